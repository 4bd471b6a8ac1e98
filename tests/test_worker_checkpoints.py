"""A worker's Rhino checkpoint runtime without Spark (replication.checkpoints)."""

from __future__ import annotations

from types import SimpleNamespace

from replication.checkpoints import WorkerCheckpoints
from rhino_state import RocksDBStateBackend
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
        assert checkpoints.report()["taken"] == [(4, 0, 1, 7, meta.digest), (4, 0, 1, 8, meta8.digest)]
    finally:
        backend.close()
        checkpoints.close()
