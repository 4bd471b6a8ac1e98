"""``replication status JOB``: rendering a status file (hand-made, and one a job master wrote)
and the command's errors.  The run against a real job is in tests/control/test_prometheus.py."""

from __future__ import annotations

import json
import os
import re

import pytest

from ops.cli import main
from replication.status import format_status, status_path, write_status

NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _status_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLICATION_STATUS_DIR", str(tmp_path))


def _replica(task: int, partition: int, replica: int, worker: int) -> dict:
    return {"task": task, "partition": partition, "replica": replica, "worker": worker}


def _metrics(n_in: int, out: int, **extra) -> dict:
    base = {"in": n_in, "out": out, "dedup_dropped": 0, "gaps": 0, "queue": 0, "dead_lettered": 0,
            "p50_ms": 0.0, "p99_ms": 0.0, "role": "", "finished": False, "leader": False, "order_epoch": -1,
            "pulse": 0, "restored_from": -1, "checkpoint_id": -1}
    return {**base, **extra}


def _status() -> dict:
    """A KaZoo job with Rhino checkpoints: src -> merge (two inputs, led) -> sink; worker 2 died,
    merge[1]r0 was restored on worker 0, sink[0]r1 (on worker 2) is still lost."""
    return {
        "job": "orders", "app_id": "app-1", "driver_pid": os.getpid(), "updated": NOW - 0.5, "state": "running",
        "ordering": "kazoo", "replicated": True, "rhino": True, "metrics_url": "http://10.0.0.5:9464/metrics",
        "workers": {"0": {"executor": "1", "address": "a:1", "python_pid": 11, "attempt": 0, "alive": True,
                          "standby": False},
                    "1": {"executor": "2", "address": "a:2", "python_pid": 12, "attempt": 0, "alive": True,
                          "standby": False},
                    "2": {"executor": "3", "address": "a:3", "python_pid": 13, "attempt": 0, "alive": False,
                          "standby": False}},
        "tasks": [{"id": 0, "name": "src", "parallelism": 1, "operators": ["src", "parse"], "inputs": []},
                  {"id": 1, "name": "merge", "parallelism": 2, "operators": ["merge"],
                   "inputs": ["src[hash]"]},
                  {"id": 2, "name": "sink", "parallelism": 1, "operators": ["sink"], "inputs": ["merge[forward]"]}],
        "replicas": {"src[0]r0": _replica(0, 0, 0, 0), "src[0]r1": _replica(0, 0, 1, 1),
                     "merge[0]r0": _replica(1, 0, 0, 1), "merge[0]r1": _replica(1, 0, 1, 0),
                     "merge[1]r0": _replica(1, 1, 0, 0), "merge[1]r1": _replica(1, 1, 1, 1),
                     "sink[0]r0": _replica(2, 0, 0, 0), "sink[0]r1": _replica(2, 0, 1, 2)},
        "lost": ["sink[0]r1"],
        "sinks": {"sink[0]r0": {"epoch": 1, "committed_seq": 990}},
        "metrics": {
            "src[0]r0": _metrics(5000, 5000), "src[0]r1": _metrics(4990, 4990, queue=2),
            "merge[0]r0": _metrics(2500, 2500, leader=True, order_epoch=4, p99_ms=12.5),
            "merge[0]r1": _metrics(2460, 2460, order_epoch=4, queue=7),
            "merge[1]r0": _metrics(300, 300, order_epoch=9, restored_from=17),
            "merge[1]r1": _metrics(2500, 2500, leader=True, order_epoch=9),
            "sink[0]r0": _metrics(5000, 5000, role="writer", p99_ms=40.2),
            "sink[0]r1": _metrics(3000, 3000, role="writer"),
        },
        "checkpoints": {"src[0]": {"group": [2], "completed": 40, "completed_at": NOW - 1.25, "holders": [2]},
                        "merge[0]": {"group": [2], "completed": 41, "completed_at": NOW - 0.5, "holders": [2]},
                        "merge[1]": {"group": [1, 2]}, "sink[0]": {"group": [1], "completed": 8,
                                                                 "completed_at": NOW - 3, "holders": [1]}},
        "recoveries": [{"replica": "merge[1]r0", "worker": 0, "checkpoint_id": 17, "failed_at": NOW - 10,
                        "restored_at": NOW - 9.8, "caught_up_at": NOW - 8.5, "recovery_s": 1.5, "load_s": 0.1}],
        "checkpoints_compared": 120,
        "divergences": ["DIVERGENCE: checkpoint 12 of merge[0]: replica 0 has state digest aa, replica 1 has bb"],
        "events": [{"time": NOW - 10, "text": "worker 2 (executor 3) declared dead: executor 3 left the cluster"},
                   {"time": NOW - 9.9, "text": "sink sink[0]r0 takes over writing (epoch 1)"},
                   {"time": NOW - 8.5, "text": "merge[1]r0 caught up: two live replicas again, 1.50s after the "
                                               "failure"}],
    }


