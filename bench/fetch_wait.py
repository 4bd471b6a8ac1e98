"""Does the broker answer a waiting fetch as soon as a record arrives?  Latency by ``fetch.wait.max.ms``.

    .venv/bin/python bench/fetch_wait.py [--waits 10,100,500] [--records 20] [--idle-waits 0,100,200,500]
                                         [--bootstrap HOST:PORT]
                                         [--out bench/results/fetch_wait]

A consumer following one partition (nothing else on it) with ``fetch.wait.max.ms`` = each of
``--waits``; a producer writes one record at a time, ``--records`` times, 137 ms apart (not a
multiple of any wait); per wait, the median and worst produce-to-consume latency.  A broker that
completes a waiting fetch when a record arrives (Apache Kafka) shows the same few milliseconds at
every wait, so consumers can long-poll for free; one that answers only when the wait ends shows
latencies growing with the wait, so every consumer must poll with short waits and the broker serves
hundreds of empty fetches a second per consumer.

Then how long a new reader of an empty partition takes to learn it is at the end (its first
end-of-partition event), per wait and per start: offset 0, or librdkafka's logical
``OFFSET_BEGINNING``, which it resolves with an offset lookup first (a takeover's scan starts a
reader like this, and the new writer's output waits for it).  And how long a new transactional
producer's ``init_transactions`` takes, called at once after the producer is made or after it had
0.3 s to connect (a takeover fences the old writer with it).  And what a worker's idle consumer
costs the first record after a pause: a ``SharedConsumer`` (10 ms wait) that found nothing for
half a second fetches with ``idle_fetch_wait_ms`` (0: it keeps 10 ms), then ten records 10 ms
apart: the produce-to-consume latency of the first and the worst of the next nine (read while the
consumer is made again with its short wait), per idle wait (``spark.replication.kafka.idleFetchWait``).  Without
``--bootstrap`` it runs on the embedded stack (DESIGN §10).  Writes ``fetch_wait.csv``,
``first_end.csv``, ``first_txn.csv`` and ``idle_resume.csv``.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from bench.common import print_plain_table, write_csv  # noqa: E402
from deploy.stack import EmbeddedStack  # noqa: E402
from deploy.topics import create_topics  # noqa: E402
from transport.fetch_policy import Pace  # noqa: E402
from transport.kafka_feeds import SharedConsumer  # noqa: E402

IDLE_AFTER_S = 0.5


def latencies(bootstrap: str, topic: str, wait_ms: int, records: int) -> list[float]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fetch-wait-{wait_ms}",
                         "fetch.wait.max.ms": wait_ms, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    while consumer.consume(1000, timeout=0.5):  # what earlier waits wrote
        pass
    out = []
    for _ in range(records):
        producer.produce(topic, value=repr(time.time()).encode())
        producer.flush()
        msgs: list = []
        while not msgs:
            msgs = [m for m in consumer.consume(1, timeout=2.0) if m.error() is None]
        out.append((time.time() - float(msgs[0].value())) * 1000)
        time.sleep(0.137)
    consumer.close()
    return sorted(out)


def first_end_s(bootstrap: str, topic: str, wait_ms: int, start: int) -> float:
    """Seconds from a new reader's creation to its first end-of-partition event on ``topic``[0]."""
    started = time.monotonic()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"first-end-{wait_ms}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.wait.max.ms": wait_ms, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        while time.monotonic() - started < 10:
            for msg in consumer.consume(1000, timeout=0.01):
                if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                    return time.monotonic() - started
        raise TimeoutError(f"no end of {topic}[0] within 10 s")
    finally:
        consumer.close()


