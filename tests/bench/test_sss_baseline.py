"""The Spark Structured Streaming baseline (bench/sss.py): offset planning over several topics, the
hash chain job's per-key step and ordering rule, the output checks and the fault statistics as pure
functions (no Spark), plus one fault-free run per job logic on the embedded stack (slow, integration)."""

from __future__ import annotations

import itertools
import json
import math
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.sss import (  # noqa: E402
    CHAIN_STREAMS,
    OutRecord,
    account,
    chain_checks,
    chain_frame,
    chain_per_key,
    fault_stats,
    input_topics,
    is_exact,
    offsets_from_json,
    offsets_to_json,
    order_events,
    ordering_stream,
    out_record,
    per_second,
    percentile,
    plan_end_offsets,
    plan_ranges,
    retried_spans,
    subscribed_topics,
)
from replication.examples.ordered import HashChain, chain_step, make_events, verify_chains  # noqa: E402
from replication.functions import ProcessContext, RuntimeContext  # noqa: E402

# --------------------------------------------------------------------------- offsets over several topics


def test_offsets_round_trip_as_json_able_nested_string_keys():
    js = offsets_to_json({("b", 1): 7, ("a", 1): 0, ("a", 0): 3})
    assert js == {"a": {"0": 3, "1": 0}, "b": {"1": 7}}
    assert list(js) == ["a", "b"] and list(js["a"]) == ["0", "1"]
    assert json.loads(json.dumps(js)) == js
    assert offsets_from_json(js) == {("a", 0): 3, ("a", 1): 0, ("b", 1): 7}


def test_subscribe_option_lists_topics_in_order_without_blanks_or_repeats():
    assert subscribed_topics("x-a, x-b,,x-a ") == ["x-a", "x-b"]
    with pytest.raises(ValueError, match="no topic"):
        subscribed_topics(" , ")


def test_end_offsets_take_everything_available_and_never_go_back():
    start = {"a": {"0": 5, "1": 10}, "b": {"0": 0}}
    assert plan_end_offsets(start, {("a", 0): 9, ("a", 1): 10, ("b", 0): 4}) == \
        {"a": {"0": 9, "1": 10}, "b": {"0": 4}}
    # a stale view (fetch behind the start) keeps the start: offsets never move backwards
    assert plan_end_offsets(start, {("a", 0): 3, ("a", 1): 10, ("b", 0): 0}) == start
    # a partition the view does not know yet stays where it is
    assert plan_end_offsets(start, {("b", 0): 6}) == {"a": {"0": 5, "1": 10}, "b": {"0": 6}}


def test_end_offsets_add_new_topic_partitions_from_zero():
    assert plan_end_offsets({"a": {"0": 2}}, {("a", 0): 2, ("a", 1): 5, ("b", 0): 1}) == \
        {"a": {"0": 2, "1": 5}, "b": {"0": 1}}


def test_end_offsets_respect_max_rows_in_proportion_to_backlog_across_topics():
    start = {"a": {"0": 0, "1": 100}, "b": {"0": 50}}
    end = plan_end_offsets(start, {("a", 0): 60, ("a", 1): 130, ("b", 0): 60}, max_rows=50)  # 60, 30, 10
    taken = {tp: o - offsets_from_json(start)[tp] for tp, o in offsets_from_json(end).items()}
    assert taken == {("a", 0): 30, ("a", 1): 15, ("b", 0): 5}
    # a limit above the backlog changes nothing; zero takes nothing
    assert plan_end_offsets(start, {("a", 0): 1, ("a", 1): 101, ("b", 0): 51}, max_rows=10) == \
        {"a": {"0": 1, "1": 101}, "b": {"0": 51}}
    assert plan_end_offsets(start, {("a", 0): 60, ("a", 1): 130, ("b", 0): 60}, max_rows=0) == start


def test_end_offsets_max_rows_distributes_remainders_exactly():
    start = {"a": {"0": 0, "1": 0}, "b": {"0": 0}}
    end = offsets_from_json(plan_end_offsets(start, {("a", 0): 1, ("a", 1): 1, ("b", 0): 1}, max_rows=2))
    assert sum(end.values()) == 2 and all(v in (0, 1) for v in end.values())


