"""Runtime handover, the pure protocol core: rescale, rebalance, drain and operator replacement
(DESIGN §6 "Handover"; Rhino, paper 000 §4.1; Megaphone, paper 002; paper 001 §3.3.2).

This module owns

* the **planners** that turn an operation into moves: ``rescale``, ``move_vnodes`` and
  ``rebalance`` give vnode moves; ``plan_drain`` gives replica moves (draining an executor);
* the **strategies** that cut a set of vnode moves into ordered steps, one routing-table epoch
  and one switch position each: ``AllAtOnce``, ``Fluid`` and ``Batched`` (with a cap on bytes in
  flight), applied by ``plan_steps``;

and beside it, the protocol's words (:mod:`rhino_state.handover_messages`: states,
instructions, acks), the driver-side ``HandoverManager`` (:mod:`rhino_state.handover_manager`:
one state machine per step and per operator replacement, fed acknowledgements and replica
failures, deciding commit, abort or roll-forward) and the participant-side pieces a replica runs
(:mod:`rhino_state.handover_participants`: ``VersionedRouter`` for upstreams, ``OriginAlignment``
and ``cut_key_groups`` for the origin, ``TargetGate`` for the target, ``CodeSwitch`` for an
operator replacement).

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

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rhino_state.keys import RoutingTable
from transport.ids import PartitionId, ReplicaId

__all__ = [
    "AllAtOnce",
    "Batched",
    "Fluid",
    "LateInstructionError",
    "MoveRequest",
    "RebalanceRequest",
    "ReplaceOperatorRequest",
    "ReplicaMove",
    "RescaleRequest",
    "Step",
    "SwitchNotCommittedError",
    "Transfer",
    "VnodeMove",
    "apply_moves",
    "move_vnodes",
    "plan_drain",
    "plan_steps",
    "rebalance",
    "rescale",
]



class LateInstructionError(ValueError):
    """An instruction reached a participant that is already at or past the position it names."""


class SwitchNotCommittedError(RuntimeError):
    """A switch is due at this position but is not committed yet: wait for the commit or a cancel."""


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value  # type: ignore[return-value]


def check_table(table: object) -> RoutingTable:
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
        if not is_int(vnode) or not 0 <= vnode < num_vnodes:
            raise ValueError(f"{name}: unknown vnode {vnode!r}, vnodes are [0, {num_vnodes})")
        ok = is_int(value) if integral else (isinstance(value, (int, float)) and not isinstance(value, bool)
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
            check_int(f"VnodeMove {name}", getattr(self, name), 0)
        if self.origin == self.target:
            raise ValueError(f"vnode {self.vnode}: moving to its own partition {self.target}")


@dataclass(frozen=True)
class Transfer:
    """The vnodes one step moves from one origin to one target (one state transfer)."""

    origin: int
    target: int
    vnodes: tuple[int, ...]


def transfers_of(moves: Iterable[VnodeMove]) -> tuple[Transfer, ...]:
    groups: dict[tuple[int, int], list[int]] = {}
    for m in moves:
        groups.setdefault((m.origin, m.target), []).append(m.vnode)
    return tuple(Transfer(o, t, tuple(sorted(vs))) for (o, t), vs in sorted(groups.items()))


def apply_moves(table: RoutingTable, moves: Iterable[VnodeMove],
                parallelism: int | None = None) -> RoutingTable:
    """The next table (epoch + 1) with every move applied; ``parallelism`` optionally changes the
    number of partitions.  Equals ``table.moved(vnodes, target, parallelism=...)`` for moves to one
    target; raises ValueError for a move that does not fit ``table``."""
    check_table(table)
    new_p = table.parallelism if parallelism is None else check_int("parallelism", parallelism, 1)
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
    check_table(table)
    vnodes = list(vnodes)
    if not vnodes:
        raise ValueError("move_vnodes needs at least one vnode")
    if not is_int(target) or not 0 <= target < table.parallelism:
        raise ValueError(f"target partition {target!r} out of range [0, {table.parallelism})")
    seen: set[int] = set()
    for v in vnodes:
        if not is_int(v) or not 0 <= v < table.num_vnodes:
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
    check_table(table)
    num_vnodes = table.num_vnodes
    if not is_int(parallelism) or not 1 <= parallelism <= num_vnodes:
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
    check_table(table)
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
    elif not is_int(target) or not 0 <= target < table.parallelism:
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
        check_int("Fluid gap", self.gap, 1)


@dataclass(frozen=True)
class Batched:
    """Up to ``step_size`` vnodes and ``max_bytes`` of state per step, ``gap`` positions apart, so
    queues drain between steps (Megaphone's batched migration).  A single vnode larger than
    ``max_bytes`` goes alone."""

    step_size: int
    gap: int = 1
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        check_int("Batched step_size", self.step_size, 1)
        check_int("Batched gap", self.gap, 1)
        if self.max_bytes is not None:
            check_int("Batched max_bytes", self.max_bytes, 1)


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
        return transfers_of(self.moves)

    @property
    def joining(self) -> tuple[int, ...]:
        """New partitions: their channels open at this step."""
        return tuple(range(self.table_before.parallelism, self.table_after.parallelism))

    @property
    def leaving(self) -> tuple[int, ...]:
        """Removed partitions (empty after this step): their channels close at this step."""
        return tuple(range(self.table_after.parallelism, self.table_before.parallelism))


def step_gap(strategy: Strategy) -> int:
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
    check_table(table)
    moves = tuple(moves)
    start = check_int("start", start, 0)
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
    gap = step_gap(strategy)
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
               holders: Mapping[PartitionId, Iterable[int]] | None = None,
               groups: Mapping[PartitionId, Sequence[int]] | None = None,
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
    num_workers = check_int("num_workers", num_workers, 1)
    dead = set(dead)
    drained = sorted(set(drained))
    if not drained:
        raise ValueError("plan_drain needs at least one worker to drain")
    for w in drained:
        if not is_int(w) or not 0 <= w < num_workers:
            raise ValueError(f"unknown worker {w!r}: workers are [0, {num_workers})")
        if w in dead:
            raise ValueError(f"worker {w} is dead: its replicas are restored, not drained")
    if max_per_wave is not None:
        check_int("max_per_wave", max_per_wave, 1)
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
