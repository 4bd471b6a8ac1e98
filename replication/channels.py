"""Output channels: batching, seq stamping, bounded buffering and delivery.

The instance thread calls :meth:`OutputChannel.emit`; a sender thread per channel
seals a batch when it is full or after the buffer timeout, stamps it with the
next seq, frames it and hands it to the transport (a gRPC peer, or the local
worker for instances in the same process).  At most ``max_ready`` sealed batches
wait for the sender; beyond that ``emit`` blocks: back-pressure reaches the
producing operator instead of memory growing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import grpc

from replication import framing
from replication.plan import ChannelSpec
from replication.rpc import Peer, is_retryable

log = logging.getLogger(__name__)

Transport = Callable[[bytes], None]


class ChannelClosed(Exception):
    """The channel was closed while a caller was blocked on it."""


def remote_transport(peer: Peer, stop: threading.Event, retry_s: float = 0.05) -> Transport:
    """Push over gRPC, retrying transport failures until ``stop`` is set."""

    def send(payload: bytes) -> None:
        while True:
            try:
                peer.call_bytes("Push", payload, timeout=30)
                return
            except grpc.RpcError as err:
                if not is_retryable(err) or stop.is_set():
                    raise
                time.sleep(retry_s)

    return send


class OutputChannel:
    def __init__(
        self,
        spec: ChannelSpec,
        transport: Transport,
        *,
        batch_size: int,
        buffer_timeout_s: float,
        max_ready: int = 2,
        first_seq: int = 0,
    ) -> None:
        self.spec = spec
        self._transport = transport
        self._batch_size = batch_size
        self._timeout = buffer_timeout_s
        self._max_ready = max_ready
        self._next_seq = first_seq
        self._current: list = []
        self._current_started = 0.0
        self._ready: deque[tuple[int, list]] = deque()
        self._sending = False
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.batches_sent = 0
        self.elements_sent = 0
        self._thread = threading.Thread(target=self._run, name=f"send-ch{spec.id}", daemon=True)
        self._thread.start()

    @property
    def next_seq(self) -> int:
        """The seq the next emitted element will get."""
        with self._cond:
            return self._next_seq + len(self._current)

    def emit(self, element: tuple) -> None:
        """Append an element; blocks while ``max_ready`` sealed batches wait."""
        with self._cond:
            while len(self._ready) >= self._max_ready and not self._closed:
                self._cond.wait()
            self._raise_if_failed()
            if not self._current:
                self._current_started = time.monotonic()
            self._current.append(element)
            if len(self._current) >= self._batch_size:
                self._seal()
            self._cond.notify_all()

    def flush(self) -> None:
        """Seal the open batch now (it is sent as soon as the sender is free)."""
        with self._cond:
            if self._current:
                self._seal()
                self._cond.notify_all()

    def close(self, timeout: float | None = None) -> bool:
        """Flush, wait until everything is sent (or ``timeout``), stop the sender.
        Returns True if everything was delivered."""
        self.flush()
        with self._cond:
            done = self._cond.wait_for(lambda: (not self._ready and not self._sending) or self._error, timeout)
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
        return bool(done) and self._error is None

    def abort(self) -> None:
        """Stop without delivering what is buffered."""
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._current = []
            self._cond.notify_all()

    def _seal(self) -> None:
        batch, self._current = self._current, []
        self._ready.append((self._next_seq, batch))
        self._next_seq += len(batch)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise ChannelClosed(f"channel {self.spec.id} failed: {self._error}") from self._error
        if self._closed:
            raise ChannelClosed(f"channel {self.spec.id} is closed")

    def _run(self) -> None:
        spec = self.spec
        while True:
            with self._cond:
                while not self._closed:
                    if self._ready:
                        break
                    if self._current:
                        remaining = self._current_started + self._timeout - time.monotonic()
                        if remaining <= 0:
                            self._seal()
                            break
                        self._cond.wait(remaining)
                    else:
                        self._cond.wait()
                if self._closed and not self._ready:
                    return
                if not self._ready:
                    continue
                first_seq, batch = self._ready[0]
                self._sending = True
            try:
                payload = framing.encode_batch(spec.dst_task, spec.dst_partition, spec.id, first_seq, batch)
                self._transport(payload)
            except BaseException as err:  # noqa: BLE001 - surfaced to the emitting thread
                log.error("channel %s: send failed: %s", spec.id, err)
                with self._cond:
                    self._error = err
                    self._sending = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready.popleft()
                self._sending = False
                self.batches_sent += 1
                self.elements_sent += len(batch)
                self._cond.notify_all()
