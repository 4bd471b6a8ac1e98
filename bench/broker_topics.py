"""What the broker's count of topics costs every idempotent produce and every transaction.

    .venv/bin/python bench/broker_topics.py [--topics 150,300,600] [--out bench/results/broker_topics]

On the embedded stack (DESIGN §10), with nothing else running: the broker process's CPU (from
``/proc``) per produce request of an idempotent producer (one record of 100 bytes, flushed each
time) and per transaction of a transactional producer (10 such records, committed), on a fresh
broker, after each step of single-partition topics added (``--topics``: the totals added; a
LiveRobin heartbeat log makes one a second at its default period), and once those topics are
deleted again.  The embedded broker keeps its topics, producers and transactions in one JSON
object that it copies and writes whole on every idempotent produce and every transaction step
(``tansu-storage/src/dynostore.rs`` at v0.6.0, ``Meta``): a cost per request that grows with the
topics the broker holds.  Writes ``broker_topics.csv``.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka import Producer  # noqa: E402

from bench.broker_cost import broker_pid, process_seconds  # noqa: E402
from bench.common import print_plain_table, write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack  # noqa: E402
from deploy.topics import create_topics, delete_topics  # noqa: E402

PAYLOAD = b"x" * 100


def idempotent_produce_us(bootstrap: str, pid: int, requests: int) -> float:
    """Broker CPU (us) per produce request of an idempotent producer."""
    topic = f"idem-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 0})
    producer.produce(topic, partition=0, value=PAYLOAD)
    producer.flush(10)  # its producer id first
    start = process_seconds(pid)
    for _ in range(requests):
        producer.produce(topic, partition=0, value=PAYLOAD)
        producer.flush(10)
    return 1e6 * (process_seconds(pid) - start) / requests


def transaction_us(bootstrap: str, pid: int, transactions: int, records: int = 10) -> float:
    """Broker CPU (us) per transaction of ``records`` records."""
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "acks": "all", "linger.ms": 100})
    time.sleep(0.3)  # connected first: librdkafka's coordinator lookup waits for its timer otherwise
    producer.init_transactions(30)
    start = process_seconds(pid)
    for _ in range(transactions):
        producer.begin_transaction()
        for _ in range(records):
            producer.produce(topic, partition=0, value=PAYLOAD)
        producer.commit_transaction(30)
    return 1e6 * (process_seconds(pid) - start) / transactions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topics", default="150,300,600", help="totals of single-partition topics added, in steps")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--transactions", type=int, default=300)
    ap.add_argument("--out", default="bench/results/broker_topics")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with EmbeddedStack() as stack:
        assert stack.run_dir is not None
        bootstrap, pid = stack.bootstrap_servers, broker_pid(stack.run_dir)

        def measure(state: str, added: int) -> None:
            rows.append({"state": state, "topics_added": added,
                         "idempotent_produce_us": idempotent_produce_us(bootstrap, pid, args.requests),
                         "transaction_of_10_us": transaction_us(bootstrap, pid, args.transactions)})
            print_plain_table("broker CPU", rows[-1:], tuple(rows[-1]))

        measure("fresh", 0)
        added: list[str] = []
        for total in (int(t) for t in args.topics.split(",")):
            names = [f"seg-{i}" for i in range(len(added), total)]
            for i in range(0, len(names), 100):
                create_topics(bootstrap, {n: 1 for n in names[i:i + 100]})
            added += names
            measure("with topics added", len(added))
        for i in range(0, len(added), 100):
            delete_topics(bootstrap, added[i:i + 100])
        measure("those topics deleted", 0)
    write_csv(out / "broker_topics.csv", rows, digits=0)
    write_machine(out)
    print_plain_table("broker CPU per request (us)", rows, ("state", "topics_added", "idempotent_produce_us",
                                                            "transaction_of_10_us"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
