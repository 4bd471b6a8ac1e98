"""The Spark Structured Streaming baseline (bench/sss.py): offset planning, accounting and the fault
statistics as pure functions, plus one fault-free run on the embedded stack (slow, integration)."""

from __future__ import annotations

import math
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sss import (  # noqa: E402
    OutRecord,
    account,
    fault_stats,
    offsets_from_json,
    offsets_to_json,
    per_second,
    percentile,
    plan_end_offsets,
    plan_ranges,
)

# --------------------------------------------------------------------------- offsets


def test_offsets_round_trip_as_json_able_string_keys():
    js = offsets_to_json({2: 7, 0: 3, 1: 0})
    assert js == {"0": 3, "1": 0, "2": 7} and list(js) == ["0", "1", "2"]
    assert offsets_from_json(js) == {0: 3, 1: 0, 2: 7}


def test_end_offsets_take_everything_available_and_never_go_back():
    start = {"0": 5, "1": 10, "2": 0}
    assert plan_end_offsets(start, {0: 9, 1: 10, 2: 4}) == {"0": 9, "1": 10, "2": 4}
    # a stale view (fetch behind the start) keeps the start: offsets never move backwards
    assert plan_end_offsets(start, {0: 3, 1: 10, 2: 0}) == start
    # a partition the view does not know yet stays where it is
    assert plan_end_offsets(start, {0: 6}) == {"0": 6, "1": 10, "2": 0}


def test_end_offsets_add_new_partitions_from_zero():
    assert plan_end_offsets({"0": 2}, {0: 2, 1: 5}) == {"0": 2, "1": 5}


def test_end_offsets_respect_max_rows_in_proportion_to_backlog():
    start = {"0": 0, "1": 100, "2": 50}
    end = plan_end_offsets(start, {0: 60, 1: 130, 2: 60}, max_rows=50)  # backlogs 60, 30, 10
    taken = {p: end[p] - start[p] for p in start}
    assert sum(taken.values()) == 50
    assert taken == {"0": 30, "1": 15, "2": 5}
    # a limit above the backlog changes nothing; zero takes nothing
    assert plan_end_offsets(start, {0: 1, 1: 101, 2: 51}, max_rows=10) == {"0": 1, "1": 101, "2": 51}
    assert plan_end_offsets(start, {0: 60, 1: 130, 2: 60}, max_rows=0) == start


def test_end_offsets_max_rows_distributes_remainders_exactly():
    start = {"0": 0, "1": 0, "2": 0}
    end = plan_end_offsets(start, {0: 1, 1: 1, 2: 1}, max_rows=2)
    assert sum(end.values()) == 2 and all(v in (0, 1) for v in end.values())


def test_ranges_cover_only_partitions_with_records():
    assert plan_ranges({"0": 5, "1": 10, "2": 0}, {"0": 9, "1": 10, "2": 4}) == [(0, 5, 9), (2, 0, 4)]
    assert plan_ranges({"0": 5}, {"0": 5}) == []
    assert plan_ranges({}, {"1": 3}) == [(1, 0, 3)]  # unknown start: from 0
    with pytest.raises(ValueError, match="behind"):
        plan_ranges({"0": 5}, {"0": 4})


def test_ranges_tile_the_stream_across_consecutive_batches():
    """Consecutive (start, end) pairs, as Spark chains them, read every offset exactly once."""
    views = [{0: 3, 1: 0}, {0: 3, 1: 2}, {0: 8, 1: 2}, {0: 8, 1: 9}]
    start = offsets_to_json({0: 0, 1: 0})
    read = {0: [], 1: []}
    for view in views:
        end = plan_end_offsets(start, view)
        for p, s, e in plan_ranges(start, end):
            read[p].extend(range(s, e))
        start = end
    assert read == {0: list(range(8)), 1: list(range(9))}


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
    return [{"second": s, "count": 100, "p50_ms": v / 2, "p99_ms": v, "max_ms": v} for s, v in sorted(p99s.items())]


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
def test_sss_fault_free_run_outputs_every_id(stack, spark):
    from bench.sss import run_sss_experiment

    result = run_sss_experiment(stack.bootstrap_servers, spark, rate=100, keys=16, duration_s=12, kill_at_s=None,
                                trigger_ms=100, out_topic_prefix=f"sss{uuid.uuid4().hex[:8]}-",
                                drain_timeout_s=180)
    s = result["summary"]
    print(f"\nSSS smoke: {s['records_in']} in, {s['distinct_out']} distinct out, {s['duplicates']} duplicated ids "
          f"({s['extra_copies']} extra copies), {s['missing']} missing, p50 {s['steady_p50_ms']:.0f} ms, "
          f"p99 {s['steady_p99_ms']:.0f} ms, {s['batches']} batches")
    assert not s["query_error"]
    assert s["records_in"] > 0 and s["feed_errors"] == 0
    assert s["missing"] == 0 and s["drained"]
    assert s["wrong_counts"] == 0
    assert result["timeline"] and all(r["count"] > 0 for r in result["timeline"])
