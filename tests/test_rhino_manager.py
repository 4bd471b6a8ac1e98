"""The replication manager: replica groups, completed checkpoints, restore placement (pure)."""

from __future__ import annotations

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
    assert m.restore_host((0, 0, 0)) is None  # nothing completed yet
    assert m.checkpoint_completed((0, 0), 5, {0: 10})
    assert not m.checkpoint_completed((0, 0), 4, {0: 8})  # older: ignored
    lost, changed = m.worker_dead(0)
    assert (0, 0, 0) in lost and all(m.placement[r] == 0 for r in lost)
    assert m.restore_host((0, 0, 0)) == 2  # worker 2 holds (0, 0)'s checkpoint 5
    assert m.completed[(0, 0)].positions == {0: 10}
    regrouped = m.replica_moved((0, 0, 0), 2)
    assert m.groups[(0, 0)] == [] and regrouped == {(0, 0): []}  # workers 1 and 2 run it, 0 is dead
    # the relaunched worker joins the groups it left short (their next checkpoint is a full one)
    assert m.worker_alive(0) == {(0, 0): [0], (0, 1): [0]}


def test_a_dead_holder_cannot_be_restored_from():
    m = ReplicationManager(dict(PLACEMENT), 3)
    m.checkpoint_completed((0, 0), 1, {})
    holder = m.groups[(0, 0)][0]
    m.worker_dead(holder)
    assert m.completed[(0, 0)].holders == frozenset()
    m.worker_dead(0)
    assert m.restore_host((0, 0, 0)) is None


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
