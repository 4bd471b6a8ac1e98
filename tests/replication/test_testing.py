"""The local test harness (replication.testing): a job's operators run in-process on in-memory
input, and give what the cluster gives: the README's job, the examples against their plain-Python
references, dead letters with their reasons, side outputs, timers of both domains, keyed state."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest

import replication
from replication import Job, KeyedProcessFunction, StateTtl
from replication.api import JobDefinitionError
from replication.examples.clickstream import (
    SAMPLE_SHARE,
    add_clickstream,
    batched_clicks,
    clicks_counted,
    pages_reference,
    running_reference,
    sampled_reference,
)
from replication.examples.enrichment import add_enrichment, enrichment_reference, same_second_reference
from replication.examples.sessions import (
    add_recent_clicks,
    add_sessions,
    recent_clicks_reference,
    sessions_reference,
)
from replication.examples.views import REPEAT_TTL_MS, add_page_views, page_views, views_reference
from replication.functions import OutputTag
from replication.testing import Input, run_locally
from tests.example_inputs import customer_table, order_events

README = Path(__file__).resolve().parents[2] / "README.md"


def counted(values) -> Counter:
    return Counter(json.dumps(v, sort_keys=True) for v in values)


def test_the_readmes_job_runs_in_the_harness(monkeypatch):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    submitted = []
    monkeypatch.setattr(replication, "run", lambda job, **kw: submitted.append(job))
    exec(compile(code, str(README), "exec"), {})  # noqa: S102 - the README's own example
    (job,) = submitted
    payments = [{"card": "c1" if i % 3 else "c2", "amount": i} for i in range(600)]
    run = run_locally(job, {"payments": [json.dumps(p).encode() for p in payments]})
    seen: Counter[str] = Counter()
    expected = []
    for p in payments:
        seen[p["card"]] += 1
        if seen[p["card"]] % 100 == 0:
            expected.append({"card": p["card"], "payments": seen[p["card"]]})
    assert run.outputs["milestones"] == expected and len(expected) == 6
    assert [json.loads(w.value) for w in run.written["milestones"]] == expected and run.dead_letters == []


def test_every_python_block_of_the_readme_runs_and_its_tests_pass(monkeypatch):
    """The README's code, in order, in one namespace (``run`` only records the job), then every
    ``test_*`` function it defines: its harness example runs its own ``build()``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    monkeypatch.setattr(replication, "run", lambda job, **kw: None)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert len(blocks) >= 3 and tests
    for test in tests:
        test()


