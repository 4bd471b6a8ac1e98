"""The exactly-once outputs' writers as the worker's control-plane service.

Every exactly-once output of a hosted replica (its sink, its dead letters) reports how far it
committed, whether a newer producer fenced it and whether its writer is past what the output held
when it took over (:class:`OutputProgress`); the driver names the writer of each, with its epoch
(:class:`WriterRoles`), which the replicas take when it changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replication.heartbeat_parts import OUTPUTS, OutputKey, OutputProgress, WriterRoles


class OutputWriters:
    """The writer roles of the hosted replicas' outputs, and what those outputs committed."""

    name = OUTPUTS

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # its hosted replicas

    def committed(self) -> dict[OutputKey, tuple[int, int]]:
        """What each exactly-once output (sink, dead letters) of the hosted replicas committed."""
        return _committed(list(self.worker.instances.items()))

    def report(self) -> OutputProgress | None:
        hosted = list(self.worker.instances.items())  # (one snapshot for both: restores add replicas)
        fenced = {(t, p, inst.replica, w.kind): w.fenced_at for (t, p), inst in hosted
                  for w in inst.writers if w.fenced_at >= 0}
        committed = _committed(hosted)
        regenerated = frozenset((t, p, w.kind) for (t, p), inst in hosted for w in inst.writers if w.regenerated)
        return OutputProgress(committed, fenced, regenerated) if committed or fenced else None

    def settle(self, part: OutputProgress, delivered: bool) -> None:
        """(Each report says everything: a lost one is made good by the next.)"""

    def apply(self, part: WriterRoles) -> None:
        for inst in self.worker.hosted():
            give_roles(part.roles, inst)


def _committed(hosted: list[tuple[tuple[int, int], Any]]) -> dict[OutputKey, tuple[int, int]]:
    return {(t, p, w.kind): w.committed for (t, p), inst in hosted for w in inst.writers}


def give_roles(roles: Mapping[OutputKey, tuple[int, int, int, int]], inst: Any) -> None:
    """The writer roles of ``inst``'s exactly-once outputs (sinks, dead letters), by kind; the
    instance is woken only when they changed (every heartbeat reply repeats them)."""
    mine = {w.kind: roles[key] for w in inst.writers
            if (key := (inst.task.id, inst.partition, w.kind)) in roles}
    if mine and mine != inst.roles_given:
        inst.roles_given = mine
        inst.pending_control = mine
        inst.wake()
