"""The command line's entry points: ``python -m replication`` and ``--version``."""

from __future__ import annotations

import subprocess
import sys

from ops.cli import version


def test_python_m_replication_is_the_cli_and_says_its_version():
    done = subprocess.run([sys.executable, "-m", "replication", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"replication {version()}", done
    assert version()[0].isdigit()


JOB_MODULE = '''
from replication import Job

def build():
    job = Job("myjob")
    job.source("clicks").key_by(lambda c: c["user"]).reduce(lambda a, b: b, name="latest").sink("out")
    return job
'''


def _cli(tmp_path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI run from a directory holding the job's module (the user's own directory)."""
    (tmp_path / "myjob.py").write_text(JOB_MODULE)
    return subprocess.run([sys.executable, "-m", "replication", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout)


def test_plan_offline_needs_no_kafka_and_finds_the_job_in_the_current_directory(tmp_path):
    done = _cli(tmp_path, "plan", "myjob:build", "--offline", "--partitions", "clicks=4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["job myjob: 2 tasks, 6 instances, 8 channels",
                                        "  task 0 'source:clicks' x4: source:clicks  (inputs: kafka)",
                                        "  task 1 'latest' x2: latest -> sink:out  (inputs: source:clicks[hash])"]
    refused = _cli(tmp_path, "plan", "myjob:build", "--offline")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("error: invalid job: source 'source:clicks': the partition count of topic 'clicks' is "
                              "needed to plan offline: --partitions clicks=N (or parallelism= on the source)\n")


def test_an_unreachable_broker_is_one_line_naming_the_key_and_the_address(tmp_path):
    done = _cli(tmp_path, "plan", "myjob:build", "--conf", "spark.replication.kafka.bootstrapServers=127.0.0.1:1")
    assert done.returncode == 2
    # (librdkafka's reason, e.g. "Failed to get metadata: Local: Broker transport failure", is its own)
    assert done.stderr.startswith("error: spark.replication.kafka.bootstrapServers=127.0.0.1:1: cannot read Kafka "
                                  "metadata: ") and done.stderr.count("\n") == 1, done.stderr


def test_a_factory_that_fails_is_one_line(tmp_path):
    done = _cli(tmp_path, "plan", "replication.examples.fraud:build_job", "--offline")
    assert done.returncode == 2
    assert done.stderr == ("error: invalid job: 'replication.examples.fraud:build_job' failed: TypeError: build_job() "
                           "missing 1 required positional argument: 'topics'\n")


UNION_MODULE = '''
from replication import Job

def build():
    job = Job("merged")
    job.source("a").union(job.source("b")).key_by(lambda v: v["k"]).reduce(lambda x, y: y, name="latest").sink("out")
    return job
'''


def test_replication_in_unordered_mode_refuses_tasks_with_several_inputs_unless_allowed(tmp_path):
    (tmp_path / "merged.py").write_text(UNION_MODULE)
    plan = ["plan", "merged:build", "--offline", "--partitions", "a=1", "--partitions", "b=1",
            "--conf", "spark.replication.enabled=true"]
    refused = _cli(tmp_path, *plan)
    assert refused.returncode == 2 and refused.stderr == (
        "error: invalid configuration:\nspark.replication.mode=unordered with replication: "
        "tasks with several input channels (union-2) would diverge between their replicas; use mode liverobin or "
        "kazoo, or set spark.replication.unordered.allowDivergence=true to run them anyway\n"), refused.stderr
    allowed = _cli(tmp_path, *plan, "--conf", "spark.replication.unordered.allowDivergence=true")
    assert allowed.returncode == 0 and "may diverge" in allowed.stderr, allowed.stderr
    ordered = _cli(tmp_path, *plan, "--conf", "spark.replication.mode=liverobin")
    assert ordered.returncode == 0 and ordered.stderr == "", ordered.stderr
