"""What an executor JVM's start costs, with the JVM's defaults and with the project's executor options.

    .venv/bin/python bench/executor_start.py [--rounds 2] [--executors 2] [--idle-seconds 30]

A replacement executor starts on the same hosts as the replicas that mask the failure it follows,
so its start is taken from them.  For each option set (alternating, ``--rounds`` times): a Spark
``local-cluster`` session whose executors run with ``spark.executor.extraJavaOptions`` set to it,
one Python task per executor, then each executor JVM's CPU seconds so far (its start) and its cores
over ``--idle-seconds`` with nothing to do.  Writes ``executor_start.csv`` and prints the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, pid_ticks, write_csv, write_machine  # noqa: E402
from deploy.stack import require_java17  # noqa: E402
from replication.spark_cluster import (  # noqa: E402
    EXECUTOR_JAVA_OPTIONS,
    build_session,
    executor_jvm_pids,
    stop_session,
    wait_for_executors,
)

OPTION_SETS = {"jvm defaults": "", "project": EXECUTOR_JAVA_OPTIONS}


def measure(label: str, options: str, executors: int, idle_s: float) -> list[dict]:
    hz = os.sysconf("SC_CLK_TCK")
    t0 = time.monotonic()
    spark = build_session(f"local-cluster[{executors},1,1024]", app_name="bench-executor-start",
                          conf={"spark.executor.extraJavaOptions": options})
    try:
        sc = spark.sparkContext
        wait_for_executors(sc, executors, timeout=120)
        sc.parallelize(range(executors), executors).map(lambda x: x).collect()
        ready_s = time.monotonic() - t0
        pids = executor_jvm_pids(sc)
        started = {e: pid_ticks(p) / hz for e, p in pids.items()}
        time.sleep(idle_s)
        return [{"options": label, "executor": e, "start_cpu_s": started[e],
                 "idle_cores": (pid_ticks(p) / hz - started[e]) / idle_s, "session_ready_s": ready_s}
                for e, p in sorted(pids.items())]
    finally:
        stop_session(spark)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--out", default=str(REPO / "bench/results/executor_start"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    rows: list[dict] = []
    for n in range(args.rounds):
        for label, options in OPTION_SETS.items():
            got = measure(label, options, args.executors, args.idle_seconds)
            for row in got:
                row["round"] = n + 1
                print("   " + format_row(row), flush=True)
            rows += got
    write_csv(out / "executor_start.csv", rows, digits=4)
    write_machine(out)
    for label in OPTION_SETS:
        mine = [r for r in rows if r["options"] == label]
        print(f"{label} ({OPTION_SETS[label] or 'none'}): start {statistics.median(r['start_cpu_s'] for r in mine):.2f} "
              f"CPU-s per executor (range {min(r['start_cpu_s'] for r in mine):.2f}-"
              f"{max(r['start_cpu_s'] for r in mine):.2f}), idle {statistics.median(r['idle_cores'] for r in mine):.4f} "
              f"cores per executor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
