"""KaZoo's election janitor in the driver: a dead worker's leaderships fail over at once."""

from __future__ import annotations

import logging

from kazoo_leader.election import zk_client
from kazoo_leader.eviction import delete_tree, evict, expel
from replication.control.master import JobMaster
from replication.runtime.feeds import election_identity, election_membership

log = logging.getLogger(__name__)


class ElectionJanitor:
    """The driver's ZooKeeper session for KaZoo: when a worker is declared dead it deletes that
    worker's election nodes, so the partitions it led fail over at once instead of after the
    ZooKeeper session timeout (safe even if the worker is only hung: it can no longer publish
    under a current epoch), after expelling it (deleting its membership node) so that it can never
    enter an election again; at the end it removes the run's election tree."""

    def __init__(self, connect: str, root: str, master: JobMaster, digest: str | None = None) -> None:
        self.root = root
        self._master = master
        self._client = zk_client(connect, digest, timeout=10)
        try:
            self._client.start(timeout=15)
        except Exception as exc:  # noqa: BLE001 - a clear message instead of kazoo's timeout
            self._client.close()
            raise RuntimeError(f"cannot reach ZooKeeper at {connect} (spark.replication.zookeeper.connect): "
                               f"{exc}") from None
        master.on_dead.append(self.evict)

    def evict(self, worker: int, attempt: int) -> None:
        try:
            # expelled first: a hung worker that wakes up (its session expired) cannot re-enter
            expel(self._client, election_membership(self.root, worker, attempt))
            removed = evict(self._client, self.root, election_identity(worker, attempt))
        except Exception as exc:  # noqa: BLE001 - the session timeout still fails it over
            log.warning("could not evict worker %d from its elections: %s", worker, exc)
            return
        if removed:
            self._master.note(f"worker {worker} removed from {len(removed)} leader election(s): "
                              "its leaderships fail over now")

    def close(self) -> None:
        try:
            delete_tree(self._client, self.root)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not remove %s from ZooKeeper: %s", self.root, exc)
        self._client.stop()
        self._client.close()
