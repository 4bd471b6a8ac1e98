"""The driver side: validate, plan, place, start the workers on Spark, watch, stop.

:func:`run` returns a :class:`JobHandle` at once; the workers run inside one
long-running Spark job submitted from a driver thread.  The job master (a gRPC
service in the driver) collects registrations, hands out the address table,
aggregates the workers' metrics and carries the drain/stop commands.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo_leader.election import delete_tree, evict, expel, zk_client
from kazoo_leader.segments import SegmentedLog
from liverobin.generator import FETCH_WAIT_MS, HeartbeatGenerator
from liverobin.positions import PositionBoard
from liverobin.segments import HeartbeatLog
from liverobin.windows import WindowWord
from replication import savepoint as savepoints
from replication.api import Job
from replication.config import PREFIX, ConfigError, ReplicationConfig, follow_spark_ssl
from replication.durability import (
    DurableCheckpoints,
    plan_shape,
    rescale_savepoint_dir,
    resume_point,
    run_lineage,
    with_parallelism,
)
from replication.handovers import CodeOrder, HandoverCoordinator, format_vnodes, parse_strategy, step_phases
from replication.liveness import FATAL_SILENCE_FACTOR, LateBeats, silent_workers
from replication.messages import (
    Ack,
    Attach,
    CopyCheckpoint,
    HandoverReport,
    HandoverRequest,
    Heartbeat,
    Instructions,
    Register,
    Registered,
    Restored,
    RestoreReplica,
    SourcePositions,
    WorkerFinished,
    quiet_after,
)
from replication.metrics import InstanceMetrics, aggregate, window_text
from replication.plan import (
    Instance,
    PhysicalPlan,
    ReplicaId,
    TaskSpec,
    check_replicable,
    place,
    plan_job,
    replica_name,
)
from replication.pulses import DriverPulses, switch_pulse
from replication.runtime.driver_link import HEARTBEAT_METHOD
from replication.runtime.feeds import election_identity, election_membership
from replication.runtime.worker import WorkerBootstrap, run_worker
from replication.security import job_security, remove_cli_credentials, write_cli_credentials
from replication.spark_cluster import (
    driver_advertise_host,
    driver_bind_host,
    executor_ids,
    executor_lister,
    warm_up,
)
from replication.status import write_status
from rhino_state import AllAtOnce, Batched, HandoverState, JobState, RoutingTable
from rhino_state.durable import DurableCut, DurableStore, without_credentials
from rhino_state.handover import Strategy
from rhino_state.manager import ReplicationManager, RestorePlan
from transport import rpc
from transport.frames import FrameServer
from transport.kafka_io import TopicMaker, admin_client, end_offsets_by_fetch, ensure_topics, topic_partitions
from transport.rpc import host_port
from transport.security import RpcSecurity

log = logging.getLogger(__name__)


# How often the liveness loop asks Spark which executors are registered.  A killed executor's
# worker is usually seen dead sooner, when its process exits and its watch on the driver ends:
# both wait for the kernel to tear the JVM down.
EXECUTOR_POLL_S = 0.5


class JobFailedError(RuntimeError):
    """The job stopped because of an error (a failed instance, a lost worker, a start timeout)."""


@dataclass
class WorkerInfo:
    index: int
    attempt: int
    executor: str | None
    address: str
    python_pid: int | None = None
    last_seen: float = 0.0
    standby: bool = False  # relaunched after its executor died: hosts none of its replicas
    late_beats: LateBeats = field(default_factory=LateBeats)


class JobMaster:
    """Control plane state; its methods are the gRPC handlers (called from rpc threads).

    It also watches liveness: a worker whose executor left the cluster, or that was silent
    for ``spark.replication.failureTimeout``, is declared dead.  With replication its replicas
    are cut off, the other replicas carry on, and a sink partition whose writer was there
    gets the other replica as writer with a higher epoch; without replication the job fails.
    """

    def __init__(self, plan: PhysicalPlan, placement: dict[ReplicaId, int], num_workers: int,
                 cfg: ReplicationConfig, job_name: str = "", app_id: str = "",
                 executor_ids: Callable[[], list[str]] | None = None, security: RpcSecurity | None = None) -> None:
        self.plan = plan
        self.placement = placement
        self.num_workers = num_workers
        self.replicated = plan.replicas > 1
        self.start_timeout_s = cfg.start_timeout_ms / 1000
        self.mode = cfg.mode
        self.failure_timeout_s = cfg.failure_timeout_ms / 1000
        self._patient_with: set[int] = set()  # silent workers whose loss would end the job
        self.job_name = job_name
        self.app_id = app_id
        self._executor_ids = executor_ids
        self.workers: dict[int, WorkerInfo] = {}
        self.dead: dict[int, str] = {}  # worker -> why its replicas are lost (until Spark relaunches it)
        self.lost: dict[ReplicaId, float] = {}  # replicas whose worker died, not restored: when (wall clock)
        self.command = "run"
        self.metrics: dict[str, InstanceMetrics] = {}
        self.reports: dict[int, WorkerFinished] = {}
        self.failure: str | None = None
        self.started_at: float | None = None
        self.events: list[tuple[float, str]] = []
        # the exactly-once outputs: (task, partition, kind) -> [writer replica, epoch, committed seq,
        # committed offset]; kind "out" for sink partitions, "dlq" for every partition's dead letters
        # (replicated or checkpointed jobs: written once, by one replica, fenced like a sink)
        exactly_once = self.replicated or cfg.rhino_enabled
        self.sinks: dict[tuple[int, int, str], list[int]] = {
            (t.id, p, "out"): [0, 0, -1, -1] for t in plan.tasks if any(n.kind == "sink" for n in t.chain)
            for p in range(t.parallelism)}
        if exactly_once:
            self.sinks.update({(t.id, p, "dlq"): [0, 0, -1, -1] for t in plan.tasks for p in range(t.parallelism)})
        self._cond = threading.Condition()
        self._closed = threading.Event()
        # each attached worker attempt's bell: rung when what its next heartbeat reply says changed
        # in a way that cannot wait for it (writer roles, dead workers, restored replicas)
        self._bells: dict[tuple[int, int], rpc.Bell] = {}
        # per worker attempt, the last heartbeat reply given, and the quiet ones (they beat seldom):
        # rung when the reply they would get changed
        self._given: dict[tuple[int, int], Instructions] = {}
        self._quiet: set[tuple[int, int]] = set()
        self._status_dirty = True
        self._status_written = 0.0
        # called (each in a thread of its own, outside the lock) with a worker declared dead and its attempt
        self.on_dead: list[Callable[[int, int], None]] = []
        # Rhino: replica groups and completed checkpoints; digests of the checkpoints replicas took
        # (the manager moves restored replicas in the one placement map the master and the handle share)
        self.rhino = ReplicationManager(
            placement, num_workers, cfg.rhino_replicas,
            channels=[(c.id, (c.src_task, c.src_partition), (c.dst_task, c.dst_partition)) for c in plan.channels],
        ) if cfg.rhino_enabled else None
        self._digests: dict[tuple[int, int, int], tuple[int, str]] = {}  # (task, part, id) -> (replica, digest)
        self.checkpoints_compared = 0
        self.divergences: list[str] = []
        # restored replicas: where they run now, where their upstreams replay from, and which restore
        # it was (a replica restored twice on the same worker, relaunched in between, is replayed to twice)
        self.moves: dict[ReplicaId, tuple[int, str, dict[int, int], int]] = {}
        self._restores_done = 0
        self.recoveries: list[dict[str, Any]] = []  # one per restored replica, with its timings
        self._catching_up: dict[ReplicaId, dict[str, Any]] = {}
        self._restoring: set[ReplicaId] = set()
        self._attempts: dict[ReplicaId, int] = {}  # restores of each replica: its incarnation, in its acks
        self.savepoint: str | None = None  # a drain ending in a savepoint: its directory
        self.savepoint_armed: set[int] = set()  # workers whose replicas know it
        self.measure_state: dict[int, int] = {}  # keyed task -> the latest request to measure its state per vnode
        self._unrestorable: set[ReplicaId] = set()  # reported once: no holder of a checkpoint (yet)
        self._retry_at: dict[ReplicaId, float] = {}  # a failed restore is tried again after a pause
        self._copying: dict[Instance, float] = {}  # a restore point being copied (or retried from then)
        self._peers: dict[str, rpc.Peer] = {}
        self.security = security or RpcSecurity.generate()
        self.server: rpc.RpcServer | None = None  # the job master's own server, once started
        self.rpc_refused: dict[str, int] = {}  # calls each worker's server refused ("worker N"), as reported
        self.metrics_url: str | None = None  # the Prometheus endpoint, set by the JobHandle that serves it
        self.handovers: HandoverCoordinator | None = None  # created by the first handover request
        self.durable: DurableCheckpoints | None = None  # spark.replication.checkpointDir: set by run()
        # KaZoo pulse windows (liverobin.windows): the driver's latest word
        # for the sources, and what each source replica reported holding: (window, {partition: position})
        self.pulse_window: WindowWord | None = None
        self.holding: dict[ReplicaId, tuple[int, dict[int, int]]] = {}
        self.source_positions = PositionBoard()  # how far the sources read: where pulses go
        self.drained: set[int] = set()  # workers drained by request: no restored replica goes there
        # a drain without pulses (unordered, KaZoo): where each source replica stopped reading, and where
        # every replica of a source partition ends, once all its live replicas reported (the furthest)
        self.drain_positions: dict[ReplicaId, dict[int, int]] = {}
        self.drain_at: dict[Instance, dict[int, int]] = {}
        self.dropped: dict[ReplicaId, int] = {}  # replicas replaced after a cut-off: up to which restore attempt
        self.control_address: str | None = None  # this gRPC server, for the CLI's requests (in the status file)
        self.heartbeat_port = 0  # the workers' heartbeat frames (on the control address's host; in the status file)
        self.mover: Callable[[HandoverRequest], HandoverReport] | None = None  # the JobHandle's, to the CLI

    # -- state changes (caller holds the condition unless noted) ---------------------------------
    def event(self, text: str) -> None:
        log.warning("%s", text)
        self.events.append((time.time(), text))
        self._status_dirty = True

    def note(self, text: str) -> None:
        """:meth:`event`, from a thread that does not hold the condition."""
        with self._cond:
            self.event(text)

    def resume_outputs(self, committed: Mapping[str, list[int]]) -> None:
        """A resumed run: the first writer of every exactly-once output takes over from the run
        before (epoch 1 scans what that run wrote, from the offset the cut knew committed on)."""
        for (t, p, kind), role in self.sinks.items():
            seq, offset = committed.get(f"{t}-{p}-{kind}", (-1, -1))
            self.sinks[(t, p, kind)] = [role[0], 1, seq, offset]

    def resume_restore_points(self, cut: DurableCut) -> None:
        """A resumed run: the cut's checkpoints are its first completed ones, held by the durable
        store, so a replica lost before this run's own checkpoints complete is restored from there."""
        assert self.rhino is not None
        for inst, part in sorted(cut.parts.items()):
            self.rhino.checkpoint_completed(inst, part.checkpoint_id, part.positions, part.digest, now=time.time(),
                                            holders=(), outputs=part.outputs, durable_file=part.file)

    def fail(self, reason: str) -> None:
        with self._cond:
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            self.event(f"job failed: {reason}")
        self.command = "stop"
        self._ring_workers()
        self._cond.notify_all()

    def set_command(self, command: str) -> None:
        with self._cond:
            if self.command != "stop":
                self.command = command
                self._ring_workers()

    def _bystander(self, info: WorkerInfo) -> bool:
        """A relaunched worker that can host nothing (no Rhino checkpoints to restore from): it stays
        counted dead and is left alone until the job ends.  With Rhino a relaunched worker is live
        again, and declared dead like any other."""
        return info.standby and self.rhino is None

    def _replica_label(self, t: int, p: int, r: int) -> str:
        return replica_name(self.plan.task(t).name, p, r)

    def _output_label(self, t: int, p: int, r: int, kind: str) -> str:
        """An exactly-once output of a replica, for the events: its sink or its dead letters."""
        return f"{'sink' if kind == 'out' else 'dead letters of'} {self._replica_label(t, p, r)}"

    def _declare_dead(self, w: int, reason: str) -> None:
        if w in self.dead or w in self.reports:
            return
        self.dead[w] = reason
        info = self.workers.get(w)
        self.event(f"worker {w} (executor {info.executor if info else '?'}) declared dead: {reason}")
        for hook in self.on_dead:
            threading.Thread(target=hook, args=(w, info.attempt if info else 0), name=f"on-dead-w{w}",
                             daemon=True).start()
        if self.rhino is not None:
            lost, regrouped = self.rhino.worker_dead(w)
            for (t, p), group in regrouped.items():
                self.event(f"replica group of {self.plan.task(t).name}[{p}] is now workers {group}")
        if not self.replicated and self.rhino is None:
            self._fail(f"worker {w} lost ({reason}); the job can neither mask the failure (that needs "
                       "spark.replication.enabled) nor roll the lost partitions back (spark.replication.rhino.enabled)")
            return
        now = time.time()
        for replica, ww in list(self.placement.items()):
            if ww == w and not self._lose(replica, f"worker {w}", now):
                return
        if self.drain_positions:
            self._settle_drain()  # a replica that had not reported is gone: the others decide
        if self.rhino is not None:
            self._start_restores()
        self._ring_workers()
        self._cond.notify_all()

    def _ring_workers(self) -> None:
        """Have every attached worker send its next heartbeat now (its reply says what changed)."""
        for bell in list(self._bells.values()):
            bell.ring()

    def _loss_ends_the_job(self, w: int) -> bool:
        """Whether declaring ``w`` dead now would fail the job: it runs the last live replica of a
        partition with no checkpoint another live worker holds (or the job can neither mask nor
        roll back a loss)."""
        if not self.replicated and self.rhino is None:
            return True
        def live_elsewhere(twin: ReplicaId) -> bool:
            where = self.placement.get(twin)
            return twin not in self.lost and where is not None and where != w and where not in self.dead

        for (t, p, r), ww in self.placement.items():
            if ww != w or any(live_elsewhere((t, p, rr)) for rr in range(self.plan.replicas) if rr != r):
                continue
            if self.rhino is None:
                return True
            cp = self.rhino.restore_point((t, p))
            if cp is None or not (cp.durable_file or cp.holders - self.rhino.dead - {w}):
                return True
        return False

    def _lose(self, replica: ReplicaId, where: str, now: float) -> bool:
        """``replica`` is lost (``where``: on what, for the messages): a writer role it held passes to
        its twin; the last replica of a partition is rolled back, or the job fails at once when that
        cannot be done.  False if the job failed."""
        t, p, r = replica
        self.lost.setdefault(replica, now)
        if self.handovers is not None:
            for text in self.handovers.replica_lost(replica):
                self.event(text)
        if all((t, p, rr) in self.lost for rr in range(self.plan.replicas)):
            name = self.plan.task(t).name
            lost = f"both replicas of {name}[{p}] are" if self.replicated else f"{name}[{p}] (one instance) is"
            if self.rhino is None:
                self._fail(f"{lost} lost ({where} was the last); rolling it back needs "
                           "spark.replication.rhino.enabled")
                return False
            cp = self.rhino.restore_point((t, p))
            if cp is None:
                self._fail(f"{lost} lost ({where}) before a consistent set of checkpoints to roll it back "
                           "to was completed")
                return False
            if not cp.durable_file and not cp.holders - self.rhino.dead:
                self._fail(f"{lost} lost ({where}) and so is every worker holding the checkpoint {cp.checkpoint_id} "
                           f"it would be rolled back to: nothing is left to restore it from")
                return False
            self.event(f"{lost} lost: it is rolled back to its safe checkpoint")
            return True
        for kind in ("out", "dlq"):
            role = self.sinks.get((t, p, kind))
            if role is not None and role[0] == r:
                role[0], role[1] = 1 - r, role[1] + 1
                self.event(f"{self._output_label(t, p, 1 - r, kind)} takes over writing (epoch {role[1]})")
        return True

    def _replica_cut_off(self, replica: ReplicaId, worker: int, why: str) -> None:
        """An upstream channel cut ``replica`` (on ``worker``) off by itself: it failed or lagged too
        far.  It is stopped there and replaced (restored from a checkpoint with Rhino, else the
        partition goes on with its twin alone, and the status shows it lost)."""
        finished = worker in self.reports and self.reports[worker].status == "finished"
        if replica in self.lost or self.placement.get(replica) != worker or worker in self.dead or finished:
            return  # lost already, moved since, its worker known dead, or finished (it has everything)
        name = self._replica_label(*replica)
        self.event(f"{name} on worker {worker} replaced: an upstream cut it off ({why})")
        self.dropped[replica] = self._attempts.get(replica, 0)
        if self.rhino is not None:
            for (t, p), group in self.rhino.replica_lost(replica).items():
                self.event(f"replica group of {self.plan.task(t).name}[{p}] is now workers {group}")
        if not self._lose(replica, f"{name} cut off", time.time()):
            return
        if self.drain_positions:
            self._settle_drain()
        if self.rhino is not None:
            self._start_restores()
        self._status_dirty = True
        self._ring_workers()
        self._cond.notify_all()

    def _replica_passed(self, replica: ReplicaId, pulse: int) -> bool:
        """Whether ``replica`` can no longer stop at ``pulse``: lost, or reported past it."""
        if replica in self.lost or self.placement.get(replica) in self.dead:
            return True
        m = self.metrics.get(self._replica_label(*replica))
        return m is not None and m.pulse > pulse

    def heartbeat_log_needed_from(self) -> int | None:
        """LiveRobin: the lowest pulse a source replica counted, or a restore of one (from a Rhino
        checkpoint or the durable store's oldest cut) starts after; None while not every live
        source replica has reported one.  Log segments before that pulse's are read by nobody."""
        with self._cond:
            sources = {t.id for t in self.plan.tasks if t.is_source}
            needed: list[int] = []
            for (t, p, r), w in self.placement.items():
                if t not in sources or w in self.dead or (t, p, r) in self.lost:
                    continue  # (a lost replica is restored from a checkpoint, below, or never)
                m = self.metrics.get(self._replica_label(t, p, r))
                if m is None:
                    return None
                if not m.finished:
                    needed.append(m.pulse)
            if self.rhino is not None:  # a source checkpoint's id is the last pulse it placed
                for inst in self.rhino.instances():
                    if inst[0] in sources:
                        kept = self.rhino.retain_from(inst)
                        if kept is None:
                            return None
                        needed.append(kept)
            if self.durable is not None and self.durable.oldest_kept is not None:
                needed.append(self.durable.oldest_kept)
            return min(needed, default=None)

    def _writer_fenced(self, replica: ReplicaId, kind: str, epoch: int) -> None:
        """The writer of an exactly-once output says a newer producer fenced it at ``epoch`` (a
        superseded takeover that fenced late, a fatal producer error).  Still the writer at that
        epoch: it is named again with a higher one, so it fences that producer and takes over;
        else it was rightly fenced and nothing changes."""
        t, p, r = replica
        role = self.sinks.get((t, p, kind))
        if role is None or role[0] != r or role[1] != epoch or replica in self.lost:
            return
        role[1] += 1
        self.event(f"{self._output_label(t, p, r, kind)} was fenced as writer at epoch {epoch}: "
                   f"it takes over again (epoch {role[1]})")
        self._status_dirty = True
        self._ring_workers()

    def _sink_roles(self) -> dict[tuple[int, int, str], tuple[int, int, int, int]]:
        return {key: tuple(role) for key, role in self.sinks.items()}

    # -- handlers ---------------------------------------------------------------------------------
    def _addresses(self) -> dict[int, str]:
        return {i: info.address for i, info in self.workers.items()}

    def register(self, req: Register) -> Registered:
        w, attempt = req.worker, req.attempt
        with self._cond:
            if w in self.workers:  # Spark relaunched it after its executor was lost
                self._declare_dead(w, f"relaunched by Spark (attempt {attempt})")
                if self.failure:  # (also: neither replicated nor checkpointed, so the loss failed the job)
                    return Registered("abort", self.failure or "job failed")
                self.workers[w] = WorkerInfo(w, attempt, req.executor, req.address, req.python_pid,
                                             time.monotonic(), standby=True)
                if self.rhino is not None:  # it can hold checkpoints and host restored replicas: alive again
                    self.dead.pop(w, None)  # (not there when its last attempt had reported its end)
                self.event(f"worker {w} relaunched on executor {req.executor} as a standby: " + (
                    "it joins replica groups and can host restored replicas" if self.rhino is not None else
                    "its replicas' state is lost (restoring it needs spark.replication.rhino.enabled); the other "
                    "replicas carry on"))
                if self.rhino is not None:
                    for (t, p), group in self.rhino.worker_alive(w).items():
                        self.event(f"replica group of {self.plan.task(t).name}[{p}] is now workers {group}")
                    # now, not at the next liveness round: a lost replica waiting for a free worker
                    # is restored here (its restore waits until this worker is ready)
                    self._start_restores()
                return Registered("standby", "its replicas run elsewhere now" if self.rhino is not None
                                  else "state of the lost replicas cannot be restored (no Rhino checkpoints)",
                                  self._addresses(), Instructions(self.command, list(self.dead), self._sink_roles()))
            self.workers[w] = WorkerInfo(w, attempt, req.executor, req.address, req.python_pid, time.monotonic())
            log.info("worker %d registered from executor %s at %s", w, req.executor, req.address)
            self._status_dirty = True
            self._cond.notify_all()
            ok = self._cond.wait_for(lambda: len(self.workers) >= self.num_workers or self.failure,
                                     self.start_timeout_s)
            if self.failure:
                return Registered("abort", self.failure)
            if not ok:
                self._fail(f"only {len(self.workers)} of {self.num_workers} workers registered within "
                           f"spark.replication.startTimeout; are there {self.num_workers} free task slots?")
                return Registered("abort", self.failure or "")
            executors = [i.executor for i in self.workers.values()]
            if (self.replicated or self.rhino is not None) and len(set(executors)) < len(executors):
                self._fail(f"two workers share an executor ({executors}): replicas (or checkpoints and the "
                           "partitions they are of) would not be apart; run executors with one task slot each "
                           "(spark.executor.cores = spark.task.cpus)")
                return Registered("abort", self.failure or "")
            if self.started_at is None:
                self.started_at = time.monotonic()
                self._write_status()  # now, so the kill tooling can find the replicas at once
                self._cond.notify_all()
            self.workers[w].last_seen = time.monotonic()
            # the Rhino view too: replicas ship their first checkpoint the moment they start
            return Registered("ok", "", self._addresses(), Instructions(
                self.command, list(self.dead), self._sink_roles(),
                rhino=self._rhino_view() if self.rhino is not None else None))

    def heartbeat(self, req: Heartbeat) -> Instructions:
        w, attempt = req.worker, req.attempt
        arrived = time.monotonic()  # (before the lock: waiting for it is this driver's delay, not the worker's)
        with self._cond:
            info = self.workers.get(w)
            if info is None or info.attempt != attempt or (w in self.dead and not self._bystander(info)):
                return Instructions("evicted")  # declared dead while unresponsive, or an old attempt
            info.late_beats.heard(arrived, arrived - info.last_seen, self.failure_timeout_s)
            info.last_seen = max(info.last_seen, arrived)
            if req.rpc_refused != self.rpc_refused.get(f"worker {w}", 0):
                self.rpc_refused[f"worker {w}"] = req.rpc_refused
                self._status_dirty = True
            if req.metrics is not None:
                self.metrics.update(req.metrics)
                self._status_dirty = True
                self._cond.notify_all()  # e.g. state_bytes_per_vnode waits for the replicas' measurements
                if self._catching_up:
                    self._check_caught_up()
            self._sink_progress(req.sinks)
            handovers: list[dict[str, Any]] = []
            retained = None
            if self.handovers is not None:
                news = self.handovers.on_acks(req.handover_acks)
                for text in news:
                    self.event(text)
                if news:  # committed, cancelled or completed: the next phase starts at each worker's reply
                    self._ring_workers()
                self.handovers.forget_cancelled(self._replica_passed)
                handovers = self.handovers.view()
                if self.handovers.retain:
                    retained = self.handovers.retained()
                self._cond.notify_all()
            if req.holding:  # KaZoo sources holding their records for a pulse window
                self.holding.update(req.holding)
                self._cond.notify_all()
            if req.drain_positions:
                self.drain_positions.update(req.drain_positions)
                self._settle_drain()
            for replica, (worker, why) in req.cut_offs.items():
                self._replica_cut_off(replica, worker, why)
            for (t, p, r, kind), epoch in req.fenced.items():
                self._writer_fenced((t, p, r), kind, epoch)
            if self.savepoint is not None and req.savepoint_armed == self.savepoint and w not in self.savepoint_armed:
                self.savepoint_armed.add(w)
                self._cond.notify_all()
            rhino = None
            if self.rhino is not None:
                self._checkpoint_reports(req.checkpoints or {})
                rhino = self._rhino_view()
            command = self.command
            if req.errors:
                self._fail("; ".join(req.errors))
                command = "stop"
            view = Instructions(
                command, list(self.dead), self._sink_roles(),
                [w for w, r in self.reports.items() if r.status == "finished"], handovers, retained,
                None if self.pulse_window is None else tuple(self.pulse_window), dict(self.measure_state),
                self.savepoint, rhino, dict(self.drain_at),
                dict(self.dropped))
            self._ring_quiet(req, view)
            return view

    def _ring_quiet(self, req: Heartbeat, view: Instructions) -> None:
        """Note whether ``req``'s worker is quiet now (``quiet_after``: it beats seldom), and ring
        every quiet worker that was given another reply than ``view``: it asks for it at once."""
        key = (req.worker, req.attempt)
        given, self._given[key] = self._given.get(key), view
        if quiet_after(req, view, given):
            self._quiet.add(key)
        else:
            self._quiet.discard(key)
        for other in [k for k in self._quiet if self._given[k] != view]:
            self._quiet.discard(other)
            bell = self._bells.get(other)
            if bell is not None:
                bell.ring()

    def _settle_drain(self) -> None:
        """Where each source partition's replicas end a drain without pulses: once every live
        replica reported where it stopped, the furthest of them (the others read on to it)."""
        for t in self.plan.tasks:
            if not t.is_source:
                continue
            for p in range(t.parallelism):
                if (t.id, p) in self.drain_at:
                    continue
                live = [(t.id, p, r) for r in range(self.plan.replicas)
                        if (t.id, p, r) not in self.lost and self.placement[(t.id, p, r)] not in self.dead]
                if not live or any(rep not in self.drain_positions for rep in live):
                    continue
                reported = [self.drain_positions[rep] for rep in live]
                self.drain_at[(t.id, p)] = {k: max(pos.get(k, -1) for pos in reported)
                                            for k in sorted({k for pos in reported for k in pos})}

    # -- Rhino checkpoints (caller holds the condition) ----------------------------------------
    def _checkpoint_reports(self, report: dict) -> None:
        """Digests of the checkpoints a worker's replicas took (the two replicas of a partition must
        agree) and the checkpoints its shippers saw completed."""
        assert self.rhino is not None
        for t, p, r, cid, digest in report.get("taken", ()):
            self.rhino.checkpoint_taken((t, p, r), cid)
            original = self.rhino.checkpoint((t, p), cid)
            if original is not None and original.digest:  # regenerated by a rolled-back replica
                self.checkpoints_compared += 1
                if original.digest != digest:
                    text = (f"DIVERGENCE: checkpoint {cid} of {self.plan.task(t).name}[{p}] regenerated after a "
                            f"rollback by replica {r} has state digest {digest[:16]}, the original had "
                            f"{original.digest[:16]}")
                    self.divergences.append(text)
                    self.event(text)
                continue
            other = self._digests.pop((t, p, cid), None)
            if other is None:
                self._digests[(t, p, cid)] = (r, digest)
                if len(self._digests) > 10_000:  # a replica that never reports its twin: forget the oldest
                    del self._digests[next(iter(self._digests))]
            elif other[0] != r:
                self.checkpoints_compared += 1
                if other[1] != digest:
                    text = (f"DIVERGENCE: checkpoint {cid} of {self.plan.task(t).name}[{p}]: replica {other[0]} "
                            f"has state digest {other[1][:16]}, replica {r} has {digest[:16]}")
                    self.divergences.append(text)
                    self.event(text)
        workers_at = {info.address: w for w, info in self.workers.items()}
        if report.get("completed"):
            self._status_dirty = True  # the status view shows each partition's last checkpoint
        for t, p, cid, positions, digest, chain, outputs in report.get("completed", ()):
            holders = [workers_at[a] for a in chain if a in workers_at]
            self.rhino.checkpoint_completed((t, p), cid, positions, digest, now=time.time(), holders=holders,
                                            outputs=outputs)
        if report.get("completed") and self.handovers is not None and self.handovers.history:
            rhino = self.rhino
            self.handovers.prune(lambda inst: cp.checkpoint_id if (cp := rhino.restore_point(inst)) else None)
        if self.durable is not None:
            self.durable.uploaded(report.get("durable", ()))
            self.durable.consider(self.rhino.safe, self.rhino.instances(), self.sinks)

    def _start_restores(self) -> None:
        """Restore every lost replica for which a live worker holds a completed checkpoint (one
        restore at a time per replica); the others wait for one (e.g. the relaunched worker once it
        received its groups' next checkpoints)."""
        assert self.rhino is not None
        if self.failure or self.command == "stop":
            return
        now = time.monotonic()
        avoid = self._not_hosts()
        for replica in sorted(self.lost):
            if replica in self._restoring or self._retry_at.get(replica, 0) > now:
                continue
            if any(other[:2] == replica[:2] for other in self._restoring):
                continue  # one restore per partition at a time (a rollback brings back one replica first)
            plan = self.rhino.restore_plan(replica, avoid=avoid)
            if plan is None or (plan.source is not None and plan.source not in self.workers):
                if replica not in self._unrestorable:
                    self._unrestorable.add(replica)
                    self.event(f"{self._replica_label(*replica)} cannot be restored yet: no live worker holds the "
                               "completed checkpoint it needs, or none is free to run it; its partition runs "
                               "without it until one is")
                continue
            cp, host = plan.checkpoint, plan.host
            self.rhino.restoring(replica, cp)  # pinned now: the cut may move on before the restore is done
            self._writer_from_restored(replica)
            self._restoring.add(replica)
            address = self.workers[host].address
            attempt = self._attempts[replica] = self._attempts.get(replica, 0) + 1
            req = RestoreReplica(replica, cp.checkpoint_id, dict(self.placement), self._sink_roles(),
                                 self._addresses(), attempt,
                                 # the committed handovers it takes part in that its checkpoint may predate
                                 [] if self.handovers is None else self.handovers.replica_restored(replica, attempt),
                                 "" if plan.source is None else self.workers[plan.source].address,
                                 cp.durable_file if plan.durable else "", frozenset(self.lost),
                                 self._restores_done)
            threading.Thread(target=self._restore, args=(replica, host, address, req, plan),
                             name=f"restore-{replica}", daemon=True).start()

    def _not_hosts(self) -> set[int]:
        """Workers no restored replica or checkpoint copy goes to: drained, or not registered yet."""
        return self.drained | {w for w in range(self.num_workers) if w not in self.workers}

    def _peer(self, address: str) -> rpc.Peer:
        return self._peers.get(address) or self._peers.setdefault(address, rpc.Peer(address, self.security))

    def _start_copies(self) -> None:
        """A partition whose restore point only a worker running one of its replicas holds (a
        replica restored there) is lost with that worker: a group member pulls a copy now rather
        than wait for the safe cut to reach a checkpoint it received (one copy at a time)."""
        assert self.rhino is not None
        if self.failure or self.command == "stop":
            return
        now = time.monotonic()
        for inst, cp, member, source in self.rhino.copies_wanted(avoid=self._not_hosts()):
            if self._copying.get(inst, 0) > now or source not in self.workers:
                continue
            self._copying[inst] = now + 120  # until it is done
            req = CopyCheckpoint(inst, cp.checkpoint_id, self.workers[source].address)
            threading.Thread(target=self._copy, args=(inst, member, self.workers[member].address, source, req),
                             name=f"copy-{inst}", daemon=True).start()

    def _copy(self, inst: Instance, member: int, address: str, source: int, req: CopyCheckpoint) -> None:
        """Have ``member`` pull checkpoint ``req.checkpoint_id`` of ``inst`` (its own thread)."""
        assert self.rhino is not None
        name = f"{self.plan.task(inst[0]).name}[{inst[1]}]"
        peer = self._peer(address)
        started = time.monotonic()
        try:
            peer.call("CopyCheckpoint", req, Ack, timeout=120)
        except Exception as exc:  # noqa: BLE001 - tried again in 2 s, and the chain may deliver one meanwhile
            with self._cond:
                self._copying[inst] = time.monotonic() + 2.0
                self.event(f"copying checkpoint {req.checkpoint_id} of {name} to worker {member} failed (tried "
                           f"again in 2 s): {exc}")
            return
        with self._cond:
            self._copying.pop(inst, None)
            if self.rhino.checkpoint_copied(inst, req.checkpoint_id, member):
                self.event(f"checkpoint {req.checkpoint_id} of {name} copied to worker {member} (pulled from worker "
                           f"{source} in {time.monotonic() - started:.3f}s): restorable whichever worker dies")
                self._status_dirty = True

    def _writer_from_restored(self, replica: ReplicaId) -> None:
        """A sink partition whose writer is lost (its twin too, or it was lost before its restore
        finished, or it is the one being restored): the replica being restored writes, with a higher
        epoch, so it first scans the output for what the lost writer committed."""
        t, p, r = replica
        for kind in ("out", "dlq"):
            role = self.sinks.get((t, p, kind))
            if role is not None and (t, p, role[0]) in self.lost:
                role[0], role[1] = r, role[1] + 1
                self.event(f"{self._output_label(t, p, r, kind)} writes once restored (epoch {role[1]})")

    def _restore(self, replica: ReplicaId, host: int, address: str, req: RestoreReplica, plan: RestorePlan) -> None:
        """Restore a lost replica on ``host``, which holds the checkpoint ``req`` names or pulls it
        from ``plan.source`` (its own thread); the upstreams then replay to it from their backups.
        A rollback: no live replica of the partition was left (when the restore started or by the
        time it finished)."""
        assert self.rhino is not None
        t, p, r = replica
        name = self._replica_label(t, p, r)
        peer = self._peer(address)
        info = self.workers.get(host)
        attempt = None if info is None else info.attempt
        try:
            reply = peer.call("Restore", req, Restored, timeout=120)
        except Exception as exc:  # noqa: BLE001 - reported; the partition keeps running on one replica
            with self._cond:
                self._not_restored(replica)
                self._retry_at[replica] = time.monotonic() + 2.0
                self.event(f"restoring {name} on worker {host} failed (tried again in 2 s): {exc}")
            return
        with self._cond:
            info = self.workers.get(host)
            if host in self.dead or info is None or info.attempt != attempt:
                # it is gone with its host: still lost, and restored elsewhere
                self._not_restored(replica)
                self.event(f"{name} restored on worker {host}, but that worker was declared dead meanwhile: "
                           "restored again elsewhere")
                self._start_restores()
                return
            self._restoring.discard(replica)
            dead_at = self.lost.pop(replica, time.time())
            self._unrestorable.discard(replica)
            rollback = plan.rollback or not self.rhino.replica_workers((t, p))
            self._writer_from_restored(replica)  # its twin may have died while it was restored
            for (tt, pp), group in self.rhino.replica_moved(replica, host).items():  # moves it in placement
                self.event(f"replica group of {self.plan.task(tt).name}[{pp}] is now workers {group}")
            self._restores_done += 1
            self.moves[replica] = (host, address, reply.positions, self._restores_done)
            # caught up: where its twin was (after a rollback: the furthest either replica was), by
            # pulses in LiveRobin, by the checkpoints both replicas take at the same positions in KaZoo
            sibling = self.metrics.get(self._replica_label(t, p, 1 - r))
            itself = self.metrics.get(self._replica_label(t, p, r)) if rollback else None
            known = [m for m in (sibling, itself) if m is not None]
            now = time.time()
            self._catching_up[replica] = {
                "replica": name, "worker": host, "checkpoint_id": reply.checkpoint_id,
                "failed_at": dead_at, "restored_at": now, "load_s": reply.load_s,
                "restore_s": reply.restore_s, "rollback": rollback, "pulled_from": plan.source,
                "target_pulse": max([reply.pulse, *(m.pulse for m in known)]),
                "target_checkpoint": (max([reply.checkpoint_id, *(m.checkpoint_id for m in known)])
                                      if self.mode == "kazoo" else -1)}
            # the lost incarnation's last figures (its pulse reached near its twin's) must not count
            # as the restored one's: it is caught up only by what the restored one reports
            self.metrics.pop(name, None)
            pulled = f" (pulled from worker {plan.source})" if plan.source is not None else \
                " (built from the durable cut)" if plan.durable else ""
            self.event(f"{name} {'rolled back' if rollback else 'restored'} on worker {host} from checkpoint "
                       f"{reply.checkpoint_id}{pulled} in {reply.restore_s:.3f}s ({now - dead_at:.2f}s after the "
                       "failure); its upstreams replay from their backups")
            self._status_dirty = True
            self._ring_workers()  # its upstreams send to it from their next reply on

    def _not_restored(self, replica: ReplicaId) -> None:
        """A restore that did not bring ``replica`` back: it stays lost (caller holds the lock)."""
        assert self.rhino is not None
        self._restoring.discard(replica)
        self.rhino.restore_failed(replica)
        if self.handovers is not None:
            for text in self.handovers.replica_lost(replica):
                self.event(text)

    def _check_caught_up(self) -> None:
        """A restored replica that reached the pulse its twin had at the restore: two replicas again."""
        for replica, rec in list(self._catching_up.items()):
            m = self.metrics.get(rec["replica"])
            if m is not None and m.restored_from >= 0 and m.pulse >= rec["target_pulse"] \
                    and max(m.checkpoint_id, m.restored_from) >= rec["target_checkpoint"]:
                del self._catching_up[replica]
                now = time.time()
                rec.update(caught_up_at=now, recovery_s=now - rec["failed_at"])
                self.recoveries.append(rec)
                again = "two live replicas again" if self.replicated else "its partition runs again"
                self.event(f"{rec['replica']} caught up: {again}, {rec['recovery_s']:.2f}s after the failure")

    def _rhino_view(self) -> dict:
        """What workers need: groups (addresses, chain order), completed checkpoints, shippers."""
        assert self.rhino is not None
        addresses = {w: i.address for w, i in self.workers.items()}
        groups = {inst: [addresses[w] for w in g if w in addresses] for inst, g in self.rhino.groups.items()}
        rhino = self.rhino
        completed = {inst: cp.checkpoint_id for inst, cp in rhino.completed.items()}
        trim = {inst: cut for inst in rhino.instances() if (cut := rhino.trim_positions(inst)) is not None}
        retain = {inst: rhino.retain_from(inst) for inst in rhino.instances()}
        shippers = {}
        for (t, p, r), w in sorted(self.placement.items()):
            if w not in self.dead and (t, p, r) not in self.lost and (t, p) not in shippers:
                shippers[(t, p)] = r
        return {"groups": groups, "completed": completed, "trim": trim, "retain": retain, "shippers": shippers,
                "moves": dict(self.moves)}

    def _sink_progress(self, progress: dict) -> None:
        for key, (seq, offset) in progress.items():
            role = self.sinks.get(key)
            if role is not None:
                role[2], role[3] = max(role[2], seq), max(role[3], offset)

    def report_positions(self, req: SourcePositions) -> None:
        """A worker's stream of its sources' positions (a gRPC handler; no lock of the master)."""
        self.source_positions.update(req.positions)

    def attach(self, req: Attach) -> rpc.Watched:
        """A worker attempt's watch (a gRPC handler): when it ends before the attempt reported its
        end, the worker's process exited or lost its connection to this driver.  Its bell has the
        worker beat at once when something changed for it."""
        bell = rpc.Bell()
        with self._cond:
            self._bells[(req.worker, req.attempt)] = bell
        return rpc.Watched(lambda: self._watch_ended(req.worker, req.attempt), bell)

    def _watch_ended(self, w: int, attempt: int) -> None:
        with self._cond:
            self._bells.pop((w, attempt), None)
            self._given.pop((w, attempt), None)
            self._quiet.discard((w, attempt))
        if self._closed.is_set():
            return
        with self._cond:
            info = self.workers.get(w)
            if info is not None and info.attempt == attempt and self._liveness_counts(w, info):
                self._declare_dead(w, "its process exited (its connection to the driver closed)")

    def _liveness_counts(self, w: int, info: WorkerInfo) -> bool:
        """Whether losing worker ``w`` now would be a death: the job started, and ``w`` is neither
        dead already, nor ended (reported), nor a bystander (the rule of every failure detector)."""
        return self.started_at is not None and w not in self.dead and w not in self.reports \
            and not self._bystander(info)

    def finished(self, req: WorkerFinished) -> Ack:
        w = req.worker
        with self._cond:
            info = self.workers.get(w)
            current = info is not None and info.attempt == req.attempt
            if current and req.status != "evicted":
                # (an evicted attempt's replicas run elsewhere now: its stale figures must not
                # replace what their restored incarnations report, e.g. their final digests)
                self.metrics.update(req.metrics)
                self._sink_progress(req.sinks)
                self.reports[w] = req
                if self.rhino is not None:
                    self.rhino.worker_ended(w)  # its server stops: restores and copies go elsewhere
                if req.status == "finished":
                    self._ring_workers()  # its upstreams stop sending to it (retire) at once
            if req.status == "failed":
                if w in self.dead:  # its replicas were cut off already: what broke there is no failure
                    self.event(f"worker {w}, declared dead before, reported: {'; '.join(req.errors)}")
                else:
                    self._fail("; ".join(req.errors))
            self._status_dirty = True
            self._cond.notify_all()
        return Ack()

    # -- watching ---------------------------------------------------------------------------------
    def move(self, req: HandoverRequest) -> HandoverReport:
        """The CLI's ``replication move`` (a gRPC handler): the answer of the job's handle."""
        if self.mover is None:
            return HandoverReport(error="the job is not ready for handovers yet")
        return self.mover(req)

    def all_done(self) -> bool:
        """Every worker has reported its end, or is dead with no relaunch running."""
        with self._cond:
            return all(w in self.reports or (w in self.dead and not self._bystander(self.workers[w]))
                       for w in range(self.num_workers) if w in self.workers) and len(self.workers) > 0

    def monitor(self, period_s: float = 0.1, executor_poll_s: float = EXECUTOR_POLL_S) -> None:
        """Liveness loop (a driver thread) until :meth:`close`; Spark's list of executors is asked
        for every ``executor_poll_s`` (a py4j call costs the driver and its JVM more than the rest
        of a round)."""
        last_round = time.monotonic()
        next_poll = last_round
        while not self._closed.wait(period_s):
            alive_executors = None
            if self._executor_ids is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + executor_poll_s
                try:
                    alive_executors = set(self._executor_ids())
                except Exception as err:  # noqa: BLE001 - the SparkContext may be stopping
                    log.debug("executor list unavailable: %s", err)
            status = None
            with self._cond:
                now = time.monotonic()
                if now - last_round > max(0.5, self.failure_timeout_s / 4):
                    # this driver stalled (GIL, GC, a slow Spark call): the heartbeats that could not be
                    # handled meanwhile say nothing about the workers
                    log.warning("job master stalled for %.1fs: worker silence is counted from now", now - last_round)
                    for info in self.workers.values():
                        info.last_seen = max(info.last_seen, now)
                last_round = now
                silence: dict[int, float] = {}
                for w, info in list(self.workers.items()):
                    if not self._liveness_counts(w, info):
                        continue
                    if alive_executors is not None and info.executor not in alive_executors:
                        self._declare_dead(w, f"executor {info.executor} left the cluster")
                    else:
                        silence[w] = now - info.last_seen
                fatal = {w for w, s in silence.items() if s > self.failure_timeout_s and self._loss_ends_the_job(w)}
                for w in fatal - self._patient_with:
                    self.event(f"worker {w} silent for {silence[w]:.1f}s, but its loss would end the job: "
                               f"declared dead only after {self.failure_timeout_s * FATAL_SILENCE_FACTOR:.1f}s")
                self._patient_with = fatal
                patience = {w: self.workers[w].late_beats.patience(now, self.failure_timeout_s) for w in silence}
                for w in silent_workers(silence, self.failure_timeout_s, fatal=fatal, patience=patience):
                    if self._liveness_counts(w, self.workers[w]):
                        worst = self.workers[w].late_beats.worst(now)
                        strained = f" (waited longer: its heartbeats came up to {worst:.1f}s apart lately)" \
                            if patience[w] > 1 else ""
                        self._declare_dead(w, f"silent for {silence[w]:.1f}s{strained}")
                if self.rhino is not None and self.lost and not self._restoring:
                    self._start_restores()
                if self.rhino is not None:
                    self._start_copies()
                if self._status_dirty and time.monotonic() - self._status_written >= 0.5 and self.job_name:
                    self._status_dirty = False
                    self._status_written = time.monotonic()
                    status = self._status_or_none("running")
            if status is not None:  # written (fsync) outside the lock: heartbeats do not wait for the disk
                self._publish_status(status)

    def end_watching(self) -> None:
        """The job is over: stop the liveness loop; the watches that end as the server stops then
        say nothing about the workers."""
        self._closed.set()

    def close(self, state: str) -> None:
        self.end_watching()
        with self._cond:
            self._write_status(state)

    def _write_status(self, state: str = "running") -> None:
        if self.job_name and (status := self._status_or_none(state)) is not None:
            self._publish_status(status)

    def _status_or_none(self, state: str) -> dict[str, Any] | None:
        try:
            return self._status(state)
        except Exception:  # noqa: BLE001 - the status view must never stop the monitor or a registration
            log.exception("cannot build the job status")
            return None

    def _publish_status(self, status: dict[str, Any]) -> None:
        try:
            write_status(self.job_name, status)
        except OSError as err:
            log.warning("cannot write the job status file: %s", err)

    def _status(self, state: str) -> dict[str, Any]:
        """What ``replication status`` shows (written as JSON next to the job)."""
        return {
            "job": self.job_name, "app_id": self.app_id, "driver_pid": os.getpid(), "updated": time.time(),
            "state": state, "control_address": self.control_address, "heartbeat_port": self.heartbeat_port,
            "workers": {str(w): {"executor": i.executor, "address": i.address, "python_pid": i.python_pid,
                                 "attempt": i.attempt, "alive": w not in self.dead or self._bystander(i),
                                 "standby": i.standby} for w, i in self.workers.items()},
            "replicas": {self._replica_label(t, p, r): {"task": t, "partition": p, "replica": r, "worker": w}
                         for (t, p, r), w in self.placement.items()},
            "sinks": {self._replica_label(t, p, role[0]): {"epoch": role[1], "committed_seq": role[2]}
                      for (t, p, kind), role in self.sinks.items() if kind == "out"},
            "events": [{"time": ts, "text": text} for ts, text in self.events[-50:]],
            "checkpoints": {} if self.rhino is None else {
                f"{self.plan.task(t).name}[{p}]": {
                    "group": self.rhino.groups.get((t, p), []),
                    **({"completed": cp.checkpoint_id, "completed_at": cp.completed_at,
                        "holders": sorted(cp.holders)} if (cp := self.rhino.completed.get((t, p))) else {})}
                for t, p in self.rhino.instances()},
            "divergences": self.divergences[-10:],
            "durable": None if self.durable is None else self.durable.status(),
            "metrics": {name: {"in": m.records_in, "out": m.records_out, "dedup_dropped": m.dedup_dropped,
                               "gaps": m.gaps, "queue": m.queue_batches, "dead_lettered": m.dead_lettered,
                               "p50_ms": round(m.latency.percentile(0.5) * 1000, 1),
                               "p99_ms": round(m.latency.percentile(0.99) * 1000, 1),
                               "role": m.role, "finished": m.finished, "leader": m.leader,
                               "order_epoch": m.order_epoch, "pulse": m.pulse, "restored_from": m.restored_from,
                               "checkpoint_id": m.checkpoint_id} for name, m in self.metrics.items()},
            # for `replication status`: the task graph, lost replicas, recoveries, the metrics endpoint
            "ordering": self.mode if self.mode in ("kazoo", "liverobin") else "none",
            "replicated": self.replicated, "rhino": self.rhino is not None,
            "tasks": [{"id": t.id, "name": t.name, "parallelism": t.parallelism,
                       "operators": [n.name for n in t.chain],
                       "inputs": [f"{self.plan.task(i.src_task).name}[{i.partitioning}]" for i in t.inputs]}
                      for t in self.plan.tasks],
            "lost": sorted(self._replica_label(*replica) for replica in self.lost),
            "recoveries": self.recoveries[-20:], "checkpoints_compared": self.checkpoints_compared,
            "metrics_url": self.metrics_url,
            # handovers: the vnode map of every keyed task, the handovers not completed, drained workers
            "routing": {self.plan.task(t).name: {
                "epoch": table.epoch, "active": table.parallelism,
                "vnodes": [table.assignment.count(p) for p in range(self.plan.task(t).parallelism)]}
                for t, table in (self.handovers.manager.tables if self.handovers is not None
                                 else self.plan.routing).items()},
            "handovers": [] if self.handovers is None else [
                {"id": o.handover_id, "task": self.plan.task(o.task).name,
                 "state": self.handovers.state(o.handover_id).value,
                 "what": (f"operator {o.operator} version {o.version}" if isinstance(o, CodeOrder) else
                          f"{len(o.moves)} vnode(s) from {sorted(o.origins)} to {sorted(o.targets)}")}
                for o in self.handovers.orders.values()],
            "pulse_window": self.pulse_window, "drained": sorted(self.drained),
            "rpc_refused": self.refused_calls(),
        }

    def refused_calls(self) -> dict[str, int]:
        """Unauthenticated calls each server refused: the driver's and each worker's (as reported)."""
        with self._cond:
            return {"driver": self.server.refused if self.server is not None else 0, **self.rpc_refused}

    def snapshot(self) -> dict[str, InstanceMetrics]:
        with self._cond:
            return dict(self.metrics)


