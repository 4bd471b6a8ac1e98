"""The BetterCloud-like and NEXMark-like workloads in every replication configuration: latency,
throughput, exactness and (NEXMark) the state size reached.

    .venv/bin/python bench/workloads.py [--workloads bettercloud,nexmark]
                                        [--modes off,passive,unordered,liverobin,kazoo]
                                        [--rate 200] [--duration 15] [--period 10] [--nexmark-state-mb 20]
                                        [--out bench/results/workloads]

The two jobs of :mod:`replication.examples.workloads`, each at ``--rate`` input events/s for
``--duration`` seconds per configuration, on one embedded stack and one ``local-cluster[3,1,512]``
Spark for everything:

* ``bettercloud``: ``events`` (2 partitions, keyed by customer) and ``controls`` (1 partition, one
  update per 20 events: unbalanced), filters, two joins (``app-rules``, ``customer-policies``, one
  partition each), a ``flat_map`` of 2 partitions, exactly-once sink. Its output depends on the
  consumption order; :func:`verify_bettercloud` checks every record against the reference given the
  order the output reports, and that this order is admissible.
* ``nexmark``: ``persons`` and ``auctions`` (2 partitions each, 1:3), a windowed join keyed by
  person (``--nexmark-window-ms`` tumbling windows, 2 partitions) that keeps every person and
  auction, exactly-once sink. The payload of each event is chosen so that the join's state reaches
  ``--nexmark-state-mb`` by the end of the run (``--nexmark-payload`` sets it instead). Columns
  ``state_mb`` (the logical bytes the join holds after the whole input, from the input:
  :func:`nexmark_state_bytes`) and ``state_disk_peak_mb`` (measured: the peak size of the join's
  RocksDB directories per replica, sampled every second; it lags by what the write-back cache of
  ``--state-cache-entries`` entries per instance has not flushed yet).

Configurations (as in ``bench/ordering.py``): ``off`` (no replication), ``passive`` (no replication,
Rhino checkpoints about every second at LiveRobin pulses of ``--period``), ``unordered`` (replicated,
first come first served: the replicas of multi-input tasks diverge), ``liverobin`` (replicated,
pulses every ``--period`` ms) and ``kazoo`` (replicated, ZooKeeper leaders write order logs).
Latency is sink time minus source ingest time (the first ``--warm-up`` seconds dropped); throughput
is output records / (last sink write - first ingest). A configuration that fails is a row of the
CSV with its error, not hidden. Writes ``workloads.csv``, ``workloads.png`` and ``machine.txt``;
exits non-zero if a configuration other than ``unordered`` is not exact.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import forget_topics, format_row, one_line, write_csv, write_machine  # noqa: E402
from bench.ordering import MODES, Config, latency_configs  # noqa: E402
from deploy.stack import EmbeddedStack, StackEndpoints, require_java17  # noqa: E402
from deploy.topics import create_topics, read_all  # noqa: E402
from ops.loadgen import LoadResult, MakeRecord, generate_load  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from ops.workload import Latencies, Sample, percentile, sample_of  # noqa: E402
from replication import JobFailedError, JobHandle, run  # noqa: E402
from replication.examples.nexmark import (  # noqa: E402
    NEXMARK_JOIN,
    NexmarkConfig,
    NexmarkGenerator,
    NexmarkTopics,
    build_nexmark_job,
    nexmark_state_bytes,
    payload_for_state,
    verify_nexmark,
)
from replication.examples.workloads import (  # noqa: E402
    BetterCloudGenerator,
    BetterCloudTopics,
    OutputReport,
    build_bettercloud_job,
    verify_bettercloud,
)
from replication.spark_cluster import build_session, stop_session, wait_for_executors  # noqa: E402

MS = 1000.0
MB = 1_000_000
WORKLOADS = ("bettercloud", "nexmark")
CONTROL_EVERY = 20  # bettercloud: one control update per this many activity events
AUCTIONS_PER_PERSON = 3  # nexmark: the load generator's round robin (NEXMark: 1 person : 3 auctions)
ERROR_CHARS = 500  # a failure in a row: at most this many characters (bench.common.one_line)
COUNT_COLUMNS = ("missing", "duplicated", "unexpected", "wrong", "broken")


@dataclass
class WorkloadRun:
    """One run of one workload in one configuration: what went in, what came out, how it ended."""

    workload: str
    config: Config
    load: LoadResult | None = None
    samples: list[Sample] = field(default_factory=list)
    report: OutputReport | None = None
    failure: str | None = None  # the job failed, did not end, or the run broke: why
    state_bytes: int | None = None  # nexmark: logical bytes of the join's state after the whole input
    state_disk_bytes: int | None = None  # nexmark: peak on-disk bytes of the join's RocksDB, per replica
    payload_bytes: int | None = None  # nexmark

    @property
    def exact(self) -> bool:
        return self.failure is None and self.report is not None and self.report.exact

    @property
    def outcome(self) -> str:
        """``yes``, or why not: the failure and / or the verifier's findings."""
        parts = [f"failed: {self.failure}"] if self.failure else []
        if self.report is not None and not self.report.exact:
            parts.append(str(self.report))
        elif self.report is None and not self.failure:
            parts.append("output not verified")
        return "; ".join(parts) or "yes"


