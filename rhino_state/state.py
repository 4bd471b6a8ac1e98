"""User-facing keyed state handles bound to the current key of a keyed operator.

Physical layout (after the backend's 2-byte key-group prefix)::

    state id (4 bytes: xxh32 of "<operator_uid>/<name>")
    + len(encoded key) (4 bytes, big endian) + encoded key
    [+ encoded map key]                        # MapState only

Values are pickled (protocol 5) canonically (:func:`canonical_dumps`): sets and frozensets in a
sorted order, so that equal values are equal bytes in every process (a set of strings iterates
in an order that depends on the process's ``PYTHONHASHSEED``) and the two replicas' state
digests agree.  State never leaves the replica in object form (checkpoints ship the raw bytes),
so both replicas decode what they encoded.
Every read returns a freshly unpickled object, so mutating a value read from
state changes nothing until it is written back with ``update``/``put``.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import Any

import xxhash

from rhino_state.backend import RocksDBStateBackend
from rhino_state.keys import Key, decode_key, encode_key, stable_hash, validate_num_key_groups

__all__ = ["MapState", "NoCurrentKeyError", "StateContext", "ValueState", "canonical_dumps"]

_PICKLE_PROTOCOL = 5
_MISSING = object()


class NoCurrentKeyError(RuntimeError):
    """A state handle was used before ``StateContext.set_current_key``."""


# the opcodes with which protocol 5 writes a set or frozenset (the C pickler's fast path)
_EMPTY_SET, _FROZENSET = pickle.EMPTY_SET, pickle.FROZENSET


def _sorted(items: set | frozenset) -> list:
    try:
        return sorted(items)
    except TypeError:  # elements of mixed or unorderable types
        return sorted(items, key=canonical_dumps)


class _CanonicalPickler(pickle._Pickler):
    """The pure-Python pickler (the C one pickles exact sets without consulting any hook), with
    sets and frozensets written in sorted order; everything else as ``pickle`` writes it."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_set(self, obj: set) -> None:
        self.write(pickle.EMPTY_SET)
        self.memoize(obj)
        items = _sorted(obj)
        for i in range(0, len(items), self._BATCHSIZE):
            self.write(pickle.MARK)
            for item in items[i:i + self._BATCHSIZE]:
                self.save(item)
            self.write(pickle.ADDITEMS)

    def _save_frozenset(self, obj: frozenset) -> None:
        self.write(pickle.MARK)
        for item in _sorted(obj):
            self.save(item)
        if id(obj) in self.memo:  # recursive: drop what was pushed, fetch it from the memo
            self.write(pickle.POP_MARK + self.get(self.memo[id(obj)][0]))
            return
        self.write(pickle.FROZENSET)
        self.memoize(obj)

    dispatch[set] = _save_set
    dispatch[frozenset] = _save_frozenset


def canonical_dumps(value: Any) -> bytes:
    """``value`` pickled (protocol 5) so that equal values give equal bytes in every process:
    by ``pickle`` itself when that wrote no set (the usual case, at C speed), else again by
    :class:`_CanonicalPickler` (also when those opcode bytes only occur inside a string)."""
    data = pickle.dumps(value, protocol=_PICKLE_PROTOCOL)
    if _EMPTY_SET not in data and _FROZENSET not in data:
        return data
    out = io.BytesIO()
    _CanonicalPickler(out, protocol=_PICKLE_PROTOCOL).dump(value)
    return out.getvalue()


_dumps = canonical_dumps


