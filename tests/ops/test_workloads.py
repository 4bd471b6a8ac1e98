"""The BetterCloud-like and NEXMark-like workloads: their references and verifiers (fast, no Spark:
the jobs' own functions run through a small interpreter of the job graph on real RocksDB state),
the benchmark's rows and plot from made-up runs, and one run of each job on Spark (slow)."""

from __future__ import annotations

import copy
import csv
import json
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from replication.api import Job
from replication.examples.nexmark import (
    NEXMARK_JOIN,
    NexmarkConfig,
    NexmarkGenerator,
    NexmarkTopics,
    build_nexmark_job,
    nexmark_reference,
    nexmark_state_bytes,
    payload_for_state,
    verify_nexmark,
)
from replication.examples.workloads import (
    AUDIT,
    BetterCloudGenerator,
    BetterCloudTopics,
    bettercloud_reference,
    build_bettercloud_job,
    canonical,
    consumption_order,
    verify_bettercloud,
)
from replication.functions import ProcessContext, RuntimeContext
from replication.plan import plan_job
from rhino_state.backend import RocksDBStateBackend
from rhino_state.state import StateContext

REPO = Path(__file__).resolve().parents[2]
START_TS = 1_700_000_000_000
KEY_GROUPS = 1 << 15
BC = BetterCloudTopics.with_prefix("")
NX = NexmarkTopics.with_prefix("")


# -- a local interpreter of a job graph (one instance per operator, state in RocksDB) ----------

class LocalRun:
    """Pushes source records one at a time through the job's own operators, depth first: one valid
    consumption order, without Spark. Keyed state lives in a RocksDB per keyed operator."""

    def __init__(self, job: Job, state_dir: Path) -> None:
        self.job = job
        self.consumers: dict[int, list[tuple[Any, Any]]] = defaultdict(list)
        for node in job.nodes:
            for edge in node.inputs:
                self.consumers[edge.source.id].append((node, edge))
        self.sources = {n.spec["topic"]: n for n in job.nodes if n.kind == "source"}
        self.outputs: dict[str, list[Any]] = defaultdict(list)
        self.backends: dict[str, RocksDBStateBackend] = {}
        self.keyed: dict[int, tuple[Any, StateContext]] = {}
        for node in job.nodes:
            if node.kind == "process":
                backend = self.backends[node.name] = RocksDBStateBackend(str(state_dir / node.name))
                state = StateContext(backend, node.name, KEY_GROUPS)
                fn = copy.deepcopy(node.spec["fn"])
                fn.open(RuntimeContext(state, node.name, 0, 1))
                self.keyed[node.id] = (fn, state)

    def feed(self, topic: str, record: dict) -> None:
        self._emit(self.sources[topic], json.loads(json.dumps(record)))  # as deserialized from Kafka

    def _emit(self, node: Any, value: Any) -> None:
        for consumer, edge in self.consumers[node.id]:
            self._deliver(consumer, edge, value)

    def _deliver(self, node: Any, edge: Any, value: Any) -> None:
        kind, spec = node.kind, node.spec
        if kind == "map":
            self._emit(node, spec["fn"](value))
        elif kind == "filter":
            if spec["fn"](value):
                self._emit(node, value)
        elif kind == "flat_map":
            for v in spec["fn"](value):
                self._emit(node, v)
        elif kind == "union":
            self._emit(node, value)
        elif kind == "process":
            fn, state = self.keyed[node.id]
            key = edge.key_fn(value)
            state.set_current_key(key)
            ctx = ProcessContext()
            ctx.key, ctx.timestamp = key, value["rec"]["ts"]
            for v in fn.process(value, ctx) or ():
                self._emit(node, v)
        elif kind == "sink":
            self.outputs[spec["topic"]].append(json.loads(spec["serializer"](value)))
        else:
            raise AssertionError(f"the interpreter does not know {kind!r}")

    def state_bytes(self, operator: str) -> int:
        """Logical bytes (physical keys + values) of an operator's RocksDB."""
        backend = self.backends[operator]
        return sum(2 + len(rest) + len(value) for _, rest, value in backend.iter_key_groups(range(KEY_GROUPS)))

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


def run_local(job: Job, feed: list[tuple[str, dict]], state_dir: Path) -> LocalRun:
    local = LocalRun(job, state_dir)
    for topic, record in feed:
        local.feed(topic, record)
    return local


