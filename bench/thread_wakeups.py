"""Which threads of the executors' Python workers wake, how often and at what CPU cost.

Attach to a job already running on this machine (e.g. the idle phase of ``bench/cpu_profile.py``)::

    .venv/bin/python bench/thread_wakeups.py --seconds 10 --out /tmp/wakeups.txt

Reads every thread's voluntary context switches and CPU ticks from ``/proc`` at the start and the
end of the window, names each thread by its Python name and the first frame outside ``threading``
(``py-spy dump``), and prints one line per kind of thread (digits in names folded), most wake-ups
first. A sampling profiler shows where a busy thread spends its time; this shows the threads that
are each cheap but wake often, which is what an idle job's CPU is made of.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

PY_SPY = Path(sys.executable).with_name("py-spy")
TICKS_PER_S = 100


def executor_workers() -> list[int]:
    """The PIDs of the PySpark daemons and the workers they forked (the replication workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "pyspark.daemon" in cmd:
            pids.append(int(proc.name))
    return pids


def snapshot(pids: list[int]) -> dict[tuple[int, int], tuple[str, int, int]]:
    """(pid, tid) -> (OS thread name, CPU ticks, voluntary context switches)."""
    out = {}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                stat, status = (task / "stat").read_text(), (task / "status").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            switches = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
            out[(pid, int(task.name))] = (stat[stat.index("(") + 1:stat.rindex(")")],
                                          int(fields[11]) + int(fields[12]), int(switches.group(1)) if switches else 0)
    return out


def python_names(pids: list[int]) -> dict[tuple[int, int], str]:
    """(pid, tid) -> "<Python thread name> <first frame outside threading>" of the Python threads."""
    names = {}
    for pid in pids:
        dump = subprocess.run([str(PY_SPY), "dump", "--pid", str(pid), "--nonblocking", "--json"],
                              capture_output=True, text=True, check=False).stdout
        try:
            threads = json.loads(dump)
        except ValueError:
            continue
        for thread in threads:
            frames = thread.get("frames") or []
            where = next((f"{f['name']}@{Path(f['filename']).name}" for f in frames
                          if not f["filename"].endswith(("threading.py", "queue.py"))), "?")
            names[(pid, thread.get("os_thread_id"))] = f"{thread.get('thread_name') or ''} {where}".strip()
    return names


def wakeups(seconds: float) -> list[tuple[str, int, float, float]]:
    """(kind of thread, threads, cores, wake-ups per second), most wake-ups first."""
    pids = executor_workers()
    before = snapshot(pids)
    time.sleep(seconds)
    after = snapshot(pids)
    names = python_names(pids)
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0])
    for key, (os_name, ticks, switches) in after.items():
        if key not in before:
            continue
        kind = kinds[re.sub(r"\d+", "N", names.get(key, os_name))]
        kind[0] += 1
        kind[1] += (ticks - before[key][1]) / TICKS_PER_S / seconds
        kind[2] += (switches - before[key][2]) / seconds
    return sorted(((k, int(n), cores, rate) for k, (n, cores, rate) in kinds.items()), key=lambda r: -r[3])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    rows = wakeups(args.seconds)
    if not rows:
        print("no executor Python workers found (is a job running?)", file=sys.stderr)
        return 1
    lines = [f"{'thread':60s} {'n':>4s} {'cores':>7s} {'wakeups/s':>10s}"]
    lines += [f"{kind[:60]:60s} {n:4d} {cores:7.3f} {rate:10.1f}" for kind, n, cores, rate in rows]
    lines.append(f"total: {sum(r[3] for r in rows):.0f} wake-ups/s, {sum(r[2] for r in rows):.3f} cores")
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
