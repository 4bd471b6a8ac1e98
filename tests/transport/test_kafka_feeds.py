"""The worker's shared source consumer (transport.kafka_feeds) on the real embedded broker:
every feed gets its partitions' records exactly once and in order, through back-pressure
pauses, reader pauses, closes and a partition moving to a new feed; positions never run ahead
of what a reader was handed; and the fetch waits of long-lived consumers (this one and the KaZoo
order log's reader) going idle and back without losing or repeating a record."""

from __future__ import annotations

import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from deploy.topics import list_topics
from kazoo_leader.order_log import OrderLog
from kazoo_leader.orders import Order
from kazoo_leader.segments import SegmentedLog
from liverobin.generator import pulse_producer_conf
from tests.ordered_runs import wait_until
from transport.fetch_policy import Pace
from transport.kafka_feeds import NO_POSITION, PartitionFeed, SharedConsumer
from transport.kafka_io import ReadyConsumers, TopicMaker, consume_ready, ensure_topics


def _produce(bootstrap: str, topic: str, partition: int, n: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        producer.produce(topic, value=str(i).encode(), partition=partition)
    assert producer.flush(30) == 0


def _read(feed: PartitionFeed, n: int, timeout: float = 30.0) -> list[tuple[int, int]]:
    """``n`` records as (partition, offset)."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} records after {timeout}s"
        for msg in feed.consume(50, 0.2):
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset()))
    return got


def _topic(stack, name: str, partitions: int) -> str:
    ensure_topics(AdminClient({"bootstrap.servers": stack.bootstrap_servers}), {name: partitions})
    return name


def _conf(stack) -> dict:
    return {"bootstrap.servers": stack.bootstrap_servers, "group.id": "feeds-test", "fetch.wait.max.ms": 10}


def test_feeds_of_one_consumer_get_their_partitions_exactly_once_in_order(stack, topic_prefix):
    a, b = _topic(stack, topic_prefix + "a", 2), _topic(stack, topic_prefix + "b", 1)
    for k in (0, 1):
        _produce(stack.bootstrap_servers, a, k, 1500)
    _produce(stack.bootstrap_servers, b, 0, 1000)
    shared = SharedConsumer(_conf(stack))
    assert shared.polls == 0  # no feed: no thread, no fetch
    try:
        feed_a = shared.open(a, {0: OFFSET_BEGINNING, 1: 500}, limit=10_000)
        highs: list[tuple[int, int, int]] = []
        feed_b = shared.open(b, {0: 200}, limit=10_000, on_high=lambda *told: highs.append(told))
        got_a, got_b = _read(feed_a, 2500), _read(feed_b, 800)
        assert [o for k, o in got_a if k == 0] == list(range(1500))
        assert [o for k, o in got_a if k == 1] == list(range(500, 1500))
        assert got_b == [(0, o) for o in range(200, 1000)]
        assert feed_a.consume(10, 0.3) == [] and feed_b.consume(10, 0) == []
        # everything handed over: the positions are the partitions' ends
        assert (feed_a.position(0), feed_a.position(1), feed_b.position(0)) == (1500, 1500, 1000)
        assert feed_a.low_watermark(0) == 0
        assert (feed_a.high_watermark(0), feed_a.high_watermark(1), feed_b.high_watermark(0)) == (1500, 1500, 1000)
        assert highs == [(0, 0, 1000)]  # told once: the high watermark moved once (the topic was written before)
        assert shared.assigned == 3
    finally:
        shared.close()


def test_a_full_feed_is_paused_and_its_records_come_after_exactly_once(stack, topic_prefix):
    """A feed whose reader does not take its records holds at most its limit plus one poll's
    worth; a slow feed does not hold up another one on the same consumer."""
    slow, fast = _topic(stack, topic_prefix + "slow", 1), _topic(stack, topic_prefix + "fast", 1)
    _produce(stack.bootstrap_servers, slow, 0, 20_000)
    shared = SharedConsumer(_conf(stack))
    try:
        feed = shared.open(slow, {0: OFFSET_BEGINNING}, limit=300)
        other = shared.open(fast, {0: OFFSET_BEGINNING}, limit=300)
        deadline = time.monotonic() + 10
        while not feed.full:
            assert time.monotonic() < deadline, "the feed never filled up"
            time.sleep(0.01)
        _produce(stack.bootstrap_servers, fast, 0, 1000)
        assert [o for _, o in _read(other, 1000)] == list(range(1000))  # not held up by the full feed
        assert feed.full and feed.buffered <= 300 + 2000
        got = []
        while len(got) < 20_000:  # a slow reader: pause, resume, pause... as it goes
            assert time.monotonic() < deadline + 60
            got += [m.offset() for m in feed.consume(100, 0.2)]
            assert feed.buffered <= 300 + 2000
        assert got == list(range(20_000))
        assert feed.position(0) == 20_000
    finally:
        shared.close()


def test_a_paused_feed_gets_nothing_new_until_resumed_and_misses_nothing(stack, topic_prefix):
    topic = _topic(stack, topic_prefix + "p", 1)
    _produce(stack.bootstrap_servers, topic, 0, 100)
    shared = SharedConsumer(_conf(stack))
    try:
        feed = shared.open(topic, {0: OFFSET_BEGINNING}, limit=10_000)
        got = [o for _, o in _read(feed, 100)]
        feed.pause()
        time.sleep(0.2)  # (the pause is applied before the fetch thread's next poll)
        _produce(stack.bootstrap_servers, topic, 0, 500, start=100)
        time.sleep(0.5)
        assert feed.consume(1000, 0) == []
        assert feed.position(0) == 100
        feed.resume()
        got += [o for _, o in _read(feed, 500)]
        assert got == list(range(600))
    finally:
        shared.close()


def test_positions_never_run_ahead_of_what_the_reader_took(stack, topic_prefix):
    """While records arrive, each partition's position is the offset after the last record
    taken (unknown before the first): a pulse placed at a position never passes a record still
    to be handed over, whether records of it are buffered, in flight or not fetched yet."""
    topic = _topic(stack, topic_prefix + "pos", 2)
    shared = SharedConsumer(_conf(stack))

    def feeder() -> None:
        for i in range(0, 4000, 100):
            _produce(stack.bootstrap_servers, topic, (i // 100) % 2, 100, start=i // 2)

    thread = threading.Thread(target=feeder)
    try:
        feed = shared.open(topic, {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING}, limit=500)
        thread.start()
        taken: dict[int, int] = {0: 0, 1: 0}
        deadline = time.monotonic() + 60
        while sum(taken.values()) < 4000:
            assert time.monotonic() < deadline, taken
            for msg in feed.consume(37, 0.05):
                k = msg.partition()
                assert msg.offset() == taken[k]  # in order, none skipped
                taken[k] += 1
            for k in (0, 1):
                assert feed.position(k) == (taken[k] if taken[k] else NO_POSITION) or \
                    (taken[k] == 0 and feed.position(k) == 0)
                # records below it exist, taken or not (-1: nothing fetched of it yet)
                assert feed.high_watermark(k) >= taken[k] or feed.high_watermark(k) == -1 == taken[k] - 1
        assert taken == {0: 2000, 1: 2000}
        assert (feed.position(0), feed.position(1)) == (2000, 2000)
    finally:
        thread.join()
        shared.close()


def test_a_closed_feed_gives_up_its_partitions_and_a_new_feed_takes_one_over(stack, topic_prefix):
    topic = _topic(stack, topic_prefix + "c", 2)
    for k in (0, 1):
        _produce(stack.bootstrap_servers, topic, k, 300)
    shared = SharedConsumer(_conf(stack))
    try:
        first = shared.open(topic, {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING}, limit=10_000)
        _read(first, 600)
        # a restored replica reading partition 1 again from 100 while the first still runs
        second = shared.open(topic, {1: 100}, limit=10_000)
        assert [o for _, o in _read(second, 200)] == list(range(100, 300))
        _produce(stack.bootstrap_servers, topic, 1, 10, start=300)
        assert [o for _, o in _read(second, 10)] == list(range(300, 310))
        assert first.consume(100, 0.3) == []  # partition 1 is no longer the first feed's
        assert first.position(1) == 300  # nor does its position move past what it was handed
        first.close()
        second.close()
        deadline = time.monotonic() + 5
        while shared.assigned:
            assert time.monotonic() < deadline, "partitions still assigned after their feeds closed"
            time.sleep(0.02)
        polls = shared.polls
        time.sleep(0.3)
        assert shared.polls == polls  # nothing to read: the fetch thread waits without polling
    finally:
        shared.close()



def test_a_position_moved_past_records_never_handed_over_ends_a_wait():
    """Transaction markers are fetched but never handed over: the feed's position moves past
    them, and that alone ends a reader's wait (a LiveRobin source waiting for records below its
    next pulse sleeps on its feed); a fetch that moves nothing does not."""
    feed = PartitionFeed(owner=None, feed_id=1, topic="t", starts={0: 0}, limit=10)
    feed._append([], {0: 0}, {0: 0}, {0: 0})  # the first fetch: where the consumer is
    assert feed.consume(10, 0) == []
    ended = threading.Event()
    waiter = threading.Thread(target=lambda: (feed.consume(10, 60), ended.set()), daemon=True)
    waiter.start()
    feed._append([], {0: 0}, {0: 0}, {0: 0})  # an empty fetch: nothing moved
    assert not ended.wait(0.3)
    feed._append([], {0: 4}, {0: 0}, {0: 4})  # past three aborted records and their marker
    assert ended.wait(30)
    assert feed.position(0) == 4


def test_a_resumed_partition_is_sought_to_where_reading_goes_on():
    """librdkafka's resume alone left a partition unfetched for up to a second: ``resume_now``
    seeks each partition to the offset it carries, or else to the consumer's position."""
    from confluent_kafka import TopicPartition

    from transport.kafka_io import resume_now

    class _Consumer:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def resume(self, tps):
            self.calls.append(("resume", [(tp.topic, tp.partition) for tp in tps]))

        def position(self, tps):
            return [TopicPartition(tp.topic, tp.partition, {1: 17}.get(tp.partition, -1001)) for tp in tps]

        def seek(self, tp):
            self.calls.append(("seek", tp.topic, tp.partition, tp.offset))

    consumer = _Consumer()
    resume_now(consumer, [TopicPartition("t", 0, 5), TopicPartition("t", 1), TopicPartition("t", 2)])
    assert consumer.calls == [("resume", [("t", 0), ("t", 1), ("t", 2)]), ("seek", "t", 0, 5), ("seek", "t", 1, 17)]


