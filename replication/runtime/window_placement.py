"""Where a KaZoo source replica puts a pulse window's pulses: the partition leader's order (pure).

Inside a pulse window both replicas of a source partition must emit the window's pulses
between the same records.  :class:`WindowPlacer` does it with the partition's order log
(:class:`kazoo_leader.window_order.WindowOrder`): from the window's *start* offset (the
offset its first pulse names for the partition) the replica the election names orders records
and pulses as they arrive, and every replica emits them in that order.  So a record waits one
order-log round trip, not until a pulse beyond it is written.  Records below the start go out
before the stretch, records after the window's last pulse after it, both in offset order.

:class:`WindowOrders` is a replica's side of the partition's order log across windows: the
records read for a window it has not reached yet, its leadership, the records to publish.
Both are fed by the source's thread; no I/O, no threads, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from kazoo_leader.window_order import WindowOrder, WindowRecord
from liverobin.heartbeats import PULSE_ITEM, RECORD_ITEM, PulseRecord

# A record of a window's ordered stretch (a checkpoint may not fall among them: a restore
# would need the order's state; it re-reads the window from the log instead).
ORDERED_ITEM = "ordered"


def _marked_last(pulse: PulseRecord) -> bool:
    return pulse.last


class WindowOrders:
    """One source replica's side of its partition's order log, across pulse windows.

    Feed it the log's records (:meth:`on_records`) and the election (:meth:`on_leadership`);
    :meth:`begin` starts a window's order, :meth:`finish` forgets it; publish what :meth:`due`
    returns.  ``proposer_options``: :class:`~kazoo_leader.proposer.OrderProposer`'s."""

    def __init__(self, **proposer_options: Any) -> None:
        self.epoch: int | None = None  # elected with it (None: a follower)
        self.current: WindowOrder | None = None
        self._options = proposer_options
        self._early: dict[int, list[WindowRecord]] = {}  # records of windows not begun here yet
        self._done = 0  # windows up to this one are over for this replica
        self._first_at: dict[int, int] = {}  # window not over here -> the log position of its first record read
        self._read_to = 0  # every record of the log below this position was read (-1: positions unknown)
        self._outbox: list[WindowRecord] = []
        self.stale_leader = 0  # elections whose epoch the log had passed (for the logs)

    def on_records(self, records: list[WindowRecord]) -> None:
        """The order log's next records, in log order."""
        current = self.current
        for record in records:
            offset = record.order.offset
            if offset < 0 or self._read_to < 0:
                self._read_to = -1
            else:
                self._read_to = offset + 1
                if record.window > self._done:
                    self._first_at.setdefault(record.window, offset)
            if current is not None and record.window == current.window:
                current.on_record(record)
            elif record.window > self._done and (current is None or record.window > current.window):
                self._early.setdefault(record.window, []).append(record)

    def on_leadership(self, epoch: int | None) -> None:
        """Elected with ``epoch``, or no longer leader (None)."""
        self.epoch = epoch
        if self.current is None or self.current.ended:
            return
        if epoch is None:
            self.current.resign()
        else:
            self._lead(self.current)

    def begin(self, window: int, start: int) -> WindowOrder:
        """Window ``window``'s order, from offset ``start`` (its first pulse's)."""
        order = self.current = WindowOrder(window, start, _marked_last, **self._options)
        for record in self._early.pop(window, []):
            order.on_record(record)
        self._forget(window)
        if self.epoch is not None:
            self._lead(order)
        return order

    def _lead(self, order: WindowOrder) -> None:
        try:
            self._outbox.append(order.lead(self.epoch))  # type: ignore[arg-type]
        except ValueError:  # the log has a newer epoch: another replica leads, this one follows
            self.stale_leader += 1

    def finish(self, window: int) -> None:
        """Window ``window`` is over here: its records, and earlier ones, are no longer kept."""
        self._done = max(self._done, window)
        if self.current is not None and self.current.window <= window:
            self.current = None
        self._forget(window + 1)
        for over in [w for w in self._first_at if w <= self._done]:
            del self._first_at[over]

    def _forget(self, below: int) -> None:
        for window in [w for w in self._early if w < below]:
            del self._early[window]

    @property
    def resume_from(self) -> int:
        """Where a replica restored from a checkpoint taken now reads the order log from: no
        record of a window that is not over here lies below it (those read so far are at or
        after their window's first, the rest after everything read)."""
        if self._read_to < 0:
            return 0
        return min(self._first_at.values(), default=self._read_to)

    def due(self, now: float) -> list[WindowRecord]:
        """Records to publish now (a leader's fence and orders)."""
        out, self._outbox = self._outbox, []
        if self.current is not None:
            record = self.current.next_order(now)
            if record is not None:
                out.append(record)
        return out

    def is_in_flight(self, record: WindowRecord) -> bool:
        """Whether ``record`` (its publish failed) is still to be written."""
        current = self.current
        return current is not None and current.window == record.window and \
            current.proposer.is_in_flight(record.order)

    def wake_at(self) -> float | None:
        return None if self.current is None else self.current.wake_at()

    @property
    def waiting(self) -> bool:
        """A window's order runs here (its order log is to be read)."""
        return self.current is not None and not self.current.ended


