"""The driver-side handover manager (:mod:`rhino_state.handover`): a request planned into a job of
steps, the steps instructed one after the other, operator replacements; each step's state machine
(acks and replica failures deciding commit, abort or roll-forward) is
:mod:`rhino_state.handover_events`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

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
from rhino_state.handover_events import HandoverJob, HandoverRecord, StepEvents
from rhino_state.handover_messages import (
    BEFORE_COMMIT,
    IN_FLIGHT,
    CodeInstruction,
    HandoverAck,
    HandoverState,
    Instruction,
    JobState,
)
from rhino_state.keys import RoutingTable
from transport.ids import PartitionId, ReplicaId


class HandoverManager(StepEvents):
    """Driver-side handover manager (pure): validates and plans operations, instructs their
    steps one at a time, and runs each step's state machine from the acks it is fed.

    ``tables``: the routing table of every keyed task; ``upstreams[task]``: the instances that
    route to it; ``downstreams[task]``: the instances that merge its output (they rewire when
    its parallelism changes).

    How a step commits, aborts or rolls forward from the acks and failures it is fed:
    :class:`~rhino_state.handover_events.StepEvents`."""

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
