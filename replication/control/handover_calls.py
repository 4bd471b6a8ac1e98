"""The handover calls of a running job: move vnodes, rescale, rebalance, drain an executor,
replace an operator, and the measurements they plan from (docs/handover.md).

Each call checks what it is asked, then runs as handover jobs (:mod:`replication.control.handover_steps`);
the CLI's requests arrive through :meth:`HandoverCalls.move_request`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from replication.config import ReplicationConfig
from replication.control.handover_coordinator import HandoverCoordinator
from replication.control.handover_steps import HandoverSteps
from replication.control.master import JobFailedError, JobMaster
from replication.control.pulses import DriverPulses
from replication.handover_orders import format_vnodes, parse_strategy
from replication.messages import HandoverReport, HandoverRequest
from replication.plan import PhysicalPlan, TaskSpec, replica_name
from rhino_state import AllAtOnce, RoutingTable
from rhino_state.handover import Strategy
from transport.ids import ReplicaId


class HandoverCalls:
    """What a :class:`JobHandle` can move while its job runs."""

    def __init__(self, master: JobMaster, plan: PhysicalPlan, cfg: ReplicationConfig, placement: dict[ReplicaId, int],
                 pulses: Callable[[], DriverPulses | None], running: Callable[[], bool], job_name: str) -> None:
        self.master, self.plan, self.cfg, self.placement = master, plan, cfg, placement
        self.job_name = job_name
        self.steps = HandoverSteps(master, plan, cfg, placement, pulses, running, self.state_bytes_per_vnode)

    def move_vnodes(self, task: str, vnodes: Sequence[int], target: int, timeout: float = 60.0,
                    margin_s: float = 0.5, release_s: float | None = None, strategy: Strategy | None = None,
                    gap_s: float = 0.0) -> dict[str, Any]:
        """Move ``vnodes`` of the keyed ``task`` to its partition ``target`` while the job runs
        (docs/handover.md): every upstream reroutes them at a pulse about ``margin_s`` ahead, the
        origin cuts their state and sends it to the target, which processes their records from
        the pulse ``release_s`` later on (None: sized from the task's earlier steps, see
        :class:`replication.control.handover_timelines.ReleaseMargin`; 0.15 s before any).  Exactly once on both
        replicas.

        ``strategy``: ``AllAtOnce()`` (default: one step), ``Fluid()`` (one vnode per step) or
        ``Batched(n)`` (n per step), each step a handover of its own, ``gap_s`` apart so queues
        drain.  Returns the job's state and, per step, its id, pulses, release margin, state
        entries and bytes moved, duration, its participants' timeline (wall clock) and its
        phases (:func:`replication.control.handover_timelines.step_phases`); raises ValueError for a request it
        refuses and TimeoutError if it did not complete within ``timeout``."""
        tid = self._keyed_task(task)
        strategy = strategy or AllAtOnce()

        def submit(c: HandoverCoordinator, sizes: list[int] | None) -> int:  # (a retry: what is not there yet)
            left = [v for v in vnodes if c.manager.tables[tid].partition_of_vnode(v) != target] or list(vnodes)
            return c.start_job(tid, left, target, strategy, sizes)

        return self.steps.run_job(
            task, submit,
            f"vnodes {format_vnodes(vnodes)} to partition {target}", strategy, timeout, margin_s, release_s, gap_s)

    def rescale(self, task: str, parallelism: int, timeout: float = 120.0, margin_s: float = 0.5,
                release_s: float | None = None, strategy: Strategy | None = None, gap_s: float = 0.0) -> dict[str, Any]:
        """Run the keyed ``task`` on ``parallelism`` of its partitions while the job runs, up or
        down: the fewest vnodes move (balanced to within one vnode per partition), the partitions
        beyond ``parallelism`` end with none.  The task hosts ``max_parallelism`` partitions from
        the start (``KeyedStream.process(max_parallelism=...)``), the spare ones idle.  Moves and
        the report as in :meth:`move_vnodes`."""
        tid = self._keyed_task(task)
        strategy = strategy or AllAtOnce()
        return self.steps.run_job(
            task, lambda c, sizes: c.start_rescale(tid, parallelism, strategy, sizes), f"rescale to {parallelism} partitions",
            strategy, timeout, margin_s, release_s, gap_s)

    def rebalance(self, task: str, fraction: float = 0.5, target: int | None = None, window_s: float = 3.0,
                  timeout: float = 120.0, margin_s: float = 0.5, release_s: float | None = None,
                  strategy: Strategy | None = None, gap_s: float = 0.0) -> dict[str, Any]:
        """Relieve the busiest partition of the keyed ``task``: measure the records per vnode over
        ``window_s`` seconds, then move up to ``fraction`` of that partition's vnodes, heaviest
        first, to the least loaded partition (or ``target``), each only if it lowers the larger of
        the two loads.  The report of :meth:`move_vnodes` plus ``load_before`` and ``load_after``
        (records/s per partition, the latter as planned from the same measurement); no step when
        nothing would improve."""
        tid = self._keyed_task(task)
        strategy = strategy or AllAtOnce()
        if not 0 < window_s <= 600:
            raise ValueError(f"window_s must be in (0, 600] seconds, got {window_s!r}")
        before, started = self.routed_per_vnode(task), time.monotonic()
        time.sleep(window_s)
        after = self.routed_per_vnode(task)
        seconds = time.monotonic() - started
        load = [(a - b) / seconds for a, b in zip(after, before, strict=True)]
        if not any(load):
            raise ValueError(f"no record reached {task!r} in the last {window_s:g} s: no load to rebalance by")
        table_before = self.routing(task)
        report = self.steps.run_job(
            task, lambda c, sizes: c.start_rebalance(tid, load, fraction, target, strategy, sizes),
            f"rebalance of up to {fraction:.0%} of the busiest partition's vnodes", strategy, timeout, margin_s,
            release_s, gap_s)
        table_after = self.routing(task)
        for key, table in (("load_before", table_before), ("load_after", table_after)):
            report[key] = [round(sum(load[v] for v in table.vnodes_of(p)), 1) for p in range(table.parallelism)]
        return report

    def routed_per_vnode(self, task: str) -> list[int]:
        """Records routed to each vnode of the keyed ``task`` since the job started, as last
        reported by its upstream partitions (of each, the replica that counted more)."""
        spec = self._keyed_spec(task)
        num_vnodes = self.plan.routing[spec.id].num_vnodes
        snapshot = self.master.snapshot()
        total = [0] * num_vnodes
        for up in self.plan.tasks:
            if not any(e.dst_task == spec.id and e.partitioning == "hash" for e in up.outputs):
                continue
            for p in range(up.parallelism):
                counted = [m.routed.get(spec.id, ()) for r in range(self.plan.replicas)
                           if (m := snapshot.get(replica_name(up.name, p, r))) is not None]
                best = max(counted, key=sum, default=())
                for v, n in enumerate(best):
                    total[v] += n
        return total

    def state_bytes_per_vnode(self, task: str, timeout: float = 30.0) -> list[int]:
        """Keyed state bytes of each vnode of ``task`` now: every partition measures its RocksDB
        (one replica of each counts; a partition owns disjoint vnodes)."""
        spec = self._keyed_spec(task)
        master = self.master
        with master.locked():
            rid = master.measurements.request(spec.id)
            master.ring_workers()
            done = master.wait_for(lambda: all(
                                   any((m := master.metrics.get(replica_name(spec.name, p, r))) is not None and m.vnode_bytes[0] >= rid
                                   for r in range(self.plan.replicas)) for p in range(spec.parallelism)), timeout)
            reports = [max((m.vnode_bytes for r in range(self.plan.replicas)
                            if (m := master.metrics.get(replica_name(spec.name, p, r))) is not None),
                           key=lambda v: v[0]) for p in range(spec.parallelism)]
        if not done:
            raise TimeoutError(f"the partitions of {task!r} did not measure their state within {timeout:g}s")
        sizes = [0] * self.plan.routing[spec.id].num_vnodes
        for _, per_vnode in reports:
            for v, n in enumerate(per_vnode):
                sizes[v] += n
        return sizes

    def drain_executor(self, executor: str, timeout: float = 120.0) -> dict[str, Any]:
        """Move every replica off ``executor`` while the job runs (maintenance): its worker stops
        as if it had died, the twins go on serving (nothing stalls but the replicas' own catch-up),
        and each of its replicas is restored from its latest Rhino checkpoint on a member of its
        replica group, then caught up from its upstreams' backups.  Needs replication and Rhino.
        Returns where each replica went and how long it took; ValueError when draining would
        leave a partition without a live replica or nowhere to restore."""
        master = self.master
        if not self.plan.replicas > 1 or master.rhino is None:
            raise ValueError("draining an executor needs spark.replication.enabled (the twins serve meanwhile) and "
                             "spark.replication.rhino.enabled (the replicas are restored from their checkpoints)")
        started = time.monotonic()
        with master.locked():
            live = {w: i for w, i in master.workers.items() if w not in master.dead and not i.standby}
            w = next((w for w, i in live.items() if str(i.executor) == str(executor)), None)
            if w is None:
                raise ValueError(f"no live worker runs on executor {executor!r} (live: executors "
                                 f"{sorted(str(i.executor) for i in live.values())})")
            replicas = sorted(rid for rid, ww in self.placement.items() if ww == w)
            alone = [master.replica_label(t, p, r) for t, p, r in replicas
                     if any((t, p, rr) in master.lost for rr in range(self.plan.replicas) if rr != r)]
            if alone:
                raise ValueError(f"draining executor {executor} would leave {alone} without a live replica")
            if len(live) < 3:
                raise ValueError(f"draining executor {executor} leaves {len(live) - 1} live worker(s): two replicas of "
                                 "a partition and its checkpoints need at least two others")
            labels = {master.replica_label(t, p, r) for t, p, r in replicas}
            seen = len(master.recoveries)
            master.drained.add(w)  # (Spark reruns its task there as a standby: it may keep checkpoints)
            master.losses.declare_dead(w, f"drained by request (executor {executor})")
            master.status_changed()
            done = master.wait_for(lambda: master.failure is not None or labels <= {
                                   rec["replica"] for rec in master.recoveries[seen:]}, timeout)
            if master.failure is not None:
                raise JobFailedError(f"job failed while draining executor {executor}: {master.failure}")
            if not done:
                raise TimeoutError(f"draining executor {executor}: {sorted(labels - {r['replica'] for r in master.recoveries[seen:]})} "
                                   f"not restored and caught up within {timeout:g}s")
            restored = [{k: rec[k] for k in ("replica", "worker", "checkpoint_id", "recovery_s", "load_s")}
                        for rec in master.recoveries[seen:] if rec["replica"] in labels]
        return {"executor": str(executor), "worker": w, "replicas": sorted(labels), "restored": restored,
                "seconds": time.monotonic() - started}

    def replace_operator(self, task: str, operator: str, fn: Any, timeout: float = 60.0,
                         margin_s: float = 0.5) -> dict[str, Any]:
        """Replace the user function of ``operator`` (a map, filter, flat_map or keyed process
        operator of the processing task ``task``) by ``fn`` while the job runs: every replica of
        every partition switches right after the same pulse, about ``margin_s`` ahead, so both
        replicas of a partition run the old code on exactly the same elements.  A keyed process
        function keeps the operator's state.  ``fn`` is shipped with cloudpickle.  Returns the
        replacement's id, version, pulse, state and duration."""
        from pyspark import cloudpickle

        self._require_pulses("replacing an operator")
        spec = next((t for t in self.plan.tasks if t.name == task), None)
        if spec is None or spec.is_source:
            raise ValueError(f"{task!r} is not a processing task of job {self.job_name} (sources not supported)")
        node = next((n for n in spec.chain if n.name == operator), None)
        kinds = ("map", "filter", "flat_map", "process")
        if node is None or node.kind not in kinds:
            names = [n.name for n in spec.chain if n.kind in kinds]
            raise ValueError(f"task {task!r} has no operator {operator!r} with a user function (it has {names})")
        if node.kind == "process" and not hasattr(fn, "process"):
            raise ValueError(f"operator {operator!r} runs a KeyedProcessFunction: give an instance of one")
        if node.kind != "process" and not callable(fn):
            raise ValueError(f"operator {operator!r} runs a function: give a callable")
        payload = cloudpickle.dumps(fn)
        started = time.monotonic()
        with self.steps.window("an operator replacement", timeout) as coordinator:
            pulse, switch_at = self.steps.switch_pulse(margin_s)
            order = coordinator.start_replace(spec.id, operator, payload, switch_at)
            self.master.ring_workers()
            self.master.event(f"operator {operator!r} of {task}: version {order.version} from pulse {switch_at} on "
                              f"(now about {pulse})")
            hid = order.handover_id
            self.steps.await_handover(coordinator, hid, started + timeout, f"while replacing {operator!r}",
                                 f"replacement {hid} of {operator!r} not completed within {timeout}s")
            record = coordinator.record(hid)
        return {"handover_id": hid, "version": order.version, "switch_at": switch_at, "state": record.state.value,
                "reason": record.reason, "seconds": time.monotonic() - started}

    def move_request(self, req: HandoverRequest) -> HandoverReport:
        """A ``replication move``, ``rescale``, ``rebalance`` or ``drain`` from the CLI, with the
        strategy named ("all", "fluid" or "batched:N"): the report, or the error."""
        def timeout(default: float) -> float:
            return default if req.timeout is None else req.timeout

        try:
            if req.executor is not None:
                return HandoverReport(self.drain_executor(req.executor, timeout=timeout(120.0)))
            strategy = parse_strategy(req.strategy)
            if req.task is None:
                raise ValueError("a handover request names its task")
            if req.fraction is not None:
                return HandoverReport(self.rebalance(req.task, req.fraction, req.target,
                                                     3.0 if req.window is None else req.window,
                                                     timeout=timeout(120.0), strategy=strategy))
            if req.parallelism is not None:
                return HandoverReport(self.rescale(req.task, req.parallelism, timeout=timeout(120.0),
                                                   strategy=strategy))
            if req.vnodes is None or req.target is None:
                raise ValueError("a move names its vnodes and its target partition")
            return HandoverReport(self.move_vnodes(req.task, req.vnodes, req.target, timeout=timeout(60.0),
                                                   strategy=strategy))
        except (ValueError, TimeoutError, JobFailedError) as err:
            return HandoverReport(error=f"{type(err).__name__}: {err}")

    def routing(self, task: str) -> RoutingTable:
        """The vnode -> partition map of the keyed ``task`` now (after the handovers committed)."""
        spec = self._keyed_spec(task)
        with self.master.locked():
            if self.master.handovers is not None:
                return self.master.handovers.manager.tables[spec.id]
        return self.plan.routing[spec.id]

    def _require_pulses(self, what: str) -> None:
        if self.cfg.mode not in ("liverobin", "kazoo"):
            raise ValueError(f"{what} at runtime needs spark.replication.mode=liverobin or kazoo (pulses are the "
                             "switch points)")

    def _keyed_spec(self, task: str) -> TaskSpec:
        spec = next((t for t in self.plan.tasks if t.name == task), None)
        if spec is None or spec.id not in self.plan.routing:
            keyed = [t.name for t in self.plan.tasks if t.id in self.plan.routing]
            raise ValueError(f"{task!r} is not a keyed task of job {self.job_name} (keyed tasks: {keyed})")
        return spec

    def _keyed_task(self, task: str) -> int:
        """The id of the keyed ``task``, or ValueError naming why it cannot be handed over (yet)."""
        self._require_pulses("moving vnodes")
        return self._keyed_spec(task).id
