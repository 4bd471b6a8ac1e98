"""What a LiveRobin job costs its driver as the input rate grows (the heartbeat generator's part).

    .venv/bin/python bench/pulse_cost.py [--rates 0,400,800,1600] [--seconds 15] [--out bench/results/pulse_cost]

One embedded stack and one ``local-cluster[3,1,512]`` Spark running the ordered job of
:mod:`replication.examples.ordered` (L=1, parallelism 2) in LiveRobin mode (10 ms period).  The load
comes from a separate process (this one is then the driver alone: the job master and the heartbeat
generator), one rate after the other, each for 5 s of warm-up and a window of ``--seconds``.  Per
window: the cores of this process, the bytes per second its TCP sockets received (``ss``: the
generator's fetches of the sources, when it makes them, the heartbeat log, the workers' calls and
streams, Spark's gateway), the broker's cores, pulses written and position reports received per
second.  Then a drain and a check that the output is exact.  Writes ``summary.csv``
and ``pulse_cost.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import CostProbe, write_csv, write_machine  # noqa: E402
from bench.ordering import Config, event_makers  # noqa: E402
from deploy.stack import EmbeddedStack, require_java17  # noqa: E402
from deploy.topics import create_topics, read_all  # noqa: E402
from ops.loadgen import generate_load  # noqa: E402
from replication import run  # noqa: E402
from replication.examples.ordered import build_ordered_job, verify_chains  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402

WARM_UP_S = 5.0


def feed(bootstrap: str, topic_a: str, topic_b: str, steps: list[tuple[float, float]], ids_path: str) -> None:
    """The load process: each (rate, seconds) step in turn (rate 0: a pause), announced on stdout."""
    make = event_makers()
    streams = [(topic_a, make("a"))] * 2 + [(topic_b, make("b"))]
    ids: list[str] = []
    for i, (rate, seconds) in enumerate(steps):
        print(f"step {i}", flush=True)
        if rate <= 0:
            time.sleep(seconds)
            continue
        result = generate_load(bootstrap, streams, rate=rate, duration_s=seconds)
        ids += [i for parsed in result.parsed.values() for i in parsed]
    Path(ids_path).write_text(json.dumps(ids))
    print("done", flush=True)


def tcp_bytes_received(pid: int) -> int:
    """Bytes received so far on the TCP sockets ``pid`` holds open (``ss -tinp``: the socket's line
    names its process, the indented line after it carries ``bytes_received``)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    total, mine = 0, False
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            mine = f"pid={pid}," in line
        elif mine:
            total += sum(int(f.split(":", 1)[1]) for f in line.split() if f.startswith("bytes_received:"))
    return total


def measure(handle: Any, probe: CostProbe, seconds: float) -> dict[str, float]:
    gens = handle.pulse_generators
    board = getattr(handle.master, "source_positions", None)  # (absent before sources reported positions)
    pid = os.getpid()
    t0, cpu0, read0 = time.monotonic(), time.process_time(), tcp_bytes_received(pid)
    snap0, pulses0, reports0 = probe.snapshot(), sum(g.written for g in gens), board.reports if board else 0
    time.sleep(seconds)
    dt = time.monotonic() - t0
    snap1 = probe.snapshot()
    broker = (snap1.ticks.get("broker", 0) - snap0.ticks.get("broker", 0)) / 100 / dt
    return {"driver_cores": (time.process_time() - cpu0) / dt,
            "driver_received_kib_per_s": (tcp_bytes_received(pid) - read0) / 1024 / dt,
            "broker_cores": broker,
            "pulses_per_s": (sum(g.written for g in gens) - pulses0) / dt,
            "position_reports_per_s": ((board.reports if board else 0) - reports0) / dt}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["events_per_s"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(rates, [r["driver_cores"] for r in rows], "o-", label="driver process")
    a.plot(rates, [r["broker_cores"] for r in rows], "s-", label="broker")
    a.set_xlabel("events/s")
    a.set_ylabel("cores")
    a.legend()
    b.plot(rates, [r["driver_received_kib_per_s"] for r in rows], "o-")
    b.set_xlabel("events/s")
    b.set_ylabel("driver's TCP sockets received, KiB/s")
    fig.suptitle("LiveRobin: what the driver costs as the input grows")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="0,400,800,1600")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default="bench/results/pulse_cost")
    ap.add_argument("--feed", nargs=5, metavar=("BOOTSTRAP", "TOPIC_A", "TOPIC_B", "STEPS", "IDS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.feed:
        bootstrap, a, b, steps, ids = args.feed
        feed(bootstrap, a, b, [tuple(s) for s in json.loads(steps)], ids)
        return 0
    rates = [float(r) for r in args.rates.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    rows: list[dict] = []
    with EmbeddedStack() as stack, tempfile.TemporaryDirectory() as tmp:
        spark = build_session("local-cluster[3,1,512]", app_name="bench-pulse-cost")
        try:
            probe = CostProbe.for_spark(spark, stack.run_dir)
            bootstrap = stack.bootstrap_servers
            stamp = f"{int(time.time() * 1000) % 10**10}"
            topic_a, topic_b, sink = f"pc{stamp}-a", f"pc{stamp}-b", f"pc{stamp}-out"
            create_topics(bootstrap, {topic_a: 2, topic_b: 2})
            config = Config("liverobin 10ms", "liverobin", 10)
            handle = run(build_ordered_job(topic_a, topic_b, sink, name=f"pc-{stamp}"), spark=spark,
                         conf=config.conf(stack))
            handle.wait_started(120)
            time.sleep(WARM_UP_S)
            steps = [(rate, WARM_UP_S + args.seconds) for rate in rates]
            ids_path = str(Path(tmp) / "ids.json")
            feeder = subprocess.Popen([sys.executable, __file__, "--feed", bootstrap, topic_a, topic_b,
                                       json.dumps(steps), ids_path], stdout=subprocess.PIPE, text=True)
            assert feeder.stdout is not None
            for rate in rates:
                assert feeder.stdout.readline().startswith("step")
                time.sleep(WARM_UP_S)
                row = {"events_per_s": rate, **measure(handle, probe, args.seconds)}
                rows.append(row)
                print(", ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
            assert feeder.stdout.readline().strip() == "done"
            feeder.wait(60)
            handle.drain(timeout=300)
            outputs = [json.loads(r.value) for r in read_all(bootstrap, sink)]
            report = verify_chains(outputs, json.loads(Path(ids_path).read_text()))
        finally:
            stop_session(spark)
    exact = "yes" if report.exact else f"no: {report}"
    for row in rows:
        row["exact"] = exact
    write_csv(out / "summary.csv", rows, digits=3)
    plot(rows, out / "pulse_cost.png")
    write_machine(out)
    with (out / "summary.csv").open() as f:
        for r in csv.DictReader(f):
            print(", ".join(f"{k}={v}" for k, v in r.items()))
    print(f"wrote {out}: summary.csv, pulse_cost.png")
    return 0 if report.exact else 1


if __name__ == "__main__":
    sys.exit(main())
