"""Built-in window aggregators: count, sum, min, max and reduce.

Each is an :class:`~replication.functions.Aggregator` with ``merge``, so a handover serves its
windows' keys while their state moves and session windows can merge.  ``value`` picks what is
aggregated from a record (default: the record itself); the result is the default
``{key, start, end, value}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replication.functions import Aggregator


def _identity(value: Any) -> Any:
    return value


class Count(Aggregator):
    """How many records a window holds."""

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, first: int, second: int) -> int:
        return first + second


class Sum(Aggregator):
    """The sum of ``value(record)`` over a window (0 when empty)."""

    def __init__(self, value: Callable[[Any], Any] = _identity) -> None:
        self.value = value

    def create(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + self.value(value)

    def merge(self, first: Any, second: Any) -> Any:
        return first + second


class _Extreme(Aggregator):
    def __init__(self, value: Callable[[Any], Any] = _identity) -> None:
        self.value = value

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return self.merge(acc, self.value(value))

    def merge(self, first: Any, second: Any) -> Any:
        if first is None:
            return second
        if second is None:
            return first
        return self._pick(first, second)

    def _pick(self, first: Any, second: Any) -> Any:
        raise NotImplementedError


class Min(_Extreme):
    """The smallest ``value(record)`` of a window (the first of equals)."""

    def _pick(self, first: Any, second: Any) -> Any:
        return second if second < first else first


class Max(_Extreme):
    """The largest ``value(record)`` of a window (the first of equals)."""

    def _pick(self, first: Any, second: Any) -> Any:
        return second if second > first else first


class Reduce(Aggregator):
    """``fn`` folded over a window's ``value(record)``s in arrival order; ``fn`` must be
    associative (``fn(fn(a, b), c) == fn(a, fn(b, c))``), as merging windows applies it to partial
    results."""

    def __init__(self, fn: Callable[[Any, Any], Any], value: Callable[[Any], Any] = _identity) -> None:
        if not callable(fn):
            raise TypeError("Reduce needs a callable of two values")
        self.fn = fn
        self.value = value

    def create(self) -> Any:
        return _EMPTY

    def add(self, acc: Any, value: Any) -> Any:
        return self.merge(acc, self.value(value))

    def merge(self, first: Any, second: Any) -> Any:
        if first == _EMPTY:
            return second
        if second == _EMPTY:
            return first
        return self.fn(first, second)

    def result(self, key: Any, window_start: int, window_end: int, acc: Any) -> Any:
        return super().result(key, window_start, window_end, None if acc == _EMPTY else acc)


_EMPTY = ("__replication_empty_reduce__",)  # a plain tuple: pickles to itself in every process