def test_an_assigned_partition_s_topic_is_looked_up_first():
    """librdkafka's incremental assign alone left a partition of a topic new to the consumer
    unfetched for about a second (a source replica restored on a worker that read other topics):
    ``assign_now`` asks for each topic's metadata first, once per topic, and assigns even if
    that fails."""
    from confluent_kafka import KafkaException, TopicPartition

    from transport.kafka_io import assign_now

    class _Consumer:
        def __init__(self, fail: bool) -> None:
            self.fail, self.calls = fail, []

        def list_topics(self, topic, timeout):
            self.calls.append(("metadata", topic))
            if self.fail:
                raise KafkaException("no broker")

        def incremental_assign(self, tps):
            self.calls.append(("assign", [(tp.topic, tp.partition, tp.offset) for tp in tps]))

    for fail in (False, True):
        consumer = _Consumer(fail)
        assign_now(consumer, [TopicPartition("t", 0, 5), TopicPartition("t", 1, 7), TopicPartition("u", 0, 2)])
        assert consumer.calls == [("metadata", "t"), ("metadata", "u"),
                                  ("assign", [("t", 0, 5), ("t", 1, 7), ("u", 0, 2)])]


def test_a_pulse_reader_through_the_shared_consumer_counts_every_pulse_across_segments(stack, topic_prefix):
    """The worker's heartbeat-log reader reads through a feed of the sources' shared consumer (one
    fetch per wait for both): every pulse is counted once, in order, across segment switches, and
    the sources' feeds go on getting their records."""
    from liverobin.heartbeats import PulseRecord
    from liverobin.reader import PulseReader
    from liverobin.segments import HeartbeatLog

    log = HeartbeatLog(topic_prefix + "hb", per_segment=5)
    ensure_topics(AdminClient({"bootstrap.servers": stack.bootstrap_servers}),
                  {log.topic(s): 1 for s in range(4)})
    source = _topic(stack, topic_prefix + "src", 1)
    shared = SharedConsumer(_conf(stack))
    reader = PulseReader(log, {"bootstrap.servers": stack.bootstrap_servers}, shared=shared)
    sub = reader.subscribe()
    rung = threading.Event()
    sub.on_pulse = rung.set
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 0})
    try:
        feed = shared.open(source, {0: OFFSET_BEGINNING}, limit=100)
        reader.start()
        got: list[int] = []
        deadline = time.monotonic() + 60
        for h in range(1, 13):  # three segments; the reader follows a segment once the last one is done
            producer.produce(log.topic(log.segment_of(h)), value=PulseRecord(h, {source: {0: h}}).encode(),
                             partition=0)
            producer.flush(10)
            while len(got) < h:
                assert time.monotonic() < deadline, f"pulses counted: {got}"
                rung.wait(1)
                rung.clear()
                got += [r.h for r in sub.take()]
        assert got == list(range(1, 13))
        _produce(stack.bootstrap_servers, source, 0, 20)
        assert _read(feed, 20) == [(0, i) for i in range(20)]
        assert reader.error is None and reader.caught_up.is_set()
    finally:
        reader.close()
        shared.close()


