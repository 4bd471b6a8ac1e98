"""End to end on real executors: a stateful job with a window and a union, checked record by record.

Runs against the session's local-cluster Spark (3 executor JVMs) and the embedded
ZooKeeper + broker.  The output topics must equal a reference computed in plain
Python from the same input: nothing missing, nothing extra.
"""

from __future__ import annotations

import json
import threading

import pytest

from deploy.topics import create_topics, produce, read_all
from replication import ConfigError, run
from replication.examples.fraud import PaymentGenerator, Topics, build_job, canonical, generate, reference

pytestmark = pytest.mark.integration


def _conf(stack, **extra):
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.channel.bufferTimeout": "5ms", **extra}


def _values(bootstrap, topic):
    return [json.loads(r.value) for r in read_all(bootstrap, topic, idle_timeout_s=1.0)]


def test_stateful_window_union_job_matches_reference(stack, spark, topic_prefix):
    topics = Topics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.eu: 2, topics.us: 2})
    eu, us = PaymentGenerator("eu", cards=60, merchants=15), PaymentGenerator("us", cards=60, merchants=15)
    # event time advances 7 ms per record and region: ~35 one-second windows per merchant over the run
    first_eu, pay_eu, _ = generate(eu, 2500, start_ts=1_700_000_000_000, step_ms=7)
    first_us, pay_us, _ = generate(us, 2500, start_ts=1_700_000_000_003, step_ms=7)
    produce(stack.bootstrap_servers, topics.eu, first_eu)
    produce(stack.bootstrap_servers, topics.us, first_us)

    # 8 partitions per keyed operator: 22 instances hosted by 3 workers on 3 executors
    handle = run(build_job(topics, name=f"{topic_prefix}fraud", parallelism=8), spark=spark, conf=_conf(stack))
    # more input while the job runs: it is a streaming job, not a batch
    more_eu, pay_eu2, _ = generate(eu, 2500, start_ts=1_700_000_017_500, step_ms=7)
    more_us, pay_us2, _ = generate(us, 2500, start_ts=1_700_000_017_503, step_ms=7)
    writers = [threading.Thread(target=produce, args=(stack.bootstrap_servers, t, recs))
               for t, recs in ((topics.eu, more_eu), (topics.us, more_us))]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    result = handle.drain(timeout=300)

    expected_decisions, expected_totals = reference([pay_eu + pay_eu2, pay_us + pay_us2])
    decisions = _values(stack.bootstrap_servers, topics.decisions)
    totals = _values(stack.bootstrap_servers, topics.totals)
    # the check is not vacuous: the rule raised alerts, and there are many windows
    assert sum(bool(d["alerts"]) for d in expected_decisions) > 50 and len(expected_totals) > 300
    assert canonical(decisions) == canonical(expected_decisions)
    assert canonical(totals) == canonical(expected_totals)
    assert result.status == "finished"
    assert result.metrics.dead_lettered == 0 and result.metrics.gaps == 0
    # the 22 instances really ran in 3 workers on 3 distinct executor processes
    assert len(handle.placement) == 22 and len(result.per_instance) == 22
    assert len({w.executor for w in result.workers.values()}) == 3


def test_malformed_records_go_to_dead_letter_topic_and_rest_is_exact(stack, spark, topic_prefix):
    topics = Topics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.eu: 2, topics.us: 2})
    eu = PaymentGenerator("eu", cards=30, merchants=8, bad_every=50)
    us = PaymentGenerator("us", cards=30, merchants=8)
    recs_eu, pay_eu, bad = generate(eu, 1500, start_ts=1_700_000_000_000, step_ms=5)
    recs_us, pay_us, _ = generate(us, 800, start_ts=1_700_000_000_001, step_ms=9)
    produce(stack.bootstrap_servers, topics.eu, recs_eu)
    produce(stack.bootstrap_servers, topics.us, recs_us)
    job = build_job(topics, name=f"{topic_prefix}fraud")
    result = run(job, spark=spark, conf=_conf(stack)).drain(timeout=300)

    expected_decisions, expected_totals = reference([pay_eu, pay_us])
    assert canonical(_values(stack.bootstrap_servers, topics.decisions)) == canonical(expected_decisions)
    assert canonical(_values(stack.bootstrap_servers, topics.totals)) == canonical(expected_totals)
    dead = read_all(stack.bootstrap_servers, f"{job.name}.dlq", idle_timeout_s=1.0)
    assert bad == 30 and len(dead) == bad == result.metrics.dead_lettered
    reasons = [dict(d.headers)["reason"].decode() for d in dead]
    assert sum(r.startswith("deserialize: JSONDecodeError") for r in reasons) == 15
    assert sum(r.startswith("TypeError") for r in reasons) == 15  # the filter raised on a string amount
    inputs = {(r.partition, r.offset): r.value for r in read_all(stack.bootstrap_servers, topics.eu)}
    for d in dead:  # the source coordinates point at the original record
        h = {k: v.decode() for k, v in d.headers}
        assert h["source.topic"] == topics.eu
        original = inputs[(int(h["source.partition"]), int(h["source.offset"]))]
        if h["payload"] == "original":  # failed at the source: the bytes as read
            assert h["reason"].startswith("deserialize:") and d.value == original
        else:  # failed in user code downstream: the value as JSON
            assert h["payload"] == "json" and json.loads(d.value) == json.loads(original)