def test_ranges_cover_only_topic_partitions_with_records():
    start = {"a": {"0": 5, "1": 10}, "b": {"0": 0}}
    assert plan_ranges(start, {"a": {"0": 9, "1": 10}, "b": {"0": 4}}) == [("a", 0, 5, 9), ("b", 0, 0, 4)]
    assert plan_ranges({"a": {"0": 5}}, {"a": {"0": 5}}) == []
    assert plan_ranges({}, {"b": {"1": 3}}) == [("b", 1, 0, 3)]  # unknown start: from 0
    with pytest.raises(ValueError, match="behind"):
        plan_ranges({"a": {"0": 5}}, {"a": {"0": 4}})


def test_ranges_tile_both_topics_across_consecutive_batches():
    """Consecutive (start, end) pairs, as Spark chains them, read every offset of every topic exactly once."""
    tps = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    views = [{("a", 0): 3}, {("a", 0): 3, ("b", 1): 2}, {("a", 0): 8, ("a", 1): 1, ("b", 1): 2},
             {("a", 0): 8, ("a", 1): 4, ("b", 0): 6, ("b", 1): 9}]
    start = offsets_to_json(dict.fromkeys(tps, 0))
    read: dict[tuple[str, int], list[int]] = {tp: [] for tp in tps}
    for view in views:
        end = plan_end_offsets(start, view)
        for t, p, s, e in plan_ranges(start, end):
            read[(t, p)].extend(range(s, e))
        start = end
    assert read == {("a", 0): list(range(8)), ("a", 1): list(range(4)), ("b", 0): list(range(6)),
                    ("b", 1): list(range(9))}


# --------------------------------------------------------------------------- chain job: input, order, step


def test_chain_input_is_two_topics_of_two_partitions_fed_two_to_one():
    assert input_topics("chain", "p-", 5) == {"p-a": 2, "p-b": 2}
    assert input_topics("count", "p-", 3) == {"p-in": 3}
    assert sorted(CHAIN_STREAMS) == ["a", "a", "b"]
    with pytest.raises(ValueError):
        input_topics("sum", "p-", 3)


def test_ordering_stream_makes_bench_ordering_events():
    produced: dict = {}
    make_a, make_b = ordering_stream("a", 3, produced), ordering_stream("b", 3, produced)
    made = [make_a(1000), make_a(1000), make_b(1001), make_a(1002), make_a(1003)]
    assert [m[2] for m in made] == ["a-0", "a-1", "b-0", "a-2", "a-3"]
    assert [m[0] for m in made] == [b"k0", b"k1", b"k0", b"k2", b"k0"]
    assert json.loads(made[4][1]) == {"id": "a-3", "key": "k0", "ts": 1003}  # ts: the producer's clock
    # the bytes make_events itself writes for that event at that time
    assert made[4][:2] == make_events("a", 1, 3, start_ts=1003 - 3, first=3)[0]
    assert produced["b-0"] == ("k0", 1001, None) and len(produced) == 5


def _events(rows: list[tuple[str, int, str, int, int]]) -> pd.DataFrame:
    """(id, ts, topic, partition, offset) rows of one key as the stateful function gets them."""
    return pd.DataFrame({"id": [r[0] for r in rows], "key": "k0", "ts": [r[1] for r in rows],
                         "topic": [r[2] for r in rows], "partition": [r[3] for r in rows],
                         "offset": [r[4] for r in rows]})


def test_order_events_merges_sources_by_ts_then_topic_partition_offset():
    ev = _events([("a-4", 20, "a", 0, 7), ("b-1", 15, "b", 1, 3), ("a-5", 20, "a", 1, 2),
                  ("b-2", 20, "b", 0, 9), ("a-3", 10, "a", 0, 6)])
    assert list(order_events(ev)["id"]) == ["a-3", "b-1", "a-4", "a-5", "b-2"]


def test_order_events_never_reorders_a_source_partition():
    # a[0] goes back in time at offset 1: a plain sort by ts would put a-1 before a-0
    ev = _events([("a-0", 10, "a", 0, 0), ("a-1", 5, "a", 0, 1), ("b-0", 7, "b", 0, 0),
                  ("a-2", 12, "a", 0, 2)])
    assert list(order_events(ev)["id"]) == ["b-0", "a-0", "a-1", "a-2"]


