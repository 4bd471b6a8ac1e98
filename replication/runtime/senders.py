"""Who sends a channel's batches: one thread per destination worker, whatever the channels.

A channel (:class:`replication.runtime.channels.OutputChannel`) keeps a :class:`Cursor` per destination
replica and *schedules* it on the :class:`BatchSender` of the worker that replica runs on when a
batch is sealed, or *at* the time its open batch is due.  The sender's thread takes every ready
cursor, asks its channel for the next batch (``next_batch``), sends them all at once and reports
each status back (``batch_sent``, ``batch_failed``).  :class:`PushLink` sends to another worker in one
``PushMany`` call (its wire format is here too), :class:`LocalSender` delivers to this worker's
own instances (or calls a plain callable).
"""

from __future__ import annotations

import heapq
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from transport import batch_format, wire
from transport.frames import FrameCallFailed, FramePeer, TransportFailure
from transport.rpc import Peer, is_retryable

log = logging.getLogger(__name__)

Transport = Callable[[bytes], object]


class PushRefused(Exception):
    """The destination worker refused a batch (it hosts no replica of its partition, or the
    channel is not an input there): the replica is cut off, as for a failed transport."""


# PushMany wire format: a request is a sequence of (4-byte big-endian length, framed batch); the
# reply has one status byte per batch (then, if any was refused, the list of the reasons, transport.wire).
PUSH_METHOD = "PushMany"
PUSH_OK, PUSH_BUSY, PUSH_REFUSED = 0, 1, 2
_LEN = struct.Struct(">I")


def encode_pushes(payloads: Sequence[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(p)) + p for p in payloads)


