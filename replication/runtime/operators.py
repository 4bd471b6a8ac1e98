"""Runtime operators of a task chain.

Each operator receives data elements through ``process`` and control through
``on_watermark`` / ``on_pulse`` / ``on_end``, and pushes results to ``next``.  LiveRobin
pulses pass through every operator unchanged, at their position among the records
(first-seen forwarding keeps multi-stage graphs live).  The tail of a
chain is a :class:`Router` (network outputs) or a :class:`SinkOperator`.  A user
function that raises sends its record to the dead-letter topic and the chain goes
on with the next record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from replication.functions import (
    RESERVED_PREFIX,
    ProcessContext,
    RandomDraws,
    RuntimeContext,
    TimerService,
    has_timers,
)
from replication.runtime.deadletter import describe_error, payload_of
from replication.runtime.elements import DATA, END_ELEMENT, pulse, watermark
from rhino_state import decode_key, encode_key, key_group
from rhino_state.timers import TimerQueue
from transport.kafka_io import produce_blocking


def records_of(result: Any, what: str) -> list[Any]:
    """The output records a user function returned: an iterable of them, or None.  A dict, a string
    or bytes is refused: iterating it would emit its keys, characters or byte values."""
    if result is None:
        return []
    if isinstance(result, (dict, str, bytes)):
        raise TypeError(f"{what} returned a {type(result).__name__}: return an iterable of records "
                        "(a list, or yield them), e.g. [record]")
    return list(result)


class Operator:
    next: Operator

    def __init__(self, name: str, env: Any) -> None:
        self.name = name
        self.env = env  # the hosting instance: metrics, dead letters, state

    def process(self, rec: tuple) -> None:
        raise NotImplementedError

    def on_watermark(self, wm: int) -> None:
        self.next.on_watermark(wm)

    def on_pulse(self, h: int, t: int = 0) -> None:
        """Pulse ``h``, written at processing time ``t`` (ms; 0: unknown)."""
        self.next.on_pulse(h, t)

    def on_processing_time(self, t: int) -> None:
        """Processing time reaches ``t`` (ms) in this task only (a KaZoo order's clock): it goes
        down the chain, not over channels."""
        self.next.on_processing_time(t)

    def on_end(self) -> None:
        self.next.on_end()

    def side(self, tag: str, rec: tuple) -> None:
        """A record for the side output ``tag``: passed on to the chain's router (only a stream
        that reads the tag gets it)."""
        self.next.side(tag, rec)

    def process2(self, rec: tuple) -> None:
        """A record of the task's second input (two-input functions only)."""
        raise TypeError(f"operator {self.name!r} has one input")

    def snapshot(self) -> Any:
        """What this operator keeps outside keyed state, for a checkpoint (picklable); None: nothing."""
        return None

    def restore(self, snapshot: Any) -> None:
        """Take back what :meth:`snapshot` returned (a replica restored from a checkpoint)."""

    def restore_savepoint(self, snapshots: list[Any], owns: Callable[[int], bool]) -> None:
        """A new run from a savepoint: the :meth:`snapshot` of this operator in every partition of
        the run that wrote it (their number may differ from this run's); ``owns``: whether a key
        group is this partition's now.  Nothing to take back by default."""

    def state_left(self, key_groups: frozenset[int]) -> None:
        """A handover origin cut the keyed state of ``key_groups`` out (it moves elsewhere)."""

    def state_arrived(self, key_groups: Iterable[range], entries: list[tuple[int, bytes, bytes]] | None = None) -> None:
        """A handover target loaded the keyed state of ``key_groups`` (all of it: ``entries``, or
        None to read it back from the backend), before the records it held."""

    def fire_behind(self) -> None:
        """A handover target, after the records it held: fire what moved in already due."""

    def catch_up(self, wm: int, key_groups: frozenset[int]) -> None:
        """A handover target processing the records it held of ``key_groups``: from here to the
        next call they see the watermark ``wm`` (at most this operator's own), and what of
        theirs is due by it fires now, in order, before it goes on down the chain."""
        self.next.catch_up(wm, key_groups)

    def replace_fn(self, fn: Any) -> None:
        """Run ``fn`` instead of the user function from the next element on (operator replacement,
        docs/handover.md); operators without a user function refuse."""
        if not hasattr(self, "fn"):
            raise ValueError(f"operator {self.name!r} has no user function to replace")
        self.fn = fn

    def dead_letter(self, rec: tuple, reason: str) -> None:
        payload, kind = payload_of(rec[1])
        self.env.dead_letter(reason=reason, operator=self.name, origin=rec[5], payload=payload, payload_kind=kind)


