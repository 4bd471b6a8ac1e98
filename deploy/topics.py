"""Small Kafka helpers for tests and demos (confluent-kafka).

Works on the embedded tansu broker and on Apache Kafka.  ``read_all`` never uses
ListOffsets for end offsets (tansu under-reports them) and never joins a consumer group
(slow on tansu): it assigns every partition manually and relies on partition-EOF events.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from transport.kafka_io import ensure_topics, produce_blocking, wait_for_topics

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Record:
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    timestamp: int  # milliseconds since the epoch, -1 if unknown


def create_topics(bootstrap: str, topics: Mapping[str, int], timeout: float = 30.0,
                  replication_factor: int = 1, config: Mapping[str, str] | None = None) -> None:
    """Create ``{name: partitions}``; a topic that already exists is fine. Waits for metadata."""
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), topics, timeout, replication_factor, config)


def delete_topics(bootstrap: str, names: Iterable[str], timeout: float = 30.0) -> None:
    """Delete topics; a topic that does not exist is fine. Waits until metadata no longer shows them."""
    names = list(names)
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name, future in admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise RuntimeError(f"cannot delete topic {name!r}: {exc.args[0].str()}") from exc
    wait_for_topics(admin, dict.fromkeys(names), timeout)


def produce(bootstrap: str, topic: str, records: Iterable[Any], partition: int | None = None,
            config: Mapping[str, Any] | None = None, timeout: float = 60.0) -> int:
    """Produce records and flush; returns how many were delivered.

    Each record is either a value (bytes/str/None) or a tuple ``(key, value)`` or
    ``(key, value, headers)``. Raises RuntimeError if any delivery failed.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, **(config or {})})
    errors: list[str] = []
    count = 0

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err.str())

    extra = {} if partition is None else {"partition": partition}
    for rec in records:
        if not isinstance(rec, tuple):
            key, value, headers = None, rec, None
        elif len(rec) in (2, 3):
            key, value, headers = (*rec, None)[:3]
        else:
            raise ValueError(f"record tuples are (key, value) or (key, value, headers), got {len(rec)} items")
        produce_blocking(producer, topic, value=value, key=key, headers=headers, on_delivery=on_delivery, **extra)
        count += 1
    remaining = producer.flush(timeout)
    if remaining:
        raise RuntimeError(f"{remaining} of {count} records to {topic!r} not delivered within {timeout}s")
    if errors:
        raise RuntimeError(f"{len(errors)} of {count} records to {topic!r} failed: {errors[0]}")
    return count


def list_topics(bootstrap: str, timeout: float = 10.0) -> list[str]:
    """Names of every topic the broker has."""
    return sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout).topics)


def delete_topics_containing(bootstrap: str, text: str, timeout: float = 30.0) -> None:
    """Delete every topic whose name contains ``text`` (a run's or a test's own topics, with those its
    jobs made: they are named after the job): the embedded broker's every idempotent produce and
    transaction step costs more with each topic it keeps (docs/embedded-broker.md)."""
    delete_topics(bootstrap, [t for t in list_topics(bootstrap) if text in t], timeout)


def partitions_of(bootstrap: str, topic: str, timeout: float = 10.0) -> Sequence[int]:
    """Partition ids of an existing topic (raises RuntimeError if it does not exist).

    Asks for all topics' metadata: a metadata request naming an unknown topic makes tansu
    auto-create it (with 4 partitions), whatever allow.auto.create.topics says.
    """
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout).topics.get(topic)
    if md is None or md.error is not None or not md.partitions:
        raise RuntimeError(f"topic {topic!r} not found: {md.error if md else 'no metadata'}")
    return sorted(md.partitions)


def read_all(bootstrap: str, topic: str, idle_timeout_s: float = 1.0, max_wait_s: float = 60.0,
             config: Mapping[str, Any] | None = None, held_s: float = 10.0) -> list[Record]:
    """Read every record of ``topic`` from offset 0 of each partition.

    Returns once every partition reported EOF and nothing new arrived for ``idle_timeout_s``;
    raises TimeoutError after ``max_wait_s``. Records are in partition order, then offset order.

    A ``read_committed`` reader (the default) reaches EOF at a partition's last stable offset.
    A transaction whose commit returned may become visible a moment later (the broker writes
    its markers after answering the commit), so a partition whose EOF lies below its high
    watermark counts as read only once that EOF has not moved for ``held_s``.
    """
    parts = partitions_of(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-all-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest", "allow.auto.create.topics": False,
                         "fetch.wait.max.ms": 50,  # EOF at the end comes after an empty fetch wait
                         **(config or {})})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: dict[int, list[Record]] = {p: [] for p in parts}
        at_eof: dict[int, tuple[int, float]] = {}  # partition -> (its EOF offset, since when there)
        start = last_activity = time.monotonic()

        def settled(p: int, now: float) -> bool:
            offset, since = at_eof[p]
            high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
            return offset >= high or now - since >= held_s

        while True:
            now = time.monotonic()
            if set(at_eof) == set(parts) and now - last_activity >= idle_timeout_s \
                    and all(settled(p, now) for p in parts):
                break
            if now - start > max_wait_s:
                got = sum(len(v) for v in out.values())
                raise TimeoutError(f"read_all({topic!r}): {got} records, partitions at EOF "
                                   f"{sorted(at_eof)} of {parts} after {max_wait_s}s")
            for msg in consumer.consume(num_messages=10_000, timeout=0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        before = at_eof.get(msg.partition())
                        if before is None or before[0] != msg.offset():
                            at_eof[msg.partition()] = (msg.offset(), time.monotonic())
                        continue
                    raise RuntimeError(f"read_all({topic!r}): {err.str()}")
                at_eof.pop(msg.partition(), None)
                last_activity = time.monotonic()
                out[msg.partition()].append(Record(
                    msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                    msg.headers(), msg.timestamp()[1]))
        return [r for p in parts for r in out[p]]
    finally:
        consumer.close()
