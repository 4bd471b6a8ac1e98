"""bench/restart.py without Spark: its arguments, the parts of a restart from its marks, a live rescale's
phases, the latency windows and the per-second timeline, the savepoint's size, the CSV rows and the plot
(the real runs take minutes: see the module doc)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import handover as hb  # noqa: E402
from bench import restart as rb  # noqa: E402


def test_the_command_parses_its_arguments():
    proc = subprocess.run([sys.executable, str(REPO / "bench/restart.py"), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout and "--out" in proc.stdout
    args = rb.parse_args([])
    assert args.sizes == [1_000_000, 20_000_000] and args.ways == ["live", "restart"]
    assert args.runs == [(1_000_000, "live"), (1_000_000, "restart"), (20_000_000, "live"),
                         (20_000_000, "restart")]
    quick = rb.parse_args(["--quick"])
    assert quick.sizes == [1_000_000] and quick.before == 5.0 and quick.after == 3.0
    # --quick fills in only what was not given
    assert rb.parse_args(["--quick", "--sizes=2MB", "--after", "1"]).sizes == [2_000_000]
    assert rb.parse_args(["--quick", "--after", "1"]).after == 1.0
    assert rb.parse_args(["--ways", "restart"]).runs == [(1_000_000, "restart"), (20_000_000, "restart")]
    for bad in (["--ways", "reboot"], ["--sizes", "lots"], ["--ways", ""], ["--before", "-1"]):
        with pytest.raises(SystemExit):
            rb.parse_args(bad)


def test_a_restart_is_split_into_its_parts_which_add_up():
    marks = {"requested": 100.0, "armed": 100.3, "drained": 104.0, "launched": 106.5, "registered": 110.0,
             "loaded": 111.2, "first_output": 112.0}
    parts = rb.restart_parts(marks)
    assert parts["op_s"] == pytest.approx(12.0)
    assert (parts["drain_s"], parts["launch_s"], parts["workers_s"]) == pytest.approx((4.0, 2.5, 3.5))
    assert (parts["load_s"], parts["first_output_s"]) == pytest.approx((1.2, 0.8))
    assert parts["arm_s"] == pytest.approx(0.3) and parts["start_s"] == pytest.approx(6.0)
    assert sum(parts[k] for k in rb.RESTART_PARTS) == pytest.approx(parts["op_s"])
    # the second run never wrote: no end, so no duration, but the parts it got through
    cut = rb.restart_parts({k: v for k, v in marks.items() if k != "first_output"})
    assert cut["op_s"] == "" and cut["first_output_s"] == ""
    assert cut["drain_s"] == pytest.approx(4.0)
    assert rb.restart_parts({})["drain_s"] == ""


def test_a_live_rescale_is_split_into_the_handover_phases():
    step = hb.StepPhases(7, 86, start=10.0, committed=10.2, cut=10.9, completed=11.1, entries=100)
    parts = rb.live_parts(1.25, [step])
    phases = (parts["trigger_s"], parts["alignment_s"], parts["transfer_catchup_s"])
    assert phases == pytest.approx((0.2, 0.7, 0.2))
    assert parts["op_s"] == 1.25 and parts["other_s"] == pytest.approx(0.15)
    unknown = hb.StepPhases(7, 86, start=None, committed=None, cut=None, completed=None, entries=0)
    assert rb.live_parts(1.0, [unknown])["other_s"] == ""


def _obs(points: list[tuple[float, float]]) -> list[hb.Obs]:
    return [hb.Obs(p, p + lat, False) for p, lat in points]


def test_latency_windows_the_return_to_normal_and_the_timeline():
    req = 1000.0
    # 0.1 s before the request; 5 s stalled during [req, req + 2); 0.15 s from then on
    obs = _obs([(req - 3 + i / 10, 0.1) for i in range(30)]
               + [(req + i / 10, 5.0 - i / 10) for i in range(20)]
               + [(req + 2 + i / 10, 0.15) for i in range(30)] + [(req + 2.05, 0.9)])
    cols = rb.latency_columns(obs, req, req + 2, (req - 5, req + 5), warm_up_s=0.0)
    assert cols["p99_before_ms"] == pytest.approx(100) and cols["max_during_ms"] == pytest.approx(5000)
    assert cols["max_after_ms"] == pytest.approx(900) and cols["worst_second_p99_ms"] == pytest.approx(5000)
    # second 2 holds the 0.9 s outlier: its p99 is above the threshold (max(2 x 0.1, 0.1 + 0.1) s), so
    # normal from second 3
    assert rb.normal_threshold_s(0.1) == pytest.approx(0.2)
    assert rb.normal_threshold_s(0.045) == pytest.approx(0.145)
    assert cols["normal_from_s"] == 3
    assert rb.normal_from(obs, req, 10.0) == 0 and rb.normal_from(_obs([(req + 1, 9.0)]), req, 1.0) == ""
    # the first normal second counts, whatever comes later
    assert rb.normal_from(_obs([(req, 2.0), (req + 1, 0.1), (req + 2, 2.0)]), req, 0.2) == 1
    rows = rb.timeline_rows(obs, req, {"size": "1MB", "way": "restart"}, before_s=2.0, ended=req + 2)
    assert [r["second"] for r in rows] == [-2, -1, 0, 1, 2, 3, 4]
    assert [r["in_operation"] for r in rows] == ["no", "no", "yes", "yes", "no", "no", "no"]
    assert rows[0]["records"] == 10 and rows[2]["max_ms"] == pytest.approx(5000)
    assert [r["second"] for r in rb.timeline_rows(obs, req, {}, 2.0, req + 2, since=req - 0.5)][:2] == [-1, 0]
    assert rb.window_stats(obs, req + 50, req + 60, "x") == {"p99_x_ms": "", "max_x_ms": ""}


def test_the_savepoint_size_the_first_output_and_the_rows(tmp_path):
    root = tmp_path / "sp"
    (root / "chain").mkdir(parents=True)
    (root / "chain" / "p0-r0.pkl").write_bytes(b"x" * 1000)
    (root / "_meta.json").write_text("{}")
    assert rb.dir_bytes(root) == 1002 and rb.dir_bytes(tmp_path / "none") == 0
    assert rb.first_after([5.0, 9.0, 7.0, 1.0], 6.0) == 7.0 and rb.first_after([1.0], 6.0) is None
    row = rb.run_row({"size": "1MB", "way": "live"}, op_s=1.5, unknown_column=3,
                     **rb.entries_columns(10, 10))
    assert list(row) == list(rb.RUN_COLUMNS) and row["op_s"] == 1.5 and row["drain_s"] == ""
    assert row["entries_match"] == "yes" and "unknown_column" not in row
    assert rb.entries_columns(9, 10)["entries_match"] == "no"
    assert rb.entries_columns(None, 10)["entries"] == ""


def test_the_csv_files_and_the_plot_are_written_and_read_back(tmp_path):
    req = 1000.0
    res = rb.Results()
    for way, stall in (("live", 0.3), ("restart", 12.0)):
        obs = _obs([(req - 3 + i / 10, 0.1) for i in range(30)] + [(req + i / 10, stall) for i in range(40)])
        labels = {"size": "1MB", "way": way}
        parts = (rb.live_parts(1.2, [hb.StepPhases(1, 86, 0.0, 0.2, 0.9, 1.1, 10)]) if way == "live" else
                 rb.restart_parts({"requested": 0.0, "drained": 4.0, "launched": 6.0, "registered": 9.0,
                                   "loaded": 10.0, "first_output": 11.0}))
        res.runs.append(rb.run_row(labels, exact="yes", savepoint_bytes=2_100_000 if way == "restart" else "",
                                   **parts, **rb.latency_columns(obs, req, req + 1, (req - 3, req + 4), 0.0)))
        res.timeline += rb.timeline_rows(obs, req, labels, 3.0, req + 1)
    failed = rb.run_row({"size": "20MB", "way": "restart"}, error="RuntimeError: boom", exact="no")
    res.runs.append(failed)
    rb.write_csvs(tmp_path, res)
    rb.plot(tmp_path, res)
    assert (tmp_path / "restart.png").stat().st_size > 10_000 and (tmp_path / "machine.txt").exists()
    back = rb.load_results(tmp_path)
    assert [r["way"] for r in back.runs] == ["live", "restart", "restart"]
    assert back.runs[1]["op_s"] == pytest.approx(11.0) and back.runs[2]["error"] == "RuntimeError: boom"
    assert rb.problems(back) == ["20MB restart"]
    rb.plot(tmp_path, back)  # --replot draws from the CSV files