def test_order_events_does_not_depend_on_the_rows_arrival_order():
    ev = _events([("a-0", 1, "a", 0, 0), ("a-1", 3, "a", 0, 1), ("b-0", 3, "b", 1, 0), ("b-1", 2, "b", 1, 1),
                  ("a-9", 3, "a", 1, 4)])
    want = list(order_events(ev)["id"])
    for perm in itertools.permutations(range(len(ev))):
        assert list(order_events(ev.iloc[list(perm)])["id"]) == want


class _Value:
    def __init__(self, default):
        self.v = default

    def value(self):
        return self.v

    def update(self, v):
        self.v = v


class _OneKeyState:
    """The keyed state of one key, for HashChain outside the runtime."""

    def value_state(self, name, default=None, ttl=None):
        return _Value(default)


def _hash_chain(key: str, ids: list[str], ts: list[int]) -> list[dict]:
    fn = HashChain()
    fn.open(RuntimeContext(_OneKeyState(), "chain", 0, 1))
    ctx = ProcessContext()
    ctx.key = key
    return [rec for i, t in zip(ids, ts, strict=True)
            for rec in fn.process({"id": i, "key": key, "ts": t}, ctx)]


def test_chain_frame_is_hash_chain_on_a_frame():
    ev = _events([("a-0", 1, "a", 0, 0), ("b-0", 2, "b", 0, 0), ("a-1", 3, "a", 0, 1)])
    out, head, n = chain_frame("k0", ev, "", 0)
    want = _hash_chain("k0", list(ev["id"]), list(ev["ts"]))
    assert out.to_dict("records") == want
    assert list(out.columns) == ["key", "n", "id", "prev", "h", "ts"]
    assert (head, n) == (want[-1]["h"], 3)


def test_chain_frame_continues_the_chain_from_the_state():
    ev = _events([(f"a-{i}", i, "a", 0, i) for i in range(5)])
    whole, head, n = chain_frame("k0", ev, "", 0)
    first, h1, n1 = chain_frame("k0", ev.iloc[:2], "", 0)
    second, h2, n2 = chain_frame("k0", ev.iloc[2:], h1, n1)
    assert pd.concat([first, second], ignore_index=True).to_dict("records") == whole.to_dict("records")
    assert (h2, n2) == (head, n) == (whole["h"].iloc[-1], 5)
    assert second["prev"].iloc[0] == chain_step(chain_step("", "a-0"), "a-1")
    empty, h, k = chain_frame("k0", ev.iloc[:0], "abc", 7)
    assert len(empty) == 0 and (h, k) == ("abc", 7)


class _GroupState:
    """applyInPandasWithState's GroupState, as far as the stateful functions use it."""

    def __init__(self, value=None):
        self.value = value
        self.updates = 0

    @property
    def exists(self):
        return self.value is not None

    @property
    def get(self):
        return self.value

    def update(self, value):
        self.value = tuple(value)
        self.updates += 1


def test_chain_per_key_orders_each_batch_and_keeps_head_and_count_in_state():
    state = _GroupState()
    batch1 = [_events([("b-0", 2, "b", 1, 0)]), _events([]), _events([("a-0", 1, "a", 0, 0)])]
    batch2 = [_events([("a-1", 4, "a", 0, 1), ("b-1", 3, "b", 1, 1)])]
    out = [r for b in (batch1, batch2) for f in chain_per_key(("k0",), iter(b), state)
           for r in f.to_dict("records")]
    assert [r["id"] for r in out] == ["a-0", "b-0", "b-1", "a-1"]
    assert out == _hash_chain("k0", ["a-0", "b-0", "b-1", "a-1"], [1, 2, 3, 4])
    assert state.value == (out[-1]["h"], 4) and state.updates == 2
    assert verify_chains(out, ["a-0", "a-1", "b-0", "b-1"]).exact
    assert list(chain_per_key(("k0",), iter([_events([])]), state)) == [] and state.updates == 2


# --------------------------------------------------------------------------- output records and checks


def test_out_record_reads_both_output_formats():
    headers = {"sink_ts": "12.5", "batch_id": "3", "partition": "1", "attempt": "0", "task": "42",
               "executor": "2"}
    c = out_record({"id": 7, "k": "k3", "count": 2, "ts": 1000}, headers)
    assert (c.id, c.k, c.count, c.ts_ms, c.sink_ts, c.batch_id, c.partition, c.task) == \
        (7, "k3", 2, 1000, 12.5, 3, 1, 42)
    chain = {"key": "k1", "n": 4, "id": "b-9", "prev": "p", "h": "q", "ts": 1001}
    r = out_record(chain, {"sink_ts": "1.0", "batch_id": "0"})
    assert (r.id, r.k, r.count, r.ts_ms, r.attempt, r.task) == ("b-9", "k1", 4, 1001, 0, -1)
    assert r.value == chain


