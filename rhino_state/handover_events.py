"""Each handover step's state machine: the records the manager keeps, and the events that move
them (the participants' acks, replica failures, commit, abort, release).

Pure: :class:`StepEvents` is the part of :class:`~rhino_state.handover_manager.HandoverManager`
that decides from what it is fed; the driver's coordinator feeds it and sends what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from rhino_state.handover import Step, Strategy, is_int
from rhino_state.handover_messages import (
    BEFORE_COMMIT,
    STATE_ORDER,
    AckKind,
    AckOutcome,
    Cancel,
    CodeInstruction,
    Commit,
    HandoverAck,
    HandoverState,
    Instruction,
    JobState,
    Release,
)
from rhino_state.keys import RoutingTable
from transport.ids import PartitionId, ReplicaId


@dataclass
class HandoverJob:
    """An operation planned into steps, instructed one after the other."""

    job_id: int
    task: int
    kind: str  # "rescale" | "move" | "rebalance"
    strategy: Strategy
    steps: tuple[Step, ...]
    state: JobState = JobState.RUNNING
    next_index: int = 0
    handover_ids: list[int] = field(default_factory=list)
    reason: str = ""
    # aborted because a participant was already past the switch position when it heard of the
    # step (nothing of that step happened): the rest may be submitted again, at a later position
    late: bool = False
    stopped: bool = False  # ended between steps (stop_job): every step instructed completed

    @property
    def vnodes(self) -> frozenset[int]:
        """Every vnode the job moves."""
        return frozenset(v for s in self.steps for v in s.vnodes)


_VNODE_PHASES = (
    (HandoverState.SWITCHED, "upstream", AckKind.SWITCHED),
    (HandoverState.CUT, "origin", AckKind.CUT),
    (HandoverState.LOADED, "target", AckKind.LOADED),
    (HandoverState.COMPLETED, "downstream", AckKind.REWIRED),
)
_CODE_PHASES = ((HandoverState.COMPLETED, "instance", AckKind.SWITCHED),)


@dataclass
class HandoverRecord:
    """The manager's state of one instructed step or operator replacement."""

    handover_id: int
    kind: str  # "vnodes" | "code"
    task: int
    epoch: int
    instruction: Instruction | CodeInstruction
    participants: dict[str, frozenset[PartitionId]]
    job_id: int | None = None
    step: Step | None = None
    state: HandoverState = HandoverState.INSTRUCTED
    acks: dict[AckKind, dict[ReplicaId, int]] = field(default_factory=dict)  # kind -> replica -> attempt
    digests: dict[PartitionId, str] = field(default_factory=dict)
    phases_done: int = 0
    released: bool = False
    reason: str = ""

    @property
    def instances(self) -> frozenset[PartitionId]:
        """Every participant instance, all roles."""
        return frozenset().union(*self.participants.values())

    @property
    def phases(self) -> tuple[tuple[HandoverState, str, AckKind], ...]:
        return _VNODE_PHASES if self.kind == "vnodes" else _CODE_PHASES

    @property
    def size_bytes(self) -> int:
        return self.step.size_bytes if self.step is not None else 0


