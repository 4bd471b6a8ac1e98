"""LiveRobin vs unordered vs no replication: latency of an order-sensitive job, and around a kill.

    .venv/bin/python bench/liverobin.py [--rate 400] [--duration 12] [--periods 5,10,50] [--pipelines 1,2,3]
                                        [--kill-duration 20] [--out bench/results/liverobin]

The ordered job of :mod:`replication.examples.ordered` (two topics of 2 partitions, events
split 2:1 between them -> union -> key_by -> hash chain per key -> L-1 identity maps fed round
robin -> exactly-once sink) at a fixed offered rate, on one embedded stack and one
``local-cluster[3,1,512]`` Spark for everything.  Configurations: ``off`` (no replication),
``unordered`` (replicated, first come first served: the replicas of multi-input tasks diverge)
and ``liverobin`` (replicated, deterministic merge) at each heartbeat period.

1. Latency: every configuration at every pipeline length L; per run p50/p99/p99.9 of sink time
   minus ingest time (the first ``--warm-up`` seconds dropped), throughput, and whether the
   output is exact (:func:`verify_chains`: every event once, every key's chain links up).
2. Kill: L=1, ``off``, ``unordered`` and ``liverobin`` (``--kill-period``) under the same load for
   ``--kill-duration`` seconds; at half time the executor hosting ``chain[0]r0`` is SIGKILLed.
   Per-second p99 by ingest second relative to the kill; without replication the job fails
   (reported, not hidden).

Writes ``latency.csv``, ``latency.png``, ``kill_timeline.csv``, ``kill_summary.csv``,
``kill_timeline.png`` and ``machine.txt``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from deploy.topics import create_topics, read_all  # noqa: E402
from replication.demo import kill_replica_executor  # noqa: E402
from replication.driver import JobFailedError, run  # noqa: E402
from replication.examples.ordered import ChainReport, build_ordered_job, make_events, verify_chains  # noqa: E402
from replication.loadgen import LoadResult, generate_load  # noqa: E402
from replication.progress import StatusLine  # noqa: E402
from replication.spark_cluster import build_session, stop_session, wait_for_executors  # noqa: E402
from replication.workload import Latencies, Sample, percentile, sample_of  # noqa: E402

MS = 1000.0
KEYS = 30  # hash chains (keys) per run
VICTIM = "chain[0]r0"


@dataclass(frozen=True)
class Config:
    label: str  # off | unordered | liverobin <p>ms
    replicated: bool
    period_ms: int | None = None  # liverobin only

    def conf(self, bootstrap: str) -> dict[str, str]:
        conf = {"spark.replication.kafka.bootstrapServers": bootstrap}
        if self.replicated:
            conf["spark.replication.enabled"] = "true"
            conf["spark.replication.mode"] = "unordered" if self.period_ms is None else "liverobin"
        if self.period_ms is not None:
            conf["spark.replication.liverobin.heartbeatPeriod"] = f"{self.period_ms}ms"
        return conf


@dataclass
class OrderedRun:
    """One run of the ordered job: what was produced, what came out, how it ended."""

    config: Config
    pipeline: int
    load: LoadResult
    samples: list[Sample]
    chains: ChainReport
    failure: str | None = None  # the job failed (or did not end): why
    fault_at: float | None = None  # wall clock of the kill
    fault: str = ""
    events: list[tuple[float, str]] = field(default_factory=list)

    @property
    def report(self) -> Latencies:
        """The samples with the per-second and warm-up helpers."""
        return Latencies(self.samples)

    @property
    def exact(self) -> bool:
        return self.failure is None and self.chains.exact

    @property
    def outcome(self) -> str:
        """``yes``, ``diverged: N broken chains``, ``job failed: ...`` and / or what is missing or duplicated."""
        c = self.chains
        parts = [f"job failed: {self.failure}"] if self.failure else []
        if c.missing or c.duplicated or c.unexpected:
            parts.append(f"{len(c.missing)} missing, {len(c.duplicated)} duplicated, {len(c.unexpected)} unexpected")
        if c.broken:
            parts.append(f"diverged: {len(c.broken)} broken chains (of {c.keys})")
        return "; ".join(parts) or "yes"

    def checks(self) -> dict[str, Any]:
        """The verification columns of a CSV row."""
        return {"exact": "yes" if self.exact else "no", "missing": len(self.chains.missing),
                "duplicated": len(self.chains.duplicated), "broken_chains": len(self.chains.broken),
                "outcome": self.outcome}


def run_ordered(bootstrap: str, spark: Any, config: Config, *, pipeline: int, rate: float, duration_s: float,
                status: StatusLine, kill_at_s: float | None = None) -> OrderedRun:
    """Start the ordered job (``identity_maps=pipeline-1``), produce ``rate`` events/s for ``duration_s``
    (2:1 into topics a and b), drain, read and verify the output; optionally kill ``VICTIM``'s executor."""
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topic_a, topic_b, out = f"lr{stamp}-a", f"lr{stamp}-b", f"lr{stamp}-out"
    create_topics(bootstrap, {topic_a: 2, topic_b: 2})
    name = f"lr-{config.label.replace(' ', '')}-L{pipeline}-{stamp}"
    handle = run(build_ordered_job(topic_a, topic_b, out, name=name, identity_maps=pipeline - 1),
                 spark=spark, conf=config.conf(bootstrap))
    handle.wait_started(120)

    counters = {"a": 0, "b": 0}

    def make(source: str) -> Callable[[int], tuple[bytes, bytes, str]]:
        def f(ts: int) -> tuple[bytes, bytes, str]:
            i = counters[source]
            counters[source] += 1
            # make_events numbers event i with ts = start_ts + i ms: start so that its ts is the wall clock
            key, value = make_events(source, 1, KEYS, start_ts=ts - i, first=i)[0]
            return key, value, f"{source}-{i}"
        return f

    def job_status() -> str:
        m = handle.sink_metrics()
        return (f"{config.label} L={pipeline}: {m.records_out // handle.plan.replicas:,} out, "
                f"p99 {m.latency.percentile(0.99) * MS:.0f} ms")

    injected: dict[str, Any] = {}
    timer = None
    if kill_at_s is not None:
        def inject() -> None:
            injected["at"] = time.time()
            try:
                injected["what"] = kill_replica_executor(handle, VICTIM)
            except Exception as err:  # noqa: BLE001 - reported in the summary
                injected["what"] = f"kill failed: {type(err).__name__}: {err}"
        timer = threading.Timer(kill_at_s, inject)
        timer.start()
    make_a = make("a")
    load = generate_load(bootstrap, [(topic_a, make_a), (topic_a, make_a), (topic_b, make("b"))],
                         rate=rate, duration_s=duration_s, status=status, extra_status=job_status)
    if timer is not None:
        timer.join()
    status.update(f"{config.label} L={pipeline}: draining")
    failure = None
    try:
        result = handle.drain(timeout=180)
        events = result.events
    except (JobFailedError, TimeoutError) as err:
        failure = str(err)
        events = list(handle.master.events)
        if handle.running:
            try:
                handle.stop(30)
            except (JobFailedError, TimeoutError):
                pass
    status.update(f"{config.label} L={pipeline}: reading and verifying the output")
    raw = read_all(bootstrap, out)
    outputs, samples = [], []
    for r in raw:
        outputs.append(json.loads(r.value))
        samples.append(sample_of(r))
    event_ids = load.parsed[topic_a] + load.parsed[topic_b]
    status.done()
    return OrderedRun(config, pipeline, load, samples, verify_chains(outputs, event_ids), failure,
                      injected.get("at"), injected.get("what", ""), events)


