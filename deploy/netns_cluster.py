"""A whole deployment on network-namespace test hosts, as a script: ZooKeeper, the broker and three
Spark standalone workers on hosts of their own, the Spark master at the bridge's gateway; submit a
job to it with ``spark-submit`` and ``--conf`` flags; cut and heal a host; stop everything.

    sudo .venv/bin/python -m deploy.netns_cluster up     [--run-dir D] [--workers 3]
    sudo .venv/bin/python -m deploy.netns_cluster submit [--run-dir D] -- [spark-submit args: --conf ... app.py args]
    sudo .venv/bin/python -m deploy.netns_cluster cut|heal HOST [--run-dir D]     # HOST: zk, kafka, w0, w1, ...
    sudo .venv/bin/python -m deploy.netns_cluster status [--run-dir D]
    sudo .venv/bin/python -m deploy.netns_cluster down   [--run-dir D]

``up`` leaves the processes running and writes ``<run dir>/cluster.json`` (hosts, addresses, pids,
endpoints) for the other commands.  ``submit`` runs spark-submit in this (the root) namespace with
the master URL, ``spark.driver.host`` (the gateway), one core per executor and
``spark.replication.kafka.bootstrapServers`` / ``zookeeper.connect`` of the namespace stack already
set; the arguments after ``--`` follow them.  ``down`` stops the workers (and their executors), the
master, the broker and ZooKeeper, and deletes the namespaces.  Needs root and iproute2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from deploy.netns import TestHosts, netns_unavailable
from deploy.stack import EmbeddedStack, _pid_alive, _terminate, stop_run_dir
from deploy.standalone import MASTER_CLASS, WORKER_CLASS, StandaloneCluster, WorkerSpec, spark_home
from replication.spark_cluster import EXECUTOR_JAVA_OPTIONS

STATE = "cluster.json"


def default_run_dir() -> Path:
    return Path(tempfile.gettempdir()) / "replication-netns-cluster"


def up(run_dir: Path, workers: int = 3) -> dict:
    """Start everything, leave it running, return (and write) the cluster description."""
    if (run_dir / STATE).exists():
        raise SystemExit(f"{run_dir / STATE} exists: run `down` first (or pass another --run-dir)")
    reason = netns_unavailable()
    if reason:
        raise SystemExit(f"cannot make namespace hosts here: {reason}")
    run_dir.mkdir(parents=True, exist_ok=True)
    names = ["zk", "kafka", *(f"w{i}" for i in range(workers))]
    hosts = TestHosts(names).create()
    try:
        zk, kafka = hosts["zk"], hosts["kafka"]
        stack = EmbeddedStack(run_dir / "stack", stop_at_exit=False, zookeeper_at=(zk.address, zk.argv([])),
                              kafka_at=(kafka.address, kafka.argv([])))
        endpoints = stack.start()
        cluster = StandaloneCluster(hosts.gateway, [WorkerSpec(hosts[f"w{i}"].address, hosts[f"w{i}"].argv([]),
                                                               memory="768m") for i in range(workers)],
                                    run_dir / "spark")
        try:
            cluster.start()
        except BaseException:
            stack.stop()
            raise
    except BaseException:
        hosts.destroy()
        raise
    state = {"tag": hosts.tag, "names": names, "subnet": hosts.subnet, "gateway": hosts.gateway,
             "hosts": {n: h.address for n, h in hosts.hosts.items()}, "master_url": cluster.master_url,
             "bootstrap_servers": endpoints.bootstrap_servers, "zookeeper_connect": endpoints.zookeeper_connect,
             "stack_run_dir": str(run_dir / "stack"),
             "spark_pids": {name: p.pid for name, p in cluster._procs.items()}}
    (run_dir / STATE).write_text(json.dumps(state, indent=2) + "\n")
    return state


def _daemon_class(name: str) -> str:
    return MASTER_CLASS if name == "master" else WORKER_CLASS


def load(run_dir: Path) -> dict:
    path = run_dir / STATE
    if not path.exists():
        raise SystemExit(f"no cluster at {run_dir} (run `up` first)")
    return json.loads(path.read_text())


def hosts_of(state: dict) -> TestHosts:
    return TestHosts(state["names"], subnet=state["subnet"], prefix=state["tag"])


def submit_argv(state: dict, args: list[str]) -> list[str]:
    """spark-submit with the cluster's settings; ``args`` (more --conf, the application) follow."""
    n = sum(1 for name in state["names"] if name.startswith("w"))
    return [str(spark_home() / "bin" / "spark-submit"), "--master", state["master_url"],
            "--conf", f"spark.driver.host={state['gateway']}", "--conf", f"spark.driver.bindAddress={state['gateway']}",
            "--conf", "spark.executor.cores=1", "--conf", "spark.task.cpus=1", "--conf", f"spark.cores.max={n}",
            "--conf", "spark.executor.memory=512m", "--conf", "spark.task.maxFailures=100",
            "--conf", f"spark.executor.extraJavaOptions={EXECUTOR_JAVA_OPTIONS}",
            "--conf", f"spark.pyspark.python={sys.executable}",
            "--conf", f"spark.replication.kafka.bootstrapServers={state['bootstrap_servers']}",
            "--conf", f"spark.replication.zookeeper.connect={state['zookeeper_connect']}", *args]


def submit(state: dict, args: list[str]) -> int:
    env = dict(os.environ, SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP=state["gateway"])
    return subprocess.call(submit_argv(state, args), env=env)


def down(run_dir: Path) -> None:
    state = load(run_dir)
    for name, pid in sorted(state["spark_pids"].items(), key=lambda kv: kv[0] == "master"):
        _terminate(pid, _daemon_class(name), 15.0)  # (a no-op if it is gone, or the pid is not it any more)
    stop_run_dir(Path(state["stack_run_dir"]))
    hosts_of(state).destroy()
    (run_dir / STATE).unlink()


def status(state: dict) -> str:
    lines = [f"master {state['master_url']}  kafka {state['bootstrap_servers']}  zookeeper "
             f"{state['zookeeper_connect']}"]
    for name, pid in state["spark_pids"].items():
        lines.append(f"spark {name:9} pid {pid:<8} {'alive' if _pid_alive(pid, _daemon_class(name)) else 'gone'}")
    for name, addr in state["hosts"].items():
        link = hosts_of(state)[name].link
        up_ = subprocess.run(["ip", "-br", "link", "show", link], capture_output=True, text=True).stdout
        lines.append(f"host {name:6} {addr:14} link {'cut' if 'DOWN' in up_ else 'up'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.netns_cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up", "submit", "cut", "heal", "status", "down"])
    ap.add_argument("host", nargs="?", help="cut / heal: the host (zk, kafka, w0, ...)")
    ap.add_argument("--run-dir", type=Path, default=default_run_dir())
    ap.add_argument("--workers", type=int, default=3)
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command == "up":
        print(json.dumps(up(args.run_dir, args.workers), indent=2))
        return 0
    if args.command == "down":
        down(args.run_dir)
        print("stopped; namespaces deleted")
        return 0
    state = load(args.run_dir)
    if args.command == "submit":
        return submit(state, rest)
    if args.command == "status":
        print(status(state))
        return 0
    if not args.host or args.host not in state["hosts"]:
        ap.error(f"{args.command}: name a host: {', '.join(state['hosts'])}")
    hosts = hosts_of(state)
    (hosts.cut if args.command == "cut" else hosts.heal)(args.host)
    print(f"{args.host} {'cut off' if args.command == 'cut' else 'healed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
