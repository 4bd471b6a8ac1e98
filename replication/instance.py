"""Partition instances: one running copy of one partition of a task, hosted by a worker.

A :class:`ProcessingInstance` receives batches on its input channels (dedup by
seq, bounded queues), consumes them in the orderer's order, drives watermarks
(minimum over channels) and runs its operator chain.  A :class:`SourceInstance`
reads its Kafka partitions by manual assignment and drives the chain itself.
Both end on a graceful drain (END on every input, or every Kafka partition read
to its end) or on stop.
"""

from __future__ import annotations

import logging
import pickle
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError

from kazoo_leader.orderer import KazooOrderer
from kazoo_leader.segments import SegmentedLog
from liverobin import LiveRobinOrderer, PulsePlacer
from liverobin.heartbeats import PULSE_ITEM, PulseRecord
from liverobin.windows import HOLD, LEAVE, PulseWindows
from merge import ArrivalOrderer, InputQueues, QueuesClosed
from replication import savepoint
from replication.channels import OutputChannel
from replication.deadletter import ExactlyOnceDeadLetters, describe_error
from replication.dedup import Dedup
from replication.elements import DATA, END, MAX_WATERMARK, MIN_WATERMARK, PULSE, WATERMARK
from replication.framing import BatchHeader, decode_elements
from replication.handovers import (
    CodeOrder,
    CodeSwitches,
    HandoverOrder,
    PartitionHandovers,
    RouterSwitches,
    arm_acks,
    split_cut,
    vnode_bytes,
)
from replication.metrics import InstanceMetrics
from replication.operators import Router, build_chain, chain_operators, serves_through_moves
from replication.plan import PhysicalPlan, TaskSpec, replica_name
from rhino_state import RocksDBStateBackend, StateContext, encode_key, key_group
from rhino_state.cut import entry_bytes
from rhino_state.increments import digest_hex
from transport.kafka_feeds import PartitionFeed
from transport.kafka_io import end_offsets_by_fetch

log = logging.getLogger(__name__)

# KaZoo, in a pulse window: how long an idle source waits for the next pulse before polling
# Kafka again.
PULSE_WAIT_S = 0.005
# The longest an idle source sleeps: records, pulses and every word from its worker (roles,
# drain, stop, pulse windows) wake it, so this only bounds the cost of a wake-up missed by a bug.
IDLE_WAIT_S = 1.0