class MapOperator(Operator):
    def __init__(self, name: str, env: Any, fn: Callable) -> None:
        super().__init__(name, env)
        self.fn = fn

    def process(self, rec: tuple) -> None:
        try:
            value = self.fn(rec[1])
        except Exception as exc:  # noqa: BLE001 - user code
            self.dead_letter(rec, describe_error(exc))
            return
        self.next.process((DATA, value, rec[2], rec[3], rec[4], rec[5]))


class FilterOperator(MapOperator):
    def process(self, rec: tuple) -> None:
        try:
            keep = self.fn(rec[1])
        except Exception as exc:  # noqa: BLE001
            self.dead_letter(rec, describe_error(exc))
            return
        if keep:
            self.next.process(rec)


class FlatMapOperator(MapOperator):
    def process(self, rec: tuple) -> None:
        try:
            values = records_of(self.fn(rec[1]), "flat_map's function")
        except Exception as exc:  # noqa: BLE001
            self.dead_letter(rec, describe_error(exc))
            return
        for value in values:
            self.next.process((DATA, value, rec[2], rec[3], rec[4], rec[5]))


class ProcessOperator(Operator):
    """Runs a KeyedProcessFunction with keyed state, timers and state TTL.

    Event-time timers fire when a watermark reaches them, before the watermark goes downstream;
    processing-time timers when a pulse of their time passes (LiveRobin).  Their outputs carry the
    timer's time as event time.  Expired TTL state is swept first, at the same watermark or pulse.
    Timers and sweeps are keyed state (:mod:`rhino_state.timers`): only the queues' in-memory
    bounds follow a restore or a move."""

    def __init__(self, name: str, env: Any, fn: Any) -> None:
        super().__init__(name, env)
        self.fn = fn
        self.state = env.state_context(name)
        def queue(what: str) -> TimerQueue:
            return TimerQueue(self.state.backend, self.state.reserve_id(RESERVED_PREFIX + what), env.num_key_groups)

        self.timer_queue, self.processing_queue = queue("event_timers"), queue("processing_timers")
        self.state.sweeps = queue("ttl_sweeps")
        pulses = getattr(env, "processing_time", True)
        if pulses:  # processing time (timers, TTL) comes with the pulses or the orders' clocks
            self.state.processing_sweeps = queue("ttl_processing_sweeps")
        self.draws = RandomDraws(self.state, name)
        self.ctx = ProcessContext(draws=self.draws)
        self.ctx.timers = self.timers = TimerService(self.state, self.timer_queue, self.processing_queue, self.ctx,
                                                     name, lambda: self.state.processing_time)
        self.timers.enabled = has_timers(fn)
        self.timers.pulses = pulses
        fn.open(RuntimeContext(self.state, name, env.partition, env.parallelism))

    def process(self, rec: tuple) -> None:
        self._call(self.fn.process, rec)

    def process2(self, rec: tuple) -> None:
        """The second input's record (a :class:`~replication.functions.CoProcessFunction`)."""
        self._call(self.fn.process2, rec)

    def _call(self, method: Callable, rec: tuple) -> None:
        key = rec[2]
        self.state.set_current_key(key)
        ctx = self.ctx
        ctx.key, ctx.timestamp, ctx.time_domain = key, rec[3], None
        self.state.set_time(rec[3], ctx.watermark)
        ctx.side_outputs = []
        try:
            outputs = records_of(method(rec[1], ctx), method.__name__)
        except Exception as exc:  # noqa: BLE001
            self.dead_letter(rec, describe_error(exc))
            return
        self._emit(outputs, key, rec[3], rec[4], rec[5])

    def _emit(self, outputs: list[Any], key: Any, ts: int, ingest: float, origin: Any) -> None:
        for value in outputs:
            self.next.process((DATA, value, key, ts, ingest, origin))
        for tag, value in self.ctx.side_outputs:
            self.next.side(tag, (DATA, value, key, ts, ingest, origin))

    def on_watermark(self, wm: int) -> None:
        self.ctx.watermark = wm
        self._fire_timers(wm)
        self.next.on_watermark(wm)

    def on_pulse(self, h: int, t: int = 0) -> None:
        self._advance_processing_time(t)
        self.next.on_pulse(h, t)

    def on_processing_time(self, t: int) -> None:
        self._advance_processing_time(t)
        self.next.on_processing_time(t)

    def _advance_processing_time(self, t: int) -> None:
        state = self.state
        if t > state.processing_time:  # the largest time seen: a slower clock does not turn it back
            state.processing_time = t
            if state.processing_sweeps is not None:
                self._sweep(state.processing_sweeps, t)
            self._fire_queue(self.processing_queue, t, "processing_time")

    def catch_up(self, wm: int, key_groups: frozenset[int]) -> None:
        self.ctx.watermark = wm
        self._fire_timers(wm, key_groups)
        self.next.catch_up(wm, key_groups)

    def _fire_timers(self, wm: int, key_groups: frozenset[int] | None = None) -> None:
        assert self.state.sweeps is not None
        self.state.set_time(wm, wm)
        self._sweep(self.state.sweeps, wm, key_groups)
        self._fire_queue(self.timer_queue, wm, "event_time", key_groups)

    def _sweep(self, sweeps: TimerQueue, limit: int, key_groups: frozenset[int] | None = None) -> None:
        """Delete the state that expired by ``limit`` (before the timers fire: they never see it)."""
        while (due := sweeps.pop_due(limit, key_groups)) is not None:
            self.state.sweep(due[1], due[2])

    def _fire_queue(self, queue: TimerQueue, limit: int, domain: str,
                    key_groups: frozenset[int] | None = None) -> None:
        ctx, state, wm = self.ctx, self.state, self.ctx.watermark
        while (due := queue.pop_due(limit, key_groups)) is not None:
            ts, _, key_part = due
            key = decode_key(key_part[4:])
            state.set_current_key(key)
            state.set_time(ts if domain == "event_time" else wm, wm)
            ctx.key, ctx.timestamp, ctx.time_domain = key, ts, domain
            ctx.side_outputs = []
            try:
                outputs = records_of(self.fn.on_timer(ts, ctx), "on_timer")
            except Exception as exc:  # noqa: BLE001 - user code
                payload, kind = payload_of({"key": key, "timer": ts})
                self.env.dead_letter(reason=describe_error(exc), operator=self.name, origin=None,
                                     payload=payload, payload_kind=kind)
                continue
            self._emit(outputs, key, ts, time.time(), None)  # ingest: these records start here

    def _queues(self) -> tuple[TimerQueue, ...]:
        state = self.state
        assert state.sweeps is not None
        extra = () if state.processing_sweeps is None else (state.processing_sweeps,)
        return self.timer_queue, self.processing_queue, state.sweeps, *extra

    def state_left(self, key_groups: frozenset[int]) -> None:
        for queue in self._queues():
            queue.forget(key_groups)

    def state_arrived(self, key_groups: Iterable[range], entries: list[tuple[int, bytes, bytes]] | None = None) -> None:
        groups = [kg for r in key_groups for kg in r]
        for queue in self._queues():
            if entries is None:
                queue.load(groups)
            else:
                queue.learn(entries)

    def fire_behind(self) -> None:
        self._fire_timers(self.ctx.watermark)

    def replace_fn(self, fn: Any) -> None:
        """The new version keeps the keyed state (its timers too): it opens on the same state context."""
        self.state.forget_handles()
        self.draws.forget()
        fn.open(RuntimeContext(self.state, self.name, self.env.partition, self.env.parallelism))
        self.fn = fn
        self.timers.enabled = has_timers(fn)

    def snapshot(self) -> Any:
        return self.ctx.watermark, self.state.processing_time

    def restore(self, snapshot: Any) -> None:
        self.ctx.watermark, self.state.processing_time = snapshot if isinstance(snapshot, tuple) else (snapshot, 0)
        for queue in self._queues():
            queue.load()

    def restore_savepoint(self, snapshots: list[Any], owns: Callable[[int], bool]) -> None:
        marks = [s if isinstance(s, tuple) else (s, 0) for s in snapshots]
        self.ctx.watermark = min((wm for wm, _ in marks), default=self.ctx.watermark)
        self.state.processing_time = max((t for _, t in marks), default=self.state.processing_time)
        for queue in self._queues():
            queue.load()

    def on_end(self) -> None:
        self.fn.close()
        self.next.on_end()


