"""Where a worker's output channels send: what it knows of where every replica runs.

A worker learns the placement of every replica at start, and from the driver which workers died
or finished and which lost replicas were restored where.  From that it builds its replicas'
output channels (each to every replica of its destination partition, through one sender per
destination worker), cuts off or retires the replicas of a dead or finished worker, and sends to
a restored replica where it runs now, replaying from its checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replication.plan import PhysicalPlan
from replication.runtime.channels import BackupTrimmed, OutputChannel
from replication.runtime.senders import BatchSender, LocalSender, PushLink, WorkerDataPeer
from transport import rpc
from transport.ids import ReplicaId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownMove:
    """A replica restored on ``worker`` by the driver's ``restore``-th restore; its upstreams
    replay to it from ``positions`` (channel id -> seq)."""

    worker: int
    positions: dict[int, int]
    restore: int


class Routes:
    """Worker ``index``'s view of the replicas' placement, and the senders to each worker.

    ``peer`` makes the control-plane client of an address, ``deliver_local`` takes a batch for a
    replica hosted here, ``cut_off`` tells the driver of a replica a channel cut off by itself,
    and ``stopping`` is set when the worker stops."""

    def __init__(self, index: int, cfg: Any, plan: PhysicalPlan, placement: dict[ReplicaId, int],
                 peer: Callable[[str], rpc.Peer], deliver_local: Callable[..., bool],
                 cut_off: Callable[[ReplicaId, int, str], None], stopping: threading.Event) -> None:
        self.index, self.cfg, self.plan = index, cfg, plan
        self._peer, self._deliver_local, self._cut_off, self._stopping = peer, deliver_local, cut_off, stopping
        self._lock = threading.Lock()
        self._placement = dict(placement)  # with the restored replicas' new workers
        self._addresses: dict[int, str] = {}
        self.dead_workers: set[int] = set()
        self.finished_workers: set[int] = set()
        self._links: dict[tuple[int, str], BatchSender] = {}  # (worker, address) -> what sends to it
        self._transports_to: dict[int, list[tuple[OutputChannel, int]]] = {}  # worker -> (channel, replica)
        # where each restored replica runs now, what its upstreams replay to it from, and which
        # restore of the driver's count put it there
        self._moves_known: dict[ReplicaId, KnownMove] = {}

    # -- what this worker knows -------------------------------------------------------------
    def placement(self) -> dict[ReplicaId, int]:
        """Where each replica runs now, as this worker knows it (a copy)."""
        with self._lock:
            return dict(self._placement)

    def addresses(self) -> dict[int, str]:
        """Every worker's control-plane address, as this worker knows it (a copy)."""
        return dict(self._addresses)

    def address_of(self, w: int) -> str | None:
        return self._addresses.get(w)

    def learn(self, addresses: dict[int, str]) -> None:
        """Workers' control-plane addresses (at start, and with each restore here)."""
        self._addresses.update(addresses)

    # -- building the channels --------------------------------------------------------------
    def sender(self, w: int) -> BatchSender:
        """The sender of every batch to worker ``w`` (this one included): one thread per destination."""
        address = "" if w == self.index else self._addresses[w]
        with self._lock:
            link = self._links.get((w, address))
            if link is None:
                if w == self.index:
                    link = LocalSender(f"local-w{w}", self._deliver_local)
                else:
                    link = PushLink(WorkerDataPeer(self._peer(address)), lambda w=w: w in self.dead_workers
                                    or w in self.finished_workers or self._stopping.is_set())
                self._links[(w, address)] = link
        return link

    def outputs(self, inst: Any, placement: dict[ReplicaId, int], first_seqs: dict[int, int],
                lost: frozenset[ReplicaId] = frozenset()) -> list[tuple[Any, list[OutputChannel]]]:
        """The output channels of ``inst``, each to every replica of its destination partition but
        the ``lost`` ones (running nowhere: sent to once this worker learns where they run again;
        their placement names the worker they ran on, which may be relaunched under that index)."""
        plan, cfg = self.plan, self.cfg
        outputs = []
        for edge in inst.task.outputs:
            chans = []
            for spec in plan.output_channels(inst.task.id, inst.partition, edge.edge_id):
                targets = [placement[(spec.dst_task, spec.dst_partition, r)] for r in range(plan.replicas)]
                ch = OutputChannel(spec, [self.sender(w) for w in targets], batch_size=cfg.channel_batch_size,
                                   buffer_timeout_s=cfg.channel_buffer_timeout_ms / 1000,
                                   max_ready=2 if plan.replicas == 1 else 8, first_seq=first_seqs.get(spec.id, 0),
                                   retain=cfg.rhino_enabled, backup_limit=cfg.rhino_backup_limit,
                                   on_cut_off=self._cut_off_reported, destinations=targets)
                for r in range(plan.replicas):
                    if (spec.dst_task, spec.dst_partition, r) in lost:
                        ch.cut_off(r, "lost, not restored yet")
                with self._lock:
                    for r, w in enumerate(targets):
                        self._transports_to.setdefault(w, []).append((ch, r))
                    chans.append(ch)
            outputs.append((edge, chans))
        return outputs

    def _cut_off_reported(self, spec: Any, replica: int, worker: int | None, reason: str) -> None:
        """A channel cut a destination replica off by itself (it failed, or lagged too far): the
        driver hears of it with the next heartbeat and replaces it (never silently dropped)."""
        if worker is None or worker in self.dead_workers:
            return  # the driver knows already
        self._cut_off((spec.dst_task, spec.dst_partition, replica), worker, f"channel {spec.id}: {reason}")

    # -- the driver's word --------------------------------------------------------------------
    def workers_dead(self, workers: set[int]) -> None:
        """Cut off every replica on workers the driver declared dead (one restored elsewhere since
        is spared: its channel sends there now)."""
        for w in workers - self.dead_workers:
            self.dead_workers.add(w)
            for ch, r in self._transports_to.get(w, ()):
                ch.cut_off(r, f"worker {w} declared dead by the driver", worker=w)

    def workers_finished(self, workers: set[int]) -> None:
        """Retire the replicas on workers that finished (delivered: nothing more goes there)."""
        for w in workers - self.finished_workers:
            for ch, r in self._transports_to.get(w, ()):
                ch.retire(r, worker=w)
            self.finished_workers.add(w)  # (after: a push that gives up on it finds its replicas retired)

    def restored_here(self, replica: ReplicaId, placement: dict[ReplicaId, int]) -> None:
        """``replica`` runs here now, restored with the driver's ``placement`` of the others."""
        with self._lock:
            self._placement.update(placement)
            self._placement[replica] = self.index

    def apply_moves(self, moves: dict, hosted: list[Any]) -> None:
        """Replicas restored on other workers: send to them there, replaying from their checkpoint."""
        for (task_id, part, replica), (w, address, positions, restore) in moves.items():
            known = self._moves_known.get((task_id, part, replica))
            if known is not None and known.restore == restore:
                continue  # (keyed by the restore, not the worker: it may be relaunched and host it again)
            self._addresses[w] = address
            with self._lock:
                self._placement[(task_id, part, replica)] = w
                self._moves_known[(task_id, part, replica)] = KnownMove(w, dict(positions), restore)
            self.dead_workers.discard(w)  # relaunched: a replica lives there now
            for inst in hosted:
                for ch in inst.outputs:
                    if (ch.spec.dst_task, ch.spec.dst_partition) == (task_id, part):
                        self._rejoin(ch, replica, w, positions)

    def send_to_moved(self, inst: Any, restores_seen: int) -> None:
        """A replica restored here: its channels were built from the placement of when its restore
        started (after the driver's first ``restores_seen`` restores), so a destination restored
        since (a move this worker applied before the instance existed) is sent to where it runs
        now, replaying from its checkpoint, even on the worker it ran on before."""
        with self._lock:
            known = dict(self._moves_known)
        for ch in inst.outputs:
            spec = ch.spec
            for replica in range(self.plan.replicas):
                move = known.get((spec.dst_task, spec.dst_partition, replica))
                if move is not None and move.restore > restores_seen:
                    self._rejoin(ch, replica, move.worker, move.positions)

    def _rejoin(self, ch: OutputChannel, replica: int, w: int, positions: dict[int, int]) -> None:
        """Send to the restored ``replica`` on ``w``, replaying from where it restarted, or (this
        upstream is itself restored: its backup starts at its own checkpoint) from the oldest batch
        it still holds: the other replica of this upstream partition replays the rest."""
        spec, transport = ch.spec, self.sender(w)
        try:
            try:
                ch.rejoin(replica, transport, positions.get(spec.id, 0), w)
            except BackupTrimmed as exc:
                held = ch.backup_from
                if held is None:
                    raise
                log.warning("channel %d replays to the restored replica %s from seq %d (%s); the other replica "
                            "of this upstream partition replays what comes before", spec.id,
                            (spec.dst_task, spec.dst_partition, replica), held, exc)
                ch.rejoin(replica, transport, held, w)
        except Exception as exc:  # noqa: BLE001 - e.g. the channel closed: nothing more to send anyway
            log.warning("channel %d cannot send to the restored replica %s (%s)", spec.id,
                        (spec.dst_task, spec.dst_partition, replica), exc)
            return
        with self._lock:
            self._transports_to.setdefault(w, []).append((ch, replica))

    def close(self) -> None:
        for link in self._links.values():
            link.close()
