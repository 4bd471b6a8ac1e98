"""Where a lost replica is restored and from what, and which checkpoint copies keep a partition
restorable (Rhino, DESIGN §6; pure, like :mod:`rhino_state.manager`, of which it is a part).

A free holder of the partition's restore point runs the lost replica (hard links); else the least
loaded free worker pulls the checkpoint from a holder, or builds it from the durable store when
only that holds it.  A partition whose restore point only one worker holds, or only workers
running its replicas, would not survive the next loss: a member of its group pulls a copy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from transport.ids import PartitionId, ReplicaId


@dataclass(frozen=True)
class CompletedCheckpoint:
    """What the driver keeps of an instance's latest completed checkpoint."""

    checkpoint_id: int
    positions: Mapping[int, int]  # input channel -> next seq the checkpoint still needs
    holders: frozenset[int]  # workers that hold it (the group it was shipped along, and its shipper's)
    digest: str = ""
    completed_at: float = 0.0  # when the driver learned of it (wall clock)
    outputs: Mapping[int, int] = field(default_factory=dict)  # output channel -> next seq at the checkpoint
    # the file of its increment in the durable store, when it is a checkpoint of the cut a run
    # resumed from: any free worker can build it from there, whichever workers die
    durable_file: str = ""
    # KaZoo: where a restore from it reads the partition's order log on (None: not known, e.g. the
    # cut of an earlier build): the driver keeps the log from there while it keeps the checkpoint
    order_from: int | None = None


@dataclass(frozen=True)
class RestorePlan:
    """Restore a lost replica on ``host`` from ``checkpoint``, which ``host`` holds, or (``source``
    not None) pulls from the holder ``source``.  ``rollback``: no live replica of its instance is
    left, so its downstreams may need output from before ``checkpoint`` again."""

    host: int
    checkpoint: CompletedCheckpoint
    rollback: bool
    source: int | None = None
    durable: bool = False  # no live worker holds it: ``host`` builds it from the durable store


