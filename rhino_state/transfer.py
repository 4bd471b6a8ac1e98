"""The gRPC edge of chain replication (DESIGN §6): ships increments along replica chains.

Three pieces, all over :mod:`transport.rpc` signed raw-bytes unary calls (the first two here):

* :func:`send_increment` ships one increment (meta + payload file) to one chain member as
  a sequence of ``IncrementChunk`` calls of at most ``chunk_size`` payload bytes.  Each call
  carries a header (transfer id, offset, last flag); the last one also carries the meta, the
  chain, the receiver's position, the total size and a SHA-256 of the payload.  Any failure
  restarts the whole transfer under a fresh transfer id (the receiver drops stale partials).
* :class:`IncrementService` is the member side (``handlers()`` merges into a worker's
  ``rpc.serve`` dict).  It spools chunks to ``spool_dir``, verifies size and checksum, runs
  the :class:`~rhino_state.chain.ChainMember` machine, calls ``store_apply`` (synchronously,
  in the gRPC handler thread) and answers the upstream only once the increment is stored.
  Forwarding to the successor and acking to the origin are queued on a per-destination
  sender thread, so a slow or dead successor never holds a gRPC handler thread: each queued
  job has a deadline (``forward_timeout`` from when it was queued), retries UNAVAILABLE /
  DEADLINE_EXCEEDED until then, and on giving up sends a *nack* to the origin so it resends
  at once instead of waiting for its ack timeout.  Per destination the queue is FIFO, so a
  member forwards an instance's increments in the order it stored them.
* :class:`~rhino_state.shipper.ChainShipper` (its own module) is the origin side: it sends an
  instance's increments to its chain's head with :func:`send_increment` and hears the tail's
  acks on its ``IncrementAck`` handler.

Member ids in chains are the workers' advertised ``host:port`` addresses.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rhino_state.chain import (
    Ack,
    ChainMember,
    Forward,
    Reject,
    Store,
)
from rhino_state.increments import IncrementMeta
from rhino_state.standby_db import link_or_copy
from transport import rpc, wire
from transport.ids import PartitionId
from transport.security import RpcSecurity

__all__ = [
    "ACK_METHOD",
    "CHUNK_METHOD",
    "CHUNK_SIZE",
    "IncrementService",
    "TransferRejected",
    "send_increment",
]

log = logging.getLogger(__name__)

StoreApply = Callable[[IncrementMeta, Path], None]

CHUNK_METHOD = "IncrementChunk"
ACK_METHOD = "IncrementAck"
CHUNK_SIZE = 4 * 1024 * 1024
_HEAD = struct.Struct(">I")
_TID = re.compile(r"[0-9a-f]{32}")


class TransferRejected(Exception):
    """The receiving member refused the increment (``reason``); ``missing_base``: it holds nothing
    for the instance, so only a full snapshot can be stored there."""

    def __init__(self, reason: str, missing_base: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing_base = missing_base


@wire.record
@dataclass(frozen=True)
class ChunkHeader:
    """What precedes the payload bytes of an ``IncrementChunk`` call; the last chunk of a transfer
    also carries the meta, the chain, the receiver's position, the total size and a SHA-256."""

    tid: str
    offset: int
    last: bool
    meta: IncrementMeta | None = None
    chain: tuple[str, ...] = ()
    position: int = 0
    size: int = 0
    sha256: str = ""


@wire.record
@dataclass(frozen=True)
class ChunkReply:
    ok: bool
    error: str = ""
    missing_base: bool = False


@wire.record
@dataclass(frozen=True)
class ChainAck:
    """``IncrementAck``: chain member ``sender`` stored ``checkpoint_id`` of ``instance`` (the tail's
    ack completes it), or (``nack``) could not forward it, and why."""

    instance: PartitionId
    checkpoint_id: int
    sender: str
    nack: str | None = None
    missing_base: bool = False


def _encode(header: ChunkHeader, data: bytes = b"") -> bytes:
    head = wire.encode(header)
    return _HEAD.pack(len(head)) + head + data


def _decode(request: bytes) -> tuple[ChunkHeader, memoryview]:
    view = memoryview(request)
    (n,) = _HEAD.unpack_from(view)
    return wire.decode(view[_HEAD.size:_HEAD.size + n], ChunkHeader), view[_HEAD.size + n:]


def encode_reply(ok: bool, error: str = "", missing_base: bool = False) -> bytes:
    return wire.encode(ChunkReply(ok, error, missing_base))


