"""One partition instance a replica store backs up: its standby database and the snapshots kept of it.

A :class:`StandbyInstance` holds what the store knows of one instance (the standby, the last
applied and the newest completed checkpoint, the pending and older kept snapshots, the increments
applied since) and moves its directories from one checkpoint to the next: a full increment
replaces the standby, a delta is checked and then written into it, and a snapshot is a
hard-linked RocksDB checkpoint of it.  Its methods run with :attr:`StandbyInstance.lock` held;
which calls are allowed when (ids, gaps) is :mod:`rhino_state.replica_store`'s to decide.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field

from rocksdict import Checkpoint, Rdict

from rhino_state.checkpoint_chain import MARKER_KEY, encode_marker
from rhino_state.increments import IncrementMeta, apply_increment
from rhino_state.standby_db import check_delta, db_options, load_full
from transport.ids import PartitionId

__all__ = ["StandbyInstance"]


@dataclass(eq=False)
class StandbyInstance:
    """The standby and kept snapshots of one partition instance in a replica store (under ``dir``)."""

    instance: PartitionId
    dir: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    dropped: bool = False
    db: Rdict | None = None  # the standby
    standby_dir: str | None = None
    last: IncrementMeta | None = None  # last applied increment: the standby's content
    completed: IncrementMeta | None = None
    completed_dir: str | None = None
    metas: dict[int, IncrementMeta] = field(default_factory=dict)  # applied after `completed`
    payloads: dict[int, str] = field(default_factory=dict)
    snapshots: dict[int, str] = field(default_factory=dict)  # pending (uncompleted) snapshots
    # older completed snapshots kept for a rollback (ids >= retain_from; see ReplicaStore.retain)
    older: dict[int, tuple[IncrementMeta, str]] = field(default_factory=dict)
    retain_from: int | None = None

    def close_db(self) -> None:
        if self.db is not None:
            db, self.db = self.db, None
            db.close()

    def discard_standby(self) -> None:
        self.close_db()
        if self.standby_dir is not None:
            shutil.rmtree(self.standby_dir, ignore_errors=True)
        self.standby_dir = None
        self.last = None

    # ------------------------------------------------------------------ the standby

    def apply_full(self, meta: IncrementMeta, payload: str) -> None:
        """A new standby built from the full increment ``payload``; the old one is discarded."""
        standby_dir = os.path.join(self.dir, f"standby-{meta.checkpoint_id}")
        shutil.rmtree(standby_dir, ignore_errors=True)
        db = Rdict(standby_dir, db_options())
        try:
            load_full(db, meta, payload)
        except BaseException:
            db.close()
            shutil.rmtree(standby_dir, ignore_errors=True)
            raise
        self.discard_standby()
        self.db, self.standby_dir, self.last = db, standby_dir, meta

    def apply_delta(self, meta: IncrementMeta, payload: str) -> None:
        """The delta ``payload`` (following :attr:`last`) checked, then written into the standby."""
        db, last = self.db, self.last
        assert db is not None and last is not None
        check_delta(db, last, meta, payload)  # pass 1, read only: checksum, and the digest the standby will have
        # Pass 2: write. A failure here leaves a partial standby, which is discarded.
        try:
            apply_increment(db, payload, verify=False)
            db.put(MARKER_KEY, encode_marker(meta.checkpoint_id, meta.digest))
        except BaseException:
            self.discard_standby()
            raise
        self.last = meta

    # ------------------------------------------------------------------ snapshots

    def snapshot(self, checkpoint_id: int) -> str:
        """A RocksDB checkpoint (hard-linked) of the standby, which is at ``checkpoint_id``."""
        assert self.db is not None and self.last is not None and self.last.checkpoint_id == checkpoint_id
        snap = os.path.join(self.dir, f"snap-{checkpoint_id}")
        tmp = snap + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(snap, ignore_errors=True)
        try:
            Checkpoint(self.db).create_checkpoint(tmp)
            os.rename(tmp, snap)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return snap

    def keep_uncompleted_snapshot(self) -> None:
        """Before the standby moves past an uncompleted checkpoint, snapshot it for ``complete``."""
        last = self.last
        if last is None or last.checkpoint_id in self.snapshots:
            return
        if self.completed is not None and self.completed.checkpoint_id == last.checkpoint_id:
            return
        self.snapshots[last.checkpoint_id] = self.snapshot(last.checkpoint_id)

    def replace_completed(self, meta: IncrementMeta, snap: str) -> None:
        """``meta`` (its snapshot at ``snap``) is the newest completed checkpoint now; the one it
        replaces is kept or dropped (:meth:`keep_or_drop`)."""
        if self.completed is not None and self.completed_dir is not None:
            self.keep_or_drop(self.completed, self.completed_dir)
        self.completed, self.completed_dir = meta, snap

    def keep_or_drop(self, meta: IncrementMeta | None, snap: str) -> None:
        """A completed snapshot older than the newest: kept if ``ReplicaStore.retain`` asks for it."""
        if meta is not None and self.retain_from is not None and meta.checkpoint_id >= self.retain_from:
            self.older[meta.checkpoint_id] = (meta, snap)
        else:
            shutil.rmtree(snap, ignore_errors=True)
