"""One Kafka consumer per worker process, shared by every source replica it hosts.

A source replica opens a :class:`PartitionFeed` on the Kafka partitions it reads; one fetch
thread (:class:`SharedConsumer`) polls the consumer and hands each message to its partition's
feed.  A worker then makes one fetch per wait for all its sources, instead of one per source
replica, and runs one set of librdkafka threads: the broker serves a fraction of the empty
fetches, and the threads of a worker no longer grow with the source replicas it hosts.

Every call on the consumer is made by the fetch thread: confluent-kafka serialises the calls
made on one consumer from several threads (a call waits until a concurrent poll returns, and a
thread that polls again at once can starve it).  So a feed queues its pause, resume and close
for the fetch thread, and reads positions and watermarks the thread recorded.

A feed's :meth:`PartitionFeed.position` keeps the meaning the sources' pulse placement needs:
every record of the partition below it has been handed to the feed's reader (or was no record:
a transaction marker).  Back-pressure stays per feed: a feed holding more than its limit has its
partitions paused until its reader takes it below half of it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from transport.fetch_policy import FetchWaitPolicy, Pace
from transport.kafka_io import ReadyConsumers, assign_now, consume_ready, resume_now

log = logging.getLogger(__name__)

# How long the fetch thread waits in one poll when nothing arrives: bounds how late a feed's
# queued pause, resume or close is applied (the consumer cannot be woken from another thread).
POLL_WAIT_S = 0.02
# The same while the consumer fetches with its idle wait (nothing is read, and a poll's
# bookkeeping of every feed was half of an idle worker's Python work).
IDLE_POLL_WAIT_S = 0.1
# Messages taken from the consumer per poll.
POLL_BATCH = 2000
# librdkafka's offset for "no position yet".
NO_POSITION = -1001
# (partition, low watermark, high watermark), called by the fetch thread when a fetch moved the high
# watermark: every record below it exists, whether the feed's reader took it or not
HighWatermarkCallback = Callable[[int, int, int], None]


class FeedClosed(RuntimeError):
    """The feed was closed, or its consumer stopped."""


class PartitionFeed:
    """The messages of some partitions of one topic, for one reader thread.

    Created by :meth:`SharedConsumer.open`.  ``consume``, ``position``, ``low_watermark``,
    ``pause``, ``resume`` and ``close`` are for the reader; the fetch thread appends."""

    def __init__(self, owner: SharedConsumer, feed_id: int, topic: str, starts: Mapping[int, int],
                 limit: int, on_high: HighWatermarkCallback | None = None,
                 bell: threading.Event | None = None, is_input: bool = True) -> None:
        self._owner = owner
        self.is_input = is_input  # its records count as the job's input (a log of control records does not)
        self.on_high = on_high
        self.bell = bell  # set whenever a consume could return more (a reader of several feeds waits on it)
        self.id = feed_id
        self.topic = topic
        self.partitions = list(starts)
        self.starts = dict(starts)
        self.limit = max(1, limit)
        self._cond = threading.Condition()
        self._buffer: deque[Any] = deque()
        self._buffered = {k: 0 for k in self.partitions}
        # next offset after the last message handed to the reader (None: none yet)
        self._taken: dict[int, int | None] = {k: None for k in self.partitions}
        # next offset after the last message appended (drops a re-fetched one)
        self._appended: dict[int, int] = {k: o for k, o in starts.items() if o >= 0}
        self._fetched: dict[int, int] = {}  # the consumer's position, recorded with the last append
        self._low: dict[int, int] = {}
        self._high: dict[int, int] = {}
        self._woken = False
        self.reader_paused = False  # the reader asked for a pause (it holds records of its own)
        self.full = False  # paused by the fetch thread: more than ``limit`` buffered
        self.closed = False
        self.error: str | None = None
        self.assigned = False  # (the fetch thread's) its partitions were assigned

    # -- the reader ---------------------------------------------------------------------------
    def consume(self, max_messages: int, timeout: float) -> list[Any]:
        """Up to ``max_messages`` messages, waiting up to ``timeout`` for the first one (less if
        :meth:`wake` is called)."""
        with self._cond:
            if not self._buffer and timeout > 0 and not self._woken and not self.closed:
                self._cond.wait(timeout)
            self._woken = False
            if self.error is not None:
                raise FeedClosed(self.error)
            n = min(max_messages, len(self._buffer))
            out = [self._buffer.popleft() for _ in range(n)]
            for msg in out:
                if msg.error() is None:
                    k = msg.partition()
                    self._buffered[k] -= 1
                    self._taken[k] = msg.offset() + 1
            resume = self.full and not self._over_limit()
        if resume:
            self._owner.request(self)
        return out

    def position(self, partition: int) -> int:
        """An offset below which every record of ``partition`` was handed to the reader;
        :data:`NO_POSITION` while not known (nothing fetched and no start offset)."""
        with self._cond:
            if self._buffered.get(partition, 0) == 0 and partition in self._fetched:
                return self._fetched[partition]  # (past transaction markers too)
            taken = self._taken.get(partition)
            if taken is not None:
                return taken
            start = self.starts.get(partition, -1)
            return start if start >= 0 else NO_POSITION

    def low_watermark(self, partition: int) -> int:
        """The partition's low watermark from the last fetch (-1: none yet)."""
        with self._cond:
            return self._low.get(partition, -1)

    def high_watermark(self, partition: int) -> int:
        """The partition's high watermark from the last fetch (-1: none yet): every record below
        it exists, read by this feed or not."""
        with self._cond:
            return self._high.get(partition, -1)

    def pause(self) -> None:
        """Stop fetching for this feed (what is buffered can still be consumed)."""
        if not self.reader_paused:
            self.reader_paused = True
            self._owner.request(self)

    def resume(self) -> None:
        if self.reader_paused:
            self.reader_paused = False
            self._owner.request(self)

    def wake(self) -> None:
        """End a :meth:`consume` wait now (any thread)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop reading; the partitions are unassigned."""
        with self._cond:
            self.closed = True
            self._buffer.clear()
            self._cond.notify_all()
        self._owner.request(self)

    @property
    def buffered(self) -> int:
        with self._cond:
            return len(self._buffer)

    def _over_limit(self) -> bool:
        """Whether the feed should be paused for what it holds: over its limit, or, once paused
        so, until its reader took it to half of it."""
        return len(self._buffer) > (self.limit // 2 if self.full else self.limit)

    # -- the fetch thread ---------------------------------------------------------------------
    def _append(self, messages: list[Any], fetched: Mapping[int, int], low: Mapping[int, int],
                high: Mapping[int, int]) -> list[int]:
        """Hand ``messages`` over and record where the consumer is; the partitions whose high
        watermark moved."""
        with self._cond:
            if self.closed:
                return []
            moved = [k for k, h in high.items() if h > self._high.get(k, -1)]
            for msg in messages:
                k = msg.partition()
                if msg.error() is None:
                    if msg.offset() < self._appended.get(k, -1):
                        continue  # fetched again after a pause (it was handed over before)
                    self._appended[k] = msg.offset() + 1
                    self._buffered[k] += 1
                self._buffer.append(msg)
            moved_on = any(self._fetched.get(k) != o for k, o in fetched.items())
            self._fetched.update(fetched)
            self._low.update(low)
            self._high.update(high)
            if moved_on and not self._buffer:  # past transaction markers only: kept for the next wait
                self._woken = True
            if messages or moved_on:
                self._cond.notify_all()
                if self.bell is not None:
                    self.bell.set()
            return moved

    def _fail(self, error: str) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()
            if self.bell is not None:
                self.bell.set()


class SharedConsumer:
    """One consumer and its fetch thread, serving the :class:`PartitionFeed` s opened on it.

    ``conf`` is a confluent-kafka consumer config (manual assignment: offsets are never
    committed).  The thread starts with the first feed and stops on :meth:`close`.  The
    consumer is made again with another fetch wait as :class:`~transport.fetch_policy.FetchWaitPolicy`
    says: a longer one while records it cannot reach wait, and ``idle_fetch_wait_ms`` once no
    feed opened with ``is_input=True`` got a record for ``idle_after_s`` (0: never)."""

    def __init__(self, conf: Mapping[str, Any], name: str = "sources", idle_fetch_wait_ms: int = 0,
                 idle_after_s: float = 0.0) -> None:
        self._conf = {**conf, "enable.auto.commit": False}
        self.policy = FetchWaitPolicy(int(self._conf.get("fetch.wait.max.ms", 500)), idle_fetch_wait_ms, idle_after_s)
        self._consumers = ReadyConsumers(self._conf)
        self.name = name
        self._lock = threading.Condition()
        self._requests: dict[int, PartitionFeed] = {}  # feeds whose pause, resume or close is due
        self._owners: dict[tuple[str, int], PartitionFeed] = {}  # assigned partitions -> their feed
        # assigned partitions -> where reading goes on when the consumer is made again: the last
        # position known (a logical offset, e.g. OFFSET_BEGINNING, until one is)
        self._reading_from: dict[tuple[str, int], int] = {}
        self._paused: set[int] = set()  # feeds whose partitions are paused in the consumer
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.polls = 0  # polls made (for tests and profiles)
        self.remakes = 0  # consumers made again for another fetch wait (for tests and logs)

    def open(self, topic: str, starts: Mapping[int, int], limit: int,
             on_high: HighWatermarkCallback | None = None, bell: threading.Event | None = None,
             is_input: bool = True) -> PartitionFeed:
        """A feed of ``topic``'s partitions, each read from its start offset (negative:
        librdkafka's logical offsets, e.g. ``OFFSET_BEGINNING``).  A partition another feed
        reads is taken from it (that feed gets nothing more from it).  ``on_high`` is told, on
        the fetch thread, each time a fetch moves a partition's high watermark (it must not
        block); ``bell`` is set each time the feed has something new for its reader.  ``is_input``
        False: its records (written while the job is idle, e.g. pulses) keep the consumer idle."""
        feed = PartitionFeed(self, next(self._ids), topic, starts, limit, on_high, bell, is_input)
        with self._lock:
            if self._stop.is_set():
                raise FeedClosed(f"{self.name}: the consumer is closed")
            self._requests[feed.id] = feed
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=f"kafka-{self.name}", daemon=True)
                self._thread.start()
            self._lock.notify_all()
        return feed

    def request(self, feed: PartitionFeed) -> None:
        """``feed`` changed what it wants (paused, resumed, closed, drained): the fetch thread
        applies it before its next poll."""
        with self._lock:
            self._requests[feed.id] = feed
            self._lock.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def assigned(self) -> int:
        """How many partitions the consumer reads now."""
        with self._lock:
            return len(self._owners)

    # -- the fetch thread ---------------------------------------------------------------------
    def _main(self) -> None:
        self._consumer = self._consumers.make(self.policy.wait_ms)
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - handed to every feed's reader
            self.error = f"{self.name}: {type(exc).__name__}: {exc}"
            log.exception("shared consumer %s failed", self.name)
            with self._lock:
                feeds = set(self._owners.values()) | set(self._requests.values())
            for feed in feeds:
                feed._fail(self.error)
        finally:
            self._consumer.close()
            self._consumers.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                requests, self._requests = self._requests, {}
                if not requests and not self._owners:
                    self._lock.wait()  # nothing to read: no polls
                    continue
            for feed in requests.values():
                self._apply(self._consumer, feed)
            if not self._owners:
                continue
            messages = consume_ready(self._consumer, POLL_BATCH,
                                     IDLE_POLL_WAIT_S if self.policy.pace is Pace.IDLE else POLL_WAIT_S)
            self.polls += 1
            got, behind, input_behind = self._dispatch(self._consumer, messages)
            self._pace(got, behind, input_behind)

    def _pace(self, got: bool, behind: bool, input_behind: bool) -> None:
        """Make the consumer again when its fetch wait should change (see :class:`FetchWaitPolicy`)."""
        policy = self.policy
        pace = policy.on_poll(time.monotonic(), got, behind, input_behind)
        if pace is None:
            return
        if pace is Pace.CATCHING_UP:
            log.warning("%s: fetches came back empty for %.1fs with records to read: fetching with a %d ms "
                        "wait until at the end for %.0fs", self.name, policy.last_stall_s, policy.wait_ms,
                        policy.hold_s)
        else:
            log.info("%s: %s: fetching with a %d ms wait", self.name, pace.value, policy.wait_ms)
        self._remake(policy.wait_ms)

    def _remake(self, wait_ms: int) -> None:
        """Replace the consumer by one with fetch wait ``wait_ms``, reading every partition on from
        where the old one stopped (every message it returned was dispatched), paused ones paused."""
        self._consumer = consumer = self._consumers.switch(self._consumer, self._reading_from, wait_ms)
        self.remakes += 1
        if self.policy.pace is Pace.IDLE and self._owners:  # the first records end it: be ready
            self._consumers.make_ahead(self.policy.normal_ms, next(iter(self._owners))[0])
        paused = [TopicPartition(t, k) for (t, k), feed in self._owners.items() if feed.id in self._paused]
        if paused:
            consumer.pause(paused)

    def _apply(self, consumer: Consumer, feed: PartitionFeed) -> None:
        """Make the consumer match what ``feed`` wants: assigned, paused or not, unassigned."""
        mine = [TopicPartition(feed.topic, k) for k in feed.partitions
                if self._owners.get((feed.topic, k)) is feed]
        if feed.closed:
            if mine:
                consumer.incremental_unassign(mine)
            with self._lock:
                for tp in mine:
                    del self._owners[(tp.topic, tp.partition)]
                    del self._reading_from[(tp.topic, tp.partition)]
            self._paused.discard(feed.id)
            return
        if not feed.assigned:
            taken = [TopicPartition(feed.topic, k) for k in feed.partitions if (feed.topic, k) in self._owners]
            if taken:
                consumer.incremental_unassign(taken)
                log.warning("%s: %s partitions %s move to a new reader", self.name, feed.topic,
                            [tp.partition for tp in taken])
            starts = {k: o if o >= 0 else OFFSET_BEGINNING for k, o in feed.starts.items()}
            assign_now(consumer, [TopicPartition(feed.topic, k, o) for k, o in starts.items()])
            feed.assigned = True
            with self._lock:
                for k in feed.partitions:
                    self._owners[(feed.topic, k)] = feed
                    self._reading_from[(feed.topic, k)] = starts[k]
            mine = [TopicPartition(feed.topic, k) for k in feed.partitions]
        feed.full = feed._over_limit()
        paused = feed.reader_paused or feed.full
        if paused and feed.id not in self._paused:
            consumer.pause(mine)
            self._paused.add(feed.id)
        elif not paused and feed.id in self._paused:
            resume_now(consumer, mine)
            self._paused.discard(feed.id)

    def _dispatch(self, consumer: Consumer, messages: list[Any]) -> tuple[bool, bool, bool]:
        """Hand the messages to their feeds, with every feed's positions as of now; whether a feed
        of input got any, whether an unpaused partition has records below its high watermark
        still to be fetched, and whether one of a feed of input has."""
        by_feed: dict[int, list[Any]] = {}
        for msg in messages:
            feed = self._owners.get((msg.topic(), msg.partition()))
            if feed is not None:
                by_feed.setdefault(feed.id, []).append(msg)
            elif msg.error() is not None and msg.topic() is None:
                if msg.error().fatal():
                    raise RuntimeError(f"Kafka consumer fatal error: {msg.error()}")
                log.warning("%s: consumer error: %s", self.name, msg.error())
        feeds = {feed.id: feed for feed in self._owners.values()}
        if not feeds:
            return False, False, False
        got = any(feeds[i].is_input for i in by_feed if i in feeds)
        behind = input_behind = False
        tps = [TopicPartition(t, k) for t, k in self._owners]
        fetched = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(tps) if tp.offset >= 0}
        for feed in feeds.values():
            positions, lows, highs = {}, {}, {}
            mine = [k for k in feed.partitions if self._owners.get((feed.topic, k)) is feed]
            for k in mine:  # (a partition taken over by a newer feed: this one gets nothing more of it)
                if (feed.topic, k) in fetched:
                    positions[k] = fetched[(feed.topic, k)]
                low, high = consumer.get_watermark_offsets(TopicPartition(feed.topic, k), cached=True)
                if high < 0:  # none fetched since the consumer was made again: the last one known
                    high = feed.high_watermark(k)
                if low >= 0:
                    lows[k] = low
                if high >= 0:
                    highs[k] = high
            moved = feed._append(by_feed.get(feed.id, []), positions, lows, highs)
            if feed.on_high is not None:
                for k in moved:
                    feed.on_high(k, lows.get(k, -1), highs[k])
            if feed._over_limit() != feed.full:
                self._apply(consumer, feed)
            if feed.id not in self._paused and any(self._behind(consumer, feed, k, positions, lows, highs) for k in mine):
                behind = True
                input_behind = input_behind or feed.is_input
        return got, behind, input_behind

    def _behind(self, consumer: Consumer, feed: PartitionFeed, k: int, positions: Mapping[int, int],
                lows: Mapping[int, int], highs: Mapping[int, int]) -> bool:
        """Whether partition ``k`` has records below its high watermark not fetched yet.  Before any
        fetch answered with it, the watermark is asked of the broker, once polls have stalled."""
        high = highs.get(k)
        if high is None:
            if self.policy.stalled_for(time.monotonic()) < self.policy.stall_s:
                return True  # not known yet: counts as behind until a stall makes it worth asking
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(feed.topic, k), timeout=1.0)
            except KafkaException:
                return False
            lows = {k: low}
        position = positions.get(k)
        if position is None:  # (a consumer made again knows none before its first message: where it reads from)
            position = self._reading_from.get((feed.topic, k), NO_POSITION)
            if position < 0:
                position = lows.get(k, high)
        return position < high
