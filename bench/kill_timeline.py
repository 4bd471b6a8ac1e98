"""What happens when, after an executor SIGKILL: the JVM exiting and gone, its Python processes gone,
the driver's verdict, and the sink's per-second p99 around it.

    .venv/bin/python bench/kill_timeline.py [--mode liverobin] [--rate 1000] [--duration 24] [--runs 1]

The ordered two-source job of ``bench/ordering.py`` on 3 executors; halfway through the load the
executor of the victim replica is SIGKILLed with the kill tooling while a thread samples, every
millisecond, the JVM's ``/proc`` state (``PF_EXITING``, zombie, gone), each Python process under it
and the driver's dead set.  Prints one timeline per run (ms after the signal) and writes
``timeline.csv``.  Every run is verified record by record.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench.ordering as ordering  # noqa: E402
from bench.common import write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from replication import procfs  # noqa: E402
from replication.chaos import locate  # noqa: E402
from replication.progress import StatusLine  # noqa: E402
from replication.spark_cluster import build_session, stop_session, wait_for_executors  # noqa: E402
from replication.workload import percentile  # noqa: E402

PF_EXITING = 0x4
MS = 1000.0


def _flags(pid: int) -> tuple[str, int] | None:
    """(state, flags) of ``pid`` or None when it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[6])


class Timeline:
    """First time (s after the signal) each watched fact became true."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()

    def mark(self, what: str, at: float) -> None:
        self.seen.setdefault(what, at)

    def watch(self, t0: float, jvm: int, pythons: dict[int, str], master: Any, worker: int) -> None:
        while not self.stop.is_set() and time.perf_counter() - t0 < 10:
            now = time.perf_counter() - t0
            got = _flags(jvm)
            if got is None:
                self.mark("jvm gone", now)
            else:
                state, flags = got
                if flags & PF_EXITING:
                    self.mark("jvm PF_EXITING", now)
                if state in ("Z", "X"):
                    self.mark("jvm zombie", now)
            for pid, name in pythons.items():
                got = _flags(pid)
                if got is None or got[0] in ("Z", "X"):
                    self.mark(f"{name} gone", now)
                elif got[1] & PF_EXITING:
                    self.mark(f"{name} exiting", now)
            if worker in master.dead:
                self.mark("driver: worker dead", now)
            time.sleep(0.001)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="liverobin", choices=["liverobin", "kazoo-follower", "kazoo-leader"])
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--duration", type=float, default=24.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "bench/results/kill_timeline"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    config = ordering.kill_configs([args.mode], 10)[0]
    rows: list[dict[str, Any]] = []
    real_kill = ordering.kill_replica_executor
    status = StatusLine()
    with EmbeddedStack() as stack:
        spark = build_session("local-cluster[3,1,1024]", app_name="kill-timeline")
        try:
            for n in range(args.runs):
                wait_for_executors(spark.sparkContext, 3, timeout=90)
                timeline = Timeline()

                def kill(handle: Any, victim: str, timeline: Timeline = timeline) -> str:
                    target = locate(victim, job=handle.job.name)
                    pythons = {p: ("daemon" if "daemon" in " ".join(procfs.cmdline(p)) else f"python {p}")
                               for p in procfs.descendants(target.jvm_pid) if procfs.is_python(p)}
                    if target.python_pid in pythons:
                        pythons[target.python_pid] = "worker (the replica's)"
                    t0 = time.perf_counter()
                    watcher = threading.Thread(target=timeline.watch, daemon=True,
                                               args=(t0, target.jvm_pid, pythons, handle.master, target.worker))
                    watcher.start()
                    what = real_kill(handle, victim)
                    timeline.mark("kill sent", time.perf_counter() - t0)
                    timeline.kill_wall = time.time() - (time.perf_counter() - t0)  # type: ignore[attr-defined]
                    return what

                ordering.kill_replica_executor = kill
                r = ordering.run_ordered(stack, spark, config, pipeline=1, rate=args.rate,
                                         duration_s=args.duration, status=status, kill_at_s=args.duration / 2)
                timeline.stop.set()
                status.done()
                checks = r.checks()
                at = getattr(timeline, "kill_wall", r.fault_at or 0.0)
                by_second: dict[int, list[float]] = {}
                for s in r.samples:
                    by_second.setdefault(int((s.produced - at) // 1), []).append((s.sink - s.produced) * MS)
                before = [v for sec, vs in by_second.items() if -8 <= sec < 0 for v in vs]
                print(f"== run {n + 1}: {r.fault}")
                print(f"   exact {checks}, p99 before {percentile(before, .99):.0f} ms")
                for what, t in sorted(timeline.seen.items(), key=lambda kv: kv[1]):
                    print(f"   {t * MS:8.1f} ms  {what}")
                    rows.append({"run": n + 1, "mode": args.mode, "event": what, "ms_after_kill": round(t * MS, 2)})
                for ts, text in r.events:
                    if -1 <= ts - at <= 10:
                        print(f"   {(ts - at) * MS:8.1f} ms  driver: {text[:110]}")
                bins: dict[int, list[float]] = {}
                for s in r.samples:
                    bins.setdefault(int((s.produced - at) // 0.1), []).append((s.sink - s.produced) * MS)
                print("   max latency by 100 ms of production time: " + " ".join(
                    f"{b / 10:+.1f}s:{max(bins.get(b, [0])):.0f}" for b in range(-3, 20)))
                for sec in range(-2, 8):
                    vs = by_second.get(sec, [])
                    print(f"   second {sec:+d}: {len(vs):5d} records, p99 {percentile(vs, .99):6.0f} ms")
                    rows.append({"run": n + 1, "mode": args.mode, "event": f"p99 second {sec:+d}",
                                 "ms_after_kill": round(percentile(vs, .99), 1)})
        finally:
            stop_session(spark)
    write_csv(out / "timeline.csv", rows)
    write_machine(out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
