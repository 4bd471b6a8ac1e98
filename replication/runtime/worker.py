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

The worker is built of parts that each own one concern: :mod:`.driver_link` (heartbeats and the
driver's replies), the control-plane services (:mod:`.services`: each reports its part of the
heartbeat and applies its part of the reply), :mod:`.routes` (where replicas run, the channels'
senders), :mod:`.feeds` (the consumers, logs and ZooKeeper session its replicas share),
:mod:`.cut_exchange` (handover cuts between workers), :mod:`.checkpoints` (Rhino), :mod:`.restorer`
(a replica's state brought here: resumed or restored) and :mod:`.executor_watch` (the worker exits
as soon as its executor JVM begins to exit, so that its death is seen from its broken connections
at once).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from confluent_kafka import Producer

from replication.config import ReplicationConfig
from replication.messages import (
    Ack,
    Attach,
    CopyCheckpoint,
    CutChunk,
    CutRequest,
    Instructions,
    Register,
    Registered,
    RestoreReplica,
    WorkerFinished,
)
from replication.plan import PhysicalPlan
from replication.runtime.checkpoints import WorkerCheckpoints
from replication.runtime.cut_exchange import CutExchange
from replication.runtime.cut_offs import CutOffReports
from replication.runtime.deadletter import DeadLetterWriter
from replication.runtime.driver_link import DriverLink
from replication.runtime.executor_watch import ExecutorWatch
from replication.runtime.feeds import WorkerFeeds
from replication.runtime.handover_service import HandoverParticipation
from replication.runtime.instance import PartitionInstance
from replication.runtime.output_writers import OutputWriters
from replication.runtime.processing import ProcessingInstance
from replication.runtime.restorer import ReplicaRestorer
from replication.runtime.routes import Routes
from replication.runtime.savepoint_target import SavepointTarget
from replication.runtime.senders import PUSH_METHOD, receive_pushes
from replication.runtime.services import WorkerServices
from replication.runtime.source import SourceInstance
from replication.runtime.source_stops import DrainStops, WindowHolds
from replication.runtime.state_measurement import StateMeasurer
from replication.spark_cluster import (
    current_executor_id,
    current_executor_jvm_pid,
    executor_bind_host,
    local_advertise_host,
)
from rhino_state.durable import DurableStore
from rhino_state.increments import IncrementMeta
from transport import batch_format, rpc
from transport.frames import FrameServer
from transport.ids import PartitionId, ReplicaId
from transport.rpc import host_port
from transport.security import Refusals, RpcSecurity

log = logging.getLogger(__name__)


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
    heartbeat_port: int = 0  # the driver's port for heartbeat frames (on the host of master_address)


