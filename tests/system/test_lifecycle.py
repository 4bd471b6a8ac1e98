"""Job lifecycle on real executors: graceful stop, an executor kill without replication,
and the user's path through spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deploy.topics import create_topics, produce, read_all
from replication import JobFailedError, run
from replication.examples.fraud import PaymentGenerator, Topics, build_job, canonical, generate, reference
from replication.spark_cluster import executor_ids, kill_executor

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _conf(stack):
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers}


def _trickle(stack, topic, gen, stop: threading.Event):
    """Keep producing a little while the test runs, so the job is busy when it is stopped or killed."""
    ts = 1_700_000_000_000
    while not stop.is_set():
        recs, _, _ = generate(gen, 20, start_ts=ts, step_ms=5)
        produce(stack.bootstrap_servers, topic, recs)
        ts += 100


def test_stop_is_graceful_and_leaves_no_spark_job(stack, spark, topic_prefix):
    topics = Topics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.eu: 2, topics.us: 2})
    handle = run(build_job(topics, name=f"{topic_prefix}fraud"), spark=spark, conf=_conf(stack))
    handle.wait_started(120)
    stop = threading.Event()
    feeder = threading.Thread(target=_trickle, args=(stack, topics.eu, PaymentGenerator("eu"), stop))
    feeder.start()
    try:
        deadline = time.monotonic() + 60
        while handle.metrics().records_in < 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert handle.metrics().records_in >= 200
        t0 = time.monotonic()
        result = handle.stop()
        stop_s = time.monotonic() - t0
    finally:
        stop.set()
        feeder.join()
    assert result.status == "stopped"
    # the application-level signal ended the workers; the Spark job was not cancelled by force
    assert stop_s < handle.cfg.stop_timeout_ms / 1000
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_executor_kill_without_replication_fails_the_job_clearly(stack, spark, topic_prefix):
    topics = Topics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.eu: 2, topics.us: 2})
    handle = run(build_job(topics, name=f"{topic_prefix}fraud"), spark=spark, conf=_conf(stack))
    handle.wait_started(120)
    victim = handle.master.workers[0].executor
    assert victim in executor_ids(spark.sparkContext)
    kill_executor(spark.sparkContext, victim)
    with pytest.raises(JobFailedError, match="lost.*spark.replication.enabled"):
        handle.wait(timeout=120)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_spark_submit_runs_a_user_job_script(stack, topic_prefix, tmp_path):
    """The user's path: spark-submit a script that calls replication.run (its own Spark cluster)."""
    topics = Topics.with_prefix(topic_prefix)
    create_topics(stack.bootstrap_servers, {topics.eu: 2, topics.us: 2})
    recs_eu, pay_eu, _ = generate(PaymentGenerator("eu", cards=20), 600, start_ts=1_700_000_000_000, step_ms=11)
    recs_us, pay_us, _ = generate(PaymentGenerator("us", cards=20), 600, start_ts=1_700_000_000_005, step_ms=11)
    produce(stack.bootstrap_servers, topics.eu, recs_eu)
    produce(stack.bootstrap_servers, topics.us, recs_us)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [str(spark_submit), "--master", "local-cluster[2,1,512]", "--conf", "spark.executor.memory=512m",
           "--conf", "spark.ui.enabled=false",
           "--conf", f"spark.replication.kafka.bootstrapServers={stack.bootstrap_servers}",
           "--conf", "spark.replication.parallelism=2",
           str(REPO / "replication/examples/submit_fraud.py"), "--prefix", topic_prefix,
           "--name", f"{topic_prefix}submitted", "--drain-after", "1"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "finished after" in proc.stdout and "1,200 records read" in proc.stdout
    decisions, totals = reference([pay_eu, pay_us])
    got = [json.loads(r.value) for r in read_all(stack.bootstrap_servers, topics.decisions)]
    assert canonical(got) == canonical(decisions)
    got_totals = [json.loads(r.value) for r in read_all(stack.bootstrap_servers, topics.totals)]
    assert canonical(got_totals) == canonical(totals), proc.stdout[-2000:]


JOB_MODULE = '''
from replication import Job, KeyedProcessFunction


class RunningCount(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        yield {{"word": word, "n": n}}


def build():
    job = Job("{name}")
    (job.source("{topic}", deserializer="str")
     .flat_map(lambda line: line.split())
     .key_by(lambda w: w)
     .process(RunningCount(), name="count")
     .sink("{out}"))
    return job
'''


def test_cli_run_ships_a_user_module_and_refuses_bad_config(stack, topic_prefix, tmp_path):
    """`replication run MODULE:FACTORY` with a job module the executors cannot import by themselves."""
    topic, out = f"{topic_prefix}lines", f"{topic_prefix}counts"
    create_topics(stack.bootstrap_servers, {topic: 1})
    lines = [f"w{i % 7} w{i % 3} w{i % 5}" for i in range(300)]
    produce(stack.bootstrap_servers, topic, [line.encode() for line in lines])
    module = tmp_path / f"{topic_prefix.replace('-', '_')}wordjob.py"
    module.write_text(JOB_MODULE.format(name=f"{topic_prefix}words", topic=topic, out=out))
    # only the driver finds the module (python -m puts the cwd on its path); executors need it shipped
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cli = [sys.executable, "-m", "ops.cli", "run", f"{module.stem}:build",
           "--master", "local-cluster[2,1,512]", "--conf", f"spark.replication.kafka.bootstrapServers={stack.bootstrap_servers}"]

    bad = subprocess.run([*cli, "--conf", "spark.replication.channel.batchSize=-1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "spark.replication.channel.batchSize" in bad.stderr
    assert "Traceback" not in bad.stderr

    proc = subprocess.run([*cli, "--drain-after", "1"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts: dict[str, int] = {}
    expected = []
    for line in lines:
        for word in line.split():
            counts[word] = counts.get(word, 0) + 1
            expected.append({"word": word, "n": counts[word]})
    got = [json.loads(r.value) for r in read_all(stack.bootstrap_servers, out)]
    assert canonical(got) == canonical(expected) and len(got) == 900
