"""A worker: one long-running Spark task that hosts many partition instances.

The driver starts one Spark job whose tasks are workers (DESIGN §3: the executor
count must not grow with the partition count).  A worker starts its gRPC server,
registers with the job master in the driver, learns every worker's address,
builds its instances and their channels, then heartbeats metrics to the driver
and obeys its commands (drain, stop) until all its instances have finished.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from confluent_kafka import Producer

from replication import framing, rpc
from replication.channels import OutputChannel, remote_transport
from replication.config import ReplicationConfig
from replication.deadletter import DeadLetterWriter
from replication.instance import PartitionInstance, ProcessingInstance, SourceInstance
from replication.plan import Instance, PhysicalPlan
from replication.spark_cluster import current_executor_id, local_advertise_host

log = logging.getLogger(__name__)


@dataclass
class WorkerBootstrap:
    """Everything a worker task needs; pickled (with the user's functions) into the Spark job."""

    job_name: str
    run_id: str
    plan: PhysicalPlan
    placement: dict[Instance, int]
    cfg: ReplicationConfig
    master_address: str
    num_workers: int


def run_worker(boot: WorkerBootstrap, index: int, attempt: int) -> dict[str, Any]:
    """Entry point inside the Spark task; returns the worker's final report."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Worker(boot, index, attempt).run()


class Worker:
    def __init__(self, boot: WorkerBootstrap, index: int, attempt: int) -> None:
        self.boot = boot
        self.cfg = boot.cfg
        self.job_name = boot.job_name
        self.index = index
        self.attempt = attempt
        self.plan = boot.plan
        base = Path(self.cfg.state_dir or Path(tempfile.gettempdir()) / "replication-state")
        self.state_root = base / boot.job_name / boot.run_id / f"w{index}-a{attempt}"
        self.instances: dict[Instance, PartitionInstance] = {}
        self._ready = threading.Event()
        self._peers: dict[str, rpc.Peer] = {}
        self._stop_sending = threading.Event()
        self.producer: Producer | None = None
        self.dead_letters: DeadLetterWriter | None = None

    # -- receiving ------------------------------------------------------------------------
    def _push(self, payload: bytes) -> bytes:
        if not self._ready.wait(self.cfg.start_timeout_ms / 1000):
            raise RuntimeError(f"worker {self.index} not ready")
        header = framing.decode_header(payload)
        inst = self.instances.get((header.task, header.partition))
        if not isinstance(inst, ProcessingInstance):
            raise ValueError(f"worker {self.index} hosts no instance ({header.task}, {header.partition})")
        inst.deliver(header, payload)
        return b""

    def _inbound_calls(self) -> int:
        mine = {i for i, w in self.boot.placement.items() if w == self.index}
        return sum(1 for c in self.plan.channels if (c.dst_task, c.dst_partition) in mine)

    # -- building -------------------------------------------------------------------------
    @property
    def sink_producer(self) -> Producer:
        assert self.producer is not None
        return self.producer

    def _build(self, addresses: dict[int, str]) -> None:
        conf = self.cfg.kafka_producer_config()
        conf.update({"enable.idempotence": True, "acks": "all"})
        self.producer = Producer(conf)
        self.dead_letters = DeadLetterWriter(self.producer, self.cfg.dead_letter_topic(self.job_name), self.job_name)
        plan, cfg = self.plan, self.cfg
        for (task_id, part), w in sorted(self.boot.placement.items()):
            if w != self.index:
                continue
            task = plan.task(task_id)
            cls = SourceInstance if task.is_source else ProcessingInstance
            self.instances[(task_id, part)] = cls(self, task, part, plan)
        for (task_id, part), inst in self.instances.items():
            outputs = []
            for edge in inst.task.outputs:
                chans = []
                for spec in plan.output_channels(task_id, part, edge.edge_id):
                    dst_worker = self.boot.placement[(spec.dst_task, spec.dst_partition)]
                    transport = self._push if dst_worker == self.index else remote_transport(
                        self._peer(addresses[dst_worker]), self._stop_sending)
                    chans.append(OutputChannel(spec, transport,
                                               batch_size=cfg.channel_batch_size,
                                               buffer_timeout_s=cfg.channel_buffer_timeout_ms / 1000))
                outputs.append((edge, chans))
            inst.build(outputs)

    def _peer(self, address: str) -> rpc.Peer:
        if address not in self._peers:
            self._peers[address] = rpc.Peer(address)
        return self._peers[address]

    # -- running --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        server, port = rpc.serve({"Push": self._push}, max_workers=self._inbound_calls() + 8)
        master = rpc.Peer(self.boot.master_address)
        master_host = self.boot.master_address.rsplit(":", 1)[0]
        report: dict[str, Any] = {"worker": self.index, "attempt": self.attempt, "status": "aborted"}
        try:
            reply = master.call("Register", {
                "worker": self.index, "attempt": self.attempt, "executor": current_executor_id(),
                "address": f"{local_advertise_host(master_host)}:{port}",
            }, timeout=self.cfg.start_timeout_ms / 1000)
            if reply["status"] != "ok":
                report["reason"] = reply.get("reason", "")
                return report
            self._build(reply["addresses"])
            self._ready.set()
            for inst in self.instances.values():
                inst.start()
            report = self._serve(master)
            return report
        finally:
            self._stop_sending.set()
            for inst in self.instances.values():
                inst.request_stop()
            for inst in self.instances.values():
                inst.join(5)
            if self.producer is not None:
                self.producer.flush(self.cfg.stop_timeout_ms / 1000)
            server.stop(grace=1.0)
            try:
                master.call("Finished", {**report, "metrics": self._metrics()}, timeout=5)
            except grpc.RpcError as err:
                log.warning("could not report the end to the driver: %s", err)
            for peer in [*self._peers.values(), master]:
                peer.close()
            shutil.rmtree(self.state_root, ignore_errors=True)

    def _metrics(self) -> dict[str, Any]:
        return {inst.name: inst.metrics for inst in self.instances.values()}

    def _serve(self, master: rpc.Peer) -> dict[str, Any]:
        """Heartbeat until every instance finished or the driver says stop."""
        interval = self.cfg.metrics_interval_ms / 1000
        unreachable_since: float | None = None
        while True:
            errors = [inst.error for inst in self.instances.values() if inst.error]
            done = all(inst.finished.is_set() for inst in self.instances.values())
            if self.producer is not None:
                self.producer.poll(0)
            try:
                reply = master.call("Heartbeat", {"worker": self.index, "attempt": self.attempt,
                                                  "metrics": self._metrics(), "errors": errors}, timeout=5)
                unreachable_since = None
            except grpc.RpcError as err:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > self.cfg.stop_timeout_ms / 1000:
                    log.error("driver unreachable for too long (%s): stopping", err.code())
                    return {"worker": self.index, "attempt": self.attempt, "status": "driver-lost"}
                reply = {"command": "run"}
            command = reply["command"]
            if errors:
                return {"worker": self.index, "attempt": self.attempt, "status": "failed", "errors": errors}
            if command == "drain":
                for inst in self.instances.values():
                    if isinstance(inst, SourceInstance):
                        inst.request_drain()
            elif command == "stop":
                return {"worker": self.index, "attempt": self.attempt, "status": "stopped"}
            if done:
                return {"worker": self.index, "attempt": self.attempt, "status": "finished"}
            time.sleep(interval)
