"""The Kafka edge of KaZoo: one worker's reader and writer of the order topics of its replicas.

Each replicated partition that needs ordering has a single-partition order topic.  A worker
reads all the order topics of the replicas it hosts with one consumer (one fetch per poll for
all of them, instead of one consumer per replica) and writes the orders of the partitions it
leads with one idempotent producer (``acks=all``, no linger: an order is latency).  Records
are handed to each replica's orderer in log order; what counts is decided by the orderer from
the log alone, so every reader, here or in the other replica's worker, applies the same ones.
A record that does not decode is skipped with an error by every reader alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kazoo_leader.orders import Order
from transport.fetch_policy import FetchWaitPolicy, Pace
from transport.kafka_io import ReadyConsumers, consume_ready

log = logging.getLogger(__name__)

# The embedded broker does not complete a waiting fetch when records arrive: a reader sees an
# order up to fetch.wait.max.ms late (measured: 1 ms -> 1.2 ms p50, 100 ms -> 16 ms p50).  But it
# also lists every batch of the partition on each fetch and answers with nothing when that outlasts
# the wait (docs/embedded-broker.md): at 1 ms an order topic stops being read at about 2,000
# orders.  20 ms reads one of about 16,000 (a ten-minute soak's); on Apache Kafka a long wait
# costs no latency and could be raised.
FETCH_WAIT_MS = 20
CONSUME_BATCH = 500


@dataclass
class _Topic:
    name: str
    start_offset: int
    on_records: Callable[[list[Order]], None]
    on_failed: Callable[[Order, str], None]
    on_error: Callable[[str], None]


class OrderLog:
    """Reads and writes the order topics of one worker's replicas (register all, then start)."""

    def __init__(self, consumer_conf: Mapping[str, Any], producer_conf: Mapping[str, Any], name: str = "",
                 idle_fetch_wait_ms: int = 0, idle_after_s: float = 0.0) -> None:
        self.name = name
        self._consumer_conf = {**consumer_conf, "fetch.wait.max.ms": FETCH_WAIT_MS, "enable.auto.commit": False}
        # (no orders for a while: a longer wait, see transport.fetch_policy; never a catch-up wait)
        self.policy = FetchWaitPolicy(FETCH_WAIT_MS, idle_fetch_wait_ms, idle_after_s)
        self._consumers = ReadyConsumers(self._consumer_conf)
        self.remakes = 0  # readers made again for another fetch wait (for tests and logs)
        self._producer_conf = {**producer_conf, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
        self._topics: dict[str, _Topic] = {}
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def register(
        self,
        topic: str,
        start_offset: int,
        on_records: Callable[[list[Order]], None],
        on_failed: Callable[[Order, str], None],
        on_error: Callable[[str], None],
    ) -> Callable[[Order], None]:
        """Follow ``topic`` from ``start_offset``; returns the function that publishes to it."""
        if self._threads:
            raise RuntimeError("register order topics before the order log starts")
        if topic in self._topics:
            raise ValueError(f"order topic {topic} registered twice")
        self._topics[topic] = _Topic(topic, start_offset, on_records, on_failed, on_error)
        return lambda order: self._publish(topic, order)

    def start(self) -> None:
        if not self._topics:
            return
        self._producer = Producer(self._producer_conf)
        for target, name in ((self._read, "order-log-reader"), (self._poll_producer, "order-log-writer")):
            thread = threading.Thread(target=target, name=f"{name}-{self.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, flush_timeout_s: float = 2.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        if self._producer is not None:
            self._producer.flush(flush_timeout_s)

    # -- writing ------------------------------------------------------------------------------
    def _publish(self, topic: str, order: Order) -> None:
        if self._producer is None:
            raise RuntimeError("the order log is not started")
        entry = self._topics[topic]

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                entry.on_failed(order, str(err))

        self._producer.produce(topic, value=order.encode(), partition=0, on_delivery=delivered)

    def _poll_producer(self) -> None:
        assert self._producer is not None
        while not self._stop.is_set():
            self._producer.poll(0.05)

    # -- reading ------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            consumer = self._consumers.make(FETCH_WAIT_MS)
        except Exception as exc:  # noqa: BLE001 - surfaced to every replica's orderer
            self._fail(exc)
            return
        try:
            reading_from = {(t.name, 0): t.start_offset for t in self._topics.values()}
            consumer.assign([TopicPartition(t, k, o) for (t, k), o in reading_from.items()])
            while not self._stop.is_set():
                batches: dict[str, list[Order]] = {}
                messages = consume_ready(consumer, CONSUME_BATCH, 0.1)
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.fatal():
                            raise RuntimeError(f"Kafka consumer fatal error: {err}")
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("%s: order log consumer: %s", self.name, err)
                        continue
                    try:
                        order = Order.decode(msg.value(), offset=msg.offset())
                    except ValueError as exc:  # every reader skips the same record
                        log.error("order topic %s offset %d skipped: %s", msg.topic(), msg.offset(), exc)
                        continue
                    batches.setdefault(msg.topic(), []).append(order)
                for topic, orders in batches.items():
                    self._topics[topic].on_records(orders)
                if self.policy.on_poll(time.monotonic(), bool(messages), False) is not None:
                    consumer = self._remade(consumer, reading_from)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            consumer.close()
            self._consumers.close()

    def _remade(self, consumer: Consumer, reading_from: dict[tuple[str, int], int]) -> Consumer:
        """A reader with the fetch wait the policy asks for, reading on from where ``consumer``
        stopped (every message it returned is handled)."""
        log.info("%s: order log %s: fetching with a %d ms wait", self.name, self.policy.pace.value, self.policy.wait_ms)
        consumer = self._consumers.switch(consumer, reading_from, self.policy.wait_ms)
        self.remakes += 1
        if self.policy.pace is Pace.IDLE:  # the next order ends it: be ready
            self._consumers.make_ahead(FETCH_WAIT_MS, next(iter(reading_from))[0])
        return consumer

    def _fail(self, exc: BaseException) -> None:
        log.exception("%s: order log reader failed", self.name)
        for topic in self._topics.values():
            topic.on_error(f"{type(exc).__name__}: {exc}")
