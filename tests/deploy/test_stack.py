"""Tests for the embedded stack (deploy/): ZooKeeper + tansu, topic helpers, CLI, external mode."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from deploy import stack as stack_mod
from deploy.__main__ import main as cli_main
from deploy.stack import (
    EmbeddedStack,
    StackEndpoints,
    StackError,
    check_health,
    java_version,
    require_java17,
    run_dir_status,
    stack_from_env,
    stop_run_dir,
)
from deploy.topics import create_topics, delete_topics, partitions_of, produce, read_all

# No tests/conftest.py loads the plugin yet; harmless if it later does.
pytest_plugins = ["deploy.pytest_plugin"]

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _pid_exists(pid: int) -> bool:
    """os.kill(pid, 0) succeeds; a zombie (exited, not yet reaped by init after a detached start) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- shared stack


def test_health(stack: StackEndpoints) -> None:
    assert check_health(stack) == {"zookeeper": True, "kafka": True}
    # multi-host strings (one dead server, a chroot) are fine; dead endpoints are unhealthy
    multi = StackEndpoints(f"127.0.0.1:1,{stack.bootstrap_servers}", f"127.0.0.1:1,{stack.zookeeper_connect}/x",
                           None, True)
    assert check_health(multi) == {"zookeeper": True, "kafka": True}
    dead = StackEndpoints("127.0.0.1:1", "127.0.0.1:1", None, True)
    assert check_health(dead) == {"zookeeper": False, "kafka": False}


def test_status_lists_live_pids(stack: StackEndpoints) -> None:
    if stack.external:
        pytest.skip("external stack: no pid files")
    statuses = {st.name: st for st in run_dir_status(stack.run_dir)}
    assert set(statuses) == {"zookeeper", "kafka"}
    assert statuses["kafka"].port == int(stack.bootstrap_servers.rsplit(":", 1)[1])
    assert statuses["zookeeper"].port == int(stack.zookeeper_connect.rsplit(":", 1)[1])
    for st in statuses.values():
        assert st.alive and st.pid is not None and _pid_exists(st.pid)
        assert st.log.is_file()


def test_zookeeper_znode_roundtrip(stack: StackEndpoints) -> None:
    zk = KazooClient(hosts=stack.zookeeper_connect, timeout=2.0)
    zk.start(timeout=10)
    try:
        path = f"/test-stack/{_unique('node')}"
        zk.create(path, b"hello", makepath=True)
        data, stat = zk.get(path)
        assert data == b"hello" and stat.version == 0
        zk.set(path, b"world")
        assert zk.get(path)[0] == b"world"
        zk.delete(path)
        assert zk.exists(path) is None
    finally:
        zk.stop()
        zk.close()


def test_produce_and_read_all_1000_records(stack: StackEndpoints) -> None:
    topic = _unique("roundtrip")
    create_topics(stack.bootstrap_servers, {topic: 3})
    try:
        assert list(partitions_of(stack.bootstrap_servers, topic)) == [0, 1, 2]
        records = [(f"k{i}".encode(), f"v{i}".encode(), [("i", str(i).encode())]) for i in range(1000)]
        assert produce(stack.bootstrap_servers, topic, records) == 1000
        got = read_all(stack.bootstrap_servers, topic, idle_timeout_s=0.5)
        assert len(got) == 1000
        assert sorted(r.value for r in got) == sorted(v for _, v, _ in records)
        for r in got:  # key, value and header travel together
            i = int(r.value[1:])
            assert r.key == f"k{i}".encode() and r.headers == [("i", str(i).encode())]
            assert r.topic == topic and r.timestamp > 0
        by_partition: dict[int, list[int]] = {}
        for r in got:
            by_partition.setdefault(r.partition, []).append(r.offset)
        assert len(by_partition) > 1, "keyed records should spread over partitions"
        for offsets in by_partition.values():  # dense offsets from 0, in order
            assert offsets == list(range(len(offsets)))
    finally:
        delete_topics(stack.bootstrap_servers, [topic])


def test_produce_plain_values_to_one_partition(stack: StackEndpoints) -> None:
    topic = _unique("plain")
    create_topics(stack.bootstrap_servers, {topic: 2})
    create_topics(stack.bootstrap_servers, {topic: 2})  # idempotent
    produce(stack.bootstrap_servers, topic, [b"a", "b", None], partition=1)
    got = read_all(stack.bootstrap_servers, topic, idle_timeout_s=0.2)
    assert [(r.partition, r.offset, r.key, r.value) for r in got] == [
        (1, 0, None, b"a"), (1, 1, None, b"b"), (1, 2, None, None)]
    delete_topics(stack.bootstrap_servers, [topic, _unique("never-existed")])