class PartitionInstance:
    """Shared plumbing: metrics, dead letters, state, output channels, lifecycle."""

    def __init__(self, worker: Any, task: TaskSpec, partition: int, replica: int, plan: PhysicalPlan,
                 restoring: bool = False) -> None:
        self.worker = worker
        self.restoring = restoring  # built to be restored from a checkpoint (restore_from follows)
        self.cfg = worker.cfg
        self.task = task
        self.partition = partition
        self.replica = replica
        self.replicated = plan.replicas > 1
        # sinks number their records and write them in transactions, so that a writer taking over
        # (another replica, or this partition restored from a checkpoint) skips what the output has
        self.exactly_once_sink = self.replicated or self.cfg.rhino_enabled
        self.parallelism = task.parallelism
        self.name = replica_name(task.name, partition, replica)
        self.sink_id = f"{worker.boot.output_prefix or worker.boot.run_id}:{task.id}:{partition}"
        self._sink_partitions = plan.sink_topic_partitions
        self.sinks: list[Any] = []
        # the exactly-once outputs (sinks, dead letters), each written by the replica the driver names
        self.writers: list[Any] = []
        self.dead_letters = ExactlyOnceDeadLetters(
            self.name, self.cfg, replica, self.sink_id, self.cfg.dead_letter_topic(worker.job_name),
            worker.job_name) if self.exactly_once_sink else None
        if self.dead_letters is not None:
            self.writers.append(self.dead_letters)
        self.pending_control: dict[str, tuple] | None = None  # writer roles by output kind, set by the worker
        self.roles_given: dict[str, tuple] | None = None  # the last roles the worker handed over
        self.num_key_groups = plan.num_key_groups
        keyed_outputs = {e.dst_task for e in task.outputs if e.partitioning == "hash"}
        self.router_switches = RouterSwitches({t: plan.routing[t] for t in keyed_outputs}, plan.num_key_groups)
        # handovers of this task's vnodes (origin and target roles), and the acks for the driver
        self.handovers = (PartitionHandovers(task.id, partition, plan.num_key_groups, plan.routing[task.id].num_vnodes,
                                             keep_cuts=worker.cfg.rhino_enabled)
                          if task.id in plan.routing else None)
        self.code_switches = CodeSwitches()  # operator replacements (processing tasks)
        self.code: dict[str, bytes] = {}  # operator -> the function replacing it (cloudpickled), checkpointed
        self.attempt = 0  # a restored replica: its incarnation (its handover acks carry it)
        self.measure_request = 0  # the driver's latest request to measure the state per vnode
        self.savepoint_dir: str | None = None  # set by the worker: a drain that ends in a savepoint
        self._handover_acks: list[tuple] = []
        self._acked: set[tuple[int, str]] = set()
        self._ack_lock = threading.Lock()
        self.metrics = InstanceMetrics()
        self.outputs: list[OutputChannel] = []
        self.stop_requested = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self._backend: RocksDBStateBackend | None = None
        self._state_dir: Path = worker.state_root / f"t{task.id}-p{partition}"
        self.chain: Any = None
        self._thread: threading.Thread | None = None
        # Rhino: checkpoint every N pulses or orders (0: off), or (kazoo mode, no order log) every
        # M records read or elements consumed; a restored replica starts from ``restored``
        rhino = self.cfg.rhino_enabled
        self.checkpoint_every = self.cfg.rhino_checkpoint_every if rhino else 0
        ordered = self.cfg.mode == "liverobin" or (task.id, partition) in plan.order_logs
        self.count_every = self.cfg.rhino_checkpoint_elements if rhino and not ordered else 0
        self.restored: Any = None  # IncrementMeta of the checkpoint this replica was restored from
        self._restored_runtime: dict[str, Any] | None = None
        # count-based checkpoints also when the record time (Kafka timestamp at a source, event time
        # downstream) enters a new rhino.checkpointInterval: at the same records on both replicas
        self._interval_ms = self.cfg.rhino_checkpoint_interval_ms
        self._time_bucket: int | None = None  # the latest interval seen (restored with the checkpoint)

    # -- environment offered to operators -------------------------------------------------
    def state_backend(self) -> RocksDBStateBackend:
        if self._backend is None:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            self._backend = RocksDBStateBackend(str(self._state_dir), cache_max_entries=self.cfg.state_cache_entries,
                                                instance=(self.task.id, self.partition))
        return self._backend

    def state_context(self, operator_name: str) -> StateContext:
        return StateContext(self.state_backend(), operator_name, self.num_key_groups)

    # -- handovers (replication.handovers) --------------------------------------------------
    def apply_handover(self, order: HandoverOrder | CodeOrder, restored: bool = False) -> None:
        """Worker thread: install, commit or cancel ``order`` in the roles this replica has in it
        (``restored``: armed by :meth:`rearm`, where a part found done is in the checkpoint)."""
        outcomes: dict[str, str] = {}
        if isinstance(order, CodeOrder):
            if order.task == self.task.id and not self.task.is_source:
                outcomes["operator"] = self.code_switches.arm(order)
        else:
            if (self.task.id, self.partition) in order.upstreams:
                outcomes["upstream"] = self.router_switches.arm(order)
            if self.handovers is not None and order.task == self.task.id and \
                    self.partition in order.origins | order.targets:
                outcome = self.handovers.arm(order)
                outcomes.update({role: outcome for role, members in (("origin", order.origins),
                                                                     ("target", order.targets))
                                 if self.partition in members})
        for kind in arm_acks(order, outcomes, restored):
            self.handover_ack(order.handover_id, order.epoch, kind)

    def rearm(self, orders: list[HandoverOrder | CodeOrder], pulse: int) -> None:
        """A replica restored from the checkpoint at pulse ``pulse``: arm the committed orders
        the driver still retains; those the checkpoint already includes are skipped ("done")."""
        self.code_switches.position = pulse
        if self.handovers is not None:
            self.handovers.position = pulse
        for order in orders:
            self.apply_handover(order, restored=True)

    def handover_ack(self, handover_id: int, epoch: int, kind: str, digest: str = "", entries: int = 0,
                     times: dict[str, float] | None = None) -> None:
        """Queue an acknowledgement for the driver (the worker sends its next heartbeat now), once.
        It carries the wall-clock time of the action (``at``) and ``times``: what else the driver
        cannot see (a target's cut arrival, release and load; an origin's bytes cut)."""
        with self._ack_lock:
            if (handover_id, kind) in self._acked:
                return
            self._acked.add((handover_id, kind))
            self._handover_acks.append((handover_id, epoch, (self.task.id, self.partition, self.replica), kind,
                                        digest, entries, self.attempt, self.metrics.checkpoint_id,
                                        {"at": time.time(), **(times or {})}))
        self.worker.beat_soon()  # the next step of the handover waits for this ack

    def take_handover_acks(self) -> list[tuple]:
        with self._ack_lock:
            acks, self._handover_acks = self._handover_acks, []
        return acks

    # -- Rhino checkpoints ----------------------------------------------------------------
    def restore_from(self, meta: Any, state_dir: Path) -> dict[str, Any]:
        """Before :meth:`build`: run on the restored RocksDB at ``state_dir`` and continue from
        ``meta``'s runtime state.  Returns that runtime state (the worker needs the output seqs)."""
        self.restored = meta
        self._state_dir = state_dir
        rt = self._restored_runtime = pickle.loads(meta.runtime)
        self.metrics.restored_from = meta.checkpoint_id
        self.router_switches.restore(rt.get("routing", {}))  # the handovers it had switched at
        self.code = dict(rt.get("code", {}))  # the operator replacements it had made
        self._time_bucket = rt.get("time_bucket")
        if self.dead_letters is not None:
            self.dead_letters.out.restore_state(rt.get("dead_letters", -1))  # those after it are written again
        return rt

    def _restore_operators(self) -> None:
        rt = self._restored_runtime
        if rt is not None:
            for op, snap in zip(chain_operators(self.chain), rt["operators"], strict=True):
                op.restore(snap)
                if op.name in self.code:
                    op.replace_fn(pickle.loads(self.code[op.name]))

    def _new_interval(self, ts: int) -> bool:
        """Whether record time ``ts`` (ms) enters a later checkpoint interval than any seen before;
        the first record only starts counting."""
        bucket = ts // self._interval_ms
        known, self._time_bucket = self._time_bucket, bucket if self._time_bucket is None else max(
            self._time_bucket, bucket)
        return known is not None and bucket > known

    def _record_enters_new_interval(self, element: tuple) -> bool:
        """An ordered partition also checkpoints after the order record holding such a record."""
        return element[0] == DATA and self._new_interval(element[3])

    def take_checkpoint(self, checkpoint_id: int, runtime: dict[str, Any]) -> None:
        """Checkpoint the state as it is now, at a position both replicas share; the runtime
        state (positions, orderer, operators, output seqs) rides along."""
        started = time.perf_counter()
        runtime["time_bucket"] = self._time_bucket
        runtime["operators"] = [op.snapshot() for op in chain_operators(self.chain)]
        runtime["outputs"] = {ch.spec.id: ch.next_seq for ch in self.outputs}
        runtime["routing"] = self.router_switches.tables()
        runtime["code"] = dict(self.code)
        runtime["dead_letters"] = self.dead_letters.out.checkpoint_state() if self.dead_letters is not None else -1
        meta, shipped = self.worker.checkpoints.take(self, checkpoint_id, pickle.dumps(runtime, protocol=5),
                                                     runtime.get("positions", {}), runtime["outputs"])
        m = self.metrics
        m.checkpoints_taken += 1
        m.checkpoint_id, m.checkpoint_digest = checkpoint_id, meta.digest
        m.checkpoint_bytes_changed += meta.bytes_changed
        if shipped:
            m.checkpoint_bytes_shipped += meta.bytes_shipped
        m.checkpoint_ms = (time.perf_counter() - started) * 1000

    def dead_letter(self, *, reason: str, operator: str, origin: Any, payload: bytes,
                    payload_kind: str = "original") -> None:
        self.metrics.dead_lettered += 1
        writer = self.dead_letters if self.dead_letters is not None else self.worker.dead_letters
        writer.send(reason=reason, operator=operator, origin=origin, payload=payload, payload_kind=payload_kind)

    def sink_producer(self) -> Any:
        return self.worker.sink_producer

    def sink_partition(self, topic: str) -> int:
        """The output partition of this sink partition (replicated sinks write one partition each)."""
        return self.partition % self._sink_partitions[topic]

    def register_sink(self, sink: Any) -> None:
        """An exactly-once sink of the chain (it takes the driver's writer role of kind ``out``)."""
        self.sinks.append(sink)
        self.writers.append(sink)

    def poll_control(self) -> None:
        """Apply the latest writer roles from the job master (instance thread only)."""
        control, self.pending_control = self.pending_control, None
        if control is not None:
            for writer in self.writers:
                role = control.get(writer.kind)
                if role is not None:
                    writer.control(*role)

    def flush_outputs(self) -> None:
        """Called when the instance has no input left to process: each output channel with nothing
        on its way sends its open batch now (:meth:`OutputChannel.flush_if_free`), so at a low rate
        a record does not wait for the buffer timeout, and under load batches still fill."""
        if self.cfg.channel_flush_when_idle:
            for ch in self.outputs:
                ch.flush_if_free()

    def idle(self) -> None:
        """Called by the instance loop between batches: commit what is due."""
        for writer in self.writers:
            writer.on_idle()

    def idle_wait(self, longest: float) -> float:
        """How long the instance loop may wait for input: until a writer's next commit (or
        takeover poll) is due, at most ``longest``."""
        due = [d for w in self.writers if (d := w.due_in()) is not None]
        return min(longest, *due) if due else longest

    def wake(self) -> None:
        """Make the instance loop look at its control fields now (any thread)."""

    def flush_producer(self, producer: Any) -> None:
        remaining = producer.flush(self.cfg.stop_timeout_ms / 1000)
        if remaining:
            raise RuntimeError(f"{self.name}: {remaining} output records not acknowledged by Kafka")

    # -- lifecycle ------------------------------------------------------------------------
    def build(self, outputs: list[tuple[Any, list[OutputChannel]]]) -> None:
        for _, chans in outputs:
            self.outputs.extend(chans)
        tail = Router(self.name, self, outputs) if outputs else None
        self.chain = build_chain(self.task.chain, self, tail)
        if self.handovers is not None:
            self.handovers.serve_through = serves_through_moves(chain_operators(self.chain))
        self._restore_operators()
        if self.worker.plan.savepoint is not None and self.restored is None:
            self._load_savepoint(*self.worker.plan.savepoint)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"inst-{self.name}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.poll_control()
            if self.run():
                if self.savepoint_dir is not None:  # no final watermark: open windows go to the next run
                    savepoint.write_replica(self.savepoint_dir, self.task.name, self.partition, self.replica,
                                            self.savepoint_content())
                else:
                    self.chain.on_watermark(MAX_WATERMARK)
                self.chain.on_end()
                if self.dead_letters is not None:
                    self.dead_letters.out.finish(self.poll_control)
                # a replica that never opened its state (no keyed state, never shipped a checkpoint) has
                # the empty state's digest, so that it compares with a twin that did open it
                self.metrics.state_digest = (self.state_backend().digest() if self._backend is not None
                                             or self.restored is not None else digest_hex(0))
                for ch in self.outputs:
                    if not ch.close(timeout=self.cfg.stop_timeout_ms / 1000):
                        raise RuntimeError(f"channel {ch.spec.id} could not deliver its last batches")
            else:
                for ch in self.outputs:
                    ch.abort()
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            self.error = f"{self.name}: {describe_error(exc)}"
            log.exception("instance %s failed", self.name)
            for ch in self.outputs:
                ch.abort()
        finally:
            self.close_state()
            self.metrics.finished = True
            self.finished.set()

    def run(self) -> bool:
        """The instance's loop.  True when it ended by draining, False when stopped."""
        raise NotImplementedError

    # -- savepoints (replication.savepoint) ------------------------------------------------
    def savepoint_content(self) -> dict[str, Any]:
        """What this replica leaves to the next run, once drained: its keyed state and its
        operators' state outside it."""
        entries = []
        if self._backend is not None:
            self._backend.flush()
            entries = list(self._backend.iter_key_groups(range(self.num_key_groups)))
        return {"entries": entries, "operators": {op.name: op.snapshot() for op in chain_operators(self.chain)}}

    def _load_savepoint(self, root: str, meta: dict[str, Any]) -> None:
        """A new run: the key groups this partition owns now, from every partition of the run that
        wrote the savepoint, and its operators' state."""
        name = self.task.name
        table = self.worker.plan.routing.get(self.task.id)
        if name not in meta["keyed"] or table is None:
            return

        def owns(kg: int) -> bool:
            return table.partition_of_key_group(kg, self.num_key_groups) == self.partition

        entries, operators = savepoint.keyed_entries(root, name, meta["tasks"][name], owns)
        backend = self.state_backend()
        for kg, rest, value in entries:
            backend.put(kg, rest, value)
        backend.flush()
        for op in chain_operators(self.chain):
            if op.name in operators:
                op.restore_savepoint(operators[op.name], owns)
        self.metrics.savepoint_entries = len(entries)

    def request_stop(self) -> None:
        self.stop_requested.set()

    def close_state(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        shutil.rmtree(self._state_dir, ignore_errors=True)

    def join(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)


class ProcessingInstance(PartitionInstance):
    def __init__(self, worker: Any, task: TaskSpec, partition: int, replica: int, plan: PhysicalPlan,
                 restoring: bool = False) -> None:
        super().__init__(worker, task, partition, replica, plan, restoring)
        self.channels = [c.id for c in plan.input_channels(task.id, partition)]
        capacity = self.cfg.channel_queue_capacity
        order_log = plan.order_logs.get((task.id, partition)) if self.cfg.mode == "kazoo" else None
        self._candidate: Any = None
        if self.cfg.mode == "liverobin" or order_log is not None:
            self.queues = InputQueues(self.channels, max(4, capacity // len(self.channels)), per_channel=True)
            self.orderer: Any = (LiveRobinOrderer(self.queues, self.checkpoint_every) if order_log is None
                                 else self._kazoo(order_log))
        else:
            self.queues = InputQueues(self.channels, capacity)
            self.orderer = ArrivalOrderer(self.queues)
        self.dedup = Dedup()
        self._dedup_lock = threading.Lock()
        self._channel_locks = {c: threading.Lock() for c in self.channels}
        self._consumed = dict.fromkeys(self.channels, 0)  # per channel: elements consumed (= next seq)
        self._channel_wm = {c: MIN_WATERMARK for c in self.channels}
        self._open_channels = set(self.channels)
        self._current_wm = MIN_WATERMARK
        self._forwarded_pulse = 0
        self._aligned = self.cfg.mode == "kazoo"  # pulses (of handover windows) forwarded once aligned
        self._last_counted = 0  # the last count-based checkpoint (its id: elements consumed)
        self._channel_pulse = dict.fromkeys(self.channels, 0)

    def restore_from(self, meta: Any, state_dir: Path) -> dict[str, Any]:
        rt = super().restore_from(meta, state_dir)
        for channel, position in rt["positions"].items():
            self.dedup.resume(channel, position)  # the upstreams replay from here
        self._consumed = dict(rt["positions"])
        self._last_counted = meta.checkpoint_id
        self._channel_wm = dict(rt["channel_wm"])
        self._open_channels = set(rt["open"])
        self._current_wm = self.metrics.watermark = rt["current_wm"]
        self._forwarded_pulse = self.metrics.pulse = rt["pulse"]
        # KaZoo forwards a pulse once every channel delivered it: where each channel was
        self._channel_pulse.update(rt.get("channel_pulse", {}))
        if isinstance(self.orderer, KazooOrderer):
            state = rt["orderer"]
            self.orderer.restore(state)
            log_ = self.worker.own_order_log()  # the worker's shared reader started long ago
            self._publish_order = log_.register(
                self._order_log, state.offset + 1, on_records=self.orderer.on_records,
                on_failed=self.orderer.on_publish_failed, on_error=self.orderer.on_error)
            log_.start()
        elif isinstance(self.orderer, LiveRobinOrderer):
            self.orderer.merge.restore(rt["orderer"])
        return rt

    def _kazoo(self, order_log: SegmentedLog) -> KazooOrderer:
        """KaZoo: this partition's order log through the worker's reader/writer, its election in
        the worker's ZooKeeper session (entered when the instance starts)."""
        cfg = self.cfg

        def publish_while_leader(order: Any) -> None:
            # the election drops the epoch the moment ZooKeeper is in doubt, before its callback
            # reaches the orderer: nothing goes out under an epoch that may have been superseded
            if self._candidate is not None and self._candidate.epoch == order.epoch:
                self._publish_order(order)

        orderer = KazooOrderer(
            self.queues, publish_while_leader, max_batch=cfg.kazoo_max_batch, min_batch=cfg.kazoo_min_batch,
            idle_timeout_s=cfg.kazoo_idle_timeout_ms / 1000,
            hold_limit=max(4 * cfg.channel_batch_size, 2 * cfg.kazoo_max_batch),
            checkpoint_every=self.checkpoint_every, checkpoint_mark=self._record_enters_new_interval, name=self.name)
        self._order_log = order_log
        if not self.restoring:  # (a restored replica reads the log from its checkpoint on: restore_from)
            self._publish_order = self.worker.order_log().register(
                order_log, 0, on_records=orderer.on_records, on_failed=orderer.on_publish_failed,
                on_error=orderer.on_error)
        self._election_path = f"{self.worker.boot.election_root}/t{self.task.id}p{self.partition}"
        self.worker.election()
        return orderer

    def deliver(self, header: BatchHeader, payload: bytes) -> bool:
        """Called by the threads that receive batches (a peer's ``PushMany``, this worker's
        :class:`~replication.senders.LocalSender`): dedup, then enqueue without ever waiting.  A
        full queue refuses the batch (False, not counted: its sender sends it again after a
        backoff), so a call carrying batches of several channels never waits behind one of them."""
        lock = self._channel_locks.get(header.channel)
        if lock is None:
            raise ValueError(f"{self.name}: channel {header.channel} is not an input of this instance")
        with lock:  # one deliverer per channel: the check below stays true until the commit
            with self._dedup_lock:
                adm = self.dedup.check(header.channel, header.first_seq, header.count)
            if adm.gap:
                log.error("%s: gap of %d seqs on channel %d before seq %d (not delivered)",
                          self.name, adm.gap, header.channel, header.first_seq)
            elif adm.delivers:
                elements = decode_elements(payload, header)
                try:
                    if not self.queues.put(header.channel, elements[adm.start:adm.stop], block=False):
                        return False
                except QueuesClosed:
                    pass  # the instance is stopping: it consumes nothing more
            with self._dedup_lock:
                self.dedup.commit(header.channel, header.first_seq, adm)
                self.metrics.dedup_dropped = self.dedup.dropped
                self.metrics.gaps = self.dedup.gaps
            return True

    def request_stop(self) -> None:
        super().request_stop()
        self.queues.close()

    def wake(self) -> None:
        self.queues.wake()

    def run(self) -> bool:
        kazoo = self.orderer if isinstance(self.orderer, KazooOrderer) else None
        if kazoo is not None:
            self._candidate = self.worker.election().candidate(self._election_path, kazoo.on_leadership)
        drained = False
        try:
            drained = self._run(kazoo)
            return drained
        finally:
            # a replica that consumed everything keeps its leadership until the worker ends: all is
            # ordered, and handing it over would only make the other replica write a useless fence
            if self._candidate is not None and not drained:
                self._candidate.withdraw()

    def _run(self, kazoo: KazooOrderer | None) -> bool:
        if self.cfg.rhino_enabled and self.restored is None:
            # at once, before any input (both replicas alike): every partition is restorable from its
            # first seconds on, also one that gets little or no input
            self._checkpoint(0, self._start_orderer_state(kazoo))
        while self._open_channels:
            if self.stop_requested.is_set():
                return False
            if self.pending_control is not None:
                self.poll_control()
            if self.measure_request > self.metrics.vnode_bytes[0] and self.handovers is not None:
                self.metrics.vnode_bytes = (self.measure_request, vnode_bytes(
                    self.state_backend(), self.num_key_groups, self.handovers.num_vnodes))
            runs = self._next_runs()
            self.metrics.queue_batches = self.queues.size()
            if kazoo is not None:
                self._kazoo_metrics(kazoo)
            if not runs:
                self.idle()
            for channel, elements in runs:
                if self.count_every:
                    self._consume_counted(channel, elements)
                else:
                    self._consume(channel, elements)
            if kazoo is not None and kazoo.applier.checkpoint_due is not None:
                state = kazoo.applier.take_checkpoint()  # every element of that order record is consumed
                if self.handovers is None or not self.handovers.holds_records():  # (it would lose them)
                    self._checkpoint(state.number, state)
        return True

    def _next_runs(self) -> list[tuple[int, list]]:
        """What the orderer has consumable now, else what comes within the idle wait; with
        ``channel.flushWhenIdle``, the open output batches leave before that wait."""
        if self.cfg.channel_flush_when_idle:
            runs = self.orderer.next_runs(0)
            if runs:
                return runs
            self.flush_outputs()
        return self.orderer.next_runs(self.idle_wait(0.2))

    def _start_orderer_state(self, kazoo: KazooOrderer | None) -> Any:
        """The orderer's state before any input, for the first checkpoint."""
        if kazoo is not None:
            return kazoo.applier.start_state(0)
        if isinstance(self.orderer, LiveRobinOrderer):
            return self.orderer.merge.state()
        return None

    def _consume_counted(self, channel: int, elements: list) -> None:
        """One input channel, no orderer state: checkpoint every ``count_every`` elements consumed,
        and before a record whose event time enters a new ``rhino.checkpointInterval`` (both
        replicas at the same positions, with the same ids: either may ship them)."""
        while elements:
            done = self._consumed[channel]
            due = (done // self.count_every + 1) * self.count_every
            cut = next((i for i, el in enumerate(elements[:due - done]) if el[0] == DATA and self._new_interval(el[3])),
                       None)
            if cut is not None:  # the records before it, then a checkpoint (unless one is there already)
                self._consume(channel, elements[:cut])
                elements = elements[cut:]
                self._checkpoint_counted(self._consumed[channel])
                self._consume(channel, elements[:1])
                elements = elements[1:]
                continue
            head, elements = elements[:due - done], elements[due - done:]
            self._consume(channel, head)
            if self._consumed[channel] == due:
                self._checkpoint_counted(due)

    def _checkpoint_counted(self, position: int) -> None:
        if position > self._last_counted:
            self._last_counted = position
            self._checkpoint(position, None)

    def _checkpoint(self, checkpoint_id: int, orderer_state: Any, positions: dict[int, int] | None = None) -> None:
        self.take_checkpoint(checkpoint_id, {
            "positions": dict(self._consumed) if positions is None else positions,
            "channel_wm": dict(self._channel_wm),
            "open": sorted(self._open_channels), "current_wm": self._current_wm, "pulse": self._forwarded_pulse,
            "channel_pulse": dict(self._channel_pulse), "orderer": orderer_state})

    def _kazoo_metrics(self, kazoo: KazooOrderer) -> None:
        m = self.metrics
        m.leader, m.orders_accepted, m.orders_published = kazoo.is_leader, kazoo.applier.accepted, kazoo.published
        m.order_epoch = -1 if kazoo.epoch is None else kazoo.epoch
        m.elected_at, m.first_order_at = kazoo.elected_at, kazoo.first_order_at

    def _consume(self, channel: int, elements: list) -> None:
        """Run ``elements`` of ``channel`` through the chain; watermarks: the minimum over channels."""
        chain, metrics, handovers = self.chain, self.metrics, self.handovers
        gate = handovers if handovers is not None and handovers.gating else None
        for i, el in enumerate(elements):
            kind = el[0]
            if gate is not None and kind in (DATA, WATERMARK):  # a handover's target holds the moved key groups
                kg = key_group(encode_key(el[2]), self.num_key_groups) if kind == DATA else None
                for ch, held in gate.gate((channel, el), kg):
                    self._element(ch, held)
                continue
            if kind == DATA:
                metrics.records_in += 1
                chain.process(el)
                continue
            if kind == PULSE:
                # LiveRobin: forward a pulse the first time it is seen (Algorithm 1); KaZoo (pulse
                # windows): once every open channel delivered it, in the order the log decided
                due = self._aligned_pulses(channel, el[1]) if self._aligned else (el[1],)
                for h in due:
                    if h <= self._forwarded_pulse:
                        continue
                    if handovers is not None:
                        if not self._handovers_at_pulse(h):
                            return  # stopping while waiting for a handover
                        gate = handovers if handovers.gating else None
                    self._forwarded_pulse = metrics.pulse = h
                    chain.on_pulse(h)
                    self.code_switches.position = h  # (an instruction for a pulse already passed is late)
                    if self.code_switches.pending and not self._replace_operators_at(h):
                        return  # stopping while waiting for a replacement's commit
                    if self.checkpoint_every and not self._aligned and h % self.checkpoint_every == 0:
                        self._checkpoint_at_pulse(h, channel, i + 1)  # (KaZoo: at order numbers, not pulses)
                continue
            self._element(channel, el)
        self._consumed[channel] += len(elements)

    def _aligned_pulses(self, channel: int, h: int) -> range:
        """KaZoo: ``channel`` delivered pulse ``h``; the pulses every open channel has delivered now
        and that are not forwarded yet."""
        self._channel_pulse[channel] = max(self._channel_pulse[channel], h)
        low = min((self._channel_pulse[c] for c in self._open_channels), default=self._forwarded_pulse)
        return range(self._forwarded_pulse + 1, low + 1)

    def _element(self, channel: int, el: tuple) -> None:
        """One data, watermark or end element (not a pulse) into the chain."""
        kind, channel_wm = el[0], self._channel_wm
        if kind == DATA:
            self.metrics.records_in += 1
            self.chain.process(el)
            return
        if kind == WATERMARK:
            if el[1] <= channel_wm[channel]:
                return
            channel_wm[channel] = el[1]
        elif kind == END:
            channel_wm[channel] = MAX_WATERMARK
            self._open_channels.discard(channel)
        new_wm = min(channel_wm.values())
        if new_wm > self._current_wm:
            self._current_wm = self.metrics.watermark = new_wm
            if new_wm < MAX_WATERMARK:
                self.chain.on_watermark(new_wm)

    def _replace_operators_at(self, h: int) -> bool:
        """Pulse ``h`` was forwarded: the operator replacements due take effect from the next element.
        False: stopping while waiting to know whether one was committed."""
        for order in self.code_switches.at_pulse(h):
            decided = self.code_switches.decided(order.handover_id, self.stop_requested.is_set)
            if decided is None:
                return False
            if decided:
                op = next(o for o in chain_operators(self.chain) if o.name == order.operator)
                op.replace_fn(pickle.loads(order.fn))
                self.code[op.name] = order.fn
                self.handover_ack(order.handover_id, order.epoch, "switched")
            self.code_switches.done(order.handover_id)
        return True

    def _handovers_at_pulse(self, h: int) -> bool:
        """Before forwarding pulse ``h``: cut what this origin gives away (h = P + 1), load what this
        target gets and process the records it held (h = R).  False: stopping while waiting."""
        handovers = self.handovers
        assert handovers is not None
        stopping = self.stop_requested.is_set
        cuts, releases = handovers.at_pulse(h)
        for order in cuts:
            decided = handovers.decided(order.handover_id, stopping)
            if decided is None:
                return False
            step = handovers.step(order.handover_id)
            if not decided:
                if step is not None:
                    handovers.drop(step)
                continue
            moving = frozenset(kg for r in handovers.cut_groups(order) for kg in r)
            extras = {op.name: op.cut_keys(moving.__contains__)
                      for op in chain_operators(self.chain) if hasattr(op, "cut_keys")}
            # Rhino: a target whose worker holds this origin's last checkpoint gets the changes since
            cut = handovers.cut(order, self.state_backend(), incremental=self.cfg.rhino_enabled)
            cut_at = time.time()  # before the send: the transfer is a phase of its own
            per_target = split_cut(order, self.partition, cut, extras, self.num_key_groups,
                                   self.cfg.handover_chunk_bytes)
            if self.cfg.rhino_enabled:
                handovers.keep(order.handover_id, per_target)
            shipped = self.worker.send_handover_state(order, self.partition, per_target)
            self.handover_ack(order.handover_id, order.epoch, "cut", cut.digest, len(cut.entries),
                              {"at": cut_at, "bytes": entry_bytes(cut.entries), "shipped": shipped})
        for step in releases:
            decided = handovers.decided(step.order.handover_id, stopping)
            if decided is None:
                return False
            windows = [op for op in chain_operators(self.chain) if hasattr(op, "adopt_keys")]
            if decided:
                merge = _merger(windows) if handovers.serve_through else None
                held = handovers.release(step, self.state_backend(), stopping, merge)
                if held is None:
                    return False
                for origin in sorted(step.extras):  # the moved keys' fire index, before their held records
                    for op in windows:
                        op.adopt_keys(step.extras[origin].get(op.name, ()))
            else:
                held = handovers.drop(step)
            for ch, el in held:
                self._element(ch, el)
            if decided:
                for op in windows:
                    op.fire_behind()
                # acked once the held records are processed: its time ends the catch-up
                self.handover_ack(step.order.handover_id, step.order.epoch, "loaded", entries=step.entries,
                                  times={**step.times(), "held": len(held), "served": int(handovers.serve_through)})
        return True

    def _checkpoint_at_pulse(self, h: int, channel: int, consumed_in_run: int) -> None:
        """Checkpoint right after pulse ``h``: both replicas consumed the same prefix by then
        (``_consume`` adds the run to ``_consumed`` only when it is done)."""
        merge_state = self.orderer.merge.take_state(h)
        if self.handovers is not None and self.handovers.holds_records_at(h):
            return
        positions = dict(self._consumed)
        positions[channel] += consumed_in_run
        self._checkpoint(h, merge_state, positions)


def _merger(windows: list[Any]) -> Any:
    """A target serving through a move: merges a moved accumulator with the one it built since the
    switch, by the window operator whose state the entry is (its state id starts the key)."""
    mergers = {op.state_prefix: op.merge_raw for op in windows}
    return lambda rest, moved, served: mergers[rest[:4]](moved, served)


def drain_position(next_offset: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
    """How far a source replica reads in a drain without pulses: per Kafka partition, the end a
    fetch told (the high watermark; 0 for an empty partition) or its next offset if it emitted
    more."""
    return {k: max(next_offset.get(k, -1), end) for k, end in ends.items()}


class SourceInstance(PartitionInstance):
    """Reads assigned Kafka partitions; emits watermarks at deterministic record positions."""

    def __init__(self, worker: Any, task: TaskSpec, partition: int, replica: int, plan: PhysicalPlan,
                 restoring: bool = False) -> None:
        super().__init__(worker, task, partition, replica, plan, restoring)
        spec = task.head.spec
        self.topic: str = spec["topic"]
        self.kafka_partitions: list[int] = plan.source_partitions[task.id][partition]
        self.deserializer = spec["deserializer"]
        self.timestamp_fn = spec["timestamp"]
        self.out_of_orderness = spec["max_out_of_orderness_ms"]
        self.start_offsets = plan.source_start_offsets.get(task.id, {})
        self.drain_requested_at: float | None = None
        # a drain without pulses (unordered, KaZoo): how far this replica reads (its partitions' ends when
        # the drain came, or further), for the driver, and where every replica of the partition ends (the
        # furthest report; -1: nothing to read there)
        self.drain_position: dict[int, int] | None = None
        self.drain_at: dict[int, int] | None = None  # set by the worker from the driver's word
        # LiveRobin: the counted pulses of the heartbeat log, from the worker's reader (END follows the
        # final pulse)
        # (a restored replica subscribes to a reader of its own: the shared one started long ago)
        # KaZoo: the pulses of the windows a handover opens; records wait for pulses only inside one
        self._pulses = worker.pulse_reader().subscribe() if plan.heartbeat_log is not None and not restoring \
            else None
        self._windows = PulseWindows() if self.cfg.mode == "kazoo" and plan.heartbeat_log is not None else None
        self.pending_window: tuple | None = None  # the driver's latest word on the pulse window (worker thread)
        self._window_word: tuple | None = None
        self.holding: tuple[int, dict[int, int]] | None = None  # (window, {partition: position}) for the driver
        self._max_ts = {k: MIN_WATERMARK for k in self.kafka_partitions}
        self._emitted_wm = MIN_WATERMARK
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
        self._max_ts = dict(rt["max_ts"])
        self._emitted_wm = self.metrics.watermark = rt["emitted_wm"]
        self._after_pulse = self.metrics.pulse = rt["pulse"]
        self._pulse_placed = rt.get("pulse_placed")
        self._read = rt.get("read", 0)
        self._last_counted = self._read
        if self._windows is not None:
            if rt.get("windows") is not None:
                self._windows.restore(*rt["windows"])
            self._windows.after_pulse = self._after_pulse
        # the worker's shared reader started long ago: read the log again, from right after the last
        # pulse placed before the checkpoint (what counts is decided by the log alone, and the
        # counting goes on from that pulse's record, so the same pulses come out)
        if self.worker.plan.heartbeat_log is not None:
            reader = self._reader = self.worker.own_pulse_reader(self._pulse_placed)
            self._pulses = reader.subscribe()
            reader.start()
        return rt

    def savepoint_content(self) -> dict[str, Any]:
        """Where the next run starts reading, and the event-time marks to continue from."""
        return {"offsets": {**self.start_offsets, **self._next_offset}, "max_ts": dict(self._max_ts),
                "emitted_wm": self._emitted_wm}

    def _load_savepoint(self, root: str, meta: dict[str, Any]) -> None:
        """The offsets come with the plan; the event-time marks, so that watermarks go on from
        where the last run left them."""
        if self.task.name in meta["sources"]:
            part = savepoint.read_partition(root, self.task.name, self.partition)
            self._max_ts.update({k: v for k, v in part["max_ts"].items() if k in self._max_ts})
            self._emitted_wm = self.metrics.watermark = part["emitted_wm"]

    def request_drain(self) -> None:
        """Read to the current end and finish (LiveRobin: the final pulse of the log decides)."""
        if self.drain_requested_at is None:
            self.drain_requested_at = time.monotonic()
            self.wake()

    def request_stop(self) -> None:
        super().request_stop()
        self.wake()

    def _open_feed(self) -> PartitionFeed:
        """This replica's partitions, read through the worker's one source consumer."""
        # LiveRobin: the fetch thread reports where records exist at once; waiting for this thread
        # would wait for a pulse, which waits for the report
        on_high = self._report_position if self._pulses is not None and self._windows is None else None
        return self.worker.source_consumer().open(
            self.topic, {k: self.start_offsets.get(k, OFFSET_BEGINNING) for k in self.kafka_partitions},
            limit=self._hold_limit, on_high=on_high)

    def _report_position(self, k: int, low: int, position: int) -> None:
        """Every record of Kafka partition ``k`` below ``position`` exists: the heartbeat
        generators place pulses there (the worker's outbox drops a report that moves nothing).
        Not before a fetch told where the partition starts (``low``), if the plan does not.
        Called by the fetch thread in LiveRobin, by this replica's thread in a KaZoo window."""
        start = self.start_offsets.get(k, low)
        if start >= 0:
            self.worker.report_position(self.topic, k, start, position)

    def wake(self) -> None:
        """End the loop's wait for records (any thread: the worker's word, a pulse)."""
        feed = self._reading
        if feed is not None:
            feed.wake()

    def _drain_hold(self) -> bool:
        """A drain without pulses: report how far this replica reads (each Kafka partition's end by
        a fetch made after the request, or further if it emitted more: the high watermark in fetch
        responses, ListOffsets is not trusted, DESIGN §10) and hold until the driver names where
        every replica of the partition ends (the furthest report)."""
        if self.drain_requested_at is None:
            return False
        if self.drain_position is None:
            conf = self.cfg.kafka_consumer_config(
                group_id=f"replication-{self.worker.job_name}-{self.task.id}-{self.partition}")
            ends = end_offsets_by_fetch(conf, self.topic, self.kafka_partitions, timeout=30.0)
            self.drain_position = drain_position(self._next_offset, ends)
        return True

    def _read_to(self, feed: PartitionFeed, target: dict[int, int]) -> bool:
        """A drain without pulses: every Kafka partition read up to the offset the replicas agreed
        on (records from it on are not emitted)."""
        for k in self.kafka_partitions:
            end = target.get(k, -1)
            if end < 0:
                continue  # no replica read anything there
            if max(self._next_offset.get(k, -1), feed.position(k)) < end:
                return False
        return True

    def run(self) -> bool:
        batch = self.cfg.channel_batch_size
        feed = self._reading = self._open_feed()
        if self._pulses is not None:
            self._pulses.on_pulse = self.wake
        placer = self._pulse_placer() if self._windows is None else None
        if self.cfg.rhino_enabled and self.restored is None:
            self._source_checkpoint(0, 0)  # at once: restorable from its first seconds on, idle or not
        if self._windows is not None and self.restored is not None:
            placer = self._start_replay()
        try:
            while not self.stop_requested.is_set():
                # take what is there without waiting for a full batch; block only when idle
                if self.pending_control is not None:
                    self.poll_control()
                # (windows already in the log first: one announced now waits until they are placed)
                if placer is None and self._windows is not None:
                    self._windows.queue(self._pulses.take(0))  # a window this replica was not waited for
                    if self._windows.later or self._windows.pending:
                        placer = self._next_window()
                if self._windows is not None and self.pending_window != self._window_word:
                    placer = self._window_changed(placer, feed)
                if placer is None and self.drain_at is None and self._drain_hold():
                    self.idle()
                    time.sleep(0.01)
                    continue
                messages = feed.consume(batch, 0)
                if placer is None:
                    if not messages:
                        self.flush_outputs()
                        messages = feed.consume(batch, self.idle_wait(IDLE_WAIT_S))
                elif self._windows is not None:  # KaZoo, in a window
                    self._windows.queue(self._pulses.take(0 if messages else PULSE_WAIT_S))
                    self._feed(placer)
                else:  # LiveRobin: a pulse rings the feed too, so one wait sees records and pulses
                    pulses = self._pulses.take(0)
                    if not messages and not pulses:
                        self.flush_outputs()
                        messages = feed.consume(batch, self.idle_wait(IDLE_WAIT_S))
                        pulses = self._pulses.take(0)
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
                        if self.drain_at is not None and msg.offset() >= self.drain_at.get(msg.partition(), -1):
                            continue  # beyond where the replicas end
                        self._emit_counted(msg, time.time())
                    else:
                        placer.add_record(msg.offset(), (msg, time.time()))
                if placer is not None:
                    if self._place(placer, feed):
                        return True
                    if self._windows is not None and self._windows.current is None:
                        placer = self._after_window(placer, feed)  # its last pulse is out
                elif self.drain_at is not None and self._read_to(feed, self.drain_at):
                    return True
                if self._windows is not None:
                    self._show_window(placer)
                if self.drain_requested_at is not None:
                    self.metrics.drain = ({k: max(self._next_offset.get(k, -1), feed.position(k))
                                           for k in self.kafka_partitions},
                                          dict(self.drain_position or {}), dict(self.drain_at or {}))
            return False
        finally:
            self._reading = None
            feed.close()

    def _emit(self, msg: Any, ingest: float) -> None:
        """One Kafka record into the chain (or the dead-letter topic); watermarks follow record
        positions, so both replicas of the partition emit them at the same places."""
        metrics = self.metrics
        k, off, raw = msg.partition(), msg.offset(), msg.value()
        self._next_offset[k] = off + 1
        origin = (self.topic, k, off)
        metrics.records_in += 1
        try:
            value = self.deserializer(raw)
        except Exception as exc:  # noqa: BLE001
            self.dead_letter(reason="deserialize: " + describe_error(exc), operator=self.task.head.name,
                             origin=origin, payload=raw or b"")
            return
        try:
            ts = int(self.timestamp_fn(value)) if self.timestamp_fn is not None else msg.timestamp()[1]
        except Exception as exc:  # noqa: BLE001
            self.dead_letter(reason="timestamp: " + describe_error(exc), operator=self.task.head.name,
                             origin=origin, payload=raw or b"")
            return
        self.chain.process((DATA, value, None, ts, ingest, origin))
        if ts > self._max_ts[k]:
            self._max_ts[k] = ts
            wm = min(self._max_ts.values()) - self.out_of_orderness
            emitted = self._emitted_wm
            if wm >= emitted + self.cfg.watermark_interval_ms or (emitted == MIN_WATERMARK and wm > MIN_WATERMARK // 2):
                self._emitted_wm = metrics.watermark = wm
                self.chain.on_watermark(wm)

    def _emit_counted(self, msg: Any, ingest: float) -> None:
        """:meth:`_emit`, with count-based checkpoints (KaZoo mode: both replicas emit the same
        records, pulses or not): before a record whose Kafka timestamp enters a new
        ``rhino.checkpointInterval``, and every ``count_every`` records."""
        if self.count_every and self._new_interval(msg.timestamp()[1]) and self._read > self._last_counted:
            self._last_counted = self._read
            self._source_checkpoint(self._read, self.metrics.pulse)
        self._emit(msg, ingest)
        if self.count_every:
            self._read += 1
            if self._read % self.count_every == 0:
                self._last_counted = self._read
                self._source_checkpoint(self._read, self.metrics.pulse)

    def _source_checkpoint(self, checkpoint_id: int, pulse: int) -> None:
        """Every record before this point is out, none after it: where a restore resumes (a Kafka
        partition with no record read yet restarts where this run started).  ``pulse``: the last
        one placed; KaZoo: the pulse window held for."""
        placed = self._pulse_placed if self._pulse_placed is not None and self._pulse_placed.h == pulse else None
        self.take_checkpoint(checkpoint_id, {"offsets": dict(self._next_offset), "max_ts": dict(self._max_ts),
                                             "emitted_wm": self._emitted_wm, "pulse": pulse, "read": self._read,
                                             "pulse_placed": placed,
                                             "windows": None if self._windows is None else self._windows.state()})

    # -- LiveRobin: pulses at positions read from the heartbeat log ---------------------------
    def _pulse_placer(self) -> PulsePlacer | None:
        if self._pulses is None:
            return None
        if len(self.kafka_partitions) != 1:
            raise RuntimeError(f"{self.name}: LiveRobin needs one Kafka partition per source partition")
        k = self.kafka_partitions[0]
        return PulsePlacer(self.topic, k, fetched_to=self.start_offsets.get(k, 0))

    # -- KaZoo: pulse windows ----------------------------------------------------------------
    def _window_changed(self, placer: PulsePlacer | None, feed: PartitionFeed) -> PulsePlacer | None:
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

    def _show_window(self, placer: PulsePlacer | None) -> None:
        windows, metrics = self._windows, self.metrics
        assert windows is not None
        metrics.window = (-1 if windows.current is None else windows.current, windows.handled,
                          -1 if windows.pending is None else windows.pending)
        metrics.held_records = 0 if placer is None else placer.held

    def _hold(self, window: int) -> PulsePlacer:
        """Start holding for ``window`` (announced open) at this replica's position and report it."""
        placer = self._placer_here()
        self.holding = (window, {placer.partition: placer.fetched_to})
        self._windows.queue(self._pulses.take(0))
        self._feed(placer)
        return placer

    def _placer_here(self) -> PulsePlacer:
        k = self.kafka_partitions[0]
        return PulsePlacer(self.topic, k, fetched_to=self._next_offset.get(k, self.start_offsets.get(k, 0)))

    def _feed(self, placer: PulsePlacer) -> None:
        """Give ``placer`` the queued pulses of the window held for."""
        assert self._windows is not None
        for record in self._windows.to_place():
            placer.add_pulse(record)

    # -- KaZoo, a restored replica: the windows written before it came back ----------------------
    def _start_replay(self) -> PulsePlacer | None:
        """Read the heartbeat log to its end as it was now before emitting anything: a window whose
        pulses are already in it is not announced to this replica again, and a record may only go
        out once no pulse before it can still be unknown.  Restored inside a window: hold again."""
        assert self._reader is not None and self._windows is not None
        while not self._reader.caught_up.wait(0.1):
            if self.stop_requested.is_set():
                return None
        self._windows.queue(self._pulses.take(0))
        if self._windows.current is None:
            return None
        placer = self._placer_here()
        self._feed(placer)
        return placer

    def _next_window(self) -> PulsePlacer | None:
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

    def _after_window(self, placer: PulsePlacer, feed: PartitionFeed) -> PulsePlacer | None:
        """The window's last pulse is out.  If the next window's pulses are already queued, the records
        held may lie on both sides of them: hold on with the same placer; else leave."""
        assert self._windows is not None
        if self._windows.enter_queued():
            self._entered_from_log()
            self._feed(placer)
            return placer
        return self._leave_window(placer, feed)

    def _leave_window(self, placer: PulsePlacer, feed: PartitionFeed) -> None:
        """Emit the records held beyond the window's last pulse; from now on records go out as read."""
        for item in placer.release_records():
            self._emit_counted(*item)
        feed.resume()
        self.holding = None
        return None

    def _place(self, placer: PulsePlacer, feed: PartitionFeed) -> bool:
        """Emit what the pulses known so far allow; True once the final pulse is out (drained)."""
        pos = feed.position(placer.partition)
        if pos >= 0:
            placer.fetched(pos)  # also past transaction markers, which are never returned as records
        elif placer.partition not in self._next_offset:
            low = feed.low_watermark(placer.partition)
            if low >= 0:
                placer.fetched(low)  # nothing below the low watermark exists
        if self._windows is not None:  # (LiveRobin: the fetch thread reports, see _open_feed)
            k = placer.partition
            self._report_position(k, feed.low_watermark(k), max(placer.fetched_to, feed.high_watermark(k)))
        for kind, item in placer.take():
            if kind == PULSE_ITEM:
                h, final = item
                self.metrics.pulse = h
                self._pulse_placed = placer.last_placed
                self.chain.on_pulse(h)
                if self._windows is not None and self._windows.placed(h):
                    break  # the window's last pulse: the records after it go out as read
                if self.checkpoint_every and h % self.checkpoint_every == 0:
                    # every record before the pulse is out, none after it: where a restore resumes
                    self._source_checkpoint(h, h)
                if final:
                    return True
            else:
                self._emit_counted(*item)
        # the records held wait for a pulse beyond them; the heartbeat log is never paused
        if placer.held > self._hold_limit:
            feed.pause()
        elif placer.held < self._hold_limit // 2:
            feed.resume()
        return False
