"""The benchmark suite at a size for a 2-core machine, then ``bench/REPORT.md``.

    .venv/bin/python bench/suite.py [--only ordering,mib,workloads,rhino,sss] [--results bench/results/suite]

Steps (each one of the benchmark commands, run as it would be by hand, its own live status line
on the terminal; about 35 minutes in all on 2 cores):

* ``ordering``: ``bench/ordering.py`` at 400 events/s: latency of no replication, passive
  (checkpoint-restart), ``unordered``, ``liverobin`` (5, 10 and 50 ms) and ``kazoo`` at pipeline lengths
  1, 2 and 3; then around a kill: no
  replication, replication off with Rhino (passive, checkpoint-restart), ``unordered``,
  ``liverobin``, a KaZoo leader's and a follower's executor; the costs (CPU, loopback bytes) of every
  latency run; then the max sustainable throughput of ``off``, ``unordered``, ``liverobin 10ms`` and
  ``kazoo`` at L=1: 8 s runs at 200, 400, 800, 1,600 and 3,200 events/s, each ramp stopping at its first
  run that is not flat (about 4 minutes more).
* ``mib``: ``bench/mib.py``: the paper's MiB 2 (the chain task at 1-4 partitions, 400 events/s) and MiB 3
  (one merge, topic b at 5 events/s and topic a at 5, 50 and 500) in off, unordered, liverobin 10 ms
  and kazoo (about 5 minutes).
* ``workloads``: ``bench/workloads.py`` at 200 events/s: the BetterCloud-like application and the
  NEXMark-like windowed join (state up to 20 MB) in every configuration (about 5 minutes).
* ``rhino``: ``bench/rhino.py`` at 10 MB of state: the stateful partition's executor killed,
  active (two replicas) and passive.
* ``sss``: ``bench/sss.py``: Spark Structured Streaming running the same hash-chain job on the same
  input shape (topics a and b, 2:1, 400 events/s), an executor killed.

A step that fails (or whose output is not exact) is recorded in ``suite.json`` with its exit code
and shown in the report; the suite goes on with the next one and exits non-zero at the end.
"""

from __future__ import annotations

import argparse
import json
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
                 "--kill-modes", "off,passive,unordered,liverobin,kazoo-leader,kazoo-follower",
                 "--throughput-modes", "off,unordered,liverobin,kazoo", "--throughput-rates", "200,400,800,1600,3200",
                 "--throughput-duration", "8", "--throughput-period", "10"],
    "mib": ["bench/mib.py", "--modes", "off,unordered,liverobin,kazoo", "--partitions", "1,2,3,4", "--rate", "400",
            "--rates-a", "5,50,500", "--rate-b", "5", "--duration", "8"],
    "workloads": ["bench/workloads.py", "--rate", "200", "--duration", "15", "--nexmark-state-mb", "20"],
    "rhino": ["bench/rhino.py", "--sizes", "10MB", "--latency-modes", ""],
    "sss": ["bench/sss.py", "--logic", "chain", "--rate", "400", "--duration", "50", "--kill-at", "20"],
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
        shown = " ".join(repr(c) if c == "" else c for c in cmd[1:])
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