class StateDiskProbe:
    """Samples, every ``period_s``, the bytes on disk of one task's RocksDB directories (every
    partition and replica of job ``job`` under state directory ``root``) and keeps the peak."""

    def __init__(self, root: Path, job: str, task_id: int, period_s: float = 1.0) -> None:
        self.root = root
        self.pattern = f"{job}/*/w*-a*/t{task_id}-p*"
        self.period_s = period_s
        self.current = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="state-disk-probe", daemon=True)

    def sample(self) -> int:
        total = 0
        for instance in self.root.glob(self.pattern):
            for folder, _, files in os.walk(instance):
                for name in files:
                    try:
                        total += os.path.getsize(os.path.join(folder, name))
                    except OSError:  # a file RocksDB just deleted
                        pass
        self.current = total
        self.peak = max(self.peak, total)
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def start(self) -> StateDiskProbe:
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling; the peak in bytes."""
        self._stop.set()
        self._thread.join()
        return self.peak


def stop_quietly(handle: JobHandle) -> None:
    """Stop the job if it still runs (after a failure that is reported otherwise)."""
    if handle.running:
        try:
            handle.stop(30)
        except (JobFailedError, TimeoutError):
            pass


def finish(handle: JobHandle) -> str | None:
    """Drain the job (sources to their end); the failure as one line, None if it finished."""
    try:
        handle.drain(timeout=180)
        return None
    except (JobFailedError, TimeoutError) as err:
        stop_quietly(handle)
        return one_line(err, ERROR_CHARS)


def start_job(stack: StackEndpoints, spark: Any, config: Config, job: Any, state_root: Path,
              cache_entries: int) -> JobHandle:
    """Run ``job`` in ``config`` with its state under ``state_root`` and a write-back cache of
    ``cache_entries`` per instance; return once it runs."""
    conf = {**config.conf(stack), "spark.replication.state.dir": str(state_root),
            "spark.replication.state.cacheEntries": str(cache_entries)}
    handle = run(job, spark=spark, conf=conf)
    try:
        handle.wait_started(120)
    except BaseException:
        stop_quietly(handle)
        raise
    return handle


def feed(handle: JobHandle, streams: list[tuple[str, MakeRecord]], bootstrap: str, args: argparse.Namespace,
         status: StatusLine, label: str, extra: Callable[[], str] = lambda: "") -> LoadResult:
    """Produce ``args.rate`` events/s for ``args.duration`` s round robin over ``streams``, with a
    progress line that also shows the sink's output and latency; stops the job if the load breaks."""
    def job_status() -> str:
        m = handle.sink_metrics()
        return (f"{label}: {m.records_out // handle.plan.replicas:,} out, "
                f"p99 {m.latency.percentile(0.99) * MS:.0f} ms{extra()}")

    try:
        return generate_load(bootstrap, streams, rate=args.rate, duration_s=args.duration, status=status,
                             extra_status=job_status)
    except BaseException:
        stop_quietly(handle)
        raise


def json_record(make: Callable[[int], tuple[bytes, dict]]) -> MakeRecord:
    """A load generator stream from a generator method ``make(ts) -> (key, record)``."""
    def f(ts: int) -> tuple[bytes, bytes, dict]:
        key, rec = make(ts)
        return key, json.dumps(rec, separators=(",", ":")).encode(), rec
    return f


def read_output(bootstrap: str, topic: str) -> tuple[list[dict], list[Sample]]:
    """The output records and their clocks (produced = the record's event time)."""
    outputs, samples = [], []
    for r in read_all(bootstrap, topic, max_wait_s=120):
        outputs.append(json.loads(r.value))
        samples.append(sample_of(r, produced=outputs[-1].get("ts", 0) / MS))
    return outputs, samples


