"""The operators of real jobs on real executors with replication: session and sliding windows, a
lookup join against a table from a compacted topic (read with its metadata), an interval join, a
window join, a running reduce whose sink sets the Kafka key, timestamp and headers from the
record, list state with a TTL, processing-time timers (LiveRobin's pulses, KaZoo's orders), a sample
drawn by ``ctx.random()``; and page views: repeats dropped by a processing-time TTL, tumbling windows
with allowed lateness and a side output for the too-late views.

A replica's executor is killed and vnodes of every keyed task move while input flows; and the job
is drained into a savepoint halfway through its input and goes on from it at another parallelism
(open sessions and windows, join buffers, the table, TTL'd lists and pending timers cross over).
Every output equals a plain-Python reference of the whole input, record by record, the replicas
agree, and the TTL'd state is swept empty by the end."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from deploy.topics import create_topics, produce, read_all
from ops.chaos import kill_executor, locate
from replication import Job, run
from replication.examples.clickstream import (
    FLUSH_AFTER_MS,
    add_clickstream,
    add_sampled_clicks,
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
from replication.examples.views import (
    REPEAT_TTL_MS,
    VIEW_WINDOW_MS,
    add_page_views,
    page_views,
    views_reference,
)
from rhino_state import encode_key, key_group, vnode_of
from rhino_state.increments import EMPTY_DIGEST
from tests.example_inputs import customer_table, order_events
from tests.ordered_runs import (
    RHINO_MODES,
    output_difference,
    read_output,
    replicas_agree,
    wait_until,
    writer_log_lines,
)

pytestmark = pytest.mark.integration

INPUTS = ("orders", "payments", "customers", "clicks")
OUTPUTS = ("enriched", "paid", "pairs", "sessions", "recent", "running", "pages", "batches", "sampled")
KEYED_TASKS = ("enrich", "pay", "pairs", "sessions", "recent", "running", "pages", "batches", "sampled")


def _timeline(orders, payments, clicks) -> list[tuple[str, int, str, dict]]:
    """(input, event time, key, event) of every event, in event-time order."""
    return sorted([("orders", o["ts"], o["id"], o) for o in orders]
                  + [("payments", p["ts"], p["order"], p) for p in payments]
                  + [("clicks", c["ts"], c["user"], c) for c in clicks], key=lambda e: e[1])


def _feed(stack, topics: dict[str, str], timeline, seconds: float, batches: int = 20) -> None:
    """Produce ``timeline`` ((input, event time, key, event) in the order given) to ``topics[input]``
    over about ``seconds``, in batches."""
    step = -(-len(timeline) // batches)
    for b in range(batches):
        chunk = timeline[b * step:(b + 1) * step]
        for name in topics:
            recs = [(key.encode(), json.dumps(v).encode()) for n, _, key, v in chunk if n == name]
            if recs:
                produce(stack.bootstrap_servers, topics[name], recs)
        time.sleep(seconds / batches)


def _joins_job(name: str, topics: dict[str, str], outs: dict[str, str], parallelism: int,
               batch_after_ms: int = FLUSH_AFTER_MS) -> Job:
    job = Job(name)
    add_enrichment(job, topics["orders"], topics["payments"], topics["customers"], outs["enriched"], outs["paid"],
                   parallelism=parallelism, same_second_topic=outs["pairs"])
    clicks_stream = add_sessions(job, topics["clicks"], outs["sessions"], parallelism=parallelism)
    add_recent_clicks(clicks_stream, outs["recent"], parallelism=parallelism)
    add_clickstream(clicks_stream, outs["running"], outs["pages"], outs["batches"], parallelism=parallelism,
                    batch_after_ms=batch_after_ms)
    add_sampled_clicks(clicks_stream, outs["sampled"], parallelism=parallelism)
    return job


def _conf(stack, mode: str, rhino: bool = False) -> dict[str, str]:
    kazoo = {"spark.replication.zookeeper.connect": stack.zookeeper_connect,
             "spark.replication.kazoo.sessionTimeout": "1s"} if mode == "kazoo" else {}
    checkpoints = {"spark.replication.rhino.enabled": "true", **RHINO_MODES[mode]} if rhino else {}
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers, "spark.replication.enabled": "true",
            "spark.replication.mode": mode, "spark.replication.failureTimeout": "2s", **kazoo, **checkpoints}


def _topics(stack, name: str) -> tuple[dict[str, str], dict[str, str], list, dict]:
    """The input and output topics of the job ``name``, with the customers table produced."""
    topics = {t: f"{name}{t}" for t in INPUTS}
    outs = {t: f"{name}{t}" for t in OUTPUTS}
    create_topics(stack.bootstrap_servers, {t: 1 for t in topics.values()})
    table_records, table = customer_table()
    produce(stack.bootstrap_servers, topics["customers"], table_records)
    return topics, outs, table_records, table


def _every_batch_out(stack, outs: dict[str, str], clicks) -> None:
    """Processing-time timers fire at pulses or orders, not at the end of the input: every click's
    batch is out before the drain."""
    wait_until(lambda: sum(batched_clicks(read_output(stack, outs["batches"])).values()) >= len(clicks),
               60, "every click's batch", poll_s=0.5)


def _assert_exact(stack, outs: dict[str, str], orders, payments, clicks, table, events=(),
                  writer_logs=lambda: []) -> None:
    """Every output topic against its plain-Python reference of the whole input (``events``: the
    job's, and ``writer_logs()``: what its writers logged, to say where a record went if one
    differs)."""
    enriched, paid = enrichment_reference(orders, payments, table)

    def as_counter(records):
        return Counter(json.dumps(r, sort_keys=True) for r in records)

    for topic, expected in (("enriched", enriched), ("paid", paid), ("sessions", sessions_reference(clicks)),
                            ("recent", recent_clicks_reference(clicks)),
                            ("pairs", same_second_reference(orders, payments))):
        difference = output_difference(stack, outs[topic], expected, events)
        assert not difference, f"{difference}; writers: {writer_logs()}"
    pages = [(w["key"], w["start"], w["value"]) for w in read_output(stack, outs["pages"])]
    assert len(pages) == len({(k, s) for k, s, _ in pages}) and {(k, s): n for k, s, n in pages} == pages_reference(clicks)
    running = read_all(stack.bootstrap_servers, outs["running"])
    assert as_counter(json.loads(r.value) for r in running) == as_counter(running_reference(clicks))
    for r in running:  # the sink took the Kafka key, timestamp and a header from each result
        value = json.loads(r.value)
        assert (r.key, r.timestamp, dict(r.headers)["clicks"]) == (
            value["user"].encode(), value["last"], str(value["clicks"]).encode()), r
    sampled = read_output(stack, outs["sampled"])
    assert 0 < len(sampled) < len(clicks) and as_counter(sampled) == as_counter(sampled_reference(clicks))
    batches = read_output(stack, outs["batches"])
    assert batched_clicks(batches) == clicks_counted(clicks)
    assert all(b["clicks"] == sorted(b["clicks"]) for b in batches)


def _dead_letters(stack, name: str) -> list[tuple[str, str]]:
    """(operator, reason) of each record the job ``name`` dead-lettered: a late one names the join."""
    return [(dict(r.headers).get("operator", b"?").decode(), dict(r.headers).get("reason", b"?").decode())
            for r in read_all(stack.bootstrap_servers, f"{name}.dlq")]


def _assert_no_divergence(result) -> None:
    """The restored replicas took the path their twins took: equal checkpoints and equal handover cuts."""
    assert result.divergences == [] and not any("cut different state" in text for _, text in result.events), \
        (result.divergences, result.events)


def _assert_ttl_swept(result, handle, parallelism: int, task: str = "recent") -> None:
    """The TTL'd state of every live replica of ``task`` is swept empty by the end."""
    tid = next(t.id for t in handle.plan.tasks if t.name == task)
    ttl_replicas = {f"{task}[{p}]r{r}": result.per_instance[f"{task}[{p}]r{r}"].state_digest
                    for p in range(parallelism) for r in range(2)
                    if handle.placement[(tid, p, r)] not in handle.master.dead}
    assert len(ttl_replicas) >= parallelism and set(ttl_replicas.values()) == {EMPTY_DIGEST}, ttl_replicas


