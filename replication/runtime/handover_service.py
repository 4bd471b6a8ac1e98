"""Handovers as the worker's control-plane service: the driver's orders in, the replicas' acks out.

Every heartbeat reply carries the handovers not completed (:class:`HandoverOrders`); each hosted
replica takes the orders it has a part in (:meth:`PartitionInstance.apply_handover`), and with
Rhino the origins forget the cuts the driver no longer retains for restored targets.  What the
replicas did is acked (:class:`ReplicaAck`) with the next heartbeat; an ack whose heartbeat
failed goes with the one after.
"""

from __future__ import annotations

from typing import Any

from replication.handover_orders import order_from_wire
from replication.heartbeat_parts import HANDOVERS, HandoverAcks, HandoverOrders, ReplicaAck


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
                    inst.handovers.forget_kept(retained)
