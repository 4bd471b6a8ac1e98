"""A partition instance's shared plumbing: one running copy of one partition of a task, hosted
by a worker.

:class:`PartitionInstance` holds what every instance has: metrics, dead letters, keyed state,
output channels, checkpoints and handover acks, its thread and its lifecycle.  The two kinds
are in :mod:`.processing` (input channels, orderer, operator chain) and :mod:`.source` (Kafka
partitions, pulses, watermarks).
"""

from __future__ import annotations

import logging
import pickle
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from replication import savepoint
from replication.heartbeat_parts import ReplicaAck
from replication.metrics import InstanceMetrics
from replication.plan import PhysicalPlan, TaskSpec, replica_name
from replication.runtime.chain import build_chain, chain_operators
from replication.runtime.channels import OutputChannel
from replication.runtime.deadletter import ExactlyOnceDeadLetters, describe_error
from replication.runtime.elements import DATA, MAX_WATERMARK
from replication.runtime.handover_service import ReplicaHandoverPart
from replication.runtime.handovers import CodeSwitches, PartitionHandovers, RouterSwitches
from replication.runtime.operators import Router
from replication.runtime.windows import serves_through_moves
from rhino_state import RocksDBStateBackend, StateContext
from rhino_state.increments import digest_hex

log = logging.getLogger(__name__)

# The longest an idle replica's loop sleeps: input, pulses and every word from its worker (roles,
# drain, stop, pulse windows, a state measurement) wake it, so this only bounds the cost of a
# wake-up missed by a bug.
IDLE_WAIT_S = 1.0


class PartitionInstance(ReplicaHandoverPart):
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
        self._handover_acks: list[ReplicaAck] = []
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
    @property
    def processing_time(self) -> bool:
        """Whether processing time reaches this instance's operators (timers, TTL): LiveRobin's pulses."""
        return self.cfg.mode == "liverobin"

    def state_backend(self) -> RocksDBStateBackend:
        if self._backend is None:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            self._backend = RocksDBStateBackend(str(self._state_dir), cache_max_entries=self.cfg.state_cache_entries,
                                                instance=(self.task.id, self.partition))
        return self._backend

    def state_context(self, operator_name: str) -> StateContext:
        return StateContext(self.state_backend(), operator_name, self.num_key_groups)

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
            self._run_replaced_code()

    def _run_replaced_code(self) -> None:
        """The operators replaced at runtime (``self.code``) run their replacing functions."""
        for op in chain_operators(self.chain):
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
                                                     runtime.get("positions", {}), runtime["outputs"],
                                                     runtime.get("order_from"))
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
        """What this replica leaves to the next run, once drained: its keyed state, its operators'
        state outside it, and the functions that replaced its operators at runtime."""
        entries = []
        if self._backend is not None:
            self._backend.flush()
            entries = list(self._backend.iter_key_groups(range(self.num_key_groups)))
        return {"entries": entries, "operators": {op.name: op.snapshot() for op in chain_operators(self.chain)},
                "code": dict(self.code)}

    def _load_savepoint(self, root: str, meta: dict[str, Any]) -> None:
        """A new run: the key groups this partition owns now, from every partition of the run that
        wrote the savepoint, and its operators' state; and, from a durable resume's savepoint
        (``plan.savepoint_code``), the functions that replaced its operators at runtime."""
        table = self.worker.plan.routing.get(self.task.id)
        if self.task.name in meta["keyed"] and table is not None:
            code = self._load_keyed_savepoint(root, meta, table)
        else:
            code = savepoint.replaced_code(root, meta, self.task.name) if self.worker.plan.savepoint_code else {}
        if self.worker.plan.savepoint_code:
            self.code = code
            self._run_replaced_code()

    def _load_keyed_savepoint(self, root: str, meta: dict[str, Any], table: Any) -> dict[str, bytes]:
        """The state of the key groups it owns under ``table``; returns the parts' replaced functions."""
        def owns(kg: int) -> bool:
            return table.partition_of_key_group(kg, self.num_key_groups) == self.partition

        entries, operators, code = savepoint.keyed_entries(root, self.task.name, meta["tasks"][self.task.name], owns)
        backend = self.state_backend()
        for kg, rest, value in entries:
            backend.put(kg, rest, value)
        backend.flush()
        for op in chain_operators(self.chain):
            if op.name in operators:
                op.restore_savepoint(operators[op.name], owns)
        self.metrics.savepoint_entries = len(entries)
        return code

    def request_stop(self) -> None:
        self.stop_requested.set()

    def close_state(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        shutil.rmtree(self._state_dir, ignore_errors=True)

    def join(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)
