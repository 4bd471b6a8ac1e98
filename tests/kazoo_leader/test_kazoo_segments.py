"""The KaZoo order log cut into segments (kazoo_leader.segments): pure, no Kafka."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kazoo_leader.segments import READ_AHEAD, OrderCursor, SegmentedLog


def _the_log(log: SegmentedLog, segments: list[list[str]]) -> list[tuple[int, str]]:
    """What every reader must hand out: the first ``per_segment`` records of each segment, in order."""
    return [(log.position(n, o), v) for n, records in enumerate(segments) for o, v in enumerate(records)
            if o < log.per_segment]


def _read(cursor: OrderCursor, segments: list[list[str]], picks: list[int]) -> list[tuple[int, str]]:
    """Read like a consumer of the cursor's two segments: each step takes the next unread record of
    the current or of the next segment (``picks`` chooses), until neither has one."""
    read: dict[int, int] = {}
    out: list[tuple[int, str]] = []
    step = 0
    while True:
        ready = []
        for topic, offset in cursor.positions().items():
            segment = cursor.segments()[topic]
            at = max(offset, read.get(segment, 0))
            if segment < len(segments) and at < len(segments[segment]):
                ready.append((segment, at))
        if not ready:
            return out
        segment, at = ready[picks[step % len(picks)] % len(ready)] if picks else ready[0]
        step += 1
        read[segment] = at + 1
        out += cursor.add(segment, at, segments[segment][at])


def test_positions_name_segments_and_offsets() -> None:
    log = SegmentedLog("orders.t1p0", per_segment=3)
    assert [log.topic(log.segment_of(p)) for p in (0, 2, 3, 7)] == ["orders.t1p0.0", "orders.t1p0.0",
                                                                      "orders.t1p0.1", "orders.t1p0.2"]
    assert log.position(2, 1) == 7
    cursor = OrderCursor(log, 7)
    assert cursor.positions() == {"orders.t1p0.2": 1, "orders.t1p0.3": 0} and cursor.position == 7
    with pytest.raises(ValueError):
        SegmentedLog("x", per_segment=0)


def test_a_record_past_a_full_segment_is_not_the_logs_and_is_written_again_later() -> None:
    log = SegmentedLog("o", per_segment=2)
    cursor = OrderCursor(log)
    assert cursor.add(0, 0, "a") == [(0, "a")]
    assert cursor.add(1, 0, "c") == []  # read ahead: waits for segment 0 to complete
    assert cursor.add(0, 1, "b") == [(1, "b"), (2, "c")] and cursor.segment == 1
    assert cursor.add(0, 2, "late") == []  # segment 0 left already
    assert log.rewrite_segment(0, 2, reading=1) == 1 and log.rewrite_segment(0, 2, reading=3) == 3
    assert log.rewrite_segment(0, 1, reading=0) is None


def test_a_segment_read_ahead_in_full_is_left_at_once() -> None:
    log = SegmentedLog("o", per_segment=2)
    cursor = OrderCursor(log)
    cursor.add(0, 0, "a")
    for offset, value in enumerate(["c", "d", "past"]):
        assert cursor.add(1, offset, value) == []
    assert cursor.ignored == 1
    assert cursor.add(0, 1, "b") == [(1, "b"), (2, "c"), (3, "d")]
    assert cursor.segment == 2 and cursor.positions() == {"o.2": 0, "o.3": 0}


def test_the_next_segment_is_read_only_near_the_end_of_the_current_one() -> None:
    log = SegmentedLog("o", per_segment=READ_AHEAD + 50)
    cursor = OrderCursor(log)
    assert cursor.positions() == {"o.0": 0}  # an idle reader fetches one partition per log
    for offset in range(49):
        cursor.add(0, offset, offset)
    assert cursor.positions() == {"o.0": 49}
    cursor.add(0, 49, 49)
    assert cursor.positions() == {"o.0": 50, "o.1": 0}
    assert OrderCursor(log, 60).segments() == {"o.0": 0, "o.1": 1}


@settings(max_examples=300, deadline=None)
@given(per_segment=st.sampled_from([1, 2, 3, 5, READ_AHEAD + 2]),
       sizes=st.lists(st.integers(0, 8), min_size=1, max_size=6),
       start=st.integers(0, 30),
       picks=st.lists(st.integers(0, 1), max_size=40))
def test_every_reader_hands_out_the_same_log_whatever_it_reads_first(per_segment, sizes, start, picks) -> None:
    """Segments are filled up to ``per_segment`` (a writer does not write past the first segment
    that has room), some with records past their end; however a reader interleaves its fetches of
    the two segments it reads, it hands out exactly the log from its start position on."""
    log = SegmentedLog("o", per_segment=per_segment)
    full = [per_segment + extra if n < len(sizes) - 1 else min(extra, per_segment) for n, extra in enumerate(sizes)]
    segments = [[f"{n}.{o}" for o in range(size)] for n, size in enumerate(full)]
    expected = [(p, v) for p, v in _the_log(log, segments) if p >= start]
    cursor: OrderCursor[str] = OrderCursor(log, min(start, log.position(len(segments), 0)))
    assert _read(cursor, segments, picks) == expected
    assert _read(OrderCursor(log, cursor.position), segments, picks) == []
