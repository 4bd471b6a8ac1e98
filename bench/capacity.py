"""Issue 21's capacity targets in one run, beside the plain-loop ceiling and Spark Structured Streaming.

    .venv/bin/python bench/capacity.py [--quick] [--out bench/results/capacity] [--sustained-minutes 10]

In order, each part on a machine otherwise idle, and each on an embedded stack of its own (the
idle phase, every ramp, the latency runs, every kill run, every sustained run): the embedded broker's
fetches cost more the more batches it holds, so on one stack each step ran slower than the last.

1. *ceiling*: a plain single-process Python loop on the embedded broker (confluent-kafka consume of the
   ordered job's two topics, ``json.loads``, the hash chain in a dict per key, produce), over
   ``--ceiling-events`` pre-produced events; its output is verified like the job's.
2. one ``local-cluster[3,1,512]`` Spark for the project's modes (``--modes``), the ordered two-source job
   (union -> keyed hash chain -> sink) at L=1 throughout:

   * *idle*: the job running with no input, at each of ``--idle-parallelisms`` (topics of that many
     partitions, the chain task at that parallelism): the cores of its processes (executors' JVMs and
     Python, driver JVM, broker, ZooKeeper) over ``--idle-seconds``, the same machine with no job
     subtracted, and the threads of the executors' Python processes;
   * *throughput*: per parallelism of ``--parallelisms`` and mode, ``--rates`` in increasing order until a
     run is not flat twice in a row (``bench/ordering.py``'s criteria: kept up, p99 within its bound, no
     backlog growth, output exact); the broker's CPU per event beside the workers'; the load generator
     batches for ``--ramp-feeder-linger`` ms, as the ceiling's producer and SSS's ramp do (see
     :data:`RAMP_FEEDER_LINGER_MS`);
   * *latency*: fault-free p50 / p99 at ``--latency-rate``;
   * *kills* at ``--latency-rate``: a LiveRobin replica's and a KaZoo follower's executor, and
     separately only their Python worker (the JVM stays); worst per-second p99 in the 10 s after
     against the p99 before; an executor kill once with Spark's relaunch as it is (on this machine)
     and once with the replacement kept off the survivors' CPU (its JVM and Python at nice 19);
   * *sustained* (``--sustained-minutes``, 0: skipped): each mode at half its max sustainable rate,
     fed in batches of 100 ms (:data:`SUSTAINED_FEEDER_LINGER_MS`); the per-minute p99 and the
     executors' Python memory, first minute against last, the broker's and the Python workers'
     cores per minute, and per-second latencies (``sustained_seconds.csv``).
3. *SSS*: ``bench/sss.py``'s throughput ramp of Spark Structured Streaming on the same job shape, fed
   with the same ``--ramp-feeder-linger``.

Writes ``ceiling.csv``, ``idle.csv``, ``throughput.csv``, ``latency.csv``, ``kills.csv``, ``sustained.csv``,
``sustained_seconds.csv``, ``sss/``, ``targets.csv`` and ``targets.md`` (each figure beside its target, ``met`` yes/no, and the
ratios to the ceiling and to SSS), ``capacity.png`` and ``machine.txt``.  ``--quick`` is a smoke-sized
run (minutes) that checks the command, not the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from bench.common import (  # noqa: E402
    CPU_GROUPS,
    IDLE_SETTLE_S,
    CostProbe,
    format_row,
    max_sustainable,
    pid_ticks,
    read_csv_rows,
    snapshot_cores,
    write_csv,
    write_machine,
)
from bench.ordering import (  # noqa: E402
    KILL_MODES,
    Config,
    OrderedRun,
    event_makers,
    kill_configs,
    kill_rows,
    latency_configs,
    latency_row,
    run_ordered,
    throughput_row,
)
from deploy.stack import EmbeddedStack, StackEndpoints, require_java17, run_dir_status  # noqa: E402
from deploy.topics import create_topics, read_all  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from ops.workload import percentile  # noqa: E402
from replication import run  # noqa: E402
from replication.examples.ordered import build_ordered_job, chain_step, verify_chains  # noqa: E402
from replication.spark_cluster import build_session, stop_session, wait_for_executors  # noqa: E402
from transport.kafka_io import produce_blocking  # noqa: E402

PERIOD_MS = 10  # LiveRobin heartbeat period of every run
TARGETS = {"off": 20_000.0, "liverobin": 8_000.0, "kazoo": 8_000.0}  # max sustainable events/s
IDLE_TARGET_CORES = 0.05
KILL_FACTOR_TARGET = 2.0  # worst per-second p99 after a kill <= this x the fault-free p99
# The sustained runs' load generator batches for this long (the ramps' lingers 2 ms): with one batch
# every 2 ms per partition the embedded broker's fetches list ever more batches, and a plain loop
# reading 1,000 records/s fell behind within two minutes (bench/broker_limits.py); batched, the
# broker stays flat, and the runs measure whether the job does.  It adds up to this much to every
# record's latency, the same in every minute.
SUSTAINED_FEEDER_LINGER_MS = 100.0
# The ramps' load generator (and SSS's, and the ceiling's producer) batches for this long.  Each fetch
# of the embedded broker lists every batch the partition holds, so a feeder lingering 2 ms (500
# batches a second per partition) makes the broker's CPU per event grow within each 8 s step and sets
# the limit for every mode alike (off at 12,800 events/s: broker 55 us per event at 2 ms, 17 us at
# 20 ms).  On Apache Kafka the feeder's batches do not change what a fetch costs.  A ramp's latency
# runs from the feeder's clock, so it includes the linger (at most 20 ms; its bound, twice the first
# rate's p99 plus 50 ms, grows by as much).  The kill runs keep a 2 ms feeder (their ratio, measured
# from the feeder's clock too, would look better by a longer linger), and so do the latency runs
# (measured from the source's read, which a longer linger would make burstier).
RAMP_FEEDER_LINGER_MS = 20.0
HZ = os.sysconf("SC_CLK_TCK")  # clock ticks per second (/proc)


# --------------------------------------------------------------------------- 1. the plain-loop ceiling

def measure_ceiling(stack: StackEndpoints, events: int, status: StatusLine) -> dict[str, Any]:
    """The plain loop over ``events`` pre-produced events (2:1 into topics a and b, 2 partitions each)."""
    bootstrap = stack.bootstrap_servers
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topics = {"a": f"ceil{stamp}-a", "b": f"ceil{stamp}-b"}
    out = f"ceil{stamp}-out"
    create_topics(bootstrap, {topics["a"]: 2, topics["b"]: 2, out: 2})
    make = event_makers()
    makers = {"a": make("a"), "b": make("b")}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000})
    ids = []
    status.update(f"ceiling: producing {events:,} events")
    for i in range(events):
        source = "a" if i % 3 else "b"
        key, value, event_id = makers[source](i)
        ids.append(event_id)
        produce_blocking(producer, topics[source], key=key, value=value)
    producer.flush(120)
    broker = _broker_pid(stack)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ceiling-{stamp}", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(t, k, 0) for t in topics.values() for k in (0, 1)])
    sink = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10_000})
    heads: dict[str, tuple[str, int]] = {}
    status.update("ceiling: the plain loop")
    cpu0, broker0, t0 = _own_cpu(), pid_ticks(broker), time.monotonic()
    done = 0
    while done < events:
        for msg in consumer.consume(1000, 1.0):
            if msg.error() is not None:
                continue
            e = json.loads(msg.value())
            prev, n = heads.get(e["key"], ("", 0))
            h = chain_step(prev, e["id"])
            heads[e["key"]] = (h, n + 1)
            value = json.dumps({"key": e["key"], "n": n + 1, "id": e["id"], "prev": prev, "h": h, "ts": e["ts"]})
            while True:
                try:
                    sink.produce(out, key=msg.key(), value=value.encode())
                    break
                except BufferError:
                    sink.poll(0.01)
            done += 1
        sink.poll(0)
    sink.flush(120)
    elapsed, cpu, broker_cpu = time.monotonic() - t0, _own_cpu() - cpu0, (pid_ticks(broker) - broker0) / HZ
    consumer.close()
    status.update("ceiling: verifying its output")
    report = verify_chains([json.loads(r.value) for r in read_all(bootstrap, out)], ids)
    status.done()
    return {"events": events, "seconds": elapsed, "events_per_s": events / elapsed,
            "cpu_us_per_event": cpu / events * 1e6, "broker_cpu_us_per_event": broker_cpu / events * 1e6,
            "exact": "yes" if report.exact else f"no: {report}"}


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _broker_pid(stack: StackEndpoints) -> int:
    return next(s.pid for s in run_dir_status(stack.run_dir) if s.name == "kafka" and s.pid is not None)


# --------------------------------------------------------------------------- 2. the project's modes

def cores(probe: CostProbe, seconds: float) -> tuple[dict[str, float], dict[str, int]]:
    """Cores per process group over ``seconds``, and the live processes per group."""
    before = probe.snapshot()
    time.sleep(seconds)
    after = probe.snapshot()
    used = snapshot_cores(before, after, HZ)
    return {g: used.get(g, 0.0) for g in (*CPU_GROUPS, "bench")}, after.processes


def python_threads(probe: CostProbe) -> tuple[int, int]:
    """Threads of the executors' Python processes: in all, and in the largest one (a worker)."""
    counts = [_status_number(p, "Threads") for p in probe.groups().get("python", [])]
    return sum(counts), max(counts, default=0)


