"""Output channels: batching, seq stamping, bounded buffering, delivery to every replica.

The instance thread calls :meth:`OutputChannel.emit`.  A batch is sealed when it
is full or after the buffer timeout, stamped with the next seq and framed once.
Each *transport* (one per replica of the destination partition: duplicate
sending, DESIGN §4 rule 1; one when replication is off) has its own sender
thread and its own position in the shared list of sealed batches, so a slow or
dead replica does not hold the other one back.  Transports to another worker go
through that worker's :class:`PushLink`, which sends the batches of every channel
waiting at that moment in one call.

A sender that is behind sends every sealed batch waiting for its replica in one
call (re-framed as one batch, up to ``batch_size`` elements): one call per sealed
batch would cap a transport at 1 / (call latency) batches a second, below the rate
at which small batches are sealed (a LiveRobin pulse every 10 ms seals one on every
channel), and its replica would fall further and further behind.

Back-pressure follows the fastest live replica: ``emit`` blocks while even the
fastest has ``max_ready`` batches waiting.  A replica whose transport fails, or
that falls ``lag_limit`` batches behind, is cut off (logged, and reported through
``on_cut_off`` so that the driver replaces it: never silently); it will see a gap
if it comes back, and gaps are never delivered.  When no replica is left the
channel fails.  A replica that rejoins (below) is not cut off for lagging while it is replayed
its backlog: that backlog is the backup, bounded by ``backup_limit``.

Upstream backup (Rhino, DESIGN §6): with ``retain=True`` the channel keeps every
sealed batch from :meth:`release`'s position on (the destination's last completed
checkpoint), at most ``backup_limit`` batches, so that a replica of the destination
restored from that checkpoint can :meth:`rejoin` and be replayed what it lost.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import grpc

from replication import framing
from replication.plan import ChannelSpec
from transport import wire
from transport.rpc import Peer, is_retryable

log = logging.getLogger(__name__)

Transport = Callable[[bytes], object]


class ChannelClosed(Exception):
    """The channel was closed, or lost every destination replica, while a caller used it."""


class BackupTrimmed(Exception):
    """A rejoining replica needs seqs the channel no longer holds."""


class PushRefused(Exception):
    """The destination worker refused a batch (it hosts no replica of its partition, or the
    channel is not an input there): the replica is cut off, as for a failed transport."""


# PushMany wire format: a request is a sequence of (4-byte big-endian length, framed batch); the
# reply has one status byte per batch (then, if any was refused, the list of the reasons, transport.wire).
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


def receive_pushes(request: bytes, deliver: Callable[[framing.BatchHeader, bytes], bool]) -> bytes:
    """The receiving side of a ``PushMany`` call: ``deliver`` each batch without blocking (True:
    taken, False: its queue is full, ValueError: refused, with the reason); the reply."""
    statuses, reasons = [], []
    for payload in decode_pushes(request):
        try:
            statuses.append(PUSH_OK if deliver(framing.decode_header(payload), payload) else PUSH_BUSY)
        except ValueError as exc:
            statuses.append(PUSH_REFUSED)
            reasons.append(str(exc))
    return encode_push_reply(statuses, reasons)


class _Push:
    __slots__ = ("payload", "status", "reason", "done")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.status: int | None = None
        self.reason: BaseException | str | None = None
        self.done = threading.Event()


class PushLink:
    """Everything this worker pushes to one peer worker, in as few calls as possible.

    The per-channel sender threads hand their batches to the link (:meth:`send`, their
    transport) and wait; one thread sends whatever is waiting in a single ``PushMany`` call.
    One call per batch cost a gRPC round trip per channel and replica every buffer timeout: with
    LiveRobin pulses every 10 ms on every channel that is thousands of calls a second, and on a
    small machine the job spent its CPU on them (measured: 10 ms pulses were slower than 50 ms).

    The receiver never blocks a call on a full input queue (one busy channel would hold up
    every other channel to that worker, and a merge waiting for one of those would deadlock):
    it answers *busy* for that batch, and its sender backs off and sends it again (channel FIFO
    is kept: a sender sends its next batch only after this one is taken).  Transport failures
    are retried until ``give_up()`` says the peer is gone (then every waiting send fails).
    """

    def __init__(self, peer: Peer, give_up: Callable[[], bool], call_timeout_s: float = 10.0,
                 retry_s: float = 0.05, busy_backoff_s: tuple[float, float] = (0.001, 0.008),
                 linger_s: float = 0.001) -> None:
        self.peer = peer
        self._give_up = give_up
        self._call_timeout_s = call_timeout_s
        self._retry_s = retry_s
        self._busy_backoff_s = busy_backoff_s
        self._linger_s = linger_s
        self._pending: list[_Push] = []
        self._cond = threading.Condition()
        self._closed = False
        self.calls = 0  # PushMany calls made
        self.batches = 0  # batches they carried (busy resends included)
        self._thread = threading.Thread(target=self._run, name=f"push-{peer.address}", daemon=True)
        self._thread.start()

    def send(self, payload: bytes) -> None:
        """Deliver one framed batch (a :data:`Transport`): returns once the peer took it."""
        backoff, most = self._busy_backoff_s
        while True:
            push = _Push(payload)
            with self._cond:
                if self._closed:
                    raise ChannelClosed(f"push link to {self.peer.address} is closed")
                self._pending.append(push)
                self._cond.notify()
            push.done.wait()
            if push.status == PUSH_OK:
                return
            if push.status == PUSH_BUSY:
                time.sleep(backoff)
                backoff = min(2 * backoff, most)
                continue
            if isinstance(push.reason, BaseException):
                raise push.reason
            raise PushRefused(str(push.reason))

    def close(self) -> None:
        """Fail what is waiting and stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=1.0)
        log.info("push link to %s: %d calls carried %d batches", self.peer.address, self.calls, self.batches)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._linger_s and not self._closed:
                    self._cond.wait(self._linger_s)  # the other channels' batches sealed at about this time
                pushes, self._pending = self._pending, []
                closed = self._closed
            if closed:
                self._finish(pushes, PUSH_REFUSED, ChannelClosed(f"push link to {self.peer.address} is closed"))
                return
            self._call(pushes)

    def _call(self, pushes: list[_Push]) -> None:
        request = encode_pushes([p.payload for p in pushes])
        while True:
            try:
                reply = self.peer.call_bytes("PushMany", request, timeout=self._call_timeout_s)
                break
            except grpc.RpcError as err:
                if not is_retryable(err) or self._give_up() or self._closed:
                    self._finish(pushes, PUSH_REFUSED, err)
                    return
                time.sleep(self._retry_s)
        self.calls += 1
        self.batches += len(pushes)
        statuses, reasons = decode_push_reply(reply, len(pushes))
        refused = iter(reasons)
        for push, status in zip(pushes, statuses, strict=True):
            push.status = status
            if status == PUSH_REFUSED:
                push.reason = next(refused, "refused")
            push.done.set()

    @staticmethod
    def _finish(pushes: list[_Push], status: int, reason: BaseException) -> None:
        for push in pushes:
            push.status, push.reason = status, reason
            push.done.set()


