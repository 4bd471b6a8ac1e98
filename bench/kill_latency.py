"""Latency around an executor kill with replication on (the paper's Fig. 14/16 shape, one mode).

    .venv/bin/python bench/kill_latency.py [--rate 800] [--duration 30] [--victims 'fraud-rule[0]r0,decisions-sink[0]r0']

The replicated fraud job (source -> keyed rule -> exactly-once sink, every partition
twice) under steady load; halfway through, the executor hosting the victim replica is
SIGKILLed with the kill tooling.  Every run is verified record by record.  Writes
``timeline.csv`` (per-second p50/p99 relative to the kill), ``summary.csv`` (p99 before,
worst after, seconds above 2x the steady p99, failover events) and ``kill_latency.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from ops.demo import kill_replica_executor  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from ops.workload import percentile, run_fraud_workload  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402

MS = 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=800.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--victims", default="fraud-rule[0]r0,decisions-sink[0]r0")
    ap.add_argument("--out", default=str(REPO / "bench/results/kill_latency"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    timeline, summary = [], []
    with EmbeddedStack() as stack:
        spark = build_session("local-cluster[3,1,512]", app_name="bench-kill-latency")
        try:
            for victim in args.victims.split(","):
                print(f"== {victim}: {args.rate:.0f} events/s for {args.duration:.0f}s, kill at "
                      f"{args.duration / 2:.0f}s", flush=True)
                rep = run_fraud_workload(stack.bootstrap_servers, spark, rate=args.rate, duration_s=args.duration,
                                         replicated=True, fault=lambda h, v=victim: kill_replica_executor(h, v),
                                         fault_at_s=args.duration / 2, status=StatusLine())
                assert rep.fault_at is not None
                rows = rep.per_second(origin=rep.fault_at)
                for sec, lat in rep.by_second(origin=rep.fault_at).items():
                    timeline.append({"victim": victim, "second": sec, "count": len(lat),
                                     "p99_ms": percentile(lat, .99) * MS, "p50_ms": percentile(lat, .5) * MS})
                before = [s.sink - s.ingest for s in rep.samples if -8 <= s.ingest - rep.fault_at < -1]
                steady_p99 = percentile(before, .99)
                after = [(sec, p99) for sec, _, p99 in rows if 0 <= sec <= 10]
                row = {"victim": victim, "exact": rep.exact, "records": rep.decisions,
                       "p99_before_ms": steady_p99 * MS, "worst_p99_after_ms": max(p for _, p in after) * MS,
                       "seconds_above_2x": sum(1 for _, p in after if p > 2 * steady_p99),
                       "events": " | ".join(f"{t - rep.fault_at:+.2f}s {e}" for t, e in rep.result.events)}
                summary.append(row)
                print("   " + format_row(row, skip=("events",)), flush=True)
        finally:
            stop_session(spark)
    write_csv(out / "timeline.csv", timeline)
    write_csv(out / "summary.csv", summary)
    _plot(out, timeline, summary)
    write_machine(out)
    print(f"wrote {out}/timeline.csv, summary.csv, kill_latency.png")
    return 0 if all(r["exact"] for r in summary) else 1


def _plot(out: Path, timeline: list[dict], summary: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4))
    for row in summary:
        pts = [t for t in timeline if t["victim"] == row["victim"] and -10 <= t["second"] <= 12]
        ax.plot([t["second"] for t in pts], [t["p99_ms"] for t in pts], marker=".",
                label=f"kill executor of {row['victim']} (exact: {row['exact']})")
    ax.axvline(0, color="red", linestyle="--", linewidth=1)
    ax.text(0.1, ax.get_ylim()[1] * 0.9, "SIGKILL", color="red")
    ax.set(xlabel="seconds since the kill", ylabel="per-second p99 source→sink (ms)",
           title="Replicated fraud job: latency around an executor kill (unordered mode, 2 cores)")
    ax.legend()
    ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(out / "kill_latency.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