def init_transactions_s(bootstrap: str, connected_for_s: float) -> float:
    """Seconds a new transactional producer's ``init_transactions`` takes, ``connected_for_s`` after
    it was made."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"first-txn-{time.time_ns()}"})
    time.sleep(connected_for_s)
    started = time.monotonic()
    producer.init_transactions(30)
    return time.monotonic() - started


def after_idle_ms(bootstrap: str, topic: str, idle_wait_ms: int, pauses: int) -> tuple[list[float], list[float]]:
    """After each pause long enough to go idle, ten records 10 ms apart: the produce-to-consume
    latency of the first, and the worst of the nine after it (written while the consumer is made
    again with the short wait)."""
    shared = SharedConsumer({"bootstrap.servers": bootstrap, "group.id": f"idle-{idle_wait_ms}",
                             "fetch.wait.max.ms": 10}, name="bench", idle_fetch_wait_ms=idle_wait_ms,
                            idle_after_s=IDLE_AFTER_S)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    firsts, rests = [], []
    try:
        feed = shared.open(topic, {0: 0}, limit=10_000)
        while feed.consume(1000, 0.5):  # what earlier runs wrote
            pass
        for _ in range(pauses):
            time.sleep(IDLE_AFTER_S + 0.3 + random.random() * 0.3)  # (not in step with the wait)
            assert idle_wait_ms == 0 or shared.policy.pace is Pace.IDLE, shared.policy.pace
            writer = threading.Thread(target=_write_ten, args=(producer, topic))
            writer.start()
            latencies: list[float] = []
            while len(latencies) < 10:
                latencies += [(time.time() - float(m.value())) * 1000 for m in feed.consume(10, 2.0) if m.error() is None]
            writer.join()
            firsts.append(latencies[0])
            rests.append(max(latencies[1:]))
    finally:
        shared.close()
    return sorted(firsts), sorted(rests)


def _write_ten(producer: Producer, topic: str) -> None:
    for _ in range(10):
        producer.produce(topic, value=repr(time.time()).encode(), partition=0)
        producer.flush()
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--waits", default="10,100,500")
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--idle-waits", default="0,100,200,500")
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--out", default="bench/results/fetch_wait")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(EmbeddedStack()).bootstrap_servers
        topic = f"fetch-wait-{int(time.time() * 1000) % 10**10}"
        create_topics(bootstrap, {topic: 1})
        waits = [int(w) for w in args.waits.split(",")]
        for wait in waits:
            lat = latencies(bootstrap, topic, wait, args.records)
            rows.append({"fetch_wait_max_ms": wait, "records": len(lat), "p50_ms": round(lat[len(lat) // 2], 1),
                         "max_ms": round(lat[-1], 1)})
        empty = f"{topic}-empty"
        create_topics(bootstrap, {empty: 1})
        ends = []
        for wait in waits:
            for start, label in ((0, "offset 0"), (OFFSET_BEGINNING, "OFFSET_BEGINNING")):
                seconds = sorted(first_end_s(bootstrap, empty, wait, start) for _ in range(3))
                ends.append({"fetch_wait_max_ms": wait, "start": label, "median_ms": round(seconds[1] * 1000, 1),
                             "max_ms": round(seconds[-1] * 1000, 1)})
        txns = []
        for connected_for_s in (0.0, 0.3):
            seconds = sorted(init_transactions_s(bootstrap, connected_for_s) for _ in range(5))
            txns.append({"made_before_s": connected_for_s, "median_ms": round(seconds[2] * 1000, 1),
                         "min_ms": round(seconds[0] * 1000, 1), "max_ms": round(seconds[-1] * 1000, 1)})
        resumes = []
        for idle_wait in (int(w) for w in args.idle_waits.split(",") if w):
            firsts, rests = after_idle_ms(bootstrap, topic, idle_wait, args.records)
            resumes.append({"idle_fetch_wait_ms": idle_wait, "pauses": len(firsts),
                            "first_p50_ms": round(firsts[len(firsts) // 2], 1), "first_max_ms": round(firsts[-1], 1),
                            "next_nine_p50_ms": round(rests[len(rests) // 2], 1), "next_nine_max_ms": round(rests[-1], 1)})
    write_csv(out / "fetch_wait.csv", rows, digits=1)
    write_csv(out / "idle_resume.csv", resumes, digits=1)
    write_csv(out / "first_end.csv", ends, digits=1)
    write_csv(out / "first_txn.csv", txns, digits=1)
    print_plain_table("produce-to-consume latency by fetch.wait.max.ms", rows, tuple(rows[0]))
    print_plain_table("a new reader of an empty partition: its first end-of-partition event", ends, tuple(ends[0]))
    print_plain_table("a new transactional producer's init_transactions", txns, tuple(txns[0]))
    if resumes:
        print_plain_table("the first record after an idle pause, by idle fetch wait", resumes, tuple(resumes[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