@dataclass
class JobResult:
    status: str  # finished | stopped | failed
    metrics: InstanceMetrics
    per_instance: dict[str, InstanceMetrics]
    failure: str | None = None
    duration_s: float = 0.0
    workers: dict[int, WorkerInfo] = field(default_factory=dict)
    records_read: int = 0  # from Kafka, by the sources
    records_written: int = 0  # output records (counted once, whatever the replication)
    events: list[tuple[float, str]] = field(default_factory=list)  # failovers, standbys, failures
    recoveries: list[dict[str, Any]] = field(default_factory=list)  # restored replicas, with timings
    checkpoints_compared: int = 0  # checkpoints whose two replicas' digests were compared
    divergences: list[str] = field(default_factory=list)  # checkpoints whose replicas disagreed

    def summary(self) -> str:
        late = self.metrics.late_records
        return (f"{self.status} after {self.duration_s:.1f}s: {self.records_read:,} records read, "
                f"{self.records_written:,} written, {self.metrics.dead_lettered:,} dead-lettered"
                + (f", {late:,} late (behind the watermark: dropped)" if late else ""))


def _source_records(plan: PhysicalPlan, snapshot: dict[str, InstanceMetrics]) -> int:
    """Records read from Kafka, once per source partition (the replica that read the most)."""
    sources = {t.name for t in plan.tasks if t.is_source}
    best: dict[str, int] = {}
    for name, m in snapshot.items():
        part = name.rsplit("r", 1)[0]
        if part.rsplit("[", 1)[0] in sources:
            best[part] = max(best.get(part, 0), m.records_in)
    return sum(best.values())


