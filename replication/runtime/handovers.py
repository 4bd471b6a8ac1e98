"""The runtime side of a vnode handover (docs/handover.md), LiveRobin mode: what a replica does
with an instruction of :class:`rhino_state.handover_manager.HandoverManager`, at positions both replicas
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
  (:class:`rhino_state.handover_participants.TargetGate`); at pulse ``R`` (before forwarding it) it waits for the
  state if it has not arrived, loads it, processes the held records in arrival order and acks
  LOADED.

``R = P + k`` (``k >= 2``) is fixed in the instruction: a target stalled at ``R`` cannot deadlock the
origin's cut (docs/handover.md, "A simpler LiveRobin release point"), so no release record has
to be placed in the heartbeat log.
"""


from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replication.handover_orders import CodeOrder, HandoverOrder
from replication.runtime.handover_cuts import DeltaCut, OriginCut
from replication.runtime.kept_cuts import KeptCuts
from rhino_state import (
    LateInstructionError,
    RocksDBStateBackend,
    RoutingTable,
    SwitchNotCommittedError,
    TargetGate,
    VersionedRouter,
    cut_key_groups,
    load_key_groups,
)
from rhino_state.cut import Change, cut_digest

# How often a replica blocked at a handover position looks at its stop flag.
WAIT_SLICE_S = 0.05


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
        self.kept_cuts = KeptCuts()
        self.num_key_groups, self.num_vnodes = num_key_groups, num_vnodes
        self._steps: dict[int, _Step] = {}
        # a target whose chain only has windows with mergeable aggregators serves the moved keys
        # from the switch on instead of holding their records (set when the chain is built)
        self.serve_through = False
        self._awaited: frozenset[int] = frozenset()  # serving: key groups whose moved state is not merged in
        self.position = 0  # the last pulse forwarded
        self.moved_entries = 0  # state entries cut or loaded here
        self.held_records = 0
        self.advances: list[int] = []  # the watermarks the chain rose to while records were held

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
            self.kept_cuts.add_received(step.order.handover_id, origin, entries, step.extras.get(origin, {}))
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

    @property
    def gating(self) -> bool:
        """Whether a target step may hold records (read by the instance thread per element, without
        the lock: a snapshot of the steps, which the heartbeat thread adds and removes)."""
        return any(s.gate is not None for s in list(self._steps.values()))

    def holding(self) -> bool:
        """Whether a target step holds records now (any thread: a snapshot of the steps)."""
        return any(s.gate is not None and s.gate.held for s in list(self._steps.values()))

    def watermark_advanced(self, wm: int) -> None:
        """The chain's watermark rose to ``wm``: kept while records are held, for their replay."""
        if self.holding():
            self.advances.append(wm)
        elif self.advances:
            self.advances.clear()

    def gate(self, element: Any, key_group: int) -> tuple[Any, ...]:
        """Offer an input record of ``key_group`` to every target step; what to process now."""
        return _elements(self._through(list(self._steps.values()), ((element, key_group),), count=True))

    def _through(self, steps: list[_Step], items: tuple[tuple[Any, int], ...],
                 count: bool = False) -> tuple[tuple[Any, int], ...]:
        """Pass (element, key group) pairs through the gates of ``steps`` in order; the pairs no
        gate holds.  A gate holds the pair itself, so what it lets go later still has its key
        group for the gates after it."""
        for step in steps:
            if step.gate is None:
                continue
            nxt: tuple[tuple[Any, int], ...] = ()
            for item in items:
                taken = step.gate.admit(item, item[1]).process
                self.held_records += int(count and not taken)
                nxt += taken
            items = nxt
        return items

    def _let_go(self, step: _Step, held: tuple[tuple[Any, int], ...]) -> tuple[Any, ...]:
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

    def load_groups(self, order: HandoverOrder) -> list[range]:
        """The key groups this target takes over in ``order``."""
        return list(load_key_groups(order.moves, self.partition, self.num_key_groups, self.num_vnodes))

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


def _elements(items: Iterable[tuple[Any, int]]) -> tuple[Any, ...]:
    """The elements of (element, key group) pairs."""
    return tuple(element for element, _ in items)
