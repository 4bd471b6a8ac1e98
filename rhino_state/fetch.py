"""Restoring where the checkpoint is not (Rhino, DESIGN §6): pull it from a worker that holds it.

A lost replica is restored on a member of its replica group when one is free: that member holds
the checkpoint, so the restore is hard links.  When every live holder runs a replica of the
partition itself (e.g. a second kill a few seconds after a first, before the new group members
received a checkpoint), the replica is restored on another worker, which pulls the checkpoint:

* the holder's :class:`CheckpointExporter` writes the completed checkpoint as one full increment
  (``ReplicaStore.export_full``) on the first request and serves it in chunks of at most
  ``chunk_size`` bytes (``FetchCheckpoint``, a signed typed call); the export is deleted once its
  last chunk went out, or ``ttl`` seconds after it was last asked for;
* :func:`fetch_checkpoint` on the restoring worker pulls the chunks in order into a file; the
  caller builds the database from it with ``rhino_state.standby_db.restore_full``, which
  checks the payload's checksum and the content digest against the meta.

A group member pulls a checkpoint the same way to hold a second copy of a restore point whose
only holder runs a replica of its partition (``ReplicaStore.import_completed``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rhino_state.increments import IncrementMeta
from rhino_state.replica_store import ReplicaStore
from transport import rpc, wire
from transport.ids import PartitionId

__all__ = ["FETCH_METHOD", "CheckpointExporter", "CheckpointPart", "CheckpointRequest", "fetch_checkpoint"]

FETCH_METHOD = "FetchCheckpoint"
CHUNK_SIZE = 4 * 1024 * 1024


@wire.record
@dataclass(frozen=True)
class CheckpointRequest:
    """The bytes of completed checkpoint ``checkpoint_id`` of ``instance`` from ``offset`` on."""

    instance: PartitionId
    checkpoint_id: int
    offset: int


@wire.record
@dataclass(frozen=True)
class CheckpointPart:
    """``data`` of the full increment from the request's offset; ``meta`` and ``size`` (the
    whole payload's) come with every part, so any part tells the caller when it is done."""

    meta: IncrementMeta
    size: int
    data: bytes


@dataclass
class _Export:
    meta: IncrementMeta
    path: Path
    size: int
    last_asked: float
    served: bool = False  # its last chunk went out (to some fetcher)


@dataclass
class _Gate:
    """One writer of a key's export at a time; it goes when nobody waits on it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class CheckpointExporter:
    """The holder's side: exports a completed checkpoint once per restore and serves its chunks.

    Several workers may pull the same checkpoint at once (a restore and a copy to a new group
    member): they share one export, which goes ``grace`` seconds after its last chunk was served
    if nobody asked for a chunk of it meanwhile (or after ``ttl`` unasked, whatever happened)."""

    def __init__(self, store: ReplicaStore, spool_dir: str | Path, *, chunk_size: int = CHUNK_SIZE,
                 ttl: float = 120.0, grace: float = 5.0) -> None:
        self.store = store
        self.spool_dir = Path(spool_dir)
        self.chunk_size = chunk_size
        self.ttl = ttl
        self.grace = grace
        self._lock = threading.Lock()
        self._exports: dict[tuple[PartitionId, int], _Export] = {}
        self._exporting: dict[tuple[PartitionId, int], _Gate] = {}

    def handlers(self) -> dict[str, rpc.BytesHandler]:
        return {FETCH_METHOD: rpc.typed(self.part, CheckpointRequest)}

    def start(self) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        for leftover in self.spool_dir.glob("*.export"):
            leftover.unlink(missing_ok=True)

    def part(self, req: CheckpointRequest) -> CheckpointPart:
        key = ((req.instance[0], req.instance[1]), req.checkpoint_id)
        export = self._export(key)
        with open(export.path, "rb") as f:
            f.seek(req.offset)
            data = f.read(self.chunk_size)
        if req.offset + len(data) >= export.size:
            export.served = True  # another fetcher may still be half-way through it: it goes later
            sweep = threading.Timer(self.grace + 0.1, self._sweep)
            sweep.daemon = True
            sweep.start()
        return CheckpointPart(export.meta, export.size, data)

    def _export(self, key: tuple[PartitionId, int]) -> _Export:
        """The export of ``key``, written now if there is none (one writer per key at a time)."""
        self._sweep()
        with self._lock:
            gate = self._exporting.setdefault(key, _Gate())
            gate.users += 1
        try:
            with gate.lock:
                with self._lock:
                    export = self._exports.get(key)
                    if export is not None:
                        export.last_asked = time.monotonic()
                        return export
                path = self.spool_dir / f"{uuid.uuid4().hex}.export"
                try:
                    meta = self.store.export_full(key[0], path, key[1])
                except BaseException:
                    path.unlink(missing_ok=True)
                    raise
                export = _Export(meta, path, os.path.getsize(path), time.monotonic())
                with self._lock:
                    self._exports[key] = export
                return export
        finally:
            with self._lock:
                gate.users -= 1
                if not gate.users:
                    del self._exporting[key]

    def _sweep(self) -> None:
        """Exports served to the end and not asked for within ``grace``, and those nobody asked
        for within ``ttl`` (the restoring worker died or gave up), go."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, e in self._exports.items()
                     if now - e.last_asked > (self.grace if e.served else self.ttl)]
            gone = [self._exports.pop(k) for k in stale]
        for export in gone:
            export.path.unlink(missing_ok=True)


def fetch_checkpoint(peer: rpc.Peer, instance: PartitionId, checkpoint_id: int, path: str | Path,
                     timeout: float = 30.0) -> IncrementMeta:
    """Pull completed checkpoint ``checkpoint_id`` of ``instance`` from ``peer`` into ``path`` (a
    full increment payload); returns its meta.  Any failure leaves no file behind."""
    path = Path(path)
    offset, size = 0, None
    meta: IncrementMeta | None = None
    try:
        with open(path, "wb") as out:
            while size is None or offset < size:
                part = peer.call(FETCH_METHOD, CheckpointRequest(instance, checkpoint_id, offset), CheckpointPart,
                                 timeout=timeout)
                if meta is not None and part.meta != meta:
                    raise RuntimeError(f"checkpoint {checkpoint_id} of {instance} changed while it was fetched")
                meta, size = part.meta, part.size
                if not part.data and offset < size:
                    raise RuntimeError(f"checkpoint {checkpoint_id} of {instance}: no bytes at offset {offset} "
                                       f"of {size}")
                out.write(part.data)
                offset += len(part.data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    assert meta is not None
    return meta
