"""Baseline: the fraud job without replication, at several offered rates.

    .venv/bin/python bench/baseline.py [--rates 500,1000,2000,3000] [--duration 15] [--out bench/results/baseline]

One embedded stack and one ``local-cluster[3,1,512]`` Spark for the whole sweep.
Every run is verified record by record against the reference (a run that is not
exact is reported as such).  Writes ``summary.csv`` (one row per rate),
``timeline.csv`` (per-second p99 per rate) and ``latency_vs_rate.png`` /
``timeline.png``.  Latency = sink write time minus source ingest time (one clock);
``e2e`` also includes the broker (sink time minus production time).  The first
``--warm-up`` seconds of each run are dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from ops.workload import percentile, run_fraud_workload  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402

MS = 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="500,1000,2000,3000", help="offered events/s, comma-separated")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of load per rate")
    ap.add_argument("--warm-up", type=float, default=3.0, help="seconds dropped at the start of each run")
    ap.add_argument("--executors", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench/results/baseline"))
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    status = StatusLine()
    rows, timeline = [], []
    with EmbeddedStack() as stack:
        spark = build_session(f"local-cluster[{args.executors},1,512]", app_name="bench-baseline")
        try:
            for i, rate in enumerate(rates):
                print(f"== run {i + 1}/{len(rates)}: {rate:.0f} events/s for {args.duration:.0f}s", flush=True)
                rep = run_fraud_workload(stack.bootstrap_servers, spark, rate=rate, duration_s=args.duration,
                                         status=status)
                steady = rep.steady(args.warm_up)
                lat = [s.sink - s.ingest for s in steady]
                e2e = [s.sink - s.produced for s in steady]
                row = {"offered_rate": rate, "produced": rep.load.produced, "achieved_load_rate": round(rep.load.rate, 1),
                       "throughput": round(rep.throughput, 1), "exact": rep.exact,
                       "p50_ms": percentile(lat, .5) * MS, "p99_ms": percentile(lat, .99) * MS,
                       "p999_ms": percentile(lat, .999) * MS, "max_ms": max(lat, default=0) * MS,
                       "e2e_p50_ms": percentile(e2e, .5) * MS, "e2e_p99_ms": percentile(e2e, .99) * MS}
                rows.append(row)
                print("   " + format_row(row), flush=True)
                for sec, count, p99 in rep.per_second():
                    timeline.append({"offered_rate": rate, "second": sec, "count": count, "p99_ms": p99 * MS})
        finally:
            stop_session(spark)
    write_csv(out / "summary.csv", rows)
    write_csv(out / "timeline.csv", timeline)
    _plot(out, rows, timeline)
    write_machine(out)
    print(f"wrote {out}/summary.csv, timeline.csv, latency_vs_rate.png, timeline.png")
    return 0 if all(r["exact"] for r in rows) else 1


def _plot(out: Path, rows: list[dict], timeline: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["offered_rate"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(rates, [r["p50_ms"] for r in rows], "o-", label="p50 source→sink")
    ax1.plot(rates, [r["p99_ms"] for r in rows], "o-", label="p99 source→sink")
    ax1.plot(rates, [r["e2e_p99_ms"] for r in rows], "s--", label="p99 produced→sink")
    ax1.set(xlabel="offered rate (events/s)", ylabel="latency (ms)", yscale="log",
            title="Latency vs offered rate (no replication)")
    ax1.legend()
    ax1.grid(alpha=.3)
    ax2.plot(rates, [r["throughput"] for r in rows], "o-", label="through the job")
    ax2.plot(rates, rates, ":", color="grey", label="offered")
    ax2.set(xlabel="offered rate (events/s)", ylabel="events/s", title="Throughput")
    ax2.legend()
    ax2.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(out / "latency_vs_rate.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(11, 4))
    for rate in rates:
        pts = [t for t in timeline if t["offered_rate"] == rate]
        ax.plot([t["second"] for t in pts], [t["p99_ms"] for t in pts], label=f"{rate:.0f}/s")
    ax.set(xlabel="seconds since the first record", ylabel="per-second p99 (ms)", yscale="log",
           title="Per-second p99 latency over each run (no replication)")
    ax.legend(title="offered rate")
    ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
