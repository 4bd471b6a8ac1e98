"""The driver side: validate, plan, place, start the workers on Spark, watch, stop.

:func:`run` returns a :class:`JobHandle` at once; the workers run inside one
long-running Spark job submitted from a driver thread.  The job master (a gRPC
service in the driver) collects registrations, hands out the address table,
aggregates the workers' metrics and carries the drain/stop commands.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replication import rpc
from replication.api import Job
from replication.config import PREFIX, ReplicationConfig
from replication.kafka_io import admin_client, end_offsets_by_fetch, ensure_topics, topic_partitions
from replication.metrics import InstanceMetrics, aggregate
from replication.plan import Instance, PhysicalPlan, place, plan_job
from replication.spark_cluster import driver_advertise_host, executor_ids, warm_up
from replication.worker import WorkerBootstrap, run_worker

log = logging.getLogger(__name__)


class JobFailedError(RuntimeError):
    """The job stopped because of an error (a failed instance, a lost worker, a start timeout)."""


@dataclass
class WorkerInfo:
    index: int
    attempt: int
    executor: str | None
    address: str


class JobMaster:
    """Control plane state; its methods are the gRPC handlers (called from rpc threads)."""

    def __init__(self, num_workers: int, start_timeout_s: float) -> None:
        self.num_workers = num_workers
        self.start_timeout_s = start_timeout_s
        self.workers: dict[int, WorkerInfo] = {}
        self.command = "run"
        self.metrics: dict[str, InstanceMetrics] = {}
        self.reports: dict[int, dict] = {}
        self.failure: str | None = None
        self.started_at: float | None = None
        self._cond = threading.Condition()

    def fail(self, reason: str) -> None:
        with self._cond:
            if self.failure is None:
                self.failure = reason
                log.error("job failed: %s", reason)
            self.command = "stop"
            self._cond.notify_all()

    def set_command(self, command: str) -> None:
        with self._cond:
            if self.command != "stop":
                self.command = command

    def register(self, req: dict) -> dict:
        w, attempt = req["worker"], req["attempt"]
        with self._cond:
            if attempt > 0 or w in self.workers:
                reason = (f"worker {w} was relaunched by Spark (attempt {attempt}) after its executor was lost; "
                          "without spark.replication.enabled the job cannot mask the failure")
                self.failure = self.failure or reason
                self.command = "stop"
                self._cond.notify_all()
                return {"status": "abort", "reason": reason}
            self.workers[w] = WorkerInfo(w, attempt, req["executor"], req["address"])
            log.info("worker %d registered from executor %s at %s", w, req["executor"], req["address"])
            self._cond.notify_all()
            ok = self._cond.wait_for(lambda: len(self.workers) == self.num_workers or self.failure,
                                     self.start_timeout_s)
            if self.failure:
                return {"status": "abort", "reason": self.failure}
            if not ok:
                reason = (f"only {len(self.workers)} of {self.num_workers} workers registered within "
                          f"spark.replication.startTimeout; are there {self.num_workers} free task slots?")
                self.failure = reason
                self.command = "stop"
                return {"status": "abort", "reason": reason}
            if self.started_at is None:
                self.started_at = time.monotonic()
            return {"status": "ok", "addresses": {i: info.address for i, info in self.workers.items()}}

    def heartbeat(self, req: dict) -> dict:
        with self._cond:
            self.metrics.update(req["metrics"])
            command = self.command
        if req.get("errors"):
            self.fail("; ".join(req["errors"]))
            command = "stop"
        return {"command": command}

    def finished(self, req: dict) -> dict:
        with self._cond:
            self.metrics.update(req.get("metrics", {}))
            self.reports[req["worker"]] = req
            if req.get("status") == "failed":
                self.failure = self.failure or "; ".join(req.get("errors", []))
                self.command = "stop"
            self._cond.notify_all()
        return {}

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
    records_written: int = 0  # to Kafka, by the sinks

    def summary(self) -> str:
        return (f"{self.status} after {self.duration_s:.1f}s: {self.records_read:,} records read, "
                f"{self.records_written:,} written, {self.metrics.dead_lettered:,} dead-lettered")


def _role_metrics(plan: PhysicalPlan, snapshot: dict[str, InstanceMetrics], kind: str) -> InstanceMetrics:
    """Aggregate of the instances whose task contains an operator of ``kind`` (source or sink)."""
    names = {t.name for t in plan.tasks if any(n.kind == kind for n in t.chain)}
    return aggregate({k: v for k, v in snapshot.items() if k.rsplit("[", 1)[0] in names})


class JobHandle:
    """A running job: watch it, drain it, stop it."""

    def __init__(self, job: Job, cfg: ReplicationConfig, plan: PhysicalPlan, placement: dict[Instance, int],
                 master: JobMaster, server: Any, sc: Any, group: str) -> None:
        self.job, self.cfg, self.plan, self.placement = job, cfg, plan, placement
        self.master = master
        self._server = server
        self._sc = sc
        self._group = group
        self._done = threading.Event()
        self._spark_error: BaseException | None = None
        self._result: JobResult | None = None
        self._started = time.monotonic()

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

    def metrics(self) -> InstanceMetrics:
        """Metrics summed over all instances, as last reported."""
        return aggregate(self.master.snapshot())

    def sink_metrics(self) -> InstanceMetrics:
        """Metrics of the instances that host sinks (records_out: written; latency: end to end)."""
        return _role_metrics(self.plan, self.master.snapshot(), "sink")

    def source_metrics(self) -> InstanceMetrics:
        """Metrics of the source instances (records_in: records read from Kafka)."""
        return _role_metrics(self.plan, self.master.snapshot(), "source")

    def placement_table(self) -> str:
        """Which instance runs in which worker on which executor."""
        lines = []
        workers = self.master.workers
        for w in range(len(workers) or max(self.placement.values()) + 1):
            info = workers.get(w)
            where = f"executor {info.executor} at {info.address}" if info else "not registered"
            names = [f"{self.plan.task(t).name}[{p}]" for (t, p), ww in sorted(self.placement.items()) if ww == w]
            lines.append(f"  worker {w} ({where}): {', '.join(names)}")
        return "\n".join(lines)

    def drain(self, timeout: float | None = None) -> JobResult:
        """Let the sources read to the current end of their partitions, flush every window,
        and wait for the job to finish."""
        self.master.set_command("drain")
        return self.wait(timeout)

    def stop(self, timeout: float | None = None) -> JobResult:
        """Stop now (application-level signal first; the Spark job is cancelled if the
        workers do not end within ``timeout``, default spark.replication.stopTimeout)."""
        self.master.set_command("stop")
        wait_s = self.cfg.stop_timeout_ms / 1000 if timeout is None else timeout
        if not self._done.wait(wait_s):
            log.warning("workers did not stop within %.1fs: cancelling the Spark job", wait_s)
            self._sc.cancelJobGroup(self._group)
        return self.wait(30)

    def serve(self, drain_after_s: float = 0.0) -> JobResult:
        """Block like a service: until SIGINT/SIGTERM (then a graceful stop), until the job ends
        by itself, or, with ``drain_after_s``, drain after that many seconds.  Main thread only."""
        signalled = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: signalled.set())
        deadline = time.monotonic() + drain_after_s if drain_after_s else None
        while self.running and not signalled.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return self.drain()
            signalled.wait(0.2)
        return self.stop() if self.running else self.wait()

    def wait(self, timeout: float | None = None) -> JobResult:
        """Wait for the end; raises TimeoutError or JobFailedError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.job.name} still running after {timeout}s")
        if self._result is None:
            self._server.stop(grace=1.0)
            m = self.master
            status = "failed" if (m.failure or self._spark_error) else (
                "stopped" if m.command == "stop" else "finished")
            failure = m.failure or (f"Spark job failed: {self._spark_error}" if self._spark_error else None)
            snap = m.snapshot()
            self._result = JobResult(status, aggregate(snap), snap, failure, time.monotonic() - self._started,
                                     dict(m.workers), _role_metrics(self.plan, snap, "source").records_in,
                                     _role_metrics(self.plan, snap, "sink").records_out)
        if self._result.status == "failed":
            raise JobFailedError(self._result.failure)
        return self._result


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
    wanted = {n.spec["topic"]: plan.task(_task_of(plan, n)).parallelism for n in job.sinks()}
    wanted[cfg.dead_letter_topic(job.name)] = 1
    created = ensure_topics(admin, wanted)
    if created:
        log.info("created topics %s", ", ".join(created))
    return plan


