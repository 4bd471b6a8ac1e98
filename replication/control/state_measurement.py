"""Measuring keyed state per vnode, as the driver's service: the requests to the replicas.

A request (:meth:`StateMeasurement.request`) numbers the next measurement of a keyed task; every
replica of it measures its state per vnode and answers in its metrics (``vnode_bytes``, tagged
with the request's number), which is how the caller sees it done.  Caller holds the job master's
lock.
"""

from __future__ import annotations

from replication.heartbeat_parts import STATE_MEASUREMENT, MeasureRequests


class StateMeasurement:
    """The latest request to measure each keyed task's state: task -> its number."""

    name = STATE_MEASUREMENT

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}

    def request(self, task: int) -> int:
        """Ask every replica of ``task`` to measure its state again; the request's number."""
        self.requests[task] = self.requests.get(task, 0) + 1
        return self.requests[task]

    def on_report(self, worker: int, part: None) -> None:
        """(The answers come with the replicas' metrics.)"""

    def reply(self) -> MeasureRequests | None:
        return MeasureRequests(dict(self.requests)) if self.requests else None
