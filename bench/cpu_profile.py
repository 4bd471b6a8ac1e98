"""Where a worker's CPU goes: py-spy flame graphs of the executors' Python processes, idle and under load.

    .venv/bin/python bench/cpu_profile.py [--modes off,liverobin,kazoo] [--rate 400] [--seconds 20]
                                      [--parallelism 2] [--gil] [--out bench/results/profile]

One embedded stack and one ``local-cluster[3,1,512]`` Spark.  First the machine with Spark and the
stack up and no job (*baseline*).  Then, per mode, the ordered job of :mod:`replication.examples.ordered`
(L=1, the chain task at ``--parallelism``, two topics of that many partitions):

1. *idle*: the job running with no input, for ``--seconds`` from 10 s after its start
   (``bench.common.IDLE_SETTLE_S``: its consumers have gone to their idle fetch wait by then);
2. *load*: ``--rate`` events/s, profiled for ``--seconds`` after a warm-up of 5 s;

then a drain and a check that the output is exact.  In each window every executor's Python processes
(the PySpark daemon and its forked workers) are sampled by ``py-spy record --subprocesses --nonblocking``
(100 Hz, threads not asleep: on a loaded machine that counts threads waiting for a core or for the GIL
too; with ``--gil`` only the thread holding the GIL: the Python work itself, without the waits), written as a flame graph (``<mode>-<phase>.svg``) and as collapsed stacks (``<mode>-<phase>.txt``).
Before each profile, the same length without py-spy measures the CPU of each process group from
``/proc`` (``summary.csv``: cores used by the executors' Python, the executor JVMs, the broker, ZooKeeper,
the driver JVM and this process, which runs the replication driver and, under load, the load generator;
threads in the executors' Python processes; the job's CPU per event under load, this process apart), and
``threads.csv`` the cores of those processes' threads by kind (Python's own threads, librdkafka's
``rdk:broker`` / ``rdk:main``, gRPC's ``event_engine``...: py-spy sees only the Python ones).
``--conf KEY=VALUE`` sets a ``spark.replication.*`` key of every job.  ``categories.csv`` sums the samples'
*self* time by what the innermost project or library frame does (:data:`CATEGORIES`).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import IDLE_SETTLE_S, CostProbe, CostSnapshot, snapshot_cores, write_csv, write_machine  # noqa: E402
from bench.ordering import Config, event_makers  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from deploy.topics import create_topics, read_all  # noqa: E402
from ops.loadgen import generate_load  # noqa: E402
from ops.progress import StatusLine  # noqa: E402
from replication import procfs, run  # noqa: E402
from replication.examples.ordered import build_ordered_job, verify_chains  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402

PY_SPY = Path(sys.executable).with_name("py-spy")
GROUPS = ("python", "executor_jvm", "broker", "zookeeper", "driver_jvm", "bench")

# (category, substrings of a frame "function (file:line)"): the first match of a sample's innermost
# frame that matches any, searched from the innermost frame outwards
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pickle / framing", ("pickle", "batch_format.py", "wire.py", "msgpack")),
    ("gRPC", ("grpc", "rpc.py")),
    ("Kafka client", ("confluent_kafka", "kafka_io.py")),
    ("RocksDB / state", ("rocksdict", "rhino_state/state.py", "rhino_state/backend.py", "rhino_state/keys.py")),
    ("Rhino checkpoints", ("rhino_state/",)),
    ("dedup", ("dedup.py",)),
    ("LiveRobin", ("liverobin/",)),
    ("KaZoo", ("kazoo_leader/", "kazoo/")),
    ("merge", ("merge/",)),
    ("operators / user code", ("operators.py", "functions.py", "examples/", "sink.py", "exactly_once.py")),
    ("channels", ("channels.py",)),
    ("instance loop", ("runtime/instance.py", "processing.py", "runtime/source.py")),
    ("worker / heartbeat", ("worker.py", "metrics.py", "messages.py")),
    ("threading / queues", ("threading.py", "queue.py")),
    ("json", ("json/",)),
    ("PySpark", ("pyspark",)),
)


def executor_python(probe: CostProbe) -> list[int]:
    """The executors' Python processes' roots (the PySpark daemons): py-spy follows their children."""
    pids = set(probe.groups()["python"])
    return sorted(p for p in pids if _ppid(p) not in pids)


def _ppid(pid: int) -> int:
    try:
        return procfs.stat(pid)[2]
    except OSError:
        return -1


def thread_count(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 0)
    return total


def thread_ticks(pids: list[int]) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (thread name, CPU ticks so far) of every thread of ``pids``."""
    out = {}
    for pid in pids:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = procfs.stat_fields(text)  # utime and stime are fields 14 and 15 of proc(5)
            out[(pid, tid)] = (name, int(fields[11]) + int(fields[12]))
    return out