def _status_number(pid: int, field: str) -> int:
    """A number of ``/proc/<pid>/status`` (``Threads``, ``VmRSS`` in kB); 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure_idle(stack: StackEndpoints, spark: Any, probe: CostProbe, config: Config, parallelism: int,
                 seconds: float, machine: dict[str, float], status: StatusLine) -> dict[str, Any]:
    """A job with no input: its processes' cores over ``seconds``, the machine without a job subtracted."""
    stamp = f"{int(time.time() * 1000) % 10**10}"
    a, b, out = f"idle{stamp}-a", f"idle{stamp}-b", f"idle{stamp}-out"
    create_topics(stack.bootstrap_servers, {a: parallelism, b: parallelism})
    handle = run(build_ordered_job(a, b, out, name=f"idle-{config.mode}-{stamp}", parallelism=parallelism),
                 spark=spark, conf=config.conf(stack))
    handle.wait_started(120)
    try:
        status.update(f"idle: {config.label} at parallelism {parallelism}")
        time.sleep(IDLE_SETTLE_S)
        used, _ = cores(probe, seconds)
        threads, per_process = python_threads(probe)
    finally:
        handle.stop(60)
        status.done()
    job = {g: max(0.0, used[g] - machine.get(g, 0.0)) for g in CPU_GROUPS}
    return {"config": config.label, "parallelism": parallelism, "seconds": seconds,
            "cores_job": sum(job.values()), **{f"cores_{g}": v for g, v in job.items()},
            "cores_driver": max(0.0, used["bench"] - machine.get("bench", 0.0)),
            "python_threads": threads, "threads_largest_process": per_process}