def test_read_all_empty_and_missing_topic(stack: StackEndpoints) -> None:
    topic = _unique("empty")
    create_topics(stack.bootstrap_servers, {topic: 2})
    assert read_all(stack.bootstrap_servers, topic, idle_timeout_s=0.1) == []
    missing = _unique("missing")
    with pytest.raises(RuntimeError, match="not found"):
        read_all(stack.bootstrap_servers, missing)
    with pytest.raises(RuntimeError, match="not found"):  # ... and it was not auto-created
        partitions_of(stack.bootstrap_servers, missing)


# --------------------------------------------------------------------------- own short-lived stacks


def test_lifecycle_start_status_stop(tmp_path: Path) -> None:
    s = EmbeddedStack(run_dir=tmp_path / "run")
    assert s.health() == {"zookeeper": False, "kafka": False}
    with s as endpoints:
        assert endpoints.run_dir == tmp_path / "run" and not endpoints.external
        assert s.start() is endpoints  # already started: same endpoints
        assert s.health() == {"zookeeper": True, "kafka": True}
        statuses = s.status()
        pids = [st.pid for st in statuses]
        assert [st.name for st in statuses] == ["zookeeper", "kafka"]
        assert all(st.alive for st in statuses) and all(_pid_exists(p) for p in pids)
        assert (tmp_path / "run" / "endpoints.json").is_file()
        assert (tmp_path / "run" / "zoo.cfg").read_text().count("tickTime=200") == 1
    assert not any(_pid_exists(p) for p in pids)
    assert not any(st.alive for st in s.status())
    s.stop()  # idempotent
    assert s.health() == {"zookeeper": False, "kafka": False}


def test_start_failure_raises_with_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setattr(stack_mod, "free_port", lambda: busy.getsockname()[1])
        with pytest.raises(StackError, match="exited with code") as info:
            EmbeddedStack(run_dir=tmp_path / "run").start()
    assert "last" in str(info.value) and "lines of" in str(info.value)
    assert not any(st.alive for st in run_dir_status(tmp_path / "run"))


def test_cli_detached_start_status_health_stop(tmp_path: Path) -> None:
    run_dir = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "deploy", *args, "--run-dir", str(run_dir)],
                              capture_output=True, text=True, env=env, timeout=120)

    started = cli("start")
    try:
        assert started.returncode == 0, started.stderr
        assert '"bootstrap_servers": "127.0.0.1:' in started.stdout
        assert (run_dir / "endpoints.json").is_file()
        assert cli("status").returncode == 0
        health = cli("health")
        assert health.returncode == 0 and '"kafka": true' in health.stdout
        pids = [st.pid for st in run_dir_status(run_dir)]
        stopped = cli("stop")
        assert stopped.returncode == 0, stopped.stderr
        assert cli("status").returncode == 1
        assert not any(_pid_exists(p) for p in pids if p is not None)
    finally:
        stop_run_dir(run_dir)


def test_cli_errors_are_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("status", "health", "stop"):
        assert cli_main([command, "--run-dir", str(tmp_path / "nope")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and "Traceback" not in err


# --------------------------------------------------------------------------- no processes needed


def test_external_mode_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_start(self: EmbeddedStack) -> StackEndpoints:
        raise AssertionError("external mode must not start anything")

    monkeypatch.setattr(EmbeddedStack, "start", must_not_start)
    monkeypatch.setenv("REPLICATION_BOOTSTRAP_SERVERS", "kafka-a:9092,kafka-b:9092")
    monkeypatch.setenv("REPLICATION_ZOOKEEPER_CONNECT", "zk-a:2181/chroot")
    with stack_from_env() as endpoints:
        assert endpoints == StackEndpoints("kafka-a:9092,kafka-b:9092", "zk-a:2181/chroot", None, True)
    monkeypatch.delenv("REPLICATION_ZOOKEEPER_CONNECT")
    with pytest.raises(StackError, match="set both"), stack_from_env():
        pass


def test_require_java17(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert java_version() is None
    with pytest.raises(StackError, match=r"Java 17 or newer is required.*no 'java' was found"):
        require_java17()
    with pytest.raises(StackError, match="Java 17"):
        EmbeddedStack(run_dir=tmp_path / "run").start()

    fake_home = tmp_path / "jdk"
    (fake_home / "bin").mkdir(parents=True)
    java = fake_home / "bin" / "java"
    monkeypatch.setenv("JAVA_HOME", str(fake_home))
    for banner, major in (('openjdk version "11.0.2" 2019-01-15', 11), ('java version "1.8.0_292"', 8)):
        java.write_text(f"#!/bin/sh\necho '{banner}' >&2\n")
        java.chmod(0o755)
        assert java_version() == major
        with pytest.raises(StackError, match=f"is Java {major}"):
            require_java17()
    java.write_text("#!/bin/sh\necho 'openjdk version \"21.0.1\"' >&2\n")
    assert java_version() == 21
    require_java17()
