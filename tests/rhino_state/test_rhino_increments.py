"""Rhino incremental checkpoints of the RocksDB backend: changed-key tracking, content digest, payloads."""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from rhino_state import (
    IncrementFormatError,
    IncrementMeta,
    IncrementWriter,
    RocksDBStateBackend,
    apply_increment,
    read_increment,
    verify_increment,
    write_increment,
)
from rhino_state.increments import EMPTY_DIGEST, digest_hex, pair_hash

INSTANCE = (3, 1)


def physical(key_group: int, rest: bytes) -> bytes:
    return key_group.to_bytes(2, "big") + rest


def rdict(path: str | Path) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return Rdict(str(path), options)


def rdict_items(db: Rdict) -> dict[bytes, bytes]:
    return {key: value for key, value in db.items() if len(key) >= 2}  # skip the checkpoint marker


def content_digest(content: dict[bytes, bytes]) -> str:
    return digest_hex(sum(pair_hash(key, value) for key, value in content.items()))


@contextmanager
def backend_at(cache_max: int = 10_000) -> Iterator[tuple[RocksDBStateBackend, Path]]:
    with tempfile.TemporaryDirectory() as tmp:
        backend = RocksDBStateBackend(Path(tmp) / "db", cache_max_entries=cache_max, instance=INSTANCE)
        try:
            yield backend, Path(tmp)
        finally:
            backend.close()


def test_changed_keys_tracked_across_flushes(tmp_path: Path) -> None:
    backend = RocksDBStateBackend(tmp_path / "db", cache_max_entries=2, instance=INSTANCE)
    assert backend.changed_count is None and backend.last_checkpoint_id is None
    for i in range(10):
        backend.put(1, bytes([i]), b"v%d" % i)
    first = backend.checkpoint(1, tmp_path / "c1")
    assert first.previous_id is None and first.full and first.changed_keys == 10
    assert backend.changed_count == 0 and backend.last_checkpoint_id == 1
    backend.put(1, b"\x00", b"new")  # flushed by the writes below (cache of 2)
    backend.put(2, b"a", b"x")
    backend.delete(1, b"\x05")
    backend.put(2, b"b", b"y")
    backend.put(1, b"\x00", b"newer")
    assert backend.stats()["flushes"] >= 2 and backend.changed_count == 4
    meta = backend.checkpoint(2, tmp_path / "c2")
    assert (meta.previous_id, meta.changed_keys, meta.full) == (1, 4, False)
    assert list(read_increment(tmp_path / "c2")) == [
        (physical(1, b"\x00"), b"newer"),
        (physical(1, b"\x05"), None),
        (physical(2, b"a"), b"x"),
        (physical(2, b"b"), b"y"),
    ]
    assert meta.digest == backend.digest()
    empty = backend.checkpoint(3, tmp_path / "c3")
    assert (empty.previous_id, empty.changed_keys, empty.digest) == (2, 0, meta.digest)
    assert list(read_increment(tmp_path / "c3")) == []
    backend.close()


