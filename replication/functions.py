"""User function interfaces: keyed process functions and window aggregators."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from rhino_state import MapState, ValueState

A = TypeVar("A")


class RuntimeContext:
    """What a keyed function gets at ``open``: factories for its keyed state."""

    def __init__(self, state_context: Any, operator_name: str, partition: int, parallelism: int) -> None:
        self._state = state_context
        self.operator_name = operator_name
        self.partition = partition
        self.parallelism = parallelism

    def value_state(self, name: str, default: Any = None) -> ValueState:
        """A single value per key."""
        return self._state.value_state(name, default)

    def map_state(self, name: str) -> MapState:
        """A map per key (iterated in a deterministic key order)."""
        return self._state.map_state(name)


class ProcessContext:
    """Per-record context: the current key, the record's event time, the watermark."""

    __slots__ = ("key", "timestamp", "watermark")

    def __init__(self) -> None:
        self.key: Any = None
        self.timestamp: int = 0
        self.watermark: int = 0


class KeyedProcessFunction:
    """Stateful per-key logic.  Override ``process``; state handles come from ``open``.

    ``process`` returns an iterable of output values (a generator is fine) or None.
    It must be deterministic: use the record's event time, never the wall clock,
    and keep all cross-record memory in the state handles.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per partition instance before the first record."""

    def process(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError("KeyedProcessFunction.process must be overridden")

    def close(self) -> None:
        """Called once when the instance finishes."""


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
