"""The participant-side pieces of a handover (:mod:`rhino_state.handover`), run by the replicas:
the upstreams' ``VersionedRouter``, the origin's ``OriginAlignment`` and key-group cut, the
target's ``TargetGate`` and an operator replacement's ``CodeSwitch``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rhino_state.handover import (
    LateInstructionError,
    SwitchNotCommittedError,
    VnodeMove,
    check_int,
    check_table,
    is_int,
)
from rhino_state.keys import RoutingTable, validate_num_key_groups, vnode_key_groups


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
        check_int("switch position", pending.position, 0)
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
        if not is_int(position):
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
        self.table = check_table(table)
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
        check_table(table)
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
            out.add(check_int("key group", kg, 0))
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

    Only the moved key groups wait: records of other key groups pass (their state is
    independent), and the gate is offered records only.  Event time goes on for the others; the
    caller keeps with each held record the watermark it arrived at and processes it at that
    watermark once let go, and withholds its own output watermark while anything is held, so no
    held record becomes late and nothing of a moved key is reordered across event time.  Pulses
    are not offered either: they are positions, not data, and are forwarded in place."""

    def __init__(self, handover_id: int, key_groups: Iterable[range | int]) -> None:
        self.handover_id = handover_id
        self.key_groups = _key_group_set(key_groups)
        self.held: list[Any] = []
        self.is_loaded = False
        self.released = False

    def admit(self, element: Any, key_group: int) -> GateDecision:
        """Offer the next record, of ``key_group``, in consumption order."""
        if self.released or key_group not in self.key_groups:
            return GateDecision(False, (element,))
        self.held.append(element)
        return GateDecision(False, ())

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
                "held": list(self.held), "released": self.released}

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> TargetGate:
        """Inverse of ``snapshot`` (the load is redone after a restore: ``is_loaded`` is False)."""
        gate = cls(data["handover_id"], data["key_groups"])
        gate.held = list(data["held"])
        gate.released = data["released"]
        return gate


class CodeSwitch:
    """Which function version of an operator handles the element at a position: version ``v``
    armed at ``P`` handles every element at position ``>= P``, so both replicas switch at the same
    element.  Armed and committed like a router switch (a due, uncommitted version raises
    ``SwitchNotCommittedError``)."""

    def __init__(self, version: int = 0, *, position: int | None = None) -> None:
        self.version = check_int("version", version, 0)
        self._queue = _SwitchQueue(position)

    def arm(self, version: int, position: int, *, committed: bool = False) -> bool:
        """Install ``version`` from ``position`` on.  False: already in force or already armed."""
        check_int("version", version, 0)
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
