"""Rhino replica store: applying increments to standbys, completing, restoring by hard links, export."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from rhino_state import (
    IncrementDigestError,
    IncrementFormatError,
    IncrementGapError,
    IncrementMeta,
    NoCompletedCheckpointError,
    ReplicaStore,
    ReplicaStoreClosedError,
    RocksDBStateBackend,
    read_increment,
)

INSTANCE = (2, 0)


class Origin:
    """A backend taking checkpoints into numbered payload files, remembering each content."""

    def __init__(self, root: Path, instance: tuple[int, int] = INSTANCE, cache_max: int = 8) -> None:
        self.root = root
        self.backend = RocksDBStateBackend(root / f"origin-{instance}", cache_max, instance=instance)
        self.contents: dict[int, dict[tuple[int, bytes], bytes]] = {}
        self.metas: dict[int, IncrementMeta] = {}

    def write(self, start: int, stop: int, tag: bytes) -> None:
        for i in range(start, stop):
            self.backend.put(i % 5, b"k%04d" % i, tag + b"%d" % i)

    def checkpoint(self, checkpoint_id: int, **kwargs: object) -> tuple[IncrementMeta, Path]:
        path = self.root / f"{self.backend.instance}-{checkpoint_id}.inc"
        meta = self.backend.checkpoint(checkpoint_id, path, runtime=b"rt%d" % checkpoint_id, **kwargs)
        self.contents[checkpoint_id] = content(self.backend)
        self.metas[checkpoint_id] = meta
        return meta, path

    def close(self) -> None:
        self.backend.close()


def content(backend: RocksDBStateBackend) -> dict[tuple[int, bytes], bytes]:
    return {(kg, rest): value for kg, rest, value in backend.iter_key_groups(range(1 << 16))}


def restored(store: ReplicaStore, target: Path, instance: tuple[int, int] = INSTANCE) -> tuple:
    meta = store.restore(instance, target)
    with RocksDBStateBackend(target, instance=instance) as backend:
        return meta, content(backend), backend.digest(), backend.last_checkpoint_id


@pytest.fixture
def origin(tmp_path: Path):
    origin = Origin(tmp_path)
    yield origin
    origin.close()


@pytest.fixture
def store(tmp_path: Path):
    store = ReplicaStore(tmp_path / "store")
    yield store
    store.close()


def test_apply_complete_restore(tmp_path: Path, origin: Origin, store: ReplicaStore) -> None:
    origin.write(0, 50, b"a")
    store.apply(*origin.checkpoint(1))
    origin.write(25, 75, b"b")
    origin.backend.delete(0, b"k0000")
    meta2, payload2 = origin.checkpoint(2)
    store.apply(meta2, payload2)
    os.unlink(payload2)  # the store keeps its own copy
    assert store.last_applied(INSTANCE) == meta2 and store.latest_completed(INSTANCE) is None
    with pytest.raises(NoCompletedCheckpointError):
        store.restore(INSTANCE, tmp_path / "nothing")
    store.complete(INSTANCE, 2)
    assert store.latest_completed(INSTANCE) == meta2
    meta, data, digest, chain_at = restored(store, tmp_path / "r2")
    assert meta == meta2 and meta.runtime == b"rt2"
    assert data == origin.contents[2] and digest == meta2.digest == origin.metas[2].digest
    assert chain_at == 2


def test_restored_backend_continues_the_chain(tmp_path: Path, origin: Origin, store: ReplicaStore) -> None:
    origin.write(0, 30, b"a")
    store.apply(*origin.checkpoint(1))
    store.complete(INSTANCE, 1)
    store.restore(INSTANCE, tmp_path / "r")
    with RocksDBStateBackend(tmp_path / "r", instance=INSTANCE) as backend:
        backend.put(0, b"new", b"value")
        meta = backend.checkpoint(2, tmp_path / "from-restored.inc")
        assert (meta.previous_id, meta.changed_keys) == (1, 1)
        store.apply(meta, tmp_path / "from-restored.inc")
        store.complete(INSTANCE, 2)
        assert content(backend) == restored(store, tmp_path / "r2")[1]


def test_gap_error_and_duplicates(tmp_path: Path, origin: Origin, store: ReplicaStore) -> None:
    origin.write(0, 10, b"a")
    full = origin.checkpoint(1)
    origin.write(0, 5, b"b")
    delta2 = origin.checkpoint(2)
    origin.write(5, 10, b"c")
    delta3 = origin.checkpoint(3)
    with pytest.raises(IncrementGapError, match="full snapshot is needed"):
        store.apply(*delta2)
    store.apply(*full)
    with pytest.raises(IncrementGapError, match="last applied checkpoint is 1"):
        store.apply(*delta3)
    store.apply(*delta2)
    store.apply(*delta2)  # already applied: no-op
    store.apply(*full)  # older: no-op, does not replace the standby
    assert store.last_applied(INSTANCE) == delta2[0]
    store.apply(*delta3)
    store.complete(INSTANCE, 3)
    assert restored(store, tmp_path / "r")[1] == origin.contents[3]
    with pytest.raises(ValueError, match="cannot follow"):
        store.apply(replace(delta3[0], checkpoint_id=4, previous_id=4), delta3[1])


def test_complete_errors_and_stale_completions(tmp_path: Path, origin: Origin, store: ReplicaStore) -> None:
    with pytest.raises(ValueError, match="no increments"):
        store.complete(INSTANCE, 1)
    origin.write(0, 10, b"a")
    store.apply(*origin.checkpoint(1))
    with pytest.raises(ValueError, match="not applied"):
        store.complete(INSTANCE, 7)
    origin.write(0, 3, b"b")
    store.apply(*origin.checkpoint(2))
    store.complete(INSTANCE, 2)
    store.complete(INSTANCE, 1)  # an older completion arriving late is ignored
    store.complete(INSTANCE, 2)
    assert store.latest_completed(INSTANCE).checkpoint_id == 2


def test_gc_keeps_newest_completed_and_later_increments(
    tmp_path: Path, origin: Origin, store: ReplicaStore
) -> None:
    inst_dir = tmp_path / "store" / "t2-p0"
    for cid in range(1, 5):
        origin.write(cid * 3, cid * 3 + 10, b"v%d" % cid)
        store.apply(*origin.checkpoint(cid))
    assert [m.checkpoint_id for m, _ in store.pending(INSTANCE)] == [1, 2, 3, 4]
    store.complete(INSTANCE, 1)
    store.complete(INSTANCE, 3)
    assert sorted(p.name for p in inst_dir.iterdir() if not p.name.startswith("standby")) == [
        "inc-4.bin",
        "snap-3",
    ]
    pending = store.pending(INSTANCE)
    assert [m.checkpoint_id for m, _ in pending] == [4]
    assert list(read_increment(pending[0][1])) == list(read_increment(tmp_path / f"{INSTANCE}-4.inc"))
    assert restored(store, tmp_path / "r3")[1] == origin.contents[3]
    store.complete(INSTANCE, 4)
    assert store.pending(INSTANCE) == []
    assert sorted(p.name for p in inst_dir.iterdir() if not p.name.startswith("standby")) == ["snap-4"]


def test_retained_completed_snapshots_can_be_restored_for_a_rollback(
    tmp_path: Path, origin: Origin, store: ReplicaStore
) -> None:
    inst_dir = tmp_path / "store" / "t2-p0"
    store.retain(INSTANCE, 2)  # the driver's safe checkpoint: keep 2 and newer
    for cid in range(1, 5):
        origin.write(cid * 3, cid * 3 + 10, b"v%d" % cid)
        store.apply(*origin.checkpoint(cid))
        store.complete(INSTANCE, cid)
    assert store.completed_ids(INSTANCE) == [2, 3, 4]
    assert sorted(p.name for p in inst_dir.iterdir() if p.name.startswith("snap")) == ["snap-2", "snap-3", "snap-4"]
    for cid in (2, 3, 4):
        meta = store.restore(INSTANCE, tmp_path / f"r{cid}", cid)
        assert meta == origin.metas[cid] and meta.runtime == b"rt%d" % cid
        with RocksDBStateBackend(tmp_path / f"r{cid}", instance=INSTANCE) as backend:
            assert content(backend) == origin.contents[cid] and backend.last_checkpoint_id == cid
    with pytest.raises(NoCompletedCheckpointError, match="not kept"):
        store.restore(INSTANCE, tmp_path / "r1", 1)
    store.retain(INSTANCE, 4)  # the cut moved on: the older snapshots go now
    assert store.completed_ids(INSTANCE) == [4]
    assert sorted(p.name for p in inst_dir.iterdir() if p.name.startswith("snap")) == ["snap-4"]
    store.retain(INSTANCE, None)
    origin.write(0, 3, b"x")
    store.apply(*origin.checkpoint(5))
    store.complete(INSTANCE, 5)
    assert store.completed_ids(INSTANCE) == [5]


def test_checkpoints_completed_together_are_all_kept_for_a_rollback(
    tmp_path: Path, origin: Origin, store: ReplicaStore
) -> None:
    """The member applied 2, 3 and 4 before it heard that 4 completed (the driver's view names
    only the latest): completing 4 completes 2 and 3 as well, and those the driver may roll back
    to (from 3 on) are kept, not thrown away with the uncompleted snapshots."""
    store.retain(INSTANCE, 3)
    for cid in range(1, 5):
        origin.write(cid * 3, cid * 3 + 10, b"v%d" % cid)
        store.apply(*origin.checkpoint(cid))
        if cid == 1:
            store.complete(INSTANCE, 1)
    store.complete(INSTANCE, 4)
    assert store.completed_ids(INSTANCE) == [3, 4]
    meta = store.restore(INSTANCE, tmp_path / "r3", 3)
    assert meta == origin.metas[3]
    with RocksDBStateBackend(tmp_path / "r3", instance=INSTANCE) as backend:
        assert content(backend) == origin.contents[3] and backend.last_checkpoint_id == 3
    inst_dir = tmp_path / "store" / "t2-p0"
    assert sorted(p.name for p in inst_dir.iterdir() if p.name.startswith("snap")) == ["snap-3", "snap-4"]


def test_restore_while_later_increments_are_applied(
    tmp_path: Path, origin: Origin, store: ReplicaStore
) -> None:
    origin.write(0, 40, b"a")
    store.apply(*origin.checkpoint(1))
    store.complete(INSTANCE, 1)
    origin.write(20, 60, b"b")
    store.apply(*origin.checkpoint(2))  # the standby moves on; the completed snapshot stays at 1
    meta, data, digest, _ = restored(store, tmp_path / "r1")
    assert (meta.checkpoint_id, data, digest) == (1, origin.contents[1], origin.metas[1].digest)
    # Writing to the restored copy (and compacting it) does not disturb the store.
    with RocksDBStateBackend(tmp_path / "r1") as backend:
        for i in range(200):
            backend.put(9, b"x%d" % i, b"junk")
    origin.write(0, 10, b"c")
    store.apply(*origin.checkpoint(3))
    assert restored(store, tmp_path / "r1-again")[1] == origin.contents[1]
    store.complete(INSTANCE, 3)
    meta, data, digest, _ = restored(store, tmp_path / "r3")
    assert (meta.checkpoint_id, data, digest) == (3, origin.contents[3], origin.metas[3].digest)


def test_pipelined_completion_uses_the_snapshot_taken_before_overwriting(
    tmp_path: Path, origin: Origin, store: ReplicaStore
) -> None:
    """apply(k+1) may arrive before complete(k): the standby at k is snapshotted before moving on."""
    origin.write(0, 20, b"a")
    store.apply(*origin.checkpoint(1))
    origin.write(0, 20, b"b")
    store.apply(*origin.checkpoint(2))
    origin.write(0, 20, b"c")
    store.apply(*origin.checkpoint(3, full=True))  # a full snapshot replaces the standby
    store.complete(INSTANCE, 1)
    assert restored(store, tmp_path / "r1")[1] == origin.contents[1]
    store.complete(INSTANCE, 2)
    assert restored(store, tmp_path / "r2")[1] == origin.contents[2]
    store.complete(INSTANCE, 3)
    assert restored(store, tmp_path / "r3")[1] == origin.contents[3]


def test_restore_hard_links_sst_files(tmp_path: Path, origin: Origin, store: ReplicaStore) -> None:
    origin.write(0, 500, b"value-" * 20)
    store.apply(*origin.checkpoint(1))
    store.complete(INSTANCE, 1)
    target = tmp_path / "restored"
    store.restore(INSTANCE, target)
    snap = tmp_path / "store" / "t2-p0" / "snap-1"
    ssts = sorted(p.name for p in target.iterdir() if p.suffix == ".sst")
    assert ssts
    for name in ssts:
        assert os.stat(target / name).st_ino == os.stat(snap / name).st_ino
        assert os.stat(target / name).st_nlink > 1
    for name in ("CURRENT", "rocksdict-config.json"):  # mutable files are copies
        assert os.stat(target / name).st_ino != os.stat(snap / name).st_ino
    with pytest.raises(FileExistsError):
        store.restore(INSTANCE, target)  # not empty


def test_export_full_round_trip(tmp_path: Path, origin: Origin, store: ReplicaStore) -> None:
    origin.write(0, 100, b"a")
    store.apply(*origin.checkpoint(1))
    origin.write(50, 150, b"b")
    origin.backend.delete(1, b"k0001")
    store.apply(*origin.checkpoint(2))
    store.complete(INSTANCE, 2)
    origin.write(0, 10, b"later")
    store.apply(*origin.checkpoint(3))
    exported = store.export_full(INSTANCE, tmp_path / "export.inc")
    assert exported.full and exported.checkpoint_id == 2 and exported.runtime == b"rt2"
    assert exported.digest == origin.metas[2].digest
    assert exported.changed_keys == len(origin.contents[2])
    assert exported.bytes_shipped == os.path.getsize(tmp_path / "export.inc")
    with ReplicaStore(tmp_path / "remote") as remote:
        remote.apply(exported, tmp_path / "export.inc")
        remote.complete(INSTANCE, 2)
        meta, data, digest, chain_at = restored(remote, tmp_path / "remote-restored")
        assert (data, digest, chain_at) == (origin.contents[2], origin.metas[2].digest, 2)
        # The origin's next delta after 2 follows on the remote too.
        remote.apply(*(origin.metas[3], tmp_path / f"{INSTANCE}-3.inc"))
        remote.complete(INSTANCE, 3)
        assert restored(remote, tmp_path / "remote-3")[1] == origin.contents[3]
    with pytest.raises(NoCompletedCheckpointError):
        store.export_full((9, 9), tmp_path / "none.inc")


def test_digest_mismatch_and_corruption_leave_the_standby_untouched(
    tmp_path: Path, origin: Origin, store: ReplicaStore
) -> None:
    origin.write(0, 20, b"a")
    full = origin.checkpoint(1)
    with pytest.raises(IncrementDigestError):
        store.apply(replace(full[0], digest="0" * 64), full[1])
    assert store.last_applied(INSTANCE) is None
    store.apply(*full)
    origin.write(0, 5, b"b")
    meta2, payload2 = origin.checkpoint(2)
    with pytest.raises(IncrementDigestError):
        store.apply(replace(meta2, digest="1" * 64), payload2)
    corrupt = tmp_path / "corrupt.inc"
    data = bytearray(payload2.read_bytes())
    data[30] ^= 1
    corrupt.write_bytes(bytes(data))
    with pytest.raises(IncrementFormatError):
        store.apply(meta2, corrupt)
    with pytest.raises(IncrementFormatError, match="full"):
        store.apply(replace(meta2, previous_id=None), payload2)
    assert store.last_applied(INSTANCE) == full[0]
    store.apply(meta2, payload2)
    store.complete(INSTANCE, 2)
    assert restored(store, tmp_path / "r")[1] == origin.contents[2]
    assert [m.checkpoint_id for m, _ in store.pending(INSTANCE)] == []


def test_concurrent_instances(tmp_path: Path, store: ReplicaStore) -> None:
    origins = [Origin(tmp_path, instance=(5, p), cache_max=4) for p in range(4)]
    chains = []
    for n, o in enumerate(origins):
        chain = []
        for cid in range(1, 6):
            o.write(cid * n, cid * n + 30, b"%d-%d" % (n, cid))
            chain.append(o.checkpoint(cid))
        chains.append(chain)
        o.close()
    errors: list[BaseException] = []

    def replicate(n: int) -> None:
        try:
            for k, (meta, payload) in enumerate(chains[n]):
                store.apply(meta, payload)
                if k % 2:
                    store.complete(meta.instance, meta.checkpoint_id)
                    restored(store, tmp_path / f"r-{n}-{k}", meta.instance)
            store.complete(origins[n].backend.instance, 5)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=replicate, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.instances() == [(5, 0), (5, 1), (5, 2), (5, 3)]
    for n, o in enumerate(origins):
        meta, data, digest, _ = restored(store, tmp_path / f"final-{n}", (5, n))
        assert (meta.checkpoint_id, data, digest) == (5, o.contents[5], o.metas[5].digest)


def test_drop_close_and_stale_root(tmp_path: Path, origin: Origin) -> None:
    root = tmp_path / "store"
    store = ReplicaStore(root)
    origin.write(0, 10, b"a")
    store.apply(*origin.checkpoint(1))
    store.complete(INSTANCE, 1)
    store.drop(INSTANCE)
    store.drop(INSTANCE)  # unknown: no-op
    assert store.instances() == [] and not (root / "t2-p0").exists()
    assert store.latest_completed(INSTANCE) is None
    store.apply(*origin.checkpoint(2, full=True))
    store.close()
    store.close()
    with pytest.raises(ReplicaStoreClosedError):
        store.last_applied(INSTANCE)
    (root / "unrelated").mkdir()
    assert (root / "t2-p0").exists()
    with ReplicaStore(root) as fresh:  # a new process's store starts empty
        assert fresh.instances() == [] and not (root / "t2-p0").exists()
        assert (root / "unrelated").exists()