def _task_of(plan: PhysicalPlan, node: Any) -> int:
    return next(t.id for t in plan.tasks if node in t.chain)


def resolve_config(sc: Any, conf: Mapping[str, Any] | None) -> ReplicationConfig:
    """``spark.replication.*`` from the Spark conf, overridden by ``conf``; validated."""
    settings: dict[str, Any] = {k: v for k, v in sc.getConf().getAll() if k.startswith(PREFIX)} if sc else {}
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
    plan = prepare(job, cfg)
    warm = warm_up(sc)
    num_workers = cfg.workers or len(executor_ids(sc))
    placement = place(plan, num_workers)
    master = JobMaster(num_workers, cfg.start_timeout_ms / 1000)
    server, port = rpc.serve({"Register": rpc.pickled(master.register), "Heartbeat": rpc.pickled(master.heartbeat),
                              "Finished": rpc.pickled(master.finished)}, max_workers=num_workers * 2 + 8)
    address = f"{driver_advertise_host(sc)}:{port}"
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    boot = WorkerBootstrap(job.name, run_id, plan, placement, cfg, address, num_workers)
    handle = JobHandle(job, cfg, plan, placement, master, server, sc, f"replication-{job.name}-{run_id}")
    log.info("%s\nwarm executors: %s; %d workers; job master at %s", plan.describe(), sorted(warm), num_workers,
             address)
    threading.Thread(target=handle._run_spark_job, args=(boot,), name=f"spark-job-{job.name}", daemon=True).start()
    return handle
