"""What a source makes of a record (replication.runtime.source_records), pure."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replication.runtime.elements import MIN_WATERMARK
from replication.runtime.source_records import Rejected, SourceRecords, Watermarks


def _spec(**over):
    return {"deserializer": json.loads, "key_deserializer": None, "metadata": False, "timestamp": None, **over}


def _wrap(record, value, key_deserializer):
    return ("meta", record[0], value, key_deserializer)


def _time(record):
    return record[1]


def test_a_value_gets_the_timestamp_function_s_time_or_the_record_s():
    assert SourceRecords(_spec(), _wrap, _time).decode(b'{"ts": 7}', ("msg", 1000)) == ({"ts": 7}, 1000)
    timed = SourceRecords(_spec(timestamp=lambda v: v["ts"]), _wrap, _time)
    assert timed.decode(b'{"ts": 7.9}', ("msg", 1000)) == ({"ts": 7.9}, 7)


def test_with_metadata_the_value_is_wrapped_and_a_tombstone_stays_none():
    records = SourceRecords(_spec(metadata=True, key_deserializer=bytes.decode), _wrap, _time)
    assert records.decode(b"1", ("msg", 5)) == (("meta", "msg", 1, bytes.decode), 5)
    assert records.decode(None, ("msg", 5)) == (("meta", "msg", None, bytes.decode), 5)
    with pytest.raises(Rejected):  # without metadata a tombstone is the deserializer's to read
        SourceRecords(_spec(), _wrap, _time).decode(None, ("msg", 5))


def test_what_fails_is_rejected_with_the_dead_letter_reason():
    with pytest.raises(Rejected) as bad_value:
        SourceRecords(_spec(), _wrap, _time).decode(b"{", ("msg", 1))
    assert bad_value.value.reason.startswith("deserialize: JSONDecodeError")
    with pytest.raises(Rejected) as bad_time:
        SourceRecords(_spec(timestamp=lambda v: v["ts"]), _wrap, _time).decode(b"{}", ("msg", 1))
    assert bad_time.value.reason.startswith("timestamp: KeyError")


def test_the_watermark_follows_the_slowest_partition_and_moves_by_the_interval():
    marks = Watermarks([0, 1], out_of_orderness_ms=100, interval_ms=50)
    assert marks.observe(0, 1_000) is None  # partition 1 has read nothing yet
    assert marks.observe(1, 2_000) == 900  # the first one at once
    assert marks.observe(0, 1_040) is None  # moved by 40 < 50
    assert marks.observe(0, 1_060) == 960
    assert marks.observe(0, 1_050) is None  # not the largest of its partition
    assert marks.max_ts == {0: 1_060, 1: 2_000} and marks.emitted == 960


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10_000)), max_size=60),
       st.integers(0, 300), st.integers(1, 500))
def test_watermarks_rise_and_never_pass_the_slowest_partition(reads, lateness, interval):
    marks = Watermarks([0, 1, 2], lateness, interval)
    largest = {0: MIN_WATERMARK, 1: MIN_WATERMARK, 2: MIN_WATERMARK}
    out = []
    for k, ts in reads:
        largest[k] = max(largest[k], ts)
        wm = marks.observe(k, ts)
        if wm is not None:
            out.append(wm)
            assert wm == min(largest.values()) - lateness
    assert out == sorted(out)
    assert all(b - a >= interval for a, b in zip(out, out[1:], strict=False))
    assert (min(largest.values()) - lateness - (out[-1] if out else MIN_WATERMARK) < interval
            or min(largest.values()) == MIN_WATERMARK)
