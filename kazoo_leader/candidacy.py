"""The rules each candidate of a KaZoo election follows, run on its client's loop thread.

A candidate (:class:`Candidate`, one replica of one partition) enters with an ephemeral sequential
node, leads while its node is the lowest (its epoch is the node's number), otherwise watches its
immediate predecessor; it is deposed when the connection is suspended or lost, when its node is
deleted by someone else, or when its client was expelled.  Why this keeps epochs unique and
increasing, and how the session and its thread work: :mod:`kazoo_leader.election`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import EventType, WatchedEvent

log = logging.getLogger(__name__)

PREFIX = "n_"
_NODE = re.compile(re.escape(PREFIX) + r"(\d+)$")


class _Interrupted(Exception):
    """A ZooKeeper call was abandoned because the connection dropped (or the client closes)."""


class _Expelled(Exception):
    """The client's membership node is gone (:func:`~kazoo_leader.eviction.expel`): it must not enter any election."""


# Errors after which the connection state listener is bound to report SUSPENDED/LOST and then
# CONNECTED again, which re-runs the election: a check that hits one of them just gives up.
_CONNECTION_ERRORS = (_Interrupted, ConnectionLoss, SessionExpiredError, ConnectionClosedError)


def sequence_number(name: str) -> int | None:
    m = _NODE.match(name)
    return int(m.group(1)) if m else None


class Candidate:
    """One replica of one partition in the election at :attr:`path` (see :meth:`ElectionClient.candidate`)."""

    def __init__(self, client: CandidateRules, path: str, on_change: Callable[[int | None], None]) -> None:
        self.path = path
        self._client = client
        self._on_change = on_change
        # Written on the client's loop thread only.
        self._node: str | None = None  # our current node (full path)
        self._uncertain = False  # a create may have landed without us learning the node's name
        self._withdrawn = False
        # Read by `epoch` from any thread.  Grant writes _epoch last, depose clears it first.
        self._epoch: int | None = None
        self._lead_node: str | None = None
        self._lead_gen = -1
        self._deleted: set[str] = set()  # own nodes a watch saw deleted (kazoo's thread adds)

    @property
    def epoch(self) -> int | None:
        """The current epoch while this candidate leads, else None.

        Turns None as soon as kazoo reports a connection problem or the deletion of the node,
        possibly before ``on_change(None)`` has been delivered.
        """
        epoch = self._epoch
        if (
            epoch is None
            or self._lead_gen != self._client._suspensions
            or self._lead_node in self._deleted
        ):
            return None
        return epoch

    def withdraw(self) -> None:
        """Leave the election: delete the node; ``on_change(None)`` first if this candidate led.

        From another thread, returns once that is done (and the callback delivered); from inside
        an ``on_change`` callback, it is done at once and the callback follows after it returns.
        """
        self._client._run_on_loop(lambda: self._client._withdraw(self, "withdrawn"))

    def _watch(self, event: WatchedEvent) -> None:
        # kazoo's callback thread: record, enqueue, never block.
        if event.type == EventType.DELETED and event.path == self._node:
            self._deleted.add(event.path)
        self._client._submit(lambda: self._client._check(self))

    def __repr__(self) -> str:
        return f"Candidate({self.path!r}, identity={self._client.identity!r}, epoch={self._epoch})"


