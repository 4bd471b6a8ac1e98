"""Joins of two keyed streams, built on :class:`~replication.functions.CoProcessFunction`: an
interval join, a tumbling-window join and a lookup join against a table kept from a (compacted)
topic.

Each keeps what it waits for in keyed state and drops it with event-time timers once the
watermark says no record can match it any more, so it is checkpointed, restored, moved in a
handover and kept in savepoints like any keyed state, and its output is the same on both replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from replication.functions import CoProcessFunction, ProcessContext, RuntimeContext
from replication.records import KafkaRecord

JoinFn = Callable[[Any, Any], Any]


class _Buffered(CoProcessFunction):
    """Both inputs' records kept per key in a map state: (side, event time, number) -> value."""

    def __init__(self, fn: JoinFn) -> None:
        if not callable(fn):
            raise TypeError("a join needs a function of the two records")
        self.fn = fn

    def open(self, ctx: RuntimeContext) -> None:
        self.buffer = ctx.map_state("buffer")
        self.count = ctx.value_state("count", 0)

    def _keep(self, side: int, ts: int, value: Any) -> None:
        n = self.count.value()
        self.count.update(n + 1)
        self.buffer.put((side, ts, n), value)

    def _dropped(self, side: int, ts: int, n: int) -> None:
        """A kept record can meet no partner any more; once none is kept, the key leaves no state."""
        self.buffer.remove((side, ts, n))
        if self.buffer.is_empty():
            self.count.clear()

    def _kept(self, side: int) -> Iterator[tuple[int, int, Any]]:
        """``(ts, number, value)`` of one side, in the order they came."""
        entries = [(n, ts, v) for (s, ts, n), v in self.buffer.items() if s == side]
        return ((ts, n, v) for n, ts, v in sorted(entries, key=lambda e: e[0]))


class IntervalJoin(_Buffered):
    """Every pair (first, second) of one key with ``first.ts + lower <= second.ts <= first.ts +
    upper`` gives ``fn(first, second)``, once, when the later of the two arrives.  A record is
    kept until the watermark passes the last time a partner could have.  A record behind the
    watermark is late (partners it should meet may be dropped already): dead-lettered, not
    joined with whatever is left."""

    def __init__(self, lower_ms: int, upper_ms: int, fn: JoinFn) -> None:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lower_ms, upper_ms)) or lower_ms > upper_ms:
            raise ValueError(f"an interval join needs int bounds with lower <= upper, got [{lower_ms!r}, {upper_ms!r}]")
        super().__init__(fn)
        self.lower, self.upper = lower_ms, upper_ms

    def process1(self, value: Any, ctx: ProcessContext) -> Iterable[Any]:
        ts = _on_time(ctx)
        self._keep(0, ts, value)
        ctx.timers.register_event_time_timer(ts + self.upper + 1)
        return [self.fn(value, other) for other_ts, _, other in self._kept(1)
                if ts + self.lower <= other_ts <= ts + self.upper]

    def process2(self, value: Any, ctx: ProcessContext) -> Iterable[Any]:
        ts = _on_time(ctx)
        self._keep(1, ts, value)
        ctx.timers.register_event_time_timer(ts - self.lower + 1)
        return [self.fn(other, value) for other_ts, _, other in self._kept(0)
                if other_ts + self.lower <= ts <= other_ts + self.upper]

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> None:
        for (side, ts, n), _ in list(self.buffer.items()):
            if (ts + self.upper + 1 if side == 0 else ts - self.lower + 1) <= timestamp:
                self._dropped(side, ts, n)


def _on_time(ctx: ProcessContext) -> int:
    """The record's event time; a ValueError (the record is dead-lettered) if it is behind the
    watermark: a partner kept until the watermark passed its last chance may be gone."""
    if ctx.timestamp < ctx.watermark:
        raise ValueError(f"late: event time {ctx.timestamp} is behind the watermark {ctx.watermark} "
                         "(partners it could meet may be dropped already)")
    return ctx.timestamp


class WindowJoin(_Buffered):
    """Every pair (first, second) of one key in the same tumbling window of ``size_ms`` gives
    ``fn(first, second)`` when the watermark reaches the window's end (pairs in the order the
    records came, first input outer).  A record for a window that ended is late: dead-lettered."""

    def __init__(self, size_ms: int, fn: JoinFn) -> None:
        if not isinstance(size_ms, int) or isinstance(size_ms, bool) or size_ms <= 0:
            raise ValueError(f"a window join needs a positive window size (ms), got {size_ms!r}")
        super().__init__(fn)
        self.size = size_ms

    def _add(self, side: int, value: Any, ctx: ProcessContext) -> None:
        start = ctx.timestamp - ctx.timestamp % self.size
        if start + self.size <= ctx.watermark:
            raise ValueError(f"late: event time {ctx.timestamp} is behind the watermark {ctx.watermark} "
                             f"(window [{start}, {start + self.size}) already joined)")
        self._keep(side, start, value)  # kept under the window's start
        ctx.timers.register_event_time_timer(start + self.size)

    def process1(self, value: Any, ctx: ProcessContext) -> None:
        self._add(0, value, ctx)

    def process2(self, value: Any, ctx: ProcessContext) -> None:
        self._add(1, value, ctx)

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[Any]:
        start = timestamp - self.size
        firsts = [(n, v) for ts, n, v in self._kept(0) if ts == start]
        seconds = [(n, v) for ts, n, v in self._kept(1) if ts == start]
        for side, items in ((0, firsts), (1, seconds)):
            for n, _ in items:
                self._dropped(side, start, n)
        return [self.fn(a, b) for _, a in firsts for _, b in seconds]


class LookupJoin(CoProcessFunction):
    """The first input looks up the second, a table: ``fn(record, row)`` with the key's latest row
    (None when it has none; ``inner``: no output then).  The table input sets a key's row to each
    record's value; a tombstone (a :class:`~replication.records.KafkaRecord` whose value is None,
    as a compacted topic deletes a key) removes it.  Which of a row's update and a record comes
    first is the ordering mode's, the same on both replicas."""

    def __init__(self, fn: JoinFn, inner: bool = False) -> None:
        if not callable(fn):
            raise TypeError("a lookup join needs a function of the record and its row")
        self.fn = fn
        self.inner = inner

    def open(self, ctx: RuntimeContext) -> None:
        self.row = ctx.value_state("row")
        self.present = ctx.value_state("present", False)

    def process1(self, value: Any, ctx: ProcessContext) -> Iterable[Any]:
        if self.present.value():
            return [self.fn(value, self.row.value())]
        return [] if self.inner else [self.fn(value, None)]

    def process2(self, value: Any, ctx: ProcessContext) -> None:
        row = value.value if isinstance(value, KafkaRecord) else value
        if row is None and isinstance(value, KafkaRecord):
            self.row.clear()
            self.present.clear()
        else:
            self.row.update(row)
            self.present.update(True)
