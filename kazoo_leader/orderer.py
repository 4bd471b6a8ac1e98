"""KaZoo as the orderer of a partition instance: the order log's state machines fed from the input queues.

The instance thread owns the :class:`~kazoo_leader.orders.OrderApplier` and the
:class:`~kazoo_leader.proposer.OrderProposer`; everything else reaches it through a small inbox
(the order log's records as they are read or acknowledged, leadership changes from the
election, failed publishes), each of which wakes the instance through its input queues.  The
I/O itself (Kafka, ZooKeeper) is at the edges: ``publish`` is handed in, and
:mod:`kazoo_leader.order_log` and :mod:`kazoo_leader.election` call the ``on_*`` methods.

Input is taken from the bounded per-channel queues only while fewer than ``hold_limit`` elements
wait here to be consumed, except from the channel the current order waits for, which is always
taken from: a follower far behind its leader back-pressures its senders without ever blocking
the channel it needs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from kazoo_leader.orders import ApplierState, Order, OrderApplier
from kazoo_leader.proposer import OrderProposer
from merge.queues import InputQueues

log = logging.getLogger(__name__)

# Elements pulled per call: bounds the time between two checks of the instance's stop flag.
PULL_LIMIT = 1024
# The shortest sleep while an order is due by time (no busy loop around the idle timeout).
MIN_WAIT_S = 0.0005


class KazooOrderer:
    """Consumes the input channels in the order of the accepted order records (every replica)."""

    def __init__(
        self,
        queues: InputQueues,
        publish: Callable[[Order], None],
        *,
        max_batch: int = 1000,
        min_batch: int = 1,
        idle_timeout_s: float = 0.002,
        max_in_flight: int = 1,
        pipeline_below: int = 1,
        hold_limit: int = 4096,
        checkpoint_every: int = 0,
        checkpoint_mark: Callable[[tuple], bool] | None = None,
        clock_tick_s: float = 0.0,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not queues.per_channel:
            raise ValueError("KaZoo needs per-channel input queues (InputQueues(per_channel=True))")
        self.queues = queues
        self.name = name
        self.applier = OrderApplier(queues.channels, checkpoint_every, checkpoint_mark)
        self.proposer = OrderProposer(self.applier, max_batch=max_batch, min_batch=min_batch,
                                      idle_timeout_s=idle_timeout_s, max_in_flight=max_in_flight,
                                      pipeline_below=pipeline_below, clock_tick_s=clock_tick_s)
        self.hold_limit = max(hold_limit, max_batch)
        self._publish = publish
        self._clock = clock
        self._wall = wall_clock
        self._inbox: deque[tuple] = deque()
        self._lock = threading.Lock()
        self._pushed = 0
        self._pulled = 0
        # observable progress (copied into the instance's metrics)
        self.published = 0
        self.republished = 0
        self.elected_at = 0.0  # wall time of the last election of this replica
        self.first_order_at = 0.0  # wall time its first order of that leadership was applied

    # -- from other threads -------------------------------------------------------------------
    def on_records(self, orders: Sequence[Order]) -> None:
        """The order log's records, in log order (the log reader's or the producer's thread)."""
        self._offer(("records", list(orders)))

    def on_leadership(self, epoch: int | None) -> None:
        """Elected with ``epoch``, or no longer leader (None) (the election's thread)."""
        self._offer(("leader", epoch))

    def on_publish_failed(self, order: Order, reason: str) -> None:
        """``order`` was not acknowledged by the log (the producer's thread): re-published if
        it is still in flight."""
        self._offer(("failed", order, reason))

    def on_error(self, reason: str) -> None:
        """The order log cannot be read: the instance fails with ``reason``."""
        self._offer(("error", reason))

    def _offer(self, item: tuple) -> None:
        with self._lock:
            self._inbox.append(item)
        self.queues.wake()

    # -- the instance thread --------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.proposer.is_leader

    @property
    def epoch(self) -> int | None:
        """The log's current epoch."""
        return self.applier.epoch

    def next_runs(self, timeout: float) -> list[tuple[int, list]]:
        """Everything consumable now, as runs ``(channel, elements)`` (the orders' clocks on
        ``CLOCK_CHANNEL``); waits up to ``timeout`` only while nothing is."""
        deadline: float | None = None
        while True:
            self._drain_inbox()
            self._take_inputs()
            now = self._clock()
            order = self.proposer.next_order(now, int(self._wall() * 1000) if self.proposer.clock_tick_s else 0)
            if order is not None:
                self.published += 1
                self._publish(order)
            pulled = self.applier.pull(PULL_LIMIT)
            if pulled:
                self._pulled += len(pulled)
                return _as_runs(pulled)
            if self.applier.checkpoint_due is not None:
                return []  # the instance checkpoints now
            if self.queues.closed:
                return []
            deadline = now + timeout if deadline is None else deadline
            remaining = deadline - now
            if remaining <= 0:
                return []
            wake_at = self.proposer.wake_at()
            if wake_at is not None:
                remaining = min(remaining, max(wake_at - now, MIN_WAIT_S))
            self.queues.wait(self._wanted_channels(), remaining)

    def restore(self, state: ApplierState) -> None:
        """A replica restored from a Rhino checkpoint: a follower continuing after ``state``'s record
        (its input channels are replayed from ``state.applied``, the log after ``state.offset``)."""
        self.applier.restore(state)
        self.proposer.restore(state.applied)

    def _drain_inbox(self) -> None:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        for item in items:
            kind = item[0]
            if kind == "records":
                self._apply_records(item[1])
            elif kind == "leader":
                self._leadership(item[1])
            elif kind == "failed":
                order, reason = item[1], item[2]
                if self.proposer.is_in_flight(order):
                    log.warning("%s: order %d/%d not written (%s): writing it again", self.name, order.epoch,
                                order.seq, reason)
                    self.republished += 1
                    self._publish(order)
            else:
                raise RuntimeError(f"order log: {item[1]}")

    def _apply_records(self, orders: list[Order]) -> None:
        applier, proposer = self.applier, self.proposer
        for order in orders:
            accepted = applier.on_record(order)
            proposer.on_record(order)
            if (accepted and order.entries and order.epoch == proposer.epoch and proposer.is_leader
                    and not self.first_order_at):
                self.first_order_at = self._wall()

    def _leadership(self, epoch: int | None) -> None:
        proposer = self.proposer
        if epoch is None:
            if proposer.is_leader:
                log.info("%s: no longer leader (epoch %s)", self.name, proposer.epoch)
            proposer.resign()
            return
        try:
            fence = proposer.become_leader(epoch)
        except ValueError as exc:  # the election's epochs only grow: the log belongs to something else
            raise RuntimeError(f"{self.name}: elected with epoch {epoch}, but {exc}") from None
        self.elected_at, self.first_order_at = self._wall(), 0.0
        log.info("%s: leader with epoch %d (log epoch %s, %d elements unordered)", self.name, epoch,
                 self.applier.epoch, proposer.uncovered())
        self.published += 1
        self._publish(fence)

    def _take_inputs(self) -> None:
        queues, applier = self.queues, self.applier
        while self._pushed - self._pulled < self.hold_limit:
            item = queues.take_any(0)
            if item is None:
                break
            self._push(*item)
        channel = applier.blocked_on
        while channel is not None:  # the current order waits for this channel: always take from it
            batch = queues.take_from(channel, 0)
            if batch is None:
                break
            self._push(channel, batch)
            channel = applier.blocked_on

    def _push(self, channel: int, batch: list) -> None:
        self.applier.push(channel, batch)
        self.proposer.on_arrival(channel, len(batch), self._clock())
        self._pushed += len(batch)

    def _wanted_channels(self) -> list[int] | None:
        """Channels whose next batch should wake us (None: any)."""
        if self._pushed - self._pulled < self.hold_limit:
            return None
        channel = self.applier.blocked_on
        return [] if channel is None else [channel]


def _as_runs(pulled: list[tuple[int, tuple]]) -> list[tuple[int, list]]:
    runs: list[tuple[int, list]] = []
    for channel, element in pulled:
        if runs and runs[-1][0] == channel:
            runs[-1][1].append(element)
        else:
            runs.append((channel, [element]))
    return runs
