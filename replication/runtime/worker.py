"""A worker: one long-running Spark task that hosts many partition instances (replicas).

The driver starts one Spark job whose tasks are workers (DESIGN §3: the executor
count must not grow with the partition count).  A worker starts its gRPC server
(the control plane) and its data port (channel batches, :mod:`transport.frames`),
registers with the job master in the driver, learns every worker's address,
builds its replicas and their channels (each output channel sends to every
replica of the destination partition), then heartbeats to the driver: liveness,
sink progress and metrics up, commands, dead workers and sink roles down.

A worker relaunched by Spark after its executor died comes back as a *standby*:
it holds its slot (and, with Rhino checkpoints, joins replica groups) until the
job ends.  With Rhino checkpoints the lost replicas are restored on the workers
holding their checkpoints (:meth:`Worker.restore`), and the upstreams replay to
them from their backups.  A worker that the driver declared dead while it was
hung is *evicted* when it wakes up: it stops at once.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from confluent_kafka import Producer

from kazoo_leader.election import ElectionClient
from kazoo_leader.order_log import OrderLog
from liverobin.heartbeats import PulseRecord
from liverobin.positions import PositionOutbox
from liverobin.reader import PulseReader
from replication.config import ReplicationConfig
from replication.handovers import DeltaCut, HandoverOrder, TargetCut, order_from_wire
from replication.messages import (
    Ack,
    Attach,
    CopyCheckpoint,
    CutChunk,
    CutRequest,
    Heartbeat,
    Instructions,
    KeptCut,
    Register,
    Registered,
    Restored,
    RestoreReplica,
    SourcePositions,
    WorkerFinished,
)
from replication.plan import Instance, PhysicalPlan, ReplicaId
from replication.runtime.channels import BackupTrimmed, OutputChannel
from replication.runtime.checkpoints import WorkerCheckpoints
from replication.runtime.deadletter import DeadLetterWriter
from replication.runtime.instance import PartitionInstance
from replication.runtime.processing import ProcessingInstance
from replication.runtime.senders import (
    PUSH_METHOD,
    BatchSender,
    LocalSender,
    PushLink,
    WorkerDataPeer,
    receive_pushes,
)
from replication.runtime.source import SourceInstance
from replication.spark_cluster import current_executor_id, executor_bind_host, local_advertise_host
from rhino_state import CheckpointNotHeldError, moved_key_groups
from rhino_state.cut import Delivery, apply_changes, cut_digest, entry_bytes, plan_delivery
from rhino_state.durable import DurableStore
from rhino_state.increments import IncrementMeta
from transport import batch_format, rpc, wire
from transport.frames import FrameServer
from transport.kafka_feeds import SharedConsumer
from transport.kafka_io import admin_client, ensure_topics
from transport.rpc import host_port
from transport.security import Refusals, RpcSecurity

log = logging.getLogger(__name__)

# A target waiting at its release pulse this long for a cut fetches it from a replica that kept it.
CUT_OVERDUE_S = 0.5
# A target replica fetching a cut no origin replica can give yet asks again this often, doubling up to
# the second figure while none arrives (the origins' workers may be down for seconds).
CUT_RETRY_S = (0.2, 2.0)
# How long a target waits for the checkpoint a cut's changes apply to (its increment may still be
# on its way to this worker) before fetching the whole cut.
BASE_WAIT_S = 1.0
# A replica restored here reports its progress with every heartbeat for this long (not every
# metrics interval): the driver sees it caught up within a heartbeat of it.
RESTORED_REPORT_S = 10.0
# How long the broker may hold an empty fetch of the sources' consumer (unless the job sets
# ``fetch.wait.max.ms``).  Short, so that new records (and a drain's fresh high watermark) are
# seen quickly: the embedded broker answers a waiting fetch only when the wait ends.
SOURCE_FETCH_WAIT_MS = 10
# Beats at most this often when the driver rings (a restore storm rings many times a second).
BEAT_GAP_S = 0.02


def _idle_fetch(cfg: ReplicationConfig) -> dict[str, Any]:
    """How a worker's long-lived consumers fetch once they find no input (``kafka.idle*``)."""
    return {"idle_fetch_wait_ms": cfg.kafka_idle_fetch_wait_ms, "idle_after_s": cfg.kafka_idle_after_ms / 1000}


def _topic_maker(cfg: ReplicationConfig) -> Callable[[list[str]], None]:
    """Makes single-partition topics exist (the order logs' next segments)."""
    return lambda topics: ensure_topics(admin_client(cfg.kafka_admin_config()), dict.fromkeys(topics, 1))


@dataclass
class WorkerBootstrap:
    """Everything a worker task needs; pickled (with the user's functions) into the Spark job."""

    job_name: str
    run_id: str
    plan: PhysicalPlan
    placement: dict[ReplicaId, int]
    cfg: ReplicationConfig
    master_address: str
    num_workers: int
    election_root: str | None = None  # KaZoo: this run's ZooKeeper path; a partition's election below it
    security: RpcSecurity | None = field(default=None, repr=False)  # the run's RPC secret (and TLS material)
    output_prefix: str = ""  # the exactly-once outputs' ids start with it (default: run_id); kept by a resume
    epoch_base: int = 0  # added to KaZoo election epochs: a resumed run elects above the run before


@dataclass(frozen=True)
class KnownMove:
    """A replica restored on ``worker`` by the driver's ``restore``-th restore; its upstreams
    replay to it from ``positions`` (channel id -> seq)."""

    worker: int
    positions: dict[int, int]
    restore: int


def election_identity(worker: int, attempt: int) -> str:
    """What a worker attempt's election nodes hold: the driver evicts a dead worker's nodes by it."""
    return f"w{worker}a{attempt}"


def election_membership(election_root: str, worker: int, attempt: int) -> str:
    """The node whose deletion (the driver declaring the worker dead) bars it from every election."""
    return f"{election_root}/members/{election_identity(worker, attempt)}"


class _Mailbox:
    """The latest heartbeat reply, from the heartbeat thread to the worker's main loop (replies
    carry the driver's whole view, so a newer one replaces one not yet applied)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._reply: Instructions | None = None
        self._done = False
        self._unreachable_since: float | None = None

    def post(self, reply: Instructions | None, done: bool, at: float) -> None:
        with self._cond:
            if reply is None:
                self._unreachable_since = self._unreachable_since or at
            else:
                self._unreachable_since = None
                self._reply, self._done = reply, done
            self._cond.notify_all()

    def take(self, timeout: float) -> tuple[Instructions | None, bool, float | None]:
        """The newest reply not taken yet (None after ``timeout``), whether every instance had
        finished when it was asked for, and since when the driver has been unreachable."""
        with self._cond:
            self._cond.wait_for(lambda: self._reply is not None, timeout)
            reply, self._reply = self._reply, None
            return reply, self._done, self._unreachable_since


class WorkerEvicted(RuntimeError):
    """The driver declared this worker dead while it could not hear it (hung, or cut off by a
    network partition); raised from the Spark task so that Spark runs it again, as a standby."""


class ReplicaNotHere(LookupError):
    """A handover's state arrived for a partition this worker runs no replica of (now)."""