def _row(text: str, partition: str | None, replica: str) -> list[str]:
    """The cells of a replica's table row (split on runs of 2+ spaces)."""
    lines = text.splitlines()
    start = 0
    if partition is not None:
        start = next(i for i, line in enumerate(lines) if line.startswith(partition + " "))
        if replica == "r0":
            return re.split(r"\s{2,}", lines[start].strip())
        start += 1
    line = next(line for line in lines[start:] if re.match(rf"\s+{replica}\s", line))
    return re.split(r"\s{2,}", line.strip())


def test_format_status_from_a_hand_made_status() -> None:
    text = format_status(_status(), now=NOW)
    lines = text.splitlines()
    assert lines[0].startswith("job orders: running, application app-1, driver pid ")
    assert "(alive)" in lines[0] and lines[0].endswith("status updated 0.5 s ago")
    assert lines[1] == "ordering kazoo, 2 replicas per partition, Rhino checkpoints on; workers: 2 alive, 1 dead"
    assert "Prometheus metrics: http://10.0.0.5:9464/metrics" in lines
    assert "  task 0 src x1: src -> parse  (inputs: kafka)" in lines
    assert "  task 2 sink x1: sink  (inputs: merge[forward])" in lines
    header = next(line for line in lines if line.startswith("PARTITION"))
    assert re.split(r"\s{2,}", header) == ["PARTITION", "REPLICA", "WORKER", "EXECUTOR", "ROLE", "STATE", "IN",
                                           "OUT", "LAG", "QUEUE", "P99 MS", "LAST CHECKPOINT", "GROUP"]
    assert "LAG: how far the replica trails" in text and "in input records" in text
    # partition, replica, worker, executor, role, state, in, out, lag, queue, p99, checkpoint, group
    assert _row(text, "src[0]", "r0") == ["src[0]", "r0", "0", "1", "-", "live", "5,000", "5,000", "0", "0", "-",
                                          "40 (1.2 s ago)", "2"]
    assert _row(text, "src[0]", "r1") == ["r1", "1", "2", "-", "live", "4,990", "4,990", "10", "2", "-"]
    assert _row(text, "merge[0]", "r0") == ["merge[0]", "r0", "1", "2", "leader (epoch 4)", "live", "2,500",
                                            "2,500", "0", "0", "12.5", "41 (0.5 s ago)", "2"]
    assert _row(text, "merge[0]", "r1")[3:9] == ["follower", "live", "2,460", "2,460", "40", "7"]
    restored = _row(text, "merge[1]", "r0")
    assert restored[4:9] == ["follower", "live (restored from 17)", "300", "300", "-"]  # counters restarted
    assert restored[-2:] == ["none yet", "1, 2"]
    assert _row(text, "merge[1]", "r1")[3:8] == ["leader (epoch 9)", "live", "2,500", "2,500", "0"]
    assert _row(text, "sink[0]", "r0")[4:6] == ["writer (epoch 1)", "live"]
    lost = _row(text, "sink[0]", "r1")
    assert lost[:6] == ["r1", "2", "3", "standby", "LOST", "3,000"] and lost[7] == "-"
    assert "recoveries (two live replicas again): 1" in lines
    assert ("  merge[1]r0 restored on worker 0 from checkpoint 17, caught up 1.50 s after the failure "
            "(8.5 s ago)") in lines
    assert "divergences: 1 (120 checkpoints compared)" in lines
    assert any(line.startswith("  DIVERGENCE: checkpoint 12 of merge[0]") for line in lines)
    events = lines[lines.index("recent events (failovers, restores, failures; newest last):") + 1:]
    assert events[0] == "    10.0 s ago  worker 2 (executor 3) declared dead: executor 3 left the cluster"
    assert len(events) == 3 and events[2].endswith("two live replicas again, 1.50s after the failure")


def test_handovers_routing_and_drains_are_shown() -> None:
    status = {**_status(), "routing": {"merge": {"epoch": 3, "active": 2, "vnodes": [100, 156, 0]}},
              "handovers": [{"id": 4, "task": "merge", "state": "committed",
                             "what": "8 vnode(s) from [0] to [1]"}],
              "pulse_window": [2, True, False], "drained": [2]}
    lines = format_status(status, now=NOW).splitlines()
    assert "  vnodes of merge (epoch 3): p0 100, p1 156, p2 0  (1 spare partition(s) for rescale)" in lines
    assert "  handover 4 of merge: 8 vnode(s) from [0] to [1], committed" in lines
    assert any(line.startswith("pulse window 2 open") for line in lines)
    assert "drained workers (no replica is restored there): 2" in lines
    quiet = format_status({**status, "handovers": [], "pulse_window": [2, False, True], "drained": []}, now=NOW)
    assert "handovers in progress" not in quiet and "pulse window" not in quiet and "drained" not in quiet


