"""The job builder (replication.api) and the physical planner (replication.plan).

Pure Python: no Spark, no Kafka.  Topic partition counts are given to the planner as a dict.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import astuple

import pytest

from replication import serde
from replication.aggregators import Count as CountRecords
from replication.api import FORWARD, HASH, REBALANCE, Job, JobDefinitionError
from replication.config import ReplicationConfig
from replication.examples.fraud import FraudRule, MerchantTotals, Topics, build_job
from replication.functions import Aggregator, CoProcessFunction, KeyedProcessFunction
from replication.plan import PhysicalPlan, place, plan_job
from replication.windowing import Windows

G = 1 << 10
V = 32


def _plan(job: Job, topic_partitions: dict[str, int], *, default_parallelism: int = 3,
          num_vnodes: int = V) -> PhysicalPlan:
    return plan_job(job, default_parallelism=default_parallelism, num_key_groups=G, num_vnodes=num_vnodes,
                    topic_partitions=topic_partitions)


def _ident(x):
    return x


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", 0)

    def process(self, value, ctx):
        self.n.update(self.n.value() + 1)
        return [self.n.value()]


class Sum(Aggregator):
    def create(self):
        return 0

    def add(self, acc, value):
        return acc + value


def _simple_job(name: str = "j") -> tuple[Job, object]:
    job = Job(name)
    return job, job.source("in")


# ---------------------------------------------------------------------------------- API


@pytest.mark.parametrize("name", ["", "two words", "tab\there"])
def test_job_name_must_be_nonempty_without_spaces(name):
    with pytest.raises(JobDefinitionError, match="job name"):
        Job(name)


def test_operator_names_must_be_unique():
    job, src = _simple_job()
    m = src.map(_ident, name="enrich")
    with pytest.raises(JobDefinitionError, match="'enrich' is used twice"):
        m.map(_ident, name="enrich")
    # the same rule for keyed operators and for sinks
    m.key_by(_ident).process(Count(), name="count")
    with pytest.raises(JobDefinitionError, match="'count' is used twice"):
        m.key_by(_ident).window(10, Sum(), name="count")
    m.sink("out")
    with pytest.raises(JobDefinitionError, match="'sink:out' is used twice"):
        m.sink("out")


@pytest.mark.parametrize("kind", ["process", "window"])
def test_keyed_operator_names_must_not_contain_a_slash(kind):
    # the name is the keyed-state namespace, which cannot hold '/': refuse it while building,
    # not when the executor opens the state
    _, src = _simple_job()
    keyed = src.key_by(_ident)
    make = (lambda n: keyed.process(Count(), name=n)) if kind == "process" else (
        lambda n: keyed.window(10, Sum(), name=n))
    with pytest.raises(JobDefinitionError, match=f"{kind} operator name 'a/b' must not contain '/'"):
        make("a/b")
    assert make("a-b").node.name == "a-b"
    # stateless operators have no state namespace; this also shows the refused name was not reserved
    assert src.map(_ident, name="a/b").node.name == "a/b"


def test_a_topic_is_read_by_one_source_whose_stream_feeds_every_pipeline():
    job = Job("j")
    clicks = job.source("t", name="clicks")
    with pytest.raises(JobDefinitionError, match="source 't': the topic is read by source 'clicks' already; read a "
                                                 "topic once and use that stream for every pipeline"):
        job.source("t", name="t-again")
    clicks.map(_ident, name="a").sink("out-a")
    clicks.map(_ident, name="b").sink("out-b")
    job.validate()


def test_default_names_are_kind_and_id_and_distinct():
    job, src = _simple_job()
    a = src.map(_ident)
    b = a.filter(bool)
    c = b.flat_map(lambda v: [v])
    names = [n.name for n in job.nodes]
    assert names == ["source:in", f"map-{a.node.id}", f"filter-{b.node.id}", f"flat_map-{c.node.id}"]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
@pytest.mark.parametrize("where", ["source", "map", "filter", "flat_map", "process", "window", "sink"])
def test_parallelism_must_be_a_positive_int(where, bad):
    job, src = _simple_job()
    make = {
        "source": lambda p: job.source("other", parallelism=p),
        "map": lambda p: src.map(_ident, parallelism=p),
        "filter": lambda p: src.filter(bool, parallelism=p),
        "flat_map": lambda p: src.flat_map(list, parallelism=p),
        "process": lambda p: src.key_by(_ident).process(Count(), parallelism=p),
        "window": lambda p: src.key_by(_ident).window(5, Sum(), parallelism=p),
        "sink": lambda p: src.sink("out", parallelism=p),
    }[where]
    with pytest.raises(JobDefinitionError, match=r"parallelism must be a positive int, got"):
        make(bad)
    make(4)  # a positive int is accepted (and the failed attempt left no trace)
    assert [n.parallelism for n in job.nodes if n.kind == where][-1] == 4


def test_source_options_are_validated():
    job = Job("j")
    with pytest.raises(JobDefinitionError, match="starting_offsets must be 'earliest' or 'latest'"):
        job.source("t", starting_offsets="middle")
    with pytest.raises(JobDefinitionError, match="max_out_of_orderness_ms must be >= 0"):
        job.source("t", max_out_of_orderness_ms=-1)
    with pytest.raises(ValueError, match="unknown deserializer 'avro'"):
        job.source("t", deserializer="avro")
    ts = lambda v: v["ts"]  # noqa: E731
    s = job.source("t", starting_offsets="latest", max_out_of_orderness_ms=250, timestamp=ts, deserializer="str")
    spec = s.node.spec
    assert spec["topic"] == "t" and spec["starting_offsets"] == "latest"
    assert spec["max_out_of_orderness_ms"] == 250 and spec["timestamp"] is ts
    assert spec["deserializer"](b"h\xc3\xa9") == "hé"
    assert s.node.kind == "source" and s.node.inputs == []


@pytest.mark.parametrize("size", [0, -1000, 1.5, "1000", None])
def test_window_size_must_be_a_positive_int(size):
    _, src = _simple_job()
    with pytest.raises(JobDefinitionError, match="window size must be a positive int"):
        src.key_by(_ident).window(size, Sum())


@pytest.mark.parametrize("agg", [MerchantTotals, lambda acc, v: acc + v, None, 0])
def test_window_needs_an_aggregator_instance(agg):
    _, src = _simple_job()
    with pytest.raises(JobDefinitionError, match="window\\(\\) needs an Aggregator instance"):
        src.key_by(_ident).window(1000, agg)


def test_window_records_its_spec_and_hash_edge():
    _, src = _simple_job()
    key_fn = lambda v: v["k"]  # noqa: E731
    agg = Sum()
    w = src.key_by(key_fn).window(1000, agg, name="w")
    assert w.node.kind == "window" and w.node.spec == {"windows": Windows.tumbling(1000), "aggregator": agg}
    (edge,) = w.node.inputs
    assert edge.source is src.node and edge.partitioning == HASH and edge.key_fn is key_fn


@pytest.mark.parametrize("fn", [FraudRule, lambda v, ctx: [v], None, object()])
def test_process_needs_a_keyed_process_function_instance(fn):
    _, src = _simple_job()
    with pytest.raises(JobDefinitionError, match="process\\(\\) needs a KeyedProcessFunction instance"):
        src.key_by(_ident).process(fn)


def test_key_by_needs_a_callable():
    _, src = _simple_job()
    with pytest.raises(JobDefinitionError, match="key_by needs a callable"):
        src.key_by("card")


def test_union_across_jobs_is_refused():
    _, a = _simple_job("a")
    _, b = _simple_job("b")
    with pytest.raises(JobDefinitionError, match="different jobs"):
        a.union(b)


def test_union_needs_another_stream():
    _, a = _simple_job()
    with pytest.raises(JobDefinitionError, match="at least one other stream"):
        a.union()


def test_union_keeps_the_partitioning_of_each_input():
    job = Job("j")
    a, b = job.source("a"), job.source("b")
    u = a.union(b.rebalance())
    assert u.node.kind == "union"
    assert [(e.source, e.partitioning) for e in u.node.inputs] == [(a.node, FORWARD), (b.node, REBALANCE)]


def test_rebalance_applies_to_the_next_operator_only():
    _, src = _simple_job()
    m = src.rebalance().map(_ident, name="m")
    f = m.filter(bool, name="f")
    assert m.node.inputs[0].partitioning == REBALANCE and m.node.inputs[0].source is src.node
    assert f.node.inputs[0].partitioning == FORWARD


def test_validate_refuses_a_job_without_source():
    with pytest.raises(JobDefinitionError, match="has no source"):
        Job("empty").validate()


def test_validate_refuses_a_job_without_sink():
    job, src = _simple_job("nosink")
    src.map(_ident)
    with pytest.raises(JobDefinitionError, match="'nosink' has no sink"):
        job.validate()


def test_validate_names_a_dangling_operator():
    job, src = _simple_job()
    src.sink("out")
    src.map(_ident, name="forgotten")
    with pytest.raises(JobDefinitionError, match="operator 'forgotten' has no consumer"):
        job.validate()


def test_validate_names_an_unconsumed_source():
    job, src = _simple_job()
    src.sink("out")
    job.source("lonely")
    with pytest.raises(JobDefinitionError, match="'source:lonely' has no consumer"):
        job.validate()


def test_validate_accepts_the_fraud_job():
    build_job(Topics.with_prefix("x-")).validate()


@pytest.mark.parametrize("name, fn", sorted(serde.SERIALIZERS.items()))
def test_serializer_names_resolve(name, fn):
    _, src = _simple_job()
    src.sink("out", serializer=name, key_serializer=name)
    spec = src.job.nodes[-1].spec
    assert spec["serializer"] is fn and spec["key_serializer"] is fn


def test_builtin_serializers_encode_as_documented():
    _, src = _simple_job()
    src.sink("a", serializer="json", key_serializer="str")
    src.sink("b", serializer="bytes")
    a, b = src.job.nodes[-2].spec, src.job.nodes[-1].spec
    assert a["serializer"]({"b": 1, "a": [2, "é"]}) == b'{"a":[2,"\\u00e9"],"b":1}'
    assert a["key_serializer"](42) == b"42"
    assert b["key_serializer"] is None
    assert b["serializer"](bytearray(b"xy")) == b"xy"
    with pytest.raises(TypeError, match="needs bytes"):
        b["serializer"]("xy")


def test_callable_serializers_are_kept():
    _, src = _simple_job()
    ser, kser = (lambda v: b"v"), (lambda k: b"k")
    src.sink("out", serializer=ser, key_serializer=kser)
    spec = src.job.nodes[-1].spec
    assert spec["serializer"] is ser and spec["key_serializer"] is kser


@pytest.mark.parametrize("kwargs, what", [({"serializer": "avro"}, "serializer"),
                                          ({"key_serializer": "protobuf"}, "key serializer")])
def test_unknown_serializer_names_error(kwargs, what):
    _, src = _simple_job()
    bad = next(iter(kwargs.values()))
    with pytest.raises(ValueError, match=f"unknown {what} '{bad}'; use one of \\['bytes', 'json', 'str'\\]"):
        src.sink("out", **kwargs)
    assert [n.kind for n in src.job.nodes] == ["source"]  # nothing was added


# ---------------------------------------------------------------------------------- planner


FRAUD_TOPICS = Topics.with_prefix("x-")


def _fraud_plan(eu: int = 2, us: int = 2, parallelism: int | None = None, default: int = 3) -> PhysicalPlan:
    job = build_job(FRAUD_TOPICS, parallelism=parallelism)
    return _plan(job, {FRAUD_TOPICS.eu: eu, FRAUD_TOPICS.us: us}, default_parallelism=default)


def _check_channel_consistency(plan: PhysicalPlan) -> None:
    ids = [c.id for c in plan.channels]
    assert ids == list(range(len(ids)))  # unique, dense
    seen_in = []
    for t, p in plan.instances():
        ins = plan.input_channels(t, p)
        assert all(c.dst_task == t and c.dst_partition == p for c in ins)
        seen_in += [c.id for c in ins]
    assert sorted(seen_in) == ids  # every channel has exactly one receiving instance
    for c in plan.channels:
        assert 0 <= c.src_partition < plan.task(c.src_task).parallelism
        assert 0 <= c.dst_partition < plan.task(c.dst_task).parallelism
        assert c in plan.input_channels(c.dst_task, c.dst_partition)
        outs = plan.output_channels(c.src_task, c.src_partition, c.edge_id)
        assert c in outs
        assert [o.dst_partition for o in outs] == sorted(o.dst_partition for o in outs)
    # the two sides of every edge agree
    for t in plan.tasks:
        for ie in t.inputs:
            src = plan.task(ie.src_task)
            (oe,) = [o for o in src.outputs if o.edge_id == ie.edge_id]
            assert oe.dst_task == t.id and oe.partitioning == ie.partitioning
            assert oe.dst_parallelism == t.parallelism


def test_fraud_job_plans_to_the_expected_tasks():
    plan = _fraud_plan()
    assert plan.job_name == "fraud-monitor"
    summary = [(t.id, [n.kind for n in t.chain], t.parallelism) for t in plan.tasks]
    assert summary == [
        (0, ["source"], 2),
        (1, ["source"], 2),
        (2, ["union", "filter"], 2),
        (3, ["process", "sink"], 3),
        (4, ["window", "sink"], 3),
    ]
    names = [[n.name for n in t.chain] for t in plan.tasks]
    assert names[0] == ["source:x-payments-eu"] and names[1] == ["source:x-payments-us"]
    assert names[2][1] == "valid-amount"
    # the rule's output topic is the one Topics field that is neither an input nor the totals
    (rule_topic,) = set(astuple(FRAUD_TOPICS)) - {FRAUD_TOPICS.eu, FRAUD_TOPICS.us, FRAUD_TOPICS.totals}
    assert names[3] == ["fraud-rule", f"sink:{rule_topic}"]
    assert names[4] == ["merchant-totals", f"sink:{FRAUD_TOPICS.totals}"]
    assert [t.chain[-1].spec["topic"] for t in plan.tasks[3:]] == [rule_topic, FRAUD_TOPICS.totals]
    assert [t.is_source for t in plan.tasks] == [True, True, False, False, False]
    assert [t.keyed for t in plan.tasks] == [False, False, False, True, True]
    assert plan.task(3).head.spec["fn"].__class__ is FraudRule


def test_kazoo_orders_the_partitions_with_several_inputs_and_those_of_keyed_functions():
    plan = _fraud_plan(eu=1, us=1, default=2)
    inputs = {t.id: [len(plan.input_channels(t.id, p)) for p in range(t.parallelism)] for t in plan.tasks[2:]}
    assert inputs == {2: [2], 3: [1, 1], 4: [1, 1]}
    # the union's two inputs, and the rule's keyed function (its order log carries processing
    # time); not the window's partitions, with one input each
    assert plan.ordered_partitions() == [(2, 0), (3, 0), (3, 1)]
    assert [t.keyed_functions for t in plan.tasks] == [False, False, False, True, False]


def test_fraud_job_edges_and_channel_counts():
    plan = _fraud_plan(eu=2, us=2, default=3)
    ins = {t.id: [(i.src_task, i.partitioning) for i in t.inputs] for t in plan.tasks}
    assert ins == {0: [], 1: [], 2: [(0, FORWARD), (1, FORWARD)], 3: [(2, HASH)], 4: [(2, HASH)]}
    outs = {t.id: [(o.dst_task, o.partitioning, o.dst_parallelism) for o in t.outputs] for t in plan.tasks}
    assert outs == {0: [(2, FORWARD, 2)], 1: [(2, FORWARD, 2)], 2: [(3, HASH, 3), (4, HASH, 3)], 3: [], 4: []}
    per_edge = Counter((c.src_task, c.dst_task) for c in plan.channels)
    assert per_edge == {(0, 2): 2, (1, 2): 2, (2, 3): 6, (2, 4): 6}
    assert len(plan.channels) == 16 and len(plan.instances()) == 2 + 2 + 2 + 3 + 3
    # forward: one channel per source partition, to the same partition index
    for c in plan.channels:
        if c.dst_task == 2:
            assert c.src_partition == c.dst_partition
    # hash: all to all
    assert {(c.src_partition, c.dst_partition) for c in plan.channels if c.dst_task == 3} == {
        (s, d) for s in range(2) for d in range(3)}
    _check_channel_consistency(plan)
    # each union partition receives one channel from each source; each keyed partition one per union partition
    assert [len(plan.input_channels(2, p)) for p in range(2)] == [2, 2]
    assert [len(plan.input_channels(3, p)) for p in range(3)] == [2, 2, 2]
    assert all(len(plan.output_channels(2, p, e.edge_id)) == 3 for p in range(2) for e in plan.task(2).outputs)


def test_fraud_job_with_unequal_topics_rebalances_into_the_union():
    plan = _fraud_plan(eu=2, us=4, parallelism=5)
    assert [t.parallelism for t in plan.tasks] == [2, 4, 4, 5, 5]  # union: the largest input
    assert [i.partitioning for i in plan.task(2).inputs] == [REBALANCE, FORWARD]
    per_edge = Counter((c.src_task, c.dst_task) for c in plan.channels)
    assert per_edge == {(0, 2): 2 * 4, (1, 2): 4, (2, 3): 4 * 5, (2, 4): 4 * 5}
    _check_channel_consistency(plan)
    assert "fraud-monitor: 5 tasks, 20 instances, 52 channels" in plan.describe()


def test_source_parallelism_defaults_to_the_partition_count():
    job, src = _simple_job()
    src.sink("out")
    plan = _plan(job, {"in": 7})
    assert [(t.parallelism, [n.kind for n in t.chain]) for t in plan.tasks] == [(7, ["source", "sink"])]
    assert plan.channels == []  # chained: no network edge


def test_source_parallelism_above_the_partition_count_is_refused():
    job = Job("j")
    job.source("in", parallelism=5, name="reader").sink("out")
    with pytest.raises(JobDefinitionError, match="source 'reader': parallelism 5 > 4 partitions of topic 'in'"):
        _plan(job, {"in": 4})


def test_missing_topic_is_refused():
    job, src = _simple_job()
    src.sink("out")
    with pytest.raises(JobDefinitionError, match="source 'source:in': topic 'in' does not exist"):
        _plan(job, {"other": 3})


def test_planning_validates_the_graph():
    job, src = _simple_job()
    src.map(_ident)
    with pytest.raises(JobDefinitionError, match="has no sink"):
        _plan(job, {"in": 1})


@pytest.mark.parametrize("n, p", [(1, 1), (4, 2), (5, 2), (7, 3), (3, 3), (12, 5)])
def test_source_kafka_partitions_are_assigned_round_robin(n, p):
    job = Job("j")
    job.source("in", parallelism=p).sink("out")
    plan = _plan(job, {"in": n})
    assignment = plan.source_partitions[0]
    assert sorted(assignment) == list(range(p))
    assert assignment == {q: list(range(q, n, p)) for q in range(p)}
    flat = [k for ks in assignment.values() for k in ks]
    assert sorted(flat) == list(range(n))  # every Kafka partition exactly once
    sizes = [len(ks) for ks in assignment.values()]
    assert max(sizes) - min(sizes) <= 1


def test_source_partitions_of_both_fraud_sources():
    plan = _fraud_plan(eu=3, us=2)
    assert plan.source_partitions == {0: {0: [0], 1: [1], 2: [2]}, 1: {0: [0], 1: [1]}}


def test_forward_between_different_parallelism_becomes_rebalance():
    job, src = _simple_job()
    src.map(_ident, name="wide", parallelism=3).sink("out")
    plan = _plan(job, {"in": 2})
    assert [[n.name for n in t.chain] for t in plan.tasks] == [["source:in"], ["wide", "sink:out"]]
    (edge,) = plan.task(1).inputs
    assert edge.partitioning == REBALANCE
    assert {(c.src_partition, c.dst_partition) for c in plan.channels} == {(s, d) for s in range(2) for d in range(3)}
    _check_channel_consistency(plan)


def test_sink_with_its_own_parallelism_is_not_chained():
    job, src = _simple_job()
    src.map(_ident, name="m").sink("out", parallelism=1)
    plan = _plan(job, {"in": 3})
    assert [[n.kind for n in t.chain] for t in plan.tasks] == [["source", "map"], ["sink"]]
    assert plan.task(1).inputs[0].partitioning == REBALANCE and len(plan.channels) == 3


def test_equal_parallelism_forward_chains_into_one_task():
    job, src = _simple_job()
    src.map(_ident, name="m").filter(bool, name="f").flat_map(list, name="fm").sink("out")
    plan = _plan(job, {"in": 2})
    assert [[n.name for n in t.chain] for t in plan.tasks] == [["source:in", "m", "f", "fm", "sink:out"]]
    assert plan.channels == [] and plan.routing == {}


def test_explicit_rebalance_prevents_chaining_even_at_equal_parallelism():
    job, src = _simple_job()
    src.rebalance().map(_ident, name="m").sink("out")
    plan = _plan(job, {"in": 2})
    assert [[n.name for n in t.chain] for t in plan.tasks] == [["source:in"], ["m", "sink:out"]]
    assert plan.task(1).inputs[0].partitioning == REBALANCE and len(plan.channels) == 4


def test_fan_out_prevents_chaining():
    job, src = _simple_job()
    m = src.map(_ident, name="m")
    m.sink("a")
    m.filter(bool, name="f").sink("b")
    plan = _plan(job, {"in": 2})
    assert [[n.name for n in t.chain] for t in plan.tasks] == [["source:in", "m"], ["sink:a"], ["f", "sink:b"]]
    assert [(o.dst_task, o.partitioning) for o in plan.task(0).outputs] == [(1, FORWARD), (2, FORWARD)]
    assert len(plan.channels) == 4  # two forward edges of parallelism 2
    assert len({c.edge_id for c in plan.channels}) == 2
    _check_channel_consistency(plan)


def test_keyed_operators_start_a_task_and_stateless_ones_chain_after_them():
    job, src = _simple_job()
    (src.key_by(_ident).process(Count(), name="c1")
     .key_by(_ident).window(10, Sum(), name="w")
     .map(_ident, name="m").sink("out"))
    plan = _plan(job, {"in": 2}, default_parallelism=3)
    assert [[n.name for n in t.chain] for t in plan.tasks] == [["source:in"], ["c1"], ["w", "m", "sink:out"]]
    assert [t.parallelism for t in plan.tasks] == [2, 3, 3]
    assert [i.partitioning for t in plan.tasks for i in t.inputs] == [HASH, HASH]
    assert len(plan.channels) == 2 * 3 + 3 * 3


def test_routing_tables_exist_for_hash_input_tasks_and_cover_all_vnodes():
    plan = _fraud_plan(parallelism=5)
    assert sorted(plan.routing) == [3, 4]
    for tid, table in plan.routing.items():
        assert table.num_vnodes == V and table.parallelism == plan.task(tid).parallelism == 5
        assert len(table.assignment) == V
        assert set(table.assignment) == set(range(5))  # every partition owns vnodes
        owned = sorted(v for p in range(5) for v in table.vnodes_of(p))
        assert owned == list(range(V))
        # every key group reaches a partition of the task
        assert {table.partition_of_key_group(kg, G) for kg in range(G)} == set(range(5))
    assert plan.num_key_groups == G


def test_parallelism_above_vnodes_is_refused():
    job, src = _simple_job()
    src.key_by(_ident).process(Count(), name="wide", parallelism=9).sink("out")
    with pytest.raises(JobDefinitionError, match="task 'wide': parallelism 9 exceeds spark.replication.state.vnodes=8"):
        _plan(job, {"in": 1}, num_vnodes=8)
    _plan(job, {"in": 1}, num_vnodes=9)  # equal is fine: one vnode each


def test_max_parallelism_hosts_spare_partitions_that_own_no_vnode_at_the_start():
    job, src = _simple_job()
    src.key_by(_ident).process(Count(), name="elastic", parallelism=2, max_parallelism=3).sink("out")
    plan = _plan(job, {"in": 1}, num_vnodes=8)
    task = next(t for t in plan.tasks if t.name == "elastic")
    assert task.parallelism == 3  # hosted, the chained sink too
    assert len(plan.input_channels(task.id, 2)) == 1  # the spare partition is wired like the others
    table = plan.routing[task.id]
    assert table.parallelism == 2 and sorted(set(table.assignment)) == [0, 1]
    assert "'elastic' x3 (1 spare, for rescale)" in plan.describe()


@pytest.mark.parametrize("kwargs, match", [
    (dict(parallelism=3, max_parallelism=2), "max_parallelism 2 is below its parallelism 3"),
    (dict(max_parallelism=0), "max_parallelism must be a positive int"),
    (dict(max_parallelism=True), "max_parallelism must be a positive int"),
])
def test_max_parallelism_is_validated(kwargs, match):
    job, src = _simple_job()
    with pytest.raises(JobDefinitionError, match=match):
        src.key_by(_ident).process(Count(), name="elastic", **kwargs)


def test_max_parallelism_below_the_default_parallelism_is_refused_at_planning():
    job, src = _simple_job()
    src.key_by(_ident).process(Count(), name="elastic", max_parallelism=2).sink("out")
    with pytest.raises(JobDefinitionError, match="max_parallelism 2 is below its parallelism 3"):
        _plan(job, {"in": 1})


def test_max_parallelism_needs_a_hash_partitioned_input():
    job, src = _simple_job()
    with pytest.raises(JobDefinitionError, match="hash-partitioned input"):
        src.key_by(_ident, prepartitioned=True).process(Count(), name="elastic", max_parallelism=4)


def test_describe_lists_every_task():
    text = _fraud_plan().describe()
    assert "fraud-monitor: 5 tasks, 12 instances, 16 channels" in text
    assert "'fraud-rule' x3: fraud-rule -> sink:x-" in text
    assert "'merchant-totals' x3: merchant-totals -> sink:x-merchant-totals  (inputs: union-2[hash])" in text
    assert "(inputs: kafka)" in text


# ---------------------------------------------------------------------------------- placement


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 7, 12, 20])
@pytest.mark.parametrize("plan_args", [dict(), dict(eu=2, us=4, parallelism=5), dict(eu=1, us=1, parallelism=8)])
def test_place_spreads_instances_evenly(workers, plan_args):
    plan = _fraud_plan(**plan_args)
    placement = place(plan, workers)
    assert sorted(placement) == sorted((t, p, 0) for t, p in plan.instances())
    assert set(placement.values()) <= set(range(workers))
    load = Counter(placement.values())
    counts = [load.get(w, 0) for w in range(workers)]
    assert max(counts) - min(counts) <= 1
    for t in plan.tasks:
        on = [placement[(t.id, p, 0)] for p in range(t.parallelism)]
        if workers >= t.parallelism:
            assert len(set(on)) == t.parallelism, (t.name, on)
        else:  # as spread as the worker count allows
            per_worker = Counter(on)
            assert max(per_worker.values()) - min(per_worker.values()) <= 1
            assert len(per_worker) == workers


def test_place_eight_stateful_partitions_on_three_workers():
    job, src = _simple_job()
    src.key_by(_ident).process(Count(), name="c", parallelism=8).sink("out")
    plan = _plan(job, {"in": 1})
    placement = place(plan, 3)
    assert sorted(Counter(placement.values()).values()) == [3, 3, 3]
    stateful = [placement[(1, p, 0)] for p in range(8)]
    assert sorted(Counter(stateful).values()) == [2, 3, 3]
    assert all(stateful[p] != stateful[p + 1] for p in range(7))  # neighbours never share a worker


def test_place_needs_a_worker():
    with pytest.raises(JobDefinitionError, match="at least 1 worker"):
        place(_fraud_plan(), 0)


def test_place_keeps_the_two_replicas_of_every_partition_apart():
    job, src = _simple_job()
    src.key_by(_ident).process(Count(), name="c", parallelism=8).sink("out")
    plan = _plan(job, {"in": 1})
    plan.replicas = 2
    placement = place(plan, 3)
    assert len(placement) == 2 * len(plan.instances())
    for t, p in plan.instances():
        assert placement[(t, p, 0)] != placement[(t, p, 1)]
    assert sorted(Counter(placement.values()).values()) == [6, 6, 6]  # 18 replicas on 3 workers
    with pytest.raises(JobDefinitionError, match="at least 2 worker"):
        place(plan, 1)


def test_the_readme_job_plans_and_its_config_is_valid():
    """The job on the README's first screen is a job the planner takes, with a valid config."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    assert "handle = run(job, conf=" in code
    scope: dict = {}
    exec(code.replace("handle = run(job, conf=", "conf = ("), scope)  # noqa: S102 - the README's own code
    plan = plan_job(scope["job"], default_parallelism=2, num_key_groups=64, num_vnodes=8,
                    topic_partitions={"payments": 2})
    assert [t.name for t in plan.tasks][-1].startswith("process")
    assert ReplicationConfig.from_mapping(scope["conf"]).enabled


