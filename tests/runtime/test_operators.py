"""Runtime operators (replication.runtime.operators) driven by a fake hosting instance.

No Spark, no Kafka: the environment offers real keyed state (rhino_state over RocksDB
in a temporary directory), a dead-letter list, fake producers and fake channels.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.api import Job
from replication.functions import Aggregator, KeyedProcessFunction
from replication.handover_orders import HandoverOrder
from replication.metrics import InstanceMetrics
from replication.plan import OutputEdge, plan_job
from replication.runtime.chain import build_chain
from replication.runtime.elements import DATA, END, END_ELEMENT, MAX_WATERMARK, WATERMARK, record
from replication.runtime.handovers import RouterSwitches
from replication.runtime.operators import (
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    Operator,
    ProcessOperator,
    Router,
    SinkOperator,
)
from replication.runtime.pulse_actions import replay_held
from replication.runtime.windows import WindowOperator, serves_through_moves
from replication.windowing import Windows
from rhino_state import (
    RocksDBStateBackend,
    RoutingTable,
    StateContext,
    VnodeMove,
    encode_key,
    key_group,
    vnode_of,
)

G = 128  # key groups


# ---------------------------------------------------------------------------------- fakes


class FakeProducer:
    def __init__(self, buffer_errors: int = 0) -> None:
        self.produced: list[dict] = []
        self.polls: list[float] = []
        self.flushes: list[float] = []
        self._buffer_errors = buffer_errors

    def produce(self, topic, value=None, key=None, headers=None, **more):
        if self._buffer_errors:
            self._buffer_errors -= 1
            raise BufferError("Local: Queue full")
        self.produced.append({"topic": topic, "value": value, "key": key, "headers": headers, **more})

    def poll(self, timeout):
        self.polls.append(timeout)
        return 0

    def flush(self, timeout=None):
        self.flushes.append(timeout)
        return 0


class FakeEnv:
    """What operators use of their hosting PartitionInstance."""

    def __init__(self, backend: RocksDBStateBackend | None = None, *, partition: int = 0, parallelism: int = 1,
                 routing: dict | None = None, producer: FakeProducer | None = None) -> None:
        self.name = f"task[{partition}]"
        self.partition = partition
        self.parallelism = parallelism
        self.metrics = InstanceMetrics()
        self.backend = backend
        self.num_key_groups = G
        self.routing = routing or {}
        self.router_switches = RouterSwitches(self.routing, G)
        self.stop_requested = threading.Event()
        self.acks: list[tuple] = []
        self.producer = producer if producer is not None else FakeProducer()
        self.dead_letters: list[dict] = []
        self.flushed: list[Any] = []

    def handover_ack(self, handover_id: int, epoch: int, kind: str, digest: str = "", entries: int = 0) -> None:
        self.acks.append((handover_id, epoch, kind))

    def dead_letter(self, **kw) -> None:
        self.metrics.dead_lettered += 1
        self.dead_letters.append(kw)

    def state_context(self, name: str) -> StateContext:
        assert self.backend is not None, "this test gave the env no state backend"
        return StateContext(self.backend, name, self.num_key_groups)

    def sink_producer(self) -> FakeProducer:
        return self.producer

    def flush_producer(self, producer) -> None:
        self.flushed.append(producer)
        producer.flush(1.0)


class Collect(Operator):
    """Tail that records what reaches it."""

    def __init__(self) -> None:
        super().__init__("collect", None)
        self.records: list[tuple] = []
        self.watermarks: list[int] = []
        self.ended = 0
        self.sides: list[tuple[str, tuple]] = []  # side outputs: (tag, record)
        self.pulses: list[tuple[int, int]] = []  # (h, processing time)
        self.clocks: list[int] = []  # processing times of KaZoo orders

    def process(self, rec: tuple) -> None:
        self.records.append(rec)

    def on_watermark(self, wm: int) -> None:
        self.watermarks.append(wm)

    def catch_up(self, wm: int, key_groups: frozenset[int]) -> None:
        pass  # a chain's tail does not forward a held record's watermark

    def on_end(self) -> None:
        self.ended += 1

    def side(self, tag: str, rec: tuple) -> None:
        self.sides.append((tag, rec))

    def on_pulse(self, h: int, t: int = 0) -> None:
        self.pulses.append((h, t))

    def on_processing_time(self, t: int) -> None:
        self.clocks.append(t)

    @property
    def values(self) -> list:
        return [r[1] for r in self.records]


class FakeChannel:
    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.elements: list[tuple] = []

    def emit(self, element: tuple) -> None:
        self.elements.append(element)

    @property
    def data(self) -> list[tuple]:
        return [e for e in self.elements if e[0] == DATA]


def chain(*ops: Operator) -> Collect:
    """Link ``ops`` and a Collect tail; return the tail."""
    tail = Collect()
    for a, b in zip((*ops, tail), (*ops, tail)[1:], strict=False):
        a.next = b
    return tail


@pytest.fixture
def backend(tmp_path):
    b = RocksDBStateBackend(tmp_path / "state")
    yield b
    b.close()


@pytest.fixture
def env(backend):
    return FakeEnv(backend)


def rec(value, key=None, ts=0, ingest=0.0, origin=None):
    return record(value, key, ts, ingest, origin)


# ---------------------------------------------------------------------------------- stateless


def test_map_filter_flat_map_pass_values_and_keep_metadata():
    env = FakeEnv()
    m = MapOperator("double", env, lambda v: v * 2)
    f = FilterOperator("odd-input", env, lambda v: v % 4 == 2)
    fm = FlatMapOperator("repeat", env, lambda v: [v] * (v // 6))
    out = chain(m, f, fm)
    inputs = [rec(i, key=f"k{i}", ts=100 + i, ingest=1.5 + i, origin=("t", i % 2, 10 + i)) for i in range(1, 8)]
    for r in inputs:
        m.process(r)
    # 1..7 -> doubled 2..14 -> keep 2,6,10,14 (input odd) -> repeated v//6 times: 6 once, 10 once, 14 twice
    assert out.values == [6, 10, 14, 14]
    by_value = {r[1]: r for r in out.records}
    assert by_value[6] == (DATA, 6, "k3", 103, 4.5, ("t", 1, 13))
    assert by_value[10] == (DATA, 10, "k5", 105, 6.5, ("t", 1, 15))
    assert [r[2:] for r in out.records if r[1] == 14] == [("k7", 107, 8.5, ("t", 1, 17))] * 2
    assert env.dead_letters == []


def test_filter_passes_the_record_itself():
    out_rec = rec({"a": 1}, key="k", ts=5, ingest=2.0, origin=("t", 0, 1))
    f = FilterOperator("f", FakeEnv(), lambda v: True)
    out = chain(f)
    f.process(out_rec)
    assert out.records == [out_rec] and out.records[0] is out_rec


def test_flat_map_accepts_generators_and_none():
    env = FakeEnv()

    def explode(v):
        if v is None:
            return None
        yield from range(v)

    fm = FlatMapOperator("explode", env, explode)
    out = chain(fm)
    for v in (3, None, 0, 2):
        fm.process(rec(v, ts=v or 0))
    assert out.values == [0, 1, 2, 0, 1]
    assert [r[3] for r in out.records] == [3, 3, 3, 2, 2]


@pytest.mark.parametrize("kind", ["map", "filter", "flat_map"])
def test_raising_user_function_dead_letters_and_the_pipeline_goes_on(kind):
    env = FakeEnv()

    def user_fn(v):
        return [10 // v["d"]] if kind == "flat_map" else 10 // v["d"]

    cls = {"map": MapOperator, "filter": FilterOperator, "flat_map": FlatMapOperator}[kind]
    op = cls("user-op", env, user_fn)
    out = chain(op)
    op.process(rec({"d": 2}, ts=1, origin=("in", 0, 0)))
    op.process(rec({"d": 0}, ts=2, origin=("in", 0, 1)))  # ZeroDivisionError
    op.process(rec({"x": 1}, ts=3, origin=("in", 1, 7)))  # KeyError
    op.process(rec({"d": 5}, ts=4, origin=("in", 0, 2)))
    assert [r[3] for r in out.records] == [1, 4]  # the records after the failures went through
    assert env.metrics.dead_lettered == 2
    first, second = env.dead_letters
    assert first["reason"].startswith("ZeroDivisionError: ")
    assert second["reason"].startswith("KeyError: 'd'")
    assert "user_fn" in first["reason"]  # where it happened
    assert first["operator"] == second["operator"] == "user-op"
    assert first["origin"] == ("in", 0, 1) and second["origin"] == ("in", 1, 7)
    assert json.loads(first["payload"]) == {"d": 0} and first["payload_kind"] == "json"


def test_dead_letter_payload_of_non_json_values_is_repr():
    env = FakeEnv()
    op = MapOperator("m", env, lambda v: 1 / 0)
    chain(op)
    op.process(rec({1, 2}))
    op.process(rec(b"\x00raw"))
    assert [(d["payload_kind"], d["payload"]) for d in env.dead_letters] == [
        ("repr", b"{1, 2}"), ("bytes", b"\x00raw")]


def test_stateless_operators_forward_watermarks_and_end():
    env = FakeEnv()
    m, f = MapOperator("m", env, str), FilterOperator("f", env, bool)
    out = chain(m, f)
    m.on_watermark(42)
    m.on_watermark(50)
    m.on_end()
    assert out.watermarks == [42, 50] and out.ended == 1


# ---------------------------------------------------------------------------------- keyed process


class Profile(KeyedProcessFunction):
    """Per key: a running count (value state) and per-tag counts (map state)."""

    def open(self, ctx):
        self.opened = (ctx.operator_name, ctx.partition, ctx.parallelism)
        self.count = ctx.value_state("count", 0)
        self.tags = ctx.map_state("tags")
        self.closed = False

    def process(self, value, ctx):
        if value.get("boom"):
            raise RuntimeError("boom")
        n = self.count.value() + 1
        self.count.update(n)
        self.tags.put(value["tag"], self.tags.get(value["tag"], 0) + 1)
        yield {"key": ctx.key, "ts": ctx.timestamp, "wm": ctx.watermark, "n": n, "tags": dict(self.tags.items())}

    def close(self):
        self.closed = True


def test_process_operator_keeps_state_per_key(backend):
    env = FakeEnv(backend, partition=2, parallelism=4)
    fn = Profile()
    op = ProcessOperator("profile", env, fn)
    out = chain(op)
    assert fn.opened == ("profile", 2, 4)
    seq = [("a", "x"), ("b", "x"), ("a", "y"), ("b", "x"), ("a", "x"), ("c", "z"), ("b", "y")]
    for i, (key, tag) in enumerate(seq):
        op.process(rec({"tag": tag}, key=key, ts=1000 + i, ingest=0.5, origin=("t", 0, i)))
    got = [(r[2], r[1]["n"], r[1]["tags"]) for r in out.records]
    assert got == [
        ("a", 1, {"x": 1}),
        ("b", 1, {"x": 1}),
        ("a", 2, {"x": 1, "y": 1}),
        ("b", 2, {"x": 2}),
        ("a", 3, {"x": 2, "y": 1}),
        ("c", 1, {"z": 1}),
        ("b", 3, {"x": 2, "y": 1}),
    ]
    # outputs carry the key, the record's ts/ingest/origin; the function saw the key and the ts
    assert out.records[3][2:] == ("b", 1003, 0.5, ("t", 0, 3))
    assert [r[1]["key"] for r in out.records] == [k for k, _ in seq]
    assert [r[1]["ts"] for r in out.records] == list(range(1000, 1007))
    # the state really is in the backend, under the operator's name
    ctx = StateContext(backend, "profile", G)
    ctx.set_current_key("a")
    assert ctx.value_state("count", 0).value() == 3
    ctx.set_current_key("zzz")
    assert ctx.value_state("count", 0).value() == 0


def test_process_operator_watermark_reaches_the_function_and_end_closes_it(backend):
    env = FakeEnv(backend)
    fn = Profile()
    op = ProcessOperator("p", env, fn)
    out = chain(op)
    op.on_watermark(77)
    op.process(rec({"tag": "t"}, key=1, ts=80))
    assert out.records[0][1]["wm"] == 77 and out.watermarks == [77]
    assert fn.closed is False
    op.on_end()
    assert fn.closed is True and out.ended == 1


def test_process_operator_dead_letters_a_raising_function_and_goes_on(backend):
    env = FakeEnv(backend)
    op = ProcessOperator("p", env, Profile())
    out = chain(op)
    op.process(rec({"tag": "t"}, key="k", ts=1, origin=("t", 0, 0)))
    op.process(rec({"tag": "t", "boom": True}, key="k", ts=2, origin=("t", 0, 1)))
    op.process(rec({"tag": "t"}, key="k", ts=3, origin=("t", 0, 2)))
    assert [r[1]["n"] for r in out.records] == [1, 2]
    (dl,) = env.dead_letters
    assert dl["reason"].startswith("RuntimeError: boom") and dl["origin"] == ("t", 0, 1) and dl["operator"] == "p"


# ---------------------------------------------------------------------------------- windows


class Stats(Aggregator):
    """count, sum, min, max of the values."""

    def create(self):
        return (0, 0, None, None)

    def add(self, acc, value):
        if value == "bad":
            raise ValueError("bad value")
        n, s, lo, hi = acc
        return (n + 1, s + value, value if lo is None else min(lo, value), value if hi is None else max(hi, value))


def _window(env, size=10, agg=None) -> tuple[WindowOperator, Collect]:
    op = WindowOperator("win", env, Windows.tumbling(size), agg or Stats())
    return op, chain(op)


def _fired(out: Collect) -> list[tuple]:
    return [(r[1]["key"], r[1]["start"], r[1]["end"], r[1]["value"]) for r in out.records]


def test_window_fires_only_when_the_watermark_passes_the_end(env):
    op, out = _window(env)
    op.process(rec(5, key="k", ts=3, ingest=1.0))
    op.process(rec(7, key="k", ts=9, ingest=3.0))
    op.process(rec(1, key="k", ts=10, ingest=2.0))  # next window
    op.on_watermark(8)
    op.on_watermark(9)
    assert out.records == [] and out.watermarks == [8, 9]
    op.on_watermark(10)
    assert _fired(out) == [("k", 0, 10, (2, 12, 5, 7))]
    # result record: key, ts = end - 1, newest ingest time of the window, no origin
    assert out.records[0][0] == DATA and out.records[0][2:] == ("k", 9, 3.0, None)
    assert out.watermarks == [8, 9, 10]  # the watermark follows the results
    op.on_watermark(19)
    assert len(out.records) == 1
    op.on_watermark(20)
    assert _fired(out)[1:] == [("k", 10, 20, (1, 1, 1, 1))]


def test_a_windows_fire_index_moves_with_its_keys_in_a_handover(tmp_path):
    """The origin gives away the fire-index entries of the moved keys (their accumulators leave
    with the keyed state); the target adopts them, and fires at once the moved windows already
    behind its own watermark; neither fires a window twice or loses one."""
    with RocksDBStateBackend(tmp_path / "o") as ob, RocksDBStateBackend(tmp_path / "t") as tb:
        origin, origin_out = _window(FakeEnv(ob))
        target, target_out = _window(FakeEnv(tb))
        for key, ts in (("moved", 3), ("moved", 14), ("stays", 5)):
            origin.process(rec(1, key=key, ts=ts, ingest=1.0))
        moved_kg = key_group(encode_key("moved"), G)
        entries = origin.cut_keys(lambda kg: kg == moved_kg)
        assert sorted((e[0], e[2]) for e in entries) == [(10, "moved"), (20, "moved")]
        state = list(ob.iter_key_groups(range(moved_kg, moved_kg + 1)))  # what PartitionHandovers.cut moves
        for kg, rest, _ in state:
            ob.delete(kg, rest)
        origin.on_watermark(30)
        assert [r[0] for r in _fired(origin_out)] == ["stays"]  # the moved windows do not fire here
        target.on_watermark(12)  # the target is already past the first moved window's end
        for kg, rest, value in state:
            tb.put(kg, rest, value)
        target.adopt_keys(entries)
        target.process(rec(1, key="moved", ts=15, ingest=2.0))  # a record it held, for the second window
        target.fire_behind()
        assert _fired(target_out) == [("moved", 0, 10, (1, 1, 1, 1))]
        target.on_watermark(20)
        assert _fired(target_out)[1:] == [("moved", 10, 20, (2, 2, 1, 1))]


def test_a_window_target_judges_and_fires_held_records_at_the_watermark_they_arrived_at(tmp_path):
    """A handover target replays the records it held of the moved keys each at the watermark it
    arrived at: one the newer watermark would make late counts, and the moved key's windows fire
    at the watermark that passed their end while it waited; the other keys' fired on time."""
    with RocksDBStateBackend(tmp_path / "t") as tb:
        env = FakeEnv(tb)
        target, out = _window(env)
        groups = frozenset({key_group(encode_key("moved"), G)})
        target.on_watermark(5)
        held = [(0, rec(1, key="moved", ts=7, ingest=1.0), 5)]
        target.process(rec(2, key="stays", ts=8, ingest=1.0))
        target.on_watermark(12)
        held.append((0, rec(3, key="moved", ts=11, ingest=1.0), 12))
        target.on_watermark(25)
        assert _fired(out) == [("stays", 0, 10, (1, 2, 2, 2))]
        replay_held(target, tuple(held), groups, [12, 25], 25, lambda _, r: target.process(r))
        target.fire_behind()
        assert _fired(out)[1:] == [("moved", 0, 10, (1, 1, 1, 1)), ("moved", 10, 20, (1, 3, 3, 3))]
        assert target.watermark == 25 and env.metrics.late_records == 0 and env.dead_letters == []


