"""Event-time window operators: fixed windows (tumbling, sliding) and session windows, with an
incremental aggregator and allowed lateness.

Accumulators live in keyed map state; when windows come due is a :class:`FireIndex` kept in
memory (with the newest ingest time of each window, for latency), checkpointed with the
operator's snapshot and moved with its keys in a handover.  Ingest times are stamped by whichever
source replica's copy arrived first, so they differ between replicas: they stay out of keyed
state, whose digests the replicas compare at checkpoints.  Windows fire in the deterministic
order (end, encoded key) when the watermark reaches their end; with allowed lateness their state
stays until the watermark reaches end + lateness, and a record for a fired window in that time
emits the window's updated result at once.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from replication.functions import mergeable
from replication.runtime.deadletter import describe_error, payload_of
from replication.runtime.elements import DATA
from replication.runtime.operators import Operator, ProcessOperator
from replication.windowing import Windows
from rhino_state import canonical_dumps, encode_key, key_group

_NO_ACC = object()
IndexEntry = tuple[int, bytes, Any, float, int]  # (due at, encoded key, key, newest ingest, which index)


class FireIndex:
    """Which keys' windows come due when: due time -> encoded key -> [key, newest ingest]."""

    def __init__(self) -> None:
        self.due: dict[int, dict[bytes, list]] = {}

    def add(self, at: int, kb: bytes, key: Any, ingest: float) -> None:
        entry = self.due.setdefault(at, {}).setdefault(kb, [key, ingest])
        entry[1] = max(entry[1], ingest)

    def remove(self, at: int, kb: bytes) -> float | None:
        keys = self.due.get(at)
        entry = keys.pop(kb, None) if keys is not None else None
        if keys is not None and not keys:
            del self.due[at]
        return None if entry is None else entry[1]

    def pop_due(self, wm: int, skip: Callable[[bytes], bool]) -> Iterator[tuple[int, bytes, Any, float]]:
        """Take out the entries due at or before ``wm`` in (due, encoded key) order, but those
        ``skip`` names (the caller adds nothing to this index meanwhile)."""
        for at in sorted(a for a in self.due if a <= wm):
            keys = self.due[at]
            for kb in sorted(keys):
                if not skip(kb):
                    key, ingest = keys.pop(kb)
                    yield at, kb, key, ingest
            if not keys:
                del self.due[at]

    def cut(self, in_cut: Callable[[bytes], bool], which: int) -> list[IndexEntry]:
        out = []
        for at in sorted(self.due):
            keys = self.due[at]
            for kb in sorted(keys):
                if in_cut(kb):
                    key, ingest = keys.pop(kb)
                    out.append((at, kb, key, ingest, which))
            if not keys:
                del self.due[at]
        return out

    def snapshot(self) -> dict[int, dict[bytes, list]]:
        return {at: {kb: list(e) for kb, e in keys.items()} for at, keys in self.due.items()}


