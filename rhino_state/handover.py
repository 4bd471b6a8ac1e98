"""Runtime handover, the pure protocol core: rescale, rebalance, drain and operator replacement
(DESIGN §6 "Handover"; Rhino, paper 000 §4.1; Megaphone, paper 002; paper 001 §3.3.2).

This module owns

* the **planners** that turn an operation into moves: ``rescale``, ``move_vnodes`` and
  ``rebalance`` give vnode moves; ``plan_drain`` gives replica moves (draining an executor);
* the **strategies** that cut a set of vnode moves into ordered steps, one routing-table epoch
  and one switch position each: ``AllAtOnce``, ``Fluid`` and ``Batched`` (with a cap on bytes in
  flight), applied by ``plan_steps``;
* the driver-side ``HandoverManager``: one state machine per step (and per operator
  replacement), fed acknowledgements and replica failures, deciding commit, abort or
  roll-forward;
* the participant-side pieces a replica runs: ``VersionedRouter`` (upstreams),
  ``OriginAlignment`` and ``cut_key_groups`` (origin), ``TargetGate`` (target) and ``CodeSwitch``
  (operator replacement).

No I/O, no threads, no clocks: the driver and the replicas feed events and act on what comes
back; the runtime wiring is described in ``docs/handover.md``.

**Positions.**  Under active replication the two replicas of a partition must do everything at
the same element, so every switch point is a *logical position* both replicas attach to every
element they consume, never wall-clock time:

* LiveRobin: the highest pulse ``h`` the instance has consumed (first copy) before the element.
  Pulse numbers are global across sources, so one number serves every participant.
* KaZoo (and single-input tasks): the number of input elements the instance consumed before the
  element (its order position; a source: records read).  These are per instance, so an
  instruction names one position per upstream instance.

"Switch at ``P``" means: elements at position ``>= P`` are handled in the new configuration.

**The protocol** (one step = one epoch).  The manager sends an ``Instruction`` (epoch, moves
``origin -> target`` of vnodes, the new table, the switch position of every upstream instance)
to every replica of every participant.  Each *arms* (installs it and acks ``ARMED``) or, if it is
already past its position, acks ``LATE``.  Once every replica armed, the manager *commits*; a
router that reaches its position before the commit waits for it (or for a cancel).  This
two-phase arming is what makes the switch identical on both replicas of an upstream: without it
a cancel, or an instruction, could reach one twin before the position and the other after.  At
the position each upstream replica switches (rerouting the moved vnodes; in KaZoo mode it first
emits a handover marker on the edge's channels, in LiveRobin pulse ``P`` is the marker) and acks
``SWITCHED``.  The origin, once the marker arrived on all its input channels (nothing routed to
it under the old table is still in flight: Rhino's epoch alignment), cuts a final increment of
exactly the moved vnodes' key groups and acks ``CUT``.  The target holds the moved vnodes'
records (``TargetGate``) until it has loaded that state *and* reached an in-band release point
that the driver places after the cut (``HandoverManager.release``), processes the held records
in arrival order and acks ``LOADED``.  Downstreams of a task whose parallelism changes ack
``REWIRED`` when their merge took in (or let go of) the channels of the joining (leaving)
partitions.  Then the step is ``COMPLETED``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rhino_state.keys import RoutingTable, validate_num_key_groups, vnode_key_groups

__all__ = [
    "AckKind",
    "AckOutcome",
    "AllAtOnce",
    "Batched",
    "Cancel",
    "CodeInstruction",
    "CodeSwitch",
    "Commit",
    "Fluid",
    "GateDecision",
    "HandoverAck",
    "HandoverJob",
    "HandoverManager",
    "HandoverRecord",
    "HandoverState",
    "Instruction",
    "JobState",
    "LateInstructionError",
    "MoveRequest",
    "OriginAlignment",
    "RebalanceRequest",
    "Release",
    "ReplaceOperatorRequest",
    "ReplicaMove",
    "RescaleRequest",
    "Step",
    "SwitchNotCommittedError",
    "TargetGate",
    "Transfer",
    "VersionedRouter",
    "VnodeMove",
    "apply_moves",
    "cut_key_groups",
    "load_key_groups",
    "moved_key_groups",
    "move_vnodes",
    "plan_drain",
    "plan_steps",
    "rebalance",
    "rescale",
]

Instance = tuple[int, int]  # (task, partition)
ReplicaId = tuple[int, int, int]  # (task, partition, replica)


class LateInstructionError(ValueError):
    """An instruction reached a participant that is already at or past the position it names."""


class SwitchNotCommittedError(RuntimeError):
    """A switch is due at this position but is not committed yet: wait for the commit or a cancel."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value  # type: ignore[return-value]


def _check_table(table: object) -> RoutingTable:
    if not isinstance(table, RoutingTable):
        raise ValueError(f"expected a RoutingTable, got {type(table).__name__}")
    return table


def _per_vnode(name: str, values: Mapping[int, float] | Sequence[float] | None, num_vnodes: int,
               *, integral: bool) -> list[Any]:
    """A per-vnode number list from a mapping (missing vnodes: 0) or a full sequence."""
    out: list[Any] = [0] * num_vnodes
    if values is None:
        return out
    if isinstance(values, Mapping):
        items = list(values.items())
    else:
        values = list(values)
        if len(values) != num_vnodes:
            raise ValueError(f"{name} must give one value per vnode ({num_vnodes}), got {len(values)}")
        items = list(enumerate(values))
    for vnode, value in items:
        if not _is_int(vnode) or not 0 <= vnode < num_vnodes:
            raise ValueError(f"{name}: unknown vnode {vnode!r}, vnodes are [0, {num_vnodes})")
        ok = _is_int(value) if integral else (isinstance(value, (int, float)) and not isinstance(value, bool)
                                             and math.isfinite(value))
        if not ok or value < 0:
            kind = "an int" if integral else "a finite number"
            raise ValueError(f"{name}: vnode {vnode} must have {kind} >= 0, got {value!r}")
        out[vnode] = value
    return out


# --------------------------------------------------------------------------- vnode moves


