"""The replication manager: replica groups, completed checkpoints, restore placement (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rhino_state.manager import ReplicationManager

# two tasks of two partitions on 3 workers: partition i (over all tasks) has replica r on (i + r) % 3
PLACEMENT = {(t, p, r): (2 * t + p + r) % 3 for t in range(2) for p in range(2) for r in range(2)}


def test_groups_avoid_the_replicas_and_are_deterministic():
    m = ReplicationManager(dict(PLACEMENT), 3)
    for inst, group in m.groups.items():
        assert len(group) == 1 and not set(group) & m.replica_workers(inst)
    assert m.groups == ReplicationManager(dict(PLACEMENT), 3).groups
    assert ReplicationManager(dict(PLACEMENT), 3, size=2).groups[(0, 0)] == [2]  # only one worker is free


def test_a_lost_replica_is_restored_on_a_holder_of_the_latest_completed_checkpoint():
    m = ReplicationManager(dict(PLACEMENT), 3)
    assert m.restore_plan((0, 0, 0)) is None  # nothing completed yet
    assert m.checkpoint_completed((0, 0), 5, {0: 10})
    assert not m.checkpoint_completed((0, 0), 4, {0: 8})  # older: ignored
    lost, changed = m.worker_dead(0)
    assert (0, 0, 0) in lost and all(m.placement[r] == 0 for r in lost)
    plan = m.restore_plan((0, 0, 0))
    assert (plan.host, plan.source) == (2, None)  # worker 2 holds (0, 0)'s checkpoint 5
    # a drained holder is no destination: worker 1 (which runs the twin) is not free either
    assert m.restore_plan((0, 0, 0), avoid={2}) is None
    assert m.completed[(0, 0)].positions == {0: 10}
    regrouped = m.replica_moved((0, 0, 0), 2)
    assert m.groups[(0, 0)] == [] and regrouped == {(0, 0): []}  # workers 1 and 2 run it, 0 is dead
    # the relaunched worker joins the groups it left short (their next checkpoint is a full one),
    # then takes (1, 0) over from worker 1, which runs three replicas and was its only member
    assert m.worker_alive(0) == {(0, 0): [0], (0, 1): [0], (1, 0): [0]}


def test_a_dead_holder_cannot_be_restored_from():
    m = ReplicationManager(dict(PLACEMENT), 3)
    m.checkpoint_completed((0, 0), 1, {})
    holder = m.groups[(0, 0)][0]
    m.worker_dead(holder)
    assert m.completed[(0, 0)].holders == frozenset()
    m.worker_dead(0)
    assert m.restore_plan((0, 0, 0)) is None


def test_a_worker_that_ended_neither_runs_a_restored_replica_nor_serves_a_copy():
    """Ending jobs: a worker that reported its end stopped its server; a restore sent there, or
    pulling from there, failed and was tried again every 2 s until the drain timed out."""
    m = ReplicationManager(dict(PLACEMENT), 4)
    m.checkpoint_completed((0, 0), 5, {}, holders=[2, 3])
    m.worker_dead(0)
    assert m.restore_plan((0, 0, 0)).host in (2, 3)
    m.worker_ended(2)
    plan = m.restore_plan((0, 0, 0))
    assert (plan.host, plan.source) == (3, None)
    m.worker_ended(3)
    assert m.restore_plan((0, 0, 0)) is None  # its only holders ended: nothing to restore from
    assert m.groups[(0, 0)] and not any(source in (2, 3) for *_, source in m.copies_wanted())


def test_a_resumed_cut_restores_a_replica_whichever_workers_died_until_held_checkpoints_complete():
    """A run resumed from a durable cut: its checkpoints count as completed, held by no worker;
    a lost replica (its twin lost too: a rollback) is built from the store on a free worker."""
    m = ReplicationManager(dict(PLACEMENT), 3)
    for inst in m.instances():
        m.checkpoint_completed(inst, 40, {0: 7}, "d", holders=(), durable_file=f"f{inst}")
    assert all(m.survives_a_loss(inst) for inst in m.instances()) and not m.copies_wanted()
    m.worker_dead(0)
    m.worker_dead(1)  # both replicas of (0, 0) lost
    plan = m.restore_plan((0, 0, 0))
    assert plan.durable and plan.host == 2 and plan.source is None and plan.rollback
    assert plan.checkpoint.durable_file == "f(0, 0)" and plan.checkpoint.positions == {0: 7}
    # once a checkpoint of this run completes where a live worker holds it, that one is restored from
    m2 = ReplicationManager(dict(PLACEMENT), 3)
    m2.checkpoint_completed((0, 0), 40, {}, holders=(), durable_file="f")
    m2.checkpoint_completed((0, 0), 41, {}, holders=[2])
    m2.worker_dead(0)
    plan = m2.restore_plan((0, 0, 0))
    assert not plan.durable and plan.checkpoint.checkpoint_id == 41 and plan.host == 2


def test_holders_are_the_chain_the_checkpoint_went_along_not_the_current_group():
    m = ReplicationManager(dict(PLACEMENT), 3)
    m.worker_dead(1)
    m.checkpoint_completed((0, 0), 3, {}, holders=[1, 2])  # reported late, by a chain through a dead worker
    assert m.completed[(0, 0)].holders == frozenset({2})


def test_a_lost_replica_on_its_relaunched_worker_is_not_live():
    """Spark relaunches the dead worker before the lost replica is restored: the placement still
    names that worker, which must count as free for the group (it can hold the checkpoint)."""
    m = ReplicationManager(dict(PLACEMENT), 3, size=2)
    assert m.groups[(0, 0)] == [2]  # workers 0 and 1 run its replicas
    m.worker_dead(0)
    m.worker_alive(0)
    assert m.replica_workers((0, 0)) == {1} and m.groups[(0, 0)] == [2, 0]
    m.replica_moved((0, 0, 0), 2)  # restored on worker 2
    assert m.replica_workers((0, 0)) == {1, 2} and m.groups[(0, 0)] == [0]


def _kill_and_restore(m: ReplicationManager, w: int) -> list[int]:
    """Worker ``w`` dies and every replica it ran is restored where its plan says: the hosts."""
    lost, _ = m.worker_dead(w)
    hosts = []
    for replica in lost:
        host = m.restore_plan(replica).host
        m.replica_moved(replica, host)
        hosts.append(host)
    return hosts


def _loads(m: ReplicationManager, workers: int) -> list[int]:
    """Per worker: the live replicas it runs plus the replica groups it is a member of."""
    return [sum(1 for r, ww in m.placement.items() if ww == w and r not in m.lost)
            + sum(1 for g in m.groups.values() if w in g) for w in range(workers)]


def test_groups_and_restores_spread_over_the_workers_across_kills_and_relaunches():
    """Ten partitions on four workers, killed and relaunched one after another: the groups, and
    so the restores that go to their members, stay spread instead of all piling on one worker
    (the relaunched one joins no group unless it takes memberships over)."""
    placement = {(t, p, r): (2 * t + p + r) % 4 for t in range(5) for p in range(2) for r in range(2)}
    m = ReplicationManager(placement, 4)
    loads = _loads(m, 4)
    assert max(loads) - min(loads) <= 1, loads
    for cid, w in enumerate([3, 0, 2, 1, 3, 0], start=1):
        for inst in m.instances():  # the groups' checkpoints complete on their members
            m.checkpoint_completed(inst, cid, {})
        hosts = _kill_and_restore(m, w)
        assert len(set(hosts)) >= 2, f"every replica of worker {w} restored on worker {hosts[0]}"
        m.worker_alive(w)
        loads = _loads(m, 4)
        assert max(loads) - min(loads) <= 2, loads


# a source (task 0) -> map (task 1) -> sink (task 2) chain, one partition each, channels 10 and 11
CHAIN_PLACEMENT = {(t, 0, r): (t + r) % 3 for t in range(3) for r in range(2)}
CHAIN = [(10, (0, 0), (1, 0)), (11, (1, 0), (2, 0))]


def chain_manager() -> ReplicationManager:
    return ReplicationManager(dict(CHAIN_PLACEMENT), 3, channels=list(CHAIN))


def test_the_safe_checkpoints_form_a_consistent_cut():
    m = chain_manager()
    m.checkpoint_completed((0, 0), 1, {}, outputs={10: 100})
    m.checkpoint_completed((0, 0), 2, {}, outputs={10: 200})
    m.checkpoint_completed((1, 0), 1, {10: 150}, outputs={11: 90})
    assert m.safe == {}  # the sink has no checkpoint: nothing is safe above it
    m.checkpoint_completed((2, 0), 1, {11: 80})
    # the sink is safe at its latest; the map's checkpoint 1 produced up to 90 > 80: not covered
    assert m.safe[(2, 0)].checkpoint_id == 1 and (1, 0) not in m.safe and (0, 0) not in m.safe
    m.checkpoint_completed((2, 0), 2, {11: 95})
    assert m.safe[(1, 0)].checkpoint_id == 1
    assert m.safe[(0, 0)].checkpoint_id == 1  # 200 > 150 (the map's safe position): only 100 is covered
    assert m.trim_positions((1, 0)) == {10: 150} and m.trim_positions((0, 0)) == {}
    m.checkpoint_completed((1, 0), 2, {10: 260}, outputs={11: 120})
    assert m.safe[(1, 0)].checkpoint_id == 1  # 120 > 95: the map stays at 1, and so the source
    assert m.safe[(0, 0)].checkpoint_id == 1
    assert [cp.checkpoint_id for cp in m.history[(1, 0)]] == [1, 2]  # kept from the safe one on
    m.checkpoint_completed((2, 0), 3, {11: 130})
    assert m.safe[(1, 0)].checkpoint_id == 2 and m.safe[(0, 0)].checkpoint_id == 2
    assert [cp.checkpoint_id for cp in m.history[(0, 0)]] == [2] and m.retain_from((1, 0)) == 2
    # the cut: every channel's upstream output at its safe checkpoint <= the downstream's position
    for ch, up, down in CHAIN:
        assert m.safe[up].outputs[ch] <= m.safe[down].positions[ch]


def test_losing_every_replica_rolls_back_from_the_safe_checkpoint_and_pins_it():
    m = chain_manager()
    m.checkpoint_completed((0, 0), 1, {}, outputs={10: 40})
    m.checkpoint_completed((0, 0), 2, {}, outputs={10: 120})
    m.checkpoint_completed((1, 0), 1, {10: 50}, outputs={11: 40})
    m.checkpoint_completed((2, 0), 1, {11: 45})
    m.checkpoint_completed((1, 0), 2, {10: 150}, outputs={11: 90})  # the latest, not covered by the sink
    assert m.safe[(1, 0)].checkpoint_id == 1 and m.completed[(1, 0)].checkpoint_id == 2
    group = m.groups[(1, 0)][0]
    # one replica lost: restored from the safe checkpoint too (its twin may die before it
    # delivered what the latest one no longer produces)
    lost, _ = m.worker_dead(1)  # map r0 (worker 1) and source r1 (worker 1)
    plan = m.restore_plan((1, 0, 0))
    assert (plan.host, plan.checkpoint.checkpoint_id, plan.rollback, plan.source) == (group, 1, False, None)
    # both lost: a rollback from the safe checkpoint
    m.worker_dead(2)
    assert m.restore_plan((1, 0, 1)) is None or m.restore_plan((1, 0, 1)).rollback
    m.worker_alive(1)
    m.worker_alive(2)
    plan = m.restore_plan((1, 0, 0))
    assert plan is not None and plan.checkpoint.checkpoint_id == 1 and plan.rollback is True and plan.host == 0
    m.restoring((1, 0, 0), plan.checkpoint)
    m.replica_moved((1, 0, 0), plan.host)
    # the sink moves on; the map's safe checkpoint would now be 2, but the rollback replays from 1
    m.checkpoint_completed((2, 0), 2, {11: 100})
    assert m.safe[(1, 0)].checkpoint_id == 2 and m.trim_positions((1, 0)) == {10: 50}
    assert m.safe[(0, 0)].checkpoint_id == 1  # 120 would do for the map's safe 150, not for the pinned 50
    assert m.retain_from((1, 0)) == 1
    # the only holder runs the restored replica now: its twin goes to a free worker, which pulls
    # the pinned checkpoint from that holder (no rollback: a replica is live)
    plan = m.restore_plan((1, 0, 1))
    assert 0 not in m.groups[(1, 0)]
    assert (plan.host != 0, plan.source, plan.checkpoint.checkpoint_id, plan.rollback) == (True, 0, 1, False)
    assert m.restore_plan((1, 0, 1), avoid={1, 2}) is None  # no free worker
    # once the restored replica took a checkpoint at or past the safe one, nothing is pinned (a
    # checkpoint of another replica, or an older one, does not count)
    m.checkpoint_taken((1, 0, 1), 2)
    m.checkpoint_taken((1, 0, 0), 1)
    assert m.pinned[(1, 0)].checkpoint_id == 1
    m.checkpoint_taken((1, 0, 0), 2)
    assert (1, 0) not in m.pinned and m.trim_positions((1, 0)) == {10: 150}
    # the twin is restored from the safe checkpoint once a worker that does not run the
    # restored replica holds one (the restored replica is live: no rollback)
    m.checkpoint_completed((1, 0), 3, {10: 200}, outputs={11: 100})
    m.checkpoint_completed((2, 0), 3, {11: 100})
    plan = m.restore_plan((1, 0, 1))
    assert plan.host in m.groups[(1, 0)] and plan.checkpoint.checkpoint_id == 3 and not plan.rollback
    assert plan.source is None


def test_no_safe_checkpoint_means_no_rollback():
    m = chain_manager()
    m.checkpoint_completed((1, 0), 1, {10: 50}, outputs={11: 40})  # the sink never completed one
    m.worker_dead(1)
    m.worker_dead(2)
    m.worker_alive(1)
    assert m.restore_plan((1, 0, 0)) is None and m.trim_positions((1, 0)) is None


def test_a_failed_restore_or_a_lost_restored_replica_unpins():
    m = chain_manager()
    m.checkpoint_completed((1, 0), 1, {10: 50}, outputs={11: 40})
    m.checkpoint_completed((2, 0), 1, {11: 45})
    cp = m.safe[(1, 0)]
    m.worker_dead(1)
    m.restoring((1, 0, 0), cp)
    m.restore_failed((1, 0, 1))  # not the pinning replica: nothing changes
    assert m.pinned[(1, 0)] == cp
    m.restore_failed((1, 0, 0))
    assert (1, 0) not in m.pinned
    m.restoring((1, 0, 0), cp)
    m.replica_moved((1, 0, 0), 0)
    m.worker_dead(0)  # the restored replica dies before it caught up
    assert (1, 0) not in m.pinned



def test_a_later_checkpoint_never_stands_in_for_the_safe_one_even_with_a_live_twin():
    """An upstream (0, 0) on workers 0 and 1 feeds a downstream (1, 0) on 2 and 3.  The upstream's
    safe checkpoint 1 (what the downstream's checkpoint covers) went to worker 2, which dies; its
    checkpoint 2 went to the new member 3.  Replica 0 of the upstream is then lost: restored from
    checkpoint 2, its output would start after what a downstream replica restored from its own
    checkpoint needs, so it waits until the safe cut reaches a checkpoint a free worker holds."""
    m = ReplicationManager({(0, 0, 0): 0, (0, 0, 1): 1, (1, 0, 0): 2, (1, 0, 1): 3}, 4,
                           channels=[(7, (0, 0), (1, 0))])
    assert m.groups[(0, 0)] == [2]
    m.checkpoint_completed((0, 0), 1, {}, holders=[2], outputs={7: 5})
    m.checkpoint_completed((1, 0), 1, {7: 5}, outputs={})
    assert m.safe[(0, 0)].checkpoint_id == 1
    m.worker_dead(2)
    assert m.groups[(0, 0)] == [3]
    m.checkpoint_completed((0, 0), 2, {}, holders=[3], outputs={7: 9})
    m.worker_dead(0)
    assert m.restore_plan((0, 0, 0)) is None  # the downstream has not checkpointed past 5 yet
    m.checkpoint_completed((1, 0), 2, {7: 9}, outputs={})
    plan = m.restore_plan((0, 0, 0))
    assert (plan.host, plan.checkpoint.checkpoint_id, plan.rollback, plan.source) == (3, 2, False, None)


def test_the_cut_stays_at_a_well_held_checkpoint_rather_than_move_to_one_only_a_replica_s_worker_holds():
    """An upstream (0, 0) on workers 0 and 1 feeds (1, 0) on 2 and 3.  The upstream's checkpoints
    1 and 2 are held by worker 0 alone (it runs a replica), and 1 was copied to worker 3.  When
    the downstream's checkpoint covers 2 as well, the safe cut stays at 1: moving on to 2 would
    leave nothing to restore from if worker 0 died before 2 was copied.  Worker 0 dies: its
    replica is restored from 1 on worker 3.  The cut moves on once a newer checkpoint is well held."""
    m = ReplicationManager({(0, 0, 0): 0, (0, 0, 1): 1, (1, 0, 0): 2, (1, 0, 1): 3}, 4,
                           channels=[(7, (0, 0), (1, 0))])
    m.checkpoint_completed((0, 0), 1, {}, holders=[0], outputs={7: 5})
    m.checkpoint_completed((0, 0), 2, {}, holders=[0], outputs={7: 9})
    m.checkpoint_completed((1, 0), 1, {7: 5})
    assert m.safe[(0, 0)].checkpoint_id == 1 and not m.survives_a_loss((0, 0))
    assert m.checkpoint_copied((0, 0), 1, 3) and m.survives_a_loss((0, 0))
    m.checkpoint_completed((1, 0), 2, {7: 9})
    assert m.safe[(0, 0)].checkpoint_id == 1 and m.survives_a_loss((0, 0))
    m.worker_dead(0)
    plan = m.restore_plan((0, 0, 0))
    assert (plan.host, plan.checkpoint.checkpoint_id, plan.source, plan.rollback) == (3, 1, None, False)
    m.checkpoint_completed((0, 0), 3, {}, holders=[2, 1], outputs={7: 12})
    m.checkpoint_completed((1, 0), 3, {7: 12})
    assert m.safe[(0, 0)].checkpoint_id == 3  # well held: member 2 and the shipper's worker 1


def test_a_second_kill_whose_only_holders_run_the_twins_restores_on_a_free_worker_by_pulling():
    """Two kills a few seconds apart on four workers: the second takes replicas whose only live
    checkpoint holder runs their twin.  They go to a free worker (the least loaded), which pulls
    the checkpoint from that holder, instead of waiting for a new member to hold one."""
    placement = {(0, p, r): (p + r) % 4 for p in range(4) for r in range(2)}  # p on p and p+1
    m = ReplicationManager(dict(placement), 4)
    for inst in m.instances():
        m.checkpoint_completed(inst, 1, {})
    # (0, 1) runs on workers 1 and 2; its checkpoint is on its group member
    holder = m.groups[(0, 1)][0]
    assert holder not in (1, 2)
    m.worker_dead(1)
    plan = m.restore_plan((0, 1, 0))
    assert (plan.host, plan.source) == (holder, None)
    m.replica_moved((0, 1, 0), holder)  # now on the holder and worker 2; its new member holds nothing yet
    m.worker_dead(2)
    plan = m.restore_plan((0, 1, 1))
    assert plan is not None and plan.source == holder and plan.host not in (1, 2, holder)
    assert plan.checkpoint.checkpoint_id == 1 and not plan.rollback
    # a free holder is always preferred to pulling
    m.checkpoint_completed((0, 1), 2, {}, holders=[plan.host])
    assert m.restore_plan((0, 1, 1)).source is None



def test_a_partition_survives_a_loss_only_with_a_holder_apart_from_each_replica():
    placement = {(0, p, r): (p + r) % 4 for p in range(4) for r in range(2)}
    m = ReplicationManager(dict(placement), 4)
    assert not m.survives_a_loss((0, 1))  # nothing completed yet
    for inst in m.instances():
        m.checkpoint_completed(inst, 1, {})
    assert all(m.survives_a_loss(inst) for inst in m.instances())
    holder = m.groups[(0, 1)][0]
    m.worker_dead(1)
    m.replica_moved((0, 1, 0), holder)
    # the twin's loss can be restored by pulling from the holder, the holder's loss cannot
    assert m.restore_plan((0, 1, 1)) is not None and not m.survives_a_loss((0, 1))
    m.checkpoint_completed((0, 1), 2, {}, holders=m.groups[(0, 1)])
    assert m.survives_a_loss((0, 1))
    assert not m.survives_a_loss((0, 1), avoid=set(range(4)) - {holder, 2})  # no worker free to run it


def test_a_restore_point_held_only_beside_a_replica_is_copied_to_a_group_member():
    """A replica restored on the only holder of its checkpoint leaves its partition unprotected
    against that worker's loss: a free group member pulls a copy from the holder, and once it
    holds it the partition survives any single loss again."""
    placement = {(0, p, r): (p + r) % 4 for p in range(4) for r in range(2)}
    m = ReplicationManager(dict(placement), 4)
    for inst in m.instances():
        m.checkpoint_completed(inst, 1, {})
    assert m.copies_wanted() == []  # every restore point is held apart from the replicas
    holder = m.groups[(0, 1)][0]
    m.worker_dead(1)
    m.replica_moved((0, 1, 0), holder)
    member = m.groups[(0, 1)][0]
    wanted = {inst: (cp.checkpoint_id, w, source) for inst, cp, w, source in m.copies_wanted()}
    assert wanted[(0, 1)] == (1, member, holder)
    assert (0, 1) not in {inst for inst, *_ in m.copies_wanted(avoid={member})}  # no other member to pull it
    assert m.checkpoint_copied((0, 1), 1, member)
    assert m.survives_a_loss((0, 1)) and (0, 1) not in {inst for inst, *_ in m.copies_wanted()}
    assert member in m.restore_point((0, 1)).holders and member in m.completed[(0, 1)].holders
    # the holder dies: the replica it ran is restored from the copy, locally
    m.worker_dead(holder)
    plan = m.restore_plan((0, 1, 0))
    assert (plan.host, plan.source) == (member, None)
    # a copy of a checkpoint no longer kept, or to a dead worker, does not count
    assert not m.checkpoint_copied((0, 1), 99, member)
    assert not m.checkpoint_copied((0, 1), 1, holder)


_EVENT = st.one_of(
    st.tuples(st.just("complete"), st.integers(0, 2), st.frozensets(st.integers(0, 3), max_size=3),
              st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.just("copy"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("dead"), st.integers(0, 3)),
    st.tuples(st.just("alive"), st.integers(0, 3)),
    st.tuples(st.just("restore"), st.integers(0, 2), st.integers(0, 1)),
    st.tuples(st.just("taken"), st.integers(0, 2), st.integers(0, 1)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENT, max_size=40))
def test_the_safe_cut_stays_consistent_and_never_moves_back(events):
    """Whatever checkpoints complete (with whatever holders), copies, restores and deaths: every channel's
    upstream output at its safe checkpoint is at most the downstream's position at its own, and
    no instance's safe checkpoint moves back."""
    m = ReplicationManager(dict(CHAIN_PLACEMENT), 4, channels=list(CHAIN))
    insts = [(0, 0), (1, 0), (2, 0)]
    ids = {inst: 0 for inst in insts}
    seqs = {ch: [0, 0] for ch, _, _ in CHAIN}  # per channel: upstream output seq, downstream position
    seen: dict = {}
    for event in events:
        kind = event[0]
        if kind == "complete":
            _, i, holders, out_step, in_step = event
            inst = insts[i]
            ids[inst] += 1
            outputs, positions = {}, {}
            for ch, up, down in CHAIN:
                if up == inst:
                    seqs[ch][0] += out_step
                    outputs[ch] = seqs[ch][0]
                if down == inst:
                    seqs[ch][1] = min(seqs[ch][0], seqs[ch][1] + in_step)
                    positions[ch] = seqs[ch][1]
            m.checkpoint_completed(inst, ids[inst], positions, holders=holders, outputs=outputs)
        elif kind == "copy":
            _, i, w = event
            cp = m.restore_point(insts[i])
            if cp is not None:
                m.checkpoint_copied(insts[i], cp.checkpoint_id, w)
        elif kind == "restore":  # a replica restored from the restore point pins it
            _, i, r = event
            cp = m.restore_point(insts[i])
            if cp is not None:
                m.restoring((*insts[i], r), cp)
        elif kind == "taken":  # ... until it takes a checkpoint at or past the safe one
            _, i, r = event
            m.checkpoint_taken((*insts[i], r), ids[insts[i]])
        elif kind == "dead":
            m.worker_dead(event[1])
        else:
            m.worker_alive(event[1])
        for ch, up, down in CHAIN:
            if up in m.safe:
                cut = m.restore_point(down)
                assert cut is not None and m.safe[up].outputs.get(ch, 0) <= cut.positions.get(ch, 0)
        for inst, cp in m.safe.items():
            assert cp.checkpoint_id >= seen.get(inst, -1)
            seen[inst] = cp.checkpoint_id