def stamp() -> str:
    return f"{int(time.time() * 1000) % 10**10}"


def run_bettercloud(stack: StackEndpoints, spark: Any, config: Config, args: argparse.Namespace,
                    status: StatusLine, state_root: Path) -> WorkloadRun:
    """One bettercloud run: start, feed, drain, read, verify."""
    bootstrap, s = stack.bootstrap_servers, stamp()
    topics = BetterCloudTopics.with_prefix(f"bc{s}-")
    create_topics(bootstrap, {topics.events: 2, topics.controls: 1})
    job = build_bettercloud_job(topics, name=f"bc-{config.label.replace(' ', '')}-{s}",
                                join_parallelism=args.join_parallelism)
    handle = start_job(stack, spark, config, job, state_root, args.state_cache_entries)
    gen = BetterCloudGenerator(seed=args.seed)
    streams = [(topics.events, json_record(gen.event))] * (CONTROL_EVERY - 1) + [(topics.controls,
                                                                                  json_record(gen.control))]
    load = feed(handle, streams, bootstrap, args, status, f"bettercloud {config.label}")
    status.update(f"bettercloud {config.label}: draining")
    failure = finish(handle)
    status.update(f"bettercloud {config.label}: reading and verifying the output")
    outputs, samples = read_output(bootstrap, topics.out)
    forget_topics(bootstrap, s)
    report = verify_bettercloud(outputs, load.parsed[topics.events], load.parsed[topics.controls])
    status.done()
    return WorkloadRun("bettercloud", config, load, samples, report, failure)


def nexmark_payload(args: argparse.Namespace) -> int:
    """The payload per event: ``--nexmark-payload``, or what makes the input hold ``--nexmark-state-mb``."""
    if args.nexmark_payload is not None:
        return args.nexmark_payload
    events = int(args.rate * args.duration)
    auctions = events * AUCTIONS_PER_PERSON // (AUCTIONS_PER_PERSON + 1)
    return payload_for_state(int(args.nexmark_state_mb * MB), events - auctions, auctions,
                             NexmarkConfig(window_ms=args.nexmark_window_ms, seed=args.seed))


