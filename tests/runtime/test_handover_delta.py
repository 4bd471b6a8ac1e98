"""Rhino handover state without Spark: an origin ships only the changes since its last checkpoint to
a target whose worker holds that checkpoint (a member of its replica group), and the target rebuilds
the cut from its copy; everything else gets the whole cut (rhino_state.cut, the backend's
``changes_in``, ``ReplicaStore.read_key_groups``, the origin and target roles)."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replication.control.handover_coordinator import HandoverCoordinator
from replication.examples.ordered import build_ordered_job
from replication.handover_orders import HandoverOrder
from replication.heartbeat_parts import ReplicaAck
from replication.plan import plan_job
from replication.runtime.cut_exchange import CutExchange
from replication.runtime.handover_cuts import OriginCut, split_cut
from replication.runtime.handovers import PartitionHandovers
from replication.runtime.routes import Routes
from rhino_state import (
    CheckpointNotHeldError,
    ReplicaStore,
    RocksDBStateBackend,
    RoutingTable,
    VnodeMove,
    moved_key_groups,
    vnode_key_groups,
)
from rhino_state.cut import Delivery, apply_changes, cut_digest, entry_bytes, plan_delivery

G, V = 64, 8  # 8 key groups per vnode
ORIGIN = (3, 0)  # (task, partition) of the origin


def _content(backend: RocksDBStateBackend, groups) -> list[tuple[int, bytes, bytes]]:
    return [e for r in groups for e in backend.iter_key_groups(r)]


def _order(moves=((0, 0, 1), (1, 0, 1)), committed: bool = True) -> HandoverOrder:
    table = RoutingTable.uniform(V, 3)
    for vnode, _, target in moves:
        table = table.moved([vnode], target)
    return HandoverOrder(7, table.epoch, 3, table, tuple(VnodeMove(*m) for m in moves), 10, 14,
                         frozenset({(1, 0)}), committed)


# --------------------------------------------------------------------------- the changes since a checkpoint

kgs = st.sampled_from([0, 9, 16])  # vnodes 0, 1 (those whose changes are asked for) and 2
rests = st.sampled_from([b"a", b"ab"])  # few keys, so writes before and after the checkpoint collide
writes = st.lists(st.one_of(st.tuples(st.just("put"), kgs, rests, st.binary(max_size=4)),
                            st.tuples(st.just("delete"), kgs, rests), st.tuples(st.just("flush"))), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes, writes, st.integers(0, 3), st.sets(st.integers(0, 1), min_size=1))
def test_a_checkpoint_plus_the_changes_since_is_the_state_now(before, after, cache_max, vnodes):
    """Whatever was written before and after the checkpoint, and however the write-back cache
    flushed in between, the checkpoint's content of some key groups with ``changes_in`` of them
    applied is exactly their content now, and the cut digest agrees."""
    groups = [vnode_key_groups(v, G, V) for v in sorted(vnodes)]
    with tempfile.TemporaryDirectory() as d:
        backend = RocksDBStateBackend(Path(d) / "db", cache_max, instance=ORIGIN)
        try:
            assert backend.changes_in(groups) is None  # no checkpoint yet: nothing to apply changes to
            for op in before:
                _write(backend, op)
            backend.checkpoint(1, Path(d) / "1.inc")
            base = _content(backend, groups)
            for op in after:
                _write(backend, op)
            changes = backend.changes_in(groups)
            now = _content(backend, groups)
            assert apply_changes(base, changes) == now
            assert cut_digest(apply_changes(base, changes)) == cut_digest(now)
            assert all(g in set().union(*map(set, groups)) for g, _, _ in changes)
            assert [c[:2] for c in changes] == sorted({c[:2] for c in changes})  # key order, each once
        finally:
            backend.close()


def _write(backend: RocksDBStateBackend, op) -> None:
    if op[0] == "put":
        backend.put(op[1], op[2], op[3])
    elif op[0] == "delete":
        backend.delete(op[1], op[2])
    else:
        backend.flush()


def test_the_digest_and_the_rebuild_do_not_depend_on_the_order_of_entries():
    base = [(1, b"a", b"1"), (0, b"z", b"2"), (1, b"b", b"3")]
    assert cut_digest(base) == cut_digest(list(reversed(base))) != cut_digest(base[:2])
    assert apply_changes(base, [(1, b"b", None), (2, b"c", b"4"), (0, b"z", b"5")]) == \
        [(0, b"z", b"5"), (1, b"a", b"1"), (2, b"c", b"4")]
    assert entry_bytes([(1, b"ab", b"xyz"), (2, b"c", None)]) == 2 + 2 + 3 + 2 + 1


# --------------------------------------------------------------------------- how a cut is delivered


@pytest.mark.parametrize("target, origin_workers, holders, has_base, fetchable, expected", [
    (0, {0, 1}, {2}, True, True, Delivery.LOCAL),  # same worker: in process, whole
    (1, {0, 1}, {2}, True, True, Delivery.SKIP),  # the other origin replica is there
    (1, {0, 1}, {2}, True, False, Delivery.FULL),  # ... but without kept cuts nothing could be fetched
    (2, {0, 1}, {2}, True, True, Delivery.DELTA),  # its worker holds the origin's checkpoints
    (2, {0, 1}, {2}, False, True, Delivery.FULL),  # no checkpoint chain at the origin
    (3, {0, 1}, {2}, True, True, Delivery.FULL),  # not a member of the replica group
])
def test_an_origin_replica_plans_how_each_target_replica_gets_its_cut(target, origin_workers, holders, has_base,
                                                                      fetchable, expected):
    assert plan_delivery(target, 0, origin_workers, holders, has_base, fetchable) is expected


# --------------------------------------------------------------------------- reading a checkpoint in a replica store


def test_a_replica_store_reads_key_groups_of_a_checkpoint_it_holds_and_says_when_it_does_not(tmp_path):
    backend = RocksDBStateBackend(tmp_path / "origin", 4, instance=ORIGIN)
    store = ReplicaStore(tmp_path / "store")
    try:
        for i in range(40):
            backend.put(i % 16, b"k%02d" % i, b"v1-%d" % i)
        content = {}
        for cid in (1, 2, 3):
            if cid > 1:
                for i in range(0, 40, cid):
                    backend.put(i % 16, b"k%02d" % i, b"v%d-%d" % (cid, i))
                backend.delete(cid, b"k%02d" % cid)
            meta = backend.checkpoint(cid, tmp_path / f"{cid}.inc")
            content[cid] = _content(backend, [range(0, 8), range(12, 16)])
            store.apply(meta, tmp_path / f"{cid}.inc")
            if cid == 1:
                with pytest.raises(CheckpointNotHeldError):  # (not completed, but the standby is at it)
                    store.read_key_groups(ORIGIN, 0, [range(0, 8)])
                assert store.read_key_groups(ORIGIN, 1, [range(0, 8), range(12, 16)]) == content[1]
                store.complete(ORIGIN, 1)
        # the standby is at 3; 1 is the completed snapshot, 2 a pending one taken before the standby moved on
        for cid in (1, 2, 3):
            assert store.read_key_groups(ORIGIN, cid, [range(0, 8), range(12, 16)]) == content[cid]
        store.complete(ORIGIN, 3)  # snapshots of 1 and 2 go
        with pytest.raises(CheckpointNotHeldError, match="standby is at 3"):
            store.read_key_groups(ORIGIN, 2, [range(0, 8)])
        with pytest.raises(CheckpointNotHeldError):
            store.read_key_groups((9, 9), 3, [range(0, 8)])
        assert store.read_key_groups(ORIGIN, 3, [range(0, 0)]) == []
    finally:
        store.close()
        backend.close()


# --------------------------------------------------------------------------- origin to target, end to end


def test_a_target_rebuilds_the_origins_cut_from_its_copy_of_the_last_checkpoint_and_the_changes(tmp_path):
    """Origin partition 0 gives vnode 0 to partition 1 and vnode 1 to partition 2.  Its replica
    group member holds checkpoint 5; after it, some moved keys changed, some were deleted, some are
    new, and keys outside the moved vnodes changed too.  Each target rebuilds exactly the entries
    the origin cut for it from the store and the changes, which are a small part of the cut."""
    origin = RocksDBStateBackend(tmp_path / "origin", 16, instance=ORIGIN)
    store = ReplicaStore(tmp_path / "store")
    try:
        for i in range(300):
            origin.put(i % 24, b"key%03d" % i, b"x" * 50)
        meta = origin.checkpoint(5, tmp_path / "5.inc")
        store.apply(meta, tmp_path / "5.inc")
        store.complete(ORIGIN, 5)
        origin.put(0, b"key000", b"changed")  # vnode 0
        origin.delete(9, b"key009")  # vnode 1
        origin.put(10, b"new", b"fresh")  # vnode 1
        origin.put(20, b"key020", b"elsewhere")  # vnode 2: stays
        order = _order(moves=((0, 0, 1), (1, 0, 2)))
        ho = PartitionHandovers(3, 0, G, V)
        assert ho.arm(order) == "armed"
        ho.at_pulse(11)
        cut = ho.cut(order, origin, incremental=True)
        assert cut.base == 5 and len(cut.changes) == 3
        per_target = split_cut(order, 0, cut, {}, G, chunk_bytes=1 << 20)
        assert sorted(per_target) == [1, 2]
        assert entry_bytes(c for t in per_target.values() for ch in t.changes for c in ch) < \
            entry_bytes(cut.entries) / 20
        for target, tcut in per_target.items():
            assert tcut.base == 5 and tcut.entries == len([e for ch in tcut.chunks for e in ch])
            groups = moved_key_groups(order.moves, 0, target, G, V)
            rebuilt = apply_changes(store.read_key_groups(ORIGIN, 5, groups), [c for ch in tcut.changes for c in ch])
            assert rebuilt == sorted(e for ch in tcut.chunks for e in ch)
            assert cut_digest(rebuilt) == tcut.digest
        assert origin.get(20, b"key020") == b"elsewhere" and origin.get(0, b"key000") is None
        # without a checkpoint chain (or not asked for), no changes: the cut goes whole
        again = PartitionHandovers(3, 0, G, V)
        assert again.arm(_order(moves=((2, 0, 1),))) == "armed"
        whole = again.cut(_order(moves=((2, 0, 1),)), origin)
        assert whole.base is None and whole.changes is None and whole.entries
    finally:
        store.close()
        origin.close()


def test_a_target_assembles_the_changes_from_either_origin_replica_and_notes_what_it_read_locally(tmp_path):
    target = PartitionHandovers(3, 1, G, V)
    order = _order()
    assert target.arm(order) == "armed"
    changes = [(0, b"a", b"1"), (1, b"b", None), (2, b"c", b"3")]
    # chunks of base 4 from one replica, a repeat from the other, and stray chunks of another base
    assert target.delta_arrived(7, 0, 4, changes[2:], 1, 2, "d", 10, {}) is None
    assert target.delta_arrived(7, 0, 3, changes[:1], 0, 2, "other", 9, {"w": [1]}) is None
    assert target.delta_arrived(7, 0, 4, changes[2:], 1, 2, "d", 10) is None
    delta = target.delta_arrived(7, 0, 4, changes[:2], 0, 2, "d", 10, {"w": []})
    assert delta is not None and (delta.base, delta.changes, delta.digest, delta.entries) == (4, changes, "d", 10)
    assert target.delta_arrived(7, 0, 4, changes[:2], 0, 2, "d", 10) is None  # complete already
    assert target.delta_arrived(7, 5, 4, changes, 0, 1, "d", 10) is None  # not an origin of this target
    assert target.missing_cuts() == [(7, 0)] and target.missing_cuts(blocked_for=0.0) == []  # not at R yet
    step = target.step(7)
    step.release_reached_at = time.time() - 1.0
    assert target.missing_cuts(blocked_for=0.5) == [(7, 0)] and target.missing_cuts(blocked_for=5.0) == []
    target.state_arrived(7, 0, [(0, b"a", b"1")], 0, 2)  # a first chunk of the whole cut, fetched
    target.cut_rebuilt(7, 0, [(0, b"a", b"1"), (1, b"c", b"2")], {"w": []}, from_store=123)
    assert target.missing_cuts() == [] and step.times()["from_store"] == 123
    assert step.state == [(0, b"a", b"1"), (1, b"c", b"2")]
    target.state_arrived(7, 0, [(1, b"c", b"2")], 1, 2)  # the rest of the fetch: too late, ignored
    assert step.state == [(0, b"a", b"1"), (1, b"c", b"2")] and step.from_store == 123
    assert target.delta_arrived(7, 0, 4, changes, 0, 1, "d", 10) is None  # the cut is in


def test_the_coordinator_counts_the_bytes_cut_sent_and_read_from_the_targets_stores():
    """Per step: the bytes the origins cut, the most one replica of each origin sent over the
    network, and the most one replica of each target read from its copy of the origin's checkpoint."""
    plan = plan_job(build_ordered_job("a", "b", "out"), default_parallelism=2, num_key_groups=G, num_vnodes=V,
                    topic_partitions={"a": 2, "b": 2})
    plan.replicas = 2
    co = HandoverCoordinator(plan)
    chain = next(t for t in plan.tasks if t.name == "chain").id
    order = co.start_move(chain, [0, 1], 1, switch_at=10, release_at=14)
    hid, now = order.handover_id, time.time()

    def acks(kind, instances, **times):
        return [ReplicaAck(hid, order.epoch, (*inst, r), kind, "d", 5, 0, 3, {"at": now, **{k: v[r] for k, v in times.items()}})
                for inst in instances for r in (0, 1)]

    co.on_acks(acks("armed", [*order.upstreams, (chain, 0), (chain, 1)]), now)
    co.on_acks(acks("switched", order.upstreams), now)
    co.on_acks(acks("cut", [(chain, 0)], bytes=(1000, 1000), shipped=(40, 60)), now)
    co.on_acks(acks("loaded", [(chain, 1)], from_store=(0, 900)), now)
    assert co.state(hid).value == "completed"
    assert (co.times.moved_bytes(hid), co.times.shipped_bytes(hid), co.times.store_bytes(hid)) == (1000, 60, 900)


