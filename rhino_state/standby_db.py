"""The RocksDB directories of a replica store, below its bookkeeping (DESIGN §6).

Building a database from a full increment (checked against its meta) and exporting a snapshot as
one, materialising a closed database elsewhere by hard links, reading key-group ranges, writing
records in batches, and the file moves the store makes.
No state: :mod:`rhino_state.replica_store` and :mod:`rhino_state.standby_instance` keep which
instance, checkpoint and directory is what.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

from rhino_state.checkpoint_chain import MARKER_KEY, encode_marker
from rhino_state.increments import (
    WRITE_BATCH_BYTES,
    IncrementFormatError,
    IncrementMeta,
    IncrementReader,
    IncrementWriter,
    combine_digest,
    digest_hex,
    digest_value,
    pair_hash,
)

__all__ = [
    "IncrementDigestError",
    "check_delta",
    "check_digest",
    "db_options",
    "export_snapshot",
    "link_db",
    "link_or_copy",
    "load_full",
    "read_ranges",
    "read_snapshot",
    "restore_full",
    "unlink_quietly",
    "write_records",
]

_MULTI_GET_CHUNK = 1024  # keys per multi-get

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


def read_ranges(db: Rdict, ranges: list[range]) -> list[tuple[int, bytes, bytes]]:
    """``(key_group, rest, value)`` of every key of ``db`` in the key-group ``ranges``, in key order."""
    out: list[tuple[int, bytes, bytes]] = []
    for r in ranges:
        read_opt = ReadOptions()
        if r.stop < 1 << 16:
            read_opt.set_iterate_upper_bound(r.stop.to_bytes(2, "big"))
        it = db.iter(read_opt)
        it.seek(r.start.to_bytes(2, "big"))
        while it.valid():
            key = it.key()
            out.append((int.from_bytes(key[:2], "big"), key[2:], it.value()))
            it.next()
        del it
    return out


def read_snapshot(private: str, ranges: list[range]) -> list[tuple[int, bytes, bytes]]:
    """:func:`read_ranges` of the snapshot linked at ``private`` (a directory of the caller's
    own, deleted afterwards)."""
    try:
        db = Rdict(private, db_options(), access_type=AccessType.read_only())
        try:
            return read_ranges(db, ranges)
        finally:
            db.close()
    finally:
        shutil.rmtree(private, ignore_errors=True)


def export_snapshot(completed: IncrementMeta, private: str, path: str | os.PathLike[str]) -> IncrementMeta:
    """Write the snapshot linked at ``private`` (completed checkpoint ``completed``; a directory of
    the caller's own, deleted afterwards) as a full increment payload at ``path``, checked
    against ``completed``'s digest, streaming; its meta."""
    try:
        db = Rdict(private, db_options(), access_type=AccessType.read_only())
        try:
            total = 0
            with IncrementWriter(path, full=True) as writer:
                it = db.iter(ReadOptions())
                it.seek(b"\x00\x00")
                while it.valid():
                    key, value = it.key(), it.value()
                    writer.add(key, value)
                    total += pair_hash(key, value)
                    it.next()
                del it
            try:
                check_digest(completed, digest_hex(total))
            except IncrementDigestError:
                unlink_quietly(os.fspath(path))
                raise
        finally:
            db.close()
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return IncrementMeta(
        instance=completed.instance,
        checkpoint_id=completed.checkpoint_id,
        previous_id=None,
        digest=completed.digest,
        changed_keys=writer.records,
        bytes_changed=writer.bytes_changed,
        bytes_shipped=writer.bytes_shipped,
        runtime=completed.runtime,
    )


def check_delta(db: Rdict, last: IncrementMeta, meta: IncrementMeta, payload: str) -> None:
    """Before a delta is written to the standby ``db`` (at checkpoint ``last``): its payload's
    checksum, and the content digest the standby will have, against ``meta``
    (:class:`IncrementDigestError`; read only: a bad delta leaves the standby untouched)."""
    removed: list[int] = []
    added: list[int] = []
    reader = IncrementReader(payload)
    with reader:
        if reader.full:
            raise IncrementFormatError(f"{payload}: the meta says delta, the payload is a full snapshot")
        chunk: list[bytes] = []
        for key, value in reader:
            chunk.append(key)
            if value is not None:
                added.append(pair_hash(key, value))
            if len(chunk) >= _MULTI_GET_CHUNK:
                removed.extend(_old_hashes(db, chunk))
                chunk = []
        removed.extend(_old_hashes(db, chunk))
    check_digest(meta, digest_hex(combine_digest(digest_value(last.digest), removed, added)))


def _old_hashes(db: Rdict, keys: list[bytes]) -> Iterator[int]:
    if not keys:
        return
    for key, old in zip(keys, db.get(keys), strict=True):
        if old is not None:
            yield pair_hash(key, old)
