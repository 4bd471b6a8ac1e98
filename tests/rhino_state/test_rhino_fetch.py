"""Restoring where the checkpoint is not: a holder exports it, the restoring worker pulls and builds it."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rhino_state import IncrementDigestError, NoCompletedCheckpointError, ReplicaStore, RocksDBStateBackend
from rhino_state.fetch import CheckpointExporter, CheckpointRequest, fetch_checkpoint
from rhino_state.standby_db import restore_full
from tests.rhino_state.test_rhino_store import INSTANCE, Origin, content
from transport import rpc
from transport.security import RpcSecurity

SECURITY = RpcSecurity.generate()


@pytest.fixture
def holder(tmp_path: Path):
    """A store holding completed checkpoints 2 (kept for a rollback) and 3 of INSTANCE, served
    in 700-byte chunks, and the origin whose contents they are."""
    origin = Origin(tmp_path)
    store = ReplicaStore(tmp_path / "store")
    origin.write(0, 200, b"a")
    store.apply(*origin.checkpoint(1))
    origin.write(100, 300, b"b")
    store.apply(*origin.checkpoint(2))
    store.retain(INSTANCE, 2)
    store.complete(INSTANCE, 2)
    origin.write(0, 50, b"c")
    origin.backend.delete(1, b"k0001")
    store.apply(*origin.checkpoint(3))
    store.complete(INSTANCE, 3)
    exporter = CheckpointExporter(store, tmp_path / "exports", chunk_size=700, grace=0.05)
    exporter.start()
    server = rpc.serve(exporter.handlers(), security=SECURITY, max_workers=4, bind_host="127.0.0.1")
    peer = rpc.Peer(f"127.0.0.1:{server.port}", SECURITY)
    yield origin, exporter, peer
    peer.close()
    server.stop(0)
    store.close()
    origin.close()


def _opened(target: Path) -> tuple[dict, str, int | None]:
    with RocksDBStateBackend(target, instance=INSTANCE) as backend:
        return content(backend), backend.digest(), backend.last_checkpoint_id


@pytest.mark.parametrize("checkpoint_id", [2, 3])
def test_a_pulled_checkpoint_opens_as_the_holders_copy_and_continues_its_chain(tmp_path: Path, holder, checkpoint_id):
    origin, exporter, peer = holder
    payload = tmp_path / "pulled.inc"
    meta = fetch_checkpoint(peer, INSTANCE, checkpoint_id, payload)
    assert meta.full and meta.checkpoint_id == checkpoint_id and meta.runtime == b"rt%d" % checkpoint_id
    assert os.path.getsize(payload) == meta.bytes_shipped > 700  # several chunks
    _until(lambda: list(exporter.spool_dir.iterdir()) == [])  # the export went soon after its last chunk
    assert exporter._exporting == {}  # and so did its writer's gate
    restore_full(meta, payload, tmp_path / "restored")
    assert _opened(tmp_path / "restored") == (origin.contents[checkpoint_id], origin.metas[checkpoint_id].digest,
                                              checkpoint_id)


def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def test_two_workers_pulling_one_checkpoint_at_once_both_get_it_whole(tmp_path: Path, holder):
    """A restore and a copy to a new group member pull the same checkpoint from one holder: the
    first to finish must not take the export away from under the other's next chunk (the other
    had its export in hand and was about to read it)."""
    _, exporter, _ = holder
    first = [exporter.part(CheckpointRequest(INSTANCE, 3, 0))]
    in_hand = exporter._export((INSTANCE, 3))  # the second fetcher's next part(), before it reads
    size = first[0].size
    while sum(len(p.data) for p in first) < size:  # the first pulls to the end meanwhile
        first.append(exporter.part(CheckpointRequest(INSTANCE, 3, sum(len(p.data) for p in first))))
    with open(in_hand.path, "rb") as f:  # the second reads its chunk
        assert f.read() == b"".join(p.data for p in first)
    _until(lambda: list(exporter.spool_dir.iterdir()) == [])  # and the export goes after the grace


def test_a_checkpoint_not_kept_by_the_holder_is_refused_and_leaves_nothing(tmp_path: Path, holder):
    _, exporter, peer = holder
    payload = tmp_path / "pulled.inc"
    with pytest.raises(Exception, match="not kept here"):
        fetch_checkpoint(peer, INSTANCE, 1, payload)
    assert not payload.exists() and list(exporter.spool_dir.iterdir()) == []
    with pytest.raises(Exception, match="no completed checkpoint"):
        fetch_checkpoint(peer, (9, 9), 1, payload)
    assert exporter._exporting == {}


def test_a_payload_that_does_not_match_its_meta_builds_nothing(tmp_path: Path, holder):
    _, _, peer = holder
    payload = tmp_path / "pulled.inc"
    meta = fetch_checkpoint(peer, INSTANCE, 3, payload)
    with pytest.raises(IncrementDigestError):
        restore_full(replace(meta, digest="0" * 64), payload, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="delta"):
        restore_full(replace(meta, previous_id=2), payload, tmp_path / "delta")


def test_an_export_nobody_finishes_is_swept(tmp_path: Path, holder):
    _, exporter, _ = holder
    exporter.ttl = 0.0
    first = exporter.part(CheckpointRequest(INSTANCE, 3, 0))
    assert len(first.data) == 700 < first.size and len(list(exporter.spool_dir.iterdir())) == 1
    with pytest.raises(NoCompletedCheckpointError):
        exporter.part(CheckpointRequest((9, 9), 3, 0))  # any request sweeps what is overdue
    assert list(exporter.spool_dir.iterdir()) == []


def test_a_pulled_checkpoint_is_held_as_completed_or_kept_without_touching_the_standby(tmp_path: Path, holder):
    """A member that pulls a restore point keeps it beside what its chain gave it: the newest
    completed one if it is newer, else a kept older one; either restores like a chain's."""
    origin, _, peer = holder
    member = ReplicaStore(tmp_path / "member")
    try:
        for cid in (2, 3, 2):  # 2 first (completed), then 3 (newer: 2 kept), then 2 again (held)
            payload = tmp_path / f"pulled-{cid}.inc"
            member.import_completed(fetch_checkpoint(peer, INSTANCE, cid, payload), payload)
        member.retain(INSTANCE, 2)
        assert member.completed_ids(INSTANCE) == [2, 3] and member.last_applied(INSTANCE) is None
        for cid in (2, 3):
            member.restore(INSTANCE, tmp_path / f"r{cid}", cid)
            assert _opened(tmp_path / f"r{cid}") == (origin.contents[cid], origin.metas[cid].digest, cid)
        # the chain's next full snapshot goes on as usual (the standby was never touched)
        meta4, payload4 = origin.checkpoint(4, full=True)
        member.apply(meta4, payload4)
        member.complete(INSTANCE, 4)
        assert member.completed_ids(INSTANCE) == [2, 3, 4]
    finally:
        member.close()