def test_an_origin_cut_keeps_its_digest_with_its_entries():
    cut = OriginCut([(0, b"a", b"1")], cut_digest([(0, b"a", b"1")]))
    assert cut.base is None and cut.changes is None


# --------------------------------------------------------------------------- the worker's rebuild, and its fallback


class _Instance:
    """What ``CutExchange._rebuild_cut`` and ``CutExchange._fetch_cut`` use of a hosted replica."""

    def __init__(self, partition: int) -> None:
        self.task = type("Task", (), {"id": 3, "name": "chain"})()
        self.partition, self.replica, self.name = partition, 0, f"chain[{partition}]r0"
        self.handovers = PartitionHandovers(3, partition, G, V)
        self.stop_requested = threading.Event()


def _worker(store: ReplicaStore, hosted: list[_Instance]):
    """A worker hosting ``hosted`` (the origin's replica among them: fetches are answered in process)
    whose replica store is ``store``."""
    from replication.runtime.worker import Worker

    worker = Worker.__new__(Worker)
    worker.index, worker.stopping = 0, threading.Event()
    worker.plan = type("Plan", (), {"num_key_groups": G, "replicas": 1})()
    worker.cfg = None
    worker.checkpoints = type("Checkpoints", (), {"store": store})()
    worker.instances = {(i.task.id, i.partition): i for i in hosted}
    worker.routes = Routes(0, None, worker.plan, {(3, i.partition, 0): 0 for i in hosted}, peer=None,
                           deliver_local=None, cut_off=None, stopping=worker.stopping)
    worker.routes.learn({0: "here"})
    return worker


