"""The origin side of chain replication (DESIGN §6): :class:`ChainShipper`, one thread per worker
driving a :class:`~rhino_state.chain.ChainOrigin` per instance. It sends increments to chain heads
one at a time (round-robin over instances, in order within an instance), bounded by each origin's
flow-control window; receives acks and nacks on its ``IncrementAck`` handler (the tail acks
straight to the origin); fails an increment whose ack does not arrive within ``ack_timeout``;
retries failures with exponential backoff; and calls ``on_completed(meta, chain)`` in checkpoint
order and ``on_released(payload)`` (default: delete the file) for payloads it no longer needs.
The member side and the transfer of one increment are :mod:`rhino_state.transfer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from rhino_state.chain import (
    DEFAULT_MAX_BYTES_IN_FLIGHT,
    ChainOrigin,
    Outcome,
    Send,
)
from rhino_state.increments import IncrementMeta
from rhino_state.transfer import (
    ACK_METHOD,
    CHUNK_SIZE,
    ChainAck,
    TransferRejected,
    encode_reply,
    send_increment,
)
from transport import rpc, wire
from transport.ids import PartitionId
from transport.security import RpcSecurity

__all__ = ["ChainShipper"]

log = logging.getLogger(__name__)


def _delete_payload(ref: Any) -> None:
    Path(ref).unlink(missing_ok=True)


class ChainShipper:
    """The origin side on one worker: ships its instances' increments along their replica chains.

    Call :meth:`set_group` for an instance before offering its increments; :meth:`offer`
    hands the payload file over to the shipper, which releases it (``on_released``, default:
    delete it) once completed, dropped or refused.  ``on_completed(meta, chain)`` runs on the
    shipper thread, in checkpoint order per instance; ``chain`` is the group whose tail acked it
    (its members hold it), whatever the group became since.  Increments still pending at :meth:`close` are
    not released.
    """

    def __init__(
        self,
        *,
        security: RpcSecurity,
        on_completed: Callable[[IncrementMeta, tuple[str, ...]], None] | None = None,
        on_released: Callable[[Any], None] | None = None,
        chunk_size: int = CHUNK_SIZE,
        call_timeout: float = 30.0,
        ack_timeout: float = 60.0,
        retry_backoff: tuple[float, float] = (0.05, 2.0),
        max_in_flight: int = 2,
        max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT,
        max_pending: int = 16,
    ) -> None:
        self.security = security
        self.on_completed = on_completed
        self.on_released = on_released or _delete_payload
        self.chunk_size = chunk_size
        self.call_timeout = call_timeout
        self.ack_timeout = ack_timeout
        self.retry_backoff = retry_backoff
        self._window = {"max_in_flight": max_in_flight, "max_bytes_in_flight": max_bytes_in_flight,
                        "max_pending": max_pending}
        self.address: str | None = None
        self._cond = threading.Condition()
        self._origins: dict[PartitionId, ChainOrigin] = {}
        self._sent_at: dict[tuple[PartitionId, int], float] = {}
        self._retry_at: dict[PartitionId, float] = {}
        self._backoff: dict[PartitionId, float] = {}
        self._failures: dict[PartitionId, int] = {}
        self._outputs: deque[tuple[str, Any]] = deque()
        self._peers: dict[str, rpc.Peer] = {}
        self._turn = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    def handlers(self) -> dict[str, rpc.BytesHandler]:
        """The handlers to merge into the worker's ``rpc.serve`` dict."""
        return {ACK_METHOD: self._on_ack}

    def start(self, address: str) -> None:
        """Start shipping; ``address`` is this worker's address, to which tails send acks."""
        self.address = address
        self._thread = threading.Thread(target=self._run, name="chain-shipper", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for peer in self._peers.values():
            peer.close()

    # -- the owner's interface -------------------------------------------------------------
    def set_group(self, instance: PartitionId, group: Sequence[str], *, completed_id: int | None = None) -> None:
        """Set (or first register) ``instance``'s replica group, in chain order.

        ``completed_id`` only matters on registration: the checkpoint the group already holds.
        """
        with self._cond:
            origin = self._origins.get(instance)
            if origin is None:
                self._origins[instance] = ChainOrigin(instance, group, completed_id=completed_id, **self._window)
            else:
                outcome = origin.set_group(group)
                if outcome.accepted:
                    log.info("replica group of %s is now %s: %s", instance, list(group), outcome.reason)
                self._emit(outcome)
            self._retry_at.pop(instance, None)
            self._cond.notify_all()

    def remove_instance(self, instance: PartitionId) -> None:
        """Stop replicating ``instance``; its pending payloads are released."""
        with self._cond:
            origin = self._origins.pop(instance, None)
            if origin is not None:
                self._emit(origin.abandon())

    def offer(self, meta: IncrementMeta, payload: Path) -> bool:
        """Queue an increment for shipping; False if refused (a delta while a full snapshot is needed).

        The shipper owns ``payload`` from now on.  Raises KeyError before :meth:`set_group`.
        """
        with self._cond:
            origin = self._origins.get(meta.instance)
            if origin is None:
                raise KeyError(f"no replica group set for {meta.instance}")
            outcome = origin.offer(meta, payload)
            if outcome.reason:
                log.info("checkpoint %d of %s: %s", meta.checkpoint_id, meta.instance, outcome.reason)
            self._emit(outcome)
            return outcome.accepted

    def needs_full(self, instance: PartitionId) -> bool:
        """True when the next increment offered for ``instance`` must be a full snapshot."""
        with self._cond:
            return self._origins[instance].needs_full

    def completed_id(self, instance: PartitionId) -> int | None:
        with self._cond:
            return self._origins[instance].completed_id

    def wait_completed(self, instance: PartitionId, checkpoint_id: int, timeout: float) -> bool:
        """Wait until ``checkpoint_id`` of ``instance`` (or a later one) completed."""
        def done() -> bool:
            origin = self._origins.get(instance)
            completed = origin.completed_id if origin is not None else None
            return self._stopped or (completed is not None and completed >= checkpoint_id)

        with self._cond:
            return self._cond.wait_for(done, timeout) and not self._stopped

    def status(self) -> dict[PartitionId, dict[str, Any]]:
        """Per instance: group, completed id, in flight, queued, needs_full, failures, last failure."""
        with self._cond:
            return {inst: {"group": o.group, "completed_id": o.completed_id, "in_flight": o.in_flight,
                           "queued": o.queued, "needs_full": o.needs_full, "can_complete": o.can_complete,
                           "failures": self._failures.get(inst, 0), "last_failure": o.last_failure}
                    for inst, o in self._origins.items()}

    # -- the shipper thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                self._expire_acks(now)
                send = self._next_send(now)
                outputs = list(self._outputs)
                self._outputs.clear()
                if send is None and not outputs:
                    self._cond.wait(self._idle_time(now))
                    continue
            self._deliver(outputs)
            if send is not None:
                self._ship(send)

    def _next_send(self, now: float) -> Send | None:
        instances = list(self._origins)
        for i in range(len(instances)):
            instance = instances[(self._turn + i) % len(instances)]
            if self._retry_at.get(instance, 0.0) > now:
                continue
            origin = self._origins[instance]
            sendable = origin.sendable()
            if sendable:
                self._turn = (self._turn + i + 1) % len(instances)
                origin.on_sent(sendable[0].checkpoint_id)
                return sendable[0]
        return None

    def _idle_time(self, now: float) -> float:
        wakeups = [t + self.ack_timeout for t in self._sent_at.values()]
        wakeups += [t for t in self._retry_at.values() if t > now]
        return max(0.0, min([now + 1.0, *wakeups]) - now)

    def _expire_acks(self, now: float) -> None:
        for (instance, cid), sent in list(self._sent_at.items()):
            origin = self._origins.get(instance)
            if origin is None or cid not in origin.in_flight_ids:
                del self._sent_at[(instance, cid)]
            elif now - sent > self.ack_timeout:
                del self._sent_at[(instance, cid)]
                self._fail(instance, cid, f"no ack within {self.ack_timeout:g}s")

    def _ship(self, send: Send) -> None:
        key = (send.instance, send.checkpoint_id)
        failure, missing_base = "", False
        try:
            send_increment(self._peer(send.to), send.meta, Path(send.payload_ref), (self.address, *send.group), 1,
                           chunk_size=self.chunk_size, timeout=self.call_timeout)
        except TransferRejected as e:
            failure, missing_base = f"rejected by {send.to}: {e.reason}", e.missing_base
        except grpc.RpcError as e:
            failure = f"send to {send.to} failed: {e.code()}"
        except Exception as e:
            log.exception("shipping checkpoint %d of %s failed", send.checkpoint_id, send.instance)
            failure = f"send to {send.to} failed: {type(e).__name__}: {e}"
        with self._cond:
            origin = self._origins.get(send.instance)
            if failure:
                self._fail(send.instance, send.checkpoint_id, failure, missing_base=missing_base)
            elif origin is not None and send.checkpoint_id in origin.in_flight_ids:
                self._sent_at[key] = time.monotonic()

    def _fail(self, instance: PartitionId, checkpoint_id: int, reason: str, *, missing_base: bool = False) -> None:
        """Called with the lock held."""
        origin = self._origins.get(instance)
        if origin is None:
            return
        outcome = origin.on_failure(checkpoint_id, reason, missing_base=missing_base)
        if not outcome.accepted:
            return
        self._failures[instance] = self._failures.get(instance, 0) + 1
        low, high = self.retry_backoff
        first = instance not in self._backoff  # the backoff grows until an ack resets it
        backoff = self._backoff[instance] = min(high, self._backoff.get(instance, low / 2) * 2)
        self._retry_at[instance] = time.monotonic() + backoff
        log.log(logging.WARNING if first else logging.DEBUG, "checkpoint %d of %s: %s (retrying in %.2fs)",
                checkpoint_id, instance, reason, backoff)
        self._emit(outcome)

    def _emit(self, outcome: Outcome, chain: tuple[str, ...] = ()) -> None:
        """Queue an outcome's callbacks for the shipper thread (called with the lock held);
        ``chain``: the group that completed ``outcome.completed``."""
        self._outputs.extend(("completed", (m, chain)) for m in outcome.completed)
        self._outputs.extend(("released", r) for r in outcome.released)
        self._cond.notify_all()

    def _deliver(self, outputs: list[tuple[str, Any]]) -> None:
        for kind, item in outputs:
            try:
                if kind == "completed":
                    if self.on_completed is not None:
                        self.on_completed(*item)
                else:
                    self.on_released(item)
            except Exception:
                log.exception("%s callback failed for %r", kind, item)

    def _peer(self, address: str) -> rpc.Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = rpc.Peer(address, self.security)
        return peer

    def _on_ack(self, request: bytes) -> bytes:
        msg = wire.decode(request, ChainAck)
        instance, cid, sender = tuple(msg.instance), msg.checkpoint_id, msg.sender
        with self._cond:
            origin = self._origins.get(instance)
            if origin is None:
                return encode_reply(False, f"unknown instance {instance}")
            if msg.nack is not None:
                if sender in origin.group:
                    self._fail(instance, cid, f"{sender}: {msg.nack}", missing_base=msg.missing_base)
                return encode_reply(True)
            outcome = origin.on_ack(cid, sender)
            if outcome.accepted:
                self._backoff.pop(instance, None)
                self._emit(outcome, origin.group)
        return encode_reply(True)
