"""The state a vnode handover moves: the origin's cut of the moved key groups, split per target
into chunks (a delta against the target's own checkpoint where it has one), and the state bytes
per vnode a byte-capped step plans with."""



from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replication.handover_orders import HandoverOrder
from rhino_state import (
    RocksDBStateBackend,
    key_group,
)
from rhino_state.cut import Change, CutEntry, cut_digest


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