class _WindowBase(Operator):
    """What fixed and session windows share: state, the fire and cleanup indexes, the watermark,
    late records and handover hooks."""

    def __init__(self, name: str, env: Any, windows: Windows, aggregator: Any, late_tag: str | None = None) -> None:
        super().__init__(name, env)
        self.late_tag = late_tag  # the side output late records go to (None: the dead-letter topic)
        self.spec = windows
        self.agg = aggregator
        self.state = env.state_context(name)
        self.windows = self.state.map_state("windows")
        self.fire_index = FireIndex()  # window end -> keys
        self.cleanup_index = FireIndex()  # end + allowed lateness -> keys (with allowed lateness only)
        self.watermark = -(2**63)

    def _late(self, rec: tuple, what: str) -> None:
        self.env.metrics.late_records += 1
        if self.late_tag is not None:
            self.next.side(self.late_tag, rec)
        else:
            self.dead_letter(rec, f"late: event time {rec[3]} is behind the watermark {self.watermark} ({what})")

    def _emit(self, key: Any, start: int, end: int, acc: Any, ingest: float) -> None:
        try:
            value = self.agg.result(key, start, end, acc)
        except Exception as exc:  # noqa: BLE001 - user code
            payload, kind = payload_of({"key": key, "start": start, "acc": acc})
            self.env.dead_letter(reason=describe_error(exc), operator=self.name, origin=None,
                                 payload=payload, payload_kind=kind)
            return
        self.next.process((DATA, value, key, end - 1, ingest, None))

    def on_watermark(self, wm: int) -> None:
        if wm <= self.watermark:
            return
        self.watermark = wm
        self._fire(wm)
        self.next.on_watermark(wm)

    def _awaited(self) -> Callable[[bytes], bool]:
        """Keys a target serving moved keys must not fire yet: their moved state is not merged in."""
        handovers = getattr(self.env, "handovers", None)
        awaited = handovers.awaited_key_groups() if handovers is not None else frozenset()
        groups = self.env.num_key_groups
        return (lambda kb: key_group(kb, groups) in awaited) if awaited else (lambda kb: False)

    def catch_up(self, wm: int, key_groups: frozenset[int]) -> None:
        self.watermark = wm
        groups, awaited = self.env.num_key_groups, self._awaited()
        self._fire(wm, lambda kb: awaited(kb) or key_group(kb, groups) not in key_groups)
        self.next.catch_up(wm, key_groups)

    def _fire(self, wm: int, skip: Callable[[bytes], bool] | None = None) -> None:
        skip = self._awaited() if skip is None else skip
        for end, _, key, ingest in self.fire_index.pop_due(wm, skip):
            self.state.set_current_key(key)
            self._fire_window(key, end, ingest)
        for at, _, key, _ in self.cleanup_index.pop_due(wm, skip):
            self.state.set_current_key(key)
            self._clean_window(key, at - self.spec.allowed_lateness_ms)

    def _fire_window(self, key: Any, end: int, ingest: float) -> None:
        raise NotImplementedError

    def _clean_window(self, key: Any, end: int) -> None:
        raise NotImplementedError

    def _after_fire(self, kb: bytes, key: Any, end: int, ingest: float) -> bool:
        """Whether the fired window's state stays for late records (then its cleanup is due later)."""
        if self.spec.allowed_lateness_ms:
            self.cleanup_index.add(end + self.spec.allowed_lateness_ms, kb, key, ingest)
            return True
        return False

    # -- handover (replication.runtime.handovers): the indexes move with the keys' state ----------
    def cut_keys(self, in_cut: Callable[[int], bool]) -> list[IndexEntry]:
        """An origin: take the index entries of the keys whose key group ``in_cut`` (their
        accumulators leave with the keyed state)."""
        groups = self.env.num_key_groups
        moving: Callable[[bytes], bool] = lambda kb: in_cut(key_group(kb, groups))  # noqa: E731
        return self.fire_index.cut(moving, 0) + self.cleanup_index.cut(moving, 1)

    def adopt_keys(self, entries: Iterable[IndexEntry]) -> None:
        """A target, once it loaded the moved state: the origin's index entries of those keys
        (merged with its own where it served them meanwhile: the newest ingest time stays)."""
        for at, kb, key, ingest, *which in entries:
            (self.cleanup_index if which and which[0] else self.fire_index).add(at, kb, key, ingest)

    def fire_behind(self) -> None:
        """A target, after the records it held: fire moved windows that are already behind this
        partition's watermark (no record can still come for them in time)."""
        self._fire(self.watermark)

    @property
    def mergeable(self) -> bool:
        """Whether a handover target may serve its moved keys at once (merging accumulators)."""
        return False

    def snapshot(self) -> Any:
        return self.watermark, self.fire_index.snapshot(), self.cleanup_index.snapshot()

    def restore(self, snapshot: Any) -> None:
        self.watermark, due = snapshot[0], snapshot[1]
        self.fire_index.due = due
        self.cleanup_index.due = snapshot[2] if len(snapshot) > 2 else {}

    def restore_savepoint(self, snapshots: list[Any], owns: Callable[[int], bool]) -> None:
        """The lowest watermark of the old partitions (they had the same sources), and the index
        entries of the keys this partition owns now (their windows' accumulators are in its state)."""
        self.watermark = min((s[0] for s in snapshots), default=self.watermark)
        groups = self.env.num_key_groups
        self.adopt_keys((at, kb, key, ingest, which) for s in snapshots
                        for which, index in enumerate(s[1:3]) for at, keys in index.items()
                        for kb, (key, ingest) in keys.items() if owns(key_group(kb, groups)))


