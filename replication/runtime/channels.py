"""Output channels: batching, seq stamping, bounded buffering, delivery to every replica.

The instance thread calls :meth:`OutputChannel.emit`.  A batch is sealed when it
is full or after the buffer timeout, stamped with the next seq and framed once.
Each replica of the destination partition (duplicate sending, DESIGN §4 rule 1;
one when replication is off) has its own position in the shared list of sealed
batches, so a slow or dead replica does not hold the other one back, and is sent
to by the sender of the worker it runs on (:mod:`replication.runtime.senders`): one
thread per destination worker sends the batches of every channel and replica
routed there (to another worker in one ``PushMany`` call for everything waiting,
to this worker's own instances directly).  No thread per
channel: a worker's threads do not grow with the number of channels.

A replica that is behind is sent every sealed batch waiting for it at once
(re-framed as one batch, up to ``batch_size`` elements): one send per sealed
batch would cap it at 1 / (call latency) batches a second, below the rate
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
import threading
import time
from collections.abc import Callable, Sequence

from replication.plan import ChannelSpec
from replication.runtime.channel_sending import ChannelSending
from replication.runtime.sealed_batches import SealedBatches
from replication.runtime.senders import BatchSender, Cursor, LocalSender, Transport
from transport import batch_format

log = logging.getLogger(__name__)


class ChannelClosed(Exception):
    """The channel was closed, or lost every destination replica, while a caller used it."""


class BackupTrimmed(Exception):
    """A rejoining replica needs seqs the channel no longer holds."""


class OutputChannel(ChannelSending):
    """One output channel of a replica: the emitting side (batches, seqs, back-pressure, backups,
    cut-offs); what its senders take is :class:`~replication.runtime.channel_sending.ChannelSending`,
    the sealed batches it holds :class:`~replication.runtime.sealed_batches.SealedBatches`."""

    def __init__(
        self,
        spec: ChannelSpec,
        transports: Transport | BatchSender | Sequence[Transport | BatchSender],
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
        single = callable(transports) or isinstance(transports, BatchSender)
        self._owned: list[BatchSender] = []  # senders made here for plain callables: closed with the channel
        self._senders = [self._sender_for(t, i) for i, t in enumerate([transports] if single else transports)]
        self._destinations: list[int | None] = list(destinations) if destinations is not None \
            else [None] * len(self._senders)  # the worker each sender reaches
        if not self._senders:
            raise ValueError("a channel needs at least one transport")
        self._batch_size = batch_size
        self._timeout = buffer_timeout_s
        self._max_ready = max_ready
        self._lag_limit = max(lag_limit, max_ready)
        self._next_seq = first_seq  # seq of the first element of the open batch
        self._current: list = []
        self._current_started = 0.0
        self._seal_when_free = False  # flush_if_free found every replica busy: seal when one is done
        self._batches = SealedBatches(spec.id, first_seq, retain, backup_limit)  # until sent (and checkpointed)
        n = len(self._senders)
        self._pos = [first_seq] * n  # per replica: the next seq it must send
        self._alive = [True] * n
        self._retired = [False] * n  # the replica finished (had END): it needs nothing more
        self._replaying = [False] * n  # rejoined, still more than lag_limit behind: not a laggard yet
        self._unsent = [0] * n  # per replica: sealed batches it has not sent yet
        self._gen = [0] * n  # per replica: bumped by rejoin, so a stale cursor stops
        self._closed = False
        self._cond = threading.Condition()
        self.batches_sent = [0] * n
        self.elements_sent = [0] * n
        self._cursors = [Cursor(self, i, 0, self._senders[i]) for i in range(n)]

    def _sender_for(self, transport: Transport | BatchSender, replica: int) -> BatchSender:
        if isinstance(transport, BatchSender):
            return transport
        sender = LocalSender.through(f"ch{self.spec.id}-r{replica}", transport)
        self._owned.append(sender)
        return sender

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
            # room is looked for when a batch starts: the backlog grows only when one is sealed
            while not self._current and not self._closed:
                if any(self._alive):
                    if self._backlog() < self._max_ready:
                        break
                elif not self._rolling_back() or len(self._batches) < self._batches.limit:
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
            elif started:  # due after the buffer timeout; later appends need no wake-up
                due = self._current_started + self._timeout
                for i, cursor in enumerate(self._cursors):
                    if self._alive[i]:
                        cursor.sender.schedule_at(cursor, due)

    def flush(self) -> None:
        """Seal the open batch now (it leaves as soon as a sender is free)."""
        with self._cond:
            if self._current:
                self._seal()

    def flush_if_free(self) -> None:
        """Seal the open batch now if some live replica has sent every sealed batch (nothing of
        this channel on its way to it), else as soon as one has (or when it fills or times out).
        As Nagle's algorithm for TCP: at a low rate a batch goes at once, under load batches
        fill while one is on its way."""
        if not self._current:  # (only the emitting thread fills it: nothing to seal, no lock taken)
            return
        with self._cond:
            if not self._current:
                return
            if any(a and not u for a, u in zip(self._alive, self._unsent, strict=True)):
                self._seal()
            else:
                self._seal_when_free = True

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
        for sender in self._owned:  # one stuck in a transport call is left to finish on its own
            sender.close(join=False)
        return delivered

    def abort(self) -> None:
        """Stop without delivering what is buffered."""
        with self._cond:
            self._closed = True
            self._batches.clear()
            self._current = []
            self._cond.notify_all()
        for sender in self._owned:
            sender.close(join=False)

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
            if self._batches.release(seq):
                self._trim()

    @property
    def backup_from(self) -> int | None:
        """The lowest seq a rejoining replica can be replayed from (None: no backup kept)."""
        with self._cond:
            return self._batches.first(self._next_seq) if self._batches.keeps_backup else None

    @property
    def backup_overflows(self) -> int:
        """How often the backup gave up its oldest batches to stay within ``backup_limit``."""
        return self._batches.overflows

    def rejoin(self, replica: int, transport: Transport | BatchSender, from_seq: int, worker: int | None = None) -> None:
        """Send to ``replica`` again (restored from a checkpoint at a new place, ``worker``), starting
        with the batch that holds ``from_seq``; raises BackupTrimmed if that is no longer held."""
        with self._cond:
            if self._closed:
                raise ChannelClosed(f"channel {self.spec.id} is closed")
            pos = self._batches.start_of(from_seq, self._next_seq)
            if pos is None:
                raise BackupTrimmed(f"channel {self.spec.id}: replica {replica} needs seq {from_seq}, the "
                                    f"backup starts at {self._batches.first(self._next_seq)}")
            self._gen[replica] += 1  # a batch still in flight to the old place must not move pos
            sender = self._senders[replica] = self._sender_for(transport, replica)
            cursor = self._cursors[replica] = Cursor(self, replica, self._gen[replica], sender)
            self._destinations[replica] = worker
            self._pos[replica] = pos
            self._alive[replica] = True
            self._retired[replica] = False
            self._unsent[replica] = self._batches.count_from(pos)
            self._replaying[replica] = True
            log.info("channel %d: replica %d of %d[%d] rejoins at seq %d (%d batches to replay)", self.spec.id,
                     replica, self.spec.dst_task, self.spec.dst_partition, pos, self._unsent[replica])
            sender.schedule(cursor)
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
        self._seal_when_free = False
        batch, self._current = self._current, []
        spec = self.spec
        payload = batch_format.encode_batch(spec.dst_task, spec.dst_partition, spec.id, self._next_seq, batch)
        self._batches.add(self._next_seq, payload, len(batch))
        self._next_seq += len(batch)
        for i, cursor in enumerate(self._cursors):
            self._unsent[i] += 1
            if self._alive[i]:
                cursor.sender.schedule(cursor)

    def _trim(self) -> None:
        live = [p for p, a in zip(self._pos, self._alive, strict=True) if a]
        self._batches.trim(min(live) if live else self._next_seq)

    def _rolling_back(self) -> bool:
        """Every destination replica is lost, none finished, and a backup is kept: the destination
        is rolled back from a checkpoint and rejoins, so what is emitted meanwhile is kept."""
        return self._batches.keeps_backup and not any(self._alive) and not any(self._retired)

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self.spec.id} is closed")
        if not any(self._alive) and not any(self._retired) and not self._batches.keeps_backup:
            raise ChannelClosed(f"channel {self.spec.id}: every replica of partition {self.spec.dst_partition} "
                                f"of task {self.spec.dst_task} is lost")