@dataclass(frozen=True, order=True)
class VnodeMove:
    """Vnode ``vnode`` moves from partition ``origin`` to partition ``target``."""

    vnode: int
    origin: int
    target: int

    def __post_init__(self) -> None:
        for name in ("vnode", "origin", "target"):
            _check_int(f"VnodeMove {name}", getattr(self, name), 0)
        if self.origin == self.target:
            raise ValueError(f"vnode {self.vnode}: moving to its own partition {self.target}")


@dataclass(frozen=True)
class Transfer:
    """The vnodes one step moves from one origin to one target (one state transfer)."""

    origin: int
    target: int
    vnodes: tuple[int, ...]


def _transfers(moves: Iterable[VnodeMove]) -> tuple[Transfer, ...]:
    groups: dict[tuple[int, int], list[int]] = {}
    for m in moves:
        groups.setdefault((m.origin, m.target), []).append(m.vnode)
    return tuple(Transfer(o, t, tuple(sorted(vs))) for (o, t), vs in sorted(groups.items()))


def apply_moves(table: RoutingTable, moves: Iterable[VnodeMove],
                parallelism: int | None = None) -> RoutingTable:
    """The next table (epoch + 1) with every move applied; ``parallelism`` optionally changes the
    number of partitions.  Equals ``table.moved(vnodes, target, parallelism=...)`` for moves to one
    target; raises ValueError for a move that does not fit ``table``."""
    _check_table(table)
    new_p = table.parallelism if parallelism is None else _check_int("parallelism", parallelism, 1)
    assignment = list(table.assignment)
    seen: set[int] = set()
    for m in moves:
        if not isinstance(m, VnodeMove):
            raise ValueError(f"expected a VnodeMove, got {m!r}")
        if m.vnode >= table.num_vnodes:
            raise ValueError(f"unknown vnode {m.vnode}: vnodes are [0, {table.num_vnodes})")
        if table.assignment[m.vnode] != m.origin:
            raise ValueError(f"vnode {m.vnode} is on partition {table.assignment[m.vnode]}, "
                             f"not on {m.origin}")
        if m.target >= new_p:
            raise ValueError(f"vnode {m.vnode}: target partition {m.target} out of range [0, {new_p})")
        if m.vnode in seen:
            raise ValueError(f"vnode {m.vnode} moves twice")
        seen.add(m.vnode)
        assignment[m.vnode] = m.target
    stranded = [v for v, p in enumerate(assignment) if p >= new_p]
    if stranded:
        raise ValueError(f"parallelism {new_p} would strand vnode(s) {stranded} on partitions >= {new_p}; "
                         "move them first")
    return RoutingTable(tuple(assignment), new_p, table.epoch + 1)


def move_vnodes(table: RoutingTable, vnodes: Iterable[int], target: int) -> tuple[VnodeMove, ...]:
    """Moves of the named ``vnodes`` to partition ``target`` (sorted by vnode)."""
    _check_table(table)
    vnodes = list(vnodes)
    if not vnodes:
        raise ValueError("move_vnodes needs at least one vnode")
    if not _is_int(target) or not 0 <= target < table.parallelism:
        raise ValueError(f"target partition {target!r} out of range [0, {table.parallelism})")
    seen: set[int] = set()
    for v in vnodes:
        if not _is_int(v) or not 0 <= v < table.num_vnodes:
            raise ValueError(f"unknown vnode {v!r}: vnodes are [0, {table.num_vnodes})")
        if v in seen:
            raise ValueError(f"vnode {v} named twice")
        seen.add(v)
        if table.assignment[v] == target:
            raise ValueError(f"vnode {v} is already on partition {target} (moving to its own partition)")
    return tuple(VnodeMove(v, table.assignment[v], target) for v in sorted(vnodes))


def rescale(table: RoutingTable, parallelism: int, *,
            sizes: Mapping[int, int] | Sequence[int] | None = None) -> tuple[VnodeMove, ...]:
    """Vnode moves that take ``table`` to ``parallelism`` partitions with the fewest moves.

    Every partition ``< parallelism`` ends with ``V // parallelism`` or one more vnode (balanced
    to within one), every partition ``>= parallelism`` with none.  Minimal: the partitions that
    hold the most vnodes get the larger quotas, so as many vnodes as possible stay put.  Which of
    an over-full partition's vnodes leave: the smallest state first when ``sizes`` (bytes per
    vnode) is given (fewest bytes moved), else the highest vnode ids; receivers are filled in
    partition order with the leaving vnodes in ascending order.  Pass ``parallelism`` to
    ``plan_steps`` too (it is what shrinks the table on scale-down)."""
    _check_table(table)
    num_vnodes = table.num_vnodes
    if not _is_int(parallelism) or not 1 <= parallelism <= num_vnodes:
        raise ValueError(f"parallelism must be an int in [1, number of vnodes={num_vnodes}], "
                         f"got {parallelism!r}")
    size = _per_vnode("sizes", sizes, num_vnodes, integral=True)
    span = max(table.parallelism, parallelism)
    owned: list[list[int]] = [[] for _ in range(span)]
    for v, p in enumerate(table.assignment):
        owned[p].append(v)
    floor, extra = divmod(num_vnodes, parallelism)
    by_count = sorted(range(parallelism), key=lambda p: (-len(owned[p]), p))
    quota = [0] * span
    for i, p in enumerate(by_count):
        quota[p] = floor + 1 if i < extra else floor
    leaving: list[int] = []
    for p in range(span):
        surplus = len(owned[p]) - quota[p]
        if surplus > 0:
            ranked = sorted(owned[p], key=lambda v: (size[v], -v))
            leaving.extend(ranked[:surplus])
    leaving.sort()
    moves = []
    it = iter(leaving)
    for p in range(parallelism):
        for _ in range(quota[p] - len(owned[p])):
            v = next(it)
            moves.append(VnodeMove(v, table.assignment[v], p))
    return tuple(sorted(moves))