class WorkerEvicted(RuntimeError):
    """The driver declared this worker dead while it could not hear it (hung, or cut off by a
    network partition); raised from the Spark task so that Spark runs it again, as a standby."""


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
    """One worker attempt: its servers, its replicas' lifecycle, and the driver's word applied."""

    def __init__(self, boot: WorkerBootstrap, index: int, attempt: int) -> None:
        self.boot = boot
        self.cfg = boot.cfg
        self.job_name = boot.job_name
        self.index = index
        self.attempt = attempt
        self.plan = boot.plan
        base = Path(self.cfg.state_dir or Path(tempfile.gettempdir()) / "replication-state")
        self.state_root = base / boot.job_name / boot.run_id / f"w{index}-a{attempt}"
        self.instances: dict[PartitionId, PartitionInstance] = {}  # one replica per partition at most
        self._ready = threading.Event()
        self._peers: dict[str, rpc.Peer] = {}
        self.stopping = threading.Event()
        self.producer: Producer | None = None
        self.dead_letters: DeadLetterWriter | None = None
        if boot.security is None:
            raise ValueError("a worker needs the run's RPC security (WorkerBootstrap.security)")
        self.security: RpcSecurity = boot.security
        self.server: rpc.RpcServer | None = None
        durable = DurableStore(self.cfg.checkpoint_dir, self.job_name) if self.cfg.checkpoint_dir else None
        self.checkpoints = WorkerCheckpoints(self, self.state_root / "rhino", durable) if self.cfg.rhino_enabled \
            else None
        self.link = DriverLink(self)
        self._start_services()
        self.routes = Routes(index, self.cfg, self.plan, boot.placement, self.peer, self._deliver_local,
                             self.cut_offs.cut_off, self.stopping)
        self.feeds = WorkerFeeds(boot, index, attempt)
        self.cuts = CutExchange(self)
        self.restorer = ReplicaRestorer(self)

    def _start_services(self) -> None:
        """The control-plane services: each reports its part of every heartbeat and applies its
        part of the driver's reply (:mod:`.services`)."""
        self.cut_offs = CutOffReports(self)
        self.outputs = OutputWriters(self)
        self.savepoint = SavepointTarget(self)
        self.services = WorkerServices([self.cut_offs, self.outputs, HandoverParticipation(self), self.savepoint,
                                        StateMeasurer(self), WindowHolds(self), DrainStops(self)])
        if self.checkpoints is not None:
            self.services.add(self.checkpoints)

    def _report(self, status: str, **extra: Any) -> dict[str, Any]:
        return {"worker": self.index, "attempt": self.attempt, "status": status, **extra}

    # -- receiving ------------------------------------------------------------------------
    def _deliver(self, header: batch_format.BatchHeader, payload: bytes) -> bool:
        """One batch to a hosted instance without blocking (False: its queue is full, busy)."""
        inst = self.instances.get((header.task, header.partition))
        if not isinstance(inst, ProcessingInstance):
            raise ValueError(f"worker {self.index} hosts no replica of ({header.task}, {header.partition})")
        return inst.intake.deliver(header, payload)

    def _deliver_local(self, header: batch_format.BatchHeader, payload: bytes) -> bool:
        self.wait_ready()
        return self._deliver(header, payload)

    def _push_many(self, request: bytes) -> bytes:
        """The batches of a peer's :class:`PushLink`; never blocks on a full queue (busy instead)."""
        self.wait_ready()
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
        self.routes.learn(addresses)

    def _build(self, addresses: dict[int, str], resumed: dict[PartitionId, tuple[IncrementMeta, Path]]) -> None:
        """The replicas placed here; ``resumed``: those that go on from a durable cut (built from it)."""
        self._build_host(addresses)
        for (task_id, part, replica), w in sorted(self.boot.placement.items()):
            if w == self.index:
                self.instances[(task_id, part)] = self.instance(task_id, part, replica,
                                                                 restoring=(task_id, part) in resumed)
        for inst in self.hosted():
            first_seqs: dict[int, int] = {}
            if (key := (inst.task.id, inst.partition)) in resumed:
                first_seqs = inst.restore_from(*resumed[key])["outputs"]
            inst.build(self.routes.outputs(inst, self.boot.placement, first_seqs))

    def hosted(self) -> list[PartitionInstance]:
        """The instances hosted now, as a copy: restores add and removals drop instances from
        other threads while the heartbeat loop and shutdown go through them."""
        return list(self.instances.values())

    def instance(self, task_id: int, part: int, replica: int, restoring: bool = False) -> PartitionInstance:
        """A new replica of partition ``part`` of task ``task_id`` (not hosted yet)."""
        task = self.plan.task(task_id)
        cls = SourceInstance if task.is_source else ProcessingInstance
        return cls(self, task, part, replica, self.plan, restoring=restoring)

    def peer(self, address: str) -> rpc.Peer:
        """The control-plane client of the worker (or driver) at ``address``, made once."""
        if address not in self._peers:
            self._peers[address] = rpc.Peer(address, self.security)
        return self._peers[address]

    def wait_ready(self) -> None:
        """Wait until the hosted replicas are built (calls from peers may come before)."""
        if not self._ready.wait(self.cfg.start_timeout_ms / 1000):
            raise RuntimeError(f"worker {self.index} not ready")

    # -- the driver's word ---------------------------------------------------------------------
    def _apply(self, reply: Instructions) -> None:
        """Dead and finished workers, then each control-plane service's part of the reply."""
        self.routes.workers_dead(set(reply.dead))
        self.routes.workers_finished(set(reply.finished))
        self.services.apply(reply.parts)

    # -- running --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        master_host = self.boot.master_address.rsplit(":", 1)[0].strip("[]")
        bind_host = executor_bind_host(master_host)
        refusals, inbound = Refusals(f"worker {self.index}"), self._inbound_calls() + 16
        data = FrameServer(PUSH_METHOD, self._push_many, security=self.security, bind_host=bind_host,
                           max_connections=inbound, refusals=refusals, name=f"worker {self.index}")
        handlers = {"DataPort": rpc.typed(lambda _: data.port, type(None)),
                    "HandoverState": rpc.typed(self.cuts.receive_chunk, CutChunk),
                    "HandoverCut": rpc.typed(self.cuts.serve_kept_cut, CutRequest)}
        if self.checkpoints is not None:
            handlers.update(self.checkpoints.handlers())
            handlers["Restore"] = rpc.typed(self.restorer.restore, RestoreReplica)
            handlers["CopyCheckpoint"] = rpc.typed(self.restorer.copy_checkpoint, CopyCheckpoint)
        try:
            server = rpc.serve(handlers, security=self.security, bind_host=bind_host,
                               max_workers=inbound, name=f"worker {self.index}", refusals=refusals)
        except BaseException:
            data.stop()  # the data port would otherwise outlive a worker that never started
            raise
        self.server = server
        master = rpc.Peer(self.boot.master_address, self.security)
        watch: rpc.OpenCall | None = None  # held while this attempt runs: the driver sees its process exit at once
        executor: ExecutorWatch | None = None  # and this process exits as soon as its executor begins to exit
        report = self._report("aborted")
        try:
            address = host_port(bind_host if bind_host not in ("0.0.0.0", "::") else local_advertise_host(master_host),
                                server.port)
            if self.checkpoints is not None:
                self.checkpoints.start(address)
            resumed = self.restorer.fetch_resumed()
            reply = master.call("Register", Register(self.index, self.attempt, current_executor_id(), address,
                                                     os.getpid()), Registered,
                                timeout=self.cfg.start_timeout_ms / 1000)
            if reply.status in ("ok", "standby"):
                self.link.connect(master_host, self.boot.heartbeat_port, self.security)
                watch = master.watch("Attach", Attach(self.index, self.attempt), on_ring=self.link.ring)
                jvm = current_executor_jvm_pid()
                if jvm is not None:
                    executor = ExecutorWatch(jvm, self._executor_exiting).start()
                self.link.stream_positions(master)
            if reply.status == "standby":
                log.warning("worker %d (attempt %d) is a standby: %s", self.index, self.attempt, reply.reason)
                if self.checkpoints is None:
                    report = self._idle()
                    return report
                self._build_host(reply.addresses)  # it may host restored replicas
                assert reply.instructions is not None
                self._apply(reply.instructions)
                self._ready.set()
                self.feeds.start()
                if self.boot.election_root is not None:  # KaZoo: its session is up before a restore needs it
                    threading.Thread(target=self.feeds.open_election, name=f"election-w{self.index}",
                                     daemon=True).start()
                report = self._serve(master)
                return report
            if reply.status != "ok":
                report["reason"] = reply.reason
                return report
            self._build(reply.addresses, resumed)
            assert reply.instructions is not None
            self._apply(reply.instructions)
            self._ready.set()
            self.feeds.start()
            for inst in self.hosted():
                inst.start()
            report = self._serve(master)
            return report
        except Exception:
            log.exception("worker %d failed", self.index)
            raise
        finally:
            if executor is not None:
                executor.stop()
            self.stopping.set()
            evicted = report.get("status") == "evicted"
            if evicted:
                self.feeds.close_election()  # first: an evicted worker leaves its elections before anything slow
            for inst in self.hosted():
                inst.request_stop()
            for inst in self.hosted():
                inst.join(5)
            self.feeds.close()
            self.cuts.close()
            if self.checkpoints is not None:
                self.checkpoints.close()
            if self.producer is not None and not evicted:
                self.producer.flush(self.cfg.stop_timeout_ms / 1000)
            try:  # (before the server stops: upstreams still sending here learn that this worker finished)
                master.call("Finished", WorkerFinished(
                    self.index, self.attempt, report["status"], report.get("reason", ""), report.get("errors", []),
                    self.link.metrics(), self.outputs.committed()), Ack, timeout=5)
            except grpc.RpcError as err:
                log.warning("could not report the end to the driver: %s", err)
            server.stop(grace=1.0)
            data.stop()
            self.link.close()
            if watch is not None:
                watch.close()
            self.routes.close()
            for peer in [*self._peers.values(), master]:
                peer.close()
            shutil.rmtree(self.state_root, ignore_errors=True)

    def _executor_exiting(self) -> None:
        """The executor JVM began to exit (it was killed): nothing this worker does from here on can
        be reported through it, and its twins mask it only once it is seen dead; so it exits now."""
        log.error("worker %d (attempt %d): its executor JVM is exiting: the worker exits with it",
                  self.index, self.attempt)
        os._exit(1)

    def all_finished(self) -> bool:
        # (a standby hosts nothing until a replica is restored here)
        return bool(self.instances) and all(inst.finished.is_set() for inst in self.hosted())

    def _serve(self, master: rpc.Peer) -> dict[str, Any]:
        """Apply the driver's replies until every instance finished or the driver says stop (or
        evicts us); the heartbeats themselves go out from the :class:`DriverLink`."""
        interval = self.cfg.heartbeat_interval_ms / 1000
        self.link.start(master)
        try:
            while True:
                reply, done, unreachable_since = self.link.mailbox.take(4 * interval)
                if self.producer is not None:
                    self.producer.poll(0)
                if unreachable_since is not None and \
                        time.monotonic() - unreachable_since > self.cfg.stop_timeout_ms / 1000:
                    log.error("driver unreachable for too long: stopping")
                    return self._report("driver-lost")
                if reply is None:
                    continue
                if self.checkpoints is not None:
                    self.cuts.fetch_overdue_cuts()
                if reply.command == "evicted":
                    log.error("worker %d was declared dead while it was unresponsive: stopping at once", self.index)
                    return self._report("evicted")
                self._apply(reply)
                errors = [inst.error for inst in self.hosted() if inst.error]
                if errors:
                    return self._report("failed", errors=errors)
                command = reply.command
                if command == "drain":
                    for inst in self.hosted():
                        if isinstance(inst, SourceInstance):
                            inst.request_drain()
                elif command == "stop":
                    return self._report("stopped")
                if done:
                    return self._report("finished")
                if command == "drain" and not self.instances:
                    return self._report("standby")
        finally:
            self.link.stop()

    def _idle(self) -> dict[str, Any]:
        """A standby holds its slot until the job ends."""
        while True:
            reply = self.link.heartbeat(with_metrics=False)
            if reply is not None:
                self.services.apply(reply.parts)  # (it hosts nothing: in effect, the savepoint's directory)
            if reply is not None and reply.command in ("drain", "stop", "evicted"):
                return self._report("standby")
            time.sleep(self.cfg.heartbeat_interval_ms / 1000)