class Holding:
    """What a router asks of its instance's handovers: whether a target step holds records."""

    def __init__(self) -> None:
        self.now = False

    def holding(self) -> bool:
        return self.now


def test_a_router_withholds_its_watermark_while_a_handover_target_holds_records():
    env = FakeEnv()
    env.handovers = Holding()
    chans = [FakeChannel(0)]
    router = Router("r", env, [(_edge("forward", 3, 1), chans)])
    router.on_watermark(5)
    env.handovers.now = True
    router.on_watermark(8)
    router.on_watermark(9)
    router.forward_withheld()  # still holding: nothing yet
    assert [e[1] for e in chans[0].elements if e[0] == WATERMARK] == [5]
    env.handovers.now = False
    router.forward_withheld()
    router.forward_withheld()  # once
    assert [e[1] for e in chans[0].elements if e[0] == WATERMARK] == [5, 9]


class MergeableStats(Stats):
    def merge(self, first, second):
        n1, s1, lo1, hi1 = first
        n2, s2, lo2, hi2 = second
        return (n1 + n2, s1 + s2, min(x for x in (lo1, lo2) if x is not None),
                max(x for x in (hi1, hi2) if x is not None))


class Awaiting:
    """What a window operator asks of its instance's handovers: the key groups it serves whose moved
    state is not merged in yet."""

    def __init__(self, groups=()) -> None:
        self.groups = frozenset(groups)

    def awaited_key_groups(self) -> frozenset[int]:
        return self.groups