def decode_pushes(request: bytes) -> list[bytes]:
    payloads, pos = [], 0
    view = memoryview(request)
    while pos < len(request):
        (size,) = _LEN.unpack_from(request, pos)
        payloads.append(bytes(view[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return payloads


def encode_push_reply(statuses: Sequence[int], reasons: Sequence[str]) -> bytes:
    return bytes(statuses) + (wire.encode([str(r) for r in reasons]) if reasons else b"")


def decode_push_reply(reply: bytes, count: int) -> tuple[bytes, list[str]]:
    return reply[:count], ([str(r) for r in wire.decode(reply[count:], list)] if len(reply) > count else [])


def receive_pushes(request: bytes, deliver: Callable[[batch_format.BatchHeader, bytes], bool]) -> bytes:
    """The receiving side of a ``PushMany`` call: ``deliver`` each batch without blocking (True:
    taken, False: its queue is full, ValueError: refused, with the reason); the reply."""
    statuses, reasons = [], []
    for payload in decode_pushes(request):
        try:
            statuses.append(PUSH_OK if deliver(batch_format.decode_header(payload), payload) else PUSH_BUSY)
        except ValueError as exc:
            statuses.append(PUSH_REFUSED)
            reasons.append(str(exc))
    return encode_push_reply(statuses, reasons)


Status = tuple[int, "BaseException | str | None"]  # (PUSH_OK | PUSH_BUSY | PUSH_REFUSED, why refused)


class Cursor:
    """Where one replica of a channel's destination partition is sent from: the channel, the
    replica's index, the generation of its transport (a rejoin starts a new one) and its sender."""

    __slots__ = ("channel", "replica", "gen", "sender", "queued", "retry_at", "backoff")

    def __init__(self, channel: Any, replica: int, gen: int, sender: BatchSender) -> None:
        self.channel = channel
        self.replica = replica
        self.gen = gen
        self.sender = sender
        self.queued = False  # in the sender's ready queue
        self.retry_at = 0.0  # answered busy: not before then
        self.backoff = 0.0


class BatchSender:
    """One thread sending the batches of every (channel, replica) routed to one destination.

    A channel *schedules* a cursor when it has a sealed batch for that replica, or *schedules it
    at* the time its open batch is due (the buffer timeout).  The thread takes every ready cursor,
    asks its channel for the next batch (everything waiting for that replica, up to the batch
    size), sends them all at once (:meth:`_send`) and reports each status back to its channel.  A
    cursor has at most one batch in flight, so each channel stays FIFO per replica.  A batch
    answered *busy* (a full input queue at the destination) is sent again after a backoff of its
    own (1-8 ms), without holding up the other cursors.  So a worker has one sending thread per
    destination worker, however many channels and replicas it sends to.
    """

    def __init__(self, name: str, linger_s: float = 0.0,
                 busy_backoff_s: tuple[float, float] = (0.001, 0.008)) -> None:
        self.name = name
        self._linger_s = linger_s
        self._busy_backoff_s = busy_backoff_s
        self._cond = threading.Condition()
        self._ready: deque[Cursor] = deque()
        self._timers: list[tuple[float, int, Cursor]] = []  # (when, tie-break, cursor), a heap
        self._tick = 0
        self._closed = False
        self.calls = 0  # sends made (:meth:`_send` calls)
        self.batches = 0  # batches they carried (busy resends included)
        self._thread = threading.Thread(target=self._run, name=f"send-{name}", daemon=True)
        self._thread.start()

    def schedule(self, cursor: Cursor) -> None:
        """``cursor`` may have a batch to send now."""
        with self._cond:
            if not cursor.queued:
                cursor.queued = True
                self._ready.append(cursor)
                self._cond.notify()

    def schedule_at(self, cursor: Cursor, when: float) -> None:
        """Look at ``cursor`` again at ``when`` (monotonic time): its open batch is due then."""
        with self._cond:
            self._tick += 1
            heapq.heappush(self._timers, (when, self._tick, cursor))
            if self._timers[0][2] is cursor:
                self._cond.notify()

    def close(self, join: bool = True) -> None:
        """Stop the thread (a batch in flight is finished first; nothing is sent after it)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if join:
            self._thread.join(timeout=1.0)
        log.info("sender %s: %d sends carried %d batches", self.name, self.calls, self.batches)

    def _send(self, payloads: list[bytes]) -> list[Status]:
        """Deliver ``payloads`` (framed batches of different cursors); one status each."""
        raise NotImplementedError

    def _due(self) -> None:
        """Move the cursors whose time came to the ready queue (caller holds the condition)."""
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            cursor = heapq.heappop(self._timers)[2]
            if not cursor.queued:
                cursor.queued = True
                self._ready.append(cursor)

    def _take(self) -> list[Cursor] | None:
        """The ready cursors, waiting for one; None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                self._due()
                if self._ready:
                    break
                self._cond.wait(self._timers[0][0] - time.monotonic() if self._timers else None)
            if self._linger_s:
                self._cond.wait(self._linger_s)  # other channels' batches sealed at about this time
                self._due()
            now = time.monotonic()
            cursors, later = [], []
            for cursor in self._ready:
                cursor.queued = False
                (later if cursor.retry_at > now else cursors).append(cursor)
            self._ready.clear()
            for cursor in later:  # answered busy a moment ago: its own timer brings it back
                self._tick += 1
                heapq.heappush(self._timers, (cursor.retry_at, self._tick, cursor))
            return cursors

    def _run(self) -> None:
        try:
            self._run_until_closed()
        finally:
            self._stopped()

    def _stopped(self) -> None:
        """The thread's last act, once closed (a transport lets its connection go)."""

    def _run_until_closed(self) -> None:
        while (cursors := self._take()) is not None:
            work = []
            for cursor in cursors:
                try:
                    if (batch := cursor.channel.next_batch(cursor)) is not None:
                        work.append((cursor, batch))
                except Exception as exc:  # noqa: BLE001 - that channel's replica is cut off, the others go on
                    log.exception("%s: channel %d failed", self.name, cursor.channel.spec.id)
                    cursor.channel.batch_failed(cursor, exc)
            if work:
                self._send_work(work)

    def _send_work(self, work: list[tuple[Cursor, OutgoingBatch]]) -> None:
        backoff, most = self._busy_backoff_s
        statuses = self._send([batch.payload for _, batch in work])
        self.calls += 1
        self.batches += len(work)
        for (cursor, batch), (status, reason) in zip(work, statuses, strict=True):
            if status == PUSH_OK:
                cursor.backoff = 0.0
                cursor.channel.batch_sent(cursor, batch)
            elif status == PUSH_BUSY:
                cursor.backoff = backoff if not cursor.backoff else min(2 * cursor.backoff, most)
                cursor.retry_at = time.monotonic() + cursor.backoff
                self.schedule_at(cursor, cursor.retry_at)
            else:
                cursor.channel.batch_failed(cursor, reason if isinstance(reason, BaseException)
                                       else PushRefused(str(reason)))


class DataPeer(Protocol):
    """Where a :class:`PushLink` sends: ``call`` raises :class:`TransportFailure` when the call may
    be tried again, :class:`FrameCallFailed` when not."""

    address: str

    def call(self, payload: bytes, timeout: float) -> bytes: ...

    def close(self) -> None: ...


class WorkerDataPeer:
    """A peer worker's frame server (:mod:`transport.frames`), its port asked once of its control
    plane (``DataPort``)."""

    def __init__(self, control: Peer) -> None:
        self.control = control
        self.address = control.address
        self._frames: FramePeer | None = None

    def call(self, payload: bytes, timeout: float) -> bytes:
        if self._frames is None:
            try:
                port = self.control.call("DataPort", None, int, timeout=timeout)
            except grpc.RpcError as err:
                raise (TransportFailure if is_retryable(err) else FrameCallFailed)(
                    f"DataPort of {self.address}: {err}") from err
            host = self.address.rsplit(":", 1)[0]
            self._frames = FramePeer(host, port, PUSH_METHOD, self.control.security)
        return self._frames.call(payload, timeout)

    def close(self) -> None:
        if self._frames is not None:
            self._frames.close()


class PushLink(BatchSender):
    """Everything this worker pushes to one peer worker, in as few ``PushMany`` calls as possible.

    One call per batch cost a round trip per channel and replica every buffer timeout: with
    LiveRobin pulses every 10 ms on every channel that is thousands of calls a second, and on a
    small machine the job spent its CPU on them (measured: 10 ms pulses were slower than 50 ms).
    The call waits ``linger_s`` after the first ready batch for the others sealed at about the same
    time.  The receiver never blocks a call on a full input queue (one busy channel would hold up
    every other channel to that worker, and a merge waiting for one of those would deadlock): it
    answers *busy* for that batch.  Transport failures are retried until ``give_up()`` says the
    peer is gone; then every batch of the call fails (its replica is cut off).
    """

    def __init__(self, peer: DataPeer, give_up: Callable[[], bool], call_timeout_s: float = 10.0,
                 retry_s: float = 0.05, busy_backoff_s: tuple[float, float] = (0.001, 0.008),
                 linger_s: float = 0.001) -> None:
        self.peer = peer
        self._give_up = give_up
        self._call_timeout_s = call_timeout_s
        self._retry_s = retry_s
        super().__init__(f"push-{peer.address}", linger_s, busy_backoff_s)

    def _send(self, payloads: list[bytes]) -> list[Status]:
        request = encode_pushes(payloads)
        while True:
            try:
                reply = self.peer.call(request, timeout=self._call_timeout_s)
                break
            except TransportFailure as err:
                if self._give_up() or self._closed:
                    return [(PUSH_REFUSED, err)] * len(payloads)
                time.sleep(self._retry_s)
            except FrameCallFailed as err:
                return [(PUSH_REFUSED, err)] * len(payloads)
        statuses, reasons = decode_push_reply(reply, len(payloads))
        refused = iter(reasons)
        return [(s, next(refused, "refused") if s == PUSH_REFUSED else None) for s in statuses]

    def _stopped(self) -> None:
        self.peer.close()


class LocalSender(BatchSender):
    """Batches delivered by a direct call, ``deliver(header, payload)``, without blocking (True:
    taken, False: busy, ValueError: refused), as a remote ``PushMany`` would: to this worker's own
    instances, or through a plain :data:`Transport` callable (tests, simple transports)."""

    def __init__(self, name: str, deliver: Callable[[batch_format.BatchHeader, bytes], bool]) -> None:
        self._deliver = deliver
        super().__init__(name)

    @classmethod
    def through(cls, name: str, transport: Transport) -> LocalSender:
        """A sender that hands each batch to ``transport`` (it returns once the batch is taken and
        raises if it failed)."""
        def deliver(_header: batch_format.BatchHeader, payload: bytes) -> bool:
            transport(payload)
            return True

        return cls(name, deliver)

    def _send(self, payloads: list[bytes]) -> list[Status]:
        out: list[Status] = []
        for payload in payloads:
            try:
                out.append((PUSH_OK if self._deliver(batch_format.decode_header(payload), payload) else PUSH_BUSY, None))
            except ValueError as exc:
                out.append((PUSH_REFUSED, str(exc)))
            except Exception as exc:  # noqa: BLE001 - that replica is cut off, the others go on
                out.append((PUSH_REFUSED, exc))
        return out


@dataclass(frozen=True)
class OutgoingBatch:
    """What a cursor sends next: ``count`` elements from ``first_seq``, ``sealed`` batches of the
    channel framed as one ``payload``."""

    first_seq: int
    count: int
    sealed: int
    payload: bytes
