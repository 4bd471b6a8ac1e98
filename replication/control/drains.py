"""Drains without pulses (unordered, KaZoo) as the driver's service: where every source ends.

Drained, each source replica stops reading and reports where (:class:`DrainPositions`); once
every live replica of a source partition has, the driver tells all of them to read on to the
furthest of those positions (:class:`DrainEnds`), so both replicas end with the same records.
Caller holds the job master's lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replication.heartbeat_parts import DRAINS, DrainEnds, DrainPositions
from transport.ids import PartitionId, ReplicaId

if TYPE_CHECKING:
    from replication.control.master import JobMaster


class Drains:
    """Where each source replica stopped reading (``positions``) and where every replica of each
    source partition ends (``ends``, once settled)."""

    name = DRAINS

    def __init__(self, master: JobMaster) -> None:
        self.master = master
        self.positions: dict[ReplicaId, dict[int, int]] = {}
        self.ends: dict[PartitionId, dict[int, int]] = {}

    def on_report(self, worker: int, part: DrainPositions | None) -> None:
        if part is not None and part.replicas:
            self.positions.update(part.replicas)
            self.settle()

    def reply(self) -> DrainEnds | None:
        return DrainEnds(dict(self.ends)) if self.ends else None

    def settle(self) -> None:
        """Where each source partition's replicas end: once every live replica reported where it
        stopped, the furthest of them (the others read on to it).  Called again when replicas are
        lost: one that had not reported is gone, and the others decide."""
        if not self.positions:
            return
        m = self.master
        for t in m.plan.tasks:
            if not t.is_source:
                continue
            for p in range(t.parallelism):
                if (t.id, p) in self.ends:
                    continue
                live = [(t.id, p, r) for r in range(m.plan.replicas)
                        if (t.id, p, r) not in m.lost and m.placement[(t.id, p, r)] not in m.dead]
                if not live or any(rep not in self.positions for rep in live):
                    continue
                reported = [self.positions[rep] for rep in live]
                self.ends[(t.id, p)] = {k: max(pos.get(k, -1) for pos in reported)
                                        for k in sorted({k for pos in reported for k in pos})}