def test_a_task_serves_moved_keys_through_a_handover_only_if_its_windows_merge(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as backend:
        env = FakeEnv(backend)
        merging = WindowOperator("a", env, Windows.tumbling(10), MergeableStats())
        plain = WindowOperator("b", env, Windows.tumbling(10), Stats())
        process = ProcessOperator("c", env, Profile())
        stateless = MapOperator("d", env, lambda v: v)
        assert serves_through_moves([stateless, merging]) and merging.mergeable and not plain.mergeable
        assert not serves_through_moves([merging, plain]) and not serves_through_moves([merging, process])
        assert not serves_through_moves([stateless])  # nothing keyed: nothing to serve


def test_a_target_serving_moved_keys_fires_their_windows_only_once_the_moved_state_is_merged_in(tmp_path):
    """The origin aggregated part of a moved key's windows; the target aggregates the records after
    the switch into fresh accumulators, and does not fire those windows while their moved state is
    awaited, even past their end.  Merged in (moved first), they fire with the result a single
    partition would have had, and a key that did not move fires as usual meanwhile."""
    with RocksDBStateBackend(tmp_path / "o") as ob, RocksDBStateBackend(tmp_path / "t") as tb:
        origin, _ = _window(FakeEnv(ob), agg=MergeableStats())
        env = FakeEnv(tb)
        target, out = _window(env, agg=MergeableStats())
        moved_kg = key_group(encode_key("moved"), G)
        env.handovers = Awaiting({moved_kg})
        origin.process(rec(5, key="moved", ts=3, ingest=1.0))
        origin.process(rec(9, key="moved", ts=12, ingest=1.5))
        entries = origin.cut_keys(lambda kg: kg == moved_kg)
        state = list(ob.iter_key_groups(range(moved_kg, moved_kg + 1)))
        target.process(rec(2, key="moved", ts=7, ingest=3.0))  # after the switch, served at once
        target.process(rec(4, key="stays", ts=8, ingest=3.0))
        target.on_watermark(10)
        assert _fired(out) == [("stays", 0, 10, (1, 4, 4, 4))]  # the moved window waits for its state
        for kg, rest, value in state:  # PartitionHandovers.release with the instance's merge
            served = tb.get(kg, rest)
            assert rest.startswith(target.state_prefix)
            tb.put(kg, rest, value if served is None else target.merge_raw(value, served))
        target.adopt_keys(entries)
        env.handovers = Awaiting()
        target.fire_behind()
        assert _fired(out)[1:] == [("moved", 0, 10, (2, 7, 2, 5))]
        assert out.records[-1][4] == 3.0  # the newest ingest time of the window, the served record's
        target.on_watermark(20)
        assert _fired(out)[2:] == [("moved", 10, 20, (1, 9, 9, 9))]


def test_window_state_does_not_depend_on_ingest_times(tmp_path):
    """Two replicas see the same records with different ingest times (stamped by whichever source
    replica's copy came first): their keyed state, compared at checkpoints, must be equal; the
    newest ingest time still reaches the result, and survives a snapshot/restore."""
    digests = []
    for i, ingests in enumerate(((1.0, 5.0), (4.0, 2.0))):
        with RocksDBStateBackend(tmp_path / f"r{i}") as backend:
            op, out = _window(FakeEnv(backend))
            op.process(rec(5, key="k", ts=3, ingest=ingests[0]))
            op.process(rec(7, key="k", ts=4, ingest=ingests[1]))
            digests.append(backend.digest())
            twin, twin_out = _window(FakeEnv(backend))
            twin.restore(op.snapshot())
            twin.on_watermark(10)
            assert twin_out.records[0][4] == max(ingests)
    assert digests[0] == digests[1]


def test_window_emits_each_window_once_and_clears_its_state(env):
    op, out = _window(env)
    for ts in (0, 4, 15):
        op.process(rec(ts, key="k", ts=ts))
    op.on_watermark(30)
    op.on_watermark(30)  # not an advance: ignored, not forwarded
    op.on_watermark(25)
    op.on_watermark(MAX_WATERMARK)
    assert _fired(out) == [("k", 0, 10, (2, 4, 0, 4)), ("k", 10, 20, (1, 15, 15, 15))]
    assert out.watermarks == [30, MAX_WATERMARK]
    op.state.set_current_key("k")
    assert op.windows.is_empty() and op.fire_index.due == {}


def test_window_fires_in_end_then_encoded_key_order(env):
    op, out = _window(env)
    # keys of several types; encoded order: int < str < tuple, strs by code point
    arrivals = [("b", 25), ("b", 3), (("t", 1), 1), ("a", 14), (7, 8), ("a", 2), ("B", 5), (-3, 12)]
    for key, ts in arrivals:
        op.process(rec(1, key=key, ts=ts))
    op.on_watermark(100)
    order = [(k, s) for k, s, _, _ in _fired(out)]
    assert order == [(7, 0), ("B", 0), ("a", 0), ("b", 0), (("t", 1), 0), (-3, 10), ("a", 10), ("b", 20)]
    expected = sorted(((s + 10, encode_key(k)) for k, s in order))
    assert [(s + 10, encode_key(k)) for k, s in order] == expected


def test_window_handles_negative_event_times(env):
    op, out = _window(env)
    op.process(rec(1, key="k", ts=-1))
    op.process(rec(2, key="k", ts=-10))
    op.process(rec(4, key="k", ts=-11))
    op.on_watermark(0)
    assert _fired(out) == [("k", -20, -10, (1, 4, 4, 4)), ("k", -10, 0, (2, 3, 1, 2))]


def test_late_records_go_to_dead_letter_and_are_counted(env):
    op, out = _window(env)
    op.process(rec(1, key="k", ts=5))
    op.on_watermark(10)
    op.process(rec(2, key="k", ts=7, origin=("pay", 1, 99)))  # window [0, 10) already fired
    op.process(rec(3, key="other", ts=9, origin=("pay", 0, 5)))  # any key
    op.process(rec(4, key="k", ts=10))  # on time: window [10, 20) is open
    op.on_watermark(20)
    assert _fired(out) == [("k", 0, 10, (1, 1, 1, 1)), ("k", 10, 20, (1, 4, 4, 4))]
    assert env.metrics.late_records == 2 and env.metrics.dead_lettered == 2
    late, late2 = env.dead_letters
    assert late["reason"].startswith("late")
    assert "7" in late["reason"] and "10" in late["reason"]
    assert late["operator"] == "win" and late["origin"] == ("pay", 1, 99)
    assert json.loads(late["payload"]) == 2
    assert late2["reason"].startswith("late") and late2["origin"] == ("pay", 0, 5)


def test_window_aggregator_errors_dead_letter_and_the_window_goes_on(env):
    op, out = _window(env)
    op.process(rec(1, key="k", ts=1))
    op.process(rec("bad", key="k", ts=2, origin=("t", 0, 1)))
    op.process(rec(5, key="k", ts=3))
    op.on_watermark(10)
    assert _fired(out) == [("k", 0, 10, (2, 6, 1, 5))]
    (dl,) = env.dead_letters
    assert dl["reason"].startswith("ValueError: bad value") and env.metrics.late_records == 0


def test_window_result_errors_dead_letter_and_other_windows_still_fire(env):
    class Picky(Stats):
        def result(self, key, start, end, acc):
            if key == "x":
                raise KeyError("no result for x")
            return super().result(key, start, end, acc)

    op, out = _window(env, agg=Picky())
    for key in ("y", "x", "z"):
        op.process(rec(2, key=key, ts=4))
    op.on_watermark(10)
    assert [k for k, *_ in _fired(out)] == ["y", "z"]
    (dl,) = env.dead_letters
    assert dl["reason"].startswith("KeyError") and dl["origin"] is None
    assert json.loads(dl["payload"]) == {"key": "x", "start": 0, "acc": [1, 2, 2, 2]}


def test_window_keeps_the_newest_ingest_time(env):
    op, out = _window(env)
    for ingest in (5.0, 9.0, 7.0):
        op.process(rec(1, key="k", ts=1, ingest=ingest))
    op.on_watermark(10)
    assert out.records[0][4] == 9.0


# ---------------------------------------------------------------------------------- build_chain


class Counting(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", 0)
        self.partition = ctx.partition

    def process(self, value, ctx):
        n = self.n.value() + 1
        self.n.update(n)
        return [(self.partition, ctx.key, n)]


def _keyed_plan_chain(job_fn):
    job = Job("j")
    src = job.source("in")
    job_fn(src)
    plan = plan_job(job, default_parallelism=2, num_key_groups=G, num_vnodes=8, topic_partitions={"in": 1})
    return plan.task(1).chain


def test_build_chain_copies_the_process_function_per_instance(tmp_path):
    user_fn = Counting()
    nodes = _keyed_plan_chain(lambda s: s.key_by(lambda v: v).process(user_fn, name="count").sink("out"))
    assert [n.kind for n in nodes] == ["process", "sink"]
    backends = [RocksDBStateBackend(tmp_path / f"p{p}") for p in range(2)]
    try:
        envs = [FakeEnv(b, partition=p, parallelism=2) for p, b in enumerate(backends)]
        heads = [build_chain(nodes, e, None) for e in envs]
        fns = [h.fn for h in heads]
        assert isinstance(heads[0], ProcessOperator) and isinstance(heads[0].next, SinkOperator)
        assert fns[0] is not fns[1] and user_fn not in fns
        assert not hasattr(user_fn, "n")  # the job's object was never opened
        assert fns[0].n is not fns[1].n
        for h, keys in ((heads[0], ["k", "k", "j"]), (heads[1], ["k"])):
            for k in keys:
                h.process(rec(k, key=k, ts=1, ingest=time.time()))
        produced = [[json.loads(m["value"]) for m in e.producer.produced] for e in envs]
        assert produced == [[[0, "k", 1], [0, "k", 2], [0, "j", 1]], [[1, "k", 1]]]
        for b, expected in zip(backends, (2, 1), strict=True):
            ctx = StateContext(b, "count", G)
            ctx.set_current_key("k")
            assert ctx.value_state("n", 0).value() == expected
    finally:
        for b in backends:
            b.close()


def test_build_chain_copies_the_window_aggregator_per_instance(tmp_path):
    agg = Stats()
    nodes = _keyed_plan_chain(lambda s: s.key_by(len).window(10, agg, name="w").map(str, name="m").sink("out"))
    with RocksDBStateBackend(tmp_path / "s") as b:
        env = FakeEnv(b)
        tail = Collect()
        head = build_chain(nodes, env, tail)
        assert [type(o).__name__ for o in (head, head.next, head.next.next)] == [
            "WindowOperator", "MapOperator", "SinkOperator"]
        assert head.agg is not agg and isinstance(head.agg, Stats) and head.size == 10
        # a sink is a tail: the given tail is linked after it but sinks never call it
        assert head.next.next.next is tail


def test_build_chain_skips_union_and_source_and_links_the_tail():
    job = Job("j")
    a, b = job.source("a"), job.source("b")
    a.union(b).map(lambda v: v + 1, name="inc").sink("out")
    plan = plan_job(job, default_parallelism=1, num_key_groups=G, num_vnodes=8,
                    topic_partitions={"a": 1, "b": 1})
    union_task = plan.task(2)
    assert [n.kind for n in union_task.chain] == ["union", "map", "sink"]
    env = FakeEnv()
    head = build_chain(union_task.chain, env, None)
    assert isinstance(head, MapOperator)
    head.process(rec(41, ts=3, ingest=time.time()))
    assert [m["value"] for m in env.producer.produced] == [b"42"]
    src_head = build_chain(plan.task(0).chain, env, Collect())  # source excluded: just the tail
    assert isinstance(src_head, Collect)


def test_build_chain_refuses_empty_and_unknown():
    job = Job("j")
    job.source("in").sink("out")
    source_node = job.nodes[0]
    with pytest.raises(ValueError, match="empty chain"):
        build_chain([source_node], FakeEnv(), None)

    class Odd:
        kind, spec, name = "teleport", {}, "odd"

    with pytest.raises(ValueError, match="unknown operator kind 'teleport'"):
        build_chain([Odd()], FakeEnv(), None)


# ---------------------------------------------------------------------------------- router


def _edge(partitioning, dst_task, n, key_fn=None, edge_id=0):
    return OutputEdge(edge_id, dst_task, partitioning, key_fn, n)


def test_router_hash_routes_by_key_group_through_the_routing_table():
    table = RoutingTable.uniform(16, 4)
    env = FakeEnv(routing={7: table})
    chans = [FakeChannel(i) for i in range(4)]
    router = Router("r", env, [(_edge("hash", 7, 4, key_fn=lambda v: v["card"]), chans)])
    keys = [f"card-{i}" for i in range(200)] + [i for i in range(50)] + [("t", i) for i in range(20)]
    for rnd in range(2):
        for i, k in enumerate(keys):
            router.process(rec({"card": k, "i": i}, ts=rnd, ingest=1.0, origin=("t", 0, i)))
    where: dict = defaultdict(set)
    for ch in chans:
        for el in ch.data:
            where[encode_key(el[2])].add(ch.idx)
            assert el[1]["card"] == el[2]  # the element now carries its key
    assert len(where) == len(keys)
    assert all(len(s) == 1 for s in where.values())  # a key always goes to the same channel
    for k in keys:
        expected = table.partition_of_key_group(key_group(encode_key(k), G), G)
        assert where[encode_key(k)] == {expected}
        # the receiving partition owns the vnode of the key group its keyed state will use
        ctx = StateContext(None, "x", G)  # no backend needed to compute the key group
        ctx.set_current_key(k)
        assert vnode_of(ctx.current_key_group, G, 16) in table.vnodes_of(expected)
    counts = [len(ch.data) for ch in chans]
    assert sum(counts) == 2 * len(keys) and min(counts) > len(keys) // 8  # spread over all channels
    assert env.metrics.records_out == 2 * len(keys)
    # the load per vnode (what a rebalance is planned from): every record counted at its key's vnode
    routed = env.metrics.routed[7]
    assert len(routed) == 16 and sum(routed) == 2 * len(keys)
    for p, ch in enumerate(chans):
        assert sum(routed[v] for v in table.vnodes_of(p)) == len(ch.data)
    assert routed == [2 * sum(vnode_of(key_group(encode_key(k), G), G, 16) == v for k in keys) for v in range(16)]


def test_router_follows_a_moved_routing_table():
    table = RoutingTable.uniform(8, 2).moved(range(8), 1)  # every vnode on partition 1
    env = FakeEnv(routing={3: table})
    chans = [FakeChannel(i) for i in range(2)]
    router = Router("r", env, [(_edge("hash", 3, 2, key_fn=str), chans)])
    for i in range(30):
        router.process(rec(i))
    assert chans[0].elements == [] and [e[1] for e in chans[1].data] == list(range(30))


def _order(table: RoutingTable, moved: RoutingTable, vnodes: list[int], target: int, switch_at: int, *,
           committed: bool = False, cancelled: bool = False) -> HandoverOrder:
    origin = table.partition_of_vnode(vnodes[0])
    return HandoverOrder(1, moved.epoch, 3, moved, tuple(VnodeMove(v, origin, target) for v in vnodes), switch_at,
                         switch_at + 5, frozenset({(0, 0)}), committed, cancelled)


def test_router_switches_its_table_right_after_the_handover_pulse():
    """Both replicas of an upstream reroute at the same element: the records after pulse P."""
    table = RoutingTable.uniform(8, 2)
    moved = table.moved(range(8), 1)  # epoch 1: everything on partition 1
    env = FakeEnv(routing={3: table})
    chans = [FakeChannel(i) for i in range(2)]
    router = Router("r", env, [(_edge("hash", 3, 2, key_fn=str), chans)])
    assert env.router_switches.arm(_order(table, moved, list(table.vnodes_of(0)), 1, switch_at=5,
                                          committed=True)) == "armed"
    for h in range(1, 6):
        for i in range(10):
            router.process(rec(h * 100 + i))
        router.on_pulse(h)
    before = [e[1] for e in chans[0].data]
    assert before and all(v < 600 for v in before)
    for i in range(10):
        router.process(rec(600 + i))
    assert [e[1] for e in chans[0].data] == before  # nothing more to partition 0 after pulse 5
    assert env.acks == [(1, 1, "switched")]
    assert env.router_switches.arm(_order(table, moved, list(table.vnodes_of(0)), 1, switch_at=4)) == "done"  # in force
    later = moved.moved([0], 0)  # epoch 2, switching at pulse 5, which was already forwarded
    assert env.router_switches.arm(HandoverOrder(2, later.epoch, 3, later, (VnodeMove(0, 1, 0),), 5, 9,
                                                 frozenset({(0, 0)}))) == "late"


def test_router_waits_at_an_uncommitted_switch_until_the_commit_or_the_cancel():
    table = RoutingTable.uniform(8, 2)
    moved = table.moved(range(4), 1)
    for word in ("commit", "cancel"):
        env = FakeEnv(routing={3: table})
        chans = [FakeChannel(i) for i in range(2)]
        router = Router("r", env, [(_edge("hash", 3, 2, key_fn=str), chans)])
        order = _order(table, moved, [0, 1, 2, 3], 1, switch_at=2)
        assert env.router_switches.arm(order) == "armed"
        router.on_pulse(1)
        t = threading.Thread(target=router.on_pulse, args=(2,), daemon=True)
        t.start()
        t.join(0.3)
        assert t.is_alive()  # blocked at pulse 2: nobody knows yet whether the switch happens
        env.router_switches.arm(replace(order, committed=word == "commit", cancelled=word == "cancel"))
        t.join(5)
        assert not t.is_alive()
        assert env.acks == ([(1, 1, "switched")] if word == "commit" else [])
        assert env.router_switches.partition_of(3, 0) == (1 if word == "commit" else 0)


def test_router_key_fn_error_dead_letters_only_that_edge():
    env = FakeEnv(routing={1: RoutingTable.uniform(4, 2)})
    hashed = [FakeChannel(i) for i in range(2)]
    fwd = [FakeChannel(0)]
    router = Router("r", env, [(_edge("hash", 1, 2, key_fn=lambda v: v["k"], edge_id=0), hashed),
                               (_edge("forward", 2, 1, edge_id=1), fwd)])
    router.process(rec({"no-key": 1}, origin=("t", 0, 4)))
    router.process(rec({"k": "x"}))
    assert sum(len(c.data) for c in hashed) == 1 and len(fwd[0].data) == 2
    (dl,) = env.dead_letters
    assert dl["reason"].startswith("key_by: KeyError") and dl["origin"] == ("t", 0, 4)


def test_router_key_of_unsupported_type_dead_letters():
    env = FakeEnv(routing={1: RoutingTable.uniform(4, 2)})
    chans = [FakeChannel(i) for i in range(2)]
    router = Router("r", env, [(_edge("hash", 1, 2, key_fn=lambda v: [v]), chans)])
    router.process(rec(1))
    assert env.dead_letters[0]["reason"].startswith("key_by: TypeError")
    assert all(c.elements == [] for c in chans)


def test_router_rebalance_round_robins():
    env = FakeEnv()
    chans = [FakeChannel(i) for i in range(3)]
    router = Router("r", env, [(_edge("rebalance", 1, 3), chans)])
    sent = [rec(i, key="k", ts=i, ingest=0.1, origin=("t", 0, i)) for i in range(8)]
    for r in sent:
        router.process(r)
    assert [c.elements for c in chans] == [[sent[0], sent[3], sent[6]], [sent[1], sent[4], sent[7]],
                                           [sent[2], sent[5]]]


def test_router_forward_uses_its_one_channel():
    env = FakeEnv()
    ch = FakeChannel(0)
    router = Router("r", env, [(_edge("forward", 1, 2), [ch])])
    sent = [rec(i, key=None, ts=10 * i, ingest=2.0, origin=("t", 1, i)) for i in range(5)]
    for r in sent:
        router.process(r)
    assert ch.elements == sent


def test_router_broadcasts_watermarks_and_end_on_every_edge():
    env = FakeEnv(routing={1: RoutingTable.uniform(4, 3)})
    hashed = [FakeChannel(i) for i in range(3)]
    rebal = [FakeChannel(i) for i in range(2)]
    fwd = [FakeChannel(0)]
    router = Router("r", env, [(_edge("hash", 1, 3, key_fn=str, edge_id=0), hashed),
                               (_edge("rebalance", 2, 2, edge_id=1), rebal),
                               (_edge("forward", 3, 1, edge_id=2), fwd)])
    router.process(rec("v"))
    router.on_watermark(123)
    router.on_end()
    for ch in (*hashed, *rebal, *fwd):
        control = [e for e in ch.elements if e[0] != DATA]
        assert control == [(WATERMARK, 123), (END,)]
        assert ch.elements[-1] == END_ELEMENT
    assert sum(len(c.data) for c in hashed) == 1 and len(rebal[0].data) == 1 and len(fwd[0].data) == 1


# ---------------------------------------------------------------------------------- sink


def test_sink_writes_value_key_and_headers_and_records_latency():
    env = FakeEnv()
    sink = SinkOperator("sink:out", env, "out", lambda v: json.dumps(v).encode(), lambda k: str(k).encode())
    ingest = time.time() - 0.25
    before = time.time()
    sink.process(rec({"a": 1}, key="card-1", ts=5, ingest=ingest, origin=("in", 0, 3)))
    after = time.time()
    (msg,) = env.producer.produced
    assert msg["topic"] == "out" and msg["value"] == b'{"a": 1}' and msg["key"] == b"card-1"
    headers = dict(msg["headers"])
    assert [h for h, _ in msg["headers"]] == ["ingest_ts", "sink_ts"]
    assert headers["ingest_ts"] == repr(ingest).encode()
    sink_ts = float(headers["sink_ts"])
    assert before <= sink_ts <= after
    assert env.metrics.records_out == 1 and env.metrics.latency.count == 1
    assert env.metrics.latency.total == pytest.approx(sink_ts - ingest)
    assert 0.25 <= env.metrics.latency.max < 0.25 + (after - before) + 0.01
    assert env.producer.polls == [0]  # served delivery reports without blocking


def test_sink_without_key_serializer_writes_no_key():
    env = FakeEnv()
    sink = SinkOperator("s", env, "out", lambda v: str(v).encode(), None)
    sink.process(rec(7, key="ignored", ingest=time.time()))
    assert env.producer.produced[0]["key"] is None and env.producer.produced[0]["value"] == b"7"


def test_sink_retries_when_the_producer_queue_is_full():
    env = FakeEnv(producer=FakeProducer(buffer_errors=2))
    sink = SinkOperator("s", env, "out", lambda v: v, None)
    sink.process(rec(b"x", ingest=time.time()))
    assert [m["value"] for m in env.producer.produced] == [b"x"]
    assert env.producer.polls == [0.05, 0.05, 0]
    assert env.metrics.records_out == 1


def test_sink_serializer_error_dead_letters_and_goes_on():
    env = FakeEnv()
    from replication.serde import to_bytes

    sink = SinkOperator("s", env, "out", to_bytes, None)
    sink.process(rec("not bytes", ingest=time.time(), origin=("in", 2, 8)))
    sink.process(rec(b"ok", ingest=time.time()))
    assert [m["value"] for m in env.producer.produced] == [b"ok"]
    (dl,) = env.dead_letters
    assert dl["reason"].startswith("serialize: TypeError") and dl["origin"] == ("in", 2, 8)
    assert env.metrics.records_out == 1


def test_sink_ignores_watermarks_and_flushes_at_end():
    env = FakeEnv()
    sink = SinkOperator("s", env, "out", lambda v: v, None)
    sink.on_watermark(10)  # a sink is a tail: nothing to forward to
    assert env.producer.produced == [] and env.flushed == []
    sink.on_end()
    assert env.flushed == [env.producer] and env.producer.flushes == [1.0]


# ---------------------------------------------------------------------------------- properties


@pytest.fixture(scope="module")
def shared_backend(tmp_path_factory):
    b = RocksDBStateBackend(tmp_path_factory.mktemp("windows"))
    yield b
    b.close()


_uids = itertools.count()
KEYS = st.sampled_from(["a", "b", "c", "", 0, 1, -1, 2.5, ("t", 1), None])
RECORDS = st.lists(st.tuples(KEYS, st.integers(-50, 300), st.integers(-5, 5)), max_size=60)


def _run_window(backend, size, events) -> tuple[list[tuple], FakeEnv]:
    """Feed ("rec", key, ts, value) / ("wm", ts) events, then the max watermark."""
    env = FakeEnv(backend)
    op = WindowOperator(f"w{next(_uids)}", env, Windows.tumbling(size), Stats())  # a fresh state namespace per example
    out = chain(op)
    for ev in events:
        if ev[0] == "rec":
            op.process(rec(ev[3], key=ev[1], ts=ev[2]))
        else:
            op.on_watermark(ev[1])
    op.on_watermark(MAX_WATERMARK)
    results = [(encode_key(r[2]), r[1]["start"], r[1]["end"], r[1]["value"], r[3]) for r in out.records]
    return results, env


def _group_by(size, records) -> Counter:
    groups: dict = defaultdict(list)
    for key, ts, value in records:
        groups[(encode_key(key), ts - ts % size)].append(value)
    return Counter((k, s, s + size, (len(vs), sum(vs), min(vs), max(vs)), s + size - 1)
                   for (k, s), vs in groups.items())


@settings(max_examples=60, deadline=None)
@given(size=st.sampled_from([1, 7, 50, 1000]), records=RECORDS, data=st.data())
def test_window_output_equals_group_by_whatever_the_interleaving(shared_backend, size, records, data):
    shuffled = data.draw(st.permutations(records))
    first, env1 = _run_window(shared_backend, size, [("rec", k, ts, v) for k, ts, v in records])
    second, env2 = _run_window(shared_backend, size, [("rec", k, ts, v) for k, ts, v in shuffled])
    assert Counter(first) == _group_by(size, records)
    assert len(first) == len(set(first))  # each window fired once
    # firing order is deterministic, so even the sequence is the same for both interleavings
    assert second == first
    assert [(r[2], r[0]) for r in first] == sorted((r[2], r[0]) for r in first)
    assert env1.dead_letters == env2.dead_letters == []


@settings(max_examples=60, deadline=None)
@given(size=st.sampled_from([5, 20, 100]),
       events=st.lists(st.one_of(st.tuples(st.just("rec"), KEYS, st.integers(0, 300), st.integers(0, 9)),
                                 st.tuples(st.just("wm"), st.integers(-10, 320))), max_size=60))
def test_window_with_watermarks_drops_exactly_the_late_records(shared_backend, size, events):
    wm = -(2**63)
    on_time, late = [], 0
    for ev in events:
        if ev[0] == "wm":
            wm = max(wm, ev[1])
        elif ev[2] - ev[2] % size + size <= wm:
            late += 1
        else:
            on_time.append(ev[1:])
    results, env = _run_window(shared_backend, size, events)
    assert Counter(results) == _group_by(size, on_time)
    assert env.metrics.late_records == late == len(env.dead_letters)
    assert all(d["reason"].startswith("late") for d in env.dead_letters)
    ends = [r[2] for r in results]
    assert ends == sorted(ends)  # windows come out in event-time order across watermarks
