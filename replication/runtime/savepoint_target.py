"""A drain that ends in a savepoint, as the worker's control-plane service: where its replicas
write their parts.

The driver names the directory (:class:`SavepointDirectory`); the worker hands it to every
hosted replica (and to any restored here later) and confirms it with its heartbeats, and the
driver drains once every live worker has (a standby's confirmation counts too).
"""

from __future__ import annotations

from typing import Any

from replication.heartbeat_parts import SAVEPOINT, SavepointDirectory


class SavepointTarget:
    """The savepoint's directory, once the driver named it."""

    name = SAVEPOINT

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # its hosted replicas
        self.directory: str | None = None

    def report(self) -> SavepointDirectory | None:
        return None if self.directory is None else SavepointDirectory(self.directory)

    def settle(self, part: SavepointDirectory, delivered: bool) -> None:
        """(Reported with every beat.)"""

    def apply(self, part: SavepointDirectory) -> None:
        if self.directory is None:
            self.directory = part.directory
            for inst in self.worker.hosted():
                inst.savepoint_dir = self.directory
