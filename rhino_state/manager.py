"""The replication manager (driver side, pure): replica groups, completed checkpoints, and where a
lost replica is restored (Rhino, DESIGN §6).

Each partition instance gets a *replica group*: ``size`` live workers other than those running its
live replicas, in chain order.  A checkpoint completes when the chain's tail acknowledged it; the
manager then knows the checkpoint is held by every member of the group it was shipped to.  When a
replica is lost, it is restored on a member holding the latest completed checkpoint (a local
restore: hard links, no bulk transfer); that member then runs the replica, so the group gets a new
member in its place, which needs a full snapshot first.

No I/O, no threads: the driver feeds it events and acts on what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["CompletedCheckpoint", "ReplicationManager"]

Instance = tuple[int, int]  # (task, partition)
ReplicaId = tuple[int, int, int]  # (task, partition, replica)


@dataclass(frozen=True)
class CompletedCheckpoint:
    """What the driver keeps of an instance's latest completed checkpoint."""

    checkpoint_id: int
    positions: Mapping[int, int]  # input channel -> next seq the checkpoint still needs
    holders: frozenset[int]  # workers that hold it (the group it was shipped along)
    digest: str = ""
    completed_at: float = 0.0  # when the driver learned of it (wall clock)


@dataclass
class ReplicationManager:
    """Replica groups and checkpoint registry of one job run."""

    placement: dict[ReplicaId, int]
    num_workers: int
    size: int = 1
    dead: set[int] = field(default_factory=set)
    lost: set[ReplicaId] = field(default_factory=set)  # replicas of dead workers, not restored yet
    groups: dict[Instance, list[int]] = field(default_factory=dict)
    completed: dict[Instance, CompletedCheckpoint] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for inst in self.instances():
            self.groups[inst] = self._choose(inst, [])

    def instances(self) -> list[Instance]:
        return sorted({(t, p) for t, p, _ in self.placement})

    def replica_workers(self, inst: Instance) -> set[int]:
        """Workers running a live replica of ``inst`` (a lost one still points at its relaunched worker)."""
        return {w for (t, p, r), w in self.placement.items()
                if (t, p) == inst and w not in self.dead and (t, p, r) not in self.lost}

    def _choose(self, inst: Instance, keep: Iterable[int]) -> list[int]:
        """``keep`` (in order, still eligible) plus new members up to ``size``, deterministically:
        the workers after the instance's first replica, round robin."""
        busy = self.replica_workers(inst)
        group = [w for w in keep if w not in busy and w not in self.dead]
        first = min(w for (t, p, _), w in self.placement.items() if (t, p) == inst)
        for j in range(1, self.num_workers + 1):
            if len(group) >= self.size:
                break
            w = (first + j) % self.num_workers
            if w not in busy and w not in self.dead and w not in group:
                group.append(w)
        return group

    def _regroup(self, insts: Iterable[Instance]) -> dict[Instance, list[int]]:
        changed = {}
        for inst in insts:
            group = self._choose(inst, self.groups.get(inst, []))
            if group != self.groups.get(inst):
                self.groups[inst] = group
                changed[inst] = group
        return changed

    # -- events ------------------------------------------------------------------------------
    def checkpoint_completed(self, inst: Instance, checkpoint_id: int, positions: Mapping[int, int],
                             digest: str = "", now: float = 0.0, holders: Iterable[int] | None = None) -> bool:
        """The chain's tail acknowledged ``checkpoint_id`` of ``inst``; ``holders``: the members of
        the chain it went along (default: the current group).  False if it is not newer."""
        known = self.completed.get(inst)
        if known is not None and checkpoint_id <= known.checkpoint_id:
            return False
        held = frozenset(self.groups.get(inst, ()) if holders is None else holders) - self.dead
        self.completed[inst] = CompletedCheckpoint(checkpoint_id, dict(positions), held, digest, now)
        return True

    def worker_dead(self, w: int) -> tuple[list[ReplicaId], dict[Instance, list[int]]]:
        """``w`` is gone: its replicas (to restore) and the groups that changed (they need a full
        snapshot from their origin next)."""
        self.dead.add(w)
        lost = sorted(r for r, ww in self.placement.items() if ww == w)
        self.lost.update(lost)
        for inst, cp in list(self.completed.items()):
            if w in cp.holders:
                self.completed[inst] = CompletedCheckpoint(cp.checkpoint_id, cp.positions, cp.holders - {w},
                                                           cp.digest, cp.completed_at)
        return lost, self._regroup(self.instances())

    def worker_alive(self, w: int) -> dict[Instance, list[int]]:
        """``w`` (a relaunched worker) can hold checkpoints again: groups short of members take it."""
        self.dead.discard(w)
        return self._regroup(inst for inst, g in self.groups.items() if len(g) < self.size)

    def restore_host(self, replica: ReplicaId) -> int | None:
        """The live worker to restore ``replica`` on: a holder of the latest completed checkpoint
        of its instance that runs no replica of it; None if there is none."""
        inst = replica[:2]
        cp = self.completed.get(inst)
        if cp is None:
            return None
        busy = self.replica_workers(inst)
        order = [w for w in self.groups.get(inst, []) if w in cp.holders] + sorted(cp.holders)
        return next((w for w in order if w not in self.dead and w not in busy), None)

    def replica_moved(self, replica: ReplicaId, w: int) -> dict[Instance, list[int]]:
        """``replica`` runs on ``w`` now (restored there): its group must not contain ``w``."""
        self.placement[replica] = w
        self.lost.discard(replica)
        return self._regroup([replica[:2]])