class RestorePlanning:
    """The restore side of :class:`~rhino_state.manager.ReplicationManager` (a mixin: its
    placement, groups and completed checkpoints)."""

    placement: dict[ReplicaId, int]
    num_workers: int
    dead: set[int]
    lost: set[ReplicaId]
    groups: dict[PartitionId, list[int]]
    completed: dict[PartitionId, CompletedCheckpoint]
    history: dict[PartitionId, list[CompletedCheckpoint]]
    safe: dict[PartitionId, CompletedCheckpoint]
    pinned: dict[PartitionId, CompletedCheckpoint]
    pinned_by: dict[PartitionId, int]
    _gone: set[int]
    replica_workers: Any  # (instance): the workers running its live replicas
    restore_point: Any  # (instance): its checkpoint a restore starts from
    checkpoint: Any  # (instance, id): that completed checkpoint, if kept
    instances: Any  # (): every partition instance
    _load: Any  # (worker): the replicas and groups it carries
    _held_apart: Any  # (instance, checkpoint): held by a worker running no replica of it
    _unpin: Any  # (instance): its rollback pin goes
    _regroup: Any  # (instances): their groups chosen again

    def restore_plan(self, replica: ReplicaId, avoid: Collection[int] = ()) -> RestorePlan | None:
        """Where and from what to restore ``replica``, or None if no live worker holds the
        checkpoint needed or none is free to run it (free: live, running no replica of its
        instance, not in ``avoid``, e.g. drained or not registered yet).

        A free holder first (the restore is hard links); else the least loaded free worker,
        which pulls the checkpoint from a live holder (``source``) that runs a replica itself.

        Always the safe checkpoint (or the one a restore in progress replays from), even with a
        live twin: a replica restored from the latest one could not give a downstream that is
        rolled back later the output before that checkpoint, and its twin may die before it is
        delivered.  (Nor a downstream replica that lags behind that output, e.g. one restored a
        little earlier still catching up: it would wait for a gap nobody can fill.)"""
        inst = replica[:2]
        busy = self.replica_workers(inst)
        cp = self.restore_point(inst)
        if cp is None:
            return None
        held = [w for w in self.groups.get(inst, []) if w in cp.holders] + sorted(cp.holders)
        gone = self._gone
        held = [w for w in dict.fromkeys(held) if w not in gone]
        if not held and not cp.durable_file:
            return None
        rollback = not busy
        host = next((w for w in held if w not in busy and w not in avoid), None)
        if host is not None:
            return RestorePlan(host, cp, rollback)
        free = [w for w in range(self.num_workers) if w not in gone and w not in busy and w not in avoid]
        if not free:
            return None
        if not held:  # only the durable store has it: built there from the cut's chain
            return RestorePlan(min(free, key=self._load), cp, rollback, durable=True)
        return RestorePlan(min(free, key=self._load), cp, rollback, source=held[0])

    def survives_a_loss(self, inst: PartitionId, avoid: Collection[int] = ()) -> bool:
        """Whether ``inst`` stays restorable if any one worker running a live replica of it dies
        now: a live holder of its restore point other than that worker, and a worker free to run
        the lost replica (a holder that runs a replica is only a source: losing it loses the
        replica and that copy at once)."""
        cp = self.restore_point(inst)
        if cp is None or not self._held_apart(inst, cp):
            return False
        busy = self.replica_workers(inst)
        gone = self._gone
        live = [w for w in range(self.num_workers) if w not in gone and w not in avoid]
        return all([x for x in live if x != w and x not in busy] for w in busy or {-1})

    def copies_wanted(self, avoid: Collection[int] = ()) -> list[tuple[PartitionId, CompletedCheckpoint, int, int]]:
        """``(instance, checkpoint, member, source)``: instances that would not survive a loss
        (``survives_a_loss``) but would if a member of their group that does not hold their restore
        point pulled it from a live holder (``source``; one that runs no replica first).  E.g. a
        replica restored on the only holder of its checkpoint: until the safe cut reaches a
        checkpoint the group's new member holds, losing that worker loses the copy too."""
        wanted = []
        for inst in self.instances():
            cp = self.restore_point(inst)
            if cp is None or self.survives_a_loss(inst, avoid):
                continue
            gone = self._gone
            holders = cp.holders - gone
            busy = self.replica_workers(inst)
            member = next((w for w in self.groups.get(inst, []) if w not in holders and w not in gone
                           and w not in busy and w not in avoid), None)
            if holders and member is not None:
                wanted.append((inst, cp, member, min(holders, key=lambda w: (w in busy, w))))
        return wanted

    def checkpoint_copied(self, inst: PartitionId, checkpoint_id: int, w: int) -> bool:
        """``w`` holds checkpoint ``checkpoint_id`` of ``inst`` now (it pulled it); False if that
        checkpoint is no longer kept or ``w`` died meanwhile."""
        if w in self.dead or self.checkpoint(inst, checkpoint_id) is None:
            return False

        def with_w(cp: CompletedCheckpoint) -> CompletedCheckpoint:
            return replace(cp, holders=cp.holders | {w}) if cp.checkpoint_id == checkpoint_id else cp

        self.history[inst] = [with_w(cp) for cp in self.history[inst]]
        for table in (self.completed, self.safe, self.pinned):
            if inst in table:
                table[inst] = with_w(table[inst])
        return True

    def restore_failed(self, replica: ReplicaId) -> None:
        """The restore of ``replica`` failed, or the restored replica was lost before it caught
        up: its pin goes (a retry pins again)."""
        inst = replica[:2]
        if self.pinned_by.get(inst) == replica[2]:
            self._unpin(inst)

    def restoring(self, replica: ReplicaId, cp: CompletedCheckpoint) -> None:
        """``replica`` is restored from ``cp``: until it takes a checkpoint at or past the safe
        one, upstream backups and snapshots of its instance are kept from ``cp`` on (the safe cut
        may move past it meanwhile)."""
        self.pinned[replica[:2]] = cp
        self.pinned_by[replica[:2]] = replica[2]

    def replica_moved(self, replica: ReplicaId, w: int) -> dict[PartitionId, list[int]]:
        """``replica`` runs on ``w`` now (restored there): its group must not contain ``w``."""
        self.placement[replica] = w
        self.lost.discard(replica)
        return self._regroup([replica[:2]])
