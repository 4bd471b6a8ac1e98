"""The runtime side of a vnode handover (docs/handover.md), LiveRobin mode: what a replica does
with an instruction of :class:`rhino_state.handover.HandoverManager`, at positions both replicas
of a partition share (pulses), and the I/O at its edges.

Roles of a replica in one handover (an instance may have several):

* **upstream** (routes to the keyed task): its :class:`RouterSwitches` arms the new routing
  table at pulse ``P``; right after forwarding pulse ``P`` it switches (waiting there for the
  commit, or the cancel, if neither came yet) and acks SWITCHED;
* **origin** (loses the vnodes): when it forwards pulse ``P + 1`` for the first time, its merge
  has completed cycle ``P``: every record routed to it under the old table is consumed.  It cuts
  the moved key groups out of its state (read, then deleted), sends them to both replicas of
  the target and acks CUT with their digest;
* **target** (gains the vnodes): from the commit on it holds the records of the moved key groups
  (:class:`rhino_state.handover.TargetGate`); at pulse ``R`` (before forwarding it) it waits for the
  state if it has not arrived, loads it, processes the held records in arrival order and acks
  LOADED.

``R = P + k`` (``k >= 2``) is fixed in the instruction: a target stalled at ``R`` cannot deadlock the
origin's cut (docs/handover.md, "A simpler LiveRobin release point"), so no release record has
to be placed in the heartbeat log.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rhino_state import (
    AckKind,
    AckOutcome,
    AllAtOnce,
    Batched,
    Fluid,
    HandoverAck,
    HandoverManager,
    HandoverRecord,
    HandoverState,
    JobState,
    LateInstructionError,
    MoveRequest,
    RebalanceRequest,
    ReplaceOperatorRequest,
    RescaleRequest,
    RocksDBStateBackend,
    RoutingTable,
    SwitchNotCommittedError,
    TargetGate,
    VersionedRouter,
    VnodeMove,
    cut_key_groups,
    key_group,
    load_key_groups,
)
from rhino_state.cut import Change, CutEntry, cut_digest
from rhino_state.handover import Strategy

Instance = tuple[int, int]
ReplicaId = tuple[int, int, int]
# (handover id, epoch, kind, digest): what a replica reports through its worker's heartbeat
Ack = tuple[int, int, str, str]

# How often a replica blocked at a handover position looks at its stop flag.
WAIT_SLICE_S = 0.05


@dataclass(frozen=True)
class HandoverOrder:
    """One handover as the driver shows it to every worker (JSON-friendly in ``to_wire``)."""

    handover_id: int
    epoch: int
    task: int
    table: RoutingTable
    moves: tuple[VnodeMove, ...]
    switch_at: int  # pulse P: upstreams route with ``table`` after forwarding it
    release_at: int  # pulse R: targets load and release before forwarding it
    upstreams: frozenset[Instance]
    committed: bool = False
    cancelled: bool = False

    @property
    def origins(self) -> frozenset[int]:
        return frozenset(m.origin for m in self.moves)

    @property
    def targets(self) -> frozenset[int]:
        return frozenset(m.target for m in self.moves)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.handover_id, "epoch": self.epoch, "task": self.task, "table": self.table.to_dict(),
                "moves": [(m.vnode, m.origin, m.target) for m in self.moves], "switch_at": self.switch_at,
                "release_at": self.release_at, "upstreams": sorted(self.upstreams),
                "committed": self.committed, "cancelled": self.cancelled}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> HandoverOrder:
        return cls(d["id"], d["epoch"], d["task"], RoutingTable.from_dict(d["table"]),
                   tuple(VnodeMove(*m) for m in d["moves"]), d["switch_at"], d["release_at"],
                   frozenset(tuple(u) for u in d["upstreams"]), d["committed"], d["cancelled"])


@dataclass(frozen=True)
class CodeOrder:
    """An operator replacement as the driver shows it to every worker: ``operator`` of ``task``
    runs function ``version`` (``fn``, cloudpickled) from the elements after pulse ``switch_at``."""

    handover_id: int
    task: int
    operator: str
    version: int
    fn: bytes
    switch_at: int
    committed: bool = False
    cancelled: bool = False

    @property
    def epoch(self) -> int:
        return self.version  # acks of a replacement carry the version as their epoch

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "code", "id": self.handover_id, "task": self.task, "operator": self.operator,
                "version": self.version, "fn": self.fn, "switch_at": self.switch_at, "committed": self.committed,
                "cancelled": self.cancelled}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> CodeOrder:
        return cls(d["id"], d["task"], d["operator"], d["version"], d["fn"], d["switch_at"], d["committed"],
                   d["cancelled"])


def order_from_wire(d: Mapping[str, Any]) -> HandoverOrder | CodeOrder:
    return CodeOrder.from_wire(d) if d.get("kind") == "code" else HandoverOrder.from_wire(d)


class RouterSwitches:
    """An upstream replica's routing to every keyed task it feeds, switched at pulses.

    The worker thread arms, commits and cancels; the instance thread routes and calls
    :meth:`on_pulse` after forwarding each pulse (both under one lock)."""

    def __init__(self, tables: Mapping[int, RoutingTable], num_key_groups: int) -> None:
        self._routers = {task: VersionedRouter(table, num_key_groups) for task, table in tables.items()}
        self._ids: dict[tuple[int, int], tuple[int, int]] = {}  # (task, epoch) -> (handover id, epoch)
        self._lock = threading.Condition()

    def tables(self) -> dict[int, dict[str, Any]]:
        """The tables in force, for a checkpoint (switches armed for later pulses are not in it: a
        replica restored from it gets their orders again)."""
        with self._lock:
            return {task: router.table.to_dict() for task, router in self._routers.items()}

    def restore(self, tables: Mapping[int, Mapping[str, Any]]) -> None:
        """Route with the tables of the checkpoint this replica is restored from."""
        with self._lock:
            for task, data in tables.items():
                if task in self._routers:
                    self._routers[task] = VersionedRouter(RoutingTable.from_dict(data),
                                                          self._routers[task].num_key_groups)

    @property
    def tasks(self) -> frozenset[int]:
        return frozenset(self._routers)

    def num_vnodes(self, task: int) -> int:
        return self._routers[task].table.num_vnodes

    def partition_of(self, task: int, key_group: int) -> int:
        router = self._routers[task]
        return router.table.partition_of_key_group(key_group, router.num_key_groups)

    def arm(self, order: HandoverOrder) -> str:
        """Install, commit or cancel ``order``'s switch: "armed", "late" (pulse P was already
        forwarded), "done" (its table is in force already: restored from a checkpoint after the
        switch) or "cancelled"."""
        with self._lock:
            router = self._routers[order.task]
            if order.cancelled:
                router.cancel(order.handover_id)
                self._lock.notify_all()
                return "cancelled"
            if router.table.epoch >= order.table.epoch:
                return "done"
            try:
                router.arm(order.handover_id, order.table, order.switch_at, committed=order.committed)
            except LateInstructionError:
                return "late"
            self._ids[(order.task, order.table.epoch)] = (order.handover_id, order.epoch)
            if order.committed:
                router.commit(order.handover_id)
                self._lock.notify_all()
            return "armed"

    def on_pulse(self, h: int, stopping: Callable[[], bool]) -> list[tuple[int, int]]:
        """Pulse ``h`` was forwarded: apply the switches due (waiting for their commit or cancel);
        returns the (handover id, epoch) of those applied."""
        switched = []
        with self._lock:
            for task, router in self._routers.items():
                while True:
                    try:
                        tables = router.advance(h)
                    except SwitchNotCommittedError:
                        if stopping():
                            return switched
                        self._lock.wait(WAIT_SLICE_S)
                        continue
                    switched += [self._ids.pop((task, t.epoch)) for t in tables if (task, t.epoch) in self._ids]
                    break
        return switched


@dataclass(frozen=True)
class TargetCut:
    """What one origin partition's cut holds for one target partition: its entries in chunks,
    operators' in-memory state of the moved keys, the digest and count of the entries, and, when
    the origin has a checkpoint chain, the changes since its last checkpoint (``base``) in chunks,
    all a target holding that checkpoint needs."""

    chunks: list[list[CutEntry]]
    extras: dict[str, list]
    digest: str
    entries: int
    base: int | None = None
    changes: list[list[Change]] | None = None


@dataclass(frozen=True)
class DeltaCut:
    """A target's complete copy of an origin's changes since checkpoint ``base`` (rebuilt into the
    cut with that checkpoint's content of the moved key groups; ``digest`` and ``entries`` check it)."""

    handover_id: int
    origin: int
    base: int
    changes: list[Change]
    digest: str
    entries: int
    extras: dict[str, list]


@dataclass(frozen=True)
class OriginCut:
    """What an origin took out of its state: the entries, their digest, and the changes since its
    last checkpoint ``base`` (None: no checkpoint chain, or not asked for)."""

    entries: list[CutEntry]
    digest: str
    base: int | None = None
    changes: list[Change] | None = None


@dataclass
class _Step:
    order: HandoverOrder
    gate: TargetGate | None = None  # target role
    cut_pending: bool = False  # origin role
    # target: the cut of each origin partition that gives it vnodes, as it arrives (from either
    # replica of that origin: the first counts)
    cuts: dict[int, list[tuple[int, bytes, bytes]]] = field(default_factory=dict)
    origins: frozenset[int] = frozenset()
    chunks: dict[int, dict[int, list[tuple[int, bytes, bytes]]]] = field(default_factory=dict)  # until complete
    # target: each origin's in-memory operator state of the moved keys (operator name -> entries),
    # e.g. a window operator's fire index
    extras: dict[int, dict[str, list]] = field(default_factory=dict)
    # target: each origin's changes since a checkpoint this worker holds, by that checkpoint, as
    # their chunks arrive (the cut is rebuilt from the checkpoint once all are in)
    deltas: dict[int, dict[int, dict[int, list[Change]]]] = field(default_factory=dict)
    from_store: int = 0  # target: bytes of the cuts read from this worker's copy of the origins' checkpoints
    # target, wall clock: every origin's cut arrived, pulse R reached, the state loaded (reported
    # with the LOADED ack: the phases the driver cannot see)
    arrived_at: float | None = None
    release_reached_at: float | None = None
    loaded_at: float | None = None

    def times(self) -> dict[str, float]:
        """The target's phase times known so far and the bytes it read locally (for its LOADED ack)."""
        return {k: v for k, v in (("arrived", self.arrived_at), ("release", self.release_reached_at),
                                  ("loaded", self.loaded_at), ("from_store", self.from_store)) if v is not None}

    @property
    def entries(self) -> int:
        """State entries arrived from the origins so far (without joining their cuts)."""
        return sum(len(c) for c in self.cuts.values())

    @property
    def state(self) -> list[tuple[int, bytes, bytes]] | None:
        """Every origin's cut, once all arrived (in origin order)."""
        if not self.origins <= self.cuts.keys():
            return None
        return [e for origin in sorted(self.origins) for e in self.cuts[origin]]


class _Decisions:
    """Orders a replica may have to wait on at a pulse until it knows whether they were committed
    or cancelled (the worker thread updates them, the instance thread waits)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def _order(self, handover_id: int) -> Any:
        raise NotImplementedError

    def decided(self, handover_id: int, stopping: Callable[[], bool]) -> bool | None:
        """Wait until ``handover_id`` is committed (True) or cancelled (False); None: stopping."""
        with self._cond:
            while True:
                order = self._order(handover_id)
                if order.cancelled or order.committed:
                    return order.committed
                if stopping():
                    return None
                self._cond.wait(WAIT_SLICE_S)


class CodeSwitches(_Decisions):
    """Operator replacements armed on one replica: the function of an operator changes right after
    pulse P, on both replicas at the same element."""

    def __init__(self) -> None:
        super().__init__()
        self._orders: dict[int, CodeOrder] = {}
        self.position = 0  # the last pulse forwarded

    def _order(self, handover_id: int) -> CodeOrder:
        return self._orders[handover_id]

    @property
    def pending(self) -> bool:
        return bool(self._orders)

    def arm(self, order: CodeOrder) -> str:
        """Install, commit or cancel ``order``: "armed", "late" (pulse P already forwarded),
        "done" (committed, and this replica's checkpoint is past it) or "cancelled"."""
        with self._cond:
            known = self._orders.get(order.handover_id)
            if known is None and not order.cancelled and self.position >= order.switch_at:
                # committed: every live replica armed it in time, so this one was restored from a
                # checkpoint that already runs the new version
                return "done" if order.committed else "late"
            if known is not None or not order.cancelled:
                self._orders[order.handover_id] = order
                self._cond.notify_all()
            return "cancelled" if order.cancelled else "armed"

    def at_pulse(self, h: int) -> list[CodeOrder]:
        """Pulse ``h`` was forwarded: the replacements due from the next element on."""
        self.position = h
        if not self._orders:
            return []
        with self._cond:
            return [o for o in self._orders.values() if o.switch_at == h]

    def done(self, handover_id: int) -> None:
        with self._cond:
            self._orders.pop(handover_id, None)


class PartitionHandovers(_Decisions):
    """The origin and target roles of one replica of a keyed task's partition.

    A target gates the moved key groups from the moment it armed (records of them only come
    after an upstream switched, which needs the commit, but this replica may hear of the
    commit later than they arrive).  At its cut (P + 1) or release (R) point a replica that
    does not know yet whether the handover was committed or cancelled waits for the word."""

    def __init__(self, task: int, partition: int, num_key_groups: int, num_vnodes: int,
                 keep_cuts: bool = False) -> None:
        super().__init__()
        self.task, self.partition = task, partition
        self.keep_cuts = keep_cuts  # Rhino: cuts are kept for replicas restored from earlier checkpoints
        self.num_key_groups, self.num_vnodes = num_key_groups, num_vnodes
        self._steps: dict[int, _Step] = {}
        # a target whose chain only has windows with mergeable aggregators serves the moved keys
        # from the switch on instead of holding their records (set when the chain is built)
        self.serve_through = False
        self._awaited: frozenset[int] = frozenset()  # serving: key groups whose moved state is not merged in
        self.position = 0  # the last pulse forwarded
        self.moved_entries = 0  # state entries cut or loaded here
        self.held_records = 0
        # Rhino: this origin's cuts, per target partition, kept until the driver says every
        # target's restore point is past the release: a target replica restored from an earlier
        # checkpoint (or whose worker did not hold the checkpoint a delta applies to, or whose local
        # origin replica failed) fetches its cut (the origin's own checkpoints no longer have it)
        self._kept: dict[int, dict[int, TargetCut]] = {}
        # Rhino: the cuts this target completed (origin -> entries and extras; chunked the first time
        # they are asked for), kept as long: the twin target replica, restored from an earlier
        # checkpoint after every origin replica that kept the cut was lost, fetches it here
        self._received: dict[int, dict[int, tuple[list[CutEntry], dict[str, list]] | TargetCut]] = {}

    # -- worker thread ------------------------------------------------------------------------
    def arm(self, order: HandoverOrder) -> str:
        """Install, commit or cancel ``order``: "armed", "late" (past its position), "done"
        (committed, and this replica's checkpoint is past it) or "cancelled"."""
        with self._cond:
            step = self._steps.get(order.handover_id)
            if order.cancelled:
                if step is not None:
                    step.order = order
                    self._cond.notify_all()
                return "cancelled"
            if step is None:
                origin, target = self.partition in order.origins, self.partition in order.targets
                if (origin and self.position > order.switch_at) or (target and self.position >= order.release_at):
                    # committed: every live replica armed it in time, so this one was restored from a
                    # checkpoint that already has the cut or the loaded state
                    return "done" if order.committed else "late"
                step = self._steps[order.handover_id] = _Step(order, cut_pending=origin)
                if target:
                    step.origins = frozenset(m.origin for m in order.moves if m.target == self.partition)
                    groups = load_key_groups(order.moves, self.partition, self.num_key_groups, self.num_vnodes)
                    step.gate = TargetGate(order.handover_id, () if self.serve_through else groups)
                    self._recount_awaited()
            elif order.committed and not step.order.committed:
                step.order = order
                self._cond.notify_all()
            return "armed"

    def state_arrived(self, handover_id: int, origin: int, entries: list[tuple[int, bytes, bytes]],
                      chunk: int = 0, chunks: int = 1, extras: dict[str, list] | None = None) -> None:
        """Chunk ``chunk`` of ``chunks`` of origin partition ``origin``'s cut of ``handover_id`` for
        this partition.  Both origin replicas cut the same entries in the same order and chunk them
        alike, so a chunk from either counts (the first); the cut is complete with every chunk."""
        with self._cond:
            step = self._steps.get(handover_id)
            if step is None or step.gate is None or origin not in step.origins or origin in step.cuts:
                return
            parts = step.chunks.setdefault(origin, {})
            parts.setdefault(chunk, entries)
            if chunk == 0:
                step.extras.setdefault(origin, extras or {})
            if len(parts) == chunks:
                self._cut_complete(step, origin, [e for i in range(chunks) for e in parts[i]])

    def cut_rebuilt(self, handover_id: int, origin: int, entries: list[tuple[int, bytes, bytes]],
                    extras: dict[str, list], from_store: int) -> None:
        """Origin partition ``origin``'s whole cut of ``handover_id``, rebuilt here from this worker's
        copy of its checkpoint (``from_store`` bytes of it) and the changes since."""
        with self._cond:
            step = self._steps.get(handover_id)
            if step is None or step.gate is None or origin not in step.origins or origin in step.cuts:
                return
            step.extras.setdefault(origin, extras)
            step.from_store += from_store
            self._cut_complete(step, origin, entries)

    def _cut_complete(self, step: _Step, origin: int, entries: list[tuple[int, bytes, bytes]]) -> None:
        step.cuts[origin] = entries
        if self.keep_cuts:
            self._received.setdefault(step.order.handover_id, {})[origin] = (entries, step.extras.get(origin, {}))
        step.chunks.pop(origin, None)
        step.deltas.pop(origin, None)
        if step.origins <= step.cuts.keys():
            step.arrived_at = time.time()
        self._cond.notify_all()

    def delta_arrived(self, handover_id: int, origin: int, base: int, changes: list[Change], chunk: int,
                      chunks: int, digest: str, entries: int, extras: dict[str, list] | None = None
                      ) -> DeltaCut | None:
        """Chunk ``chunk`` of ``chunks`` of origin partition ``origin``'s changes since its checkpoint
        ``base``, for this partition; the complete :class:`DeltaCut` once every chunk is in (to be
        rebuilt with that checkpoint, then given to :meth:`cut_rebuilt`), else None.  Chunks are
        collected per ``base``: a chunk from either origin replica counts, as long as they agree on it."""
        with self._cond:
            step = self._steps.get(handover_id)
            if step is None or step.gate is None or origin not in step.origins or origin in step.cuts:
                return None
            parts = step.deltas.setdefault(origin, {}).setdefault(base, {})
            if chunk == 0:
                step.extras.setdefault(origin, extras or {})
            if chunk in parts or len(parts) == chunks:
                return None  # a repeat (the other origin replica's copy), or already complete
            parts[chunk] = changes
            if len(parts) < chunks:
                return None
            return DeltaCut(handover_id, origin, base, [c for i in range(chunks) for c in parts[i]], digest,
                            entries, step.extras.get(origin, {}))

    def kept_cut(self, handover_id: int, target: int) -> TargetCut | None:
        """This origin's kept cut of ``handover_id`` for partition ``target`` (None: not kept)."""
        with self._cond:
            return self._kept.get(handover_id, {}).get(target)

    def received_cut(self, handover_id: int, origin: int, chunk_bytes: int) -> TargetCut | None:
        """Origin partition ``origin``'s cut of ``handover_id`` as this target received it, chunked
        as the origin chunks it (entries in key order, :func:`chunk_entries`), so that chunks
        fetched here and from an origin replica fit together (None: not received).  Chunked once,
        on the first ask (a fetch asks once per chunk)."""
        with self._cond:
            got = self._received.get(handover_id, {}).get(origin)
        if got is None or isinstance(got, TargetCut):
            return got
        entries = sorted(got[0])
        cut = TargetCut(chunk_entries(entries, chunk_bytes), got[1], cut_digest(entries), len(entries))
        with self._cond:
            received = self._received.get(handover_id)
            if received is not None and received.get(origin) is got:
                received[origin] = cut
        return cut

    def forget_kept(self, still_needed: Collection[int]) -> None:
        """Drop the kept and received cuts of the handovers the driver no longer lists."""
        with self._cond:
            for table in (self._kept, self._received):
                for hid in [h for h in table if h not in still_needed]:
                    del table[hid]

    def missing_cuts(self, blocked_for: float | None = None) -> list[tuple[int, int]]:
        """(handover id, origin partition) of the cuts this target still waits for; with
        ``blocked_for``, only those it has waited for at its release pulse that long (seconds)."""
        now = time.time()
        with self._cond:
            return [(hid, o) for hid, s in self._steps.items() if s.gate is not None and not s.order.cancelled
                    and (blocked_for is None or (s.release_reached_at is not None
                                                 and now - s.release_reached_at >= blocked_for))
                    for o in sorted(s.origins - s.cuts.keys())]

    # -- instance thread ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self._steps)

    def holds_records_at(self, h: int) -> bool:
        """Whether, right after forwarding pulse ``h``, this target may hold records it has not
        processed (between a switch and its release): its checkpoint at ``h`` is skipped, as it
        would lose them (both replicas skip alike: the order's pulses decide)."""
        with self._cond:
            return any(s.gate is not None and s.order.switch_at < h < s.order.release_at
                       for s in self._steps.values())

    def holds_records(self) -> bool:
        """KaZoo (checkpoints at order numbers): whether this target may hold records it has not
        processed now, from its switch pulse on or with anything held, until its release.  The
        order decides both, so both replicas skip the same checkpoints."""
        with self._cond:
            return any(s.gate is not None and (s.gate.held or self.position >= s.order.switch_at)
                       for s in self._steps.values())

    def keep(self, handover_id: int, per_target: dict[int, TargetCut]) -> None:
        with self._cond:
            self._kept[handover_id] = per_target

    @property
    def gating(self) -> bool:
        """Whether a target step may hold records (read by the instance thread per element, without
        the lock: a snapshot of the steps, which the heartbeat thread adds and removes)."""
        return any(s.gate is not None for s in list(self._steps.values()))

    def gate(self, element: Any, key_group: int | None) -> tuple[Any, ...]:
        """Offer an input element (data with its key group, or None for a watermark) to every
        target step; what to process now, in order."""
        return _elements(self._through(list(self._steps.values()), ((element, key_group),), count=True))

    def _through(self, steps: list[_Step], items: tuple[tuple[Any, int | None], ...],
                 count: bool = False) -> tuple[tuple[Any, int | None], ...]:
        """Pass (element, key group) pairs through the gates of ``steps`` in order; the pairs no
        gate holds.  A gate holds the pair itself, so what it lets go later still has its key
        group for the gates after it."""
        for step in steps:
            if step.gate is None:
                continue
            nxt: tuple[tuple[Any, int | None], ...] = ()
            for item in items:
                taken = step.gate.admit(item, item[1]).process
                self.held_records += int(count and not taken)
                nxt += taken
            items = nxt
        return items

    def _let_go(self, step: _Step, held: tuple[tuple[Any, int | None], ...]) -> tuple[Any, ...]:
        """What ``step``'s gate let go, through the gates of the steps armed after it: a step
        cancelled before its release pulse can hold the records of a later step over the same key
        groups (the retry of a cancelled step is armed while the cancelled gate is still up), and
        those must wait for that step's state as well."""
        with self._cond:
            steps = list(self._steps.values())
        later = steps[steps.index(step) + 1:] if step in steps else steps
        return _elements(self._through(later, held))

    def at_pulse(self, h: int) -> tuple[list[HandoverOrder], list[_Step]]:
        """Pulse ``h`` is being forwarded for the first time: the cuts (h = P + 1) and releases
        (h = R) due here."""
        self.position = h
        if not self._steps:
            return [], []
        with self._cond:
            cuts = [s.order for s in self._steps.values() if s.cut_pending and h == s.order.switch_at + 1]
            releases = [s for s in self._steps.values() if s.gate is not None and h == s.order.release_at]
        return cuts, releases

    def _order(self, handover_id: int) -> HandoverOrder:
        return self._steps[handover_id].order

    def cut_groups(self, order: HandoverOrder) -> list[range]:
        """The key groups this origin gives away in ``order``."""
        return list(cut_key_groups(order.moves, self.partition, self.num_key_groups, self.num_vnodes))

    def cut(self, order: HandoverOrder, backend: RocksDBStateBackend, incremental: bool = False) -> OriginCut:
        """Take the moved key groups out of the state: their entries, a digest of them and, if
        ``incremental``, their changes since the last checkpoint (read before they are deleted)."""
        backend.flush()
        groups = self.cut_groups(order)
        changes = backend.changes_in(groups) if incremental else None
        base = backend.last_checkpoint_id if changes is not None else None
        entries: list[tuple[int, bytes, bytes]] = []
        for r in groups:
            entries += list(backend.iter_key_groups(r))
        for kg, rest, _ in entries:
            backend.delete(kg, rest)
        self.moved_entries += len(entries)
        self._finish(order.handover_id, origin=True)
        return OriginCut(entries, cut_digest(entries), base, changes)

    def awaited_key_groups(self) -> frozenset[int]:
        """Serving through a move: the key groups whose moved state is not merged in yet (their
        windows must not fire before); empty otherwise."""
        return self._awaited

    def release(self, step: _Step, backend: RocksDBStateBackend, stopping: Callable[[], bool],
                merge: Callable[[bytes, bytes, bytes], bytes] | None = None) -> tuple[Any, ...] | None:
        """At pulse R of a committed handover: wait for the state of every origin, load it, and
        hand back the held elements (None: stopping).  Serving through: ``merge(rest, moved,
        served)`` combines a moved entry with the one this replica built since the switch."""
        assert step.gate is not None
        step.release_reached_at = time.time()
        with self._cond:
            while (state := step.state) is None:
                if stopping():
                    return None
                self._cond.wait(WAIT_SLICE_S)
        for kg, rest, value in state:
            served = backend.get(kg, rest) if merge is not None else None
            backend.put(kg, rest, value if served is None else merge(rest, value, served))
        self.moved_entries += len(state)
        step.loaded_at = time.time()
        step.gate.loaded()
        held = self._let_go(step, step.gate.release().process)
        self._finish(step.order.handover_id, origin=False)
        return held

    def drop(self, step: _Step) -> tuple[Any, ...]:
        """A cancelled handover: stop gating.  What its gate holds is not its own (no upstream
        switched for it) but a later step's over the same key groups, which that step's gate takes."""
        held: tuple[Any, ...] = ()
        if step.gate is not None:
            step.gate.loaded()
            held = self._let_go(step, step.gate.release().process)
        with self._cond:
            self._steps.pop(step.order.handover_id, None)
            self._recount_awaited()
        return held

    def step(self, handover_id: int) -> _Step | None:
        with self._cond:
            return self._steps.get(handover_id)

    def _finish(self, handover_id: int, *, origin: bool) -> None:
        with self._cond:
            step = self._steps.get(handover_id)
            if step is None:
                return
            if origin:
                step.cut_pending = False
            else:
                step.gate = None
                self._recount_awaited()
            if not step.cut_pending and step.gate is None:
                del self._steps[handover_id]

    def _recount_awaited(self) -> None:
        self._awaited = frozenset(kg for s in self._steps.values() if s.gate is not None and self.serve_through
                                  for r in load_key_groups(s.order.moves, self.partition, self.num_key_groups,
                                                           self.num_vnodes) for kg in r)


def _elements(items: Iterable[tuple[Any, int | None]]) -> tuple[Any, ...]:
    """The elements of (element, key group) pairs."""
    return tuple(element for element, _ in items)


def chunk_entries(entries: list[Any], max_bytes: int) -> list[list[Any]]:
    """``entries`` (cut entries, or changes whose value may be None) in order, cut into chunks of
    at most about ``max_bytes`` (an entry larger than that goes alone); at least one chunk, empty
    when there is nothing."""
    chunks: list[list[Any]] = [[]]
    size = 0
    for entry in entries:
        n = len(entry[1]) + len(entry[2] or b"") + 16
        if chunks[-1] and size + n > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += n
    return chunks


def vnode_bytes(backend: RocksDBStateBackend, num_key_groups: int, num_vnodes: int) -> list[int]:
    """Keyed state bytes (key + value, as stored) per vnode: what moving each would transfer."""
    backend.flush()
    sizes = [0] * num_vnodes
    for kg, rest, value in backend.iter_key_groups(range(num_key_groups)):
        sizes[((kg + 1) * num_vnodes - 1) // num_key_groups] += 2 + len(rest) + len(value)  # vnode_of, inlined
    return sizes


def split_cut(order: HandoverOrder, origin: int, cut: OriginCut, extras: Mapping[str, list], num_key_groups: int,
              chunk_bytes: int) -> dict[int, TargetCut]:
    """Origin partition ``origin``'s cut of ``order``, per target partition: its state entries in
    chunks of about ``chunk_bytes`` (:func:`chunk_entries`, cut once for every send and fetch), their
    digest and count, the changes since the origin's last checkpoint in chunks (if the cut has
    them) and operators' in-memory state of the moved keys (operator -> entries whose second item is
    the encoded key)."""
    def target_of(kg: int) -> int:
        return order.table.partition_of_key_group(kg, num_key_groups)

    out = {}
    for target in sorted({m.target for m in order.moves if m.origin == origin}):
        mine = [e for e in cut.entries if target_of(e[0]) == target]
        changes = None if cut.changes is None else \
            chunk_entries([c for c in cut.changes if target_of(c[0]) == target], chunk_bytes)
        out[target] = TargetCut(chunk_entries(mine, chunk_bytes),
                                {op: [e for e in items if target_of(key_group(e[1], num_key_groups)) == target]
                                 for op, items in extras.items()},
                                cut_digest(mine), len(mine), cut.base, changes)
    return out


# The release margin of a task's first step, before any step taught it (:class:`ReleaseMargin`).
DEFAULT_RELEASE_S = 0.15


class ReleaseMargin:
    """How long after the switch pulse a task's targets release (the margin of ``R = P + k``),
    learnt from its steps so far.

    The moved keys' records wait from the switch to the release, so the margin is latency for
    them; a target that reaches the release before its state stalls there with every key until
    the state is in.  What a step needs is the time from the switch until every cut is at the
    targets (alignment, cut, transfer), modelled as ``fixed + bytes / rate``.  The margin is
    ``safety`` times the prediction plus one pulse; ``fixed`` is the (lower) median of the recent steps'
    residues, ``bytes`` the step's planned bytes or, unknown, its vnodes times the largest recent
    bytes per vnode.  Before any step: ``default_s``.

    The median, not the largest: as long as a step moves more than a hundredth of the records, a
    second's p99 is the moved keys' wait whether they wait for the margin or the target stalls
    until its state is in, so a margin set by one slow step would cost every later step of the
    history that wait for nothing.  (With the largest, one step of the KaZoo rescale benchmark
    whose alignment took 1.2 s set the next four margins to 1.9 s: held 2 s each, the rescale
    twice as long as the one before it.)"""

    def __init__(self, period_s: float, default_s: float = DEFAULT_RELEASE_S, safety: float = 1.5,
                 rate_bytes_per_s: float = 50e6, history: int = 8, max_s: float = 5.0) -> None:
        self.period_s, self.default_s, self.safety = period_s, default_s, safety
        self.rate, self.max_s = rate_bytes_per_s, max_s
        self._seen: deque[tuple[int, int, float]] = deque(maxlen=history)  # (vnodes, bytes, need s)

    def observe(self, vnodes: int, moved_bytes: int, need_s: float) -> None:
        """A completed step of ``vnodes`` moved ``moved_bytes``; its cuts were at the targets
        ``need_s`` after the switch."""
        if vnodes > 0 and need_s >= 0:
            self._seen.append((vnodes, moved_bytes, need_s))

    def margin_s(self, vnodes: int, planned_bytes: int | None = None) -> float:
        """The margin for a step of ``vnodes`` (``planned_bytes`` of state, if measured)."""
        if not self._seen:
            return self.default_s
        fixed = max(self.period_s, statistics.median_low(need - b / self.rate for _, b, need in self._seen))
        size = planned_bytes if planned_bytes is not None else vnodes * max(b / v for v, b, _ in self._seen)
        return min(self.max_s, max(2 * self.period_s, self.safety * (fixed + size / self.rate) + self.period_s))


class HandoverCoordinator:
    """Driver side: the :class:`HandoverManager`, the orders every worker is shown, and the acks the
    workers send back (the job master calls it under its lock; no I/O here)."""

    def __init__(self, plan: Any, retain: bool = False, max_bytes_in_flight: int | None = None,
                 period_s: float = 0.01) -> None:
        upstreams: dict[int, list[Instance]] = {t: [] for t in plan.routing}
        for task in plan.tasks:
            for edge in task.outputs:
                if edge.partitioning == "hash" and edge.dst_task in upstreams:
                    upstreams[edge.dst_task] += [(task.id, p) for p in range(task.parallelism)]
        self.plan = plan
        self.manager = HandoverManager(plan.routing, upstreams, replicas=plan.replicas,
                                       max_bytes_in_flight=max_bytes_in_flight)
        self.orders: dict[int, HandoverOrder | CodeOrder] = {}
        self._cut_entries: dict[int, dict[int, int]] = {}  # handover id -> origin partition -> entries cut
        self._deferred: list[HandoverAck] = []  # LOADED acks that came before the release was placed
        # Rhino (``retain``): completed orders, kept until every participant's restore point is past
        # them, for replicas restored from an earlier checkpoint to replay them (and the origins keep
        # their cuts as long as the order is listed here)
        self.retain = retain
        self.history: dict[int, HandoverOrder | CodeOrder] = {}
        # handover id -> participant instance -> the last checkpoint it had taken when it acted
        # (switched, cut, loaded): a restore point past it includes the action
        self._acted_after: dict[int, dict[Instance, int]] = {}
        # handover id -> what happened -> instance -> wall-clock time (the first replica's) or bytes
        # cut: the step's timeline (:meth:`timeline`), kept for the last TIMELINES handovers
        self._times: dict[int, dict[str, dict[Instance, float]]] = {}
        self.period_s = period_s
        self._margins: dict[int, ReleaseMargin] = {}  # per keyed task
        self._pruned: dict[int, HandoverRecord] = {}  # records the manager let go, for the driver's reports

    def start_move(self, task: int, vnodes: Iterable[int], target: int, switch_at: int,
                   release_at: int) -> HandoverOrder:
        """Plan and instruct the move of ``vnodes`` of ``task`` to partition ``target`` in one step
        at pulse ``switch_at`` (the targets release at ``release_at``); ValueError for a bad request."""
        job = self.start_job(task, vnodes, target, AllAtOnce())
        order = self.instruct_next(job, switch_at, release_at)
        if order is None:
            raise ValueError(f"task {task}: another handover is not committed yet, or a participant is lost")
        return order

    def start_job(self, task: int, vnodes: Iterable[int], target: int, strategy: Strategy,
                  sizes: Sequence[int] | None = None) -> int:
        """Plan the move of ``vnodes`` of ``task`` to ``target`` in steps (``strategy``; ``sizes``:
        state bytes per vnode, for a byte cap); its job id."""
        return self.manager.submit(MoveRequest(task, tuple(vnodes), target), strategy, sizes=sizes).job_id

    def start_rescale(self, task: int, parallelism: int, strategy: Strategy,
                      sizes: Sequence[int] | None = None) -> int:
        """Plan taking ``task`` to ``parallelism`` partitions owning vnodes (the fewest moves; the
        partitions beyond it end with none), in steps; its job id.  ValueError beyond the
        partitions the task hosts."""
        hosted = self.plan.task(task).parallelism
        if not isinstance(parallelism, int) or not 1 <= parallelism <= hosted:
            raise ValueError(f"task {self.plan.task(task).name!r} hosts {hosted} partitions (its max_parallelism): "
                             f"it can run on 1 to {hosted} of them, not {parallelism!r}")
        return self.manager.submit(RescaleRequest(task, parallelism), strategy, sizes=sizes).job_id

    def start_rebalance(self, task: int, load_per_vnode: Sequence[float], fraction: float, target: int | None,
                        strategy: Strategy, sizes: Sequence[int] | None = None) -> int:
        """Plan moving up to ``fraction`` of the busiest partition's vnodes, heaviest first, to the
        least loaded partition (or ``target``) as long as each move lowers the larger load; its job
        id (a job with no step when nothing would improve)."""
        return self.manager.submit(RebalanceRequest(task, tuple(load_per_vnode), fraction, target), strategy,
                                   sizes=sizes).job_id

    def moved_entries(self, handover_id: int) -> int:
        """State entries the origins of ``handover_id`` cut (one replica of each origin counted)."""
        return sum(self._cut_entries.get(handover_id, {}).values())

    def instruct_next(self, job_id: int, switch_at: int, release_at: int) -> HandoverOrder | None:
        """Instruct the job's next step at these pulses (None: not now, e.g. the previous step is
        not completed)."""
        if release_at < switch_at + 2:
            raise ValueError(f"release pulse {release_at} must be at least 2 after the switch {switch_at}")
        instruction = self.manager.instruct_next(job_id, switch_at)
        if instruction is None:
            return None
        order = HandoverOrder(instruction.handover_id, instruction.epoch, instruction.task, instruction.table,
                              instruction.moves, switch_at, release_at, instruction.participants["upstream"])
        self.orders[order.handover_id] = order
        return order

    def job_state(self, job_id: int) -> JobState:
        return self.manager.job(job_id).state

    def start_replace(self, task: int, operator: str, fn: bytes, switch_at: int) -> CodeOrder:
        """Instruct every replica of ``task`` to run ``fn`` (cloudpickled) as ``operator`` from pulse
        ``switch_at`` on (the next version of that operator)."""
        version = self.manager.code_versions.get((task, operator), 0) + 1
        instruction = self.manager.replace_operator(ReplaceOperatorRequest(task, operator, version), switch_at,
                                                    partitions=self.plan.task(task).parallelism)
        order = CodeOrder(instruction.handover_id, task, operator, version, fn, switch_at)
        self.orders[order.handover_id] = order
        return order

    def on_acks(self, acks: Iterable[tuple], now: float | None = None) -> list[str]:
        """Feed the acks of one heartbeat (received at wall-clock ``now``); commits, releases and
        completions follow.  Returns what happened, for the job's event log."""
        events: list[str] = []
        now = time.time() if now is None else now
        for hid, epoch, replica, kind, digest, entries, attempt, checkpoint, *more in acks:
            ack = HandoverAck(hid, epoch, tuple(replica), AckKind(kind), attempt, digest)
            if kind in _ACTIONS:  # its checkpoints after this one include what it did
                acted = self._acted_after.setdefault(hid, {})
                acted[tuple(replica[:2])] = max(checkpoint, acted.get(tuple(replica[:2]), checkpoint))
                if more and hid in self.orders:
                    self._note_times(hid, kind, tuple(replica[:2]), more[0])
            rec = self.manager.records.get(hid)
            if ack.kind is AckKind.LOADED and rec is not None and not rec.released:
                self._deferred.append(ack)
                continue
            outcome = self.manager.ack(ack)
            if ack.kind is AckKind.CUT and outcome is AckOutcome.ACCEPTED:
                if hid not in self._cut_entries:
                    for old in sorted(self._cut_entries)[:-TIMELINES]:  # (kept as long as timelines)
                        del self._cut_entries[old]
                cuts = self._cut_entries.setdefault(hid, {})
                cuts[replica[1]] = max(cuts.get(replica[1], 0), entries)
            events += self._advance(hid, now)
        return events

    def _note_times(self, hid: int, kind: str, inst: Instance, times: Mapping[str, Any]) -> None:
        """Keep the earliest replica's time of each thing ``inst`` did (the first copy is what its
        downstreams take) and the bytes an origin cut."""
        if hid not in self._times:
            self._times[hid] = {}
            for old in sorted(self._times)[:-TIMELINES]:
                del self._times[old]
        mine = self._times[hid]
        for name, value in times.items():
            if not isinstance(value, (int, float)):
                continue
            what = _ACTION_TIME[kind] if name == "at" else name
            seen = mine.setdefault(what, {})
            seen[inst] = max(seen.get(inst, value), value) if what in _AMOUNTS else min(seen.get(inst, value), value)

    def timeline(self, hid: int) -> dict[str, float | None]:
        """Wall-clock times of a step, each when the *last* participant of its role had done it
        (through its first replica): ``committed`` and ``completed`` (the driver learnt it),
        ``switched`` (upstreams rerouted at the switch pulse), ``cut`` (origins cut), ``arrived``
        (every cut reached a target), ``release`` (targets reached the release pulse), ``loaded``,
        ``caught_up`` (targets processed the records they held); None: not (yet) known."""
        mine = self._times.get(hid, {})
        return {name: max(mine[name].values()) if mine.get(name) else None for name in TIMELINE}

    def release_margin(self, task: int) -> ReleaseMargin:
        """The release margin of ``task``'s steps, learnt from its completed ones."""
        return self._margins.setdefault(task, ReleaseMargin(self.period_s))

    def next_release_s(self, job_id: int, sizes: Sequence[int] | None = None) -> float:
        """The release margin for the job's next step (``sizes``: measured bytes per vnode)."""
        job = self.manager.job(job_id)
        if job.next_index >= len(job.steps):
            return self.release_margin(job.task).default_s
        step = job.steps[job.next_index]
        planned = sum(sizes[v] for v in step.vnodes) if sizes else None
        return self.release_margin(job.task).margin_s(len(step.vnodes), planned)

    def moved_bytes(self, hid: int) -> int:
        """Key + value bytes the origins of ``hid`` cut (one replica of each origin counted)."""
        return int(sum(self._times.get(hid, {}).get("bytes", {}).values()))

    def shipped_bytes(self, hid: int) -> int:
        """Key + value bytes the origins of ``hid`` sent over the network to the targets' workers
        (the most one replica of each origin sent; its twin sends about as much)."""
        return int(sum(self._times.get(hid, {}).get("shipped", {}).values()))

    def held_records(self, hid: int) -> int:
        """Records of the moved keys the targets of ``hid`` held until the release (the most one
        replica of each target held)."""
        return int(sum(self._times.get(hid, {}).get("held", {}).values()))

    def served(self, hid: int) -> bool:
        """Whether every target of ``hid`` served the moved keys from the switch on (windows with
        mergeable aggregators) instead of holding their records until the release."""
        seen = self._times.get(hid, {}).get("served", {})  # (only targets ack LOADED)
        return bool(seen) and all(seen.values())

    def store_bytes(self, hid: int) -> int:
        """Key + value bytes the targets of ``hid`` read from their workers' copies of the origins'
        checkpoints instead of receiving them (the most one replica of each target read)."""
        return int(sum(self._times.get(hid, {}).get("from_store", {}).values()))

    def _stamp(self, hid: int, what: str, now: float) -> None:
        self._times.setdefault(hid, {}).setdefault(what, {})[(-1, -1)] = now

    def _advance(self, hid: int, now: float) -> list[str]:
        rec = self.manager.records.get(hid)
        order = self.orders.get(hid)
        if rec is None or order is None:
            return []
        name = self.plan.task(order.task).name
        events = []
        if rec.state is HandoverState.ARMED:
            self._stamp(hid, "committed", now)
            self.manager.commit(hid)
            self.orders[hid] = order = replace(order, committed=True)
            release = f", release at {order.release_at}" if isinstance(order, HandoverOrder) else ""
            events.append(f"handover {hid} of {name}: every participant armed; committed (switch at pulse "
                          f"{order.switch_at}{release})")
        if rec.state is HandoverState.ABORTED and not order.cancelled:
            self.orders[hid] = replace(order, cancelled=True)
            events.append(f"handover {hid} of {name} cancelled: {rec.reason}")
        if isinstance(order, CodeOrder):
            if rec.state is HandoverState.COMPLETED and hid in self.orders:
                self._stamp(hid, "completed", now)
                self._completed(hid)
                events.append(f"operator {order.operator!r} of {name} replaced by version {order.version} on every "
                              f"replica, from pulse {order.switch_at} on")
            return events
        if _ORDER_OF[rec.state] >= _ORDER_OF[HandoverState.CUT] and rec.state is not HandoverState.ABORTED \
                and not rec.released:
            self.manager.release(hid)
            events.append(f"handover {hid} of {name}: the origins cut {self.moved_entries(hid)} state entries")
            deferred, self._deferred = [a for a in self._deferred if a.handover_id == hid], \
                [a for a in self._deferred if a.handover_id != hid]
            for ack in deferred:
                self.manager.ack(ack)
        if rec.state is HandoverState.COMPLETED and hid in self.orders:
            self._stamp(hid, "completed", now)
            self._completed(hid)
            times = self.timeline(hid)
            if times["switched"] is not None and times["arrived"] is not None:
                self.release_margin(order.task).observe(len(order.moves), self.moved_bytes(hid),
                                                        times["arrived"] - times["switched"])
            events.append(f"handover {hid} of {name} completed: vnodes "
                          f"{format_vnodes(m.vnode for m in order.moves)} now on partition(s) {sorted(order.targets)}")
        return events

    def _completed(self, hid: int) -> None:
        order = self.orders.pop(hid)
        if self.retain:
            self.history[hid] = order

    def replica_restored(self, replica: ReplicaId, attempt: int) -> list[dict[str, Any]]:
        """``replica`` is restored (incarnation ``attempt``, its acks carry it): the committed
        orders it takes part in, completed ones still retained first, to arm before it replays
        (those its checkpoint already includes it skips)."""
        self.manager.replica_restored(replica, attempt)
        inst = replica[:2]
        orders = [*self.history.values(), *(o for o in self.orders.values() if o.committed and not o.cancelled)]
        return [o.to_wire() for o in sorted(orders, key=lambda o: o.handover_id) if inst in self._participants(o)]

    def _participants(self, order: HandoverOrder | CodeOrder) -> frozenset[Instance]:
        """The instances whose replicas act on ``order``: upstreams, origins and targets, or every
        partition of the task whose operator is replaced."""
        if isinstance(order, CodeOrder):
            return frozenset((order.task, p) for p in range(self.plan.task(order.task).parallelism))
        return order.upstreams | {(order.task, p) for p in order.origins | order.targets}

    def retained(self) -> list[int]:
        """The handovers whose cuts the origins keep: those in progress and those retained."""
        return sorted([*self.orders, *self.history])

    def prune(self, restore_point: Callable[[Instance], int | None]) -> list[int]:
        """Forget the retained orders every participant's restore point (the id of the checkpoint
        a replica would be restored from) is past: a checkpoint taken after the participant acted
        on the order (switched, cut, loaded).  Checkpoint ids are per instance (pulses, order
        numbers or record counts), so each is compared with the last one that instance had taken
        when it acted.  Returns their ids."""
        gone = []
        for hid, order in sorted(self.history.items()):
            acted = self._acted_after.get(hid, {})
            if all(inst in acted and (cp := restore_point(inst)) is not None and cp > acted[inst]
                   for inst in self._participants(order)):
                gone.append(hid)
                del self.history[hid]
                self._acted_after.pop(hid, None)
        before = dict(self.manager.records)
        for task in self.manager.tables:
            left = [o.epoch for o in [*self.orders.values(), *self.history.values()]
                    if isinstance(o, HandoverOrder) and o.task == task]
            self.manager.prune(task, min(left) - 1 if left else self.manager.tables[task].epoch)
        self._pruned.update((h, r) for h, r in before.items() if h not in self.manager.records)
        for old in sorted(self._pruned)[:-TIMELINES]:
            del self._pruned[old]
        return gone

    def replica_lost(self, replica: ReplicaId) -> list[str]:
        """A replica's worker died (or it was cut off): handovers not committed yet are cancelled
        (clean); committed ones go on without it, so one it alone held back advances now (its
        release is placed, or it completes and leaves :attr:`orders`)."""
        events = []
        for cancel in self.manager.replica_lost(replica):
            order = self.orders.get(cancel.handover_id)
            if order is not None and not order.cancelled:
                self.orders[cancel.handover_id] = replace(order, cancelled=True)
                events.append(f"handover {cancel.handover_id} cancelled: {cancel.reason}")
        now = time.time()
        for hid in list(self.orders):
            events += self._advance(hid, now)
        return events

    def forget_cancelled(self, passed: Callable[[ReplicaId, int], bool]) -> list[int]:
        """Stop showing the cancelled orders no replica can still wait for: ``passed(replica, h)``
        says every participant replica is past pulse ``h``, the order's last position (a target's
        release; a replacement's switch), or lost (a restored replica arms committed orders only).
        A replica that armed one waits at its position for the word, so until then it stays in
        :meth:`view`.  Returns their ids."""
        gone = []
        for hid, order in list(self.orders.items()):
            if not order.cancelled:
                continue
            last = order.release_at if isinstance(order, HandoverOrder) else order.switch_at
            if all(passed((*inst, r), last) for inst in self._participants(order) for r in range(self.plan.replicas)):
                del self.orders[hid]
                gone.append(hid)
        return gone

    def rolling_forward(self) -> list[int]:
        """The handovers committed and not completed (a completed order leaves :attr:`orders`): they
        only roll forward, and need pulses until they complete (a KaZoo pulse window stays open)."""
        return sorted(h for h, o in self.orders.items() if o.committed and not o.cancelled)

    def give_up(self, hid: int, reason: str) -> list[str]:
        """The driver stops waiting for handover ``hid``: not committed yet, it is cancelled
        (clean: nobody switched); committed, it rolls forward (nothing to do).  The events."""
        rec = self.manager.records.get(hid)
        if rec is None or hid not in self.orders or rec.state not in (HandoverState.INSTRUCTED, HandoverState.ARMED):
            return []
        self.manager.abort(hid, reason)
        return self._advance(hid, time.time())  # the order is shown cancelled, as for a LATE ack

    def record(self, hid: int) -> HandoverRecord:
        """The manager's record of ``hid``, also once the manager pruned it (the last
        :data:`TIMELINES` pruned ones): the driver may look at a step after checkpoints let it go."""
        rec = self.manager.records.get(hid) or self._pruned.get(hid)
        return rec if rec is not None else self.manager.record(hid)

    def state(self, hid: int) -> HandoverState:
        return self.record(hid).state

    def view(self) -> list[dict[str, Any]]:
        """What every heartbeat reply carries: the handovers not completed (cancelled ones too)."""
        return [o.to_wire() for o in self.orders.values()]


_ORDER_OF = {s: i for i, s in enumerate(HandoverState)}
_ACTIONS = ("switched", "cut", "loaded")  # acks of a participant's action (a replacement's too: switched)
_ACTION_TIME = {"switched": "switched", "cut": "cut", "loaded": "caught_up"}  # what an action ack's time ends
_AMOUNTS = ("bytes", "held", "shipped", "from_store", "served")  # what action acks count rather than time
TIMELINE = ("committed", "switched", "cut", "arrived", "release", "loaded", "caught_up", "completed")
TIMELINES = 256  # the handovers whose timelines a coordinator keeps



PHASES = ("trigger", "to_switch", "alignment", "transfer", "release_wait", "load", "catch_up", "acks")


# what a role's replica reports once it did its part of a step (a replica restored past it did)
_DONE_ACK = {"upstream": "switched", "origin": "cut", "target": "loaded", "operator": "switched"}


def arm_acks(order: HandoverOrder | CodeOrder, outcomes: Mapping[str, str], restored: bool = False) -> list[str]:
    """The acks a replica sends for ``order`` after arming it in its roles (``outcomes``: role ->
    "armed", "late", "done" or "cancelled"): LATE if any role is past its position, else ARMED if
    any armed; and, for a committed order armed at a restore (``restored``), the action of every
    role whose part the checkpoint already includes ("done"), so that the step completes without
    an action this incarnation will never take.  Re-sent to a running replica, "done" is its own
    action, which that action acks with what it did (the entries cut, their digest, its times)."""
    values = set(outcomes.values())
    acks = ["late"] if "late" in values else ["armed"] if "armed" in values else []
    if restored and order.committed and not order.cancelled:
        acks += [_DONE_ACK[role] for role, outcome in outcomes.items() if outcome == "done"]
    return acks


def step_phases(instructed_at: float, timeline: Mapping[str, float | None],
                served: bool = False) -> dict[str, float | None]:
    """A step's duration by phase, in seconds, from the driver's instruction (wall clock) and its
    :meth:`HandoverCoordinator.timeline`.  In order, adding up to instructed -> completed:
    *trigger* (-> every replica armed, committed), *to_switch* (-> the upstreams reached the switch
    pulse: the margin it was placed ahead), *alignment* (-> the origins consumed everything routed
    to them before the switch and cut), *transfer* (-> every cut reached the targets),
    *release_wait* (-> the targets reached the release pulse, when the cut was there first),
    *load*, *catch_up* (-> the held records processed) and *acks* (-> the driver learnt it all).
    Beside them: *held* (switch -> caught up: how long the moved keys' records waited; 0 when the
    targets ``served`` them from the switch on) and *blocked* (how long a target waited at the
    release pulse for its state, with every key).  None where a time is missing."""
    t = {"instructed": instructed_at, **timeline}
    def span(a: str, b: str) -> float | None:
        return t[b] - t[a] if t.get(a) is not None and t.get(b) is not None else None  # type: ignore[operator]
    arrived, release = t.get("arrived"), t.get("release")
    ready = "arrived" if arrived is not None and release is not None and arrived > release else "release"
    out = {"trigger": span("instructed", "committed"), "to_switch": span("committed", "switched"),
           "alignment": span("switched", "cut"), "transfer": span("cut", "arrived"),
           "release_wait": max(0.0, span("arrived", "release") or 0.0) if arrived and release else None,
           "load": span(ready, "loaded"), "catch_up": span("loaded", "caught_up"),
           "acks": span("caught_up", "completed"),
           "held": 0.0 if served and t.get("caught_up") is not None else span("switched", "caught_up"),
           "blocked": max(0.0, span("release", "arrived") or 0.0) if arrived and release else None}
    return out


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


def parse_strategy(text: str) -> Strategy:
    """``all`` (one step), ``fluid`` (one vnode per step), ``batched:N`` (N per step) or
    ``batched:N:BYTES`` (N per step and at most BYTES of state, e.g. ``64KiB``, ``8MiB``)."""
    name, _, arg = text.strip().lower().partition(":")
    count, capped, cap = arg.partition(":")
    if name == "all" and not arg:
        return AllAtOnce()
    if name == "fluid" and not arg:
        return Fluid()
    if name == "batched" and count.isdigit() and int(count) >= 1:
        if not capped:
            return Batched(int(count))
        number = cap.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = cap[len(number):]
        if number.isdigit() and unit in _UNITS and int(number) >= 1:
            return Batched(int(count), max_bytes=int(number) * _UNITS[unit])
    raise ValueError(f"strategy {text!r}: expected all, fluid, batched:N or batched:N:BYTES (N >= 1, BYTES "
                     "like 65536, 64KiB or 8MiB)")


def format_vnodes(vnodes: Iterable[int]) -> str:
    """[0, 1, 2, 3, 7, 9, 10] -> ``0-3,7,9-10`` (what :func:`parse_vnodes` reads)."""
    parts: list[str] = []
    run: list[int] = []
    for v in sorted(set(vnodes)):
        if run and v != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(v)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def parse_vnodes(text: str) -> list[int]:
    """``0-31,40,42`` -> [0, ..., 31, 40, 42] (ValueError naming what is wrong)."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"vnodes {text!r}: {part!r} is not N or N-M")
        if sep and int(hi) < int(lo):
            raise ValueError(f"vnodes {text!r}: range {part!r} goes down")
        out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return out
