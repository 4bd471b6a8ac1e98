"""Uploading the increments a worker ships to the durable store, off the instance thread (DESIGN §12).

The shipping replica of a partition offers each increment as it takes it (:meth:`IncrementUploader.offer`
links the payload into a spool directory and returns at once); one thread per worker uploads them in
the order offered.  A delta names the file of the increment it applies to, which must be one this
uploader took before it.  A delta that follows none (the first one after this worker took over
shipping, or after an upload failed) is refused: the caller makes its next checkpoint a full
snapshot, which starts a new chain.  An upload that fails breaks its chain the same way: the deltas
queued after it are dropped and ``on_failed`` asks for a full snapshot.

What was uploaded goes to ``on_uploaded`` (the worker reports it to the driver, which writes a cut
once every partition's checkpoint of the consistent cut is among the uploaded ones).

A chain of deltas only grows: a resume applies all of it, and retention can delete nothing newer
than its full snapshot.  :meth:`IncrementUploader.wants_full` asks for a new full snapshot once the
deltas since the last one add up to its size, or number :data:`MAX_CHAIN`: the directory then holds
at most about twice the state per kept chain, and a resume reads about as much.

A store slower than the checkpoints would let the queue, and the spool on the worker's disk, grow
without end.  So a full snapshot offered drops that partition's increments still queued (no cut
can need them once a newer chain is on its way; the cut waits for that chain instead).  What is
queued of a partition is then its deltas since its last full snapshot (and that snapshot), which
the rule above bounds: the spool holds about twice each partition's state at most.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from rhino_state.durable import DurableStore, UploadedIncrement
from rhino_state.increments import IncrementMeta
from transport.ids import PartitionId

__all__ = ["IncrementUploader"]

log = logging.getLogger(__name__)

ATTEMPTS = 3
RETRY_PAUSE_S = 0.5
KEEP_NAMES = 16  # per partition: the names of the latest increments taken, for the deltas that follow
BACKLOG_WARNING = 64
MAX_CHAIN = 200  # deltas after a full snapshot at most


class IncrementUploader:
    """Uploads one worker's offered increments in order, in a thread of its own."""

    def __init__(self, store: DurableStore, spool: Path, on_uploaded: Callable[[UploadedIncrement], None],
                 on_failed: Callable[[PartitionId], None]) -> None:
        self.store = store
        self.spool = spool
        self.on_uploaded = on_uploaded
        self.on_failed = on_failed
        self._names: dict[PartitionId, dict[int, str]] = {}  # checkpoint id -> file stem, per partition
        self._broken: set[PartitionId] = set()  # a failed upload's partitions: deltas until a full are dropped
        self._chains: dict[PartitionId, tuple[int, int, int]] = {}  # (full's bytes, deltas' bytes, deltas) since
        self._queue: deque[tuple[IncrementMeta, str | None, str, Path]] = deque()
        self.superseded = 0  # increments dropped from the queue by a newer full snapshot
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self.uploaded_bytes = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="durable-upload", daemon=True)
        spool.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def offer(self, meta: IncrementMeta, payload: Path) -> bool:
        """Queue ``meta``'s payload (linked, the caller may delete its file); False if it is a delta
        this uploader cannot chain (the caller's next checkpoint must be a full snapshot)."""
        inst = meta.instance
        with self._cond:
            if self._closed:
                return False
            names = self._names.setdefault(inst, {})
            previous = None if meta.full else names.get(meta.previous_id)
            if not meta.full and previous is None:
                return False
            file = self.store.new_file_name(meta.checkpoint_id)
            spooled = self.spool / f"t{inst[0]}-p{inst[1]}-{file}.inc"
            try:
                os.link(payload, spooled)
            except OSError:
                shutil.copyfile(payload, spooled)
            size = os.path.getsize(spooled)
            if meta.full:
                names.clear()
                self._chains[inst] = (size, 0, 0)
                self._drop_queued(inst)
            else:
                full, deltas, count = self._chains.get(inst, (0, 0, 0))
                self._chains[inst] = (full, deltas + size, count + 1)
            names[meta.checkpoint_id] = file
            for old in sorted(names)[:-KEEP_NAMES]:
                del names[old]
            self._queue.append((meta, previous, file, spooled))
            if len(self._queue) == BACKLOG_WARNING:
                log.warning("durable checkpoints: %d increments wait for their upload to %s", len(self._queue),
                            self.store.where)
            self._cond.notify_all()
        return True

    def _drop_queued(self, inst: PartitionId) -> None:
        """A full snapshot of ``inst`` is queued: what of it waits before it is not needed (caller locks)."""
        kept = deque(item for item in self._queue if item[0].instance != inst)
        for *_, spooled in (item for item in self._queue if item[0].instance == inst):
            spooled.unlink(missing_ok=True)
            self.superseded += 1
        self._queue = kept

    def wants_full(self, inst: PartitionId) -> bool:
        """Whether ``inst``'s chain is long enough that its next checkpoint should be a full snapshot."""
        with self._cond:
            chain = self._chains.get(inst)
        return chain is not None and (chain[1] >= max(chain[0], 1) or chain[2] >= MAX_CHAIN)

    def backlog(self) -> int:
        with self._cond:
            return len(self._queue) + self._busy

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything offered so far is uploaded (or dropped); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Finish the uploads queued (up to ``timeout``), then stop."""
        self.wait_idle(timeout)
        with self._cond:
            self._closed = True
            dropped, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        for *_, spooled in dropped:
            spooled.unlink(missing_ok=True)
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                meta, previous, file, spooled = self._queue.popleft()
                if meta.full:  # a new chain
                    self._broken.discard(meta.instance)
                skip = meta.instance in self._broken  # a delta of a chain whose upload failed
                self._busy = not skip
            try:
                if not skip:
                    self._upload(meta, previous, file, spooled)
            finally:
                spooled.unlink(missing_ok=True)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upload(self, meta: IncrementMeta, previous: str | None, file: str, spooled: Path) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                uploaded = self.store.upload(meta, spooled, previous, file=file)
            except Exception as exc:  # noqa: BLE001 - any file system error: retried, then a new chain
                if attempt < ATTEMPTS:
                    time.sleep(RETRY_PAUSE_S * attempt)
                    continue
                self.failures += 1
                log.warning("durable checkpoints: checkpoint %d of %s not uploaded to %s (%s): the next one is "
                            "a full snapshot", meta.checkpoint_id, meta.instance, self.store.where, exc)
                with self._cond:
                    self._broken.add(meta.instance)
                    names = self._names.get(meta.instance, {})
                    for cid in [c for c in names if c >= meta.checkpoint_id]:
                        del names[cid]
                self.on_failed(meta.instance)
                return
            self.uploaded_bytes += uploaded.size
            self.on_uploaded(uploaded)
            return
