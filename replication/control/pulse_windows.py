"""KaZoo pulse windows as the driver's service: its word to the sources, and what they hold.

A handover under KaZoo opens a window: the driver's word (:class:`liverobin.windows.WindowWord`)
tells every source replica to hold its records; each reports (:class:`Holding`) the window it
holds for and where; once every live one does, pulses are written from there on
(:mod:`replication.control.handover_steps`).  Caller holds the job master's lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from liverobin.windows import WindowWord
from replication.heartbeat_parts import PULSE_WINDOWS, Holding, WindowWordPart
from transport.ids import ReplicaId

if TYPE_CHECKING:
    from replication.control.master import JobMaster


class PulseWindows:
    """The latest word on the pulse windows, and what each source replica reported holding:
    replica -> (window, {Kafka partition: position})."""

    name = PULSE_WINDOWS

    def __init__(self, master: JobMaster) -> None:
        self.master = master
        self.word: WindowWord | None = None
        self.holding: dict[ReplicaId, tuple[int, dict[int, int]]] = {}
        # this run's windows are numbered from base + 1: a resumed run's above every window of the
        # runs before (their pulses are in the heartbeat log it reads on, and its restored sources
        # have handled some); replicas ignore a window not above those they handled
        self.base = 0

    def next_window(self) -> tuple[int, int | None]:
        """The id of the window to open next, and the latest window up to it whose pulses were
        written, as far as this driver knows (None: not said, in a resumed run)."""
        if self.word is not None:
            return self.word.window + 1, self.word.last_pulsed
        return self.base + 1, (None if self.base else 0)

    def held(self, replica: ReplicaId) -> int:
        """The window ``replica`` last said it holds for (0: none)."""
        return self.holding.get(replica, (0, {}))[0]

    def on_report(self, worker: int, part: Holding | None) -> None:
        if part is not None and part.replicas:
            self.holding.update(part.replicas)
            self.master.wake()

    def reply(self) -> WindowWordPart | None:
        return None if self.word is None else WindowWordPart(tuple(self.word))
