"""A handover's words, as the driver and the workers both read them: the order a step gives its
participants (a vnode move, an operator replacement) and its wire form, what a replica acks, and
the text forms of vnodes and strategies (the CLI's requests, docs/handover.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rhino_state import (
    AllAtOnce,
    Batched,
    Fluid,
    RoutingTable,
    VnodeMove,
)
from rhino_state.handover import Strategy
from transport.ids import PartitionId


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
    upstreams: frozenset[PartitionId]
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