def test_a_broker_that_never_answers_within_the_wait_is_read_with_a_longer_one(stack, topic_prefix):
    """The embedded broker answers a fetch empty when finding the records takes longer than the
    wait (always with a wait of 0): the consumer switches to a longer wait, reads everything in
    order and exactly once, paused feeds stay paused, and it goes back once caught up."""
    a, b = _topic(stack, topic_prefix + "a", 2), _topic(stack, topic_prefix + "b", 1)
    for k in (0, 1):
        _produce(stack.bootstrap_servers, a, k, 1200)
    _produce(stack.bootstrap_servers, b, 0, 300)
    shared = SharedConsumer({**_conf(stack), "fetch.wait.max.ms": 0})
    try:
        feed_a = shared.open(a, {0: OFFSET_BEGINNING, 1: 400}, limit=10_000)
        feed_b = shared.open(b, {0: OFFSET_BEGINNING}, limit=10_000)
        feed_b.pause()
        got = _read(feed_a, 2000)
        assert [o for k, o in got if k == 0] == list(range(1200))
        assert [o for k, o in got if k == 1] == list(range(400, 1200))
        assert shared.policy.stalls >= 1
        assert feed_b.consume(10, 0.5) == []  # paused across the switch
        feed_b.resume()
        assert _read(feed_b, 300) == [(0, o) for o in range(300)]
        deadline = time.monotonic() + 20
        while shared.policy.pace is Pace.CATCHING_UP:  # every partition at its end for a while: the configured wait again
            assert time.monotonic() < deadline, "still fetching with the catch-up wait"
            time.sleep(0.05)
        assert feed_a.consume(10, 0.3) == [] and feed_b.consume(10, 0) == []
    finally:
        shared.close()