def latency_row(r: OrderedRun, warm_up_s: float) -> dict:
    lat = [s.sink - s.ingest for s in r.report.steady(warm_up_s)]
    return {"pipeline": r.pipeline, "config": r.config.label, "offered_rate": r.load.rate,
            "records": len(r.samples), "throughput": r.report.throughput,
            "p50_ms": percentile(lat, .5) * MS, "p99_ms": percentile(lat, .99) * MS,
            "p999_ms": percentile(lat, .999) * MS, "max_ms": max(lat, default=0.0) * MS, **r.checks()}


def kill_rows(r: OrderedRun, warm_up_s: float) -> tuple[list[dict], dict]:
    """Per-second rows relative to the kill and the summary row of one kill run."""
    assert r.fault_at is not None
    rep = r.report
    timeline = [{"config": r.config.label, "second": sec, "count": len(lat),
                 "p50_ms": percentile(lat, .5) * MS, "p99_ms": percentile(lat, .99) * MS}
                for sec, lat in rep.by_second(origin=r.fault_at).items()]
    first = min((s.ingest for s in r.samples), default=r.fault_at)
    lo = max(-8.0, first + warm_up_s - r.fault_at)
    before = [s.sink - s.ingest for s in r.samples if lo <= s.ingest - r.fault_at < -1]
    steady = percentile(before, .99)
    after = [(t["second"], t["p99_ms"] / MS) for t in timeline if 0 <= t["second"] <= 10]
    worst = max(after, key=lambda x: x[1], default=(None, 0.0))
    summary = {"config": r.config.label, **r.checks(), "records": len(r.samples), "produced": r.load.produced,
               "p99_before_ms": steady * MS, "worst_p99_after_ms": worst[1] * MS,
               "worst_second": worst[0] if worst[0] is not None else "",
               "stall_seconds": sum(1 for _, p in after if p > 2 * steady),
               "seconds_after": len(after), "killed": r.fault,
               "events": " | ".join(f"{t - r.fault_at:+.2f}s {e}" for t, e in r.events)}
    return timeline, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=400.0, help="offered events/s (2:1 into topics a and b)")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds of load per latency run")
    ap.add_argument("--periods", default="5,10,50", help="liverobin heartbeat periods (ms), comma-separated")
    ap.add_argument("--pipelines", default="1,2,3", help="pipeline lengths L (identity_maps = L-1)")
    ap.add_argument("--kill-duration", type=float, default=20.0, help="seconds of load per kill run (0: none)")
    ap.add_argument("--kill-period", type=int, default=10, help="liverobin heartbeat period (ms) of the kill run")
    ap.add_argument("--warm-up", type=float, default=2.0, help="seconds dropped at the start of each run")
    ap.add_argument("--out", default=str(REPO / "bench/results/liverobin"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [Config("off", False), Config("unordered", True),
               *(Config(f"liverobin {int(p)}ms", True, int(p)) for p in args.periods.split(","))]
    pipelines = [int(x) for x in args.pipelines.split(",")]
    kill_configs = [Config("off", False), Config("unordered", True),
                    Config(f"liverobin {args.kill_period}ms", True, args.kill_period)]
    require_java17()
    status = StatusLine()
    rows: list[dict] = []
    timeline: list[dict] = []
    summary: list[dict] = []
    t0 = time.monotonic()
    with EmbeddedStack() as stack:
        spark = build_session("local-cluster[3,1,512]", app_name="bench-liverobin")
        try:
            runs = [(pl, c) for pl in pipelines for c in configs]
            for i, (pl, config) in enumerate(runs):
                print(f"== latency run {i + 1}/{len(runs)}: {config.label}, L={pl}, {args.rate:.0f} events/s "
                      f"for {args.duration:.0f}s ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
                r = run_ordered(stack.bootstrap_servers, spark, config, pipeline=pl, rate=args.rate,
                                duration_s=args.duration, status=status)
                rows.append(latency_row(r, args.warm_up))
                print("   " + format_row(rows[-1]), flush=True)
            if args.kill_duration > 0:
                for i, config in enumerate(kill_configs):
                    print(f"== kill run {i + 1}/{len(kill_configs)}: {config.label}, L=1, {args.rate:.0f} events/s "
                          f"for {args.kill_duration:.0f}s, SIGKILL the executor of {VICTIM} at "
                          f"{args.kill_duration / 2:.0f}s ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
                    r = run_ordered(stack.bootstrap_servers, spark, config, pipeline=1, rate=args.rate,
                                    duration_s=args.kill_duration, status=status, kill_at_s=args.kill_duration / 2)
                    if r.fault_at is None:
                        raise RuntimeError(f"{config.label}: the kill did not happen")
                    tl, row = kill_rows(r, args.warm_up)
                    timeline += tl
                    summary.append(row)
                    print("   " + format_row(row, skip=("events", "killed")) + f"\n   killed: {r.fault}", flush=True)
                    status.update("waiting for the replacement executor")
                    wait_for_executors(spark.sparkContext, 3, timeout=60)
                    status.done()
        finally:
            stop_session(spark)
    write_csv(out / "latency.csv", rows)
    if summary:
        write_csv(out / "kill_timeline.csv", timeline)
        write_csv(out / "kill_summary.csv", summary)
    _plot(out, rows, timeline, summary, args.rate)
    write_machine(out)
    print(f"wrote {out}/latency.csv, latency.png, kill_timeline.csv, kill_summary.csv, kill_timeline.png "
          f"in {time.monotonic() - t0:.0f}s")
    # off and liverobin must be exact; unordered may diverge and off may fail at the kill (reported)
    bad = [f"{r['config']} L={r['pipeline']}" for r in rows if r["config"] != "unordered" and r["exact"] != "yes"]
    bad += [f"kill {s['config']}" for s in summary if s["config"].startswith("liverobin") and s["exact"] != "yes"]
    if bad:
        print(f"NOT EXACT: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


def _plot(out: Path, rows: list[dict], timeline: list[dict], summary: list[dict], rate: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    def plain_log_axis(ax: Any) -> None:
        """Log y axis labelled 20, 50, 100, 200, ... instead of powers of ten."""
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if v > 0 and f"{v:.0e}"[0] in "25" else ""))

    labels = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, col, title in zip(axes, ("p50_ms", "p99_ms"), ("p50", "p99"), strict=True):
        for label in labels:
            pts = [r for r in rows if r["config"] == label]
            exact = all(r["exact"] == "yes" for r in pts)
            ax.plot([r["pipeline"] for r in pts], [r[col] for r in pts], "o-" if exact else "x--",
                    label=label + ("" if exact else " (output not exact)"))
        ax.set(xlabel="pipeline length L (tasks between the chain and the sink + 1)",
               ylabel="source→sink latency (ms)", yscale="log",
               title=f"{title}, ordered job at {rate:.0f} events/s")
        ax.set_xticks(sorted({r["pipeline"] for r in rows}))
        plain_log_axis(ax)
        ax.grid(alpha=.3, which="both")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    if not summary:
        return
    fig, ax = plt.subplots(figsize=(13, 4))
    for row in summary:
        pts = [t for t in timeline if t["config"] == row["config"] and -10 <= t["second"] <= 12]
        if row["outcome"].startswith("job failed"):
            verdict = "job failed at the kill"
        elif row["exact"] == "yes":
            verdict = "exact"
        else:
            verdict = (f"{row['missing']} missing, {row['duplicated']} duplicated, "
                       f"{row['broken_chains']} broken chains")
        ax.plot([t["second"] for t in pts], [t["p99_ms"] for t in pts], marker=".",
                label=f"{row['config']}: {verdict}")
    ax.axvline(0, color="red", linestyle="--", linewidth=1)
    ax.text(0.1, 0.95, f"SIGKILL executor of {VICTIM}", color="red", transform=ax.get_xaxis_transform())
    ax.set(xlabel="seconds since the kill (by ingest time)", ylabel="per-second p99 source→sink (ms)",
           yscale="log", title=f"Ordered job (L=1) at {rate:.0f} events/s: latency around an executor kill (2 cores)")
    plain_log_axis(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    ax.grid(alpha=.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "kill_timeline.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
