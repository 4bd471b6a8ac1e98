"""A worker attempt's start and end at the job master: its registration and its end report.

Every worker registers once when its attempt starts (an RPC thread) and waits there until all
have, up to ``spark.replication.startTimeout``: the job starts when the last one arrives, unless
two of them share an executor where replicas or checkpoints must be apart.  A worker that
registers again was relaunched by Spark (:meth:`Losses.relaunched`).  At its end the attempt
reports what it did: its last metrics, its outputs' progress, and whether it finished or failed.
In between, its heartbeats are the master's and its liveness :mod:`replication.control.watch`'s.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from replication.control.liveness import WorkerInfo
from replication.messages import Ack, Register, Registered, WorkerFinished

if TYPE_CHECKING:
    from replication.control.master import JobMaster

log = logging.getLogger(__name__)


class WorkerAttempts:
    """The start barrier of one job's workers and their end reports (its methods take the job
    master's lock)."""

    def __init__(self, master: JobMaster, start_timeout_s: float) -> None:
        self.master = master
        self.start_timeout_s = start_timeout_s  # how long the first registrations wait for the last

    def register(self, req: Register) -> Registered:
        """Worker ``req.worker``'s registration: once every worker has registered, the workers'
        addresses and every service's word; ``abort`` if the job cannot start."""
        m = self.master
        w, attempt = req.worker, req.attempt
        with m.locked():
            if w in m.workers:  # Spark relaunched it after its executor was lost
                return m.losses.relaunched(req)
            m.workers[w] = WorkerInfo(w, attempt, req.executor, req.address, req.python_pid, time.monotonic())
            log.info("worker %d registered from executor %s at %s", w, req.executor, req.address)
            m.changed()
            ok = m.wait_for(lambda: len(m.workers) >= m.num_workers or m.failure, self.start_timeout_s)
            if m.failure:
                return Registered("abort", m.failure)
            if not ok:
                m.fail(f"only {len(m.workers)} of {m.num_workers} workers registered within "
                       f"spark.replication.startTimeout; are there {m.num_workers} free task slots?")
                return Registered("abort", m.failure or "")
            executors = [i.executor for i in m.workers.values()]
            if (m.replicated or m.rhino is not None) and len(set(executors)) < len(executors):
                m.fail(f"two workers share an executor ({executors}): replicas (or checkpoints and the "
                       "partitions they are of) would not be apart; run executors with one task slot each "
                       "(spark.executor.cores = spark.task.cpus)")
                return Registered("abort", m.failure or "")
            if m.started_at is None:
                m.started_at = time.monotonic()
                m.write_status()  # now, so the kill tooling can find the replicas at once
                m.wake()
            m.workers[w].last_seen = time.monotonic()
            # every service's word (the Rhino view too: replicas ship their first checkpoint the moment they start)
            return Registered("ok", "", m.addresses(), m.instructions())

    def finished(self, req: WorkerFinished) -> Ack:
        """Worker ``req.worker``'s attempt ended: finished, failed or evicted."""
        m = self.master
        w = req.worker
        with m.locked():
            info = m.workers.get(w)
            current = info is not None and info.attempt == req.attempt
            if current and req.status != "evicted":
                # (an evicted attempt's replicas run elsewhere now: its stale figures must not
                # replace what their restored incarnations report, e.g. their final digests)
                m.metrics.update(req.metrics)
                m.outputs.progress(req.sinks)
                m.reports[w] = req
                if m.rhino is not None:
                    m.rhino.worker_ended(w)  # its server stops: restores and copies go elsewhere
                if req.status == "finished":
                    m.ring_workers()  # its upstreams stop sending to it (retire) at once
            if req.status == "failed":
                if w in m.dead:  # its replicas were cut off already: what broke there is no failure
                    m.event(f"worker {w}, declared dead before, reported: {'; '.join(req.errors)}")
                else:
                    m.fail("; ".join(req.errors))
            m.changed()
        return Ack()
