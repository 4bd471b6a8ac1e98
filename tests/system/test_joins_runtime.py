"""The operators of real jobs on real executors with replication: session and sliding windows, a
lookup join against a table from a compacted topic (read with its metadata), an interval join, a
window join, a running reduce whose sink sets the Kafka key, timestamp and headers from the
record, list state with a TTL, and processing-time timers (LiveRobin's pulses, KaZoo's orders).
A replica's executor is killed and vnodes of the interval join, the TTL'd state and the timers
move while input flows; every output equals a plain-Python reference of the same input, record
by record, the replicas agree, and the TTL'd state is swept empty by the end."""

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
    add_clickstream,
    batched_clicks,
    clicks_counted,
    pages_reference,
    running_reference,
)
from replication.examples.enrichment import add_enrichment, enrichment_reference, same_second_reference
from replication.examples.sessions import (
    add_recent_clicks,
    add_sessions,
    recent_clicks_reference,
    sessions_reference,
)
from rhino_state.increments import EMPTY_DIGEST
from tests.example_inputs import customer_table, order_events
from tests.ordered_runs import read_output, replicas_agree, wait_until

pytestmark = pytest.mark.integration

def _feed(stack, topics: dict[str, str], orders, payments, clicks, seconds: float) -> None:
    """Produce the events in event-time order over about ``seconds``, in batches."""
    timeline = sorted([("orders", o["ts"], o["id"], o) for o in orders]
                      + [("payments", p["ts"], p["order"], p) for p in payments]
                      + [("clicks", c["ts"], c["user"], c) for c in clicks], key=lambda e: e[1])
    batches = 20
    step = -(-len(timeline) // batches)
    for b in range(batches):
        chunk = timeline[b * step:(b + 1) * step]
        for name in ("orders", "payments", "clicks"):
            recs = [(key.encode(), json.dumps(v).encode()) for n, _, key, v in chunk if n == name]
            if recs:
                produce(stack.bootstrap_servers, topics[name], recs)
        time.sleep(seconds / batches)


@pytest.mark.parametrize("mode", ["liverobin", "kazoo"])
def test_windows_joins_and_keyed_state_survive_a_kill_and_a_move_with_exact_output(stack, spark, topic_prefix,
                                                                                  mode):
    name = f"{topic_prefix}joins{mode[0]}"
    topics = {t: f"{name}{t}" for t in ("orders", "payments", "customers", "clicks")}
    outs = {t: f"{name}{t}" for t in ("enriched", "paid", "pairs", "sessions", "recent", "running", "pages",
                                      "batches")}
    create_topics(stack.bootstrap_servers, {t: 1 for t in topics.values()})
    table_records, table = customer_table()
    produce(stack.bootstrap_servers, topics["customers"], table_records)
    job = Job(name)
    add_enrichment(job, topics["orders"], topics["payments"], topics["customers"], outs["enriched"], outs["paid"],
                   parallelism=2, same_second_topic=outs["pairs"])
    clicks_stream = add_sessions(job, topics["clicks"], outs["sessions"], parallelism=2)
    add_recent_clicks(clicks_stream, outs["recent"], parallelism=2)
    add_clickstream(clicks_stream, outs["running"], outs["pages"], outs["batches"], parallelism=2)
    kazoo = {"spark.replication.zookeeper.connect": stack.zookeeper_connect,
             "spark.replication.kazoo.sessionTimeout": "1s"} if mode == "kazoo" else {}
    handle = run(job, spark=spark, conf={
        "spark.replication.kafka.bootstrapServers": stack.bootstrap_servers, "spark.replication.enabled": "true",
        "spark.replication.mode": mode, "spark.replication.failureTimeout": "2s", **kazoo})
    try:
        handle.wait_started(120)

        def table_read() -> bool:  # both replicas of the lookup hold the whole table before any order
            seen = handle.master.snapshot()
            return all(sum(m.records_in for n, m in seen.items() if n.startswith("enrich[") and n.endswith(f"r{r}"))
                       >= len(table_records) for r in (0, 1))

        wait_until(table_read, 60, "the lookup join to read the customers table")
        orders, payments, clicks = order_events(int(time.time() * 1000))
        feeder = threading.Thread(target=_feed, args=(stack, topics, orders, payments, clicks, 4.0))
        feeder.start()
        time.sleep(0.8)
        moved = handle.move_vnodes("pay", handle.routing("pay").vnodes_of(0)[:16], 1)
        moved_ttl = handle.move_vnodes("recent", handle.routing("recent").vnodes_of(1)[:16], 0)
        moved_timers = handle.move_vnodes("batches", handle.routing("batches").vnodes_of(0)[:16], 1)
        kill_executor(locate("enrich[0]r0", job=name))
        feeder.join()
        # they fire at pulses or orders, not at the end of the input: every batch out before the drain
        wait_until(lambda: sum(batched_clicks(read_output(stack, outs["batches"])).values()) >= len(clicks),
                   60, "every click's batch", poll_s=0.5)
        result = handle.drain(timeout=300)
    except BaseException:
        handle.stop()
        raise
    assert moved["state"] == "completed", moved
    assert moved_ttl["state"] == "completed", moved_ttl
    assert moved_timers["state"] == "completed", moved_timers
    enriched, paid = enrichment_reference(orders, payments, table)

    def as_counter(records):
        return Counter(json.dumps(r, sort_keys=True) for r in records)

    assert as_counter(read_output(stack, outs["enriched"])) == as_counter(enriched)
    assert as_counter(read_output(stack, outs["paid"])) == as_counter(paid)
    assert as_counter(read_output(stack, outs["sessions"])) == as_counter(sessions_reference(clicks))
    assert as_counter(read_output(stack, outs["recent"])) == as_counter(recent_clicks_reference(clicks))
    assert as_counter(read_output(stack, outs["pairs"])) == as_counter(same_second_reference(orders, payments))
    pages = [(w["key"], w["start"], w["value"]) for w in read_output(stack, outs["pages"])]
    assert len(pages) == len({(k, s) for k, s, _ in pages}) and {(k, s): n for k, s, n in pages} == pages_reference(clicks)
    running = read_all(stack.bootstrap_servers, outs["running"])
    assert as_counter(json.loads(r.value) for r in running) == as_counter(running_reference(clicks))
    for r in running:  # the sink took the Kafka key, timestamp and a header from each result
        value = json.loads(r.value)
        assert (r.key, r.timestamp, dict(r.headers)["clicks"]) == (
            value["user"].encode(), value["last"], str(value["clicks"]).encode()), r
    batches = read_output(stack, outs["batches"])
    assert batched_clicks(batches) == clicks_counted(clicks)
    assert all(b["clicks"] == sorted(b["clicks"]) for b in batches)
    assert result.metrics.dead_lettered == 0 and result.metrics.late_records == 0
    assert sum("declared dead" in text for _, text in result.events) >= 1, result.events
    for task in ("pay", "pairs", "sessions", "recent", "running", "pages", "batches"):
        replicas_agree(result, handle, task=task)
    tid = next(t.id for t in handle.plan.tasks if t.name == "recent")
    ttl_replicas = {f"recent[{p}]r{r}": result.per_instance[f"recent[{p}]r{r}"].state_digest
                    for p in range(2) for r in range(2) if handle.placement[(tid, p, r)] not in handle.master.dead}
    assert len(ttl_replicas) >= 2 and set(ttl_replicas.values()) == {EMPTY_DIGEST}, ttl_replicas  # swept empty
