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


@pytest.mark.parametrize("script", ["bench/baseline.py", "bench/kill_latency.py", "bench/liverobin.py"])
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
