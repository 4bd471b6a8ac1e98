"""Keyed timers in the state backend (rhino_state.timers): fired in (ts, key group, key) order,
whatever was flushed, deleted or reloaded; the in-memory bounds rebuilt from the backend."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhino_state import RocksDBStateBackend
from rhino_state.timers import TS_MAX, TS_MIN, TimerQueue, decode_ts, encode_ts

G = 64
QID = b"TMRS"


def part(key: bytes) -> bytes:
    return len(key).to_bytes(4, "big") + key


def drain(q: TimerQueue, limit: int) -> list[tuple[int, int, bytes]]:
    out = []
    while (due := q.pop_due(limit)) is not None:
        out.append(due)
    return out


@pytest.fixture
def backend(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        yield b


def test_timestamps_encode_in_signed_order():
    values = [TS_MIN, -5, -1, 0, 1, 7, TS_MAX]
    assert sorted(values, key=encode_ts) == values
    assert [decode_ts(encode_ts(v)) for v in values] == values
    for bad in (TS_MAX + 1, 1.5, "3", True):
        with pytest.raises(ValueError, match="signed 64-bit"):
            encode_ts(bad)


def test_timers_fire_in_timestamp_key_group_key_order_up_to_the_limit(backend):
    q = TimerQueue(backend, QID, G)
    for kg, key, ts in [(5, b"b", 20), (3, b"a", 20), (5, b"a", 20), (9, b"z", 10), (1, b"q", 30)]:
        q.register(kg, part(key), ts)
    q.register(5, part(b"a"), 20)  # again: one timer
    assert drain(q, 20) == [(10, 9, part(b"z")), (20, 3, part(b"a")), (20, 5, part(b"a")), (20, 5, part(b"b"))]
    assert q.next_timestamp() == 30 and drain(q, 29) == []
    assert drain(q, 30) == [(30, 1, part(b"q"))]
    assert q.next_timestamp() is None and list(backend.iter_key_groups(range(G))) == []


def test_timers_of_some_key_groups_fire_alone_and_the_others_stay_due(backend):
    q = TimerQueue(backend, QID, G)
    for kg, key, ts in [(5, b"b", 20), (3, b"a", 10), (5, b"a", 20), (9, b"z", 5), (5, b"c", 40)]:
        q.register(kg, part(key), ts)
    only = []
    while (due := q.pop_due(30, frozenset({5, 7}))) is not None:
        only.append(due)
    assert only == [(20, 5, part(b"a")), (20, 5, part(b"b"))]
    q.register(5, part(b"d"), 20)  # its bound set again at the value a stale heap entry has
    assert drain(q, 30) == [(5, 9, part(b"z")), (10, 3, part(b"a")), (20, 5, part(b"d"))]
    assert drain(q, 40) == [(40, 5, part(b"c"))] and q.next_timestamp() is None


def test_a_deleted_timer_does_not_fire_and_a_low_bound_is_corrected(backend):
    q = TimerQueue(backend, QID, G)
    q.register(2, part(b"k"), 5)
    q.register(2, part(b"k"), 50)
    q.delete(2, part(b"k"), 5)
    q.delete(2, part(b"k"), 6)  # none there: a no-op
    assert q.timers_of(2, part(b"k")) == [50]
    assert drain(q, 40) == []
    assert drain(q, 50) == [(50, 2, part(b"k"))]


def test_load_rebuilds_the_bounds_from_the_backend_and_forget_drops_key_groups(backend):
    q = TimerQueue(backend, QID, G)
    for kg in (0, 7, G - 1):
        q.register(kg, part(b"x"), 100 + kg)
    backend.put(7, b"OTHR" + b"\x00" * 8, b"v")  # another state's entry is no timer
    fresh = TimerQueue(backend, QID, G)  # a restored replica: only the backend is known
    assert fresh.next_timestamp() is None
    fresh.load()
    assert fresh.tracked_key_groups() == [0, 7, G - 1]
    fresh.forget([7])
    assert drain(fresh, 10**6) == [(100, 0, part(b"x")), (100 + G - 1, G - 1, part(b"x"))]
    fresh.load([7])  # its state came back
    assert drain(fresh, 10**6) == [(107, 7, part(b"x"))]


ops = st.lists(st.one_of(
    st.tuples(st.just("reg"), st.integers(0, G - 1), st.sampled_from([b"a", b"bb", b"c"]), st.integers(-20, 60)),
    st.tuples(st.just("del"), st.integers(0, G - 1), st.sampled_from([b"a", b"bb", b"c"]), st.integers(-20, 60)),
    st.tuples(st.just("fire"), st.integers(-20, 70)),
    st.tuples(st.just("flush"),),
    st.tuples(st.just("reload"),),
), max_size=60)


@settings(max_examples=60, deadline=None)
@given(script=ops)
def test_firing_equals_a_sorted_set_model_whatever_is_flushed_or_reloaded(tmp_path_factory, script):
    with RocksDBStateBackend(tmp_path_factory.mktemp("q")) as backend:
        q = TimerQueue(backend, QID, G)
        model: set[tuple[int, int, bytes]] = set()
        for step in script:
            if step[0] == "reg":
                _, kg, key, ts = step
                q.register(kg, part(key), ts)
                model.add((ts, kg, part(key)))
            elif step[0] == "del":
                _, kg, key, ts = step
                q.delete(kg, part(key), ts)
                model.discard((ts, kg, part(key)))
            elif step[0] == "fire":
                due = sorted(t for t in model if t[0] <= step[1])
                assert drain(q, step[1]) == due
                model -= set(due)
            elif step[0] == "flush":
                backend.flush()
            else:
                q = TimerQueue(backend, QID, G)
                q.load()
        assert drain(q, TS_MAX) == sorted(model)


def test_learn_takes_the_bounds_of_moved_key_groups_from_their_entries(tmp_path):
    """A handover target learns the moved key groups' timers from the entries it loaded, as
    :meth:`TimerQueue.load` would from the backend, and fires them in the same order."""
    with RocksDBStateBackend(tmp_path / "o") as ob, RocksDBStateBackend(tmp_path / "t") as tb:
        origin = TimerQueue(ob, QID, G)
        for kg, key, ts in [(3, b"b", 40), (3, b"a", 20), (9, b"z", 10), (9, b"y", 70)]:
            origin.register(kg, part(key), ts)
        ob.put(3, b"OTHR" + b"\x00" * 8, b"v")  # another state's entry is no timer
        entries = list(ob.iter_key_groups(range(G)))
        for kg, rest, value in entries:
            tb.put(kg, rest, value)
        target = TimerQueue(tb, QID, G)
        target.register(5, part(b"own"), 30)
        target.learn(entries)
        assert target.tracked_key_groups() == [3, 5, 9]
        assert drain(target, 10**6) == [(10, 9, part(b"z")), (20, 3, part(b"a")), (30, 5, part(b"own")),
                                        (40, 3, part(b"b")), (70, 9, part(b"y"))]
