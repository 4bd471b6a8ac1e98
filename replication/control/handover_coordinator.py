"""The driver's side of a handover: the coordinator that turns a request into steps, instructs
their participants through the heartbeat replies and collects their acks
(:class:`rhino_state.handover_manager.HandoverManager` decides; this is its I/O edge); each step's
timeline and the release margin a task's steps learn are :mod:`.handover_timelines`
(docs/handover.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from replication.control.handover_timelines import TIMELINES, ReleaseMargin, StepTimes
from replication.handover_orders import CodeOrder, HandoverOrder, format_vnodes
from replication.heartbeat_parts import ReplicaAck
from rhino_state import (
    AckKind,
    AckOutcome,
    AllAtOnce,
    HandoverAck,
    HandoverManager,
    HandoverRecord,
    HandoverState,
    JobState,
    MoveRequest,
    RebalanceRequest,
    ReplaceOperatorRequest,
    RescaleRequest,
)
from rhino_state.handover import Strategy
from rhino_state.keys import RoutingTable
from transport.ids import PartitionId, ReplicaId


def hash_upstreams(plan: Any) -> dict[int, list[PartitionId]]:
    """Keyed task -> the partitions that send it records by key (its handovers' upstreams)."""
    upstreams: dict[int, list[PartitionId]] = {t: [] for t in plan.routing}
    for task in plan.tasks:
        for edge in task.outputs:
            if edge.partitioning == "hash" and edge.dst_task in upstreams:
                upstreams[edge.dst_task] += [(task.id, p) for p in range(task.parallelism)]
    return upstreams


class HandoverCoordinator:
    """Driver side: the :class:`HandoverManager`, the orders every worker is shown, and the acks the
    workers send back (the job master calls it under its lock; no I/O here)."""

    def __init__(self, plan: Any, retain: bool = False, max_bytes_in_flight: int | None = None,
                 period_s: float = 0.01) -> None:
        self.plan = plan
        self.manager = HandoverManager(plan.routing, hash_upstreams(plan), replicas=plan.replicas,
                                       max_bytes_in_flight=max_bytes_in_flight)
        self.manager.code_versions.update(plan.code_versions)  # a resumed run's replaced operators
        self.orders: dict[int, HandoverOrder | CodeOrder] = {}
        self._cut_entries: dict[int, dict[int, int]] = {}  # handover id -> origin partition -> entries cut
        self._deferred: list[HandoverAck] = []  # LOADED acks that came before the release was placed
        # Rhino (``retain``): completed orders, kept until every participant's restore point is past
        # them, for replicas restored from an earlier checkpoint to replay them (and the origins keep
        # their cuts as long as the order is listed here)
        self.retain = retain
        self.history: dict[int, HandoverOrder | CodeOrder] = {}
        # handover id -> participant instance -> the last checkpoint it had taken when it acted
        # (switched, cut, loaded): a restore point past it includes the action
        self._acted_after: dict[int, dict[PartitionId, int]] = {}
        self.times = StepTimes()  # each step's timeline and amounts, from the acks
        self.period_s = period_s
        self._margins: dict[int, ReleaseMargin] = {}  # per keyed task
        self._pruned: dict[int, HandoverRecord] = {}  # records the manager let go, for the driver's reports

    def start_move(self, task: int, vnodes: Iterable[int], target: int, switch_at: int,
                   release_at: int) -> HandoverOrder:
        """Plan and instruct the move of ``vnodes`` of ``task`` to partition ``target`` in one step
        at pulse ``switch_at`` (the targets release at ``release_at``); ValueError for a bad request."""
        job = self.start_job(task, vnodes, target, AllAtOnce())
        order = self.instruct_next(job, switch_at, release_at)
        if order is None:
            raise ValueError(f"task {task}: another handover is not committed yet, or a participant is lost")
        return order

    def start_job(self, task: int, vnodes: Iterable[int], target: int, strategy: Strategy,
                  sizes: Sequence[int] | None = None) -> int:
        """Plan the move of ``vnodes`` of ``task`` to ``target`` in steps (``strategy``; ``sizes``:
        state bytes per vnode, for a byte cap); its job id."""
        return self.manager.submit(MoveRequest(task, tuple(vnodes), target), strategy, sizes=sizes).job_id

    def start_rescale(self, task: int, parallelism: int, strategy: Strategy,
                      sizes: Sequence[int] | None = None) -> int:
        """Plan taking ``task`` to ``parallelism`` partitions owning vnodes (the fewest moves; the
        partitions beyond it end with none), in steps; its job id.  ValueError beyond the
        partitions the task hosts."""
        hosted = self.plan.task(task).parallelism
        if not isinstance(parallelism, int) or not 1 <= parallelism <= hosted:
            raise ValueError(f"task {self.plan.task(task).name!r} hosts {hosted} partitions (its max_parallelism): "
                             f"it can run on 1 to {hosted} of them, not {parallelism!r}")
        return self.manager.submit(RescaleRequest(task, parallelism), strategy, sizes=sizes).job_id

    def start_rebalance(self, task: int, load_per_vnode: Sequence[float], fraction: float, target: int | None,
                        strategy: Strategy, sizes: Sequence[int] | None = None) -> int:
        """Plan moving up to ``fraction`` of the busiest partition's vnodes, heaviest first, to the
        least loaded partition (or ``target``) as long as each move lowers the larger load; its job
        id (a job with no step when nothing would improve)."""
        return self.manager.submit(RebalanceRequest(task, tuple(load_per_vnode), fraction, target), strategy,
                                   sizes=sizes).job_id

    def moved_entries(self, handover_id: int) -> int:
        """State entries the origins of ``handover_id`` cut (one replica of each origin counted)."""
        return sum(self._cut_entries.get(handover_id, {}).values())

    def instruct_next(self, job_id: int, switch_at: int, release_at: int) -> HandoverOrder | None:
        """Instruct the job's next step at these pulses (None: not now, e.g. the previous step is
        not completed)."""
        if release_at < switch_at + 2:
            raise ValueError(f"release pulse {release_at} must be at least 2 after the switch {switch_at}")
        instruction = self.manager.instruct_next(job_id, switch_at)
        if instruction is None:
            return None
        order = HandoverOrder(instruction.handover_id, instruction.epoch, instruction.task, instruction.table,
                              instruction.moves, switch_at, release_at, instruction.participants["upstream"])
        self.orders[order.handover_id] = order
        return order

    def job_state(self, job_id: int) -> JobState:
        return self.manager.job(job_id).state

    def start_replace(self, task: int, operator: str, fn: bytes, switch_at: int) -> CodeOrder:
        """Instruct every replica of ``task`` to run ``fn`` (cloudpickled) as ``operator`` from pulse
        ``switch_at`` on (the next version of that operator)."""
        version = self.manager.code_versions.get((task, operator), 0) + 1
        instruction = self.manager.replace_operator(ReplaceOperatorRequest(task, operator, version), switch_at,
                                                    partitions=self.plan.task(task).parallelism)
        order = CodeOrder(instruction.handover_id, task, operator, version, fn, switch_at)
        self.orders[order.handover_id] = order
        return order

    def on_acks(self, acks: Iterable[ReplicaAck], now: float | None = None) -> list[str]:
        """Feed the acks of one heartbeat (received at wall-clock ``now``); commits, releases and
        completions follow.  Returns what happened, for the job's event log."""
        events: list[str] = []
        now = time.time() if now is None else now
        for wired in acks:
            hid, kind, replica = wired.handover_id, wired.kind, tuple(wired.replica)
            ack = HandoverAck(hid, wired.epoch, replica, AckKind(kind), wired.attempt, wired.digest)
            if kind in _ACTIONS:  # its checkpoints after this one include what it did
                acted = self._acted_after.setdefault(hid, {})
                acted[replica[:2]] = max(wired.checkpoint, acted.get(replica[:2], wired.checkpoint))
                if wired.times and hid in self.orders:
                    self.times.note(hid, kind, replica[:2], wired.times)
            rec = self.manager.records.get(hid)
            if ack.kind is AckKind.LOADED and rec is not None and not rec.released:
                self._deferred.append(ack)
                continue
            diverged = len(self.manager.divergences)
            outcome = self.manager.ack(ack)
            for h, (task, partition), (first, other) in self.manager.divergences[diverged:]:
                events.append(f"handover {h}: the replicas of {self.plan.task(task).name}[{partition}] cut "
                              f"different state (digests {first[:12]} and {other[:12]})")
            if ack.kind is AckKind.CUT and outcome is AckOutcome.ACCEPTED:
                if hid not in self._cut_entries:
                    for old in sorted(self._cut_entries)[:-TIMELINES]:  # (kept as long as timelines)
                        del self._cut_entries[old]
                cuts = self._cut_entries.setdefault(hid, {})
                cuts[replica[1]] = max(cuts.get(replica[1], 0), wired.entries)
            events += self._advance(hid, now)
        return events

    def release_margin(self, task: int) -> ReleaseMargin:
        """The release margin of ``task``'s steps, learnt from its completed ones."""
        return self._margins.setdefault(task, ReleaseMargin(self.period_s))

    def next_release_s(self, job_id: int, sizes: Sequence[int] | None = None) -> float:
        """The release margin for the job's next step (``sizes``: measured bytes per vnode)."""
        job = self.manager.job(job_id)
        if job.next_index >= len(job.steps):
            return self.release_margin(job.task).default_s
        step = job.steps[job.next_index]
        planned = sum(sizes[v] for v in step.vnodes) if sizes else None
        return self.release_margin(job.task).margin_s(len(step.vnodes), planned)

    def _advance(self, hid: int, now: float) -> list[str]:
        rec = self.manager.records.get(hid)
        order = self.orders.get(hid)
        if rec is None or order is None:
            return []
        name = self.plan.task(order.task).name
        events = []
        if rec.state is HandoverState.ARMED:
            self.times.stamp(hid, "committed", now)
            self.manager.commit(hid)
            self.orders[hid] = order = replace(order, committed=True)
            release = f", release at {order.release_at}" if isinstance(order, HandoverOrder) else ""
            events.append(f"handover {hid} of {name}: every participant armed; committed (switch at pulse "
                          f"{order.switch_at}{release})")
        if rec.state is HandoverState.ABORTED and not order.cancelled:
            self.orders[hid] = replace(order, cancelled=True)
            events.append(f"handover {hid} of {name} cancelled: {rec.reason}")
        if isinstance(order, CodeOrder):
            if rec.state is HandoverState.COMPLETED and hid in self.orders:
                self.times.stamp(hid, "completed", now)
                self._completed(hid)
                events.append(f"operator {order.operator!r} of {name} replaced by version {order.version} on every "
                              f"replica, from pulse {order.switch_at} on")
            return events
        if _ORDER_OF[rec.state] >= _ORDER_OF[HandoverState.CUT] and rec.state is not HandoverState.ABORTED \
                and not rec.released:
            self.manager.release(hid)
            events.append(f"handover {hid} of {name}: the origins cut {self.moved_entries(hid)} state entries")
            deferred, self._deferred = [a for a in self._deferred if a.handover_id == hid], \
                [a for a in self._deferred if a.handover_id != hid]
            for ack in deferred:
                self.manager.ack(ack)
        if rec.state is HandoverState.COMPLETED and hid in self.orders:
            self.times.stamp(hid, "completed", now)
            self._completed(hid)
            times = self.times.timeline(hid)
            if times["switched"] is not None and times["arrived"] is not None:
                self.release_margin(order.task).observe(len(order.moves), self.times.moved_bytes(hid),
                                                        times["arrived"] - times["switched"])
            events.append(f"handover {hid} of {name} completed: vnodes "
                          f"{format_vnodes(m.vnode for m in order.moves)} now on partition(s) {sorted(order.targets)}")
        return events

    def _completed(self, hid: int) -> None:
        order = self.orders.pop(hid)
        if self.retain:
            self.history[hid] = order

    def replica_restored(self, replica: ReplicaId, attempt: int) -> list[dict[str, Any]]:
        """``replica`` is restored (incarnation ``attempt``, its acks carry it): the committed
        orders it takes part in, completed ones still retained first, to arm before it replays
        (those its checkpoint already includes it skips)."""
        self.manager.replica_restored(replica, attempt)
        inst = replica[:2]
        orders = [*self.history.values(), *(o for o in self.orders.values() if o.committed and not o.cancelled)]
        return [o.to_wire() for o in sorted(orders, key=lambda o: o.handover_id) if inst in self._participants(o)]

    def _participants(self, order: HandoverOrder | CodeOrder) -> frozenset[PartitionId]:
        """The instances whose replicas act on ``order``: upstreams, origins and targets, or every
        partition of the task whose operator is replaced."""
        if isinstance(order, CodeOrder):
            return frozenset((order.task, p) for p in range(self.plan.task(order.task).parallelism))
        return order.upstreams | {(order.task, p) for p in order.origins | order.targets}

    def retained(self) -> list[int]:
        """The handovers whose cuts the origins keep: those in progress and those retained."""
        return sorted([*self.orders, *self.history])

    def cut_is_clean(self, ids: Mapping[PartitionId, int]) -> bool:
        """Whether checkpoints ``ids`` (a durable cut's) lie past every handover: none committed is
        under way, and each participant of every retained one took its checkpoint after it acted on
        it (as :meth:`prune` counts).  A run resumed from them arms no handover again."""
        if any(o.committed and not o.cancelled for o in self.orders.values()):
            return False
        for hid, order in self.history.items():
            acted = self._acted_after.get(hid, {})
            if not all(inst in acted and inst in ids and ids[inst] > acted[inst] for inst in self._participants(order)):
                return False
        return True

    def tables(self) -> dict[int, RoutingTable]:
        """Each keyed task's routing table, with the handovers committed so far."""
        return dict(self.manager.tables)

    def prune(self, restore_point: Callable[[PartitionId], int | None]) -> list[int]:
        """Forget the retained orders every participant's restore point (the id of the checkpoint
        a replica would be restored from) is past: a checkpoint taken after the participant acted
        on the order (switched, cut, loaded).  Checkpoint ids are per instance (pulses, order
        numbers or record counts), so each is compared with the last one that instance had taken
        when it acted.  Returns their ids."""
        gone = []
        for hid, order in sorted(self.history.items()):
            acted = self._acted_after.get(hid, {})
            if all(inst in acted and (cp := restore_point(inst)) is not None and cp > acted[inst]
                   for inst in self._participants(order)):
                gone.append(hid)
                del self.history[hid]
                self._acted_after.pop(hid, None)
        before = dict(self.manager.records)
        for task in self.manager.tables:
            left = [o.epoch for o in [*self.orders.values(), *self.history.values()]
                    if isinstance(o, HandoverOrder) and o.task == task]
            self.manager.prune(task, min(left) - 1 if left else self.manager.tables[task].epoch)
        self._pruned.update((h, r) for h, r in before.items() if h not in self.manager.records)
        for old in sorted(self._pruned)[:-TIMELINES]:
            del self._pruned[old]
        return gone

    def replica_lost(self, replica: ReplicaId) -> list[str]:
        """A replica's worker died (or it was cut off): handovers not committed yet are cancelled
        (clean); committed ones go on without it, so one it alone held back advances now (its
        release is placed, or it completes and leaves :attr:`orders`)."""
        events = []
        for cancel in self.manager.replica_lost(replica):
            order = self.orders.get(cancel.handover_id)
            if order is not None and not order.cancelled:
                self.orders[cancel.handover_id] = replace(order, cancelled=True)
                events.append(f"handover {cancel.handover_id} cancelled: {cancel.reason}")
        now = time.time()
        for hid in list(self.orders):
            events += self._advance(hid, now)
        return events

    def forget_cancelled(self, passed: Callable[[ReplicaId, int], bool]) -> list[int]:
        """Stop showing the cancelled orders no replica can still wait for: ``passed(replica, h)``
        says every participant replica is past pulse ``h``, the order's last position (a target's
        release; a replacement's switch), or lost (a restored replica arms committed orders only).
        A replica that armed one waits at its position for the word, so until then it stays in
        :meth:`view`.  Returns their ids."""
        gone = []
        for hid, order in list(self.orders.items()):
            if not order.cancelled:
                continue
            last = order.release_at if isinstance(order, HandoverOrder) else order.switch_at
            if all(passed((*inst, r), last) for inst in self._participants(order) for r in range(self.plan.replicas)):
                del self.orders[hid]
                gone.append(hid)
        return gone

    def rolling_forward(self) -> list[int]:
        """The handovers committed and not completed (a completed order leaves :attr:`orders`): they
        only roll forward, and need pulses until they complete (a KaZoo pulse window stays open)."""
        return sorted(h for h, o in self.orders.items() if o.committed and not o.cancelled)

    def give_up(self, hid: int, reason: str) -> list[str]:
        """The driver stops waiting for handover ``hid``: not committed yet, it is cancelled
        (clean: nobody switched); committed, it rolls forward (nothing to do).  The events."""
        rec = self.manager.records.get(hid)
        if rec is None or hid not in self.orders or rec.state not in (HandoverState.INSTRUCTED, HandoverState.ARMED):
            return []
        self.manager.abort(hid, reason)
        return self._advance(hid, time.time())  # the order is shown cancelled, as for a LATE ack

    def record(self, hid: int) -> HandoverRecord:
        """The manager's record of ``hid``, also once the manager pruned it (the last
        :data:`TIMELINES` pruned ones): the driver may look at a step after checkpoints let it go."""
        rec = self.manager.records.get(hid) or self._pruned.get(hid)
        return rec if rec is not None else self.manager.record(hid)

    def state(self, hid: int) -> HandoverState:
        return self.record(hid).state

    def view(self) -> list[dict[str, Any]]:
        """What every heartbeat reply carries: the handovers not completed (cancelled ones too)."""
        return [o.to_wire() for o in self.orders.values()]


_ORDER_OF = {s: i for i, s in enumerate(HandoverState)}


_ACTIONS = ("switched", "cut", "loaded")  # acks of a participant's action (a replacement's too: switched)