def test_lag_in_pulses_for_liverobin() -> None:
    status = _status()
    status["ordering"] = "liverobin"
    for name, pulse in (("merge[1]r0", 95), ("merge[1]r1", 100), ("merge[0]r0", 7), ("merge[0]r1", 7)):
        status["metrics"][name]["pulse"] = pulse
    text = format_status(status, now=NOW)
    # pulses are restored with the checkpoint, so a restored replica's lag is comparable
    assert _row(text, "merge[1]", "r0")[8] == "5" and _row(text, "merge[1]", "r1")[7] == "0"
    assert _row(text, "merge[0]", "r1")[7] == "0"  # same pulse, although fewer records


def test_old_or_sparse_status_files_render() -> None:
    """A status file from before these fields (or of a job without Rhino) still renders."""
    old = {k: v for k, v in _status().items() if k in ("job", "app_id", "driver_pid", "updated", "state",
                                                      "workers", "replicas", "sinks", "events")}
    old["driver_pid"] = 2 ** 22 + 12345  # no such process
    text = format_status(old, now=NOW)
    assert "driver pid 4206649 (gone: this status is stale)" in text.splitlines()[0]
    assert "LAST CHECKPOINT" not in text and "not reported" in text
    assert "Rhino checkpoints off" in text
    empty = format_status({"job": "x", "state": "running"}, now=NOW)
    assert "(no replicas yet)" in empty and "recent events (failovers, restores, failures; newest last): none" in empty


def test_status_command(capsys) -> None:
    write_status("orders", _status())
    assert main(["status", "orders"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job orders: running") and "leader (epoch 4)" in out
    assert main(["status", "orders", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(status_path("orders").read_text())


def test_status_command_errors(capsys) -> None:
    assert main(["status", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no running job named 'nope'") and "Traceback" not in err
    write_status("other", {"state": "running"})
    assert main(["status", "nope"]) == 2
    assert "jobs with a status file: other" in capsys.readouterr().err
    status_path("broken").write_text("{not json")
    assert main(["status", "broken"]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    write_status("weird", {"state": "running", "replicas": {"x[0]r0": {"task": "zero"}}})
    assert main(["status", "weird"]) == 2
    assert "error: malformed status file for job 'weird'" in capsys.readouterr().err
    assert main(["status", "../etc"]) == 2
    assert "invalid job name" in capsys.readouterr().err


def test_status_written_by_a_job_master_renders(capsys) -> None:
    """The fields _write_status publishes are the ones format_status reads (no Spark)."""
    from replication.control.liveness import WorkerInfo
    from replication.metrics import InstanceMetrics
    from tests.control.test_prometheus import _master

    master = _master()
    for w in range(3):
        master.workers[w] = WorkerInfo(w, 0, str(w + 1), f"127.0.0.1:{5000 + w}", python_pid=100 + w)
    chain = next(t.id for t in master.plan.tasks if t.name == "chain")
    master.metrics["chain[0]r0"] = InstanceMetrics(records_in=50, records_out=50, pulse=12)
    master.metrics["chain[0]r1"] = InstanceMetrics(records_in=40, records_out=40, pulse=9, queue_batches=3)
    master.rhino.checkpoint_completed((chain, 0), 3, {}, now=NOW - 2, holders=list(master.rhino.groups[(chain, 0)]))
    master.metrics_url = "http://h:1/metrics"
    with master.locked():
        master.event("worker 9 said hello")
        master.write_status()
    assert main(["status", "prom"]) == 0
    out = capsys.readouterr().out
    assert "ordering liverobin, 2 replicas per partition, Rhino checkpoints on" in out
    assert "Prometheus metrics: http://h:1/metrics" in out and "worker 9 said hello" in out
    assert re.search(r"^  task \d+ chain x2: chain  \(inputs: union-2\[hash\]\)$", out, re.M), out
    row0, row1 = _row(out, "chain[0]", "r0"), _row(out, "chain[0]", "r1")
    assert row0[5:9] == ["live", "50", "50", "0"] and re.fullmatch(r"3 \(\d+\.\d s ago\)", row0[11])
    assert row1[4:8] == ["live", "40", "40", "3"] and row1[8] == "3"  # lag 3 pulses, queue 3


def test_the_checkpoint_directory_and_its_last_cut_are_shown() -> None:
    status = {**_status(), "durable": {"uri": "s3://bucket/cp", "cuts_written": 12, "failures": 1,
                                       "last_cut": 40, "last_cut_at": NOW - 2.0}}
    assert ("durable checkpoints in s3://bucket/cp: cut 40 written 2.0 s ago, 12 this run, 1 failed writes"
            in format_status(status, now=NOW).splitlines())
    none_yet = {**status, "durable": {"uri": "/cp", "cuts_written": 0, "failures": 0, "last_cut": None}}
    assert "durable checkpoints in /cp: no cut written yet, 0 this run" in format_status(none_yet, now=NOW)
    held = {**status, "durable": {**status["durable"], "failures": 0, "held_by_handover_since": NOW - 7.0}}
    assert ("durable checkpoints in s3://bucket/cp: cut 40 written 2.0 s ago, 12 this run; no newer cut until a "
            "handover's participants checkpoint after it (waiting 7.0 s)") in format_status(held, now=NOW).splitlines()
    assert "durable checkpoints" not in format_status(_status(), now=NOW)
