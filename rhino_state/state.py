"""User-facing keyed state handles bound to the current key of a keyed operator.

Physical layout (after the backend's 2-byte key-group prefix)::

    state id (4 bytes: xxh32 of "<operator_uid>/<name>")
    + len(encoded key) (4 bytes, big endian) + encoded key
    [+ encoded map key]                        # MapState only
    [+ element index (8 bytes)]                # ListState (without: its next index)

Values are pickled (protocol 5) canonically (:func:`canonical_dumps`): sets and frozensets in a
sorted order, so that equal values are equal bytes in every process (a set of strings iterates
in an order that depends on the process's ``PYTHONHASHSEED``) and the two replicas' state
digests agree.  State never leaves the replica in object form (checkpoints ship the raw bytes),
so both replicas decode what they encoded.
Every read returns a freshly unpickled object, so mutating a value read from
state changes nothing until it is written back with ``update``/``put``.

A state declared with a TTL (:mod:`rhino_state.ttl`) hides values whose expiry the watermark (or,
by processing time, the pulses' time) reached; the operator gives the context its times
(:meth:`StateContext.set_time`, :attr:`StateContext.processing_time`) and a timer queue per time
for the sweeps that delete them (:attr:`StateContext.sweeps`, :attr:`StateContext.processing_sweeps`).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import xxhash

from rhino_state.backend import RocksDBStateBackend
from rhino_state.canonical import canonical_dumps
from rhino_state.keys import Key, decode_key, encode_key, stable_hash, validate_num_key_groups
from rhino_state.timers import TimerQueue
from rhino_state.ttl import EXPIRED, PROCESSING_TIME, StateTtl, codec_for

__all__ = ["ListState", "MapState", "NoCurrentKeyError", "StateContext", "ValueState"]

_MISSING = object()


class NoCurrentKeyError(RuntimeError):
    """A state handle was used before ``StateContext.set_current_key``."""




class StateContext:
    """Keyed state of one operator in a backend; tracks the key of the element being processed."""

    def __init__(self, backend: RocksDBStateBackend, operator_uid: str, num_key_groups: int) -> None:
        if not isinstance(operator_uid, str) or not operator_uid or "/" in operator_uid:
            raise ValueError(f"operator_uid must be a non-empty str without '/', got {operator_uid!r}")
        self.backend = backend
        self.operator_uid = operator_uid
        self.num_key_groups = validate_num_key_groups(num_key_groups)
        self._states: dict[str, _Handle] = {}
        self._state_ids: dict[bytes, str] = {}
        self._key: Key = _MISSING
        self._key_group = -1
        self._key_part = b""
        self.now = 0  # event time of the element being processed (at least the watermark): TTL writes
        self.watermark = -(1 << 63)  # TTL reads: a value whose expiry it reached is gone
        self.sweeps: TimerQueue | None = None  # where TTL writes schedule the sweep of their key
        self.processing_time = 0  # the time of the last pulse the operator passed: processing-time TTL
        self.processing_sweeps: TimerQueue | None = None  # None: no processing time here, such TTLs refused

    def set_current_key(self, key: Key) -> None:
        """Bind every handle of this context to ``key`` (encodes and hashes it once)."""
        key_bytes = encode_key(key)
        self._key = key
        self._key_group = stable_hash(key_bytes) & (self.num_key_groups - 1)
        self._key_part = len(key_bytes).to_bytes(4, "big") + key_bytes

    def set_time(self, timestamp: int, watermark: int) -> None:
        """The element being processed has event time ``timestamp``; the operator's watermark is
        ``watermark`` (TTL: writes expire from ``max(timestamp, watermark)`` on)."""
        self.watermark = watermark
        self.now = max(timestamp, watermark)

    @property
    def current_key(self) -> Key:
        """The current key; raises NoCurrentKeyError if none was set."""
        self._require_key()
        return self._key

    @property
    def current_key_group(self) -> int:
        """Key group of the current key."""
        return self._require_key()[0]

    def value_state(self, name: str, default: Any = None, ttl: StateTtl | None = None) -> ValueState:
        """The ValueState called ``name`` (created on first use)."""
        state = self._register(name, ValueState, default, ttl)
        assert isinstance(state, ValueState)
        return state

    def map_state(self, name: str, ttl: StateTtl | None = None) -> MapState:
        """The MapState called ``name`` (created on first use)."""
        state = self._register(name, MapState, None, ttl)
        assert isinstance(state, MapState)
        return state

    def list_state(self, name: str, ttl: StateTtl | None = None) -> ListState:
        """The ListState called ``name`` (created on first use)."""
        state = self._register(name, ListState, None, ttl)
        assert isinstance(state, ListState)
        return state

    def _register(self, name: str, kind: type[_Handle], default: Any, ttl: StateTtl | None) -> _Handle:
        if not isinstance(name, str) or not name:
            raise ValueError(f"state name must be a non-empty str, got {name!r}")
        existing = self._states.get(name)
        if existing is not None:
            if type(existing) is not kind:
                raise ValueError(
                    f"state {name!r} of operator {self.operator_uid!r} is already registered as "
                    f"{type(existing).__name__}, not {kind.__name__}"
                )
            if isinstance(existing, ValueState) and existing.default_bytes != canonical_dumps(default):
                raise ValueError(f"ValueState {name!r} is already registered with a different default")
            if existing.ttl != ttl:
                raise ValueError(f"state {name!r} is already registered with another TTL ({existing.ttl})")
            return existing
        if ttl is not None and ttl.time == PROCESSING_TIME and self.processing_sweeps is None:
            raise TypeError(f"state {name!r} of operator {self.operator_uid!r} has a processing-time TTL: "
                            "processing time comes with LiveRobin's pulses or KaZoo's orders "
                            "(spark.replication.mode=liverobin or kazoo)")
        state = kind(self, self.reserve_id(name), name, ttl)
        if isinstance(state, ValueState):
            state.set_default(default)
        self._states[name] = state
        return state

    def handles(self) -> dict[str, _Handle]:
        """The states registered so far, by name (reserved names included)."""
        return dict(self._states)

    def forget_handles(self) -> None:
        """A new version of the operator's function registers its states afresh (defaults and TTLs
        may change; the state stays)."""
        self._states.clear()

    def reserve_id(self, name: str) -> bytes:
        """The 4-byte state id of the state called ``name`` of this operator, reserved for it (a
        name whose id another name of the operator holds is refused)."""
        state_id = xxhash.xxh32_intdigest(f"{self.operator_uid}/{name}".encode(), 0).to_bytes(4, "big")
        clash = self._state_ids.get(state_id)
        if clash is not None and clash != name:
            raise ValueError(f"state names {clash!r} and {name!r} hash to the same state id; rename one")
        self._state_ids[state_id] = name
        return state_id

    def key_location(self) -> tuple[int, bytes]:
        """``(key group, key part)`` of the current key: where its state lies (the key part is the
        length-prefixed encoded key that follows a state id)."""
        return self._require_key()

    def sweep(self, key_group: int, target: bytes) -> None:
        """A sweep the TTL writes scheduled came due: delete what expired of one key's state
        (``target``: the state id and the key part)."""
        name = self._state_ids.get(target[:4])
        state = self._states.get(name) if name is not None else None
        if state is not None:
            state.sweep(key_group, target[4:])

    def clock(self, ttl: StateTtl) -> tuple[int, int]:
        """``(now, horizon)`` for a TTL: the time a write expires from, and the time up to which
        values have expired (event time: the element's time and the watermark; processing time:
        the last pulse's time for both)."""
        if ttl.time == PROCESSING_TIME:
            return self.processing_time, self.processing_time
        return self.now, self.watermark

    def _scheduled(self, state: _Handle, key_group: int, key_part: bytes) -> None:
        ttl = state.ttl
        assert ttl is not None
        sweeps = self.processing_sweeps if ttl.time == PROCESSING_TIME else self.sweeps
        if sweeps is not None:
            sweeps.register(key_group, state.state_id + key_part, ttl.sweep_at(self.clock(ttl)[0] + ttl.ttl_ms))

    def _require_key(self) -> tuple[int, bytes]:
        if self._key is _MISSING:
            raise NoCurrentKeyError(
                f"no current key in operator {self.operator_uid!r}: keyed state is only available while "
                "processing an element (call StateContext.set_current_key first)"
            )
        return self._key_group, self._key_part


class _Handle:
    """What every state handle shares: its id, codec (TTL or not) and context."""

    def __init__(self, context: StateContext, state_id: bytes, name: str, ttl: StateTtl | None = None) -> None:
        self._context = context
        self.state_id = state_id
        self.name = name
        self.ttl = ttl
        self._codec = codec_for(ttl)

    def _prefix(self) -> tuple[int, bytes]:
        key_group, key_part = self._context._require_key()
        return key_group, self.state_id + key_part

    def _write(self, key_group: int, rest: bytes, value: Any) -> None:
        """Store ``value`` under ``rest`` of the current key (a TTL write schedules its sweep)."""
        context = self._context
        if self.ttl is None:
            context.backend.put(key_group, rest, self._codec.encode(value, 0))
            return
        context.backend.put(key_group, rest, self._codec.encode(value, context.clock(self.ttl)[0]))
        context._scheduled(self, key_group, context._key_part)

    def _read(self, raw: bytes | None) -> Any:
        if raw is None:
            return EXPIRED
        return self._codec.decode(raw, 0 if self.ttl is None else self._context.clock(self.ttl)[1])

    def _live(self, raw_items: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, Any]]:
        for suffix, raw in raw_items:
            value = self._read(raw)
            if value is not EXPIRED:
                yield suffix, value

    def _raw_items(self, key_group: int, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return ((rest[len(prefix) :], raw) for rest, raw in self._context.backend.iter_prefix(key_group, prefix))

    def sweep(self, key_group: int, key_part: bytes) -> None:
        """Delete the key's expired values (its value, entries or elements)."""
        self._sweep(key_group, self.state_id + key_part, self._raw_items(key_group, self.state_id + key_part))

    def _sweep(self, key_group: int, prefix: bytes, raw_items: Iterator[tuple[bytes, bytes]]) -> None:
        if self.ttl is None:
            return
        backend, horizon = self._context.backend, self._context.clock(self.ttl)[1]
        for suffix, raw in list(raw_items):
            expiry = self._codec.expiry(raw)
            if expiry is not None and expiry <= horizon:
                backend.delete(key_group, prefix + suffix)


class ValueState(_Handle):
    """One value per key."""

    def set_default(self, default: Any) -> None:
        self.default_bytes = canonical_dumps(default)
        self._default_is_none = default is None

    def _location(self) -> tuple[int, bytes]:
        return self._prefix()

    def value(self) -> Any:
        """The value for the current key, or (a fresh copy of) the default."""
        value = self._read(self._context.backend.get(*self._location()))
        if value is EXPIRED:
            return None if self._default_is_none else pickle.loads(self.default_bytes)
        return value

    def contains(self) -> bool:
        """Whether the current key has a value (not expired): :meth:`value` is not the default."""
        return self._read(self._context.backend.get(*self._location())) is not EXPIRED

    def update(self, value: Any) -> None:
        """Set the value for the current key (``None`` is stored as a value)."""
        self._write(*self._location(), value)

    def clear(self) -> None:
        """Remove the value for the current key."""
        self._context.backend.delete(*self._location())


class MapState(_Handle):
    """A map per key; iteration is in encoded map-key order, for the current key only."""

    def get(self, map_key: Key, default: Any = None) -> Any:
        """Value under ``map_key`` or ``default``."""
        key_group, prefix = self._prefix()
        value = self._read(self._context.backend.get(key_group, prefix + encode_key(map_key)))
        return default if value is EXPIRED else value

    def put(self, map_key: Key, value: Any) -> None:
        """Set ``map_key`` to ``value``."""
        key_group, prefix = self._prefix()
        self._write(key_group, prefix + encode_key(map_key), value)

    def remove(self, map_key: Key) -> None:
        """Remove ``map_key``; a no-op if absent."""
        key_group, prefix = self._prefix()
        self._context.backend.delete(key_group, prefix + encode_key(map_key))

    def contains(self, map_key: Key) -> bool:
        """Whether ``map_key`` is present."""
        key_group, prefix = self._prefix()
        return self._read(self._context.backend.get(key_group, prefix + encode_key(map_key))) is not EXPIRED

    def _entries(self) -> Iterator[tuple[bytes, Any]]:
        return self._live(self._raw_items(*self._prefix()))

    def items(self) -> Iterator[tuple[Key, Any]]:
        """``(map_key, value)`` pairs of the current key."""
        return ((decode_key(k), v) for k, v in self._entries())

    def keys(self) -> Iterator[Key]:
        """Map keys of the current key."""
        return (decode_key(k) for k, _ in self._entries())

    def values(self) -> Iterator[Any]:
        """Values of the current key."""
        return (v for _, v in self._entries())

    def is_empty(self) -> bool:
        """Whether the current key has no entries."""
        return next(self._entries(), None) is None

    def clear(self) -> None:
        """Remove every entry of the current key."""
        key_group, prefix = self._prefix()
        for map_key, _ in list(self._raw_items(key_group, prefix)):
            self._context.backend.delete(key_group, prefix + map_key)


class ListState(_Handle):
    """A list per key: appending does not read the list; reading gives it in the order added."""

    def _next_index(self, key_group: int, prefix: bytes) -> int:
        raw = self._context.backend.get(key_group, prefix)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def _elements(self, key_group: int, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return ((suffix, raw) for suffix, raw in self._raw_items(key_group, prefix) if suffix)  # not the index

    def get(self) -> list[Any]:
        """The current key's elements, oldest first (a fresh list)."""
        return [v for _, v in self._live(self._elements(*self._prefix()))]

    def add(self, value: Any) -> None:
        """Append ``value``."""
        self.add_all((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every value of ``values``, in order."""
        key_group, prefix = self._prefix()
        index = start = self._next_index(key_group, prefix)
        for value in values:
            self._write(key_group, prefix + index.to_bytes(8, "big"), value)
            index += 1
        if index != start:
            self._context.backend.put(key_group, prefix, index.to_bytes(8, "big"))

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list with ``values``."""
        self.clear()
        self.add_all(values)

    def is_empty(self) -> bool:
        """Whether the current key has no elements."""
        return next(self._live(self._elements(*self._prefix())), None) is None

    def clear(self) -> None:
        """Remove every element of the current key."""
        key_group, prefix = self._prefix()
        for suffix, _ in list(self._raw_items(key_group, prefix)):
            self._context.backend.delete(key_group, prefix + suffix)

    def sweep(self, key_group: int, key_part: bytes) -> None:
        prefix = self.state_id + key_part
        self._sweep(key_group, prefix, self._elements(key_group, prefix))
        if next(self._elements(key_group, prefix), None) is None:
            self._context.backend.delete(key_group, prefix)  # no element left: no next index either
