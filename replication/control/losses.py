"""What a lost worker or replica costs the job, and who takes over (caller holds the job master's
lock unless a method says otherwise).

A worker is declared dead when its executor left the cluster, its process exited (its watch on
the driver ended) or it was silent too long (:mod:`replication.control.watch`). Its replicas are
lost: a writer role passes to the twin, the last replica of a partition is rolled back to its
safe checkpoint, and a loss that can be neither masked nor rolled back fails the job. An
upstream may also cut a replica off by itself (it failed or lagged too far; the upstream's worker
reports it, :class:`CutOffs`): it is replaced in the same way, and stopped where it runs
(:class:`Drops`). A worker Spark relaunched comes back as a standby.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from replication.control.liveness import WorkerInfo
from replication.heartbeat_parts import CUT_OFFS, CutOffs, Drops
from replication.messages import Register, Registered
from transport.ids import ReplicaId

if TYPE_CHECKING:
    from replication.control.master import JobMaster


class Losses:
    """Deaths, cut-offs and relaunches of one job's workers and replicas; the control-plane
    service of cut-offs (reported by the upstreams' workers) and the replicas replaced after them."""

    name = CUT_OFFS

    def __init__(self, master: JobMaster) -> None:
        self.master = master
        self.dropped: dict[ReplicaId, int] = {}  # replicas replaced after a cut-off: up to which restore attempt

    def on_report(self, worker: int, part: CutOffs | None) -> None:
        if part is not None:
            for replica, (where, why) in part.replicas.items():
                self.replica_cut_off(replica, where, why)

    def reply(self) -> Drops | None:
        return Drops(dict(self.dropped)) if self.dropped else None

    def counts(self, w: int, info: WorkerInfo) -> bool:
        """Whether losing worker ``w`` now would be a death: the job started, and ``w`` is neither
        dead already, nor ended (reported), nor a bystander (the rule of every failure detector)."""
        m = self.master
        return m.started_at is not None and w not in m.dead and w not in m.reports and not m.bystander(info)

    def watch_ended(self, w: int, attempt: int) -> None:
        """The watch of worker ``w``'s ``attempt`` ended (an RPC thread; takes the lock)."""
        m = self.master
        with m.locked():
            m.bells.detach((w, attempt))
        if m.closed.is_set():
            return
        with m.locked():
            info = m.workers.get(w)
            if info is not None and info.attempt == attempt and self.counts(w, info):
                self.declare_dead(w, "its process exited (its connection to the driver closed)")

    def declare_dead(self, w: int, reason: str) -> None:
        m = self.master
        if w in m.dead or w in m.reports:
            return
        m.dead[w] = reason
        info = m.workers.get(w)
        m.event(f"worker {w} (executor {info.executor if info else '?'}) declared dead: {reason}")
        for hook in m.on_dead:
            threading.Thread(target=hook, args=(w, info.attempt if info else 0), name=f"on-dead-w{w}",
                             daemon=True).start()
        if m.rhino is not None:
            _, regrouped = m.rhino.worker_dead(w)
            self._regrouped(regrouped)
        if not m.replicated and m.rhino is None:
            m.fail(f"worker {w} lost ({reason}); the job can neither mask the failure (that needs "
                   "spark.replication.enabled) nor roll the lost partitions back (spark.replication.rhino.enabled)")
            return
        now = time.time()
        for replica, ww in list(m.placement.items()):
            if ww == w and not self.lose(replica, f"worker {w}", now):
                return
        self._replaced()

    def relaunched(self, req: Register) -> Registered:
        """Spark relaunched worker ``req.worker`` after its executor was lost: a standby."""
        m = self.master
        w, attempt = req.worker, req.attempt
        self.declare_dead(w, f"relaunched by Spark (attempt {attempt})")
        if m.failure:  # (also: neither replicated nor checkpointed, so the loss failed the job)
            return Registered("abort", m.failure or "job failed")
        m.workers[w] = WorkerInfo(w, attempt, req.executor, req.address, req.python_pid, time.monotonic(),
                                  standby=True)
        if m.rhino is not None:  # it can hold checkpoints and host restored replicas: alive again
            m.dead.pop(w, None)  # (not there when its last attempt had reported its end)
        m.event(f"worker {w} relaunched on executor {req.executor} as a standby: " + (
            "it joins replica groups and can host restored replicas" if m.rhino is not None else
            "its replicas' state is lost (restoring it needs spark.replication.rhino.enabled); the other "
            "replicas carry on"))
        if m.rhino is not None:
            self._regrouped(m.rhino.worker_alive(w))
            # now, not at the next liveness round: a lost replica waiting for a free worker
            # is restored here (its restore waits until this worker is ready)
            m.restores.start()
        return Registered("standby", "its replicas run elsewhere now" if m.rhino is not None
                          else "state of the lost replicas cannot be restored (no Rhino checkpoints)",
                          m.addresses(), m.instructions())

    def ends_the_job(self, w: int) -> bool:
        """Whether declaring ``w`` dead now would fail the job: it runs the last live replica of a
        partition with no checkpoint another live worker holds (or the job can neither mask nor
        roll back a loss)."""
        m = self.master
        if not m.replicated and m.rhino is None:
            return True

        def live_elsewhere(twin: ReplicaId) -> bool:
            where = m.placement.get(twin)
            return twin not in m.lost and where is not None and where != w and where not in m.dead

        for (t, p, r), ww in m.placement.items():
            if ww != w or any(live_elsewhere((t, p, rr)) for rr in range(m.plan.replicas) if rr != r):
                continue
            if m.rhino is None:
                return True
            cp = m.rhino.restore_point((t, p))
            if cp is None or not (cp.durable_file or cp.holders - m.rhino.dead - {w}):
                return True
        return False

    def lose(self, replica: ReplicaId, where: str, now: float) -> bool:
        """``replica`` is lost (``where``: on what, for the messages): a writer role it held passes to
        its twin; the last replica of a partition is rolled back, or the job fails at once when that
        cannot be done.  False if the job failed."""
        m = self.master
        t, p, r = replica
        m.lost.setdefault(replica, now)
        if m.handovers is not None:
            for text in m.handovers.replica_lost(replica):
                m.event(text)
        if all((t, p, rr) in m.lost for rr in range(m.plan.replicas)):
            name = m.plan.task(t).name
            lost = f"both replicas of {name}[{p}] are" if m.replicated else f"{name}[{p}] (one instance) is"
            if m.rhino is None:
                m.fail(f"{lost} lost ({where} was the last); rolling it back needs spark.replication.rhino.enabled")
                return False
            cp = m.rhino.restore_point((t, p))
            if cp is None:
                m.fail(f"{lost} lost ({where}) before a consistent set of checkpoints to roll it back "
                       "to was completed")
                return False
            if not cp.durable_file and not cp.holders - m.rhino.dead:
                m.fail(f"{lost} lost ({where}) and so is every worker holding the checkpoint {cp.checkpoint_id} "
                       f"it would be rolled back to: nothing is left to restore it from")
                return False
            m.event(f"{lost} lost: it is rolled back to its safe checkpoint")
            return True
        for text in m.outputs.to_twin(replica):
            m.event(text)
        return True

    def replica_cut_off(self, replica: ReplicaId, worker: int, why: str) -> None:
        """An upstream channel cut ``replica`` (on ``worker``) off by itself: it failed or lagged too
        far.  It is stopped there and replaced (restored from a checkpoint with Rhino, else the
        partition goes on with its twin alone, and the status shows it lost)."""
        m = self.master
        finished = worker in m.reports and m.reports[worker].status == "finished"
        if replica in m.lost or m.placement.get(replica) != worker or worker in m.dead or finished:
            return  # lost already, moved since, its worker known dead, or finished (it has everything)
        name = m.replica_label(*replica)
        m.event(f"{name} on worker {worker} replaced: an upstream cut it off ({why})")
        self.dropped[replica] = m.restores.attempts.get(replica, 0)
        if m.rhino is not None:
            self._regrouped(m.rhino.replica_lost(replica))
        if not self.lose(replica, f"{name} cut off", time.time()):
            return
        self._replaced()

    def replica_passed(self, replica: ReplicaId, pulse: int) -> bool:
        """Whether ``replica`` can no longer stop at ``pulse``: lost, or reported past it."""
        m = self.master
        if replica in m.lost or m.placement.get(replica) in m.dead:
            return True
        metrics = m.metrics.get(m.replica_label(*replica))
        return metrics is not None and metrics.pulse > pulse

    def _replaced(self) -> None:
        """Replicas were lost: settle a drain without them, restore them, tell everyone."""
        m = self.master
        m.drains.settle()  # a replica that had not reported is gone: the others decide
        if m.rhino is not None:
            m.restores.start()
        m.changed()
        m.ring_workers()

    def _regrouped(self, regrouped: dict) -> None:
        for (t, p), group in regrouped.items():
            self.master.event(f"replica group of {self.master.plan.task(t).name}[{p}] is now workers {group}")
