"""The runtime side of a handover without Spark: a replica's origin and target roles on a real
RocksDB backend, and the driver's coordinator fed acks (replication.runtime.handovers, replication.control.handover_coordinator)."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest

from replication.config import ReplicationConfig
from replication.control.handover_coordinator import HandoverCoordinator
from replication.control.handover_timelines import DEFAULT_RELEASE_S, ReleaseMargin, step_phases
from replication.examples.ordered import build_ordered_job
from replication.handover_orders import (
    CodeOrder,
    HandoverOrder,
    format_vnodes,
    order_from_wire,
    parse_strategy,
    parse_vnodes,
)
from replication.heartbeat_parts import ReplicaAck
from replication.plan import plan_job
from replication.runtime.elements import DATA
from replication.runtime.handover_cuts import TargetCut, chunk_entries, vnode_bytes
from replication.runtime.handovers import CodeSwitches, PartitionHandovers, arm_acks
from replication.runtime.processing import ProcessingInstance
from rhino_state import (
    AllAtOnce,
    Batched,
    Fluid,
    RocksDBStateBackend,
    RoutingTable,
    VnodeMove,
    vnode_key_groups,
)
from rhino_state.cut import cut_digest, entry_bytes

G, V = 64, 8  # 8 key groups per vnode


def _order(*, origin: int = 0, target: int = 1, vnodes=(0, 1), switch_at: int = 10, release_at: int = 14,
           committed: bool = False, cancelled: bool = False) -> HandoverOrder:
    table = RoutingTable.uniform(V, 2)
    moved = table.moved(vnodes, target)
    return HandoverOrder(7, moved.epoch, 3, moved, tuple(VnodeMove(v, origin, target) for v in vnodes), switch_at,
                         release_at, frozenset({(1, 0), (1, 1)}), committed, cancelled)


def _kg(vnode: int, i: int = 0) -> int:
    return vnode_key_groups(vnode, G, V)[i]


@pytest.fixture
def backend(tmp_path):
    b = RocksDBStateBackend(str(tmp_path / "db"))
    yield b
    b.close()


def test_the_origin_cuts_exactly_the_moved_key_groups_at_the_pulse_after_the_switch(backend, tmp_path):
    moved = [(_kg(0, 1), b"a", b"1"), (_kg(1, 7), b"b", b"2")]
    kept = [(_kg(2), b"c", b"3"), (_kg(3, 4), b"d", b"4")]
    for kg, rest, value in moved + kept:
        backend.put(kg, rest, value)
    ho = PartitionHandovers(3, 0, G, V)
    assert ho.arm(_order()) == "armed"
    assert not ho.gating  # an origin holds nothing
    assert ho.at_pulse(10) == ([], [])  # pulse P: records before it may still come
    cuts, releases = ho.at_pulse(11)
    assert [o.handover_id for o in cuts] == [7] and releases == []
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: stop.set() if ho.decided(7, lambda: False) else None)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # not known yet whether it was committed: the origin waits
    ho.arm(_order(committed=True))
    waiter.join(5)
    assert stop.is_set()
    cut = ho.cut(cuts[0], backend)
    entries, digest = cut.entries, cut.digest
    assert sorted(entries) == sorted(moved)
    assert [backend.get(kg, rest) for kg, rest, _ in moved] == [None, None]
    assert [backend.get(kg, rest) for kg, rest, _ in kept] == [b"3", b"4"]
    assert not ho.active
    twin = RocksDBStateBackend(str(tmp_path / "twin"))  # the other origin replica, same state written in another order
    for kg, rest, value in reversed(moved + kept):
        twin.put(kg, rest, value)
    twin_ho = PartitionHandovers(3, 0, G, V)
    twin_ho.arm(_order(committed=True))
    assert twin_ho.cut(cuts[0], twin).digest == digest  # the driver compares the two replicas' cut digests
    twin.close()


def test_the_target_holds_the_moved_key_groups_and_releases_them_in_order_once_loaded(backend):
    ho = PartitionHandovers(3, 1, G, V)
    assert ho.arm(_order()) == "armed"
    assert ho.gating  # from the arming on: the commit may reach this replica after the records
    moved1, other, moved2 = (DATA, "x", "k", 1, 0.0, None), (DATA, "y", "j", 2, 0.0, None), (DATA, "z", "k", 3, 0.0, None)
    ho.watermark_advanced(4)  # nothing held yet: not kept
    assert not ho.holding() and ho.gate((0, moved1, 4), _kg(0)) == () and ho.holding()
    assert ho.gate((1, other, 4), _kg(5)) == ((1, other, 4),)  # another key group passes
    ho.watermark_advanced(5)  # event time goes on for the others, and is kept for the held ones
    assert ho.gate((1, other, 5), _kg(5)) == ((1, other, 5),)
    assert ho.gate((1, moved2, 5), _kg(1, 3)) == ()
    assert ho.held_records == 2 and ho.advances == [5]
    ho.arm(_order(committed=True))
    assert ho.at_pulse(13) == ([], [])
    cuts, releases = ho.at_pulse(14)
    assert cuts == [] and len(releases) == 1
    assert ho.decided(7, lambda: False) is True
    loader = threading.Thread(target=lambda: ho.state_arrived(7, 0, [(_kg(0), b"k", b"state")]))
    threading.Timer(0.2, loader.start).start()
    held = ho.release(releases[0], backend, lambda: False)  # waits for the state
    assert held == ((0, moved1, 4), (1, moved2, 5))  # each with the watermark it arrived at
    assert backend.get(_kg(0), b"k") == b"state"
    assert not ho.gating and not ho.active and not ho.holding()
    ho.watermark_advanced(6)
    assert ho.advances == []


def test_a_target_that_serves_through_lets_the_moved_records_pass_and_merges_the_moved_state_in(backend):
    """A target whose chain merges its state (windows with ``merge``) holds nothing: the moved key
    groups' records are processed at once, their key groups are awaited (their windows do not
    fire) until the release, where each moved entry is merged with the one served meanwhile."""
    ho = PartitionHandovers(3, 1, G, V)
    ho.serve_through = True
    assert ho.awaited_key_groups() == frozenset()
    assert ho.arm(_order(committed=True)) == "armed"
    assert ho.awaited_key_groups() == frozenset(vnode_key_groups(0, G, V)) | frozenset(vnode_key_groups(1, G, V))
    moved = (DATA, "x", "k", 1, 0.0, None)
    assert ho.gate((0, moved, 5), _kg(0)) == ((0, moved, 5),) and not ho.holding()
    assert ho.held_records == 0
    backend.put(_kg(0), b"served", b"2")  # what it built since the switch
    ho.state_arrived(7, 0, [(_kg(0), b"served", b"5"), (_kg(1), b"only-moved", b"1")])
    _, releases = ho.at_pulse(14)
    held = ho.release(releases[0], backend, lambda: False,
                      merge=lambda rest, moved, served: b"%d" % (int(moved) + int(served)))
    assert held == ()
    assert backend.get(_kg(0), b"served") == b"7" and backend.get(_kg(1), b"only-moved") == b"1"
    assert ho.awaited_key_groups() == frozenset() and not ho.active


def test_a_target_fed_by_two_origins_loads_only_once_both_cuts_arrived(backend):
    """A rescale up takes vnodes from partitions 0 and 1 to the new partition 2 in one step: the
    target waits for both origins' cuts (either replica of each; a repeat or a cut from a
    partition that gives it nothing is ignored)."""
    table = RoutingTable.uniform(V, 2)
    moves = (VnodeMove(3, 0, 2), VnodeMove(7, 1, 2))
    new = table.moved([3, 7], 2, parallelism=3)
    order = HandoverOrder(9, new.epoch, 3, new, moves, 10, 14, frozenset({(1, 0), (1, 1)}), committed=True)
    ho = PartitionHandovers(3, 2, G, V)
    assert ho.arm(order) == "armed"
    _, releases = ho.at_pulse(14)
    ho.state_arrived(9, 0, [(_kg(3), b"a", b"from-0")])
    ho.state_arrived(9, 0, [(_kg(3), b"a", b"twin-late")])  # the other replica of origin 0: ignored
    ho.state_arrived(9, 2, [(_kg(5), b"x", b"nonsense")])  # not an origin of this target: ignored
    released: list = []
    loader = threading.Thread(target=lambda: released.append(ho.release(releases[0], backend, lambda: False)))
    loader.start()
    loader.join(0.3)
    assert loader.is_alive()  # origin 1's cut is missing
    ho.state_arrived(9, 1, [(_kg(7), b"b", b"from-1")])
    loader.join(5)
    assert released == [()]
    assert backend.get(_kg(3), b"a") == b"from-0" and backend.get(_kg(7), b"b") == b"from-1"
    assert backend.get(_kg(5), b"x") is None
    assert ho.moved_entries == 2


def test_the_cut_state_travels_in_chunks_and_is_loaded_once_every_chunk_arrived(backend):
    """A large cut goes in calls of at most ``handover.chunkBytes`` (gRPC messages are limited to
    64 MiB); chunks of the two origin replicas are interchangeable (same entries, same order)."""
    entries = [(_kg(0, i % 8), f"key{i:03}".encode(), b"v" * 100) for i in range(50)]
    chunks = chunk_entries(entries, 1000)
    assert len(chunks) == 7 and [e for c in chunks for e in c] == entries
    assert all(sum(len(r) + len(v) + 16 for _, r, v in c) <= 1000 for c in chunks)
    assert chunk_entries([], 1000) == [[]] and chunk_entries(entries[:1], 10) == [entries[:1]]  # too big: alone
    ho = PartitionHandovers(3, 1, G, V)
    ho.arm(_order(committed=True))
    _, releases = ho.at_pulse(14)
    for i in (3, 0, 6, 1, 0, 2, 4):  # out of order, one repeated (the other origin replica's)
        ho.state_arrived(7, 0, chunks[i], i, len(chunks))
    assert releases[0].state is None  # chunk 5 is missing
    ho.state_arrived(7, 0, chunks[5], 5, len(chunks))
    assert ho.release(releases[0], backend, lambda: False) == ()
    assert [backend.get(kg, rest) for kg, rest, _ in entries] == [b"v" * 100] * 50


def test_a_cancelled_handover_is_dropped_and_a_late_instruction_refused(backend):
    ho = PartitionHandovers(3, 1, G, V)
    ho.at_pulse(20)
    assert ho.arm(_order()) == "late"  # already past the release pulse
    ho2 = PartitionHandovers(3, 0, G, V)
    ho2.at_pulse(12)
    assert ho2.arm(_order()) == "late"  # an origin past the switch
    ho3 = PartitionHandovers(3, 1, G, V)
    ho3.arm(_order())
    ho3.arm(_order(cancelled=True))
    assert ho3.decided(7, lambda: False) is False
    step = ho3.step(7)
    assert step is not None and ho3.drop(step) == ()
    assert not ho3.active
    ho4 = PartitionHandovers(3, 1, G, V)
    ho4.arm(_order())
    assert ho4.decided(7, lambda: True) is None


def test_a_cancelled_steps_gate_lets_a_later_steps_records_go_only_through_that_steps_gate(backend):
    """The retry of a cancelled step over the same vnodes switches before the cancelled step's
    release pulse: the records the cancelled gate holds from that switch on are the retry's, and
    must wait for the retry's state, not be processed at the cancelled step's release."""
    ho = PartitionHandovers(3, 1, G, V)
    cancelled = _order(switch_at=10, release_at=14)
    retry = replace(_order(switch_at=12, release_at=20, committed=True), handover_id=8)
    assert ho.arm(cancelled) == "armed"
    ho.arm(replace(cancelled, cancelled=True))
    assert ho.arm(retry) == "armed"
    moved1, other, moved2 = (DATA, "x", "k", 1, 0.0, None), (DATA, "y", "j", 2, 0.0, None), (DATA, "z", "k", 3, 0.0, None)
    ho.at_pulse(12)  # the retry's switch: its upstreams route the moved key groups here from now on
    assert ho.gate((0, moved1, 3), _kg(0)) == ()
    assert ho.gate((1, other, 3), _kg(5)) == ((1, other, 3),)
    cuts, releases = ho.at_pulse(14)
    assert cuts == [] and [s.order.handover_id for s in releases] == [7]
    assert ho.decided(7, lambda: False) is False
    assert ho.drop(releases[0]) == ()  # the retry's gate takes them: its state is not loaded yet
    assert ho.gate((1, moved2, 4), _kg(1, 3)) == ()
    cuts, releases = ho.at_pulse(20)
    assert [s.order.handover_id for s in releases] == [8]
    ho.state_arrived(8, 0, [(_kg(0), b"k", b"state")])
    assert ho.release(releases[0], backend, lambda: False) == ((0, moved1, 3), (1, moved2, 4))
    assert backend.get(_kg(0), b"k") == b"state"
    assert not ho.gating and not ho.active


def _plan(max_parallelism: int | None = None):
    plan = plan_job(build_ordered_job("a", "b", "out", max_parallelism=max_parallelism), default_parallelism=2,
                    num_key_groups=G, num_vnodes=V, topic_partitions={"a": 2, "b": 2})
    plan.replicas = 2
    return plan


def _acks(order: HandoverOrder, kind: str, instances, **kw) -> list[ReplicaAck]:
    return [ReplicaAck(order.handover_id, order.epoch, (t, p, r), kind, kw.get("digest", ""), kw.get("entries", 0),
             kw.get("attempt", 0), kw.get("checkpoint", -1))
            for t, p in instances for r in (0, 1)]


def test_the_coordinator_commits_when_every_participant_armed_and_completes_in_phase_order():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    order = coord.start_move(chain.id, [0, 1], 1, switch_at=100, release_at=110)
    assert [o["id"] for o in coord.view()] == [order.handover_id] and not coord.view()[0]["committed"]
    upstreams, origin, target = sorted(order.upstreams), [(chain.id, 0)], [(chain.id, 1)]
    assert upstreams and all(t != chain.id for t, _ in upstreams)
    assert coord.on_acks(_acks(order, "armed", upstreams + origin)) == []
    events = coord.on_acks(_acks(order, "armed", target))
    assert any("committed" in e for e in events) and coord.view()[0]["committed"]
    coord.on_acks(_acks(order, "loaded", target))  # before the cut: kept until the release is placed
    coord.on_acks(_acks(order, "switched", upstreams))
    events = coord.on_acks(_acks(order, "cut", origin, digest="d", entries=12))
    assert any("cut 12 state entries" in e for e in events)
    assert any("completed" in e for e in events) and coord.view() == []
    assert coord.state(order.handover_id).value == "completed" and coord.moved_entries(order.handover_id) == 12
    with pytest.raises(ValueError, match="own partition"):
        coord.start_move(chain.id, [0], 1, switch_at=200, release_at=210)  # vnode 0 is on partition 1 now


def _complete(coord: HandoverCoordinator, order: HandoverOrder, task: int, entries: int = 5) -> list[str]:
    """Every participant of ``order`` acks every phase; the events."""
    origins = [(task, p) for p in sorted(order.origins)]
    targets = [(task, p) for p in sorted(order.targets)]
    events = coord.on_acks(_acks(order, "armed", sorted(order.upstreams) + origins + targets))
    events += coord.on_acks(_acks(order, "switched", sorted(order.upstreams)))
    events += coord.on_acks(_acks(order, "cut", origins, digest="d", entries=entries))
    return events + coord.on_acks(_acks(order, "loaded", targets))


def test_a_durable_cut_lies_past_every_handover_each_participant_checkpointed_after_acting_on():
    """A resume from a cut arms no handover again: none committed is under way, and every
    participant of a retained one took its checkpoint in the cut after it switched, cut or loaded."""
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan, retain=True)
    order = coord.start_move(chain.id, [0, 1], 1, switch_at=100, release_at=110)
    upstreams, origin, target = sorted(order.upstreams), (chain.id, 0), (chain.id, 1)
    before = dict.fromkeys([*upstreams, origin, target], 5)
    assert coord.cut_is_clean(before)  # not committed: nobody acts on it before
    coord.on_acks(_acks(order, "armed", [*upstreams, origin, target], checkpoint=5))
    assert not coord.cut_is_clean(before)  # committed and under way
    coord.on_acks(_acks(order, "switched", upstreams, checkpoint=7))
    coord.on_acks(_acks(order, "cut", [origin], digest="d", entries=3, checkpoint=8))
    coord.on_acks(_acks(order, "loaded", [target], checkpoint=9))
    assert coord.view() == [] and order.handover_id in coord.history
    after = {**dict.fromkeys(upstreams, 8), origin: 9, target: 10}
    assert coord.cut_is_clean(after)
    assert not coord.cut_is_clean({**after, target: 9})  # the target's checkpoint from before it loaded
    assert not coord.cut_is_clean({**after, upstreams[0]: 7})  # an upstream's from before it switched
    assert coord.tables()[chain.id].vnodes_of(1)[:2] == (0, 1)


def test_the_coordinator_rescales_onto_a_spare_partition_and_back():
    plan = _plan(max_parallelism=3)
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    with pytest.raises(ValueError, match="hosts 3 partitions .* not 4"):
        coord.start_rescale(chain.id, 4, AllAtOnce())
    up = coord.start_rescale(chain.id, 3, AllAtOnce())
    order = coord.instruct_next(up, 100, 110)
    assert order is not None and order.origins == {0, 1} and order.targets == {2}
    events = _complete(coord, order, chain.id)
    assert any("cut 10 state entries" in e for e in events)  # both origins counted
    assert coord.job_state(up).value == "completed"
    table = coord.manager.tables[chain.id]
    assert table.parallelism == 3 and sorted(len(table.vnodes_of(p)) for p in range(3)) == [2, 3, 3]
    down = coord.start_rescale(chain.id, 2, Batched(1))
    steps = 0
    while coord.job_state(down).value == "running":
        order = coord.instruct_next(down, 200 + 20 * steps, 210 + 20 * steps)
        assert order is not None and order.origins == {2} and len(order.moves) == 1
        _complete(coord, order, chain.id)
        steps += 1
    table = coord.manager.tables[chain.id]
    assert steps == len(coord.manager.job(up).vnodes) and table.parallelism == 2
    assert sorted(set(table.assignment)) == [0, 1]


def test_the_coordinator_rebalances_from_a_measured_load_per_vnode():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    load = [10.0, 40.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0]  # partition 0 (vnodes 0-3) carries 60 of 64
    job = coord.start_rebalance(chain.id, load, 0.5, None, AllAtOnce())
    order = coord.instruct_next(job, 100, 110)
    # heaviest first: vnode 1 (60/4 -> 20/44); then vnode 0 would not lower the larger load (54 > 44)
    assert order is not None and sorted((m.vnode, m.origin, m.target) for m in order.moves) == [(1, 0, 1)]
    _complete(coord, order, chain.id)
    assert coord.job_state(job).value == "completed"
    # partition 0 (vnodes 0, 2, 3) carries 4, partition 1 3: no move would lower the larger load
    nothing = coord.start_rebalance(chain.id, [2.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0], 0.5, None, AllAtOnce())
    assert coord.job_state(nothing).value == "completed" and not coord.manager.job(nothing).steps


def test_the_coordinator_cancels_on_a_late_participant_or_a_lost_one_before_the_commit():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    order = coord.start_move(chain.id, [0], 1, switch_at=100, release_at=110)
    events = coord.on_acks(_acks(order, "late", [(chain.id, 0)]))
    assert any("cancelled" in e for e in events) and coord.view()[0]["cancelled"]
    # nothing of it happened: the driver may submit the rest again, further ahead (JobHandle retries)
    late_job = coord.manager.record(order.handover_id).job_id
    assert coord.manager.job(late_job).late
    second = coord.start_move(chain.id, [0], 1, switch_at=300, release_at=310)
    events = coord.replica_lost((chain.id, 1, 0))
    assert any("cancelled" in e for e in events)
    assert next(o for o in coord.view() if o["id"] == second.handover_id)["cancelled"]
    assert not coord.manager.job(coord.manager.record(second.handover_id).job_id).late  # a lost replica: wait
    with pytest.raises(ValueError, match="at least 2 after"):
        coord.start_move(chain.id, [0], 1, switch_at=400, release_at=401)
    assert replace(second, cancelled=False).to_wire()["moves"] == [(0, 0, 1)]
    assert HandoverOrder.from_wire(second.to_wire()) == second


def test_a_cancelled_order_is_shown_until_no_participant_replica_can_wait_for_it():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    order = coord.start_move(chain.id, [0], 1, switch_at=100, release_at=110)
    coord.on_acks(_acks(order, "late", [(chain.id, 0)]))
    participants = {(*inst, r) for inst in order.upstreams | {(chain.id, 0), (chain.id, 1)} for r in range(2)}
    pulses = dict.fromkeys(participants, 111)
    lost: set = set()

    def passed(replica, h):
        return replica in lost or pulses.get(replica, -1) > h

    pulses[(chain.id, 1, 1)] = 110  # a target replica that armed it waits at its release for the word
    assert coord.forget_cancelled(passed) == [] and coord.view()[0]["cancelled"]
    lost.add((chain.id, 1, 1))  # lost: its restored incarnation arms committed orders only
    del pulses[(chain.id, 1, 1)]
    assert coord.forget_cancelled(passed) == [order.handover_id] and coord.view() == []


def test_a_replica_restored_past_its_part_of_a_committed_step_reports_that_part_done():
    """A target restored from a checkpoint past the release (its twin loaded the state; this
    checkpoint has it) never loads again: without its LOADED the step would wait for ever for an
    ack this incarnation never sends.  It reports the part its checkpoint includes, and only for a
    committed order."""
    order = _order(committed=True)
    assert arm_acks(order, {"target": "done"}, restored=True) == ["loaded"]
    assert arm_acks(order, {"upstream": "done"}, restored=True) == ["switched"]
    assert arm_acks(order, {"origin": "done", "upstream": "armed"}, restored=True) == ["armed", "cut"]
    assert arm_acks(replace(order, committed=False), {"target": "late"}, restored=True) == ["late"]
    assert arm_acks(replace(order, committed=False), {"upstream": "done"}, restored=True) == []
    assert arm_acks(replace(order, cancelled=True), {"target": "cancelled"}, restored=True) == []
    assert arm_acks(order, {"target": "armed"}, restored=True) == ["armed"]
    # re-sent to a running replica, a part found done is one it did: that action acks it
    assert arm_acks(order, {"origin": "done", "upstream": "armed"}) == ["armed"]


def _running_instance(tmp_path, partition: int, send=None) -> tuple[ProcessingInstance, HandoverOrder]:
    """A running chain replica (partition ``partition``, replica 0) on a real RocksDB, and a
    committed move of vnode 0 from partition 0 to 1 (switch at 100, release at 110) it armed.
    ``send(order)``: called when it ships its cut (as :meth:`CutExchange.send`).  Its
    worker counts the heartbeats asked for at once (``inst.worker.beats``): one per ack."""
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    order = replace(HandoverCoordinator(plan).start_move(chain.id, [0], 1, switch_at=100, release_at=110),
                    committed=True)
    worker = SimpleNamespace(cfg=ReplicationConfig(kafka_bootstrap_servers="127.0.0.1:9092"),
                             boot=SimpleNamespace(run_id="run", output_prefix="run"), job_name="job", state_root=tmp_path,
                             cuts=SimpleNamespace(send=lambda o, origin, cuts: (send or (lambda _: None))(o) or 0),
                             beats=[])
    worker.link = SimpleNamespace(ring=lambda: worker.beats.append(1))
    inst = ProcessingInstance(worker, chain, partition, 0, plan)
    inst.apply_handover(order)
    assert [a.kind for a in inst.take_handover_acks()] == ["armed"] and len(worker.beats) == 1
    return inst, order


def test_an_origin_acks_its_cut_with_the_entries_when_the_order_comes_again_during_the_cut(tmp_path):
    """The driver re-sends every order not completed with each heartbeat.  One that reaches an origin
    replica between its cut (the step done on its side) and the cut's ack must not read as a replica
    restored past the cut: that ack, with no entries and no digest, went first and the real one was
    dropped as a repeat, so the driver counted 0 entries moved and checked no digest."""
    inst = None
    inst, order = _running_instance(tmp_path, 0, send=lambda o: inst.apply_handover(o))
    backend = inst.state_backend()
    moved = [(_kg(0), b"a", b"1"), (_kg(0, 3), b"b", b"2")]
    for kg, rest, value in [*moved, (_kg(5), b"c", b"3")]:
        backend.put(kg, rest, value)
    assert inst._handovers_at_pulse(order.switch_at + 1)
    (ack,) = inst.take_handover_acks()
    assert ack.kind == "cut" and ack.entries == len(moved), ack
    assert ack.digest == cut_digest(moved) and ack.times["bytes"] == entry_bytes(moved)
    assert len(inst.worker.beats) == 2  # the driver hears of the cut now, not at the next interval


def test_a_target_acks_its_load_with_the_entries_when_the_order_comes_again_meanwhile(tmp_path):
    inst, order = _running_instance(tmp_path, 1)
    inst.handovers.state_arrived(order.handover_id, 0, [(_kg(0), b"a", b"1")])
    release = inst.handovers.release

    def release_then_heartbeat(*args, **kwargs):
        held = release(*args, **kwargs)
        inst.apply_handover(order)  # the order again, before the held records are processed
        return held
    inst.handovers.release = release_then_heartbeat
    assert inst._handovers_at_pulse(order.release_at)
    (ack,) = inst.take_handover_acks()
    assert ack.kind == "loaded" and ack.entries == 1 and "release" in ack.times, ack
    assert inst.state_backend().get(_kg(0), b"a") == b"1"


def _move_cut() -> tuple[HandoverCoordinator, int, HandoverOrder]:
    """A coordinator whose move of vnode 0 (chain partition 0 -> 1) is committed, switched and cut:
    only the targets' LOADED acks are due.  Returns it, the chain's task id and the order."""
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    order = coord.start_move(chain.id, [0], 1, switch_at=100, release_at=110)
    coord.on_acks(_acks(order, "armed", [*order.upstreams, (chain.id, 0), (chain.id, 1)]))
    order = coord.orders[order.handover_id]
    assert order.committed
    coord.on_acks(_acks(order, "switched", order.upstreams) + _acks(order, "cut", [(chain.id, 0)]))
    return coord, chain.id, order


def test_a_step_completes_once_a_target_restored_past_the_release_reports_it_loaded():
    coord, chain_id, order = _move_cut()
    coord.replica_lost((chain_id, 1, 1))  # a target replica dies before its LOADED...
    coord.replica_restored((chain_id, 1, 1), 1)  # ...and comes back from a checkpoint past the release
    coord.on_acks([ReplicaAck(order.handover_id, order.epoch, (chain_id, 1, 0), "loaded", "", 5, 0, 0)])
    assert coord.state(order.handover_id).value != "completed"  # waits for the restored incarnation
    acks = arm_acks(order, {"target": "done"}, restored=True)
    coord.on_acks([ReplicaAck(order.handover_id, order.epoch, (chain_id, 1, 1), kind, "", 0, 1, 120) for kind in acks])
    assert coord.state(order.handover_id).value == "completed"


def test_a_committed_step_that_only_a_lost_replica_held_back_completes_and_leaves_the_orders():
    """The manager rolls a committed step forward without a lost replica; the coordinator must see
    it complete then, or the order stays listed as rolling forward (its pulses kept on) for good."""
    coord, chain_id, order = _move_cut()
    coord.on_acks([ReplicaAck(order.handover_id, order.epoch, (chain_id, 1, 0), "loaded", "", 5, 0, 0)])
    assert coord.rolling_forward() == [order.handover_id]  # the other target replica has not loaded
    events = coord.replica_lost((chain_id, 1, 1))
    assert coord.state(order.handover_id).value == "completed" and any("completed" in e for e in events)
    assert coord.rolling_forward() == [] and coord.view() == []


def test_the_cli_spells_vnodes_and_strategies():
    assert parse_vnodes("0-3,7, 9-9") == [0, 1, 2, 3, 7, 9]
    assert format_vnodes([9, 0, 1, 2, 3, 7, 10]) == "0-3,7,9-10" and format_vnodes([]) == ""
    assert parse_vnodes(format_vnodes([5, 6, 8])) == [5, 6, 8]
    for bad, why in (("a", "not N or N-M"), ("3-1", "goes down"), ("1,,2", "not N or N-M")):
        with pytest.raises(ValueError, match=why):
            parse_vnodes(bad)
    assert (parse_strategy("all"), parse_strategy("Fluid"), parse_strategy("batched:8")) == (
        AllAtOnce(), Fluid(), Batched(8))
    assert (parse_strategy("batched:8:65536"), parse_strategy("batched:4:64KiB"), parse_strategy("batched:2:8m")) == (
        Batched(8, max_bytes=65536), Batched(4, max_bytes=65536), Batched(2, max_bytes=8 << 20))
    for bad in ("batched", "batched:0", "fluid:2", "some", "batched:8:", "batched:8:0", "batched:8:4TiB",
                "batched:8:k"):
        with pytest.raises(ValueError, match="all, fluid, batched:N or batched:N:BYTES"):
            parse_strategy(bad)


def test_code_switches_arm_once_before_their_pulse_and_wait_for_the_word_at_it():
    order = CodeOrder(3, 4, "chain", 1, b"fn", switch_at=10)
    code = CodeSwitches()
    code.position = 9
    assert code.arm(order) == "armed" and code.pending
    assert code.at_pulse(9) == [] and [o.handover_id for o in code.at_pulse(10)] == [3]
    assert code.decided(3, lambda: True) is None  # stopping while nobody knows yet
    code.arm(replace(order, committed=True))
    assert code.decided(3, lambda: False) is True
    code.done(3)
    assert not code.pending
    late = CodeSwitches()
    late.position = 10  # pulse 10 already forwarded: elements after it ran the old code
    assert late.arm(order) == "late" and not late.pending
    cancelled = CodeSwitches()
    cancelled.arm(order)
    assert cancelled.arm(replace(order, cancelled=True)) == "cancelled"
    assert cancelled.decided(3, lambda: False) is False
    assert CodeSwitches().arm(replace(order, cancelled=True)) == "cancelled"  # never armed: nothing kept
    assert order_from_wire(order.to_wire()) == order


def test_the_coordinator_runs_an_operator_replacement_to_completion():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    order = coord.start_replace(chain.id, "chain", b"fn", switch_at=50)
    assert order.version == 1 and coord.view()[0]["kind"] == "code"
    replicas = [(chain.id, p) for p in range(chain.parallelism)]
    events = coord.on_acks([ReplicaAck(order.handover_id, 1, (t, p, r), "armed", "", 0, 0, -1) for t, p in replicas for r in (0, 1)])
    assert any("committed" in e for e in events) and coord.view()[0]["committed"]
    events = coord.on_acks([ReplicaAck(order.handover_id, 1, (t, p, r), "switched", "", 0, 0, -1) for t, p in replicas
                            for r in (0, 1)])
    assert any("replaced by version 1" in e for e in events) and coord.view() == []
    assert coord.start_replace(chain.id, "chain", b"fn2", switch_at=80).version == 2


# -- Rhino on: checkpoints during a handover, restored replicas, kept cuts ----------------------


def test_a_target_skips_its_checkpoints_while_it_may_hold_records_and_fetches_missing_cuts():
    target = PartitionHandovers(3, 1, G, V)
    assert target.arm(_order(switch_at=10, release_at=14)) == "armed"
    # the moved key groups' records come only after the upstreams switched at 10; released at 14
    assert [h for h in range(8, 17) if target.holds_records_at(h)] == [11, 12, 13]
    assert target.missing_cuts() == [(7, 0)]
    target.state_arrived(7, 0, [(_kg(0), b"a", b"1")])
    assert target.missing_cuts() == []


def test_an_origin_keeps_its_cut_per_target_until_the_driver_no_longer_lists_the_handover():
    origin = PartitionHandovers(3, 0, G, V)
    kept = TargetCut([[(_kg(0), b"a", b"1")]], {"w": []}, "d", 1)
    origin.kept_cuts.keep(7, {1: kept})
    assert origin.kept_cuts.kept_cut(7, 1) == kept
    assert origin.kept_cuts.kept_cut(7, 2) is None and origin.kept_cuts.kept_cut(8, 1) is None
    origin.kept_cuts.forget({7, 9})
    assert origin.kept_cuts.kept_cut(7, 1) is not None
    origin.kept_cuts.forget({9})
    assert origin.kept_cuts.kept_cut(7, 1) is None


def test_a_restored_replica_skips_the_roles_its_checkpoint_already_includes():
    """Restored from the checkpoint at pulse 12 (switch 10, cut 11, release 14): a committed order
    is "done" for the origin and still to do for the target; an uncommitted one is late."""
    origin, target = PartitionHandovers(3, 0, G, V), PartitionHandovers(3, 1, G, V)
    origin.position = target.position = 12
    assert origin.arm(_order(committed=True)) == "done" and not origin.active
    assert target.arm(_order(committed=True)) == "armed" and target.missing_cuts() == [(7, 0)]
    assert PartitionHandovers(3, 0, G, V).arm(_order()) == "armed"
    late = PartitionHandovers(3, 0, G, V)
    late.position = 12
    assert late.arm(_order()) == "late"
    target.position = 14
    assert PartitionHandovers(3, 1, G, V).arm(_order(committed=True)) == "armed"
    past = PartitionHandovers(3, 1, G, V)
    past.position = 14
    assert past.arm(_order(committed=True)) == "done"
    code = CodeSwitches()
    code.position = 10
    fn = CodeOrder(8, 3, "f", 2, b"", switch_at=10, committed=True)
    assert code.arm(fn) == "done" and not code.pending
    assert code.arm(replace(fn, handover_id=9, switch_at=11)) == "armed" and code.pending
    assert code.arm(replace(fn, handover_id=10, committed=False)) == "late"


def test_router_tables_go_into_a_checkpoint_and_a_restored_router_switches_only_later_tables():
    from replication.runtime.handovers import RouterSwitches

    table = RoutingTable.uniform(V, 2)
    routers = RouterSwitches({3: table}, G)
    order = _order(committed=True)
    assert routers.arm(order) == "armed"
    routers.on_pulse(10, lambda: False)
    saved = routers.tables()
    assert saved == {3: order.table.to_dict()}
    restored = RouterSwitches({3: table}, G)  # built from the plan, as a restored replica is
    restored.restore(saved)
    assert restored.partition_of(3, _kg(0)) == 1
    assert restored.arm(order) == "done"  # its table is in force: no second switch


def test_the_coordinator_retains_completed_orders_for_restored_replicas_until_restore_points_pass():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan, retain=True)
    order = coord.start_move(chain.id, [0, 1], 1, switch_at=100, release_at=110)
    target = (chain.id, 1, 0)
    events = coord.on_acks(_acks(order, "armed", sorted(order.upstreams) + [(chain.id, 0), (chain.id, 1)]))
    assert any("committed" in e for e in events)
    assert coord.replica_lost(target) == []  # after the commit: rolls forward without it
    coord.on_acks(_acks(order, "switched", sorted(order.upstreams)))
    coord.on_acks(_acks(order, "cut", [(chain.id, 0)], digest="d", entries=3))
    # the restored target replica gets the committed order, and acks as incarnation 1
    orders = coord.replica_restored(target, 1)
    assert [order_from_wire(o) for o in orders] == [replace(order, committed=True)]
    assert coord.retained() == [order.handover_id]
    assert coord.on_acks([ReplicaAck(order.handover_id, order.epoch, target, "loaded", "", 3, 0, -1)]) == []  # stale: attempt 0
    events = coord.on_acks([ReplicaAck(order.handover_id, order.epoch, (chain.id, 1, 1), "loaded", "", 3, 0, 100),
                            ReplicaAck(order.handover_id, order.epoch, target, "loaded", "", 3, 1, 80)])
    assert any("completed" in e for e in events) and coord.view() == []
    assert not coord.manager.violations
    assert list(coord.history) == [order.handover_id] and coord.retained() == [order.handover_id]
    # an upstream replica restored later still gets it, until every participant's restore point is a
    # checkpoint taken after it acted (the target: after checkpoint 100, the later of its replicas')
    upstream = (*sorted(order.upstreams)[0], 1)
    assert [o["id"] for o in coord.replica_restored(upstream, 1)] == [order.handover_id]
    points = dict.fromkeys({*order.upstreams, (chain.id, 0), (chain.id, 1)}, 120)
    points[(chain.id, 1)] = 100
    assert coord.prune(points.get) == [] and coord.retained() == [order.handover_id]
    points[(chain.id, 1)] = 101
    assert coord.prune(points.get) == [order.handover_id] and coord.retained() == [] and not coord.history
    assert coord.replica_restored((chain.id, 1, 1), 1) == []
    # the manager let the record go; the driver, waking up later to report the step, still sees it
    assert order.handover_id not in coord.manager.records
    assert coord.state(order.handover_id).value == "completed" and coord.moved_entries(order.handover_id) == 3


def test_handovers_are_refused_with_the_reason_where_they_are_not_wired():
    from types import SimpleNamespace

    from replication.control.handover_calls import HandoverCalls

    def check(mode: str, rhino: bool) -> None:
        HandoverCalls._require_pulses(SimpleNamespace(cfg=SimpleNamespace(mode=mode, rhino_enabled=rhino)), "moving vnodes")

    for mode in ("liverobin", "kazoo"):
        check(mode, True)
        check(mode, False)
    with pytest.raises(ValueError, match=r"mode=liverobin or kazoo \(pulses are the switch points\)"):
        check("unordered", False)


def test_state_bytes_are_counted_per_vnode_and_a_byte_cap_plans_the_steps_from_them(backend):
    backend.put(_kg(0), b"a", b"x" * 100)
    backend.put(_kg(0, 3), b"b", b"y" * 50)
    backend.put(_kg(5), b"c", b"z" * 10)
    sizes = vnode_bytes(backend, G, V)
    assert sizes == [2 + 1 + 100 + 2 + 1 + 50, 0, 0, 0, 0, 2 + 1 + 10, 0, 0]
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    table = coord.manager.tables[chain.id]
    mine = list(table.vnodes_of(0))
    weights = [0] * table.num_vnodes
    for v, n in zip(mine, (300, 100, 100, 250), strict=True):
        weights[v] = n
    job = coord.start_job(chain.id, mine, 1, Batched(4, max_bytes=300), sizes=weights)
    steps = coord.manager.job(job).steps
    assert [s.size_bytes for s in steps] == [300, 200, 250]  # in vnode order, cut before the cap
    assert [len(s.moves) for s in steps] == [1, 2, 1]


def test_a_step_waits_for_the_bytes_in_flight_cap_and_for_lost_replicas_and_says_why():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan, max_bytes_in_flight=500)
    table = coord.manager.tables[chain.id]
    v0, v1 = list(table.vnodes_of(0))[:2]
    sizes = [0] * table.num_vnodes
    sizes[v0], sizes[v1] = 300, 400
    first = coord.start_job(chain.id, [v0], 1, Batched(1, max_bytes=500), sizes=sizes)
    second = coord.start_job(chain.id, [v1], 1, Batched(1, max_bytes=500), sizes=sizes)
    order = coord.instruct_next(first, 100, 110)
    assert coord.instruct_next(second, 100, 110) is None
    assert coord.manager.why_not_next(second) == "another handover of the task is not committed yet"
    coord.on_acks(_acks(order, "armed", sorted(order.upstreams) + [(chain.id, 0), (chain.id, 1)]))
    assert coord.instruct_next(second, 120, 130) is None  # 300 in flight + 400 > 500
    assert "300 bytes of state are in flight; the step's 400 more would pass the cap of 500" in \
        coord.manager.why_not_next(second)
    coord.on_acks(_acks(order, "switched", sorted(order.upstreams)))
    coord.on_acks(_acks(order, "cut", [(chain.id, 0)], digest="d"))
    coord.on_acks(_acks(order, "loaded", [(chain.id, 1)]))
    coord.replica_lost((chain.id, 0, 1))
    assert coord.instruct_next(second, 140, 150) is None
    why = coord.manager.why_not_next(second)
    assert "lost" in why and str((chain.id, 0, 1)) in why
    coord.replica_restored((chain.id, 0, 1), 1)
    assert coord.instruct_next(second, 160, 170) is not None


def test_a_completed_replacement_is_retained_for_restored_replicas_until_past_its_switch():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan, retain=True)
    order = coord.start_replace(chain.id, "chain", b"fn", switch_at=50)
    replicas = [(chain.id, p) for p in range(chain.parallelism)]
    for kind in ("armed", "switched"):
        coord.on_acks([ReplicaAck(order.handover_id, 1, (t, p, r), kind, "", 0, 0, 49) for t, p in replicas for r in (0, 1)])
    assert coord.view() == [] and list(coord.history) == [order.handover_id]
    restored = coord.replica_restored((chain.id, 1, 0), 1)
    assert [order_from_wire(o) for o in restored] == [replace(order, committed=True)]
    assert coord.replica_restored((0, 0, 0), 1) == []  # a source: not a participant
    points = {(chain.id, 0): 60, (chain.id, 1): 49}  # acted after checkpoint 49 (the acks say so)
    assert coord.prune(points.get) == []
    points[(chain.id, 1)] = 50  # its checkpoint at the switch pulse runs the new code already
    assert coord.prune(points.get) == [order.handover_id]


def test_the_coordinator_keeps_each_steps_timeline_from_the_first_replica_of_the_last_participant():
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan, period_s=0.01)
    order = coord.start_move(chain.id, [0, 1], 1, switch_at=100, release_at=110)
    hid, ep = order.handover_id, order.epoch
    ups = sorted(order.upstreams)

    def ack(inst, r, kind, times, entries=0):
        return ReplicaAck(hid, ep, (*inst, r), kind, "d" if kind == "cut" else "", entries, 0, -1, times)

    coord.on_acks([ack(i, r, "armed", {"at": 1.0}) for i in ups + [(chain.id, 0), (chain.id, 1)] for r in (0, 1)],
                  now=2.0)
    # the upstreams switch: replica 1 of the second one first; the last upstream's first replica counts
    coord.on_acks([ack(ups[0], 0, "switched", {"at": 3.0}), ack(ups[0], 1, "switched", {"at": 3.2}),
                   ack(ups[1], 0, "switched", {"at": 3.5}), ack(ups[1], 1, "switched", {"at": 3.4})], now=3.6)
    coord.on_acks([ack((chain.id, 0), r, "cut", {"at": 4.0 + r, "bytes": 5000}, entries=5) for r in (0, 1)], now=4.1)
    events = coord.on_acks([ack((chain.id, 1), r, "loaded", {"at": 6.0 + r, "arrived": 4.2 + r, "release": 5.0 + r,
                                                              "loaded": 5.5 + r, "held": 7})
                            for r in (0, 1)], now=6.5)
    assert any("completed" in e for e in events)
    times = coord.times.timeline(hid)
    assert times == {"committed": 2.0, "switched": 3.4, "cut": 4.0, "arrived": 4.2, "release": 5.0, "loaded": 5.5,
                     "caught_up": 6.0, "completed": 6.5}
    assert coord.times.moved_bytes(hid) == 5000  # one replica of the origin counted
    phases = step_phases(1.5, times)
    assert phases["trigger"] == pytest.approx(0.5) and phases["alignment"] == pytest.approx(0.6)
    assert phases["transfer"] == pytest.approx(0.2) and phases["release_wait"] == pytest.approx(0.8)
    assert phases["held"] == pytest.approx(2.6) and phases["blocked"] == 0.0
    additive = ("trigger", "to_switch", "alignment", "transfer", "release_wait", "load", "catch_up", "acks")
    assert sum(phases[k] for k in additive) == pytest.approx(6.5 - 1.5)
    # the completed step taught the task's release margin: 0.8 s from switch to state there
    assert coord.next_release_s(coord.start_job(chain.id, [2], 1, AllAtOnce())) != DEFAULT_RELEASE_S


def test_phases_show_a_target_blocked_at_the_release_for_its_state_and_what_is_unknown():
    times = {"committed": 1.0, "switched": 2.0, "cut": 2.1, "arrived": 2.9, "release": 2.4, "loaded": 3.0,
             "caught_up": 3.1, "completed": 3.3}
    phases = step_phases(0.5, times)
    assert phases["blocked"] == pytest.approx(0.5) and phases["release_wait"] == 0.0
    assert phases["load"] == pytest.approx(0.1)  # from the arrival, not from the release it waited at
    assert sum(v for k, v in phases.items() if k not in ("held", "blocked")) == pytest.approx(3.3 - 0.5)
    unknown = step_phases(0.5, {**times, "arrived": None})
    assert unknown["transfer"] is None and unknown["blocked"] is None and unknown["trigger"] == pytest.approx(0.5)
    assert phases["held"] == pytest.approx(1.1) and step_phases(0.5, times, served=True)["held"] == 0.0


def test_the_release_margin_is_learnt_from_the_steps_and_sized_by_the_bytes_that_move():
    m = ReleaseMargin(period_s=0.01, default_s=0.3, safety=2.0, rate_bytes_per_s=50e6, max_s=5.0)
    assert m.margin_s(8) == 0.3 and m.margin_s(8, 10**6) == 0.3  # nothing seen: the default
    m.observe(8, 1_000_000, 0.06)  # 20 ms for the bytes at 50 MB/s, 40 ms fixed
    assert m.margin_s(8, 1_000_000) == pytest.approx(2 * 0.06 + 0.01)
    assert m.margin_s(8) == pytest.approx(2 * 0.06 + 0.01)  # unknown bytes: 125 KB per vnode seen
    assert m.margin_s(16) == pytest.approx(2 * (0.04 + 0.04) + 0.01)
    assert m.margin_s(1, 0) == pytest.approx(2 * 0.04 + 0.01)
    m.observe(1, 1000, 0.5)  # one slow step does not set the margin of the next ones
    assert m.margin_s(1, 0) == pytest.approx(2 * 0.04 + 0.01)
    m.observe(1, 1000, 0.5)  # most of the recent steps slow: it does
    assert m.margin_s(1, 0) > 0.9
    assert m.margin_s(10**6) == 5.0  # capped
    fast = ReleaseMargin(period_s=0.01, safety=1.0)
    fast.observe(1, 0, 0.0)
    assert fast.margin_s(1, 0) == pytest.approx(0.02)  # at least two pulses: R >= P + 2


def test_a_step_given_up_before_the_commit_is_cancelled_and_a_committed_one_rolls_forward_to_the_end():
    """The driver's deadline passes during a step: not committed, the step is cancelled (nobody
    switched); committed, it is listed as rolling forward (its pulses must go on) until it
    completes, and the job then stops between two steps, the rest never instructed."""
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    job = coord.start_job(chain.id, [0, 1, 2, 3], 1, Batched(1))
    first = coord.instruct_next(job, 100, 110)
    assert first is not None and coord.rolling_forward() == []
    events = coord.give_up(first.handover_id, "not done within 5s")
    assert events == [f"handover {first.handover_id} of chain cancelled: not done within 5s"]
    assert coord.state(first.handover_id).value == "aborted" and coord.view()[0]["cancelled"]
    assert coord.job_state(job).value == "aborted"

    job = coord.start_job(chain.id, [0, 1, 2, 3], 1, Batched(1))
    order = coord.instruct_next(job, 200, 210)
    assert order is not None
    origins, targets = [(chain.id, 0)], [(chain.id, 1)]
    coord.on_acks(_acks(order, "armed", sorted(order.upstreams) + origins + targets))
    assert coord.rolling_forward() == [order.handover_id]
    assert coord.give_up(order.handover_id, "too late") == []  # committed: it only rolls forward
    with pytest.raises(ValueError, match="still in progress"):
        coord.manager.stop_job(job, "timeout")
    coord.on_acks(_acks(order, "switched", sorted(order.upstreams)))
    assert coord.rolling_forward() == [order.handover_id]
    coord.on_acks(_acks(order, "cut", origins, digest="d", entries=3))
    coord.on_acks(_acks(order, "loaded", targets))
    assert coord.rolling_forward() == [] and coord.state(order.handover_id).value == "completed"
    coord.manager.stop_job(job, "not done within 5s")
    ended = coord.manager.job(job)
    assert coord.job_state(job).value == "aborted" and ended.reason == "stopped after 1 of 4 step(s): not done within 5s"
    assert coord.manager.step_states(job)[0].value == "completed"
    assert coord.manager.tables[chain.id].partition_of_vnode(0) == 1  # the completed step stays
    assert [coord.manager.tables[chain.id].partition_of_vnode(v) for v in (1, 2, 3)] == [0, 0, 0]
    again = coord.start_job(chain.id, [1, 2, 3], 1, AllAtOnce())  # its vnodes are free again
    assert coord.job_state(again).value == "running"


def test_a_target_keeps_the_cut_it_received_for_its_twin_chunked_as_the_origin_chunks_it(backend):
    """Rhino: a target replica restored from a checkpoint before the release needs the cut again;
    when every origin replica that kept it is lost, its twin serves the cut it received, in the
    same chunks an origin replica sends (so chunks from either fit together)."""
    entries = [(_kg(0, i % 8), f"k{i:03d}".encode(), bytes(40)) for i in range(60)]
    origin_chunks = chunk_entries(sorted(entries), 500)
    assert len(origin_chunks) > 3
    ho = PartitionHandovers(3, 1, G, V, keep_cuts=True)
    ho.arm(_order(committed=True))
    assert ho.kept_cuts.received_cut(7, 0, 500) is None
    for i, chunk in reversed(list(enumerate(origin_chunks))):  # in any order
        ho.state_arrived(7, 0, chunk, i, len(origin_chunks), {"window": [("w", b"k001")]} if i == 0 else None)
    served = ho.kept_cuts.received_cut(7, 0, 500)
    assert served is not None and served.chunks == origin_chunks and served.entries == 60
    assert ho.kept_cuts.received_cut(7, 0, 500) is served  # chunked once: a fetch asks once per chunk
    assert served.extras == {"window": [("w", b"k001")]}
    ho.kept_cuts.forget({8})  # the driver no longer lists handover 7: no restore point precedes its release
    assert ho.kept_cuts.received_cut(7, 0, 500) is None

    without_rhino = PartitionHandovers(3, 1, G, V)
    without_rhino.arm(_order(committed=True))
    without_rhino.state_arrived(7, 0, entries)
    assert without_rhino.kept_cuts.received_cut(7, 0, 500) is None  # nothing is restored: nothing kept


def test_origin_replicas_that_cut_different_state_are_an_event():
    """The two replicas of an origin must cut the same state: a digest that differs from its
    twin's is reported in the job's events, naming the partition."""
    plan = _plan()
    chain = next(t for t in plan.tasks if t.name == "chain")
    coord = HandoverCoordinator(plan)
    order = coord.start_move(chain.id, [0, 1], 1, switch_at=100, release_at=110)
    coord.on_acks(_acks(order, "armed", sorted(order.upstreams) + [(chain.id, 0), (chain.id, 1)]))
    coord.on_acks(_acks(order, "switched", sorted(order.upstreams)))
    first, second = _acks(order, "cut", [(chain.id, 0)], digest="aaaa", entries=3)
    assert not any("different state" in e for e in coord.on_acks([first]))
    events = coord.on_acks([replace(second, digest="bbbb")])
    assert [e for e in events if "different state" in e] == [
        f"handover {order.handover_id}: the replicas of chain[0] cut different state (digests aaaa and bbbb)"]
