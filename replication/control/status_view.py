"""The job's status as ``replication status`` shows it: built from the job master's state, written
as JSON next to the job (:mod:`replication.status`) at most twice a second while it changes."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from replication.handover_orders import CodeOrder
from replication.status import write_status

if TYPE_CHECKING:
    from replication.control.master import JobMaster

log = logging.getLogger(__name__)


class StatusFile:
    """The status file of job ``job_name`` ("": none is written)."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name
        self.dirty = True  # changed since it was last written
        self._written = 0.0

    def due(self, master: JobMaster) -> dict[str, Any] | None:
        """The status to write now, if it changed and the last was written half a second ago or
        more (caller holds the master's lock; :meth:`publish` it outside the lock)."""
        if not (self.dirty and time.monotonic() - self._written >= 0.5 and self.job_name):
            return None
        self.dirty = False
        self._written = time.monotonic()
        return self._build(master, "running")

    def write(self, master: JobMaster, state: str) -> None:
        """Write the status now, as ``state`` (caller holds the master's lock)."""
        if self.job_name and (status := self._build(master, state)) is not None:
            self.publish(status)

    def publish(self, status: dict[str, Any]) -> None:
        try:
            write_status(self.job_name, status)
        except OSError as err:
            log.warning("cannot write the job status file: %s", err)

    @staticmethod
    def _build(master: JobMaster, state: str) -> dict[str, Any] | None:
        try:
            return job_status(master, state)
        except Exception:  # noqa: BLE001 - the status view must never stop the monitor or a registration
            log.exception("cannot build the job status")
            return None


def job_status(master: JobMaster, state: str) -> dict[str, Any]:
    """What ``replication status`` shows (written as JSON next to the job; caller holds the master's
    lock)."""
    m = master
    return {
        "job": m.job_name, "app_id": m.app_id, "driver_pid": os.getpid(), "updated": time.time(),
        "state": state, "control_address": m.control_address, "heartbeat_port": m.heartbeat_port,
        "workers": {str(w): {"executor": i.executor, "address": i.address, "python_pid": i.python_pid,
                             "attempt": i.attempt, "alive": w not in m.dead or m.bystander(i),
                             "standby": i.standby} for w, i in m.workers.items()},
        "replicas": {m.replica_label(t, p, r): {"task": t, "partition": p, "replica": r, "worker": w}
                     for (t, p, r), w in m.placement.items()},
        "sinks": {m.replica_label(t, p, role[0]): {"epoch": role[1], "committed_seq": role[2]}
                  for (t, p, kind), role in m.outputs.roles.items() if kind == "out"},
        "events": [{"time": ts, "text": text} for ts, text in m.events[-50:]],
        "checkpoints": {} if m.rhino is None else {
            f"{m.plan.task(t).name}[{p}]": {
                "group": m.rhino.groups.get((t, p), []),
                **({"completed": cp.checkpoint_id, "completed_at": cp.completed_at,
                    "holders": sorted(cp.holders)} if (cp := m.rhino.completed.get((t, p))) else {})}
            for t, p in m.rhino.instances()},
        "divergences": m.restores.digests.divergences[-10:],
        "durable": None if m.durable is None else m.durable.status(),
        "metrics": {name: {"in": im.records_in, "out": im.records_out, "dedup_dropped": im.dedup_dropped,
                           "gaps": im.gaps, "queue": im.queue_batches, "dead_lettered": im.dead_lettered,
                           "p50_ms": round(im.latency.percentile(0.5) * 1000, 1),
                           "p99_ms": round(im.latency.percentile(0.99) * 1000, 1),
                           "role": im.role, "finished": im.finished, "leader": im.leader,
                           "order_epoch": im.order_epoch, "pulse": im.pulse, "restored_from": im.restored_from,
                           "checkpoint_id": im.checkpoint_id} for name, im in m.metrics.items()},
        # for `replication status`: the task graph, lost replicas, recoveries, the metrics endpoint
        "ordering": m.mode if m.mode in ("kazoo", "liverobin") else "none",
        "replicated": m.replicated, "rhino": m.rhino is not None,
        "tasks": [{"id": t.id, "name": t.name, "parallelism": t.parallelism,
                   "operators": [n.name for n in t.chain],
                   "inputs": [f"{m.plan.task(i.src_task).name}[{i.partitioning}]" for i in t.inputs]}
                  for t in m.plan.tasks],
        "lost": sorted(m.replica_label(*replica) for replica in m.lost),
        "recoveries": m.restores.recoveries[-20:], "checkpoints_compared": m.restores.digests.compared,
        "metrics_url": m.metrics_url,
        # handovers: the vnode map of every keyed task, the handovers not completed, drained workers
        "routing": {m.plan.task(t).name: {
            "epoch": table.epoch, "active": table.parallelism,
            "vnodes": [table.assignment.count(p) for p in range(m.plan.task(t).parallelism)]}
            for t, table in (m.handovers.manager.tables if m.handovers is not None
                             else m.plan.routing).items()},
        "handovers": [] if m.handovers is None else [
            {"id": o.handover_id, "task": m.plan.task(o.task).name,
             "state": m.handovers.state(o.handover_id).value,
             "what": (f"operator {o.operator} version {o.version}" if isinstance(o, CodeOrder) else
                      f"{len(o.moves)} vnode(s) from {sorted(o.origins)} to {sorted(o.targets)}")}
            for o in m.handovers.orders.values()],
        "pulse_window": m.windows.word, "drained": sorted(m.drained),
        "rpc_refused": m.refused_calls(),
    }