def _eventually(holds, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not holds():
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.02)


def test_a_consumer_without_input_fetches_with_the_idle_wait_and_reads_on_exactly_once(stack, topic_prefix):
    """No record of an input feed for a while: the consumer is made again with the idle wait,
    though a feed of control records (``is_input=False``) gets records meanwhile; the first
    records after that bring the short wait back, and every record comes once, in order."""
    data, log = _topic(stack, topic_prefix + "data", 2), _topic(stack, topic_prefix + "log", 1)
    _produce(stack.bootstrap_servers, data, 0, 30)
    shared = SharedConsumer(_conf(stack), idle_fetch_wait_ms=300, idle_after_s=0.5)
    stop = threading.Event()

    def pulses() -> None:  # written while the job is idle, like the heartbeat log's
        n = 0
        while not stop.wait(0.1):
            _produce(stack.bootstrap_servers, log, 0, 1, start=n)
            n += 1

    writer = threading.Thread(target=pulses, daemon=True)
    try:
        feed = shared.open(data, {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING}, limit=1000)
        pulse_feed = shared.open(log, {0: OFFSET_BEGINNING}, limit=1000, is_input=False)
        assert _read(feed, 30) == [(0, o) for o in range(30)]
        writer.start()
        # (the pace changes before the consumer is made again: wait for both)
        _eventually(lambda: shared.policy.pace is Pace.IDLE and shared.remakes > 0, "idle")
        idle_at = shared.remakes
        time.sleep(1.0)
        assert len(_read(pulse_feed, 3)) >= 3  # control records still come, and it stays idle
        assert shared.policy.pace is Pace.IDLE and shared.remakes == idle_at
        _produce(stack.bootstrap_servers, data, 1, 20)
        assert _read(feed, 20) == [(1, o) for o in range(20)]
        _eventually(lambda: shared.remakes > idle_at, "made again with the short wait")
        _produce(stack.bootstrap_servers, data, 0, 10, start=30)
        assert _read(feed, 10) == [(0, o) for o in range(30, 40)]
        assert feed.consume(10, 0.3) == []
        assert feed.position(0) == 40 and feed.position(1) == 20
    finally:
        stop.set()
        shared.close()


