"""What the embedded broker allows any reader: a plain Python loop streaming live, over time.

    .venv/bin/python bench/broker_limits.py [--rate 1000,3200] [--seconds 120] [--feeder-linger 2,100]
                                            [--out bench/results/broker_limits]

On the embedded stack, with nothing else running.  Per rate and per linger of the feeder: a paced
producer (:class:`bench.common.PacedFeeder`, idempotent, ``acks=all``) writes timestamped JSON
records into a topic of 4 partitions, and a plain loop in a process of its own follows it as the
job's sources do (one consumer, ``fetch.wait.max.ms`` 10, each record ``json.loads``-ed and
produced to an output topic with ``linger.ms`` 5).  Every 5 s the loop writes a row: records read a
second, the p50 / p99 of produce-to-read latency, and the broker's cores over the window.

So the rows say what the broker itself costs and allows, with no Spark and no replication: the
floor of the job's latency at a rate, and whether a reader keeps up for minutes (the embedded
broker's fetch lists every batch a partition holds: docs/embedded-broker.md).  Writes
``broker_limits.csv`` and ``broker_limits.png``.
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

WINDOW_S = 5.0


def follow(bootstrap: str, topic: str, out: str, broker: int, seconds: float) -> None:
    """The plain loop (run in a process of its own): one JSON row per window on stdout."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from bench.common import pid_ticks
    from ops.workload import percentile
    from replication.runtime.feeds import SOURCE_FETCH_WAIT_MS
    from transport.kafka_io import consume_ready

    hz = 100.0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"limits-{topic}", "enable.auto.commit": False,
                         "fetch.wait.max.ms": SOURCE_FETCH_WAIT_MS})
    consumer.assign([TopicPartition(topic, k, 0) for k in range(4)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        at, ticks, lat = time.monotonic(), pid_ticks(broker), []
        while time.monotonic() - at < WINDOW_S:
            for msg in consume_ready(consumer, 1000, 0.1):
                if msg.error() is not None:
                    continue
                event = json.loads(msg.value())
                lat.append(time.time() * 1000 - event["ts"])
                producer.produce(out, value=msg.value())
            producer.poll(0)
        span = time.monotonic() - at
        print(json.dumps({"t_s": round(time.monotonic() - start), "read_per_s": round(len(lat) / span),
                          "p50_ms": round(percentile(lat, 0.5), 1) if lat else "",
                          "p99_ms": round(percentile(lat, 0.99), 1) if lat else "",
                          "broker_cores": round((pid_ticks(broker) - ticks) / hz / span, 3)}), flush=True)
    producer.flush(30)
    consumer.close()


def run(bootstrap: str, broker: int, rate: float, linger_ms: float, seconds: float) -> list[dict]:
    from bench.common import PacedFeeder
    from deploy.topics import create_topics

    stamp = int(time.time() * 1000) % 10**9
    topic, out = f"limits{stamp}", f"limits{stamp}-out"
    create_topics(bootstrap, {topic: 4, out: 4})

    def make(i: int) -> tuple[str, bytes, bytes]:
        return topic, f"k{i % 200}".encode(), json.dumps({"id": i, "ts": time.time() * 1000}).encode()

    loop = subprocess.Popen([sys.executable, __file__, "--follow", bootstrap, topic, out, str(broker), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    feeder = PacedFeeder(bootstrap, make, rate, linger_ms=linger_ms)
    feeder.start()
    rows = []
    assert loop.stdout is not None
    for line in loop.stdout:
        row = {"rate": rate, "feeder_linger_ms": linger_ms, **json.loads(line)}
        rows.append(row)
        print("   " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    loop.wait()
    feeder.stop()
    return rows


def plot(out: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key in dict.fromkeys((r["rate"], r["feeder_linger_ms"]) for r in rows):
        sel = [r for r in rows if (r["rate"], r["feeder_linger_ms"]) == key]
        label = f"{key[0]:.0f}/s, feeder linger {key[1]:.0f} ms"
        ax1.plot([r["t_s"] for r in sel], [r["p99_ms"] or None for r in sel], marker=".", label=label)
        ax2.plot([r["t_s"] for r in sel], [r["read_per_s"] / r["rate"] for r in sel], marker=".", label=label)
    ax1.set(xlabel="seconds", ylabel="p99 produce-to-read (ms)", yscale="log",
            title="a plain loop reading live from the embedded broker")
    ax2.set(xlabel="seconds", ylabel="read / offered", ylim=(0, 1.2), title="does it keep up")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "broker_limits.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--follow":
        follow(argv[1], argv[2], argv[3], int(argv[4]), float(argv[5]))
        return 0
    from bench.broker_cost import broker_pid
    from bench.common import write_csv, write_machine
    from deploy.stack import EmbeddedStack

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="1000,3200", help="offered records/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--feeder-linger", default="2,100", help="the feeder's linger.ms, comma-separated")
    ap.add_argument("--out", default=str(REPO / "bench/results/broker_limits"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with EmbeddedStack() as stack:
        assert stack.run_dir is not None
        broker = broker_pid(stack.run_dir)
        for rate in (float(r) for r in args.rate.split(",")):
            for linger in (float(x) for x in args.feeder_linger.split(",")):
                print(f"== {rate:.0f} records/s, feeder linger {linger:.0f} ms, {args.seconds:.0f} s", flush=True)
                rows += run(stack.bootstrap_servers, broker, rate, linger, args.seconds)
    write_csv(out / "broker_limits.csv", rows)
    plot(out, rows)
    write_machine(out)
    print(f"wrote {out}: broker_limits.csv, broker_limits.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
