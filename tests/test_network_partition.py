"""Network partitions on namespace test hosts: a host's link is cut while its processes keep running,
then healed (``tests/partition_scenario.py``, each run in a process of its own: it has its own
Spark standalone cluster, ZooKeeper and broker on hosts of their own, and its own driver).

Slow (about 2-3 minutes each); skipped, saying why, where network namespaces cannot be created
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

SCRIPT = Path(__file__).with_name("partition_scenario.py")


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