class CandidateRules:
    """The election logic of :class:`~kazoo_leader.election.ElectionClient` (a mixin: the client's
    session, candidates and loop thread; every method runs on that thread)."""

    identity: str
    membership: str | None
    epoch_base: int
    _zk: KazooClient
    _data: bytes
    _lock: threading.Lock
    _candidates: dict[str, Candidate]
    _suspensions: int
    _expelled: bool
    _orphans: set[str]
    _notes: deque[Callable[[], None]]
    _op: Any  # (async result, generation): its value, or raises (loop thread)
    _usable: Any  # (): the current generation if connected and running, else None
    _submit: Any  # (work): run on the loop thread
    _run_on_loop: Any  # (work): run on the loop thread and wait for it

    def _reap(self) -> None:
        """Delete nodes of ours that must not take part any more (old leader nodes, withdrawn)."""
        gen = self._usable()
        if gen is None:
            return
        for node in sorted(self._orphans):
            try:
                self._op(self._zk.delete_async(node), gen)
            except NoNodeError:
                pass
            except _CONNECTION_ERRORS:
                return
            self._orphans.discard(node)

    def _depose(self, cand: Candidate, reason: str) -> None:
        """Stop leading (if leading): the node is never used again."""
        epoch = cand._epoch
        if epoch is None:
            return
        cand._epoch = None
        if cand._node is not None:
            self._orphans.add(cand._node)
            cand._node = None
        log.info("election %s: %s stops leading, epoch %d (%s)", cand.path, self.identity, epoch, reason)
        self._notes.append(lambda: cand._on_change(None))

    def _grant(self, cand: Candidate, gen: int, node: str, epoch: int) -> None:
        if cand._epoch is not None or gen != self._suspensions:
            return  # already leading, or suspended since: the next CONNECTED checks again
        cand._lead_node = node
        cand._lead_gen = gen
        cand._epoch = epoch
        log.info("election %s: %s leads, epoch %d", cand.path, self.identity, epoch)
        self._notes.append(lambda: cand._on_change(epoch))

    def _withdraw(self, cand: Candidate, reason: str) -> None:
        if cand._withdrawn:
            return
        cand._withdrawn = True
        with self._lock:
            if self._candidates.get(cand.path) is cand:
                del self._candidates[cand.path]
        self._depose(cand, reason)
        if cand._node is not None:
            self._orphans.add(cand._node)
            cand._node = None
        self._reap()

    def _create(self, cand: Candidate, gen: int) -> str:
        if cand._uncertain:
            self._drop_duplicates(cand, gen)
        try:
            if self.membership is None:
                node = self._op(
                    self._zk.create_async(
                        f"{cand.path}/{PREFIX}", self._data, ephemeral=True, sequence=True, makepath=True
                    ),
                    gen,
                )
            else:
                node = self._create_as_member(cand, gen)
        except _CONNECTION_ERRORS:
            cand._uncertain = True
            raise
        cand._uncertain = False
        return node

    def _create_as_member(self, cand: Candidate, gen: int) -> str:
        """Create the candidate node only while the membership node exists (one transaction)."""
        self._op(self._zk.ensure_path_async(cand.path), gen)
        tx = self._zk.transaction()
        tx.check(self.membership, -1)  # version -1: any version, but the node must exist
        tx.create(f"{cand.path}/{PREFIX}", self._data, ephemeral=True, sequence=True)
        check, created = self._op(tx.commit_async(), gen)
        if isinstance(check, NoNodeError):
            raise _Expelled()
        if isinstance(created, Exception):
            raise created
        return created

    def _drop_duplicates(self, cand: Candidate, gen: int) -> None:
        """After a create whose outcome we missed: delete the node it may have made.

        Such a node holds our identity and is owned by our session; we run one candidate per
        path, so any such node that is not the current one is a leftover.
        """
        client_id = self._zk.client_id
        if client_id is None:
            raise _Interrupted()
        try:
            children = self._op(self._zk.get_children_async(cand.path), gen)
        except NoNodeError:
            return
        for name in children:
            full = f"{cand.path}/{name}"
            if sequence_number(name) is None or full == cand._node:
                continue
            try:
                data, stat = self._op(self._zk.get_async(full), gen)
                if data == self._data and stat.ephemeralOwner == client_id[0]:
                    log.info("election %s: %s deletes a duplicate node %s", cand.path, self.identity, name)
                    self._op(self._zk.delete_async(full), gen)
            except NoNodeError:
                pass

    def _check(self, cand: Candidate) -> None:
        """(Re)evaluate one candidate: enter if needed, lead if lowest, else watch the predecessor."""
        if cand._withdrawn or self._expelled:
            return
        gen = self._usable()
        if gen is None:
            return
        try:
            self._reap()
            while True:
                if cand._node is None:
                    cand._node = self._create(cand, gen)
                node = cand._node
                name = node.rsplit("/", 1)[1]
                self._op(self._zk.sync_async(cand.path), gen)
                try:
                    children = self._op(self._zk.get_children_async(cand.path), gen)
                except NoNodeError:
                    children = []
                ranked = sorted((s, n) for n in children if (s := sequence_number(n)) is not None)
                names = [n for _, n in ranked]
                if name not in names:
                    # Deleted by someone else (evict): out, and back in with a new node.
                    self._depose(cand, "node deleted")
                    cand._node = None
                    continue
                index = names.index(name)
                # Watch our own node in every role, so an eviction is noticed at once.
                if self._op(self._zk.exists_async(node, watch=cand._watch), gen) is None:
                    continue
                if index == 0:
                    self._grant(cand, gen, node, self.epoch_base + ranked[0][0])
                    return
                if cand._epoch is not None:  # cannot happen: lower numbers never reappear
                    log.error("election %s: a node below the leader's appeared: %s", cand.path, names)
                    self._depose(cand, "a lower node appeared")
                    continue
                pred = f"{cand.path}/{names[index - 1]}"
                if self._op(self._zk.exists_async(pred, watch=cand._watch), gen) is not None:
                    return
                # The predecessor went away between get_children and exists: look again.
        except _CONNECTION_ERRORS:
            # The next CONNECTED re-runs this check (after a SUSPENDED/LOST deposed a leader).
            log.debug("election %s: check interrupted by a connection problem", cand.path)
        except _Expelled:
            if not self._expelled:
                self._expelled = True
                log.error("election: %s was expelled (%s is gone): it enters no election any more",
                          self.identity, self.membership)
            self._depose(cand, "expelled")