def _move_every_keyed_task(handle, first: str, outcome: dict, tasks=KEYED_TASKS,
                           keys: dict[str, list[str]] | None = None) -> threading.Thread:
    """Move 16 vnodes of every keyed task to its other partition (of ``keys[task]``'s vnodes
    first, if given), ``first`` first with wide margins (1 s to the switch, 3 s to the release),
    one after the other in a thread; each report, or the error, into ``outcome``."""
    def vnodes(task: str, origin: int) -> list[int]:
        table = handle.routing(task)
        owned = table.vnodes_of(origin)
        groups = handle.plan.num_key_groups
        holding = {vnode_of(key_group(encode_key(k), groups), groups, table.num_vnodes) for k in (keys or {}).get(task, [])}
        return [*[v for v in owned if v in holding], *[v for v in owned if v not in holding]][:16]

    def move_all() -> None:
        try:
            for i, task in enumerate([first] + [t for t in tasks if t != first]):
                margins = {"margin_s": 1.0, "release_s": 3.0} if task == first else {}
                outcome[task] = handle.move_vnodes(task, vnodes(task, i % 2), (i + 1) % 2, **margins)
        except Exception as exc:  # noqa: BLE001 - asserted by the caller
            outcome["error"] = exc

    mover = threading.Thread(target=move_all)
    mover.start()
    return mover