class StateContext:
    """Keyed state of one operator in a backend; tracks the key of the element being processed."""

    def __init__(self, backend: RocksDBStateBackend, operator_uid: str, num_key_groups: int) -> None:
        if not isinstance(operator_uid, str) or not operator_uid or "/" in operator_uid:
            raise ValueError(f"operator_uid must be a non-empty str without '/', got {operator_uid!r}")
        self.backend = backend
        self.operator_uid = operator_uid
        self.num_key_groups = validate_num_key_groups(num_key_groups)
        self._states: dict[str, ValueState | MapState] = {}
        self._state_ids: dict[bytes, str] = {}
        self._key: Key = _MISSING
        self._key_group = -1
        self._key_part = b""

    def set_current_key(self, key: Key) -> None:
        """Bind every handle of this context to ``key`` (encodes and hashes it once)."""
        key_bytes = encode_key(key)
        self._key = key
        self._key_group = stable_hash(key_bytes) & (self.num_key_groups - 1)
        self._key_part = len(key_bytes).to_bytes(4, "big") + key_bytes

    @property
    def current_key(self) -> Key:
        """The current key; raises NoCurrentKeyError if none was set."""
        self._require_key()
        return self._key

    @property
    def current_key_group(self) -> int:
        """Key group of the current key."""
        return self._require_key()[0]

    def value_state(self, name: str, default: Any = None) -> ValueState:
        """The ValueState called ``name`` (created on first use)."""
        state = self._register(name, ValueState, default)
        assert isinstance(state, ValueState)
        return state

    def map_state(self, name: str) -> MapState:
        """The MapState called ``name`` (created on first use)."""
        state = self._register(name, MapState, None)
        assert isinstance(state, MapState)
        return state

    def _register(
        self, name: str, kind: type[ValueState] | type[MapState], default: Any
    ) -> ValueState | MapState:
        if not isinstance(name, str) or not name:
            raise ValueError(f"state name must be a non-empty str, got {name!r}")
        existing = self._states.get(name)
        if existing is not None:
            if type(existing) is not kind:
                raise ValueError(
                    f"state {name!r} of operator {self.operator_uid!r} is already registered as "
                    f"{type(existing).__name__}, not {kind.__name__}"
                )
            if isinstance(existing, ValueState) and existing.default_bytes != _dumps(default):
                raise ValueError(f"ValueState {name!r} is already registered with a different default")
            return existing
        state_id = self.reserve_id(name)
        state = (
            ValueState(self, state_id, name, default)
            if kind is ValueState
            else MapState(self, state_id, name)
        )
        self._states[name] = state
        return state

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

    def _require_key(self) -> tuple[int, bytes]:
        if self._key is _MISSING:
            raise NoCurrentKeyError(
                f"no current key in operator {self.operator_uid!r}: keyed state is only available while "
                "processing an element (call StateContext.set_current_key first)"
            )
        return self._key_group, self._key_part


class ValueState:
    """One value per key."""

    def __init__(self, context: StateContext, state_id: bytes, name: str, default: Any = None) -> None:
        self._context = context
        self._state_id = state_id
        self.name = name
        self.default_bytes = _dumps(default)
        self._default_is_none = default is None

    def _location(self) -> tuple[int, bytes]:
        key_group, key_part = self._context._require_key()
        return key_group, self._state_id + key_part

    def value(self) -> Any:
        """The value for the current key, or (a fresh copy of) the default."""
        raw = self._context.backend.get(*self._location())
        if raw is None:
            return None if self._default_is_none else pickle.loads(self.default_bytes)
        return pickle.loads(raw)

    def update(self, value: Any) -> None:
        """Set the value for the current key (``None`` is stored as a value)."""
        key_group, rest = self._location()
        self._context.backend.put(key_group, rest, _dumps(value))

    def clear(self) -> None:
        """Remove the value for the current key."""
        self._context.backend.delete(*self._location())


class MapState:
    """A map per key; iteration is in encoded map-key order, for the current key only."""

    def __init__(self, context: StateContext, state_id: bytes, name: str) -> None:
        self._context = context
        self._state_id = state_id
        self.name = name

    def _prefix(self) -> tuple[int, bytes]:
        key_group, key_part = self._context._require_key()
        return key_group, self._state_id + key_part

    def get(self, map_key: Key, default: Any = None) -> Any:
        """Value under ``map_key`` or ``default``."""
        key_group, prefix = self._prefix()
        raw = self._context.backend.get(key_group, prefix + encode_key(map_key))
        return default if raw is None else pickle.loads(raw)

    def put(self, map_key: Key, value: Any) -> None:
        """Set ``map_key`` to ``value``."""
        key_group, prefix = self._prefix()
        self._context.backend.put(key_group, prefix + encode_key(map_key), _dumps(value))

    def remove(self, map_key: Key) -> None:
        """Remove ``map_key``; a no-op if absent."""
        key_group, prefix = self._prefix()
        self._context.backend.delete(key_group, prefix + encode_key(map_key))

    def contains(self, map_key: Key) -> bool:
        """Whether ``map_key`` is present."""
        key_group, prefix = self._prefix()
        return self._context.backend.get(key_group, prefix + encode_key(map_key)) is not None

    def _raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        key_group, prefix = self._prefix()
        return (
            (rest[len(prefix) :], raw) for rest, raw in self._context.backend.iter_prefix(key_group, prefix)
        )

    def items(self) -> Iterator[tuple[Key, Any]]:
        """``(map_key, value)`` pairs of the current key."""
        return ((decode_key(k), pickle.loads(v)) for k, v in self._raw_items())

    def keys(self) -> Iterator[Key]:
        """Map keys of the current key."""
        return (decode_key(k) for k, _ in self._raw_items())

    def values(self) -> Iterator[Any]:
        """Values of the current key."""
        return (pickle.loads(v) for _, v in self._raw_items())

    def is_empty(self) -> bool:
        """Whether the current key has no entries."""
        return next(self._raw_items(), None) is None

    def clear(self) -> None:
        """Remove every entry of the current key."""
        key_group, prefix = self._prefix()
        for map_key, _ in list(self._raw_items()):
            self._context.backend.delete(key_group, prefix + map_key)
