"""bench/restart.py without Spark: its arguments, the parts of a restart from its marks, a live rescale's
phases from its report's steps (their phases as the runtime computes them from the participants' times),
the latency windows and the per-second timeline, the savepoint's size, the CSV rows and the plot
(the real runs take minutes: see the module doc)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import handover as hb  # noqa: E402
from bench import restart as rb  # noqa: E402
from replication.control.handover_timelines import step_phases  # noqa: E402

# a rescale step's wall-clock times as its participants report them: instructed 10.0, committed 10.2, the
# upstreams at the switch pulse 10.7, the origins cut 10.75, the cut at the targets 10.8, the release pulse
# 11.0, loaded 11.01, the held records processed 11.03, the driver knows 11.1
INSTRUCTED = 10.0
TIMELINE = {"committed": 10.2, "switched": 10.7, "cut": 10.75, "arrived": 10.8, "release": 11.0, "loaded": 11.01,
            "caught_up": 11.03, "completed": 11.1}


def _step(**times: float | None) -> dict:
    """A step of a ``rescale`` report (what ``live_parts`` reads of it), ``times`` replacing TIMELINE's."""
    timeline = {**TIMELINE, **times}
    return {"handover_id": 3, "vnodes": list(range(86)), "instructed_at": INSTRUCTED, "timeline": timeline,
            "phases": step_phases(INSTRUCTED, timeline)}


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
    assert (parts["restore_s"], parts["first_output_s"]) == pytest.approx((1.2, 0.8))
    assert parts["arm_s"] == pytest.approx(0.3) and parts["start_s"] == pytest.approx(6.0)
    assert sum(parts[k] for k in rb.RESTART_PARTS) == pytest.approx(parts["op_s"])
    # the second run never wrote: no end, so no duration, but the parts it got through
    cut = rb.restart_parts({k: v for k, v in marks.items() if k != "first_output"})
    assert cut["op_s"] == "" and cut["first_output_s"] == ""
    assert cut["drain_s"] == pytest.approx(4.0)
    assert rb.restart_parts({})["drain_s"] == ""


def test_a_live_rescale_is_split_into_the_handover_phases():
    parts = rb.live_parts(1.25, [_step()])
    assert list(parts) == ["op_s", *rb.LIVE_PHASES, "other_s"]
    assert [parts[c] for c in rb.LIVE_PHASES] == pytest.approx([0.2, 0.5, 0.05, 0.05, 0.2, 0.01, 0.02, 0.07])
    # the step spans 1.1 s of the call's 1.25: the rest is outside it; phases and rest add up to the call
    assert parts["op_s"] == 1.25 and parts["other_s"] == pytest.approx(0.15)
    # what the table and the plot show: the phases grouped, up to each milestone of the step
    assert [rb.part(parts, p) for p in rb.LIVE_PARTS] == pytest.approx([0.2, 0.55, 0.25, 0.03, 0.07])
    assert sum(rb.part(parts, p) for p in (*rb.LIVE_PARTS, "other_s")) == pytest.approx(1.25)
    assert rb.part(parts, "op_s") == 1.25 and rb.part(parts, "drain_s") == ""
    # the cut reached the targets after the release pulse: no release wait, loading starts on its arrival
    late = rb.live_parts(1.25, [_step(arrived=11.05, loaded=11.07, caught_up=11.09, completed=11.12)])
    assert (late["transfer_s"], late["release_wait_s"], late["load_s"]) == pytest.approx((0.3, 0.0, 0.02))
    assert rb.part(late, "transfer+release_wait_s") == pytest.approx(0.3)
    assert late["other_s"] == pytest.approx(0.13)
    # two steps: each phase summed
    two = rb.live_parts(2.5, [_step(), _step()])
    assert two["to_switch_s"] == pytest.approx(1.0) and two["other_s"] == pytest.approx(0.3)
    # a step that never completed: what it lacks is unknown, never a wrong rest
    unfinished = rb.live_parts(1.0, [_step(caught_up=None, completed=None)])
    assert unfinished["trigger_s"] == pytest.approx(0.2) and unfinished["load_s"] == pytest.approx(0.01)
    assert unfinished["catch_up_s"] == unfinished["acks_s"] == unfinished["other_s"] == ""
    assert rb.part(unfinished, "load+catch_up_s") == "" and rb.part(unfinished, "trigger_s") == pytest.approx(0.2)
    assert set(rb.live_parts(1.0, []).values()) == {1.0, ""}


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


