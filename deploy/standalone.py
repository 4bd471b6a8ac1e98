"""A Spark standalone cluster (a master and workers) from the pip PySpark, on real hosts or on
namespace test hosts (:mod:`deploy.netns`).

On real hosts, run one process per host (``deploy/README.md`` has the whole recipe)::

    python -m deploy.standalone master --host 10.0.0.1              # spark://10.0.0.1:7077
    python -m deploy.standalone worker spark://10.0.0.1:7077 --host 10.0.0.11 [--cores 1 --memory 2g]

Each runs in the foreground until stopped (SIGTERM or Ctrl-C).  :class:`StandaloneCluster` starts
the same processes from Python (tests and the namespace scripts), each optionally inside a host's
``ip netns exec`` prefix, and stops them again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deploy.stack import _terminate, spawn_logged

__all__ = ["StandaloneCluster", "WorkerSpec", "master_argv", "spark_home", "worker_argv"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home(root: Path | None = None) -> Path:
    """A Spark home for the daemons: the pip PySpark package, with its own ``work/`` directory."""
    from replication.spark_cluster import shadow_spark_home

    return shadow_spark_home(root or Path(tempfile.gettempdir()) / "replication-spark")


def master_argv(home: Path, host: str, port: int, webui_port: int) -> list[str]:
    return [str(home / "bin" / "spark-class"), MASTER_CLASS, "--host", host, "--port", str(port),
            "--webui-port", str(webui_port)]


def worker_argv(home: Path, master_url: str, host: str, cores: int, memory: str, work_dir: Path | str,
                webui_port: int | None = None) -> list[str]:
    """A worker offering ``cores`` task slots (keep one per executor: spark.executor.cores=1)."""
    return [str(home / "bin" / "spark-class"), WORKER_CLASS, "--host", host, "--cores", str(cores), "--memory",
            memory, "--work-dir", str(work_dir), *(["--webui-port", str(webui_port)] if webui_port is not None
                                                    else []), master_url]


def daemon_env(address: str, home: Path) -> dict[str, str]:
    """Environment of a master or worker daemon at ``address`` (its executors inherit it)."""
    env = dict(os.environ)
    env.update({"SPARK_HOME": str(home), "SPARK_LOCAL_IP": address, "SPARK_LOCAL_HOSTNAME": address,
                "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"})
    return env


@dataclass(frozen=True)
class WorkerSpec:
    address: str
    prefix: Sequence[str] = ()  # e.g. a namespace host's ``ip netns exec <ns>``
    cores: int = 1
    memory: str = "1g"


@dataclass
class StandaloneCluster:
    """A master at ``master_address`` (in this namespace) and one worker per spec."""

    master_address: str
    workers: list[WorkerSpec]
    run_dir: Path
    port: int = 7077
    webui_port: int = 8080
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_address}:{self.port}"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self._procs[name] = spawn_logged(argv, self.run_dir / f"{name}.log", self.run_dir, env)

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        home = spark_home()
        self._spawn("master", master_argv(home, self.master_address, self.port, self.webui_port),
                    daemon_env(self.master_address, home))
        try:
            self._wait(lambda s: True, timeout_s, "the master")
            for i, w in enumerate(self.workers):
                work = self.run_dir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker-{i}", [*w.prefix, *worker_argv(home, self.master_url, w.address, w.cores,
                                                                     w.memory, work, webui_port=0)],
                            daemon_env(w.address, home))
            self._wait(lambda s: s.get("aliveworkers", 0) >= len(self.workers), timeout_s,
                       f"{len(self.workers)} workers to register")
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict:
        """The master's JSON status (workers, applications), ``{}`` if it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.master_address}:{self.webui_port}/json/", timeout=2) as r:
                return json.load(r)
        except OSError:
            return {}

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"Spark {name} exited with code {proc.returncode}; see "
                                       f"{self.run_dir / (name + '.log')}")
            state = self.state()
            if state and ok(state):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f}s for {what}: {state or 'the master does not answer'}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Workers (and so their executors) first, then the master."""
        for name in sorted(self._procs, key=lambda n: n == "master"):
            _terminate(self._procs[name].pid, f"spark {name}", 15.0, popen=self._procs[name])
        self._procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.standalone", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    m = sub.add_parser("master", help="run a standalone master here (foreground)")
    m.add_argument("--host", required=True, help="the address workers and drivers reach this host at")
    m.add_argument("--port", type=int, default=7077)
    m.add_argument("--webui-port", type=int, default=8080)
    w = sub.add_parser("worker", help="run a standalone worker here (foreground)")
    w.add_argument("master", help="spark://HOST:PORT")
    w.add_argument("--host", required=True, help="this host's address (executors advertise it)")
    w.add_argument("--cores", type=int, default=1, help="one task slot per executor: keep spark.executor.cores=1")
    w.add_argument("--memory", default="2g")
    w.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "replication-spark-worker"))
    args = ap.parse_args(argv)
    home = spark_home()
    if args.role == "master":
        cmd = master_argv(home, args.host, args.port, args.webui_port)
    else:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
        cmd = worker_argv(home, args.master, args.host, args.cores, args.memory, args.work_dir)
    proc = subprocess.Popen(cmd, env=daemon_env(args.host, home))
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
