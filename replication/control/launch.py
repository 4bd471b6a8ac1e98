"""Starting a job: validate the config, plan, resume from a savepoint or durable checkpoints,
place the replicas, serve the job master and submit the workers' Spark job (:func:`run`)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark import cloudpickle

from kazoo_leader.segments import SegmentedLog
from liverobin.segments import HeartbeatLog
from replication import savepoint as savepoints
from replication.api import Job, JobDefinitionError
from replication.config import PREFIX, ConfigError, ReplicationConfig, follow_spark_ssl
from replication.control.elections import ElectionJanitor
from replication.control.handle import JobHandle
from replication.control.master import JobMaster
from replication.control.order_retention import OrderLogRetention
from replication.control.watch import monitor
from replication.durability import (
    DurableCheckpoints,
    plan_shape,
    rescale_savepoint_dir,
    resume_point,
    run_lineage,
    with_parallelism,
)
from replication.messages import Attach, HandoverRequest, Heartbeat, Register, SourcePositions, WorkerFinished
from replication.plan import PhysicalPlan, check_replicable, place, plan_job
from replication.runtime.driver_link import HEARTBEAT_METHOD
from replication.runtime.worker import WorkerBootstrap
from replication.security import job_security, write_cli_credentials
from replication.spark_cluster import (
    ExecutorsCannotLoad,
    driver_advertise_host,
    driver_bind_host,
    executor_ids,
    executor_lister,
    warm_up,
)
from rhino_state.durable import DurableStore, without_credentials
from rhino_state.keys import RoutingTable
from transport import rpc
from transport.frames import FrameServer
from transport.kafka_io import (
    KafkaUnavailable,
    TopicMaker,
    admin_client,
    end_offsets_by_fetch,
    ensure_topics,
    topic_partitions,
)
from transport.rpc import host_port

log = logging.getLogger(__name__)



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


def _from_savepoint(plan: PhysicalPlan, cfg: ReplicationConfig, job_name: str) -> None:
    """Check the savepoint against the plan (ConfigError naming the key otherwise) and start the
    sources where it ends.  The operators replaced at runtime in the run that wrote it keep their
    functions if it is the savepoint of a durable resume at another parallelism (as any durable
    resume does); from any other savepoint the job's own functions run, and a warning names them."""
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
    replaced = {(task, op): version for task, op, version in meta.get("code_versions", [])}
    plan.savepoint_code = cfg.checkpoint_dir is not None and \
        savepoints.canonical(root) == rescale_savepoint_dir(cfg.checkpoint_dir, job_name)
    if plan.savepoint_code:
        ids = {t.name: t.id for t in plan.tasks}
        plan.code_versions.update({(ids[task], op): version for (task, op), version in replaced.items() if task in ids})
    elif replaced:
        log.warning("savepoint %s: this run starts with the job's own functions; replaced at runtime in the run "
                    "that wrote it were %s", without_credentials(root),
                    ", ".join(f"operator {op!r} of task {task!r} (version {v})" for (task, op), v in sorted(replaced.items())))


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
        _from_savepoint(plan, replace(cfg, restore_from=between), job_name)


def _resumed_handovers(plan: PhysicalPlan) -> None:
    """A resumed run routes as the checkpoints of its cut do (handovers of the runs before moved
    vnodes; a cut lies past every handover): the driver plans the next handovers from there.  Its
    replaced operators run the function their checkpoints hold; their next replacement counts its
    version on from the cut's."""
    if plan.resume is None:
        return
    for key, data in plan.resume.cut.run.get("routing", {}).items():
        table, current = RoutingTable.from_dict(data), plan.routing.get(int(key))
        if current is not None and (table.parallelism, table.num_vnodes) == (current.parallelism, current.num_vnodes):
            plan.routing[int(key)] = table
    for task, operator, version in plan.resume.cut.run.get("code_versions", []):
        plan.code_versions[(int(task), str(operator))] = int(version)


def check_unordered(plan: PhysicalPlan, cfg: ReplicationConfig) -> None:
    """Replication in ``unordered`` mode: a task with several input channels would diverge between
    its replicas; refused, unless ``unordered.allowDivergence`` (then a warning names them)."""
    multi = [t.name for t in plan.multi_input_tasks()]
    if not multi:
        return
    key = PREFIX + "unordered.allowDivergence"
    if not cfg.unordered_allow_divergence:
        raise ConfigError([(PREFIX + "mode", f"{PREFIX}mode=unordered with replication: tasks with several input "
                                             f"channels ({', '.join(multi)}) would diverge between their replicas; "
                                             f"use mode liverobin or kazoo, or set {key}=true to run them anyway")])
    log.warning("%s=true: tasks with several input channels (%s) may diverge between their replicas and produce "
                "wrong output", key, ", ".join(multi))


def plan_offline(job: Job, cfg: ReplicationConfig, partitions: Mapping[str, int]) -> PhysicalPlan:
    """The job's plan without Kafka: ``partitions`` gives each source topic's partition count (a
    source with ``parallelism=`` and no count is taken to have that many).  Creates nothing."""
    counts = dict(partitions)
    for node in job.nodes:
        topic = node.spec.get("topic") if node.kind == "source" else None
        if topic is not None and topic not in counts:
            if node.parallelism is None:
                raise JobDefinitionError(f"source {node.name!r}: the partition count of topic {topic!r} is needed "
                                         f"to plan offline: --partitions {topic}=N (or parallelism= on the source)")
            counts[topic] = node.parallelism
    plan = plan_job(job, default_parallelism=cfg.parallelism, num_key_groups=cfg.state_key_groups,
                    num_vnodes=cfg.state_vnodes, topic_partitions=counts)
    _replicated(plan, cfg, counts)
    return plan


