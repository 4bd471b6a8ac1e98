"""The demo: embedded stack + local-cluster Spark + the fraud job under load, verified.

Starts ZooKeeper and the broker, a Spark cluster of several executor JVMs, runs
the card-payment job of :mod:`replication.examples.fraud`, drives it with the
load generator (live progress), drains it, checks every output record against a
plain-Python reference and prints a summary.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from deploy.stack import EmbeddedStack, require_java17
from deploy.topics import create_topics, read_all
from replication.driver import run
from replication.examples.fraud import PaymentGenerator, Topics, build_job, canonical, reference
from replication.loadgen import generate_load
from replication.progress import StatusLine
from replication.spark_cluster import build_session, executor_ids, executor_jvm_pids, stop_session

WARM_UP_S = 2.0


@dataclass
class DemoOptions:
    rate: float = 1500.0
    duration_s: float = 20.0
    executors: int = 3
    partitions: int = 2
    bad_every: int = 200


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    values = sorted(values)
    return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


def python_processes_under(root_pids: list[int]) -> list[int]:
    """Python processes descending from ``root_pids`` (the executors' Python workers and daemons)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            parents[int(entry)] = int(fields["PPid"].strip())
            names[int(entry)] = fields["Name"].strip()
        except (OSError, KeyError, ValueError):
            continue
    roots = set(root_pids)

    def under(pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < 64:
            pid = parents.get(pid, 0)
            if pid in roots:
                return True
            seen += 1
        return False

    return sorted(p for p, n in names.items() if n.startswith("python") and under(p))


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
    topics = Topics.with_prefix(f"demo{int(time.time())}-")
    create_topics(stack.bootstrap_servers, {topics.eu: opts.partitions, topics.us: opts.partitions})
    job = build_job(topics, name=f"fraud-monitor-{int(time.time())}")
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers}
    print("== planning and starting the job")
    handle = run(job, spark=spark, conf=conf)
    print(handle.plan.describe())
    deadline = time.monotonic() + 120
    while handle.master.started_at is None and handle.running and time.monotonic() < deadline:
        time.sleep(0.1)
    print("   placement:\n" + handle.placement_table())

    eu = PaymentGenerator("eu", bad_every=opts.bad_every)
    us = PaymentGenerator("us", bad_every=opts.bad_every)

    def make(gen: PaymentGenerator):
        def f(ts: int):
            key, value, parsed = gen.next(ts)
            return key.encode(), value, parsed
        return f

    def job_status() -> str:
        m = handle.sink_metrics()
        return f"job: {m.records_out:,} out, p99 {m.latency.percentile(0.99) * 1000:.0f} ms"

    print(f"== load: {opts.rate:.0f} events/s for {opts.duration_s:.0f}s into {topics.eu}, {topics.us}")
    load = generate_load(stack.bootstrap_servers, [(topics.eu, make(eu)), (topics.us, make(us))],
                         rate=opts.rate, duration_s=opts.duration_s, status=out, extra_status=job_status)
    print("== draining: sources read to the end, windows flush, the job finishes")
    result = handle.drain(timeout=300)

    print("== verifying the output against a plain-Python reference")
    decisions_raw = read_all(stack.bootstrap_servers, topics.decisions)
    totals_raw = read_all(stack.bootstrap_servers, topics.totals)
    dead = read_all(stack.bootstrap_servers, f"{job.name}.dlq")
    exp_decisions, exp_totals = reference([load.parsed[topics.eu], load.parsed[topics.us]])
    decisions = [json.loads(r.value) for r in decisions_raw]
    totals = [json.loads(r.value) for r in totals_raw]
    ok_decisions = canonical(decisions) == canonical(exp_decisions)
    ok_totals = canonical(totals) == canonical(exp_totals)
    ok_dead = len(dead) == load.malformed
    for name, ok, got, want in (("decisions", ok_decisions, len(decisions), len(exp_decisions)),
                                ("window totals", ok_totals, len(totals), len(exp_totals)),
                                ("dead letters", ok_dead, len(dead), load.malformed)):
        print(f"   {name:14s} {got:7,d} records, expected {want:7,d}: {'exact match' if ok else 'MISMATCH'}")

    pipeline, e2e, first_ingest, last_sink = [], [], float("inf"), 0.0
    stamps = [({k: float(v) for k, v in r.headers}, json.loads(r.value)["ts"] / 1000) for r in decisions_raw]
    first_ingest = min((h["ingest_ts"] for h, _ in stamps), default=0.0)
    for h, produced in stamps:
        last_sink = max(last_sink, h["sink_ts"])
        if h["ingest_ts"] - first_ingest >= WARM_UP_S:
            pipeline.append(h["sink_ts"] - h["ingest_ts"])
            e2e.append(h["sink_ts"] - produced)
    p50, p99 = _percentiles(pipeline)
    e50, e99 = _percentiles(e2e)
    jvms = executor_jvm_pids(sc)
    pythons = python_processes_under(list(jvms.values()))
    alerts = sum(bool(d["alerts"]) for d in decisions)
    m = result.metrics
    print("\n== summary")
    print(f"   events in     {load.produced:,} ({load.malformed} malformed on purpose), "
          f"out: {len(decisions):,} decisions ({alerts} with alerts) + {len(totals):,} window totals")
    print(f"   throughput    {len(decisions) / max(last_sink - first_ingest, 1e-9):,.0f} events/s through the job "
          f"(offered {load.rate:,.0f}/s)")
    print(f"   latency       (after {WARM_UP_S:.0f}s warm-up) source->sink p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
          f"produced->sink p50 {e50 * 1000:.1f} ms, p99 {e99 * 1000:.1f} ms")
    print(f"   dead-lettered {m.dead_lettered} (sequence gaps {m.gaps}, late records {m.late_records})")
    print(f"   cluster       {len(jvms)} executor JVMs, {len(pythons)} Python worker processes, "
          f"{len(result.workers)} workers hosting {len(handle.placement)} partition instances")
    ok = ok_decisions and ok_totals and ok_dead and result.status == "finished"
    print(f"   result        {'EXACT: no record missing, none extra' if ok else 'FAILED'}")
    return 0 if ok else 1