class OutputChannel:
    def __init__(
        self,
        spec: ChannelSpec,
        transports: Transport | Sequence[Transport],
        *,
        batch_size: int,
        buffer_timeout_s: float,
        max_ready: int = 2,
        lag_limit: int = 1024,
        first_seq: int = 0,
        retain: bool = False,
        backup_limit: int = 4096,
        on_cut_off: Callable[[ChannelSpec, int, int | None, str], None] | None = None,
        destinations: Sequence[int] | None = None,
    ) -> None:
        self.spec = spec
        # (spec, replica, its worker, reason) of a cut-off this channel decided itself
        self._on_cut_off = on_cut_off
        self._transports = [transports] if callable(transports) else list(transports)
        self._destinations: list[int | None] = list(destinations) if destinations is not None \
            else [None] * len(self._transports)  # the worker each transport reaches
        if not self._transports:
            raise ValueError("a channel needs at least one transport")
        self._batch_size = batch_size
        self._timeout = buffer_timeout_s
        self._max_ready = max_ready
        self._lag_limit = max(lag_limit, max_ready)
        self._next_seq = first_seq  # seq of the first element of the open batch
        self._current: list = []
        self._current_started = 0.0
        self._sealed: deque[int] = deque()  # first seqs of sealed batches not yet sent by every live replica
        self._batches: dict[int, tuple[bytes, int]] = {}  # first seq -> (framed payload, count)
        n = len(self._transports)
        self._pos = [first_seq] * n  # per replica: the next seq it must send
        self._alive = [True] * n
        self._retired = [False] * n  # the replica finished (had END): it needs nothing more
        self._replaying = [False] * n  # rejoined, still more than lag_limit behind: not a laggard yet
        self._unsent = [0] * n  # per replica: sealed batches it has not sent yet
        self._gen = [0] * n  # per replica: bumped by rejoin, so a stale sender thread stops
        # upstream backup: sealed batches from this seq on are kept for a restored replica (None: off)
        self._retain_from: int | None = first_seq if retain else None
        self._backup_limit = backup_limit
        self.backup_overflows = 0
        self._closed = False
        self._cond = threading.Condition()
        self.batches_sent = [0] * n
        self.elements_sent = [0] * n
        self._threads = [self._sender(i) for i in range(n)]

    def _sender(self, i: int) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(i, self._gen[i]), name=f"send-ch{self.spec.id}-r{i}",
                                  daemon=True)
        thread.start()
        return thread

    # -- emitting side ----------------------------------------------------------------------
    @property
    def next_seq(self) -> int:
        """The seq the next emitted element will get."""
        with self._cond:
            return self._next_seq + len(self._current)

    def destination(self, replica: int) -> int | None:
        """The worker ``replica`` is sent to (None: not known)."""
        with self._cond:
            return self._destinations[replica]

    @property
    def live_replicas(self) -> list[int]:
        with self._cond:
            return [i for i, a in enumerate(self._alive) if a]

    def emit(self, element: tuple) -> None:
        """Append an element; blocks while the fastest live replica has ``max_ready`` batches waiting."""
        with self._cond:
            while not self._closed:
                if any(self._alive):
                    if self._backlog() < self._max_ready:
                        break
                elif not self._rolling_back() or len(self._sealed) < self._backup_limit:
                    break  # (rolling back: the backup keeps it for the restored replica, up to its limit)
                self._cond.wait()
            self._raise_if_unusable()
            if not any(self._alive) and not self._rolling_back():
                return  # every destination replica finished: what is left are duplicates
            started = not self._current
            if started:
                self._current_started = time.monotonic()
            self._current.append(element)
            if len(self._current) >= self._batch_size:
                self._seal()
                self._cond.notify_all()
            elif started:  # a sender waiting for work starts the buffer timeout; later appends need no wake-up
                self._cond.notify_all()

    def flush(self) -> None:
        """Seal the open batch now (it leaves as soon as a sender is free)."""
        with self._cond:
            if self._current:
                self._seal()
                self._cond.notify_all()

    def close(self, timeout: float | None = None) -> bool:
        """Flush, wait until every live replica got everything (or until ``timeout`` passed without
        any replica receiving more: a slow downstream is waited for), stop the senders.  True if at
        least one replica received everything (or finished, see :meth:`retire`).  While every
        destination replica is lost but a backup is kept (it is being restored), wait for one to
        rejoin and get everything."""
        self.flush()
        with self._cond:
            def done() -> bool:
                return (any(self._alive) or not self._rolling_back()) and (
                    all(p == self._next_seq for p, a in zip(self._pos, self._alive, strict=True) if a)
                    or not any(self._alive))

            seen = list(self._pos)
            deadline = None if timeout is None else time.monotonic() + timeout
            while not done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
                if self._pos != seen:  # a replica received more: the wait starts again
                    seen = list(self._pos)
                    deadline = None if timeout is None else time.monotonic() + timeout
            delivered = any(self._retired) or any(p == self._next_seq for p in self._pos)
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:  # a sender stuck in a transport call is left to finish on its own
            t.join(timeout=0.05)
        return delivered

    def abort(self) -> None:
        """Stop without delivering what is buffered."""
        with self._cond:
            self._closed = True
            self._sealed.clear()
            self._batches.clear()
            self._current = []
            self._cond.notify_all()

    def cut_off(self, replica: int, reason: str, worker: int | None = None) -> None:
        """Stop sending to ``replica``, as the driver says (its worker was declared dead): not
        reported.  With ``worker``: only while the replica is still sent to there (it may have
        been restored elsewhere since)."""
        with self._cond:
            if self._sent_to(replica, worker):
                self._cut_off(replica, reason, report=False)

    def retire(self, replica: int, worker: int | None = None) -> None:
        """Stop sending to ``replica`` because it finished: it received END on this channel (from
        either upstream replica), so it has everything; this counts as delivered.  With ``worker``:
        only while the replica is still sent to there."""
        with self._cond:
            if self._alive[replica] and self._sent_to(replica, worker):
                self._retired[replica] = True
                self._alive[replica] = False
                self._trim()
                self._cond.notify_all()

    def release(self, seq: int) -> None:
        """The destination checkpointed everything below ``seq``: the backup may drop it."""
        with self._cond:
            if self._retain_from is not None and seq > self._retain_from:
                self._retain_from = seq
                self._trim()

    @property
    def backup_from(self) -> int | None:
        """The lowest seq a rejoining replica can be replayed from (None: no backup kept)."""
        with self._cond:
            if self._retain_from is None:
                return None
            return self._sealed[0] if self._sealed else self._next_seq

    def rejoin(self, replica: int, transport: Transport, from_seq: int, worker: int | None = None) -> None:
        """Send to ``replica`` again (restored from a checkpoint at a new place, ``worker``), starting
        with the batch that holds ``from_seq``; raises BackupTrimmed if that is no longer held."""
        with self._cond:
            if self._closed:
                raise ChannelClosed(f"channel {self.spec.id} is closed")
            if from_seq >= self._next_seq:
                pos = self._next_seq
            else:
                held = [s for s in self._sealed if s <= from_seq]
                if not held:
                    raise BackupTrimmed(f"channel {self.spec.id}: replica {replica} needs seq {from_seq}, the "
                                        f"backup starts at {self._sealed[0] if self._sealed else self._next_seq}")
                pos = held[-1]
            self._gen[replica] += 1  # a sender still stuck in a call to the old place must not move pos
            self._transports[replica] = transport
            self._destinations[replica] = worker
            self._pos[replica] = pos
            self._alive[replica] = True
            self._retired[replica] = False
            self._unsent[replica] = sum(1 for s in self._sealed if s >= pos)
            self._replaying[replica] = True
            log.info("channel %d: replica %d of %d[%d] rejoins at seq %d (%d batches to replay)", self.spec.id,
                     replica, self.spec.dst_task, self.spec.dst_partition, pos, self._unsent[replica])
            self._threads.append(self._sender(replica))
            self._cond.notify_all()

    # -- internals (caller holds the condition) ----------------------------------------------
    def _sent_to(self, replica: int, worker: int | None) -> bool:
        known = self._destinations[replica]
        return worker is None or known is None or known == worker

    def _cut_off(self, replica: int, reason: str, report: bool = True) -> None:
        if self._alive[replica]:
            self._alive[replica] = False
            log.warning("channel %d: replica %d of %d[%d] cut off: %s", self.spec.id, replica, self.spec.dst_task,
                        self.spec.dst_partition, reason)
            self._trim()
            self._cond.notify_all()
            if report and self._on_cut_off is not None:
                self._on_cut_off(self.spec, replica, self._destinations[replica], reason)

    def _backlog(self) -> int:
        """Sealed batches the fastest live replica has not sent yet (cuts off laggards)."""
        live = [i for i, a in enumerate(self._alive) if a]
        if not live:
            return 0
        fastest = min(self._unsent[i] for i in live)
        for i in live:
            if self._unsent[i] - fastest <= self._lag_limit:
                self._replaying[i] = False
            elif not self._replaying[i]:
                self._cut_off(i, f"{self._unsent[i] - fastest} batches behind the other replica")
        return fastest

    def _seal(self) -> None:
        batch, self._current = self._current, []
        spec = self.spec
        payload = framing.encode_batch(spec.dst_task, spec.dst_partition, spec.id, self._next_seq, batch)
        self._batches[self._next_seq] = (payload, len(batch))
        self._sealed.append(self._next_seq)
        self._next_seq += len(batch)
        for i in range(len(self._unsent)):
            self._unsent[i] += 1

    def _trim(self) -> None:
        live = [p for p, a in zip(self._pos, self._alive, strict=True) if a]
        low = min(live) if live else self._next_seq
        if self._retain_from is not None:
            sent = low
            low = min(low, self._retain_from)
            if len(self._sealed) > self._backup_limit:  # keep memory bounded: give up the oldest backup
                over = self._sealed[len(self._sealed) - self._backup_limit]
                if over > low:
                    self.backup_overflows += 1
                    if self.backup_overflows == 1:
                        log.warning("channel %d: upstream backup beyond %d batches: dropping its oldest "
                                    "(the destination's checkpoints do not complete)", self.spec.id,
                                    self._backup_limit)
                    low = self._retain_from = min(over, sent)
        while self._sealed and self._sealed[0] + self._batches[self._sealed[0]][1] <= low:
            del self._batches[self._sealed.popleft()]

    def _rolling_back(self) -> bool:
        """Every destination replica is lost, none finished, and a backup is kept: the destination
        is rolled back from a checkpoint and rejoins, so what is emitted meanwhile is kept."""
        return self._retain_from is not None and not any(self._alive) and not any(self._retired)

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self.spec.id} is closed")
        if not any(self._alive) and not any(self._retired) and self._retain_from is None:
            raise ChannelClosed(f"channel {self.spec.id}: every replica of partition {self.spec.dst_partition} "
                                f"of task {self.spec.dst_task} is lost")

    def _run(self, i: int, gen: int) -> None:
        transport = self._transports[i]
        while True:
            with self._cond:
                while True:
                    if self._closed or not self._alive[i] or self._gen[i] != gen:
                        return
                    if self._pos[i] in self._batches:
                        break
                    if self._current:
                        remaining = self._current_started + self._timeout - time.monotonic()
                        if remaining <= 0:
                            self._seal()
                            self._cond.notify_all()
                            continue
                        self._cond.wait(remaining)
                    else:
                        self._cond.wait()
                first_seq = self._pos[i]
                payload, count = self._batches[first_seq]
                more: list[bytes] = []  # the next sealed batches, sent with this one while it fits
                nxt = first_seq + count
                while nxt in self._batches and count + self._batches[nxt][1] <= self._batch_size:
                    more.append(self._batches[nxt][0])
                    count += self._batches[nxt][1]
                    nxt = first_seq + count
            if more:  # behind: one call for everything waiting (the receiver's dedup takes any range)
                elements = []
                for framed in (payload, *more):
                    elements += framing.decode_elements(framed, framing.decode_header(framed))
                spec = self.spec
                payload = framing.encode_batch(spec.dst_task, spec.dst_partition, spec.id, first_seq, elements)
            try:
                transport(payload)
            except BaseException as err:  # noqa: BLE001 - the replica is cut off, the others go on
                with self._cond:
                    if not self._retired[i] and self._gen[i] == gen:
                        self._cut_off(i, f"send failed: {err}")
                return
            with self._cond:
                if self._gen[i] != gen:
                    return
                self._pos[i] = first_seq + count
                self._unsent[i] -= 1 + len(more)
                self.batches_sent[i] += 1 + len(more)
                self.elements_sent[i] += count
                self._trim()
                self._cond.notify_all()
