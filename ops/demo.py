"""The demo: embedded stack + local-cluster Spark + the fraud job under load, verified.

Starts ZooKeeper and the broker, a Spark cluster of several executor JVMs, runs
the card-payment job of :mod:`replication.examples.fraud`, drives it with the
load generator (live progress), drains it, checks every output record against a
plain-Python reference and prints a summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from deploy.stack import EmbeddedStack, require_java17
from ops.chaos import kill_executor, locate
from ops.progress import StatusLine
from ops.workload import percentile, run_fraud_workload
from replication import procfs
from replication.plan import replica_name
from replication.spark_cluster import build_session, executor_ids, executor_jvm_pids, stop_session

WARM_UP_S = 2.0


@dataclass
class DemoOptions:
    rate: float = 1500.0
    duration_s: float = 20.0
    executors: int = 3
    partitions: int = 2
    bad_every: int = 200
    replicated: bool = True  # False: the union + window job without replication
    mode: str = "unordered"  # liverobin: the union + window job, replicated, deterministic merge
    victim: str = "fraud-rule[0]r0"  # the replica whose executor is killed halfway (replicated only)
    rhino: bool = False  # Rhino checkpoints: the killed executor's replicas are restored from them


def kill_replica_executor(handle: Any, replica: str) -> str:
    """SIGKILL the executor hosting ``replica`` with the kill tooling; describe what died."""
    target = locate(replica, job=handle.job.name)
    kill_executor(target)
    names = [replica_name(handle.plan.task(t).name, p, r)
             for (t, p, r), w in sorted(handle.placement.items()) if w == target.worker]
    return (f"SIGKILLed executor {target.executor} (JVM pid {target.jvm_pid}), worker {target.worker}, "
            f"hosting {', '.join(names)}")


def python_processes_under(root_pids: list[int]) -> list[int]:
    """Python processes descending from ``root_pids`` (the executors' Python workers and daemons)."""
    return sorted({p for root in root_pids for p in procfs.descendants(root) if procfs.is_python(p)})


def main(opts: DemoOptions) -> int:
    require_java17()
    out = StatusLine()
    print("== starting the embedded stack (ZooKeeper + Kafka-protocol broker)")
    with EmbeddedStack() as stack:
        print(f"   kafka {stack.bootstrap_servers}, zookeeper {stack.zookeeper_connect}, logs {stack.run_dir}")
        master = f"local-cluster[{opts.executors},1,512]"
        print(f"== starting Spark {master} ({opts.executors} executor JVMs)")
        t0 = time.monotonic()
        spark = build_session(master, app_name="replication-demo")
        try:
            return _run(opts, stack, spark, out, time.monotonic() - t0)
        finally:
            stop_session(spark)


def _run(opts: DemoOptions, stack, spark, out: StatusLine, spark_start_s: float) -> int:
    sc = spark.sparkContext
    print(f"   {len(executor_ids(sc))} executors registered in {spark_start_s:.1f}s")
    print("== planning and starting the job" + (f" (spark.replication.enabled=true, mode={opts.mode})"
                                                 if opts.replicated else ""))
    fault = (lambda handle: kill_replica_executor(handle, opts.victim)) if opts.replicated else None
    rep = run_fraud_workload(stack.bootstrap_servers, spark, rate=opts.rate, duration_s=opts.duration_s,
                             partitions=opts.partitions, bad_every=opts.bad_every, replicated=opts.replicated, mode=opts.mode,
                             fault=fault, fault_at_s=opts.duration_s / 2, status=out, say=print,
                             conf={"spark.replication.zookeeper.connect": stack.zookeeper_connect,
                                   **({"spark.replication.rhino.enabled": "true"} if opts.rhino else {})})
    for c in rep.checks:
        print(f"   {c.name:14s} {c.got:7,d} records, expected {c.expected:7,d}: "
              f"{'exact match' if c.exact else 'MISMATCH'}")
    steady = rep.steady(WARM_UP_S)
    pipeline = [s.sink - s.ingest for s in steady]
    e2e = [s.sink - s.produced for s in steady]
    jvms = executor_jvm_pids(sc)
    pythons = python_processes_under(list(jvms.values()))
    m = rep.result.metrics
    ms = 1000
    if rep.fault_at is not None:
        print("\n== what happened around the kill")
        for ts, text in sorted(rep.result.events + _leaderships_since(rep.result.per_instance, rep.fault_at)):
            print(f"   {ts - rep.fault_at:+6.2f}s  {text}")
        print("   per-second p99 latency (source->sink) around the kill:")
        for sec, count, p99 in rep.per_second(origin=rep.fault_at):
            if -5 <= sec <= 8:
                mark = "  <- kill" if sec == 0 else ""
                print(f"   {sec:+3d}s {count:5d} records  p99 {p99 * ms:7.1f} ms  {'#' * min(60, int(p99 * ms / 5))}{mark}")
    print("\n== summary")
    print(f"   events in     {rep.load.produced:,} ({rep.load.malformed} malformed on purpose), "
          f"out: {rep.decisions:,} decisions ({rep.alerts:,} with alerts)"
          + (f" + {rep.window_totals:,} window totals" if rep.window_totals else ""))
    print(f"   throughput    {rep.throughput:,.0f} events/s through the job (offered {rep.load.rate:,.0f}/s)")
    print(f"   latency       (after {WARM_UP_S:.0f}s warm-up) source->sink p50 {percentile(pipeline, .5) * ms:.1f} ms, "
          f"p99 {percentile(pipeline, .99) * ms:.1f} ms; produced->sink p50 {percentile(e2e, .5) * ms:.1f} ms, "
          f"p99 {percentile(e2e, .99) * ms:.1f} ms")
    distinct_dead = next(c.got for c in rep.checks if c.name == "dead letters")
    print(f"   dead-lettered {distinct_dead} records, each once"
          + f"; sequence gaps {m.gaps}, late records {m.late_records}")
    print(f"   cluster       {len(jvms)} executor JVMs, {len(pythons)} Python worker processes, "
          f"{len(rep.result.workers)} workers hosting {len(rep.handle.placement)} "
          f"{'replicas' if opts.replicated else 'partition instances'}")
    if rep.fault:
        print(f"   fault         {rep.fault}")
    for rec in rep.result.recoveries:
        print(f"   restored      {rec['replica']} on worker {rec['worker']} from checkpoint {rec['checkpoint_id']}: "
              f"restore {rec['restore_s'] * ms:.0f} ms, two live replicas again {rec['recovery_s']:.2f}s after "
              "the failure")
    verdict = "EXACT: no record missing, none extra" + (" (the kill was masked)" if rep.fault else "")
    print(f"   result        {verdict if rep.exact else 'FAILED'}")
    return 0 if rep.exact else 1


def _leaderships_since(per_instance: dict, since: float) -> list[tuple[float, str]]:
    """KaZoo leaderships that began after ``since``, as timeline entries (from the final metrics)."""
    out = []
    for name, m in per_instance.items():
        if m.elected_at > since:
            out.append((m.elected_at, f"{name} leads its partition's order log (epoch {m.order_epoch})"))
            if m.first_order_at:
                out.append((m.first_order_at, f"{name}: its first order is back, the partition consumes again"))
    return out