def _committed(handle) -> bool:
    """Whether the handover under way (the first move's) is committed and not yet released."""
    with handle.master.locked():
        coordinator = handle.master.handovers
        return bool(coordinator is not None and coordinator.orders
                    and all(o.committed for o in coordinator.orders.values()))


# LiveRobin: the executor of a target replica of the TTL'd lists dies between the commit of their
# move and its release; KaZoo: that of the processing-time timers'
@pytest.mark.parametrize("mode, moved_first", [("liverobin", "recent"), ("kazoo", "batches")])
def test_windows_joins_and_keyed_state_survive_a_kill_and_moves_with_exact_output(stack, spark, topic_prefix,
                                                                                  mode, moved_first):
    name = f"{topic_prefix}joins{mode[0]}"
    started = time.time()
    topics, outs, table_records, table = _topics(stack, name)
    job = _joins_job(name, topics, outs, parallelism=2)
    handle = run(job, spark=spark, conf=_conf(stack, mode, rhino=True))  # the lost replica comes back
    moves: dict = {}
    try:
        handle.wait_started(120)

        def table_read() -> bool:  # both replicas of the lookup hold the whole table before any order
            seen = handle.master.snapshot()
            return all(sum(m.records_in for n, m in seen.items() if n.startswith("enrich[") and n.endswith(f"r{r}"))
                       >= len(table_records) for r in (0, 1))

        wait_until(table_read, 60, "the lookup join to read the customers table")
        orders, payments, clicks = order_events(int(time.time() * 1000))
        feeder = threading.Thread(target=_feed, args=(stack, topics, _timeline(orders, payments, clicks), 4.0))
        feeder.start()
        time.sleep(0.8)
        mover = _move_every_keyed_task(handle, moved_first, moves)
        wait_until(lambda: _committed(handle) or bool(moves), 30, f"the move of {moved_first} to commit")
        assert not moves, f"the first move ended before its commit was seen: {moves}"
        kill_executor(locate(f"{moved_first}[1]r0", job=name))  # a replica of the move's target
        feeder.join()
        mover.join(180)
        assert not mover.is_alive(), f"moves still under way: {moves}"
        _every_batch_out(stack, outs, clicks)
        result = handle.drain(timeout=300)
    except BaseException:
        handle.stop()
        raise
    assert set(moves) == set(KEYED_TASKS) and all(m["state"] == "completed" for m in moves.values()), moves
    _assert_no_divergence(result)
    assert result.metrics.dead_lettered == 0 and result.metrics.late_records == 0, _dead_letters(stack, name)
    _assert_exact(stack, outs, orders, payments, clicks, table, result.events,
                  lambda: writer_log_lines(spark, started))
    assert sum("declared dead" in text for _, text in result.events) == 1, result.events
    for task in KEYED_TASKS:
        replicas_agree(result, handle, task=task)
    _assert_ttl_swept(result, handle, 2)


@pytest.mark.parametrize("mode", ["liverobin", pytest.param("kazoo", marks=pytest.mark.slow)])
def test_every_kind_of_state_goes_on_from_a_savepoint_at_another_parallelism(stack, spark, topic_prefix, tmp_path,
                                                                             mode):
    """Run 1 at parallelism 2 takes the first half of the input and is drained into a savepoint
    while sessions, sliding windows, join buffers, TTL'd lists and processing-time batches are
    open; run 2 at parallelism 3 goes on from it with the second half.  The two runs' output is
    the reference output of the whole input."""
    name = f"{topic_prefix}spjoins{mode[0]}"
    topics, outs, table_records, table = _topics(stack, name)
    orders, payments, clicks = order_events(int(time.time() * 1000))
    timeline = _timeline(orders, payments, clicks)
    half = len(timeline) // 2
    root = tmp_path / "savepoint"
    # batches flush 10 s of processing time after their first click, long after run 1's input
    # (2 s) and its drain: the savepoint holds pending processing-time timers
    first = run(_joins_job(name, topics, outs, parallelism=2, batch_after_ms=10_000), spark=spark,
                conf=_conf(stack, mode))
    try:
        first.wait_started(120)
        wait_until(lambda: sum(m.records_in for n, m in first.master.snapshot().items() if n.startswith("enrich["))
                   >= 2 * len(table_records), 60, "the lookup join to read the customers table")
        _feed(stack, topics, timeline[:half], 2.0, batches=10)
        first.drain(timeout=300, savepoint=root)
    except BaseException:
        first.stop()
        raise
    handle = run(_joins_job(name, topics, outs, parallelism=3, batch_after_ms=10_000), spark=spark,
                 conf={**_conf(stack, mode), "spark.replication.restoreFrom": str(root)})
    try:
        handle.wait_started(120)
        _feed(stack, topics, timeline[half:], 2.0, batches=10)
        _every_batch_out(stack, outs, clicks)
        result = handle.drain(timeout=300)
    except BaseException:
        handle.stop()
        raise
    assert 0 < len(read_output(stack, outs["sessions"]))
    for task in ("enrich", "pay", "pairs", "sessions", "recent", "batches", "sampled"):
        assert sum(result.per_instance[f"{task}[{p}]r0"].savepoint_entries for p in range(3)) > 0, task
    _assert_exact(stack, outs, orders, payments, clicks, table)
    assert result.metrics.dead_lettered == 0 and result.metrics.late_records == 0
    for task in KEYED_TASKS:
        replicas_agree(result, handle, task=task)
    _assert_ttl_swept(result, handle, 3)


