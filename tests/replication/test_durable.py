"""Durable checkpoints without Spark: the store (upload, cuts, verification, restore, retention),
the uploader's chains, and the driver's decision when a cut is complete."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from replication.durability import (
    CutTracker,
    DurableCheckpoints,
    differences,
    parallelism_changes,
    rescale_savepoint_dir,
    resume_point,
    with_parallelism,
)
from rhino_state import RocksDBStateBackend
from rhino_state.durable import CutPart, DamagedCheckpointError, DurableCut, DurableStore
from rhino_state.manager import CompletedCheckpoint
from rhino_state.uploader import IncrementUploader
from tests.rhino_state.test_rhino_store import Origin, content

INSTANCE = (2, 0)


def _read(store: DurableStore, path: str) -> bytes:
    with store.fs.open_input_stream(path) as f:
        return f.read()


def _replace(store: DurableStore, path: str, data: bytes) -> None:
    with store.fs.open_output_stream(path) as f:
        f.write(data)


@pytest.fixture
def origin(tmp_path: Path):
    origin = Origin(tmp_path / "origin")
    (tmp_path / "origin").mkdir(exist_ok=True)
    yield origin
    origin.close()


def _chain(store: DurableStore, origin: Origin, ids: list[int], *, full_at: tuple[int, ...] = ()) -> dict[int, str]:
    """Take checkpoints ``ids`` (full at the first and at ``full_at``), writing between them; upload
    each; returns id -> file."""
    files: dict[int, str] = {}
    previous = None
    for n, cid in enumerate(ids):
        origin.write(cid * 3, cid * 3 + 20, b"v%d-" % cid)
        if n % 3 == 2:
            origin.backend.delete(cid % 5, b"k%04d" % (cid * 3))
        full = n == 0 or cid in full_at
        meta, payload = origin.checkpoint(cid, full=full)
        files[cid] = store.upload(meta, payload, None if full else previous).file
        previous = files[cid]
    return files


def _cut(store: DurableStore, number: int, files: dict[int, str], origin: Origin, cid: int) -> DurableCut:
    cut = DurableCut(number, store.job, {INSTANCE: CutPart(cid, files[cid], origin.metas[cid].digest, {3: 7}, {4: 9})},
                     plan={"mode": "liverobin"}, run={"output_prefix": "r1", "epoch_base": 0},
                     sinks={"2-0-out": [11, 40]}, written_at=1.0)
    store.write_cut(cut)
    return cut


def _restored_content(store: DurableStore, file: str, target: Path) -> tuple:
    meta = store.restore(INSTANCE, file, target)
    with RocksDBStateBackend(target, instance=INSTANCE) as backend:
        return meta, content(backend), backend.digest(), backend.last_checkpoint_id


def test_a_cut_restores_the_state_of_its_checkpoint_from_the_full_snapshot_and_deltas(tmp_path, origin, durable_dir):
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [1, 2, 3, 5])
    cut = _cut(store, 1, files, origin, 3)
    assert store.cut_numbers() == [1]
    read = store.read_cut(1)
    assert read == cut and read.parts[INSTANCE].positions == {3: 7} and read.sinks == {"2-0-out": [11, 40]}
    found, skipped = store.latest_complete_cut()
    assert found == cut and skipped == []
    assert [inc.meta.checkpoint_id for inc in store.chain(INSTANCE, files[3])] == [1, 2, 3]
    meta, data, digest, at = _restored_content(store, files[3], tmp_path / "r3")
    assert data == origin.contents[3] and digest == origin.metas[3].digest and at == 3
    assert meta.runtime == b"rt3"
    # the backend goes on from there: a later checkpoint chains onto the restored one
    assert _restored_content(store, files[5], tmp_path / "r5")[1] == origin.contents[5]


def test_a_path_relative_or_a_file_uri_names_the_same_store(tmp_path, origin, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = _chain(DurableStore("dir", "job"), origin, [1])
    assert DurableStore(f"file://{tmp_path}/dir", "job").uploaded(INSTANCE) == [files[1]]


@pytest.mark.parametrize("damage", ["truncate payload", "flip a payload byte", "delete a delta", "delete a meta",
                                    "edit the cut", "truncate the cut"])
def test_a_damaged_latest_cut_is_reported_and_the_one_before_is_used(tmp_path, origin, damage, durable_dir):
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [1, 2, 3, 4])
    first = _cut(store, 1, files, origin, 2)
    _cut(store, 2, files, origin, 4)
    inc_dir = f"{store.root}/increments/t2-p0"
    cut_path = store.cut_path(2)
    if damage == "truncate payload":
        path = f"{inc_dir}/{files[4]}.inc"
        _replace(store, path, _read(store, path)[:-5])
    elif damage == "flip a payload byte":
        path = f"{inc_dir}/{files[3]}.inc"
        data = bytearray(_read(store, path))
        data[len(data) // 2] ^= 0xFF
        _replace(store, path, bytes(data))
    elif damage == "delete a delta":
        store.fs.delete_file(f"{inc_dir}/{files[3]}.inc")
    elif damage == "delete a meta":
        store.fs.delete_file(f"{inc_dir}/{files[4]}.json")
    elif damage == "edit the cut":
        body = json.loads(_read(store, cut_path))
        body["parts"]["2-0"]["positions"]["3"] = 1
        _replace(store, cut_path, json.dumps(body).encode())
    else:
        _replace(store, cut_path, _read(store, cut_path)[:40])
    found, skipped = store.latest_complete_cut()
    assert found == first
    assert [n for n, _ in skipped] == [2]
    assert skipped[0][1].startswith("cut 2") or "t2-p0" in skipped[0][1]
    assert _restored_content(store, files[2], tmp_path / "r")[1] == origin.contents[2]


def test_restore_checks_each_increment_it_downloads(tmp_path, origin, durable_dir):
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [1, 2])
    path = f"{store.root}/increments/t2-p0/{files[1]}.inc"
    data = bytearray(_read(store, path))
    data[-3] ^= 0x01
    _replace(store, path, bytes(data))
    with pytest.raises(DamagedCheckpointError, match="checksum"):
        store.restore(INSTANCE, files[2], tmp_path / "r")


def test_a_cut_is_written_whole_or_not_at_all(tmp_path, origin, monkeypatch, durable_dir):
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [1])
    real = store.fs.open_output_stream

    class Broken:
        def __init__(self, stream):
            self.stream = stream

        def write(self, data):
            self.stream.write(data[: len(data) // 2])
            raise OSError("disk full")

        def close(self):
            self.stream.close()

    class FullDisk:
        def __init__(self, fs):
            self.fs = fs

        def open_output_stream(self, path):
            return Broken(real(path))

        def __getattr__(self, name):
            return getattr(self.fs, name)

    monkeypatch.setattr(store, "fs", FullDisk(store.fs))
    with pytest.raises(OSError, match="disk full"):
        _cut(store, 1, files, origin, 1)
    monkeypatch.undo()
    assert store.cut_numbers() == []
    assert not store.fs.get_file_info(pafs.FileSelector(f"{store.root}/cuts", allow_not_found=True))


def test_retention_keeps_every_increment_a_kept_or_later_cut_needs(tmp_path, origin, durable_dir):
    """A new chain (a shipper that took over, starting with a full snapshot) may begin at an id below
    an older chain's newest: retention goes by the oldest kept cut's chain start, not by its id."""
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [10, 20, 30, 40, 50, 60, 70], full_at=(40, 70))
    for n, cid in enumerate([20, 30, 50, 60], start=1):
        _cut(store, n, files, origin, cid)
    assert store.oldest_checkpoint() == 20
    assert store.retain(2) == (2, 6, [3, 4])  # cuts 1, 2; ids 10-30 (payload + meta each)
    assert store.cut_numbers() == [3, 4]
    assert store.oldest_checkpoint() == 50  # how far back a resume may go (a LiveRobin log is kept from there)
    assert store.uploaded(INSTANCE) == [files[c] for c in (40, 50, 60, 70)]
    for number in (3, 4):
        cut = store.read_cut(number)
        store.verify(cut)
    assert _restored_content(store, files[70], tmp_path / "r70")[1] == origin.contents[70]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=12), st.integers(1, 3))
def test_after_retention_every_kept_cut_still_verifies(tmp_path_factory, steps, keep):
    """Any sequence of checkpoints (some full), some made cuts: retention never breaks a kept one."""
    root = tmp_path_factory.mktemp("retain")
    origin = Origin(root)
    try:
        store = DurableStore(str(root / "dir"), "job")
        ids = [10 * (n + 1) for n in range(len(steps))]
        files = _chain(store, origin, ids, full_at=tuple(cid for cid, (full, _) in zip(ids, steps, strict=True) if full))
        number = 0
        for cid, (_, cut) in zip(ids, steps, strict=True):
            if cut:
                number += 1
                _cut(store, number, files, origin, cid)
                store.retain(keep)
        kept = store.cut_numbers()
        assert len(kept) == min(keep, number)
        for n in kept:
            store.verify(store.read_cut(n))
    finally:
        origin.close()


def test_uploader_chains_deltas_and_starts_a_new_chain_after_a_failure(tmp_path, origin, monkeypatch, durable_dir):
    store = DurableStore(durable_dir, "job")
    uploaded, failed = [], []
    done = threading.Event()
    uploader = IncrementUploader(store, tmp_path / "spool", uploaded.append, failed.append)
    try:
        origin.write(0, 10, b"a")
        assert uploader.offer(*origin.checkpoint(1, full=True))
        origin.write(0, 5, b"b")
        assert uploader.offer(*origin.checkpoint(2))
        assert uploader.wait_idle(10)
        assert [u.meta.checkpoint_id for u in uploaded] == [1, 2] and uploaded[1].previous_file == uploaded[0].file
        # a delta that follows a checkpoint this uploader never took: refused (the caller takes a full one)
        origin.write(0, 5, b"c")
        meta3, payload3 = origin.checkpoint(3)
        gap = dataclasses.replace(meta3, previous_id=99)
        assert not uploader.offer(gap, payload3)
        # an upload that fails breaks the chain: the deltas queued behind it are dropped
        real = store.upload
        calls = []

        def failing(meta, payload, previous, file=None):
            calls.append(meta.checkpoint_id)
            if meta.checkpoint_id == 3:
                done.wait(5)
                raise OSError("bucket unreachable")
            return real(meta, payload, previous, file=file)

        monkeypatch.setattr(store, "upload", failing)
        monkeypatch.setattr("rhino_state.uploader.RETRY_PAUSE_S", 0.0)
        assert uploader.offer(meta3, payload3)
        origin.write(0, 5, b"d")
        assert uploader.offer(*origin.checkpoint(4))  # queued behind 3
        done.set()
        assert uploader.wait_idle(10)
        assert failed == [INSTANCE] and 4 not in calls
        origin.write(0, 5, b"e")
        assert not uploader.offer(*origin.checkpoint(5))  # its previous (4) was dropped with the chain
        assert uploader.offer(*origin.checkpoint(6, full=True))
        assert uploader.wait_idle(10)
        assert [u.meta.checkpoint_id for u in uploaded] == [1, 2, 6] and uploaded[2].previous_file is None
        assert not list((tmp_path / "spool").iterdir())
    finally:
        uploader.close()


def _cp(cid: int, digest: str = "d") -> CompletedCheckpoint:
    return CompletedCheckpoint(cid, {1: cid}, frozenset({1}), digest, 0.0, {2: cid})


def test_a_cut_is_handed_out_once_every_safe_checkpoint_is_uploaded_and_only_when_it_moved():
    tracker = CutTracker()
    a, b = (0, 0), (1, 0)
    safe = {a: _cp(5), b: _cp(7)}
    assert tracker.next_cut(safe, [a, b]) is None  # nothing uploaded
    tracker.uploaded(a, 5, "f5")
    tracker.uploaded(b, 6, "g6")
    assert tracker.next_cut(safe, [a, b]) is None  # b's safe checkpoint (7) is not uploaded
    assert tracker.next_cut({a: _cp(5)}, [a, b]) is None  # b has no safe checkpoint
    tracker.uploaded(b, 7, "g7")
    parts = tracker.next_cut(safe, [a, b])
    assert parts == {a: CutPart(5, "f5", "d", {1: 5}, {2: 5}), b: CutPart(7, "g7", "d", {1: 7}, {2: 7})}
    assert tracker.next_cut(safe, [a, b]) is None  # the same cut
    assert 6 not in tracker.uploads[b]  # below the cut: never needed again
    tracker.uploaded(a, 8, "f8")
    seen = []
    assert tracker.next_cut({a: _cp(8), b: _cp(7)}, [a, b], clean=lambda ids: seen.append(ids) or False,
                            now=100.0) is None
    assert tracker.next_cut({a: _cp(8), b: _cp(7)}, [a, b], clean=lambda ids: seen.append(ids) or False,
                            now=101.0) is None
    assert seen == [{a: 8, b: 7}] * 2 and tracker.held_since == 100.0  # a handover between them: asked again
    assert tracker.next_cut({a: _cp(8), b: _cp(7)}, [a, b], clean=lambda ids: True)[a].file == "f8"
    assert tracker.held_since is None


def test_the_driver_writes_cuts_in_the_background_and_applies_retention(tmp_path, origin, durable_dir):
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [1, 2, 3])
    events = []
    durable = DurableCheckpoints(store, plan={"mode": "liverobin"}, run={"output_prefix": "r", "epoch_base": 0},
                                 retain=1, on_event=events.append)
    listed = []
    list_cuts = store.cut_numbers
    store.cut_numbers = lambda: listed.append(1) or list_cuts()  # one listing per cut written (S3: a LIST)
    try:
        durable.uploaded([(*INSTANCE, cid, f) for cid, f in files.items()])
        sinks = {(2, 0, "out"): [0, 0, 12, 345]}
        for cid in (1, 2, 3):
            assert durable.consider({INSTANCE: _cp(cid, origin.metas[cid].digest)}, [INSTANCE], sinks)
            assert durable.flush(10)
            assert len(listed) == cid and durable.oldest_kept == cid
        assert list_cuts() == [3] and durable.cuts_written == 3 and not events
        cut = store.read_cut(3)
        assert cut.sinks == {"2-0-out": [12, 345]} and cut.parts[INSTANCE].checkpoint_id == 3
        assert durable.status()["last_cut"] == 3
    finally:
        durable.close()


SHAPE = {"mode": "liverobin", "key_groups": 128, "channels": [[0, 0, 0, 1, 0]],
         "tasks": {"src": {"id": 0, "kind": "source", "parallelism": 1, "operators": ["src"]},
                   "count": {"id": 1, "kind": "keyed", "parallelism": 2, "operators": ["count", "sink"]}}}


def test_a_job_that_differs_from_its_checkpoints_is_told_what_differs():
    assert differences(SHAPE, SHAPE) == []
    other = json.loads(json.dumps(SHAPE))
    other["tasks"]["count"]["parallelism"] = 3
    other["tasks"]["count"]["operators"] = ["total", "sink"]
    other["mode"] = "kazoo"
    problems = differences(SHAPE, other)
    assert any("mode kazoo" in p for p in problems)
    assert any("task count: parallelism 3 here, 2 in the checkpoints" in p for p in problems)
    assert any("operators ['total', 'sink'] here" in p for p in problems)
    renamed = json.loads(json.dumps(SHAPE))
    renamed["tasks"]["counter"] = renamed["tasks"].pop("count")
    assert differences(SHAPE, renamed) == ["task count of the checkpoints is not in this job (its state would be lost)",
                                           "task counter is not in the checkpoints"]


def test_resume_point_uses_the_newest_complete_cut_refuses_a_mismatch_and_ignore_starts_empty(tmp_path, origin,
                                                                                             durable_dir):
    store = DurableStore(durable_dir, "job")
    files = _chain(store, origin, [1, 2])
    events: list[str] = []
    assert resume_point(store, SHAPE, ignore=False, on_event=events.append) is None  # increments, no cut
    assert store.instances() == []  # nothing a cut names: cleared
    files = _chain(store, origin, [3, 4])
    for n, cid in enumerate((3, 4), start=1):
        store.write_cut(DurableCut(n, "job", {INSTANCE: CutPart(cid, files[cid], origin.metas[cid].digest)},
                                   plan=SHAPE, written_at=1.0))
    store.fs.delete_file(f"{store.root}/increments/t2-p0/{files[4]}.inc")
    point = resume_point(store, SHAPE, ignore=False, on_event=events.append)
    assert point is not None and point.cut.number == 1
    assert any("cut 2 skipped" in e and "missing" in e for e in events)
    changed = {**SHAPE, "key_groups": 256}
    with pytest.raises(ValueError, match="256"):
        resume_point(store, changed, ignore=False, on_event=events.append)
    store.fs.delete_file(f"{store.root}/increments/t2-p0/{files[3]}.inc")
    with pytest.raises(ValueError, match="none of the 2 cuts"):
        resume_point(store, SHAPE, ignore=False, on_event=events.append)
    assert resume_point(store, SHAPE, ignore=True, on_event=events.append) is None
    assert store.cut_numbers() == [] and store.instances() == []


def test_the_uploader_asks_for_a_full_snapshot_once_the_deltas_since_the_last_add_up_to_it(tmp_path, origin):
    """A chain never restarted would grow without end: restored whole on a resume, never retained away."""
    store = DurableStore(str(tmp_path / "dir"), "job")
    uploader = IncrementUploader(store, tmp_path / "spool", lambda uploaded: None, lambda inst: None)
    try:
        origin.write(0, 200, b"a")
        assert uploader.offer(*origin.checkpoint(1, full=True)) and not uploader.wants_full(INSTANCE)
        origin.write(0, 20, b"b")  # a tenth of the keys
        assert uploader.offer(*origin.checkpoint(2)) and not uploader.wants_full(INSTANCE)
        for cid in range(3, 12):
            origin.write(0, 20, b"c%d" % cid)
            assert uploader.offer(*origin.checkpoint(cid))
        assert uploader.wants_full(INSTANCE)  # ten tenths: as much as the full snapshot
        assert uploader.offer(*origin.checkpoint(12, full=True)) and not uploader.wants_full(INSTANCE)
        assert uploader.wait_idle(10)
    finally:
        uploader.close()


def test_a_store_slower_than_the_checkpoints_keeps_the_spool_bounded(tmp_path, origin, monkeypatch):
    """Uploads slower than checkpoints: the queued deltas of a partition that add up to its full
    snapshot ask for a new one, which drops them from the queue; what is uploaded still chains."""
    store = DurableStore(str(tmp_path / "dir"), "job")
    real, started, release = store.upload, threading.Event(), threading.Event()

    def slow(meta, payload, previous, file=None):
        started.set()
        release.wait(10)
        return real(meta, payload, previous, file=file)

    monkeypatch.setattr(store, "upload", slow)
    uploaded = []
    uploader = IncrementUploader(store, tmp_path / "spool", uploaded.append, lambda inst: None)
    try:
        origin.write(0, 100, b"a")
        assert uploader.offer(*origin.checkpoint(1, full=True))
        assert started.wait(10)  # uploading (held back)
        origin.write(0, 100, b"b")
        assert uploader.offer(*origin.checkpoint(2, full=True))  # queued: the chain the next ones follow
        cid = 2
        while not uploader.wants_full(INSTANCE):
            cid += 1
            origin.write(0, 30, b"c%d" % cid)
            assert uploader.offer(*origin.checkpoint(cid))
            assert cid < 40, "the queued deltas never asked for a full snapshot"
        queued = len(list((tmp_path / "spool").iterdir()))
        assert queued == cid  # the one uploading, the queued full and its deltas
        origin.write(0, 5, b"d")
        assert uploader.offer(*origin.checkpoint(cid + 1, full=True))
        assert len(list((tmp_path / "spool").iterdir())) == 2  # the one uploading and the new full
        assert uploader.superseded == cid - 1 and not uploader.wants_full(INSTANCE)
        release.set()
        assert uploader.wait_idle(10)
        assert [u.meta.checkpoint_id for u in uploaded] == [1, cid + 1]
        assert not list((tmp_path / "spool").iterdir())
        assert _restored_content(store, uploaded[-1].file, tmp_path / "r")[1] == origin.contents[cid + 1]
    finally:
        release.set()
        uploader.close()


def test_a_job_that_differs_only_in_parallelism_resumes_through_a_savepoint_beside_its_checkpoints():
    other = json.loads(json.dumps(SHAPE))
    other["tasks"]["count"]["parallelism"] = 3
    other["channels"].append([1, 0, 0, 1, 2])
    assert parallelism_changes(SHAPE, other) == {"count": 2}
    assert parallelism_changes(SHAPE, SHAPE) is None
    renamed = json.loads(json.dumps(other))
    renamed["tasks"]["count"]["operators"] = ["total", "sink"]
    assert parallelism_changes(SHAPE, renamed) is None  # not only the parallelism
    source = json.loads(json.dumps(SHAPE))
    source["tasks"]["src"]["parallelism"] = 2
    assert parallelism_changes(SHAPE, source) is None  # a source follows its topic
    assert rescale_savepoint_dir("/shared/cp/", "job") == "/shared/cp/job.rescale-savepoint"
    assert rescale_savepoint_dir("file:///shared/cp", "job") == "file:///shared/cp/job.rescale-savepoint"
    assert (rescale_savepoint_dir("s3://bucket/cp?scheme=http&region=x", "job")
            == "s3://bucket/cp/job.rescale-savepoint?scheme=http&region=x")  # the query configures the store


def test_with_parallelism_copies_the_job_and_leaves_it_as_it_was():
    from replication.examples.ordered import build_ordered_job

    job = build_ordered_job("a", "b", "out", name="j", parallelism=3)
    old = with_parallelism(job, {"chain": 2})
    assert next(n for n in old.nodes if n.name == "chain").parallelism == 2
    assert next(n for n in job.nodes if n.name == "chain").parallelism == 3
    assert [n.name for n in old.nodes] == [n.name for n in job.nodes]
    assert all(e.source in old.nodes for n in old.nodes for e in n.inputs)  # edges point into the copy


def test_a_cut_says_where_a_resume_reads_each_order_log_from_and_the_driver_keeps_the_lowest(tmp_path):
    """A cut keeps each partition's order-log position (KaZoo) through its body; the store's floor
    is the lowest position over the cuts that read, None for a partition a cut does not say it of
    (a cut of an earlier build), and the driver counts the cut it has queued or is writing too."""
    a, b = (2, 0), (2, 1)
    cut = DurableCut(1, "job", {a: CutPart(5, "f5", "d", {1: 5}, {2: 5}, order_from=1200),
                                b: CutPart(7, "g7", "d", {1: 7}, {2: 7})})
    assert DurableCut.from_body(json.loads(json.dumps(cut.body()))) == cut
    store = DurableStore(str(tmp_path / "store"), "job")
    store.write_cut(cut)
    store.write_cut(dataclasses.replace(cut, number=2, parts={a: CutPart(9, "f9", "d", order_from=3400),
                                                              b: CutPart(9, "g9", "d", order_from=50)}))
    assert store.order_log_floor() == {a: 1200, b: None}
    durable = DurableCheckpoints(store, plan={}, run={}, retain=1)
    try:
        assert durable.order_log_floor() == {a: 1200, b: None}
        durable.uploaded([(*a, 11, "f11"), (*b, 11, "g11")])
        safe = {a: dataclasses.replace(_cp(11), order_from=900), b: dataclasses.replace(_cp(11), order_from=60)}
        assert durable.consider(safe, [a, b], {})  # queued, then written: it counts from the start
        assert durable.order_log_floor() == {a: 900, b: None}
        assert durable.flush(10) and store.cut_numbers() == [1, 2, 3]
        assert store.read_cut(3).parts[a].order_from == 900 and durable.order_log_floor() == {a: 900, b: None}
    finally:
        durable.close()