def run_nexmark(stack: StackEndpoints, spark: Any, config: Config, args: argparse.Namespace,
                status: StatusLine, state_root: Path) -> WorkloadRun:
    """One nexmark run: start, feed while sampling the join's state on disk, drain, read, verify."""
    bootstrap, s = stack.bootstrap_servers, stamp()
    topics = NexmarkTopics.with_prefix(f"nx{s}-")
    create_topics(bootstrap, {topics.persons: 2, topics.auctions: 2})
    cfg = NexmarkConfig(window_ms=args.nexmark_window_ms, payload_bytes=nexmark_payload(args), seed=args.seed)
    job = build_nexmark_job(topics, cfg.window_ms, name=f"nx-{config.label.replace(' ', '')}-{s}")
    handle = start_job(stack, spark, config, job, state_root, args.state_cache_entries)
    task = next(t.id for t in handle.plan.tasks if t.name == NEXMARK_JOIN)
    probe = StateDiskProbe(state_root, job.name, task).start()
    gen = NexmarkGenerator(cfg)
    model = {"bytes": 0}  # logical state of what was produced so far

    def counted(make: Callable[[int], tuple[bytes, dict]], person: bool) -> Callable[[int], tuple[bytes, dict]]:
        def f(ts: int) -> tuple[bytes, dict]:
            key, rec = make(ts)
            model["bytes"] += nexmark_state_bytes([rec] if person else [], [] if person else [rec], cfg.window_ms)
            return key, rec
        return f

    def extra() -> str:
        return (f", state {model['bytes'] / MB:,.1f}/{args.nexmark_state_mb:g} MB produced, "
                f"{probe.current / handle.plan.replicas / MB:,.1f} MB on disk per replica")

    streams = ([(topics.persons, json_record(counted(gen.person, True)))]
               + [(topics.auctions, json_record(counted(gen.auction, False)))] * AUCTIONS_PER_PERSON)
    try:
        load = feed(handle, streams, bootstrap, args, status, f"nexmark {config.label}", extra)
        status.update(f"nexmark {config.label}: draining")
        failure = finish(handle)
    finally:
        peak = probe.stop()
    status.update(f"nexmark {config.label}: reading and verifying the output")
    outputs, samples = read_output(bootstrap, topics.out)
    forget_topics(bootstrap, s)
    persons, auctions = load.parsed[topics.persons], load.parsed[topics.auctions]
    report = verify_nexmark(outputs, persons, auctions, cfg.window_ms)
    status.done()
    return WorkloadRun("nexmark", config, load, samples, report, failure,
                       state_bytes=nexmark_state_bytes(persons, auctions, cfg.window_ms),
                       state_disk_bytes=peak // handle.plan.replicas, payload_bytes=cfg.payload_bytes)


RUNNERS = {"bettercloud": run_bettercloud, "nexmark": run_nexmark}


def run_one(stack: StackEndpoints, spark: Any, workload: str, config: Config, args: argparse.Namespace,
            status: StatusLine, state_root: Path) -> WorkloadRun:
    """One run; anything that breaks it is recorded as its failure."""
    try:
        return RUNNERS[workload](stack, spark, config, args, status, state_root)
    except Exception as err:  # noqa: BLE001 - recorded in the CSV, not hidden
        status.done()
        return WorkloadRun(workload, config, failure=one_line(err, ERROR_CHARS))


def result_row(r: WorkloadRun, warm_up_s: float) -> dict[str, Any]:
    """The CSV row of a run."""
    stats = Latencies(r.samples)
    lat = [s.sink - s.ingest for s in stats.steady(warm_up_s)]
    counts = r.report.counts() if r.report is not None else dict.fromkeys(COUNT_COLUMNS, "")

    def opt(v: float | None) -> float | str:
        return "" if v is None else v

    return {"workload": r.workload, "config": r.config.label,
            "offered_rate": r.load.rate if r.load else 0.0, "events": r.load.produced if r.load else 0,
            "expected": r.report.expected if r.report else "", "records": len(r.samples),
            "throughput": stats.throughput, "p50_ms": percentile(lat, .5) * MS, "p99_ms": percentile(lat, .99) * MS,
            "p999_ms": percentile(lat, .999) * MS, "max_ms": max(lat, default=0.0) * MS,
            "exact": "yes" if r.exact else "no", **counts,
            "state_mb": opt(r.state_bytes / MB if r.state_bytes is not None else None),
            "state_disk_peak_mb": opt(r.state_disk_bytes / MB if r.state_disk_bytes is not None else None),
            "payload_bytes": opt(r.payload_bytes), "outcome": r.outcome}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"configurations, comma-separated, of: {', '.join(MODES)}")
    ap.add_argument("--rate", type=float, default=200.0, help="input events/s of each run (all sources together)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of load per run")
    ap.add_argument("--period", type=int, default=10, help="LiveRobin heartbeat period (ms) of liverobin and passive")
    ap.add_argument("--warm-up", type=float, default=2.0, help="seconds dropped at the start of each run")
    ap.add_argument("--join-parallelism", type=int, default=1, help="partitions of each bettercloud join")
    ap.add_argument("--nexmark-state-mb", type=float, default=20.0,
                    help="logical state of the nexmark join at the end of a run (sets the payload)")
    ap.add_argument("--nexmark-payload", type=int, default=None, help="payload bytes per nexmark event (overrides)")
    ap.add_argument("--nexmark-window-ms", type=int, default=2000, help="tumbling window of the nexmark join")
    ap.add_argument("--state-cache-entries", type=int, default=200,
                    help="spark.replication.state.cacheEntries of every run: few, so that the state is in RocksDB "
                         "(the default 10,000 entries would hold the whole nexmark state in memory)")
    ap.add_argument("--seed", type=int, default=5, help="seed of the input generators")
    ap.add_argument("--state-dir", default=None, help="where the jobs keep their state (default: a temporary directory)")
    ap.add_argument("--out", default=str(REPO / "bench/results/workloads"))
    args = ap.parse_args(argv)
    for flag, allowed in (("workloads", WORKLOADS), ("modes", MODES)):
        chosen = [m.strip() for m in getattr(args, flag).split(",") if m.strip()]
        if unknown := [m for m in chosen if m not in allowed]:
            ap.error(f"--{flag}: unknown {', '.join(unknown)} (choose from {', '.join(allowed)})")
        setattr(args, flag, chosen)
    if args.rate <= 0 or args.duration <= 0:
        ap.error("--rate and --duration must be positive")
    return args