def ramp(stack: StackEndpoints, spark: Any, probe: CostProbe, config: Config, parallelism: int,
         rates: list[float], duration: float, status: StatusLine,
         feeder_linger_ms: float = RAMP_FEEDER_LINGER_MS) -> list[dict[str, Any]]:
    """``rates`` in increasing order until a run is not flat, a run that is not flat tried once more
    before the ramp stops (a single 8 s run on 2 cores can miss for a transient); a row per run, with
    the broker's share."""
    rows: list[dict[str, Any]] = []
    base = None
    for rate in rates:
        row = _ramp_step(stack, spark, probe, config, parallelism, rate, duration, status, base, feeder_linger_ms)
        if row["verdict"] != "flat" and not row["verdict"].startswith("error"):
            rows.append({**row, "verdict": "retried: " + row["verdict"]})
            row = _ramp_step(stack, spark, probe, config, parallelism, rate, duration, status, base, feeder_linger_ms)
        rows.append(row)
        if row["verdict"] != "flat":
            break
        base = row["p99_ms"] if base is None else base
    return rows


def _ramp_step(stack: StackEndpoints, spark: Any, probe: CostProbe, config: Config, parallelism: int, rate: float,
               duration: float, status: StatusLine, base: float | None, feeder_linger_ms: float) -> dict[str, Any]:
    print(f"== throughput: {config.label}, parallelism {parallelism}, {rate:,.0f} events/s", flush=True)
    try:
        r = run_ordered(stack, spark, config, pipeline=1, rate=rate, duration_s=duration, status=status,
                        probe=probe, parallelism=parallelism, source_partitions=parallelism,
                        feeder_linger_ms=feeder_linger_ms)
        row = throughput_row(r, rate, 2.0, base)
        produced = max(1, r.load.produced)
        cpu = r.costs
        row.update({"parallelism": parallelism, "feeder_linger_ms": feeder_linger_ms,
                    "broker_cpu_us_per_event": cpu["cpu_broker_s"] / produced * 1e6,
                    "python_cpu_us_per_event": cpu["cpu_python_s"] / produced * 1e6,
                    "job_cpu_us_per_event": cpu["cpu_s"] / produced * 1e6})
    except Exception as err:  # noqa: BLE001 - reported as the run's verdict, and the ramp stops
        status.done()
        row = {"config": config.label, "parallelism": parallelism, "offered_rate": rate,
               "verdict": f"error: {type(err).__name__}: {' '.join(str(err).split())[:300]}"}
    print("   " + format_row(row, skip=("outcome",)), flush=True)
    return row