class WindowPlacer:
    """:class:`liverobin.PulsePlacer`'s interface for a KaZoo source replica in pulse windows:
    records (:meth:`add_record`) and the window's counted pulses (:meth:`add_pulse`) in, what
    goes out from :meth:`take`, in the order of the partition's order log (see the module
    docstring).  The source tells it where the window ends (:meth:`end_window`: after the last
    pulse given, as :class:`liverobin.windows.PulseWindows` decides from the heartbeat log)."""

    def __init__(self, topic: str, partition: int, fetched_to: int, orders: WindowOrders,
                 clock: Callable[[], float]) -> None:
        self.topic, self.partition, self.fetched_to = topic, partition, fetched_to
        self.orders = orders
        self._clock = clock
        self.last_placed: PulseRecord | None = None  # the counted record of the last pulse taken
        self.ended = False  # a final pulse was taken
        self._order: WindowOrder | None = None
        self._last_given: PulseRecord | None = None  # the current order's latest pulse
        self._ending = False  # the heartbeat log ended the window after _last_given
        self._loose: deque[tuple[int, Any]] = deque()  # records in no stretch, in offset order
        self._ready: deque[tuple[str, Any]] = deque()  # what goes out next, in order

    # -- input ---------------------------------------------------------------------------------
    def add_record(self, offset: int, item: Any) -> None:
        self.fetched(offset + 1)
        order = self._order
        if order is None or order.ended:
            self._loose.append((offset, item))
            return
        self._ready.extend((RECORD_ITEM, it) for _, it in order.add_records([(offset, item)], self._clock()))

    def fetched(self, position: int) -> None:
        if position > self.fetched_to:
            self.fetched_to = position

    def add_pulse(self, record: PulseRecord) -> None:
        """The next counted pulse of the window held for (its first begins the window's order)."""
        now = self._clock()
        order = self._order
        if order is None or order.ended:
            order = self._begin(record, now)
            self._ending = False
        elif record.window != order.window:  # (PulseWindows gives a window's pulses once the last one's are out)
            raise ValueError(f"pulse {record.h} of window {record.window} while window {order.window} still runs")
        self._last_given = record
        order.add_pulse(record, now)

    def _begin(self, first: PulseRecord, now: float) -> WindowOrder:
        start = first.offsets.get(self.topic, {}).get(self.partition, 0)
        order = self._order = self.orders.begin(first.window, start)
        loose, self._loose = list(self._loose), deque()
        self._ready.extend((RECORD_ITEM, it) for _, it in order.add_records(loose, now))
        return order

    def end_window(self) -> None:
        """The window ends after the last pulse given (on every replica alike, as the heartbeat
        log says); the records after it wait for the next window's first pulse or
        :meth:`release_records`."""
        if self._order is not None and self._last_given is not None:
            self._ending = True
            self._advance()

    # -- output --------------------------------------------------------------------------------
    def take(self) -> Iterator[tuple[str, Any]]:
        """What goes out now, in order: ``("record", item)`` (outside the ordered stretch),
        ``("ordered", item)`` (inside it) and ``("pulse", (h, final, t))``."""
        self._advance()
        ready = self._ready
        while ready:
            kind, payload = ready.popleft()
            if kind == PULSE_ITEM:
                self.last_placed = payload
                self.ended = payload.final
                yield PULSE_ITEM, (payload.h, payload.final, payload.t)
            else:
                yield kind, payload

    def _advance(self) -> None:
        order = self._order
        # (no ordered element before every record below the start is out: they precede it)
        if order is None or order.ended or self.fetched_to < order.start:
            return
        self._pull(order.end_after(self._last_given) if self._ending else order.take(), order)
        if order.ended:
            self.orders.finish(order.window)

    def _pull(self, taken: list[tuple[str, Any]], order: WindowOrder) -> None:
        """The order's output: the records after the window's last pulse (once it ended) are
        in no stretch any more."""
        after = len(taken)
        if order.ended:
            pulses = [i for i, (kind, _) in enumerate(taken) if kind == "pulse"]
            after = pulses[-1] + 1 if pulses else 0
        for i, (kind, payload) in enumerate(taken):
            if kind == "pulse":
                self._ready.append((PULSE_ITEM, payload))
            elif i >= after:
                self._loose.append(payload)
            else:
                self._ready.append((ORDERED_ITEM, payload[1]))

    def release_records(self) -> list[Any]:
        """Every record held, in offset order: the replica leaves the window."""
        if self._order is not None and not self._order.ended:  # (its end is known before it is left)
            raise RuntimeError(f"window {self._order.window} left before its order reached its last pulse")
        items = [payload for kind, payload in self._ready if kind != PULSE_ITEM] + [it for _, it in self._loose]
        self._ready.clear()
        self._loose.clear()
        return items

    @property
    def held(self) -> int:
        """Records read and not out yet."""
        return len(self._loose) + (0 if self._order is None else self._order.held)
