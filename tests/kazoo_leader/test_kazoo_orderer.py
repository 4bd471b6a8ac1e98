"""KaZoo's orderer (queues + order state machines + inbox) with an in-memory order log.

No Kafka, no ZooKeeper: the fake log appends what is published and hands records to each
replica's orderer when the test says so, so delays, lost publishes, overlapping leaders and
late deposals are all under the test's control.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kazoo_leader.orderer import KazooOrderer
from kazoo_leader.orders import CLOCK, CLOCK_CHANNEL, DATA, END, Order
from merge.queues import InputQueues
from tests.interleavings import schedule


class FakeLog:
    """A single-partition log: appended records, each reader's position."""

    def __init__(self) -> None:
        self.records: list[Order] = []
        self.read: dict[int, int] = {}
        self.drop_next = 0  # publishes to fail (reported) before one lands

    def publisher(self, orderer_of: callable) -> callable:
        def publish(order: Order) -> None:
            if self.drop_next:
                self.drop_next -= 1
                orderer_of().on_publish_failed(order, "simulated delivery timeout")
                return
            self.records.append(order)
        return publish

    def deliver(self, reader: int, orderer: KazooOrderer, upto: int | None = None) -> None:
        """Hand ``reader`` the records it has not read yet (up to log position ``upto``)."""
        start = self.read.get(reader, 0)
        stop = len(self.records) if upto is None else min(upto, len(self.records))
        if stop > start:
            orderer.on_records(self.records[start:stop])
            self.read[reader] = stop


def make_replica(log: FakeLog, channels, **kw) -> KazooOrderer:
    queues = InputQueues(channels, capacity=10_000, per_channel=True)
    box: list[KazooOrderer] = []
    orderer = KazooOrderer(queues, log.publisher(lambda: box[0]), **kw)
    box.append(orderer)
    return orderer


def drain(orderer: KazooOrderer, out: list) -> None:
    for channel, elements in orderer.next_runs(0):
        out.extend((channel, e) for e in elements)


def channel_seqs(sizes: list[int]) -> dict[int, list[tuple]]:
    seqs = {}
    for c, n in enumerate(sizes):
        seqs[c] = [(DATA, f"c{c}-{i}") for i in range(n)] + [(END,)]
    return seqs


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_two_replicas_consume_the_same_sequence_through_leader_changes(sizes, seed):
    """Random arrival interleavings per replica, random read-back delays, leader changes with
    late deposals (two leaders at once), failed publishes: both replicas consume the identical
    sequence, which is every channel's elements in FIFO order, each exactly once."""
    rnd = random.Random(seed)
    seqs = channel_seqs(sizes)
    log = FakeLog()
    replicas = [make_replica(log, list(seqs), max_batch=rnd.randint(1, 8), hold_limit=rnd.randint(1, 20))
                for _ in range(2)]
    arrivals = [schedule(seqs, rnd, 5) for _ in replicas]
    consumed: list[list] = [[], []]
    epoch = 0
    leader: int | None = None
    for _ in range(10_000):
        if all(r.applier.finished for r in replicas):
            break
        action = rnd.random()
        if action < 0.04 or leader is None:  # a new leader; the old one may learn it late or never
            epoch += rnd.randint(1, 3)
            new = rnd.randrange(2)
            if leader is not None and leader != new and rnd.random() < 0.5:
                replicas[leader].on_leadership(None)
            leader = new
            replicas[new].on_leadership(epoch)
        elif action < 0.06:
            log.drop_next = 1
        i = rnd.randrange(2)
        if arrivals[i] and rnd.random() < 0.6:
            channel, batch = arrivals[i].pop(0)
            replicas[i].queues.put(channel, batch)
        if rnd.random() < 0.7:
            log.deliver(i, replicas[i], upto=len(log.records) - rnd.randint(0, 1))
        drain(replicas[i], consumed[i])
    # quiesce: everything arrives and every record is read back
    for i, r in enumerate(replicas):
        for channel, batch in arrivals[i]:
            r.queues.put(channel, batch)
    for _ in range(1000):
        if all(r.applier.finished for r in replicas):
            break
        for i, r in enumerate(replicas):
            log.deliver(i, r)
            drain(r, consumed[i])
    assert all(r.applier.finished for r in replicas), "ordering stalled"
    assert consumed[0] == consumed[1]
    for c, seq in seqs.items():
        assert [e for ch, e in consumed[0] if ch == c] == seq


