"""What the broker's CPU goes to: fetch waits, consumers, partitions, and reading at a rate.

    .venv/bin/python bench/broker_cost.py [--seconds 6] [--rates 2400,10000] [--out bench/results/broker_cost]

On the embedded stack (DESIGN §10), with nothing else running, the broker process's CPU (from
``/proc``) over ``--seconds`` in each of these setups:

* *idle*: consumers following empty partitions, nothing produced: one consumer over 1, 4 and 8
  partitions at ``fetch.wait.max.ms`` 10, 100 and 500; and 4 consumers of one partition each at
  10 ms (what a worker's source replicas cost with a consumer each, against one shared consumer);
* *load*: a producer at each of ``--rates`` events/s (``linger.ms`` 2, as the load generator)
  into 4 partitions; alone, with one consumer reading all of them, and with two (a source
  partition's two replicas), at a 10 ms wait; and one consumer with ``fetch.min.bytes`` 1 MB at a
  10 and a 20 ms wait (a broker that honours it answers fewer, fuller fetches).

A broker whose cost is per event shows load figures proportional to the rate; one whose cost is
per fetch shows idle figures falling with the wait and load figures that do not grow with the
rate.  Writes ``broker_cost.csv`` (``read_per_s``: records each consumer read a second).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402

from bench.common import print_plain_table, write_csv  # noqa: E402
from deploy.stack import EmbeddedStack, run_dir_status  # noqa: E402
from deploy.topics import create_topics  # noqa: E402

RECORD = b'{"account": "acc-0042", "amount": 1234, "ts": 1790000000000}'
MIN_BYTES = 1_000_000  # a fetch the broker could hold until this much is there, or the wait ends


def process_seconds(pid: int) -> float:
    """utime + stime of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid(run_dir: Path) -> int:
    for proc in run_dir_status(run_dir):
        if proc.name == "kafka" and proc.pid is not None and proc.alive:
            return proc.pid
    raise RuntimeError(f"no live broker recorded in {run_dir}")


class Readers:
    """``consumers`` consumers (each over ``partitions`` of ``topic``), each polled by a thread."""

    def __init__(self, bootstrap: str, groups: list[list[TopicPartition]], wait_ms: int, min_bytes: int = 1) -> None:
        self.stop = threading.Event()
        self._read = [0] * len(groups)
        self._threads = [threading.Thread(target=self._follow, args=(bootstrap, tps, wait_ms, min_bytes, i))
                         for i, tps in enumerate(groups)]
        for t in self._threads:
            t.start()

    def _follow(self, bootstrap: str, tps: list[TopicPartition], wait_ms: int, min_bytes: int, i: int) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"broker-cost-{i}",
                             "fetch.wait.max.ms": wait_ms, "fetch.min.bytes": min_bytes, "enable.auto.commit": False})
        consumer.assign(tps)
        try:
            while not self.stop.is_set():
                self._read[i] += sum(1 for m in consumer.consume(1000, timeout=0.1) if m.error() is None)
        finally:
            consumer.close()

    @property
    def records(self) -> int:
        """Records read so far, by all the consumers."""
        return sum(self._read)

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join()


class Feeder:
    """A producer writing ``rate`` records a second round robin into ``partitions`` of ``topic``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, topic, partitions, rate))
        self._thread.start()

    def _run(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 2})
        start, n = time.monotonic(), 0
        while not self.stop.is_set():
            due = int((time.monotonic() - start) * rate)
            while n < due:
                producer.produce(topic, value=RECORD, partition=n % partitions)
                n += 1
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)

    def close(self) -> None:
        self.stop.set()
        self._thread.join()


def measure(pid: int, seconds: float, warm_up: float = 2.0) -> float:
    time.sleep(warm_up)
    before, at = process_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (process_seconds(pid) - before) / (time.monotonic() - at)


def run(bootstrap: str, pid: int, seconds: float, rates: list[int]) -> list[dict]:
    rows: list[dict] = []
    stamp = int(time.time() * 1000) % 10**9
    idle_topics = [f"cost{stamp}-idle{i}" for i in range(8)]
    create_topics(bootstrap, {t: 1 for t in idle_topics})
    rows.append({"phase": "idle", "setup": "no consumer", "consumers": 0, "partitions": 0, "wait_ms": "",
                 "rate": 0, "broker_cores": round(measure(pid, seconds), 3), "read_per_s": 0, "us_per_event": ""})
    setups = [(1, n, wait) for n in (1, 4, 8) for wait in (10, 100, 500)] + [(4, 1, 10)]
    for consumers, per, wait in setups:
        groups = [[TopicPartition(idle_topics[c * per + k], 0, OFFSET_BEGINNING) for k in range(per)]
                  for c in range(consumers)]
        readers = Readers(bootstrap, groups, wait)
        try:
            cores = measure(pid, seconds)
        finally:
            readers.close()
        rows.append({"phase": "idle", "setup": f"{consumers} consumer(s) x {per} partition(s)",
                     "consumers": consumers, "partitions": consumers * per, "wait_ms": wait, "rate": 0,
                     "broker_cores": round(cores, 3), "read_per_s": 0, "us_per_event": ""})
    for rate in rates:
        for consumers, wait, min_bytes in ((0, 10, 1), (1, 10, 1), (2, 10, 1), (1, 10, MIN_BYTES), (1, 20, MIN_BYTES)):
            topic = f"cost{stamp}-r{rate}-c{consumers}-w{wait}-m{min_bytes}"
            create_topics(bootstrap, {topic: 4})
            feeder = Feeder(bootstrap, topic, 4, rate)
            readers = Readers(bootstrap, [[TopicPartition(topic, k, OFFSET_BEGINNING) for k in range(4)]] * consumers,
                              wait, min_bytes)
            try:
                time.sleep(2.0)
                read = readers.records
                cores = measure(pid, seconds, warm_up=0.0)
                read = round((readers.records - read) / seconds / max(1, consumers))
            finally:
                readers.close()
                feeder.close()
            held = f", fetch.min.bytes {min_bytes:,}" if min_bytes > 1 else ""
            rows.append({"phase": "load", "setup": f"produce + {consumers} consumer(s) x 4 partitions{held}",
                         "consumers": consumers, "partitions": 4, "wait_ms": wait if consumers else "", "rate": rate,
                         "broker_cores": round(cores, 3), "read_per_s": read,
                         "us_per_event": round(cores / rate * 1e6)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rates", default="2400,10000")
    ap.add_argument("--out", default="bench/results/broker_cost")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with EmbeddedStack() as stack:
        assert stack.run_dir is not None
        rows = run(stack.bootstrap_servers, broker_pid(stack.run_dir), args.seconds,
                   [int(r) for r in args.rates.split(",")])
    write_csv(out / "broker_cost.csv", rows, digits=3)
    print_plain_table("broker CPU", rows, ("phase", "setup", "wait_ms", "rate", "broker_cores", "us_per_event"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
