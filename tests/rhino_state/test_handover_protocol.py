"""The pure handover core (rhino_state.handover): planners, strategies, the manager's state
machine and the participant pieces (router, origin alignment, target gate, code switch)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhino_state import RoutingTable, vnode_key_groups
from rhino_state.handover import (
    AllAtOnce,
    Batched,
    Fluid,
    LateInstructionError,
    MoveRequest,
    RebalanceRequest,
    ReplaceOperatorRequest,
    RescaleRequest,
    SwitchNotCommittedError,
    VnodeMove,
    apply_moves,
    move_vnodes,
    plan_drain,
    plan_steps,
    rebalance,
    rescale,
)
from rhino_state.handover_manager import HandoverManager
from rhino_state.handover_messages import (
    AckKind,
    AckOutcome,
    CodeInstruction,
    HandoverAck,
    HandoverState,
    Instruction,
    JobState,
)
from rhino_state.handover_participants import (
    CodeSwitch,
    OriginAlignment,
    TargetGate,
    VersionedRouter,
    cut_key_groups,
    load_key_groups,
)
from rhino_state.manager import ReplicationManager

FAST = settings(max_examples=80, deadline=None)


@st.composite
def tables(draw, max_vnodes: int = 24, max_parallelism: int = 6):
    """A random routing table (partitions may be empty, as after earlier handovers)."""
    num_vnodes = draw(st.integers(1, max_vnodes))
    parallelism = draw(st.integers(1, min(max_parallelism, num_vnodes)))
    assignment = draw(st.lists(st.integers(0, parallelism - 1), min_size=num_vnodes, max_size=num_vnodes))
    return RoutingTable(tuple(assignment), parallelism, draw(st.integers(0, 5)))


def counts(table: RoutingTable) -> list[int]:
    return [len(table.vnodes_of(p)) for p in range(table.parallelism)]


def brute_force_min_moves(table: RoutingTable, parallelism: int) -> int:
    """Fewest moves to a table balanced within one over ``parallelism`` partitions, by trying
    every choice of the partitions that get the larger quota."""
    owned = [table.assignment.count(p) for p in range(max(table.parallelism, parallelism))]
    floor, extra = divmod(table.num_vnodes, parallelism)
    best = 0
    for bigger in itertools.combinations(range(parallelism), extra):
        stay = sum(min(owned[p], floor + (p in bigger)) for p in range(parallelism))
        best = max(best, stay)
    return table.num_vnodes - best


# --------------------------------------------------------------------------- planners


def test_apply_moves_matches_routing_table_moved_and_validates():
    table = RoutingTable.uniform(8, 2, epoch=3)
    moves = move_vnodes(table, [1, 2], 1)
    assert moves == (VnodeMove(1, 0, 1), VnodeMove(2, 0, 1))
    assert apply_moves(table, moves) == table.moved([1, 2], 1)
    assert apply_moves(table, moves).epoch == 4
    with pytest.raises(ValueError, match="vnode 5 is on partition 1, not on 0"):
        apply_moves(table, [VnodeMove(5, 0, 1)])
    with pytest.raises(ValueError, match="moves twice"):
        apply_moves(table, [VnodeMove(1, 0, 1), VnodeMove(1, 0, 1)])
    with pytest.raises(ValueError, match="target partition 2 out of range"):
        apply_moves(table, [VnodeMove(1, 0, 2)])
    with pytest.raises(ValueError, match="unknown vnode 9"):
        apply_moves(table, [VnodeMove(9, 0, 1)])
    with pytest.raises(ValueError, match=r"parallelism 1 would strand vnode\(s\) \[5, 6, 7\]"):
        apply_moves(table, [VnodeMove(4, 1, 0)], parallelism=1)
    assert apply_moves(table, move_vnodes(table, [4, 5, 6, 7], 0), parallelism=1).parallelism == 1
    with pytest.raises(ValueError, match="moving to its own partition 1"):
        VnodeMove(3, 1, 1)


def test_move_vnodes_names_what_is_wrong():
    table = RoutingTable.uniform(8, 2)
    with pytest.raises(ValueError, match="unknown vnode 8"):
        move_vnodes(table, [8], 1)
    with pytest.raises(ValueError, match=r"target partition 2 out of range \[0, 2\)"):
        move_vnodes(table, [0], 2)
    own = r"vnode 5 is already on partition 1 \(moving to its own partition\)"
    with pytest.raises(ValueError, match=own):
        move_vnodes(table, [1, 5], 1)
    with pytest.raises(ValueError, match="named twice"):
        move_vnodes(table, [1, 1], 1)
    with pytest.raises(ValueError, match="at least one vnode"):
        move_vnodes(table, [], 1)


def test_rescale_examples():
    table = RoutingTable.uniform(8, 2)  # 0: [0..3], 1: [4..7]
    up = rescale(table, 4)
    assert len(up) == 4 and {m.target for m in up} == {2, 3}
    assert counts(apply_moves(table, up, 4)) == [2, 2, 2, 2]
    down = rescale(RoutingTable.uniform(8, 4), 2)
    final = apply_moves(RoutingTable.uniform(8, 4), down, 2)
    assert counts(final) == [4, 4] and len(down) == 4
    assert rescale(table, 2) == ()  # already balanced
    for bad in (0, 9, 2.0, True):
        with pytest.raises(ValueError, match="parallelism must be an int in \\[1, number of vnodes=8\\]"):
            rescale(table, bad)


def test_rescale_moves_the_smallest_state_when_sizes_are_known():
    table = RoutingTable.uniform(4, 1)
    sizes = {0: 50, 1: 1, 2: 70, 3: 2}
    moves = rescale(table, 2, sizes=sizes)
    assert {m.vnode for m in moves} == {1, 3}
    with pytest.raises(ValueError, match="sizes: vnode 1 must have an int >= 0"):
        rescale(table, 2, sizes={1: -1})


@FAST
@given(tables(), st.data())
def test_rescale_is_balanced_and_minimal(table, data):
    parallelism = data.draw(st.integers(1, min(table.num_vnodes, 7)))
    moves = rescale(table, parallelism)
    final = apply_moves(table, moves, parallelism)
    floor = table.num_vnodes // parallelism
    assert all(c in (floor, floor + 1) for c in counts(final))  # balanced within one vnode
    assert final.parallelism == parallelism  # partitions >= parallelism are gone (emptied)
    assert len({m.vnode for m in moves}) == len(moves)
    assert len(moves) == brute_force_min_moves(table, parallelism)


def test_rebalance_moves_heaviest_fitting_vnodes_to_the_least_loaded():
    table = RoutingTable((0, 0, 0, 0, 1, 1, 2, 2), 3)
    load = [12, 1, 4, 3, 4, 4, 5, 5]  # partition 0: 20, 1: 8, 2: 10
    moves = rebalance(table, load, fraction=0.5)
    # 12 would take partition 1 to 20, not below 20: skipped; 4 (8 -> 12 < 20), then 3 (15 < 16) fit
    assert moves == (VnodeMove(2, 0, 1), VnodeMove(3, 0, 1))
    assert rebalance(table, load, fraction=0.25) == (VnodeMove(2, 0, 1),)  # ceil(0.25 * 4) = 1
    # with no limit, vnode 1 still does not fit (16 is not below 13)
    assert rebalance(table, load, fraction=1.0) == (VnodeMove(2, 0, 1), VnodeMove(3, 0, 1))
    assert rebalance(table, {0: 0.0}, fraction=1.0) == ()  # no load, nothing improves
    with pytest.raises(ValueError, match="fraction must be a number in \\(0, 1\\]"):
        rebalance(table, load, fraction=0)
    with pytest.raises(ValueError, match="vnode 2 must have a finite number >= 0"):
        rebalance(table, {2: -1.0})
    with pytest.raises(ValueError, match="one value per vnode"):
        rebalance(table, [1.0, 2.0])
    with pytest.raises(ValueError, match="target partition 0 is the busiest"):
        rebalance(table, load, target=0)
    with pytest.raises(ValueError, match="at least two partitions"):
        rebalance(RoutingTable.uniform(4, 1), [1, 1, 1, 1])


@FAST
@given(tables(), st.data())
def test_rebalance_never_raises_the_peak(table, data):
    load = data.draw(st.lists(st.integers(0, 100), min_size=table.num_vnodes, max_size=table.num_vnodes))
    fraction = data.draw(st.sampled_from([0.1, 0.25, 0.5, 1.0]))
    if table.parallelism < 2:
        return
    moves = rebalance(table, load, fraction)

    def totals(t):
        return [sum(load[v] for v in t.vnodes_of(p)) for p in range(t.parallelism)]

    before, after = totals(table), totals(apply_moves(table, moves))
    assert max(after) <= max(before)
    if moves:
        busiest = {m.origin for m in moves}
        assert len(busiest) == 1 and len({m.target for m in moves}) == 1
        origin, target = busiest.pop(), moves[0].target
        assert before[origin] == max(before)
        assert max(after[origin], after[target]) < before[origin]
        n = len(table.vnodes_of(origin))
        assert len(moves) <= max(1, -(-round(fraction * n, 9) // 1))


# --------------------------------------------------------------------------- strategies


def test_strategies_cut_moves_into_steps():
    table = RoutingTable.uniform(8, 2)
    moves = rescale(table, 4)
    (only,) = plan_steps(table, moves, AllAtOnce(), start=10, parallelism=4)
    assert only.position == 10 and only.table_after == apply_moves(table, moves, 4)
    assert only.joining == (2, 3) and only.leaving == ()
    fluid = plan_steps(table, moves, Fluid(gap=3), start=10, parallelism=4)
    assert [len(s.moves) for s in fluid] == [1, 1, 1, 1]
    assert [s.position for s in fluid] == [10, 13, 16, 19]
    assert [s.epoch for s in fluid] == [1, 2, 3, 4]
    batched = plan_steps(table, moves, Batched(step_size=3, gap=2), parallelism=4)
    assert [len(s.moves) for s in batched] == [3, 1] and [s.position for s in batched] == [0, 2]
    with pytest.raises(ValueError, match="Fluid gap must be an int >= 1"):
        Fluid(0)
    with pytest.raises(ValueError, match="Batched step_size must be an int >= 1"):
        Batched(0)
    with pytest.raises(ValueError, match="Batched gap must be an int >= 1"):
        Batched(1, gap=0)
    with pytest.raises(ValueError, match="Batched max_bytes must be an int >= 1"):
        Batched(1, max_bytes=0)
    with pytest.raises(ValueError, match="unknown strategy"):
        plan_steps(table, moves, "fluid", parallelism=4)


def test_scale_down_shrinks_the_table_at_the_last_step_and_up_grows_it_when_needed():
    table = RoutingTable.uniform(8, 4)
    steps = plan_steps(table, rescale(table, 2), Fluid(), parallelism=2)
    assert [s.table_after.parallelism for s in steps] == [4, 4, 4, 2]
    assert steps[-1].leaving == (2, 3) and all(not s.leaving for s in steps[:-1])
    two = RoutingTable.uniform(8, 2)
    up = plan_steps(two, rescale(two, 4), Fluid(), parallelism=4)
    assert [s.table_after.parallelism for s in up] == [3, 3, 4, 4]  # 0 -> 2 twice, then 1 -> 3 twice
    assert [s.joining for s in up] == [(2,), (), (3,), ()]
    # only empty partitions leave: one step with no moves closes their channels
    sparse = RoutingTable((0, 0, 1, 1), 3)
    (close,) = plan_steps(sparse, (), AllAtOnce(), parallelism=2)
    assert close.moves == () and close.leaving == (2,)
    with pytest.raises(ValueError, match="new partition\\(s\\) \\[2, 3\\] would own no vnode"):
        plan_steps(RoutingTable.uniform(4, 2), (), AllAtOnce(), parallelism=4)


@st.composite
def move_plans(draw):
    table = draw(tables())
    parallelism = draw(st.integers(1, min(table.num_vnodes, 6)))
    # any target assignment that leaves no vnode beyond the new parallelism
    target = [p if p < parallelism and draw(st.booleans()) else draw(st.integers(0, parallelism - 1))
              for p in table.assignment]
    moves = [VnodeMove(v, table.assignment[v], t) for v, t in enumerate(target) if t != table.assignment[v]]
    new = [p for p in range(table.parallelism, parallelism) if p not in target]
    if new:  # new partitions must receive something: give them a vnode each if possible
        return table, None, None
    strategy = draw(st.one_of(st.just(AllAtOnce()), st.builds(Fluid, st.integers(1, 5)),
                              st.builds(Batched, st.integers(1, 5), st.integers(1, 5),
                                        st.one_of(st.none(), st.integers(1, 300)))))
    sizes = draw(st.lists(st.integers(0, 200), min_size=table.num_vnodes, max_size=table.num_vnodes))
    return table, (moves, parallelism, tuple(target)), (strategy, sizes)


@FAST
@given(move_plans(), st.integers(0, 1000))
def test_every_epoch_of_a_plan_is_a_valid_table_and_the_last_is_the_request(plan, start):
    table, request, how = plan
    if request is None:
        return
    moves, parallelism, target = request
    strategy, sizes = how
    steps = plan_steps(table, moves, strategy, start=start, sizes=sizes, parallelism=parallelism)
    current = table
    moved: list[int] = []
    for i, step in enumerate(steps):
        assert step.index == i and step.table_before == current
        assert step.table_after.epoch == current.epoch + 1
        for m in step.moves:
            assert current.assignment[m.vnode] == m.origin
        after = step.table_after
        # every vnode is owned by exactly one existing partition at every epoch
        assert len(after.assignment) == table.num_vnodes
        assert all(0 <= p < after.parallelism for p in after.assignment)
        assert step.size_bytes == sum(sizes[m.vnode] for m in step.moves)
        moved.extend(m.vnode for m in step.moves)
        current = after
    assert sorted(moved) == sorted(m.vnode for m in moves)  # each vnode moves once
    if steps:
        assert current.assignment == target and current.parallelism == parallelism
        positions = [s.position for s in steps]
        assert positions == sorted(set(positions)) and positions[0] == start
    else:
        assert target == table.assignment and parallelism == table.parallelism


@FAST
@given(tables(max_vnodes=30), st.integers(1, 6), st.integers(1, 400), st.data())
def test_batched_steps_respect_the_byte_cap_except_a_lone_oversized_vnode(table, step_size, cap, data):
    if table.parallelism < 2:
        return
    sizes = data.draw(st.lists(st.integers(0, 600), min_size=table.num_vnodes, max_size=table.num_vnodes))
    moves = [VnodeMove(v, p, (p + 1) % table.parallelism) for v, p in enumerate(table.assignment)]
    steps = plan_steps(table, moves, Batched(step_size, max_bytes=cap), sizes=sizes)
    assert sum(len(s.moves) for s in steps) == len(moves)
    for s in steps:
        assert 1 <= len(s.moves) <= step_size
        assert s.size_bytes <= cap or len(s.moves) == 1
    # greedy: a step is closed only when the next move did not fit
    for a, b in zip(steps, steps[1:], strict=False):
        assert len(a.moves) == step_size or a.size_bytes + sizes[b.moves[0].vnode] > cap


# --------------------------------------------------------------------------- drain


def test_drain_moves_replicas_off_a_worker_preferring_checkpoint_holders():
    placement = {(t, p, r): (2 * t + p + r) % 4 for t in range(2) for p in range(2) for r in range(2)}
    rm = ReplicationManager(dict(placement), 4)
    for inst in rm.instances():
        rm.checkpoint_completed(inst, 1, {})
    holders = {inst: rm.completed[inst].holders for inst in rm.instances()}
    (wave,) = plan_drain(rm.placement, 4, [1], holders=holders, groups=rm.groups)
    assert sorted(m.replica for m in wave) == sorted(r for r, w in placement.items() if w == 1)
    for m in wave:
        twin = (m.replica[0], m.replica[1], 1 - m.replica[2])
        assert m.source == 1 and m.destination not in (1, placement[twin])
        assert m.local == (m.destination in holders[m.replica[:2]])
    assert all(m.local for m in wave)  # every instance's group member is a free live worker here


def test_drain_never_moves_both_replicas_of_an_instance_in_one_wave():
    placement = {(0, 0, 0): 0, (0, 0, 1): 1, (0, 1, 0): 1, (0, 1, 1): 2}
    waves = plan_drain(placement, 5, [0, 1])
    flat = [m for w in waves for m in w]
    assert sorted(m.replica for m in flat) == [(0, 0, 0), (0, 0, 1), (0, 1, 0)]
    for wave in waves:
        insts = [m.replica[:2] for m in wave]
        assert len(insts) == len(set(insts))
    dest = {m.replica: m.destination for m in flat}
    assert dest[(0, 0, 0)] != dest[(0, 0, 1)] and dest[(0, 1, 0)] != 2
    assert all(len(w) <= 1 for w in plan_drain(placement, 5, [0, 1], max_per_wave=1))


def test_drain_refuses_what_cannot_be_drained():
    placement = {(0, 0, 0): 0, (0, 0, 1): 1}
    with pytest.raises(ValueError, match="unknown worker 7"):
        plan_drain(placement, 3, [7])
    with pytest.raises(ValueError, match="worker 2 is dead"):
        plan_drain(placement, 3, [2], dead=[2])
    with pytest.raises(ValueError, match="leaves no live worker"):
        plan_drain(placement, 2, [0, 1])
    with pytest.raises(ValueError, match="cannot drain replica \\(0, 0, 0\\)"):
        plan_drain(placement, 3, [0], dead=[2])
    with pytest.raises(ValueError, match="at least one worker"):
        plan_drain(placement, 3, [])


# --------------------------------------------------------------------------- manager

KEYED = 1
UPSTREAMS = [(0, 0), (0, 1)]
DOWNSTREAMS = [(2, 0)]


def manager(parallelism: int = 2, num_vnodes: int = 8, **kw) -> HandoverManager:
    return HandoverManager({KEYED: RoutingTable.uniform(num_vnodes, parallelism)}, {KEYED: UPSTREAMS},
                           {KEYED: DOWNSTREAMS}, **kw)


def replicas_of(instances, n=2):
    return [(t, p, r) for t, p in sorted(instances) for r in range(n)]


def send(m, instr, kind, role, **kw):
    """Every live replica of ``role`` acks ``kind`` (with its current attempt)."""
    return [m.ack(HandoverAck(instr.handover_id, instr.epoch, r, kind, m.attempts.get(r, 0), **kw))
            for r in replicas_of(instr.participants[role], m.replicas) if r not in m.lost]


def arm_all(m, instr):
    for r in replicas_of(frozenset().union(*instr.participants.values()), m.replicas):
        if r not in m.lost:
            ack = HandoverAck(instr.handover_id, instr.epoch, r, AckKind.ARMED, m.attempts.get(r, 0))
            assert m.ack(ack) is AckOutcome.ACCEPTED


def run_step(m, instr):
    arm_all(m, instr)
    m.commit(instr.handover_id)
    finish_step(m, instr)


def finish_step(m, instr):
    send(m, instr, AckKind.SWITCHED, "upstream")
    send(m, instr, AckKind.CUT, "origin")
    m.release(instr.handover_id)
    send(m, instr, AckKind.LOADED, "target")
    send(m, instr, AckKind.REWIRED, "downstream")


def test_a_move_goes_through_every_state_to_completed():
    m = manager()
    job = m.submit(MoveRequest(KEYED, (1, 2), 1))
    assert job.state is JobState.RUNNING and m.busy_vnodes(KEYED) == {1: job.job_id, 2: job.job_id}
    instr = m.instruct_next(job.job_id, 100)
    assert isinstance(instr, Instruction)
    rec = m.record(instr.handover_id)
    assert rec.state is HandoverState.INSTRUCTED
    assert instr.switch_at == {(0, 0): 100, (0, 1): 100} and instr.epoch == 1
    assert instr.participants["origin"] == {(1, 0)} and instr.participants["target"] == {(1, 1)}
    assert instr.participants["downstream"] == frozenset()  # parallelism unchanged
    with pytest.raises(ValueError, match="commit needs every participant replica armed"):
        m.commit(instr.handover_id)
    arm_all(m, instr)
    assert rec.state is HandoverState.ARMED
    m.commit(instr.handover_id)
    assert rec.state is HandoverState.COMMITTED and m.tables[KEYED] == instr.table
    upstream_replicas = replicas_of(instr.participants["upstream"])
    for r in upstream_replicas[:-1]:  # every live replica of every upstream must have switched
        m.ack(HandoverAck(instr.handover_id, instr.epoch, r, AckKind.SWITCHED))
        assert rec.state is HandoverState.COMMITTED
    m.ack(HandoverAck(instr.handover_id, instr.epoch, upstream_replicas[-1], AckKind.SWITCHED))
    assert rec.state is HandoverState.SWITCHED
    with pytest.raises(ValueError, match="the release needs every origin cut"):
        m.release(instr.handover_id)
    send(m, instr, AckKind.CUT, "origin", digest="d1")
    assert rec.state is HandoverState.CUT
    release = m.release(instr.handover_id)
    assert release.targets == {(1, 1)}
    send(m, instr, AckKind.LOADED, "target")
    assert rec.state is HandoverState.COMPLETED
    assert job.state is JobState.COMPLETED and m.busy_vnodes(KEYED) == {}
    assert m.tables[KEYED].assignment == (0, 1, 1, 0, 1, 1, 1, 1)
    assert m.violations == [] and m.divergences == []


def test_acks_out_of_order_duplicate_stale_and_unexpected():
    m = manager()
    job = m.submit(MoveRequest(KEYED, (0,), 1))
    instr = m.instruct_next(job.job_id, 5)
    hid, epoch = instr.handover_id, instr.epoch
    early = HandoverAck(hid, epoch, (0, 0, 0), AckKind.SWITCHED)
    assert m.ack(early) is AckOutcome.UNEXPECTED  # nobody switches before the commit
    assert m.ack(HandoverAck(hid, epoch + 1, (0, 0, 0), AckKind.ARMED)) is AckOutcome.STALE
    assert m.ack(HandoverAck(hid + 7, epoch, (0, 0, 0), AckKind.ARMED)) is AckOutcome.STALE
    assert m.ack(HandoverAck(hid, epoch, (5, 0, 0), AckKind.ARMED)) is AckOutcome.UNEXPECTED
    assert m.ack(HandoverAck(hid, epoch, (0, 0, 0), AckKind.ARMED, attempt=3)) is AckOutcome.UNEXPECTED
    arm_all(m, instr)
    assert m.ack(HandoverAck(hid, epoch, (0, 0, 0), AckKind.ARMED)) is AckOutcome.DUPLICATE
    m.commit(hid)
    # the origin's and target's acks may overtake the upstreams'
    assert send(m, instr, AckKind.CUT, "origin") == [AckOutcome.ACCEPTED] * 2
    # no release placed yet: a target cannot have released
    assert m.ack(HandoverAck(hid, epoch, (1, 1, 0), AckKind.LOADED)) is AckOutcome.UNEXPECTED
    rec = m.record(hid)
    assert rec.state is HandoverState.COMMITTED
    assert m.ack(HandoverAck(hid, epoch, (0, 0, 0), AckKind.CUT)) is AckOutcome.UNEXPECTED  # not an origin
    send(m, instr, AckKind.SWITCHED, "upstream")
    assert rec.state is HandoverState.CUT  # jumps over SWITCHED: the cuts were in already
    assert send(m, instr, AckKind.SWITCHED, "upstream") == [AckOutcome.DUPLICATE] * 4
    m.release(hid)
    send(m, instr, AckKind.LOADED, "target")
    assert rec.state is HandoverState.COMPLETED
    assert len(m.violations) == 5 and all(isinstance(reason, str) for _, reason in m.violations)


def test_origin_replicas_with_different_cut_digests_are_a_divergence():
    m = manager()
    instr = m.instruct_next(m.submit(MoveRequest(KEYED, (0,), 1)).job_id, 5)
    arm_all(m, instr)
    m.commit(instr.handover_id)
    m.ack(HandoverAck(instr.handover_id, instr.epoch, (1, 0, 0), AckKind.CUT, digest="aa"))
    m.ack(HandoverAck(instr.handover_id, instr.epoch, (1, 0, 1), AckKind.CUT, digest="bb"))
    assert m.divergences == [(instr.handover_id, (1, 0), ("aa", "bb"))]


def test_a_late_participant_aborts_cleanly_and_the_vnodes_can_be_moved_again():
    m = manager()
    job = m.submit(MoveRequest(KEYED, (0, 1), 1))
    instr = m.instruct_next(job.job_id, 5)
    m.ack(HandoverAck(instr.handover_id, instr.epoch, (0, 0, 0), AckKind.ARMED))
    assert m.ack(HandoverAck(instr.handover_id, instr.epoch, (0, 0, 1), AckKind.LATE)) is AckOutcome.ABORTED
    assert m.record(instr.handover_id).state is HandoverState.ABORTED
    assert job.state is JobState.ABORTED and m.busy_vnodes(KEYED) == {}
    assert m.step_states(job.job_id) == (HandoverState.ABORTED,)
    assert m.prune(KEYED, 0) == 1 and m.step_states(job.job_id) == (HandoverState.ABORTED,)
    assert m.tables[KEYED] == RoutingTable.uniform(8, 2)  # nothing changed
    assert m.ack(HandoverAck(instr.handover_id, instr.epoch, (0, 1, 0), AckKind.ARMED)) is AckOutcome.STALE
    with pytest.raises(ValueError, match="nothing to instruct"):
        m.instruct_next(job.job_id, 50)
    again = m.instruct_next(m.submit(MoveRequest(KEYED, (0, 1), 1)).job_id, 50)
    assert again.epoch == instr.epoch and again.handover_id != instr.handover_id
    # an ack of the aborted attempt (same epoch number) cannot count for the new one
    assert m.ack(HandoverAck(instr.handover_id, again.epoch, (0, 0, 0), AckKind.ARMED)) is AckOutcome.STALE


def test_abort_is_only_allowed_before_the_commit():
    m = manager()
    instr = m.instruct_next(m.submit(MoveRequest(KEYED, (0,), 1)).job_id, 5)
    arm_all(m, instr)
    cancel = m.abort(instr.handover_id, "operator asked")
    assert cancel.handover_id == instr.handover_id and cancel.reason == "operator asked"
    instr = m.instruct_next(m.submit(MoveRequest(KEYED, (0,), 1)).job_id, 6)
    arm_all(m, instr)
    m.commit(instr.handover_id)
    with pytest.raises(ValueError, match="only a handover not committed yet can abort"):
        m.abort(instr.handover_id)


def test_a_replica_lost_before_the_commit_aborts_after_it_rolls_forward():
    m = manager()
    instr = m.instruct_next(m.submit(MoveRequest(KEYED, (0,), 1)).job_id, 5)
    arm_all(m, instr)
    (cancel,) = m.replica_lost((1, 1, 0))
    assert cancel.handover_id == instr.handover_id and "lost before the commit" in cancel.reason
    job = m.submit(MoveRequest(KEYED, (0,), 1))
    assert m.instruct_next(job.job_id, 6) is None  # not while a participant replica is down
    assert m.replica_restored((1, 1, 0), attempt=1) == ()  # nothing committed to replay
    instr = m.instruct_next(job.job_id, 6)
    arm_all(m, instr)  # the restored replica arms with its new attempt
    m.commit(instr.handover_id)
    rec = m.record(instr.handover_id)
    send(m, instr, AckKind.SWITCHED, "upstream")
    m.ack(HandoverAck(instr.handover_id, instr.epoch, (1, 0, 0), AckKind.CUT))
    # origin replica 1 dies before cutting: its twin's cut is enough, the step rolls forward
    assert m.replica_lost((1, 0, 1)) == ()
    assert rec.state is HandoverState.CUT
    m.release(instr.handover_id)
    # a target replica dies after the commit too, is restored, and gets the committed instruction
    m.ack(HandoverAck(instr.handover_id, instr.epoch, (1, 1, 0), AckKind.LOADED, attempt=1))
    m.replica_lost((1, 1, 1))
    assert rec.state is HandoverState.COMPLETED
    (again,) = m.replica_restored((1, 1, 1), attempt=1)
    assert again.handover_id == instr.handover_id and again.committed and not instr.committed
    # acks of the dead incarnation are stale; the restored one's re-ack is accepted and changes nothing
    def restored(kind, attempt=1):
        return m.ack(HandoverAck(instr.handover_id, instr.epoch, (1, 1, 1), kind, attempt))

    assert restored(AckKind.LOADED, attempt=0) is AckOutcome.STALE
    assert restored(AckKind.LOADED) is AckOutcome.ACCEPTED
    assert restored(AckKind.ARMED) is AckOutcome.ACCEPTED
    assert rec.state is HandoverState.COMPLETED
    assert restored(AckKind.LATE) is AckOutcome.UNEXPECTED
    assert rec.state is HandoverState.COMPLETED and "LATE after the commit" in m.violations[-1][1]


def test_when_every_replica_of_an_origin_is_lost_the_cut_waits_for_the_restored_one():
    m = manager()
    instr = m.instruct_next(m.submit(MoveRequest(KEYED, (0,), 1)).job_id, 5)
    arm_all(m, instr)
    m.commit(instr.handover_id)
    send(m, instr, AckKind.SWITCHED, "upstream")
    m.replica_lost((1, 0, 0))
    m.replica_lost((1, 0, 1))
    rec = m.record(instr.handover_id)
    assert rec.state is HandoverState.SWITCHED
    fenced = HandoverAck(instr.handover_id, instr.epoch, (1, 0, 0), AckKind.CUT)
    assert m.ack(fenced) is AckOutcome.STALE
    (replay,) = m.replica_restored((1, 0, 0), attempt=2)
    assert replay.committed
    assert rec.state is HandoverState.SWITCHED
    m.ack(HandoverAck(instr.handover_id, instr.epoch, (1, 0, 0), AckKind.CUT, attempt=2))
    assert rec.state is HandoverState.CUT
    with pytest.raises(ValueError, match="attempt of restored replica"):
        m.replica_restored((1, 0, 0), attempt=2)


def test_submit_validates_requests():
    m = manager()
    with pytest.raises(ValueError, match="unknown task 9: keyed tasks are \\[1\\]"):
        m.submit(MoveRequest(9, (0,), 1))
    with pytest.raises(ValueError, match="target partition 5 out of range"):
        m.submit(MoveRequest(KEYED, (0,), 5))
    with pytest.raises(ValueError, match="moving to its own partition"):
        m.submit(MoveRequest(KEYED, (0,), 0))
    with pytest.raises(ValueError, match="parallelism must be an int in \\[1, number of vnodes=8\\], got 0"):
        m.submit(RescaleRequest(KEYED, 0))
    with pytest.raises(ValueError, match="got 9"):
        m.submit(RescaleRequest(KEYED, 9))
    first = m.submit(MoveRequest(KEYED, (0, 1), 1))
    clash = rf"vnode\(s\) \[1\] already in a running handover \(job\(s\) \[{first.job_id}\]"
    with pytest.raises(ValueError, match=clash):
        m.submit(MoveRequest(KEYED, (1, 2), 1))
    m.submit(MoveRequest(KEYED, (2,), 1))  # disjoint vnodes may move concurrently
    with pytest.raises(ValueError, match="a rescale needs the task idle"):
        m.submit(RescaleRequest(KEYED, 4))
    with pytest.raises(ValueError, match="rebalance after handover job"):
        m.submit(RebalanceRequest(KEYED, [1] * 8))
    with pytest.raises(ValueError, match="expected a RoutingTable"):
        HandoverManager({1: "table"}, {1: UPSTREAMS})
    with pytest.raises(ValueError, match="no upstream instances"):
        HandoverManager({1: RoutingTable.uniform(4, 2)}, {})


def test_switch_positions_must_grow_and_keep_the_strategy_gap():
    m = manager()
    job = m.submit(MoveRequest(KEYED, (0, 1), 1), Fluid(gap=10))
    with pytest.raises(ValueError, match="missing \\[\\(0, 1\\)\\]"):
        m.instruct_next(job.job_id, {(0, 0): 5})
    first = m.instruct_next(job.job_id, {(0, 0): 5, (0, 1): 7})  # KaZoo: a position per upstream
    assert first.position_for((0, 1)) == 7
    assert m.instruct_next(job.job_id, 100) is None  # the previous step is not committed
    arm_all(m, first)
    m.commit(first.handover_id)
    assert m.instruct_next(job.job_id, 100) is None  # ... nor completed: one step of a job at a time
    finish_step(m, first)
    with pytest.raises(ValueError, match="at least 10 after the previous step"):
        m.instruct_next(job.job_id, {(0, 0): 15, (0, 1): 16})
    with pytest.raises(ValueError, match="must be after its previous switch at 7"):
        m.instruct_next(job.job_id, 6)
    second = m.instruct_next(job.job_id, {(0, 0): 15, (0, 1): 17})
    run_step(m, second)
    assert job.state is JobState.COMPLETED and m.tables[KEYED].epoch == 2


def test_concurrent_moves_of_disjoint_vnodes_chain_their_epochs():
    m = manager()
    a = m.submit(MoveRequest(KEYED, (0,), 1))
    b = m.submit(MoveRequest(KEYED, (7,), 0))
    ia = m.instruct_next(a.job_id, 10)
    assert m.instruct_next(b.job_id, 20) is None  # one uncommitted step per task at a time
    arm_all(m, ia)
    m.commit(ia.handover_id)
    with pytest.raises(ValueError, match="must be after its previous switch at 10"):
        m.instruct_next(b.job_id, 10)
    ib = m.instruct_next(b.job_id, 20)  # a is committed, not completed: b's epoch builds on it
    assert (ia.epoch, ib.epoch) == (1, 2) and ib.table == ia.table.moved([7], 0)
    router = VersionedRouter(RoutingTable.uniform(8, 2), 32)
    router.arm(ia.handover_id, ia.table, 10, committed=True)
    router.arm(ib.handover_id, ib.table, 20)
    arm_all(m, ib)
    m.commit(ib.handover_id)
    router.commit(ib.handover_id)
    finish_step(m, ib)  # steps of different jobs may complete in any order
    finish_step(m, ia)
    assert a.state is b.state is JobState.COMPLETED
    assert [router.route(kg, 25) for kg in (0, 28)] == [1, 0] and router.table == m.tables[KEYED]


def test_the_bytes_in_flight_cap_holds_back_a_step_until_the_previous_transfer_is_loaded():
    m = HandoverManager({1: RoutingTable.uniform(8, 2), 3: RoutingTable.uniform(8, 2)},
                        {1: UPSTREAMS, 3: [(2, 0)]}, max_bytes_in_flight=100)
    a = m.submit(MoveRequest(1, (0,), 1), sizes={0: 80})
    b = m.submit(MoveRequest(3, (0,), 1), sizes={0: 30})
    big = m.submit(MoveRequest(1, (4,), 0), sizes={4: 500})
    ia = m.instruct_next(a.job_id, 5)
    assert m.in_flight_bytes() == 80
    assert m.instruct_next(b.job_id, 5) is None  # 80 + 30 > 100
    arm_all(m, ia)
    m.commit(ia.handover_id)
    send(m, ia, AckKind.SWITCHED, "upstream")
    send(m, ia, AckKind.CUT, "origin")
    m.release(ia.handover_id)
    send(m, ia, AckKind.LOADED, "target")
    assert m.in_flight_bytes() == 0
    ib = m.instruct_next(b.job_id, 5)
    assert ib is not None and m.in_flight_bytes() == 30
    assert m.instruct_next(big.job_id, 9) is None
    run_step(m, ib)
    assert m.instruct_next(big.job_id, 9) is not None  # larger than the cap: goes alone
    assert m.in_flight_bytes() == 500


def test_a_fluid_rescale_up_and_back_down_rewires_the_downstream():
    m = manager()
    job = m.submit(RescaleRequest(KEYED, 4), Fluid(gap=2), start=10)
    assert [s.position for s in job.steps] == [10, 12, 14, 16]
    assert m.step_states(job.job_id) == (HandoverState.PLANNED,) * 4
    pos = 10
    seen_downstream = []
    while job.state is JobState.RUNNING:
        instr = m.instruct_next(job.job_id, pos)
        seen_downstream.append(bool(instr.participants["downstream"]))
        if instr.joining:
            assert instr.participants["target"] >= {(KEYED, p) for p in instr.joining}
        run_step(m, instr)
        pos += 2
    assert m.step_states(job.job_id) == (HandoverState.COMPLETED,) * 4
    assert seen_downstream == [True, False, True, False]  # partition 2 joins at step 0, partition 3 at step 2
    assert counts(m.tables[KEYED]) == [2, 2, 2, 2] and m.tables[KEYED].epoch == 4
    down = m.submit(RescaleRequest(KEYED, 1), Batched(step_size=4, gap=3))
    while down.state is JobState.RUNNING:
        instr = m.instruct_next(down.job_id, pos)
        run_step(m, instr)
        pos += 3
    assert m.tables[KEYED] == RoutingTable((0,) * 8, 1, m.tables[KEYED].epoch)
    assert instr.leaving == (1, 2, 3) and instr.participants["origin"] == {(KEYED, p) for p in (1, 2, 3)}
    assert m.prune(KEYED, m.tables[KEYED].epoch) == 6 and not m.records


def test_partitions_opened_by_a_step_are_targets_even_without_a_vnode_in_it():
    m = HandoverManager({KEYED: RoutingTable((1, 1, 0, 0), 2)}, {KEYED: UPSTREAMS}, {KEYED: DOWNSTREAMS})
    job = m.submit(RescaleRequest(KEYED, 4), Fluid())
    assert [s.moves for s in job.steps] == [(VnodeMove(3, 0, 3),), (VnodeMove(1, 1, 2),)]
    first = m.instruct_next(job.job_id, 5)
    assert first.joining == (2, 3)
    assert first.participants["target"] == {(KEYED, 2), (KEYED, 3)}
    run_step(m, first)
    assert m.record(first.handover_id).state is HandoverState.COMPLETED
    second = m.instruct_next(job.job_id, 6)
    assert second.joining == () and second.participants["downstream"] == frozenset()
    run_step(m, second)
    assert m.tables[KEYED].assignment == (1, 2, 0, 3)


def test_rebalance_and_no_op_jobs():
    m = manager(parallelism=2)
    job = m.submit(RebalanceRequest(KEYED, [9, 9, 9, 9, 1, 1, 1, 1], fraction=0.5))
    assert {mv.vnode for s in job.steps for mv in s.moves} == {0, 1}
    noop = manager().submit(RescaleRequest(KEYED, 2))
    assert noop.state is JobState.COMPLETED and noop.steps == ()


def test_operator_replacement_switches_every_replica_at_the_planned_position():
    m = manager()
    req = ReplaceOperatorRequest(KEYED, "score", 2)
    instr = m.replace_operator(req, {(KEYED, 0): 40, (KEYED, 1): 55})
    assert isinstance(instr, CodeInstruction) and instr.epoch == 2
    with pytest.raises(ValueError, match="already being replaced"):
        m.replace_operator(ReplaceOperatorRequest(KEYED, "score", 3), 60)
    rec = m.record(instr.handover_id)
    arm_all(m, instr)
    m.commit(instr.handover_id)
    assert m.ack(HandoverAck(instr.handover_id, 2, (KEYED, 0, 0), AckKind.CUT)) is AckOutcome.UNEXPECTED
    send(m, instr, AckKind.SWITCHED, "instance")
    assert rec.state is HandoverState.COMPLETED and m.code_versions[(KEYED, "score")] == 2
    with pytest.raises(ValueError, match="must be an int > current version 2"):
        m.replace_operator(ReplaceOperatorRequest(KEYED, "score", 2), 60)
    with pytest.raises(ValueError, match="must be after its previous switch at 40"):
        m.replace_operator(ReplaceOperatorRequest(KEYED, "score", 3), 40)
    with pytest.raises(ValueError, match="no routing table: pass partitions="):
        m.replace_operator(ReplaceOperatorRequest(7, "f", 1), 1)
    other = m.replace_operator(ReplaceOperatorRequest(7, "f", 1), 1, partitions=3)
    assert other.participants["instance"] == {(7, 0), (7, 1), (7, 2)}


@FAST
@given(st.randoms(use_true_random=False), st.integers(0, 3))
def test_any_interleaving_of_acks_completes_exactly_when_every_phase_is_acked(rnd, lost_count):
    m = manager(parallelism=2)
    instr = m.instruct_next(m.submit(RescaleRequest(KEYED, 3)).job_id, 20)
    arm_all(m, instr)
    m.commit(instr.handover_id)
    rec = m.record(instr.handover_id)
    events = []
    for role, kind in (("upstream", AckKind.SWITCHED), ("origin", AckKind.CUT), ("target", AckKind.LOADED),
                       ("downstream", AckKind.REWIRED)):
        for r in replicas_of(instr.participants[role]):
            events.append(("ack", HandoverAck(instr.handover_id, instr.epoch, r, kind)))
    # replica-1s that die mid-way (their twins carry the step), and duplicates and stale acks
    everybody = replicas_of(rec.instances)
    for r in rnd.sample([r for r in everybody if r[2] == 1], lost_count):
        events.append(("lost", r))
    events += [e for e in events[:3]] + [("ack", HandoverAck(instr.handover_id, instr.epoch + 5, (0, 0, 0),
                                                               AckKind.SWITCHED))]
    rnd.shuffle(events)
    released = False
    pending_loaded = []
    states = []
    for what, ev in events:
        if what == "lost":
            assert m.replica_lost(ev) == ()  # committed: never aborts
        elif ev.kind is AckKind.LOADED and not released:
            pending_loaded.append(ev)  # a target cannot release before the release point is placed
        else:
            m.ack(ev)
        if not released and rec.state in (HandoverState.CUT, HandoverState.LOADED):
            m.release(instr.handover_id)
            released = True
            for held in pending_loaded:
                m.ack(held)
        states.append(rec.state)
    order = list(HandoverState)
    assert [order.index(s) for s in states] == sorted(order.index(s) for s in states)  # never regresses
    assert rec.state is HandoverState.COMPLETED
    assert m.tables[KEYED].parallelism == 3 and not m.violations


# --------------------------------------------------------------------------- participants


def test_router_switches_exactly_at_the_position():
    old = RoutingTable.uniform(4, 2)
    new = old.moved([0], 1)
    router = VersionedRouter(old, 16)  # vnode v owns key groups [4v, 4v + 4)
    assert router.route(0, 3) == 0
    assert router.arm(7, new, 5)
    assert router.route(0, 4) == 0  # before the position: old table
    assert router.blocked(5) and not router.blocked(4)
    with pytest.raises(SwitchNotCommittedError):
        router.route(0, 5)
    assert router.position == 4  # the blocked element was not consumed
    router.commit(7)
    assert router.advance(5) == (new,)
    assert router.route(0, 5) == 1 and router.route(1, 5) == 1
    assert not router.arm(7, new, 5)  # in force already
    with pytest.raises(ValueError, match="goes back"):
        router.route(0, 4)
    with pytest.raises(LateInstructionError):
        router.arm(8, new.moved([1], 1), 5)
    with pytest.raises(ValueError, match="does not follow epoch 1"):
        router.arm(9, RoutingTable(new.assignment, 2, 5), 9)


def test_router_cancel_and_checkpoint():
    old = RoutingTable.uniform(4, 2)
    e1 = old.moved([0], 1)
    e2 = e1.moved([1], 1)
    router = VersionedRouter(old, 16, position=2)
    router.arm(1, e1, 5, committed=True)
    router.arm(2, e2, 9)
    with pytest.raises(ValueError, match="must come after the pending switch"):
        router.arm(3, e2.moved([2], 1), 9)
    restored = VersionedRouter.from_snapshot(router.snapshot())
    assert restored.pending == router.pending == ((1, 5, True), (2, 9, False))
    assert restored.position == 2
    assert restored.route(0, 6) == router.route(0, 6) == 1
    assert router.cancel(2) == (2,)
    assert router.route(0, 20) == 1 and router.route(4, 20) == 0 and router.table == e1
    committed = VersionedRouter(old, 16)
    committed.arm(1, e1, 5, committed=True)
    with pytest.raises(ValueError, match="committed: it cannot be cancelled"):
        committed.cancel(1)


@FAST
@given(st.data())
def test_two_replicas_route_identically_whenever_the_instruction_arrives_before_the_position(data):
    old = RoutingTable.uniform(8, 3)
    new = apply_moves(old, [VnodeMove(0, 0, 2), VnodeMove(5, 1, 0)])
    positions = sorted(data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=60)))
    key_groups = data.draw(st.lists(st.integers(0, 31), min_size=len(positions), max_size=len(positions)))
    switch = data.draw(st.integers(0, 60))
    elements = list(zip(key_groups, positions, strict=True))
    before_switch = sum(1 for p in positions if p < switch)  # elements routed before the position

    def replica(arm_at: int, commit_at: int) -> list[int]:
        router = VersionedRouter(old, 32)
        out = []
        for i, (kg, pos) in enumerate(elements):
            if i == arm_at:
                router.arm(1, new, switch)
            if i == commit_at and router.pending:
                router.commit(1)
            try:
                out.append(router.route(kg, pos))
            except SwitchNotCommittedError:
                router.commit(1)  # the commit arrives while the element waits
                out.append(router.route(kg, pos))
        return out

    def arrival():
        return data.draw(st.integers(0, before_switch)), data.draw(st.integers(0, len(elements)))

    a, b = replica(*arrival()), replica(*arrival())
    expected = [(new if pos >= switch else old).partition_of_key_group(kg, 32) for kg, pos in elements]
    assert a == b == expected
    # too late: an instruction after an element at or past its position is refused
    late = VersionedRouter(old, 32)
    late.route(0, switch)
    with pytest.raises(LateInstructionError):
        late.arm(1, new, switch)


def test_origin_aligns_when_every_channel_delivered_the_marker():
    key_groups = cut_key_groups([VnodeMove(1, 0, 1), VnodeMove(2, 0, 1), VnodeMove(6, 3, 1)], 0, 32, 8)
    assert key_groups == (range(4, 12),)
    assert set().union(*key_groups) == set(vnode_key_groups(1, 32, 8)) | set(vnode_key_groups(2, 32, 8))
    assert load_key_groups([VnodeMove(1, 0, 1), VnodeMove(6, 3, 1)], 1, 32, 8) == (range(4, 8), range(24, 28))
    origin = OriginAlignment(3, [10, 11, 12], key_groups)
    assert origin.record_ok(10, 5)
    assert not origin.marker(10)
    assert not origin.record_ok(10, 5) and origin.record_ok(10, 20) and origin.record_ok(11, 5)
    assert not origin.marker(12)
    assert origin.marker(11) and origin.aligned
    with pytest.raises(ValueError, match="second marker"):
        origin.marker(11)
    with pytest.raises(ValueError, match="not an input"):
        origin.marker(99)


def test_target_gate_holds_moved_key_groups_until_loaded_and_released():
    gate = TargetGate(4, [range(8, 12)])
    assert gate.admit("a", 1).process == ("a",)
    assert gate.admit("m1", 9).process == ()  # moved: held
    assert gate.admit("b", 2).process == ("b",)  # other key groups pass, also after a held record
    assert gate.release().wait  # release point reached, state not loaded: wait
    gate.loaded()
    assert gate.admit("m2", 10).process == ()  # loaded but before the release point: still held
    assert gate.admit("c", 3).process == ("c",)
    snap = gate.snapshot()
    decision = gate.release()
    assert not decision.wait and decision.process == ("m1", "m2")
    assert gate.admit("m3", 9).process == ("m3",)
    restored = TargetGate.from_snapshot(snap)
    assert restored.held == ["m1", "m2"] and not restored.is_loaded


@FAST
@given(st.lists(st.integers(0, 15), max_size=40), st.data())
def test_target_replicas_loading_at_different_times_produce_the_same_sequence(stream, data):
    """Both target replicas consume the same input and the release point at the same index;
    whenever each finishes loading, the processed sequence is identical, per-key-group order is
    kept, every element is processed exactly once and only the moved key groups wait."""
    elements = list(enumerate(stream))
    release_at = data.draw(st.integers(0, len(elements)))

    def run(loaded_at: int) -> list:
        gate = TargetGate(1, [range(4, 8)])
        out = []
        i = 0
        while i <= len(elements):
            if i == loaded_at:
                gate.loaded()
            if i == release_at:
                decision = gate.release()
                if decision.wait:
                    loaded_at = i  # this replica waits at the release point until its load is done
                    continue
                out.extend(decision.process)
            if i < len(elements):
                out.extend(gate.admit(elements[i], elements[i][1]).process)
            i += 1
        return out

    a = run(data.draw(st.integers(0, len(elements) + 1)))
    b = run(data.draw(st.integers(0, len(elements) + 1)))
    assert a == b
    assert sorted(a) == elements
    for kg in range(16):
        assert [e for e in a if e[1] == kg] == [e for e in elements if e[1] == kg]
    assert [e for e in a if not 4 <= e[1] < 8] == [e for e in elements if not 4 <= e[1] < 8]


def test_code_switch_changes_the_function_at_the_same_element_on_both_replicas():
    def replica(arm_at: int) -> list[int]:
        cs = CodeSwitch(1)
        out = []
        for n in range(20):
            if n == arm_at:
                cs.arm(2, 12, committed=True)
            out.append(cs.version_for(n))
        return out

    assert replica(0) == replica(11) == [1] * 12 + [2] * 8
    cs = CodeSwitch(1)
    cs.version_for(12)
    with pytest.raises(LateInstructionError):
        cs.arm(2, 12)
    cs2 = CodeSwitch(1)
    assert cs2.arm(2, 5) and not cs2.arm(2, 5) and not cs2.arm(1, 9)
    assert cs2.arm(4, 8)
    with pytest.raises(ValueError, match="must be newer than the armed version 4"):
        cs2.arm(3, 9)
    with pytest.raises(ValueError, match="armed again at another position"):
        cs2.arm(2, 6)
    with pytest.raises(SwitchNotCommittedError):
        cs2.version_for(5)
    assert cs2.cancel(2) == (2, 4)  # a later version was armed on top of it
    assert cs2.version_for(30) == 1


def test_restored_replica_rearms_committed_instructions_and_skips_what_it_has():
    m = manager()
    instr = m.instruct_next(m.submit(MoveRequest(KEYED, (0,), 1)).job_id, 30)
    run_step(m, instr)
    m.replica_lost((0, 1, 1))
    (replay,) = m.replica_restored((0, 1, 1), attempt=1)
    old = RoutingTable.uniform(8, 2)
    behind = VersionedRouter(old, 32, position=12)  # restored from a checkpoint before the switch
    position = replay.position_for((0, 1))
    assert behind.arm(replay.handover_id, replay.table, position, committed=replay.committed)
    assert behind.route(0, 29) == 0 and behind.route(0, 30) == 1
    ahead = VersionedRouter(replay.table, 32, position=40)  # restored from a checkpoint after it
    assert not ahead.arm(replay.handover_id, replay.table, position, committed=True)


def test_random_fluid_and_batched_plans_replay_on_routers():
    """End to end on the pure pieces: a batched rescale's steps armed and committed on a router
    give, at every position, the table of the last step switched by then."""
    rnd = random.Random(7)
    table = RoutingTable.uniform(16, 2)
    steps = plan_steps(table, rescale(table, 5), Batched(step_size=3, gap=4), start=10, parallelism=5)
    router = VersionedRouter(table, 64)
    for i, s in enumerate(steps):
        router.arm(i + 1, s.table_after, s.position, committed=True)
    for pos in range(0, 10 + 4 * len(steps)):
        kg = rnd.randrange(64)
        in_force = [s.table_after for s in steps if s.position <= pos]
        expected = (in_force[-1] if in_force else table).partition_of_key_group(kg, 64)
        assert router.route(kg, pos) == expected
