"""Network partitions on namespace test hosts: a host's link is cut while its processes keep running,
then healed (``tests/partition_scenario.py``, each run in a process of its own: it has its own
Spark standalone cluster, ZooKeeper and broker on hosts of their own, and its own driver).

Slow (about a minute each); skipped, saying why, where network namespaces cannot be created
(needs root and iproute2).  Run them with ``./dev test -m slow -k network_partition``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.netns import netns_unavailable

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "partition_scenario.py"


def _run(scenario: str, tmp_path: Path) -> dict:
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    out = tmp_path / "outcome.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--scenario", scenario, "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), f"the scenario wrote no outcome (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    res = json.loads(out.read_text())
    assert "error" not in res, res["error"]
    return res


def _common(res: dict) -> None:
    assert res["exact"], res["report"]  # every event id once, every key's chain consistent
    assert not res["divergences"], res["divergences"]
    # failureTimeout is 2 s: the driver declares the silent worker dead within a few heartbeats of it
    assert res["declared_dead_s"] < 10, res["declared_dead_s"]
    # every replica that lived on the cut-off host was restored elsewhere and caught up (two replicas
    # again while the host was still cut off), and after the heal the host's worker came back as a standby
    assert set(res["lost"]) <= {r["replica"] for r in res["recoveries"]}, (res["lost"], res["recoveries"])
    assert res["two_replicas_again_after_cut_s"] < res["cut_s"], res
    assert res["standby_again_after_heal_s"] >= 0


def test_cutting_off_a_kazoo_leader_elects_its_twin_and_keeps_the_output_exact(tmp_path):
    res = _run("kazoo-leader", tmp_path)
    _common(res)
    assert "KaZoo leader" in res["victim"]
    assert res["new_leader_s"] < res["cut_s"]  # the twin led (a higher epoch) while the old leader was cut off


def test_cutting_off_a_liverobin_replica_keeps_the_output_exact(tmp_path):
    res = _run("liverobin-replica", tmp_path)
    _common(res)
    assert res["victim"] == "chain[0]r0"


def test_cutting_off_the_sink_writer_fences_it_and_keeps_the_output_exact(tmp_path):
    res = _run("sink-writer", tmp_path)
    _common(res)
    writer, epoch = res["sink_role_while_cut"][:2]
    # while cut off the other replica writes, at a higher epoch (its producer fenced the old one's)
    assert res["writer_switched_s"] < res["cut_s"] and epoch >= 1
    assert f"chain-sink[0]r{writer}" != res["victim"].split(" ")[0]


def test_the_scripted_namespace_deployment_runs_a_spark_submitted_replicated_job_and_stops_cleanly(tmp_path):
    """``deploy.netns_cluster``: up (ZooKeeper, broker and three Spark workers on hosts of their own),
    spark-submit the fraud job replicated with --conf flags, down: no namespace and no process left."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    from deploy.netns_cluster import STATE, down, up
    from deploy.stack import _pid_alive
    from deploy.standalone import WORKER_CLASS
    from deploy.topics import create_topics, produce, read_all
    from replication.examples.fraud import PaymentGenerator, Topics, canonical, generate, reference

    run_dir = tmp_path / "cluster"
    state = up(run_dir)
    try:
        prefix = "netns-"
        topics = Topics.with_prefix(prefix)
        create_topics(state["bootstrap_servers"], {topics.eu: 2, topics.us: 2})
        recs_eu, pay_eu, _ = generate(PaymentGenerator("eu", cards=20), 600, start_ts=1_700_000_000_000, step_ms=11)
        recs_us, pay_us, _ = generate(PaymentGenerator("us", cards=20), 600, start_ts=1_700_000_000_005, step_ms=11)
        produce(state["bootstrap_servers"], topics.eu, recs_eu)
        produce(state["bootstrap_servers"], topics.us, recs_us)
        proc = subprocess.run(
            [sys.executable, "-m", "deploy.netns_cluster", "submit", "--run-dir", str(run_dir), "--",
             "--conf", "spark.replication.enabled=true", "--conf", "spark.replication.mode=liverobin",
             "--conf", "spark.replication.parallelism=2",
             str(SCRIPT.parents[1] / "replication/examples/submit_fraud.py"), "--prefix", prefix, "--name",
             "netns-fraud", "--drain-after", "1"],
            capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "finished after" in proc.stdout and "1,200 records read" in proc.stdout, proc.stdout[-2000:]
        decisions, totals = reference([pay_eu, pay_us])
        got = [json.loads(r.value) for r in read_all(state["bootstrap_servers"], topics.decisions)]
        assert canonical(got) == canonical(decisions)
    finally:
        down(run_dir)
    assert not (run_dir / STATE).exists()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert state["tag"] not in listed, listed
    assert not any(_pid_alive(pid, WORKER_CLASS) for name, pid in state["spark_pids"].items() if name != "master")
