"""The driver's side of KaZoo's elections (:mod:`kazoo_leader.election`): a dead worker's candidate
nodes deleted so its leaderships fail over at once (:func:`evict`), its membership removed so it
never enters an election again (:func:`expel`), and a run's election tree removed at its end."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import (
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError

from kazoo_leader.candidacy import sequence_number
from kazoo_leader.election import ElectionClient, zk_client

log = logging.getLogger(__name__)


def _kazoo(client: KazooClient | ElectionClient) -> KazooClient:
    return client.kazoo if isinstance(client, ElectionClient) else client


def evict(connect_or_client: KazooClient | ElectionClient | str, root: str, identity: str,
          digest: str | None = None) -> list[str]:
    """Delete every candidate node under ``root`` (any depth) whose data is ``identity``.

    The driver calls this when it declares a worker dead, so the worker's leaderships fail over
    at once instead of after its session timeout.  A live worker notices, stops leading and
    re-enters with a higher epoch.  Accepts a started client (preferred) or a connect string
    (and then the ``digest`` identity the election nodes' ACLs name, if any).
    Returns the deleted node paths.
    """
    if isinstance(connect_or_client, str):
        zk = zk_client(connect_or_client, digest)
        try:
            zk.start(timeout=15)
        except KazooTimeoutError:
            zk.stop()
            zk.close()
            raise RuntimeError(f"ZooKeeper at {connect_or_client!r} unreachable") from None
        try:
            return evict(zk, root, identity)
        finally:
            zk.stop()
            zk.close()
    zk = _kazoo(connect_or_client)
    deleted: list[str] = []
    zk.retry(_evict_level_by_level, zk, root.rstrip("/") or "/", identity.encode(), deleted)
    if deleted:
        log.info("evicted %s from %d election(s) under %s: %s", identity, len(deleted), root, deleted)
    return deleted


def _evict_level_by_level(zk: KazooClient, root: str, data: bytes, deleted: list[str]) -> None:
    """:func:`evict`'s walk: each level of the tree in three rounds of requests sent at once
    (list, read, delete), not one round trip per node, so a dead leader's partitions fail over
    after a few round trips however many elections the run has.  Appends to ``deleted``; safe
    to repeat after a lost connection (a node deleted before is gone)."""
    level = [root]
    while level:
        listings = [(path, zk.get_children_async(path)) for path in level]
        nodes = []
        for path, listing in listings:
            try:
                nodes += [(f"{path.rstrip('/')}/{name}", name) for name in sorted(listing.get())]
            except NoNodeError:
                continue
        reads = [(full, name, zk.get_async(full)) for full, name in nodes]
        level, deletes = [], []
        for full, name, read in reads:
            try:
                value, stat = read.get()
            except NoNodeError:
                continue
            if sequence_number(name) is not None and stat.ephemeralOwner != 0 and stat.numChildren == 0:
                if value == data:
                    deletes.append((full, zk.delete_async(full, version=stat.version)))
            elif stat.numChildren > 0:
                level.append(full)
        for full, delete in deletes:
            try:
                delete.get()
                deleted.append(full)
            except NoNodeError:
                pass


def expel(client: KazooClient | ElectionClient, membership: str) -> bool:
    """Delete a client's membership node: it can never enter an election again (see the module
    docstring).  Call it before :func:`evict`, so a re-entry racing with the eviction fails.
    Returns False if the node was gone already."""
    zk = _kazoo(client)
    try:
        zk.retry(zk.delete, membership)
    except NoNodeError:
        return False
    log.info("expelled the holder of %s from every election", membership)
    return True


def delete_tree(client: KazooClient | ElectionClient, root: str) -> None:
    """Remove a job run's election subtree at job end (no error if it is already gone)."""
    zk = _kazoo(client)
    for attempt in range(5):
        try:
            zk.retry(zk.delete, root, recursive=True)
            return
        except NoNodeError:
            return
        except NotEmptyError:  # a candidate entered meanwhile; it should be withdrawn by now
            if attempt == 4:
                raise