class WindowOperator(_WindowBase):
    """Fixed event-time windows (tumbling or sliding): accumulators in keyed map state, window
    start -> acc."""

    def __init__(self, name: str, env: Any, windows: Windows, aggregator: Any, late_tag: str | None = None) -> None:
        super().__init__(name, env, windows, aggregator, late_tag)
        self.size = windows.size_ms

    def process(self, rec: tuple) -> None:
        ts, key = rec[3], rec[2]
        horizon = self.watermark - self.spec.allowed_lateness_ms  # windows ending by it are gone
        starts = [s for s in self.spec.starts(ts) if s + self.size > horizon]
        if not starts:
            self._late(rec, f"its {self.spec.describe()} already closed")
            return
        self.state.set_current_key(key)
        accs = []
        try:
            for start in starts:
                acc = self.windows.get(start, _NO_ACC)
                accs.append(self.agg.add(self.agg.create() if acc is _NO_ACC else acc, rec[1]))
        except Exception as exc:  # noqa: BLE001 - user code
            self.dead_letter(rec, describe_error(exc))
            return
        kb = encode_key(key)
        for start, acc in zip(starts, accs, strict=True):
            self.windows.put(start, acc)
            end = start + self.size
            if end <= self.watermark:  # fired already, within the allowed lateness: the update now
                self.cleanup_index.add(end + self.spec.allowed_lateness_ms, kb, key, rec[4])
                self._emit(key, start, end, acc, rec[4])
            else:
                self.fire_index.add(end, kb, key, rec[4])

    def _fire_window(self, key: Any, end: int, ingest: float) -> None:
        start = end - self.size
        acc = self.windows.get(start)
        if not self._after_fire(encode_key(key), key, end, ingest):
            self.windows.remove(start)
        self._emit(key, start, end, acc, ingest)

    def _clean_window(self, key: Any, end: int) -> None:
        self.windows.remove(end - self.size)

    @property
    def mergeable(self) -> bool:
        """Whether its accumulators merge (:meth:`replication.functions.Aggregator.merge`) and no
        fired window takes late records: then a handover target serves moved keys at once."""
        return mergeable(self.agg) and not self.spec.allowed_lateness_ms

    @property
    def state_prefix(self) -> bytes:
        """What every physical key of its accumulators starts with (after the key group)."""
        return self.windows.state_id

    def merge_raw(self, moved: bytes, served: bytes) -> bytes:
        """A target that served moved keys: the moved accumulator (the origin's records) merged with
        the one it built since the switch (the records after them), as stored."""
        return canonical_dumps(self.agg.merge(pickle.loads(moved), pickle.loads(served)))


class SessionWindowOperator(_WindowBase):
    """Session windows per key: keyed map state, session start -> (end, acc); a record's window
    ``[ts, ts + gap)`` merges with every session it overlaps (the aggregator's ``merge``, in start
    order)."""

    def process(self, rec: tuple) -> None:
        ts, key = rec[3], rec[2]
        gap = self.spec.session_gap_ms
        self.state.set_current_key(key)
        sessions = [(start, end, acc) for start, (end, acc) in self.windows.items()]
        overlapping = [s for s in sessions if s[0] < ts + gap and ts < s[1]]
        start = min([ts, *(s[0] for s in overlapping)])
        end = max([ts + gap, *(s[1] for s in overlapping)])
        if end + self.spec.allowed_lateness_ms <= self.watermark:
            self._late(rec, f"its session [{start}, {end}) already closed")
            return
        try:
            parts = sorted([*((s[0], s[2]) for s in overlapping), (ts, self.agg.add(self.agg.create(), rec[1]))],
                           key=lambda p: p[0])
            acc = parts[0][1]
            for _, more in parts[1:]:
                acc = self.agg.merge(acc, more)
        except Exception as exc:  # noqa: BLE001 - user code
            self.dead_letter(rec, describe_error(exc))
            return
        kb = encode_key(key)
        ingest = rec[4]
        for old_start, old_end, _ in overlapping:
            self.windows.remove(old_start)
            for index in (self.fire_index, self.cleanup_index):
                old = index.remove(old_end if index is self.fire_index else
                                   old_end + self.spec.allowed_lateness_ms, kb)
                ingest = max(ingest, old) if old is not None else ingest
        self.windows.put(start, (end, acc))
        if end <= self.watermark:  # a fired session, within the allowed lateness: the update now
            self.cleanup_index.add(end + self.spec.allowed_lateness_ms, kb, key, ingest)
            self._emit(key, start, end, acc, ingest)
        else:
            self.fire_index.add(end, kb, key, ingest)

    def _session_ending(self, end: int) -> tuple[int, Any] | None:
        for start, (session_end, acc) in self.windows.items():
            if session_end == end:
                return start, acc
        return None

    def _fire_window(self, key: Any, end: int, ingest: float) -> None:
        found = self._session_ending(end)
        if found is None:
            return
        start, acc = found
        if not self._after_fire(encode_key(key), key, end, ingest):
            self.windows.remove(start)
        self._emit(key, start, end, acc, ingest)

    def _clean_window(self, key: Any, end: int) -> None:
        found = self._session_ending(end)
        if found is not None:
            self.windows.remove(found[0])


def serves_through_moves(operators: Iterable[Operator]) -> bool:
    """Whether a task running ``operators`` can serve keys it takes over in a handover from the
    switch on: its only keyed state is fixed windows whose aggregators merge (a process function's
    state, or a session's, cannot be rebuilt from two halves, so its records wait for the moved
    state)."""
    stateful = [op for op in operators if isinstance(op, (ProcessOperator, _WindowBase))]
    return bool(stateful) and all(isinstance(op, _WindowBase) and op.mergeable for op in stateful)
