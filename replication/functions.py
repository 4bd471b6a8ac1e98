"""User function interfaces: keyed process functions with their context (state, timers, seeded
randomness) and window aggregators."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rhino_state import ListState, MapState, StateContext, StateTtl, ValueState
from rhino_state.timers import TS_MIN, TimerQueue, encode_ts

RESERVED_PREFIX = "__"  # state names the runtime keeps for itself (timers, random draws)


@dataclass(frozen=True)
class OutputTag:
    """Names a side output: ``ctx.output(tag, value)`` in a keyed function (or a window's late
    records) and ``stream.side_output(tag)`` to read it."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"an OutputTag's name must be a non-empty str without '/', got {self.name!r}")

A = TypeVar("A")


class RuntimeContext:
    """What a keyed function gets at ``open``: factories for its keyed state."""

    def __init__(self, state_context: Any, operator_name: str, partition: int, parallelism: int) -> None:
        self._state = state_context
        self.operator_name = operator_name
        self.partition = partition
        self.parallelism = parallelism

    def value_state(self, name: str, default: Any = None, ttl: StateTtl | None = None) -> ValueState:
        """A single value per key; with ``ttl``, gone (the default again) once the watermark passes
        its last write's event time plus the TTL (``StateTtl(ms, time="processing")``: once a pulse
        or a KaZoo order passes the processing time of its last write plus the TTL)."""
        return self._state.value_state(_user_state_name(name), default, ttl)

    def map_state(self, name: str, ttl: StateTtl | None = None) -> MapState:
        """A map per key (iterated in a deterministic key order); with ``ttl``, each entry expires
        on its own."""
        return self._state.map_state(_user_state_name(name), ttl)

    def list_state(self, name: str, ttl: StateTtl | None = None) -> ListState:
        """A list per key (appending does not read it); with ``ttl``, each element expires on its own."""
        return self._state.list_state(_user_state_name(name), ttl)


def _user_state_name(name: str) -> str:
    if isinstance(name, str) and name.startswith(RESERVED_PREFIX):
        raise ValueError(f"state name {name!r}: names starting with {RESERVED_PREFIX!r} are reserved")
    return name


