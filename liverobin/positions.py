"""How far the source replicas have read: reported by the sources, read by the heartbeat generator.

The generator places pulse ``h`` at offsets below which every record exists (DESIGN §5).  It
learns them from the source replicas instead of reading the sources itself, so the driver
fetches no source data and its cost does not grow with the input rate.  A replica reports a
*position* for its Kafka partition: every record below it exists (the replica read it, or the
high watermark of its last fetch says so).  The generator takes the furthest position any
replica of a partition reported; a replica that is behind waits for the records below a pulse
before placing it (:attr:`liverobin.heartbeats.PulsePlacer.needs_records`), as it did when the
generator followed the sources itself.

* :class:`PositionOutbox` (a worker): the latest position of each partition its sources read,
  coalesced, handed out at most once per period; nothing while no position moves.  A new sender
  (the stream to the driver broke and was opened again) starts with every position known, and
  the one before it stops.
* :class:`PositionBoard` (the driver): the furthest position reported per partition, and where
  the first report said that partition's reading starts (the generator bounds its first pulse's
  step from there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

__all__ = ["PositionBoard", "PositionOutbox", "Report"]

# (topic, partition, start, position): reading started at ``start``; every record below
# ``position`` exists
Report = tuple[str, int, int, int]
Positions = dict[str, dict[int, int]]  # topic -> partition -> offset
M = TypeVar("M")


class PositionOutbox:
    """A worker's position reports, waiting to be sent (any thread reports; one sender takes)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._cond = threading.Condition()
        self._known: dict[tuple[str, int], tuple[int, int]] = {}
        self._pending: set[tuple[str, int]] = set()  # moved since last handed out
        self._closed = False
        self._sender = 0  # the generation of the current :meth:`batches`
        self.sent = 0  # batches handed out

    def report(self, topic: str, partition: int, start: int, position: int) -> None:
        """Every record of ``partition`` of ``topic`` below ``position`` exists (a source replica
        reading from ``start`` saw it)."""
        key = (topic, partition)
        with self._cond:
            known = self._known.get(key)
            if known is not None:
                if position <= known[1]:
                    return
                start = min(start, known[0])
            self._known[key] = (start, position)
            self._pending.add(key)
            self._cond.notify_all()

    def close(self) -> None:
        """End :meth:`batches` (at once, also while it waits)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def batches(self, wrap: Callable[[list[Report]], M]) -> Iterator[M]:
        """The reports, each batch wrapped by ``wrap``: every position known first, then what
        moved; blocks while nothing did, hands the first batch after a quiet spell at once and
        the next ones no sooner than a period apart; ends once closed or once a newer
        :meth:`batches` started (what it had not handed out goes to the newer one)."""
        with self._cond:
            self._sender = generation = self._sender + 1
            self._pending |= set(self._known)

        def stopped() -> bool:
            return self._closed or self._sender != generation

        last = -self.period_s
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or stopped())
                if stopped():
                    return
                delay = last + self.period_s - time.monotonic()
                if delay > 0 and self._cond.wait_for(stopped, delay):
                    return
                batch = [(t, k, *self._known[(t, k)]) for t, k in sorted(self._pending)]
                self._pending.clear()
            last = time.monotonic()
            self.sent += 1
            yield wrap(batch)


class PositionBoard:
    """The driver's view of how far the sources have read (reports from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)
        self._positions: dict[str, dict[int, int]] = {}
        self._starts: dict[str, dict[int, int]] = {}
        self.reports = 0  # entries received
        self.version = 0  # grows with every position that moves, and every ring

    def update(self, reports: Iterable[Report]) -> None:
        with self._lock:
            moved = False
            for topic, k, start, position in reports:
                self.reports += 1
                self._starts.setdefault(topic, {}).setdefault(k, start)
                known = self._positions.setdefault(topic, {})
                if position > known.get(k, -1):
                    known[k] = position
                    moved = True
            if moved:
                self.version += 1
                self._news.notify_all()

    def ring(self) -> None:
        """Wake every :meth:`wait_news` (a generator's own word changed: drain, window, stop)."""
        with self._lock:
            self.version += 1
            self._news.notify_all()

    def wait_news(self, seen: int, timeout: float) -> int:
        """Wait until :attr:`version` is past ``seen`` (a position moved, or a ring), at most
        ``timeout`` seconds; the version now."""
        with self._lock:
            self._news.wait_for(lambda: self.version > seen, timeout)
            return self.version

    def positions(self, sources: Mapping[str, Iterable[int]]) -> Positions:
        """The furthest reported position of each partition of ``sources`` that has one."""
        with self._lock:
            out: Positions = {}
            for topic, parts in sources.items():
                known = self._positions.get(topic, {})
                reported = {k: known[k] for k in parts if k in known}
                if reported:
                    out[topic] = reported
            return out

    def starts(self, sources: Mapping[str, Iterable[int]]) -> Positions:
        """Where the first report of each partition of ``sources`` said reading starts."""
        with self._lock:
            return {topic: {k: self._starts[topic][k] for k in parts if k in self._starts.get(topic, {})}
                    for topic, parts in sources.items()}
