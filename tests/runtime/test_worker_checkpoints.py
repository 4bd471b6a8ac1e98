"""A worker's Rhino checkpoint runtime without Spark (replication.runtime.checkpoints)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from replication.heartbeat_parts import CheckpointReport
from replication.runtime.checkpoints import WorkerCheckpoints
from rhino_state import RocksDBStateBackend
from tests.rhino_state.test_rhino_store import content
from transport import rpc
from transport.security import RpcSecurity


def test_a_checkpoint_taken_while_the_driver_hands_shipping_to_the_twin_is_not_shipped_and_fails_nothing(tmp_path):
    """``take`` decides to ship, then the heartbeat thread applies a view in which the twin ships
    (a restored replica ships again) and the shipper forgets the instance before ``offer``: the
    checkpoint is just not shipped (its twin's are), the replica goes on."""
    checkpoints = WorkerCheckpoints(SimpleNamespace(instances={}, security=RpcSecurity.generate()), tmp_path / "rhino")
    backend = RocksDBStateBackend(tmp_path / "db", instance=(4, 0))
    inst = SimpleNamespace(task=SimpleNamespace(id=4), partition=0, replica=1, name="sink[0]r1",
                           state_backend=lambda: backend)
    try:
        backend.put(0, b"k", b"v")
        checkpoints._groups[(4, 0)] = ["10.0.0.1:1"]  # shipping, as far as take() can tell ...
        meta, shipped = checkpoints.take(inst, 7, b"", {}, {})  # ... but the shipper has no group for it
        assert meta.checkpoint_id == 7 and not shipped
        checkpoints._full_next.add((4, 0))  # the same when the group is dropped between deciding and offering
        backend.put(0, b"k", b"w")
        meta8, shipped = checkpoints.take(inst, 8, b"", {}, {})
        assert meta8.checkpoint_id == 8 and not shipped
        assert checkpoints.report().taken == [(4, 0, 1, 7, meta.digest), (4, 0, 1, 8, meta8.digest)]
    finally:
        backend.close()
        checkpoints.close()


def _checkpoints(tmp_path, name: str, security: RpcSecurity) -> tuple[WorkerCheckpoints, object, str]:
    """A worker's checkpoint runtime serving its handlers on a port of its own, and its address."""
    checkpoints = WorkerCheckpoints(SimpleNamespace(instances={}, security=security), tmp_path / name)
    server = rpc.serve(checkpoints.handlers(), security=security, bind_host="127.0.0.1", max_workers=8)
    address = f"127.0.0.1:{server.port}"
    checkpoints.start(address)
    return checkpoints, server, address


def test_the_shipper_holds_what_it_ships_and_serves_it_once_its_group_is_gone(tmp_path):
    """sink[0]r0 ships checkpoints 1 (full) and 2 (a delta) to its group's only member: each
    completes with the shipper's own worker among its holders.  With the member gone, another
    worker pulls checkpoint 2 from the shipper and gets the replica's state at 2."""
    security = RpcSecurity.generate()
    origin, origin_server, origin_address = _checkpoints(tmp_path, "origin", security)
    member, member_server, member_address = _checkpoints(tmp_path, "member", security)
    puller, puller_server, _ = _checkpoints(tmp_path, "puller", security)
    backend = RocksDBStateBackend(tmp_path / "db", instance=(4, 0))
    inst = SimpleNamespace(task=SimpleNamespace(id=4), partition=0, replica=0, name="sink[0]r0",
                           state_backend=lambda: backend)
    try:
        origin._ship((4, 0), [member_address], None)
        backend.put(0, b"k", b"v")
        assert origin.take(inst, 1, b"rt1", {}, {})[1]
        backend.put(0, b"k", b"w")
        backend.put(1, b"j", b"x")
        meta2, shipped = origin.take(inst, 2, b"rt2", {}, {})
        assert shipped and not meta2.full
        completed = []
        deadline = time.monotonic() + 10
        while len(completed) < 2:
            assert time.monotonic() < deadline, completed
            completed += (origin.report() or CheckpointReport()).completed
            time.sleep(0.01)
        assert [(c.checkpoint_id, sorted(c.holders)) for c in completed] == [(cid, sorted([member_address, origin_address]))
                                                             for cid in (1, 2)]
        member.close()
        member_server.stop(0)
        meta = puller.fetch((4, 0), tmp_path / "restored", 2, rpc.Peer(origin_address, security))
        assert meta.checkpoint_id == 2 and meta.digest == meta2.digest and meta.runtime == b"rt2"
        with RocksDBStateBackend(tmp_path / "restored", instance=(4, 0)) as restored:
            assert content(restored) == content(backend) and restored.last_checkpoint_id == 2
    finally:
        backend.close()
        for checkpoints, server in ((origin, origin_server), (puller, puller_server)):
            checkpoints.close()
            server.stop(0)