def _role_metrics(plan: PhysicalPlan, snapshot: dict[str, InstanceMetrics], kind: str) -> InstanceMetrics:
    """Aggregate of the instances whose task contains an operator of ``kind`` (source or sink)."""
    names = {t.name for t in plan.tasks if any(n.kind == kind for n in t.chain)}
    return aggregate({k: v for k, v in snapshot.items() if k.rsplit("[", 1)[0] in names})


class ElectionJanitor:
    """The driver's ZooKeeper session for KaZoo: when a worker is declared dead it deletes that
    worker's election nodes, so the partitions it led fail over at once instead of after the
    ZooKeeper session timeout (safe even if the worker is only hung: it can no longer publish
    under a current epoch), after expelling it (deleting its membership node) so that it can never
    enter an election again; at the end it removes the run's election tree."""

    def __init__(self, connect: str, root: str, master: JobMaster, digest: str | None = None) -> None:
        self.root = root
        self._master = master
        self._client = zk_client(connect, digest, timeout=10)
        try:
            self._client.start(timeout=15)
        except Exception as exc:  # noqa: BLE001 - a clear message instead of kazoo's timeout
            self._client.close()
            raise RuntimeError(f"cannot reach ZooKeeper at {connect} (spark.replication.zookeeper.connect): "
                               f"{exc}") from None
        master.on_dead.append(self.evict)

    def evict(self, worker: int, attempt: int) -> None:
        try:
            # expelled first: a hung worker that wakes up (its session expired) cannot re-enter
            expel(self._client, election_membership(self.root, worker, attempt))
            removed = evict(self._client, self.root, election_identity(worker, attempt))
        except Exception as exc:  # noqa: BLE001 - the session timeout still fails it over
            log.warning("could not evict worker %d from its elections: %s", worker, exc)
            return
        if removed:
            with self._master._cond:
                self._master.event(f"worker {worker} removed from {len(removed)} leader election(s): "
                                   "its leaderships fail over now")

    def close(self) -> None:
        try:
            delete_tree(self._client, self.root)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not remove %s from ZooKeeper: %s", self.root, exc)
        self._client.stop()
        self._client.close()


