"""Replica-group side of Rhino incremental checkpoints (DESIGN §6).

One :class:`ReplicaStore` per worker process keeps, for every partition instance it backs up,
a *standby* RocksDB to which the instance's increments are applied in order, plus the newest
*completed* checkpoint as a RocksDB checkpoint directory (hard links to the standby's SST files).

Layout under ``root``, one directory per instance ``t{task}-p{partition}``::

    standby-{id}/   the standby database (a new one per full snapshot; id of that snapshot)
    snap-{id}/      RocksDB checkpoint of the standby at checkpoint ``id``: the completed one, or
                    a pending one taken when an uncompleted id was about to be overwritten
    inc-{id}.bin    payload files applied after the newest completed checkpoint (for forwarding)

Every applied increment is checked against its meta: the payload's framing and checksum, and the
content digest of the standby after applying (computed in O(changed keys), see
``rhino_state.increments``); a delta is verified before anything is written, so a bad payload
leaves the standby untouched. The standby carries the backend's checkpoint marker, so a restored
directory opens as a ``RocksDBStateBackend`` that continues the chain at the restored id.

Bookkeeping (metas, runtime bytes) lives in memory for the process's lifetime; a new store on the
same root removes the instance directories a previous process left there.  The store decides which
call is allowed when and holds each instance's lock; what one instance holds, and how its standby
and snapshots move, is :class:`rhino_state.standby_instance.StandbyInstance`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from rhino_state.increments import IncrementMeta
from rhino_state.standby_db import (
    export_snapshot,
    link_db,
    link_or_copy,
    read_ranges,
    read_snapshot,
    restore_full,
    unlink_quietly,
)
from rhino_state.standby_instance import StandbyInstance
from transport.ids import PartitionId

__all__ = [
    "CheckpointNotHeldError",
    "IncrementGapError",
    "NoCompletedCheckpointError",
    "ReplicaStore",
    "ReplicaStoreClosedError",
]

_INSTANCE_DIR = re.compile(r"t\d+-p\d+")


class IncrementGapError(RuntimeError):
    """A delta does not apply to the standby's last applied checkpoint."""


class NoCompletedCheckpointError(LookupError):
    """The instance has no completed checkpoint in this store."""


class ReplicaStoreClosedError(RuntimeError):
    """The replica store was closed."""


class CheckpointNotHeldError(LookupError):
    """This store does not hold that checkpoint of the instance (not applied yet, or gone)."""


