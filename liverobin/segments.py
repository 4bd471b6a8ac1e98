"""The heartbeat log of a run as a sequence of short topics, *segments* (pure).

A single heartbeat topic grows by a record per pulse for as long as the job runs, and a broker
may charge each fetch for the length of the partition it reads: the embedded one lists every
batch of the partition on each fetch that returns records (docs/embedded-broker.md), so pulses
slowed from 80 to 3 a second within minutes.  So a run's log is cut into single-partition topics
``<prefix>.<n>``: segment ``n`` holds pulses ``n * per_segment + 1`` to ``(n + 1) * per_segment``,
and a reader never reads more than two segments at a time.

The counting rules of :class:`liverobin.heartbeats.PulseLog` apply to the segments read in order,
with one more: a record counts only in the segment of its ``h`` (a writer puts every pulse there,
so it only takes a stray record out).  A segment is *complete* once its last pulse counted:
nothing after that in it can count, so a reader goes on with the next segment.  For that to
happen, a writer never writes into segment ``n + 1`` before it has read back the last pulse of
segment ``n`` as counted (:meth:`LogCursor.may_write`); a lost last pulse is written again, with
the same ``h``, since the first record of each ``h`` wins anyway.  Readers read the next segment
ahead, so a switch costs no round trip: its records wait in the cursor until the current segment
is complete.
"""

from __future__ import annotations

from dataclasses import dataclass

from liverobin.heartbeats import PulseLog, PulseRecord

__all__ = ["SEGMENT_PULSES", "HeartbeatLog", "LogCursor"]

# Pulses per segment: at the default 10 ms period a new topic every second.  13 readers of a log
# written 100 times a second kept the embedded broker at 0.3 cores with segments of 100 pulses,
# 0.7 with 500, and at all of this 2-core machine within 20 s with one topic.
SEGMENT_PULSES = 100


@dataclass(frozen=True)
class HeartbeatLog:
    """Where a run's pulses go: topic ``<prefix>.<n>`` (one partition) for segment ``n``."""

    prefix: str
    per_segment: int = SEGMENT_PULSES

    def topic(self, segment: int) -> str:
        return f"{self.prefix}.{segment}"

    def segment_of(self, h: int) -> int:
        return (h - 1) // self.per_segment

    def last_h(self, segment: int) -> int:
        """The last pulse of ``segment``: once it counted, the segment is complete."""
        return (segment + 1) * self.per_segment

    def first_read_after(self, h: int) -> int:
        """The first segment a reader that counted pulse ``h`` (0: none yet) may still read: a
        cursor restored after ``h`` starts in ``h``'s segment."""
        return self.segment_of(h) if h > 0 else 0


class LogCursor:
    """One reader's place in a :class:`HeartbeatLog` and what it counted so far.

    Feed it every record read, with the segment it was read from (:meth:`add`); read what
    :meth:`positions` names, from those offsets.  ``after``: a record counted earlier (a
    restored source starts right after the last pulse its checkpoint placed).  ``segment``
    (without ``after``): start at that segment with nothing counted, for a writer that only needs
    the newest pulses (what it writes is counted by the readers' rules, whatever it knew)."""

    def __init__(self, log: HeartbeatLog, after: PulseRecord | None = None, segment: int = 0) -> None:
        self.log = log
        self.pulses = PulseLog.after(after) if after is not None else PulseLog()
        self.segment = log.segment_of(after.h) if after is not None else segment
        self._next: dict[int, int] = {self.segment: after.at + 1 if after is not None else 0}
        self._ahead: list[PulseRecord] = []  # the next segment's records, read before this one completed
        self._advance()

    @property
    def complete(self) -> bool:
        """The current segment's last pulse counted (or the final one did): nothing more counts in it."""
        return self.pulses.final or self.pulses.last_h >= self.log.last_h(self.segment)

    def positions(self) -> dict[str, int]:
        """Topic -> the offset to read it from: the current segment and the next one."""
        return {self.log.topic(s): self._next.get(s, 0) for s in (self.segment, self.segment + 1)}

    def segments(self) -> dict[str, int]:
        """Topic -> segment of what :meth:`positions` names."""
        return {self.log.topic(s): s for s in (self.segment, self.segment + 1)}

    def next_offset(self, segment: int) -> int:
        """Where reading ``segment`` goes on (0 for a segment not read yet)."""
        return self._next.get(segment, 0)

    def add(self, segment: int, record: PulseRecord) -> list[PulseRecord]:
        """``record``, read at offset ``record.at`` of ``segment`` (records of one segment in their
        order); the records that count now, as :meth:`PulseLog.accept` returns them, in order."""
        if segment not in (self.segment, self.segment + 1):
            return []  # a segment left already (a record still in flight), or one not read yet
        if record.at >= 0:
            self._next[segment] = max(self._next.get(segment, 0), record.at + 1)
        if segment == self.segment + 1:
            self._ahead.append(record)
            return []
        counted = self._count(record)
        out = [counted] if counted is not None else []
        return out + self._advance()

    def may_write(self, h: int) -> bool:
        """Whether a writer whose log this is may write pulse ``h`` now: not into a segment after
        this one before this one's last pulse is read back as counted."""
        return self.log.segment_of(h) <= self.segment

    def _count(self, record: PulseRecord) -> PulseRecord | None:
        if self.log.segment_of(record.h) != self.segment:
            self.pulses.ignored += 1
            return None
        return self.pulses.accept(record)

    def _advance(self) -> list[PulseRecord]:
        """Go on with the next segment while the current one is complete; what its records read
        ahead make count."""
        out: list[PulseRecord] = []
        while self.complete and not self.pulses.final:
            self._next.pop(self.segment, None)
            self.segment += 1
            ahead, self._ahead = self._ahead, []
            for record in ahead:
                counted = self._count(record)
                if counted is not None:
                    out.append(counted)
                if self.complete:
                    # the rest of the old "ahead" segment is this one's: nothing more counts in it,
                    # and nothing of the segment after it was read yet
                    break
        return out
