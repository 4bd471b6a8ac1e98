"""Tests of replication.spark_cluster: session, executor identity, warm-up, executor kill.

The integration tests share one ``local-cluster[3,1,512]`` session (module
scope); the executor-kill test runs last because it changes the executor set.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from replication import procfs
from replication import spark_cluster as scl

# Executors cannot import this test module: ship its task functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N_EXECUTORS = 3
MASTER = f"local-cluster[{N_EXECUTORS},1,512]"


# --------------------------------------------------------------------------- unit tests (no Spark)


def test_parse_local_cluster() -> None:
    assert scl.parse_local_cluster("local-cluster[3,1,512]") == (3, 1, 512)
    assert scl.parse_local_cluster(" local-cluster[ 2 , 2 , 1024 ] ") == (2, 2, 1024)
    assert scl.parse_local_cluster("local[2]") is None
    assert scl.parse_local_cluster("spark://h:7077") is None


def test_a_failed_spark_job_is_told_in_one_line_with_the_python_error() -> None:
    worker = ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
              '  File "/v/pyspark/serializers.py", line 483, in loads\n'
              "    return cloudpickle.loads(obj, encoding=encoding)\n"
              "ModuleNotFoundError: No module named 'myjob'\n SQLSTATE: 38000")
    assert scl.spark_error_line(RuntimeError(worker)) == (
        "An exception was thrown from the Python worker: ModuleNotFoundError: No module named 'myjob'")
    py4j = ("An error occurred while calling o41.collectAndServe.\n: org.apache.spark.SparkException: "
            "Job 3 cancelled\n\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages")
    assert scl.spark_error_line(RuntimeError(py4j)) == (
        "An error occurred while calling o41.collectAndServe.: org.apache.spark.SparkException: Job 3 cancelled")
    assert scl.spark_error_line(RuntimeError("lost")) == "lost"
    assert scl.spark_error_line(RuntimeError()) == "RuntimeError"


def test_default_conf_local_cluster() -> None:
    conf = scl.default_conf(MASTER, "x")
    assert conf["spark.executor.memory"] == "512m"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert int(conf["spark.task.maxFailures"]) >= 10
    assert conf["spark.scheduler.mode"] == "FAIR"
    remote = scl.default_conf("spark://h:7077", "x")
    assert "spark.driver.host" not in remote and "spark.executor.memory" not in remote


def test_not_an_executor_on_driver() -> None:
    assert scl.current_executor_id() is None
    assert scl.current_executor_jvm_pid() is None


def test_local_advertise_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert scl.local_advertise_host("127.0.0.1") == "127.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    assert scl.local_advertise_host("127.0.0.1") == "10.1.2.3"


def test_executor_cmdline_parsing() -> None:
    argv = [
        "/usr/bin/java",
        "-cp",
        "x",
        "org.apache.spark.executor.CoarseGrainedExecutorBackend",
        "--driver-url",
        "spark://CoarseGrainedScheduler@127.0.0.1:1",
        "--executor-id",
        "7",
        "--hostname",
        "10.0.0.5",
        "--cores",
        "1",
        "--app-id",
        "app-1",
    ]
    ep = scl._parse_executor_cmdline(42, argv)
    assert ep == scl.ExecutorProcess("7", 42, "10.0.0.5", "app-1")
    assert scl._parse_executor_cmdline(42, ["python", "-m", "pyspark.daemon"]) is None


# --------------------------------------------------------------------------- integration


def _gateway_pid() -> int | None:
    """Pid of the driver JVM (``SparkSubmit``) this Python process launched, if any."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return None if proc is None else int(proc.pid)


@pytest.fixture
def sc(spark: Any) -> Any:
    """The session's shared local-cluster (tests/conftest.py); the kill test leaves it with a
    replacement executor in place of the killed one, and waits until it has registered."""
    return spark.sparkContext


