"""Built-in (de)serializers, selectable by name in the API."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

Deserializer = Callable[[bytes], Any]
Serializer = Callable[[Any], bytes]


def json_loads(data: bytes) -> Any:
    # (not orjson: it reads an integer of over 64 bits as a float, losing digits)
    return json.loads(data)


def json_dumps(value: Any) -> bytes:
    """Compact JSON with sorted keys and non-ASCII characters escaped, as the json module writes
    it, by orjson (several times faster), by the json module where orjson writes otherwise or
    not at all (non-ASCII text and DEL, integers over 64 bits, non-string keys).  NaN and infinities
    are written as ``null`` (JSON has no such numbers)."""
    try:
        out = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        if out.isascii() and b"\x7f" not in out:  # (the json module escapes DEL, orjson does not)
            return out
    except TypeError:
        pass
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def utf8_decode(data: bytes) -> str:
    return data.decode("utf-8")


def utf8_encode(value: Any) -> bytes:
    return str(value).encode("utf-8")


def identity_bytes(data: bytes) -> bytes:
    return data


def to_bytes(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise TypeError(f"the 'bytes' serializer needs bytes, got {type(value).__name__}")
    return bytes(value)


DESERIALIZERS: dict[str, Deserializer] = {"json": json_loads, "str": utf8_decode, "bytes": identity_bytes}
SERIALIZERS: dict[str, Serializer] = {"json": json_dumps, "str": utf8_encode, "bytes": to_bytes}


def resolve(spec: str | Callable, table: dict[str, Callable], what: str) -> Callable:
    """A callable given as itself or by name from ``table``; anything else is a ValueError."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"{what} must be one of {sorted(table)} or a callable, got {spec!r}")
    try:
        return table[spec]
    except KeyError:
        raise ValueError(f"unknown {what} {spec!r}; use one of {sorted(table)} or a callable") from None
