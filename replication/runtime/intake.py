"""The receiving side of a processing replica's input channels: each batch checked by seq, then
put into the replica's bounded input queues without ever waiting.

Batches come on the threads that receive them (a peer's ``PushMany``, this worker's
:class:`~replication.runtime.senders.LocalSender`).  Duplicates are dropped and gaps reported
(:mod:`.dedup`); a full queue refuses a batch, and its sender sends it again after a backoff.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from merge import InputQueues, QueuesClosed
from replication.runtime.dedup import Dedup
from transport.batch_format import BatchHeader, decode_elements

log = logging.getLogger(__name__)


class InputIntake:
    """Admits the batches of one processing replica's input channels into its queues (any thread)."""

    def __init__(self, name: str, channels: list[int], queues: InputQueues, metrics: Any) -> None:
        self.name = name  # the replica's, for errors and logs
        self.queues = queues
        self.metrics = metrics  # the replica's: its dedup counts
        self.dedup = Dedup()
        self._dedup_lock = threading.Lock()
        self._channel_locks = {c: threading.Lock() for c in channels}
        self.elements_in = 0  # delivered into the queues (KaZoo: whether input waits for orders)
        self.order_reader: Any = None  # KaZoo: the order-log reader that follows the replica's log

    def resume(self, positions: dict[int, int]) -> None:
        """A restored replica: each channel's upstreams replay from its position."""
        for channel, position in positions.items():
            self.dedup.resume(channel, position)

    def deliver(self, header: BatchHeader, payload: bytes) -> bool:
        """Dedup, then enqueue without ever waiting.  A full queue refuses the batch (False, not
        counted: its sender sends it again after a backoff), so a call carrying batches of several
        channels never waits behind one of them."""
        lock = self._channel_locks.get(header.channel)
        if lock is None:
            raise ValueError(f"{self.name}: channel {header.channel} is not an input of this instance")
        delivered = 0
        with lock:  # one deliverer per channel: the check below stays true until the commit
            with self._dedup_lock:
                adm = self.dedup.check(header.channel, header.first_seq, header.count)
            if adm.gap:
                log.error("%s: gap of %d seqs on channel %d before seq %d (not delivered)",
                          self.name, adm.gap, header.channel, header.first_seq)
            elif adm.delivers:
                elements = decode_elements(payload, header)
                try:
                    batch = elements[adm.start:adm.stop]
                    if not self.queues.put(header.channel, batch, block=False):
                        return False
                    delivered = len(batch)
                except QueuesClosed:
                    pass  # the instance is stopping: it consumes nothing more
            with self._dedup_lock:
                self.dedup.commit(header.channel, header.first_seq, adm)
                self.metrics.dedup_dropped = self.dedup.dropped
                self.metrics.gaps = self.dedup.gaps
                self.elements_in += delivered
            if delivered and self.order_reader is not None:
                self.order_reader.input_arrived()
            return True
