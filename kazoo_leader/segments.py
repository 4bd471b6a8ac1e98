"""A KaZoo order log as a sequence of short topics, *segments* (pure).

One order topic grows by a record per order for as long as the job runs, and a broker may charge
every fetch for the length of the partition it reads: the embedded one lists every batch of the
partition on each fetch that returns records, and answers with nothing once that outlasts the
fetch's wait (docs/embedded-broker.md), so a KaZoo job slowed down by itself within minutes.  So
a partition's log is cut into single-partition topics ``<prefix>.<n>`` of ``per_segment``
records each.

A *position* numbers the log's records across segments: the record at offset ``o`` of segment
``n`` is at position ``n * per_segment + o``.  Only the first ``per_segment`` records of a segment
are the log's; a record written past them (its writer wrote before reading that the segment was
full) is not, for every reader alike, and its writer writes it again into a later segment
(:meth:`SegmentedLog.rewrite_segment`).  That is harmless by the order log's own rules: a record
counts by its epoch and sequence number, not by where it lands, and one written twice counts
once.  Readers read the next segment ahead near the end of the current one, so a switch costs no
round trip: its records wait in the cursor until the current segment is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["READ_AHEAD", "SEGMENT_ORDERS", "OrderCursor", "SegmentedLog"]

# Records per segment.  The embedded broker spends about 1.2 us per batch listed on each fetch
# that returns records: a full segment costs a fetch 1.2 ms.  The ordered benchmark job at 800
# events/s writes 15-25 orders a second per partition: a new topic a minute.
SEGMENT_ORDERS = 1000
# A reader reads the next segment too once fewer than this many records of the current one are left
# (a switch then costs no round trip); before that, one partition per log, which is what an idle
# reader's empty fetches cost the broker.
READ_AHEAD = 100

V = TypeVar("V")


@dataclass(frozen=True)
class SegmentedLog:
    """Where one partition's orders go: topic ``<prefix>.<n>`` (one partition) for segment ``n``."""

    prefix: str
    per_segment: int = SEGMENT_ORDERS

    def __post_init__(self) -> None:
        if self.per_segment < 1:
            raise ValueError(f"a segment holds at least one record, not {self.per_segment}")

    def topic(self, segment: int) -> str:
        return f"{self.prefix}.{segment}"

    def segment_of(self, position: int) -> int:
        return position // self.per_segment

    def position(self, segment: int, offset: int) -> int:
        """The position of the record at ``offset`` of ``segment`` (only below ``per_segment`` one of the log's)."""
        return segment * self.per_segment + offset

    def rewrite_segment(self, segment: int, offset: int, reading: int) -> int | None:
        """Where a record that landed at ``offset`` of ``segment`` must be written again, its
        writer's reader being in segment ``reading`` (None: it landed in the log)."""
        if offset < self.per_segment:
            return None
        return max(segment + 1, reading)


class OrderCursor(Generic[V]):
    """One reader's place in a :class:`SegmentedLog`.

    Read what :meth:`positions` names, from those offsets, and feed every record read with its
    segment and offset (:meth:`add`, records of one segment in their order): it returns the
    log's records that follow, with their positions, in log order."""

    def __init__(self, log: SegmentedLog, position: int = 0) -> None:
        if position < 0:
            raise ValueError(f"a log position is >= 0, not {position}")
        self.log = log
        self.segment = log.segment_of(position)
        self._next: dict[int, int] = {self.segment: position - log.position(self.segment, 0), self.segment + 1: 0}
        self._ahead: list[tuple[int, V]] = []  # the next segment's records, read before this one completed
        self.ignored = 0  # records written past the end of their segment

    @property
    def position(self) -> int:
        """The position of the next record of the log this cursor hands out."""
        return self.log.position(self.segment, self._next[self.segment])

    def positions(self) -> dict[str, int]:
        """Topic -> the offset to read it from: the current segment, and the next one near its end."""
        return {self.log.topic(s): self._next[s] for s in self._reading()}

    def segments(self) -> dict[str, int]:
        """Topic -> segment of what :meth:`positions` names."""
        return {self.log.topic(s): s for s in self._reading()}

    def _reading(self) -> tuple[int, ...]:
        if self._next[self.segment] + READ_AHEAD >= self.log.per_segment:
            return self.segment, self.segment + 1
        return (self.segment,)

    def follows(self, segment: int, offset: int) -> bool:
        """Whether the record at ``offset`` of ``segment`` is the next one this cursor reads there
        (every record before it in that segment read already), so that adding it now hands out
        what a reader reaching it would."""
        return self._next.get(segment) == offset

    def add(self, segment: int, offset: int, value: V) -> list[tuple[int, V]]:
        """``value``, read at ``offset`` of ``segment``; the log's records that follow now, as
        ``(position, value)`` in log order."""
        if segment not in self._next or offset < self._next[segment]:
            return []  # a segment left already, or a record read twice
        self._next[segment] = offset + 1
        if offset >= self.log.per_segment:
            self.ignored += 1
            return []
        if segment == self.segment + 1:
            self._ahead.append((offset, value))
            return []
        out = [(self.log.position(segment, offset), value)]
        while self._next[self.segment] >= self.log.per_segment:  # complete: go on with the next one
            del self._next[self.segment]
            self.segment += 1
            self._next[self.segment + 1] = 0
            ahead, self._ahead = self._ahead, []
            out += [(self.log.position(self.segment, o), v) for o, v in ahead]
        return out