# A handover job aborted because a participant was already past the switch pulse goes again this often.
LATE_RETRIES = 2


@dataclass(frozen=True)
class ControlServers:
    """The job master's servers: gRPC for the control calls, watches and streams, signed frames for
    the workers' heartbeats (a gRPC unary call costs several times the CPU of the same bytes on a
    socket, and every worker beats several times a second, idle or not)."""

    calls: rpc.RpcServer
    heartbeats: FrameServer

    def stop(self, grace: float | None = None) -> None:
        self.heartbeats.stop()
        self.calls.stop(grace=grace)


class JobHandle:
    """A running job: watch it, drain it, stop it."""

    def __init__(self, job: Job, cfg: ReplicationConfig, plan: PhysicalPlan, placement: dict[ReplicaId, int],
                 master: JobMaster, server: Any, sc: Any, group: str,
                 elections: ElectionJanitor | None = None) -> None:
        self.job, self.cfg, self.plan, self.placement = job, cfg, plan, placement
        self.master = master
        self._server = server
        self._sc = sc
        self._group = group
        self._done = threading.Event()
        self._spark_error: BaseException | None = None
        self._cancelled_after_end = False  # we cancelled a relaunch nobody needs: not a failure
        self._result: JobResult | None = None
        self._started = time.monotonic()
        self._elections = elections
        self.pulses: DriverPulses | None = None
        self._segment_maker = TopicMaker(cfg.kafka_admin_config())  # the heartbeat log's next segments
        if plan.heartbeat_log is not None:
            resumed_at = int(plan.resume.cut.run.get("pulse", 0)) if plan.resume is not None else 0
            retain = cfg.mode == "liverobin"  # (KaZoo's log holds pulse windows only: a few segments)
            self.pulses = DriverPulses(self._new_generator, plan.heartbeat_log, master.event, first_h=resumed_at,
                                       needed_from=master.heartbeat_log_needed_from if retain else None,
                                       delete_topics=self._segment_maker.delete if retain else None)
            if master.durable is not None:  # a cut says how far the log was: a resume reads it from there
                master.durable.pulse = lambda: self.pulses.last_h if self.pulses is not None else 0
        if cfg.mode == "liverobin":
            self.start_pulse_generator()
        self.metrics_server: Any = None  # the Prometheus endpoint (replication.prometheus.MetricsServer)
        if cfg.metrics_port:
            self._start_metrics_endpoint(cfg.metrics_port)

    def _start_metrics_endpoint(self, port: int) -> None:
        """Serve ``GET /metrics`` (Prometheus) on ``port`` until the job ends; a port that cannot be
        bound is logged and recorded as an event, and the job runs without the endpoint."""
        from replication.prometheus import MetricsServer, collect, render

        host = self.cfg.metrics_bind_address or driver_bind_host(self._sc)
        try:
            self.metrics_server = MetricsServer(lambda: render(collect(self.master)), port, host,
                                                self.cfg.metrics_basic_auth)
        except OSError as err:
            with self.master._cond:
                self.master.event(f"no metrics endpoint: cannot listen on {host} port {port} "
                                  f"(spark.replication.metrics.port, metrics.bindAddress): {err}")
            return
        with self.master._cond:
            wildcard = host in ("0.0.0.0", "::", "")
            self.master.metrics_url = self.metrics_server.url(driver_advertise_host(self._sc) if wildcard else host)
            self.master._status_dirty = True  # the status file shows it
        log.info("job %s: Prometheus metrics at %s", self.job.name, self.metrics_url)

    @property
    def metrics_url(self) -> str | None:
        """The Prometheus endpoint's URL (None: no endpoint); kept by the job master, which
        publishes it in the status file."""
        return self.master.metrics_url

    # -- LiveRobin heartbeat generators ----------------------------------------------------
    @property
    def pulse_generators(self) -> list[HeartbeatGenerator]:
        """Every heartbeat generator this driver started (LiveRobin, or KaZoo's for pulse windows)."""
        return self.pulses.generators if self.pulses is not None else []

    def start_pulse_generator(self, windowed: bool = False) -> HeartbeatGenerator:
        """Start one more heartbeat generator in this driver (LiveRobin); several may run at once
        and one may be killed and restarted at any time: the log decides which pulses count.
        ``windowed``: KaZoo's, which writes only the pulse windows of handovers."""
        if self.pulses is None:
            raise RuntimeError("heartbeat generators only exist with spark.replication.mode=liverobin or kazoo")
        return self.pulses.start(windowed)

    def _new_generator(self, name: str, from_segment: int, windowed: bool) -> HeartbeatGenerator:
        cfg, log_ = self.cfg, self.plan.heartbeat_log
        assert log_ is not None
        return HeartbeatGenerator(
            name=name, heartbeat_log=log_,
            sources=self.plan.source_topics(), positions=self.master.source_positions,
            starts={t.head.spec["topic"]: self.plan.source_start_offsets.get(t.id, {})
                    for t in self.plan.tasks if t.is_source},
            period_s=cfg.pulse_period_ms / 1000, max_step=cfg.liverobin_max_pulse_step,
            consumer_conf=cfg.kafka_consumer_config(group_id=f"replication-{self.job.name}-pulses"),
            producer_conf=cfg.kafka_producer_config(), create_topics=self._segment_maker,
            from_segment=from_segment, windowed=windowed)

    def kill_pulse_generators(self) -> list[str]:
        """Stop every running heartbeat generator at once, without a final pulse (a crash for the
        log); the sources hold their records until a generator runs again (one that dies on its
        own is replaced: replication.pulses).  Returns their names."""
        return self.pulses.kill() if self.pulses is not None else []

    # started by run()
    def _run_spark_job(self, boot: WorkerBootstrap) -> None:
        try:
            self._sc.setJobGroup(self._group, f"replicated streaming job {self.job.name}", interruptOnCancel=True)
            n = boot.num_workers

            def entry(index: int, _: Any) -> Any:
                from pyspark import TaskContext

                ctx = TaskContext.get()
                yield run_worker(boot, index, ctx.attemptNumber() if ctx else 0)

            self._sc.parallelize(range(n), n).mapPartitionsWithIndex(entry).collect()
        except BaseException as err:  # noqa: BLE001 - reported by wait()
            self._spark_error = err
        finally:
            self._done.set()

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def wait_started(self, timeout: float | None = None) -> None:
        """Block until every worker has registered and the replicas run (or raise)."""
        timeout = self.cfg.start_timeout_ms / 1000 if timeout is None else timeout
        with self.master._cond:
            self.master._cond.wait_for(lambda: self.master.started_at is not None or self.master.failure
                                       or not self.running, timeout)
        if self.master.started_at is None:
            if self.master.failure or not self.running:
                self.wait(30)  # raises JobFailedError with the reason
            raise TimeoutError(f"job {self.job.name}: workers did not register within {timeout}s")

    def metrics(self) -> InstanceMetrics:
        """Metrics summed over all instances, as last reported."""
        return aggregate(self.master.snapshot())

    def sink_metrics(self) -> InstanceMetrics:
        """Metrics of the instances that host sinks (records_out: written; latency: end to end)."""
        return _role_metrics(self.plan, self.master.snapshot(), "sink")

    def source_metrics(self) -> InstanceMetrics:
        """Metrics of the source instances (records_in: records read from Kafka)."""
        return _role_metrics(self.plan, self.master.snapshot(), "source")

    def recoveries(self) -> list[dict[str, Any]]:
        """Replicas restored from Rhino checkpoints that caught up (two live replicas again), with
        their timings: failed_at, restored_at, caught_up_at (wall clock), load_s, recovery_s; and
        pulled_from: the worker the checkpoint was pulled from (None: the host held it)."""
        with self.master._cond:
            return [dict(r) for r in self.master.recoveries]

    def placement_table(self) -> str:
        """Which replica runs in which worker on which executor (and which workers are dead)."""
        lines = []
        workers = self.master.workers
        for w in range(max(self.placement.values()) + 1):
            info = workers.get(w)
            where = f"executor {info.executor} at {info.address}" if info else "not registered"
            if w in self.master.dead:
                where += f", DEAD ({self.master.dead[w]})" + (" -> standby" if info and info.standby else "")
            names = [replica_name(self.plan.task(t).name, p, r)
                     for (t, p, r), ww in sorted(self.placement.items()) if ww == w]
            lines.append(f"  worker {w} ({where}): {', '.join(names)}")
        return "\n".join(lines)

    def move_vnodes(self, task: str, vnodes: Sequence[int], target: int, timeout: float = 60.0,
                    margin_s: float = 0.5, release_s: float | None = None, strategy: Strategy | None = None,
                    gap_s: float = 0.0) -> dict[str, Any]:
        """Move ``vnodes`` of the keyed ``task`` to its partition ``target`` while the job runs
        (docs/handover.md): every upstream reroutes them at a pulse about ``margin_s`` ahead, the
        origin cuts their state and sends it to the target, which processes their records from
        the pulse ``release_s`` later on (None: sized from the task's earlier steps, see
        :class:`replication.handovers.ReleaseMargin`; 0.15 s before any).  Exactly once on both
        replicas.

        ``strategy``: ``AllAtOnce()`` (default: one step), ``Fluid()`` (one vnode per step) or
        ``Batched(n)`` (n per step), each step a handover of its own, ``gap_s`` apart so queues
        drain.  Returns the job's state and, per step, its id, pulses, release margin, state
        entries and bytes moved, duration, its participants' timeline (wall clock) and its
        phases (:func:`replication.handovers.step_phases`); raises ValueError for a request it
        refuses and TimeoutError if it did not complete within ``timeout``."""
        tid = self._keyed_task(task)
        strategy = strategy or AllAtOnce()

        def submit(c: HandoverCoordinator, sizes: list[int] | None) -> int:  # (a retry: what is not there yet)
            left = [v for v in vnodes if c.manager.tables[tid].partition_of_vnode(v) != target] or list(vnodes)
            return c.start_job(tid, left, target, strategy, sizes)

        return self._run_handover_job(
            task, submit,
            f"vnodes {format_vnodes(vnodes)} to partition {target}", strategy, timeout, margin_s, release_s, gap_s)

    def rescale(self, task: str, parallelism: int, timeout: float = 120.0, margin_s: float = 0.5,
                release_s: float | None = None, strategy: Strategy | None = None, gap_s: float = 0.0) -> dict[str, Any]:
        """Run the keyed ``task`` on ``parallelism`` of its partitions while the job runs, up or
        down: the fewest vnodes move (balanced to within one vnode per partition), the partitions
        beyond ``parallelism`` end with none.  The task hosts ``max_parallelism`` partitions from
        the start (``KeyedStream.process(max_parallelism=...)``), the spare ones idle.  Moves and
        the report as in :meth:`move_vnodes`."""
        tid = self._keyed_task(task)
        strategy = strategy or AllAtOnce()
        return self._run_handover_job(
            task, lambda c, sizes: c.start_rescale(tid, parallelism, strategy, sizes), f"rescale to {parallelism} partitions",
            strategy, timeout, margin_s, release_s, gap_s)

    def drain_executor(self, executor: str, timeout: float = 120.0) -> dict[str, Any]:
        """Move every replica off ``executor`` while the job runs (maintenance): its worker stops
        as if it had died, the twins go on serving (nothing stalls but the replicas' own catch-up),
        and each of its replicas is restored from its latest Rhino checkpoint on a member of its
        replica group, then caught up from its upstreams' backups.  Needs replication and Rhino.
        Returns where each replica went and how long it took; ValueError when draining would
        leave a partition without a live replica or nowhere to restore."""
        master = self.master
        if not self.plan.replicas > 1 or master.rhino is None:
            raise ValueError("draining an executor needs spark.replication.enabled (the twins serve meanwhile) and "
                             "spark.replication.rhino.enabled (the replicas are restored from their checkpoints)")
        started = time.monotonic()
        with master._cond:
            live = {w: i for w, i in master.workers.items() if w not in master.dead and not i.standby}
            w = next((w for w, i in live.items() if str(i.executor) == str(executor)), None)
            if w is None:
                raise ValueError(f"no live worker runs on executor {executor!r} (live: executors "
                                 f"{sorted(str(i.executor) for i in live.values())})")
            replicas = sorted(rid for rid, ww in self.placement.items() if ww == w)
            alone = [master._replica_label(t, p, r) for t, p, r in replicas
                     if any((t, p, rr) in master.lost for rr in range(self.plan.replicas) if rr != r)]
            if alone:
                raise ValueError(f"draining executor {executor} would leave {alone} without a live replica")
            if len(live) < 3:
                raise ValueError(f"draining executor {executor} leaves {len(live) - 1} live worker(s): two replicas of "
                                 "a partition and its checkpoints need at least two others")
            labels = {master._replica_label(t, p, r) for t, p, r in replicas}
            seen = len(master.recoveries)
            master.drained.add(w)  # (Spark reruns its task there as a standby: it may keep checkpoints)
            master._declare_dead(w, f"drained by request (executor {executor})")
            master._status_dirty = True
            done = master._cond.wait_for(lambda: master.failure is not None or labels <= {
                rec["replica"] for rec in master.recoveries[seen:]}, timeout)
            if master.failure is not None:
                raise JobFailedError(f"job failed while draining executor {executor}: {master.failure}")
            if not done:
                raise TimeoutError(f"draining executor {executor}: {sorted(labels - {r['replica'] for r in master.recoveries[seen:]})} "
                                   f"not restored and caught up within {timeout:g}s")
            restored = [{k: rec[k] for k in ("replica", "worker", "checkpoint_id", "recovery_s", "load_s")}
                        for rec in master.recoveries[seen:] if rec["replica"] in labels]
        return {"executor": str(executor), "worker": w, "replicas": sorted(labels), "restored": restored,
                "seconds": time.monotonic() - started}

    def state_bytes_per_vnode(self, task: str, timeout: float = 30.0) -> list[int]:
        """Keyed state bytes of each vnode of ``task`` now: every partition measures its RocksDB
        (one replica of each counts; a partition owns disjoint vnodes)."""
        spec = self._keyed_spec(task)
        master = self.master
        with master._cond:
            rid = master.measure_state[spec.id] = master.measure_state.get(spec.id, 0) + 1
            master._ring_workers()
            done = master._cond.wait_for(lambda: all(
                any((m := master.metrics.get(replica_name(spec.name, p, r))) is not None and m.vnode_bytes[0] >= rid
                    for r in range(self.plan.replicas)) for p in range(spec.parallelism)), timeout)
            reports = [max((m.vnode_bytes for r in range(self.plan.replicas)
                            if (m := master.metrics.get(replica_name(spec.name, p, r))) is not None),
                           key=lambda v: v[0]) for p in range(spec.parallelism)]
        if not done:
            raise TimeoutError(f"the partitions of {task!r} did not measure their state within {timeout:g}s")
        sizes = [0] * self.plan.routing[spec.id].num_vnodes
        for _, per_vnode in reports:
            for v, n in enumerate(per_vnode):
                sizes[v] += n
        return sizes

    def routed_per_vnode(self, task: str) -> list[int]:
        """Records routed to each vnode of the keyed ``task`` since the job started, as last
        reported by its upstream partitions (of each, the replica that counted more)."""
        spec = self._keyed_spec(task)
        num_vnodes = self.plan.routing[spec.id].num_vnodes
        snapshot = self.master.snapshot()
        total = [0] * num_vnodes
        for up in self.plan.tasks:
            if not any(e.dst_task == spec.id and e.partitioning == "hash" for e in up.outputs):
                continue
            for p in range(up.parallelism):
                counted = [m.routed.get(spec.id, ()) for r in range(self.plan.replicas)
                           if (m := snapshot.get(replica_name(up.name, p, r))) is not None]
                best = max(counted, key=sum, default=())
                for v, n in enumerate(best):
                    total[v] += n
        return total

    def rebalance(self, task: str, fraction: float = 0.5, target: int | None = None, window_s: float = 3.0,
                  timeout: float = 120.0, margin_s: float = 0.5, release_s: float | None = None,
                  strategy: Strategy | None = None, gap_s: float = 0.0) -> dict[str, Any]:
        """Relieve the busiest partition of the keyed ``task``: measure the records per vnode over
        ``window_s`` seconds, then move up to ``fraction`` of that partition's vnodes, heaviest
        first, to the least loaded partition (or ``target``), each only if it lowers the larger of
        the two loads.  The report of :meth:`move_vnodes` plus ``load_before`` and ``load_after``
        (records/s per partition, the latter as planned from the same measurement); no step when
        nothing would improve."""
        tid = self._keyed_task(task)
        strategy = strategy or AllAtOnce()
        if not 0 < window_s <= 600:
            raise ValueError(f"window_s must be in (0, 600] seconds, got {window_s!r}")
        before, started = self.routed_per_vnode(task), time.monotonic()
        time.sleep(window_s)
        after = self.routed_per_vnode(task)
        seconds = time.monotonic() - started
        load = [(a - b) / seconds for a, b in zip(after, before, strict=True)]
        if not any(load):
            raise ValueError(f"no record reached {task!r} in the last {window_s:g} s: no load to rebalance by")
        table_before = self.routing(task)
        report = self._run_handover_job(
            task, lambda c, sizes: c.start_rebalance(tid, load, fraction, target, strategy, sizes),
            f"rebalance of up to {fraction:.0%} of the busiest partition's vnodes", strategy, timeout, margin_s,
            release_s, gap_s)
        table_after = self.routing(task)
        for key, table in (("load_before", table_before), ("load_after", table_after)):
            report[key] = [round(sum(load[v] for v in table.vnodes_of(p)), 1) for p in range(table.parallelism)]
        return report

    def _run_handover_job(self, task: str, submit: Callable[[HandoverCoordinator, list[int] | None], int],
                          what: str, strategy: Strategy, timeout: float, margin_s: float, release_s: float | None,
                          gap_s: float) -> dict[str, Any]:
        """Submit a handover job and run its steps one by one, each at pulses about ``margin_s``
        ahead; the report of :meth:`move_vnodes`.  A byte cap (``Batched(max_bytes=...)``) plans
        the steps from the state bytes per vnode, measured first.  A job aborted because a
        participant was past the switch pulse when it heard of the step (a loaded worker's
        heartbeats were late) goes again for what is left, the switch twice as far ahead, up to
        :data:`LATE_RETRIES` times."""
        started = time.monotonic()
        deadline = started + timeout
        steps: list[dict[str, Any]] = []
        capped = (isinstance(strategy, Batched) and strategy.max_bytes is not None) or \
            self.cfg.handover_max_bytes_in_flight > 0
        sizes = self.state_bytes_per_vnode(task, timeout=min(30.0, timeout)) if capped else None
        with self._handover_window("a handover", timeout) as coordinator:
            master = self.master
            jobs: list[int] = []
            while True:
                job = submit(coordinator, sizes)
                jobs.append(job)
                master.event(f"handover job {job} of {task}: {what} ({type(strategy).__name__}, "
                             f"{len(coordinator.manager.job(job).steps)} step(s))")
                self._run_steps(coordinator, job, task, sizes, deadline, timeout, margin_s, release_s, gap_s, steps)
                ended = coordinator.manager.job(job)
                if not (ended.state is JobState.ABORTED and ended.late and len(jobs) <= LATE_RETRIES):
                    break
                # nothing of the aborted step happened: the rest goes again, its switch further ahead
                margin_s = 2 * max(margin_s, 0.25)
                master.event(f"handover job {job} of {task}: {ended.reason}; the rest again, the switch "
                             f"{margin_s:g}s ahead")
            state = coordinator.job_state(job)
            reason = coordinator.manager.job(job).reason
            table = coordinator.manager.tables[coordinator.manager.job(job).task]
        return {"job": job, "jobs": jobs, "state": state.value, "reason": reason, "steps": steps,
                "entries_moved": sum(s["entries_moved"] for s in steps), "seconds": time.monotonic() - started,
                "partitions": sorted(set(table.assignment))}

    def _run_steps(self, coordinator: HandoverCoordinator, job: int, task: str, sizes: list[int] | None,
                   deadline: float, timeout: float, margin_s: float, release_s: float | None, gap_s: float,
                   steps: list[dict[str, Any]]) -> None:
        """Instruct the steps of handover ``job`` one by one until it ends, each at pulses about
        ``margin_s`` ahead; each step's report is appended to ``steps``.  Past ``deadline`` no
        step is instructed: the job stops between two steps and TimeoutError says how far it got
        (a step committed before the deadline completes first: it only rolls forward)."""
        master = self.master
        while coordinator.job_state(job) is JobState.RUNNING:
            if time.monotonic() >= deadline:  # (why_not_next: what the job waits for, if anything)
                self._stop_job(coordinator, job, task, timeout, coordinator.manager.why_not_next(job))
            step_started = time.monotonic()
            period_ms = self._pulse_period_ms()
            pulse, switch_at = self._switch_pulse(margin_s, period_ms)
            margin = coordinator.next_release_s(job, sizes) if release_s is None else release_s
            release_at = switch_at + max(2, math.ceil(margin * 1000 / period_ms))
            instructed_at = time.time()
            order = coordinator.instruct_next(job, switch_at, release_at)
            if order is None:  # e.g. a lost replica not restored yet, or the bytes-in-flight cap: wait
                master._cond.wait(0.1)
                continue
            master._ring_workers()  # the participants arm it from their next reply on
            hid = order.handover_id
            self._await_handover(coordinator, hid, deadline, f"during handover {hid}",
                                 f"handover {hid} of {task} not completed within {timeout}s")
            timeline, served = coordinator.timeline(hid), coordinator.served(hid)
            steps.append({"handover_id": hid, "vnodes": sorted(m.vnode for m in order.moves),
                          "origins": sorted(order.origins), "targets": sorted(order.targets),
                          "state": coordinator.state(hid).value,
                          "switch_at": switch_at, "release_at": release_at, "pulse_at_request": pulse,
                          "entries_moved": coordinator.moved_entries(hid),
                          "bytes_moved": coordinator.moved_bytes(hid),
                          "bytes_shipped": coordinator.shipped_bytes(hid),
                          "bytes_from_store": coordinator.store_bytes(hid),
                          "bytes_planned": coordinator.record(hid).size_bytes if sizes else None,
                          "release_s": (release_at - switch_at) * period_ms / 1000,
                          "instructed_at": instructed_at, "timeline": timeline,
                          "phases": step_phases(instructed_at, timeline, served),
                          "served": served, "held_records": coordinator.held_records(hid),
                          "seconds": time.monotonic() - step_started})
            if gap_s and coordinator.job_state(job) is JobState.RUNNING:
                master._cond.wait(gap_s)

    def _switch_pulse(self, margin_s: float, period_ms: float | None = None) -> tuple[int, int]:
        """The generators' last pulse, and the pulse about ``margin_s`` after it."""
        assert self.pulses is not None
        pulse = self.pulses.last_h
        return pulse, switch_pulse(pulse, margin_s, self._pulse_period_ms() if period_ms is None else period_ms)

    def _pulse_period_ms(self) -> float:
        """The time between pulses a handover counts its margins with: as the generators write
        them (``DriverPulses.period_ms``; KaZoo: in the open window)."""
        nominal = self.cfg.pulse_period_ms
        if self.pulses is None:
            return nominal
        return self.pulses.period_ms(nominal, windowed=self.cfg.mode == "kazoo")

    def _stop_job(self, coordinator: HandoverCoordinator, job: int, task: str, timeout: float,
                  why: str | None = None) -> None:
        """Stop handover ``job`` between two steps (its deadline passed) and raise TimeoutError."""
        manager = coordinator.manager
        ended = manager.job(job)
        manager.stop_job(job, f"not done within {timeout:g}s" + (f" ({why})" if why else ""))
        self.master.event(f"handover job {job} of {task}: {ended.reason}; the routing table stays at epoch "
                          f"{manager.tables[ended.task].epoch}")
        raise TimeoutError(f"handover job {job} of {task}: {ended.reason}")

    def replace_operator(self, task: str, operator: str, fn: Any, timeout: float = 60.0,
                         margin_s: float = 0.5) -> dict[str, Any]:
        """Replace the user function of ``operator`` (a map, filter, flat_map or keyed process
        operator of the processing task ``task``) by ``fn`` while the job runs: every replica of
        every partition switches right after the same pulse, about ``margin_s`` ahead, so both
        replicas of a partition run the old code on exactly the same elements.  A keyed process
        function keeps the operator's state.  ``fn`` is shipped with cloudpickle.  Returns the
        replacement's id, version, pulse, state and duration."""
        from pyspark import cloudpickle

        self._require_pulses("replacing an operator")
        spec = next((t for t in self.plan.tasks if t.name == task), None)
        if spec is None or spec.is_source:
            raise ValueError(f"{task!r} is not a processing task of job {self.job.name} (sources not supported)")
        node = next((n for n in spec.chain if n.name == operator), None)
        kinds = ("map", "filter", "flat_map", "process")
        if node is None or node.kind not in kinds:
            names = [n.name for n in spec.chain if n.kind in kinds]
            raise ValueError(f"task {task!r} has no operator {operator!r} with a user function (it has {names})")
        if node.kind == "process" and not hasattr(fn, "process"):
            raise ValueError(f"operator {operator!r} runs a KeyedProcessFunction: give an instance of one")
        if node.kind != "process" and not callable(fn):
            raise ValueError(f"operator {operator!r} runs a function: give a callable")
        payload = cloudpickle.dumps(fn)
        started = time.monotonic()
        with self._handover_window("an operator replacement", timeout) as coordinator:
            pulse, switch_at = self._switch_pulse(margin_s)
            order = coordinator.start_replace(spec.id, operator, payload, switch_at)
            self.master._ring_workers()
            self.master.event(f"operator {operator!r} of {task}: version {order.version} from pulse {switch_at} on "
                              f"(now about {pulse})")
            hid = order.handover_id
            self._await_handover(coordinator, hid, started + timeout, f"while replacing {operator!r}",
                                 f"replacement {hid} of {operator!r} not completed within {timeout}s")
            record = coordinator.record(hid)
        return {"handover_id": hid, "version": order.version, "switch_at": switch_at, "state": record.state.value,
                "reason": record.reason, "seconds": time.monotonic() - started}

    @contextlib.contextmanager
    def _handover_window(self, what: str, timeout: float) -> Iterator[HandoverCoordinator]:
        """The heartbeat generators pulse every period for up to ``timeout`` (``what`` switches at a
        pulse): LiveRobin's running ones, or in KaZoo mode one that writes a pulse window (the
        sources hold their records until it ends).  Inside, the caller holds the master's lock and
        has its coordinator.  The pulses go on until no committed handover needs them."""
        pulses = self.pulses
        if pulses is None:
            raise ValueError(f"{what} switches at a pulse: it needs spark.replication.mode=liverobin or kazoo")
        if self.cfg.mode == "kazoo":
            window = self._open_pulse_window(what)
        else:
            window = None
            if not pulses.live():
                raise ValueError(f"no heartbeat generator runs (start one with start_pulse_generator()): {what} "
                                 "switches at a pulse")
            pulses.eager(timeout)
        coordinator = None
        try:
            with self.master._cond:
                if self.master.handovers is None:
                    self.master.handovers = HandoverCoordinator(
                        self.plan, retain=self.cfg.rhino_enabled,
                        max_bytes_in_flight=self.cfg.handover_max_bytes_in_flight or None,
                        period_s=self.cfg.pulse_period_ms / 1000)
                    # replicas restored before it existed ack as their incarnation; lost ones take part in nothing
                    manager = self.master.handovers.manager
                    manager.attempts.update(self.master._attempts)
                    manager.lost.update(set(self.master.lost) - self.master._restoring)
                coordinator = self.master.handovers
                yield coordinator
        finally:
            if coordinator is not None:
                self._await_rolled_forward(coordinator, what)
            if window is None:
                pulses.eager(0)
            else:
                self._close_pulse_window(window)

    def _job_over(self) -> bool:
        """The job failed, was told to stop, or its workers all ended: no step completes any more."""
        return self.master.failure is not None or self.master.command == "stop" or self._done.is_set()

    def _await_rolled_forward(self, coordinator: HandoverCoordinator, what: str) -> None:
        """Until no committed handover waits for pulses (or the job is over): a committed step only
        rolls forward, and it reaches its switch and release only while pulses are written."""
        master = self.master
        waited = 0
        with master._cond:
            while not self._job_over() and (pending := coordinator.rolling_forward()):
                if waited % 300 == 0:  # at once, then every 30 s
                    master.event(f"{what}: handover(s) {pending} committed, not completed: the pulses go on "
                                 "until they complete")
                master._cond.wait(0.1)
                waited += 1

    def _open_pulse_window(self, what: str, hold_timeout: float = 15.0) -> int:
        """KaZoo: tell every source replica to hold its records, and once all live ones do, have
        a windowed generator write pulses from their positions on (liverobin.heartbeats); the
        window's id."""
        master = self.master
        sources = [(t, p, r) for (t, p, r) in self.placement if self.plan.task(t).is_source]
        with master._cond:
            last = master.pulse_window
            window, pulsed = (last.window + 1, last.last_pulsed) if last else (1, 0)
            master.pulse_window = WindowWord(window, True, False, pulsed)
            master._status_dirty = True

            def live() -> list[ReplicaId]:
                return [rid for rid in sources if self.placement[rid] not in master.dead]

            held = master._cond.wait_for(lambda: master.failure is not None or all(
                master.holding.get(rid, (0, {}))[0] == window for rid in live()), hold_timeout)
            if master.failure is not None or not held:
                master.pulse_window = WindowWord(window, False, False, pulsed)  # no pulse: they stop holding
                missing = [master._replica_label(t, p, r) for t, p, r in live()
                           if master.holding.get((t, p, r), (0, {}))[0] != window]
                where = "; ".join(f"{name}: {text}" for name in missing
                                  if (text := window_text(master.metrics.get(name, InstanceMetrics()))))
                raise TimeoutError(f"{what}: source replicas {missing} did not hold their records for window "
                                   f"{window} within {hold_timeout:g}s" + (f" ({where})" if where else "")
                                   if not held else f"job failed: {master.failure}")
            floor: dict[str, dict[int, int]] = {}
            for t, p, r in live():
                topic = self.plan.task(t).head.spec["topic"]
                for k, position in master.holding[(t, p, r)][1].items():
                    floor.setdefault(topic, {})[k] = max(floor.get(topic, {}).get(k, 0), position)
            master.event(f"pulse window {window} open: every source replica holds its records ({what})")
        assert self.pulses is not None
        self.pulses.open_window(window, floor)
        return window

    def _close_pulse_window(self, window: int) -> None:
        assert self.pulses is not None
        last = self.pulses.close_window(timeout=15.0)
        with self.master._cond:
            self.master.pulse_window = WindowWord(window, False, True, window)  # they stop at the last pulse
            self.master.event(f"pulse window {window} closed at pulse {last}" if last is not None else
                              f"pulse window {window}: its last pulse was not written within 15 s; "
                              "the sources hold their records until a generator ends it")

    def _await_handover(self, coordinator: HandoverCoordinator, hid: int, deadline: float, during: str,
                        timed_out: str) -> None:
        """Until handover ``hid`` completed or aborted (caller holds the master's lock); raises if the
        job failed meanwhile.  At ``deadline`` a step not committed yet is cancelled (TimeoutError);
        a committed one only rolls forward, so it is waited for to the end."""
        master = self.master

        def ended() -> bool:
            return coordinator.state(hid) in (HandoverState.COMPLETED, HandoverState.ABORTED) or self._job_over()

        done = master._cond.wait_for(ended, max(0.0, deadline - time.monotonic()))
        if not done:
            for text in coordinator.give_up(hid, timed_out):
                master.event(text)
            master._ring_workers()
            if coordinator.state(hid) is HandoverState.ABORTED:
                raise TimeoutError(f"{timed_out} (not committed: cancelled)")
            master.event(f"handover {hid} is {coordinator.state(hid).value} past its deadline: it rolls forward "
                         "to completion")
            waited = 0
            while not master._cond.wait_for(ended, 1.0):
                waited += 1
                if waited % 30 == 0:
                    master.event(f"handover {hid} still {coordinator.state(hid).value} {waited} s past its deadline")
        if master.failure is not None:
            raise JobFailedError(f"job failed {during}: {master.failure}")
        if coordinator.state(hid) not in (HandoverState.COMPLETED, HandoverState.ABORTED):
            raise JobFailedError(f"the job ended {during} (handover {hid} {coordinator.state(hid).value})")

    def move_request(self, req: HandoverRequest) -> HandoverReport:
        """A ``replication move``, ``rescale``, ``rebalance`` or ``drain`` from the CLI, with the
        strategy named ("all", "fluid" or "batched:N"): the report, or the error."""
        def timeout(default: float) -> float:
            return default if req.timeout is None else req.timeout

        try:
            if req.executor is not None:
                return HandoverReport(self.drain_executor(req.executor, timeout=timeout(120.0)))
            strategy = parse_strategy(req.strategy)
            if req.task is None:
                raise ValueError("a handover request names its task")
            if req.fraction is not None:
                return HandoverReport(self.rebalance(req.task, req.fraction, req.target,
                                                     3.0 if req.window is None else req.window,
                                                     timeout=timeout(120.0), strategy=strategy))
            if req.parallelism is not None:
                return HandoverReport(self.rescale(req.task, req.parallelism, timeout=timeout(120.0),
                                                   strategy=strategy))
            if req.vnodes is None or req.target is None:
                raise ValueError("a move names its vnodes and its target partition")
            return HandoverReport(self.move_vnodes(req.task, req.vnodes, req.target, timeout=timeout(60.0),
                                                   strategy=strategy))
        except (ValueError, TimeoutError, JobFailedError) as err:
            return HandoverReport(error=f"{type(err).__name__}: {err}")

    def routing(self, task: str) -> RoutingTable:
        """The vnode -> partition map of the keyed ``task`` now (after the handovers committed)."""
        spec = self._keyed_spec(task)
        with self.master._cond:
            if self.master.handovers is not None:
                return self.master.handovers.manager.tables[spec.id]
        return self.plan.routing[spec.id]

    def _require_pulses(self, what: str) -> None:
        if self.cfg.mode not in ("liverobin", "kazoo"):
            raise ValueError(f"{what} at runtime needs spark.replication.mode=liverobin or kazoo (pulses are the "
                             "switch points)")

    def _keyed_spec(self, task: str) -> TaskSpec:
        spec = next((t for t in self.plan.tasks if t.name == task), None)
        if spec is None or spec.id not in self.plan.routing:
            keyed = [t.name for t in self.plan.tasks if t.id in self.plan.routing]
            raise ValueError(f"{task!r} is not a keyed task of job {self.job.name} (keyed tasks: {keyed})")
        return spec

    def _keyed_task(self, task: str) -> int:
        """The id of the keyed ``task``, or ValueError naming why it cannot be handed over (yet)."""
        self._require_pulses("moving vnodes")
        return self._keyed_spec(task).id

    def drain(self, timeout: float | None = None, savepoint: str | os.PathLike[str] | None = None) -> JobResult:
        """Let the sources read to the current end of their partitions, flush every window,
        and wait for the job to finish.  With ``savepoint`` (a directory every executor can
        write and the next run can read: a path, or a URI ``pyarrow.fs`` opens): do not flush the
        windows; every replica writes its state there instead, for a run with
        ``spark.replication.restoreFrom`` (docs/savepoints.md)."""
        root = None if savepoint is None else self._arm_savepoint(savepoints.canonical(savepoint))
        if self.cfg.mode == "liverobin":
            assert self.pulses is not None  # the sources end right after the final pulse, read from the log
            self.pulses.finish(grace_s=2 * FETCH_WAIT_MS / 1000 + 0.3)
        self.master.set_command("drain")
        result = self.wait(timeout)
        if root is not None:
            self._complete_savepoint(root, result)
        return result

    def _arm_savepoint(self, root: str) -> str:
        """Tell every worker where the savepoint goes, and wait until each knows (a replica that
        ended before it knew would flush its windows and write nothing)."""
        if savepoints.is_complete(root):
            raise ValueError(f"{without_credentials(root)} already holds a savepoint: give an empty or new directory")
        savepoints.prepare(root)
        master = self.master
        with master._cond:
            master.savepoint = root
            master._ring_workers()
            live = lambda: {w for w, i in master.workers.items()  # noqa: E731
                            if w not in master.dead and w not in master.reports}
            if not master._cond.wait_for(lambda: live() <= master.savepoint_armed, 30):
                raise TimeoutError(f"workers {sorted(live() - master.savepoint_armed)} did not learn of the savepoint "
                                   "within 30 s")
            master.event(f"savepoint to {without_credentials(root)}: every worker knows; draining")
            return master.savepoint

    def _complete_savepoint(self, root: str, result: JobResult) -> None:
        """Every partition of every task wrote its part (one replica suffices): mark it complete."""
        tasks = {t.name: t.parallelism for t in self.plan.tasks}
        missing = savepoints.missing_parts(root, tasks, self.plan.replicas)
        if result.status != "finished" or missing:
            raise JobFailedError(f"savepoint {without_credentials(root)} incomplete (job {result.status}; no part from "
                                 f"{', '.join(missing) or 'none missing'}): it cannot be restored from")
        savepoints.write_meta(root, job=self.job.name, num_key_groups=self.plan.num_key_groups, tasks=tasks,
                              sources=[t.name for t in self.plan.tasks if t.is_source],
                              keyed=[t.name for t in self.plan.tasks if t.id in self.plan.routing])
        self.master.event(f"savepoint {without_credentials(root)} complete")

    def stop(self, timeout: float | None = None) -> JobResult:
        """Stop now (application-level signal first; the Spark job is cancelled if the
        workers do not end within ``timeout``, default spark.replication.stopTimeout)."""
        self.master.set_command("stop")
        self.kill_pulse_generators()
        wait_s = self.cfg.stop_timeout_ms / 1000 if timeout is None else timeout
        if not self._done.wait(wait_s):
            log.warning("workers did not stop within %.1fs: cancelling the Spark job", wait_s)
            self._sc.cancelJobGroup(self._group)
        return self.wait(30)

    def serve(self, drain_after_s: float = 0.0, savepoint: str | None = None) -> JobResult:
        """Block like a service: until SIGINT/SIGTERM (then a graceful stop), until the job ends
        by itself, or, with ``drain_after_s``, drain after that many seconds.  With ``savepoint``
        both end in a drain into a savepoint in that directory.  Main thread only."""
        signalled = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: signalled.set())
        deadline = time.monotonic() + drain_after_s if drain_after_s else None
        while self.running and not signalled.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return self.drain(savepoint=savepoint)
            signalled.wait(0.2)
        if self.running and savepoint is not None:
            return self.drain(savepoint=savepoint)
        return self.stop() if self.running else self.wait()

    def _wait_done(self, timeout: float | None) -> bool:
        """The Spark job ended, or every worker ended (a relaunched task still waiting for an
        executor is then cancelled)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.2):
            if self.master.all_done() and not self._done.wait(2.0):
                log.info("every worker ended; cancelling the Spark job's pending task relaunches")
                self._cancelled_after_end = True
                self._sc.cancelJobGroup(self._group)
                self._done.wait(10)
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def wait(self, timeout: float | None = None) -> JobResult:
        """Wait for the end; raises TimeoutError or JobFailedError."""
        if not self._wait_done(timeout):
            raise TimeoutError(f"job {self.job.name} still running after {timeout}s")
        if self._result is None:
            self.master.end_watching()
            self._server.stop(grace=1.0)
            if self.metrics_server is not None:
                self.metrics_server.close()
            if self.pulses is not None:
                self.pulses.close()
            m = self.master
            if self._cancelled_after_end and self._spark_error is not None:
                log.info("Spark job ended by our cancel after every worker ended: %s",
                         str(self._spark_error).splitlines()[0])
                self._spark_error = None
            status = "failed" if (m.failure or self._spark_error) else (
                "stopped" if m.command == "stop" else "finished")
            failure = m.failure or (f"Spark job failed: {self._spark_error}" if self._spark_error else None)
            snap = m.snapshot()
            self._result = JobResult(status, aggregate(snap), snap, failure, time.monotonic() - self._started,
                                     dict(m.workers), _source_records(self.plan, snap),
                                     _role_metrics(self.plan, snap, "sink").records_out // self.plan.replicas,
                                     list(m.events), list(m.recoveries), m.checkpoints_compared,
                                     list(m.divergences))
            if m.durable is not None:
                m.durable.close()
            m.close(status)
            remove_cli_credentials(self.job.name)
            if self._elections is not None:
                self._elections.close()
        if self._result.status == "failed":
            raise JobFailedError(self._result.failure)
        return self._result


def _from_savepoint(plan: PhysicalPlan, cfg: ReplicationConfig) -> None:
    """Check the savepoint against the plan (ConfigError naming the key otherwise) and start the
    sources where it ends."""
    key = PREFIX + "restoreFrom"
    root = cfg.restore_from
    try:
        meta = savepoints.read_meta(root)
    except (OSError, ValueError) as exc:
        raise ConfigError([(key, f"{key}={without_credentials(root)}: {exc}")]) from None
    kinds = {t.name: ("source" if t.is_source else "keyed" if t.id in plan.routing else "other", t.parallelism)
             for t in plan.tasks}
    problems = savepoints.check(root, meta, num_key_groups=plan.num_key_groups, tasks=kinds, key=key)
    if problems:
        raise ConfigError([(key, p) for p in problems])
    for t in plan.tasks:
        if t.is_source and t.name in meta["sources"]:
            plan.source_start_offsets[t.id] = savepoints.source_offsets(root, t.name, t.parallelism)
    plan.savepoint = (root, meta)


def _resume_then_rescale(job: Job, spark: Any, conf: Mapping[str, Any] | None, cfg: ReplicationConfig,
                         parallelism: dict[str, int]) -> JobHandle:
    """The newest cut has other parallelism than ``job`` for some tasks: run the job at the cut's
    (it resumes, exactly once), drain it into a savepoint beside the checkpoints, and start ``job``
    from that savepoint, each keyed partition taking the key groups it owns now.  Its checkpoints
    are deleted once the savepoint is complete; the savepoint once the new run wrote a cut (until
    then a new start goes on from the savepoint)."""
    assert cfg.checkpoint_dir is not None
    between = rescale_savepoint_dir(cfg.checkpoint_dir, job.name)
    savepoints.delete(between)
    log.warning("durable checkpoints: going on at the checkpoints' parallelism (%s), then through a savepoint at "
                "this job's", ", ".join(f"{t} {p}" for t, p in sorted(parallelism.items())))
    first = run(with_parallelism(job, parallelism), spark=spark, conf=conf)
    try:
        first.wait_started(cfg.start_timeout_ms / 1000)
        result = first.drain(savepoint=between)
    except BaseException:
        if first.running:
            first.stop()
        raise
    log.warning("durable checkpoints: the run at the checkpoints' parallelism drained into %s after %.1fs "
                "(%d records written); starting at this job's parallelism", without_credentials(between), result.duration_s,
                result.records_written)
    DurableStore(cfg.checkpoint_dir, job.name).clear()
    return run(job, spark=spark, conf={**(conf or {}), PREFIX + "restoreFrom": between})


def _from_checkpoint_dir(plan: PhysicalPlan, cfg: ReplicationConfig, job_name: str) -> None:
    """A job with durable checkpoints goes on from the newest complete cut of its directory, if any;
    one that cannot is refused, naming the key."""
    key = PREFIX + "checkpointDir"
    assert cfg.checkpoint_dir is not None
    between = rescale_savepoint_dir(cfg.checkpoint_dir, job_name)
    try:
        store = DurableStore(cfg.checkpoint_dir, job_name)
        plan.resume = resume_point(store, plan_shape(plan, cfg.mode), ignore=cfg.checkpoint_dir_ignore,
                                   on_event=log.warning)
        if cfg.checkpoint_dir_ignore:
            savepoints.delete(between)
        rescaling = plan.resume is None and cfg.restore_from is None and savepoints.is_complete(between)
    except (OSError, ValueError) as exc:
        raise ConfigError([(key, f"{key}={without_credentials(cfg.checkpoint_dir)}: {exc}")]) from None
    if rescaling:
        # a resume at another parallelism drained into it, and its second run wrote no cut yet
        log.warning("durable checkpoints: no cut since a resume at another parallelism; starting from its "
                    "savepoint %s", without_credentials(between))
        _from_savepoint(plan, replace(cfg, restore_from=between))


def prepare(job: Job, cfg: ReplicationConfig) -> PhysicalPlan:
    """Check Kafka, create missing sink / dead-letter topics, plan the job (no Spark needed)."""
    admin = admin_client(cfg.kafka_admin_config())
    sources = {n.spec["topic"] for n in job.nodes if n.kind == "source"}
    partitions = topic_partitions(admin, sources)
    plan = plan_job(job, default_parallelism=cfg.parallelism, num_key_groups=cfg.state_key_groups,
                    num_vnodes=cfg.state_vnodes, topic_partitions=partitions)
    for task in plan.tasks:
        if task.is_source and task.head.spec["starting_offsets"] == "latest":
            plan.source_start_offsets[task.id] = end_offsets_by_fetch(
                cfg.kafka_consumer_config(group_id=f"replication-{job.name}-start"), task.head.spec["topic"],
                range(partitions[task.head.spec["topic"]]))
    if cfg.restore_from is not None:
        _from_savepoint(plan, cfg)
    if cfg.checkpoint_dir is not None:
        _from_checkpoint_dir(plan, cfg, job.name)
    if cfg.enabled:
        plan.replicas = 2
    if cfg.enabled or cfg.mode != "unordered":
        check_replicable(plan, partitions)
    if cfg.mode in ("liverobin", "kazoo"):  # KaZoo: pulses only in the windows a handover opens
        # this run's own segments (liverobin.segments): generators make the later ones exist; a resumed
        # run goes on in the log of the run it resumes (its sources read the pulses after their checkpoints)
        resumed = plan.resume.cut.run.get("heartbeat_log") if plan.resume is not None else None
        plan.heartbeat_log = HeartbeatLog(resumed or f"{cfg.heartbeat_topic(job.name)}.{uuid.uuid4().hex[:8]}")
        ensure_topics(admin, {plan.heartbeat_log.topic(n): 1 for n in range(3)})
    if cfg.mode == "kazoo":
        # each run writes order logs of its own (kazoo_leader.segments): orders of an earlier run of the
        # job (and their epochs) are not this run's; a resumed run goes on in the logs of the run it
        # resumes, every partition from its cut's checkpoint on (a cut holds them all)
        if plan.resume is None:
            prefix = f"{cfg.order_logs_prefix(job.name)}.{uuid.uuid4().hex[:8]}"
        else:
            prefix = plan.resume.cut.run.get("order_logs") or ""
            if not prefix:
                key = PREFIX + "checkpointDir"
                raise ConfigError([(key, f"{key}={without_credentials(cfg.checkpoint_dir or '')}: cut "
                                         f"{plan.resume.cut.number} names no KaZoo order logs (written by an earlier "
                                         f"build); set {key}.ignore=true to start afresh")])
        plan.order_logs_prefix = prefix
        plan.order_logs = {inst: SegmentedLog(cfg.order_log(prefix, *inst))
                           for inst in plan.multi_input_partitions()}
        ensure_topics(admin, {log_.topic(n): 1 for log_ in plan.order_logs.values() for n in range(3)})
    elif cfg.enabled and cfg.mode == "unordered":  # (LiveRobin orders them by pulses)
        multi = [t.name for t in plan.multi_input_tasks()]
        log.warning("spark.replication.mode=%s: input channels are consumed first come, first served%s", cfg.mode,
                    f"; tasks with several input channels ({', '.join(multi)}) may diverge between their "
                    "replicas and produce wrong output" if multi else "")
    wanted = {n.spec["topic"]: plan.task(_task_of(plan, n)).parallelism for n in job.sinks()}
    wanted[cfg.dead_letter_topic(job.name)] = 1
    created = ensure_topics(admin, wanted)
    if created:
        log.info("created topics %s", ", ".join(created))
    plan.sink_topic_partitions = topic_partitions(admin, [n.spec["topic"] for n in job.sinks()])
    return plan


def _task_of(plan: PhysicalPlan, node: Any) -> int:
    return next(t.id for t in plan.tasks if node in t.chain)


def resolve_config(sc: Any, conf: Mapping[str, Any] | None) -> ReplicationConfig:
    """``spark.replication.*`` from the Spark conf (``rpc.tls.*`` following Spark's ``spark.ssl.*``
    where unset), overridden by ``conf``; validated."""
    spark = dict(sc.getConf().getAll()) if sc else {}
    settings: dict[str, Any] = follow_spark_ssl(spark)
    settings.update({k: v for k, v in spark.items() if k.startswith(PREFIX)})
    settings.update(conf or {})
    return ReplicationConfig.from_mapping(settings)


def run(job: Job, *, spark: Any = None, conf: Mapping[str, Any] | None = None) -> JobHandle:
    """Validate the config, plan the job and start it on the Spark cluster of ``spark``
    (default: ``SparkSession.builder.getOrCreate()``).  Returns immediately."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    cfg = resolve_config(sc, conf)
    max_failures = int(sc.getConf().get("spark.task.maxFailures", "4"))
    if max_failures < 10:
        log.warning("spark.task.maxFailures=%d: Spark aborts the whole job (every worker) when one worker "
                    "task has failed that often (each executor loss counts); set it to 100 or more",
                    max_failures)
    plan = prepare(job, cfg)
    if plan.resume is not None and plan.resume.parallelism:
        return _resume_then_rescale(job, spark, conf, cfg, plan.resume.parallelism)
    warm = warm_up(sc)
    num_workers = cfg.workers or len(executor_ids(sc))
    if cfg.rhino_enabled and num_workers <= plan.replicas:
        raise ConfigError([(PREFIX + "rhino.enabled", f"{PREFIX}rhino.enabled=true: needs at least "
                            f"{plan.replicas + 1} executors (checkpoints are held apart from the {plan.replicas} "
                            f"instance(s) of each partition), the cluster has {num_workers}")])
    placement = place(plan, num_workers)
    security = job_security(dict(sc.getConf().getAll()), cfg)
    master = JobMaster(plan, placement, num_workers, cfg, job.name, sc.applicationId, executor_lister(sc),
                       security)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    election_root = f"/replication/{job.name}/{run_id}" if plan.order_logs else None
    lineage = run_lineage(plan.resume, run_id)
    if cfg.checkpoint_dir is not None:
        if plan.resume is not None:
            master.resume_outputs(plan.resume.cut.sinks)
            master.resume_restore_points(plan.resume.cut)
            for note in plan.resume.notes:
                master.note(note)
        assert cfg.checkpoint_dir is not None
        master.durable = DurableCheckpoints(
            DurableStore(cfg.checkpoint_dir, job.name), plan=plan_shape(plan, cfg.mode), retain=cfg.checkpoint_dir_retain,
            run={**lineage, "run_id": run_id,
                 "heartbeat_log": plan.heartbeat_log.prefix if plan.heartbeat_log is not None else None,
                 "order_logs": plan.order_logs_prefix},
            on_event=master.note)
        between = rescale_savepoint_dir(cfg.checkpoint_dir, job.name)
        if plan.savepoint is not None and savepoints.canonical(plan.savepoint[0]) == between:
            master.durable.on_first_cut = lambda: savepoints.delete(between)
    elections = ElectionJanitor(cfg.zookeeper_connect, election_root, master, cfg.zookeeper_digest) \
        if election_root else None
    threading.Thread(target=master.monitor, name=f"monitor-{job.name}", daemon=True).start()
    server = rpc.serve({"Register": rpc.typed(master.register, Register),
                        "Finished": rpc.typed(master.finished, WorkerFinished),
                        "MoveVnodes": rpc.typed(master.move, HandoverRequest)},
                       watches={"Attach": rpc.decoding(master.attach, Attach)},
                       streams={"SourcePositions": rpc.decoding(master.report_positions, SourcePositions)},
                       # registrations wait for each other; a watch and a stream per attempt (a paused
                       # evicted one may still hold its own beside its relaunch's)
                       security=security, bind_host=driver_bind_host(sc), max_workers=num_workers * 6 + 8,
                       name="job master")
    try:
        beats = FrameServer(HEARTBEAT_METHOD, rpc.typed(master.heartbeat, Heartbeat), security=security,
                            bind_host=driver_bind_host(sc), max_connections=num_workers * 2 + 8,
                            refusals=server.refusals, name="job master heartbeats")
    except BaseException:
        server.stop(grace=None)
        raise
    master.server = server
    address = host_port(driver_advertise_host(sc), server.port)
    master.control_address = address
    master.heartbeat_port = beats.port
    write_cli_credentials(job.name, security, cfg)
    boot = WorkerBootstrap(job.name, run_id, plan, placement, cfg, address, num_workers, election_root, security,
                           output_prefix=lineage["output_prefix"], epoch_base=lineage["epoch_base"],
                           heartbeat_port=beats.port)
    handle = JobHandle(job, cfg, plan, placement, master, ControlServers(server, beats), sc, f"replication-{job.name}-{run_id}", elections)
    master.mover = handle.move_request
    log.info("%s\nwarm executors: %s; %d workers; job master at %s", plan.describe(), sorted(warm), num_workers,
             address)
    threading.Thread(target=handle._run_spark_job, args=(boot,), name=f"spark-job-{job.name}", daemon=True).start()
    return handle