def rebalance(table: RoutingTable, load_per_vnode: Mapping[int, float] | Sequence[float],
              fraction: float = 0.5, *, target: int | None = None) -> tuple[VnodeMove, ...]:
    """Moves of up to ``ceil(fraction * n)`` of the busiest partition's ``n`` vnodes to the least
    loaded partition (or ``target``), heaviest first.

    A vnode of load ``w`` moves only if ``load(target) + w < load(busiest)`` (both as they are
    before that move), so every move strictly lowers the larger of the two loads and no
    partition becomes as busy as the busiest was; a vnode too heavy for that is skipped for a
    lighter one.  Heaviest first relieves the most load with the fewest vnodes
    (fewest handovers and held records).  Empty result: nothing would improve."""
    _check_table(table)
    load = _per_vnode("load_per_vnode", load_per_vnode, table.num_vnodes, integral=False)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    if table.parallelism < 2:
        raise ValueError("rebalance needs at least two partitions")
    totals = [0.0] * table.parallelism
    for v, p in enumerate(table.assignment):
        totals[p] += load[v]
    busiest = min(range(table.parallelism), key=lambda p: (-totals[p], p))
    if target is None:
        target = min((p for p in range(table.parallelism) if p != busiest), key=lambda p: (totals[p], p))
    elif not _is_int(target) or not 0 <= target < table.parallelism:
        raise ValueError(f"target partition {target!r} out of range [0, {table.parallelism})")
    elif target == busiest:
        raise ValueError(f"target partition {target} is the busiest partition (moving to its own partition)")
    candidates = sorted(table.vnodes_of(busiest), key=lambda v: (-load[v], v))
    limit = max(1, math.ceil(round(fraction * len(candidates), 9)))  # round: 0.1 * 30 is 3.0000000000000004
    high, low = totals[busiest], totals[target]
    moves = []
    for v in candidates:
        if len(moves) == limit:
            break
        w = load[v]
        if w > 0 and low + w < high:
            moves.append(VnodeMove(v, busiest, target))
            high, low = high - w, low + w
    return tuple(sorted(moves))


# --------------------------------------------------------------------------- strategies and steps


@dataclass(frozen=True)
class AllAtOnce:
    """Every move in one step: the shortest migration, the longest hold at the targets."""


@dataclass(frozen=True)
class Fluid:
    """One vnode per step, ``gap`` positions apart (Megaphone's fluid migration)."""

    gap: int = 1

    def __post_init__(self) -> None:
        _check_int("Fluid gap", self.gap, 1)


@dataclass(frozen=True)
class Batched:
    """Up to ``step_size`` vnodes and ``max_bytes`` of state per step, ``gap`` positions apart, so
    queues drain between steps (Megaphone's batched migration).  A single vnode larger than
    ``max_bytes`` goes alone."""

    step_size: int
    gap: int = 1
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_int("Batched step_size", self.step_size, 1)
        _check_int("Batched gap", self.gap, 1)
        if self.max_bytes is not None:
            _check_int("Batched max_bytes", self.max_bytes, 1)


Strategy = AllAtOnce | Fluid | Batched


@dataclass(frozen=True)
class Step:
    """One handover: the moves that switch together at ``position`` (planned), taking
    ``table_before`` (epoch e) to ``table_after`` (epoch e + 1)."""

    index: int
    position: int
    moves: tuple[VnodeMove, ...]
    table_before: RoutingTable
    table_after: RoutingTable
    size_bytes: int = 0

    @property
    def epoch(self) -> int:
        """The epoch this step starts."""
        return self.table_after.epoch

    @property
    def vnodes(self) -> frozenset[int]:
        """The vnodes this step moves."""
        return frozenset(m.vnode for m in self.moves)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """The moves grouped by (origin, target)."""
        return _transfers(self.moves)

    @property
    def joining(self) -> tuple[int, ...]:
        """New partitions: their channels open at this step."""
        return tuple(range(self.table_before.parallelism, self.table_after.parallelism))

    @property
    def leaving(self) -> tuple[int, ...]:
        """Removed partitions (empty after this step): their channels close at this step."""
        return tuple(range(self.table_after.parallelism, self.table_before.parallelism))


def _gap(strategy: Strategy) -> int:
    return 1 if isinstance(strategy, AllAtOnce) else strategy.gap


def _chunks(moves: Sequence[VnodeMove], strategy: Strategy, size: Sequence[int]) -> list[list[VnodeMove]]:
    if isinstance(strategy, AllAtOnce):
        return [list(moves)] if moves else []
    if isinstance(strategy, Fluid):
        return [[m] for m in moves]
    if isinstance(strategy, Batched):
        chunks: list[list[VnodeMove]] = []
        current: list[VnodeMove] = []
        current_bytes = 0
        for m in moves:
            fits = len(current) < strategy.step_size and (
                strategy.max_bytes is None or current_bytes + size[m.vnode] <= strategy.max_bytes)
            if current and not fits:
                chunks.append(current)
                current, current_bytes = [], 0
            current.append(m)
            current_bytes += size[m.vnode]
        if current:
            chunks.append(current)
        return chunks
    raise ValueError(f"unknown strategy {strategy!r}: use AllAtOnce(), Fluid(gap) or "
                     "Batched(step_size, gap, max_bytes)")