def test_the_user_guides_python_blocks_run_and_its_jobs_count_as_they_say(monkeypatch):
    """The user guide's code, in order, in one namespace (``run`` hands back a stand-in handle),
    then both of its jobs in the harness: a milestone every 100 clicks of a user, and page counts."""
    guide = README.parent / "docs" / "user-guide.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)
    submitted = []
    monkeypatch.setattr(replication, "run", lambda job, **kw: submitted.append(job) or mock.MagicMock())
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(guide), "exec"), namespace)  # noqa: S102 - the guide's own code
    assert [job.name for job in submitted] == ["clicks"]
    clicks = [{"user": f"u{i % 2}", "page": "/a" if i % 3 else "/b", "ts": 500 * i} for i in range(400)]
    run = run_locally(namespace["build"](), {"clicks-web": clicks[::2], "clicks-app": clicks[1::2] + [{"ts": 1}]})
    assert counted(run.outputs["milestones"]) == counted({"user": u, "clicks": n} for u in ("u0", "u1")
                                                         for n in (100, 200))
    pages = Counter((c["page"], c["ts"] // 60_000) for c in clicks)
    assert {(w["key"], w["start"] // 60_000): w["value"] for w in run.outputs["page-counts"]} == pages
    per_user = run_locally(namespace["build_per_user"](), {"clicks-by-user": clicks})
    assert len(per_user.outputs["milestones"]) == 4


def test_the_examples_give_their_references():
    orders, payments, clicks = order_events(1_000_000)
    rows, table = customer_table()
    job = Job("examples")
    add_enrichment(job, "orders", "payments", "customers", "enriched", "paid", same_second_topic="pairs")
    stream = add_sessions(job, "clicks", "sessions")
    add_recent_clicks(stream, "recent")
    add_clickstream(stream, "running", "pages", "batches")
    run = run_locally(job, {"customers": [Input(v, key=k, timestamp=0) for k, v in rows],
                            "orders": [Input(o, timestamp=o["ts"]) for o in orders],
                            "payments": [Input(p, timestamp=p["ts"]) for p in payments],
                            "clicks": [Input(c, timestamp=c["ts"]) for c in clicks]},
                      pulse_every_ms=50, idle_after_ms=500, keep_state=True)
    out = run.outputs
    enriched, paid = enrichment_reference(orders, payments, table)
    assert counted(out["enriched"]) == counted(enriched) and counted(out["paid"]) == counted(paid)
    assert counted(out["pairs"]) == counted(same_second_reference(orders, payments))
    assert counted(out["sessions"]) == counted(sessions_reference(clicks))
    assert counted(out["recent"]) == counted(recent_clicks_reference(clicks))
    assert counted(out["running"]) == counted(running_reference(clicks))
    assert {(w["key"], w["start"]): w["value"] for w in out["pages"]} == pages_reference(clicks)
    assert batched_clicks(out["batches"]) == clicks_counted(clicks) and len(out["batches"]) < len(clicks) / 2
    assert run.dead_letters == []
    # what is left: the table and the running totals; the joins, the TTL'd lists and the batches are gone
    left = {name: len(keys) for name, keys in run.state.items()}
    assert left == {"enrich": 27, "running": 8, "pay": 0, "pairs": 0, "recent": 0, "batches": 0}, left
    assert run.state["running"]["u0"] == {"reduced": {"user": "u0", "clicks": 60, "last": clicks[-8]["ts"]}}


def test_page_views_drop_repeats_update_late_windows_and_side_out_the_too_late():
    """The late views arrive after every on-time one (their Kafka timestamp): those within the
    lateness update their window, the others go to the side output, and the ids expire by
    processing time (the harness's pulses go on ``idle_after_ms`` past the last record)."""
    on_time, late = page_views(1_700_000_000_000)
    job = Job("views")
    add_page_views(job, "views", "counts", "late")
    arrival = on_time[-1]["ts"]
    run = run_locally(job, {"views": [Input(v, timestamp=v["ts"]) for v in on_time]
                            + [Input(v, timestamp=arrival) for v in late]},
                      pulse_every_ms=50, idle_after_ms=2 * REPEAT_TTL_MS, keep_state=True)
    expected, too_late = views_reference(on_time, late)
    assert Counter((w["key"], w["start"], w["value"]) for w in run.outputs["counts"]) == expected
    assert run.outputs["late"] == too_late and len(too_late) == 5 and run.dead_letters == []
    assert sum(n for (_, _, n) in expected) > len({v["id"] for v in on_time})  # (updates counted again)
    assert run.state == {"unique": {}}  # every id expired and swept


def test_a_sample_drawn_by_ctx_random_depends_on_each_keys_own_clicks_only():
    """``ctx.random()`` is seeded by the operator, the key and the key's own history: interleaving
    other users' clicks differently draws the same sample, which is about the share asked for."""
    _, _, clicks = order_events(1_000_000)
    sample = sampled_reference(clicks)
    by_user = sorted(clicks, key=lambda c: (c["user"], c["ts"]))  # (each user's clicks in their order)
    assert counted(sampled_reference(by_user)) == counted(sample)
    assert abs(len(sample) / len(clicks) - SAMPLE_SHARE) < 0.1
    assert sample == [c for c in clicks if c in sample]  # clicks, not made up; in input order


def _upper_by_key(job_name: str) -> Job:
    job = Job(job_name)
    (job.source("in", deserializer="json").key_by(lambda v: v["k"]).reduce(lambda a, b: b, name="latest")
     .map(lambda v: v["s"].upper(), name="upper").sink("out", serializer="str", key_serializer="str"))
    return job


def test_bad_records_go_to_the_dead_letters_with_their_reason_and_the_rest_come_out():
    run = run_locally(_upper_by_key("bad"), {"in": [b'{"k": 1, "s": "a"}', b"not json", {"s": "no key"},
                                                    {"k": 2, "s": 5}, {"k": 3, "s": "b"}]})
    assert run.outputs["out"] == ["A", "B"]
    assert [w.key for w in run.written["out"]] == [b"1", b"3"]
    reasons = [(d["operator"], d["reason"].split(":")[0]) for d in run.dead_letters]
    assert reasons == [("source:in", "deserialize"), ("source:in", "key_by"), ("upper", "AttributeError")]
    assert run.dead_letters[0]["payload"] == b"not json" and run.dead_letters[0]["origin"] == ("in", 0, 1)


class Alerts(KeyedProcessFunction):
    """Per key: amounts over 100 to a side output; an event-time timer 10 ms after a key's first
    record emits its total, and a processing-time timer 50 ms after it its count so far; the total
    lives in state with a TTL."""

    LARGE = OutputTag("large")

    def open(self, ctx):
        self.total = ctx.value_state("total", 0, ttl=StateTtl(1_000))
        self.count = ctx.value_state("count", 0)

    def process(self, value, ctx):
        if self.count.value() == 0:
            ctx.timers.register_event_time_timer(ctx.timestamp + 10)
            ctx.timers.register_processing_time_timer(ctx.timers.current_processing_time() + 50)
        self.count.update(self.count.value() + 1)
        self.total.update(self.total.value() + value["amount"])
        if value["amount"] > 100:
            ctx.output(self.LARGE, value)

    def on_timer(self, timestamp, ctx):
        yield (ctx.time_domain, ctx.key, self.total.value() if ctx.time_domain == "event_time" else self.count.value())


def _alerts_job() -> Job:
    job = Job("alerts")
    alerts = job.source("pay", timestamp=lambda v: v["ts"]).key_by(lambda v: v["k"]).process(Alerts(), name="alerts")
    alerts.sink("totals", serializer="json")
    alerts.side_output(Alerts.LARGE).sink("large", serializer="json")
    return job


PAYMENTS = [Input({"k": "a", "amount": 5, "ts": 0}, timestamp=0), Input({"k": "b", "amount": 500, "ts": 2}, timestamp=20),
            Input({"k": "a", "amount": 7, "ts": 5}, timestamp=40), Input({"k": "a", "amount": 1, "ts": 30}, timestamp=100)]


def test_side_outputs_and_timers_of_both_domains_and_state_left():
    run = run_locally(_alerts_job(), {"pay": PAYMENTS}, pulse_every_ms=10, watermark_interval_ms=0, keep_state=True)
    assert run.outputs["large"] == [{"k": "b", "amount": 500, "ts": 2}]
    # processing time: the timers registered at 0 (a) and 20 (b) fire at the pulses of 50 and 70,
    # when a had 2 records and b 1; event time: the watermark passes 10 and 12 after the record of
    # ts 30 (a source sends its watermark after the record that moved it)
    assert run.outputs["totals"] == [("processing_time", "a", 2), ("processing_time", "b", 1),
                                     ("event_time", "a", 13), ("event_time", "b", 500)]
    assert run.state["alerts"] == {"a": {"count": 3}, "b": {"count": 1}}  # the totals' TTL passed at the end


def test_without_pulses_processing_time_is_refused_naming_the_mode():
    run = run_locally(_alerts_job(), {"pay": PAYMENTS})
    assert {d["operator"] for d in run.dead_letters} == {"alerts"}
    assert "processing time comes with LiveRobin's pulses" in run.dead_letters[0]["reason"]


def test_inputs_for_a_topic_no_source_reads_are_refused():
    with pytest.raises(ValueError, match=r"inputs for topics no source of job 'bad' reads: \['nope'\]"):
        run_locally(_upper_by_key("bad"), {"nope": []})


class ReturnsADict(KeyedProcessFunction):
    def process(self, value, ctx):
        return {"seen": value}  # meant: yield it


class StateInProcess(KeyedProcessFunction):
    def process(self, value, ctx):
        ctx.value_state("late")


def test_mistakes_in_user_functions_are_dead_lettered_with_a_reason_that_says_what_to_do():
    job = Job("mistakes")
    src = job.source("in")
    src.key_by(lambda v: v).process(ReturnsADict(), name="dict").sink("a")
    src.flat_map(lambda v: str(v), name="chars").sink("b")
    src.key_by(lambda v: v).process(StateInProcess(), name="state").sink("c")
    run = run_locally(job, {"in": [1]})
    assert run.outputs == {"a": [], "b": [], "c": []}
    reasons = {d["operator"]: d["reason"] for d in run.dead_letters}
    assert reasons == {
        "dict": "TypeError: process returned a dict: return an iterable of records (a list, or yield them), "
                "e.g. [record]",
        "chars": "TypeError: flat_map's function returned a str: return an iterable of records (a list, or "
                 "yield them), e.g. [record]",
        "state": "TypeError: state is declared in open(ctx) (ctx.value_state, map_state, list_state there), not "
                 f"in process or on_timer (at {__file__}:{StateInProcess.process.__code__.co_firstlineno + 1} "
                 "in process)"}, reasons  # the place: the user's line, never the library's


def test_a_function_that_cannot_be_shipped_is_refused_naming_its_operator():
    import threading

    lock = threading.Lock()
    job = Job("unshippable")
    job.source("in").map(lambda v: (lock, v)[1], name="locked").sink("out")
    with pytest.raises(JobDefinitionError, match=r"^map 'locked': its function cannot be shipped to the executors "
                                                 r"\(pickling failed: TypeError: cannot pickle '_thread.lock' object\)$"):
        run_locally(job, {"in": [1]})
