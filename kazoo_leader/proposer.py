"""KaZoo's leader side for one replica: :class:`OrderProposer` (DESIGN §5).

The proposer publishes a fence for its epoch, orders nothing until its own
:class:`~kazoo_leader.orders.OrderApplier` has accepted that fence, then orders, per channel, only
the elements no accepted record covers yet, following the interleaving in which they arrived here.
With a clock tick it stamps its wall clock into every order and writes a time-only order when
nothing was written for a tick, so processing time passes on every replica alike.

A deposed leader does not kill itself: seeing a higher epoch in the log (or :meth:`OrderProposer.resign`)
turns its proposer into a follower's; its applier never stops.  No I/O, no threads, no clock:
time is passed in as ``now``.
"""

from __future__ import annotations

import heapq
from collections import deque

from kazoo_leader.orders import Order, OrderApplier

_FOLLOWER, _FENCING, _LEADING = "follower", "fencing", "leading"


class OrderProposer:
    """The leader's side of KaZoo for one replica; it observes that replica's :class:`OrderApplier`.

    Call :meth:`on_arrival` for every push (leader or not, so a new leader knows the interleaving
    it saw), and pass every log record to the applier first and then to :meth:`on_record` (the
    other way round is safe too: in-flight and fence state are read from the applier).
    """

    def __init__(
        self,
        applier: OrderApplier,
        max_batch: int = 1000,
        min_batch: int = 1,
        idle_timeout_s: float = 0.002,
        max_in_flight: int = 1,
        pipeline_below: int = 1,
        clock_tick_s: float = 0.0,
    ) -> None:
        if max_batch < 1 or min_batch < 1:
            raise ValueError("max_batch and min_batch must be >= 1")
        if max_in_flight < 1 or pipeline_below < 1:
            raise ValueError("max_in_flight and pipeline_below must be >= 1")
        if min_batch > max_batch:
            raise ValueError(f"min_batch {min_batch} exceeds max_batch {max_batch}")
        if idle_timeout_s < 0 or clock_tick_s < 0:
            raise ValueError("idle_timeout_s and clock_tick_s must be >= 0")
        self.applier = applier
        self.max_batch = max_batch
        self.min_batch = min_batch
        self.idle_timeout_s = idle_timeout_s
        self.max_in_flight = max_in_flight
        # while an order is in flight, another goes out only if it names fewer elements than this
        # (small orders: latency; under load the next one waits and grows instead of multiplying)
        self.pipeline_below = pipeline_below
        # > 0: every order carries the clock passed to next_order, and a time-only order goes out
        # when nothing was written for this long (processing time passes with no input)
        self.clock_tick_s = clock_tick_s
        self._written_at = 0.0  # when our last record was produced
        self.epoch: int | None = None  # our epoch while leader
        self._state = _FOLLOWER
        # published and not yet seen in the log, oldest first; their elements are not ordered again while
        # they are (an order seen after a later one of ours is ignored: its elements are then
        # uncovered, and ordered again)
        self._in_flight: deque[Order] = deque()
        self._pending = dict.fromkeys(applier.channels, 0)  # per channel, elements named in flight
        self._last_seq = -1  # seq of the last record we produced in this epoch
        self._arrived = dict.fromkeys(applier.channels, 0)
        # per channel, arrival runs [lo, hi, time, arrival number, channel], oldest first
        self._runs: dict[int, deque[list]] = {c: deque() for c in applier.channels}
        self._arrival_no = 0
        self.deposed_by: int | None = None  # the higher epoch that deposed us, if any

    def restore(self, applied: dict[int, int]) -> None:
        """A follower restored from a checkpoint: what arrived before it is ``applied``."""
        self._arrived = {c: applied.get(c, 0) for c in self.applier.channels}
        for runs in self._runs.values():
            runs.clear()

    # -- leadership ------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Elected (fencing or ordering)."""
        return self._state != _FOLLOWER

    @property
    def ordering(self) -> bool:
        """Our fence is accepted: :meth:`next_order` may return orders."""
        self._sync()
        return self._state == _LEADING

    @property
    def in_flight(self) -> Order | None:
        """The oldest record published and not yet seen in the log."""
        self._sync()
        return self._in_flight[0] if self._in_flight else None

    def is_in_flight(self, order: Order) -> bool:
        """Whether ``order`` is published and not seen in the log yet (re-publish it if its produce failed)."""
        self._sync()
        return order in self._in_flight

    def become_leader(self, epoch: int) -> Order:
        """Elected with ``epoch``: returns the fence record to publish first."""
        current = self.applier.epoch
        if current is not None and epoch <= current:
            raise ValueError(f"epoch {epoch} is not above the log's epoch {current}; its fence would be ignored")
        if self.epoch is not None and epoch <= self.epoch:
            raise ValueError(f"epoch {epoch} is not above our previous epoch {self.epoch}")
        fence = Order(epoch, self.applier.last_seq + 1)
        self.epoch = epoch
        self._state = _FENCING
        self._clear_in_flight()
        self._in_flight.append(fence)
        self._last_seq = fence.seq
        self.deposed_by = None
        return fence

    def resign(self) -> None:
        """Leadership lost: become a follower; no order of the old epoch is returned after this."""
        self._state = _FOLLOWER
        self._clear_in_flight()

    def _clear_in_flight(self) -> None:
        self._in_flight.clear()
        for channel in self._pending:
            self._pending[channel] = 0

    def on_record(self, order: Order) -> None:
        """A log record (the same ones the applier sees): a higher epoch deposes us."""
        if self._state != _FOLLOWER and self.epoch is not None and order.epoch > self.epoch:
            self.deposed_by = order.epoch
            self.resign()
        self._sync()

    def _sync(self) -> None:
        a = self.applier
        if self._state != _FOLLOWER and a.epoch is not None and a.epoch > self.epoch:
            self.deposed_by = a.epoch
            self.resign()
        if a.epoch == self.epoch:
            while self._in_flight and a.last_seq >= self._in_flight[0].seq:
                # back and accepted (coverage includes it), or passed by a later one (then ignored)
                done = self._in_flight.popleft()
                for channel, count in done.entries:
                    self._pending[channel] -= count
                if self._state == _FENCING:
                    self._state = _LEADING
        self._trim()

    # -- arrivals ----------------------------------------------------------------------------
    def on_arrival(self, channel: int, count: int, now: float) -> None:
        """``count`` elements of ``channel`` were pushed to this replica at time ``now``."""
        if channel not in self._runs:
            raise KeyError(f"channel {channel} is not an input of this proposer")
        if count <= 0:
            return
        lo = self._arrived[channel]
        self._arrived[channel] = lo + count
        self._runs[channel].append([lo, lo + count, now, self._arrival_no, channel])
        self._arrival_no += 1
        self._trim_channel(channel)

    def _trim(self) -> None:
        for channel in self._runs:
            self._trim_channel(channel)

    def _trim_channel(self, channel: int) -> None:
        runs = self._runs[channel]
        covered = self.applier._covered_of(channel)
        while runs and runs[0][1] <= covered:
            runs.popleft()

    def _orderable(self, channel: int) -> tuple[int, int]:
        """[frontier, end) of the elements of ``channel`` that nobody ordered, that no order of ours in
        flight names, and that we hold."""
        frontier = self.applier._covered_of(channel) + self._pending[channel]
        end = min(self._arrived[channel], self.applier._received_of(channel))
        return frontier, max(frontier, end)

    # -- ordering ----------------------------------------------------------------------------
    def uncovered(self) -> int:
        """Elements received here that neither an accepted record nor one of ours in flight covers."""
        self._sync()
        return self._uncovered()

    def _uncovered(self) -> int:
        return sum(hi - lo for lo, hi in map(self._orderable, self._runs))

    def _oldest(self) -> float | None:
        oldest = None
        for channel, runs in self._runs.items():
            lo, hi = self._orderable(channel)
            if lo < hi:
                first = next(run for run in runs if run[1] > lo)  # the oldest run not in flight
                if oldest is None or first[2] < oldest:
                    oldest = first[2]
        return oldest

    def wake_at(self) -> float | None:
        """When :meth:`next_order` will return an order if nothing else happens (None: not by time)."""
        self._sync()
        if self._state != _LEADING or len(self._in_flight) >= self.max_in_flight:
            return None
        oldest = self._oldest()
        if oldest is None:
            return self._written_at + self.clock_tick_s if self._ticks() else None
        total = self._uncovered()
        if self._in_flight and total >= self.pipeline_below:
            return None
        return oldest if total >= self.min_batch else oldest + self.idle_timeout_s

    def _ticks(self) -> bool:
        """Time-only orders are due by time: clocked, nothing in flight, and input still open."""
        return self.clock_tick_s > 0 and not self._in_flight and not self.applier.finished

    def next_order(self, now: float, clock_ms: int = 0) -> Order | None:
        """The next order to publish, or None (not ordering, ``max_in_flight`` in flight, or nothing due yet).

        Due when uncovered elements reach ``min_batch`` or the oldest has waited ``idle_timeout_s``;
        it names everything uncovered in arrival order (merged runs), at most ``max_batch`` elements.
        With orders in flight, only while fewer than ``pipeline_below`` elements are uncovered.
        With ``clock_tick_s``, orders carry ``clock_ms``, and with nothing to order a time-only one
        goes out ``clock_tick_s`` after the last record.
        """
        self._sync()
        if self._state != _LEADING or len(self._in_flight) >= self.max_in_flight:
            return None
        clock = clock_ms if self.clock_tick_s > 0 and clock_ms > 0 else 0
        total = self._uncovered()
        if total == 0 and clock and self._ticks() and now - self._written_at >= self.clock_tick_s:
            return self._produce((), clock, now)
        if total == 0 or (self._in_flight and total >= self.pipeline_below):
            return None
        if total < self.min_batch and now - self._oldest() < self.idle_timeout_s:
            return None
        frontier: dict[int, int] = {}
        limit: dict[int, int] = {}
        for channel in self._runs:
            frontier[channel], limit[channel] = self._orderable(channel)
        entries: list[list[int]] = []
        budget = self.max_batch
        merged = heapq.merge(*self._runs.values(), key=lambda run: run[3])
        for lo, hi, _, _, channel in merged:
            if budget == 0:
                break
            start, stop = max(lo, frontier[channel]), min(hi, limit[channel])
            if start >= stop:
                continue
            assert start == frontier[channel], "arrival runs of a channel must be contiguous"
            take = min(stop - start, budget)
            frontier[channel] += take
            budget -= take
            if entries and entries[-1][0] == channel:
                entries[-1][1] += take
            else:
                entries.append([channel, take])
        return self._produce(tuple((c, n) for c, n in entries), clock, now)

    def _produce(self, entries: tuple[tuple[int, int], ...], clock: int, now: float) -> Order:
        self._last_seq += 1
        order = Order(self.epoch, self._last_seq, entries, clock=clock)  # type: ignore[arg-type]
        self._in_flight.append(order)
        self._written_at = now
        for channel, count in order.entries:
            self._pending[channel] += count
        return order
