"""ZooKeeper leader election per replicated partition: the I/O edge of KaZoo (DESIGN §5).

One :class:`ElectionClient` per process (worker) holds one ZooKeeper session; each replica it
hosts joins the election of its partition with :meth:`ElectionClient.candidate`.  A candidate
creates an ephemeral sequential node ``<path>/n_<seq>`` holding the client's identity (e.g.
``"w3"``); the candidate with the lowest ``seq`` among the children leads, and its **epoch is that
``seq``**.  A follower watches only its immediate predecessor (no herd effect) and its own node.

Why epochs are unique and increase from one leadership to the next: sequence numbers under one
parent only grow, so each node has its own number and a lower number never reappears once gone.
A node leads at most once: a candidate that stops leading for any reason deletes that node and
re-enters with a new, higher one.  When candidate A starts leading with ``a``, every node with a
lower number has gone (``sync`` + ``get_children`` after A's own create sees every node created
before A's), so a leadership that starts after A's has a number created after ``a``, i.e. higher.
This holds for one lifetime of the parent node: a job run must not delete and reuse its election
path while candidates of that run may still be around (:func:`kazoo_leader.eviction.delete_tree` is for job end).

Leadership ends when the connection is SUSPENDED or LOST (a leader that cannot be sure it still
holds its node stops at once: its session may expire and a successor lead while it is cut off),
when its node is deleted by someone else (:func:`kazoo_leader.eviction.evict`, the driver declaring a worker dead), on
:meth:`Candidate.withdraw` and on :meth:`ElectionClient.close`.

**Membership.** A client made with ``membership=<path>`` creates that persistent node at start and
creates every candidate node in one ZooKeeper transaction with a check that the membership node
still exists.  :func:`kazoo_leader.eviction.expel` deletes it: from then on the client can never enter any election
again, whatever its session does.  That is what makes a worker the driver declared dead while it
was only hung harmless: when it wakes, its session has expired and it would re-enter every
election with a new node; if its twins have meanwhile left (their job ended), it would lead.  A stale leader is harmless to
the order log because its epoch is lower than its successor's (see :mod:`kazoo_leader.orders`);
what this module guarantees is that it never leads again under the old epoch.

The rules each candidate follows (enter, lead, watch, be deposed) are
:mod:`kazoo_leader.candidacy`; this module holds the session and its thread.

Threads: kazoo's listener and watch callbacks only enqueue work.  One thread per client runs
the election logic (ZooKeeper calls) and delivers every ``on_change`` callback, never while
holding a lock.  A slow ``on_change`` therefore delays the election handling of the other
candidates of the same client (not kazoo's own threads): keep callbacks short.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from kazoo_leader.candidacy import Candidate, CandidateRules, _Interrupted

log = logging.getLogger(__name__)


def zk_client(connect: str, digest: str | None = None, **options: Any) -> KazooClient:
    """A ZooKeeper session; with ``digest`` (``user:password``) it authenticates as that digest
    identity and every node it creates gets an ACL giving that identity alone access."""
    if digest is None:
        return KazooClient(hosts=connect, **options)
    user, _, password = digest.partition(":")
    return KazooClient(hosts=connect, auth_data=[("digest", digest)],
                       default_acl=[make_digest_acl(user, password, all=True)], **options)


class ElectionClient(CandidateRules):
    """One ZooKeeper session per process (worker); many candidates share it."""

    def __init__(self, connect: str, session_timeout_s: float, identity: str,
                 membership: str | None = None, digest: str | None = None, epoch_base: int = 0) -> None:
        """``epoch_base`` is added to every epoch granted: a run that continues the order logs of
        an earlier run (a resume) elects under a new path, above every epoch written before."""
        if not identity:
            raise ValueError("identity must be a non-empty string")
        if membership is not None and (not membership.startswith("/") or membership.endswith("/")):
            raise ValueError(f"membership path must be absolute without a trailing '/': {membership!r}")
        self.connect = connect
        self.identity = identity
        self.membership = membership
        self.epoch_base = epoch_base
        self._expelled = False  # the membership node was found gone (loop thread writes)
        self._data = identity.encode()
        self._zk = zk_client(
            connect, digest,
            timeout=session_timeout_s,
            # Reconnect quickly after a blip; kazoo's default backoff grows up to an hour.
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
        )
        self._lock = threading.Lock()  # guards _candidates and _closed; never held during callbacks
        self._candidates: dict[str, Candidate] = {}
        self._closed = False
        self._ended = False  # the loop's stop sentinel is queued: nothing else will run there
        self._started = False
        # Incremented by kazoo's thread on every SUSPENDED/LOST: a leadership granted under an
        # older value is void (see Candidate.epoch), and a pending call is abandoned.
        self._suspensions = 0
        self._wake: threading.Event | None = None  # set to abandon the ZooKeeper call in progress
        self._stopping = False
        self._orphans: set[str] = set()  # nodes of ours to delete once connected (loop thread)
        self._notes: deque[Callable[[], None]] = deque()  # callbacks to deliver (loop thread)
        self._queue: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"election-{identity}", daemon=True)

    @property
    def kazoo(self) -> KazooClient:
        """The underlying session, e.g. to :func:`~kazoo_leader.eviction.evict` or :func:`~kazoo_leader.eviction.delete_tree` with it."""
        return self._zk

    def start(self, timeout_s: float = 15) -> None:
        """Connect to ZooKeeper and start the election thread; RuntimeError if unreachable."""
        if self._started:
            raise RuntimeError("ElectionClient already started")
        self._started = True
        self._zk.add_listener(self._on_state)
        try:
            self._zk.start(timeout=timeout_s)
        except KazooTimeoutError:
            self._closed = True
            self._stop_session()  # it keeps retrying in the background otherwise
            raise RuntimeError(
                f"ZooKeeper at {self.connect!r} unreachable: no session within {timeout_s:g} s"
            ) from None
        if self.membership is not None:
            self._zk.ensure_path(self.membership)
        self._thread.start()

    @property
    def expelled(self) -> bool:
        """True once this client found its membership node deleted (it enters no election any more)."""
        return self._expelled

    def candidate(self, path: str, on_change: Callable[[int | None], None]) -> Candidate:
        """Join the election at ``path`` (e.g. ``/job/<run>/election/p3``); returns at once.

        ``on_change(epoch)`` is called when this candidate becomes leader, ``on_change(None)``
        when it stops; the calls strictly alternate, starting with an epoch.  One candidate per
        path per client.
        """
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"election path must be absolute without a trailing '/': {path!r}")
        with self._lock:
            if not self._started or self._closed:
                raise RuntimeError("ElectionClient is not running (start() it, and not after close())")
            if path in self._candidates:
                raise ValueError(f"{self.identity} already has a candidate at {path}")
            cand = Candidate(self, path, on_change)
            self._candidates[path] = cand
        self._submit(lambda: self._check(cand))
        return cand

    def close(self) -> None:
        """Withdraw all candidates (``on_change(None)`` for a leader), end the session, stop.

        The session ends (so every node of this client goes away at once) after the callbacks
        have been delivered.  Returns when all is done, unless called from a callback.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self._thread.is_alive():
            self._stop_session()
            return
        self._stopping = True  # abandon a ZooKeeper call in progress, skip queued checks
        wake = self._wake
        if wake is not None:
            wake.set()
        self._run_on_loop(self._shutdown)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # -- kazoo's threads ------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        if state != KazooState.CONNECTED:
            self._suspensions += 1  # only kazoo's connection thread writes it
            wake = self._wake
            if wake is not None:
                wake.set()
        self._submit(lambda: self._handle_state(state))

    def _submit(self, work: Callable[[], None]) -> None:
        self._queue.put(work)

    # -- the loop thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                break
            try:
                work()
            except Exception:
                log.exception("election %s: internal error", self.identity)
            self._deliver()
        self._deliver()
        self._stop_session()

    def _stop_session(self) -> None:
        self._zk.remove_listener(self._on_state)
        self._zk.stop()
        self._zk.close()

    def _deliver(self) -> None:
        # Callbacks run here, after the work that decided them, so a callback that calls back
        # into us (withdraw) only queues its own notification: callbacks never nest.
        while self._notes:
            note = self._notes.popleft()
            try:
                note()
            except Exception:
                log.exception("election %s: on_change callback raised", self.identity)

    def _run_on_loop(self, work: Callable[[], None]) -> None:
        if threading.current_thread() is self._thread:
            work()
            return
        done = threading.Event()

        def run() -> None:
            try:
                work()
            finally:
                self._notes.append(done.set)  # after the callbacks `work` queued

        with self._lock:
            if self._ended:
                return
            self._submit(run)
        done.wait()

    def _shutdown(self) -> None:
        self._stopping = True
        with self._lock:
            cands = list(self._candidates.values())
        for cand in cands:
            # No deletes: stopping the session right after removes every node at once.
            cand._withdrawn = True
            self._depose(cand, "client closed")
        with self._lock:
            self._candidates.clear()
            self._ended = True
            self._submit(None)

    def _op(self, result: Any, gen: int) -> Any:
        """Wait for an async ZooKeeper call, giving up if the connection drops meanwhile.

        A plain synchronous call made while disconnected waits for the reconnection (or the
        session expiry), which would hold up the deposition of every candidate of this client.
        """
        done = threading.Event()
        result.rawlink(lambda _r: done.set())
        self._wake = done
        try:
            if self._suspensions != gen or self._stopping:
                raise _Interrupted()
            done.wait()
            if not result.ready():
                raise _Interrupted()
            return result.get()
        finally:
            self._wake = None

    def _usable(self) -> int | None:
        """The current suspension count if connected and running, else None (the caller waits
        for the next CONNECTED, which re-runs everything)."""
        gen = self._suspensions
        if self._stopping or self._zk.state != KazooState.CONNECTED:
            return None
        return gen

    def _handle_state(self, state: str) -> None:
        with self._lock:
            cands = list(self._candidates.values())
        if state == KazooState.CONNECTED:
            log.debug("election %s: connected", self.identity)
            self._reap()
            for cand in cands:
                self._check(cand)
            return
        reason = "connection suspended" if state == KazooState.SUSPENDED else "session lost"
        for cand in cands:
            self._depose(cand, reason)
            if state == KazooState.LOST:  # the session's nodes are gone with it
                cand._node = None
                cand._uncertain = False
        if state == KazooState.LOST:
            self._orphans.clear()
