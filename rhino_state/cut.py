"""The state a handover moves from an origin partition to a target (DESIGN §6 "Handover").

An origin cuts the moved key groups out of its state.  Rhino (paper 000 §4.1) ships only the last
increment: a target that already holds the origin's last checkpoint (a member of its replica
group) rebuilds the cut from that checkpoint plus the changes since, and only the changes cross
the network.  This module is the pure part of that: the cut's digest, rebuilding a cut from a
checkpoint and its changes, and how an origin replica delivers its cut to each target replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from enum import Enum

__all__ = ["Change", "CutEntry", "Delivery", "apply_changes", "cut_digest", "entry_bytes", "plan_delivery"]

CutEntry = tuple[int, bytes, bytes]  # (key group, rest of the key, value)
Change = tuple[int, bytes, bytes | None]  # the value now; None: deleted since the checkpoint


def cut_digest(entries: Iterable[CutEntry]) -> str:
    """Digest of a cut's entries, independent of their order (both origin replicas must agree)."""
    h = hashlib.sha256()
    for kg, rest, value in sorted(entries):
        h.update(kg.to_bytes(2, "big") + len(rest).to_bytes(4, "big") + rest + len(value).to_bytes(4, "big") + value)
    return h.hexdigest()


def entry_bytes(entries: Iterable[Change]) -> int:
    """Key and value bytes of entries as stored (2-byte key group + rest + value)."""
    return sum(2 + len(rest) + (len(value) if value is not None else 0) for _, rest, value in entries)


def apply_changes(base: Iterable[CutEntry], changes: Iterable[Change]) -> list[CutEntry]:
    """The entries of ``base`` (a checkpoint's content of some key groups) with ``changes`` (the
    values since, None deleting) applied, in key order."""
    merged: dict[tuple[int, bytes], bytes | None] = {(kg, rest): value for kg, rest, value in base}
    for kg, rest, value in changes:
        merged[(kg, rest)] = value
    return [(kg, rest, value) for (kg, rest), value in sorted(merged.items()) if value is not None]


class Delivery(Enum):
    """How one origin replica gets its cut to one target replica."""

    LOCAL = "local"  # same worker: handed over in process, whole
    DELTA = "delta"  # the target's worker holds the origin's checkpoint: the changes since it only
    FULL = "full"  # over the network, whole
    SKIP = "skip"  # another live origin replica runs on the target's worker and hands it over locally


def plan_delivery(target_worker: int, me: int, origin_workers: Collection[int], holders: Collection[int],
                  has_base: bool, fetchable: bool) -> Delivery:
    """How the origin replica on worker ``me`` delivers to the target replica on ``target_worker``.

    ``origin_workers``: workers of the origin's live replicas; ``holders``: workers whose replica
    store holds the origin's checkpoints (its replica group); ``has_base``: the cut has changes since
    a checkpoint; ``fetchable``: origin replicas keep their cuts, so a target that misses one (its
    local origin replica failed, its checkpoint copy was not there) fetches it.  Without that,
    every target replica gets the whole cut from every origin replica, as duplicate sending does
    with records."""
    if target_worker == me:
        return Delivery.LOCAL
    if fetchable and target_worker in origin_workers:
        return Delivery.SKIP
    if fetchable and has_base and target_worker in holders:
        return Delivery.DELTA
    return Delivery.FULL
