"""KaZoo leader election against the embedded ZooKeeper (kazoo_leader.election)."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.connection import _CONNECTION_DROP
from kazoo.protocol.states import KazooState

from kazoo_leader.election import ElectionClient
from kazoo_leader.eviction import delete_tree, evict, expel

pytestmark = pytest.mark.integration

SESSION_S = 1.0
WAIT_S = 10.0


class Ledger:
    """Every epoch granted on one path, in callback order, by any candidate."""

    def __init__(self) -> None:
        self.epochs: list[int] = []
        self.lock = threading.Lock()


class Recorder:
    """An ``on_change`` that records its calls (and threads), with waits."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.events: list[int | None] = []
        self.threads: set[str] = set()
        self.cond = threading.Condition()

    def __call__(self, epoch: int | None) -> None:
        if epoch is not None:
            with self.ledger.lock:
                self.ledger.epochs.append(epoch)
        with self.cond:
            self.events.append(epoch)
            self.threads.add(threading.current_thread().name)
            self.cond.notify_all()

    def wait_events(self, n: int, timeout: float = WAIT_S) -> list[int | None]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= n, timeout), f"got {self.events}"
            return list(self.events)

    def wait_leader(self, after: int = 0, timeout: float = WAIT_S) -> int:
        """Wait until the latest call is an epoch, at index >= ``after``; return it."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: len(self.events) > after and self.events[-1] is not None, timeout
            )
            assert ok, f"never became leader: {self.events}"
            return self.events[-1]


def assert_alternates(*recorders: Recorder) -> None:
    for rec in recorders:
        for i, event in enumerate(rec.events):
            assert (event is None) == (i % 2 == 1), f"not alternating: {rec.events}"
    ledger = recorders[0].ledger
    assert ledger.epochs == sorted(set(ledger.epochs)), f"epochs not strictly increasing: {ledger.epochs}"


def wait_until(cond: Callable[[], bool], timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def seq_of(node: str) -> int:
    return int(node.rsplit("_", 1)[1])


@pytest.fixture
def zk(stack) -> Iterator[KazooClient]:
    client = KazooClient(hosts=stack.zookeeper_connect)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def root(zk) -> Iterator[str]:
    path = f"/test-election/{uuid.uuid4().hex}"
    yield path
    delete_tree(zk, path)


@pytest.fixture
def clients(stack) -> Iterator[Callable[[str], ElectionClient]]:
    made: list[ElectionClient] = []

    def make(identity: str) -> ElectionClient:
        client = ElectionClient(stack.zookeeper_connect, SESSION_S, identity)
        client.start()
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def children_by_owner(zk: KazooClient, path: str) -> dict[str, list[int]]:
    """identity -> sorted seqs of its nodes at ``path``."""
    out: dict[str, list[int]] = {}
    for name in zk.get_children(path):
        data, _ = zk.get(f"{path}/{name}")
        out.setdefault(data.decode(), []).append(seq_of(name))
    return {k: sorted(v) for k, v in out.items()}


def count(zk: KazooClient, path: str) -> int:
    return len(zk.get_children(path)) if zk.exists(path) else 0


def test_first_leads_and_close_fails_over(zk, root, clients) -> None:
    path = f"{root}/p0"
    ledger = Ledger()
    c1, c2 = clients("w1"), clients("w2")
    r1, r2 = Recorder(ledger), Recorder(ledger)
    a = c1.candidate(path, r1)
    e1 = r1.wait_leader()
    assert a.epoch == e1
    b = c2.candidate(path, r2)
    wait_until(lambda: count(zk, path) == 2, what="second node")
    owners = children_by_owner(zk, path)
    assert owners["w1"] == [e1] and owners["w2"][0] > e1
    assert r2.events == [] and b.epoch is None

    c1.close()
    assert r1.events == [e1, None]  # delivered before close() returned
    assert a.epoch is None
    e2 = r2.wait_leader()
    assert e2 > e1 and b.epoch == e2
    assert r1.threads == {"election-w1"} and r2.threads == {"election-w2"}
    assert_alternates(r1, r2)


def test_withdraw_elects_only_the_next(zk, root, clients) -> None:
    path = f"{root}/p0"
    ledger = Ledger()
    recs = [Recorder(ledger) for _ in range(3)]
    cands = []
    for i, rec in enumerate(recs):
        cands.append(clients(f"w{i}").candidate(path, rec))
        wait_until(lambda n=i + 1: count(zk, path) == n, what=f"node {i}")
    e0 = recs[0].wait_leader()

    cands[0].withdraw()
    assert recs[0].events == [e0, None]
    e1 = recs[1].wait_leader()
    assert e1 > e0
    assert count(zk, path) == 2
    time.sleep(0.3)  # give a herd the chance to show up
    assert recs[2].events == []
    assert recs[1].events == [e1]
    cands[0].withdraw()  # idempotent
    assert_alternates(*recs)


def expire_session(client: ElectionClient, connect: str) -> None:
    """Expire the session on the server: attach a second client to it, then close that one."""
    session_id, password = client.kazoo.client_id
    other = KazooClient(hosts=connect, client_id=(session_id, password), timeout=SESSION_S)
    other.start(timeout=15)
    other.stop()
    other.close()


def test_session_expiry_fails_over(stack, zk, root, clients) -> None:
    path = f"{root}/p0"
    ledger = Ledger()
    c1, c2 = clients("w1"), clients("w2")
    r1, r2 = Recorder(ledger), Recorder(ledger)
    lost = threading.Event()
    c1.kazoo.add_listener(lambda state: lost.set() if state == KazooState.LOST else None)
    a = c1.candidate(path, r1)
    e1 = r1.wait_leader()
    c2.candidate(path, r2)
    wait_until(lambda: count(zk, path) == 2, what="second node")
    old_session = c1.kazoo.client_id[0]

    expire_session(c1, stack.zookeeper_connect)
    assert r1.wait_events(2) == [e1, None]
    e2 = r2.wait_leader()
    assert e2 > e1
    assert lost.wait(WAIT_S), "kazoo never reported LOST"
    # The old leader re-enters under its new session, behind the new leader.
    wait_until(lambda: children_by_owner(zk, path).get("w1", [0])[0] > e2, what="w1 re-entered")
    assert c1.kazoo.client_id[0] != old_session
    assert len(children_by_owner(zk, path)["w1"]) == 1
    assert a.epoch is None and r1.events == [e1, None]
    assert_alternates(r1, r2)


def test_suspended_leader_reenters_with_a_new_epoch(zk, root, clients) -> None:
    path = f"{root}/p0"
    ledger = Ledger()
    c1 = clients("w1")
    r1 = Recorder(ledger)
    a = c1.candidate(path, r1)
    e1 = r1.wait_leader()
    session = c1.kazoo.client_id[0]

    c1.kazoo._call(_CONNECTION_DROP, None)  # kazoo's own test trick: drop the socket, keep the session
    e2 = r1.wait_leader(after=2)
    assert r1.events == [e1, None, e2] and e2 > e1 and a.epoch == e2
    assert c1.kazoo.client_id[0] == session  # same session: only the node was replaced
    assert children_by_owner(zk, path) == {"w1": [e2]}
    assert_alternates(r1)


def test_duplicate_node_from_a_lost_create_reply_is_removed(zk, root, clients) -> None:
    path = f"{root}/p0"
    c1 = clients("w1")
    r1 = Recorder(Ledger())
    a = c1.candidate(path, r1)
    e1 = r1.wait_leader()
    # What a create whose reply was lost leaves behind: a second node of ours, same session.
    dup = seq_of(c1.kazoo.create(f"{path}/n_", b"w1", ephemeral=True, sequence=True))
    a._uncertain = True  # as _create marks it when the reply is lost
    c1.kazoo._call(_CONNECTION_DROP, None)
    e2 = r1.wait_leader(after=2)
    assert e2 > dup > e1
    assert children_by_owner(zk, path) == {"w1": [e2]}
    assert_alternates(r1)


def test_evict_deposes_at_once_and_the_evicted_comes_back(stack, zk, root, clients) -> None:
    path = f"{root}/p0"
    other = f"{root}/p1"
    ledger = Ledger()
    c1, c2 = clients("w1"), clients("w2")
    r1, r2 = Recorder(ledger), Recorder(ledger)
    a = c1.candidate(path, r1)
    e1 = r1.wait_leader()
    b = c2.candidate(path, r2)
    r1_other = Recorder(Ledger())
    c1.candidate(other, r1_other)  # w1 in a second election, as a follower of nobody: it leads
    r1_other.wait_leader()
    wait_until(lambda: count(zk, path) == 2, what="second node")

    t0 = time.monotonic()
    deleted = evict(zk, root, "w1")
    e2 = r2.wait_leader()
    elapsed = time.monotonic() - t0
    assert elapsed < SESSION_S / 2, f"failover took {elapsed:.2f} s"
    assert sorted(deleted) == sorted([f"{path}/n_{e1:010d}", f"{other}/n_{r1_other.events[0]:010d}"])
    assert r1.wait_events(2)[:2] == [e1, None]
    assert e2 > e1
    wait_until(lambda: children_by_owner(zk, path).get("w1", [0])[0] > e2, what="w1 re-entered")
    assert a.epoch is None
    # Alone in `other`, w1 re-enters and leads again there with a higher epoch.
    assert r1_other.wait_leader(after=2) > r1_other.events[0]

    b.withdraw()
    e3 = r1.wait_leader(after=2)
    assert e3 > e2 and a.epoch == e3
    assert evict(stack.zookeeper_connect, root, "nobody") == []  # with its own short session
    assert_alternates(r1, r2)
    assert_alternates(r1_other)


def test_expelled_client_never_enters_again_even_alone(stack, zk, root) -> None:
    """What the driver does to a worker it declared dead while it was hung: expel, then evict.
    When the worker wakes up its session has expired; it must not re-enter, not even where
    nobody else is left to lead (its twins finished).  A member that was not expelled still
    re-enters after the same expiry."""
    path, other = f"{root}/p0", f"{root}/p1"
    hung = ElectionClient(stack.zookeeper_connect, SESSION_S, "w1a0", membership=f"{root}/members/w1a0")
    kept = ElectionClient(stack.zookeeper_connect, SESSION_S, "w2a0", membership=f"{root}/members/w2a0")
    hung.start()
    kept.start()
    try:
        r_hung, r_kept = Recorder(Ledger()), Recorder(Ledger())
        a = hung.candidate(path, r_hung)
        e1 = r_hung.wait_leader()
        kept.candidate(other, r_kept)
        k1 = r_kept.wait_leader()

        assert expel(zk, f"{root}/members/w1a0") is True
        assert expel(zk, f"{root}/members/w1a0") is False  # gone already
        assert evict(zk, root, "w1a0") == [f"{path}/n_{e1:010d}"]
        assert r_hung.wait_events(2) == [e1, None]
        expire_session(hung, stack.zookeeper_connect)
        expire_session(kept, stack.zookeeper_connect)
        assert r_kept.wait_leader(after=2) > k1  # a member re-enters after its session expired
        time.sleep(3 * SESSION_S)  # room for any re-entry of the expelled one
        assert hung.expelled and a.epoch is None and r_hung.events == [e1, None]
        assert count(zk, path) == 0, children_by_owner(zk, path)
    finally:
        hung.close()
        kept.close()


def test_churn_keeps_callbacks_alternating_and_epochs_increasing(zk, root, clients) -> None:
    path = f"{root}/p0"
    ledger = Ledger()
    c1, c2 = clients("w1"), clients("w2")
    recs = {c1: [Recorder(ledger)], c2: [Recorder(ledger)]}
    cands = {c1: c1.candidate(path, recs[c1][0]), c2: c2.candidate(path, recs[c2][0])}
    wait_until(lambda: count(zk, path) == 2, what="both nodes")
    for round_ in range(6):
        wait_until(lambda: any(c.epoch is not None for c in cands.values()), what="a leader")
        leader = next(c for c in cands if cands[c].epoch is not None)
        follower = c2 if leader is c1 else c1
        seen = len(recs[follower][-1].events)
        if round_ % 3 == 2:
            evict(zk, root, leader.identity)  # the leader re-enters by itself
        else:
            cands[leader].withdraw()
            rec = Recorder(ledger)
            recs[leader].append(rec)
            cands[leader] = leader.candidate(path, rec)
        recs[follower][-1].wait_leader(after=seen)
        wait_until(lambda: count(zk, path) == 2, what="re-entry")
    assert len(ledger.epochs) >= 7
    assert_alternates(*recs[c1], *recs[c2])


def test_withdraw_from_inside_the_callback(zk, root, clients) -> None:
    path = f"{root}/p0"
    c1 = clients("w1")
    events: list[int | None] = []
    done = threading.Event()
    holder: dict[str, object] = {}

    def on_change(epoch: int | None) -> None:
        events.append(epoch)
        if epoch is not None:
            holder["cand"].withdraw()  # must neither deadlock nor nest the None callback
            events.append("after withdraw")
        else:
            done.set()

    holder["cand"] = c1.candidate(path, on_change)
    assert done.wait(WAIT_S)
    assert events[1:] == ["after withdraw", None]
    wait_until(lambda: count(zk, path) == 0, what="node deleted")
    with pytest.raises(ValueError):
        c1.candidate("relative/path", on_change)
    c1.candidate(path, lambda e: None)
    with pytest.raises(ValueError):
        c1.candidate(path, lambda e: None)


def test_start_fails_fast_when_nothing_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connect = f"127.0.0.1:{port}"
    client = ElectionClient(connect, SESSION_S, "w1")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=connect):
        client.start(timeout_s=1)
    assert time.monotonic() - t0 < 3
    with pytest.raises(RuntimeError):
        client.candidate("/x", lambda e: None)
    client.close()


def test_with_a_digest_the_election_nodes_are_closed_to_other_clients(stack) -> None:
    """``spark.replication.zookeeper.digest``: the election and membership nodes carry a digest ACL,
    so a client without that identity can neither read, delete nor join them; the driver's
    eviction, authenticated, still works."""
    from kazoo.exceptions import NoAuthError

    from kazoo_leader.election import zk_client

    digest = "job:s3cret"
    root = f"/test-election-acl/{uuid.uuid4().hex}"
    client = ElectionClient(stack.zookeeper_connect, SESSION_S, "w1a0", membership=f"{root}/members/w1a0",
                            digest=digest)
    stranger = KazooClient(hosts=stack.zookeeper_connect)
    wrong = zk_client(stack.zookeeper_connect, "job:guess")
    owner = zk_client(stack.zookeeper_connect, digest)
    for zk in (stranger, wrong, owner):
        zk.start(timeout=15)
    try:
        client.start()
        rec = Recorder(Ledger())
        client.candidate(f"{root}/p0", rec)
        rec.wait_leader()
        [node] = owner.get_children(f"{root}/p0")
        for zk in (stranger, wrong):
            with pytest.raises(NoAuthError):
                zk.get(f"{root}/p0/{node}")
            with pytest.raises(NoAuthError):
                zk.get_children(f"{root}/p0")
            with pytest.raises(NoAuthError):
                zk.delete(f"{root}/members/w1a0")
            with pytest.raises(NoAuthError):
                zk.create(f"{root}/p0/n_", b"intruder", ephemeral=True, sequence=True)
        assert evict(stack.zookeeper_connect, root, "w1a0", digest=digest) == [f"{root}/p0/{node}"]
        assert rec.wait_events(2)[1] is None  # deposed by the eviction
    finally:
        client.close()
        delete_tree(owner, root)
        for zk in (stranger, wrong, owner):
            zk.stop()
            zk.close()
