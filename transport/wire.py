"""A safe encoding for control-plane messages: msgpack of plain data and registered dataclasses.

Decoding builds nothing but plain values (``None``, bools, ints of any size, floats, ``str``,
``bytes``, lists, dicts, tuples, sets, frozensets, :class:`collections.Counter`) and instances
of the dataclasses and enums registered with :func:`record` or :func:`register`.  It never
imports a name or calls a constructor the bytes choose, so a message from the network cannot
run code (unlike ``pickle``).  A registered dataclass is rebuilt field by field, without
running its ``__init__`` or ``__post_init__``, as ``pickle`` does.

Tuples, sets and records travel as msgpack extension types; that costs a nested pack per
tuple, so bulk rows of scalars (state entries) go through :func:`pack_rows`, which msgpack's C
code packs in one pass.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import msgpack

__all__ = ["WireError", "decode", "encode", "pack_rows", "record", "register", "unpack_rows"]

T = TypeVar("T")

_TUPLE, _SET, _FROZENSET, _RECORD, _ENUM, _BIGINT, _COUNTER = range(1, 8)
_INT64 = (-(2**63), 2**64 - 1)

_RECORDS: dict[str, type] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}
_ENUMS: dict[str, type[enum.Enum]] = {}


class WireError(ValueError):
    """Bytes that do not decode to an allowed message (or a value that cannot be encoded)."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(*classes: type) -> None:
    """Allow these dataclasses and enums in messages (idempotent)."""
    for cls in classes:
        if isinstance(cls, type) and issubclass(cls, enum.Enum):
            _ENUMS[_name(cls)] = cls
        elif dataclasses.is_dataclass(cls) and isinstance(cls, type):
            _RECORDS[_name(cls)] = cls
            _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
        else:
            raise TypeError(f"only dataclasses and enums can be registered, not {cls!r}")


def record(cls: type[T]) -> type[T]:
    """Class decorator: :func:`register` a dataclass (or enum) as a message type."""
    register(cls)
    return cls


# -- encoding --------------------------------------------------------------------------------------

def _default(obj: Any) -> Any:
    kind = type(obj)
    if kind is tuple:
        return msgpack.ExtType(_TUPLE, _pack(list(obj)))
    if kind in _FIELDS:
        return msgpack.ExtType(_RECORD, _pack([_name(kind), *(getattr(obj, f) for f in _FIELDS[kind])]))
    if isinstance(obj, enum.Enum) and _name(kind) in _ENUMS:
        return msgpack.ExtType(_ENUM, _pack([_name(kind), obj.value]))
    if kind is set:
        return msgpack.ExtType(_SET, _pack(list(obj)))
    if kind is frozenset:
        return msgpack.ExtType(_FROZENSET, _pack(list(obj)))
    if kind is Counter:
        return msgpack.ExtType(_COUNTER, _pack(dict(obj)))
    if kind is int:  # beyond 64 bits
        return msgpack.ExtType(_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True))
    if kind in (bytearray, memoryview):
        return bytes(obj)
    if isinstance(obj, int) and not isinstance(obj, enum.Enum):  # an int subclass (e.g. numpy's are not)
        return int(obj)
    if isinstance(obj, str):
        return str(obj)
    raise TypeError(f"cannot encode a {_name(kind)} in a message (register it with transport.wire.record)")


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)


def encode(obj: Any) -> bytes:
    """The bytes of ``obj`` (plain data and registered dataclasses and enums)."""
    try:
        return _pack(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(str(exc)) from None


# -- decoding --------------------------------------------------------------------------------------

def _build(name: str, values: Sequence[Any]) -> Any:
    cls = _RECORDS.get(name)
    if cls is None:
        raise WireError(f"{name!r} is not a message type")
    fields = _FIELDS[cls]
    if len(values) != len(fields):
        raise WireError(f"{name} has {len(fields)} fields, the message carries {len(values)}")
    obj = object.__new__(cls)
    for field_name, value in zip(fields, values, strict=True):
        object.__setattr__(obj, field_name, value)
    return obj


def _ext(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int.from_bytes(data, "big", signed=True)
    value = _unpack(data)
    if code == _TUPLE:
        return tuple(value)
    if code == _SET:
        return set(value)
    if code == _FROZENSET:
        return frozenset(value)
    if code == _COUNTER:
        return Counter(value)
    if code == _RECORD:
        return _build(value[0], value[1:])
    if code == _ENUM:
        cls = _ENUMS.get(value[0])
        if cls is None:
            raise WireError(f"{value[0]!r} is not a message enum")
        return cls(value[1])
    raise WireError(f"unknown extension type {code}")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext, raw=False, strict_map_key=False, use_list=True)


def decode(data: bytes | memoryview, expect: type[T] | tuple[type, ...] | None = None) -> T:
    """Decode ``data``; with ``expect``, it must be an instance of that type (or one of those)."""
    try:
        obj = _unpack(data)
    except WireError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, msgpack.UnpackException) as exc:
        raise WireError(f"undecodable message: {type(exc).__name__}: {exc}") from None
    if expect is not None and not isinstance(obj, expect):
        want = expect.__name__ if isinstance(expect, type) else " or ".join(t.__name__ for t in expect)
        raise WireError(f"expected a {want}, got a {type(obj).__name__}")
    return obj


# -- bulk rows -------------------------------------------------------------------------------------

def pack_rows(rows: Iterable[Sequence[Any]]) -> bytes:
    """Rows of scalars (ints within 64 bits, floats, ``str``, ``bytes``, ``None``) in one pass."""
    try:
        return msgpack.packb(rows if isinstance(rows, list) else list(rows), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"rows must hold scalars only: {exc}") from None


def unpack_rows(data: bytes | memoryview) -> list[tuple]:
    """The rows :func:`pack_rows` packed, each as a tuple."""
    try:
        rows = msgpack.unpackb(data, raw=False, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(f"undecodable rows: {exc}") from None
    if not isinstance(rows, tuple):
        raise WireError("rows must be a sequence")
    return list(rows)
