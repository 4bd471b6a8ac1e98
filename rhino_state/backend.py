"""Embedded RocksDB keyed-state backend with a write-back cache.

One ``RocksDBStateBackend`` (one RocksDB, raw bytes, default column family
only) per hosted partition instance. A physical key is the 2-byte big-endian
key group followed by the caller's ``rest`` bytes, so the key groups of a vnode
form one contiguous key range.

Caching: writes and deletes go to a dirty map (a delete is a tombstone) that
``flush()`` writes in WriteBatches of a few MiB; it is flushed automatically when it
holds more than ``cache_max_entries`` keys. Reads look at the dirty map, then at
a bounded LRU read cache of clean values (and known-absent keys), then at
RocksDB. All writes must go through this object while it is open (it holds the
RocksDB lock), which keeps the read cache coherent. Flush points do not change
the logical content, so ``digest()`` only depends on what was written.

Iteration (``iter_prefix``, ``iter_key_groups``) merges the dirty map with
RocksDB in key order. It reads RocksDB in short chunks, each with its own
short-lived iterator, so an abandoned generator never keeps the database open
after ``close()``. Writes made while a generator is suspended may or may not be
seen by it; every key is yielded at most once, in ascending order.

Incremental checkpoints (Rhino, DESIGN §6): ``checkpoint()`` flushes and writes a payload file
(``rhino_state.increments``) with the final value or tombstone of every key changed since the last
checkpoint, or, for the first checkpoint or with ``full=True``, every live key. Which keys changed,
the content digest kept in O(changed keys) and the marker that lets a reopened database resume the
chain are :mod:`rhino_state.checkpoint_chain`. ``digest()`` computes the same digest by a full
scan. A key written back to its checkpoint-time value, or deleted while absent, is still shipped
(as its value or a tombstone).

Measured cost (CPython, 64-byte values, shared machine, so rough): the first
write of a key in an interval adds ~1 us (one BLAKE2b) when the old value is in
the read cache (read-modify-write) and ~2-3 us when the flush has to read it
(blind writes); a delta checkpoint of 1,000 changed keys takes ~10 ms, a full
snapshot of 10^5 keys ~140 ms, and a full-scan ``digest()`` of them ~110 ms.
"""

from __future__ import annotations

import os
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from heapq import merge
from typing import Any

from rocksdict import Options, Rdict, ReadOptions, WriteBatch

from rhino_state.checkpoint_chain import (
    MARKER_KEY,
    MULTI_GET_CHUNK,
    CheckpointChain,
    decode_marker,
    encode_marker,
)
from rhino_state.increments import (
    WRITE_BATCH_BYTES,
    IncrementMeta,
    IncrementWriter,
    batch_write,
    digest_hex,
    digest_value,
    pair_hash,
)
from transport.ids import PartitionId

__all__ = ["RocksDBStateBackend", "StateBackendClosedError"]

_ITER_CHUNK = 512
_FIRST_KEY = b"\x00\x00"  # smallest physical key


class StateBackendClosedError(RuntimeError):
    """Raised when a closed state backend is used."""


def _kg_prefix(key_group: int) -> bytes:
    try:
        return key_group.to_bytes(2, "big")
    except (OverflowError, AttributeError):
        raise ValueError(f"key_group must be an int in [0, 65536), got {key_group!r}") from None