class SinkBase(Operator):
    """Serializes records for a Kafka topic; the subclasses decide how they are written."""

    def __init__(self, name: str, env: Any, topic: str, serializer: Callable, key_serializer: Callable | None,
                 *, key_fn: Callable | None = None, headers_fn: Callable | None = None,
                 timestamp_fn: Callable | None = None) -> None:
        super().__init__(name, env)
        self.topic = topic
        self.serializer = serializer
        self.key_serializer = key_serializer
        self.key_fn = key_fn  # the Kafka key from the record (default: the stream's key)
        self.headers_fn = headers_fn  # (name, bytes) pairs from the record
        self.timestamp_fn = timestamp_fn  # the Kafka timestamp (ms) from the record

    def serialize(self, rec: tuple) -> tuple[bytes, bytes | None, list[tuple[str, bytes]], int | None] | None:
        """``(value, key, headers, timestamp)`` to produce, or None after sending the record to the
        dead-letter topic."""
        try:
            value = self.serializer(rec[1])
            key = None
            if self.key_serializer is not None:
                key = self.key_serializer(self.key_fn(rec[1]) if self.key_fn is not None else rec[2])
            headers = [] if self.headers_fn is None else _headers(self.headers_fn(rec[1]))
            ts = None if self.timestamp_fn is None else int(self.timestamp_fn(rec[1]))
        except Exception as exc:  # noqa: BLE001
            self.dead_letter(rec, "serialize: " + describe_error(exc))
            return None
        return value, key, headers, ts

    def on_watermark(self, wm: int) -> None:
        pass

    def catch_up(self, wm: int, key_groups: frozenset[int]) -> None:
        pass

    def on_pulse(self, h: int, t: int = 0) -> None:
        pass

    def on_processing_time(self, t: int) -> None:
        pass

    def side(self, tag: str, rec: tuple) -> None:
        pass  # no stream reads side outputs chained into a sink


