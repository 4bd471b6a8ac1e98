"""The Kafka edge of KaZoo: one worker's reader and writer of the order logs of its replicas.

Each replicated partition that needs ordering has an order log, a sequence of single-partition
topics (:mod:`kazoo_leader.segments`).  A worker reads all the order logs of the replicas it
hosts with one consumer (one fetch per poll for all of them, instead of one consumer per
replica), each at its current segment (and the next one near its end), and writes the orders of the partitions
it leads with one idempotent producer (``acks=all``, no linger: an order is latency) into the
segment its reader is in, making the next segments exist ahead of the readers; an order that
landed past the end of a full segment is written again into a later one.  Records are handed to
each replica's orderer in log order, with their positions; what counts is decided by the
orderer from the log alone, so every reader, here or in the other replica's worker, applies the
same ones.  A record that does not decode is skipped with an error by every reader alike.

An order written here is handed out from its delivery report (``acks=all``: it is in the log at
the offset the broker names) when every record before that offset has been read already: it is
then the log's next record, exactly what the reader would hand out on reaching it, a fetch's
round trip later (the reader then reads it as read already).  Any other record, and an order
acknowledged while records before it are unread (another writer's), waits for the reader.  So
a leader applies its own orders about a millisecond after writing them, its followers as they
read them, and every replica still applies the log's records in the log's order.

A reader that read no order for a while, while none of its replicas had input waiting, leaves its
segments and sleeps until input arrives (or this worker writes an order): an order names input
elements, and a replica with none to consume needs no order before its next input, which wakes
the reader.  On the embedded broker every fetch costs the same whether or not it finds records
(docs/embedded-broker.md), so an idle job's order logs cost it nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kazoo_leader.orders import Order
from kazoo_leader.segments import OrderCursor, SegmentedLog
from transport.kafka_io import ReadyConsumers, assign_now, consume_ready

log = logging.getLogger(__name__)

# The embedded broker does not complete a waiting fetch when records arrive: a reader sees an
# order up to fetch.wait.max.ms late (measured: 1 ms -> 1.2 ms p50, 100 ms -> 16 ms p50).  But it
# also lists every batch of the partition on each fetch and answers with nothing when that outlasts
# the wait (docs/embedded-broker.md): at 1 ms an order topic stops being read at about 2,000
# orders, 20 ms reads one of about 16,000; a segment holds far fewer.  On Apache Kafka a long wait
# costs no latency and could be raised.
FETCH_WAIT_MS = 20
CONSUME_BATCH = 500
# Segments made to exist ahead of the one written (readers read the next one before it is written).
SEGMENTS_AHEAD = 4
# How long the writer's thread waits for delivery reports (and segments to make) in one poll.
WRITER_POLL_S = 0.05
# With nothing in flight and no segment to make, the writer's thread sleeps until an order is
# written, at most this long (the producer's own error reports wait that long at worst).
WRITER_IDLE_S = 1.0
# A resting reader asks its replicas whether input waits at least this often (input that arrives
# wakes it at once: this only bounds a wake-up missed).
REST_CHECK_S = 1.0


class OrderHandOut:
    """One replica's place in its order log, fed what the reader reads and what the writer has
    acknowledged (any thread); hands each of the log's records to ``on_records`` once, in log
    order, with its position as :attr:`Order.offset`.  No I/O."""

    def __init__(self, order_log: SegmentedLog, start: int, on_records: Callable[[list[Order]], None],
                 decode: Callable[..., Any] = Order.decode) -> None:
        self.log = order_log
        self._decode = decode
        self._cursor: OrderCursor[bytes] = OrderCursor(order_log, start)
        self._on_records = on_records
        self._lock = threading.Lock()  # held while handing out: on_records sees the log in its order
        self.from_acks = 0  # records handed out from their acknowledgement, before the reader reached them

    @property
    def segment(self) -> int:
        """The segment the next record is in."""
        return self._cursor.segment

    @property
    def position(self) -> int:
        """The position of the next record to hand out: this replica reads none below it again."""
        with self._lock:
            return self._cursor.position

    def reading(self) -> tuple[dict[str, int], dict[str, int]]:
        """What to read: topic -> segment, and topic -> the offset to read it from."""
        with self._lock:
            return self._cursor.segments(), self._cursor.positions()

    def read(self, records: list[tuple[int, int, bytes]]) -> list[Order]:
        """Records ``(segment, offset, value)`` read, each segment's in their order (a record read
        already is ignored); returns the orders handed out."""
        with self._lock:
            return self._hand_out([r for segment, offset, value in records
                                   for r in self._cursor.add(segment, offset, value)])

    def acknowledged(self, segment: int, offset: int, value: bytes) -> list[Order]:
        """A record written at ``offset`` of ``segment``, as its writer's acknowledgement says:
        handed out now if every record before it has been read (it is then the log's next
        record), else left for the reader; returns the orders handed out."""
        with self._lock:
            if not self._cursor.follows(segment, offset):
                return []
            orders = self._hand_out(self._cursor.add(segment, offset, value))
            self.from_acks += len(orders)
            return orders

    def _hand_out(self, records: list[tuple[int, bytes]]) -> list[Order]:
        orders = []
        for position, value in records:
            try:
                orders.append(self._decode(value, offset=position))
            except ValueError as exc:  # every reader skips the same record
                log.error("order log %s position %d skipped: %s", self.log.prefix, position, exc)
        if orders:
            self._on_records(orders)
        return orders


@dataclass
class _Log:
    log: SegmentedLog
    hand_out: OrderHandOut
    on_failed: Callable[[Order, str], None]
    on_error: Callable[[str], None]
    pending: Callable[[], bool] | None  # whether the replica has input waiting (None: always)
    made: int = -1  # segments up to this one exist (made here or by the driver)
    assigned: dict[str, int] = field(default_factory=dict)  # its topics the reader reads -> their segment


class OrderLog:
    """Reads and writes the order logs of one worker's replicas (register all, then start).

    ``create_topics`` makes topics exist (single-partition), for the segments ahead.  The reader
    rests after ``rest_after_s`` without an order while no registered replica has input pending
    (0: never)."""

    def __init__(self, consumer_conf: Mapping[str, Any], producer_conf: Mapping[str, Any],
                 create_topics: Callable[[list[str]], None], name: str = "", rest_after_s: float = 0.0) -> None:
        self.name = name
        self._consumer_conf = {**consumer_conf, "fetch.wait.max.ms": FETCH_WAIT_MS, "enable.auto.commit": False}
        self._consumers = ReadyConsumers(self._consumer_conf)
        self.rest_after_s = rest_after_s
        self.rests = 0  # times the reader left its segments for want of input (for tests and logs)
        self._wanted = threading.Event()  # input arrived or an order was written since the reader looked
        self._unread: set[tuple[str, tuple]] = set()  # orders written here, not handed out yet (prefix, key)
        self.rewritten = 0  # orders written again, having landed past the end of a full segment
        # (no periodic metadata refresh: it names every topic the producer wrote to, and the embedded
        # broker creates a topic a metadata request names, so the segments the driver deletes came back)
        self._producer_conf = {**producer_conf, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
                               "topic.metadata.refresh.interval.ms": -1}
        self._create_topics = create_topics
        self._logs: dict[str, _Log] = {}  # by prefix
        self._to_make: dict[str, int] = {}  # prefix -> segments up to this one must exist (the writer's thread)
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._written = threading.Event()  # an order was produced (or segments asked for) since the writer looked
        self._threads: list[threading.Thread] = []

    def register(
        self,
        order_log: SegmentedLog,
        start: int,
        on_records: Callable[[list[Order]], None],
        on_failed: Callable[[Order, str], None],
        on_error: Callable[[str], None],
        pending: Callable[[], bool] | None = None,
        decode: Callable[..., Any] = Order.decode,
    ) -> Callable[[Order], None]:
        """Follow ``order_log`` from position ``start``; returns the function that publishes to it.
        Each order is handed out with its position as :attr:`Order.offset`.  ``pending``: whether
        the replica has input it has not consumed (None: the reader never rests for it); call
        :meth:`input_arrived` whenever it gets some.  ``decode``: the log's record type
        (``decode(value, offset=position)``, with ``encode()`` and ``key`` like :class:`Order`)."""
        if self._threads:
            raise RuntimeError("register order logs before the order log starts")
        if order_log.prefix in self._logs:
            raise ValueError(f"order log {order_log.prefix} registered twice")
        hand_out = OrderHandOut(order_log, start, lambda orders: self._handed_out(order_log.prefix, orders, on_records),
                                decode)
        self._logs[order_log.prefix] = entry = _Log(order_log, hand_out, on_failed, on_error, pending)
        return lambda order: self._publish(entry, order)

    def position(self, order_log: SegmentedLog) -> int:
        """Where the replica following ``order_log`` reads on (:attr:`OrderHandOut.position`)."""
        return self._logs[order_log.prefix].hand_out.position

    def start(self) -> None:
        if not self._logs:
            return
        self._producer = Producer(self._producer_conf)
        for target, name in ((self._read, "order-log-reader"), (self._write, "order-log-writer")):
            thread = threading.Thread(target=target, name=f"{name}-{self.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def input_arrived(self) -> None:
        """A registered replica got input (any thread): a resting reader reads on at once."""
        self._wanted.set()

    def close(self, flush_timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._written.set()
        self._wanted.set()
        for thread in self._threads:
            thread.join(5)
        if self._producer is not None:
            self._producer.flush(flush_timeout_s)

    # -- writing ------------------------------------------------------------------------------
    def _publish(self, entry: _Log, order: Order, segment: int | None = None) -> None:
        """Write ``order`` into ``segment`` (default: the one the reader is in)."""
        if self._producer is None:
            raise RuntimeError("the order log is not started")
        target = entry.hand_out.segment if segment is None else segment
        key = (entry.log.prefix, order.key)
        with self._lock:
            self._unread.add(key)
        if entry.made < target + 2:
            with self._lock:
                self._to_make[entry.log.prefix] = max(self._to_make.get(entry.log.prefix, -1), target + SEGMENTS_AHEAD)

        value = order.encode()

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                with self._lock:
                    self._unread.discard(key)  # (written again, if still in flight: on_failed)
                entry.on_failed(order, str(err))
                return
            again = entry.log.rewrite_segment(target, msg.offset(), entry.hand_out.segment)
            if again is not None:  # past the end of a full segment: not in the log
                self.rewritten += 1
                self._publish(entry, order, again)
                return
            entry.hand_out.acknowledged(target, msg.offset(), value)

        self._producer.produce(entry.log.topic(target), value=value, partition=0, on_delivery=delivered)
        self._written.set()
        self._wanted.set()

    def _write(self) -> None:
        """Serve the producer's delivery reports and make the segments the writers will need."""
        assert self._producer is not None
        while not self._stop.is_set():
            self._written.clear()
            if len(self._producer) == 0 and not self._to_make:
                self._written.wait(WRITER_IDLE_S)  # (set after every produce: none is missed)
                continue
            self._producer.poll(WRITER_POLL_S)
            with self._lock:
                wanted, self._to_make = self._to_make, {}
            for prefix, upto in wanted.items():
                entry = self._logs[prefix]
                if upto <= entry.made:
                    continue
                try:
                    self._create_topics([entry.log.topic(n) for n in range(entry.made + 1, upto + 1)])
                    entry.made = upto
                except Exception as exc:  # noqa: BLE001 - asked again by the next order
                    log.warning("%s: order log %s: cannot make segments up to %d: %s", self.name, prefix, upto, exc)

    def _handed_out(self, prefix: str, orders: list[Order], on_records: Callable[[list[Order]], None]) -> None:
        """The log's next records, read or acknowledged (under the log's hand-out lock)."""
        on_records(orders)
        if self._unread:
            with self._lock:
                self._unread.difference_update((prefix, o.key) for o in orders)

    @property
    def awaiting(self) -> int:
        """Orders written here and not handed out yet (the reader does not rest while there are)."""
        with self._lock:
            return len(self._unread)

    # -- reading ------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            consumer = self._consumers.make(FETCH_WAIT_MS)
        except Exception as exc:  # noqa: BLE001 - surfaced to every replica's orderer
            self._fail(exc)
            return
        try:
            assigned: dict[str, tuple[_Log, int]] = {}  # topics read -> their log and segment
            last_read = time.monotonic()
            while not self._stop.is_set():
                for entry in self._logs.values():
                    wanted, positions = entry.hand_out.reading()
                    if entry.assigned != wanted:
                        self._follow(consumer, entry, assigned, wanted, positions)
                read_now: dict[str, list[tuple[int, int, bytes]]] = {}  # prefix -> (segment, offset, value)
                messages = consume_ready(consumer, CONSUME_BATCH, 0.1)
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.fatal():
                            raise RuntimeError(f"Kafka consumer fatal error: {err}")
                        if err.code() not in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                            log.warning("%s: order log consumer: %s", self.name, err)
                        continue
                    read = assigned.get(msg.topic())
                    if read is None:
                        continue  # a segment left already
                    entry, segment = read
                    read_now.setdefault(entry.log.prefix, []).append((segment, msg.offset(), msg.value()))
                for prefix, records in read_now.items():
                    self._logs[prefix].hand_out.read(records)
                now = time.monotonic()
                if read_now:
                    last_read = now
                elif self.rest_after_s and now - last_read >= self.rest_after_s and self._may_rest():
                    self._rest(consumer, assigned)
                    last_read = time.monotonic()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            consumer.close()
            self._consumers.close()

    @staticmethod
    def _follow(consumer: Consumer, entry: _Log, assigned: dict[str, tuple[_Log, int]],
                wanted: dict[str, int], positions: dict[str, int]) -> None:
        """Read the segments ``wanted`` (topic -> segment, from ``positions``) of ``entry``'s log, and
        no other of it."""
        left = [TopicPartition(topic, 0) for topic in entry.assigned.keys() - wanted.keys()]
        if left:
            consumer.incremental_unassign(left)
        for tp in left:
            assigned.pop(tp.topic, None)
        new = [TopicPartition(topic, 0, positions[topic]) for topic in wanted.keys() - entry.assigned.keys()]
        if new:
            assign_now(consumer, new)
        for tp in new:
            assigned[tp.topic] = (entry, wanted[tp.topic])
        entry.assigned = wanted

    def _may_rest(self) -> bool:
        """No registered replica has input waiting and every order written here was handed out
        (checked after clearing the wake-up: what comes from now on wakes the rest this may start)."""
        self._wanted.clear()
        with self._lock:
            if self._unread:
                return False
        return not any(entry.pending is None or entry.pending() for entry in self._logs.values())

    def _rest(self, consumer: Consumer, assigned: dict[str, tuple[_Log, int]]) -> None:
        """Fetch nothing until a replica gets input, this worker writes an order, or the reader
        stops; then every cursor's segments are assigned again where it is.  (Not a pause: a
        resumed partition of librdkafka's was fetched up to a second later, an assigned one at once.)"""
        consumer.incremental_unassign([TopicPartition(topic, 0) for topic in assigned])
        assigned.clear()
        for entry in self._logs.values():
            entry.assigned = {}
        self.rests += 1
        log.debug("%s: order logs resting (no input waiting)", self.name)
        while not self._stop.is_set():
            if self._wanted.wait(REST_CHECK_S) or not self._may_rest():
                break

    def _fail(self, exc: BaseException) -> None:
        log.exception("%s: order log reader failed", self.name)
        for entry in self._logs.values():
            entry.on_error(f"{type(exc).__name__}: {exc}")
