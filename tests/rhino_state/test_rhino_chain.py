"""Chain replication of Rhino checkpoint increments: the pure machines and the gRPC edge."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhino_state.chain import OVERFLOW_FACTOR, Ack, ChainMember, ChainOrigin, Forward, Reject, Store
from rhino_state.increments import IncrementMeta
from rhino_state.shipper import ChainShipper
from rhino_state.transfer import (
    ACK_METHOD,
    CHUNK_METHOD,
    CHUNK_SIZE,
    ChainAck,
    IncrementService,
    TransferRejected,
    send_increment,
)
from transport import rpc, wire
from transport.security import RpcSecurity

INST = (3, 1)
SECURITY = RpcSecurity.generate()


def inc(cid: int, prev: int | None, size: int = 10, instance: tuple[int, int] = INST) -> IncrementMeta:
    return IncrementMeta(instance, cid, prev, digest=f"d{cid}", bytes_shipped=size)


def ids(metas: Any) -> list[int]:
    return [m.checkpoint_id for m in metas]


def send_next(origin: ChainOrigin) -> int:
    s = origin.sendable()[0]
    origin.on_sent(s.checkpoint_id)
    return s.checkpoint_id


# -- ChainOrigin ----------------------------------------------------------------------------


def test_window_limits_in_flight_count_and_ack_frees_it() -> None:
    o = ChainOrigin(INST, ["a", "b"], max_in_flight=2)
    assert o.needs_full and o.completed_id is None
    for cid, prev in [(1, None), (2, 1), (3, 2), (4, 3)]:
        assert o.offer(inc(cid, prev), f"p{cid}").accepted
    assert not o.needs_full
    sends = o.sendable()
    assert [s.checkpoint_id for s in sends] == [1, 2]
    assert sends[0].to == "a" and sends[0].group == ("a", "b") and sends[0].payload_ref == "p1"
    o.on_sent(1)
    o.on_sent(2)
    assert o.sendable() == [] and (o.in_flight, o.queued) == (2, 2)
    out = o.on_ack(1, "b")
    assert ids(out.completed) == [1] and out.released == ("p1",) and o.completed_id == 1
    assert [s.checkpoint_id for s in o.sendable()] == [3]


def test_byte_window_admits_one_oversized_increment_when_idle() -> None:
    o = ChainOrigin(INST, ["a"], max_in_flight=4, max_bytes_in_flight=100)
    o.offer(inc(1, None, size=500), 1)
    o.offer(inc(2, 1, size=60), 2)
    o.offer(inc(3, 2, size=60), 3)
    assert [s.checkpoint_id for s in o.sendable()] == [1]  # bigger than the window, but nothing in flight
    send_next(o)
    assert o.sendable() == [] and o.bytes_in_flight == 500
    o.on_ack(1, "a")
    assert [s.checkpoint_id for s in o.sendable()] == [2]  # 60 + 60 > 100
    send_next(o)
    assert o.sendable() == []


def test_only_the_tail_completes_and_a_later_ack_completes_earlier_ones_in_order() -> None:
    o = ChainOrigin(INST, ["a", "b", "c"], max_in_flight=3)
    for cid, prev in [(1, None), (2, 1), (3, 2)]:
        o.offer(inc(cid, prev), cid)
        send_next(o)
    assert not o.on_ack(2, "a").accepted and not o.on_ack(2, "b").accepted
    assert o.completed_id is None
    out = o.on_ack(2, "c")
    assert ids(out.completed) == [1, 2] and out.released == (1, 2)
    assert not o.on_ack(1, "c").accepted  # already completed: stale
    assert not o.on_ack(9, "c").accepted  # never offered
    assert ids(o.on_ack(3, "c").completed) == [3] and o.completed_id == 3
    assert (o.in_flight, o.queued) == (0, 0)


def test_failure_goes_back_n_and_retries_in_order() -> None:
    o = ChainOrigin(INST, ["a"], max_in_flight=3)
    for cid, prev in [(1, None), (2, 1), (3, 2)]:
        o.offer(inc(cid, prev), cid)
        send_next(o)
    assert o.on_failure(2, "UNAVAILABLE").accepted
    assert o.in_flight_ids == (1,) and o.last_failure == "checkpoint 2: UNAVAILABLE"
    assert [s.checkpoint_id for s in o.sendable()] == [2, 3]
    assert not o.on_failure(3, "late").accepted  # not in flight any more
    with pytest.raises(ValueError):
        o.on_sent(3)  # must go in order
    assert not o.on_sent(1).accepted  # already in flight
    assert not o.on_sent(42).accepted  # unknown (dropped)
    send_next(o)
    send_next(o)
    assert ids(o.on_ack(3, "a").completed) == [1, 2, 3]


def test_a_late_ack_of_a_requeued_increment_still_completes_it() -> None:
    o = ChainOrigin(INST, ["a"])
    o.offer(inc(1, None), 1)
    send_next(o)
    o.on_failure(1, "deadline exceeded")  # the head stored it, but the reply was lost
    assert ids(o.on_ack(1, "a").completed) == [1]


def test_offer_validation_and_needs_full() -> None:
    o = ChainOrigin(INST, ["a"])
    refused = o.offer(inc(1, 0), "p1")
    assert not refused.accepted and refused.released == ("p1",) and o.needs_full
    o.offer(inc(2, None), 2)
    with pytest.raises(ValueError):
        o.offer(inc(2, None), 2)  # ids must increase
    with pytest.raises(ValueError):
        o.offer(inc(4, 3), 4)  # does not apply to the last offered (2)
    with pytest.raises(ValueError):
        o.offer(inc(5, 2, instance=(9, 9)), 5)
    restored = ChainOrigin(INST, ["a"], completed_id=7)
    assert not restored.needs_full and restored.offer(inc(8, 7), 8).accepted
    with pytest.raises(ValueError):
        ChainOrigin(INST, ["a", "a"])
    with pytest.raises(ValueError):
        ChainOrigin(INST, ["a"], max_in_flight=0)


def test_new_member_drops_uncompleted_and_needs_full() -> None:
    o = ChainOrigin(INST, ["a", "b"])
    for cid, prev in [(1, None), (2, 1), (3, 2), (4, 3)]:
        o.offer(inc(cid, prev), cid)
    send_next(o)
    send_next(o)
    o.on_ack(1, "b")
    out = o.set_group(["a", "c"])
    assert out.released == (2, 3, 4) and o.needs_full and o.completed_id == 1
    assert (o.in_flight, o.queued) == (0, 0)
    assert not o.on_ack(2, "b").accepted  # the old tail's late ack
    assert not o.on_ack(2, "c").accepted  # dropped
    assert not o.offer(inc(5, 4), 5).accepted
    assert o.offer(inc(6, None), 6).accepted and not o.needs_full
    assert o.sendable()[0].group == ("a", "c")
    send_next(o)
    assert ids(o.on_ack(6, "c").completed) == [6] and o.completed_id == 6
    assert not o.set_group(["a", "c"]).accepted  # unchanged


def test_shrinking_or_reordering_keeps_increments_and_resends_in_flight() -> None:
    o = ChainOrigin(INST, ["a", "b", "c"])
    for cid, prev in [(1, None), (2, 1), (3, 2)]:
        o.offer(inc(cid, prev), cid)
    send_next(o)
    send_next(o)
    out = o.set_group(["c", "a"])
    assert out.released == () and not o.needs_full and (o.in_flight, o.queued) == (0, 3)
    s = o.sendable()[0]
    assert s.to == "c" and s.checkpoint_id == 1
    send_next(o)
    assert not o.on_ack(1, "c").accepted  # the head, not the tail
    assert ids(o.on_ack(1, "a").completed) == [1]


def test_empty_group_queues_boundedly_and_resumes_with_the_same_members() -> None:
    o = ChainOrigin(INST, ["a", "b"], max_in_flight=2, max_pending=3)
    o.offer(inc(1, None), 1)
    send_next(o)
    o.set_group([])
    assert not o.can_complete and o.sendable() == [] and (o.in_flight, o.queued) == (0, 1)
    assert not o.on_ack(1, "b").accepted
    o.offer(inc(2, 1), 2)
    o.offer(inc(3, 2), 3)
    o.set_group(["b", "a"])  # the same members came back: nothing lost
    assert not o.needs_full and [s.checkpoint_id for s in o.sendable()] == [1, 2]
    o.set_group([])
    out = o.offer(inc(4, 3), 4)  # over max_pending, no full snapshot to keep: drop all
    assert not out.accepted and out.released == (1, 2, 3, 4) and o.needs_full
    assert not o.offer(inc(5, 4), 5).accepted
    o.offer(inc(6, None), 6)
    o.offer(inc(7, 6), 7)
    o.offer(inc(8, None), 8)
    out = o.offer(inc(9, 8), 9)  # overflow again: the newest full supersedes what came before it
    assert out.accepted and out.released == (6, 7) and ids(o.pending) == [8, 9] and not o.needs_full


def test_overflowing_deltas_are_kept_while_smaller_than_a_full_snapshot() -> None:
    o = ChainOrigin(INST, [], max_in_flight=1, max_pending=2)  # an empty group: nothing leaves
    o.offer(inc(1, None, size=100), 1)
    for cid in range(2, 5):  # 30 bytes of deltas past max_pending: still cheaper than a full (100)
        out = o.offer(inc(cid, cid - 1, size=10), cid)
        assert out.accepted and out.released == ()
    out = o.offer(inc(5, 4, size=80), 5)  # 110 bytes of deltas: a full snapshot is cheaper now
    assert not out.accepted and out.released == (1, 2, 3, 4, 5) and o.needs_full
    o.offer(inc(6, None, size=100), 6)
    cap = OVERFLOW_FACTOR * 2
    outcomes = [o.offer(inc(cid, cid - 1, size=1), cid) for cid in range(7, 7 + cap)]
    assert all(out.accepted for out in outcomes[:-1]) and not outcomes[-1].accepted and o.needs_full


def test_missing_base_failure_needs_full() -> None:
    o = ChainOrigin(INST, ["a"], completed_id=3)
    o.offer(inc(4, 3), 4)
    send_next(o)
    out = o.on_failure(4, "a lost its copy", missing_base=True)
    assert out.released == (4,) and o.needs_full and o.completed_id == 3


# -- ChainMember ----------------------------------------------------------------------------

CHAIN = ("o", "m1", "m2")


def test_member_stores_then_forwards_or_acks() -> None:
    head, tail = ChainMember("m1"), ChainMember("m2")
    m = inc(1, None)
    assert head.on_increment(m, CHAIN, 1) == [Store(m)]
    assert head.on_stored(m, CHAIN, 1) == [Forward("m2", m, CHAIN, 2)]
    assert tail.on_increment(m, CHAIN, 2) == [Store(m)]
    assert tail.on_stored(m, CHAIN, 2) == [Ack("o", INST, 1, "m2")]
    assert tail.last_stored(INST) == 1


def test_member_duplicates_are_not_stored_again_but_still_forwarded_and_acked() -> None:
    head, tail = ChainMember("m1"), ChainMember("m2")
    for member, pos in [(head, 1), (tail, 2)]:
        for m in [inc(1, None), inc(2, 1)]:
            member.on_increment(m, CHAIN, pos)
            member.on_stored(m, CHAIN, pos)
    assert head.on_increment(inc(1, None), CHAIN, 1) == [Forward("m2", inc(1, None), CHAIN, 2)]
    assert tail.on_increment(inc(2, 1), CHAIN, 2) == [Ack("o", INST, 2, "m2")]


def test_member_rejects_what_it_cannot_store() -> None:
    m = ChainMember("m1")
    gap = m.on_increment(inc(2, 1), CHAIN, 1)
    assert isinstance(gap[0], Reject) and gap[0].missing_base  # holds nothing for the instance
    assert isinstance(m.on_increment(inc(1, None), CHAIN, 2)[0], Reject)  # wrong position
    assert isinstance(m.on_increment(inc(1, None), ("o", "m1"), 5)[0], Reject)
    first = inc(1, None)
    assert m.on_increment(first, CHAIN, 1) == [Store(first)]
    busy = m.on_increment(first, CHAIN, 1)  # a retry while the first copy is still being stored
    assert isinstance(busy[0], Reject) and "busy" in busy[0].reason
    failed = m.on_store_failed(first, "disk full")
    assert isinstance(failed[0], Reject) and m.last_stored(INST) is None
    assert m.on_increment(first, CHAIN, 1) == [Store(first)]  # the retry is stored
    m.on_stored(first, CHAIN, 1)
    hole = m.on_increment(inc(3, 2), CHAIN, 1)
    assert isinstance(hole[0], Reject) and not hole[0].missing_base
    with pytest.raises(ValueError):
        m.on_stored(inc(3, 2), CHAIN, 1)  # never asked to store it
    seeded = ChainMember("m1", stored={INST: 5})
    assert seeded.on_increment(inc(6, 5), CHAIN, 1) == [Store(inc(6, 5))]


# -- property: random interleavings over a simulated lossy chain ------------------------------

POOL = ("a", "b", "c", "d")


@dataclass
class Sim:
    origin: ChainOrigin
    members: dict[str, ChainMember] = field(default_factory=lambda: {m: ChainMember(m) for m in POOL})
    stores: dict[str, list[IncrementMeta]] = field(default_factory=lambda: {m: [] for m in POOL})
    links: dict[tuple[str, str], deque[Any]] = field(default_factory=dict)
    next_id: int = 1
    last_accepted: int | None = None
    offered: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)

    def check(self, outcome: Any) -> None:
        self.released.extend(outcome.released)
        acked = outcome.completed[-1].checkpoint_id if outcome.completed else None
        for meta in outcome.completed:
            assert not self.completed or meta.checkpoint_id > self.completed[-1]
            self.completed.append(meta.checkpoint_id)
            # the whole current chain stored it, or a later full snapshot that supersedes it
            for member in self.origin.group:
                assert any(m.checkpoint_id == meta.checkpoint_id or (m.full and m.checkpoint_id > meta.checkpoint_id)
                           for m in self.stores[member])
        if acked is not None:
            for member in self.origin.group:
                assert max(ids(self.stores[member])) >= acked
        assert self.origin.in_flight <= self.origin.max_in_flight

    def offer(self, full: bool) -> None:
        cid, self.next_id = self.next_id, self.next_id + 1
        full = full or self.origin.needs_full or self.last_accepted is None
        out = self.origin.offer(inc(cid, None if full else self.last_accepted), cid)
        self.offered.append(cid)
        if out.accepted:
            self.last_accepted = cid
        self.check(out)

    def send(self) -> None:
        sendable = self.origin.sendable()
        if sendable:
            s = sendable[0]
            self.check(self.origin.on_sent(s.checkpoint_id))
            self.links.setdefault(("o", s.to), deque()).append(("inc", s.meta, ("o", *s.group), 1))

    def busy_links(self) -> list[tuple[str, str]]:
        return sorted(k for k, q in self.links.items() if q)

    def deliver(self, n: int, lose: bool = False) -> None:
        busy = self.busy_links()
        if not busy:
            return
        src, dst = busy[n % len(busy)]
        msg = self.links[(src, dst)].popleft()
        if lose:
            if src == "o":  # the origin sees its own send fail
                self.check(self.origin.on_failure(msg[1].checkpoint_id, "lost"))
            return
        if msg[0] == "ack":
            self.check(self.origin.on_ack(msg[1], msg[2]))
            return
        _, meta, chain, pos = msg
        member = self.members[dst]
        actions = member.on_increment(meta, chain, pos)
        if isinstance(actions[0], Store):
            store = self.stores[dst]
            assert meta.full or (store and store[-1].checkpoint_id == meta.previous_id)  # gap-free
            store.append(meta)
            actions = member.on_stored(meta, chain, pos)
        action = actions[0]
        if isinstance(action, Forward):
            self.links.setdefault((dst, action.to), deque()).append(("inc", action.meta, action.chain,
                                                                     action.position))
        elif isinstance(action, Ack):
            self.links.setdefault((dst, "o"), deque()).append(("ack", action.checkpoint_id, action.from_member))
        elif src == "o":  # the head's rejection is the reply to the origin's send
            self.check(self.origin.on_failure(meta.checkpoint_id, action.reason,
                                              missing_base=action.missing_base))

    def timeout(self) -> None:
        if self.origin.in_flight_ids:
            self.check(self.origin.on_failure(self.origin.in_flight_ids[0], "no ack"))

    def set_group(self, n: int) -> None:
        rnd = random.Random(n)
        group = rnd.sample(POOL, rnd.randint(0, 3))
        self.check(self.origin.set_group(group))


EVENTS = ("offer", "full", "send", "send", "deliver", "deliver", "deliver", "lose", "timeout", "group")


@settings(max_examples=500, deadline=None)
@given(r=st.integers(1, 3), steps=st.lists(st.tuples(st.sampled_from(EVENTS), st.integers(0, 10_000)),
                                          max_size=150))
def test_random_interleavings_complete_in_order_and_only_after_the_tail_stored(
        r: int, steps: list[tuple[str, int]]) -> None:
    sim = Sim(ChainOrigin(INST, POOL[:r], max_in_flight=2, max_bytes_in_flight=25, max_pending=5))
    for event, n in steps:
        if event in ("offer", "full"):
            sim.offer(full=event == "full")
        elif event == "send":
            sim.send()
        elif event in ("deliver", "lose"):
            sim.deliver(n, lose=event == "lose")
        elif event == "timeout":
            sim.timeout()
        else:
            sim.set_group(n)
    # then a stable group and a lossless network: everything still held completes
    if not sim.origin.group:
        sim.check(sim.origin.set_group(["b", "a"]))
    sim.offer(full=False)
    if sim.origin.needs_full:  # that delta overflowed the queue
        sim.offer(full=True)
    for _ in range(10_000):
        if not sim.origin.pending:
            break
        if sim.busy_links():
            sim.deliver(0)
        elif sim.origin.sendable():
            sim.send()
        else:
            sim.timeout()  # lost messages: the origin's ack timeout fires
    assert not sim.origin.pending and sim.origin.completed_id == sim.last_accepted == sim.completed[-1]
    assert sorted(sim.released) == sorted(sim.offered)  # every payload released exactly once
    for member in sim.origin.group:
        assert sim.stores[member][-1].checkpoint_id == sim.last_accepted


# -- the gRPC edge --------------------------------------------------------------------------


@dataclass
class Member:
    service: IncrementService
    server: Any
    address: str
    got: list[tuple[IncrementMeta, bytes]] = field(default_factory=list)

    def stop(self) -> None:
        self.server.stop(0)
        self.service.close()


def start_member(root: Path, name: str, fail_first: int = 0, **kw: Any) -> Member:
    got: list[tuple[IncrementMeta, bytes]] = []
    failures = [fail_first]

    def apply(meta: IncrementMeta, path: Path) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError("injected store failure")
        got.append((meta, path.read_bytes()))

    service = IncrementService(apply, root / name / "spool", security=SECURITY, forward_timeout=1.0,
                               call_timeout=5.0, **kw)
    server = rpc.serve(service.handlers(), security=SECURITY, max_workers=8, bind_host="127.0.0.1")
    address = f"127.0.0.1:{server.port}"
    service.start(address)
    return Member(service, server, address, got)


@pytest.fixture
def net(tmp_path: Path) -> Any:
    """An origin worker (a ChainShipper on its own server) plus a factory of member workers."""
    completed: list[IncrementMeta] = []
    shipper = ChainShipper(security=SECURITY, on_completed=lambda meta, chain: completed.append(meta),
                           ack_timeout=5.0, call_timeout=5.0,
                           retry_backoff=(0.05, 0.2))
    server = rpc.serve(shipper.handlers(), security=SECURITY, max_workers=8, bind_host="127.0.0.1")
    shipper.start(f"127.0.0.1:{server.port}")
    members: list[Member] = []

    def member(name: str, **kw: Any) -> Member:
        members.append(start_member(tmp_path, name, **kw))
        return members[-1]

    def payload(cid: int, data: bytes) -> Path:
        path = tmp_path / "origin" / f"{cid}.inc"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    yield shipper, member, payload, completed
    shipper.close()
    server.stop(0)
    for m in members:
        m.stop()


def eventually(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_ships_increments_along_a_real_chain(net: Any, tmp_path: Path) -> None:
    shipper, member, payload, completed = net
    m1, m2 = member("m1"), member("m2")
    shipper.set_group(INST, [m1.address, m2.address])
    assert shipper.needs_full(INST)
    big = os.urandom(10 * 1024 * 1024 + 123)  # three chunks
    datas = {1: b"full snapshot", 2: big, 3: b"", 4: b"small delta"}
    paths = {}
    for cid, data in datas.items():
        paths[cid] = payload(cid, data)
        meta = IncrementMeta(INST, cid, None if cid == 1 else cid - 1, f"d{cid}", bytes_shipped=len(data),
                             runtime=b"rt%d" % cid)
        assert shipper.offer(meta, paths[cid])
    assert shipper.wait_completed(INST, 4, timeout=30)
    eventually(lambda: len(completed) == 4)
    assert ids(completed) == [1, 2, 3, 4] and shipper.completed_id(INST) == 4
    for m in (m1, m2):
        assert ids(meta for meta, _ in m.got) == [1, 2, 3, 4]
        assert [data for _, data in m.got] == list(datas.values())
        assert m.got[1][0].runtime == b"rt2"
    eventually(lambda: not any(p.exists() for p in paths.values()))  # garbage-collected at the origin
    eventually(lambda: not any(any((tmp_path / m / "spool").iterdir()) for m in ("m1", "m2")))
    status = shipper.status()[INST]
    assert status["in_flight"] == status["queued"] == 0 and not status["needs_full"]


def test_dead_head_fails_sends_until_the_group_changes_then_needs_full(net: Any) -> None:
    shipper, member, payload, completed = net
    m1, m2, m3 = member("m1"), member("m2"), member("m3")
    shipper.set_group(INST, [m1.address, m2.address])
    shipper.offer(inc(1, None), payload(1, b"one"))
    assert shipper.wait_completed(INST, 1, timeout=15)
    m1.stop()
    two = payload(2, b"two")
    assert shipper.offer(inc(2, 1), two)
    eventually(lambda: shipper.status()[INST]["failures"] >= 2)  # retried
    status = shipper.status()[INST]
    assert status["completed_id"] == 1 and "UNAVAILABLE" in status["last_failure"]
    shipper.set_group(INST, [m2.address, m3.address])
    assert shipper.needs_full(INST)
    eventually(lambda: not two.exists())  # dropped and released
    assert not shipper.offer(inc(3, 2), payload(3, b"three"))
    assert shipper.offer(inc(4, None), payload(4, b"four"))
    assert shipper.wait_completed(INST, 4, timeout=15)
    eventually(lambda: ids(completed) == [1, 4])
    assert ids(meta for meta, _ in m2.got) == [1, 4] and m3.got == [(inc(4, None), b"four")]


def test_dead_tail_nacks_through_the_head_and_duplicates_are_stored_once(net: Any) -> None:
    shipper, member, payload, completed = net
    m1, m2, m3 = member("m1"), member("m2"), member("m3")
    shipper.set_group(INST, [m1.address, m2.address])
    shipper.offer(inc(1, None), payload(1, b"one"))
    assert shipper.wait_completed(INST, 1, timeout=15)
    m2.stop()
    shipper.offer(inc(2, 1), payload(2, b"two"))
    eventually(lambda: shipper.status()[INST]["failures"] >= 2)  # the head's nacks trigger resends
    status = shipper.status()[INST]
    assert status["completed_id"] == 1 and m2.address in status["last_failure"]
    assert ids(meta for meta, _ in m1.got) == [1, 2]  # resent, stored once
    shipper.set_group(INST, [m1.address, m3.address])
    assert shipper.needs_full(INST)
    shipper.offer(inc(3, None), payload(3, b"three"))
    assert shipper.wait_completed(INST, 3, timeout=15)
    assert ids(meta for meta, _ in m1.got) == [1, 2, 3] and ids(meta for meta, _ in m3.got) == [3]
    eventually(lambda: ids(completed) == [1, 3])


def test_several_instances_share_one_shipper(net: Any) -> None:
    shipper, member, payload, completed = net
    m1 = member("m1")
    instances = [(1, p) for p in range(4)]
    for inst in instances:
        shipper.set_group(inst, [m1.address])
    for cid in (1, 2, 3):
        for inst in instances:
            meta = inc(cid, None if cid == 1 else cid - 1, instance=inst)
            assert shipper.offer(meta, payload(cid * 100 + inst[1], b"%d/%d" % (inst[1], cid)))
    for inst in instances:
        assert shipper.wait_completed(inst, 3, timeout=15)
    eventually(lambda: len(completed) == 12)
    for inst in instances:
        assert [m.checkpoint_id for m in completed if m.instance == inst] == [1, 2, 3]
        assert [data for meta, data in m1.got if meta.instance == inst] == [b"%d/%d" % (inst[1], c)
                                                                          for c in (1, 2, 3)]


class LoopbackPeer:
    """Calls a handler in-process, optionally corrupting the payload bytes of each chunk."""

    def __init__(self, handler: Callable[[bytes], bytes], corrupt: bool = False) -> None:
        self.handler, self.corrupt, self.address = handler, corrupt, "loopback"

    def call_bytes(self, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        assert method == CHUNK_METHOD
        if self.corrupt and len(payload) > 1:
            payload = payload[:-1] + bytes([payload[-1] ^ 1])
        return self.handler(payload)


def test_receiver_verifies_checksum_rejects_bad_chains_and_survives_store_failures(tmp_path: Path) -> None:
    got: list[tuple[int, bytes]] = []
    failures = [1]

    def apply(meta: IncrementMeta, path: Path) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError("disk full")
        got.append((meta.checkpoint_id, path.read_bytes()))

    service = IncrementService(apply, tmp_path / "spool", security=SECURITY, chunk_size=CHUNK_SIZE)
    handler = service.handlers()[CHUNK_METHOD]
    src = tmp_path / "payload"
    src.write_bytes(os.urandom(3000))
    chain = ("origin", "me")
    with pytest.raises(TransferRejected, match="not running"):
        send_increment(LoopbackPeer(handler), inc(1, None), src, chain, 1)
    service.start("me")
    try:
        with pytest.raises(TransferRejected, match="checksum"):
            send_increment(LoopbackPeer(handler, corrupt=True), inc(1, None), src, chain, 1, chunk_size=1000)
        with pytest.raises(TransferRejected) as missing:
            send_increment(LoopbackPeer(handler), inc(2, 1), src, chain, 1)
        assert missing.value.missing_base
        with pytest.raises(TransferRejected, match="not at position"):
            send_increment(LoopbackPeer(handler), inc(1, None), src, ("origin", "other"), 1)
        with pytest.raises(TransferRejected, match="disk full"):
            send_increment(LoopbackPeer(handler), inc(1, None), src, chain, 1, chunk_size=1000)
        send_increment(LoopbackPeer(handler), inc(1, None), src, chain, 1, chunk_size=1000)
        send_increment(LoopbackPeer(handler), inc(1, None), src, chain, 1, chunk_size=1000)  # duplicate
        assert got == [(1, src.read_bytes())]
        assert service.member is not None and service.member.last_stored(INST) == 1
        eventually(lambda: not any((tmp_path / "spool").iterdir()))
    finally:
        service.close()


def test_stale_partial_transfers_are_swept(tmp_path: Path) -> None:
    service = IncrementService(lambda meta, path: None, tmp_path / "spool", security=SECURITY, spool_ttl=0.0)
    handler = service.handlers()[CHUNK_METHOD]
    service.start("me")
    stop = threading.Event()

    class HalfPeer(LoopbackPeer):
        def call_bytes(self, method: str, payload: bytes, timeout: float | None = None) -> bytes:
            if stop.is_set():
                raise ConnectionError("sender died")
            stop.set()
            return self.handler(payload)

    src = tmp_path / "payload"
    src.write_bytes(b"x" * 2500)
    with pytest.raises(ConnectionError):
        send_increment(HalfPeer(handler), inc(1, None), src, ("o", "me"), 1, chunk_size=1000)
    assert len(list((tmp_path / "spool").glob("*.part"))) == 1
    send_increment(LoopbackPeer(handler), inc(1, None), src, ("o", "me"), 1, chunk_size=1000)
    assert not list((tmp_path / "spool").glob("*.part"))
    service.close()


def test_a_completed_checkpoint_names_the_chain_that_acked_it_not_the_group_of_later(tmp_path: Path) -> None:
    """The tail of chain [a] acks checkpoint 1; before the shipper thread reports it, the group
    becomes [b] (a new member, which holds nothing): the report still names [a], the member that
    holds it (the driver would otherwise restore from a worker that has nothing)."""
    done: list[tuple[int, tuple[str, ...]]] = []
    shipper = ChainShipper(security=SECURITY, on_completed=lambda meta, chain: done.append((meta.checkpoint_id,
                                                                                           chain)))
    payload = tmp_path / "1.inc"
    payload.write_bytes(b"x" * 10)
    shipper.set_group(INST, ["a"])
    assert shipper.offer(inc(1, None), payload)  # (a full snapshot: no previous checkpoint)
    shipper.handlers()[ACK_METHOD](wire.encode(ChainAck(INST, 1, "a")))
    shipper.set_group(INST, ["b"])
    shipper.start("127.0.0.1:1")  # (the thread reports what completed)
    try:
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        shipper.close()
    assert done == [(1, ("a",))]
