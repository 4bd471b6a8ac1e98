"""Which silent workers the failure detector declares dead (pure; no clock, no I/O).

A crashed worker is noticed without waiting: its connection to the driver closes (the ``Attach``
watch) or Spark reports its executor lost. Silence is left for hangs and partitions, and there
one worker's silence and every worker's silence mean different things: a host starved of CPU,
a stalled driver or a broken network makes the observer deaf to all of them at once. So, as
Kubernetes' node controller stops evicting in a full disruption, a silence shared by more than
half of the watched workers (at least two) is held to a longer timeout before anyone is
declared dead; a worker silent alone is declared at the plain timeout.

A silence that would end the job is held to a longer timeout still: a worker running the last
live replica of a partition that nothing else can restore (no twin elsewhere, and no checkpoint a
live worker holds), or any worker of a job that can neither mask nor roll back a loss. Declaring
such a worker dead fails the job at once; a worker starved of CPU for a few seconds (a relaunched
executor's JVM starting beside it on a small host) would turn a slow second into a failed job.
Waiting only delays the takeover of that worker's other replicas, which failing would stop.

A worker whose heartbeats came late lately (a gap of more than a quarter of the timeout between
two of them in the last minute: a host short of CPU while state is built, a disk that stalls the
process) is given twice its longest such gap, up to the shared timeout: the accrual detectors of
Cassandra and Akka adapt to the arrival times they see in the same way. A worker that hangs after
a calm minute is declared at the plain timeout; one that was straining, at most four times later.
A worker that has not sent its first heartbeat yet is building its replicas (opening their state,
loading a savepoint, starting its sources on a host where other executors start too): it is given
the shared timeout as well; a crash meanwhile is still seen at once.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

SHARED_SILENCE_FACTOR = 4.0
"""How many plain timeouts a silence shared by most workers must last before it counts."""

FATAL_SILENCE_FACTOR = 10.0
"""How many plain timeouts a silence that would end the job must last before it counts (on two
cores, three executors' JVMs starting at once starved a worker's threads for 7 s)."""


STRAIN_WINDOW_S = 60.0
"""How long a late heartbeat counts towards a worker's patience."""

STRAIN_FACTOR = 2.0
"""A straining worker is given this many times its longest recent gap between heartbeats."""


class LateBeats:
    """The gaps between one worker's heartbeats that were long, lately (pure: times are passed in)."""

    def __init__(self, window_s: float = STRAIN_WINDOW_S) -> None:
        self.window_s = window_s
        self._gaps: deque[tuple[float, float]] = deque()  # (arrival, gap before it)

    def heard(self, at: float, gap: float, timeout_s: float) -> None:
        """A heartbeat arrived at ``at``, ``gap`` seconds after the one before it."""
        if gap > timeout_s / 4:
            self._gaps.append((at, gap))

    def worst(self, now: float) -> float:
        """The longest gap of the last ``window_s`` (0: none was long)."""
        while self._gaps and self._gaps[0][0] < now - self.window_s:
            self._gaps.popleft()
        return max((gap for _, gap in self._gaps), default=0.0)

    def patience(self, now: float, timeout_s: float, cap: float = SHARED_SILENCE_FACTOR) -> float:
        """How many plain timeouts this worker's silence must last: 1 unless it strained lately."""
        return min(cap, max(1.0, STRAIN_FACTOR * self.worst(now) / timeout_s))


def silent_workers(silence_s: Mapping[int, float], timeout_s: float,
                   shared_factor: float = SHARED_SILENCE_FACTOR, fatal: Collection[int] = (),
                   fatal_factor: float = FATAL_SILENCE_FACTOR, patience: Mapping[int, float] | None = None) -> list[int]:
    """The workers to declare dead, given how long each watched worker has been silent.

    ``silence_s`` holds every worker whose death would count (alive, started, not ended), silent
    or not: the share of silent ones is judged against all of them.  ``fatal``: the workers whose
    loss would end the job.  ``patience``: per worker, how many timeouts its silence must last
    at least (:meth:`LateBeats.patience`).
    """
    over = sorted(w for w, s in silence_s.items() if s > timeout_s)
    shared = len(over) >= 2 and 2 * len(over) > len(silence_s)
    patience = patience or {}

    def factor(w: int) -> float:
        return max(fatal_factor if w in fatal else shared_factor if shared else 1.0, patience.get(w, 1.0))

    return [w for w in over if silence_s[w] > timeout_s * factor(w)]


@dataclass
class WorkerInfo:
    """What the driver knows of a registered worker attempt."""

    index: int
    attempt: int
    executor: str | None
    address: str
    python_pid: int | None = None
    last_seen: float = 0.0
    standby: bool = False  # relaunched after its executor died: hosts none of its replicas
    late_beats: LateBeats = field(default_factory=LateBeats)
    heard: bool = False  # its first heartbeat arrived (until then it builds its replicas)

    def patience(self, now: float, timeout_s: float) -> float:
        """How many plain timeouts this worker's silence must last: the shared factor until its
        first heartbeat, then :meth:`LateBeats.patience`."""
        return self.late_beats.patience(now, timeout_s) if self.heard else SHARED_SILENCE_FACTOR