class StepEvents:
    """How the steps of a :class:`~rhino_state.handover_manager.HandoverManager` commit, abort or
    roll forward (a mixin of the manager: its records, jobs, tables and replica incarnations).

    **Abort or roll forward.**  Before the commit no upstream can have switched (an armed
    router that reaches its position waits for the commit), so a LATE ack, a lost participant
    replica or ``abort()`` cancels the step cleanly: every participant drops the instruction
    and the table stays at the previous epoch.  After the commit some upstream may already
    have routed records of the moved vnodes to the target, and its twin *will* (both armed the
    same position), so undoing would need those records back: the step only rolls forward.
    That is safe because every piece of it is deterministic (Rhino Theorem 1: the target gets
    exactly the origin's state at the switch and then exactly the records after it, and the
    handover completes in finite time since channels are FIFO and durable): a replica lost
    after the commit is restored from a checkpoint, gets the committed instruction again
    (``replica_restored``) and replays its input from the checkpoint's positions, so it
    switches, cuts or loads at the very same element as before, with the same seqs, and the
    downstream dedup drops what was already delivered.  The twin carries the step meanwhile;
    if both replicas of a participant are lost, the phase waits for the restored one.

    **Acks.**  A phase needs an ack from every *live* replica of each instance in its role
    (at least one); phases never regress, so a replica restored after its phase was satisfied
    is not waited for (its re-ack is accepted and changes nothing).  Acks of an old attempt,
    of a replica declared lost, of another epoch, or of an aborted or unknown handover are
    STALE; repeats are DUPLICATE; an ack that the protocol forbids (SWITCHED before the commit,
    LATE after it, from a non-participant, LOADED before the release) is UNEXPECTED and kept in
    ``violations``."""

    replicas: int
    records: dict[int, HandoverRecord]
    jobs: dict[int, HandoverJob]
    tables: dict[int, RoutingTable]
    code_versions: dict[tuple[int, str], int]
    attempts: dict[ReplicaId, int]
    lost: set[ReplicaId]
    violations: list[tuple[HandoverAck, str]]
    divergences: list[tuple[int, PartitionId, tuple[str, str]]]

    def record(self, handover_id: int) -> HandoverRecord:
        """The record of ``handover_id``."""
        if handover_id not in self.records:
            raise ValueError(f"unknown handover {handover_id!r}")
        return self.records[handover_id]

    def job(self, job_id: int) -> HandoverJob:
        """The job ``job_id``."""
        if job_id not in self.jobs:
            raise ValueError(f"unknown handover job {job_id!r}")
        return self.jobs[job_id]

    def _replicas_of(self, inst: PartitionId) -> list[ReplicaId]:
        return [(inst[0], inst[1], r) for r in range(self.replicas)]

    # -- protocol events ----------------------------------------------------------------------
    def commit(self, handover_id: int) -> Commit:
        """Every participant replica armed: commit (from now on the handover only rolls forward)."""
        rec = self.record(handover_id)
        if rec.state is not HandoverState.ARMED:
            armed = rec.acks.get(AckKind.ARMED, {})
            missing = sorted(r for inst in rec.instances for r in self._replicas_of(inst)
                             if r not in self.lost and armed.get(r) != self.attempts.get(r, 0))
            raise ValueError(f"handover {handover_id} is {rec.state.value}: commit needs every participant "
                             f"replica armed (not armed: {missing})")
        rec.state = HandoverState.COMMITTED
        if rec.kind == "vnodes":
            self.tables[rec.task] = rec.instruction.table  # type: ignore[union-attr]
        else:
            self.code_versions[(rec.task, rec.instruction.operator)] = rec.epoch  # type: ignore[union-attr]
        self._advance(rec)
        return Commit(handover_id, rec.epoch)

    def abort(self, handover_id: int, reason: str = "aborted by request") -> Cancel:
        """Abort a handover that is not committed yet (clean: nobody switched)."""
        rec = self.record(handover_id)
        if rec.state not in BEFORE_COMMIT:
            raise ValueError(f"handover {handover_id} is {rec.state.value}: only a handover not committed "
                             "yet can abort (after the commit upstream replicas may have switched; it rolls "
                             "forward)")
        return self._abort(rec, reason)

    def stop_job(self, job_id: int, reason: str) -> None:
        """End a running job between its steps (its caller gave up, e.g. a timeout): the steps not
        instructed yet never are, and the table stays where its last step left it.  ValueError
        while a step of it is instructed and not completed (abort it first, or let a committed one
        roll forward)."""
        job = self.job(job_id)
        if job.state is not JobState.RUNNING:
            return
        busy = [h for h in job.handover_ids
                if h in self.records and self.records[h].state not in (HandoverState.COMPLETED,
                                                                       HandoverState.ABORTED)]
        if busy:
            raise ValueError(f"job {job_id}: step handover(s) {busy} still in progress; a job stops "
                             "between its steps")
        job.state, job.stopped = JobState.ABORTED, True
        job.reason = f"stopped after {job.next_index} of {len(job.steps)} step(s): {reason}"

    def _abort(self, rec: HandoverRecord, reason: str, late: bool = False) -> Cancel:
        rec.state = HandoverState.ABORTED
        rec.reason = reason
        if rec.job_id is not None:
            job = self.jobs[rec.job_id]
            job.state = JobState.ABORTED
            job.reason = f"step {job.next_index - 1} (handover {rec.handover_id}) aborted: {reason}"
            job.late = late
        return Cancel(rec.handover_id, rec.epoch, reason)

    def release(self, handover_id: int) -> Release:
        """Every origin cut: the release of the targets' held records may be placed in-band."""
        rec = self.record(handover_id)
        cut = STATE_ORDER[HandoverState.CUT] <= STATE_ORDER[rec.state] < STATE_ORDER[HandoverState.ABORTED]
        if rec.kind != "vnodes" or not cut:
            raise ValueError(f"handover {handover_id} is {rec.state.value}: the release needs every "
                             "origin cut")
        rec.released = True
        return Release(handover_id, rec.epoch, rec.participants["target"])

    def ack(self, ack: HandoverAck) -> AckOutcome:
        """Feed one acknowledgement."""
        rec = self.records.get(ack.handover_id)
        if rec is None or rec.state is HandoverState.ABORTED or ack.epoch != rec.epoch:
            return AckOutcome.STALE
        replica = ack.replica
        current = self.attempts.get(replica, 0)
        if ack.attempt < current or (ack.attempt == current and replica in self.lost):
            return AckOutcome.STALE
        if ack.attempt > current:
            return self._violation(ack, f"attempt {ack.attempt} of {replica} is unknown (current {current})")
        inst = replica[:2]
        roles = [role for role, insts in rec.participants.items() if inst in insts]
        if not roles or not 0 <= replica[2] < self.replicas:
            return self._violation(ack, f"{replica} is not a participant of handover {rec.handover_id}")
        acks = rec.acks.setdefault(ack.kind, {})
        if ack.kind in (AckKind.ARMED, AckKind.LATE):
            if rec.state not in BEFORE_COMMIT:
                if ack.kind is AckKind.LATE:
                    return self._violation(ack, "LATE after the commit (a restored replica gets committed "
                                                "instructions)")
                return self._record_ack(acks, ack)  # a restored replica re-armed: changes nothing
            if ack.kind is AckKind.LATE:
                self._abort(rec, f"replica {replica} is past its position", late=True)
                return AckOutcome.ABORTED
            outcome = self._record_ack(acks, ack)
            if outcome is AckOutcome.ACCEPTED and self._all_acked(rec, rec.instances, AckKind.ARMED):
                rec.state = HandoverState.ARMED
            return outcome
        role = next((r for _, r, k in rec.phases if k is ack.kind), None)
        if role not in roles:
            return self._violation(ack, f"{ack.kind.value} from {replica}, which is not a "
                                        f"{role or 'participant'} of handover {rec.handover_id}")
        if rec.state in BEFORE_COMMIT:
            return self._violation(ack, f"{ack.kind.value} before the commit of handover {rec.handover_id}")
        if ack.kind is AckKind.LOADED and not rec.released:
            return self._violation(ack, f"LOADED before the release of handover {rec.handover_id} was placed")
        outcome = self._record_ack(acks, ack)
        if outcome is AckOutcome.ACCEPTED:
            if ack.kind is AckKind.CUT and ack.digest:
                known = rec.digests.setdefault(inst, ack.digest)
                if known != ack.digest:
                    self.divergences.append((rec.handover_id, inst, (known, ack.digest)))
            self._advance(rec)
        return outcome

    def _record_ack(self, acks: dict[ReplicaId, int], ack: HandoverAck) -> AckOutcome:
        if acks.get(ack.replica) == ack.attempt:
            return AckOutcome.DUPLICATE
        acks[ack.replica] = ack.attempt
        return AckOutcome.ACCEPTED

    def _violation(self, ack: HandoverAck, reason: str) -> AckOutcome:
        self.violations.append((ack, reason))
        return AckOutcome.UNEXPECTED

    def _all_acked(self, rec: HandoverRecord, instances: Iterable[PartitionId], kind: AckKind) -> bool:
        acks = rec.acks.get(kind, {})
        for inst in instances:
            live = [r for r in self._replicas_of(inst) if r not in self.lost]
            if not live or any(acks.get(r) != self.attempts.get(r, 0) for r in live):
                return False
        return True

    def _advance(self, rec: HandoverRecord) -> None:
        if STATE_ORDER[rec.state] < STATE_ORDER[HandoverState.COMMITTED] or rec.state is HandoverState.ABORTED:
            return
        phases = rec.phases
        while rec.phases_done < len(phases):
            state, role, kind = phases[rec.phases_done]
            if not self._all_acked(rec, rec.participants.get(role, ()), kind):
                break
            rec.phases_done += 1
            rec.state = state
        if rec.state is HandoverState.COMPLETED and rec.job_id is not None:
            job = self.jobs[rec.job_id]
            if job.state is JobState.RUNNING and job.next_index == len(job.steps) \
                    and job.handover_ids[-1] == rec.handover_id:
                job.state = JobState.COMPLETED

    # -- failures -----------------------------------------------------------------------------
    def replica_lost(self, replica: ReplicaId) -> tuple[Cancel, ...]:
        """``replica`` is gone: steps it takes part in abort if not committed yet (the Cancels to
        send), else roll forward without waiting for it."""
        self.lost.add(replica)
        cancels = []
        for rec in sorted(self.records.values(), key=lambda r: r.handover_id):
            if replica[:2] not in rec.instances:
                continue
            if rec.state in BEFORE_COMMIT:
                cancels.append(self._abort(rec, f"replica {replica} lost before the commit"))
            else:
                self._advance(rec)
        return tuple(cancels)

    def replica_restored(self, replica: ReplicaId, attempt: int) -> tuple[Instruction | CodeInstruction, ...]:
        """``replica`` runs again as incarnation ``attempt``: the committed instructions it takes
        part in (oldest first, marked committed), to install before it replays; it skips those
        its checkpoint already includes (a table or version at or past their epoch)."""
        current = self.attempts.get(replica, 0)
        if not is_int(attempt) or attempt <= current:
            raise ValueError(f"attempt of restored replica {replica} must be an int > {current}, "
                             f"got {attempt!r}")
        self.attempts[replica] = attempt
        self.lost.discard(replica)
        return tuple(replace(rec.instruction, committed=True)
                     for rec in sorted(self.records.values(), key=lambda r: r.handover_id)
                     if replica[:2] in rec.instances
                     and rec.state not in (*BEFORE_COMMIT, HandoverState.ABORTED))
