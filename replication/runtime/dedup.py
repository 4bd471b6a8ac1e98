"""Per-channel sequence check: deliver in order, drop duplicates, report gaps.

DESIGN §4 rule 3: per channel the highest delivered seq ``last`` is kept; an
element is delivered iff ``seq == last + 1``, dropped iff ``seq <= last``, and
``seq > last + 1`` is a gap: counted and surfaced, never delivered.  Pure: no I/O,
no threads (the caller serialises calls per channel).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Admission:
    """What to do with a batch ``[first_seq, first_seq + count)``.

    ``deliver`` is the slice ``[start, stop)`` of the batch's elements to deliver
    (empty when ``start == stop``); ``dropped`` counts duplicates; ``gap`` is the
    number of missing seqs before the batch (then nothing is delivered).
    """

    start: int
    stop: int
    dropped: int
    gap: int

    @property
    def delivers(self) -> bool:
        return self.stop > self.start


@dataclass
class Dedup:
    """Dedup state of one receiving partition instance, for all its channels."""

    last: dict[int, int] = field(default_factory=dict)
    dropped: int = 0
    gaps: int = 0

    def admit(self, channel: int, first_seq: int, count: int) -> Admission:
        """Decide on a batch and advance ``last`` past what is delivered."""
        adm = self.check(channel, first_seq, count)
        self.commit(channel, first_seq, adm)
        return adm

    def check(self, channel: int, first_seq: int, count: int) -> Admission:
        """What :meth:`admit` would decide, changing nothing (a receiver that may yet refuse
        the batch commits it only once taken)."""
        last = self.last.get(channel, -1)
        if first_seq > last + 1:
            return Admission(0, 0, 0, first_seq - last - 1)
        start = min(last + 1 - first_seq, count)
        return Admission(start, count, start, 0)

    def commit(self, channel: int, first_seq: int, adm: Admission) -> None:
        """Record a decision of :meth:`check` (the batch was taken)."""
        if adm.gap:
            self.gaps += 1
            return
        self.dropped += adm.dropped
        if adm.delivers:
            self.last[channel] = first_seq + adm.stop - 1

    def resume(self, channel: int, next_seq: int) -> None:
        """Expect ``next_seq`` next on ``channel`` (a replica restored from a checkpoint)."""
        self.last[channel] = next_seq - 1

    def position(self, channel: int) -> int:
        """Highest delivered seq of ``channel`` (-1 before the first element)."""
        return self.last.get(channel, -1)