class ProcessContext:
    """Per-call context of ``process`` and ``on_timer``: the current key, the event time (the
    record's, or the timer's), the watermark, the key's timers and a seeded random source.

    ``time_domain`` is None in ``process``, and ``"event_time"`` or ``"processing_time"`` in
    ``on_timer``."""

    __slots__ = ("key", "timestamp", "watermark", "time_domain", "timers", "_draws", "side_outputs")

    def __init__(self, timers: TimerService | None = None, draws: RandomDraws | None = None) -> None:
        self.key: Any = None
        self.timestamp: int = 0
        self.watermark: int = TS_MIN  # no event time reached yet, as the instance's and a window's
        self.time_domain: str | None = None
        self.timers = timers
        self._draws = draws
        self.side_outputs: list[tuple[str, Any]] = []  # this call's, emitted once it returned

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to the side output ``tag`` (read with ``stream.side_output(tag)``; dropped
        if nothing reads it).  It goes out once the call returns, after its main outputs, and not at
        all if the call raises (the record goes to the dead-letter topic)."""
        if not isinstance(tag, OutputTag):
            raise TypeError(f"ctx.output needs an OutputTag, got {type(tag).__qualname__}")
        self.side_outputs.append((tag.name, value))

    def value_state(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("state is declared in open(ctx) (ctx.value_state, map_state, list_state there), "
                        "not in process or on_timer")

    map_state = list_state = value_state

    def random(self) -> random.Random:
        """A random source for the current key, seeded by the operator, the key and how many sources
        this key drew before: both replicas draw the same numbers, and so does a replica restored
        from a checkpoint or a partition the key moved to."""
        if self._draws is None:
            raise RuntimeError("ctx.random() is only available in a keyed process function")
        return self._draws.next_source()


class TimerService:
    """The current key's timers (``ctx.timers``): ``on_timer(ts, ctx)`` is called for that key once
    the watermark reaches ``ts`` (event time), or once a pulse of processing time ``ts`` or later
    passes the operator (processing time: the heartbeat generator's clock stamped into each
    LiveRobin pulse, so both replicas fire at the same pulse); in the order (ts, key group, key).

    Timers are keyed state: checkpointed, restored, moved with their keys in a handover and kept in
    savepoints.  Registering the same (key, ts) twice fires once; a timer at or behind the
    watermark (the processing time) fires at the next watermark (pulse), event-time timers at the
    latest when the input ends."""

    def __init__(self, state: StateContext, event: TimerQueue, processing: TimerQueue, ctx: ProcessContext,
                 operator: str, processing_time: Callable[[], int]) -> None:
        self._state = state
        self._event = event
        self._processing = processing
        self._ctx = ctx
        self._operator = operator
        self._processing_time = processing_time
        self.enabled = True  # False: the function has no on_timer to call
        self.pulses = True  # False: no pulses carry processing time here (not LiveRobin)

    def _register(self, queue: TimerQueue, ts: int) -> None:
        if not self.enabled:
            raise TypeError(f"operator {self._operator!r} registers a timer but its function does not "
                            "override on_timer")
        encode_ts(ts)
        queue.register(*self._state.key_location(), ts)

    def register_event_time_timer(self, ts: int) -> None:
        """Fire ``on_timer(ts, ctx)`` for the current key when the watermark reaches ``ts`` (ms)."""
        self._register(self._event, ts)

    def delete_event_time_timer(self, ts: int) -> None:
        """Remove the current key's event-time timer at ``ts``; a no-op if there is none."""
        encode_ts(ts)
        self._event.delete(*self._state.key_location(), ts)

    def event_time_timers(self) -> list[int]:
        """The timestamps of the current key's event-time timers, ascending."""
        return self._event.timers_of(*self._state.key_location())

    def register_processing_time_timer(self, ts: int) -> None:
        """Fire ``on_timer(ts, ctx)`` for the current key at the first pulse (LiveRobin) or order
        (KaZoo) of processing time ``ts`` (ms since the epoch) or later."""
        if not self.pulses:
            raise TypeError(f"operator {self._operator!r} registers a processing-time timer: processing time "
                            "comes with LiveRobin's pulses or KaZoo's orders "
                            "(spark.replication.mode=liverobin or kazoo)")
        self._register(self._processing, ts)

    def delete_processing_time_timer(self, ts: int) -> None:
        """Remove the current key's processing-time timer at ``ts``; a no-op if there is none."""
        encode_ts(ts)
        self._processing.delete(*self._state.key_location(), ts)

    def processing_time_timers(self) -> list[int]:
        """The timestamps of the current key's processing-time timers, ascending."""
        return self._processing.timers_of(*self._state.key_location())

    def current_watermark(self) -> int:
        """The operator's watermark: event time the input has reached."""
        return self._ctx.watermark

    def current_processing_time(self) -> int:
        """The processing time of the last pulse the operator passed (ms; 0 before the first): the
        same on both replicas at the same record."""
        return self._processing_time()