class ReplicaStore:
    """Standby copies and completed checkpoints of many partition instances (thread safe)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        os.makedirs(self.root, exist_ok=True)
        for name in os.listdir(self.root):
            if _INSTANCE_DIR.fullmatch(name):
                shutil.rmtree(os.path.join(self.root, name))
        self._lock = threading.Lock()
        self._instances: dict[PartitionId, StandbyInstance] = {}
        self._closed = False

    # ------------------------------------------------------------------ locking

    @contextmanager
    def _locked(self, instance: PartitionId, *, create: bool) -> Iterator[StandbyInstance | None]:
        """The instance's state with its lock held (None if unknown and not ``create``)."""
        while True:
            with self._lock:
                if self._closed:
                    raise ReplicaStoreClosedError(f"replica store at {self.root!r} is closed")
                inst = self._instances.get(instance)
                if inst is None and create:
                    task, partition = instance
                    inst = StandbyInstance(instance, os.path.join(self.root, f"t{int(task)}-p{int(partition)}"))
                    os.makedirs(inst.dir, exist_ok=True)
                    self._instances[instance] = inst
            if inst is None:
                yield None
                return
            with inst.lock:
                if inst.dropped or self._closed:
                    continue  # dropped or closed while we waited: look again
                yield inst
                return

    # ------------------------------------------------------------------ applying increments

    def apply(self, meta: IncrementMeta, payload_path: str | os.PathLike[str]) -> None:
        """Apply one increment to the standby of ``meta.instance`` and keep its meta and payload.

        A full snapshot replaces the standby content; a delta must follow the last applied
        checkpoint (``IncrementGapError`` otherwise); an id at or below the last applied one is a
        no-op. The payload is linked (or copied) into the store, so the caller may delete its file.
        """
        if not meta.full and meta.previous_id >= meta.checkpoint_id:
            raise ValueError(f"delta {meta.checkpoint_id} cannot follow checkpoint {meta.previous_id}")
        with self._locked(meta.instance, create=True) as inst:
            assert inst is not None
            if inst.last is not None and meta.checkpoint_id <= inst.last.checkpoint_id:
                return
            if not meta.full:
                last_id = None if inst.last is None else inst.last.checkpoint_id
                if meta.previous_id != last_id:
                    raise IncrementGapError(
                        f"instance {meta.instance}: delta {meta.checkpoint_id} follows checkpoint "
                        f"{meta.previous_id}, but the last applied checkpoint is {last_id}"
                        + (" (a full snapshot is needed)" if last_id is None else "")
                    )
            payload = os.path.join(inst.dir, f"inc-{meta.checkpoint_id}.bin")
            link_or_copy(payload_path, payload)
            try:
                inst.keep_uncompleted_snapshot()
                if meta.full:
                    inst.apply_full(meta, payload)
                else:
                    inst.apply_delta(meta, payload)
            except BaseException:
                os.unlink(payload)
                raise
            inst.metas[meta.checkpoint_id] = meta
            inst.payloads[meta.checkpoint_id] = payload

    # ------------------------------------------------------------------ completed checkpoints

    def complete(self, instance: PartitionId, checkpoint_id: int) -> None:
        """Mark an applied checkpoint completed: snapshot it (hard links) and drop older state.

        Keeps the newest completed snapshot, the older ones from :meth:`retain`'s id on, and the
        metas and payloads applied after the newest. Completing an id at or below the latest
        completed one is a no-op.
        """
        with self._locked(instance, create=False) as inst:
            if inst is None:
                raise ValueError(f"instance {instance} has no increments in this store")
            if inst.completed is not None and checkpoint_id <= inst.completed.checkpoint_id:
                return
            meta = inst.metas.get(checkpoint_id)
            if meta is None:
                raise ValueError(f"instance {instance}: checkpoint {checkpoint_id} was not applied here")
            if checkpoint_id in inst.snapshots:
                snap = inst.snapshots.pop(checkpoint_id)
            elif inst.last is not None and inst.last.checkpoint_id == checkpoint_id:
                snap = inst.snapshot(checkpoint_id)
            else:
                raise ValueError(
                    f"instance {instance}: the state of checkpoint {checkpoint_id} is no longer available"
                )
            inst.replace_completed(meta, snap)
            # completing a checkpoint completes every earlier one the chain delivered: those a
            # rollback may still need are kept like any other completed snapshot
            for old in sorted(i for i in inst.snapshots if i < checkpoint_id):
                inst.keep_or_drop(inst.metas.get(old), inst.snapshots.pop(old))
            for old in [i for i in inst.payloads if i <= checkpoint_id]:
                unlink_quietly(inst.payloads.pop(old))
            for old in [i for i in inst.metas if i < checkpoint_id]:
                del inst.metas[old]

    def import_completed(self, meta: IncrementMeta, payload: str | os.PathLike[str]) -> None:
        """Hold a completed checkpoint pulled from another holder (a full increment): as the newest
        completed one if it is newer than what is here, else as an older kept one (until
        :meth:`retain` drops it).  The standby and the increments after it are not touched."""
        if not meta.full:
            raise ValueError(f"instance {meta.instance}: checkpoint {meta.checkpoint_id} is a delta, not a full one")
        with self._locked(meta.instance, create=True) as inst:
            assert inst is not None
            directory = inst.dir
        built = os.path.join(directory, f"imported-{meta.checkpoint_id}-{uuid.uuid4().hex}")
        restore_full(meta, payload, built)  # outside the lock: O(state)
        with self._locked(meta.instance, create=True) as inst:
            assert inst is not None
            cid = meta.checkpoint_id
            if (inst.completed is not None and inst.completed.checkpoint_id == cid) or cid in inst.older:
                shutil.rmtree(built, ignore_errors=True)  # held already
            elif inst.completed is None or cid > inst.completed.checkpoint_id:
                inst.replace_completed(meta, built)
            else:
                inst.older[cid] = (meta, built)

    def retain(self, instance: PartitionId, from_id: int | None) -> None:
        """Keep completed snapshots of ``instance`` from ``from_id`` on (a rollback may restore
        any of them); older ones are deleted now.  None: keep only the newest."""
        with self._locked(instance, create=True) as inst:
            assert inst is not None
            inst.retain_from = from_id
            for old in [i for i in inst.older if from_id is None or i < from_id]:
                shutil.rmtree(inst.older.pop(old)[1], ignore_errors=True)

    def completed_ids(self, instance: PartitionId) -> list[int]:
        """Ids of the completed snapshots of ``instance`` held here, ascending."""
        with self._locked(instance, create=False) as inst:
            if inst is None or inst.completed is None:
                return []
            return sorted(inst.older) + [inst.completed.checkpoint_id]

    def latest_completed(self, instance: PartitionId) -> IncrementMeta | None:
        """Meta of the newest completed checkpoint of ``instance``, if any."""
        with self._locked(instance, create=False) as inst:
            return None if inst is None else inst.completed

    def last_applied(self, instance: PartitionId) -> IncrementMeta | None:
        """Meta of the increment the standby of ``instance`` is at, if any."""
        with self._locked(instance, create=False) as inst:
            return None if inst is None else inst.last

    def pending(self, instance: PartitionId) -> list[tuple[IncrementMeta, str]]:
        """``(meta, payload path)`` of the increments applied after the newest completed checkpoint,
        in id order (paths stay valid until a later ``complete``)."""
        with self._locked(instance, create=False) as inst:
            if inst is None:
                return []
            return [(inst.metas[i], inst.payloads[i]) for i in sorted(inst.payloads)]

    def restore(self, instance: PartitionId, target_dir: str | os.PathLike[str],
                checkpoint_id: int | None = None) -> IncrementMeta:
        """Materialise the newest completed checkpoint (or the kept one ``checkpoint_id``) at
        ``target_dir`` (absent or empty).

        SST files are hard-linked; CURRENT, MANIFEST, WAL, OPTIONS and rocksdict's config file are
        copied because the opener may rewrite them in place. ``RocksDBStateBackend(target_dir)``
        then opens exactly that content and continues the checkpoint chain at its id. The standby
        is not affected.
        """
        with self._locked(instance, create=False) as inst:
            meta, source = _completed(instance, inst, checkpoint_id)
            link_db(source, os.fspath(target_dir))
            return meta

    def read_key_groups(self, instance: PartitionId, checkpoint_id: int,
                        key_groups: Iterable[range]) -> list[tuple[int, bytes, bytes]]:
        """``(key_group, rest, value)`` of every key in ``key_groups`` in checkpoint ``checkpoint_id``
        of ``instance``, in key order: from the standby if it is at that checkpoint, else from the
        snapshot kept of it (the completed one, an older one kept for a rollback, or a pending
        one).  A handover target rebuilds an origin's cut from it.  ``CheckpointNotHeldError``:
        not here (not applied yet, or no longer kept)."""
        ranges = [r for r in key_groups if r]
        with self._locked(instance, create=False) as inst:
            if inst is None:
                raise CheckpointNotHeldError(f"instance {instance} has no increments in this store")
            if inst.db is not None and inst.last is not None and inst.last.checkpoint_id == checkpoint_id:
                return read_ranges(inst.db, ranges)
            if inst.completed is not None and inst.completed.checkpoint_id == checkpoint_id:
                source = inst.completed_dir
            elif checkpoint_id in inst.older:
                source = inst.older[checkpoint_id][1]
            else:
                source = inst.snapshots.get(checkpoint_id)
            if source is None:
                last = None if inst.last is None else inst.last.checkpoint_id
                raise CheckpointNotHeldError(f"instance {instance}: checkpoint {checkpoint_id} is not held here "
                                             f"(the standby is at {last})")
            private = os.path.join(inst.dir, f"read-{uuid.uuid4().hex}")
            link_db(source, private)  # the snapshot may be deleted once the lock is released
        return read_snapshot(private, ranges)

    def export_full(self, instance: PartitionId, path: str | os.PathLike[str],
                    checkpoint_id: int | None = None) -> IncrementMeta:
        """Write the newest completed checkpoint (or the kept one ``checkpoint_id``) as a full
        increment payload at ``path``.

        For restoring on a worker that does not hold it: that worker builds the database from
        the returned meta and payload with :func:`restore_full` (or ``apply``s them to its own
        store). Streams; the instance is only locked while the snapshot is hard-linked to a
        private directory.
        """
        with self._locked(instance, create=False) as inst:
            completed, source = _completed(instance, inst, checkpoint_id)
            private = os.path.join(inst.dir, f"export-{uuid.uuid4().hex}")
            link_db(source, private)
        return export_snapshot(completed, private, path)

    # ------------------------------------------------------------------ lifecycle

    def instances(self) -> list[PartitionId]:
        """Instances with state in this store."""
        with self._lock:
            return sorted(self._instances)

    def drop(self, instance: PartitionId) -> None:
        """Delete everything of ``instance`` (a no-op if unknown)."""
        with self._locked(instance, create=False) as inst:
            if inst is None:
                return
            inst.dropped = True
            inst.close_db()
            with self._lock:
                del self._instances[instance]
            shutil.rmtree(inst.dir, ignore_errors=True)

    def close(self) -> None:
        """Close every standby database (files stay on disk); closing twice is a no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            instances = list(self._instances.values())
        for inst in instances:
            with inst.lock:
                inst.close_db()

    def __enter__(self) -> ReplicaStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplicaStore({self.root!r}, instances={len(self._instances)})"


def _completed(instance: PartitionId, inst: StandbyInstance | None,
               checkpoint_id: int | None) -> tuple[IncrementMeta, str]:
    """Meta and snapshot directory of the newest completed checkpoint, or of the kept one
    ``checkpoint_id`` (the instance's lock held)."""
    if inst is None or inst.completed is None or inst.completed_dir is None:
        raise NoCompletedCheckpointError(f"instance {instance} has no completed checkpoint here")
    if checkpoint_id is None or checkpoint_id == inst.completed.checkpoint_id:
        return inst.completed, inst.completed_dir
    if checkpoint_id not in inst.older:
        raise NoCompletedCheckpointError(
            f"instance {instance}: completed checkpoint {checkpoint_id} is not kept here "
            f"(kept: {sorted(inst.older) + [inst.completed.checkpoint_id]})")
    return inst.older[checkpoint_id]