def test_the_csv_files_and_the_plot_are_written_and_read_back(tmp_path, capsys):
    req = 1000.0
    res = rb.Results()
    for way, stall in (("live", 0.3), ("restart", 12.0)):
        obs = _obs([(req - 3 + i / 10, 0.1) for i in range(30)] + [(req + i / 10, stall) for i in range(40)])
        labels = {"size": "1MB", "way": way}
        parts = (rb.live_parts(1.2, [_step()]) if way == "live" else
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
    assert back.runs[1]["restore_s"] == pytest.approx(1.0) and back.runs[1]["load_s"] == ""
    # the live row's phases to the ms, grouped again from the CSV
    live = back.runs[0]
    assert (live["load_s"], live["catch_up_s"], live["other_s"]) == (0.01, 0.02, 0.1)
    assert live["restore_s"] == "" and rb.part(live, "load+catch_up_s") == pytest.approx(0.03)
    assert rb.problems(back) == ["20MB restart"]
    rb.print_table(back)
    table = capsys.readouterr().out
    assert "to_switch+alignment_s" in table and "transfer+release_wait_s" in table
    header, live_line = table.splitlines()[1:3]
    end = header.index("to_switch+alignment_s") + len("to_switch+alignment_s")  # right-aligned under it
    assert live_line[:end].split()[-1] == "0.55" and rb.shown(live)["other_s"] == 0.1
    (tmp_path / "restart.png").unlink()
    assert rb.main(["--replot", "--out", str(tmp_path)]) == 0  # --replot draws from the CSV files
    assert (tmp_path / "restart.png").stat().st_size > 10_000


def test_the_report_shows_the_live_and_the_restart_parts(tmp_path):
    from bench import report

    res = rb.Results([rb.run_row({"size": "1MB", "way": "live"}, exact="yes", **rb.live_parts(1.25, [_step()])),
                      rb.run_row({"size": "1MB", "way": "restart"}, exact="yes", savepoint_bytes=2_198_838,
                                 **rb.restart_parts({"requested": 0.0, "drained": 1.26, "launched": 2.31,
                                                     "registered": 2.42, "loaded": 2.48, "first_output": 2.99}))])
    rb.write_csvs(tmp_path / "restart", res)
    _, _, live, restart = report.restart_table(tmp_path)
    assert ("| 1MB | live | 1.25 | trigger 0.200, to switch + alignment 0.550, transfer + release wait 0.250, "
            "load + catch-up 0.030, acks 0.070, outside the step 0.150 |") in live
    assert ("| 1MB | restart | 2.99 | drain + savepoint 1.260, launch 1.050, workers 0.110, replicas + state 0.060, "
            "first output 0.510 | - / - | - | 2.2 | yes |") == restart
    # a CSV from before the live phases came from the report: the restore was load_s, the live phases
    # other than the trigger were the driver's events' (not shown)
    old = tmp_path / "old"
    (old / "restart").mkdir(parents=True)
    (old / "restart" / "restart.csv").write_text(
        "size,way,exact,op_s,drain_s,launch_s,workers_s,load_s,first_output_s,trigger_s,alignment_s,"
        "transfer_catchup_s,other_s,savepoint_bytes,p99_during_ms,max_during_ms,p99_before_ms\n"
        "1MB,live,yes,1.01,,,,,,0.4,0.43,0.18,0.0,,303,322,57\n"
        "1MB,restart,yes,2.99,1.26,1.05,0.11,0.06,0.51,,,,,2198838,2263,2281,71\n")
    _, _, live, restart = report.restart_table(old)
    assert "| trigger 0.400, outside the step 0.000 |" in live and "alignment" not in live
    assert "workers 0.110, replicas + state 0.060, first output 0.510 |" in restart