def _cut_chunks(cut: TargetCut, delta: bool) -> list[list]:
    """What travels of ``cut`` to one target replica: its changes since checkpoint ``cut.base``
    (``delta``, when it has them) or its entries, in chunks."""
    return cut.changes if delta and cut.changes is not None else cut.chunks


def _cut_requests(order: HandoverOrder, origin: int, target: int, cut: TargetCut, delta: bool) -> Iterator[CutChunk]:
    """The ``HandoverState`` calls that carry ``cut`` to one replica of ``target``: its entries in
    chunks, or (``delta``) its changes since checkpoint ``cut.base`` in chunks with the digest and
    count of the entries they must rebuild."""
    delta = delta and cut.changes is not None
    chunks = _cut_chunks(cut, delta)
    for i, chunk in enumerate(chunks):
        rows = wire.pack_rows(chunk)
        yield CutChunk(order.handover_id, order.task, target, origin, i, len(chunks),
                       extras=_pack_extras(cut.extras) if i == 0 else b"",
                       entries=None if delta else rows, changes=rows if delta else None,
                       base=cut.base if delta else None, digest=cut.digest if delta else "",
                       count=cut.entries if delta else 0)


def _pack_extras(extras: dict[str, list]) -> bytes:
    """Operators' in-memory state of moved keys (user keys among it): pickled, as user records are."""
    return pickle.dumps(extras, protocol=5) if any(extras.values()) else b""


def _unpack_extras(data: bytes) -> dict[str, list]:
    return pickle.loads(data) if data else {}


