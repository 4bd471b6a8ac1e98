"""The driver-side handover state machine (:mod:`rhino_state.handover`): one per step and per
operator replacement, fed acknowledgements and replica failures, deciding commit, abort or
roll-forward; a job's steps one after the other."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from rhino_state.handover import (
    AllAtOnce,
    MoveRequest,
    RebalanceRequest,
    ReplaceOperatorRequest,
    RescaleRequest,
    Step,
    Strategy,
    apply_moves,
    check_int,
    check_table,
    is_int,
    move_vnodes,
    plan_steps,
    rebalance,
    rescale,
    step_gap,
)
from rhino_state.handover_messages import (
    BEFORE_COMMIT,
    IN_FLIGHT,
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


class HandoverManager:
    """Driver-side handover manager (pure): validates and plans operations, instructs their
    steps one at a time, and runs each step's state machine from the acks it is fed.

    ``tables``: the routing table of every keyed task; ``upstreams[task]``: the instances that
    route to it; ``downstreams[task]``: the instances that merge its output (they rewire when
    its parallelism changes).

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

    def __init__(self, tables: Mapping[int, RoutingTable], upstreams: Mapping[int, Iterable[PartitionId]],
                 downstreams: Mapping[int, Iterable[PartitionId]] | None = None, *, replicas: int = 2,
                 max_bytes_in_flight: int | None = None) -> None:
        self.tables: dict[int, RoutingTable] = {}
        for task, table in tables.items():
            self.tables[task] = check_table(table)
        self.upstreams: dict[int, tuple[PartitionId, ...]] = {}
        for task in self.tables:
            ups = tuple(sorted(set(upstreams.get(task, ()))))
            if not ups:
                raise ValueError(f"keyed task {task} has no upstream instances")
            self.upstreams[task] = ups
        self.downstreams = {t: tuple(sorted(set(d))) for t, d in (downstreams or {}).items()}
        self.replicas = check_int("replicas", replicas, 1)
        self.max_bytes_in_flight = (None if max_bytes_in_flight is None
                                    else check_int("max_bytes_in_flight", max_bytes_in_flight, 1))
        self.jobs: dict[int, HandoverJob] = {}
        self.records: dict[int, HandoverRecord] = {}
        self.attempts: dict[ReplicaId, int] = {}
        self.lost: set[ReplicaId] = set()
        self.code_versions: dict[tuple[int, str], int] = {}
        self.violations: list[tuple[HandoverAck, str]] = []
        self.divergences: list[tuple[int, PartitionId, tuple[str, str]]] = []
        self._next_job = 1
        self._next_handover = 1

    # -- queries ------------------------------------------------------------------------------
    def _table(self, task: int) -> RoutingTable:
        if task not in self.tables:
            raise ValueError(f"unknown task {task!r}: keyed tasks are {sorted(self.tables)}")
        return self.tables[task]

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

    def step_states(self, job_id: int) -> tuple[HandoverState, ...]:
        """The state of every step of a job: PLANNED until instructed (ABORTED after an abort)."""
        job = self.job(job_id)
        aborted = job.state is JobState.ABORTED
        last = job.handover_ids[-1] if job.handover_ids else None
        done = [self.records[h].state if h in self.records  # else pruned: completed, or the aborted last
                else HandoverState.ABORTED if aborted and not job.stopped and h == last else HandoverState.COMPLETED
                for h in job.handover_ids]
        rest = HandoverState.ABORTED if aborted else HandoverState.PLANNED
        return tuple(done) + (rest,) * (len(job.steps) - len(done))

    def busy_vnodes(self, task: int) -> dict[int, int]:
        """Vnodes of ``task`` in a running job -> that job's id."""
        return {v: j.job_id for j in self.jobs.values()
                if j.task == task and j.state is JobState.RUNNING for v in j.vnodes}

    def in_flight_bytes(self) -> int:
        """State bytes of the steps instructed but not loaded yet (all tasks)."""
        return sum(r.size_bytes for r in self.records.values() if r.state in IN_FLIGHT)

    def _replicas_of(self, inst: PartitionId) -> list[ReplicaId]:
        return [(inst[0], inst[1], r) for r in range(self.replicas)]

    # -- operations ---------------------------------------------------------------------------
    def submit(self, request: RescaleRequest | MoveRequest | RebalanceRequest,
               strategy: Strategy = AllAtOnce(), *, sizes: Mapping[int, int] | Sequence[int] | None = None,  # noqa: B008 - frozen
               start: int = 0) -> HandoverJob:
        """Validate ``request``, plan it with ``strategy`` from the current table and register the
        job (no step instructed yet; a job with nothing to move is COMPLETED at once)."""
        task = request.task
        table = self._table(task)
        running = sorted(j.job_id for j in self.jobs.values()
                         if j.task == task and j.state is JobState.RUNNING)
        rescaling = [j for j in running if self.jobs[j].kind == "rescale"]
        parallelism = table.parallelism
        if isinstance(request, RescaleRequest):
            if running:
                raise ValueError(f"task {task}: a rescale needs the task idle, but handover job(s) {running} "
                                 "are running")
            moves = rescale(table, request.parallelism, sizes=sizes)
            parallelism, kind = request.parallelism, "rescale"
        elif isinstance(request, MoveRequest):
            if rescaling:
                raise ValueError(f"task {task} is being rescaled by job {rescaling[0]}")
            moves, kind = move_vnodes(table, request.vnodes, request.target), "move"
        elif isinstance(request, RebalanceRequest):
            if running:
                raise ValueError(f"task {task}: rebalance after handover job(s) {running} finish "
                                 "(loads measured during a handover are not meaningful)")
            moves = rebalance(table, request.load_per_vnode, request.fraction, target=request.target)
            kind = "rebalance"
        else:
            raise ValueError(f"unknown request {request!r}")
        busy = self.busy_vnodes(task)
        clash = sorted(m.vnode for m in moves if m.vnode in busy)
        if clash:
            raise ValueError(f"task {task}: vnode(s) {clash} already in a running handover "
                             f"(job(s) {sorted({busy[v] for v in clash})})")
        steps = plan_steps(table, moves, strategy, start=start, sizes=sizes, parallelism=parallelism)
        job = HandoverJob(self._next_job, task, kind, strategy, steps)
        self._next_job += 1
        if not steps:
            job.state = JobState.COMPLETED
        self.jobs[job.job_id] = job
        return job

    def _positions(self, what: str, instances: Sequence[PartitionId], switch_at: int | Mapping[PartitionId, int],
                   previous: Mapping[PartitionId, int], gap_from: Mapping[PartitionId, int],
                   gap: int) -> dict[PartitionId, int]:
        if isinstance(switch_at, Mapping):
            positions = dict(switch_at)
            missing = sorted(set(instances) - set(positions))
            unknown = sorted(set(positions) - set(instances))
            if missing or unknown:
                raise ValueError(f"switch_at must name every {what} instance {list(instances)}: "
                                 f"missing {missing}, unknown {unknown}")
        else:
            positions = dict.fromkeys(instances, switch_at)
        for inst, pos in positions.items():
            check_int(f"switch position of {inst}", pos, 0)
            if inst in previous and pos <= previous[inst]:
                raise ValueError(f"switch position {pos} of {inst} must be after its previous switch "
                                 f"at {previous[inst]}")
        for inst, pos in positions.items():
            if inst in gap_from and pos < gap_from[inst] + gap:
                raise ValueError(f"switch position {pos} of {inst} must be at least {gap} after the "
                                 f"previous step of the job (at {gap_from[inst]}) so that queues drain")
        return positions

    def _last_positions(self, records: Iterable[HandoverRecord]) -> dict[PartitionId, int]:
        out: dict[PartitionId, int] = {}
        for rec in records:
            if rec.state is HandoverState.ABORTED:
                continue
            for inst, pos in rec.instruction.switch_at.items():
                out[inst] = max(pos, out.get(inst, pos))
        return out

    def instruct_next(self, job_id: int, switch_at: int | Mapping[PartitionId, int]) -> Instruction | None:
        """Instruct the job's next step, switching at ``switch_at`` (one pulse for every upstream,
        or a position per upstream instance).  None: not now (the previous step of the job is
        not completed, another step of the task is not committed yet, a participant replica is
        lost, or the bytes-in-flight cap is reached)."""
        job = self.job(job_id)
        if job.state is not JobState.RUNNING:
            raise ValueError(f"job {job_id} is {job.state.value}: nothing to instruct")
        if self.why_not_next(job_id) is not None:
            return None
        task = job.task
        task_records = [r for r in self.records.values() if r.task == task and r.kind == "vnodes"]
        step = job.steps[job.next_index]
        before = self.tables[task]
        after = apply_moves(before, step.moves, step.table_after.parallelism)
        participants = self._step_participants(task, step)
        previous = self._last_positions(task_records)
        gap_from = self._last_positions([self.records[job.handover_ids[-1]]]) if job.handover_ids else {}
        positions = self._positions("upstream", self.upstreams[task], switch_at, previous, gap_from,
                                    step_gap(job.strategy))
        hid = self._next_handover
        self._next_handover += 1
        step = replace(step, position=min(positions.values()), table_before=before, table_after=after)
        instruction = Instruction(hid, task, after.epoch, after, before.parallelism, step.moves, positions,
                                  participants)
        self.records[hid] = HandoverRecord(hid, "vnodes", task, after.epoch, instruction, participants,
                                           job_id, step)
        job.handover_ids.append(hid)
        job.next_index += 1
        return instruction

    def _step_participants(self, task: int, step: Step) -> dict[str, frozenset[PartitionId]]:
        return {
            "upstream": frozenset(self.upstreams[task]),
            "origin": frozenset((task, p) for p in {m.origin for m in step.moves} | set(step.leaving)),
            # a joining partition that gets no vnode in this step still has to be up and armed
            "target": frozenset((task, p) for p in {m.target for m in step.moves} | set(step.joining)),
            "downstream": (frozenset(self.downstreams.get(task, ())) if step.joining or step.leaving
                           else frozenset()),
        }

    def why_not_next(self, job_id: int) -> str | None:
        """Why the running job's next step cannot be instructed now (None: it can): its previous
        step is not completed, another step of the task is not committed yet, a participant
        replica is lost, or the bytes-in-flight cap is reached."""
        job = self.job(job_id)
        if job.handover_ids and self.records[job.handover_ids[-1]].state is not HandoverState.COMPLETED:
            return "its previous step is not completed"
        task = job.task
        if any(r.task == task and r.kind == "vnodes" and r.state in BEFORE_COMMIT for r in self.records.values()):
            return "another handover of the task is not committed yet"
        step = job.steps[job.next_index]
        everyone = frozenset().union(*self._step_participants(task, step).values())
        lost = sorted(r for inst in everyone for r in self._replicas_of(inst) if r in self.lost)
        if lost:
            return f"participant replica(s) {lost} are lost (restored from checkpoints with Rhino on)"
        cap = self.max_bytes_in_flight
        in_flight = self.in_flight_bytes()
        if cap is not None and in_flight > 0 and in_flight + step.size_bytes > cap:
            return (f"{in_flight} bytes of state are in flight; the step's {step.size_bytes} more would pass the "
                    f"cap of {cap}")
        return None

    def replace_operator(self, request: ReplaceOperatorRequest, switch_at: int | Mapping[PartitionId, int], *,
                         partitions: int | None = None) -> CodeInstruction:
        """Instruct every replica of ``request.task`` to switch ``request.operator`` to
        ``request.version`` at ``switch_at`` (same protocol: arm, commit, SWITCHED acks)."""
        task, op = request.task, request.operator
        if not isinstance(op, str) or not op:
            raise ValueError(f"operator must be a non-empty name, got {op!r}")
        if partitions is None:
            if task not in self.tables:
                raise ValueError(f"task {task!r} has no routing table: pass partitions=")
            partitions = self.tables[task].parallelism
        partitions = check_int("partitions", partitions, 1)
        same = [r for r in self.records.values() if r.kind == "code" and r.task == task
                and r.instruction.operator == op]  # type: ignore[union-attr]
        running = [r.handover_id for r in same
                   if r.state not in (HandoverState.COMPLETED, HandoverState.ABORTED)]
        if running:
            raise ValueError(f"operator {op!r} of task {task} is already being replaced "
                             f"(handover {running[0]})")
        current = self.code_versions.get((task, op), 0)
        if not is_int(request.version) or request.version <= current:
            raise ValueError(f"version of operator {op!r} must be an int > current version {current}, "
                             f"got {request.version!r}")
        instances = [(task, p) for p in range(partitions)]
        lost = sorted(r for inst in instances for r in self._replicas_of(inst) if r in self.lost)
        if lost:
            raise ValueError(f"cannot replace operator {op!r} while replica(s) {lost} are lost; "
                             "retry after restore")
        positions = self._positions("task", instances, switch_at, self._last_positions(same), {}, 1)
        hid = self._next_handover
        self._next_handover += 1
        participants = {"instance": frozenset(instances)}
        instruction = CodeInstruction(hid, task, op, request.version, positions, participants)
        self.records[hid] = HandoverRecord(hid, "code", task, request.version, instruction, participants)
        return instruction

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

    def prune(self, task: int, epoch: int) -> int:
        """Forget the completed vnode handovers of ``task`` up to ``epoch`` and its aborted ones,
        once every restore point of its participants is past them; returns how many."""
        gone = [h for h, r in self.records.items() if r.task == task and r.kind == "vnodes"
                and (r.state is HandoverState.ABORTED
                     or (r.state is HandoverState.COMPLETED and r.epoch <= epoch))
                and (r.job_id is None or self.jobs[r.job_id].state is not JobState.RUNNING)]
        for h in gone:
            del self.records[h]
        return len(gone)


# --------------------------------------------------------------------------- participants