def test_delete_then_reput_and_put_then_delete(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db", cache_max_entries=1, instance=INSTANCE) as backend:
        backend.put(0, b"a", b"1")
        backend.put(0, b"b", b"2")
        backend.checkpoint(10, tmp_path / "full")
        backend.delete(0, b"a")
        backend.flush()
        backend.put(0, b"a", b"again")  # deleted, flushed, re-put: ships the put
        backend.put(0, b"c", b"3")
        backend.flush()
        backend.delete(0, b"c")  # new key removed again: ships a tombstone (harmless)
        backend.delete(0, b"zz")  # deleting an absent key is a write too
        meta = backend.checkpoint(11, tmp_path / "delta")
        assert dict(read_increment(tmp_path / "delta")) == {
            physical(0, b"a"): b"again",
            physical(0, b"c"): None,
            physical(0, b"zz"): None,
        }
        assert (
            meta.digest
            == backend.digest()
            == content_digest({physical(0, b"a"): b"again", physical(0, b"b"): b"2"})
        )


def test_bytes_changed_and_shipped(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db", instance=INSTANCE) as backend:
        backend.put(7, b"key", b"value")  # physical key 5 bytes, value 5
        backend.put(7, b"gone", b"x")
        full = backend.checkpoint(1, tmp_path / "full")
        assert full.bytes_changed == (5 + 5) + (6 + 1)
        assert full.bytes_shipped == os.path.getsize(tmp_path / "full")
        backend.put(7, b"key", b"v2")
        backend.delete(7, b"gone")
        delta = backend.checkpoint(2, tmp_path / "delta", runtime=b"positions")
        assert delta.bytes_changed == (5 + 2) + 6  # a tombstone counts its key
        assert delta.bytes_shipped == os.path.getsize(tmp_path / "delta")
        # 10-byte header, 9-byte record headers, 17-byte end record, 16-byte checksum
        assert delta.bytes_shipped == 10 + 2 * 9 + delta.bytes_changed + 17 + 16
        assert delta.runtime == b"positions" and delta.instance == INSTANCE


def test_full_on_request_restarts_the_chain(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db", instance=INSTANCE) as backend:
        for i in range(5):
            backend.put(1, bytes([i]), b"x")
        backend.checkpoint(1, tmp_path / "c1")
        backend.put(1, b"\x00", b"y")
        full = backend.checkpoint(2, tmp_path / "c2", full=True)
        assert full.previous_id is None and full.changed_keys == 5
        assert len(list(read_increment(tmp_path / "c2"))) == 5
        assert full.digest == backend.digest()
        backend.put(1, b"\x01", b"z")
        delta = backend.checkpoint(3, tmp_path / "c3")
        assert delta.previous_id == 2 and delta.changed_keys == 1


def test_full_and_delta_of_equal_content_have_equal_digests(tmp_path: Path) -> None:
    with (
        RocksDBStateBackend(tmp_path / "a", cache_max_entries=3, instance=INSTANCE) as a,
        RocksDBStateBackend(tmp_path / "b", cache_max_entries=0, instance=INSTANCE) as b,
    ):
        for backend in (a, b):
            for i in range(20):
                backend.put(i % 3, b"k%d" % i, b"v%d" % i)
        a.checkpoint(1, tmp_path / "a1")
        b.checkpoint(1, tmp_path / "b1")
        for backend in (a, b):
            for i in range(0, 20, 4):
                backend.delete(i % 3, b"k%d" % i)
            backend.put(9, b"new", b"n")
        delta = a.checkpoint(2, tmp_path / "a2")
        full = b.checkpoint(2, tmp_path / "b2", full=True)
        assert (delta.previous_id, full.previous_id) == (1, None)
        assert delta.digest == full.digest == a.digest() == b.digest()


def test_checkpoint_marker_survives_reopen_only_without_later_writes(tmp_path: Path) -> None:
    path = tmp_path / "db"
    backend = RocksDBStateBackend(path, instance=INSTANCE)
    backend.put(0, b"a", b"1")
    meta = backend.checkpoint(4, tmp_path / "c4")
    backend.close()
    backend = RocksDBStateBackend(path, instance=INSTANCE)
    assert backend.last_checkpoint_id == 4 and backend.changed_count == 0
    backend.put(0, b"b", b"2")
    with pytest.raises(ValueError, match="must increase"):
        backend.checkpoint(4, tmp_path / "again")
    delta = backend.checkpoint(5, tmp_path / "c5")
    assert (delta.previous_id, delta.changed_keys) == (4, 1) and delta.digest != meta.digest
    backend.put(0, b"c", b"3")
    backend.close()  # flushes a change after checkpoint 5: the marker is gone
    backend = RocksDBStateBackend(path, instance=INSTANCE)
    assert backend.last_checkpoint_id is None and backend.changed_count is None
    assert backend.checkpoint(6, tmp_path / "c6").previous_id is None
    backend.close()


def test_checkpoint_needs_an_instance(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as backend:
        with pytest.raises(ValueError, match="instance"):
            backend.checkpoint(1, tmp_path / "c")


def test_empty_state(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db", instance=INSTANCE) as backend:
        meta = backend.checkpoint(0, tmp_path / "c0")
        assert meta.digest == backend.digest() == EMPTY_DIGEST
        assert meta.changed_keys == 0 and list(read_increment(tmp_path / "c0")) == []


# --------------------------------------------------------------------------- payload format


def test_payload_round_trip_with_large_values(tmp_path: Path) -> None:
    records = [
        (b"\x00\x00a", b"x" * (3 << 20)),
        (b"\x00\x00b", None),
        (b"\x00\x01", b""),
        (b"\xff\xff", b"y"),
    ]
    writer = write_increment(tmp_path / "p", records, full=False)
    assert writer.records == 4 and writer.bytes_shipped == os.path.getsize(tmp_path / "p")
    assert list(read_increment(tmp_path / "p")) == records
    assert verify_increment(tmp_path / "p") is False
    assert not os.path.exists(str(tmp_path / "p") + ".tmp")


def test_writer_rejects_unsorted_keys_and_tombstones_in_full(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ascending"):
        write_increment(tmp_path / "p", [(b"\x00\x02", b""), (b"\x00\x01", b"")], full=False)
    with pytest.raises(ValueError, match="tombstones"):
        write_increment(tmp_path / "p", [(b"\x00\x02", None)], full=True)
    assert os.listdir(tmp_path) == []  # nothing published, temporary file removed


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "magic"])
def test_corrupt_payload_is_detected_and_not_applied(tmp_path: Path, damage: str) -> None:
    records = [(physical(1, b"%04d" % i), b"value%d" % i) for i in range(200)]
    write_increment(tmp_path / "p", records, full=True)
    data = bytearray((tmp_path / "p").read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[:-20]
    elif damage == "extend":
        data += b"\x00"
    else:
        data[0:1] = b"X"
    (tmp_path / "p").write_bytes(bytes(data))
    with pytest.raises(IncrementFormatError):
        verify_increment(tmp_path / "p")
    db = rdict(tmp_path / "db")
    with pytest.raises(IncrementFormatError):
        apply_increment(db, tmp_path / "p")
    assert rdict_items(db) == {}
    db.close()


def test_apply_full_requires_an_empty_target(tmp_path: Path) -> None:
    write_increment(tmp_path / "p", [(b"\x00\x01x", b"1")], full=True)
    db = rdict(tmp_path / "db")
    db.put(b"\x00\x00", b"existing")
    with pytest.raises(ValueError, match="empty"):
        apply_increment(db, tmp_path / "p")
    db.close()
    with RocksDBStateBackend(tmp_path / "b") as backend:
        backend.put(0, b"", b"existing")
        with pytest.raises(ValueError, match="empty"):
            apply_increment(backend, tmp_path / "p")


def test_apply_to_a_backend_counts_as_writes(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "origin", instance=INSTANCE) as origin:
        origin.put(1, b"a", b"1")
        origin.put(2, b"b", b"2")
        full = origin.checkpoint(1, tmp_path / "c1")
        origin.delete(1, b"a")
        origin.put(3, b"c", b"3")
        delta = origin.checkpoint(2, tmp_path / "c2")
    with RocksDBStateBackend(tmp_path / "copy", cache_max_entries=1, instance=INSTANCE) as copy:
        assert apply_increment(copy, tmp_path / "c1") == 2
        assert copy.digest() == full.digest
        copy.checkpoint(1, tmp_path / "copy1")
        assert apply_increment(copy, tmp_path / "c2") == 2
        assert copy.changed_count == 2
        assert copy.checkpoint(2, tmp_path / "copy2").digest == delta.digest == copy.digest()


# --------------------------------------------------------------------------- properties

kgs = st.sampled_from([0, 1, 255, 65535])
rests = st.binary(max_size=2)
values = st.binary(max_size=5)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), kgs, rests, values),
        st.tuples(st.just("delete"), kgs, rests),
        st.tuples(st.just("flush")),
        st.tuples(st.just("checkpoint"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, cache_max=st.sampled_from([0, 1, 3, 100]))
def test_replaying_the_chain_reproduces_every_checkpoint(ops: list[tuple], cache_max: int) -> None:
    """Applying the increments in order to an empty RocksDB gives the backend's content at each checkpoint."""
    model: dict[bytes, bytes] = {}
    with backend_at(cache_max) as (backend, tmp):
        replica = rdict(tmp / "replica")
        checkpoint_id = 0
        previous = None
        try:
            for op in [*ops, ("checkpoint", False)]:
                if op[0] == "put":
                    backend.put(op[1], op[2], op[3])
                    model[physical(op[1], op[2])] = op[3]
                elif op[0] == "delete":
                    backend.delete(op[1], op[2])
                    model.pop(physical(op[1], op[2]), None)
                elif op[0] == "flush":
                    backend.flush()
                else:
                    checkpoint_id += 1
                    payload = tmp / f"inc-{checkpoint_id}"
                    meta = backend.checkpoint(checkpoint_id, payload, full=op[1])
                    assert meta.checkpoint_id == checkpoint_id
                    if op[1] or previous is None:
                        assert meta.previous_id is None
                        replica.close()
                        Rdict.destroy(str(tmp / "replica"))
                        replica = rdict(tmp / "replica")
                    else:
                        assert meta.previous_id == previous
                    apply_increment(replica, payload)
                    assert rdict_items(replica) == model
                    assert meta.digest == backend.digest() == content_digest(model)
                    assert meta.bytes_shipped == os.path.getsize(payload)
                    previous = checkpoint_id
        finally:
            replica.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    content=st.dictionaries(st.tuples(kgs, rests), values, max_size=12),
    noise=st.dictionaries(st.tuples(kgs, rests), values, max_size=12),
    seed=st.integers(0, 2**16),
    caches=st.tuples(st.sampled_from([0, 1, 4, 100]), st.sampled_from([0, 1, 4, 100])),
)
def test_digest_depends_only_on_content(
    content: dict, noise: dict, seed: int, caches: tuple[int, int]
) -> None:
    """Different histories (extra keys written and deleted, overwrites, flush points, checkpoint
    boundaries, full or delta) reaching the same content give the same checkpoint digest."""
    rng = random.Random(seed)
    digests = []
    with backend_at(caches[0]) as (a, tmp_a), backend_at(caches[1]) as (b, tmp_b):
        for backend, tmp, history in ((a, tmp_a, 0), (b, tmp_b, 1)):
            if history == 0:
                for (kg, rest), value in content.items():
                    backend.put(kg, rest, value)
                digests.append(backend.checkpoint(1, tmp / "only").digest)
                continue
            backend.checkpoint(1, tmp / "empty")
            for (kg, rest), value in noise.items():
                backend.put(kg, rest, value + b"~")
                if rng.random() < 0.3:
                    backend.flush()
            backend.checkpoint(2, tmp / "noise")
            items = list(content.items())
            rng.shuffle(items)
            for (kg, rest), value in items:
                backend.put(kg, rest, value)
                if rng.random() < 0.3:
                    backend.flush()
            for kg, rest in noise:
                if (kg, rest) not in content:
                    backend.delete(kg, rest)
            digests.append(backend.checkpoint(3, tmp / "final", full=rng.random() < 0.5).digest)
        assert digests[0] == digests[1] == a.digest() == b.digest()


def test_meta_is_frozen() -> None:
    meta = IncrementMeta(INSTANCE, 1, None, EMPTY_DIGEST)
    assert meta.full
    with pytest.raises(AttributeError):
        meta.digest = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------- measurement


def test_delta_ships_only_the_changed_keys(tmp_path: Path) -> None:
    """10^5 keys, 1% changed: the delta ships about the changed bytes, the full snapshot the state."""
    n = 100_000
    value = b"v" * 64
    with RocksDBStateBackend(tmp_path / "db", instance=INSTANCE) as backend:
        for i in range(n):
            backend.put(i % 4096, i.to_bytes(4, "big"), value)
        started = time.perf_counter()
        full = backend.checkpoint(1, tmp_path / "full")
        full_s = time.perf_counter() - started
        rng = random.Random(7)
        for i in rng.sample(range(n), n // 100):
            backend.put(i % 4096, i.to_bytes(4, "big"), b"w" * 64)
        started = time.perf_counter()
        delta = backend.checkpoint(2, tmp_path / "delta")
        delta_s = time.perf_counter() - started
        started = time.perf_counter()
        assert backend.digest() == delta.digest
        scan_s = time.perf_counter() - started
    print(
        f"\nfull: {full.changed_keys} keys, {full.bytes_shipped} B shipped, {full_s * 1e3:.0f} ms; "
        f"delta: {delta.changed_keys} keys, {delta.bytes_changed} B changed, {delta.bytes_shipped} B shipped "
        f"({delta.bytes_shipped / full.bytes_shipped:.2%} of full), {delta_s * 1e3:.1f} ms; "
        f"full-scan digest {scan_s * 1e3:.0f} ms"
    )
    assert delta.changed_keys == n // 100
    assert delta.bytes_shipped <= delta.bytes_changed + 9 * delta.changed_keys + 64
    assert delta.bytes_shipped < full.bytes_shipped / 50


def test_writer_context_manager_aborts_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with IncrementWriter(tmp_path / "p", full=False) as writer:
            writer.add(b"\x00\x00", b"x")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
