"""Processing instances: a partition of a task fed by input channels.

A :class:`ProcessingInstance` receives batches on its input channels (dedup by seq, bounded
queues: :mod:`.intake`), consumes them in the orderer's order (arrival, LiveRobin or KaZoo),
drives watermarks (minimum over channels) and runs its operator chain, until END on every input
or stop.  Handovers and checkpoints happen at pulses, where both replicas are at the same point
of their input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kazoo_leader.orderer import KazooOrderer
from kazoo_leader.orders import CLOCK_CHANNEL, ApplierState
from kazoo_leader.segments import SegmentedLog
from liverobin import LiveRobinOrderer
from merge import ArrivalOrderer, InputQueues
from replication.plan import PhysicalPlan, TaskSpec
from replication.runtime.elements import DATA, END, MAX_WATERMARK, MIN_WATERMARK, PULSE, WATERMARK
from replication.runtime.handover_cuts import vnode_bytes
from replication.runtime.instance import IDLE_WAIT_S, PartitionInstance
from replication.runtime.intake import InputIntake
from replication.runtime.pulse_actions import PulseActions
from rhino_state import encode_key, key_group

# KaZoo, keyed functions: with no input, the leader writes an order carrying only its clock this
# often (as LiveRobin's idle pulses), so processing-time timers and TTL go on firing
CLOCK_TICK_S = 1.0


class ProcessingInstance(PulseActions, PartitionInstance):
    """Consumes its input channels in its orderer's order and runs its operator chain."""

    def __init__(self, worker: Any, task: TaskSpec, partition: int, replica: int, plan: PhysicalPlan,
                 restoring: bool = False) -> None:
        super().__init__(worker, task, partition, replica, plan, restoring)
        self.channels = [c.id for c in plan.input_channels(task.id, partition)]
        self._second_input = plan.second_input_channels(task.id, partition)  # a two-input function's
        capacity = self.cfg.channel_queue_capacity
        order_log = plan.order_logs.get((task.id, partition)) if self.cfg.mode == "kazoo" else None
        self._candidate: Any = None
        self._elements_ordered = 0  # consumed in the orderer's order
        if self.cfg.mode == "liverobin" or order_log is not None:
            self.queues = InputQueues(self.channels, max(4, capacity // len(self.channels)), per_channel=True)
        else:
            self.queues = InputQueues(self.channels, capacity)
        # what the input channels deliver (peers' and local senders' threads); KaZoo: before the
        # orderer, which hands it the order-log reader
        self.intake = InputIntake(self.name, self.channels, self.queues, self.metrics)
        if order_log is not None:
            self.orderer: Any = self._kazoo(order_log)
        elif self.cfg.mode == "liverobin":
            self.orderer = LiveRobinOrderer(self.queues, self.checkpoint_every)
        else:
            self.orderer = ArrivalOrderer(self.queues)
        self._consumed = dict.fromkeys(self.channels, 0)  # per channel: elements consumed (= next seq)
        self._channel_wm = {c: MIN_WATERMARK for c in self.channels}
        self._open_channels = set(self.channels)
        self._current_wm = MIN_WATERMARK
        self._forwarded_pulse = 0
        self._aligned = self.cfg.mode == "kazoo"  # pulses (of handover windows) forwarded once aligned
        self._last_counted = 0  # the last count-based checkpoint (its id: elements consumed)
        self._channel_pulse = dict.fromkeys(self.channels, 0)

    def restore_from(self, meta: Any, state_dir: Path) -> dict[str, Any]:
        rt = super().restore_from(meta, state_dir)
        self.intake.resume(rt["positions"])  # the upstreams replay from here
        self._consumed = dict(rt["positions"])
        self._last_counted = meta.checkpoint_id
        self._channel_wm = dict(rt["channel_wm"])
        self._open_channels = set(rt["open"])
        self._current_wm = self.metrics.watermark = rt["current_wm"]
        self._forwarded_pulse = self.metrics.pulse = rt["pulse"]
        # KaZoo forwards a pulse once every channel delivered it: where each channel was
        self._channel_pulse.update(rt.get("channel_pulse", {}))
        if isinstance(self.orderer, KazooOrderer):
            state = rt["orderer"]
            if state is None:  # an earlier build's checkpoint, taken with no order log: a log from its start
                state = ApplierState(0, -1, None, -1, dict(rt["positions"]),
                                     sorted(set(self.channels) - self._open_channels))
            self.orderer.restore(state)
            log_ = self.intake.order_reader = self.worker.feeds.own_order_log()  # (the shared one started long ago)
            self._publish_order = log_.register(
                self._order_log, state.offset + 1, on_records=self.orderer.on_records,
                on_failed=self.orderer.on_publish_failed, on_error=self.orderer.on_error,
                pending=self._input_pending)
            log_.start()
        elif isinstance(self.orderer, LiveRobinOrderer):
            self.orderer.merge.restore(rt["orderer"])
        return rt

    def _kazoo(self, order_log: SegmentedLog) -> KazooOrderer:
        """KaZoo: this partition's order log through the worker's reader/writer, its election in
        the worker's ZooKeeper session (entered when the instance starts)."""
        cfg = self.cfg

        def publish_while_leader(order: Any) -> None:
            # the election drops the epoch the moment ZooKeeper is in doubt, before its callback
            # reaches the orderer: nothing goes out under an epoch that may have been superseded
            if self._candidate is not None and self._candidate.epoch == order.epoch:
                self._publish_order(order)

        orderer = KazooOrderer(
            self.queues, publish_while_leader, max_batch=cfg.kazoo_max_batch, min_batch=cfg.kazoo_min_batch,
            idle_timeout_s=cfg.kazoo_idle_timeout_ms / 1000, max_in_flight=cfg.kazoo_max_in_flight,
            pipeline_below=cfg.kazoo_pipeline_below,
            hold_limit=max(4 * cfg.channel_batch_size, 2 * cfg.kazoo_max_batch),
            checkpoint_every=self.checkpoint_every, checkpoint_mark=self._record_enters_new_interval,
            clock_tick_s=CLOCK_TICK_S if self.task.keyed_functions else 0.0, name=self.name)
        self._order_log = order_log
        if not self.restoring:  # (a restored replica reads the log from its checkpoint on: restore_from)
            reader = self.intake.order_reader = self.worker.feeds.order_log()
            self._publish_order = reader.register(
                order_log, 0, on_records=orderer.on_records, on_failed=orderer.on_publish_failed,
                on_error=orderer.on_error, pending=self._input_pending)
        self._election_path = f"{self.worker.boot.election_root}/t{self.task.id}p{self.partition}"
        self.worker.feeds.election()
        return orderer

    @property
    def processing_time(self) -> bool:
        """LiveRobin's pulses, or the clocks of this partition's KaZoo orders (keyed functions)."""
        kazoo = isinstance(self.orderer, KazooOrderer) and self.orderer.proposer.clock_tick_s > 0
        return kazoo or super().processing_time

    def request_stop(self) -> None:
        super().request_stop()
        self.queues.close()

    def wake(self) -> None:
        self.queues.wake()

    def run(self) -> bool:
        kazoo = self.orderer if isinstance(self.orderer, KazooOrderer) else None
        if kazoo is not None:
            self._candidate = self.worker.feeds.election().candidate(self._election_path, kazoo.on_leadership)
        drained = False
        try:
            drained = self._run(kazoo)
            return drained
        finally:
            # a replica that consumed everything keeps its leadership until the worker ends: all is
            # ordered, and handing it over would only make the other replica write a useless fence
            if self._candidate is not None and not drained:
                self._candidate.withdraw()

    def _run(self, kazoo: KazooOrderer | None) -> bool:
        if self.cfg.rhino_enabled and self.restored is None:
            # at once, before any input (both replicas alike): every partition is restorable from its
            # first seconds on, also one that gets little or no input
            self._checkpoint(0, self._start_orderer_state(kazoo))
        while self._open_channels:
            if self.stop_requested.is_set():
                return False
            if self.pending_control is not None:
                self.poll_control()
            if self.measure_request > self.metrics.vnode_bytes[0] and self.handovers is not None:
                self.metrics.vnode_bytes = (self.measure_request, vnode_bytes(
                    self.state_backend(), self.num_key_groups, self.handovers.num_vnodes))
            runs = self._next_runs()
            self._elements_ordered += sum(len(elements) for channel, elements in runs if channel != CLOCK_CHANNEL)
            self.metrics.queue_batches = self.queues.size()
            if kazoo is not None:
                self._kazoo_metrics(kazoo)
            if not runs:
                self.idle()
            for channel, elements in runs:
                if channel == CLOCK_CHANNEL:  # the leader's clock when it wrote the next order
                    for _, t in elements:
                        self.chain.on_processing_time(t)
                elif self.count_every:
                    self._consume_counted(channel, elements)
                else:
                    self._consume(channel, elements)
            if kazoo is not None and kazoo.applier.checkpoint_due is not None:
                state = kazoo.applier.take_checkpoint()  # every element of that order record is consumed
                if self.handovers is None or not self.handovers.holds_records():  # (it would lose them)
                    self._checkpoint(state.number, state)
        return True

    def _next_runs(self) -> list[tuple[int, list]]:
        """What the orderer has consumable now, else what comes within the idle wait; with
        ``channel.flushWhenIdle``, the open output batches leave before that wait."""
        if self.cfg.channel_flush_when_idle:
            runs = self.orderer.next_runs(0)
            if runs:
                return runs
            self.flush_outputs()
        return self.orderer.next_runs(self.idle_wait(IDLE_WAIT_S))

    def _input_pending(self) -> bool:
        """Whether input was delivered that the orderer has not handed out yet (any thread; read
        in this order, a delivery not yet counted is seen by the reader through its wake-up)."""
        ordered = self._elements_ordered
        return self.intake.elements_in > ordered

    def _start_orderer_state(self, kazoo: KazooOrderer | None) -> Any:
        """The orderer's state before any input, for the first checkpoint."""
        if kazoo is not None:
            return kazoo.applier.start_state(0)
        if isinstance(self.orderer, LiveRobinOrderer):
            return self.orderer.merge.state()
        return None

    def _consume_counted(self, channel: int, elements: list) -> None:
        """One input channel, no orderer state: checkpoint every ``count_every`` elements consumed,
        and before a record whose event time enters a new ``rhino.checkpointInterval`` (both
        replicas at the same positions, with the same ids: either may ship them)."""
        while elements:
            done = self._consumed[channel]
            due = (done // self.count_every + 1) * self.count_every
            cut = next((i for i, el in enumerate(elements[:due - done]) if el[0] == DATA and self._new_interval(el[3])),
                       None)
            if cut is not None:  # the records before it, then a checkpoint (unless one is there already)
                self._consume(channel, elements[:cut])
                elements = elements[cut:]
                self._checkpoint_counted(self._consumed[channel])
                self._consume(channel, elements[:1])
                elements = elements[1:]
                continue
            head, elements = elements[:due - done], elements[due - done:]
            self._consume(channel, head)
            if self._consumed[channel] == due:
                self._checkpoint_counted(due)

    def _checkpoint_counted(self, position: int) -> None:
        if position > self._last_counted:
            self._last_counted = position
            self._checkpoint(position, None)

    def _checkpoint(self, checkpoint_id: int, orderer_state: Any, positions: dict[int, int] | None = None) -> None:
        self.take_checkpoint(checkpoint_id, {
            "positions": dict(self._consumed) if positions is None else positions,
            "channel_wm": dict(self._channel_wm),
            "open": sorted(self._open_channels), "current_wm": self._current_wm, "pulse": self._forwarded_pulse,
            "channel_pulse": dict(self._channel_pulse), "orderer": orderer_state,
            # where a restore from it reads the order log on (the driver keeps the log from there)
            "order_from": orderer_state.offset + 1 if isinstance(orderer_state, ApplierState) else None})

    def _kazoo_metrics(self, kazoo: KazooOrderer) -> None:
        m = self.metrics
        m.leader, m.orders_accepted, m.orders_published = kazoo.is_leader, kazoo.applier.accepted, kazoo.published
        m.order_epoch = -1 if kazoo.epoch is None else kazoo.epoch
        m.elected_at, m.first_order_at = kazoo.elected_at, kazoo.first_order_at
        if self.intake.order_reader is not None:
            m.order_log_at = self.intake.order_reader.position(self._order_log)

    def _consume(self, channel: int, elements: list) -> None:
        """Run ``elements`` of ``channel`` through the chain; watermarks: the minimum over channels."""
        chain, metrics, handovers = self.chain, self.metrics, self.handovers
        gate = handovers if handovers is not None and handovers.gating else None
        process = chain.process2 if channel in self._second_input else chain.process
        for i, el in enumerate(elements):
            kind = el[0]
            if gate is not None and kind == DATA:  # a handover's target holds the moved key groups' records
                kg = key_group(encode_key(el[2]), self.num_key_groups)
                for ch, passed, _ in gate.gate((channel, el, self._current_wm), kg):
                    self._element(ch, passed)
                continue
            if kind == DATA:
                metrics.records_in += 1
                process(el)
                continue
            if kind == PULSE:
                # LiveRobin: forward a pulse the first time it is seen (Algorithm 1); KaZoo (pulse
                # windows): once every open channel delivered it, in the order the log decided
                due = self._aligned_pulses(channel, el[1]) if self._aligned else (el[1],)
                for h in due:
                    if h <= self._forwarded_pulse:
                        continue
                    if handovers is not None:
                        if not self._handovers_at_pulse(h):
                            return  # stopping while waiting for a handover
                        gate = handovers if handovers.gating else None
                    self._forwarded_pulse = metrics.pulse = h
                    chain.on_pulse(h, 0 if self._aligned or len(el) < 3 else el[2])
                    self.code_switches.position = h  # (an instruction for a pulse already passed is late)
                    if self.code_switches.pending and not self._replace_operators_at(h):
                        return  # stopping while waiting for a replacement's commit
                    if self.checkpoint_every and not self._aligned and h % self.checkpoint_every == 0:
                        self._checkpoint_at_pulse(h, channel, i + 1)  # (KaZoo: at order numbers, not pulses)
                continue
            self._element(channel, el)
        self._consumed[channel] += len(elements)

    def _aligned_pulses(self, channel: int, h: int) -> range:
        """KaZoo: ``channel`` delivered pulse ``h``; the pulses every open channel has delivered now
        and that are not forwarded yet."""
        self._channel_pulse[channel] = max(self._channel_pulse[channel], h)
        low = min((self._channel_pulse[c] for c in self._open_channels), default=self._forwarded_pulse)
        return range(self._forwarded_pulse + 1, low + 1)

    def _element(self, channel: int, el: tuple) -> None:
        """One data, watermark or end element (not a pulse) into the chain."""
        kind, channel_wm = el[0], self._channel_wm
        if kind == DATA:
            self.metrics.records_in += 1
            if channel in self._second_input:
                self.chain.process2(el)
            else:
                self.chain.process(el)
            return
        if kind == WATERMARK:
            if el[1] <= channel_wm[channel]:
                return
            channel_wm[channel] = el[1]
        elif kind == END:
            channel_wm[channel] = MAX_WATERMARK
            self._open_channels.discard(channel)
        new_wm = min(channel_wm.values())
        if new_wm > self._current_wm:
            self._current_wm = self.metrics.watermark = new_wm
            if self.handovers is not None:
                self.handovers.watermark_advanced(new_wm)
            if new_wm < MAX_WATERMARK:
                self.chain.on_watermark(new_wm)

    def _checkpoint_at_pulse(self, h: int, channel: int, consumed_in_run: int) -> None:
        """Checkpoint right after pulse ``h``: both replicas consumed the same prefix by then
        (``_consume`` adds the run to ``_consumed`` only when it is done)."""
        merge_state = self.orderer.merge.take_state(h)
        if self.handovers is not None and self.handovers.holds_records_at(h):
            return
        positions = dict(self._consumed)
        positions[channel] += consumed_in_run
        self._checkpoint(h, merge_state, positions)