@pytest.mark.parametrize("case", ["rebuilt", "checkpoint not here", "wrong digest"])
def test_a_target_that_cannot_rebuild_the_cut_from_its_checkpoint_copy_fetches_it_whole(tmp_path, monkeypatch, case):
    """The target's worker holds checkpoint 5 of the origin.  Changes against 5 rebuild the cut there;
    changes against a checkpoint it does not hold (after a short wait for its increment), or a
    rebuild whose digest differs from the origin's, make it fetch the whole cut an origin replica
    kept.  Either way the target ends with exactly the origin's cut."""
    monkeypatch.setattr("replication.runtime.cut_exchange.BASE_WAIT_S", 0.05)
    origin_state = RocksDBStateBackend(tmp_path / "origin", 4, instance=ORIGIN)
    store = ReplicaStore(tmp_path / "store")
    try:
        for i in range(20):
            origin_state.put(i % 16, b"k%02d" % i, b"v%d" % i)
        store.apply(origin_state.checkpoint(5, tmp_path / "5.inc"), tmp_path / "5.inc")
        origin_state.put(3, b"k03", b"changed")
        order = _order()
        origin, target = _Instance(0), _Instance(1)
        for inst in (origin, target):
            assert inst.handovers.arm(order) == "armed"
        origin.handovers.at_pulse(11)
        cut = origin.handovers.cut(order, origin_state, incremental=True)
        kept = split_cut(order, 0, cut, {}, G, chunk_bytes=64)
        origin.handovers.kept_cuts.keep(7, kept)
        tcut = kept[1]
        changes = [c for ch in tcut.changes for c in ch]
        base = {"rebuilt": 5, "checkpoint not here": 6, "wrong digest": 5}[case]
        digest = "0" * 64 if case == "wrong digest" else tcut.digest
        delta = target.handovers.delta_arrived(7, 0, base, changes, 0, 1, digest, tcut.entries, {})
        CutExchange(_worker(store, [origin, target]))._rebuild_cut(target, delta)
        step = target.handovers.step(7)
        assert step.state == sorted(e for ch in tcut.chunks for e in ch) and len(step.state) == tcut.entries
        assert (step.from_store > 0) == (case == "rebuilt")
    finally:
        store.close()
        origin_state.close()