def _chain_output(ids_by_key: dict[str, list[str]], batch: int = 0, sink0: float = 1.0) -> list[OutRecord]:
    out, t = [], sink0
    for key, ids in ids_by_key.items():
        frame, _, _ = chain_frame(key, pd.DataFrame({"id": ids, "ts": range(len(ids))}), "", 0)
        for rec in frame.to_dict("records"):
            out.append(out_record(rec, {"sink_ts": str(t), "batch_id": str(batch)}))
            t += 0.001
    return out


def test_chain_checks_pass_an_exact_output():
    out = _chain_output({"k0": ["a-0", "b-0", "a-1"], "k1": ["a-2"]})
    c = chain_checks(out, ["a-0", "a-1", "a-2", "b-0"])
    assert c["chains_exact"] == c["chains_exact_dedup"] == "yes" and c["chain_keys"] == 2
    assert c["identical_copies"] == c["conflicting_ids"] == c["broken_chains"] == 0


def test_chain_checks_report_identical_rewrites_and_what_removing_them_leaves():
    out = _chain_output({"k0": ["a-0", "b-0", "a-1"]})
    rewritten = [out_record(r.value, {"sink_ts": str(r.sink_ts + 5), "batch_id": "0", "attempt": "1"})
                 for r in out[1:]]  # a retried task wrote its rows again, identical
    c = chain_checks(out + rewritten, ["a-0", "a-1", "b-0"])
    assert c["chains_exact"] == "no" and c["identical_copies"] == 2 and c["conflicting_ids"] == 0
    assert c["chains_exact_dedup"] == "yes" and c["broken_chains_dedup"] == 0
    assert "duplicated" in c["chain_check"]


def test_chain_checks_keep_copies_that_differ_and_flag_the_chain():
    out = _chain_output({"k0": ["a-0", "b-0", "a-1"]})
    other = dict(out[1].value, n=3, prev=out[2].value["h"])  # b-0 recomputed at another position
    c = chain_checks([*out, out_record(other, {"sink_ts": "9.0", "batch_id": "1"})], ["a-0", "a-1", "b-0"])
    assert c["conflicting_ids"] == 1 and c["identical_copies"] == 0
    assert c["chains_exact_dedup"] == "no" and c["broken_chains_dedup"] == 1


def test_chain_checks_catch_a_missing_event_and_a_source_out_of_order():
    assert chain_checks(_chain_output({"k0": ["a-0", "a-1"]}), ["a-0", "a-1", "b-0"])["chains_exact"] == "no"
    c = chain_checks(_chain_output({"k0": ["a-1", "a-0"]}), ["a-0", "a-1"])
    assert c["chains_exact"] == "no" and c["reordered_keys"] == 1 and c["broken_chains"] == 0


def test_is_exact_by_logic():
    base = {"missing": 0, "duplicates": 0, "unexpected": 0, "query_error": ""}
    assert is_exact({**base, "logic": "chain", "chains_exact": "yes", "wrong_counts": ""})
    assert not is_exact({**base, "logic": "chain", "chains_exact": "no", "wrong_counts": ""})
    assert not is_exact({**base, "duplicates": 1, "logic": "chain", "chains_exact": "yes"})
    assert is_exact({**base, "logic": "count", "wrong_counts": 0})
    assert not is_exact({**base, "logic": "count", "wrong_counts": 2})
    assert not is_exact({**base, "query_error": "boom", "logic": "count", "wrong_counts": 0})


# --------------------------------------------------------------------------- accounting and latency


def _out(i, count, sink, batch, k="k0", ts=1000):
    return OutRecord(i, k, count, ts, sink, batch)