def test_a_failed_publish_is_written_again_only_while_in_flight():
    log = FakeLog()
    r = make_replica(log, [0, 1])
    log.drop_next = 1
    r.on_leadership(5)
    drain(r, [])
    assert log.records == [] and r.republished == 0
    drain(r, [])  # the failure report is in the inbox: the fence goes out again
    assert log.records == [Order(5, 0)] and r.republished == 1
    log.deliver(0, r)
    r.queues.put(0, [(DATA, "a")])
    out: list = []
    drain(r, out)
    assert log.records[-1] == Order(5, 1, ((0, 1),))
    # a failure report for a record that is no longer in flight changes nothing
    r.on_publish_failed(Order(5, 0), "late report")
    log.deliver(0, r)
    drain(r, out)
    assert out == [(0, (DATA, "a"))] and r.republished == 1


def test_a_clocked_orderer_stamps_its_wall_clock_and_ticks_while_idle():
    log = FakeLog()
    now, wall = [0.0], [1_000.0]
    r = make_replica(log, [0], clock_tick_s=1.0, clock=lambda: now[0], wall_clock=lambda: wall[0])
    r.on_leadership(1)
    drain(r, [])
    log.deliver(0, r)
    out: list = []
    drain(r, out)
    assert out == [] and log.records == [Order(1, 0)]  # the fence; a second since: nothing yet
    now[0], wall[0] = 1.0, 1_001.0
    drain(r, out)
    assert log.records[-1] == Order(1, 1, clock=1_001_000)
    log.deliver(0, r)
    r.queues.put(0, [(DATA, "a")])
    now[0], wall[0] = 1.2, 1_001.2
    drain(r, out)
    assert log.records[-1] == Order(1, 2, ((0, 1),), clock=1_001_200)
    log.deliver(0, r)
    drain(r, out)
    assert out == [(CLOCK_CHANNEL, (CLOCK, 1_001_000)), (CLOCK_CHANNEL, (CLOCK, 1_001_200)), (0, (DATA, "a"))]
    quiet_log = FakeLog()
    unclocked = make_replica(quiet_log, [0], clock=lambda: now[0], wall_clock=lambda: wall[0])
    unclocked.on_leadership(1)
    drain(unclocked, [])
    quiet_log.deliver(0, unclocked)
    now[0] += 5.0
    drain(unclocked, [])
    unclocked.queues.put(0, [(DATA, "a")])
    drain(unclocked, [])
    assert quiet_log.records == [Order(1, 0), Order(1, 1, ((0, 1),))]  # no tick, no clock


def test_the_channel_an_order_waits_for_is_taken_beyond_the_hold_limit():
    """A follower holding ``hold_limit`` elements takes nothing more, except from the channel the
    current order names: a far-behind follower never stalls on its own back-pressure."""
    log = FakeLog()
    leader, follower = make_replica(log, [0, 1]), make_replica(log, [0, 1], hold_limit=1, max_batch=1)
    assert follower.hold_limit == 1
    leader.on_leadership(1)
    drain(leader, [])
    leader.queues.put(1, [(DATA, "b1")])
    log.deliver(0, leader)
    drain(leader, [])  # orders (1, 1)
    follower.queues.put(0, [(DATA, "a1")])
    follower.queues.put(0, [(DATA, "a2")])
    follower.queues.put(1, [(DATA, "b1")])
    out: list = []
    drain(follower, out)
    assert follower.applier.received == {0: 1, 1: 0}  # holds one, takes no more
    log.deliver(1, follower)
    drain(follower, out)
    assert out == [(1, (DATA, "b1"))]


def test_a_record_from_another_thread_wakes_a_waiting_orderer_at_once():
    log = FakeLog()
    r = make_replica(log, [0, 1])
    r.queues.put(0, [(DATA, "a")])
    out: list = []
    threading.Timer(0.2, lambda: r.on_records([Order(3, 0), Order(3, 1, ((0, 1),))])).start()
    t0 = time.monotonic()
    runs = r.next_runs(10)
    assert runs == [(0, [(DATA, "a")])] and time.monotonic() - t0 < 5
    assert out == [] and r.epoch == 3


def test_a_reader_error_fails_the_instance_loudly():
    r = make_replica(FakeLog(), [0, 1])
    r.on_error("KafkaException: topic authorization failed")
    with pytest.raises(RuntimeError, match="topic authorization failed"):
        r.next_runs(0)


def test_election_with_an_epoch_the_log_has_passed_is_refused_loudly():
    log = FakeLog()
    r = make_replica(log, [0, 1])
    r.on_records([Order(9, 0)])
    r.on_leadership(4)
    with pytest.raises(RuntimeError, match="elected with epoch 4"):
        r.next_runs(0)


def test_per_channel_queues_are_required():
    with pytest.raises(ValueError, match="per-channel"):
        KazooOrderer(InputQueues([0, 1], 4), lambda order: None)