def run_benchmark(stack: StackEndpoints, spark: Any, args: argparse.Namespace, status: StatusLine,
                  state_root: Path) -> list[WorkloadRun]:
    """Every workload in every configuration, one after the other, on one stack and one Spark."""
    configs = latency_configs(args.modes, [args.period], args.period)
    todo = [(w, c) for w in args.workloads for c in configs]
    runs: list[WorkloadRun] = []
    t0 = time.monotonic()
    for i, (workload, config) in enumerate(todo):
        print(f"== run {i + 1}/{len(todo)}: {workload}, {config.label}, {args.rate:.0f} events/s for "
              f"{args.duration:.0f}s ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
        runs.append(run_one(stack, spark, workload, config, args, status, state_root))
        print("   " + format_row(result_row(runs[-1], args.warm_up)), flush=True)
        wait_for_executors(spark.sparkContext, 3, timeout=60)
    return runs


def write_results(out: Path, runs: list[WorkloadRun], args: argparse.Namespace) -> list[dict]:
    """``workloads.csv``, ``workloads.png`` and ``machine.txt`` under ``out``; returns the rows."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [result_row(r, args.warm_up) for r in runs]
    if rows:
        write_csv(out / "workloads.csv", rows)
        _plot(out / "workloads.png", rows, args.rate)
    write_machine(out)
    return rows


def print_table(rows: list[dict]) -> None:
    """The rows as a plain table, then why each inexact one is not exact."""
    cols = ["workload", "config", "p50_ms", "p99_ms", "throughput", "records", "exact", "state_mb",
            "state_disk_peak_mb"]
    cells = [[f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    for row in [cols, *cells]:
        padded = [v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        print("   " + "  ".join(padded))
    for r in rows:
        if r["exact"] != "yes":
            print(f"   {r['workload']} {r['config']}: {r['outcome']}")


def _plot(path: Path, rows: list[dict], rate: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.5 * len(workloads), 7.5), squeeze=False)
    for col, workload in enumerate(workloads):
        mine = [r for r in rows if r["workload"] == workload]
        xs = range(len(mine))
        ax = axes[0][col]
        for offset, key, label in ((-0.2, "p50_ms", "p50"), (0.2, "p99_ms", "p99")):
            ax.bar([x + offset for x in xs], [max(r[key], 0.1) for r in mine], width=0.4, label=label)
        for x, r in enumerate(mine):
            if r["exact"] != "yes":
                failed = r["outcome"].startswith("failed")
                inexact = any(r[c] not in ("", 0) for c in COUNT_COLUMNS)
                what = ", ".join(w for w, on in (("job failed", failed), ("not exact", inexact)) if on)
                ax.annotate(what, (x, max(r["p99_ms"], 0.1)), ha="center", va="bottom", color="red", fontsize=8)
        title = f"{workload} at {rate:.0f} events/s"
        states = [r["state_mb"] for r in mine if r["state_mb"] != ""]
        if states:
            title += f", join state {max(states):,.0f} MB"
        ax.set(ylabel="source→sink latency (ms)", yscale="log", title=title)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v > 0 and f"{v:.0e}"[0] in "25" else ""))
        ax.set_xticks(list(xs), [r["config"] for r in mine], fontsize=8)
        ax.grid(alpha=.3, which="both", axis="y")
        ax.legend(fontsize="small")
        ax = axes[1][col]
        ax.bar(list(xs), [r["throughput"] for r in mine], color=["C2" if r["exact"] == "yes" else "C3" for r in mine])
        ax.set(ylabel="output records/s (red: not exact)", title=f"{workload}: throughput")
        ax.set_xticks(list(xs), [r["config"] for r in mine], fontsize=8)
        ax.grid(alpha=.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    state_root = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="bench-workloads-"))
    status = StatusLine()
    t0 = time.monotonic()
    try:
        with EmbeddedStack() as stack:
            spark = build_session("local-cluster[3,1,512]", app_name="bench-workloads")
            try:
                runs = run_benchmark(stack, spark, args, status, state_root)
            finally:
                stop_session(spark)
    finally:
        if not args.state_dir:
            shutil.rmtree(state_root, ignore_errors=True)
    rows = write_results(out, runs, args)
    print_table(rows)
    print(f"wrote {out}/workloads.csv, workloads.png in {time.monotonic() - t0:.0f}s")
    bad = [f"{r['workload']} {r['config']}" for r in rows if r["config"] != "unordered" and r["exact"] != "yes"]
    if bad:
        print(f"NOT EXACT: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