def send_increment(
    peer: rpc.Peer,
    meta: IncrementMeta,
    payload: Path,
    chain: Sequence[str],
    position: int,
    *,
    chunk_size: int = CHUNK_SIZE,
    timeout: float = 30.0,
) -> None:
    """Ship ``meta`` and the ``payload`` file to ``chain[position]`` (reached through ``peer``).

    Returns once that member stored the increment.  Raises :class:`TransferRejected` if it
    refused, ``grpc.RpcError`` on transport failures (``timeout`` applies per chunk call) and
    ``OSError`` if the payload cannot be read.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    tid = uuid.uuid4().hex
    digest = hashlib.sha256()
    offset = 0
    with open(payload, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        while True:
            data = f.read(min(chunk_size, size - offset)) if offset < size else b""
            digest.update(data)
            last = not data or offset + len(data) >= size
            header = ChunkHeader(tid, offset, last) if not last else ChunkHeader(
                tid, offset, last, meta, tuple(chain), position, offset + len(data), digest.hexdigest())
            reply = wire.decode(peer.call_bytes(CHUNK_METHOD, _encode(header, data), timeout=timeout), ChunkReply)
            if not reply.ok:
                raise TransferRejected(reply.error, reply.missing_base)
            offset += len(data)
            if last:
                return


def _retrying(deadline: float, call_timeout: float, stop: threading.Event, fn: Callable[[float], None]) -> None:
    """Run ``fn(timeout)``, retrying retryable gRPC errors with backoff until ``deadline`` or ``stop``."""
    backoff = 0.05
    while True:
        remaining = deadline - time.monotonic()
        try:
            fn(max(0.1, min(call_timeout, remaining)))
            return
        except grpc.RpcError as e:
            if not rpc.is_retryable(e) or time.monotonic() + backoff >= deadline or stop.wait(backoff):
                raise
        backoff = min(backoff * 2, 1.0)


# -- member side ----------------------------------------------------------------------------


@dataclass
class _Partial:
    path: Path
    digest: Any
    size: int = 0
    touched: float = field(default_factory=time.monotonic)


@dataclass
class _Job:
    deadline: float
    forward: Forward | None = None
    payload: Path | None = None  # forward: the spooled file, deleted once the job is done
    message: ChainAck | None = None  # ack / nack to an origin


class _Outbox:
    """A FIFO of jobs to one destination, run by its own thread."""

    def __init__(self, service: IncrementService, address: str) -> None:
        self.address = address
        self.peer = rpc.Peer(address, service.security)
        self._service = service
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"increment-out-{address}", daemon=True)
        self._thread.start()

    def put(self, job: _Job) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self.stopping.is_set())
                if self.stopping.is_set():
                    break
                job = self._jobs.popleft()
            try:
                self._service._run_job(self, job)
            except Exception:
                log.exception("increment job to %s failed", self.address)
        for job in self._jobs:
            if job.payload is not None:
                job.payload.unlink(missing_ok=True)

    def close(self) -> None:
        with self._cond:
            self.stopping.set()
            self._cond.notify()
        self._thread.join(timeout=10)
        self.peer.close()


class IncrementService:
    """Receives increments for the chains this worker is a member of, stores and forwards them.

    ``store_apply(meta, path)`` stores one increment; it may read, copy, hard-link or move
    ``path`` (it gets its own hard link of the spooled file) and must raise if it could not
    store it.  ``spool_dir`` belongs to the service: leftovers are deleted on :meth:`start`.
    ``stored`` seeds the last stored checkpoint per instance (e.g. from the replica store).
    """

    def __init__(
        self,
        store_apply: StoreApply,
        spool_dir: str | Path,
        *,
        security: RpcSecurity,
        stored: Mapping[PartitionId, int] | None = None,
        chunk_size: int = CHUNK_SIZE,
        call_timeout: float = 30.0,
        forward_timeout: float = 30.0,
        spool_ttl: float = 600.0,
    ) -> None:
        self._store_apply = store_apply
        self.security = security
        self.spool_dir = Path(spool_dir)
        self._stored = dict(stored or {})
        self.chunk_size = chunk_size
        self.call_timeout = call_timeout
        self.forward_timeout = forward_timeout
        self.spool_ttl = spool_ttl
        self._lock = threading.Lock()
        self._member: ChainMember | None = None
        self._partials: dict[str, _Partial] = {}
        self._outboxes: dict[str, _Outbox] = {}
        self._closed = False

    @property
    def member(self) -> ChainMember | None:
        return self._member

    def handlers(self) -> dict[str, rpc.BytesHandler]:
        """The handlers to merge into the worker's ``rpc.serve`` dict."""
        return {CHUNK_METHOD: self._on_chunk}

    def start(self, self_id: str) -> None:
        """Accept increments as ``self_id`` (this worker's address as chains name it)."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        for p in self.spool_dir.iterdir():
            if p.suffix in (".part", ".store"):
                p.unlink(missing_ok=True)
        with self._lock:
            self._member = ChainMember(self_id, self._stored)

    def close(self) -> None:
        """Stop the sender threads (queued forwards are dropped: origins resend them)."""
        with self._lock:
            self._closed = True
            outboxes, self._outboxes = list(self._outboxes.values()), {}
        for box in outboxes:
            box.close()

    # -- receiving -------------------------------------------------------------------------
    def _on_chunk(self, request: bytes) -> bytes:
        try:
            header, data = _decode(request)
            return self._chunk(header, data)
        except Exception as e:
            log.exception("increment chunk failed")
            return encode_reply(False, f"{type(e).__name__}: {e}")

    def _chunk(self, header: ChunkHeader, data: memoryview) -> bytes:
        tid, offset = header.tid, header.offset
        if not isinstance(tid, str) or not _TID.fullmatch(tid):
            return encode_reply(False, f"bad transfer id {tid!r}")
        with self._lock:
            if self._member is None or self._closed:
                return encode_reply(False, "increment service not running")
            if offset == 0:
                self._sweep()
                partial = self._partials[tid] = _Partial(self.spool_dir / f"{tid}.part", hashlib.sha256())
                partial.path.write_bytes(b"")
            else:
                partial = self._partials.get(tid)
                if partial is None or partial.size != offset:
                    return encode_reply(False, f"transfer {tid}: unexpected chunk at offset {offset}")
        # chunks of one transfer arrive one at a time (the sender waits for each reply)
        with open(partial.path, "ab") as f:
            f.write(data)
        partial.digest.update(data)
        partial.size += len(data)
        partial.touched = time.monotonic()
        if not header.last:
            return encode_reply(True)
        with self._lock:
            self._partials.pop(tid, None)
        if partial.size != header.size or partial.digest.hexdigest() != header.sha256 or header.meta is None:
            partial.path.unlink(missing_ok=True)
            return encode_reply(False, f"transfer {tid}: size or checksum mismatch "
                                 f"({partial.size} bytes received, {header.size} sent)")
        return self._complete(header.meta, tuple(header.chain), header.position, partial.path)

    def _complete(self, meta: IncrementMeta, chain: tuple[str, ...], position: int, path: Path) -> bytes:
        with self._lock:
            assert self._member is not None
            action = self._member.on_increment(meta, chain, position)[0]
        if isinstance(action, Store):
            link = path.with_suffix(".store")
            try:
                link_or_copy(path, link)
                self._store_apply(meta, link)
            except Exception as e:
                log.exception("storing checkpoint %d of %s failed", meta.checkpoint_id, meta.instance)
                with self._lock:
                    action = self._member.on_store_failed(meta, f"{type(e).__name__}: {e}")[0]
            else:
                with self._lock:
                    action = self._member.on_stored(meta, chain, position)[0]
            finally:
                link.unlink(missing_ok=True)
        if isinstance(action, Reject):
            path.unlink(missing_ok=True)
            return encode_reply(False, action.reason, action.missing_base)
        deadline = time.monotonic() + self.forward_timeout
        if isinstance(action, Forward):
            self._enqueue(action.to, _Job(deadline, forward=action, payload=path))
        else:
            assert isinstance(action, Ack)
            path.unlink(missing_ok=True)
            self._enqueue(action.to, _Job(deadline, message=ChainAck(action.instance, action.checkpoint_id,
                                                                     action.from_member)))
        return encode_reply(True)

    def _sweep(self) -> None:
        """Drop partial transfers abandoned by their senders (called with the lock held)."""
        now = time.monotonic()
        for tid, partial in list(self._partials.items()):
            if now - partial.touched > self.spool_ttl:
                del self._partials[tid]
                partial.path.unlink(missing_ok=True)

    # -- sending ---------------------------------------------------------------------------
    def _enqueue(self, address: str, job: _Job) -> None:
        with self._lock:
            box = self._outboxes.get(address)
            if box is None and not self._closed:
                box = self._outboxes[address] = _Outbox(self, address)
        if box is not None:
            box.put(job)
        elif job.payload is not None:  # closing: the origin resends what never got through
            job.payload.unlink(missing_ok=True)

    def _run_job(self, box: _Outbox, job: _Job) -> None:
        if job.forward is not None:
            self._run_forward(box, job)
            return
        assert job.message is not None
        try:
            _retrying(job.deadline, self.call_timeout, box.stopping, lambda t: box.peer.call_bytes(
                ACK_METHOD, wire.encode(job.message), timeout=t))
        except grpc.RpcError as e:
            log.warning("could not deliver %s to origin %s: %s", job.message, box.address, e.code())

    def _run_forward(self, box: _Outbox, job: _Job) -> None:
        fwd, path, peer = job.forward, job.payload, box.peer
        assert fwd is not None and path is not None
        reason, missing_base = "", False
        try:
            if time.monotonic() >= job.deadline:
                reason = "forward deadline passed before it could start"
            else:
                _retrying(job.deadline, self.call_timeout, box.stopping, lambda t: send_increment(
                    peer, fwd.meta, path, fwd.chain, fwd.position, chunk_size=self.chunk_size, timeout=t))
        except TransferRejected as e:
            reason, missing_base = f"rejected by {fwd.to}: {e.reason}", e.missing_base
        except grpc.RpcError as e:
            reason = f"forward to {fwd.to} failed: {e.code()}"
        except OSError as e:
            reason = f"forward to {fwd.to} failed: {e}"
        finally:
            path.unlink(missing_ok=True)
        if reason:
            log.warning("checkpoint %d of %s: %s", fwd.meta.checkpoint_id, fwd.meta.instance, reason)
            self._enqueue(fwd.chain[0], _Job(time.monotonic() + self.forward_timeout, message=ChainAck(
                fwd.meta.instance, fwd.meta.checkpoint_id, fwd.chain[fwd.position - 1], reason, missing_base)))


# -- origin side ----------------------------------------------------------------------------