def _successor(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def _db_range(open_db: Callable[[], Rdict], lower: bytes, upper: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """RocksDB content of [lower, upper), read in chunks with short-lived iterators; ``open_db``
    gives the database for each chunk (and raises once it is closed)."""
    seek = lower
    while True:
        db = open_db()
        read_opt = ReadOptions()
        if upper is not None:
            read_opt.set_iterate_upper_bound(upper)
        it = db.iter(read_opt)
        it.seek(seek)
        chunk = []
        while it.valid() and len(chunk) < _ITER_CHUNK:
            chunk.append((it.key(), it.value()))
            it.next()
        del it  # release the RocksDB iterator before yielding
        yield from chunk
        if len(chunk) < _ITER_CHUNK:
            return
        seek = chunk[-1][0] + b"\x00"


def _first_in_each_group(it: Any, prefix: bytes, groups: Sequence[int]) -> list[tuple[int, bytes]]:
    """With RocksDB iterator ``it``: ``(key_group, rest)`` of the first key under ``prefix`` in each
    of the ascending ``groups`` that has one.  It seeks only where the key it stands on lies below
    the next group's prefix, and skips the groups below that key's."""
    found = []
    at = b""  # the key the iterator stands on: the first one at or after its last seek
    i, n = 0, len(groups)
    while i < n:
        kg = groups[i]
        lower = _kg_prefix(kg) + prefix
        if at < lower:
            it.seek(lower)
            if not it.valid():
                break  # no key at or after it: none in this key group or any later one
            at = it.key()
        if at.startswith(lower):
            found.append((kg, at[2:]))
            i += 1
            continue
        i += 1  # nothing of ``prefix`` in this group: go on at the group of the key stood on
        at_group = int.from_bytes(at[:2], "big")
        if i < n and groups[i] < at_group:
            i = bisect_left(groups, at_group, i)
    return found


class RocksDBStateBackend:
    """Keyed state of one partition instance in an embedded RocksDB."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        cache_max_entries: int = 10_000,
        *,
        instance: PartitionId | None = None,
    ) -> None:
        """Open (or create) the database at ``path``; ``instance`` is recorded in checkpoint metas."""
        if cache_max_entries < 0:
            raise ValueError(f"cache_max_entries must be >= 0, got {cache_max_entries!r}")
        self.path = os.fspath(path)
        self.cache_max_entries = cache_max_entries
        os.makedirs(self.path, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db: Rdict | None = Rdict(self.path, options)
        self._dirty: dict[bytes, bytes | None] = {}  # None is a tombstone
        self._dirty_sorted: list[bytes] | None = None  # built on the first iteration after a flush
        self._clean: OrderedDict[bytes, bytes | None] = OrderedDict()  # None: known absent
        self._stats = dict.fromkeys(("reads", "writes", "cache_hits", "flushes", "bytes_written"), 0)
        self.instance = instance
        self._chain = CheckpointChain()
        self._marker_valid = False  # the marker in RocksDB describes the current content
        marker = decode_marker(self._db.get(MARKER_KEY))
        if marker is not None:
            self._chain.start(marker[0], digest_value(marker[1]))
            self._marker_valid = True

    # ------------------------------------------------------------------ point access

    def get(self, key_group: int, rest: bytes) -> bytes | None:
        """Value stored under (key_group, rest), or None."""
        db = self._open_db()
        key = _kg_prefix(key_group) + rest
        self._stats["reads"] += 1
        if key in self._dirty:
            self._stats["cache_hits"] += 1
            return self._dirty[key]
        if key in self._clean:
            self._stats["cache_hits"] += 1
            self._clean.move_to_end(key)
            return self._clean[key]
        value = db.get(key)
        self._remember_clean(key, value)
        return value

    def put(self, key_group: int, rest: bytes, value: bytes) -> None:
        """Store ``value`` under (key_group, rest)."""
        if not isinstance(value, bytes):
            raise TypeError(f"state values must be bytes, got {type(value).__qualname__}")
        self._write(_kg_prefix(key_group) + rest, value)

    def delete(self, key_group: int, rest: bytes) -> None:
        """Remove (key_group, rest); a no-op if absent."""
        self._write(_kg_prefix(key_group) + rest, None)

    def _write(self, key: bytes, value: bytes | None) -> None:
        self._open_db()
        self._stats["writes"] += 1
        self._chain.written(key, self._clean)
        if key not in self._dirty and self._dirty_sorted is not None:
            insort(self._dirty_sorted, key)
        self._dirty[key] = value
        self._clean.pop(key, None)
        if len(self._dirty) > self.cache_max_entries:
            self.flush()

    def _remember_clean(self, key: bytes, value: bytes | None) -> None:
        if self.cache_max_entries == 0:
            return
        self._clean[key] = value
        while len(self._clean) > self.cache_max_entries:
            self._clean.popitem(last=False)

    # ------------------------------------------------------------------ iteration

    def iter_prefix(self, key_group: int, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(rest, value)`` of live keys in ``key_group`` whose rest starts with ``prefix``, in key order."""
        lower = _kg_prefix(key_group) + prefix
        return ((key[2:], value) for key, value in self._iter_range(lower, _successor(lower)))

    def iter_key_groups(self, key_groups: range) -> Iterator[tuple[int, bytes, bytes]]:
        """``(key_group, rest, value)`` of every live key in ``key_groups``, in key order."""
        if key_groups.step != 1:
            raise ValueError(f"key_groups must be a contiguous range (step 1), got {key_groups!r}")
        if not key_groups:
            return iter(())
        lower = _kg_prefix(key_groups.start)
        upper = None if key_groups.stop >= 1 << 16 else _kg_prefix(key_groups.stop)
        return (
            (int.from_bytes(key[:2], "big"), key[2:], value) for key, value in self._iter_range(lower, upper)
        )

    def _iter_range(self, lower: bytes, upper: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Live (physical key, value) pairs in [lower, upper), dirty entries merged over RocksDB."""
        self._open_db()
        sorted_dirty = self._sorted_dirty_keys()
        start = bisect_left(sorted_dirty, lower)
        stop = len(sorted_dirty) if upper is None else bisect_left(sorted_dirty, upper, start)
        dirty = [(key, 0, self._dirty[key]) for key in sorted_dirty[start:stop]]
        stored = ((key, 1, value) for key, value in _db_range(self._open_db, lower, upper))
        last = None
        for key, _, value in merge(dirty, stored):  # dirty (0) sorts before stored (1) on equal keys
            if key != last:
                last = key
                if value is not None:
                    yield key, value

    def first_in_key_groups(self, prefix: bytes, key_groups: Iterable[int]) -> Iterator[tuple[int, bytes]]:
        """``(key_group, rest)`` of the first live key whose rest starts with ``prefix`` in each of
        ``key_groups`` that has one, by ascending key group.  Flushes first, then walks one RocksDB
        iterator up the key groups (:func:`_first_in_each_group`), so key groups without state cost
        nothing (a restore asks for all of them)."""
        self.flush()
        groups = key_groups if isinstance(key_groups, range) and key_groups.step == 1 else sorted(set(key_groups))
        return iter(_first_in_each_group(self._open_db().iter(ReadOptions()), prefix, groups))

    def _sorted_dirty_keys(self) -> list[bytes]:
        if self._dirty_sorted is None:
            self._dirty_sorted = sorted(self._dirty)
        return self._dirty_sorted

    # ------------------------------------------------------------------ maintenance

    @property
    def dirty_count(self) -> int:
        """Number of written keys not yet flushed to RocksDB."""
        return len(self._dirty)

    def flush(self) -> None:
        """Write all dirty entries to RocksDB (in WriteBatches of about ``WRITE_BATCH_BYTES``; the
        first deletes the checkpoint marker, so the marker never stands beside other content)."""
        db = self._open_db()
        if not self._dirty:
            return
        self._chain.hash_stored(db)
        batch = WriteBatch(raw_mode=True)
        if self._marker_valid:
            batch.delete(MARKER_KEY)
        written = in_batch = 0
        for key, value in self._dirty.items():
            size = batch_write(batch, key, value)
            written += size
            in_batch += size
            if in_batch >= WRITE_BATCH_BYTES:
                db.write(batch)
                batch, in_batch = WriteBatch(raw_mode=True), 0
        db.write(batch)
        self._marker_valid = False
        self._stats["flushes"] += 1
        self._stats["bytes_written"] += written
        dirty, self._dirty, self._dirty_sorted = self._dirty, {}, None
        for key, value in dirty.items():
            self._remember_clean(key, value)

    def digest(self) -> str:
        """Content digest of all live pairs, unflushed writes included, by a full scan (O(state)).

        The same function as ``IncrementMeta.digest`` (see ``rhino_state.increments``).
        """
        total = 0
        for key, value in self._iter_range(_FIRST_KEY, None):
            total += pair_hash(key, value)
        return digest_hex(total)

    # ------------------------------------------------------------------ checkpoints

    @property
    def last_checkpoint_id(self) -> int | None:
        """Id of the checkpoint the next delta applies to; None: the next checkpoint is full."""
        return self._chain.last_id

    @property
    def changed_count(self) -> int | None:
        """Keys put or deleted since the last checkpoint; None if there is none (all is new)."""
        return None if self._chain.changed is None else len(self._chain.changed)

    def changes_in(self, key_groups: Iterable[range]) -> list[tuple[int, bytes, bytes | None]] | None:
        """``(key_group, rest, value)`` of every key in ``key_groups`` put or deleted since the last
        checkpoint, with its value now (None: deleted), in key order: what the next delta
        checkpoint would hold of those key groups.  On top of that checkpoint's content it gives
        their content now (a handover ships only this to a target that holds the checkpoint).
        None: there is no checkpoint to apply it to."""
        db = self._open_db()
        changed = self._chain.changed
        if changed is None:
            return None
        bounds = [(_kg_prefix(r.start), None if r.stop >= 1 << 16 else _kg_prefix(r.stop)) for r in key_groups if r]
        keys = sorted(k for k in changed
                      if any(lo <= k and (hi is None or k < hi) for lo, hi in bounds))
        stored = [k for k in keys if k not in self._dirty]
        values: dict[bytes, bytes | None] = {}
        for start in range(0, len(stored), MULTI_GET_CHUNK):
            chunk = stored[start : start + MULTI_GET_CHUNK]
            values.update(zip(chunk, db.get(chunk), strict=True))
        return [(int.from_bytes(k[:2], "big"), k[2:], self._dirty[k] if k in self._dirty else values[k])
                for k in keys]

    def checkpoint(
        self,
        checkpoint_id: int,
        path: str | os.PathLike[str],
        *,
        runtime: bytes = b"",
        full: bool = False,
    ) -> IncrementMeta:
        """Flush and write the increment since the last checkpoint to ``path``; returns its meta.

        A delta holds the final value (or a tombstone) of each key written since the last
        checkpoint; with ``full`` or without a previous checkpoint it is a full snapshot of every
        live key (``previous_id`` None). Checkpoint ids must increase. Cost: O(changed keys) for a
        delta (one multi-get per 1024 changed keys), O(state) for a full snapshot.
        """
        db = self._open_db()
        if self.instance is None:
            raise ValueError("construct the backend with instance=(task, partition) to take checkpoints")
        if not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            raise ValueError(f"checkpoint_id must be a non-negative int, got {checkpoint_id!r}")
        last = self._chain.last_id
        if last is not None and checkpoint_id <= last:
            raise ValueError(f"checkpoint ids must increase: {checkpoint_id} after {last}")
        self.flush()
        previous = None if full or self._chain.changed is None else last
        with IncrementWriter(path, full=previous is None) as writer:
            if previous is None:
                total = 0
                for key, value in _db_range(self._open_db, _FIRST_KEY, None):
                    writer.add(key, value)
                    total += pair_hash(key, value)
            else:
                total = self._chain.unchanged_sum()
                keys = sorted(self._chain.changed or ())
                for start in range(0, len(keys), MULTI_GET_CHUNK):
                    chunk = keys[start : start + MULTI_GET_CHUNK]
                    for key, value in zip(chunk, db.get(chunk), strict=True):
                        writer.add(key, value)
                        if value is not None:
                            total += pair_hash(key, value)
        digest = digest_hex(total)
        db.put(MARKER_KEY, encode_marker(checkpoint_id, digest))
        self._marker_valid = True
        self._chain.start(checkpoint_id, total)
        return IncrementMeta(
            instance=self.instance,
            checkpoint_id=checkpoint_id,
            previous_id=previous,
            digest=digest,
            changed_keys=writer.records,
            bytes_changed=writer.bytes_changed,
            bytes_shipped=writer.bytes_shipped,
            runtime=runtime,
        )

    def stats(self) -> dict[str, int]:
        """Counters: reads, writes, cache_hits, flushes, bytes_written, plus dirty and cached sizes."""
        return {**self._stats, "dirty": len(self._dirty), "cached": len(self._clean)}

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._db is None

    def close(self) -> None:
        """Flush and close RocksDB; closing twice is a no-op."""
        if self._db is None:
            return
        try:
            self.flush()
        finally:
            db, self._db = self._db, None
            self._clean.clear()
            db.close()

    def __enter__(self) -> RocksDBStateBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_db(self) -> Rdict:
        if self._db is None:
            raise StateBackendClosedError(f"state backend at {self.path!r} is closed")
        return self._db

    def __repr__(self) -> str:
        state = "closed" if self._db is None else f"dirty={len(self._dirty)}"
        return f"RocksDBStateBackend({self.path!r}, {state})"
