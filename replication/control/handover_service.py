"""Handovers as the driver's service: the participants' acks in, the orders out.

The coordinator (:class:`~replication.control.handover_coordinator.HandoverCoordinator`, made by
the first handover request) decides; this feeds it each heartbeat's acks (:class:`HandoverAcks`),
logs what they moved on (commits, cancellations, completions) and rings the workers, whose next
reply starts the next phase, and gives every worker the orders not completed
(:class:`HandoverOrders`).  Caller holds the job master's lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replication.heartbeat_parts import HANDOVERS, HandoverAcks, HandoverOrders

if TYPE_CHECKING:
    from replication.control.master import JobMaster


class HandoverService:
    """The job master's handovers, as its heartbeats carry them."""

    name = HANDOVERS

    def __init__(self, master: JobMaster) -> None:
        self.master = master

    def on_report(self, worker: int, part: HandoverAcks | None) -> None:
        m = self.master
        coordinator = m.handovers
        if coordinator is None:
            return
        news = coordinator.on_acks(part.acks if part is not None else ())
        for text in news:
            m.event(text)
        if news:  # committed, cancelled or completed: the next phase starts at each worker's reply
            m.ring_workers()
        coordinator.forget_cancelled(m.losses.replica_passed)
        m.wake()

    def reply(self) -> HandoverOrders | None:
        coordinator = self.master.handovers
        if coordinator is None:
            return None
        return HandoverOrders(coordinator.view(), coordinator.retained() if coordinator.retain else None)
