"""Sliding and session windows, allowed lateness, the built-in aggregators and KeyedStream.reduce,
driven by a fake hosting instance over a real RocksDB; each window's output equals a plain-Python
reference of the same input."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.aggregators import Count, Max, Min, Reduce, Sum
from replication.api import Job, JobDefinitionError, _RunningReduce
from replication.functions import Aggregator
from replication.runtime.elements import MAX_WATERMARK
from replication.runtime.operators import ProcessOperator
from replication.runtime.windows import SessionWindowOperator, WindowOperator, serves_through_moves
from replication.windowing import Windows
from rhino_state import RocksDBStateBackend, encode_key
from tests.runtime.test_operators import FakeEnv, chain, rec

_uids = itertools.count()


@pytest.fixture(scope="module")
def shared_backend(tmp_path_factory):
    with RocksDBStateBackend(tmp_path_factory.mktemp("windows")) as b:
        yield b


@pytest.fixture
def backend(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        yield b


def run(backend, windows: Windows, events, agg=None) -> tuple[list[tuple], FakeEnv]:
    """Feed ("rec", key, ts, value) / ("wm", ts) events, then the max watermark; the results as
    (key, start, end, value)."""
    env = FakeEnv(backend)
    cls = SessionWindowOperator if windows.sessions else WindowOperator
    op = cls(f"w{next(_uids)}", env, windows, agg or Sum())
    out = chain(op)
    for ev in events:
        if ev[0] == "rec":
            op.process(rec(ev[3], key=ev[1], ts=ev[2]))
        else:
            op.on_watermark(ev[1])
    op.on_watermark(MAX_WATERMARK)
    return [(r[1]["key"], r[1]["start"], r[1]["end"], r[1]["value"]) for r in out.records], env


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 30), slide=st.integers(1, 30), ts=st.integers(-100, 100))
def test_a_record_belongs_to_every_aligned_window_that_holds_it(size, slide, ts):
    if slide > size:
        with pytest.raises(ValueError, match="longer than its size"):
            Windows.sliding(size, slide)
        return
    expected = [s for s in range(-200, 201) if s % slide == 0 and s <= ts < s + size]
    assert Windows.sliding(size, slide).starts(ts) == expected


RECORDS = st.lists(st.tuples(st.sampled_from(["a", "b", 7]), st.integers(-30, 200), st.integers(0, 9)), max_size=50)


@settings(max_examples=50, deadline=None)
@given(size_slide=st.sampled_from([(10, 10), (10, 5), (12, 4), (30, 7)]), records=RECORDS, data=st.data())
def test_sliding_window_output_equals_a_group_by_over_each_window(shared_backend, size_slide, records, data):
    size, slide = size_slide
    shuffled = data.draw(st.permutations(records))
    got, env = run(shared_backend, Windows.sliding(size, slide), [("rec", k, ts, v) for k, ts, v in shuffled])
    sums: dict = defaultdict(int)
    for key, ts, value in records:
        for start in range(-300, 300):
            if start % slide == 0 and start <= ts < start + size:
                sums[(key, start)] += value
    assert Counter(got) == Counter((k, s, s + size, v) for (k, s), v in sums.items())
    assert [(r[2], encode_key(r[0])) for r in got] == sorted((r[2], encode_key(r[0])) for r in got)
    assert env.dead_letters == []


def sessions_of(records, gap):
    """Reference: per key, the union of the intervals [ts, ts + gap), with the sum of their values."""
    out = []
    by_key = defaultdict(list)
    for key, ts, value in records:
        by_key[key].append((ts, value))
    for key, events in by_key.items():
        events.sort()
        start, end, total = events[0][0], events[0][0] + gap, 0
        for ts, value in events:
            if ts >= end:
                out.append((key, start, end, total))
                start, total = ts, 0
            end = max(end, ts + gap)
            total += value
        out.append((key, start, end, total))
    return Counter(out)


@settings(max_examples=50, deadline=None)
@given(gap=st.sampled_from([1, 5, 20]), records=RECORDS, data=st.data())
def test_session_window_output_equals_merged_intervals_whatever_the_order(shared_backend, gap, records, data):
    shuffled = data.draw(st.permutations(records))
    got, env = run(shared_backend, Windows.session(gap), [("rec", k, ts, v) for k, ts, v in shuffled])
    assert Counter(got) == sessions_of(records, gap)
    assert env.dead_letters == []


@settings(max_examples=40, deadline=None)
@given(gap=st.sampled_from([3, 10]), records=RECORDS)
def test_sessions_fire_as_the_watermark_passes_them_on_in_order_input(shared_backend, gap, records):
    """Records in event-time order with the watermark just behind them: nothing is late, and each
    session comes out once the watermark passes its end, exactly as the reference merges them."""
    events = []
    for key, ts, value in sorted(records, key=lambda r: r[1]):
        events += [("rec", key, ts, value), ("wm", ts - 1)]
    got, env = run(shared_backend, Windows.session(gap), events)
    assert Counter(got) == sessions_of(records, gap) and env.dead_letters == []


def test_allowed_lateness_updates_a_fired_window_then_drops_what_comes_later(backend):
    got, env = run(backend, Windows.tumbling(10, allowed_lateness_ms=5), [
        ("rec", "k", 3, 1), ("wm", 10),  # [0, 10) fires: 1
        ("rec", "k", 4, 2),  # late but within the lateness: the update, 3
        ("wm", 14), ("rec", "k", 5, 4),  # still within: 7
        ("wm", 15), ("rec", "k", 6, 8),  # the window's state is gone: late
        ("rec", "k", 12, 1),
    ])
    assert got == [("k", 0, 10, 1), ("k", 0, 10, 3), ("k", 0, 10, 7), ("k", 10, 20, 1)]
    assert len(env.dead_letters) == 1 and "late" in env.dead_letters[0]["reason"]
    assert env.metrics.late_records == 1


def test_a_late_session_record_within_the_lateness_updates_or_extends_its_session(backend):
    got, env = run(backend, Windows.session(5, allowed_lateness_ms=10), [
        ("rec", "k", 0, 1), ("wm", 6),  # [0, 5) fires: 1
        ("rec", "k", 3, 2),  # joins it: [0, 8) = 3 (end 8 > 6: fires again later)
        ("wm", 30), ("rec", "k", 1, 4),  # [0, 8) was cleaned at 18: late
    ])
    assert got == [("k", 0, 5, 1), ("k", 0, 8, 3)]
    assert len(env.dead_letters) == 1


def test_window_state_is_removed_after_the_lateness(backend):
    env = FakeEnv(backend)
    op = WindowOperator("w", env, Windows.sliding(10, 5, allowed_lateness_ms=3), Count())
    chain(op)
    for ts in (1, 7, 12):
        op.process(rec(None, key="k", ts=ts))
    op.on_watermark(100)
    op.state.set_current_key("k")
    assert op.windows.is_empty() and op.fire_index.due == {} and op.cleanup_index.due == {}


def test_snapshot_and_restore_keep_both_indexes(backend):
    env = FakeEnv(backend)
    op = WindowOperator("w", env, Windows.tumbling(10, allowed_lateness_ms=20), Count())
    out = chain(op)
    op.process(rec(None, key="k", ts=1))
    op.process(rec(None, key="k", ts=11))
    op.on_watermark(10)
    snapshot = op.snapshot()
    again = WindowOperator("w", env, Windows.tumbling(10, allowed_lateness_ms=20), Count())
    again.restore(snapshot)
    out2 = chain(again)
    again.process(rec(None, key="k", ts=2))  # within the lateness of [0, 10)
    again.on_watermark(MAX_WATERMARK)
    assert [r[1]["value"] for r in out.records] == [1]
    assert [(r[1]["start"], r[1]["value"]) for r in out2.records] == [(0, 2), (10, 1)]


def test_only_merging_fixed_windows_without_lateness_serve_moved_keys(backend):
    env = FakeEnv(backend)
    assert serves_through_moves([WindowOperator("a", env, Windows.sliding(10, 5), Sum())])
    assert not serves_through_moves([WindowOperator("b", env, Windows.tumbling(10, 5), Sum())])
    assert not serves_through_moves([SessionWindowOperator("c", env, Windows.session(5), Sum())])


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.integers(-50, 50), max_size=8), b=st.lists(st.integers(-50, 50), max_size=8))
def test_built_in_aggregators_merge_as_if_they_had_added_everything(a, b):
    for agg, expected in ((Count(), len(a + b)), (Sum(), sum(a + b)), (Min(), min(a + b, default=None)),
                          (Max(), max(a + b, default=None)),
                          (Reduce(lambda x, y: x + y), sum(a + b) if a + b else None)):
        def fold(values, agg=agg):
            acc = agg.create()
            for v in values:
                acc = agg.add(acc, v)
            return acc
        merged = agg.merge(fold(a), fold(b))
        assert merged == fold(a + b)
        assert agg.result("k", 0, 10, merged)["value"] == expected


def test_sum_min_max_take_a_field_and_reduce_keeps_the_first_of_a_window(backend):
    got, _ = run(backend, Windows.tumbling(10), [("rec", "k", 1, {"n": 3}), ("rec", "k", 2, {"n": 5})],
                 agg=Max(lambda p: p["n"]))
    assert got == [("k", 0, 10, 5)]
    got, _ = run(backend, Windows.tumbling(10), [("rec", "k", 1, "x"), ("rec", "k", 2, "y")],
                 agg=Reduce(lambda x, y: x + y))
    assert got == [("k", 0, 10, "xy")]


def test_keyed_reduce_emits_the_running_result_per_key(backend):
    op = ProcessOperator("r", FakeEnv(backend), _RunningReduce(lambda acc, v: acc + v))
    out = chain(op)
    for key, v in [("a", 1), ("b", 10), ("a", 2), ("a", 3), ("b", 5)]:
        op.process(rec(v, key=key, ts=0))
    assert out.values == [1, 10, 3, 6, 15]


def test_window_api_refuses_bad_sizes_and_sessions_without_merge_before_start():
    class NoMerge(Count):
        merge = Aggregator.merge  # not overridden: no merge

    keyed = Job("j").source("t").key_by(lambda v: v)
    for call, match in [(lambda: keyed.window(10, Count(), slide_ms=20), "longer than its size"),
                        (lambda: keyed.window(0, Count()), "positive int"),
                        (lambda: keyed.window(10, Count(), allowed_lateness_ms=-1), "non-negative"),
                        (lambda: keyed.session_window(5, NoMerge(), name="s"), "must define merge"),
                        (lambda: keyed.reduce("x"), "callable")]:
        with pytest.raises(JobDefinitionError, match=match):
            call()
    assert keyed.session_window(5, Count()).node.spec["windows"] == Windows.session(5)