def plan_steps(table: RoutingTable, moves: Iterable[VnodeMove], strategy: Strategy = AllAtOnce(), *,
               start: int = 0, sizes: Mapping[int, int] | Sequence[int] | None = None,
               parallelism: int | None = None) -> tuple[Step, ...]:
    """Cut ``moves`` into ordered steps, one epoch each, step ``k`` planned at
    ``start + k * gap``.

    ``parallelism`` is the final number of partitions (default: the current one, grown to fit
    the targets).  A new partition joins (the table grows) at the first step that moves a vnode
    to it; partitions leave (the table shrinks) at the last step, when they are empty.  Moves
    are taken in (origin, target, vnode) order, so a step involves few partitions; the last
    table equals ``apply_moves(table, moves, parallelism)``."""
    _check_table(table)
    moves = tuple(moves)
    start = _check_int("start", start, 0)
    if parallelism is None:
        parallelism = max([table.parallelism] + [m.target + 1 for m in moves if isinstance(m, VnodeMove)])
    final = apply_moves(table, moves, parallelism)
    idle = [p for p in range(table.parallelism, parallelism) if p not in final.assignment]
    if idle:
        raise ValueError(f"new partition(s) {idle} would own no vnode")
    size = _per_vnode("sizes", sizes, table.num_vnodes, integral=True)
    chunks = _chunks(sorted(moves, key=lambda m: (m.origin, m.target, m.vnode)), strategy, size)
    if not chunks:
        if parallelism == table.parallelism:
            return ()
        chunks = [[]]  # only empty partitions leave: one step that closes their channels
    gap = _gap(strategy)
    steps = []
    before = table
    for i, chunk in enumerate(chunks):
        if i == len(chunks) - 1:
            p = parallelism
        else:
            p = max([before.parallelism] + [m.target + 1 for m in chunk])
        after = apply_moves(before, chunk, p)
        steps.append(Step(i, start + i * gap, tuple(chunk), before, after, sum(size[m.vnode] for m in chunk)))
        before = after
    return tuple(steps)


# --------------------------------------------------------------------------- drain


@dataclass(frozen=True)
class ReplicaMove:
    """Replica ``replica`` moves from worker ``source`` to ``destination``; ``local``: the
    destination holds the instance's restore-point checkpoint (restore by hard links)."""

    replica: ReplicaId
    source: int
    destination: int
    local: bool


def plan_drain(placement: Mapping[ReplicaId, int], num_workers: int, drained: Iterable[int], *,
               holders: Mapping[Instance, Iterable[int]] | None = None,
               groups: Mapping[Instance, Sequence[int]] | None = None,
               dead: Iterable[int] = (),
               max_per_wave: int | None = None) -> tuple[tuple[ReplicaMove, ...], ...]:
    """Waves of replica moves that empty the ``drained`` workers.

    Draining moves *replicas*, not vnodes: each move is Rhino's restore of a lost replica, done
    before the loss (make before break): restore the replica on the destination from its
    instance's restore-point checkpoint, rejoin it to its upstreams (they replay from the
    checkpoint's positions), let it catch up, then stop the old one (downstream dedup drops the
    third copy meanwhile).  A destination is a live worker that is not drained and does not run
    the instance's other replica; preferred: one of ``holders[instance]`` (it holds the restore
    point: a local restore, no bulk copy), then one of ``groups[instance]``, then the least
    loaded, lowest id.  A wave never holds both replicas of an instance, so an instance always
    keeps a serving replica; ``max_per_wave`` caps a wave (restore bandwidth)."""
    num_workers = _check_int("num_workers", num_workers, 1)
    dead = set(dead)
    drained = sorted(set(drained))
    if not drained:
        raise ValueError("plan_drain needs at least one worker to drain")
    for w in drained:
        if not _is_int(w) or not 0 <= w < num_workers:
            raise ValueError(f"unknown worker {w!r}: workers are [0, {num_workers})")
        if w in dead:
            raise ValueError(f"worker {w} is dead: its replicas are restored, not drained")
    if max_per_wave is not None:
        _check_int("max_per_wave", max_per_wave, 1)
    eligible = [w for w in range(num_workers) if w not in dead and w not in drained]
    if not eligible:
        raise ValueError(f"draining {drained} leaves no live worker")
    where = dict(placement)
    load = {w: 0 for w in eligible}
    for w in where.values():
        if w in load:
            load[w] += 1
    waves: list[list[ReplicaMove]] = []
    for replica in sorted(r for r, w in placement.items() if w in drained):
        inst = replica[:2]
        busy = {w for r, w in where.items() if r[:2] == inst and r != replica}
        options = [w for w in eligible if w not in busy]
        if not options:
            raise ValueError(f"cannot drain replica {replica}: every live worker that is not drained runs "
                             f"another replica of instance {inst}")
        held = set((holders or {}).get(inst, ()))
        grouped = set((groups or {}).get(inst, ()))
        dest = min(options, key=lambda w: (w not in held, w not in grouped, load[w], w))
        load[dest] += 1
        where[replica] = dest
        move = ReplicaMove(replica, placement[replica], dest, dest in held)
        for wave in waves:
            room = max_per_wave is None or len(wave) < max_per_wave
            if room and all(m.replica[:2] != inst for m in wave):
                wave.append(move)
                break
        else:
            waves.append([move])
    return tuple(tuple(wave) for wave in waves)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RescaleRequest:
    """Change keyed task ``task`` to ``parallelism`` partitions."""

    task: int
    parallelism: int


@dataclass(frozen=True)
class MoveRequest:
    """Move the named ``vnodes`` of ``task`` to partition ``target``."""

    task: int
    vnodes: tuple[int, ...]
    target: int


@dataclass(frozen=True)
class RebalanceRequest:
    """Move a ``fraction`` of the busiest partition's vnodes to the least loaded one (``rebalance``)."""

    task: int
    load_per_vnode: Mapping[int, float] | Sequence[float]
    fraction: float = 0.5
    target: int | None = None


@dataclass(frozen=True)
class ReplaceOperatorRequest:
    """Replace operator ``operator`` of ``task`` by function version ``version``."""

    task: int
    operator: str
    version: int


# --------------------------------------------------------------------------- manager


class HandoverState(enum.Enum):
    """Where a handover step (or operator replacement) is."""

    PLANNED = "planned"  # a step of a job not instructed yet
    INSTRUCTED = "instructed"  # instruction sent, collecting ARMED acks: abort is clean
    ARMED = "armed"  # every participant replica armed, nobody switched: abort is clean
    COMMITTED = "committed"  # commit sent: routers switch at the position; only roll forward from here
    SWITCHED = "switched"  # every upstream rerouted at the position
    CUT = "cut"  # every origin cut the final increment of the moved vnodes
    LOADED = "loaded"  # every target loaded it and processed its held records
    COMPLETED = "completed"
    ABORTED = "aborted"


_ORDER = {s: i for i, s in enumerate(HandoverState)}
_BEFORE_COMMIT = (HandoverState.INSTRUCTED, HandoverState.ARMED)
_IN_FLIGHT = (HandoverState.INSTRUCTED, HandoverState.ARMED, HandoverState.COMMITTED, HandoverState.SWITCHED,
              HandoverState.CUT)


