"""What happens when, after an executor SIGKILL: the JVM exiting and gone, its Python processes gone,
the driver's verdict, and the sink's per-second p99 around it.

    .venv/bin/python bench/kill_timeline.py [--mode liverobin] [--kill executor] [--rate 1000] [--runs 1]

The ordered two-source job of ``bench/ordering.py`` on 3 executors; halfway through the load the
executor of the victim replica (``--kill python``: only its Python worker) is SIGKILLed with the kill
tooling while a thread samples, every millisecond, the killed process's ``/proc`` state
(``PF_EXITING``, zombie, gone), each other Python process under the executor and the driver's dead
set.  Prints one timeline per run (ms after the signal) and writes
``timeline.csv``.  Every run is verified record by record.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench.ordering as ordering  # noqa: E402
from bench.common import write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from ops.chaos import ReplicaProcess, kill_executor, kill_python, locate  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from ops.workload import percentile  # noqa: E402
from replication import procfs  # noqa: E402
from replication.runtime.executor_watch import PF_EXITING  # noqa: E402
from replication.spark_cluster import build_session, stop_session, wait_for_executors  # noqa: E402

MS = 1000.0


def _flags(pid: int) -> tuple[str, int] | None:
    """(state, flags) of ``pid`` or None when it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = procfs.stat_fields(f.read())
    except OSError:
        return None
    return fields[0], int(fields[6])


class Timeline:
    """First time (s after the signal) each watched fact became true."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()
        self.t0 = 0.0  # perf_counter at the signal
        self.kill_wall = 0.0  # and the wall clock

    def mark(self, what: str, at: float) -> None:
        self.seen.setdefault(what, at)

    def watch(self, t0: float, victim: int, label: str, pythons: dict[int, str], master: Any,
              worker: int) -> None:
        while not self.stop.is_set() and time.perf_counter() - t0 < 10:
            now = time.perf_counter() - t0
            got = _flags(victim)
            if got is None:
                self.mark(f"{label} gone", now)
            else:
                state, flags = got
                if flags & PF_EXITING:
                    self.mark(f"{label} PF_EXITING", now)
                if state in ("Z", "X"):
                    self.mark(f"{label} zombie", now)
            for pid, name in pythons.items():
                got = _flags(pid)
                if got is None or got[0] in ("Z", "X"):
                    self.mark(f"{name} gone", now)
                elif got[1] & PF_EXITING:
                    self.mark(f"{name} exiting", now)
            if worker in master.dead:
                self.mark("driver: worker dead", now)
            time.sleep(0.001)

    def kill(self, master: Any, target: ReplicaProcess, python_only: bool) -> list[int]:
        """Start watching, then SIGKILL the target's executor JVM (or its Python worker only)."""
        pythons = {p: ("daemon" if "daemon" in " ".join(procfs.cmdline(p)) else f"python {p}")
                   for p in procfs.descendants(target.jvm_pid) if procfs.is_python(p)}
        pythons.pop(target.python_pid, None)
        victim, label = (target.python_pid, "worker") if python_only else (target.jvm_pid, "jvm")
        if not python_only:
            pythons[target.python_pid] = "worker (the replica's)"
        ended = master.losses.watch_ended  # the driver's Attach-watch callback, timed when it starts

        def watch_ended(w: int, attempt: int) -> None:
            if w == target.worker:
                self.mark("driver: its Attach watch ended", time.perf_counter() - self.t0)
            ended(w, attempt)

        master.losses.watch_ended = watch_ended
        self.t0 = time.perf_counter()
        self.kill_wall = time.time()
        threading.Thread(target=self.watch, daemon=True,
                         args=(self.t0, victim, label, pythons, master, target.worker)).start()
        pids = kill_python(target) if python_only else kill_executor(target)
        self.mark("kill sent", time.perf_counter() - self.t0)
        return pids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="liverobin", choices=["liverobin", "kazoo-follower", "kazoo-leader"])
    ap.add_argument("--kill", default="executor", choices=["executor", "python"],
                    help="SIGKILL the victim's executor JVM or only its Python worker")
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--duration", type=float, default=24.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "bench/results/kill_timeline"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    config = replace(ordering.kill_configs([args.mode], 10)[0], kill=args.kill)
    rows: list[dict[str, Any]] = []
    handles: list[Any] = []
    real_run = ordering.run

    def run_and_keep(*a: Any, **kw: Any) -> Any:
        handles.append(real_run(*a, **kw))
        return handles[-1]

    ordering.run = run_and_keep
    status = StatusLine()
    with EmbeddedStack() as stack:
        spark = build_session("local-cluster[3,1,1024]", app_name="kill-timeline")
        try:
            for n in range(args.runs):
                wait_for_executors(spark.sparkContext, 3, timeout=90)
                timeline = Timeline()

                def kill_exec(handle: Any, victim: str, timeline: Timeline = timeline) -> str:
                    target = locate(victim, job=handle.job.name)
                    timeline.kill(handle.master, target, python_only=False)
                    return f"SIGKILLed executor {target.executor} (JVM pid {target.jvm_pid}), worker {target.worker}"

                def kill_py(target: ReplicaProcess, timeline: Timeline = timeline) -> list[int]:
                    return timeline.kill(handles[-1].master, target, python_only=True)

                ordering.kill_replica_executor, ordering.kill_python = kill_exec, kill_py
                r = ordering.run_ordered(stack, spark, config, pipeline=1, rate=args.rate,
                                         duration_s=args.duration, status=status, kill_at_s=args.duration / 2)
                timeline.stop.set()
                status.done()
                checks = r.checks()
                at = timeline.kill_wall or r.fault_at or 0.0
                by_second: dict[int, list[float]] = {}
                for s in r.samples:
                    by_second.setdefault(int((s.produced - at) // 1), []).append((s.sink - s.produced) * MS)
                before = [v for sec, vs in by_second.items() if -8 <= sec < 0 for v in vs]
                print(f"== run {n + 1}: {r.fault}")
                print(f"   exact {checks}, p99 before {percentile(before, .99):.0f} ms")
                for what, t in sorted(timeline.seen.items(), key=lambda kv: kv[1]):
                    print(f"   {t * MS:8.1f} ms  {what}")
                    rows.append({"run": n + 1, "mode": args.mode, "kill": args.kill, "event": what, "ms_after_kill": round(t * MS, 2)})
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
                    rows.append({"run": n + 1, "mode": args.mode, "kill": args.kill, "event": f"p99 second {sec:+d}",
                                 "ms_after_kill": round(percentile(vs, .99), 1)})
        finally:
            stop_session(spark)
    write_csv(out / "timeline.csv", rows)
    write_machine(out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