class _Unreachable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def __str__(self) -> str:
        return "<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\t...>"


def test_a_cut_no_origin_replica_can_give_is_asked_for_less_and_less_often_and_logged_once(monkeypatch, caplog):
    """The origin's workers are down: the target asks every 0.2 s, doubling up to 2 s, and says so
    once per worker in one line (it logged the whole gRPC error every 0.2 s)."""
    from replication.runtime import cut_exchange

    target = _Instance(1)
    worker = _worker(None, [target])
    worker.plan = type("Plan", (), {"num_key_groups": G, "replicas": 2})()
    worker.routes = Routes(0, None, worker.plan, {(3, 0, 0): 1, (3, 0, 1): 1, (3, 1, 0): 0, (3, 1, 1): 2}, peer=None,
                           deliver_local=None, cut_off=None, stopping=worker.stopping)
    worker.routes.learn({0: "here", 1: "origin-r0", 2: "target-twin"})
    calls: list[str] = []

    class _Peer:
        def __init__(self, address: str) -> None:
            self.address = address

        def call(self, method, request, reply_type, timeout):
            calls.append(self.address)
            raise _Unreachable()

    worker.peer = _Peer
    cuts = CutExchange(worker)
    cuts._fetching = {target.name}
    target.handovers.missing_cuts = lambda blocked_for: [(7, 0)]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 7:
            target.stop_requested.set()

    monkeypatch.setattr(cut_exchange.time, "sleep", sleep)
    with caplog.at_level(logging.WARNING, logger="replication.runtime.cut_exchange"):
        cuts._fetch_cuts(target, 0.5)
    assert waits == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert len(calls) == 7 * 3  # both origin replicas and the target's twin, every round
    logged = [r.getMessage() for r in caplog.records if "fetching the cut" in r.getMessage()]
    assert len(logged) == 2 and all("UNAVAILABLE" in m and "\n" not in m for m in logged)  # workers 1 and 2
