"""Who writes each exactly-once output, at which epoch, and how far it committed (the driver's
table; caller holds the job master's lock).

An output is a sink partition (kind ``"out"``) or, in a replicated or checkpointed job, every
partition's dead letters (``"dlq"``): written once, by one replica, fenced like a sink. A role
passes to the twin when its writer is lost, to a restored replica when both were, and back to
a writer a late takeover fenced; each change raises the epoch, so the new writer's producer
fences the old one and scans the output for what it committed.  In a resumed run the table also
says which outputs are not yet written past what the run before wrote (:attr:`OutputRoles.regenerating`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from replication.heartbeat_parts import OUTPUTS, OutputKey, OutputProgress, WriterRoles
from replication.plan import PhysicalPlan
from transport.ids import ReplicaId

if TYPE_CHECKING:
    from replication.control.master import JobMaster


class OutputRoles:
    """The writer role of every exactly-once output: ``roles[key] = [writer replica, epoch,
    committed seq, committed offset]``. Methods that change a role return the events to log."""

    def __init__(self, plan: PhysicalPlan, exactly_once: bool, label: Callable[[int, int, int], str]) -> None:
        self._label = label
        self.roles: dict[OutputKey, list[int]] = {
            (t.id, p, "out"): [0, 0, -1, -1] for t in plan.tasks if any(n.kind == "sink" for n in t.chain)
            for p in range(t.parallelism)}
        if exactly_once:
            self.roles.update({(t.id, p, "dlq"): [0, 0, -1, -1] for t in plan.tasks for p in range(t.parallelism)})
        # a resumed run: the outputs whose writer has not yet produced every seq the run before wrote
        self.regenerating: set[OutputKey] = set()

    def resume(self, committed: Mapping[str, list[int]]) -> None:
        """A resumed run: the first writer of every output takes over from the run before (epoch 1
        scans what that run wrote, from the offset the cut knew committed on)."""
        for (t, p, kind), role in self.roles.items():
            seq, offset = committed.get(f"{t}-{p}-{kind}", (-1, -1))
            self.roles[(t, p, kind)] = [role[0], 1, seq, offset]
        self.regenerating = set(self.roles)

    def label(self, t: int, p: int, r: int, kind: str) -> str:
        """An output of a replica, for the events: its sink or its dead letters."""
        return f"{'sink' if kind == 'out' else 'dead letters of'} {self._label(t, p, r)}"

    def to_twin(self, replica: ReplicaId) -> list[str]:
        """``replica`` is lost, its twin is not: the twin takes over what it wrote."""
        t, p, r = replica
        events = []
        for kind in ("out", "dlq"):
            role = self.roles.get((t, p, kind))
            if role is not None and role[0] == r:
                role[0], role[1] = 1 - r, role[1] + 1
                events.append(f"{self.label(t, p, 1 - r, kind)} takes over writing (epoch {role[1]})")
        return events

    def to_restored(self, replica: ReplicaId, lost: Collection[ReplicaId]) -> list[str]:
        """An output whose writer is lost (its twin too, or it was lost before its restore finished,
        or it is the one being restored): ``replica``, being restored, writes, with a higher epoch,
        so it first scans the output for what the lost writer committed."""
        t, p, r = replica
        events = []
        for kind in ("out", "dlq"):
            role = self.roles.get((t, p, kind))
            if role is not None and (t, p, role[0]) in lost:
                role[0], role[1] = r, role[1] + 1
                events.append(f"{self.label(t, p, r, kind)} writes once restored (epoch {role[1]})")
        return events

    def fenced(self, replica: ReplicaId, kind: str, epoch: int, lost: Collection[ReplicaId]) -> str | None:
        """The writer of an output says a newer producer fenced it at ``epoch`` (a superseded
        takeover that fenced late, a fatal producer error). Still the writer at that epoch: it is
        named again with a higher one, so it fences that producer and takes over (the event
        returned); else it was rightly fenced and nothing changes (None)."""
        t, p, r = replica
        role = self.roles.get((t, p, kind))
        if role is None or role[0] != r or role[1] != epoch or replica in lost:
            return None
        role[1] += 1
        return (f"{self.label(t, p, r, kind)} was fenced as writer at epoch {epoch}: it takes over again "
                f"(epoch {role[1]})")

    def progress(self, committed: Mapping[OutputKey, tuple[int, int]]) -> None:
        """What the writers report committed: (seq, offset) per output, never going back."""
        for key, (seq, offset) in committed.items():
            role = self.roles.get(key)
            if role is not None:
                role[2], role[3] = max(role[2], seq), max(role[3], offset)

    def regenerated(self, keys: Collection[OutputKey]) -> bool:
        """The writers of ``keys`` produced past what their outputs held when they took over;
        True if that leaves no output regenerating."""
        if not self.regenerating or not keys:
            return False
        self.regenerating.difference_update(keys)
        return not self.regenerating

    def labels(self, keys: Collection[OutputKey]) -> list[str]:
        """Outputs by name (sink ``chain-sink[0]``, ``dead letters of union-2[1]``), for messages."""
        return [self.label(t, p, self.roles[(t, p, kind)][0], kind) for t, p, kind in sorted(keys)]

    def view(self) -> dict[OutputKey, tuple[int, int, int, int]]:
        """The roles as the workers get them in their instructions."""
        return {key: tuple(role) for key, role in self.roles.items()}  # type: ignore[misc]


class OutputService:
    """The writer roles as the driver's control-plane service: the writers' progress and fenced
    writers in, the roles out."""

    name = OUTPUTS

    def __init__(self, master: JobMaster) -> None:
        self.master = master

    def on_report(self, worker: int, part: OutputProgress | None) -> None:
        if part is None:
            return
        m = self.master
        m.outputs.progress(part.committed)
        if m.outputs.regenerated(part.regenerated):
            m.wake()  # (a KaZoo handover of a resumed run waits for it)
        for (t, p, r, kind), epoch in part.fenced.items():
            text = m.outputs.fenced((t, p, r), kind, epoch, m.lost)
            if text is not None:
                m.event(text)
                m.ring_workers()

    def reply(self) -> WriterRoles | None:
        roles = self.master.outputs.view()
        return WriterRoles(roles) if roles else None
