"""Source instances: a partition of a source task reading its Kafka partitions.

A :class:`SourceInstance` reads its Kafka partitions by manual assignment, emits watermarks at
deterministic record positions and places LiveRobin pulses or KaZoo pulse windows, driving its
operator chain itself until every partition is read to its drain position (without pulses:
:mod:`.source_drain`) or it is stopped.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError

from liverobin import PulsePlacer
from liverobin.heartbeats import PULSE_ITEM, PulseRecord
from liverobin.windows import PulseWindows
from replication import savepoint
from replication.plan import PhysicalPlan, TaskSpec
from replication.records import kafka_record, kafka_time
from replication.runtime.elements import DATA
from replication.runtime.instance import IDLE_WAIT_S, PartitionInstance
from replication.runtime.source_drain import SourceDrain
from replication.runtime.source_records import Rejected, SourceRecords, Watermarks
from replication.runtime.source_windows import KazooWindows
from replication.runtime.window_placement import ORDERED_ITEM, WindowOrders, WindowPlacer
from transport.kafka_feeds import PartitionFeed

log = logging.getLogger(__name__)


class SourceInstance(KazooWindows, PartitionInstance):
    """Reads assigned Kafka partitions; emits watermarks at deterministic record positions."""

    def __init__(self, worker: Any, task: TaskSpec, partition: int, replica: int, plan: PhysicalPlan,
                 restoring: bool = False) -> None:
        super().__init__(worker, task, partition, replica, plan, restoring)
        spec = task.head.spec
        self.topic: str = spec["topic"]
        self.kafka_partitions: list[int] = plan.source_partitions[task.id][partition]
        self.records = SourceRecords(spec, kafka_record, kafka_time)
        self.start_offsets = plan.source_start_offsets.get(task.id, {})
        self.drain = SourceDrain(self.cfg, f"replication-{worker.job_name}-{task.id}-{partition}", self.topic,
                                 self.kafka_partitions)
        # LiveRobin: the counted pulses of the heartbeat log, from the worker's reader (END follows the
        # final pulse)
        # (a restored replica subscribes to a reader of its own: the shared one started long ago)
        # KaZoo: the pulses of the windows a handover opens; records wait for pulses only inside one
        self._pulses = worker.feeds.pulse_reader().subscribe() if plan.heartbeat_log is not None and not restoring \
            else None
        self._windows = PulseWindows() if self.cfg.mode == "kazoo" and plan.heartbeat_log is not None else None
        self._window_orders: WindowOrders | None = None
        if self._windows is not None:
            self._open_window_order(restoring)
        self.pending_window: tuple | None = None  # the driver's latest word on the pulse window (worker thread)
        self._window_word: tuple | None = None
        self.holding: tuple[int, dict[int, int]] | None = None  # (window, {partition: position}) for the driver
        self.watermarks = Watermarks(self.kafka_partitions, spec["max_out_of_orderness_ms"],
                                     self.cfg.watermark_interval_ms)
        self._next_offset: dict[int, int] = dict(self.start_offsets)  # else: the low watermark
        self._after_pulse = 0  # a restored replica: pulses up to this one are behind it
        self._pulse_placed: PulseRecord | None = None  # the counted record of the last pulse placed
        self._read = 0  # records emitted (count-based checkpoints)
        self._last_counted = 0  # the last count-based checkpoint (its id: records emitted)
        if self._windows is not None:
            self.checkpoint_every = 0  # KaZoo: count-based checkpoints only, inside pulse windows too
        self._reader: Any = None  # a restored replica's own reader of the heartbeat log
        self._hold_limit = max(4 * self.cfg.channel_batch_size, 2 * self.cfg.liverobin_max_pulse_step)
        self._reading: PartitionFeed | None = None  # while the loop runs

    def restore_from(self, meta: Any, state_dir: Path) -> dict[str, Any]:
        rt = super().restore_from(meta, state_dir)
        self.start_offsets = {**self.start_offsets, **rt["offsets"]}
        self._next_offset = dict(rt["offsets"])
        self.watermarks.max_ts = dict(rt["max_ts"])
        self.watermarks.emitted = self.metrics.watermark = rt["emitted_wm"]
        self._after_pulse = self.metrics.pulse = rt["pulse"]
        self._pulse_placed = rt.get("pulse_placed")
        self._read = rt.get("read", 0)
        self._last_counted = self._read
        if self._windows is not None:
            if rt.get("windows") is not None:
                self._windows.restore(*rt["windows"])
                current, handled = rt["windows"]
                self._window_orders.finish(handled if current is None else current - 1)  # (behind it)
            self._windows.after_pulse = self._after_pulse
        # the worker's shared reader started long ago: read the log again, from right after the last
        # pulse placed before the checkpoint (what counts is decided by the log alone, and the
        # counting goes on from that pulse's record, so the same pulses come out)
        if self.worker.plan.heartbeat_log is not None:
            reader = self._reader = self.worker.feeds.own_pulse_reader(self._pulse_placed)
            self._pulses = reader.subscribe()
            reader.start()
        if self._windows is not None:  # (the shared order log reader started long ago)
            order_log = self.worker.feeds.own_order_log()
            # a checkpoint of an earlier build, or of a run that had window order logs of its own,
            # placed its windows in another log: this one is read from its start (the records of
            # windows the checkpoint had handled are dropped)
            same_log = rt.get("window_log") == self._window_log.prefix
            self._follow_window_log(order_log, rt.get("order_from", 0) if same_log else 0)
            order_log.start()
        return rt

    def savepoint_content(self) -> dict[str, Any]:
        """Where the next run starts reading, and the event-time marks to continue from."""
        return {"offsets": {**self.start_offsets, **self._next_offset}, "max_ts": dict(self.watermarks.max_ts),
                "emitted_wm": self.watermarks.emitted}

    def _load_savepoint(self, root: str, meta: dict[str, Any]) -> None:
        """The offsets come with the plan; the event-time marks, so that watermarks go on from
        where the last run left them."""
        if self.task.name in meta["sources"]:
            part = savepoint.read_partition(root, self.task.name, self.partition)
            marks = self.watermarks
            marks.max_ts.update({k: v for k, v in part["max_ts"].items() if k in marks.max_ts})
            marks.emitted = self.metrics.watermark = part["emitted_wm"]

    def request_drain(self) -> None:
        """Read to the current end and finish (LiveRobin: the final pulse of the log decides)."""
        if self.drain.request():
            self.wake()

    def request_stop(self) -> None:
        super().request_stop()
        self.wake()

    def _open_feed(self) -> PartitionFeed:
        """This replica's partitions, read through the worker's one source consumer."""
        # LiveRobin: the fetch thread reports where records exist at once; waiting for this thread
        # would wait for a pulse, which waits for the report
        on_high = self._report_position if self._pulses is not None and self._windows is None else None
        return self.worker.feeds.source_consumer().open(
            self.topic, {k: self.start_offsets.get(k, OFFSET_BEGINNING) for k in self.kafka_partitions},
            limit=self._hold_limit, on_high=on_high)

    def _report_position(self, k: int, low: int, position: int) -> None:
        """Every record of Kafka partition ``k`` below ``position`` exists: the heartbeat
        generators place pulses there (the worker's outbox drops a report that moves nothing).
        Not before a fetch told where the partition starts (``low``), if the plan does not.
        Called by the fetch thread (LiveRobin; a KaZoo window starts where the replicas held,
        which they report with their heartbeats, and its leader orders the rest)."""
        start = self.start_offsets.get(k, low)
        if start >= 0:
            self.worker.link.report_position(self.topic, k, start, position)

    def wake(self) -> None:
        """End the loop's wait for records (any thread: the worker's word, a pulse)."""
        feed = self._reading
        if feed is not None:
            feed.wake()

    def run(self) -> bool:
        batch = self.cfg.channel_batch_size
        feed = self._reading = self._open_feed()
        if self._pulses is not None:
            self._pulses.on_pulse = self.wake
        placer = self._pulse_placer() if self._windows is None else None
        if self.cfg.rhino_enabled and self.restored is None:
            self._source_checkpoint(0, 0)  # at once: restorable from its first seconds on, idle or not
        if self._windows is not None:
            self._join_window_election()
        if self._windows is not None and self.restored is not None:
            placer = self._start_replay()
        drained = False
        try:
            while not self.stop_requested.is_set():
                # take what is there without waiting for a full batch; block only when idle
                if self.pending_control is not None:
                    self.poll_control()
                # (windows already in the log first: one announced now waits until they are placed)
                if placer is None and self._windows is not None:
                    self._windows.queue(self._pulses.take())  # a window this replica was not waited for
                    if self._windows.later or self._windows.pending:
                        placer = self._next_window()
                if self._windows is not None and self.pending_window != self._window_word:
                    placer = self._window_changed(placer, feed)
                if placer is None and self.drain.hold(self._next_offset):  # (a drain without pulses)
                    self.idle()
                    time.sleep(0.01)
                    continue
                messages = feed.consume(batch, 0)
                if placer is None:
                    if not messages:
                        self.flush_outputs()
                        messages = feed.consume(batch, self.idle_wait(IDLE_WAIT_S))
                else:  # pulses, and in a KaZoo window the order log's news, ring the feed too
                    windowed = self._windows is not None
                    pulses = self._pulses.take()
                    if not messages and not pulses and not (windowed and self._window_inbox):
                        self.flush_outputs()
                        wait = self._window_wait() if windowed else self.idle_wait(IDLE_WAIT_S)
                        messages = feed.consume(batch, wait)
                        pulses = self._pulses.take()
                    if windowed:
                        self._windows.queue(pulses)
                        self._feed(placer)
                    else:
                        for record in pulses:
                            if record.h > self._after_pulse:
                                placer.add_pulse(record)
                if not messages:
                    self.idle()
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        if err.fatal():
                            raise RuntimeError(f"Kafka consumer fatal error: {err}")
                        log.warning("%s: consumer error: %s", self.name, err)
                        continue
                    if placer is None:
                        if self.drain.beyond(msg.partition(), msg.offset()):
                            continue  # beyond where the replicas end
                        self._emit_counted(msg, time.time())
                    else:
                        placer.add_record(msg.offset(), (msg, time.time()))
                if self._window_orders is not None:
                    self._serve_window_order()
                if placer is not None:
                    if self._place(placer, feed):
                        drained = True
                        return True
                    if self._windows is not None and self._windows.current is None:
                        placer = self._after_window(placer, feed)  # its last pulse is out
                elif self.drain.done(feed, self._next_offset, self.start_offsets):
                    drained = True
                    return True
                if self._windows is not None:
                    self._show_window(placer)
                if self.drain.requested_at is not None:
                    self.metrics.drain = self.drain.progress(feed, self._next_offset)
            return False
        finally:
            self._reading = None
            feed.close()
            # (a replica that read everything keeps its leadership: nothing is left to order)
            if self._windows is not None and self._window_candidate is not None and not drained:
                self._window_candidate.withdraw()

    def _emit(self, msg: Any, ingest: float) -> None:
        """One Kafka record into the chain (or the dead-letter topic); watermarks follow record
        positions, so both replicas of the partition emit them at the same places."""
        k, off, raw = msg.partition(), msg.offset(), msg.value()
        self._next_offset[k] = off + 1
        origin = (self.topic, k, off)
        self.metrics.records_in += 1
        try:
            value, ts = self.records.decode(raw, msg)
        except Rejected as rejected:
            self.dead_letter(reason=rejected.reason, operator=self.task.head.name, origin=origin, payload=raw or b"")
            return
        self.chain.process((DATA, value, None, ts, ingest, origin))
        wm = self.watermarks.observe(k, ts)
        if wm is not None:
            self.metrics.watermark = wm
            self.chain.on_watermark(wm)

    def _emit_counted(self, msg: Any, ingest: float, checkpoint: bool = True) -> None:
        """:meth:`_emit`, with count-based checkpoints (KaZoo mode: both replicas emit the same
        records, pulses or not): before a record whose Kafka timestamp enters a new
        ``rhino.checkpointInterval``, and every ``count_every`` records; none among the records of
        a pulse window's ordered stretch (``checkpoint`` false)."""
        if self.count_every and self._new_interval(msg.timestamp()[1]) and self._read > self._last_counted \
                and checkpoint:
            self._last_counted = self._read
            self._source_checkpoint(self._read, self.metrics.pulse)
        self._emit(msg, ingest)
        if self.count_every:
            self._read += 1
            if self._read % self.count_every == 0 and checkpoint:
                self._last_counted = self._read
                self._source_checkpoint(self._read, self.metrics.pulse)

    def _source_checkpoint(self, checkpoint_id: int, pulse: int) -> None:
        """Every record before this point is out, none after it: where a restore resumes (a Kafka
        partition with no record read yet restarts where this run started).  ``pulse``: the last
        one placed; KaZoo: the pulse window held for."""
        placed = self._pulse_placed if self._pulse_placed is not None and self._pulse_placed.h == pulse else None
        orders = self._window_orders
        self.take_checkpoint(checkpoint_id, {"offsets": dict(self._next_offset), "max_ts": dict(self.watermarks.max_ts),
                                             "emitted_wm": self.watermarks.emitted, "pulse": pulse, "read": self._read,
                                             "pulse_placed": placed,
                                             "windows": None if self._windows is None else self._windows.state(),
                                             "order_from": 0 if orders is None else orders.resume_from,
                                             "window_log": None if orders is None else self._window_log.prefix})

    # -- LiveRobin: pulses at positions read from the heartbeat log ---------------------------
    def _pulse_placer(self) -> PulsePlacer | None:
        if self._pulses is None:
            return None
        if len(self.kafka_partitions) != 1:
            raise RuntimeError(f"{self.name}: LiveRobin needs one Kafka partition per source partition")
        k = self.kafka_partitions[0]
        return PulsePlacer(self.topic, k, fetched_to=self.start_offsets.get(k, 0))

    def _place(self, placer: PulsePlacer | WindowPlacer, feed: PartitionFeed) -> bool:
        """Emit what the pulses known so far allow; True once the final pulse is out (drained)."""
        pos = feed.position(placer.partition)
        if pos >= 0:
            placer.fetched(pos)  # also past transaction markers, which are never returned as records
        elif placer.partition not in self._next_offset:
            low = feed.low_watermark(placer.partition)
            if low >= 0:
                placer.fetched(low)  # nothing below the low watermark exists
        for kind, item in placer.take():
            if kind == PULSE_ITEM:
                h, final, t = item
                self.metrics.pulse = h
                self._pulse_placed = placer.last_placed
                self.chain.on_pulse(h, t)
                if self._windows is not None and self._windows.placed(h):
                    break  # the window's last pulse: the records after it go out as read
                if self.checkpoint_every and h % self.checkpoint_every == 0:
                    # every record before the pulse is out, none after it: where a restore resumes
                    self._source_checkpoint(h, h)
                if final:
                    return True
            else:
                self._emit_counted(*item, checkpoint=kind != ORDERED_ITEM)
        # the records held wait for a pulse beyond them; the heartbeat log is never paused
        if placer.held > self._hold_limit:
            feed.pause()
        elif placer.held < self._hold_limit // 2:
            feed.resume()
        return False