def _views_timeline(views: list[dict]) -> list[tuple[str, int, str, dict]]:
    """The views as :func:`_feed` takes them, in the order given (late ones stay late)."""
    return [("views", v["ts"], v["page"], v) for v in views]


@pytest.mark.parametrize("mode", ["liverobin", pytest.param("kazoo", marks=pytest.mark.slow)])
def test_repeats_expired_by_processing_time_and_late_views_survive_a_kill_and_moves(stack, spark, topic_prefix,
                                                                                   mode):
    """Page views (``replication/examples/views.py``): repeats dropped by ids kept with a
    processing-time TTL, counts in tumbling windows with allowed lateness, the too-late views to
    a side output.  Vnodes of both tasks move and the executor of a replica of the ids is killed
    while the on-time views flow (Rhino brings it back); once every page's first window has
    fired, late views come: those within the lateness update their window, the others go to the
    side output.  Both outputs equal the reference record by record, the replicas agree, and the
    ids are swept by processing time."""
    name = f"{topic_prefix}views{mode[0]}"
    topics = {t: f"{name}{t}" for t in ("views", "counts", "late")}
    create_topics(stack.bootstrap_servers, {topics["views"]: 1})
    job = Job(name)
    add_page_views(job, topics["views"], topics["counts"], topics["late"], parallelism=2)
    handle = run(job, spark=spark, conf=_conf(stack, mode, rhino=True))
    moves: dict = {}
    try:
        handle.wait_started(120)
        start = int(time.time() * 1000) // VIEW_WINDOW_MS * VIEW_WINDOW_MS
        on_time, late = page_views(start)
        pages = sorted({v["page"] for v in on_time})
        feeder = threading.Thread(target=_feed, args=(stack, topics, _views_timeline(on_time), 4.0))
        feeder.start()
        time.sleep(0.8)
        mover = _move_every_keyed_task(handle, "unique", moves, tasks=("unique", "views-per-page"),
                                       keys={"views-per-page": pages})
        wait_until(lambda: _committed(handle) or bool(moves), 30, "the move of the ids to commit")
        assert not moves, f"the first move ended before its commit was seen: {moves}"
        kill_executor(locate("unique[1]r0", job=name))  # a replica of the move's target
        feeder.join()
        mover.join(180)
        assert not mover.is_alive(), f"moves still under way: {moves}"
        wait_until(lambda: {w["key"] for w in read_output(stack, topics["counts"]) if w["start"] == start}
                   == set(pages), 60, "every page's first window to fire")
        _feed(stack, topics, _views_timeline(late), 0.0, batches=1)
        expected, too_late = views_reference(on_time, late)
        wait_until(lambda: len(read_output(stack, topics["late"])) >= len(too_late), 60, "the too-late views")
        # processing time passes every id's expiry (REPEAT_TTL_MS after its view, swept within an
        # eighth more)
        time.sleep(REPEAT_TTL_MS / 1000 * 1.125 + 2.0)
        result = handle.drain(timeout=300)
    except BaseException:
        handle.stop()
        raise
    assert set(moves) == {"unique", "views-per-page"} and all(m["state"] == "completed" for m in moves.values()), moves
    _assert_no_divergence(result)
    got = Counter((w["key"], w["start"], w["value"]) for w in read_output(stack, topics["counts"]))
    assert got == expected
    assert Counter(json.dumps(v, sort_keys=True) for v in read_output(stack, topics["late"])) == \
        Counter(json.dumps(v, sort_keys=True) for v in too_late)
    assert result.metrics.dead_lettered == 0
    assert sum("declared dead" in text for _, text in result.events) == 1, result.events
    for task in ("unique", "views-per-page"):
        replicas_agree(result, handle, task=task)
        _assert_ttl_swept(result, handle, 2, task=task)
