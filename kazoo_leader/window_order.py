"""KaZoo order for a replicated source partition inside a pulse window; pure.

Out of a pulse window a KaZoo source replica emits its Kafka partition's records as it reads
them.  Inside window ``w`` it must put the window's pulses between the same records as its
twin.  :class:`WindowOrder` makes it a KaZoo-ordered instance with two input channels:

* channel :data:`RECORDS`: the partition's records from the window's *start* offset on (the
  offset the window's first pulse names for this partition, at or beyond every position the
  replicas reported when they held for the window, so neither replica emitted past it);
* channel :data:`PULSES`: the window's pulses, in the heartbeat log's order.

Every replica consumes both only as the accepted records of the partition's order log say
(:class:`~kazoo_leader.orders.OrderApplier`); the replica the election names proposes them
(:class:`~kazoo_leader.proposer.OrderProposer`), after a fence of its own for this window.  So a
record waits one order-log round trip, not a pulse's hold, and fencing and failover are
KaZoo's: a new leader orders only what no accepted record covers.  Applying the window's last
pulse ends the stretch at the same element on every replica; the records after it go out in
offset order, as read, the same on both (no pulse lies among them).

The order log of a source partition carries :class:`WindowRecord`: an order tagged with its
window, so a stretch applies its own window's records only, each window with a fresh
applier (epochs and sequence numbers start again at every window's fence).  No I/O, no
threads, no clock: time is passed in as ``now``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo_leader.orders import DATA, PULSE, Order, OrderApplier
from kazoo_leader.proposer import OrderProposer

RECORDS = 0
PULSES = 1

_WINDOW = struct.Struct(">q")


@dataclass(frozen=True)
class WindowRecord:
    """A record of a source partition's order log: ``order`` applies to window ``window`` only."""

    window: int
    order: Order

    @property
    def key(self) -> tuple:
        """What tells this record from every other of its log (each window's orders count afresh)."""
        return (self.window, *self.order.key)

    def encode(self) -> bytes:
        return _WINDOW.pack(self.window) + self.order.encode()

    @classmethod
    def decode(cls, data: bytes, offset: int = -1) -> WindowRecord:
        """Parse :meth:`encode`'s output; ValueError on anything else."""
        data = bytes(data)
        if len(data) < _WINDOW.size:
            raise ValueError(f"window order record too short: {len(data)} bytes")
        (window,) = _WINDOW.unpack_from(data)
        return cls(window, Order.decode(data[_WINDOW.size:], offset))


class WindowOrder:
    """One source replica's records and pulses of window ``window``, consumed in the order log's
    order from offset ``start`` until the pulse ``is_last`` is true of.  Feed it what the replica
    reads (:meth:`add_records`, :meth:`add_pulse`), the partition's order log
    (:meth:`on_record`) and the election (:meth:`lead`, :meth:`resign`); publish what
    :meth:`lead` and :meth:`next_order` return; emit what :meth:`take` returns."""

    def __init__(self, window: int, start: int, is_last: Callable[[Any], bool], **proposer_options: Any) -> None:
        self.window = window
        self.start = start
        self.is_last = is_last
        self.applier = OrderApplier((RECORDS, PULSES))
        self.proposer = OrderProposer(self.applier, **proposer_options)
        self.ended = False
        self._declared_last: Any = None  # a pulse the heartbeat log showed to be the window's last
        self._last_out: Any = None  # the last of the window's pulses taken so far
        self._unapplied: deque[tuple[int, Any]] = deque()  # records pushed, not yet consumed
        self._next_offset = start  # records below it were pushed (or lie before the stretch)

    # -- input -----------------------------------------------------------------------------
    def add_records(self, records: Sequence[tuple[int, Any]], now: float) -> list[tuple[int, Any]]:
        """Records read, ``(offset, item)`` in offset order.  Returns those that go out at once:
        below :attr:`start` (no pulse of the window lies among them) or after the stretch ended."""
        out: list[tuple[int, Any]] = []
        inside: list[tuple] = []
        for offset, item in records:
            if offset < self.start:
                out.append((offset, item))
                continue
            if offset < self._next_offset:
                raise ValueError(f"record at offset {offset} read twice (the stretch is at {self._next_offset})")
            self._next_offset = offset + 1
            if self.ended:
                out.append((offset, item))
            else:
                inside.append((DATA, offset, item))
                self._unapplied.append((offset, item))
        if inside:
            self.applier.push(RECORDS, inside)
            self.proposer.on_arrival(RECORDS, len(inside), now)
        return out

    def add_pulse(self, pulse: Any, now: float) -> None:
        """The window's next pulse, as the heartbeat log gives it."""
        if not self.ended:
            self.applier.push(PULSES, [(PULSE, pulse)])
            self.proposer.on_arrival(PULSES, 1, now)

    def on_record(self, record: WindowRecord) -> bool:
        """The partition order log's next record (every replica, in log order); returns whether
        it was accepted for this window."""
        if record.window != self.window or self.ended:
            return False
        accepted = self.applier.on_record(record.order)
        self.proposer.on_record(record.order)
        return accepted

    # -- leadership ------------------------------------------------------------------------
    def lead(self, epoch: int) -> WindowRecord:
        """Elected with ``epoch`` (for this window or before it): the fence to publish first."""
        return WindowRecord(self.window, self.proposer.become_leader(epoch))

    def resign(self) -> None:
        self.proposer.resign()

    def next_order(self, now: float) -> WindowRecord | None:
        """The leader's next order to publish, if one is due."""
        if self.ended:
            return None
        order = self.proposer.next_order(now)
        return None if order is None else WindowRecord(self.window, order)

    def wake_at(self) -> float | None:
        return None if self.ended else self.proposer.wake_at()

    # -- output ----------------------------------------------------------------------------
    def take(self) -> list[tuple[str, Any]]:
        """What goes out now, in order: ``("record", (offset, item))`` and ``("pulse", pulse)``.
        After the window's last pulse, every record read beyond it follows in offset order and
        :attr:`ended` is set: the replica leaves the window."""
        out: list[tuple[str, Any]] = []
        if self.ended:
            return out
        for channel, element in self.applier.pull():
            if channel == RECORDS:
                out.append(("record", self._unapplied.popleft()))
                continue
            pulse = element[1]
            out.append(("pulse", pulse))
            self._last_out = pulse
            if self.is_last(pulse) or pulse == self._declared_last:
                self.ended = True
                break
        if self.ended:
            out.extend(self._release())
        return out

    def end_after(self, pulse: Any) -> list[tuple[str, Any]]:
        """The heartbeat log showed ``pulse`` to be the window's last (a later window's pulse
        followed it, with no pulse marked last): the stretch ends right after it, on every
        replica alike.  Returns what goes out now (the records held, if it is out already)."""
        self._declared_last = pulse
        if self.ended or pulse != self._last_out:  # (no pulse of the window follows its last)
            return self.take()
        self.ended = True
        return self._release()

    def _release(self) -> list[tuple[str, Any]]:
        out = [("record", record) for record in self._unapplied]
        self._unapplied.clear()
        return out

    @property
    def held(self) -> int:
        """Records read and not out yet."""
        return len(self._unapplied)
