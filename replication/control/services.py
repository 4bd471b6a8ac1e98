"""The driver's side of the control-plane services: one contract, and the heartbeat's round of them.

A service (writer roles, Rhino checkpoints, handovers, pulse windows, drains, cut-offs,
savepoints, state measurement) owns one concern of the job master's.  On every heartbeat the
master hands each service its part of the worker's report (:meth:`DriverService.on_report`),
then asks each for its word to the workers (:meth:`DriverService.reply`), in the order they were
registered; the parts are the typed records of :mod:`replication.heartbeat_parts`.  Both run
under the master's lock.  The worker's side is :mod:`replication.runtime.services`.
"""

from __future__ import annotations

from typing import Any, Protocol

from replication.heartbeat_parts import ServiceSet


class DriverService(Protocol):
    """One control-plane service as the job master runs it (its methods hold the master's lock)."""

    name: str  # its key in the heartbeat's and the reply's parts

    def on_report(self, worker: int, part: Any | None) -> None:
        """Worker ``worker``'s report for this service (None: it had nothing new), on every beat."""

    def reply(self) -> Any | None:
        """This service's word to every worker now (None: nothing to say)."""


class DriverServices(ServiceSet[DriverService]):
    """The services of a job master, in the order their reports are taken and their words given."""

    def take_reports(self, worker: int, parts: dict[str, Any]) -> None:
        """Hand each service its part of ``worker``'s heartbeat (None where it sent none)."""
        unknown = parts.keys() - set(self.names())
        if unknown:
            raise ValueError(f"worker {worker} reported for services this driver does not run: {sorted(unknown)}")
        for service in self._services:
            service.on_report(worker, parts.get(service.name))

    def replies(self) -> dict[str, Any]:
        """Every service's word to the workers, those with something to say."""
        return {s.name: part for s in self._services if (part := s.reply()) is not None}
