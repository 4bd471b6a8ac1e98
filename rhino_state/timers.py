"""Keyed timers kept in the state backend, fired in a deterministic order.

A timer is a (timestamp, key) pair of one operator and one time domain. It is stored as keyed
state, so a checkpoint ships it, a restore brings it back, a handover moves it with its vnode and
a savepoint keeps it, like any other state.  Physical layout (after the backend's 2-byte key group)::

    queue id (4 bytes, as a state id) + timestamp (8 bytes: ts + 2**63, big endian) + key part

with the empty value, so a key group's timers iterate in (timestamp, key) order.  In memory a
queue keeps only, per key group holding timers, a lower bound of its earliest timestamp, in a
heap: :meth:`TimerQueue.pop_due` visits key groups in (timestamp, key group) order and fires
one timer at a time, so both replicas of a partition fire the same timers in the same order
(timestamp, key group, encoded key), whatever was cached or flushed. The bound is rebuilt from
the backend (one seek per key group) after the state changed under the queue: a restore, a
savepoint, state moved in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import islice

from rhino_state.backend import RocksDBStateBackend

_OFFSET = 1 << 63
TS_MIN, TS_MAX = -_OFFSET, _OFFSET - 1


def encode_ts(ts: int) -> bytes:
    """8 bytes that sort as the signed 64-bit ``ts`` does."""
    if not isinstance(ts, int) or isinstance(ts, bool) or not TS_MIN <= ts <= TS_MAX:
        raise ValueError(f"a timer's timestamp must be an int in the signed 64-bit range, got {ts!r}")
    return (ts + _OFFSET).to_bytes(8, "big")


def decode_ts(raw: bytes) -> int:
    """Inverse of :func:`encode_ts`."""
    return int.from_bytes(raw, "big") - _OFFSET


class TimerQueue:
    """The timers of one operator in one time domain, in one partition's backend."""

    def __init__(self, backend: RocksDBStateBackend, queue_id: bytes, num_key_groups: int) -> None:
        if len(queue_id) != 4:
            raise ValueError(f"a queue id is 4 bytes, got {queue_id!r}")
        self.backend = backend
        self.queue_id = queue_id
        self.num_key_groups = num_key_groups
        self._earliest: dict[int, int] = {}  # key group -> at most its earliest timer's timestamp
        self._heap: list[tuple[int, int]] = []  # (timestamp, key group); stale entries are skipped

    def register(self, key_group: int, key_part: bytes, ts: int) -> None:
        """A timer at ``ts`` for the key ``key_part`` (length-prefixed encoded key) of ``key_group``;
        registering it again is a no-op."""
        self.backend.put(key_group, self.queue_id + encode_ts(ts) + key_part, b"")
        self._lower(key_group, ts)

    def delete(self, key_group: int, key_part: bytes, ts: int) -> None:
        """Remove the timer at ``ts`` of that key; a no-op if there is none."""
        self.backend.delete(key_group, self.queue_id + encode_ts(ts) + key_part)

    def timers_of(self, key_group: int, key_part: bytes) -> list[int]:
        """The timestamps of that key's timers, ascending (a scan of its key group's timers)."""
        n = len(self.queue_id)
        return [decode_ts(rest[n : n + 8]) for rest, _ in self.backend.iter_prefix(key_group, self.queue_id)
                if rest[n + 8 :] == key_part]

    def next_timestamp(self) -> int | None:
        """At most the earliest timer's timestamp (None: no timer)."""
        while self._heap:
            ts, kg = self._heap[0]
            if self._earliest.get(kg) == ts:
                return ts
            heapq.heappop(self._heap)
        return None

    def pop_due(self, limit: int, key_groups: frozenset[int] | None = None) -> tuple[int, int, bytes] | None:
        """Remove and return the next timer at or before ``limit`` as ``(ts, key group, key part)``,
        in (ts, key group, key part) order; None: none is due.  ``key_groups``: of those only."""
        while True:
            if key_groups is None:
                ts = self.next_timestamp()
                if ts is None or ts > limit:
                    return None
                kg = heapq.heappop(self._heap)[1]
            else:  # a scan of the bounds: their heap entries go stale and are skipped later
                due = [(t, g) for g, t in self._earliest.items() if t <= limit and g in key_groups]
                if not due:
                    return None
                ts, kg = min(due)
            taken = self._take(kg, ts)
            if taken is not None:
                return taken

    def _take(self, kg: int, bound: int) -> tuple[int, int, bytes] | None:
        """The earliest timer of ``kg`` if it is at ``bound`` (removed), else None (the bound is
        raised to it, or dropped with no timer left)."""
        n = len(self.queue_id)
        first_two = list(islice(self.backend.iter_prefix(kg, self.queue_id), 2))
        if not first_two:
            del self._earliest[kg]
            return None
        rest = first_two[0][0]
        found = decode_ts(rest[n : n + 8])
        if found > bound:  # the bound was low: timers were deleted
            self._set(kg, found)
            return None
        self.backend.delete(kg, rest)
        if len(first_two) > 1:
            self._set(kg, decode_ts(first_two[1][0][n : n + 8]))
        else:
            del self._earliest[kg]
        return found, kg, rest[n + 8 :]

    def load(self, key_groups: Iterable[int] | None = None) -> None:
        """Learn the earliest timer of ``key_groups`` (None: every key group) from the backend,
        after their state changed under the queue."""
        groups = range(self.num_key_groups) if key_groups is None else key_groups
        for kg, rest in self.backend.first_in_key_groups(self.queue_id, groups):
            self._set(kg, decode_ts(rest[len(self.queue_id) : len(self.queue_id) + 8]))

    def learn(self, entries: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Learn the earliest timers of key groups whose whole state just moved in, from its
        entries ``(key group, rest, value)`` (as :meth:`load` would from the backend, without a
        seek per key group: a range it gave away before is full of deletions to skip)."""
        n = len(self.queue_id)
        for kg, rest, _ in entries:
            if rest[:n] == self.queue_id:
                self._lower(kg, decode_ts(rest[n : n + 8]))

    def forget(self, key_groups: Iterable[int]) -> None:
        """Stop tracking ``key_groups`` (their state left this partition)."""
        for kg in key_groups:
            self._earliest.pop(kg, None)

    def tracked_key_groups(self) -> list[int]:
        """The key groups that may hold timers, ascending."""
        return sorted(self._earliest)

    def _lower(self, key_group: int, ts: int) -> None:
        known = self._earliest.get(key_group)
        if known is None or ts < known:
            self._set(key_group, ts)

    def _set(self, key_group: int, ts: int) -> None:
        self._earliest[key_group] = ts
        heapq.heappush(self._heap, (ts, key_group))
        if len(self._heap) > 2 * len(self._earliest) + 64:  # mostly stale bounds: rebuild
            self._heap = [(t, kg) for kg, t in self._earliest.items()]
            heapq.heapify(self._heap)