class SinkOperator(SinkBase):
    """Produces every value to a Kafka topic (no replication, no checkpoints: at most once when
    the job fails); records end-to-end latency."""

    def __init__(self, name: str, env: Any, topic: str, serializer: Callable, key_serializer: Callable | None,
                 **record_fns: Callable | None) -> None:
        super().__init__(name, env, topic, serializer, key_serializer, **record_fns)
        self.producer = env.sink_producer()

    def process(self, rec: tuple) -> None:
        out = self.serialize(rec)
        if out is None:
            return
        now = time.time()
        value, key, headers, ts = out
        headers = [*headers, ("ingest_ts", repr(rec[4]).encode()), ("sink_ts", repr(now).encode())]
        produce_blocking(self.producer, self.topic, value=value, key=key, headers=headers,
                         **({} if ts is None else {"timestamp": ts}))
        metrics = self.env.metrics
        metrics.records_out += 1
        metrics.latency.record(now - rec[4])

    def on_end(self) -> None:
        self.env.flush_producer(self.producer)


def _headers(pairs: Any) -> list[tuple[str, bytes]]:
    """A record's headers as the sink's ``headers`` function gave them: (str, bytes) pairs."""
    out = []
    for name, value in pairs:
        if not isinstance(name, str) or not isinstance(value, (bytes, type(None))):
            raise TypeError(f"a header is a (str, bytes) pair, got ({type(name).__name__}, {type(value).__name__})")
        out.append((name, value))
    return out


