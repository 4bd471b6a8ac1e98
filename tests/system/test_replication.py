"""Active replication on real executors: every partition runs twice; kills are masked.

The job is single-input (source -> keyed fraud rule -> sink, parallelism 2, three
tasks, 12 replicas on 3 executors), so FIFO channels make both replicas of every
partition deterministic without an ordering mode.  Each test kills (or hangs) the
executor hosting a chosen replica mid-run, with the real kill tooling, and checks
the output topic record by record against the failure-free reference.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import zlib

import pytest
from pyspark import cloudpickle

from deploy.topics import create_topics, produce, read_all
from ops.chaos import kill_executor, kill_python, locate, pause_executor, resume_executor
from replication import Job, KeyedProcessFunction, run
from replication.examples.fraud import PaymentGenerator, build_replicated_job, canonical, generate, reference
from replication.status import read_status
from tests.ordered_runs import feed

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this module

REPLICATED = {"spark.replication.enabled": "true", "spark.replication.failureTimeout": "2s"}


def _conf(stack):
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers, **REPLICATED}


def _run_with_fault(stack, spark, prefix, victim: str, fault):
    """Feed 6,000 payments over ~6 s, apply ``fault(job name, victim replica)`` after ~2 s,
    drain, and return (result, output decisions, expected decisions, handle)."""
    src, out = f"{prefix}payments", f"{prefix}decisions"
    create_topics(stack.bootstrap_servers, {src: 2})
    job = build_replicated_job(src, out, name=f"{prefix}fraud")
    handle = run(job, spark=spark, conf=_conf(stack))
    handle.wait_started(120)
    gen = PaymentGenerator("eu", cards=80, merchants=20)
    payments: list[dict] = []

    def feed():
        ts = 1_700_000_000_000
        for _ in range(30):
            recs, pays, _ = generate(gen, 200, start_ts=ts, step_ms=1)
            produce(stack.bootstrap_servers, src, recs)
            payments.extend(pays)
            ts += 200
            time.sleep(0.2)

    feeder = threading.Thread(target=feed)
    feeder.start()
    time.sleep(2.0)
    fault(job.name, victim)
    feeder.join()
    result = handle.drain(timeout=300)
    got = [json.loads(r.value) for r in read_all(stack.bootstrap_servers, out)]
    expected, _ = reference([payments])
    return result, got, expected, handle


def _kill(job: str, replica: str) -> None:
    kill_executor(locate(replica, job=job))


def test_python_worker_kill_is_masked(stack, spark, topic_prefix):
    """Only the Python worker hosting a replica dies (its executor JVM lives on): the driver
    notices the silent worker or its relaunch, and the output stays exact."""
    result, got, expected, _ = _run_with_fault(stack, spark, topic_prefix, "fraud-rule[0]r1",
                                               lambda job, replica: kill_python(locate(replica, job=job)))
    assert canonical(got) == canonical(expected)
    assert any("declared dead" in text for _, text in result.events), result.events


@pytest.mark.parametrize("victim", ["source:{p}payments[0]r1", "fraud-rule[1]r0", "decisions-sink[0]r0"],
                         ids=["source-replica", "stateful-replica", "sink-writer-replica"])
def test_executor_kill_is_masked_and_output_stays_exact(stack, spark, topic_prefix, victim):
    victim = victim.format(p=topic_prefix)
    result, got, expected, handle = _run_with_fault(stack, spark, topic_prefix, victim, _kill)
    assert len(expected) > 5000
    assert canonical(got) == canonical(expected)  # no loss, no duplicate
    assert result.status == "finished"
    dead = [text for _, text in result.events if "declared dead" in text]
    assert len(dead) == 1, result.events
    if victim.startswith("decisions-sink"):
        assert any("takes over writing" in text for _, text in result.events)
    assert result.metrics.gaps == 0
    # determinism: where both replicas of a stateful partition survived, their state is identical
    rule = next(t.id for t in handle.plan.tasks if t.name == "fraud-rule")
    survivors = [p for p in (0, 1) if all(handle.placement[(rule, p, r)] not in handle.master.dead for r in (0, 1))]
    for p in survivors:
        d0, d1 = (result.per_instance[f"fraud-rule[{p}]r{r}"].state_digest for r in (0, 1))
        assert d0 and d0 == d1


def test_hung_executor_is_fenced_and_causes_no_duplicates(stack, spark, topic_prefix):
    """SIGSTOP the executor of a sink writer: after the failure timeout the other replica takes
    over; when the hung executor wakes up it is evicted and its writer is fenced."""
    paused = {}

    def hang(job, replica):
        rp = locate(replica, job=job)
        paused["target"] = rp
        pause_executor(rp)
        threading.Timer(5.0, lambda: resume_executor(rp)).start()

    result, got, expected, _ = _run_with_fault(stack, spark, topic_prefix, "decisions-sink[1]r0", hang)
    assert canonical(got) == canonical(expected)
    assert len({(d["txn"]) for d in got}) == len(got)
    texts = [t for _, t in result.events]
    assert any("silent for" in t for t in texts) and any("takes over writing" in t for t in texts)


class RunningHash(KeyedProcessFunction):
    """Order-sensitive on purpose: a hash chain over every value it consumes."""

    def open(self, ctx):
        self.h = ctx.value_state("h", default=0)

    def process(self, value, ctx):
        h = (self.h.value() * 1_000_003 + zlib.crc32(value.encode())) % (1 << 61)  # stable across processes
        self.h.update(h)
        return ()


def test_unordered_mode_diverges_on_a_two_input_task(stack, spark, topic_prefix, caplog):
    """The paper's "no ordering" baseline: two sources into one task, replicated, first come
    first served (allowed by its key; refused without it: tests/ops/test_cli.py); the two
    replicas of the order-sensitive operator end in different states.
    Whether they do depends on timing (two replicas can happen to see the batches in the same
    order), so the input also arrives live, in rounds, while the job runs (many interleavings
    for the two replicas to differ in), and up to three runs; one divergence proves the point."""
    a, b = f"{topic_prefix}a", f"{topic_prefix}b"
    create_topics(stack.bootstrap_servers, {a: 1, b: 1})
    produce(stack.bootstrap_servers, a, [b"a%d" % i for i in range(4000)])
    produce(stack.bootstrap_servers, b, [b"b%d" % i for i in range(4000)])
    digests = []
    for attempt in range(3):
        job = Job(f"{topic_prefix}diverge{attempt}")
        merged = job.source(a, deserializer="str").union(job.source(b, deserializer="str"))
        (merged.key_by(lambda v: "all", prepartitioned=True).process(RunningHash(), name="hash")
         .new_task().map(str, name="noop").sink(f"{topic_prefix}out{attempt}", serializer="str"))
        with caplog.at_level(logging.WARNING, logger="replication.control.launch"):
            handle = run(job, spark=spark,
                         conf={**_conf(stack), "spark.replication.unordered.allowDivergence": "true"})
            handle.wait_started(120)
            feed(stack, a, b, [], rounds=20, first_round=20 * attempt)
            result = handle.drain(timeout=300)
        assert any("allowDivergence=true" in r.getMessage() and "may diverge" in r.getMessage()
                   and "union" in r.getMessage() for r in caplog.records)
        d0, d1 = result.per_instance["hash[0]r0"].state_digest, result.per_instance["hash[0]r1"].state_digest
        assert d0 and d1
        digests.append((d0, d1))
        if d0 != d1:
            break
    assert any(d0 != d1 for d0, d1 in digests), digests


def test_eight_partitions_on_three_executors_with_live_replica_metrics(stack, spark, topic_prefix):
    """24 partitions (three tasks x 8) as 48 replicas on 3 executors, replicas apart; while the job
    runs, `replication replicas JOB` shows every replica with its counters."""
    src, out = f"{topic_prefix}payments", f"{topic_prefix}decisions"
    create_topics(stack.bootstrap_servers, {src: 8})
    recs, payments, _ = generate(PaymentGenerator("eu", cards=120), 4000, start_ts=1_700_000_000_000, step_ms=3)
    produce(stack.bootstrap_servers, src, recs)
    job = build_replicated_job(src, out, name=f"{topic_prefix}fraud8")
    handle = run(job, spark=spark, conf=_conf(stack))
    handle.wait_started(120)
    assert len(handle.placement) == 48
    executor_of = {w: info.executor for w, info in handle.master.workers.items()}
    assert len(set(executor_of.values())) == 3
    for (t, p, r), w in handle.placement.items():
        if r == 0:
            assert executor_of[w] != executor_of[handle.placement[(t, p, 1)]]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = read_status(job.name).get("metrics", {})
        if sum(metrics.get(f"fraud-rule[{p}]r{r}", {}).get("in", 0) for p in range(8) for r in (0, 1)) >= 2 * 3900:
            break
        time.sleep(0.5)
    cli = subprocess.run([sys.executable, "-m", "ops.cli", "replicas", job.name],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    rows = {line.split()[0]: line.split() for line in cli.stdout.splitlines() if "[" in line.split()[0]}
    assert len(rows) == 48
    header = next(line.split() for line in cli.stdout.splitlines() if line.startswith("REPLICA"))
    col = header.index("IN") - 2  # "JVM PID" and "PYTHON PID" are two words each in the header
    assert sum(int(rows[f"fraud-rule[{p}]r{r}"][col]) for p in range(8) for r in (0, 1)) >= 2 * 3900
    assert handle.running

    result = handle.drain(timeout=300)
    got = [json.loads(r.value) for r in read_all(stack.bootstrap_servers, out)]
    assert canonical(got) == canonical(reference([payments])[0])
    assert result.records_written == len(got)
