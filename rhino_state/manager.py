"""The replication manager (driver side, pure): replica groups, completed checkpoints, and where a
lost replica is restored (Rhino, DESIGN §6).

Each partition instance gets a *replica group*: ``size`` live workers other than those running its
live replicas, in chain order.  A checkpoint completes when the chain's tail acknowledged it; the
manager then knows the checkpoint is held by every member of the group it was shipped to.  When a
replica is lost, it is restored on a member holding the latest completed checkpoint (a local
restore: hard links, no bulk transfer); that member then runs the replica, so the group gets a new
member in its place, which needs a full snapshot first.  The worker of the replica that ships
the checkpoints holds them too.  If every live holder runs a replica of the instance itself,
another worker restores it from a checkpoint it pulls from a holder.  A run that resumed from a
durable cut starts with the cut's checkpoints as its completed ones (``durable_file``): until its
own checkpoints complete, a free worker restores a lost replica by building it from the store.

**Rollback.** When *every* replica of an instance is lost (or its twin dies before a restored
replica delivered what it should), restoring it from its latest checkpoint is not enough: what
it had produced before that checkpoint but not yet delivered died with it, and a downstream that
lost its replicas too may need still older output.  So the manager
keeps each instance's completed checkpoints from its *safe* one on, where the safe checkpoints of
all instances form a consistent cut: for every channel, the upstream's output seq at its safe
checkpoint is at most the downstream's input position at its own.  Sinks (no downstream) are safe
at their latest; an upstream is safe at its newest checkpoint that its downstreams' safe ones
cover.  Upstream backups are trimmed to the safe positions (not the latest), and replica-group
members keep every snapshot from the safe one on, so any set of instances can be rolled back to
the cut and replayed: the restored ones regenerate, deterministically, everything their
downstreams lack, and their upstreams' backups reach back to their positions.

No I/O, no threads: the driver feeds it events and acts on what it returns.  Where and from what a
lost replica is restored, and which checkpoint copies keep a partition restorable, is
:mod:`rhino_state.restore_planning`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from rhino_state.restore_planning import CompletedCheckpoint, RestorePlan, RestorePlanning
from transport.ids import PartitionId, ReplicaId

__all__ = ["CompletedCheckpoint", "ReplicationManager", "RestorePlan"]


Channel = tuple[int, PartitionId, PartitionId]  # (channel id, upstream instance, downstream instance)


@dataclass
class ReplicationManager(RestorePlanning):
    """Replica groups and checkpoint registry of one job run."""

    placement: dict[ReplicaId, int]
    num_workers: int
    size: int = 1
    dead: set[int] = field(default_factory=set)
    lost: set[ReplicaId] = field(default_factory=set)  # replicas of dead workers, not restored yet
    # workers whose process ended normally (the job is ending): they neither run a restored replica
    # nor serve a checkpoint copy any more, but their groups stay as they are
    ended: set[int] = field(default_factory=set)
    groups: dict[PartitionId, list[int]] = field(default_factory=dict)
    completed: dict[PartitionId, CompletedCheckpoint] = field(default_factory=dict)  # the latest
    channels: list[Channel] = field(default_factory=list)  # the job graph, for the consistent cut
    # completed checkpoints from the safe one on (ascending), the safe ones, and rollbacks in progress
    history: dict[PartitionId, list[CompletedCheckpoint]] = field(default_factory=dict)
    safe: dict[PartitionId, CompletedCheckpoint] = field(default_factory=dict)
    pinned: dict[PartitionId, CompletedCheckpoint] = field(default_factory=dict)
    pinned_by: dict[PartitionId, int] = field(default_factory=dict)  # the replica restored from it
    _downstream: dict[PartitionId, list[tuple[int, PartitionId]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for inst in self.instances():
            self.groups[inst] = self._choose(inst, [])
        for ch, up, down in self.channels:
            self._downstream.setdefault(up, []).append((ch, down))

    def instances(self) -> list[PartitionId]:
        return sorted({(t, p) for t, p, _ in self.placement})

    def replica_workers(self, inst: PartitionId) -> set[int]:
        """Workers running a live replica of ``inst`` (a lost one still points at its relaunched worker)."""
        return {w for (t, p, r), w in self.placement.items()
                if (t, p) == inst and w not in self.dead and (t, p, r) not in self.lost}

    def _load(self, w: int) -> int:
        """What ``w`` carries: the live replicas it runs and the replica groups it is a member of."""
        replicas = sum(1 for r, ww in self.placement.items() if ww == w and r not in self.lost)
        return replicas + sum(1 for g in self.groups.values() if w in g)

    def _choose(self, inst: PartitionId, keep: Iterable[int]) -> list[int]:
        """``keep`` (in order, still eligible) plus new members up to ``size``, deterministically:
        the least loaded eligible workers, ties broken round robin after the instance's first replica
        (so restores, which go to group members, spread instead of piling on one worker)."""
        busy = self.replica_workers(inst)
        group = [w for w in keep if w not in busy and w not in self.dead]
        first = min(w for (t, p, _), w in self.placement.items() if (t, p) == inst)
        ring = [(first + j) % self.num_workers for j in range(1, self.num_workers + 1)]
        free = [w for w in ring if w not in busy and w not in self.dead and w not in group]
        free.sort(key=self._load)  # stable: ties keep the ring order
        return group + free[:max(0, self.size - len(group))]

    def _regroup(self, insts: Iterable[PartitionId]) -> dict[PartitionId, list[int]]:
        changed = {}
        for inst in insts:
            group = self._choose(inst, self.groups.get(inst, []))
            if group != self.groups.get(inst):
                self.groups[inst] = group
                changed[inst] = group
        return changed

    # -- events ------------------------------------------------------------------------------
    def checkpoint_completed(self, inst: PartitionId, checkpoint_id: int, positions: Mapping[int, int],
                             digest: str = "", now: float = 0.0, holders: Iterable[int] | None = None,
                             outputs: Mapping[int, int] | None = None, durable_file: str = "",
                             order_from: int | None = None) -> bool:
        """The chain's tail acknowledged ``checkpoint_id`` of ``inst``; ``holders``: the members of
        the chain it went along (default: the current group).  ``durable_file``: it is the
        checkpoint of the durable cut a run resumed from (no worker needs to hold it).
        ``order_from``: where a restore from it reads the order log on.  False if it is not newer."""
        known = self.completed.get(inst)
        if known is not None and checkpoint_id <= known.checkpoint_id:
            return False
        held = frozenset(self.groups.get(inst, ()) if holders is None else holders) - self.dead
        cp = CompletedCheckpoint(checkpoint_id, dict(positions), held, digest, now, dict(outputs or {}), durable_file,
                                 order_from)
        self.completed[inst] = cp
        self.history.setdefault(inst, []).append(cp)
        self._recompute_safe()
        return True

    def checkpoint_taken(self, replica: ReplicaId, checkpoint_id: int) -> None:
        """``replica`` took ``checkpoint_id``: a replica restored from a pinned checkpoint that is
        now at or past the safe one needs nothing older any more (unpinned)."""
        inst = replica[:2]
        pinned = self.pinned.get(inst)
        if pinned is None or self.pinned_by.get(inst) != replica[2] or checkpoint_id <= pinned.checkpoint_id:
            return
        safe = self.safe.get(inst)
        if safe is None or checkpoint_id >= safe.checkpoint_id:
            self._unpin(inst)

    def _unpin(self, inst: PartitionId) -> None:
        del self.pinned[inst], self.pinned_by[inst]
        self._recompute_safe()

    def checkpoint(self, inst: PartitionId, checkpoint_id: int) -> CompletedCheckpoint | None:
        """The completed checkpoint ``checkpoint_id`` of ``inst`` if it is still kept."""
        return next((cp for cp in self.history.get(inst, ()) if cp.checkpoint_id == checkpoint_id), None)

    def _recompute_safe(self) -> None:
        """The consistent cut (see the module docstring), downstream first; the history before
        each instance's safe checkpoint (or pinned one, while a rollback replays from it) goes."""
        safe: dict[PartitionId, CompletedCheckpoint | None] = {}

        def resolve(inst: PartitionId, visiting: frozenset[PartitionId]) -> CompletedCheckpoint | None:
            if inst in safe:
                return safe[inst]
            if inst in visiting:
                raise ValueError(f"the job graph has a cycle through {inst}")
            limits: dict[int, int] = {}
            for ch, down in self._downstream.get(inst, ()):
                # a rollback in progress replays the downstream from its pinned checkpoint
                cut = self.pinned.get(down) or resolve(down, visiting | {inst})
                if cut is None:
                    safe[inst] = None  # a downstream with no safe checkpoint: nothing is safe above it
                    return None
                limits[ch] = cut.positions.get(ch, 0)
            covered = [cp for cp in self.history.get(inst, ())
                       if all(cp.outputs.get(ch, 0) <= limit for ch, limit in limits.items())]
            safe[inst] = self._best_held(inst, covered)
            return safe[inst]

        for inst in self.instances():
            cut = resolve(inst, frozenset())
            if cut is None:
                self.safe.pop(inst, None)
                continue
            self.safe[inst] = cut
            oldest = min(cut.checkpoint_id, self.restore_point(inst).checkpoint_id)
            self.history[inst] = [cp for cp in self.history.get(inst, ()) if cp.checkpoint_id >= oldest]

    def _best_held(self, inst: PartitionId, covered: list[CompletedCheckpoint]) -> CompletedCheckpoint | None:
        """The safe checkpoint of ``inst`` among those the cut covers (ascending): the newest
        that stays held if a worker running a replica dies, from the current safe one on (the
        cut never moves back); else the newest.  The cut does not move from a checkpoint a copy
        made well held to a newer one only a worker running a replica holds."""
        if not covered:
            return None
        current = self.safe.get(inst)
        floor = -1
        if current is not None and any(cp.checkpoint_id == current.checkpoint_id for cp in covered):
            floor = current.checkpoint_id
        return next((cp for cp in reversed(covered) if cp.checkpoint_id >= floor and self._held_apart(inst, cp)),
                    covered[-1])

    def _held_apart(self, inst: PartitionId, cp: CompletedCheckpoint) -> bool:
        """Whether a live worker holds ``cp`` apart from each worker running a replica of ``inst``
        (or the durable store does)."""
        holders = cp.holders - self.dead
        return bool(cp.durable_file) or all(holders - {w} for w in self.replica_workers(inst) or {-1})

    def restore_point(self, inst: PartitionId) -> CompletedCheckpoint | None:
        """What a restore of ``inst`` starts from: the checkpoint a restore in progress is pinned
        to, else the safe one (None: there is none yet)."""
        return self.pinned.get(inst) or self.safe.get(inst)

    def trim_positions(self, inst: PartitionId) -> Mapping[int, int] | None:
        """Where the upstreams of ``inst`` may trim their backups to: the positions of its restore
        point (None: keep everything)."""
        cut = self.restore_point(inst)
        return None if cut is None else cut.positions

    def kept(self, inst: PartitionId) -> list[CompletedCheckpoint]:
        """Every checkpoint of ``inst`` a restore may still start from: its history, the latest
        completed one, the safe one and one a rollback is pinned to."""
        found = [*self.history.get(inst, ()),
                 *(cp for table in (self.completed, self.safe, self.pinned) if (cp := table.get(inst)) is not None)]
        return list({cp.checkpoint_id: cp for cp in found}.values())

    def retain_from(self, inst: PartitionId) -> int | None:
        """The oldest checkpoint id of ``inst`` group members must keep a snapshot of."""
        kept = self.history.get(inst)
        return kept[0].checkpoint_id if kept else None

    def worker_dead(self, w: int) -> tuple[list[ReplicaId], dict[PartitionId, list[int]]]:
        """``w`` is gone: its replicas (to restore) and the groups that changed (they need a full
        snapshot from their origin next)."""
        self.dead.add(w)
        lost = sorted(r for r, ww in self.placement.items() if ww == w)
        self.lost.update(lost)
        for replica in lost:
            self.restore_failed(replica)

        def without(cp: CompletedCheckpoint) -> CompletedCheckpoint:
            return replace(cp, holders=cp.holders - {w}) if w in cp.holders else cp

        for inst in list(self.completed):
            self.completed[inst] = without(self.completed[inst])
        for inst, kept in self.history.items():
            self.history[inst] = [without(cp) for cp in kept]
        for table in (self.safe, self.pinned):
            for inst in list(table):
                table[inst] = without(table[inst])
        return lost, self._regroup(self.instances())

    @property
    def _gone(self) -> set[int]:
        """Workers that neither run a restored replica nor serve a checkpoint: dead, or ended."""
        return self.dead | self.ended

    def worker_ended(self, w: int) -> None:
        """``w``'s process ended normally (it reported its end): no restore or copy goes to or
        comes from it."""
        self.ended.add(w)

    def replica_lost(self, replica: ReplicaId) -> dict[PartitionId, list[int]]:
        """``replica`` alone is lost (its worker lives on): it is to be restored; the groups that
        changed (its worker may hold its partition's checkpoints now)."""
        self.lost.add(replica)
        self.restore_failed(replica)
        return self._regroup([replica[:2]])

    def worker_alive(self, w: int) -> dict[PartitionId, list[int]]:
        """``w`` (a relaunched worker) can hold checkpoints again: groups short of members take it,
        then it takes memberships over from the busiest workers until the load is even (their
        next checkpoint goes to it in full; the old member keeps what it holds meanwhile)."""
        self.dead.discard(w)
        changed = self._regroup(inst for inst, g in self.groups.items() if len(g) < self.size)
        while (move := self._membership_to_take(w)) is not None:
            inst, old = move
            group = [w if m == old else m for m in self.groups[inst]]
            self.groups[inst] = changed[inst] = group
        return changed

    def _membership_to_take(self, w: int) -> tuple[PartitionId, int] | None:
        """A group membership that moving from its member to ``w`` evens the load, the busiest
        member's first (deterministic), or None."""
        best: tuple[int, PartitionId, int] | None = None
        loads = {m: self._load(m) for m in {w, *(m for g in self.groups.values() for m in g)}}
        for inst in sorted(self.groups):
            group = self.groups[inst]
            if w in group or w in self.replica_workers(inst):
                continue
            for member in group:
                if loads[member] - loads[w] >= 2 and (best is None or loads[member] > best[0]):
                    best = (loads[member], inst, member)
        return None if best is None else best[1:]