def _replicated(plan: PhysicalPlan, cfg: ReplicationConfig, partitions: Mapping[str, int]) -> None:
    """Two replicas per partition with replication, and the checks replication and the ordering
    modes make of the plan (each source partition one Kafka partition; no multi-input task left
    unordered unless allowed)."""
    if cfg.enabled:
        plan.replicas = 2
    if cfg.enabled or cfg.mode != "unordered":
        check_replicable(plan, partitions)
    if cfg.enabled and cfg.mode == "unordered":
        check_unordered(plan, cfg)


def prepare(job: Job, cfg: ReplicationConfig) -> PhysicalPlan:
    """Check Kafka, create missing sink / dead-letter topics, plan the job (no Spark needed)."""
    admin = admin_client({"log_level": 2, **cfg.kafka_admin_config()})  # (its own log: one line per try)
    sources = {n.spec["topic"] for n in job.nodes if n.kind == "source"}
    try:
        partitions = topic_partitions(admin, sources)
    except KafkaUnavailable as err:
        raise KafkaUnavailable(f"{PREFIX}kafka.bootstrapServers={cfg.kafka_bootstrap_servers}: {err}") from None
    plan = plan_job(job, default_parallelism=cfg.parallelism, num_key_groups=cfg.state_key_groups,
                    num_vnodes=cfg.state_vnodes, topic_partitions=partitions)
    for task in plan.tasks:
        if task.is_source and task.head.spec["starting_offsets"] == "latest":
            plan.source_start_offsets[task.id] = end_offsets_by_fetch(
                cfg.kafka_consumer_config(group_id=f"replication-{job.name}-start"), task.head.spec["topic"],
                range(partitions[task.head.spec["topic"]]))
    if cfg.restore_from is not None:
        _from_savepoint(plan, cfg, job.name)
    if cfg.checkpoint_dir is not None:
        _from_checkpoint_dir(plan, cfg, job.name)
        _resumed_handovers(plan)
    _replicated(plan, cfg, partitions)
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
                           for inst in plan.ordered_partitions()}
        # the sources' pulse-window order logs too: a restored source may place a window of the run
        # before from the heartbeat log, as its twin did, and reads that window's order from there
        resumed = plan.resume.cut.run.get("window_order_logs") if plan.resume is not None else None
        windows = resumed or f"{cfg.order_logs_prefix(job.name)}.{uuid.uuid4().hex[:8]}.windows"
        plan.window_order_logs_prefix = windows
        plan.window_order_logs = {inst: SegmentedLog(cfg.order_log(windows, *inst))
                                  for inst in plan.source_partition_ids()}
        ensure_topics(admin, {log_.topic(n): 1 for logs in (plan.order_logs, plan.window_order_logs)
                              for log_ in logs.values() for n in range(3)})
    wanted = {n.spec["topic"]: plan.task(_task_of(plan, n)).parallelism for n in job.sinks()}
    wanted[cfg.dead_letter_topic(job.name)] = 1
    created = ensure_topics(admin, wanted)
    if created:
        log.info("created topics %s", ", ".join(created))
    plan.sink_topic_partitions = topic_partitions(admin, [n.spec["topic"] for n in job.sinks()])
    return plan


def _task_of(plan: PhysicalPlan, node: Any) -> int:
    return next(t.id for t in plan.tasks if node in t.chain)


def _warm_up_with(sc: Any, plan: PhysicalPlan) -> dict[str, Any]:
    """Warm every executor up, each loading the plan as its workers will: a module of the job
    they cannot import is refused here, in one line, not by a hundred failed worker tasks."""
    try:
        return warm_up(sc, payload=cloudpickle.dumps(plan))
    except ExecutorsCannotLoad as err:
        raise JobDefinitionError(f"the executors cannot load the job: {err}; install its modules on every "
                                 f"executor or ship them (--py-files, SparkContext.addPyFile)") from err


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
    warm = _warm_up_with(sc, plan)
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
    election_root = f"/replication/{job.name}/{run_id}" if plan.order_logs or plan.window_order_logs else None
    lineage = run_lineage(plan.resume, run_id)
    master.windows.base = lineage["window_base"]
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
                 "order_logs": plan.order_logs_prefix, "window_order_logs": plan.window_order_logs_prefix},
            on_event=master.note)
        between = rescale_savepoint_dir(cfg.checkpoint_dir, job.name)
        if plan.savepoint is not None and savepoints.canonical(plan.savepoint[0]) == between:
            master.durable.on_first_cut = lambda: savepoints.delete(between)
    elections = ElectionJanitor(cfg.zookeeper_connect, election_root, master, cfg.zookeeper_digest) \
        if election_root else None
    threading.Thread(target=monitor, args=(master,), name=f"monitor-{job.name}", daemon=True).start()
    if plan.order_logs or plan.window_order_logs:  # KaZoo: what no reader needs is deleted while the job runs
        OrderLogRetention(master, {**plan.order_logs, **plan.window_order_logs},
                          TopicMaker(cfg.kafka_admin_config()).delete).start()
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
    handle.start_pulse_generators()
    log.info("%s\nwarm executors: %s; %d workers; job master at %s", plan.describe(), sorted(warm), num_workers,
             address)
    threading.Thread(target=handle.run_spark_job, args=(boot,), name=f"spark-job-{job.name}", daemon=True).start()
    return handle
