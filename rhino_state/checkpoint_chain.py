"""The checkpoint chain of one state backend: what changed since its last checkpoint, the content
digest kept up to date in O(changed keys), and the marker that records that checkpoint in RocksDB.

After a first checkpoint the chain tracks the set of physical keys written (put or delete) since
the last one, independently of cache flushes. The digest is the commutative content digest of
``rhino_state.increments``: the first write of a key in an interval remembers the hash of its value
at the last checkpoint (from the backend's read cache, else read from RocksDB with one multi-get
per flush, before the batch overwrites it), so a delta checkpoint's digest is the last one's minus
those hashes plus the hashes of the changed keys' values now. Keys are not tracked before the first
checkpoint (it is full anyway).

Checkpoint marker: a checkpoint also stores ``(checkpoint id, digest)`` under the reserved 1-byte
key ``MARKER_KEY`` (physical keys are at least 2 bytes long, so it never collides and no iteration
reaches it). The first flush that changes the content after a checkpoint deletes it in the same
WriteBatch. Opening a database with a marker (e.g. one restored from a replica store) therefore
resumes the chain at that checkpoint; without one, the next checkpoint is full.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from rocksdict import Rdict

from rhino_state.increments import DIGEST_MODULUS, digest_value, pair_hash

MARKER_KEY = b"\x00"  # reserved: the last checkpoint, valid while the content has not changed since
MULTI_GET_CHUNK = 1024


def encode_marker(checkpoint_id: int, digest: str) -> bytes:
    """Value of the checkpoint marker key: the database holds the content of this checkpoint."""
    return json.dumps({"checkpoint_id": checkpoint_id, "digest": digest}).encode()


def decode_marker(raw: bytes | None) -> tuple[int, str] | None:
    """``(checkpoint_id, digest)`` of a marker value, or None if absent or unreadable."""
    if raw is None:
        return None
    try:
        marker = json.loads(raw)
        checkpoint_id, digest = marker["checkpoint_id"], marker["digest"]
        digest_value(digest)
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(checkpoint_id, int):
        return None
    return checkpoint_id, digest


class CheckpointChain:
    """Keys changed since the last checkpoint and the digest arithmetic of the next delta."""

    def __init__(self) -> None:
        self.last_id: int | None = None
        self._digest = 0  # content digest at last_id
        self.changed: set[bytes] | None = None  # None: no checkpoint to delta against
        self._base_pending: set[bytes] = set()  # changed keys whose checkpoint-time value is not hashed yet
        self._base_sum = 0  # sum of pair hashes of the changed keys' values at last_id

    def start(self, checkpoint_id: int, digest: int) -> None:
        """The content is now that of checkpoint ``checkpoint_id`` with digest ``digest``."""
        self.last_id = checkpoint_id
        self._digest = digest % DIGEST_MODULUS
        self.changed = set()
        self._base_pending = set()
        self._base_sum = 0

    def written(self, key: bytes, clean: Mapping[bytes, bytes | None]) -> None:
        """``key`` is being put or deleted and is not dirty; ``clean`` is the backend's read cache."""
        changed = self.changed
        if changed is None or key in changed:
            return
        changed.add(key)
        if key in clean:
            old = clean[key]
            if old is not None:
                self._base_sum += pair_hash(key, old)
        else:
            self._base_pending.add(key)

    def hash_stored(self, db: Rdict) -> None:
        """Hash the checkpoint-time values of changed keys still only in RocksDB (before a flush
        overwrites them)."""
        if not self._base_pending:
            return
        pending = list(self._base_pending)
        for start in range(0, len(pending), MULTI_GET_CHUNK):
            keys = pending[start : start + MULTI_GET_CHUNK]
            for key, old in zip(keys, db.get(keys), strict=True):
                if old is not None:
                    self._base_sum += pair_hash(key, old)
        self._base_pending.clear()

    def unchanged_sum(self) -> int:
        """The digest sum of the keys not changed since the last checkpoint (all changed keys'
        checkpoint-time values must be hashed: call after a flush)."""
        assert self.changed is not None and not self._base_pending
        return self._digest - self._base_sum
