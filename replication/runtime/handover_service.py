"""Handovers as the worker's control-plane service, and each hosted replica's side of them: the
driver's orders in, the replicas' acks out.

Every heartbeat reply carries the handovers not completed (:class:`HandoverOrders`); each hosted
replica takes the orders it has a part in (:meth:`ReplicaHandoverPart.apply_handover`), and with
Rhino the origins forget the cuts the driver no longer retains for restored targets.  What the
replicas did is acked (:class:`ReplicaAck`) with the next heartbeat; an ack whose heartbeat
failed goes with the one after.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from replication.handover_orders import CodeOrder, HandoverOrder, order_from_wire
from replication.heartbeat_parts import HANDOVERS, HandoverAcks, HandoverOrders, ReplicaAck
from replication.runtime.handovers import CodeSwitches, PartitionHandovers, RouterSwitches, arm_acks


class HandoverParticipation:
    """The hosted replicas' part in the handovers: orders applied, acks collected."""

    name = HANDOVERS

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # its hosted replicas
        self._unsent: list[ReplicaAck] = []  # (only the heartbeat thread touches it)

    def report(self) -> HandoverAcks | None:
        for inst in self.worker.hosted():
            self._unsent += inst.take_handover_acks()
        return HandoverAcks(list(self._unsent)) if self._unsent else None

    def settle(self, part: HandoverAcks, delivered: bool) -> None:
        if delivered:
            del self._unsent[:len(part.acks)]

    def apply(self, part: HandoverOrders) -> None:
        for wired in part.orders:
            order = order_from_wire(wired)
            for inst in self.worker.hosted():
                inst.apply_handover(order)
        if part.retained is not None:  # Rhino: the cuts origins keep for restored targets
            retained = set(part.retained)
            for inst in self.worker.hosted():
                if inst.handovers is not None:
                    inst.handovers.kept_cuts.forget(retained)


class ReplicaHandoverPart:
    """A hosted replica's side of the handovers: the orders it has a part in armed, committed or
    cancelled (:mod:`replication.runtime.handovers` decides), its acks queued for the worker's next
    heartbeat (a mixin of :class:`~replication.runtime.instance.PartitionInstance`)."""

    task: Any
    partition: int
    replica: int
    attempt: int
    metrics: Any
    worker: Any
    handovers: PartitionHandovers | None
    router_switches: RouterSwitches
    code_switches: CodeSwitches
    _handover_acks: list[ReplicaAck]
    _acked: set[tuple[int, str]]
    _ack_lock: threading.Lock

    def apply_handover(self, order: HandoverOrder | CodeOrder, restored: bool = False) -> None:
        """Worker thread: install, commit or cancel ``order`` in the roles this replica has in it
        (``restored``: armed by :meth:`rearm`, where a part found done is in the checkpoint)."""
        outcomes: dict[str, str] = {}
        if isinstance(order, CodeOrder):
            if order.task == self.task.id and not self.task.is_source:
                outcomes["operator"] = self.code_switches.arm(order)
        else:
            if (self.task.id, self.partition) in order.upstreams:
                outcomes["upstream"] = self.router_switches.arm(order)
            if self.handovers is not None and order.task == self.task.id and \
                    self.partition in order.origins | order.targets:
                outcome = self.handovers.arm(order)
                outcomes.update({role: outcome for role, members in (("origin", order.origins),
                                                                     ("target", order.targets))
                                 if self.partition in members})
        for kind in arm_acks(order, outcomes, restored):
            self.handover_ack(order.handover_id, order.epoch, kind)

    def rearm(self, orders: list[HandoverOrder | CodeOrder], pulse: int) -> None:
        """A replica restored from the checkpoint at pulse ``pulse``: arm the committed orders
        the driver still retains; those the checkpoint already includes are skipped ("done")."""
        self.code_switches.position = pulse
        if self.handovers is not None:
            self.handovers.position = pulse
        for order in orders:
            self.apply_handover(order, restored=True)

    def handover_ack(self, handover_id: int, epoch: int, kind: str, digest: str = "", entries: int = 0,
                     times: dict[str, float] | None = None) -> None:
        """Queue an acknowledgement for the driver (the worker sends its next heartbeat now), once.
        It carries the wall-clock time of the action (``at``) and ``times``: what else the driver
        cannot see (a target's cut arrival, release and load; an origin's bytes cut)."""
        with self._ack_lock:
            if (handover_id, kind) in self._acked:
                return
            self._acked.add((handover_id, kind))
            self._handover_acks.append(ReplicaAck(
                handover_id, epoch, (self.task.id, self.partition, self.replica), kind, digest, entries,
                self.attempt, self.metrics.checkpoint_id, {"at": time.time(), **(times or {})}))
        self.worker.link.ring()  # the next step of the handover waits for this ack

    def take_handover_acks(self) -> list[ReplicaAck]:
        with self._ack_lock:
            acks, self._handover_acks = self._handover_acks, []
        return acks
