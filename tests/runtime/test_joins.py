"""Two-input keyed functions and the joins built on them (replication.joins), driven by a fake
hosting instance over a real RocksDB: each join's output equals a plain-Python reference of the
same input, and what it keeps is dropped once the watermark says no partner can come."""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.api import Job, JobDefinitionError
from replication.config import ReplicationConfig
from replication.functions import CoProcessFunction, KeyedProcessFunction
from replication.joins import IntervalJoin, LookupJoin, WindowJoin
from replication.plan import plan_job
from replication.records import KafkaRecord
from replication.runtime.elements import MAX_WATERMARK
from replication.runtime.operators import ProcessOperator
from replication.runtime.processing import ProcessingInstance
from rhino_state import RocksDBStateBackend
from tests.runtime.test_operators import FakeEnv, chain, rec

_uids = itertools.count()


@pytest.fixture(scope="module")
def shared_backend(tmp_path_factory):
    with RocksDBStateBackend(tmp_path_factory.mktemp("joins")) as b:
        yield b


@pytest.fixture
def backend(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        yield b


def feed(backend, fn, events):
    """("a"|"b", key, ts, value) records and ("wm", ts) watermarks, then the max watermark."""
    op = ProcessOperator(f"j{next(_uids)}", FakeEnv(backend), fn)
    out = chain(op)
    for ev in events:
        if ev[0] == "wm":
            op.on_watermark(ev[1])
        else:
            (op.process if ev[0] == "a" else op.process2)(rec(ev[3], key=ev[1], ts=ev[2]))
    op.on_watermark(MAX_WATERMARK)
    return out, op


def in_order(records, data):
    """The records in event-time order, with watermarks just behind them now and then."""
    events = []
    for i, r in enumerate(sorted(records, key=lambda r: r[2])):
        events.append(r)
        if data.draw(st.booleans(), label=f"wm{i}"):
            events.append(("wm", r[2] - 1))
    return events


RECS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"]), st.integers(0, 60),
                          st.integers(0, 99)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(records=RECS, bounds=st.sampled_from([(0, 5), (-3, 3), (-10, -2), (0, 0)]), data=st.data())
def test_an_interval_join_emits_every_pair_in_its_bounds_once(shared_backend, records, bounds, data):
    lower, upper = bounds
    out, _ = feed(shared_backend, IntervalJoin(lower, upper, lambda a, b: (a, b)), in_order(records, data))
    firsts = [(k, ts, v) for side, k, ts, v in records if side == "a"]
    seconds = [(k, ts, v) for side, k, ts, v in records if side == "b"]
    expected = Counter((a[2], b[2]) for a in firsts for b in seconds
                       if a[0] == b[0] and a[1] + lower <= b[1] <= a[1] + upper)
    assert Counter(out.values) == expected


@pytest.mark.parametrize("join", [IntervalJoin(-2, 5, lambda a, b: (a, b)), WindowJoin(20, lambda a, b: (a, b))],
                         ids=["interval", "window"])
def test_a_join_keeps_nothing_of_a_key_once_the_watermark_passed(backend, join):
    out, op = feed(backend, join, [("a", "k", 10, "a1"), ("b", "k", 12, "b1"), ("wm", 100)])
    assert out.values == [("a1", "b1")]
    assert list(backend.iter_key_groups(range(op.env.num_key_groups))) == []  # records, counter, timers
    out, op = feed(backend, join, [("a", "k", 110, "a2"), ("b", "k", 111, "b2"), ("wm", 200)])
    assert out.values == [("a2", "b2")]  # the key starts afresh


@settings(max_examples=60, deadline=None)
@given(records=RECS, size=st.sampled_from([1, 10, 25]), data=st.data())
def test_a_window_join_emits_the_pairs_of_each_window_at_its_end(shared_backend, records, size, data):
    out, op = feed(shared_backend, WindowJoin(size, lambda a, b: (a, b)), in_order(records, data))
    firsts = [(k, ts, v) for side, k, ts, v in records if side == "a"]
    seconds = [(k, ts, v) for side, k, ts, v in records if side == "b"]
    expected = Counter((a[2], b[2]) for a in firsts for b in seconds
                       if a[0] == b[0] and a[1] // size == b[1] // size)
    assert Counter(out.values) == expected
    assert op.env.dead_letters == []


def test_a_window_join_dead_letters_a_record_for_a_window_already_joined(backend):
    out, op = feed(backend, WindowJoin(10, lambda a, b: (a, b)),
                   [("a", "k", 1, "a1"), ("b", "k", 2, "b1"), ("wm", 10), ("b", "k", 3, "late")])
    assert out.values == [("a1", "b1")]
    assert len(op.env.dead_letters) == 1 and "late" in op.env.dead_letters[0]["reason"]


def test_an_interval_join_dead_letters_a_record_behind_the_watermark(backend):
    """b2 at 5 would meet a1 (at 1, within [0, 5]), but the watermark 7 dropped a1 already: b2 is
    late, dead-lettered with the reason instead of silently meeting nothing; b3 at the watermark
    is on time."""
    out, op = feed(backend, IntervalJoin(0, 5, lambda a, b: (a, b)),
                   [("a", "k", 1, "a1"), ("b", "k", 2, "b1"), ("wm", 7), ("b", "k", 5, "b2"), ("a", "k", 7, "a3"),
                    ("b", "k", 7, "b3")])
    assert out.values == [("a1", "b1"), ("a3", "b3")]
    assert len(op.env.dead_letters) == 1 and "late: event time 5 is behind the watermark 7" in \
        op.env.dead_letters[0]["reason"]


def test_a_lookup_join_sees_the_latest_row_and_a_tombstone_deletes_it(backend):
    def row(key, value):
        return KafkaRecord(value=value, key=key, headers=(), timestamp=0, topic="t", partition=0, offset=0)

    out, _ = feed(backend, LookupJoin(lambda r, t: (r, t)), [
        ("a", "k", 1, "before"), ("b", "k", 2, row("k", {"v": 1})), ("a", "k", 3, "r1"),
        ("b", "k", 4, row("k", {"v": 2})), ("a", "k", 5, "r2"), ("b", "k", 6, row("k", None)), ("a", "k", 7, "after"),
        ("b", "j", 8, "plain row"), ("a", "j", 9, "r3")])
    assert out.values == [("before", None), ("r1", {"v": 1}), ("r2", {"v": 2}), ("after", None),
                          ("r3", "plain row")]
    inner, _ = feed(backend, LookupJoin(lambda r, t: (r, t), inner=True), [("a", "k", 1, "none"),
                                                                           ("b", "k", 2, "row"), ("a", "k", 3, "x")])
    assert inner.values == [("x", "row")]


class Tag(CoProcessFunction):
    def process1(self, value, ctx):
        yield ("first", value)

    def process2(self, value, ctx):
        yield ("second", value)


def test_connected_streams_plan_one_keyed_task_whose_second_input_goes_to_process2():
    job = Job("j")
    a, b = job.source("a"), job.source("b")
    a.connect(b).key_by(lambda v: v["k"], lambda v: v["id"]).process(Tag(), name="tag").sink("out")
    plan = plan_job(job, default_parallelism=2, num_key_groups=64, num_vnodes=8, topic_partitions={"a": 2, "b": 3})
    tag = next(t for t in plan.tasks if t.name == "tag")
    assert [(plan.task(i.src_task).name, i.index, i.partitioning) for i in tag.inputs] == \
        [("source:a", 0, "hash"), ("source:b", 1, "hash")]
    second = plan.second_input_channels(tag.id, 0)
    assert len(second) == 3 and all(plan.channels[c].src_task == plan.task(tag.inputs[1].src_task).id for c in second)
    assert tag in plan.multi_input_tasks()
    with pytest.raises(JobDefinitionError, match="takes two inputs"):
        a.key_by(lambda v: v).process(Tag())
    with pytest.raises(JobDefinitionError, match="needs a CoProcessFunction"):
        a.connect(b).key_by(len, len).process(KeyedProcessFunction())
    with pytest.raises(JobDefinitionError, match="lower <= upper"):
        a.key_by(len).interval_join(b.key_by(len), 5, 1, lambda x, y: x)


def test_a_function_overriding_only_process_opens_and_closes_with_the_defaults(backend):
    class Only(KeyedProcessFunction):
        def process(self, value, ctx):
            yield value

    op = ProcessOperator("only", FakeEnv(backend), Only())
    out = chain(op)
    op.process(rec(1, key="k"))
    op.on_end()
    assert out.values == [1] and out.ended == 1


def test_a_processing_replica_hands_its_second_inputs_records_to_process2(tmp_path):
    job = Job("j")
    a, b = job.source("a"), job.source("b")
    a.connect(b).key_by(len, len).process(Tag(), name="tag").sink("out")
    plan = plan_job(job, default_parallelism=1, num_key_groups=64, num_vnodes=8, topic_partitions={"a": 1, "b": 1})
    task = next(t for t in plan.tasks if t.name == "tag")
    worker = SimpleNamespace(cfg=ReplicationConfig(kafka_bootstrap_servers="127.0.0.1:9092"),
                             boot=SimpleNamespace(run_id="run", output_prefix="run"), job_name="job",
                             state_root=tmp_path)
    inst = ProcessingInstance(worker, task, 0, 0, plan)
    op = ProcessOperator("tag", inst, Tag())
    out = chain(op)
    inst.chain = op
    (first,), (second,) = (plan.input_channels(task.id, 0)[i:i + 1] for i in (0, 1))
    assert inst._second_input == {second.id}
    inst._consume(second.id, [rec("b1", key=2)])
    inst._consume(first.id, [rec("a1", key=2), rec("a2", key=2)])
    inst._element(second.id, rec("b2", key=2))
    assert out.values == [("second", "b1"), ("first", "a1"), ("first", "a2"), ("second", "b2")]
    inst.close_state()
