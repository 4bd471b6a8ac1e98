"""The paper's micro-benchmarks MiB 2 and MiB 3 (paper 004 §VII, Fig. 12 and 13) on the ordered job.

    .venv/bin/python bench/mib.py [--modes off,unordered,liverobin,kazoo] [--period 10]
                                  [--partitions 1,2,3,4] [--rate 400]
                                  [--rates-a 5,50,500] [--rate-b 5] [--duration 10]
                                  [--out bench/results/mib]

(MiB 1, a pipeline of 1-3 identity maps, is ``bench/ordering.py``'s latency runs.)

* **MiB 2, task parallelism.** The hash-chain task at 1, 2, 3 and 4 partitions (``--partitions``),
  fed by the union of topics a and b (2 partitions each, events 2:1) at ``--rate`` events/s. With
  one partition, each replica of the task merges 4 channels (one per source partition), as with
  more: the paper's point, that parallelism changes little except for LiveRobin with a single
  *upstream* partition, is about the number of input channels, which here stays 4.
* **MiB 3, unbalanced sources.** The chain task at one partition (one merge) with topic b at
  ``--rate-b`` events/s (5) and topic a at each of ``--rates-a`` (5, 50, 500): LiveRobin's merge waits
  for the slow source's pulses, KaZoo's leader orders what is there.

Each run: p50/p99 source→sink (ingest time; the first ``--warm-up`` seconds dropped), throughput, and
whether the output is exact (every event once, every chain links up; ``unordered`` may diverge, by
design). Writes ``mib.csv`` and ``mib.png`` (p50/p99 by partitions and by a's rate, per configuration).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, write_csv, write_machine  # noqa: E402
from bench.ordering import MODES, _plain_log_axis, latency_configs, latency_row, run_ordered  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402

MIB_MODES = ("off", "unordered", "liverobin", "kazoo")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MIB_MODES), help=f"configurations, of: {', '.join(MODES)}")
    ap.add_argument("--period", type=int, default=10, help="liverobin heartbeat period (ms)")
    ap.add_argument("--partitions", default="1,2,3,4", help="MiB 2: partitions of the chain task ('' to skip)")
    ap.add_argument("--rate", type=float, default=400, help="MiB 2: offered events/s (2:1 into a and b)")
    ap.add_argument("--rates-a", default="5,50,500", help="MiB 3: events/s into topic a ('' to skip)")
    ap.add_argument("--rate-b", type=int, default=5, help="MiB 3: events/s into topic b")
    ap.add_argument("--duration", type=float, default=10, help="seconds of load per run")
    ap.add_argument("--warm-up", type=float, default=2.0, help="seconds dropped at the start of each run")
    ap.add_argument("--out", default=str(REPO / "bench/results/mib"))
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in args.modes if m not in MODES]:
        ap.error(f"--modes: unknown {', '.join(unknown)} (of {', '.join(MODES)})")
    args.partitions, args.rates_a = _ints(args.partitions), _ints(args.rates_a)
    if any(p < 1 for p in args.partitions) or any(r < 1 for r in args.rates_a) or args.rate_b < 1:
        ap.error("partitions and rates must be positive")
    return args


def mib3_weights(rate_a: int, rate_b: int) -> tuple[int, int]:
    """The round-robin weights (a, b) of the load generator for those two rates (in lowest terms)."""
    from math import gcd

    g = gcd(rate_a, rate_b)
    return rate_a // g, rate_b // g


def plan_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run: shape, configuration, chain partitions, total rate and a:b weights."""
    configs = latency_configs(args.modes, [args.period], args.period)
    runs = [{"shape": "MiB 2", "config": c, "partitions": p, "rate": args.rate, "weights": (2, 1),
             "rate_a": args.rate * 2 / 3, "rate_b": args.rate / 3} for p in args.partitions for c in configs]
    runs += [{"shape": "MiB 3", "config": c, "partitions": 1, "rate": float(ra + args.rate_b),
              "weights": mib3_weights(ra, args.rate_b), "rate_a": float(ra), "rate_b": float(args.rate_b)}
             for ra in args.rates_a for c in configs]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    status = StatusLine()
    runs = plan_runs(args)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with EmbeddedStack() as stack:
        spark = build_session("local-cluster[3,1,512]", app_name="bench-mib")
        try:
            for i, run in enumerate(runs):
                config = run["config"]
                print(f"== {run['shape']} run {i + 1}/{len(runs)}: {config.label}, chain partitions "
                      f"{run['partitions']}, a {run['rate_a']:.0f}/s + b {run['rate_b']:.0f}/s for "
                      f"{args.duration:.0f}s ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
                r = run_ordered(stack, spark, config, pipeline=1, rate=run["rate"], duration_s=args.duration,
                                status=status, parallelism=run["partitions"], weights=run["weights"])
                row = {"shape": run["shape"], "partitions": run["partitions"], "rate_a": run["rate_a"],
                       "rate_b": run["rate_b"], **latency_row(r, args.warm_up)}
                rows.append(row)
                print("   " + format_row(row, skip=tuple(k for k in row if k.startswith(("cpu", "net", "window")))),
                      flush=True)
        finally:
            stop_session(spark)
    write_csv(out / "mib.csv", rows)
    write_machine(out)
    plot(out, rows)
    print(f"wrote {out}/mib.csv, mib.png in {time.monotonic() - t0:.0f}s")
    bad = [f"{r['shape']} {r['config']} p={r['partitions']} a={r['rate_a']:.0f}/s" for r in rows
           if r["config"] != "unordered" and r["exact"] != "yes"]
    if bad:
        print(f"NOT EXACT: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


def plot(out: Path, rows: list[dict[str, Any]]) -> None:
    """``mib.png``: MiB 2 p50/p99 by partitions, MiB 3 p50/p99 by topic a's rate, per configuration."""
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, shape, x, xlabel in ((axes[0], "MiB 2", "partitions", "partitions of the chain task"),
                                 (axes[1], "MiB 3", "rate_a", "topic a events/s (topic b fixed)")):
        pts = [r for r in rows if r["shape"] == shape]
        for label in dict.fromkeys(r["config"] for r in pts):
            mine = [r for r in pts if r["config"] == label]
            exact = all(r["exact"] == "yes" for r in mine)
            (line,) = ax.plot([r[x] for r in mine], [r["p99_ms"] for r in mine], "o-" if exact else "x--",
                              label=f"{label} p99" + ("" if exact else " (not exact)"))
            ax.plot([r[x] for r in mine], [r["p50_ms"] for r in mine], ":", color=line.get_color(),
                    label=f"{label} p50")
        ax.set(xlabel=xlabel, ylabel="source→sink latency (ms)", yscale="log", title=shape)
        if shape == "MiB 3" and pts:
            ax.set_xscale("log")
            ax.set_xticks(sorted({r[x] for r in pts}), [f"{r[x]:g}" for r in sorted(pts, key=lambda r: r[x])
                                                         if r["config"] == pts[0]["config"]])
            ax.set_title(f"MiB 3: one merge, topic b at {pts[0]['rate_b']:.0f} events/s")
        elif pts:
            ax.set_xticks(sorted({r[x] for r in pts}))
            ax.set_title(f"MiB 2: {pts[0]['offered_rate']:.0f} events/s")
        _plain_log_axis(ax.yaxis)
        ax.grid(alpha=.3, which="both")
        ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(out / "mib.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