def test_the_kazoo_order_log_rests_while_its_replica_has_no_input_and_reads_every_order_once(stack, topic_prefix):
    """The order log's reader stops fetching once no order came for a while and its replica has no
    input waiting, and reads on when input arrives (or this worker writes an order); every order is
    read back once and in log order (across its segments), whichever worker wrote it."""
    segments = SegmentedLog(topic_prefix + "orders", per_segment=4)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    got: list[Order] = []
    errors: list[str] = []
    pending = [False]

    def order_log(name: str, rest_after_s: float) -> OrderLog:
        return OrderLog(_conf(stack), {"bootstrap.servers": stack.bootstrap_servers},
                        lambda topics: ensure_topics(admin, dict.fromkeys(topics, 1)), name=name,
                        rest_after_s=rest_after_s)

    ensure_topics(admin, {segments.topic(n): 1 for n in range(2)})
    here, elsewhere = order_log("here", 0.5), order_log("elsewhere", 0.0)  # (the other writes: a leader there)
    publish = here.register(segments, 0, got.extend, lambda order, reason: errors.append(reason), errors.append,
                            pending=lambda: pending[0])
    publish_elsewhere = elsewhere.register(segments, 0, lambda orders: None,
                                           lambda order, reason: errors.append(reason), errors.append)
    here.start()
    elsewhere.start()
    try:
        for seq in range(4):  # written here (filling segment 0: none written again): read back here at once
            publish(Order(1, seq, ((0, 1),)))
        wait_until(lambda: len(got) == 4, 10, "own orders read back")
        _eventually(lambda: here.rests == 1, "resting")
        for seq in range(4, 9):
            publish_elsewhere(Order(1, seq, ((0, 1),)))
        time.sleep(1.5)  # (a resting reader looks again every REST_CHECK_S: no input is waiting yet)
        assert len(got) == 4 and here.rests == 1
        pending[0] = True
        here.input_arrived()
        wait_until(lambda: len(got) == 9, 10, "orders written elsewhere, read once input arrived")
        pending[0] = False
        _eventually(lambda: here.rests == 2, "resting again")
        for seq in range(9, 14):
            publish_elsewhere(Order(1, seq, ((0, 1),)))
        pending[0] = True  # input counted, its wake-up missed: seen at the next look
        wait_until(lambda: len(got) == 14, 10, "orders read once input was seen waiting")
        assert [o.seq for o in got] == list(range(14)) and [o.offset for o in got] == list(range(14))
        assert not errors
    finally:
        here.close()
        elsewhere.close()