def test_account_counts_duplicates_missing_and_wrong_counts():
    produced = {0: ("k0", 1000, 1), 1: ("k0", 1001, 2), 2: ("k1", 1002, 1), 3: ("k1", 1003, 2)}
    outputs = [_out(0, 1, 2.0, 0), _out(1, 2, 2.1, 1), _out(1, 2, 2.5, 1),  # same-batch retry copy
               _out(2, 1, 3.0, 1), _out(2, 1, 4.0, 2),  # re-run in a later batch
               _out(9, 1, 3.0, 2)]  # never produced; 3 is missing
    acc = account(produced, outputs)
    assert acc["records_out"] == 6 and acc["distinct_out"] == 4
    assert acc["duplicates"] == 2 and acc["extra_copies"] == 2
    assert acc["dup_ids_same_batch"] == 1 and acc["dup_ids_across_batches"] == 1
    assert acc["dup_batches"] == [1, 2]
    assert acc["missing"] == 1 and acc["unexpected"] == 1 and acc["wrong_counts"] == 0
    assert acc["first"][1].sink_ts == 2.1 and acc["first"][2].batch_id == 1


def test_account_flags_a_wrong_running_count():
    acc = account({0: ("k0", 1, 1), 1: ("k0", 2, 2)}, [_out(0, 1, 1.0, 0), _out(1, 3, 1.0, 0)])
    assert acc["wrong_counts"] == 1 and acc["missing"] == 0


def test_account_lists_retried_task_writes_and_write_spans():
    produced = {i: ("k0", 1000 + i, i + 1) for i in range(4)}
    outputs = [OutRecord(0, "k0", 1, 1000, 5.00, 3, 0, 0), OutRecord(1, "k0", 2, 1001, 5.02, 3, 0, 0),
               OutRecord(2, "k0", 3, 1002, 5.10, 3, 1, 0),
               OutRecord(2, "k0", 3, 1002, 9.00, 3, 1, 1), OutRecord(3, "k0", 4, 1003, 9.04, 3, 1, 1)]
    acc = account(produced, outputs)
    assert acc["retried_writes"] == ["b3/p1/a1"]
    assert acc["duplicates"] == 1 and acc["dup_ids_same_batch"] == 1 and acc["missing"] == 0
    assert acc["sink_write_ms_max"] == pytest.approx(40.0)  # b3/p1/a1 wrote from 9.00 to 9.04


def test_account_skips_count_checks_where_no_count_is_expected():
    produced = {"a-0": ("k0", 1000, None), "a-1": ("k0", 1001, None)}
    acc = account(produced, [OutRecord("a-0", "k0", 5, 1000, 1.0, 0),
                             OutRecord("a-1", "k0", 9, 1001, 1.1, 0)])
    assert acc["wrong_counts"] == 0 and acc["missing"] == 0 and acc["duplicates"] == 0


def test_a_write_after_the_first_task_of_its_partition_is_a_retry_even_at_attempt_0():
    """A re-attempted stage numbers its task attempts from 0 again: the task attempt id tells them apart."""
    first = [OutRecord(i, "k0", i + 1, 1000, 5.0 + i / 100, 4, 0, 0, "1", 17) for i in range(3)]
    again = [OutRecord(i, "k0", i + 1, 1000, 9.0 + i / 100, 4, 0, 0, "2", 23) for i in range(2)]
    other = [OutRecord(9, "k1", 1, 1000, 5.5, 4, 1, 0, "1", 18)]
    assert list(retried_spans(first + again + other)) == [(4, 0, 0, 23)]
    acc = account({i: ("k0", 1000, i + 1) for i in range(3)} | {9: ("k1", 1000, 1)}, first + again + other)
    assert acc["retried_writes"] == ["b4/p0/a0"] and acc["retried_rows"] == 2
    assert acc["duplicates"] == 2 and acc["extra_copies"] == 2 and acc["dup_ids_same_batch"] == 2


def test_percentile_is_nearest_rank_and_nan_when_empty():
    vals = list(range(1, 101))
    assert percentile(vals, .5) == 50 and percentile(vals, .99) == 99 and percentile(vals, 1.0) == 100
    assert percentile([7.0], .99) == 7.0
    assert math.isnan(percentile([], .5))


def test_per_second_bins_by_produce_time_relative_to_origin():
    origin = 100.0
    samples = [(98.5, 10.0), (99.9, 30.0), (100.0, 5.0), (100.99, 7.0), (101.0, 50.0)]
    rows = per_second(samples, origin)
    assert [r["second"] for r in rows] == [-2, -1, 0, 1]
    by = {r["second"]: r for r in rows}
    assert by[0]["count"] == 2 and by[0]["max_ms"] == 7.0 and by[0]["p50_ms"] == 5.0
    assert by[-1]["p99_ms"] == 30.0 and by[1]["count"] == 1


