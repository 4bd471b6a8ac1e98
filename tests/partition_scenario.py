"""One network-partition experiment on namespace test hosts, in a process of its own (it runs its
own Spark driver); ``tests/system/test_network_partition.py`` runs it and checks the JSON it writes.

Hosts (``deploy.netns``): ``zk`` (ZooKeeper), ``kafka`` (the broker), ``w0``-``w2`` (a Spark
standalone worker each, one executor of one core); the Spark master and the driver are in the
root namespace, at the bridge's gateway address.  The order-sensitive two-source job
(``replication.examples.ordered``) runs replicated with Rhino, fed without pause.  Once every
partition has a completed checkpoint on a live group member, the link of the host running the
victim is cut (its processes keep running), kept cut for ``--cut-seconds``, then healed; the run
then waits until every replica lost with that worker is restored and caught up, stops feeding,
drains and checks the output.

    python tests/partition_scenario.py --scenario kazoo-leader|liverobin-replica|sink-writer --json OUT

Victims: ``kazoo-leader``: the worker of the KaZoo leader of ``union-2[0]`` (mode kazoo);
``liverobin-replica``: the worker of ``chain[0]r0`` (mode liverobin); ``sink-writer``: the worker of
the writer replica of ``chain-sink[0]`` (mode liverobin).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.netns import TestHosts, netns_unavailable  # noqa: E402
from deploy.stack import EmbeddedStack  # noqa: E402
from deploy.standalone import StandaloneCluster, WorkerSpec  # noqa: E402
from replication import run  # noqa: E402
from replication.examples.ordered import build_ordered_job, verify_chains  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402
from tests.ordered_runs import every_partition_restorable, fed_without_pause, read_output, source_topics  # noqa: E402

SCENARIOS = {"kazoo-leader": "kazoo", "liverobin-replica": "liverobin", "sink-writer": "liverobin"}


def wait(cond, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
    return time.time()


def label_of(master, replica) -> str:
    return master.replica_label(*replica)


def find(master, name: str):
    return next(k for k in master.placement if label_of(master, k) == name)


def choose_victim(scenario: str, master) -> tuple[int, str]:
    """(worker, what it is) for the scenario."""
    if scenario == "kazoo-leader":
        t, p, _ = find(master, "union-2[0]r0")
        wait(lambda: any(getattr(master.metrics.get(label_of(master, (t, p, r))), "leader", False) for r in (0, 1)),
             30, "a KaZoo leader of union-2[0]")
        r = next(r for r in (0, 1) if master.metrics[label_of(master, (t, p, r))].leader)
        return master.placement[(t, p, r)], f"union-2[0]r{r} (KaZoo leader)"
    if scenario == "liverobin-replica":
        return master.placement[find(master, "chain[0]r0")], "chain[0]r0"
    t, p, _ = find(master, "chain-sink[0]r0")
    writer = master.sinks[(t, p, "out")][0]
    return master.placement[(t, p, writer)], f"chain-sink[0]r{writer} (sink writer)"


def experiment(args, out: dict) -> None:
    mode = SCENARIOS[args.scenario]
    run_dir = Path(tempfile.mkdtemp(prefix="partition-"))
    with TestHosts(["zk", "kafka", "w0", "w1", "w2"]) as hosts:
        zk, kafka = hosts["zk"], hosts["kafka"]
        stack = EmbeddedStack(run_dir / "stack", zookeeper_at=(zk.address, zk.argv([])),
                              kafka_at=(kafka.address, kafka.argv([])))
        endpoints = stack.start()
        cluster = StandaloneCluster(hosts.gateway, [WorkerSpec(hosts[w].address, hosts[w].argv([]), memory="768m")
                                                    for w in ("w0", "w1", "w2")], run_dir / "spark")
        try:
            cluster.start()
            spark = build_session(cluster.master_url, "partition-test", expected_executors=3, conf={
                "spark.driver.host": hosts.gateway, "spark.driver.bindAddress": hosts.gateway,
                "spark.executor.cores": "1", "spark.executor.memory": "512m", "spark.cores.max": "3",
                "spark.task.cpus": "1"})
            try:
                scenario(args, mode, hosts, SimpleNamespace(bootstrap_servers=endpoints.bootstrap_servers),
                         endpoints, spark, out)
            finally:
                stop_session(spark)
        finally:
            cluster.stop()
            stack.stop()
            shutil.rmtree(run_dir, ignore_errors=True)


def scenario(args, mode: str, hosts: TestHosts, stack, endpoints, spark, out: dict) -> None:
    name = f"part{int(time.time()) % 100000}{args.scenario.split('-')[0][:2]}"
    a, b = source_topics(stack, name)
    job = build_ordered_job(a, b, f"{name}out", name=name)
    conf = {"spark.replication.kafka.bootstrapServers": endpoints.bootstrap_servers,
            "spark.replication.enabled": "true", "spark.replication.mode": mode,
            "spark.replication.rhino.enabled": "true",
            "spark.replication.rhino.checkpointEvery": "20" if mode == "liverobin" else "50",
            "spark.replication.rhino.checkpointElements": "200"}
    if mode == "kazoo":
        conf["spark.replication.zookeeper.connect"] = endpoints.zookeeper_connect
    handle = run(job, spark=spark, conf=conf)
    handle.wait_started(120)
    master = handle.master
    with fed_without_pause(stack, a, b) as ids:
        wait(lambda: every_partition_restorable(master), 90, "a safe checkpoint everywhere")
        victim, what = choose_victim(args.scenario, master)
        address = master.workers[victim].address.rsplit(":", 1)[0]
        host = hosts.host_of(address)
        assert host is not None, f"worker {victim} at {address} is on no test host"
        lost = sorted(label_of(master, k) for k, w in master.placement.items() if w == victim)
        sink_key = next((*k[:2], "out") for k in master.placement if label_of(master, k) == "chain-sink[0]r0")
        before = {"sink_role": list(master.sinks[sink_key]),
                  "leaders": {k: (m.leader, m.order_epoch) for k, m in master.metrics.items() if m.leader}}
        attempt = master.workers[victim].attempt
        out.update(victim=what, worker=victim, host=host.name, lost=lost)
        cut_at = time.time()
        hosts.cut(host.name)
        out["declared_dead_s"] = wait(lambda: victim in master.dead, 30, f"worker {victim} declared dead") - cut_at
        if args.scenario == "kazoo-leader":
            replica = what.split(" ")[0]
            twin = replica[:-1] + str(1 - int(replica[-1]))
            epoch = before["leaders"][replica][1]
            out["new_leader_s"] = wait(lambda: (m := master.metrics.get(twin)) is not None and m.leader
                                       and m.order_epoch > epoch, 30, f"{twin} to lead") - cut_at
        if args.scenario == "sink-writer":
            out["writer_switched_s"] = wait(lambda: master.sinks[sink_key][1] > before["sink_role"][1], 30,
                                            "the other sink replica to write") - cut_at
        time.sleep(args.cut_seconds)
        out["sink_role_while_cut"] = list(master.sinks[sink_key])
        healed_at = time.time()
        hosts.heal(host.name)
        out["cut_s"] = healed_at - cut_at
        wait(lambda: set(lost) <= {r["replica"] for r in handle.recoveries()}, 180,
             f"{', '.join(lost)} restored and caught up")
        out["two_replicas_again_after_cut_s"] = max(
            r["caught_up_at"] for r in handle.recoveries() if r["replica"] in lost) - cut_at
        # healed, the cut-off worker hears it was evicted, stops, and Spark runs it again: a standby
        out["standby_again_after_heal_s"] = wait(
            lambda: master.workers[victim].attempt > attempt and victim not in master.dead, 120,
            f"worker {victim} to register again as a standby") - healed_at
        time.sleep(3)  # load after the recovery, with the healed host back on the network
    result = handle.drain(timeout=300)
    report = verify_chains(read_output(stack, f"{name}out"), ids)
    out.update(exact=report.exact, report=str(report), records=len(ids), divergences=result.divergences,
               recoveries=[{k: r[k] for k in ("replica", "worker", "rollback", "recovery_s")}
                           for r in result.recoveries],
               events=[text for _, text in master.events][-60:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    ap.add_argument("--cut-seconds", type=float, default=5.0, help="how long the link stays cut")
    ap.add_argument("--json", required=True, help="where the outcome goes")
    args = ap.parse_args(argv)
    out: dict = {"scenario": args.scenario}
    reason = netns_unavailable()
    if reason:
        out["skipped"] = reason
    else:
        try:
            experiment(args, out)
        except BaseException as exc:  # noqa: BLE001 - reported in the JSON
            out["error"] = "".join(traceback.format_exception(exc))[-4000:]
    Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items() if k != "events"}, indent=2, default=str))
    return 0 if out.get("exact") or out.get("skipped") else 1


if __name__ == "__main__":
    raise SystemExit(main())
