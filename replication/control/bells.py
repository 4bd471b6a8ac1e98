"""The workers' bells: each attached worker attempt beats at once when its bell rings (caller
holds the job master's lock).

A worker beats on its own schedule; when what its next heartbeat reply would say changed in a
way that cannot wait (writer roles, dead workers, restored replicas, a command), the driver
rings it. A worker whose beats bring nothing new and whose reply stays the same is *quiet*
(``messages.quiet_after``, applied by both ends): it beats seldom, and is rung only when the
reply it would get changed.
"""

from __future__ import annotations

from replication.messages import Heartbeat, Instructions, quiet_after
from transport import rpc

Attempt = tuple[int, int]
"""(worker, attempt)."""


class WorkerBells:
    """The bell of every attached worker attempt, the last reply each was given, the quiet ones."""

    def __init__(self) -> None:
        self._bells: dict[Attempt, rpc.Bell] = {}
        self._given: dict[Attempt, Instructions] = {}
        self._quiet: set[Attempt] = set()

    def attach(self, attempt: Attempt) -> rpc.Bell:
        """A new watch of ``attempt``: its bell."""
        bell = self._bells[attempt] = rpc.Bell()
        return bell

    def detach(self, attempt: Attempt) -> None:
        """``attempt``'s watch ended."""
        self._bells.pop(attempt, None)
        self._given.pop(attempt, None)
        self._quiet.discard(attempt)

    def ring_all(self) -> None:
        """Have every attached worker send its next heartbeat now (its reply says what changed)."""
        for bell in list(self._bells.values()):
            bell.ring()

    def replied(self, req: Heartbeat, view: Instructions) -> None:
        """``view`` answers ``req``: note whether its worker is quiet now, and ring every quiet
        worker that was given another reply than ``view`` (it asks for it at once)."""
        key = (req.worker, req.attempt)
        given, self._given[key] = self._given.get(key), view
        if quiet_after(req, view, given):
            self._quiet.add(key)
        else:
            self._quiet.discard(key)
        for other in [k for k in self._quiet if self._given[k] != view]:
            self._quiet.discard(other)
            bell = self._bells.get(other)
            if bell is not None:
                bell.ring()
