"""Kafka client I/O shared by the runtime, the protocol packages, the tools and the tests
(confluent-kafka).

Works on Apache Kafka and on the embedded broker: end offsets come from a fetch,
never from ListOffsets (DESIGN §10), and metadata requests never name a topic
(the embedded broker auto-creates topics named in a metadata request).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)


class KafkaUnavailable(RuntimeError):
    """The brokers could not be reached or did not answer in time."""


def topic_partitions(admin: AdminClient, topics: Iterable[str], timeout: float = 10.0) -> dict[str, int]:
    """Partition counts of the existing ``topics`` (missing ones are absent from the result)."""
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException as err:
        reason = err.args[0].str() if err.args and hasattr(err.args[0], "str") else str(err)
        raise KafkaUnavailable(f"cannot read Kafka metadata: {reason}") from err
    wanted = set(topics)
    return {name: len(t.partitions) for name, t in md.topics.items() if name in wanted and t.error is None}


def ensure_topics(admin: AdminClient, topics: Mapping[str, int], timeout: float = 10.0,
                  replication_factor: int = -1, config: Mapping[str, str] | None = None) -> list[str]:
    """Create the topics of ``topics`` (name -> partitions) that do not exist yet and wait until
    metadata shows them; returns the created ones.  A topic that exists keeps its partition count,
    even below the one asked for (a sink of more partitions than its topic writes partition
    ``p mod N``: a job restored from a savepoint at a higher parallelism, for one)."""
    existing = topic_partitions(admin, topics, timeout)
    missing = [NewTopic(name, num_partitions=n, replication_factor=replication_factor, config=dict(config or {}))
               for name, n in topics.items() if name not in existing]
    created = []
    if missing:
        for name, fut in admin.create_topics(missing, operation_timeout=timeout, request_timeout=timeout).items():
            try:
                fut.result(timeout)
                created.append(name)
            except KafkaException as err:
                if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise KafkaUnavailable(f"cannot create topic {name!r}: {err.args[0].str()}") from err
    wait_for_topics(admin, {name: n for name, n in topics.items() if name not in existing}, timeout)
    return created


def wait_for_topics(admin: AdminClient, expected: Mapping[str, int | None], timeout: float) -> None:
    """Wait until metadata shows each topic (with at least the expected partition count), or,
    for an expected count of None, no longer shows it."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=max(0.5, deadline - time.monotonic())).topics
        pending = [
            name for name, parts in expected.items()
            if (parts is None and name in topics and topics[name].error is None)
            or (parts is not None and (name not in topics or topics[name].error is not None
                                       or len(topics[name].partitions) < parts))
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic metadata not settled after {timeout}s: {pending}")
        time.sleep(0.05)


def produce_blocking(producer: Producer, topic: str, **kwargs: Any) -> None:
    """``producer.produce`` that waits (serving delivery reports) while the local queue is full."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            break
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)


def consume_ready(consumer: Consumer, max_messages: int, timeout: float) -> list[Any]:
    """The messages available now (at most ``max_messages``), waiting up to ``timeout`` only for
    the first.  ``Consumer.consume`` itself waits out its whole timeout unless ``max_messages``
    arrive, which adds the timeout to the latency of every control record read with it."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(num_messages=max_messages - 1, timeout=0)] if max_messages > 1 else [first]


def resume_now(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Resume paused ``partitions`` and fetch them at once.  librdkafka's resume alone left a
    partition unfetched for 0.7-1.0 s on the embedded broker (a probe: a record produced while
    paused was read back up to a second after the resume; under a millisecond after a seek), so
    each is sought to where reading goes on: its offset if it carries one, else the consumer's
    position (none known: left to the resume)."""
    consumer.resume(partitions)
    known = [tp for tp in partitions if tp.offset >= 0]
    rest = [TopicPartition(tp.topic, tp.partition) for tp in partitions if tp.offset < 0]
    for tp in known + [tp for tp in (consumer.position(rest) if rest else []) if tp.offset >= 0]:
        consumer.seek(tp)


def assign_now(consumer: Consumer, partitions: list[TopicPartition], timeout: float = 1.0) -> None:
    """Add ``partitions`` to ``consumer``'s assignment and fetch them at once.  A partition of a
    topic the consumer did not read before was first fetched about a second after librdkafka's
    incremental assign (once its periodic topic scan asked the broker for the topic; a probe on
    the embedded broker: 1.0 s, against 20 ms for another partition of a topic it reads), so the
    topics' metadata is asked for first (if that fails, the scan still finds them)."""
    for topic in dict.fromkeys(tp.topic for tp in partitions):
        try:
            consumer.list_topics(topic, timeout=timeout)
        except KafkaException:
            pass
    consumer.incremental_assign(partitions)


def admin_client(conf: Mapping[str, Any]) -> AdminClient:
    return AdminClient(dict(conf))


class TopicMaker:
    """Makes single-partition topics exist (a segmented log's next segments), and deletes those no
    reader needs any more, through one admin client, made on first use and kept: a new client
    costs a connection and a metadata round trip, about 55 ms on the embedded broker, against
    1-4 ms for creating three topics with one kept."""

    def __init__(self, admin_conf: Mapping[str, Any]) -> None:
        self._conf = dict(admin_conf)
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()

    def _client(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = admin_client(self._conf)
            return self._admin

    def __call__(self, topics: list[str]) -> None:
        ensure_topics(self._client(), dict.fromkeys(topics, 1))

    def delete(self, topics: list[str]) -> None:
        """Ask for ``topics`` to be deleted, without waiting; a failure is logged (a topic that is
        gone already is not one), and the topic stays."""
        if not topics:
            return
        for name, future in self._client().delete_topics(topics, operation_timeout=10, request_timeout=10).items():
            future.add_done_callback(lambda f, name=name: _deleted(name, f))


def _deleted(name: str, future: Any) -> None:
    err = future.exception()
    if err is not None and not (isinstance(err, KafkaException) and
                                err.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        log.warning("topic %s not deleted: %s", name, err)


def end_offsets_by_fetch(consumer_conf: Mapping[str, Any], topic: str, partitions: Iterable[int],
                         timeout: float = 10.0) -> dict[int, int]:
    """The current end offset of each partition, read from the high watermark of a real fetch.

    Not from ListOffsets: the embedded broker under-reports it (DESIGN §10), and
    librdkafka's OFFSET_END goes through ListOffsets too.
    """
    parts = list(partitions)
    consumer = Consumer({**consumer_conf, "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    try:
        consumer.assign([TopicPartition(topic, k, OFFSET_BEGINNING) for k in parts])
        deadline = time.monotonic() + timeout
        ends: dict[int, int] = {}
        while len(ends) < len(parts):
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"no fetch response for {topic} partitions {sorted(set(parts) - set(ends))}")
            consumer.consume(num_messages=1, timeout=0.05)
            for k in parts:
                high = consumer.get_watermark_offsets(TopicPartition(topic, k), cached=True)[1]
                if high >= 0:
                    ends[k] = high
        return ends
    finally:
        consumer.close()


class ReadyConsumers:
    """Consumers of one config, made with a given ``fetch.wait.max.ms``; one can be made ahead.

    A new client's first request waits for its connection (about 50 ms on the embedded broker,
    now and then), so a consumer made again to switch back to its short fetch wait would leave
    the records that arrive meanwhile waiting; :meth:`make_ahead` connects the next one early."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = dict(conf)
        self._ahead: tuple[int, Consumer] | None = None

    def make(self, wait_ms: int) -> Consumer:
        """A consumer with ``wait_ms`` (the one made ahead if it has that wait)."""
        if self._ahead is not None and self._ahead[0] == wait_ms:
            consumer, self._ahead = self._ahead[1], None
            return consumer
        self.close()
        return Consumer({**self._conf, "fetch.wait.max.ms": wait_ms})

    def switch(self, old: Consumer, reading_from: dict[tuple[str, int], int], wait_ms: int) -> Consumer:
        """Close ``old``; a consumer with ``wait_ms`` reading every partition of ``reading_from``
        on from ``old``'s position, or, where ``old`` returned no message of it (librdkafka knows
        no position before one), from the offset it holds there (where ``old`` started).
        ``reading_from`` is moved on to those positions."""
        for tp in old.position([TopicPartition(t, k) for t, k in reading_from]):
            if tp.offset >= 0:
                reading_from[(tp.topic, tp.partition)] = tp.offset
        old.close()
        consumer = self.make(wait_ms)
        assign_now(consumer, [TopicPartition(t, k, o) for (t, k), o in reading_from.items()])
        return consumer

    def make_ahead(self, wait_ms: int, topic: str) -> None:
        """Make the next consumer now and connect it by asking for ``topic``'s metadata (a topic
        that exists: the embedded broker creates topics a metadata request names)."""
        self.close()
        consumer = Consumer({**self._conf, "fetch.wait.max.ms": wait_ms})
        try:
            consumer.list_topics(topic, timeout=1.0)
        except KafkaException:
            pass  # (connected or not, it is made)
        self._ahead = (wait_ms, consumer)

    def close(self) -> None:
        """Close the consumer made ahead, if any."""
        if self._ahead is not None:
            self._ahead[1].close()
            self._ahead = None
