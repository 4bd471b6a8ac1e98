"""The job master: the driver's control-plane state and the workers' calls on it.

Its methods are the handlers of the workers' registrations, heartbeats, watches and reports
(called from RPC threads); everything they change is guarded by one condition, which callers in
the driver reach through :meth:`JobMaster.locked`, :meth:`JobMaster.wait_for` and
:meth:`JobMaster.pause`. A worker attempt's registration and end report are
:mod:`replication.control.attempts`; what is lost with a worker and who takes over is
:mod:`replication.control.losses`; Rhino's restores :mod:`replication.control.restores`; the
exactly-once writers :mod:`replication.control.outputs`; the liveness loop
:mod:`replication.control.watch`; the status file :mod:`replication.control.status_view`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from liverobin.positions import PositionBoard
from replication.config import ReplicationConfig
from replication.control.attempts import WorkerAttempts
from replication.control.bells import WorkerBells
from replication.control.drains import Drains
from replication.control.handover_coordinator import HandoverCoordinator
from replication.control.handover_service import HandoverService
from replication.control.liveness import WorkerInfo
from replication.control.losses import Losses
from replication.control.outputs import OutputRoles, OutputService
from replication.control.pulse_windows import PulseWindows
from replication.control.restores import Restores
from replication.control.savepoint_arming import SavepointArming
from replication.control.services import DriverServices
from replication.control.state_measurement import StateMeasurement
from replication.control.status_view import StatusFile
from replication.durability import DurableCheckpoints
from replication.messages import (
    Ack,
    Attach,
    HandoverReport,
    HandoverRequest,
    Heartbeat,
    Instructions,
    Register,
    Registered,
    SourcePositions,
    WorkerFinished,
)
from replication.metrics import InstanceMetrics
from replication.plan import PhysicalPlan, replica_name
from rhino_state.durable import DurableCut
from rhino_state.manager import ReplicationManager
from transport import rpc
from transport.ids import ReplicaId
from transport.security import RpcSecurity

log = logging.getLogger(__name__)


class JobFailedError(RuntimeError):
    """The job stopped because of an error (a failed instance, a lost worker, a start timeout)."""


class JobMaster:
    """Control plane state; its methods are the RPC handlers (called from RPC threads).

    A worker whose executor left the cluster, whose process exited, or that was silent for
    ``spark.replication.failureTimeout`` is declared dead (:class:`Losses`). With replication
    its replicas are cut off, the other replicas carry on, and a sink partition whose writer was
    there gets the other replica as writer with a higher epoch; without replication the job fails.
    """

    def __init__(self, plan: PhysicalPlan, placement: dict[ReplicaId, int], num_workers: int,
                 cfg: ReplicationConfig, job_name: str = "", app_id: str = "",
                 executor_ids: Callable[[], list[str]] | None = None, security: RpcSecurity | None = None) -> None:
        self.plan = plan
        self.placement = placement
        self.num_workers = num_workers
        self.replicated = plan.replicas > 1
        self.mode = cfg.mode
        self.failure_timeout_s = cfg.failure_timeout_ms / 1000
        self.job_name = job_name
        self.app_id = app_id
        self.executor_ids = executor_ids
        self.workers: dict[int, WorkerInfo] = {}
        self.dead: dict[int, str] = {}  # worker -> why its replicas are lost (until Spark relaunches it)
        self.lost: dict[ReplicaId, float] = {}  # replicas whose worker died, not restored: when (wall clock)
        self.command = "run"
        self.metrics: dict[str, InstanceMetrics] = {}
        self.reports: dict[int, WorkerFinished] = {}
        self.failure: str | None = None
        self.started_at: float | None = None
        self.events: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self.closed = threading.Event()
        self.bells = WorkerBells()
        self.status_file = StatusFile(job_name)
        # called (each in a thread of its own, outside the lock) with a worker declared dead and its attempt
        self.on_dead: list[Callable[[int, int], None]] = []
        # Rhino: replica groups and completed checkpoints (the manager moves restored replicas in the one
        # placement map the master and the handle share)
        self.rhino = ReplicationManager(
            placement, num_workers, cfg.rhino_replicas,
            channels=[(c.id, (c.src_task, c.src_partition), (c.dst_task, c.dst_partition)) for c in plan.channels],
        ) if cfg.rhino_enabled else None
        self.outputs = OutputRoles(plan, self.replicated or cfg.rhino_enabled, self.replica_label)
        self.restores = Restores(self, self.rhino)
        self.losses = Losses(self)
        self.worker_attempts = WorkerAttempts(self, cfg.start_timeout_ms / 1000)
        self.security = security or RpcSecurity.generate()
        self.server: rpc.RpcServer | None = None  # the job master's own server, once started
        self.rpc_refused: dict[str, int] = {}  # calls each worker's server refused ("worker N"), as reported
        self.metrics_url: str | None = None  # the Prometheus endpoint, set by the JobHandle that serves it
        self.handovers: HandoverCoordinator | None = None  # created by the first handover request
        self.durable: DurableCheckpoints | None = None  # spark.replication.checkpointDir: set by run()
        self.source_positions = PositionBoard()  # how far the sources read: where pulses go
        self.drained: set[int] = set()  # workers drained by request: no restored replica goes there
        # the control-plane services: each takes its part of every heartbeat and gives its word in the reply
        self.windows = PulseWindows(self)
        self.drains = Drains(self)
        self.savepoints = SavepointArming(self)
        self.measurements = StateMeasurement()
        self.services = DriverServices([OutputService(self), HandoverService(self), self.windows, self.drains,
                                        self.losses, self.savepoints, self.measurements])
        if self.rhino is not None:
            self.services.add(self.restores)
        self.control_address: str | None = None  # this gRPC server, for the CLI's requests (in the status file)
        self.heartbeat_port = 0  # the workers' heartbeat frames (on the control address's host; in the status file)
        self.mover: Callable[[HandoverRequest], HandoverReport] | None = None  # the JobHandle's, to the CLI

    # -- the lock and what waits on it -------------------------------------------------------------
    def locked(self) -> threading.Condition:
        """The master's condition, to hold while reading or changing its state (``with``)."""
        return self._cond

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None) -> Any:
        """Until ``predicate()`` (checked under the lock, which the caller may hold) or ``timeout``."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds`` for any change (the caller holds the lock)."""
        self._cond.wait(seconds)

    def status_changed(self) -> None:
        """What the status file shows changed: it is rewritten at the next round (nobody woken)."""
        self.status_file.dirty = True

    def changed(self) -> None:
        """Something callers wait for changed (caller holds the lock): wake them, and the status
        file is rewritten at the next round."""
        self.status_changed()
        self._cond.notify_all()

    def wake(self) -> None:
        """Something callers wait for changed, nothing the status file shows (caller holds the lock)."""
        self._cond.notify_all()

    def ring_workers(self) -> None:
        """Have every attached worker send its next heartbeat now (its reply says what changed)."""
        self.bells.ring_all()

    # -- reading ------------------------------------------------------------------------------------
    def replica_label(self, t: int, p: int, r: int) -> str:
        return replica_name(self.plan.task(t).name, p, r)

    def bystander(self, info: WorkerInfo) -> bool:
        """A relaunched worker that can host nothing (no Rhino checkpoints to restore from): it stays
        counted dead and is left alone until the job ends.  With Rhino a relaunched worker is live
        again, and declared dead like any other."""
        return info.standby and self.rhino is None

    def addresses(self) -> dict[int, str]:
        return {i: info.address for i, info in self.workers.items()}

    @property
    def sinks(self) -> dict[tuple[int, int, str], list[int]]:
        """The exactly-once outputs' roles (:class:`OutputRoles`)."""
        return self.outputs.roles

    @property
    def moves(self) -> dict[ReplicaId, tuple[int, str, dict[int, int], int]]:
        return self.restores.moves

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        return self.restores.recoveries

    @property
    def divergences(self) -> list[str]:
        return self.restores.digests.divergences

    @property
    def checkpoints_compared(self) -> int:
        return self.restores.digests.compared

    def snapshot(self) -> dict[str, InstanceMetrics]:
        with self._cond:
            return dict(self.metrics)

    def refused_calls(self) -> dict[str, int]:
        """Unauthenticated calls each server refused: the driver's and each worker's (as reported)."""
        with self._cond:
            return {"driver": self.server.refused if self.server is not None else 0, **self.rpc_refused}

    def all_done(self) -> bool:
        """Every worker has reported its end, or is dead with no relaunch running."""
        with self._cond:
            return all(w in self.reports or (w in self.dead and not self.bystander(self.workers[w]))
                       for w in range(self.num_workers) if w in self.workers) and len(self.workers) > 0

    # -- state changes --------------------------------------------------------------------------
    def event(self, text: str) -> None:
        """Log ``text`` as an event of the job (caller holds the lock)."""
        log.warning("%s", text)
        self.events.append((time.time(), text))
        self.status_changed()

    def note(self, text: str) -> None:
        """:meth:`event`, from a thread that does not hold the condition."""
        with self._cond:
            self.event(text)

    def code_versions(self) -> Mapping[tuple[int, str], int]:
        """(task id, operator) -> the version its function was replaced to at runtime, in this run
        or the runs it resumes."""
        return self.plan.code_versions if self.handovers is None else self.handovers.manager.code_versions

    def resume_outputs(self, committed: Mapping[str, list[int]]) -> None:
        """A resumed run: see :meth:`OutputRoles.resume`."""
        self.outputs.resume(committed)

    def resume_restore_points(self, cut: DurableCut) -> None:
        """A resumed run: see :meth:`Restores.resume_from`."""
        self.restores.resume_from(cut)

    def fail(self, reason: str) -> None:
        """The job fails with ``reason`` (the first reason given stays); every worker is told to stop."""
        with self._cond:
            if self.failure is None:
                self.failure = reason
                self.event(f"job failed: {reason}")
            self.command = "stop"
            self.ring_workers()
            self._cond.notify_all()

    def set_command(self, command: str) -> None:
        with self._cond:
            if self.command != "stop":
                self.command = command
                self.ring_workers()

    def declare_dead(self, w: int, reason: str) -> None:
        """Worker ``w`` is dead (see :meth:`Losses.declare_dead`)."""
        with self._cond:
            self.losses.declare_dead(w, reason)

    # -- handlers ---------------------------------------------------------------------------------
    def register(self, req: Register) -> Registered:
        """A worker's registration (:meth:`WorkerAttempts.register`)."""
        return self.worker_attempts.register(req)

    def heartbeat(self, req: Heartbeat) -> Instructions:
        w, attempt = req.worker, req.attempt
        arrived = time.monotonic()  # (before the lock: waiting for it is this driver's delay, not the worker's)
        with self._cond:
            info = self.workers.get(w)
            if info is None or info.attempt != attempt or (w in self.dead and not self.bystander(info)):
                return Instructions("evicted")  # declared dead while unresponsive, or an old attempt
            info.late_beats.heard(arrived, arrived - info.last_seen, self.failure_timeout_s)
            info.last_seen = max(info.last_seen, arrived)
            info.heard = True
            if req.rpc_refused != self.rpc_refused.get(f"worker {w}", 0):
                self.rpc_refused[f"worker {w}"] = req.rpc_refused
                self.status_changed()
            if req.metrics is not None:
                self.metrics.update(req.metrics)
                self.changed()  # e.g. state_bytes_per_vnode waits for the replicas' measurements
                if self.restores.catching_up:
                    self.restores.check_caught_up()
            self.services.take_reports(w, req.parts)
            if req.errors:
                self.fail("; ".join(req.errors))
            view = self.instructions()
            self.bells.replied(req, view)
            return view

    def instructions(self) -> Instructions:
        """What every worker is told now: the command, dead and finished workers, and each
        service's word (caller holds the lock)."""
        return Instructions(self.command, list(self.dead),
                            [w for w, r in self.reports.items() if r.status == "finished"],
                            self.services.replies())

    def report_positions(self, req: SourcePositions) -> None:
        """A worker's stream of its sources' positions (an RPC handler; no lock of the master)."""
        self.source_positions.update(req.positions)

    def attach(self, req: Attach) -> rpc.Watched:
        """A worker attempt's watch (an RPC handler): when it ends before the attempt reported its
        end, the worker's process exited or lost its connection to this driver.  Its bell has the
        worker beat at once when something changed for it."""
        with self._cond:
            bell = self.bells.attach((req.worker, req.attempt))
        return rpc.Watched(lambda: self.losses.watch_ended(req.worker, req.attempt), bell)

    def finished(self, req: WorkerFinished) -> Ack:
        """A worker attempt's end report (:meth:`WorkerAttempts.finished`)."""
        return self.worker_attempts.finished(req)

    def move(self, req: HandoverRequest) -> HandoverReport:
        """The CLI's ``replication move`` (an RPC handler): the answer of the job's handle."""
        if self.mover is None:
            return HandoverReport(error="the job is not ready for handovers yet")
        return self.mover(req)

    # -- the status file ----------------------------------------------------------------------------
    def end_watching(self) -> None:
        """The job is over: stop the liveness loop; the watches that end as the server stops then
        say nothing about the workers."""
        self.closed.set()

    def close(self, state: str) -> None:
        self.end_watching()
        with self._cond:
            self.write_status(state)

    def write_status(self, state: str = "running") -> None:
        """Write the status file now (caller holds the lock)."""
        self.status_file.write(self, state)
