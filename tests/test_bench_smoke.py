"""The benchmark commands stay runnable (their full runs are minutes long: see bench/README.md)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import write_csv, write_machine  # noqa: E402


@pytest.mark.parametrize("script", ["bench/baseline.py", "bench/kill_latency.py"])
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
