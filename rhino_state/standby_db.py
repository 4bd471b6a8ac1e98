"""The RocksDB directories of a replica store, below its bookkeeping (DESIGN §6).

Building a database from a full increment (checked against its meta), materialising a closed
database elsewhere by hard links, writing records in batches, and the file moves the store makes.
No state: :mod:`rhino_state.replica_store` keeps which instance, checkpoint and directory is what.
"""

from __future__ import annotations

import errno
import os
import shutil

from rocksdict import Options, Rdict, WriteBatch

from rhino_state.backend import MARKER_KEY, encode_marker
from rhino_state.increments import (
    WRITE_BATCH_BYTES,
    IncrementFormatError,
    IncrementMeta,
    IncrementReader,
    digest_hex,
    pair_hash,
)

__all__ = [
    "IncrementDigestError",
    "check_digest",
    "db_options",
    "link_db",
    "link_or_copy",
    "load_full",
    "restore_full",
    "unlink_quietly",
    "write_records",
]

# RocksDB never modifies these after writing them (it only creates and unlinks them), so a
# restore may hard-link them; everything else (CURRENT, MANIFEST, WAL, OPTIONS, rocksdict's
# config) may be rewritten or appended in place by the opener and is copied.
_IMMUTABLE_SUFFIXES = (".sst", ".blob")


class IncrementDigestError(RuntimeError):
    """The state after applying an increment does not have the digest its meta announces."""

def db_options() -> Options:
    """Raw-mode options of every database a replica store opens or builds."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def link_db(source: str, target: str) -> None:
    """Materialise the closed RocksDB directory ``source`` at ``target`` (absent or empty).

    SST and blob files are hard-linked (copied only if ``target`` is on another file system);
    the small mutable files are copied, so opening ``target`` never changes ``source``.
    """
    os.makedirs(target, exist_ok=True)
    if os.listdir(target):
        raise FileExistsError(f"restore target {target!r} is not empty")
    try:
        for name in os.listdir(source):
            src, dst = os.path.join(source, name), os.path.join(target, name)
            if name.endswith(_IMMUTABLE_SUFFIXES):
                try:
                    os.link(src, dst)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                    shutil.copy2(src, dst)
            else:
                shutil.copy2(src, dst)
    except BaseException:
        for name in os.listdir(target):
            os.unlink(os.path.join(target, name))
        raise

def check_digest(meta: IncrementMeta, digest: str) -> None:
    """Raise ``IncrementDigestError`` unless ``digest`` is the one ``meta`` announces."""
    if digest != meta.digest:
        raise IncrementDigestError(
            f"instance {meta.instance}: checkpoint {meta.checkpoint_id} yields digest {digest}, "
            f"its meta says {meta.digest}"
        )


def restore_full(meta: IncrementMeta, payload: str | os.PathLike[str], target_dir: str | os.PathLike[str]) -> None:
    """Build at ``target_dir`` (absent or empty) the database a full increment describes, as
    :meth:`ReplicaStore.restore` would materialise it: ``RocksDBStateBackend(target_dir)`` opens
    that content and continues the checkpoint chain at ``meta``'s id.  Checked against the meta
    (framing, checksum, content digest); nothing is left at ``target_dir`` if it does not match."""
    if not meta.full:
        raise ValueError(f"instance {meta.instance}: checkpoint {meta.checkpoint_id} is a delta, not a full snapshot")
    target = os.fspath(target_dir)
    if os.path.isdir(target) and os.listdir(target):
        raise FileExistsError(f"restore target {target!r} is not empty")
    db = Rdict(target, db_options())
    try:
        load_full(db, meta, os.fspath(payload))
    except BaseException:
        db.close()
        shutil.rmtree(target, ignore_errors=True)
        raise
    db.close()


def load_full(db: Rdict, meta: IncrementMeta, payload: str) -> None:
    """Write a full snapshot's records into the empty ``db``, check its digest, mark its id."""
    reader = IncrementReader(payload)
    with reader:
        if not reader.full:
            raise IncrementFormatError(f"{payload}: the meta says full, the payload is a delta")
        total = 0
        batch: list[tuple[bytes, bytes | None]] = []
        batch_bytes = 0
        for key, value in reader:
            assert value is not None
            total += pair_hash(key, value)
            batch.append((key, value))
            batch_bytes += len(key) + len(value)
            if batch_bytes >= WRITE_BATCH_BYTES:
                write_records(db, batch)
                batch, batch_bytes = [], 0
        write_records(db, batch)
    check_digest(meta, digest_hex(total))
    db.put(MARKER_KEY, encode_marker(meta.checkpoint_id, meta.digest))

def write_records(db: Rdict, records: list[tuple[bytes, bytes | None]]) -> None:
    """Write ``records`` (a value of None deletes the key) as one batch."""
    if not records:
        return
    batch = WriteBatch(raw_mode=True)
    for key, value in records:
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    db.write(batch)

def link_or_copy(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Put ``source``'s content at ``target`` (replaced at once): a hard link, a copy across file systems."""
    source, target = os.fspath(source), os.fspath(target)
    tmp = target + ".tmp"
    unlink_quietly(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def unlink_quietly(path: str) -> None:
    """Remove ``path`` if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
