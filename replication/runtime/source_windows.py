"""A KaZoo source replica's pulse windows: the partition's records and a handover's pulses in one order.

Out of a window a KaZoo source emits records as it reads them.  When the driver opens a window
(its word reaches :attr:`KazooWindows.pending_window` through the worker's ``pulse_windows``
service), the replica holds its records from where it is and reports that position
(:attr:`KazooWindows.holding`); the heartbeat generator writes the window's pulses from the
furthest such position on.  From the window's first pulse on, the replica the partition's
election names orders records and pulses as they arrive in the partition's order log, and every
replica emits them in that order (:mod:`replication.runtime.window_placement`): a record waits
one order-log round trip, not for a pulse beyond it.  After the window's last pulse the records
read beyond it go out and reading goes on.  A restored replica first reads the heartbeat log to
its end, so a window written while it was away is placed from the log, not announced again
(:mod:`liverobin.windows` decides; this is the source's side of it), in the order its log kept.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from kazoo_leader.orderer import MIN_WAIT_S
from kazoo_leader.window_order import WindowRecord
from liverobin.windows import HOLD, LEAVE, PulseWindows
from replication.runtime.instance import IDLE_WAIT_S
from replication.runtime.window_placement import WindowOrders, WindowPlacer
from transport.kafka_feeds import PartitionFeed

log = logging.getLogger(__name__)


class KazooWindows:
    """The pulse-window part of :class:`~replication.runtime.source.SourceInstance` (a mixin: it
    runs on the source replica's thread, with the replica's feed, pulses and emitter)."""

    _windows: PulseWindows | None
    _pulses: Any
    _reader: Any
    pending_window: tuple | None
    _window_word: tuple | None
    holding: tuple[int, dict[int, int]] | None
    kafka_partitions: list[int]
    topic: str
    _next_offset: dict[int, int]
    start_offsets: dict[int, int]
    metrics: Any
    name: str
    stop_requested: Any
    _emit_counted: Any  # (msg, ingest time): one record out, counted for checkpoints
    worker: Any
    task: Any
    partition: int
    cfg: Any
    wake: Any
    idle_wait: Any

    # -- the partition's order log and election ----------------------------------------------------
    def _open_window_order(self, restoring: bool) -> None:
        """This partition's order log through the worker's reader and writer (a restored replica's
        own, from :meth:`_follow_window_log`), its election in the worker's ZooKeeper session."""
        cfg = self.cfg
        self._window_orders = WindowOrders(
            max_batch=cfg.kazoo_max_batch, min_batch=cfg.kazoo_min_batch,
            idle_timeout_s=cfg.kazoo_idle_timeout_ms / 1000, max_in_flight=cfg.kazoo_max_in_flight,
            pipeline_below=cfg.kazoo_pipeline_below)
        self._window_inbox: deque[tuple] = deque()  # the log's records, leadership (other threads)
        self._window_log = self.worker.plan.window_order_logs[(self.task.id, self.partition)]
        self._window_candidate: Any = None
        self._order_reader: Any = None
        if not restoring:
            self._follow_window_log(self.worker.feeds.order_log())
        self._election_path = f"{self.worker.boot.election_root}/t{self.task.id}p{self.partition}"
        self.worker.feeds.election()

    def _follow_window_log(self, reader: Any, start: int = 0) -> None:
        """Read the order log from position ``start``: its start, or for a restored replica where
        its checkpoint says no window it had not finished has a record below (a window's order
        is read whole: the checkpoints a replica is restored from lie outside every window's
        ordered stretch)."""
        self._order_reader = reader
        self._publish_window_record = reader.register(
            self._window_log, start, on_records=lambda records: self._window_news(("records", records)),
            on_failed=lambda record, reason: self._window_news(("failed", record, reason)),
            on_error=lambda reason: self._window_news(("error", reason)),
            pending=self._window_order_pending, decode=WindowRecord.decode)

    def _join_window_election(self) -> None:
        self._window_candidate = self.worker.feeds.election().candidate(
            self._election_path, lambda epoch: self._window_news(("leader", epoch)))

    def _window_news(self, item: tuple) -> None:
        self._window_inbox.append(item)
        self.wake()

    def _window_wait(self) -> float:
        """How long the loop may wait for its feed in a window (a pulse or the order log's news
        ends the wait): until the window order's next batch is due, or a writer's commit."""
        longest = self.idle_wait(IDLE_WAIT_S)
        wake_at = self._window_orders.wake_at()
        return longest if wake_at is None else min(longest, max(wake_at - time.monotonic(), MIN_WAIT_S))

    def _window_order_pending(self) -> bool:
        """Whether a window's order is to be read here (the order log reader's thread)."""
        return self.holding is not None or self._window_orders.waiting

    def _serve_window_order(self) -> None:
        """What the other threads brought, then publish what the order wants published."""
        inbox, orders = self._window_inbox, self._window_orders
        while inbox:
            item = inbox.popleft()
            kind = item[0]
            if kind == "records":
                orders.on_records(item[1])
            elif kind == "leader":
                log.info("%s: %s window order", self.name, "leads the" if item[1] is not None else "follows the")
                orders.on_leadership(item[1])
            elif kind == "failed":
                if orders.is_in_flight(item[1]):
                    log.warning("%s: window order record not written (%s): writing it again", self.name, item[2])
                    self._publish_window(item[1])
            else:
                raise RuntimeError(f"{self.name}: window order log: {item[1]}")
        for record in orders.due(time.monotonic()):
            self._publish_window(record)

    def _publish_window(self, record: WindowRecord) -> None:
        # the election drops the epoch the moment ZooKeeper is in doubt: nothing goes out under an
        # epoch that may have been superseded
        candidate = self._window_candidate
        if candidate is not None and candidate.epoch == record.order.epoch:
            self._publish_window_record(record)

    def _window_changed(self, placer: WindowPlacer | None, feed: PartitionFeed) -> WindowPlacer | None:
        """The driver's word on the pulse window changed: start holding (and report where this
        replica is), or stop because the window closed before any pulse was written."""
        word = self._window_word = self.pending_window
        assert self._windows is not None and word is not None
        action = self._windows.announce(*word)
        if action == LEAVE:
            if placer is not None:
                placer = self._leave_window(placer, feed)
            action = self._windows.announce(*word)  # the same word may open the next window
        if action == HOLD:
            return self._hold(word[0])
        return placer

    def _show_window(self, placer: WindowPlacer | None) -> None:
        windows, metrics = self._windows, self.metrics
        assert windows is not None
        metrics.window = (-1 if windows.current is None else windows.current, windows.handled,
                          -1 if windows.pending is None else windows.pending)
        metrics.held_records = 0 if placer is None else placer.held
        orders = self._window_orders
        metrics.leader = orders.epoch is not None  # (of the partition's window order)
        metrics.order_epoch = -1 if orders.current is None or orders.current.applier.epoch is None \
            else orders.current.applier.epoch
        if self._order_reader is not None:
            metrics.order_log_at = self._order_reader.position(self._window_log)

    def _hold(self, window: int) -> WindowPlacer:
        """Start holding for ``window`` (announced open) at this replica's position and report it."""
        placer = self._placer_here()
        self.holding = (window, {placer.partition: placer.fetched_to})
        self.worker.link.ring()  # (every record waits until the window's first pulse: report now)
        self._windows.queue(self._pulses.take())
        self._feed(placer)
        return placer

    def _placer_here(self) -> WindowPlacer:
        k = self.kafka_partitions[0]
        if self._order_reader is not None:
            self._order_reader.input_arrived()  # (a resting reader reads on)
        return WindowPlacer(self.topic, k, self._next_offset.get(k, self.start_offsets.get(k, 0)),
                            self._window_orders, time.monotonic)

    def _feed(self, placer: WindowPlacer) -> None:
        """Give ``placer`` the queued pulses of the window held for; tell it the window's end as
        soon as the heartbeat log shows it."""
        windows = self._windows
        assert windows is not None
        for record in windows.to_place():
            placer.add_pulse(record)
        if windows.current is None or windows.end_h is not None:
            placer.end_window()

    # -- a restored replica: the windows written before it came back -----------------------------
    def _start_replay(self) -> WindowPlacer | None:
        """Read the heartbeat log to its end as it was now before emitting anything: a window whose
        pulses are already in it is not announced to this replica again, and a record may only go
        out once no pulse before it can still be unknown.  Restored inside a window: hold again."""
        assert self._reader is not None and self._windows is not None
        while not self._reader.caught_up.wait(0.1):
            if self.stop_requested.is_set():
                return None
        self._windows.queue(self._pulses.take())
        if self._windows.current is None:
            return None
        placer = self._placer_here()
        self._feed(placer)
        return placer

    def _next_window(self) -> WindowPlacer | None:
        """Out of any window: enter the next window of the queued pulses (written before it was
        restored, or while it was not yet among the replicas a window waited for), else hold for
        the window announced while it still placed others; None: neither."""
        windows = self._windows
        assert windows is not None
        entered = windows.next_window()
        if entered == HOLD:
            return self._hold(windows.current)
        if not entered:
            return None
        self._entered_from_log()
        placer = self._placer_here()
        self._feed(placer)
        return placer

    def _entered_from_log(self) -> None:
        assert self._windows is not None
        log.warning("%s: places the pulses of window %d from the heartbeat log (it came back behind them)",
                    self.name, self._windows.current)
        self.metrics.windows_from_log += 1

    def _after_window(self, placer: WindowPlacer, feed: PartitionFeed) -> WindowPlacer | None:
        """The window's last pulse is out.  If the next window's pulses are already queued, the records
        held may lie on both sides of them: hold on with the same placer; else leave."""
        assert self._windows is not None
        placer.end_window()
        if self._windows.enter_queued():
            self._entered_from_log()
            self._feed(placer)
            return placer
        return self._leave_window(placer, feed)

    def _leave_window(self, placer: WindowPlacer, feed: PartitionFeed) -> None:
        """Emit the records held beyond the window's last pulse; from now on records go out as read."""
        for item in placer.release_records():
            self._emit_counted(*item)
        feed.resume()
        self.holding = None
        return None