def run_worker(boot: WorkerBootstrap, index: int, attempt: int) -> dict[str, Any]:
    """Entry point inside the Spark task; returns the worker's final report.  An evicted worker
    raises :class:`WorkerEvicted` once it stopped: its replicas live elsewhere now, but the task
    slot is healthy again, and Spark's retry registers there as a standby (it joins replica groups
    and can host restored replicas), like a task relaunched after its executor died."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    report = Worker(boot, index, attempt).run()
    if report.get("status") == "evicted":
        raise WorkerEvicted(f"worker {index} (attempt {attempt}) was declared dead by the driver while it could "
                            "not hear it, and stopped; Spark runs the task again as a standby")
    return report


class Worker:
    def __init__(self, boot: WorkerBootstrap, index: int, attempt: int) -> None:
        self.boot = boot
        self.cfg = boot.cfg
        self.job_name = boot.job_name
        self.index = index
        self.attempt = attempt
        self.plan = boot.plan
        base = Path(self.cfg.state_dir or Path(tempfile.gettempdir()) / "replication-state")
        self.state_root = base / boot.job_name / boot.run_id / f"w{index}-a{attempt}"
        self.instances: dict[Instance, PartitionInstance] = {}  # one replica per partition at most
        self._ready = threading.Event()
        self._peers: dict[str, rpc.Peer] = {}
        self._links: dict[tuple[int, str], BatchSender] = {}  # (worker, address) -> what sends to it
        self._unsent_acks: list[tuple] = []  # handover acks of the hosted replicas, for the next heartbeat
        self._stopping = threading.Event()
        self._beat_now = threading.Event()  # the driver rang: something changed for this worker
        self.dead_workers: set[int] = set()
        self.finished_workers: set[int] = set()
        self._transports_to: dict[int, list[tuple[OutputChannel, int]]] = {}  # worker -> (channel, replica)
        self.producer: Producer | None = None
        self.dead_letters: DeadLetterWriter | None = None
        self._pulse_reader: PulseReader | None = None
        self._source_consumer: SharedConsumer | None = None
        self._own_pulse_readers: list[PulseReader] = []
        self._own_order_logs: list[OrderLog] = []
        self._order_log: OrderLog | None = None
        self._election: ElectionClient | None = None
        self._election_lock = threading.Lock()  # (a standby opens its session while a restore may need it)
        self._addresses: dict[int, str] = {}
        # where each restored replica runs now, what its upstreams replay to it from, and which
        # restore of the driver's count put it there
        self._moves_known: dict[ReplicaId, KnownMove] = {}
        self._placement: dict[ReplicaId, int] = dict(boot.placement)  # with the restored replicas' new workers
        self._savepoint: str | None = None  # the directory a drain writes its savepoint to
        self._lock = threading.Lock()
        self._sender: ThreadPoolExecutor | None = None  # handover state to other workers, off the instances' threads
        self._fetching: set[str] = set()  # target replicas fetching cuts they miss
        self._cut_offs: dict[ReplicaId, tuple[int, str]] = {}  # replicas the channels cut off, for the driver
        self._restored_at: dict[Instance, float] = {}  # replicas restored here: when (monotonic)
        if boot.security is None:
            raise ValueError("a worker needs the run's RPC security (WorkerBootstrap.security)")
        self.security: RpcSecurity = boot.security
        self.server: rpc.RpcServer | None = None
        durable = DurableStore(self.cfg.checkpoint_dir, self.job_name) if self.cfg.checkpoint_dir else None
        self.checkpoints = WorkerCheckpoints(self, self.state_root / "rhino", durable) if self.cfg.rhino_enabled \
            else None
        # how far the hosted sources read, streamed to the driver's heartbeat generators (LiveRobin; KaZoo windows)
        self._positions = PositionOutbox(self.cfg.pulse_period_ms / 1000) \
            if self.plan.heartbeat_log is not None else None
        self._position_stream: rpc.OpenCall | None = None

    def pulse_reader(self) -> PulseReader:
        """The worker's reader of the LiveRobin heartbeat log (shared by its source replicas)."""
        if self._pulse_reader is None:
            assert self.plan.heartbeat_log is not None
            self._pulse_reader = PulseReader(self.plan.heartbeat_log, self.cfg.kafka_consumer_config(
                group_id=f"replication-{self.job_name}-pulses-w{self.index}"), shared=self.source_consumer())
        return self._pulse_reader

    def report_position(self, topic: str, partition: int, start: int, position: int) -> None:
        """Every record of ``partition`` of ``topic`` below ``position`` exists (a hosted source
        replica reading it from ``start`` saw it)."""
        if self._positions is not None:
            self._positions.report(topic, partition, start, position)

    def _stream_positions(self, master: rpc.Peer) -> None:
        """Keep the stream of the hosted sources' positions to the driver open: opened again (from
        every position known) when it ended while this attempt runs, or a source's last position
        might never reach the generators."""
        call = self._position_stream
        if self._positions is None or self._stopping.is_set() or (call is not None and not call.ended):
            return
        if call is not None:
            log.warning("worker %d: the stream of source positions to the driver ended: opening it again", self.index)
        self._position_stream = master.stream("SourcePositions", self._positions.batches(
            lambda reports: SourcePositions(self.index, self.attempt, reports)))

    def source_consumer(self) -> SharedConsumer:
        """The worker's one Kafka consumer, shared by the source replicas it hosts (each reads
        its partitions through a feed of it)."""
        if self._source_consumer is None:
            conf = self.cfg.kafka_consumer_config(group_id=f"replication-{self.job_name}-sources-w{self.index}")
            conf.setdefault("fetch.wait.max.ms", SOURCE_FETCH_WAIT_MS)
            self._source_consumer = SharedConsumer(conf, name=f"sources-w{self.index}", **_idle_fetch(self.cfg))
        return self._source_consumer

    def own_pulse_reader(self, after: PulseRecord | None) -> PulseReader:
        """A reader of the heartbeat log for one restored source (it subscribes, then starts it),
        from right after ``after``, the last pulse its checkpoint placed (None: from this run's
        start)."""
        assert self.plan.heartbeat_log is not None
        reader = PulseReader(self.plan.heartbeat_log, self.cfg.kafka_consumer_config(
            group_id=f"replication-{self.job_name}-pulses-w{self.index}-{len(self._own_pulse_readers)}"), after)
        self._own_pulse_readers.append(reader)
        return reader

    def order_log(self) -> OrderLog:
        """The worker's reader and writer of its replicas' KaZoo order logs."""
        if self._order_log is None:
            self._order_log = OrderLog(
                self.cfg.kafka_consumer_config(group_id=f"replication-{self.job_name}-orders-w{self.index}"),
                self.cfg.kafka_producer_config(), _topic_maker(self.cfg), name=f"w{self.index}",
                **_idle_fetch(self.cfg))
        return self._order_log

    def own_order_log(self) -> OrderLog:
        """A reader and writer of one restored replica's order log (register, then start it): the
        worker's shared one cannot follow a log from a new position once started."""
        n = len(self._own_order_logs)
        log_ = OrderLog(self.cfg.kafka_consumer_config(group_id=f"replication-{self.job_name}-orders-w{self.index}-{n}"),
                        self.cfg.kafka_producer_config(), _topic_maker(self.cfg), name=f"w{self.index}-restored{n}",
                        **_idle_fetch(self.cfg))
        self._own_order_logs.append(log_)
        return log_

    def election(self) -> ElectionClient:
        """The worker's ZooKeeper session for its replicas' KaZoo elections (started before them, or
        at once for a replica restored here while the worker runs)."""
        with self._election_lock:
            if self._election is None:
                assert self.cfg.zookeeper_connect is not None
                assert self.boot.election_root is not None
                client = ElectionClient(
                    self.cfg.zookeeper_connect, self.cfg.kazoo_session_timeout_ms / 1000,
                    identity=election_identity(self.index, self.attempt),
                    membership=election_membership(self.boot.election_root, self.index, self.attempt),
                    digest=self.cfg.zookeeper_digest, epoch_base=self.boot.epoch_base)
                if self._ready.is_set():
                    client.start(timeout_s=self.cfg.start_timeout_ms / 1000)
                self._election = client
            return self._election

    def _open_election(self) -> None:
        """A KaZoo standby's ZooKeeper session, opened before a restore here needs it (a restore
        that comes first opens it itself)."""
        try:
            self.election()
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down for now: the first restore here tries again
            log.warning("worker %d: no ZooKeeper session opened ahead of restores: %s", self.index, exc)

    def _report(self, status: str, **extra: Any) -> dict[str, Any]:
        return {"worker": self.index, "attempt": self.attempt, "status": status, **extra}

    # -- receiving ------------------------------------------------------------------------
    def _deliver(self, header: batch_format.BatchHeader, payload: bytes) -> bool:
        """One batch to a hosted instance without blocking (False: its queue is full, busy)."""
        inst = self.instances.get((header.task, header.partition))
        if not isinstance(inst, ProcessingInstance):
            raise ValueError(f"worker {self.index} hosts no replica of ({header.task}, {header.partition})")
        return inst.deliver(header, payload)

    def _deliver_local(self, header: batch_format.BatchHeader, payload: bytes) -> bool:
        if not self._ready.wait(self.cfg.start_timeout_ms / 1000):
            raise RuntimeError(f"worker {self.index} not ready")
        return self._deliver(header, payload)

    def _push_many(self, request: bytes) -> bytes:
        """The batches of a peer's :class:`PushLink`; never blocks on a full queue (busy instead)."""
        if not self._ready.wait(self.cfg.start_timeout_ms / 1000):
            raise RuntimeError(f"worker {self.index} not ready")
        return receive_pushes(request, self._deliver)

    def _inbound_calls(self) -> int:
        """Concurrent pushes this worker may receive: each peer's :class:`PushLink` has one call in
        flight (doubled: a relaunched peer's new link may overlap its old one's last call)."""
        return 2 * len(set(self.boot.placement.values()))

    # -- building -------------------------------------------------------------------------
    @property
    def sink_producer(self) -> Producer:
        assert self.producer is not None
        return self.producer

    def _build_host(self, addresses: dict[int, str]) -> None:
        """What every hosted replica shares: the producer, the dead-letter writer, the addresses."""
        conf = self.cfg.kafka_producer_config()
        conf.update({"enable.idempotence": True, "acks": "all"})
        self.producer = Producer(conf)
        self.dead_letters = DeadLetterWriter(self.producer, self.cfg.dead_letter_topic(self.job_name), self.job_name)
        self._addresses = dict(addresses)

    def _build(self, addresses: dict[int, str], resumed: dict[Instance, tuple[IncrementMeta, Path]]) -> None:
        """The replicas placed here; ``resumed``: those that go on from a durable cut (built from it)."""
        self._build_host(addresses)
        for (task_id, part, replica), w in sorted(self.boot.placement.items()):
            if w == self.index:
                self.instances[(task_id, part)] = self._instance(task_id, part, replica,
                                                                 restoring=(task_id, part) in resumed)
        for inst in self._hosted():
            first_seqs: dict[int, int] = {}
            if (key := (inst.task.id, inst.partition)) in resumed:
                first_seqs = inst.restore_from(*resumed[key])["outputs"]
            inst.build(self._outputs(inst, self.boot.placement, first_seqs))

    def _fetch_resumed(self) -> dict[Instance, tuple[IncrementMeta, Path]]:
        """A resumed run's first attempt: the state of every replica placed here, built from its
        partition's checkpoint in the durable cut (downloaded and checked increment by increment),
        before registering: a large state takes a while, and no heartbeat is due yet."""
        resume = self.plan.resume
        if resume is None or self.attempt != 0:
            return {}
        out = {}
        for (task_id, part, _), w in sorted(self.boot.placement.items()):
            if w != self.index:
                continue
            started = time.monotonic()
            target = self.state_root / f"t{task_id}-p{part}-resumed"
            meta = self._from_durable((task_id, part), resume.cut.parts[(task_id, part)].file, target)
            out[(task_id, part)] = (meta, target)
            log.warning("worker %d: %s[%d] resumes from checkpoint %d of cut %d (built in %.3fs)", self.index,
                        self.plan.task(task_id).name, part, meta.checkpoint_id, resume.cut.number,
                        time.monotonic() - started)
        return out

    def _from_durable(self, inst: Instance, file: str, target: Path) -> IncrementMeta:
        """Build checkpoint ``file`` of ``inst`` at ``target`` from the durable store this run
        resumed from (downloaded and checked increment by increment)."""
        assert self.plan.resume is not None
        shutil.rmtree(target, ignore_errors=True)
        return DurableStore(self.plan.resume.uri, self.job_name).restore(inst, file, target, scratch=self.state_root)

    def _hosted(self) -> list[PartitionInstance]:
        """The instances hosted now, as a copy: restores add and removals drop instances from
        other threads while the heartbeat loop and shutdown go through them."""
        return list(self.instances.values())

    def _instance(self, task_id: int, part: int, replica: int, restoring: bool = False) -> PartitionInstance:
        task = self.plan.task(task_id)
        cls = SourceInstance if task.is_source else ProcessingInstance
        return cls(self, task, part, replica, self.plan, restoring=restoring)

    def _transport(self, w: int) -> BatchSender:
        """The sender of every batch to worker ``w`` (this one included): one thread per destination."""
        address = "" if w == self.index else self._addresses[w]
        with self._lock:
            link = self._links.get((w, address))
            if link is None:
                if w == self.index:
                    link = LocalSender(f"local-w{w}", self._deliver_local)
                else:
                    link = PushLink(WorkerDataPeer(self._peer(address)), lambda w=w: w in self.dead_workers
                                    or w in self.finished_workers or self._stopping.is_set())
                self._links[(w, address)] = link
        return link

    def _outputs(self, inst: PartitionInstance, placement: dict[ReplicaId, int], first_seqs: dict[int, int],
                 lost: frozenset[ReplicaId] = frozenset()) -> list[tuple[Any, list[OutputChannel]]]:
        """The output channels of ``inst``, each to every replica of its destination partition but
        the ``lost`` ones (running nowhere: sent to once this worker learns where they run again;
        their placement names the worker they ran on, which may be relaunched under that index)."""
        plan, cfg = self.plan, self.cfg
        outputs = []
        for edge in inst.task.outputs:
            chans = []
            for spec in plan.output_channels(inst.task.id, inst.partition, edge.edge_id):
                targets = [placement[(spec.dst_task, spec.dst_partition, r)] for r in range(plan.replicas)]
                ch = OutputChannel(spec, [self._transport(w) for w in targets], batch_size=cfg.channel_batch_size,
                                   buffer_timeout_s=cfg.channel_buffer_timeout_ms / 1000,
                                   max_ready=2 if plan.replicas == 1 else 8, first_seq=first_seqs.get(spec.id, 0),
                                   retain=cfg.rhino_enabled, backup_limit=cfg.rhino_backup_limit,
                                   on_cut_off=self._cut_off_reported, destinations=targets)
                for r in range(plan.replicas):
                    if (spec.dst_task, spec.dst_partition, r) in lost:
                        ch.cut_off(r, "lost, not restored yet")
                with self._lock:
                    for r, w in enumerate(targets):
                        self._transports_to.setdefault(w, []).append((ch, r))
                    chans.append(ch)
            outputs.append((edge, chans))
        return outputs

    # -- Rhino: restoring a lost replica here, and replaying to replicas restored elsewhere -------
    def restore(self, req: RestoreReplica) -> Restored:
        """Run the lost replica ``req.replica`` here, from the completed checkpoint this worker
        holds (hard links, no transfer) or pulls from ``req.source``; its upstreams replay from
        the returned positions."""
        assert self.checkpoints is not None
        if not self._ready.wait(self.cfg.start_timeout_ms / 1000):
            raise RuntimeError(f"worker {self.index} not ready")
        task_id, part, replica = req.replica
        if (task_id, part) in self.instances:
            raise RuntimeError(f"worker {self.index} already runs a replica of {(task_id, part)}")
        started = time.monotonic()
        self._addresses.update(req.addresses)
        inst = self._instance(task_id, part, replica, restoring=True)
        target = self.state_root / f"t{task_id}-p{part}-restored"
        if req.durable_file:
            meta = self._from_durable((task_id, part), req.durable_file, target)
        elif req.source:
            meta = self.checkpoints.fetch((task_id, part), target, req.checkpoint_id, self._peer(req.source))
        else:
            meta = self.checkpoints.restore((task_id, part), target, req.checkpoint_id)
        loaded = time.monotonic()
        runtime = inst.restore_from(meta, target)
        inst.build(self._outputs(inst, req.placement, runtime["outputs"], lost=req.lost))
        self._apply_roles(req.sinks, inst)
        inst.attempt = req.attempt
        inst.savepoint_dir = self._savepoint
        inst.rearm([order_from_wire(o) for o in req.handovers], runtime["pulse"])
        with self._lock:
            self._placement.update(req.placement)
            self._placement[(task_id, part, replica)] = self.index
        self.instances[(task_id, part)] = inst
        self._restored_at[(task_id, part)] = time.monotonic()
        self._send_to_moved(inst, req.restores_seen)
        inst.start()
        if inst.handovers is not None and inst.handovers.missing_cuts():
            with self._lock:
                self._fetching.add(inst.name)
            threading.Thread(target=self._fetch_cuts, args=(inst,), name=f"fetch-cuts-{inst.name}",
                             daemon=True).start()
        log.warning("restored %s from checkpoint %d in %.3fs (state load %.3fs)", inst.name, meta.checkpoint_id,
                    time.monotonic() - started, loaded - started)
        return Restored(meta.checkpoint_id, runtime.get("positions", {}), loaded - started,
                        time.monotonic() - started, runtime["pulse"])

    def _copy_checkpoint(self, req: CopyCheckpoint) -> Ack:
        assert self.checkpoints is not None
        started = time.monotonic()
        key = (req.instance[0], req.instance[1])
        self.checkpoints.copy(key, req.checkpoint_id, self._peer(req.source))
        log.info("holds checkpoint %d of %s too (pulled in %.3fs)", req.checkpoint_id, key, time.monotonic() - started)
        return Ack()

    def _apply_moves(self, moves: dict) -> None:
        """Replicas restored on other workers: send to them there, replaying from their checkpoint."""
        for (task_id, part, replica), (w, address, positions, restore) in moves.items():
            known = self._moves_known.get((task_id, part, replica))
            if known is not None and known.restore == restore:
                continue  # (keyed by the restore, not the worker: it may be relaunched and host it again)
            self._addresses[w] = address
            with self._lock:
                self._placement[(task_id, part, replica)] = w
                self._moves_known[(task_id, part, replica)] = KnownMove(w, dict(positions), restore)
            self.dead_workers.discard(w)  # relaunched: a replica lives there now
            for inst in self._hosted():
                for ch in inst.outputs:
                    if (ch.spec.dst_task, ch.spec.dst_partition) == (task_id, part):
                        self._rejoin(ch, replica, w, positions)

    def _send_to_moved(self, inst: Any, restores_seen: int) -> None:
        """A replica restored here: its channels were built from the placement of when its restore
        started (after the driver's first ``restores_seen`` restores), so a destination restored
        since (a move this worker applied before the instance existed) is sent to where it runs
        now, replaying from its checkpoint, even on the worker it ran on before."""
        with self._lock:
            known = dict(self._moves_known)
        for ch in inst.outputs:
            spec = ch.spec
            for replica in range(self.plan.replicas):
                move = known.get((spec.dst_task, spec.dst_partition, replica))
                if move is not None and move.restore > restores_seen:
                    self._rejoin(ch, replica, move.worker, move.positions)

    def _rejoin(self, ch: OutputChannel, replica: int, w: int, positions: dict[int, int]) -> None:
        """Send to the restored ``replica`` on ``w``, replaying from where it restarted, or (this
        upstream is itself restored: its backup starts at its own checkpoint) from the oldest batch
        it still holds: the other replica of this upstream partition replays the rest."""
        spec, transport = ch.spec, self._transport(w)
        try:
            try:
                ch.rejoin(replica, transport, positions.get(spec.id, 0), w)
            except BackupTrimmed as exc:
                held = ch.backup_from
                if held is None:
                    raise
                log.warning("channel %d replays to the restored replica %s from seq %d (%s); the other replica "
                            "of this upstream partition replays what comes before", spec.id,
                            (spec.dst_task, spec.dst_partition, replica), held, exc)
                ch.rejoin(replica, transport, held, w)
        except Exception as exc:  # noqa: BLE001 - e.g. the channel closed: nothing more to send anyway
            log.warning("channel %d cannot send to the restored replica %s (%s)", spec.id,
                        (spec.dst_task, spec.dst_partition, replica), exc)
            return
        with self._lock:
            self._transports_to.setdefault(w, []).append((ch, replica))

    def _cut_off_reported(self, spec: Any, replica: int, worker: int | None, reason: str) -> None:
        """A channel cut a destination replica off by itself (it failed, or lagged too far): the
        driver hears of it with the next heartbeat and replaces it (never silently dropped)."""
        if worker is None or worker in self.dead_workers:
            return  # the driver knows already
        with self._lock:
            self._cut_offs[(spec.dst_task, spec.dst_partition, replica)] = (worker, f"channel {spec.id}: {reason}")

    def _peer(self, address: str) -> rpc.Peer:
        if address not in self._peers:
            self._peers[address] = rpc.Peer(address, self.security)
        return self._peers[address]

    # -- handovers: instructions from the job master, the cut state between replicas ------------
    def _apply_handovers(self, orders: list[dict]) -> None:
        for wired in orders:
            order = order_from_wire(wired)
            for inst in self._hosted():
                inst.apply_handover(order)

    def send_handover_state(self, order: HandoverOrder, origin: int, per_target: dict[int, TargetCut]) -> int:
        """Deliver origin partition ``origin``'s cut of ``order``'s vnodes to every live replica of
        each target (:func:`rhino_state.cut.plan_delivery`): in process on this worker, the changes
        since the origin's last checkpoint to a worker holding it, nothing to a worker where the
        other origin replica runs (it hands its own cut over there; with Rhino a target that misses
        it fetches a kept cut), the whole cut otherwise.  Network sends run in the background, so
        the origin goes on processing.  Returns the bytes sent over the network."""
        key = (order.task, origin)
        rhino = self.checkpoints is not None
        with self._lock:
            origin_workers = {w for (t, p, _), w in self._placement.items()
                              if (t, p) == key and w not in self.dead_workers}
            targets = [(target, r, self._placement[(order.task, target, r)])
                       for target in per_target for r in range(self.plan.replicas)]
        holders = set(self.checkpoints.holders(key, self._addresses)) if rhino else set()
        shipped = 0
        for target, _, w in targets:
            cut = per_target[target]
            if w in self.dead_workers:
                continue
            how = plan_delivery(w, self.index, origin_workers, holders, cut.base is not None, rhino)
            if how is Delivery.SKIP:
                continue
            requests = list(_cut_requests(order, origin, target, cut, delta=how is Delivery.DELTA))
            if how is Delivery.LOCAL:
                try:
                    for req in requests:
                        self._handover_state(req)
                except ReplicaNotHere as exc:  # lost or replaced meanwhile: restored, it fetches a kept cut
                    log.warning("handover %d: state for %s[%d] not delivered here: %s", order.handover_id,
                                self.plan.task(order.task).name, target, exc)
                continue
            shipped += sum(entry_bytes(chunk) for chunk in _cut_chunks(cut, how is Delivery.DELTA))
            self._handover_sender().submit(self._send_cut, order.handover_id, w, requests)
        return shipped

    def _handover_sender(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._sender is None:
                self._sender = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"handover-send-w{self.index}")
            return self._sender

    def _send_cut(self, hid: int, w: int, requests: list[CutChunk]) -> None:
        try:
            for req in requests:
                if w in self.dead_workers or self._stopping.is_set():
                    return
                self._peer(self._addresses[w]).call("HandoverState", req, Ack, timeout=30)
        except Exception as exc:  # noqa: BLE001 - the other origin replica's copy, or a fetch, carries it
            log.warning("handover %d: state for %s[%d] not delivered to worker %d: %s", hid,
                        self.plan.task(requests[0].task).name, requests[0].partition, w, exc)

    def _handover_cut(self, req: CutRequest) -> KeptCut:
        """Chunk ``req.chunk`` of the cut an origin replica here keeps for a target partition
        (Rhino: for a target replica restored from a checkpoint before the release, or one that
        could not rebuild the cut from its copy of the origin's checkpoint)."""
        inst = self.instances.get((req.task, req.origin))
        kept = inst.handovers.kept_cut(req.handover, req.partition) if inst and inst.handovers else None
        twin = self.instances.get((req.task, req.partition))  # the asking target's twin, if it runs here
        if kept is None and twin is not None and twin.handovers is not None:
            kept = twin.handovers.received_cut(req.handover, req.origin, self.cfg.handover_chunk_bytes)
        if kept is None or not 0 <= req.chunk < len(kept.chunks):
            return KeptCut(missing=True)
        i = req.chunk
        return KeptCut(entries=wire.pack_rows(kept.chunks[i]), chunks=len(kept.chunks),
                       extras=_pack_extras(kept.extras) if i == 0 else b"")

    def _fetch_cuts(self, inst: PartitionInstance, blocked_for: float | None = None) -> None:
        """Fetch the origins' cuts a target replica misses from whichever origin replica kept them
        (an origin replica that cuts again after its own restore sends them too), until none is
        missing: a replica restored from a checkpoint before a release, or (``blocked_for``) one
        waiting at its release pulse that long (its local origin replica failed)."""
        assert inst.handovers is not None
        wait, failed = CUT_RETRY_S[0], set()
        try:
            while not (inst.stop_requested.is_set() or self._stopping.is_set()):
                missing = inst.handovers.missing_cuts(blocked_for)
                if not missing:
                    return
                arrived = [self._fetch_cut(inst, hid, origin, failed) for hid, origin in missing]
                time.sleep(wait)
                wait = CUT_RETRY_S[0] if any(arrived) else min(CUT_RETRY_S[1], 2 * wait)
        finally:
            with self._lock:
                self._fetching.discard(inst.name)

    def _fetch_cut(self, inst: PartitionInstance, hid: int, origin: int, failed: set | None = None) -> bool:
        """One try at the cut of ``hid`` from origin partition ``origin``, from each of its replicas
        in turn, then from the twin of ``inst`` (which keeps the cuts it received: the origin
        replicas that kept it may be lost); whether it arrived.  A worker that failed is logged
        once per cut (``failed``: those logged)."""
        assert inst.handovers is not None
        task = inst.task.id
        sources = [(origin, r) for r in range(self.plan.replicas)]
        sources += [(inst.partition, r) for r in range(self.plan.replicas) if r != inst.replica]
        for partition, r in sources:
            with self._lock:
                w = self._placement.get((task, partition, r))
            if w is None or w in self.dead_workers or w not in self._addresses:
                continue
            try:
                i, chunks = 0, 1
                while i < chunks:
                    req = CutRequest(hid, task, origin, inst.partition, i)
                    reply = (self._handover_cut(req) if w == self.index
                             else self._peer(self._addresses[w]).call("HandoverCut", req, KeptCut, timeout=30))
                    if reply.missing:
                        break
                    chunks = reply.chunks
                    inst.handovers.state_arrived(hid, origin, wire.unpack_rows(reply.entries), i, chunks,
                                                 _unpack_extras(reply.extras))
                    i += 1
                if i and i == chunks:
                    log.warning("%s: fetched the cut of handover %d of %s[%d] from %s[%d] replica %d (%d chunk(s))",
                                inst.name, hid, inst.task.name, origin, inst.task.name, partition, r, chunks)
                    return True
            except Exception as exc:  # noqa: BLE001 - the other origin replica, or the next round
                if failed is None or (hid, origin, w) not in failed:
                    why = exc.code() if callable(getattr(exc, "code", None)) else exc
                    log.warning("%s: fetching the cut of handover %d from worker %d failed: %s (asked again until "
                                "it arrives)", inst.name, hid, w, why)
                    if failed is not None:
                        failed.add((hid, origin, w))
        return False

    def _fetch_overdue_cuts(self) -> None:
        """Target replicas waiting at a release pulse for a cut that does not come: fetch it."""
        for inst in self._hosted():
            if inst.handovers is None or not inst.handovers.missing_cuts(CUT_OVERDUE_S):
                continue
            with self._lock:
                if inst.name in self._fetching:
                    continue
                self._fetching.add(inst.name)
            threading.Thread(target=self._fetch_cuts, args=(inst, CUT_OVERDUE_S), name=f"fetch-cuts-{inst.name}",
                             daemon=True).start()

    def _handover_state(self, req: CutChunk) -> Ack:
        if not self._ready.wait(self.cfg.start_timeout_ms / 1000):
            raise RuntimeError(f"worker {self.index} not ready")
        inst = self.instances.get((req.task, req.partition))
        if inst is None or inst.handovers is None:
            raise ReplicaNotHere(f"worker {self.index} hosts no replica of ({req.task}, {req.partition})")
        extras = _unpack_extras(req.extras)
        if req.changes is None:
            inst.handovers.state_arrived(req.handover, req.origin, wire.unpack_rows(req.entries) if req.entries else [],
                                         req.chunk, req.chunks, extras)
            return Ack()
        assert req.base is not None
        delta = inst.handovers.delta_arrived(req.handover, req.origin, req.base, wire.unpack_rows(req.changes),
                                             req.chunk, req.chunks, req.digest, req.count, extras)
        if delta is not None:
            threading.Thread(target=self._rebuild_cut, args=(inst, delta), name=f"rebuild-cut-{inst.name}",
                             daemon=True).start()
        return Ack()

    def _rebuild_cut(self, inst: PartitionInstance, delta: DeltaCut) -> None:
        """Rebuild an origin's cut from this worker's copy of its checkpoint ``delta.base`` and the
        changes since (waiting a little for that checkpoint if its increment is still on its way
        here); fetch the whole cut if the copy is not here or the result does not check out."""
        assert inst.handovers is not None and self.checkpoints is not None
        step = inst.handovers.step(delta.handover_id)
        if step is None:
            return
        key = (inst.task.id, delta.origin)
        groups = moved_key_groups(step.order.moves, delta.origin, inst.partition, self.plan.num_key_groups,
                                  inst.handovers.num_vnodes)
        store = self.checkpoints.store
        deadline = time.monotonic() + BASE_WAIT_S
        why = ""
        while not (inst.stop_requested.is_set() or self._stopping.is_set()):
            try:
                base = store.read_key_groups(key, delta.base, groups)
            except CheckpointNotHeldError as exc:
                last = store.last_applied(key)
                if time.monotonic() < deadline and (last is None or last.checkpoint_id < delta.base):
                    time.sleep(0.01)  # its increment is on its way here
                    continue
                why = str(exc)
                break
            entries = apply_changes(base, delta.changes)
            if len(entries) == delta.entries and cut_digest(entries) == delta.digest:
                changed = {(kg, rest) for kg, rest, _ in delta.changes}
                local = entry_bytes(e for e in entries if (e[0], e[1]) not in changed)  # what did not travel
                inst.handovers.cut_rebuilt(delta.handover_id, delta.origin, entries, delta.extras, local)
                return
            why = f"rebuilt {len(entries)} entries, digest {cut_digest(entries)[:12]}, the origin cut " \
                  f"{delta.entries}, digest {delta.digest[:12]}"
            break
        else:
            return
        log.warning("%s: cannot rebuild the cut of handover %d from the checkpoint %d of %s[%d] here (%s): "
                    "fetching it whole", inst.name, delta.handover_id, delta.base, inst.task.name, delta.origin, why)
        while not (inst.stop_requested.is_set() or self._stopping.is_set()) and \
                (delta.handover_id, delta.origin) in inst.handovers.missing_cuts():
            if not self._fetch_cut(inst, delta.handover_id, delta.origin):
                time.sleep(0.2)

    def _drop(self, drop: dict[ReplicaId, int]) -> None:
        """Stop the replicas the driver replaces (an upstream cut them off: they failed or lagged),
        unless this one is a later incarnation (restored after that decision)."""
        for (t, p, r), attempt in drop.items():
            inst = self.instances.get((t, p))
            if inst is None or inst.replica != r or inst.attempt > attempt:
                continue
            log.warning("%s: stopped, the driver replaces it (an upstream cut it off)", inst.name)
            del self.instances[(t, p)]
            inst.request_stop()

    def _apply(self, reply: Instructions) -> None:
        """Dead workers and sink roles from the job master."""
        if reply.drop:
            self._drop(reply.drop)
        for w in set(reply.dead) - self.dead_workers:
            self.dead_workers.add(w)
            for ch, r in self._transports_to.get(w, ()):  # (a replica restored elsewhere since is spared)
                ch.cut_off(r, f"worker {w} declared dead by the driver", worker=w)
        for w in set(reply.finished) - self.finished_workers:
            for ch, r in self._transports_to.get(w, ()):
                ch.retire(r, worker=w)
            self.finished_workers.add(w)  # (after: a push that gives up on it finds its replicas retired)
        for inst in self._hosted():
            self._apply_roles(reply.sinks, inst)
        if reply.handovers:
            self._apply_handovers(reply.handovers)
        self._learn_savepoint(reply)
        for task, request in reply.measure_state.items():
            for inst in self._hosted():
                if inst.task.id == task:
                    inst.measure_request = max(inst.measure_request, request)
        if reply.retained_handovers is not None:  # Rhino: the cuts origins keep for restored targets
            retained = set(reply.retained_handovers)
            for inst in self._hosted():
                if inst.handovers is not None:
                    inst.handovers.forget_kept(retained)
        for inst in self._hosted():
            if isinstance(inst, SourceInstance):
                if reply.pulse_window and tuple(reply.pulse_window) != inst.pending_window:
                    inst.pending_window = tuple(reply.pulse_window)
                    inst.wake()
                if inst.drain_at is None and (inst.task.id, inst.partition) in reply.drain_at:
                    inst.drain_at = reply.drain_at[(inst.task.id, inst.partition)]
                    inst.wake()
        if self.checkpoints is not None and reply.rhino is not None:
            self._apply_moves(reply.rhino.get("moves", {}))
            self.checkpoints.apply_view(reply.rhino)

    def _learn_savepoint(self, reply: Instructions) -> None:
        """A drain that ends in a savepoint: where its replicas write their parts (the heartbeats
        then confirm it to the driver, which waits for every worker, a standby's too)."""
        if reply.savepoint and self._savepoint is None:
            self._savepoint = reply.savepoint
            for inst in self._hosted():
                inst.savepoint_dir = self._savepoint

    @staticmethod
    def _apply_roles(roles: dict, inst: PartitionInstance) -> None:
        """The writer roles of ``inst``'s exactly-once outputs (sinks, dead letters), by kind; the
        instance is woken only when they changed (every heartbeat reply repeats them)."""
        mine = {w.kind: roles[key] for w in inst.writers
                if (key := (inst.task.id, inst.partition, w.kind)) in roles}
        if mine and mine != inst.roles_given:
            inst.roles_given = mine
            inst.pending_control = mine
            inst.wake()

    # -- running --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        master_host = self.boot.master_address.rsplit(":", 1)[0].strip("[]")
        bind_host = executor_bind_host(master_host)
        refusals, inbound = Refusals(f"worker {self.index}"), self._inbound_calls() + 16
        data = FrameServer(PUSH_METHOD, self._push_many, security=self.security, bind_host=bind_host,
                           max_connections=inbound, refusals=refusals, name=f"worker {self.index}")
        handlers = {"DataPort": rpc.typed(lambda _: data.port, type(None)),
                    "HandoverState": rpc.typed(self._handover_state, CutChunk),
                    "HandoverCut": rpc.typed(self._handover_cut, CutRequest)}
        if self.checkpoints is not None:
            handlers.update(self.checkpoints.handlers())
            handlers["Restore"] = rpc.typed(self.restore, RestoreReplica)
            handlers["CopyCheckpoint"] = rpc.typed(self._copy_checkpoint, CopyCheckpoint)
        try:
            server = rpc.serve(handlers, security=self.security, bind_host=bind_host,
                               max_workers=inbound, name=f"worker {self.index}", refusals=refusals)
        except BaseException:
            data.stop()  # the data port would otherwise outlive a worker that never started
            raise
        self.server = server
        master = rpc.Peer(self.boot.master_address, self.security)
        watch: rpc.OpenCall | None = None  # held while this attempt runs: the driver sees its process exit at once
        report = self._report("aborted")
        try:
            address = host_port(bind_host if bind_host not in ("0.0.0.0", "::") else local_advertise_host(master_host),
                                server.port)
            if self.checkpoints is not None:
                self.checkpoints.start(address)
            resumed = self._fetch_resumed()
            reply = master.call("Register", Register(self.index, self.attempt, current_executor_id(), address,
                                                     os.getpid()), Registered,
                                timeout=self.cfg.start_timeout_ms / 1000)
            if reply.status in ("ok", "standby"):
                watch = master.watch("Attach", Attach(self.index, self.attempt), on_ring=self._beat_now.set)
                self._stream_positions(master)
            if reply.status == "standby":
                log.warning("worker %d (attempt %d) is a standby: %s", self.index, self.attempt, reply.reason)
                if self.checkpoints is None:
                    report = self._idle(master)
                    return report
                self._build_host(reply.addresses)  # it may host restored replicas
                assert reply.instructions is not None
                self._apply(reply.instructions)
                self._ready.set()
                if self.boot.election_root is not None:  # KaZoo: its session is up before a restore needs it
                    threading.Thread(target=self._open_election, name=f"election-w{self.index}", daemon=True).start()
                report = self._serve(master)
                return report
            if reply.status != "ok":
                report["reason"] = reply.reason
                return report
            self._build(reply.addresses, resumed)
            assert reply.instructions is not None
            self._apply(reply.instructions)
            self._ready.set()
            if self._pulse_reader is not None:
                self._pulse_reader.start()
            if self._order_log is not None:
                self._order_log.start()
            if self._election is not None:
                self._election.start(timeout_s=self.cfg.start_timeout_ms / 1000)
            for inst in self._hosted():
                inst.start()
            report = self._serve(master)
            return report
        except Exception:
            log.exception("worker %d failed", self.index)
            raise
        finally:
            self._stopping.set()
            evicted = report.get("status") == "evicted"
            if evicted and self._election is not None:
                self._election.close()  # first: an evicted worker leaves its elections before anything slow
            for inst in self._hosted():
                inst.request_stop()
            for inst in self._hosted():
                inst.join(5)
            for reader in [*self._own_pulse_readers, *([self._pulse_reader] if self._pulse_reader else [])]:
                reader.close()
            if self._source_consumer is not None:
                self._source_consumer.close()
            if self._sender is not None:
                self._sender.shutdown(wait=False, cancel_futures=True)
            if self.checkpoints is not None:
                self.checkpoints.close()
            if self._election is not None:
                self._election.close()
            for order_log in [*self._own_order_logs, *([self._order_log] if self._order_log else [])]:
                order_log.close()
            if self.producer is not None and not evicted:
                self.producer.flush(self.cfg.stop_timeout_ms / 1000)
            try:  # (before the server stops: upstreams still sending here learn that this worker finished)
                master.call("Finished", WorkerFinished(
                    self.index, self.attempt, report["status"], report.get("reason", ""), report.get("errors", []),
                    self._metrics(), self._sink_progress()), Ack, timeout=5)
            except grpc.RpcError as err:
                log.warning("could not report the end to the driver: %s", err)
            server.stop(grace=1.0)
            data.stop()
            if self._positions is not None:
                self._positions.close()
            for call in (self._position_stream, watch):
                if call is not None:
                    call.close()
            for link in self._links.values():
                link.close()
            for peer in [*self._peers.values(), master]:
                peer.close()
            shutil.rmtree(self.state_root, ignore_errors=True)

    def _metrics(self) -> dict[str, Any]:
        return {inst.name: inst.metrics for inst in self._hosted()}

    def _catching_up_metrics(self) -> dict[str, Any] | None:
        """The metrics of the replicas restored here in the last :data:`RESTORED_REPORT_S`."""
        since = time.monotonic() - RESTORED_REPORT_S
        recent = [inst for key, inst in list(self.instances.items()) if self._restored_at.get(key, since) > since]
        return {inst.name: inst.metrics for inst in recent} or None

    def _sink_progress(self) -> dict[tuple[int, int, str], tuple[int, int]]:
        """What each exactly-once output (sink, dead letters) of the hosted replicas committed."""
        return {(t, p, w.kind): w.committed for (t, p), inst in list(self.instances.items()) for w in inst.writers}

    def _fenced_writers(self) -> dict[tuple[int, int, int, str], int]:
        """The exactly-once outputs of the hosted replicas whose writer was fenced: the epoch."""
        return {(t, p, inst.replica, w.kind): w.fenced_at for (t, p), inst in list(self.instances.items())
                for w in inst.writers if w.fenced_at >= 0}

    def _heartbeat(self, master: rpc.Peer, with_metrics: bool) -> Instructions | None:
        for inst in self._hosted():
            self._unsent_acks += inst.take_handover_acks()
        sources = [inst for inst in self._hosted() if isinstance(inst, SourceInstance)]
        with self._lock:
            cut_offs = dict(self._cut_offs)
        holding = {(inst.task.id, inst.partition, inst.replica): inst.holding for inst in sources
                   if inst.holding is not None}
        drain_positions = {(inst.task.id, inst.partition, inst.replica): inst.drain_position for inst in sources
                           if inst.drain_position is not None and inst.drain_at is None}
        req = Heartbeat(
            self.index, self.attempt, sinks=self._sink_progress(),
            errors=[inst.error for inst in self._hosted() if inst.error],
            checkpoints=self.checkpoints.report() if self.checkpoints is not None else None,
            metrics=self._metrics() if with_metrics else self._catching_up_metrics(), holding=holding,
            handover_acks=list(self._unsent_acks), savepoint_armed=self._savepoint, drain_positions=drain_positions,
            cut_offs=cut_offs, fenced=self._fenced_writers(),
            rpc_refused=self.server.refused if self.server is not None else 0)
        try:
            reply = master.call("Heartbeat", req, Instructions, timeout=5)
        except grpc.RpcError as err:
            log.warning("heartbeat failed: %s", err.code())
            if req.checkpoints and self.checkpoints is not None:
                self.checkpoints.unreport(req.checkpoints)  # the driver would never hear of them
            return None
        self._unsent_acks = []
        with self._lock:
            for replica in req.cut_offs:
                self._cut_offs.pop(replica, None)
        return reply

    def _all_finished(self) -> bool:
        # (a standby hosts nothing until a replica is restored here)
        return bool(self.instances) and all(inst.finished.is_set() for inst in self._hosted())

    def beat_soon(self) -> None:
        """Send the next heartbeat now, not at the interval: an instance has news for the driver
        (a handover's ack: its next phase waits for it).  Rings within ``BEAT_GAP_S`` merge."""
        self._beat_now.set()

    def _beat(self, master: rpc.Peer, stop: threading.Event, mailbox: _Mailbox) -> None:
        """The liveness loop: a heartbeat every interval, whatever the main loop is busy with
        (applying a reply may wait on a restore's locks for a while); each reply goes to
        ``mailbox`` with whether every instance had finished when it was asked for."""
        interval = self.cfg.heartbeat_interval_ms / 1000
        metrics_every = self.cfg.metrics_interval_ms / 1000
        next_metrics = 0.0
        last = time.monotonic()
        while not stop.is_set():
            started = time.monotonic()
            if started - last > 4 * interval:
                log.warning("heartbeat thread of worker %d ran %.2fs after its last beat (starved)", self.index,
                            started - last)
            last = started
            done = self._all_finished()
            reply = self._heartbeat(master, with_metrics=done or started >= next_metrics)
            self._stream_positions(master)
            if time.monotonic() - started > 1.0:
                log.warning("heartbeat of worker %d took %.2fs", self.index, time.monotonic() - started)
            if started >= next_metrics:
                next_metrics = started + metrics_every
            mailbox.post(reply, done, started)
            self._beat_now.wait(max(0.0, interval - (time.monotonic() - started)))
            self._beat_now.clear()
            stop.wait(max(0.0, started + BEAT_GAP_S - time.monotonic()))  # (rings merge into one beat)

    def _serve(self, master: rpc.Peer) -> dict[str, Any]:
        """Apply the driver's replies until every instance finished or the driver says stop (or
        evicts us); the heartbeats themselves go out from :meth:`_beat`."""
        interval = self.cfg.heartbeat_interval_ms / 1000
        mailbox = _Mailbox()
        stop = threading.Event()
        beater = threading.Thread(target=self._beat, args=(master, stop, mailbox), name=f"heartbeat-w{self.index}",
                                  daemon=True)
        beater.start()
        try:
            while True:
                reply, done, unreachable_since = mailbox.take(4 * interval)
                if self.producer is not None:
                    self.producer.poll(0)
                if unreachable_since is not None and \
                        time.monotonic() - unreachable_since > self.cfg.stop_timeout_ms / 1000:
                    log.error("driver unreachable for too long: stopping")
                    return self._report("driver-lost")
                if reply is None:
                    continue
                if self.checkpoints is not None:
                    self._fetch_overdue_cuts()
                if reply.command == "evicted":
                    log.error("worker %d was declared dead while it was unresponsive: stopping at once", self.index)
                    return self._report("evicted")
                self._apply(reply)
                errors = [inst.error for inst in self._hosted() if inst.error]
                if errors:
                    return self._report("failed", errors=errors)
                command = reply.command
                if command == "drain":
                    for inst in self._hosted():
                        if isinstance(inst, SourceInstance):
                            inst.request_drain()
                elif command == "stop":
                    return self._report("stopped")
                if done:
                    return self._report("finished")
                if command == "drain" and not self.instances:
                    return self._report("standby")
        finally:
            stop.set()
            self._beat_now.set()
            beater.join(5)

    def _idle(self, master: rpc.Peer) -> dict[str, Any]:
        """A standby holds its slot until the job ends."""
        while True:
            reply = self._heartbeat(master, with_metrics=False)
            if reply is not None:
                self._learn_savepoint(reply)
            if reply is not None and reply.command in ("drain", "stop", "evicted"):
                return self._report("standby")
            time.sleep(self.cfg.heartbeat_interval_ms / 1000)