class AckKind(enum.Enum):
    """What a participant replica acknowledges."""

    ARMED = "armed"  # installed the instruction before its position
    LATE = "late"  # could not: already at or past its position
    SWITCHED = "switched"  # upstream: rerouted at the position (operator replacement: switched function)
    CUT = "cut"  # origin: aligned and cut the final increment of exactly the moved key groups
    LOADED = "loaded"  # target: loaded the state and released the held records
    REWIRED = "rewired"  # downstream: its merge took in / let go of the joining / leaving channels


class AckOutcome(enum.Enum):
    """What the manager made of an ack."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"  # unknown or aborted handover, another epoch, or an old / fenced attempt
    UNEXPECTED = "unexpected"  # a protocol violation (kept in ``HandoverManager.violations``)
    ABORTED = "aborted"  # accepted, and the handover was aborted because of it (a LATE ack)


@dataclass(frozen=True)
class HandoverAck:
    """An acknowledgement from one replica (``attempt``: its incarnation, bumped by a restore)."""

    handover_id: int
    epoch: int
    replica: ReplicaId
    kind: AckKind
    attempt: int = 0
    digest: str = ""  # CUT: digest of the final increment (both origin replicas must agree)


@dataclass(frozen=True)
class Instruction:
    """What every participant replica of a vnode handover step gets.

    ``table`` is the routing table in force from the switch on (epoch ``epoch``);
    ``switch_at[u]`` the position at which upstream instance ``u`` switches; ``participants``
    maps a role to its instances: upstream (reroute), origin (cut; leaving partitions too),
    target (load; joining partitions too, even with nothing to load), downstream (rewire, only
    when partitions join or leave).  ``committed`` is set on the copies given to replicas
    restored after the commit."""

    handover_id: int
    task: int
    epoch: int
    table: RoutingTable
    previous_parallelism: int
    moves: tuple[VnodeMove, ...]
    switch_at: dict[Instance, int]
    participants: dict[str, frozenset[Instance]]
    committed: bool = False

    def position_for(self, instance: Instance) -> int:
        """The switch position of upstream ``instance``."""
        if instance not in self.switch_at:
            raise ValueError(f"instance {instance} is not an upstream of handover {self.handover_id}")
        return self.switch_at[instance]

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """The moves grouped by (origin, target)."""
        return _transfers(self.moves)

    @property
    def joining(self) -> tuple[int, ...]:
        """Partitions whose channels open at the switch."""
        return tuple(range(self.previous_parallelism, self.table.parallelism))

    @property
    def leaving(self) -> tuple[int, ...]:
        """Partitions whose channels close at the switch."""
        return tuple(range(self.table.parallelism, self.previous_parallelism))


@dataclass(frozen=True)
class CodeInstruction:
    """What every replica of ``task`` gets to replace ``operator`` by ``version`` at
    ``switch_at[instance]`` (the element at that position is the first the new version handles)."""

    handover_id: int
    task: int
    operator: str
    version: int
    switch_at: dict[Instance, int]
    participants: dict[str, frozenset[Instance]]
    committed: bool = False

    @property
    def epoch(self) -> int:
        """Acks of an operator replacement carry the version as their epoch."""
        return self.version


@dataclass(frozen=True)
class Commit:
    """Sent to every participant once all armed: switch at the instructed positions."""

    handover_id: int
    epoch: int


@dataclass(frozen=True)
class Cancel:
    """Sent to every participant when a handover aborts: drop the instruction and go on."""

    handover_id: int
    epoch: int
    reason: str


@dataclass(frozen=True)
class Release:
    """To be placed *in-band* at the targets (LiveRobin: on a future pulse of the heartbeat log;
    KaZoo: a record of the target's order log): where they release their held records."""

    handover_id: int
    epoch: int
    targets: frozenset[Instance]


class JobState(enum.Enum):
    """Where a multi-step operation (a job) is."""

    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"


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
    participants: dict[str, frozenset[Instance]]
    job_id: int | None = None
    step: Step | None = None
    state: HandoverState = HandoverState.INSTRUCTED
    acks: dict[AckKind, dict[ReplicaId, int]] = field(default_factory=dict)  # kind -> replica -> attempt
    digests: dict[Instance, str] = field(default_factory=dict)
    phases_done: int = 0
    released: bool = False
    reason: str = ""

    @property
    def instances(self) -> frozenset[Instance]:
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

    def __init__(self, tables: Mapping[int, RoutingTable], upstreams: Mapping[int, Iterable[Instance]],
                 downstreams: Mapping[int, Iterable[Instance]] | None = None, *, replicas: int = 2,
                 max_bytes_in_flight: int | None = None) -> None:
        self.tables: dict[int, RoutingTable] = {}
        for task, table in tables.items():
            self.tables[task] = _check_table(table)
        self.upstreams: dict[int, tuple[Instance, ...]] = {}
        for task in self.tables:
            ups = tuple(sorted(set(upstreams.get(task, ()))))
            if not ups:
                raise ValueError(f"keyed task {task} has no upstream instances")
            self.upstreams[task] = ups
        self.downstreams = {t: tuple(sorted(set(d))) for t, d in (downstreams or {}).items()}
        self.replicas = _check_int("replicas", replicas, 1)
        self.max_bytes_in_flight = (None if max_bytes_in_flight is None
                                    else _check_int("max_bytes_in_flight", max_bytes_in_flight, 1))
        self.jobs: dict[int, HandoverJob] = {}
        self.records: dict[int, HandoverRecord] = {}
        self.attempts: dict[ReplicaId, int] = {}
        self.lost: set[ReplicaId] = set()
        self.code_versions: dict[tuple[int, str], int] = {}
        self.violations: list[tuple[HandoverAck, str]] = []
        self.divergences: list[tuple[int, Instance, tuple[str, str]]] = []
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
        return sum(r.size_bytes for r in self.records.values() if r.state in _IN_FLIGHT)

    def _replicas_of(self, inst: Instance) -> list[ReplicaId]:
        return [(inst[0], inst[1], r) for r in range(self.replicas)]

    # -- operations ---------------------------------------------------------------------------
    def submit(self, request: RescaleRequest | MoveRequest | RebalanceRequest,
               strategy: Strategy = AllAtOnce(), *, sizes: Mapping[int, int] | Sequence[int] | None = None,
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

    def _positions(self, what: str, instances: Sequence[Instance], switch_at: int | Mapping[Instance, int],
                   previous: Mapping[Instance, int], gap_from: Mapping[Instance, int],
                   gap: int) -> dict[Instance, int]:
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
            _check_int(f"switch position of {inst}", pos, 0)
            if inst in previous and pos <= previous[inst]:
                raise ValueError(f"switch position {pos} of {inst} must be after its previous switch "
                                 f"at {previous[inst]}")
        for inst, pos in positions.items():
            if inst in gap_from and pos < gap_from[inst] + gap:
                raise ValueError(f"switch position {pos} of {inst} must be at least {gap} after the "
                                 f"previous step of the job (at {gap_from[inst]}) so that queues drain")
        return positions

    def _last_positions(self, records: Iterable[HandoverRecord]) -> dict[Instance, int]:
        out: dict[Instance, int] = {}
        for rec in records:
            if rec.state is HandoverState.ABORTED:
                continue
            for inst, pos in rec.instruction.switch_at.items():
                out[inst] = max(pos, out.get(inst, pos))
        return out

    def instruct_next(self, job_id: int, switch_at: int | Mapping[Instance, int]) -> Instruction | None:
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
                                    _gap(job.strategy))
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

    def _step_participants(self, task: int, step: Step) -> dict[str, frozenset[Instance]]:
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
        if any(r.task == task and r.kind == "vnodes" and r.state in _BEFORE_COMMIT for r in self.records.values()):
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

    def replace_operator(self, request: ReplaceOperatorRequest, switch_at: int | Mapping[Instance, int], *,
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
        partitions = _check_int("partitions", partitions, 1)
        same = [r for r in self.records.values() if r.kind == "code" and r.task == task
                and r.instruction.operator == op]  # type: ignore[union-attr]
        running = [r.handover_id for r in same
                   if r.state not in (HandoverState.COMPLETED, HandoverState.ABORTED)]
        if running:
            raise ValueError(f"operator {op!r} of task {task} is already being replaced "
                             f"(handover {running[0]})")
        current = self.code_versions.get((task, op), 0)
        if not _is_int(request.version) or request.version <= current:
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
        if rec.state not in _BEFORE_COMMIT:
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
        cut = _ORDER[HandoverState.CUT] <= _ORDER[rec.state] < _ORDER[HandoverState.ABORTED]
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
            if rec.state not in _BEFORE_COMMIT:
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
        if rec.state in _BEFORE_COMMIT:
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

    def _all_acked(self, rec: HandoverRecord, instances: Iterable[Instance], kind: AckKind) -> bool:
        acks = rec.acks.get(kind, {})
        for inst in instances:
            live = [r for r in self._replicas_of(inst) if r not in self.lost]
            if not live or any(acks.get(r) != self.attempts.get(r, 0) for r in live):
                return False
        return True

    def _advance(self, rec: HandoverRecord) -> None:
        if _ORDER[rec.state] < _ORDER[HandoverState.COMMITTED] or rec.state is HandoverState.ABORTED:
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
            if rec.state in _BEFORE_COMMIT:
                cancels.append(self._abort(rec, f"replica {replica} lost before the commit"))
            else:
                self._advance(rec)
        return tuple(cancels)

    def replica_restored(self, replica: ReplicaId, attempt: int) -> tuple[Instruction | CodeInstruction, ...]:
        """``replica`` runs again as incarnation ``attempt``: the committed instructions it takes
        part in (oldest first, marked committed), to install before it replays; it skips those
        its checkpoint already includes (a table or version at or past their epoch)."""
        current = self.attempts.get(replica, 0)
        if not _is_int(attempt) or attempt <= current:
            raise ValueError(f"attempt of restored replica {replica} must be an int > {current}, "
                             f"got {attempt!r}")
        self.attempts[replica] = attempt
        self.lost.discard(replica)
        return tuple(replace(rec.instruction, committed=True)
                     for rec in sorted(self.records.values(), key=lambda r: r.handover_id)
                     if replica[:2] in rec.instances
                     and rec.state not in (*_BEFORE_COMMIT, HandoverState.ABORTED))

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


@dataclass
class _Pending:
    key: int  # handover id (router) or version (code switch)
    order: int  # epoch or version
    position: int
    payload: Any
    committed: bool


class _SwitchQueue:
    """Switches armed at future positions, applied in order when their position is reached;
    an uncommitted one that is due blocks (raises) until committed or cancelled."""

    def __init__(self, position: int | None = None) -> None:
        self.pending: list[_Pending] = []
        self.position = position  # the last position handled

    def find(self, key: int) -> _Pending | None:
        return next((p for p in self.pending if p.key == key), None)

    def arm(self, pending: _Pending) -> None:
        _check_int("switch position", pending.position, 0)
        if self.position is not None and pending.position <= self.position:
            raise LateInstructionError(f"switch {pending.key} at position {pending.position} arrived after "
                                       f"position {self.position} was handled")
        if self.pending and pending.position <= self.pending[-1].position:
            raise ValueError(f"switch {pending.key} at position {pending.position} must come after the "
                             f"pending switch at {self.pending[-1].position}")
        self.pending.append(pending)

    def commit(self, key: int) -> None:
        p = self.find(key)
        if p is None:
            raise ValueError(f"no pending switch {key} to commit")
        p.committed = True

    def cancel(self, key: int) -> tuple[int, ...]:
        i = next((i for i, p in enumerate(self.pending) if p.key == key), None)
        if i is None:
            return ()
        if self.pending[i].committed:
            raise ValueError(f"switch {key} is committed: it cannot be cancelled")
        gone = tuple(p.key for p in self.pending[i:])  # later ones were built on it
        del self.pending[i:]
        return gone

    def blocked(self, position: int) -> bool:
        return any(not p.committed for p in self.pending if p.position <= position)

    def due(self, position: int) -> list[_Pending]:
        if not _is_int(position):
            raise ValueError(f"position must be an int, got {position!r}")
        if self.position is not None and position < self.position:
            raise ValueError(f"position {position} goes back (last handled: {self.position})")
        n = 0
        while n < len(self.pending) and self.pending[n].position <= position:
            if not self.pending[n].committed:
                raise SwitchNotCommittedError(f"switch {self.pending[n].key} is due at position "
                                              f"{self.pending[n].position} but not committed")
            n += 1
        applied = self.pending[:n]
        del self.pending[:n]
        self.position = position
        return applied


class VersionedRouter:
    """An upstream replica's routing to one keyed task: the table in force plus switches armed
    at future positions.  Both replicas of the upstream feed it the same positions, so they
    switch at the same element whenever each got the instruction (as long as before the
    position) and the commit (a due, uncommitted switch raises ``SwitchNotCommittedError``:
    wait and retry)."""

    def __init__(self, table: RoutingTable, num_key_groups: int, *, position: int | None = None) -> None:
        self.table = _check_table(table)
        self.num_key_groups = validate_num_key_groups(num_key_groups)
        self._queue = _SwitchQueue(position)

    @property
    def position(self) -> int | None:
        """The last position routed."""
        return self._queue.position

    @property
    def pending(self) -> tuple[tuple[int, int, bool], ...]:
        """Armed switches as (handover id, position, committed)."""
        return tuple((p.key, p.position, p.committed) for p in self._queue.pending)

    def arm(self, handover_id: int, table: RoutingTable, position: int, *, committed: bool = False) -> bool:
        """Install a switch to ``table`` at ``position``.  False: nothing new (the table is already
        in force, e.g. restored from a checkpoint after it, or the same switch again).  Raises
        ``LateInstructionError`` if ``position`` was already handled."""
        _check_table(table)
        if table.num_vnodes != self.table.num_vnodes:
            raise ValueError(f"table has {table.num_vnodes} vnodes, the router {self.table.num_vnodes}")
        known = self._queue.find(handover_id)
        if known is not None:
            if known.payload != table or known.position != position:
                raise ValueError(f"handover {handover_id} armed again with another table or position")
            known.committed = known.committed or committed
            return False
        if table.epoch <= self.table.epoch:
            return False
        last = self._queue.pending[-1].order if self._queue.pending else self.table.epoch
        if table.epoch != last + 1:
            raise ValueError(f"switch to epoch {table.epoch} does not follow epoch {last}")
        self._queue.arm(_Pending(handover_id, table.epoch, position, table, committed))
        return True

    def commit(self, handover_id: int) -> None:
        """The manager committed ``handover_id``.  A commit for a switch no longer pending (applied
        from a checkpoint) is ignored."""
        if self._queue.find(handover_id) is not None:
            self._queue.commit(handover_id)

    def cancel(self, handover_id: int) -> tuple[int, ...]:
        """Drop an uncommitted switch (and any armed after it); returns the dropped ids."""
        return self._queue.cancel(handover_id)

    def blocked(self, position: int) -> bool:
        """Whether an element at ``position`` must wait for a commit."""
        return self._queue.blocked(position)

    def advance(self, position: int) -> tuple[RoutingTable, ...]:
        """Apply the switches due at ``position``; returns the tables switched to (the runtime
        acks SWITCHED, opens / closes channels and, in KaZoo mode, emits the markers first)."""
        applied = self._queue.due(position)
        for p in applied:
            self.table = p.payload
        return tuple(p.payload for p in applied)

    def route(self, key_group: int, position: int) -> int:
        """The partition for an element of ``key_group`` at ``position``."""
        self.advance(position)
        return self.table.partition_of_key_group(key_group, self.num_key_groups)

    def snapshot(self) -> dict[str, Any]:
        """Checkpointable state (JSON-friendly)."""
        pending = [[p.key, p.position, p.payload.to_dict(), p.committed] for p in self._queue.pending]
        return {"table": self.table.to_dict(), "num_key_groups": self.num_key_groups,
                "position": self.position, "pending": pending}

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> VersionedRouter:
        """Inverse of ``snapshot``."""
        router = cls(RoutingTable.from_dict(data["table"]), data["num_key_groups"], position=data["position"])
        saved = router._queue.position
        router._queue.position = None  # re-arm what was armed before that position
        for key, position, table, committed in data["pending"]:
            router.arm(key, RoutingTable.from_dict(table), position, committed=committed)
        router._queue.position = saved
        return router


def _vnode_ranges(vnodes: Iterable[int], num_key_groups: int, num_vnodes: int) -> tuple[range, ...]:
    out: list[range] = []
    for v in sorted(set(vnodes)):
        r = vnode_key_groups(v, num_key_groups, num_vnodes)
        if out and out[-1].stop == r.start:
            out[-1] = range(out[-1].start, r.stop)
        elif len(r):
            out.append(r)
    return tuple(out)


def cut_key_groups(moves: Iterable[VnodeMove], origin: int, num_key_groups: int,
                   num_vnodes: int) -> tuple[range, ...]:
    """The key groups ``origin`` cuts into the final increment of a step (contiguous runs merged)."""
    return _vnode_ranges((m.vnode for m in moves if m.origin == origin), num_key_groups, num_vnodes)


def load_key_groups(moves: Iterable[VnodeMove], target: int, num_key_groups: int,
                    num_vnodes: int) -> tuple[range, ...]:
    """The key groups ``target`` loads (and holds records of) in a step."""
    return _vnode_ranges((m.vnode for m in moves if m.target == target), num_key_groups, num_vnodes)


def moved_key_groups(moves: Iterable[VnodeMove], origin: int, target: int, num_key_groups: int,
                     num_vnodes: int) -> tuple[range, ...]:
    """The key groups ``origin`` gives ``target`` in a step (what its cut for that target holds)."""
    return _vnode_ranges((m.vnode for m in moves if m.origin == origin and m.target == target), num_key_groups,
                         num_vnodes)


def _key_group_set(key_groups: Iterable[range | int]) -> frozenset[int]:
    out: set[int] = set()
    for kg in key_groups:
        if isinstance(kg, range):
            out.update(kg)
        else:
            out.add(_check_int("key group", kg, 0))
    return frozenset(out)


class OriginAlignment:
    """Origin side of a step: the origin may cut once the switch marker (LiveRobin: pulse ``P``;
    KaZoo: the handover marker) arrived on every input channel of the edge, because then every
    record routed to it under the old table has been consumed.  It never blocks a channel:
    after its marker a channel carries no record of the moved key groups."""

    def __init__(self, handover_id: int, channels: Iterable[int], key_groups: Iterable[range | int]) -> None:
        self.handover_id = handover_id
        self.channels = frozenset(channels)
        if not self.channels:
            raise ValueError("an origin needs at least one input channel")
        self.key_groups = _key_group_set(key_groups)
        self.marked: set[int] = set()

    @property
    def aligned(self) -> bool:
        """Every channel delivered its marker: cut now."""
        return self.marked == self.channels

    def marker(self, channel: int) -> bool:
        """The marker arrived on ``channel``; True exactly when this one completes the alignment."""
        if channel not in self.channels:
            raise ValueError(f"channel {channel} is not an input of handover {self.handover_id}'s origin")
        if channel in self.marked:
            raise ValueError(f"second marker of handover {self.handover_id} on channel {channel}")
        self.marked.add(channel)
        return self.aligned

    def record_ok(self, channel: int, key_group: int) -> bool:
        """False for a record of a moved key group after its channel's marker (a protocol
        violation to count and surface)."""
        return not (key_group in self.key_groups and channel in self.marked)


@dataclass(frozen=True)
class GateDecision:
    """``wait``: nothing was taken; wait until loaded and offer the same again.  Otherwise
    ``process`` lists the elements to process now, in order (possibly none: held)."""

    wait: bool
    process: tuple[Any, ...] = ()


class TargetGate:
    """Target side of a step: holds the input of the moved key groups until the state is loaded
    *and* the in-band release point is consumed, then hands the held elements back in arrival
    order.

    The release point is in-band (both target replicas consume it at the same element) because
    the two replicas finish loading at different wall-clock times: releasing "when loaded" would
    interleave the held records differently with the rest and give the two replicas different
    output sequences.  It is placed after the origin cut, so a replica that reaches it before
    its load finished may wait there without any cycle (the cut no longer depends on it).

    Records of other key groups pass (their state is independent).  An element without a key
    group (a watermark or an event-time timer tick) is held once anything is held, and then
    everything after it too, so no held record becomes late because of a watermark that came
    after it and nothing is reordered across event time.  Pulses are not offered: they are
    positions, not data, and are forwarded in place."""

    def __init__(self, handover_id: int, key_groups: Iterable[range | int]) -> None:
        self.handover_id = handover_id
        self.key_groups = _key_group_set(key_groups)
        self.held: list[Any] = []
        self.is_loaded = False
        self.released = False
        self._barrier = False

    def admit(self, element: Any, key_group: int | None) -> GateDecision:
        """Offer the next element in consumption order (``key_group`` None: an event-time element)."""
        if self.released:
            return GateDecision(False, (element,))
        moved = key_group is not None and key_group in self.key_groups
        if moved or self._barrier or (key_group is None and self.held):
            self._barrier = self._barrier or key_group is None
            self.held.append(element)
            return GateDecision(False, ())
        return GateDecision(False, (element,))

    def loaded(self) -> None:
        """The moved state is loaded on this replica."""
        self.is_loaded = True

    def release(self) -> GateDecision:
        """The in-band release point was consumed: the held elements to process now, or wait."""
        if self.released:
            return GateDecision(False, ())
        if not self.is_loaded:
            return GateDecision(True, ())
        self.released = True
        held, self.held = tuple(self.held), []
        return GateDecision(False, held)

    def snapshot(self) -> dict[str, Any]:
        """Checkpointable state: a checkpoint taken while holding keeps the held elements."""
        return {"handover_id": self.handover_id, "key_groups": sorted(self.key_groups),
                "held": list(self.held), "released": self.released, "barrier": self._barrier}

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> TargetGate:
        """Inverse of ``snapshot`` (the load is redone after a restore: ``is_loaded`` is False)."""
        gate = cls(data["handover_id"], data["key_groups"])
        gate.held = list(data["held"])
        gate.released = data["released"]
        gate._barrier = data["barrier"]
        return gate


class CodeSwitch:
    """Which function version of an operator handles the element at a position: version ``v``
    armed at ``P`` handles every element at position ``>= P``, so both replicas switch at the same
    element.  Armed and committed like a router switch (a due, uncommitted version raises
    ``SwitchNotCommittedError``)."""

    def __init__(self, version: int = 0, *, position: int | None = None) -> None:
        self.version = _check_int("version", version, 0)
        self._queue = _SwitchQueue(position)

    def arm(self, version: int, position: int, *, committed: bool = False) -> bool:
        """Install ``version`` from ``position`` on.  False: already in force or already armed."""
        _check_int("version", version, 0)
        known = self._queue.find(version)
        if known is not None:
            if known.position != position:
                raise ValueError(f"version {version} armed again at another position")
            known.committed = known.committed or committed
            return False
        if version <= self.version:
            return False
        last = self._queue.pending[-1].order if self._queue.pending else self.version
        if version <= last:
            raise ValueError(f"version {version} must be newer than the armed version {last}")
        self._queue.arm(_Pending(version, version, position, None, committed))
        return True

    def commit(self, version: int) -> None:
        """The manager committed ``version``."""
        if self._queue.find(version) is not None:
            self._queue.commit(version)

    def cancel(self, version: int) -> tuple[int, ...]:
        """Drop an uncommitted version (and later ones)."""
        return self._queue.cancel(version)

    def version_for(self, position: int) -> int:
        """The version that handles the element at ``position`` (positions never go back)."""
        for p in self._queue.due(position):
            self.version = p.order
        return self.version