@pytest.mark.integration
def test_three_distinct_executors(sc: Any) -> None:
    ids = scl.executor_ids(sc)
    assert len(ids) == N_EXECUTORS
    assert len(set(ids)) == N_EXECUTORS
    assert "driver" not in ids
    assert sorted(scl.executor_jvm_pids(sc)) == sorted(ids)


@pytest.mark.integration
def test_warm_up_covers_all_executors(sc: Any) -> None:
    t0 = time.monotonic()
    info = scl.warm_up(sc)
    print(f"\nwarm_up: {time.monotonic() - t0:.2f}s {info}")
    ids = scl.executor_ids(sc)
    assert sorted(info) == sorted(ids)
    assert len({w.python_pid for w in info.values()}) == N_EXECUTORS
    jvm = scl.executor_jvm_pids(sc)
    for eid, w in info.items():
        assert w.executor_id == eid
        assert w.jvm_pid == jvm[eid]
        assert w.host == "127.0.0.1"


@pytest.mark.integration
def test_warm_up_names_the_executors_that_cannot_load_the_payload(sc: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A module only the driver can import: every executor says so, in one line each."""
    (tmp_path / "only_on_the_driver.py").write_text("class Rule:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_on_the_driver  # type: ignore[import-not-found]

    with pytest.raises(scl.ExecutorsCannotLoad) as refused:
        scl.warm_up(sc, payload=cloudpickle.dumps(only_on_the_driver.Rule()))
    assert sorted(refused.value.errors) == sorted(scl.executor_ids(sc))
    assert set(refused.value.errors.values()) == {"ModuleNotFoundError: No module named 'only_on_the_driver'"}
    assert "cannot load it: ModuleNotFoundError: No module named 'only_on_the_driver'" in str(refused.value)
    info = scl.warm_up(sc, payload=cloudpickle.dumps({"loads": "anywhere"}))
    assert sorted(info) == sorted(scl.executor_ids(sc))


def _identify(_: int) -> tuple[str | None, int | None, int]:
    time.sleep(1.0)  # keep the slot so that the three tasks run side by side
    return scl.current_executor_id(), scl.current_executor_jvm_pid(), os.getpid()


@pytest.mark.integration
def test_current_executor_id_inside_tasks(sc: Any) -> None:
    rows = sc.parallelize(range(N_EXECUTORS), N_EXECUTORS).map(_identify).collect()
    ids = [r[0] for r in rows]
    assert sorted(ids) == sorted(scl.executor_ids(sc))
    jvm = scl.executor_jvm_pids(sc)
    for eid, jvm_pid, _pid in rows:
        assert jvm_pid == jvm[eid]


@pytest.mark.integration
def test_executor_jvms_start_without_the_optimizing_compiler(sc: Any) -> None:
    """A replacement executor's start takes its CPU from the replicas that mask the failure."""
    for pid in scl.executor_jvm_pids(sc).values():
        argv = procfs.cmdline(pid)
        assert "-XX:TieredStopAtLevel=1" in argv and "-XX:+UseSerialGC" in argv, argv


@pytest.mark.integration
def test_executor_work_dir(sc: Any) -> None:
    eid = scl.executor_ids(sc)[0]
    d = scl.executor_work_dir(sc, eid)
    assert (d / "stderr").is_file(), d
    assert "CoarseGrainedExecutorBackend" in (d / "stderr").read_text(errors="replace")


def _where_pyspark_comes_from(_: int) -> tuple[str, list[str]]:
    import pyspark

    return pyspark.__file__, [p for p in sys.path if p.endswith(".zip")]


@pytest.mark.integration
def test_executor_python_imports_the_compiled_pyspark_not_the_zip(sc: Any) -> None:
    """Python compiles a zip's modules from source at every import (about 0.5 s of CPU for each
    executor daemon and forked worker): the executors' workers import PySpark from the venv."""
    import pyspark

    rows = sc.parallelize(range(N_EXECUTORS), N_EXECUTORS).map(_where_pyspark_comes_from).collect()
    for file, zips in rows:
        assert file == pyspark.__file__, file
        assert not any(Path(z).exists() for z in zips), zips


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def _looping_task(index: int, out_dir: str, seconds: float) -> dict[str, Any]:
    """Announce where it runs, loop for ``seconds`` and return the loop count."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    attempt = tc.attemptNumber() if tc is not None else -1
    info = {"index": index, "eid": scl.current_executor_id(), "pid": os.getpid(), "attempt": attempt}
    Path(out_dir, f"{index}-{attempt}.json").write_text(json.dumps(info))
    start = time.time()
    count = 0
    while time.time() - start < seconds:
        count += 1
        time.sleep(0.01)
    return {**info, "count": count, "start": start, "end": time.time()}


@pytest.mark.integration
def test_kill_executor_masks_nothing_else(sc: Any, tmp_path: Path) -> None:
    """SIGKILL one executor while a 3-task job runs: the driver notices, the others keep running."""
    before = scl.executor_ids(sc)
    seconds = 8.0
    result: dict[str, Any] = {}

    def run() -> None:
        sc.setJobGroup("kill-test", "kill test", interruptOnCancel=True)
        try:
            rdd = sc.parallelize(range(N_EXECUTORS), N_EXECUTORS)
            result["rows"] = rdd.map(lambda i: _looping_task(i, str(tmp_path), seconds)).collect()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            result["error"] = e

    job = threading.Thread(target=run, daemon=True)
    job.start()
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*-0.json"))) < N_EXECUTORS:
        assert "error" not in result, result["error"]
        assert time.monotonic() < deadline, "tasks did not start"
        time.sleep(0.05)
    started = {
        json.loads(p.read_text())["index"]: json.loads(p.read_text()) for p in tmp_path.glob("*-0.json")
    }
    victim_index = 0
    victim = started[victim_index]["eid"]

    t_kill, t_kill_wall = time.monotonic(), time.time()
    pid = scl.kill_executor(sc, victim)
    assert pid > 0
    victim_python = started[victim_index]["pid"]
    gone_after = new_after = python_gone_after = None
    while time.monotonic() - t_kill < 60 and None in (gone_after, new_after, python_gone_after):
        ids = scl.executor_ids(sc)
        if gone_after is None and victim not in ids:
            gone_after = time.monotonic() - t_kill
        if new_after is None and set(ids) - set(before):
            new_after = time.monotonic() - t_kill
        if python_gone_after is None and not _alive(victim_python):
            python_gone_after = time.monotonic() - t_kill
        time.sleep(0.02)
    job.join(timeout=120)
    assert not job.is_alive(), "job did not finish"
    assert "error" not in result, result.get("error")
    after = scl.executor_ids(sc)
    print(
        f"\nkilled executor {victim} (pid {pid}): removed from the driver's list after "
        f"{gone_after}s, replacement registered after {new_after}s; executors {before} -> {after}; "
        f"its Python task process died after {python_gone_after}s"
    )
    # the orphaned Python worker must not outlive its JVM (pyspark.daemon SIGHUPs its group on EOF)
    assert python_gone_after is not None and python_gone_after < 10
    assert gone_after is not None and gone_after < 10, "driver did not notice the dead executor"
    assert new_after is not None, "local-cluster started no replacement executor"
    assert victim not in after and len(after) == N_EXECUTORS

    rows = {r["index"]: r for r in result["rows"]}
    retried = rows[victim_index]
    assert retried["attempt"] >= 1 and retried["eid"] != victim
    for i in range(N_EXECUTORS):
        if i == victim_index:
            continue
        r = rows[i]
        # the survivors ran once, uninterrupted, in the same Python process, for the full loop
        assert r["attempt"] == 0 and r["pid"] == started[i]["pid"] and r["eid"] == started[i]["eid"]
        assert r["end"] - r["start"] >= seconds
        assert r["count"] > seconds * 20
    print(f"retried task started {retried['start'] - t_kill_wall:.2f}s after the kill: {retried}")