def kill_run(stack: StackEndpoints, spark: Any, config: Config, rate: float, duration: float,
             status: StatusLine) -> dict[str, Any]:
    print(f"== kill: {config.label} ({config.kill}) at {rate:,.0f} events/s", flush=True)
    r: OrderedRun = run_ordered(stack, spark, config, pipeline=1, rate=rate, duration_s=duration, status=status,
                                kill_at_s=duration / 2)
    status.update("waiting for the replacement executor")
    wait_for_executors(spark.sparkContext, 3, timeout=90)
    status.done()
    if r.fault_at is None:
        return {"config": config.label, "kill": config.kill, "victim": config.victim, "exact": "no",
                "outcome": f"the kill did not happen: {r.fault}"}
    _, row = kill_rows(r, 2.0)
    row = {"config": config.label, "kill": config.kill, **{k: v for k, v in row.items() if k != "config"}}
    row["factor"] = row["worst_p99_after_ms"] / row["p99_before_ms"] if row["p99_before_ms"] else ""
    print("   " + format_row(row, skip=("events", "killed", "outcome")), flush=True)
    return row


def sustained_run(stack: StackEndpoints, spark: Any, probe: CostProbe, config: Config, rate: float,
                  minutes: float, status: StatusLine) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per-minute p99 by event time and the executors' Python memory, first minute against last;
    the broker's and the executors' Python cores per minute; and per second of event time the
    records' count, p50, p99 and worst latency (the second list)."""
    print(f"== sustained: {config.label} at {rate:,.0f} events/s for {minutes:.0f} min", flush=True)
    rss: list[float] = []
    snapshots = [probe.snapshot()]
    halt = threading.Event()

    def sample() -> None:  # the executors' Python memory every 10 s, the CPU every minute, while the load runs
        while not halt.wait(10):
            rss.append(_python_rss_mb(probe))
            if len(rss) % 6 == 0:
                snapshots.append(probe.snapshot())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        r = run_ordered(stack, spark, config, pipeline=1, rate=rate, duration_s=minutes * 60, status=status,
                        feeder_linger_ms=SUSTAINED_FEEDER_LINGER_MS)
    finally:
        halt.set()
        sampler.join()
    steady = rss[6:-3] or rss  # from the second minute to before the drain
    rss_first, rss_last = (steady[0], steady[-1]) if steady else (0.0, 0.0)
    by_minute: dict[int, list[float]] = {}
    t0 = min((s.produced for s in r.samples), default=0.0)
    for s in r.samples:
        by_minute.setdefault(int((s.produced - t0) // 60), []).append(s.sink - s.produced)
    minutes_p99 = [percentile(v, 0.99) * 1000 for _, v in sorted(by_minute.items()) if len(v) > 100]
    first, last = (minutes_p99[0], minutes_p99[-1]) if minutes_p99 else (0.0, 0.0)
    hz = os.sysconf("SC_CLK_TCK")

    def cores(group: str) -> str:
        return " ".join(f"{(b.ticks.get(group, 0) - a.ticks.get(group, 0)) / hz / (b.at - a.at):.2f}"
                        for a, b in itertools.pairwise(snapshots))

    by_second: dict[int, list[float]] = {}
    for s in r.samples:
        by_second.setdefault(int(s.produced - t0), []).append((s.sink - s.produced) * 1000)
    seconds = [{"config": config.label, "second": k, "records": len(v), "p50_ms": percentile(v, 0.5),
                "p99_ms": percentile(v, 0.99), "max_ms": max(v)} for k, v in sorted(by_second.items())]
    return {"config": config.label, "rate": rate, "minutes": minutes, "exact": "yes" if r.exact else "no",
            "p99_first_minute_ms": first, "p99_last_minute_ms": last, "p99_ratio": last / first if first else "",
            "per_minute_p99_ms": " ".join(f"{p:.0f}" for p in minutes_p99),
            "python_rss_start_mb": rss_first, "python_rss_end_mb": rss_last,
            "per_minute_broker_cores": cores("broker"), "per_minute_python_cores": cores("python")}, seconds


def _python_rss_mb(probe: CostProbe) -> float:
    return sum(_status_number(pid, "VmRSS") for pid in probe.groups().get("python", [])) / 1024


# --------------------------------------------------------------------------- 3. Spark Structured Streaming

def sss_ramp(rates: list[float], duration: float, out: Path,
             feeder_linger_ms: float = RAMP_FEEDER_LINGER_MS) -> list[dict[str, Any]]:
    """``bench/sss.py``'s throughput ramp (its own Spark session and stack), rows of its throughput.csv."""
    cmd = [sys.executable, str(REPO / "bench/sss.py"), "--logic", "chain", "--feeder-linger", f"{feeder_linger_ms:g}",
           "--throughput-rates", ",".join(f"{r:.0f}" for r in rates), "--throughput-duration", f"{duration:.0f}",
           "--throughput-warm-up", "5", "--trigger-ms", "100", "--drain-timeout", "120", "--out", str(out)]
    print(f"== Spark Structured Streaming: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=False)
    return read_csv_rows(out / "throughput.csv")


# --------------------------------------------------------------------------- the targets table

def _victim_led(kill: dict) -> str:
    """A KaZoo kill whose victim led partitions (placement and the elections decide, so a follower's
    kill may take a leader with it): which, and when the last of them ordered again."""
    led = kill.get("led_at_kill") or "none"
    if led == "none":
        return ""
    first = kill.get("failover_max_ms", "")
    return f"; the victim also led {led}" + (f" (ordering again {first:.0f} ms after the kill)" if first != "" else "")


def targets(ceiling: dict, idle: list[dict], throughput: list[dict], latency: list[dict], kills: list[dict],
            sustained: list[dict], sss: list[dict]) -> list[dict[str, Any]]:
    """Each figure beside its target: ``met`` yes / no / ``-`` (not measured), ratios to the ceiling and SSS."""
    rows: list[dict[str, Any]] = []
    ceil = ceiling.get("events_per_s", 0.0)
    sss_max = next(iter(max_sustainable(sss).values()), None) if sss else None
    sss_rate = sss_max.max_rate if sss_max is not None else None

    def add(target: str, figure: str, met: bool | None, rate: float | None = None) -> None:
        rows.append({"target": target, "figure": figure, "met": "-" if met is None else ("yes" if met else "no"),
                     "of_ceiling": f"{rate / ceil:.3f}" if rate and ceil else "",
                     "of_sss": f"{rate / sss_rate:.2f}" if rate and sss_rate else ""})

    add("ceiling: plain Python loop (events/s)", f"{ceil:,.0f} ({ceiling.get('cpu_us_per_event', 0):.1f} us CPU, "
        f"broker {ceiling.get('broker_cpu_us_per_event', 0):.1f} us per event; exact {ceiling.get('exact')})",
        None, ceil or None)
    if sss_max is not None:
        add("Spark Structured Streaming max sustainable (events/s)", sss_max.text, None, sss_rate)
    ramps = {}
    for r in final_runs(throughput):
        ramps.setdefault((r["config"], int(r["parallelism"])), []).append(r)
    for (config, p), rs in ramps.items():
        best = max_sustainable(rs)[config]
        mode = config.split()[0]
        flat = [x for x in rs if x["verdict"] == "flat"]
        at = flat[-1] if flat else {}
        cost = (f"; at {best.max_rate:,.0f}/s: workers {at.get('python_cpu_us_per_event', 0):.0f} us, broker "
                f"{at.get('broker_cpu_us_per_event', 0):.0f} us CPU per event") if at else ""
        linger = f" (feeder linger {float(rs[0].get('feeder_linger_ms') or 2):g} ms)"
        add(f"max sustainable {config}, P={p} >= {TARGETS[mode]:,.0f}/s", best.text + cost + linger,
            (best.max_rate or 0.0) >= TARGETS[mode], best.max_rate)
    for config in dict.fromkeys(r["config"] for r in throughput):
        by_p = {p: max_sustainable(rs)[config].max_rate or 0.0 for (c, p), rs in ramps.items() if c == config}
        if len(by_p) > 1:
            ps = sorted(by_p)
            add(f"{config}: flat or better from P={ps[0]} to P={ps[-1]}",
                " / ".join(f"P={p}: {by_p[p]:,.0f}" for p in ps),
                all(by_p[b] >= by_p[a] for a, b in zip(ps, ps[1:], strict=False)))
    for r in idle:  # (the job's processes and its driver, which runs in this process)
        total = r["cores_job"] + r["cores_driver"]
        add(f"idle {r['config']}, P={r['parallelism']} <= {IDLE_TARGET_CORES} cores",
            f"{total:.3f} cores (executors' Python {r['cores_python']:.3f}, broker {r['cores_broker']:.3f}, "
            f"driver {r['cores_driver']:.3f}); {r['threads_largest_process']} threads in the largest Python process",
            total <= IDLE_TARGET_CORES)
    off = next((r for r in latency if r["config"] == "off"), None)
    for r in latency:
        mode = r["config"].split()[0]
        bound = {"off": 10.0, "liverobin": (off["p50_ms"] + 2 * PERIOD_MS) if off else None,
                 "kazoo": (off["p50_ms"] + 15.0) if off else None}[mode]
        add(f"fault-free p50 {r['config']} at {r['offered_rate']:,.0f}/s" + (f" <= {bound:.0f} ms" if bound else ""),
            f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, exact {r['exact']}",
            None if bound is None else r["p50_ms"] <= bound)
    for r in kills:
        factor = r.get("factor", "")
        add(f"kill {r['config']} ({r['kill']}): worst p99 in 10 s <= {KILL_FACTOR_TARGET:.0f}x fault-free",
            f"{r.get('worst_p99_after_ms', 0):.0f} ms vs {r.get('p99_before_ms', 0):.0f} ms before"
            + (f" ({factor:.1f}x)" if factor != "" else "") + f", exact {r.get('exact')}" + _victim_led(r),
            factor != "" and factor <= KILL_FACTOR_TARGET and r.get("exact") == "yes")
    for r in sustained:
        ratio = r["p99_ratio"]
        add(f"sustained {r['config']} {r['minutes']:.0f} min at {r['rate']:,.0f}/s: last-minute p99 <= 1.5x first",
            f"p99 {r['p99_first_minute_ms']:.0f} -> {r['p99_last_minute_ms']:.0f} ms, Python RSS "
            f"{r['python_rss_start_mb']:.0f} -> {r['python_rss_end_mb']:.0f} MB, exact {r['exact']}",
            ratio != "" and ratio <= 1.5 and r["exact"] == "yes")
    return rows


def final_runs(throughput: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ramp rows that count: without the first tries of a rate that was tried again."""
    return [r for r in throughput if not str(r["verdict"]).startswith("retried")]


def write_markdown(path: Path, rows: list[dict[str, Any]]) -> None:
    lines = ["| target | figure | met | of ceiling | of SSS |", "|---|---|---|---:|---:|"]
    lines += [f"| {r['target']} | {r['figure']} | {r['met']} | {r['of_ceiling']} | {r['of_sss']} |" for r in rows]
    path.write_text("\n".join(lines) + "\n")


def plot(out: Path, throughput: list[dict], ceiling: dict, sss: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars: list[tuple[str, float]] = [("plain loop", ceiling.get("events_per_s", 0.0))]
    if sss:
        bars.append(("SSS", next(iter(max_sustainable(sss).values())).max_rate or 0.0))
    ramps: dict[tuple[str, int], list[dict]] = {}
    for r in final_runs(throughput):
        ramps.setdefault((r["config"], int(r["parallelism"])), []).append(r)
    bars += [(f"{c} P={p}", max_sustainable(rs)[c].max_rate or 0.0) for (c, p), rs in ramps.items()]
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color="tab:blue")
    ax.set_xscale("log")
    ax.set_xlabel("max sustainable events/s (log)")
    ax.set_title("capacity: the ordered two-source job, L=1, against the plain loop and SSS")
    fig.tight_layout()
    fig.savefig(out / "capacity.png", dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- the command

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke-sized run: checks the command, not the targets")
    ap.add_argument("--modes", default="off,liverobin,kazoo")
    ap.add_argument("--rates", default="400,800,1600,3200,6400,8000,12800,20000,25600",
                    help="the ramps' offered events/s, in increasing order (the targets 8,000 and 20,000 among them)")
    ap.add_argument("--parallelisms", default="2,4,8")
    ap.add_argument("--ramp-duration", type=float, default=8.0)
    ap.add_argument("--ramp-feeder-linger", type=float, default=RAMP_FEEDER_LINGER_MS,
                    help="the throughput ramps' load generator linger.ms, the job's and SSS's (default %(default)s)")
    ap.add_argument("--idle-parallelisms", default="2,8")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--latency-rate", type=float, default=1000.0)
    ap.add_argument("--latency-duration", type=float, default=15.0, help="seconds of load (0: no latency runs)")
    ap.add_argument("--kill-duration", type=float, default=24.0)
    ap.add_argument("--kills", default="liverobin:executor,liverobin:executor-niced,liverobin:python,"
                                       "kazoo-follower:executor,kazoo-follower:executor-niced,kazoo-follower:python",
                    help="victim:what (executor, executor-niced: its replacement at nice 19, python: the "
                         "Python worker only), comma-separated ('' none)")
    ap.add_argument("--ceiling-events", type=int, default=100_000, help="0: no ceiling run")
    ap.add_argument("--sss-rates", default="800,1600,3200,6400")
    ap.add_argument("--sss-duration", type=float, default=20.0)
    ap.add_argument("--sustained-minutes", type=float, default=0.0)
    ap.add_argument("--sustained-rates", default="", metavar="MODE=RATE,...",
                    help="the sustained runs' rates (default: half of each mode's max sustainable in this run)")
    ap.add_argument("--out", default=str(REPO / "bench/results/capacity"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rates, args.parallelisms, args.idle_parallelisms = "400,800", "2", "2"
        args.ramp_duration, args.idle_seconds, args.latency_duration, args.kill_duration = 6.0, 4.0, 8.0, 16.0
        args.kills, args.ceiling_events, args.sss_rates, args.sss_duration = "liverobin:python", 5_000, "", 0
    args.modes = [m for m in args.modes.split(",") if m]
    args.rates = [float(x) for x in args.rates.split(",") if x]
    args.parallelisms = [int(x) for x in args.parallelisms.split(",") if x]
    args.idle_parallelisms = [int(x) for x in args.idle_parallelisms.split(",") if x]
    args.sss_rates = [float(x) for x in args.sss_rates.split(",") if x]
    return args


def kill_config(spec: str) -> Config:
    """``victim:what``: ``bench/ordering.py``'s kill run of that name, killing ``what``."""
    victim, _, what = spec.partition(":")
    if victim not in KILL_MODES:
        raise SystemExit(f"--kills: unknown victim {victim!r} (one of {', '.join(KILL_MODES)})")
    return dataclasses.replace(kill_configs([victim], PERIOD_MS)[0], kill=what or "executor")


@contextlib.contextmanager
def fresh_stack(spark: Any) -> Iterator[tuple[EmbeddedStack, CostProbe]]:
    """A new embedded stack, and a probe of the job's processes on it.  Each ramp and each phase gets
    one: the embedded broker's fetches cost more the more batches it holds (docs/embedded-broker.md),
    so on a shared stack every step would run slower than the one before."""
    with EmbeddedStack() as stack:
        yield stack, CostProbe.for_spark(spark, stack.run_dir)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    status = StatusLine()
    modes = latency_configs(args.modes, [PERIOD_MS])
    kills = [kill_config(k) for k in args.kills.split(",") if k]
    idle, throughput, latency, kill_results, sustained, sustained_seconds = [], [], [], [], [], []
    ceiling: dict[str, Any] = {}
    if args.ceiling_events:
        with EmbeddedStack() as stack:
            ceiling = measure_ceiling(stack, args.ceiling_events, status)
        print("== ceiling: " + format_row(ceiling), flush=True)
        write_csv(out / "ceiling.csv", [ceiling])
    spark = build_session("local-cluster[3,1,512]", app_name="bench-capacity")
    try:
        with fresh_stack(spark) as (stack, probe):
            status.update("the machine with Spark and the stack and no job")
            time.sleep(3)
            machine, _ = cores(probe, args.idle_seconds)
            status.done()
            for p in args.idle_parallelisms:
                for config in modes:
                    idle.append(measure_idle(stack, spark, probe, config, p, args.idle_seconds, machine, status))
                    print("== idle: " + format_row(idle[-1]), flush=True)
        if idle:
            write_csv(out / "idle.csv", idle)
        for p in args.parallelisms:
            for config in modes:
                with fresh_stack(spark) as (stack, probe):
                    throughput += ramp(stack, spark, probe, config, p, args.rates, args.ramp_duration, status,
                                       args.ramp_feeder_linger)
                write_csv(out / "throughput.csv", throughput)
        for config in modes if args.latency_duration > 0 else []:
            with fresh_stack(spark) as (stack, _):
                r = run_ordered(stack, spark, config, pipeline=1, rate=args.latency_rate,
                                duration_s=args.latency_duration, status=status)
            latency.append(latency_row(r, 2.0))
            print("== latency: " + format_row(latency[-1], skip=("outcome",)), flush=True)
        if latency:
            write_csv(out / "latency.csv", latency)
        for config in kills:
            with fresh_stack(spark) as (stack, _):
                kill_results.append(kill_run(stack, spark, config, args.latency_rate, args.kill_duration, status))
        if kill_results:
            write_csv(out / "kills.csv", kill_results)
        if args.sustained_minutes > 0:
            best = {r.config: r.max_rate for r in max_sustainable(
                [r for r in final_runs(throughput) if int(r["parallelism"]) == args.parallelisms[0]]).values()}
            given = dict(kv.split("=", 1) for kv in args.sustained_rates.split(",") if kv)
            for config in modes:
                rate = float(given[config.mode]) if config.mode in given else (best.get(config.label) or args.rates[0]) / 2
                with fresh_stack(spark) as (stack, probe):
                    row, seconds = sustained_run(stack, spark, probe, config, rate, args.sustained_minutes, status)
                sustained.append(row)
                sustained_seconds += seconds
            write_csv(out / "sustained.csv", sustained)
            write_csv(out / "sustained_seconds.csv", sustained_seconds)
    finally:
        stop_session(spark)
    sss = sss_ramp(args.sss_rates, args.sss_duration, out / "sss", args.ramp_feeder_linger) if args.sss_rates else []
    table = targets(ceiling, idle, throughput, latency, kill_results, sustained, sss)
    write_csv(out / "targets.csv", table)
    write_markdown(out / "targets.md", table)
    plot(out, throughput, ceiling, sss)
    write_machine(out)
    print("== targets")
    print((out / "targets.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
