"""What an output channel's senders take from it: the batches due for each destination replica.

The sender of the worker a replica runs on (:mod:`replication.runtime.senders`) asks the channel
for the next batch of that replica (:meth:`ChannelSending.next_batch`: every sealed batch it has
not sent, framed as one while they fit, or the open batch once its buffer timeout passed) and
says how the send went (:meth:`ChannelSending.batch_sent`, :meth:`ChannelSending.batch_failed`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from replication.plan import ChannelSpec
from replication.runtime.sealed_batches import SealedBatches
from replication.runtime.senders import Cursor, OutgoingBatch
from transport import batch_format


class ChannelSending:
    """The sending side of :class:`~replication.runtime.channels.OutputChannel` (a mixin: the
    channel's batches and per-replica positions, under its condition)."""

    spec: ChannelSpec
    _cond: threading.Condition
    _closed: bool
    _alive: list[bool]
    _retired: list[bool]
    _gen: list[int]
    _pos: list[int]
    _unsent: list[int]
    _batches: SealedBatches
    _current: list
    _current_started: float
    _timeout: float
    _batch_size: int
    _seal_when_free: bool
    batches_sent: list[int]
    elements_sent: list[int]
    _seal: Any  # (): seal the open batch (condition held)
    _trim: Any  # (): drop the batches every live replica sent (condition held)
    _cut_off: Any  # (replica, reason): cut a replica off (condition held)

    def next_batch(self, cursor: Cursor) -> OutgoingBatch | None:
        """What ``cursor``'s replica must be sent next: every sealed batch it has not sent yet,
        framed as one while they fit in a batch (a replica behind catches up in few sends), or the
        open batch once its buffer timeout passed; None if nothing is due (or the cursor is stale)."""
        i = cursor.replica
        with self._cond:
            if self._closed or not self._alive[i] or self._gen[i] != cursor.gen:
                return None
            first_seq = self._pos[i]
            if first_seq not in self._batches:
                if not self._current:
                    return None
                due = self._current_started + self._timeout
                if due > time.monotonic():
                    cursor.sender.schedule_at(cursor, due)
                    return None
                self._seal()
            payload, count = self._batches[first_seq]
            framed = [payload]
            nxt = first_seq + count
            while nxt in self._batches and count + self._batches[nxt][1] <= self._batch_size:
                framed.append(self._batches[nxt][0])
                count += self._batches[nxt][1]
                nxt = first_seq + count
        if len(framed) > 1:  # (the receiver's dedup takes any range)
            elements = []
            for one in framed:
                elements += batch_format.decode_elements(one, batch_format.decode_header(one))
            spec = self.spec
            payload = batch_format.encode_batch(spec.dst_task, spec.dst_partition, spec.id, first_seq, elements)
        return OutgoingBatch(first_seq, count, len(framed), payload)

    def batch_sent(self, cursor: Cursor, batch: OutgoingBatch) -> None:
        i = cursor.replica
        with self._cond:
            if self._gen[i] != cursor.gen:
                return
            self._pos[i] = batch.first_seq + batch.count
            self._unsent[i] -= batch.sealed
            self.batches_sent[i] += batch.sealed
            self.elements_sent[i] += batch.count
            self._trim()
            self._cond.notify_all()
            if self._closed or not self._alive[i]:
                return
            if self._seal_when_free and self._current and not self._unsent[i]:
                self._seal()
            if self._pos[i] in self._batches:
                cursor.sender.schedule(cursor)
            elif self._current:
                cursor.sender.schedule_at(cursor, self._current_started + self._timeout)

    def batch_failed(self, cursor: Cursor, err: BaseException) -> None:
        with self._cond:
            if not self._retired[cursor.replica] and self._gen[cursor.replica] == cursor.gen:
                self._cut_off(cursor.replica, f"send failed: {err}")