class _NoProcess(KeyedProcessFunction):
    def open(self, ctx):
        pass


class _NoSecond(CoProcessFunction):
    def process1(self, value, ctx):
        return [value]


class _NoCreate(Aggregator):
    def add(self, acc, value):
        return acc


def test_functions_and_aggregators_missing_a_required_method_are_refused_naming_them():
    job = Job("j")
    keyed = job.source("t").key_by(_ident)
    with pytest.raises(JobDefinitionError, match=r"^process '_NoProcess': _NoProcess does not define "
                                                 r"process\(value, ctx\)$"):
        keyed.process(_NoProcess())
    with pytest.raises(JobDefinitionError, match=r"^process 'both': _NoSecond does not define process2\(value, ctx\)$"):
        keyed.stream.connect(job.source("u")).key_by(_ident, _ident).process(_NoSecond(), name="both")
    with pytest.raises(JobDefinitionError, match=r"^window 'w': its aggregator _NoCreate does not define create\(\)$"):
        keyed.window(60_000, _NoCreate(), name="w")


def test_a_window_under_a_second_warns_that_spans_are_milliseconds():
    keyed = Job("j").source("t").key_by(_ident)
    with pytest.warns(UserWarning, match=r"^window: 60 ms is under a second; event-time spans are in milliseconds$"):
        keyed.window(60, CountRecords())
    with pytest.warns(UserWarning, match=r"^session_window 's': 30 ms is under a second"):
        keyed.session_window(30, CountRecords(), name="s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keyed.window(60_000, CountRecords())


@pytest.mark.parametrize("define, message", [
    (lambda j: j.source("t").sink("o", serializer=None),
     "sink 'o': serializer must be one of ['bytes', 'json', 'str'] or a callable, got None"),
    (lambda j: j.source("t", deserializer="avro"),
     "source 't': unknown deserializer 'avro'; use one of ['bytes', 'json', 'str'] or a callable"),
    (lambda j: j.source("t").map(_ident, parallelism=0), "map: parallelism must be a positive int, got 0"),
    (lambda j: j.source("t").map(_ident, parallelism=True), "map: parallelism must be a positive int, got True"),
], ids=["serializer-none", "deserializer-unknown", "parallelism-0", "parallelism-bool"])
def test_bad_arguments_are_refused_in_one_line_naming_the_operator(define, message):
    with pytest.raises(JobDefinitionError) as refused:
        define(Job("j"))
    assert str(refused.value) == message
