"""The worker's side of the control-plane services: one contract, and the heartbeat's round of them.

A service (writer roles, Rhino checkpoints, handovers, pulse windows, drains, cut-offs,
savepoints, state measurement) owns one concern of the worker's talk with the driver.  The
heartbeat thread asks each for its report (:meth:`WorkerService.report`) and, once the beat was
answered or failed, tells each whether the driver got it (:meth:`WorkerService.settle`); the main
loop hands each its part of the driver's reply (:meth:`WorkerService.apply`).  Parts are the typed
records of :mod:`replication.heartbeat_parts`.  The driver's side is
:mod:`replication.control.services`.
"""

from __future__ import annotations

from typing import Any, Protocol

from replication.heartbeat_parts import ServiceSet


class WorkerService(Protocol):
    """One control-plane service as a worker runs it."""

    name: str  # its key in the heartbeat's and the reply's parts

    def report(self) -> Any | None:
        """What this service tells the driver with the next heartbeat (None: nothing new)."""

    def settle(self, part: Any, delivered: bool) -> None:
        """The heartbeat that carried ``part`` (this service's last report) was answered
        (``delivered``) or failed: what failed goes with the next one."""

    def apply(self, part: Any) -> None:
        """The driver's word for this service, from a heartbeat reply (only when it has one)."""


class WorkerServices(ServiceSet[WorkerService]):
    """The services of a worker, in the order their reports are taken and their words applied."""

    def reports(self) -> dict[str, Any]:
        """Every service's report, those with news."""
        return {s.name: part for s in self._services if (part := s.report()) is not None}

    def settle(self, parts: dict[str, Any], delivered: bool) -> None:
        """Tell each service that reported whether its report reached the driver."""
        for service in self._services:
            if service.name in parts:
                service.settle(parts[service.name], delivered)

    def apply(self, parts: dict[str, Any]) -> None:
        """Hand each service its part of a reply; parts of services this worker does not run are
        left alone (a standby without Rhino runs only some)."""
        for service in self._services:
            if service.name in parts:
                service.apply(parts[service.name])
