"""A running job as its caller holds it: watch it, move state while it runs, drain it, stop it.

:func:`replication.control.launch.run` returns a :class:`JobHandle` at once; the workers run
inside one long-running Spark job submitted from a driver thread, and the job master
(:mod:`replication.control.master`) collects what they report.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from liverobin.generator import FETCH_WAIT_MS, HeartbeatGenerator
from replication import savepoint as savepoints
from replication.api import Job
from replication.config import ReplicationConfig
from replication.control.elections import ElectionJanitor
from replication.control.handover_calls import HandoverCalls
from replication.control.liveness import WorkerInfo
from replication.control.master import JobFailedError, JobMaster
from replication.control.prometheus import MetricsServer, collect, render
from replication.control.pulses import DriverPulses
from replication.control.retention import log_needed_from
from replication.metrics import InstanceMetrics, aggregate
from replication.plan import PhysicalPlan, replica_name
from replication.runtime.worker import WorkerBootstrap, run_worker
from replication.security import remove_cli_credentials
from replication.spark_cluster import driver_advertise_host, driver_bind_host, spark_error_line
from rhino_state.durable import without_credentials
from transport.ids import ReplicaId
from transport.kafka_io import TopicMaker

log = logging.getLogger(__name__)


def _handover_call(name: str) -> Callable[..., Any]:
    """A :class:`JobHandle` method that is :class:`HandoverCalls`'s ``name`` (its signature and docs)."""
    @functools.wraps(getattr(HandoverCalls, name))
    def call(self: JobHandle, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.handovers, name)(*args, **kwargs)
    return call


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
                                       needed_from=functools.partial(log_needed_from, master) if retain else None,
                                       delete_topics=self._segment_maker.delete if retain else None)
            if master.durable is not None:  # a cut says how far the log was: a resume reads it from there
                master.durable.pulse = lambda: self.pulses.last_h if self.pulses is not None else 0
        self.handovers = HandoverCalls(master, plan, cfg, placement, lambda: self.pulses, lambda: self.running, job.name)
        self.metrics_server: Any = None  # the Prometheus endpoint (replication.control.prometheus.MetricsServer)
        if cfg.metrics_port:
            self._start_metrics_endpoint(cfg.metrics_port)

    def _start_metrics_endpoint(self, port: int) -> None:
        """Serve ``GET /metrics`` (Prometheus) on ``port`` until the job ends; a port that cannot be
        bound is logged and recorded as an event, and the job runs without the endpoint."""
        host = self.cfg.metrics_bind_address or driver_bind_host(self._sc)
        try:
            self.metrics_server = MetricsServer(lambda: render(collect(self.master)), port, host,
                                                self.cfg.metrics_basic_auth)
        except OSError as err:
            with self.master.locked():
                self.master.event(f"no metrics endpoint: cannot listen on {host} port {port} "
                                  f"(spark.replication.metrics.port, metrics.bindAddress): {err}")
            return
        with self.master.locked():
            wildcard = host in ("0.0.0.0", "::", "")
            self.master.metrics_url = self.metrics_server.url(driver_advertise_host(self._sc) if wildcard else host)
            self.master.status_changed()  # the status file shows it
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

    def start_pulse_generators(self) -> None:
        """The run's first generator (launch): LiveRobin's, or KaZoo's for pulse windows, ready for
        the first (every source holds its records from the window's opening to its first pulse)."""
        if self.pulses is not None:
            self.start_pulse_generator(windowed=self.cfg.mode == "kazoo")

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
        own is replaced: replication.control.pulses).  Returns their names."""
        return self.pulses.kill() if self.pulses is not None else []

    # started by launch.run()
    def run_spark_job(self, boot: WorkerBootstrap) -> None:
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
        self.master.wait_for(lambda: self.master.started_at is not None or self.master.failure
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
        with self.master.locked():
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


    # -- handovers while the job runs (replication.control.handover_calls) ----------------------------
    move_vnodes = _handover_call("move_vnodes")
    rescale = _handover_call("rescale")
    rebalance = _handover_call("rebalance")
    drain_executor = _handover_call("drain_executor")
    replace_operator = _handover_call("replace_operator")
    state_bytes_per_vnode = _handover_call("state_bytes_per_vnode")
    routed_per_vnode = _handover_call("routed_per_vnode")
    routing = _handover_call("routing")
    move_request = _handover_call("move_request")

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
        arming = master.savepoints
        with master.locked():
            arming.directory = root
            master.ring_workers()
            live = lambda: {w for w, i in master.workers.items()  # noqa: E731
                            if w not in master.dead and w not in master.reports}
            if not master.wait_for(lambda: live() <= arming.armed, 30):
                raise TimeoutError(f"workers {sorted(live() - arming.armed)} did not learn of the savepoint "
                                   "within 30 s")
            master.event(f"savepoint to {without_credentials(root)}: every worker knows; draining")
            return root

    def _complete_savepoint(self, root: str, result: JobResult) -> None:
        """Every partition of every task wrote its part (one replica suffices): mark it complete."""
        tasks = {t.name: t.parallelism for t in self.plan.tasks}
        missing = savepoints.missing_parts(root, tasks, self.plan.replicas)
        if result.status != "finished" or missing:
            raise JobFailedError(f"savepoint {without_credentials(root)} incomplete (job {result.status}; no part from "
                                 f"{', '.join(missing) or 'none missing'}): it cannot be restored from")
        savepoints.write_meta(root, job=self.job.name, num_key_groups=self.plan.num_key_groups, tasks=tasks,
                              sources=[t.name for t in self.plan.tasks if t.is_source],
                              keyed=[t.name for t in self.plan.tasks if t.id in self.plan.routing],
                              code_versions={(self.plan.task(t).name, op): v for (t, op), v in self.master.code_versions().items()})
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
            if self._spark_error is not None:
                log.warning("the Spark job of %s failed: %s", self.job.name, self._spark_error)
            failure = m.failure or (f"Spark job failed: {spark_error_line(self._spark_error)}"
                                    if self._spark_error else None)
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