class Router(Operator):
    """Tail of a chain with network outputs: picks the channel of every output edge."""

    def __init__(self, name: str, env: Any, edges: list[tuple[Any, list]]) -> None:
        super().__init__(name, env)
        # per output edge: (OutputEdge, [OutputChannel by destination partition], round-robin counter)
        self.edges = [[edge, chans, 0] for edge, chans in edges]
        self._by_tag: dict[str | None, list[list]] = {}  # the main output (None), each side output
        for slot in self.edges:
            self._by_tag.setdefault(getattr(slot[0], "tag", None), []).append(slot)
        self.num_key_groups = env.num_key_groups
        self.switches = env.router_switches  # routing tables per keyed destination, switched by handovers
        # a handover target holding records of moved keys withholds its watermark until they are processed
        self.handovers = getattr(env, "handovers", None)
        self._withheld: int | None = None
        # records per vnode of each hash edge's destination (the metrics' ``routed``), and the number
        # of vnodes of that destination
        self._routed = {}
        for edge, _ in edges:
            if edge.partitioning == "hash":
                vnodes = self.switches.num_vnodes(edge.dst_task)
                self._routed[edge.dst_task] = (env.metrics.routed.setdefault(edge.dst_task, [0] * vnodes), vnodes)

    def process(self, rec: tuple) -> None:
        self._route(rec, self._by_tag.get(None, ()))

    def side(self, tag: str, rec: tuple) -> None:
        self._route(rec, self._by_tag.get(tag, ()))

    def _route(self, rec: tuple, slots: Any) -> None:
        sent = False
        for slot in slots:
            edge, chans = slot[0], slot[1]
            if edge.partitioning == "hash":
                try:
                    key = edge.key_fn(rec[1])
                    kg = key_group(encode_key(key), self.num_key_groups)
                except Exception as exc:  # noqa: BLE001
                    self.dead_letter(rec, "key_by: " + describe_error(exc))
                    continue
                part = self.switches.partition_of(edge.dst_task, kg)
                chans[part].emit((DATA, rec[1], key, rec[3], rec[4], rec[5]))
                counts, vnodes = self._routed[edge.dst_task]
                counts[((kg + 1) * vnodes - 1) // self.num_key_groups] += 1  # rhino_state.vnode_of, inlined
            elif edge.partitioning == "forward":
                if edge.key_fn is None:
                    chans[0].emit(rec)
                else:  # a prepartitioned key_by: same partition, key attached for the keyed operator
                    try:
                        key = edge.key_fn(rec[1])
                    except Exception as exc:  # noqa: BLE001
                        self.dead_letter(rec, "key_by: " + describe_error(exc))
                        continue
                    chans[0].emit((DATA, rec[1], key, rec[3], rec[4], rec[5]))
            else:
                chans[slot[2] % len(chans)].emit(rec)
                slot[2] += 1
            sent = True
        if sent:
            self.env.metrics.records_out += 1

    def on_watermark(self, wm: int) -> None:
        if self.handovers is not None and self.handovers.holding():
            self._withheld = wm  # a held record's output may still come, behind it
            return
        element = watermark(wm)
        for _, chans, _ in self.edges:
            for ch in chans:
                ch.emit(element)

    def catch_up(self, wm: int, key_groups: frozenset[int]) -> None:
        pass  # the watermark of held records, behind the one this chain had: not forwarded

    def forward_withheld(self) -> None:
        """The records a handover target held are processed: forward the watermark withheld
        meanwhile (withheld again if another step still holds some)."""
        if self._withheld is not None:
            wm, self._withheld = self._withheld, None
            self.on_watermark(wm)

    def on_processing_time(self, t: int) -> None:
        pass  # the downstream tasks have clocks of their own

    def on_pulse(self, h: int, t: int = 0) -> None:
        element = pulse(h, t)
        for _, chans, _ in self.edges:
            for ch in chans:
                ch.emit(element)  # no flush: pulses ride in the data batches (tiny batches fill queues)
        # a handover switches the routing right after its pulse, on both replicas alike
        for handover_id, epoch in self.switches.on_pulse(h, self.env.stop_requested.is_set):
            self.env.handover_ack(handover_id, epoch, "switched")

    def on_end(self) -> None:
        for _, chans, _ in self.edges:
            for ch in chans:
                ch.emit(END_ELEMENT)

    def snapshot(self) -> Any:
        return [slot[2] for slot in self.edges]

    def restore(self, snapshot: Any) -> None:
        for slot, counter in zip(self.edges, snapshot, strict=True):
            slot[2] = counter