def test_a_consumer_made_ahead_is_the_one_made_next_with_its_wait(stack, topic_prefix):
    """ReadyConsumers hands out the consumer it made ahead when the wait matches, connected (it
    reads at once), and closes it when another wait is asked for."""
    topic = _topic(stack, topic_prefix + "ahead", 1)
    _produce(stack.bootstrap_servers, topic, 0, 3)
    consumers = ReadyConsumers(_conf(stack))
    consumers.make_ahead(10, topic)
    ahead = consumers._ahead[1]
    first = consumers.make(10)
    assert first is ahead and consumers._ahead is None
    first.assign([TopicPartition(topic, 0, 0)])
    assert len(consume_ready(first, 10, 5.0)) >= 1
    first.close()
    consumers.make_ahead(10, topic)
    second = consumers._ahead[1]
    other = consumers.make(200)  # another wait: a new consumer, the one made ahead closed
    assert other is not second and consumers._ahead is None
    other.close()
    consumers.close()


def test_a_topic_maker_makes_every_segment_through_one_admin_client(stack, topic_prefix, monkeypatch):
    """The heartbeat generator and the order logs make their next segments with a kept admin client:
    a new one per call cost about 55 ms on the embedded broker (a connection and metadata), in the
    generator's pulse loop every few seconds."""
    import transport.kafka_io as kafka_io

    made: list[AdminClient] = []
    real = kafka_io.admin_client
    monkeypatch.setattr(kafka_io, "admin_client", lambda conf: made.append(real(conf)) or made[-1])
    maker = kafka_io.TopicMaker({"bootstrap.servers": stack.bootstrap_servers})
    for n in range(3):
        maker([f"{topic_prefix}seg.{3 * n + k}" for k in range(3)])
    topics = AdminClient({"bootstrap.servers": stack.bootstrap_servers}).list_topics(timeout=10).topics
    assert all(f"{topic_prefix}seg.{i}" in topics and len(topics[f"{topic_prefix}seg.{i}"].partitions) == 1
               for i in range(9))
    assert len(made) == 1


def test_a_deleted_segment_stays_deleted_though_the_pulse_producer_wrote_to_it(stack, topic_prefix):
    """A topic maker deletes the segments no reader needs.  The embedded broker creates a topic
    that a metadata request names, and a producer's periodic metadata refresh names every topic it
    wrote to: a producer refreshing every second brings its deleted topic back, so the heartbeat
    generator's producer does no periodic refresh (a produce error still refreshes)."""
    bootstrap = stack.bootstrap_servers
    conf = pulse_producer_conf({"bootstrap.servers": bootstrap})
    assert conf["topic.metadata.refresh.interval.ms"] == -1
    names = {"pulses": f"{topic_prefix}hb.0", "refreshing": f"{topic_prefix}other.0"}
    maker = TopicMaker({"bootstrap.servers": bootstrap})
    maker(list(names.values()))
    producers = {"pulses": Producer(conf),
                 "refreshing": Producer({**conf, "topic.metadata.refresh.interval.ms": 1000})}
    for kind, producer in producers.items():
        producer.produce(names[kind], value=b"1")
        assert producer.flush(10) == 0
    maker.delete(list(names.values()))
    wait_until(lambda: not set(names.values()) & set(list_topics(bootstrap)), 10, "the deletions")

    def refreshed() -> bool:
        for producer in producers.values():
            producer.poll(0)
        return names["refreshing"] in list_topics(bootstrap)

    wait_until(refreshed, 15, "the refreshing producer's topic to be created again", poll_s=0.2)
    assert names["pulses"] not in list_topics(bootstrap)
