"""A drain that ends in a savepoint, as the driver's service: the directory, and who knows it.

The driver tells every worker where the savepoint goes (:class:`SavepointDirectory`); each
confirms it with its heartbeats, and the drain starts once every live worker has (a replica that
ended before it knew would flush its windows and write nothing).  Caller holds the job master's
lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replication.heartbeat_parts import SAVEPOINT, SavepointDirectory

if TYPE_CHECKING:
    from replication.control.master import JobMaster


class SavepointArming:
    """The savepoint's directory (None: no savepoint asked for) and the workers that know it."""

    name = SAVEPOINT

    def __init__(self, master: JobMaster) -> None:
        self.master = master
        self.directory: str | None = None
        self.armed: set[int] = set()

    def on_report(self, worker: int, part: SavepointDirectory | None) -> None:
        if self.directory is not None and part is not None and part.directory == self.directory \
                and worker not in self.armed:
            self.armed.add(worker)
            self.master.wake()

    def reply(self) -> SavepointDirectory | None:
        return None if self.directory is None else SavepointDirectory(self.directory)
