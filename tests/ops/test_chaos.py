"""Status files and the chaos tooling, on fake executor process trees (no Spark needed).

A fake executor is a Python process whose command line carries
``org.apache.spark.executor.CoarseGrainedExecutorBackend --executor-id 7
--app-id <unique>``; like a real one it has a Python "daemon" child with a
Python "worker" grandchild (the pid a status file names), plus a non-Python
child (``sleep``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ops import chaos, chaos_cli, cli
from ops.chaos import ChaosError, ChaosRefused, ExecutorTarget, UnknownReplica
from replication.status import (
    list_status_jobs,
    read_status,
    remove_status,
    status_path,
    write_status,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")

BACKEND = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_WORKER = "import time; time.sleep(120)"
_DAEMON = (
    "import subprocess, sys, time\n"
    f"w = subprocess.Popen([sys.executable, '-c', {_WORKER!r}])\n"
    "print('worker', w.pid, flush=True)\n"
    "time.sleep(120)\n"
)
_JVM = (
    "import subprocess, sys, time\n"
    f"d = subprocess.Popen([sys.executable, '-c', {_DAEMON!r}])\n"
    "print('daemon', d.pid, flush=True)\n"
    "s = subprocess.Popen(['sleep', '120'])\n"
    "print('sleep', s.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def proc_state(pid: int) -> str | None:
    """One-letter state of ``pid`` (None once reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def wait_state(pid: int, states: str | tuple[str | None, ...], timeout: float = 5.0) -> str | None:
    """Wait until ``pid`` is in one of ``states``; return the last state seen."""
    wanted = (states,) if isinstance(states, str) else states
    deadline = time.monotonic() + timeout
    state = proc_state(pid)
    while state not in wanted and time.monotonic() < deadline:
        time.sleep(0.02)
        state = proc_state(pid)
    return state


@dataclass
class FakeExecutor:
    app_id: str
    executor: str
    proc: subprocess.Popen[str]
    daemon: int
    worker: int
    sleep: int

    @property
    def jvm(self) -> int:
        return self.proc.pid

    def status(self, job: str = "chaos-test", **over: Any) -> dict[str, Any]:
        """A status dict with one live worker (0) on this executor and one not registered (1)."""
        st: dict[str, Any] = {
            "job": job, "app_id": self.app_id, "driver_pid": os.getpid(), "updated": time.time(),
            "state": "running",
            "workers": {"0": {"executor": self.executor, "address": "127.0.0.1:4567",
                              "python_pid": self.worker, "attempt": 0, "alive": True}},
            "replicas": {
                "rule[0]r0": {"task": 2, "partition": 0, "replica": 0, "worker": 0},
                "rule[0]r1": {"task": 3, "partition": 0, "replica": 1, "worker": 1},
                "rule[10]r0": {"task": 4, "partition": 10, "replica": 0, "worker": 0},
            },
        }
        st.update(over)
        return st


def _spawn_fake_executor(executor: str = "7") -> tuple[FakeExecutor, list[int]]:
    app_id = f"app-test-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _JVM, BACKEND, "--executor-id", executor, "--hostname", "127.0.0.1",
         "--app-id", app_id],
        stdout=subprocess.PIPE, text=True,
    )
    fds = [os.pidfd_open(proc.pid)]
    pids: dict[str, int] = {}
    deadline = time.monotonic() + 20
    assert proc.stdout is not None
    while len(pids) < 3:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"fake executor did not start its children: {pids}"
        tag, pid = proc.stdout.readline().split()
        pids[tag] = int(pid)
        with contextlib.suppress(OSError):
            fds.append(os.pidfd_open(int(pid)))
    fake = FakeExecutor(app_id, executor, proc, pids["daemon"], pids["worker"], pids["sleep"])
    return fake, fds


