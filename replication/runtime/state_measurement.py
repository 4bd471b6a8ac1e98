"""Measuring keyed state per vnode, as the worker's control-plane service: each request the
driver numbers (:class:`MeasureRequests`) wakes the hosted replicas of its task once; they
answer in their metrics (``vnode_bytes``)."""

from __future__ import annotations

from typing import Any

from replication.heartbeat_parts import STATE_MEASUREMENT, MeasureRequests


class StateMeasurer:
    """Hands the driver's requests to measure state to the hosted replicas."""

    name = STATE_MEASUREMENT

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # its hosted replicas

    def report(self) -> None:
        """(The answers go with the metrics.)"""

    def settle(self, part: None, delivered: bool) -> None:
        """(Nothing reported.)"""

    def apply(self, part: MeasureRequests) -> None:
        for task, request in part.requests.items():
            for inst in self.worker.hosted():
                if inst.task.id == task and request > inst.measure_request:
                    inst.measure_request = request
                    inst.wake()