def test_bad_config_is_refused_before_anything_starts(stack, spark, topic_prefix):
    topics = Topics.with_prefix(topic_prefix)
    job = build_job(topics, name=f"{topic_prefix}fraud")
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    with pytest.raises(ConfigError) as err:
        run(job, spark=spark, conf=_conf(stack, **{"spark.replication.channel.batchSize": "0",
                                                   "spark.replication.paralelism": "2"}))
    message = str(err.value)
    assert "spark.replication.channel.batchSize" in message
    assert "spark.replication.paralelism" in message and "spark.replication.parallelism" in message
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs_before


def test_a_job_the_executors_cannot_load_is_refused_before_it_starts(stack, spark, topic_prefix, tmp_path,
                                                                    monkeypatch):
    """A function from a module only the driver can import (not installed on the executors, not
    shipped): run() refuses the job in one line naming the module, instead of starting workers
    that fail to unpickle it until Spark gives up."""
    from replication import Job, JobDefinitionError

    (tmp_path / "rules_on_the_driver.py").write_text("def shout(s):\n    return s.upper()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import rules_on_the_driver

    src = f"{topic_prefix}in"
    create_topics(stack.bootstrap_servers, {src: 1})
    job = Job(f"{topic_prefix}unloadable")
    job.source(src, deserializer="str").map(rules_on_the_driver.shout).sink(f"{topic_prefix}out", serializer="str")
    with pytest.raises(JobDefinitionError) as refused:
        run(job, spark=spark, conf=_conf(stack))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("the executors cannot load the job: executor(s) ")
    assert "ModuleNotFoundError: No module named 'rules_on_the_driver'" in message
    assert "--py-files" in message


def test_latest_starting_offsets_skip_old_records_and_drain_idle_partitions(stack, spark, topic_prefix):
    """'latest' starts at the end as of job start (resolved from a fetch, not ListOffsets, which the
    embedded broker under-reports), and a partition that gets nothing new still drains."""
    from replication import Job

    src, out = f"{topic_prefix}in", f"{topic_prefix}out"
    create_topics(stack.bootstrap_servers, {src: 3})
    produce(stack.bootstrap_servers, src, [(b"k%d" % (i % 2), b"old-%d" % i) for i in range(100)])
    job = Job(f"{topic_prefix}latest")
    job.source(src, deserializer="str", starting_offsets="latest").map(str.upper).sink(out, serializer="str")
    _new_records_alone_come_out(stack, spark, job, src, out, 50, drain_timeout=120)


def test_a_drain_ends_a_source_partition_that_never_had_a_record(stack, spark, topic_prefix):
    """Read from the beginning, a partition that never got a record has no position to report: a
    drain agrees it ends at offset 0 there, which the replica reading it has reached already.  The
    source delivers each record's metadata (key, headers, timestamp, position), and the sink takes
    the Kafka key, headers and timestamp of what it writes from the record."""
    from replication import Job

    def tagged(record):  # (defined here: the executors get it by value, they cannot import tests)
        return {"v": record.value.upper(), "k": record.key, "at": f"{record.partition}:{record.offset}",
                "ts": record.timestamp, "n": record.header("n")}

    src, out = f"{topic_prefix}in", f"{topic_prefix}out"
    create_topics(stack.bootstrap_servers, {src: 3})
    job = Job(f"{topic_prefix}empty")
    (job.source(src, deserializer="str", metadata=True, key_deserializer="str").map(tagged)
     .sink(out, serializer=lambda t: t["v"].encode(), key_serializer="str", key=lambda t: t["k"],
           headers=lambda t: [("at", t["at"].encode()), ("n", t["n"])], timestamp=lambda t: t["ts"] + 7))
    _new_records_alone_come_out(stack, spark, job, src, out, 20, drain_timeout=60)
    inputs = {r.value.decode().upper(): r for r in read_all(stack.bootstrap_servers, src)}
    for r in read_all(stack.bootstrap_servers, out):
        source = inputs[r.value.decode()]
        assert r.key == source.key and r.timestamp == source.timestamp + 7, (r, source)
        headers = dict(r.headers)
        assert headers["at"] == f"{source.partition}:{source.offset}".encode(), (r, source)
        assert headers["n"] == dict(source.headers)["n"], (r, source)


def _new_records_alone_come_out(stack, spark, job, src: str, out: str, n: int, drain_timeout: float) -> None:
    """Run ``job`` (``src`` of three partitions, upper-cased into ``out``), produce ``n`` records
    keyed k0/k1 (with a header ``n``: the record's number), which hash to at most two of the three
    partitions (at least one gets nothing), drain it: exactly those records come out."""
    handle = run(job, spark=spark, conf=_conf(stack))
    produce(stack.bootstrap_servers, src, [(b"k%d" % (i % 2), b"new-%d" % i, [("n", b"%d" % i)]) for i in range(n)])
    result = handle.drain(timeout=drain_timeout)
    got = sorted(r.value.decode() for r in read_all(stack.bootstrap_servers, out))
    assert got == sorted(f"NEW-{i}" for i in range(n))
    assert result.records_read == n