@pytest.fixture
def fake() -> Iterator[FakeExecutor]:
    fx, fds = _spawn_fake_executor()
    try:
        with open(f"/proc/{fx.jvm}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        assert BACKEND in argv and argv[argv.index("--app-id") + 1] == fx.app_id
        assert argv[argv.index("--executor-id") + 1] == "7"
        yield fx
    finally:  # SIGKILL the whole tree through pidfds taken at spawn (no pid-reuse risk)
        for fd in fds:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        fx.proc.wait(timeout=10)
        if fx.proc.stdout:
            fx.proc.stdout.close()


@pytest.fixture
def status_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "jobs"
    monkeypatch.setenv("REPLICATION_STATUS_DIR", str(d))
    return d


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# --------------------------------------------------------------------------- status files


def test_status_path_env_and_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REPLICATION_STATUS_DIR", str(tmp_path))
    assert status_path("fraud-monitor") == tmp_path / "fraud-monitor.json"
    monkeypatch.delenv("REPLICATION_STATUS_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # recompute gettempdir() from TMPDIR
    (tmp_path / "t").mkdir()
    assert status_path("j") == tmp_path / "t" / "replication-jobs" / "j.json"
    for bad in ("", "..", "a/b", "x\0y"):
        with pytest.raises(ValueError):
            status_path(bad)


def test_write_read_remove(status_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no running job named 'j' \(no status file at .*j\.json\)"):
        read_status("j")
    before = time.time()
    path = write_status("j", {"app_id": "app-1", "state": "running", "workers": {}, "replicas": {}})
    assert path == status_dir / "j.json"
    st = read_status("j")
    assert st["job"] == "j" and st["app_id"] == "app-1" and before <= st["updated"] <= time.time()
    write_status("j", {**st, "state": "finished", "updated": 5.0})
    assert read_status("j")["state"] == "finished" and read_status("j")["updated"] == 5.0
    assert list_status_jobs() == ["j"]
    assert sorted(p.name for p in status_dir.iterdir()) == ["j.json"]  # no temp files left
    assert remove_status("j") is True and remove_status("j") is False
    assert list_status_jobs() == []


def test_read_status_rejects_garbage(status_dir: Path) -> None:
    status_dir.mkdir()
    (status_dir / "j.json").write_text("{half")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_status("j")
    (status_dir / "j.json").write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        read_status("j")


def test_write_status_is_atomic(status_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payloads = [{"state": "running", "blob": c * 200_000} for c in "ab"]
    write_status("j", payloads[0])
    stop = threading.Event()
    seen: list[str] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(read_status("j")["blob"][0])
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(60):
            write_status("j", payloads[i % 2])
    finally:
        stop.set()
        t.join()
    assert not errors and seen and set(seen) <= {"a", "b"}

    # a failed write leaves the previous file intact and no temp file behind
    def broken_replace(*_: object) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", broken_replace)
        with pytest.raises(OSError, match="disk full"):
            write_status("j", {"state": "failed"})
    with pytest.raises(TypeError):
        write_status("j", {"state": object()})
    assert read_status("j")["blob"][0] in "ab"
    assert sorted(p.name for p in status_dir.iterdir()) == ["j.json"]


# --------------------------------------------------------------------------- locate


def test_locate_finds_jvm_and_python_worker(fake: FakeExecutor) -> None:
    st = fake.status()
    rp = chaos.locate("rule[0]r0", status=st)
    assert (rp.job, rp.replica, rp.worker, rp.executor) == ("chaos-test", "rule[0]r0", 0, "7")
    assert rp.jvm_pid == fake.jvm and rp.python_pid == fake.worker
    assert rp.app_id == fake.app_id and rp.driver_pid == os.getpid()
    assert chaos.executor_jvms(fake.app_id) == {"7": [fake.jvm]}
    assert set(chaos.descendants(fake.jvm)) >= {fake.daemon, fake.worker, fake.sleep}
    target = chaos.locate_executor("7", status=st)
    assert target.jvm_pid == fake.jvm and target.executor == "7"


def test_locate_from_status_file(fake: FakeExecutor, status_dir: Path) -> None:
    write_status("chaos-test", fake.status())
    rp = chaos.locate("rule[10]r0", job="chaos-test")
    assert rp.jvm_pid == fake.jvm and rp.python_pid == fake.worker and rp.status_snapshot is None
    with pytest.raises(FileNotFoundError, match="no running job named 'other'"):
        chaos.locate("rule[0]r0", job="other")


def test_list_replicas_from_the_status_file(fake: FakeExecutor, status_dir: Path) -> None:
    write_status("chaos-test", {**fake.status(), "metrics": {"rule[10]r0": {"in": 5}}})
    rows = {row.replica: row for row in chaos.list_replicas("chaos-test")}
    assert rows["rule[10]r0"].alive and rows["rule[10]r0"].metrics == {"in": 5}


def test_locate_errors(fake: FakeExecutor) -> None:
    with pytest.raises(UnknownReplica, match=r"no replica 'nope'; known replicas: rule\[0\]r0, rule\[0\]r1, "
                                             r"rule\[10\]r0"):
        chaos.locate("nope", status=fake.status())
    with pytest.raises(ChaosError, match="worker 1, which has not registered"):
        chaos.locate("rule[0]r1", status=fake.status())
    st = fake.status()
    st["workers"]["0"]["alive"] = False
    with pytest.raises(ChaosError, match="declared dead"):
        chaos.locate("rule[0]r0", status=st)
    st = fake.status()
    st["workers"]["0"]["executor"] = "8"
    with pytest.raises(ChaosError, match="no executor JVM with --executor-id 8"):
        chaos.locate("rule[0]r0", status=st)
    st = fake.status()
    st["workers"]["0"]["python_pid"] = dead_pid()
    with pytest.raises(ChaosError, match="is not alive"):
        chaos.locate("rule[0]r0", status=st)
    with pytest.raises(ValueError, match="not 'other'"):
        chaos.locate("rule[0]r0", job="other", status=fake.status())


# --------------------------------------------------------------------------- actions


def test_pause_and_resume_stop_the_whole_executor(fake: FakeExecutor) -> None:
    rp = chaos.locate("rule[0]r0", status=fake.status())
    tree = [fake.jvm, fake.daemon, fake.worker, fake.sleep]
    paused = chaos.pause_executor(rp)
    assert paused[0] == fake.jvm and set(paused) == set(tree)
    for pid in tree:
        assert wait_state(pid, "T") == "T", pid
    assert chaos.paused_executors(fake.app_id) == {"7": fake.jvm}
    rows = chaos.list_replicas(status=fake.status())
    assert rows[0].note == "paused"
    resumed = chaos.resume_executor(rp)
    assert set(resumed) == set(tree)
    for pid in tree:
        assert wait_state(pid, "S") == "S", pid
    assert chaos.paused_executors(fake.app_id) == {}


def test_kill_executor(fake: FakeExecutor) -> None:
    rp = chaos.locate("rule[0]r0", status=fake.status())
    assert chaos.kill_executor(rp) == [fake.jvm]
    assert fake.proc.wait(timeout=5) == -signal.SIGKILL
    assert proc_state(fake.worker) in ("S", "R")  # only the JVM was signalled
    with pytest.raises(ChaosError, match="no executor JVM"):
        chaos.locate("rule[0]r0", status=fake.status())


def test_kill_executor_after_pause_kills_paused_children(fake: FakeExecutor) -> None:
    rp = chaos.locate("rule[0]r0", status=fake.status())
    chaos.pause_executor(rp)
    wait_state(fake.worker, "T")
    killed = chaos.kill_executor(rp)
    assert set(killed) == {fake.jvm, fake.daemon, fake.worker, fake.sleep}
    assert fake.proc.wait(timeout=5) == -signal.SIGKILL
    for pid in (fake.daemon, fake.worker, fake.sleep):
        assert wait_state(pid, ("Z", None)) in ("Z", None), pid


def test_kill_python_kills_only_the_worker(fake: FakeExecutor) -> None:
    rp = chaos.locate("rule[0]r0", status=fake.status())
    assert chaos.kill_python(rp) == [fake.worker]
    assert wait_state(fake.worker, ("Z", None)) in ("Z", None)
    assert proc_state(fake.jvm) in ("S", "R") and proc_state(fake.daemon) in ("S", "R")
    with pytest.raises(ChaosError, match="is not alive"):
        chaos.locate("rule[0]r0", status=fake.status())
    with pytest.raises(ChaosError, match="has exited"):
        chaos.kill_python(rp)


# --------------------------------------------------------------------------- refusals


def assert_untouched(*pids: int) -> None:
    time.sleep(0.05)
    for pid in pids:
        assert proc_state(pid) in ("S", "R"), pid


def test_refuses_other_application(fake: FakeExecutor) -> None:
    with pytest.raises(ChaosError, match="no executor JVM"):  # not found under the wrong app id
        chaos.locate("rule[0]r0", status=fake.status(app_id="app-other"))
    st = fake.status(app_id="app-other")
    target = ExecutorTarget(job="chaos-test", app_id="app-other", driver_pid=os.getpid(), executor="7",
                            jvm_pid=fake.jvm, status_snapshot=st)
    for action in (chaos.kill_executor, chaos.pause_executor, chaos.resume_executor):
        with pytest.raises(ChaosRefused, match="not 'app-other'"):
            action(target)
    other_executor = replace(target, app_id=fake.app_id, executor="8",
                             status_snapshot=fake.status())
    with pytest.raises(ChaosRefused, match="is executor '7', not '8'"):
        chaos.kill_executor(other_executor)
    assert_untouched(fake.jvm, fake.worker)


def test_refuses_pids_that_are_not_executors(fake: FakeExecutor, sleeper: subprocess.Popen[bytes]) -> None:
    st = fake.status()
    not_jvm = ExecutorTarget(job="chaos-test", app_id=fake.app_id, driver_pid=os.getpid(), executor="7",
                             jvm_pid=sleeper.pid, status_snapshot=st)
    for action in (chaos.kill_executor, chaos.pause_executor):
        with pytest.raises(ChaosRefused, match="is not a Spark CoarseGrainedExecutorBackend"):
            action(not_jvm)
    with pytest.raises(ChaosRefused, match="is not a Spark"):  # SIGCONT is harmless, still refused
        chaos.resume_executor(replace(not_jvm, jvm_pid=os.getpid()))
    assert_untouched(sleeper.pid)

    rp = chaos.locate("rule[0]r0", status=st)
    with pytest.raises(ChaosRefused, match="is not a Spark"):
        chaos.kill_python(replace(rp, jvm_pid=sleeper.pid))
    # a Python process outside the executor, and a non-Python child of it
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(ChaosRefused, match="does not descend from executor 7"):
            chaos.kill_python(replace(rp, python_pid=outsider.pid))
        with pytest.raises(ChaosRefused, match="does not descend"):
            chaos.kill_python(replace(rp, python_pid=fake.jvm))
        with pytest.raises(ChaosRefused, match="not a Python process"):
            chaos.kill_python(replace(rp, python_pid=fake.sleep))
        st_out = fake.status()
        st_out["workers"]["0"]["python_pid"] = outsider.pid
        with pytest.raises(ChaosRefused, match="does not descend"):
            chaos.locate("rule[0]r0", status=st_out)
        assert_untouched(outsider.pid, fake.sleep, fake.jvm, fake.worker)
    finally:
        outsider.kill()
        outsider.wait()


def test_refuses_a_job_that_is_not_running(fake: FakeExecutor, status_dir: Path) -> None:
    for state in ("finished", "stopped", "failed"):
        with pytest.raises(ChaosRefused, match=f"is '{state}', not 'running'"):
            chaos.locate("rule[0]r0", status=fake.status(state=state))
    # re-checked right before signalling: from the snapshot ...
    st = fake.status()
    rp = chaos.locate("rule[0]r0", status=st)
    st["state"] = "finished"
    for action in (chaos.kill_executor, chaos.pause_executor, chaos.kill_python):
        with pytest.raises(ChaosRefused, match="is 'finished'"):
            action(rp)
    # ... or from the status file, which may have changed or gone
    write_status("chaos-test", fake.status())
    rp = chaos.locate("rule[0]r0", job="chaos-test")
    write_status("chaos-test", fake.status(state="stopped"))
    with pytest.raises(ChaosRefused, match="is 'stopped'"):
        chaos.kill_executor(rp)
    write_status("chaos-test", fake.status(app_id="app-next-run"))
    with pytest.raises(ChaosRefused, match="now runs as application 'app-next-run'"):
        chaos.kill_executor(rp)
    remove_status("chaos-test")
    with pytest.raises(ChaosRefused, match="no running job named"):
        chaos.pause_executor(rp)
    assert_untouched(fake.jvm, fake.worker)


def test_refuses_a_dead_driver(fake: FakeExecutor) -> None:
    gone = dead_pid()
    with pytest.raises(ChaosRefused, match=f"driver pid {gone} of job 'chaos-test' is not alive"):
        chaos.locate("rule[0]r0", status=fake.status(driver_pid=gone))
    st = fake.status()
    rp = chaos.locate("rule[0]r0", status=st)
    st["driver_pid"] = gone
    for action in (chaos.kill_executor, chaos.pause_executor, chaos.kill_python):
        with pytest.raises(ChaosRefused, match="is not alive"):
            action(rp)
    assert_untouched(fake.jvm, fake.worker)


# --------------------------------------------------------------------------- listing and CLI


def test_list_replicas(fake: FakeExecutor) -> None:
    st = fake.status()
    st["workers"]["2"] = {"executor": "9", "address": "127.0.0.1:2", "python_pid": dead_pid(), "attempt": 1,
                          "alive": False}
    st["replicas"]["rule[1]r0"] = {"task": 5, "partition": 1, "replica": 0, "worker": 2}
    st["state"] = "finished"  # display works in any state
    rows = chaos.list_replicas(status=st)
    assert [r.replica for r in rows] == ["rule[0]r0", "rule[0]r1", "rule[1]r0", "rule[10]r0"]
    r0 = rows[0]
    assert (r0.worker, r0.executor, r0.jvm_pid, r0.python_pid, r0.alive, r0.note) == (
        0, "7", fake.jvm, fake.worker, True, "")
    assert (r0.task, r0.partition, r0.index, r0.attempt, r0.address) == (2, 0, 0, 0, "127.0.0.1:4567")
    assert (rows[1].alive, rows[1].note, rows[1].executor) == (False, "not registered", None)
    assert (rows[2].alive, rows[2].note, rows[2].jvm_pid) == (False, "declared dead", None)
    table = chaos_cli.format_table(rows).splitlines()
    assert table[0].split()[:4] == ["REPLICA", "WORKER", "ATTEMPT", "EXECUTOR"]
    # no metrics reported yet: dashes
    assert table[1].split() == ["rule[0]r0", "0", "0", "7", str(fake.jvm), str(fake.worker),
                                "-", "-", "-", "-", "-", "-", "-", "yes"]
    st["metrics"] = {"rule[0]r0": {"in": 120, "out": 118, "dedup_dropped": 120, "gaps": 0, "queue": 3,
                                   "p99_ms": 12.5, "role": "writer"}}
    row = chaos_cli.format_table(chaos.list_replicas(status=st)).splitlines()[1].split()
    assert row[6:] == ["120", "118", "120", "0", "3", "12.5", "writer", "yes"]
    assert "no (not registered)" in table[2]


def test_cli_replicas_and_kill(fake: FakeExecutor, status_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_status("chaos-test", fake.status())
    assert chaos_cli.main(["replicas", "chaos-test"]) == 0
    out = capsys.readouterr().out
    assert f"application {fake.app_id}" in out and "running" in out
    assert any(line.startswith("rule[0]r0") and str(fake.jvm) in line for line in out.splitlines())

    assert cli.main(["replicas", "chaos-test", "--json"]) == 0  # wired into `replication`
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["replica"] == "rule[0]r0" and rows[0]["python_pid"] == fake.worker

    assert chaos_cli.main(["kill", "chaos-test", "rule[0]r0", "--action", "pause-executor"]) == 0
    assert "SIGSTOP" in capsys.readouterr().out
    assert wait_state(fake.worker, "T") == "T"
    assert chaos_cli.main(["replicas", "chaos-test"]) == 0
    assert "paused executors: 7" in capsys.readouterr().out
    assert cli.main(["kill", "chaos-test", "--executor", "7", "--action", "resume-executor"]) == 0
    assert "SIGCONT" in capsys.readouterr().out
    assert wait_state(fake.worker, "S") == "S"

    assert chaos_cli.main(["kill", "chaos-test", "rule[0]r0", "--action", "resume-executor"]) == 2
    assert "error: executor 7 is not paused" in capsys.readouterr().err

    assert chaos_cli.main(["kill", "chaos-test", "rule[0]r0", "--action", "kill-python"]) == 0
    assert wait_state(fake.worker, ("Z", None)) in ("Z", None)
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["replicas", "no-such-job"], "error: no running job named 'no-such-job'"),
    (["kill", "chaos-test", "nope", "--action", "kill-executor"], "error: job 'chaos-test' has no replica 'nope'"),
    (["kill", "chaos-test", "--action", "kill-executor"], "error: name a REPLICA or pass --executor"),
    (["kill", "chaos-test", "--executor", "7", "--action", "kill-python"], "error: kill-python needs a REPLICA"),
    (["kill", "chaos-test", "rule[0]r0", "--action", "explode"], "invalid choice"),
])
def test_cli_errors(fake: FakeExecutor, status_dir: Path, capsys: pytest.CaptureFixture[str],
                    argv: list[str], message: str) -> None:
    write_status("chaos-test", fake.status())
    assert chaos_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert_untouched(fake.jvm, fake.worker)


def test_cli_refusal_is_an_error_not_a_traceback(fake: FakeExecutor, status_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_status("chaos-test", fake.status(driver_pid=dead_pid()))
    assert cli.main(["kill", "chaos-test", "rule[0]r0", "--action", "kill-executor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: driver pid") and "Traceback" not in err
    assert_untouched(fake.jvm)