def sides(feed: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """A bettercloud feed (topic, record) as the reference's (side, record)."""
    return [("event" if topic == BC.events else "control", rec) for topic, rec in feed]


def merge(first: list, second: list, seed: int) -> list:
    """A random merge of two sequences that keeps each one's order."""
    rng, out, i, j = random.Random(seed), [], 0, 0
    while i < len(first) or j < len(second):
        if j == len(second) or (i < len(first) and rng.random() < len(first) / (len(first) + len(second))):
            out.append(first[i])
            i += 1
        else:
            out.append(second[j])
            j += 1
    return out


def bettercloud_input(events: int = 600, control_every: int = 6, seed: int = 5) -> tuple[list[dict], list[dict]]:
    return BetterCloudGenerator(seed=seed).batch(events, control_every, START_TS)


# -- bettercloud --------------------------------------------------------------------------------

def rule(version: int, app: str = "drive", status: str = "active", max_bytes: int = 1000,
         notify: tuple[str, ...] = ("chat", "email")) -> dict:
    return {"id": f"r-{app}-{version}", "type": "rule", "status": status, "app": app, "version": version,
            "max_bytes": max_bytes, "watch": ["download", "share"], "notify": list(notify), "ts": START_TS}


def event(i: int, kind: str = "share", app: str = "drive", customer: str = "c1", size: int = 5000,
          country: str = "BE") -> dict:
    return {"id": f"e{i}", "customer": customer, "user": f"{customer}-u0", "app": app, "kind": kind,
            "country": country, "bytes": size, "ts": START_TS + i}


def test_bettercloud_join_judges_by_the_highest_version_seen_so_far():
    """The content depends on the consumption order: the same event and rule give an audit record
    before the rule and two notifications after it; an older version arriving late changes nothing;
    noise events and draft rules are filtered out."""
    e, r1, r2 = event(1), rule(1), rule(2, max_bytes=10_000, notify=("ticket",))
    assert [(o["channel"], o["v"]) for o in bettercloud_reference([("event", e), ("control", r1)])] == [(AUDIT, 0)]
    out = bettercloud_reference([("control", r1), ("event", e)])
    assert [(o["channel"], o["v"], o["n"]) for o in out] == [("chat", 1, 1), ("email", 1, 1)]
    assert out[0]["reason"] == "share of 5000 bytes over 1000"
    late = bettercloud_reference([("control", r2), ("control", r1), ("event", e), ("event", event(2, size=20_000))])
    assert [(o["channel"], o["v"], o["n"]) for o in late] == [(AUDIT, 2, 1), ("ticket", 2, 2)]
    assert bettercloud_reference([("control", rule(1, status="draft")), ("event", e),
                                  ("event", event(3, kind="system"))]) == [
        {**out[0], "channel": AUDIT, "reason": "", "v": 0} | {"id": "e1"}]
    policy = {"id": "p1", "type": "policy", "status": "active", "customer": "c1", "version": 1,
              "blocked": ["BE"], "notify": ["email"], "ts": START_TS}
    login = bettercloud_reference([("control", policy), ("event", event(4, kind="login"))])
    assert [(o["join"], o["key"], o["channel"], o["reason"]) for o in login] == [
        ("customer", "c1", "email", "login from BE")]


def test_bettercloud_job_graph_has_the_shape_of_the_application():
    """Two sources, two joins of one partition on unions (several input channels each: ordering
    needed), and the flat_map with its sink in 2 partitions."""
    plan = plan_job(build_bettercloud_job(BC), default_parallelism=2, num_key_groups=KEY_GROUPS, num_vnodes=64,
                    topic_partitions={BC.events: 2, BC.controls: 1})
    tasks = {t.name: (t.parallelism, [n.kind for n in t.chain]) for t in plan.tasks}
    assert tasks["events"] == (2, ["source", "filter", "map"])
    assert tasks["controls"] == (1, ["source", "filter", "map"])
    assert tasks["app-rules"] == (1, ["process"]) and tasks["customer-policies"] == (1, ["process"])
    assert tasks["notify"] == (2, ["flat_map", "sink"])
    assert sum(1 for t in plan.tasks if t.head.kind == "union") == 3
    multi = {t.name for t in plan.multi_input_tasks()}
    assert {"app-rules", "customer-policies"} <= multi


def test_bettercloud_job_matches_the_reference_and_the_verifier_accepts_any_admissible_order(tmp_path):
    """The job's own operators (on RocksDB) give the reference's output in two different merges of
    the two sources; the outputs differ (order-sensitive) and the verifier accepts both, and
    rebuilds from each an order whose reference equals it."""
    events, controls = bettercloud_input()
    outputs = []
    for seed in (1, 2):
        feed = merge([(BC.events, e) for e in events], [(BC.controls, c) for c in controls], seed)
        local = run_local(build_bettercloud_job(BC), feed, tmp_path / f"run{seed}")
        got = local.outputs[BC.out]
        local.close()
        assert canonical(got) == canonical(bettercloud_reference(sides(feed)))
        report = verify_bettercloud(got, events, controls)
        assert report.exact, report
        assert report.records == len(got) and report.expected == sum(e["kind"] != "system" for e in events)
        assert canonical(bettercloud_reference(consumption_order(got, events, controls))) == canonical(got)
        outputs.append(got)
    assert canonical(outputs[0]) != canonical(outputs[1]), "the merge order should change some verdicts"
    channels = {o["channel"] for o in outputs[0]}
    assert AUDIT in channels and channels - {AUDIT}, "both audits and notifications"


def test_bettercloud_verifier_finds_every_kind_of_error():
    events, controls = bettercloud_input()
    feed = sides(merge([(BC.events, e) for e in events], [(BC.controls, c) for c in controls], 3))
    good = bettercloud_reference(feed)
    assert verify_bettercloud(good, events, controls).exact

    def check(outputs: list[dict], **expected: int) -> None:
        counts = verify_bettercloud(outputs, events, controls).counts()
        assert {k: v for k, v in counts.items() if v} == expected

    check(good[:5] + good[6:], missing=1)
    check(good + [good[7]], duplicated=1)
    noise = next(e for e in events if e["kind"] == "system")
    check(good + [{**good[0], "id": noise["id"]}], unexpected=1)
    check(good[:3] + [{**good[3], "reason": "made up"}] + good[4:], wrong=1)
    # two records of one event disagree: one of them is wrong
    i = next(i for i, o in enumerate(good) if o["channel"] != AUDIT and good[i + 1]["id"] == o["id"])
    check(good[:i + 1] + [{**good[i + 1], "user": "x"}] + good[i + 2:], wrong=1)
    # judged by a draft: no admissible order, and the values are not those of the reference
    draft = next(c for c in controls if c["status"] == "draft" and c["type"] == "rule")
    j = next(j for j, o in enumerate(good) if o["join"] == "app" and o["key"] == draft["app"])
    same = [k for k, o in enumerate(good) if o["id"] == good[j]["id"]]
    forged = [{**o, "v": draft["version"]} if k in same else o for k, o in enumerate(good)]
    report = verify_bettercloud(forged, events, controls)
    assert len(report.wrong) == len(same) and any("no active control" in b for b in report.broken), report
    # two events of a customer swap their counters: they left their production order
    by_key: dict[str, dict[str, dict]] = defaultdict(dict)  # customer -> event id -> its first record
    for o in good:
        if o["join"] == "customer":
            by_key[o["key"]].setdefault(o["id"], o)
    firsts = [list(recs.values()) for recs in by_key.values()]
    x, y = next((x, y) for recs in firsts for x, y in zip(recs, recs[1:], strict=False)
                if x["v"] == y["v"])  # consecutive events of a customer judged by the same version
    swapped = [{**o, "n": y["n"]} if o["id"] == x["id"] else {**o, "n": x["n"]} if o["id"] == y["id"] else o
               for o in good]
    report = verify_bettercloud(swapped, events, controls)
    assert any("production order" in p for p in report.broken), report
    # two replicas that merged differently, their outputs mixed: not exact
    other = bettercloud_reference(sides(merge([(BC.events, e) for e in events],
                                              [(BC.controls, c) for c in controls], 4)))
    assert canonical(other) != canonical(good)
    assert not verify_bettercloud(good[: len(good) // 2] + other[len(other) // 2:], events, controls).exact


def test_bettercloud_verifier_sees_versions_go_back_and_counters_collide():
    events = [event(i, customer=f"c{i}") for i in range(3)]  # three customers: no production order between them
    controls = [rule(1), rule(2)]
    good = bettercloud_reference([("control", controls[0]), ("event", events[0]), ("control", controls[1]),
                                  ("event", events[1]), ("event", events[2])])
    assert verify_bettercloud(good, events, controls).exact
    back = bettercloud_reference([("control", controls[1]), ("event", events[0]), ("event", events[1]),
                                  ("event", events[2])])
    back = [{**o, "v": 1, "reason": o["reason"]} if o["id"] == "e2" else o for o in back]
    report = verify_bettercloud(back, events, controls)
    assert any("went back" in p for p in report.broken), report
    collide = [{**o, "n": 1} if o["id"] == "e1" else o for o in good]
    report = verify_bettercloud(collide, events, controls)
    assert any("not distinct" in p for p in report.broken), report


# -- nexmark ------------------------------------------------------------------------------------

def nexmark_input(persons: int = 80, payload: int = 40, window_ms: int = 50) -> tuple[NexmarkConfig, list, list]:
    cfg = NexmarkConfig(window_ms=window_ms, payload_bytes=payload, active_sellers=4)
    ps, aus = NexmarkGenerator(cfg).batch(persons, 3, START_TS, step_ms=2)
    return cfg, ps, aus


def test_nexmark_reference_pairs_persons_and_auctions_of_the_same_window():
    cfg, ps, aus = nexmark_input()
    out = nexmark_reference(ps, aus, cfg.window_ms)
    by_id = {p["id"]: p for p in ps}
    assert 0 < len(out) < len(aus)
    for rec in out:
        a = aus[rec["auction"]]
        p = by_id[a["seller"]]
        assert rec["person"] == p["id"] and rec["window"] == p["ts"] - p["ts"] % cfg.window_ms
        assert a["ts"] - a["ts"] % cfg.window_ms == rec["window"] and rec["ts"] == max(p["ts"], a["ts"])
    matched = {r["auction"] for r in out}
    for a in aus:  # every unmatched auction's seller registered in another window
        if a["id"] not in matched:
            p = by_id[a["seller"]]
            assert p["ts"] // cfg.window_ms != a["ts"] // cfg.window_ms


def test_nexmark_job_gives_the_reference_in_any_order_and_its_state_size_is_the_model(tmp_path):
    cfg, ps, aus = nexmark_input()
    job = build_nexmark_job(NX, cfg.window_ms)
    expected = canonical(nexmark_reference(ps, aus, cfg.window_ms))
    persons, auctions = [(NX.persons, p) for p in ps], [(NX.auctions, a) for a in aus]
    for i, feed in enumerate([auctions + persons, persons + auctions, merge(persons, auctions, 7)]):
        local = run_local(job, feed, tmp_path / f"run{i}")
        assert canonical(local.outputs[NX.out]) == expected
        assert verify_nexmark(local.outputs[NX.out], ps, aus, cfg.window_ms).exact
        assert local.state_bytes(NEXMARK_JOIN) == nexmark_state_bytes(ps, aus, cfg.window_ms)
        local.close()


def test_nexmark_state_grows_with_the_input_and_reaches_a_target():
    cfg, ps, aus = nexmark_input(payload=0)
    small = nexmark_state_bytes(ps, aus, cfg.window_ms)
    _, ps2, aus2 = nexmark_input(payload=1000)
    assert nexmark_state_bytes(ps2, aus2, cfg.window_ms) - small == pytest.approx(1000 * (len(ps) + len(aus)),
                                                                                   rel=0.01)
    assert nexmark_state_bytes(ps[:40], aus[:120], cfg.window_ms) < small
    target = 2_000_000
    payload = payload_for_state(target, 250, 750, NexmarkConfig(window_ms=cfg.window_ms))
    big = NexmarkConfig(window_ms=cfg.window_ms, payload_bytes=payload)
    ps3, aus3 = NexmarkGenerator(big).batch(250, 3, START_TS)
    assert nexmark_state_bytes(ps3, aus3, cfg.window_ms) == pytest.approx(target, rel=0.02)


def test_nexmark_verifier_finds_every_kind_of_error():
    cfg, ps, aus = nexmark_input()
    good = nexmark_reference(ps, aus, cfg.window_ms)
    assert len(good) > 4

    def counts(outputs: list[dict]) -> dict[str, int]:
        return {k: v for k, v in verify_nexmark(outputs, ps, aus, cfg.window_ms).counts().items() if v}

    assert counts(good[1:]) == {"missing": 1}
    assert counts(good + good[:2]) == {"duplicated": 2}
    assert counts(good + [{**good[0], "auction": 10**6}]) == {"unexpected": 1}
    assert counts([{**good[0], "reserve": -1}] + good[1:]) == {"wrong": 1}
    report = verify_nexmark(good, ps, aus, cfg.window_ms)
    assert report.exact and report.expected == report.records == len(good) and "EXACT" in str(report)


def test_generators_are_deterministic():
    assert bettercloud_input(seed=9) == bettercloud_input(seed=9) != bettercloud_input(seed=10)
    assert nexmark_input() == nexmark_input()


# -- the benchmark's rows, table and plot -------------------------------------------------------

def test_benchmark_rows_and_plot_from_made_up_runs(tmp_path):
    sys.path.insert(0, str(REPO))
    from bench import workloads as bench
    from ops.loadgen import LoadResult
    from ops.workload import Sample

    args = bench.parse_args(["--modes", "liverobin,off,unordered", "--workloads", "nexmark", "--rate", "100",
                             "--duration", "10", "--nexmark-state-mb", "5", "--warm-up", "0.5",
                             "--out", str(tmp_path)])
    assert args.modes == ["liverobin", "off", "unordered"] and args.workloads == ["nexmark"]
    assert [c.label for c in bench.latency_configs(args.modes, [args.period], args.period)] == [
        "off", "unordered", "liverobin 10ms"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--workloads", "nexmak"])
    # the payload makes 1,000 events of the nexmark input hold the target state
    cfg = NexmarkConfig(window_ms=args.nexmark_window_ms, payload_bytes=bench.nexmark_payload(args), seed=args.seed)
    ps, aus = NexmarkGenerator(cfg).batch(250, 3, START_TS)
    assert nexmark_state_bytes(ps, aus, cfg.window_ms) == pytest.approx(5_000_000, rel=0.02)

    cfg, ps, aus = nexmark_input()
    good = nexmark_reference(ps, aus, cfg.window_ms)
    samples = [Sample(START_TS / 1000 + i / 100, 100.0 + i / 100, 100.0 + i / 100 + 0.02 + (i % 10) / 1000)
               for i in range(len(good))]
    configs = {c.label: c for c in bench.latency_configs(["off", "unordered", "liverobin"], [10], 10)}
    runs = [bench.WorkloadRun("nexmark", configs["off"], LoadResult(produced=320, elapsed_s=3.2), samples,
                              verify_nexmark(good, ps, aus, cfg.window_ms), state_bytes=3_000_000,
                              state_disk_bytes=2_500_000, payload_bytes=40),
            bench.WorkloadRun("nexmark", configs["unordered"], LoadResult(produced=320, elapsed_s=3.2), samples,
                              verify_nexmark(good[3:] + good[:1] + good[5:6], ps, aus, cfg.window_ms), state_bytes=3_000_000,
                              state_disk_bytes=2_400_000, payload_bytes=40),
            bench.WorkloadRun("bettercloud", configs["liverobin 10ms"], failure="JobFailedError: boom")]
    rows = bench.write_results(tmp_path, runs, args)
    bench.print_table(rows)
    assert [(r["config"], r["exact"]) for r in rows] == [("off", "yes"), ("unordered", "no"), ("liverobin 10ms", "no")]
    assert rows[0]["p50_ms"] == pytest.approx(25, abs=1) and rows[0]["state_mb"] == 3.0
    assert rows[0]["throughput"] == pytest.approx(len(good) / (samples[-1].sink - samples[0].ingest))
    assert rows[1]["missing"] == 2 and rows[1]["duplicated"] == 1 and "missing 2" in rows[1]["outcome"]
    assert rows[2]["outcome"] == "failed: JobFailedError: boom" and rows[2]["records"] == 0
    assert rows[2]["missing"] == rows[2]["state_mb"] == ""
    written = list(csv.DictReader((tmp_path / "workloads.csv").open()))
    assert [r["exact"] for r in written] == ["yes", "no", "no"] and written[0]["state_disk_peak_mb"] == "2.5"
    assert (tmp_path / "workloads.png").stat().st_size > 0 and (tmp_path / "machine.txt").exists()


def test_state_disk_probe_sums_the_task_directories(tmp_path):
    sys.path.insert(0, str(REPO))
    from bench.workloads import StateDiskProbe

    for worker, task, size in (("w0-a0", 3, 1000), ("w1-a0", 3, 500), ("w1-a0", 4, 7000)):
        d = tmp_path / "job" / "run1" / worker / f"t{task}-p0" / "sub"
        d.mkdir(parents=True)
        (d / "000001.log").write_bytes(b"x" * size)
    probe = StateDiskProbe(tmp_path, "job", 3)
    assert probe.sample() == 1500 and probe.peak == 1500
    (tmp_path / "job" / "run1" / "w0-a0" / "t3-p0" / "sub" / "000001.log").unlink()
    assert probe.sample() == 500 and probe.peak == 1500


# -- on Spark, replicated, LiveRobin (slow) -----------------------------------------------------

def _liverobin_conf(stack) -> dict[str, str]:
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.enabled": "true", "spark.replication.mode": "liverobin",
            "spark.replication.failureTimeout": "2s", "spark.replication.liverobin.maxPulseStep": "100"}


def _digests_agree(result, handle, task: str) -> None:
    tid = next(t.id for t in handle.plan.tasks if t.name == task)
    for p in range(handle.plan.task(tid).parallelism):
        d0, d1 = (result.per_instance[f"{task}[{p}]r{r}"].state_digest for r in (0, 1))
        assert d0 and d0 == d1, f"{task}[{p}]: replicas diverged"


def _produce(stack, topic: str, records: list[dict], key: str) -> None:
    from deploy.topics import produce

    produce(stack.bootstrap_servers, topic, [(str(r[key]).encode(), json.dumps(r).encode()) for r in records])


def _read(stack, topic: str) -> list[dict]:
    from deploy.topics import read_all

    return [json.loads(r.value) for r in read_all(stack.bootstrap_servers, topic)]


@pytest.mark.slow
@pytest.mark.integration
def test_bettercloud_on_spark_liverobin_equals_the_reference(stack, spark, topic_prefix):
    """Pre-produced input, replicated in LiveRobin mode: the output is exactly the reference's output
    for the consumption order it reports, that order is admissible, and both replicas of each join
    end with the same state."""
    from deploy.topics import create_topics
    from replication import run

    topics = BetterCloudTopics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.events: 2, topics.controls: 1})
    events, controls = bettercloud_input(events=1500, control_every=10)
    _produce(stack, topics.events, events, "customer")
    _produce(stack, topics.controls, controls, "id")
    handle = run(build_bettercloud_job(topics, name=f"{topic_prefix}bc"), spark=spark, conf=_liverobin_conf(stack))
    handle.wait_started(120)
    result = handle.drain(timeout=300)
    got = _read(stack, topics.out)
    report = verify_bettercloud(got, events, controls)
    assert report.exact, report
    assert canonical(got) == canonical(bettercloud_reference(consumption_order(got, events, controls)))
    assert len({o["v"] for o in got}) > 3, "rules and policies should have been applied"
    for task in ("app-rules", "customer-policies"):
        _digests_agree(result, handle, task)
    assert result.metrics.gaps == 0


@pytest.mark.slow
@pytest.mark.integration
def test_nexmark_on_spark_liverobin_equals_the_reference(stack, spark, topic_prefix):
    """Pre-produced persons and auctions, replicated in LiveRobin mode: the output equals the
    reference exactly and both replicas of each join partition hold the same state."""
    from deploy.topics import create_topics
    from replication import run

    topics = NexmarkTopics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.persons: 2, topics.auctions: 2})
    cfg, ps, aus = nexmark_input(persons=400, payload=200, window_ms=40)
    _produce(stack, topics.persons, ps, "id")
    _produce(stack, topics.auctions, aus, "seller")
    handle = run(build_nexmark_job(topics, cfg.window_ms, name=f"{topic_prefix}nx"), spark=spark,
                 conf=_liverobin_conf(stack))
    handle.wait_started(120)
    result = handle.drain(timeout=300)
    got = _read(stack, topics.out)
    expected = nexmark_reference(ps, aus, cfg.window_ms)
    assert len(expected) > 100
    assert canonical(got) == canonical(expected), verify_nexmark(got, ps, aus, cfg.window_ms)
    _digests_agree(result, handle, NEXMARK_JOIN)
    assert result.metrics.gaps == 0