class RandomDraws:
    """Seeded random sources per key: the n-th source of a key is seeded by (operator, key, n), and
    n is kept in the key's state.  When every state the function declared has a TTL of one time
    domain, the count lives as long as the longest of them, so a key whose state expired leaves
    nothing behind; a count that expired starts again from a base, the operator's time at the
    draw that starts it, which is part of the seed: a key drawing again does not repeat what it
    drew before."""

    NAME = RESERVED_PREFIX + "random_draws"

    def __init__(self, state: StateContext, operator: str) -> None:
        self._state = state
        self._operator = operator.encode()
        self._count: ValueState | None = None  # declared at the first draw: after open() declared the rest

    def forget(self) -> None:
        """A new version of the function declares its states afresh (their TTLs may change)."""
        self._count = None

    def count_ttl(self) -> StateTtl | None:
        """The count's TTL: the longest of the function's states', if they all have one of a time domain."""
        ttls = [h.ttl for name, h in self._state.handles().items() if not name.startswith(RESERVED_PREFIX)]
        if not ttls or any(t is None for t in ttls) or len({t.time for t in ttls}) != 1:
            return None
        return max(ttls, key=lambda t: t.ttl_ms)

    def next_source(self) -> random.Random:
        if self._count is None:
            self._count = self._state.value_state(self.NAME, 0, self.count_ttl())
        count = self._count.value()
        if count == 0 and self._count.ttl is not None:
            count = (self._state.now, 0)  # a first draw, or the first since the count expired
        if isinstance(count, tuple):
            base, n = count
            self._count.update((base, n + 1))
            salt = n.to_bytes(8, "big") + base.to_bytes(8, "big", signed=True)
        else:
            self._count.update(count + 1)
            salt = count.to_bytes(8, "big")
        _, key_part = self._state.key_location()
        digest = hashlib.blake2b(self._operator + b"\x00" + key_part + salt, digest_size=8)
        return random.Random(int.from_bytes(digest.digest(), "big"))


class KeyedProcessFunction:
    """Stateful per-key logic.  Override ``process``; state handles come from ``open``.

    ``process`` returns an iterable of output values (a generator is fine) or None.
    It must be deterministic: use the record's event time, never the wall clock,
    ``ctx.random()`` for randomness, and keep all cross-record memory in the state handles
    (timers included: ``ctx.timers``).
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per partition instance before the first record."""

    def process(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError("KeyedProcessFunction.process must be overridden")

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[Any] | None:
        """A timer of ``ctx.key`` registered with ``ctx.timers`` fired: return (or yield) output
        values, as ``process`` does; their event time is ``timestamp``.  Override it to use timers."""
        raise NotImplementedError(f"{type(self).__qualname__} registers timers but does not override on_timer")

    def close(self) -> None:
        """Called once when the instance finishes."""


class CoProcessFunction(KeyedProcessFunction):
    """Stateful per-key logic over two keyed inputs (``a.connect(b).key_by(ka, kb).process(fn)``):
    ``process1`` gets the first input's records, ``process2`` the second's, both with the key's
    state, timers and side outputs (``on_timer`` as in :class:`KeyedProcessFunction`).  Which input
    goes next is the ordering mode's, the same on both replicas."""

    def process1(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError("CoProcessFunction.process1 must be overridden")

    def process2(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError("CoProcessFunction.process2 must be overridden")

    def process(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        return self.process1(value, ctx)


def has_timers(fn: KeyedProcessFunction) -> bool:
    """Whether ``fn`` overrides :meth:`KeyedProcessFunction.on_timer` (may register timers)."""
    return type(fn).on_timer is not KeyedProcessFunction.on_timer


class Aggregator(Generic[A]):
    """An incremental window aggregation: ``create`` an accumulator, ``add`` values, ``result``;
    optionally ``merge`` (then a handover serves the window's keys while their state moves)."""

    def create(self) -> A:
        raise NotImplementedError

    def add(self, acc: A, value: Any) -> A:
        raise NotImplementedError

    def result(self, key: Any, window_start: int, window_end: int, acc: A) -> Any:
        return {"key": key, "start": window_start, "end": window_end, "value": acc}

    def merge(self, first: A, second: A) -> A:
        """Optional: the accumulator of a window's values of ``first`` followed by those of
        ``second`` (what ``add`` would have built from all of them, in that order).  With it, a
        partition that takes over keys in a handover aggregates their new records at once into
        fresh accumulators and merges the moved ones in when they arrive, instead of holding the
        records until then (docs/handover.md, "Serving windows through a move")."""
        raise NotImplementedError


def mergeable(aggregator: Aggregator) -> bool:
    """Whether ``aggregator`` defines :meth:`Aggregator.merge`."""
    return type(aggregator).merge is not Aggregator.merge
