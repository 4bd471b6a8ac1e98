"""Bringing a replica's state to this worker: from a durable cut when a run resumes, and from a
Rhino checkpoint when the driver restores a lost replica here.

A resumed run's first attempt builds the state of every replica placed here from its partition's
checkpoint in the durable cut before it registers (:meth:`ReplicaRestorer.fetch_resumed`).  A
lost replica (``Restore``, from the driver) is run here from the completed checkpoint this worker
holds (hard links, no transfer), one it pulls from a holder, or the durable cut's; its upstreams
then replay to it from the positions returned.  ``CopyCheckpoint`` has this worker hold a
restore point too, pulled from its only other holder.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from replication.handover_orders import order_from_wire
from replication.messages import Ack, CopyCheckpoint, Restored, RestoreReplica
from replication.runtime.output_writers import give_roles
from rhino_state.durable import DurableStore
from rhino_state.increments import IncrementMeta
from transport.ids import PartitionId

log = logging.getLogger(__name__)


class ReplicaRestorer:
    """The worker's restores: ``worker`` is the :class:`~replication.runtime.worker.Worker`."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def fetch_resumed(self) -> dict[PartitionId, tuple[IncrementMeta, Path]]:
        """A resumed run's first attempt: the state of every replica placed here, built from its
        partition's checkpoint in the durable cut (downloaded and checked increment by increment),
        before registering: a large state takes a while, and no heartbeat is due yet."""
        w = self.worker
        resume = w.plan.resume
        if resume is None or w.attempt != 0:
            return {}
        out = {}
        for (task_id, part, _), where in sorted(w.boot.placement.items()):
            if where != w.index:
                continue
            started = time.monotonic()
            target = w.state_root / f"t{task_id}-p{part}-resumed"
            meta = self._from_durable((task_id, part), resume.cut.parts[(task_id, part)].file, target)
            out[(task_id, part)] = (meta, target)
            log.warning("worker %d: %s[%d] resumes from checkpoint %d of cut %d (built in %.3fs)", w.index,
                        w.plan.task(task_id).name, part, meta.checkpoint_id, resume.cut.number,
                        time.monotonic() - started)
        return out

    def _from_durable(self, inst: PartitionId, file: str, target: Path) -> IncrementMeta:
        """Build checkpoint ``file`` of ``inst`` at ``target`` from the durable store this run
        resumed from (downloaded and checked increment by increment)."""
        w = self.worker
        assert w.plan.resume is not None
        shutil.rmtree(target, ignore_errors=True)
        return DurableStore(w.plan.resume.uri, w.job_name).restore(inst, file, target, scratch=w.state_root)

    def restore(self, req: RestoreReplica) -> Restored:
        """Run the lost replica ``req.replica`` here, from the completed checkpoint this worker
        holds (hard links, no transfer) or pulls from ``req.source``; its upstreams replay from
        the returned positions."""
        w = self.worker
        assert w.checkpoints is not None
        w.wait_ready()
        task_id, part, replica = req.replica
        if (task_id, part) in w.instances:
            raise RuntimeError(f"worker {w.index} already runs a replica of {(task_id, part)}")
        started = time.monotonic()
        w.routes.learn(req.addresses)
        inst = w.instance(task_id, part, replica, restoring=True)
        target = w.state_root / f"t{task_id}-p{part}-restored"
        if req.durable_file:
            meta = self._from_durable((task_id, part), req.durable_file, target)
        elif req.source:
            meta = w.checkpoints.fetch((task_id, part), target, req.checkpoint_id, w.peer(req.source))
        else:
            meta = w.checkpoints.restore((task_id, part), target, req.checkpoint_id)
        loaded = time.monotonic()
        runtime = inst.restore_from(meta, target)
        inst.build(w.routes.outputs(inst, req.placement, runtime["outputs"], lost=req.lost))
        give_roles(req.sinks, inst)
        inst.attempt = req.attempt
        inst.savepoint_dir = w.savepoint.directory
        inst.rearm([order_from_wire(o) for o in req.handovers], runtime["pulse"])
        w.routes.restored_here((task_id, part, replica), req.placement)
        w.instances[(task_id, part)] = inst
        w.link.restored((task_id, part))
        w.routes.send_to_moved(inst, req.restores_seen)
        inst.start()
        w.cuts.fetch_missing(inst)
        log.warning("restored %s from checkpoint %d in %.3fs (state load %.3fs)", inst.name, meta.checkpoint_id,
                    time.monotonic() - started, loaded - started)
        return Restored(meta.checkpoint_id, runtime.get("positions", {}), loaded - started,
                        time.monotonic() - started, runtime["pulse"])

    def copy_checkpoint(self, req: CopyCheckpoint) -> Ack:
        """Hold completed checkpoint ``req.checkpoint_id`` of ``req.instance`` too, pulled from ``req.source``."""
        w = self.worker
        assert w.checkpoints is not None
        started = time.monotonic()
        key = (req.instance[0], req.instance[1])
        w.checkpoints.copy(key, req.checkpoint_id, w.peer(req.source))
        log.info("holds checkpoint %d of %s too (pulled in %.3fs)", req.checkpoint_id, key, time.monotonic() - started)
        return Ack()
