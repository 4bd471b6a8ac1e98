"""The heartbeat log cut into segments (liverobin.segments, pure): every reader counts what one
log in write order would, whatever the order in which it reads the segments, and from wherever
it resumes."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from liverobin.heartbeats import PulseLog, PulseRecord
from liverobin.segments import HeartbeatLog, LogCursor
from transport.segment_retention import DELETE_PER_ROUND, KEEP_BEHIND, SegmentRetention

T = "payments"
LOG = HeartbeatLog("hb", per_segment=5)


@st.composite
def written(draw):
    """Records in the order they reached the broker, from generators that obey the rule: pulse h
    goes to its segment, and none into a segment before the last pulse of the one before it was
    counted (a lost one is written again).  Some writers lag (an h already counted), some pulses
    are lost (a gap inside a segment), one may be final."""
    counted, out, top = PulseLog(), [], 0
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["next", "next", "next", "stale", "skip"]))
        h = counted.last_h + (2 if kind == "skip" else 1)
        if kind == "stale":
            h = draw(st.integers(1, max(1, counted.last_h)))
        if LOG.segment_of(h) > LOG.segment_of(counted.last_h + 1):
            h = counted.last_h + 1  # the last pulse of a segment is never skipped
        top = max(top, draw(st.integers(top, top + 3)))
        offsets = {T: {0: draw(st.integers(max(0, top - 4), top))}}
        record = PulseRecord(h, offsets, final=kind == "next" and draw(st.integers(0, 30)) == 0)
        out.append(record)
        counted.accept(record)
        if counted.final:
            break
    return out


def _segments(records: list[PulseRecord]) -> dict[int, list[PulseRecord]]:
    """Each record in the topic of its segment, at the next offset there."""
    segments: dict[int, list[PulseRecord]] = {}
    for r in records:
        seg = segments.setdefault(LOG.segment_of(r.h), [])
        seg.append(PulseRecord(r.h, r.offsets, r.final, at=len(seg)))
    return segments


def _read(segments: dict[int, list[PulseRecord]], rnd: random.Random, after: PulseRecord | None = None) -> list:
    """One reader: fetches from the segments the cursor names, in a random order."""
    cursor = LogCursor(LOG, after)
    counted = []
    while True:
        ready = [(int(topic.rsplit(".", 1)[1]), offset) for topic, offset in cursor.positions().items()
                 if offset < len(segments.get(int(topic.rsplit(".", 1)[1]), []))]
        if not ready or cursor.pulses.final:
            return counted
        seg, offset = rnd.choice(ready)
        for record in segments[seg][offset:offset + rnd.randint(1, 3)]:
            counted += cursor.add(seg, record)


def _key(c: PulseRecord) -> tuple:
    return c.h, c.offsets, c.final


@settings(max_examples=400, deadline=None)
@given(written(), st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_segments_read_in_any_order_count_what_the_log_in_write_order_counts(records, rnd_a, rnd_b):
    log = PulseLog()
    expected = [_key(c) for r in records if (c := log.accept(r)) is not None]
    segments = _segments(records)
    assert [_key(c) for c in _read(segments, rnd_a)] == expected
    assert [_key(c) for c in _read(segments, rnd_b)] == expected


@settings(max_examples=300, deadline=None)
@given(written(), st.randoms(use_true_random=False), st.data())
def test_a_reader_resumed_after_a_counted_record_counts_the_rest_alike(records, rnd, data):
    whole = _read(_segments(records), random.Random(0))
    if not whole:
        return
    cut = data.draw(st.integers(0, len(whole) - 1))
    resumed = _read(_segments(records), rnd, after=whole[cut])
    assert [(_key(c), c.at) for c in resumed] == [(_key(c), c.at) for c in whole[cut + 1:]]


def test_a_writer_waits_for_the_last_pulse_of_a_segment_before_the_next_one():
    cursor = LogCursor(LOG)
    assert cursor.positions() == {"hb.0": 0, "hb.1": 0}
    for h in range(1, 5):
        cursor.add(0, PulseRecord(h, {T: {0: h}}, at=h - 1))
    assert cursor.may_write(5) and not cursor.may_write(6)  # 5 was lost or is in flight: write it (again)
    # another writer's record of the next segment, read ahead: it waits for the segment to complete
    assert cursor.add(1, PulseRecord(6, {T: {0: 9}}, at=0)) == []
    assert [c.h for c in cursor.add(0, PulseRecord(5, {T: {0: 5}}, at=4))] == [5, 6]
    assert cursor.segment == 1 and cursor.may_write(7) and cursor.positions() == {"hb.1": 1, "hb.2": 0}
    assert cursor.add(0, PulseRecord(4, {T: {0: 4}}, at=5)) == []  # a late record of a segment left


def test_a_stray_record_outside_its_segment_counts_nowhere():
    cursor = LogCursor(LOG)
    assert cursor.add(0, PulseRecord(7, {T: {0: 1}}, at=0)) == []
    assert [c.h for c in cursor.add(0, PulseRecord(1, {T: {0: 1}}, at=1))] == [1]


def test_resuming_after_the_last_pulse_of_a_segment_starts_the_next_one():
    cursor = LogCursor(LOG, after=PulseLog().accept(PulseRecord(10, {T: {0: 3}}, at=4)))
    assert cursor.segment == 2 and cursor.positions() == {"hb.2": 0, "hb.3": 0}


def test_retention_names_the_segments_below_the_first_one_read_less_a_margin():
    log = HeartbeatLog("hb", per_segment=10)
    assert log.first_read_after(0) == 0 and log.first_read_after(10) == 0 and log.first_read_after(25) == 2
    keep = SegmentRetention()
    assert keep.release(log.first_read_after(0)) == []
    assert KEEP_BEHIND == 2 and keep.release(log.first_read_after(55)) == [0, 1, 2]
    assert keep.release(4) == []  # a reader reported lower than before: nothing comes back, nothing goes
    assert keep.release(6) == [3]
    assert keep.release(6 + DELETE_PER_ROUND + 10) == list(range(4, 4 + DELETE_PER_ROUND))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1_000), max_size=30))
def test_retention_never_names_a_segment_twice_nor_one_a_reader_may_still_read(needed):
    keep = SegmentRetention()
    named: list[int] = []
    for first_read in needed:
        gone = keep.release(first_read)
        assert all(s < first_read - KEEP_BEHIND for s in gone)
        named += gone
    assert named == sorted(set(named)) and named == list(range(len(named)))
