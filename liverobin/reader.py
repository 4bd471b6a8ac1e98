"""One reader of the heartbeat log per worker process, shared by its source replicas.

A consumer per source replica would make the broker answer one fetch per pulse per replica
(hundreds per second at a 10 ms period); one per worker is enough, because what counts in
the log is decided by the log alone (:class:`liverobin.heartbeats.PulseLog`): every reader,
in this worker or another, hands out the same counted pulses in the same order.  The worker's
reader fetches through feeds of the consumer its sources share (one fetch per wait for both); a
restored source's own reader, which starts further back in the log, has a consumer of its own.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from liverobin.heartbeats import PulseLog, PulseRecord
from liverobin.segments import HeartbeatLog, LogCursor
from transport.kafka_feeds import PartitionFeed, SharedConsumer
from transport.kafka_io import consume_ready

log = logging.getLogger(__name__)

FETCH_WAIT_MS = 5
# Through the worker's shared consumer: the most records a segment's feed holds before it is paused
# (never reached: the reader takes what arrives at once), and the longest wait with nothing new
# (every arrival sets the bell: a bound on a missed one, not a poll).
FEED_LIMIT = 100_000
FEED_IDLE_WAIT_S = 1.0


class PulseSubscription:
    """The counted pulses for one source replica, in log order."""

    def __init__(self, reader: PulseReader) -> None:
        self._reader = reader
        self._items: deque[PulseRecord] = deque()
        # called by the reader's thread after it handed pulses over (or failed): lets a source that
        # waits on something else too (its records) be woken by a pulse
        self.on_pulse: Callable[[], None] | None = None

    def take(self) -> list[PulseRecord]:
        """Every pulse not taken yet (the reader rings ``on_pulse`` when one comes)."""
        with self._reader._lock:
            if self._reader.error is not None:
                raise RuntimeError(f"heartbeat log reader failed: {self._reader.error}")
            items = list(self._items)
            self._items.clear()
            return items


class PulseReader:
    """Reads the heartbeat log from this run's start, or right after ``after`` (a counted record
    read earlier: a restored source needs nothing before the last pulse it placed), and hands
    every counted pulse to each subscription.  It reads the log's current segment and the next
    one (:class:`liverobin.segments.LogCursor`)."""

    def __init__(self, heartbeat_log: HeartbeatLog, consumer_conf: Mapping[str, Any],
                 after: PulseRecord | None = None, shared: SharedConsumer | None = None) -> None:
        self.log = heartbeat_log
        self.cursor = LogCursor(heartbeat_log, after)
        self._conf = {**consumer_conf, "fetch.wait.max.ms": FETCH_WAIT_MS, "enable.auto.commit": False}
        # read through feeds of this consumer (the worker's sources' one) instead of one of its own
        self._shared = shared
        self._bell = threading.Event()
        self._subs: list[PulseSubscription] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.caught_up = threading.Event()  # read the log to its end as it was after reading began

    @property
    def pulses(self) -> PulseLog:
        """What this reader counted so far."""
        return self.cursor.pulses

    def subscribe(self) -> PulseSubscription:
        """A subscription from the first record read (before :meth:`start` only)."""
        if self._thread is not None:
            raise RuntimeError("subscribe before the reader starts: a late subscriber would miss pulses")
        sub = PulseSubscription(self)
        self._subs.append(sub)
        return sub

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="pulse-reader", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._bell.set()
        if self._thread is not None:
            self._thread.join(5)

    def _main(self) -> None:
        if self._shared is not None:
            self._read_feeds(self._shared)
            return
        try:
            consumer = Consumer(self._conf)
        except Exception as exc:  # noqa: BLE001 - surfaced to every source through take()
            self._fail(exc)
            return
        try:
            cursor = self.cursor
            segments: dict[str, int] = {}  # the topics assigned -> their segment
            while not self._stop.is_set():
                if set(segments.values()) != {cursor.segment, cursor.segment + 1}:
                    segments = cursor.segments()
                    consumer.assign([TopicPartition(topic, 0, offset) for topic, offset in cursor.positions().items()])
                counted = self._count(consume_ready(consumer, 500, 0.1), segments)
                if counted:
                    self._hand_over(counted)
                current = TopicPartition(self.log.topic(cursor.segment), 0)
                if not self.caught_up.is_set() and self._at_end(consumer.get_watermark_offsets(current, cached=True)[1]):
                    self.caught_up.set()  # (after handing out what it read)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            consumer.close()

    def _read_feeds(self, shared: SharedConsumer) -> None:
        """:meth:`_main` through feeds of the worker's shared consumer: the sources and the log
        are read by one fetch per wait, and the broker serves one consumer less per worker."""
        feeds: dict[str, PartitionFeed] = {}
        cursor = self.cursor
        segments: dict[str, int] = {}  # the topics read -> their segment
        try:
            while not self._stop.is_set():
                if set(segments.values()) != {cursor.segment, cursor.segment + 1}:
                    segments, positions = cursor.segments(), cursor.positions()
                    for topic in feeds.keys() - segments.keys():
                        feeds.pop(topic).close()
                    for topic in segments.keys() - feeds.keys():
                        feeds[topic] = shared.open(topic, {0: positions[topic]}, limit=FEED_LIMIT, bell=self._bell,
                                                   is_input=False)  # (pulses are written while idle too)
                self._bell.clear()  # (cleared before the feeds are read: nothing set after it is missed)
                counted, read = [], 0
                for feed in list(feeds.values()):
                    messages = feed.consume(500, 0)
                    read += len(messages)
                    counted += self._count(messages, segments)
                if counted:
                    self._hand_over(counted)
                current = feeds.get(self.log.topic(cursor.segment))  # (none: two segments done in one round)
                if not self.caught_up.is_set() and current is not None and self._at_end(current.high_watermark(0)):
                    self.caught_up.set()  # (after handing out what it read)
                if not read:
                    self._bell.wait(FEED_IDLE_WAIT_S)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            for feed in feeds.values():
                feed.close()

    def _count(self, messages: list[Any], segments: Mapping[str, int]) -> list[PulseRecord]:
        """The records that count among ``messages`` read from the log's ``segments`` (topic ->
        segment), in order."""
        counted: list[PulseRecord] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise RuntimeError(f"Kafka consumer fatal error: {err}")
                continue  # e.g. the next segment's topic not known to the client yet
            segment = segments.get(msg.topic())
            if segment is None:
                continue  # a segment left already
            try:
                record = PulseRecord.decode(msg.value(), at=msg.offset())
            except ValueError as exc:  # every reader skips the same record
                log.error("heartbeat log %s offset %d skipped: %s", msg.topic(), msg.offset(), exc)
                continue
            counted += self.cursor.add(segment, record)
        return counted

    def _hand_over(self, counted: list[PulseRecord]) -> None:
        """Give every subscription the pulses counted, then ring those that asked to be rung."""
        with self._lock:
            for sub in self._subs:
                sub._items.extend(counted)
        self._ring()

    def _at_end(self, high: int) -> bool:
        """The current segment read up to ``high``, the high watermark a fetch made since reading
        began reported (-1: none yet; the segments after it are empty until it completes)."""
        cursor = self.cursor
        return cursor.pulses.final or 0 <= high <= cursor.next_offset(cursor.segment)

    def _fail(self, exc: BaseException) -> None:
        log.exception("heartbeat log reader failed")
        with self._lock:
            self.error = f"{type(exc).__name__}: {exc}"
        self._ring()

    def _ring(self) -> None:
        for sub in self._subs:
            if sub.on_pulse is not None:
                sub.on_pulse()
