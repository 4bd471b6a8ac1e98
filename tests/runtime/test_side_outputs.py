"""Side outputs: ``ctx.output(tag, value)`` in keyed functions and a window's late records, planned
as a stream of their own and routed only to the edges that read the tag."""

from __future__ import annotations

import pytest

from replication.aggregators import Count
from replication.api import Job, JobDefinitionError
from replication.functions import KeyedProcessFunction, OutputTag
from replication.plan import OutputEdge, plan_job
from replication.runtime.elements import DATA, WATERMARK
from replication.runtime.operators import ProcessOperator, Router
from replication.runtime.windows import WindowOperator
from replication.windowing import Windows
from rhino_state import RocksDBStateBackend
from tests.runtime.test_operators import FakeChannel, FakeEnv, chain, rec

ODD = OutputTag("odd")


class Split(KeyedProcessFunction):
    """Even values out on the main output, odd ones to the side output; "boom" raises after a side
    output."""

    def process(self, value, ctx):
        if value == "boom":
            ctx.output(ODD, "never")
            raise ValueError("boom")
        if value % 2:
            ctx.output(ODD, value)
        else:
            yield value


@pytest.fixture
def backend(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        yield b


def test_a_keyed_function_emits_side_outputs_after_its_main_outputs_and_none_when_it_raises(backend):
    env = FakeEnv(backend)
    op = ProcessOperator("split", env, Split())
    out = chain(op)
    for v in (1, 2, "boom", 3):
        op.process(rec(v, key="k", ts=v if isinstance(v, int) else 0, origin=("in", 0, 7)))
    assert out.values == [2]
    assert [(tag, r[1], r[2], r[5]) for tag, r in out.sides] == [("odd", 1, "k", ("in", 0, 7)), ("odd", 3, "k", ("in", 0, 7))]
    assert len(env.dead_letters) == 1
    with pytest.raises(TypeError, match="needs an OutputTag"):
        op.ctx.output("odd", 1)


def test_the_router_sends_side_records_only_on_the_edges_of_their_tag(backend):
    env = FakeEnv(backend)
    main, side, other = FakeChannel(0), FakeChannel(1), FakeChannel(2)
    router = Router("r", env, [(OutputEdge(1, 5, "forward", None, 1), [main]),
                               (OutputEdge(2, 6, "forward", None, 1, tag="odd"), [side]),
                               (OutputEdge(3, 7, "forward", None, 1, tag="even"), [other])])
    router.process(rec("m", ts=1))
    router.side("odd", rec("s", ts=2))
    router.side("nobody", rec("x", ts=3))
    router.on_watermark(9)
    assert [e[1] for e in main.data] == ["m"] and [e[1] for e in side.data] == ["s"] and other.data == []
    assert all(ch.elements[-1] == (WATERMARK, 9) for ch in (main, side, other))
    assert side.data[0][0] == DATA


def test_late_window_records_go_to_the_late_output_instead_of_the_dead_letter_topic(backend):
    env = FakeEnv(backend)
    op = WindowOperator("w", env, Windows.tumbling(10), Count(), late_tag="late")
    out = chain(op)
    op.process(rec("a", key="k", ts=1))
    op.on_watermark(20)
    op.process(rec("b", key="k", ts=5))
    assert [r[1]["value"] for r in out.records] == [1]
    assert [(tag, r[1]) for tag, r in out.sides] == [("late", "b")]
    assert env.dead_letters == [] and env.metrics.late_records == 1


def test_a_side_output_is_planned_as_a_stream_of_its_own():
    job = Job("j")
    processed = job.source("in").key_by(lambda v: v).process(Split(), name="split")
    processed.sink("evens")
    processed.side_output(ODD).map(str, name="as-text").sink("odds", serializer="str")
    late = OutputTag("late")
    windows = job.source("in2").key_by(lambda v: v).window(10, Count(), late_output=late, name="w")
    windows.sink("counts")
    windows.side_output(late).sink("late")
    plan = plan_job(job, default_parallelism=2, num_key_groups=64, num_vnodes=8, topic_partitions={"in": 2, "in2": 2})
    split = next(t for t in plan.tasks if t.name == "split")
    side = next(t for t in plan.tasks if t.name == "split.odd")
    assert [n.name for n in side.chain] == ["split.odd", "as-text", "sink:odds"]
    assert {(plan.task(o.dst_task).name, o.tag) for o in split.outputs} == {("sink:evens", None), ("split.odd", "odd")}
    assert any(o.tag == "late" for t in plan.tasks if t.name == "w" for o in t.outputs)
    with pytest.raises(JobDefinitionError, match="only keyed functions and windows"):
        Job("k").source("in").map(str).side_output(ODD)
    with pytest.raises(ValueError, match="non-empty str"):
        OutputTag("")
