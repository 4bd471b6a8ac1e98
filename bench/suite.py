"""The benchmark suite at a size for a 2-core machine, then ``bench/REPORT.md``.

    .venv/bin/python bench/suite.py [--only ordering,throughput,mib,...] [--results bench/results/suite]

Steps (each one of the benchmark commands, run as it would be by hand, its own live status line
on the terminal; each holds the machine for at most about 12 minutes, about 55 minutes in all on 2 cores):

* ``ordering``: ``bench/ordering.py`` at 400 events/s: latency of no replication, passive
  (checkpoint-restart), ``unordered``, ``liverobin`` (5, 10 and 50 ms) and ``kazoo`` at pipeline lengths
  1, 2 and 3; then around a kill: no
  replication, replication off with Rhino (passive, checkpoint-restart), ``unordered``,
  ``liverobin``, a KaZoo leader's and a follower's executor; the costs (CPU, loopback bytes) of every
  latency run (about 10 minutes; 864 s when the ramps below were part of it).
* ``throughput``: ``bench/ordering.py``'s throughput ramps alone: the max sustainable throughput of
  ``off``, ``passive``, ``unordered``, ``liverobin 10ms`` and ``kazoo`` at L=1: 8 s runs at 200, 400, 800,
  1,600 and 3,200 events/s, each ramp stopping at its first run that is not flat (376 s).
* ``mib``: ``bench/mib.py``: the paper's MiB 2 (the chain task at 1-4 partitions, 400 events/s) and MiB 3
  (one merge, topic b at 5 events/s and topic a at 5, 50, 500 and 2,000) in off, unordered, liverobin 10 ms
  and kazoo (407 s).
* ``workloads``: ``bench/workloads.py`` at 200 events/s: the BetterCloud-like application and the
  NEXMark-like windowed join (state up to 20 MB) in every configuration (233 s).
* ``rhino``: ``bench/rhino.py`` at 10 MB of state: the stateful partition's executor killed,
  active (two replicas) and passive (67 s).
* ``nexmark-recovery``: ``bench/rhino.py --workload nexmark``: the same kill on the NEXMark-like join at
  5, 20 and 50 MB of join state, active and passive (281 s).
* ``sss``: ``bench/sss.py``: Spark Structured Streaming running the same hash-chain job on the same
  input shape (topics a and b, 2:1, 400 events/s), an executor killed; the costs (CPU, loopback bytes)
  of its steady window before the kill (90 s).
* ``sss-throughput``: ``bench/sss.py --throughput-rates``: its throughput ramp by ``bench/ordering.py``'s
  criteria (20 s per rate, 100 ms trigger), with the costs of each rate (157 s).
* ``handover``: ``bench/handover.py``: 32 vnodes moved in LiveRobin and KaZoo mode at 1 and 20 MB of
  state, all at once and batched (8 per step); with Rhino on in both modes (LiveRobin: checkpoints every
  20 pulses; KaZoo: every 50 order records or 200 records) all at once, in LiveRobin also batched with a
  byte cap of 660 KB (4 steps at 20 MB), and all at once at 100 MB in LiveRobin; fluid (one vnode per
  step) in LiveRobin at 20 MB only (32 steps, about 45 s); the task rescaled 2 -> 3 -> 2 partitions within
  its max_parallelism in both modes, all at once at both sizes and batched at 20 MB only; the restart
  floor.  The load comes 10 events at a time every 50 ms (``--burst 10``: at one event per batch the
  embedded broker's fetches slow down within a minute, and that, not the handover, set the latency), and
  a control per mode at 20 MB runs the same job and load for 45 s with no handover, so each row's worst
  second is judged against the p99 before and against the control's same seconds.  Per run the phases of
  each step from the participants' acks, the bytes cut, sent over the network and read from local
  checkpoint copies against the state model and the state measured per vnode, and the cores the job used
  before and during (24 runs, about 12-13 minutes).

* ``restart``: ``bench/restart.py``: the task rescaled 2 -> 3 under load at 1 and 20 MB, live (a handover
  within ``max_parallelism``) and by draining into a savepoint and restarting at parallelism 3 (the
  issue's stop-restore-restart alternative).

* ``durable``: ``bench/durable.py``: what one upload to ``spark.replication.checkpointDir`` costs (bytes,
  CPU) by state size and change rate, and the time from the start to the first output of a job resumed
  after a crash beside Spark Structured Streaming restarted from its checkpoint location, on the same
  amount of state, each in a new Spark application.

A step that fails (or whose output is not exact) is recorded in ``suite.json`` with its exit code
and shown in the report; the suite goes on with the next one and exits non-zero at the end.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import report  # noqa: E402

STEPS = {
    "ordering": ["bench/ordering.py", "--rate", "400", "--duration", "12", "--periods", "5,10,50", "--pipelines", "1,2,3",
                 "--modes", "off,passive,unordered,liverobin,kazoo", "--kill-duration", "24",
                 "--kill-modes", "off,passive,unordered,liverobin,kazoo-leader,kazoo-follower"],
    # the ramps of bench/ordering.py alone (its latency and kill runs off): a step of its own, so that each
    # step holds the machine for less than about 12 minutes
    "throughput": ["bench/ordering.py", "--modes", "", "--kill-duration", "0",
                   "--throughput-modes", "off,passive,unordered,liverobin,kazoo",
                   "--throughput-rates", "200,400,800,1600,3200", "--throughput-duration", "8",
                   "--throughput-period", "10"],
    "mib": ["bench/mib.py", "--modes", "off,unordered,liverobin,kazoo", "--partitions", "1,2,3,4", "--rate", "400",
            "--rates-a", "5,50,500,2000", "--rate-b", "5", "--duration", "8"],
    "workloads": ["bench/workloads.py", "--rate", "200", "--duration", "15", "--nexmark-state-mb", "20"],
    "rhino": ["bench/rhino.py", "--sizes", "10MB", "--latency-modes", ""],
    "nexmark-recovery": ["bench/rhino.py", "--workload", "nexmark", "--sizes", "5MB,20MB,50MB", "--rate", "200",
                         "--latency-modes", ""],
    "sss": ["bench/sss.py", "--logic", "chain", "--rate", "400", "--duration", "50", "--kill-at", "20"],
    "sss-throughput": ["bench/sss.py", "--logic", "chain", "--throughput-rates", "200,400,800,1600,3200",
                       "--throughput-duration", "20", "--throughput-warm-up", "5", "--trigger-ms", "100",
                       "--drain-timeout", "120"],
    # moves: all at once and batched in both modes; with Rhino on (checkpoints every 20 pulses in LiveRobin,
    # every 50 orders / 200 records in KaZoo) in both modes all at once, in LiveRobin also with a byte cap
    # (660 KB: 8 of the 78 KB vnodes of 20 MB, 4 steps; 1 MB in one), and once at 100 MB in LiveRobin (a
    # 34 s run on its own, 1.5 s of handover: about 35 s of the step); fluid (32 steps of about 1 s) once;
    # rescales: all at once at both sizes, batched (11 steps each way) at 20 MB only; a control per mode
    # at 20 MB. 24 runs: about 12-13 minutes on 2 cores
    "handover": ["bench/handover.py", "--sizes", "1MB,20MB", "--vnodes", "32", "--batch", "8", "--burst", "10",
                 "--modes", "liverobin,kazoo", "--operations", "move", "--strategies", "all,batched",
                 "--also", "operations=move modes=liverobin+rhino strategies=all,batched:32:660KB",
                 "--also", "operations=move modes=kazoo+rhino strategies=all",
                 "--also", "operations=move modes=liverobin+rhino sizes=100MB strategies=all",
                 "--also", "operations=move modes=liverobin sizes=20MB strategies=fluid",
                 "--also", "operations=rescale modes=liverobin,kazoo strategies=all",
                 "--also", "operations=rescale modes=liverobin,kazoo sizes=20MB strategies=batched",
                 "--also", "operations=none modes=liverobin,kazoo sizes=20MB"],
    # rescale 2 -> 3 at 1 and 20 MB: live, and by a restart from a savepoint (about 2 minutes)
    "restart": ["bench/restart.py"],
    # durable checkpoints: one upload at 10 MB, 100 MB and 1 GB (no Spark), then the resume after a
    # crash against Spark Structured Streaming's restart, both in a new application, at 10 and 100 MB
    "durable": ["bench/durable.py", "--sizes", "10MB,100MB,1GB", "--resume-sizes", "10MB,100MB"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(STEPS), help=f"steps to run, of {', '.join(STEPS)}")
    ap.add_argument("--results", default=str(REPO / "bench/results/suite"))
    ap.add_argument("--report", default=str(REPO / "bench/REPORT.md"))
    args = ap.parse_args(argv)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := [s for s in chosen if s not in STEPS]:
        ap.error(f"--only: unknown {', '.join(unknown)} (of {', '.join(STEPS)})")
    record = results / "suite.json"
    suite = json.loads(record.read_text()) if record.exists() else {"steps": []}
    for i, name in enumerate(chosen, 1):
        out = results / name
        cmd = [sys.executable, *STEPS[name], "--out", str(out.relative_to(REPO) if out.is_relative_to(REPO) else out)]
        shown = shlex.join(cmd[1:])
        print(f"== [{i}/{len(chosen)}] {name}: {shown}", flush=True)
        t0 = time.monotonic()
        code = subprocess.call(cmd, cwd=REPO)
        step = {"name": name, "command": shown, "exit": code, "seconds": time.monotonic() - t0,
                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        suite["steps"] = [s for s in suite["steps"] if s["name"] != name] + [step]
        record.write_text(json.dumps(suite, indent=2) + "\n")
        print(f"== {name}: exit {code} after {step['seconds']:.0f} s", flush=True)
    report.main(["--results", str(results), "--out", args.report])
    return 0 if all(s["exit"] == 0 for s in suite["steps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
