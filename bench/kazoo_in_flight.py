"""KaZoo's fault-free latency by the number of order records a leader may have in flight.

    .venv/bin/python bench/kazoo_in_flight.py [--in-flight 1,2,4] [--runs 2] [--out DIR]

The ordered two-source job (``bench/ordering.py``'s) in ``kazoo`` mode at ``--rate`` events/s for
``--duration`` s, once per setting of ``kazoo.maxInFlight`` (each with ``kazoo.pipelineBelow`` at
its default), ``--runs`` rounds, the settings alternating within a round; each run on an embedded
stack of its own, one Spark throughout.  Per run: p50 / p99 from the source's read to the sink's
write (``bench/ordering.py``'s latency), whether the output is exact, and the order records the
leaders wrote.  Writes ``in_flight.csv`` and ``machine.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, write_csv, write_machine  # noqa: E402
from bench.ordering import latency_configs, latency_row, run_ordered  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in-flight", default="1,2,4", help="kazoo.maxInFlight settings, comma-separated")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--out", default=str(REPO / "bench/results/kazoo-in-flight"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    base = latency_configs(["kazoo"], [10])[0]
    rows = []
    spark = build_session("local-cluster[3,1,512]", app_name="bench-kazoo-in-flight")
    try:
        for run in range(args.runs):
            for n in (int(x) for x in args.in_flight.split(",") if x):
                config = dataclasses.replace(base, label=f"kazoo in-flight {n}",
                                             extra_conf=(("spark.replication.kazoo.maxInFlight", str(n)),))
                with EmbeddedStack() as stack:
                    r = run_ordered(stack, spark, config, pipeline=1, rate=args.rate, duration_s=args.duration,
                                    status=StatusLine())
                row = {"run": run + 1, "max_in_flight": n, "orders": r.orders_published, **latency_row(r, 2.0)}
                rows.append(row)
                print(format_row(row, skip=("outcome",)), flush=True)
                write_csv(out / "in_flight.csv", rows)
    finally:
        stop_session(spark)
    write_machine(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