def cores_by_thread_kind(before: dict, after: dict, seconds: float) -> dict[str, tuple[int, float]]:
    """Threads and cores over a window, by what the thread is: its name up to a digit or a colon's
    suffix (``rdk:broker111`` and ``rdk:broker-1`` are librdkafka's ``rdk:broker``; Python's own
    threads all carry the process's name)."""
    kinds: dict[str, list] = {}
    for key, (name, ticks) in after.items():
        kind = re.sub(r"[-0-9]+$", "", name)
        entry = kinds.setdefault(kind, [0, 0])
        entry[0] += 1
        entry[1] += ticks - before.get(key, (name, 0))[1]
    return {k: (n, t / 100.0 / seconds) for k, (n, t) in sorted(kinds.items(), key=lambda kv: -kv[1][1])}


def record(roots: list[int], seconds: float, out: Path, stem: str, gil: bool = False) -> Counter[str]:
    """py-spy every root (with its children) for ``seconds``: one flame graph over all of them
    (``stem``.svg) and their collapsed stacks (``stem``.txt); returns the collapsed stacks' counts."""
    procs, raws = [], []
    for i, pid in enumerate(roots):
        raw = out / f".{stem}-{i}.raw"
        raws.append(raw)
        procs.append(subprocess.Popen(
            [str(PY_SPY), "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--rate", "100",
             "--duration", str(int(seconds)), "--format", "raw", "--output", str(raw), *(["--gil"] if gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for p in procs:
        p.wait()
    stacks: Counter[str] = Counter()
    for raw in raws:
        if raw.exists():
            for line in raw.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                if stack:
                    stacks[stack] += int(n)
            raw.unlink()
    (out / f"{stem}.txt").write_text("".join(f"{s} {n}\n" for s, n in stacks.most_common()))
    flamegraph(stacks, out / f"{stem}.svg", title=stem)
    return stacks


def flamegraph(stacks: Counter[str], path: Path, title: str, width: int = 1800, row: int = 16) -> None:
    """A static icicle-less flame graph (root at the bottom) of collapsed stacks as SVG; frames narrower
    than a pixel are left out.  Hovering a frame shows its name, samples and share."""
    total = sum(stacks.values()) or 1
    tree: dict = {}
    for stack, n in stacks.items():
        node = tree
        for frame in stack.split(";"):
            child = node.setdefault(frame, [0, {}])
            child[0] += n
            node = child[1]
    depth = [0]

    def walk(node: dict, x: float, level: int, out: list[str]) -> None:
        depth[0] = max(depth[0], level + 1)
        for frame, (n, children) in sorted(node.items()):
            w = n / total * width
            if w >= 1:
                out.append((x, level, w, frame, n))
                walk(children, x, level + 1, out)
            x += w

    boxes: list = []
    walk(tree, 0.0, 0, boxes)
    height = (depth[0] + 2) * row
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
             f'font-size="11"><text x="4" y="12">{_esc(title)}: {total} samples (100 Hz, running threads)</text>']
    for x, level, w, frame, n in boxes:
        y = height - (level + 1) * row
        hue = 20 + (hash_stable(frame) % 40)
        label = frame if len(frame) * 7 < w else frame[: max(0, int(w / 7) - 2)] + ".." if w > 30 else ""
        parts.append(f'<g><title>{_esc(frame)}: {n} samples, {100 * n / total:.1f}%</title>'
                     f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" fill="hsl({hue},80%,60%)"/>'
                     f'<text x="{x + 2:.1f}" y="{y + row - 4}">{_esc(label)}</text></g>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def hash_stable(text: str) -> int:
    return sum(text.encode()) * 31 % 997


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def categorize(stacks: Counter[str]) -> Counter[str]:
    """Samples by the category of the innermost frame that names one (:data:`CATEGORIES`), else "other"."""
    out: Counter[str] = Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        for frame in reversed(frames):
            hit = next((c for c, keys in CATEGORIES if any(k in frame for k in keys)), None)
            if hit:
                out[hit] += n
                break
        else:
            out["other"] += n
    return out


def top_self(stacks: Counter[str], n: int = 25) -> list[tuple[str, int]]:
    self_time: Counter[str] = Counter()
    for stack, count in stacks.items():
        self_time[stack.rsplit(";", 1)[-1]] += count
    return self_time.most_common(n)


def wait_sites(stacks: Counter[str], n: int = 12) -> list[tuple[str, int]]:
    """Samples whose innermost frame is a wait in ``threading`` (a thread woken and taking the GIL
    back, or waiting for a core), by the innermost frame outside ``threading``: who waits."""
    sites: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = stack.split(";")
        if "threading.py" not in frames[-1]:
            continue
        caller = next((f for f in reversed(frames) if "threading.py" not in f), frames[-1])
        sites[caller] += count
    return sites.most_common(n)


def cores(before: CostSnapshot, after: CostSnapshot) -> dict[str, float]:
    used = snapshot_cores(before, after, 100.0)
    return {g: used.get(g, 0.0) for g in GROUPS}


def window(probe: CostProbe, seconds: float, out: Path, stem: str, profile: bool,
           gil: bool = False) -> tuple[dict, Counter[str], list[dict]]:
    """The cores each group used over ``seconds`` with nothing else running, and those of the
    executors' Python processes by kind of thread (:func:`cores_by_thread_kind`), then (``profile``) the
    same length again under py-spy (py-spy's own CPU would count in this process's group, and on
    two cores it slows what it samples)."""
    python = sorted(set(probe.groups()["python"]))
    before, threads_before = probe.snapshot(), thread_ticks(python)
    time.sleep(seconds)
    after, threads_after = probe.snapshot(), thread_ticks(python)
    row = {"window": stem, "seconds": round(after.at - before.at, 1),
           **{f"cores_{g}": round(v, 3) for g, v in cores(before, after).items()},
           "python_threads": thread_count(python),
           "python_processes": after.processes.get("python", 0)}
    kinds = [{"window": stem, "thread": kind, "threads": n, "cores": round(c, 3)}
             for kind, (n, c) in cores_by_thread_kind(threads_before, threads_after, after.at - before.at).items()]
    stacks = record(executor_python(probe), seconds, out, stem, gil) if profile else Counter()
    return row, stacks, kinds


def profile_mode(stack: Any, spark: Any, probe: CostProbe, config: Config, args: argparse.Namespace,
                 out: Path, status: StatusLine) -> tuple[list[dict], dict[str, Counter[str]], list[dict]]:
    bootstrap = stack.bootstrap_servers
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topic_a, topic_b, sink = f"prof{stamp}-a", f"prof{stamp}-b", f"prof{stamp}-out"
    p = args.parallelism
    create_topics(bootstrap, {topic_a: p, topic_b: p})
    label = config.label.replace(" ", "")
    handle = run(build_ordered_job(topic_a, topic_b, sink, name=f"prof-{label}-{stamp}", parallelism=p), spark=spark,
                 conf={**config.conf(stack), **dict(kv.split("=", 1) for kv in args.conf)})
    handle.wait_started(120)
    rows, stacks = [], {}
    time.sleep(IDLE_SETTLE_S)
    status.update(f"{config.label}: idle window")
    row, stacks["idle"], kinds = window(probe, args.seconds, out, f"{label}-idle", True, args.gil)
    rows.append({"mode": config.label, "phase": "idle", "events_per_s": 0, **row})

    make = event_makers()
    load: dict[str, Any] = {}
    duration = 2 * args.seconds + 8

    def produce() -> None:
        load["result"] = generate_load(bootstrap, [(topic_a, make("a"))] * 2 + [(topic_b, make("b"))],
                                       rate=args.rate, duration_s=duration)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    time.sleep(5)
    status.update(f"{config.label}: load window at {args.rate:.0f} events/s")
    row, stacks["load"], more = window(probe, args.seconds, out, f"{label}-load", True, args.gil)
    kinds += more
    producer.join()
    per_event = sum(row[f"cores_{g}"] for g in GROUPS if g != "bench") / args.rate
    rows.append({"mode": config.label, "phase": "load", "events_per_s": args.rate,
                 "job_cpu_us_per_event": round(per_event * 1e6), **row})
    status.update(f"{config.label}: draining")
    handle.drain(timeout=180)
    outputs = [json.loads(r.value) for r in read_all(bootstrap, sink)]
    lr = load["result"]
    report = verify_chains(outputs, lr.parsed[topic_a] + lr.parsed[topic_b])
    for r in rows:
        r["exact"] = "yes" if report.exact else f"no: {report}"
    return rows, stacks, kinds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="off,liverobin,kazoo")
    ap.add_argument("--rate", type=float, default=400.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--period", type=int, default=10, help="LiveRobin heartbeat period, ms")
    ap.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a spark.replication.* setting of every job (repeatable)")
    ap.add_argument("--out", default="bench/results/profile")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    status = StatusLine()
    rows: list[dict] = []
    categories: list[dict] = []
    tops: list[str] = []
    thread_kinds: list[dict] = []
    with EmbeddedStack() as stack:
        spark = build_session("local-cluster[3,1,512]", app_name="bench-profile")
        try:
            probe = CostProbe.for_spark(spark, stack.run_dir)
            time.sleep(5)
            row, _, _ = window(probe, args.seconds, out, "baseline", False)
            rows.append({"mode": "none", "phase": "baseline", "events_per_s": 0, **row})
            for mode in args.modes.split(","):
                config = Config(mode if mode != "liverobin" else f"liverobin {args.period}ms", mode,
                                args.period if mode == "liverobin" else None)
                mode_rows, stacks, kinds = profile_mode(stack, spark, probe, config, args, out, status)
                thread_kinds += [{"mode": config.label, **k} for k in kinds]
                rows += mode_rows
                for phase, st in stacks.items():
                    total = sum(st.values()) or 1
                    cats = categorize(st)
                    categories += [{"mode": config.label, "phase": phase, "category": c, "samples": n,
                                    "share": round(n / total, 3)} for c, n in cats.most_common()]
                    tops.append(f"== {config.label} {phase}: {total} samples")
                    tops += [f"{n:6d} {100 * n / total:5.1f}%  {f}" for f, n in top_self(st)]
                    tops.append("   waits in threading (woken, taking the GIL back), by who waits:")
                    tops += [f"{n:6d} {100 * n / total:5.1f}%  {f}" for f, n in wait_sites(st)]
        finally:
            stop_session(spark)
    status.done()
    columns = list(dict.fromkeys(k for r in rows for k in r))
    write_csv(out / "summary.csv", [{k: r.get(k, "") for k in columns} for r in rows], digits=3)
    write_csv(out / "categories.csv", categories, digits=3)
    write_csv(out / "threads.csv", thread_kinds, digits=3)
    (out / "top_self.txt").write_text("\n".join(tops) + "\n")
    write_machine(out)
    with (out / "summary.csv").open() as f:
        for r in csv.DictReader(f):
            print(", ".join(f"{k}={v}" for k, v in r.items()))
    bad = [r["mode"] for r in rows if r.get("exact", "yes") != "yes"]
    print(f"wrote {out}: summary.csv, categories.csv, top_self.txt, <mode>-<phase>.svg / .txt")
    if bad:
        print(f"NOT EXACT: {', '.join(sorted(set(bad)))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