def _timeline(p99s: dict[int, float]) -> list[dict]:
    return [{"second": s, "count": 100, "p50_ms": v / 2, "p99_ms": v, "max_ms": v}
            for s, v in sorted(p99s.items())]


def test_fault_stats_stall_recovery_and_worst_second():
    kill = 1000.0
    # before the kill: records produced at -10..-2 s with latency 100 ms, all written before it
    samples = [(kill + s + f / 10, 100.0) for s in range(-10, -1) for f in range(10)]
    samples.append((kill - 0.5, 5000.0))  # produced before the kill but written after it: not "before"
    timeline = _timeline({-1: 5000, 0: 900, 1: 3000, 2: 150, 3: 250, 4: 120, 40: 9999})
    st = fault_stats(samples, timeline, kill)
    assert st["p99_before_ms"] == 100.0 and st["before_samples"] == 90
    assert st["worst_p99_after_ms"] == 3000 and st["worst_second"] == 1
    assert st["stall_s"] == 3  # seconds 0, 1, 3 are above 200 ms; 40 is outside the 30 s window
    assert st["stall_before_kill_s"] == 1  # second -1: records in flight at the kill
    assert st["recovery_s"] == 2  # first second back under 2x
    assert st["recovered_for_good_s"] == 4  # after the last second above 2x (3)


def test_fault_stats_before_window_is_by_write_time_and_skips_warm_up():
    kill = 100.0
    samples = [(80.0, 9000.0),  # warm-up record, written at 89 s: inside the window but too early
               (85.0, 1000.0),  # written at 86: before the window (kill - 10 = 90)
               (91.0, 300.0), (95.0, 500.0),  # written at 91.3 and 95.5: in
               (98.0, 2500.0)]  # written at 100.5, after the kill: out
    st = fault_stats(samples, [], kill, not_before=84.0)
    assert st["before_samples"] == 2 and st["p99_before_ms"] == 500.0
    assert st["recovery_s"] is None and st["stall_s"] == 0 and math.isnan(st["worst_p99_after_ms"])


def test_fault_stats_without_a_stall():
    kill = 50.0
    samples = [(kill - 5 + i / 100, 40.0) for i in range(300)]
    st = fault_stats(samples, _timeline({0: 60, 1: 70, 2: 40}), kill)
    assert st["stall_s"] == 0 and st["recovery_s"] == 0 and st["recovered_for_good_s"] == 0
    assert st["worst_p99_after_ms"] == 70


def test_fault_stats_never_recovering_within_the_window():
    kill = 0.0
    samples = [(-5 + i / 100, 10.0) for i in range(300)]
    st = fault_stats(samples, _timeline({s: 1000.0 for s in range(0, 35)}), kill)
    assert st["stall_s"] == 30 and st["recovery_s"] is None and st["recovered_for_good_s"] == 30


# --------------------------------------------------------------------------- integration


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("logic", ["chain", "count"])
def test_sss_fault_free_run_is_exact(stack, spark, logic):
    from bench.sss import run_sss_experiment

    result = run_sss_experiment(stack.bootstrap_servers, spark, rate=100, keys=16, duration_s=12,
                                kill_at_s=None, trigger_ms=100, drain_timeout_s=180, logic=logic,
                                out_topic_prefix=f"sss{uuid.uuid4().hex[:8]}-")
    s = result["summary"]
    print(f"\nSSS {logic} smoke: {s['records_in']} in, {s['distinct_out']} distinct out, {s['duplicates']} "
          f"duplicated ids ({s['extra_copies']} extra copies), {s['missing']} missing, p50 "
          f"{s['steady_p50_ms']:.0f} ms, p99 {s['steady_p99_ms']:.0f} ms, {s['batches']} batches")
    assert not s["query_error"] and s["logic"] == logic
    assert s["records_in"] > 0 and s["feed_errors"] == 0
    assert s["missing"] == 0 and s["duplicates"] == 0 and s["drained"]
    if logic == "chain":
        assert s["chains_exact"] == "yes" and s["chain_keys"] == 16, s["chain_check"]
    else:
        assert s["wrong_counts"] == 0
    assert s["exact"] == "yes"
    assert result["timeline"] and all(r["count"] > 0 for r in result["timeline"])
