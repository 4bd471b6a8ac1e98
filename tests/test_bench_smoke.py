"""The benchmark commands stay runnable (their full runs are minutes long: see bench/README.md)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import format_row, write_csv, write_machine  # noqa: E402


@pytest.mark.parametrize("script", ["bench/baseline.py", "bench/kill_latency.py", "bench/ordering.py"])
def test_benchmark_command_parses_its_arguments(script):
    proc = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--out" in proc.stdout


def test_csv_and_machine_record(tmp_path):
    write_csv(tmp_path / "x.csv", [{"rate": 500.0, "p99_ms": 12.3456, "exact": True}, {"rate": 1000.0,
                                                                                        "p99_ms": 1.0, "exact": False}])
    rows = list(csv.DictReader((tmp_path / "x.csv").open()))
    assert rows == [{"rate": "500.0", "p99_ms": "12.35", "exact": "True"},
                    {"rate": "1000.0", "p99_ms": "1.0", "exact": "False"}]
    write_machine(tmp_path)
    text = (tmp_path / "machine.txt").read_text()
    assert "cores" in text and "command:" in text


def test_format_row_and_per_second_grouping():
    from replication.workload import Latencies, Sample

    assert format_row({"rate": 500.0, "exact": True, "events": "x"}, skip=("events",)) == "rate=500.0, exact=True"
    rep = Latencies([Sample(0, 10.0, 10.010), Sample(0, 10.5, 10.530), Sample(0, 12.2, 12.205)])
    assert rep.by_second() == {0: [pytest.approx(0.010), pytest.approx(0.030)], 2: [pytest.approx(0.005)]}
    assert [(s, n) for s, n, _ in rep.per_second(origin=11.0)] == [(-1, 2), (1, 1)]
    assert rep.per_second()[0][2] == pytest.approx(0.030)
    # by event time (produced), for the kill runs: a record read again after a rollback keeps its second
    rep = Latencies([Sample(9.5, 10.0, 10.010), Sample(10.2, 12.0, 12.5), Sample(11.9, 11.95, 12.0)])
    assert rep.by_event_second(origin=10.0) == {-1: [pytest.approx(0.51)], 0: [pytest.approx(2.3)],
                                                1: [pytest.approx(0.1)]}


def test_ordering_configurations_and_kazoo_failover_columns(tmp_path):
    """The ordering benchmark's flags, its KaZoo failover arithmetic, and its tables and plots from
    made-up results (the real runs take minutes; a kazoo latency run is below)."""
    from bench import ordering
    from replication.metrics import InstanceMetrics

    args = ordering.parse_args(["--modes", "kazoo,off", "--periods", "5,50", "--kill-modes", "kazoo-leader"])
    assert [c.label for c in ordering.latency_configs(args.modes, args.periods)] == ["off", "kazoo"]
    assert [c.label for c in ordering.latency_configs(list(ordering.MODES), args.periods)] == [
        "off", "passive", "unordered", "liverobin 5ms", "liverobin 50ms", "kazoo"]
    assert [(c.label, c.victim) for c in ordering.kill_configs(list(ordering.KILL_MODES), 10)] == [
        ("off", "chain[0]r0"), ("passive", "chain[0]r0"), ("unordered", "chain[0]r0"),
        ("liverobin 10ms", "chain[0]r0"), ("kazoo leader kill", "leader"), ("kazoo follower kill", "follower")]
    # passive: replication off, LiveRobin pulses as checkpoint barriers, Rhino about every second
    passive = ordering.kill_configs(["passive"], 10)[0]
    stack = type("Stack", (), {"bootstrap_servers": "b:9092", "zookeeper_connect": "z:2181"})()
    assert not passive.replicated and passive.conf(stack) == {
        "spark.replication.kafka.bootstrapServers": "b:9092", "spark.replication.mode": "liverobin",
        "spark.replication.rhino.enabled": "true", "spark.replication.rhino.checkpointEvery": "100",
        "spark.replication.liverobin.heartbeatPeriod": "10ms"}
    with pytest.raises(SystemExit):
        ordering.parse_args(["--modes", "kazo"])
    assert ordering.other_replica("chain[0]r1") == "chain[0]r0"

    kill = 1000.0
    per = {"chain[0]r0": InstanceMetrics(leader=True, elected_at=990.0, first_order_at=990.1),  # died leading
           "chain[0]r1": InstanceMetrics(leader=True, elected_at=1000.2, first_order_at=1000.35),
           "chain[1]r0": InstanceMetrics(leader=True, elected_at=990.0, first_order_at=990.1),  # not affected
           "chain[1]r1": InstanceMetrics(),
           "union-2[0]r0": InstanceMetrics(),
           "union-2[0]r1": InstanceMetrics(leader=True, elected_at=1000.3, first_order_at=0.0)}  # never ordered
    fo = ordering.failovers(per, ["chain[0]", "chain[1]", "union-2[0]"], {"chain[0]r0", "union-2[0]r0"}, kill)
    assert fo == {"chain[0]": (pytest.approx(0.2), pytest.approx(0.35)), "union-2[0]": (pytest.approx(0.3), None)}

    from replication.examples.ordered import ChainReport
    from replication.loadgen import LoadResult
    from replication.workload import Sample

    # kill runs are binned by event time (produced), latency runs by ingest time: both set here
    samples = [Sample(kill + t / 10, kill + t / 10, kill + t / 10 + 0.02 + (0.3 if 0 <= t < 10 else 0))
               for t in range(-60, 60)]
    runs = {label: ordering.OrderedRun(ordering.Config(label, mode, victim=victim), 1, LoadResult(produced=120),
                                       samples, ChainReport(records=120, keys=30), fault_at=kill,
                                       victim="chain[0]r1", failovers=fo if mode == "kazoo" else {},
                                       led_at_kill=["chain[0]", "union-2[0]"] if mode == "kazoo" else [])
            for label, mode, victim in (("unordered", "unordered", "chain[0]r0"),
                                        ("kazoo leader kill", "kazoo", "leader"))}
    res = ordering.Results()
    for r in runs.values():
        res.rows.append(ordering.latency_row(r, 2.0))
        timeline, row = ordering.kill_rows(r, 2.0)
        res.timeline += timeline
        res.summary.append(row)
    kz, un = res.summary[1], res.summary[0]
    assert kz["chain0_elected_ms"] == pytest.approx(200) and kz["chain0_first_order_ms"] == pytest.approx(350)
    assert kz["failover_max_ms"] == pytest.approx(350) and "union-2[0] 300/never ms" in kz["failed_over"]
    assert kz["led_at_kill"] == "chain[0] union-2[0]"
    assert un["chain0_first_order_ms"] == un["failover_max_ms"] == un["failed_over"] == un["led_at_kill"] == ""
    assert kz["worst_p99_after_ms"] == pytest.approx(320) and kz["stall_seconds"] == 1
    ordering.write_results(tmp_path, res, 400.0)
    ordering.print_tables(res)
    for name in ("latency.csv", "latency.png", "kill_timeline.csv", "kill_summary.csv", "kill_timeline.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = list(csv.DictReader((tmp_path / "kill_summary.csv").open()))
    assert summary[1]["chain0_first_order_ms"] == "350.0" and summary[0]["chain0_first_order_ms"] == ""


@pytest.mark.integration
def test_ordering_benchmark_runs_kazoo(stack, spark, tmp_path):
    """A short KaZoo latency run at L=1 through the benchmark's own code: exact output, plausible latency
    (a kill run is too slow for the default suite: see bench/README.md for the full benchmark)."""
    from bench import ordering
    from replication.progress import StatusLine

    args = ordering.parse_args(["--modes", "kazoo", "--pipelines", "1", "--rate", "200", "--duration", "4",
                                "--warm-up", "1", "--kill-duration", "0", "--out", str(tmp_path)])
    res = ordering.run_benchmark(stack, spark, args, StatusLine())
    assert [(r["config"], r["pipeline"]) for r in res.rows] == [("kazoo", 1)] and not res.summary
    row = res.rows[0]
    assert row["exact"] == "yes", row["outcome"]
    assert row["records"] == 800 and 0 < row["p50_ms"] < 5000
    ordering.write_results(tmp_path, res, args.rate)
    assert (tmp_path / "latency.png").stat().st_size > 0
