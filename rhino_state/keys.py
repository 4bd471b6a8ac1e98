"""Stable key encoding, key groups, virtual nodes and the vnode routing table.

Everything here is deterministic across processes, machines and Python runs:
keys are encoded with a fixed type-tagged binary format (never ``pickle``) and
hashed with xxh64 (never the per-process salted ``hash()``).

Key encoding (``encode_key``)
    Supported: ``None``, ``bool``, ``int`` (any size), ``float``, ``str``,
    ``bytes`` and (nested) tuples of those. Subclasses encode as their base type
    (an ``IntEnum`` member as its ``int``, a namedtuple as a tuple). The type is
    part of the encoding, so ``1``, ``1.0`` and ``True`` are three different keys.
    Within one type, keys that compare equal encode equally (``-0.0`` as ``0.0``,
    every NaN as one canonical NaN). The encoding is self-delimiting and
    order-preserving within a type: byte order of encodings equals the natural
    order of ints, floats, strs (code points), bytes and tuples (lexicographic).
    Across types the order is None < bool < int < float < str < bytes < tuple.

Key groups and virtual nodes
    ``key_group = xxh64(encoded key) mod G`` with G a power of two in [1, 2**15]
    (it is stored as a 2-byte prefix). The G key groups are split into V virtual
    nodes of contiguous ranges, vnode ``v`` owning ``[v*G//V, (v+1)*G//V)``; any
    V in [1, G] is allowed (range sizes differ by at most one). G and V are fixed
    for the lifetime of a job; only the vnode -> partition map (``RoutingTable``)
    changes, one epoch per handover.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

__all__ = [
    "MAX_KEY_GROUPS",
    "Key",
    "RoutingTable",
    "decode_key",
    "encode_key",
    "key_group",
    "stable_hash",
    "validate_num_key_groups",
    "vnode_key_groups",
    "vnode_of",
]

#: Largest allowed number of key groups (the key-group prefix is 2 bytes).
MAX_KEY_GROUPS = 1 << 15

#: A supported user key (tuples may nest).
Key = Any

_NONE, _BOOL, _INT, _FLOAT, _STR, _BYTES, _TUPLE = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07
_TUPLE_END = 0x00  # sorts before every tag, so a tuple sorts before its extensions
_CANONICAL_NAN = struct.pack(">d", math.nan)
_SIGN_BIT = 1 << 63
_ALL_BITS = (1 << 64) - 1
_INVERT = bytes(0xFF - b for b in range(256))


# --------------------------------------------------------------------------- encoding


def encode_key(key: Key) -> bytes:
    """Encode a user key into stable, injective, type-tagged bytes."""
    out = bytearray()
    _encode_into(key, out)
    return bytes(out)


def _encode_into(key: Key, out: bytearray) -> None:
    if key is None:
        out.append(_NONE)
    elif isinstance(key, bool):
        out += bytes((_BOOL, 1 if key else 0))
    elif isinstance(key, int):
        out.append(_INT)
        _encode_int(int(key), out)
    elif isinstance(key, float):
        out.append(_FLOAT)
        out += _encode_float(float(key))
    elif isinstance(key, str):
        out.append(_STR)
        _encode_escaped(key.encode("utf-8", "surrogatepass"), out)
    elif isinstance(key, bytes):
        out.append(_BYTES)
        _encode_escaped(bytes(key), out)
    elif isinstance(key, tuple):
        out.append(_TUPLE)
        for item in key:
            _encode_into(item, out)
        out.append(_TUPLE_END)
    else:
        raise TypeError(
            f"unsupported key type {type(key).__qualname__!r}: keys must be None, bool, int, float, "
            "str, bytes or tuples of those"
        )


def _encode_int(value: int, out: bytearray) -> None:
    """Sign byte, then (length of length, length, magnitude); all inverted if negative."""
    magnitude = abs(value)
    mag = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
    length = len(mag).to_bytes((len(mag).bit_length() + 7) // 8, "big")
    body = bytes((len(length),)) + length + mag
    if value < 0:
        out.append(0x00)
        out += body.translate(_INVERT)
    else:
        out.append(0x01)
        out += body


def _encode_float(value: float) -> bytes:
    if math.isnan(value):
        raw = _CANONICAL_NAN
    else:
        raw = struct.pack(">d", value + 0.0)  # + 0.0 turns -0.0 into 0.0
    bits = int.from_bytes(raw, "big")
    bits = (bits ^ _ALL_BITS) if bits & _SIGN_BIT else (bits | _SIGN_BIT)
    return bits.to_bytes(8, "big")


def _encode_escaped(data: bytes, out: bytearray) -> None:
    """Order-preserving, self-delimiting: 0x00 -> 0x00 0xFF, terminated by 0x00 0x01."""
    out += data.replace(b"\x00", b"\x00\xff")
    out += b"\x00\x01"


# --------------------------------------------------------------------------- decoding


def decode_key(data: bytes) -> Key:
    """Decode bytes produced by ``encode_key``; raise ValueError on anything else."""
    data = bytes(data)
    try:
        key, pos = _decode_at(data, 0)
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise ValueError(f"malformed encoded key {bytes(data)!r}: {exc}") from None
    if pos != len(data):
        raise ValueError(f"malformed encoded key {bytes(data)!r}: {len(data) - pos} trailing bytes")
    if encode_key(key) != data:
        raise ValueError(f"non-canonical encoded key {bytes(data)!r}")
    return key


def _decode_at(data: bytes, pos: int) -> tuple[Key, int]:
    tag = data[pos]
    pos += 1
    if tag == _NONE:
        return None, pos
    if tag == _BOOL:
        if data[pos] > 1:
            raise ValueError(f"malformed encoded key {bytes(data)!r}: bad bool byte")
        return data[pos] == 1, pos + 1
    if tag == _INT:
        return _decode_int(data, pos)
    if tag == _FLOAT:
        if pos + 8 > len(data):
            raise IndexError("truncated float")
        bits = int.from_bytes(data[pos : pos + 8], "big")
        bits = (bits ^ _SIGN_BIT) if bits & _SIGN_BIT else (bits ^ _ALL_BITS)
        return struct.unpack(">d", bits.to_bytes(8, "big"))[0], pos + 8
    if tag in (_STR, _BYTES):
        raw, pos = _decode_escaped(data, pos)
        return (raw.decode("utf-8", "surrogatepass") if tag == _STR else raw), pos
    if tag == _TUPLE:
        items = []
        while data[pos] != _TUPLE_END:
            item, pos = _decode_at(data, pos)
            items.append(item)
        return tuple(items), pos + 1
    raise ValueError(f"malformed encoded key {bytes(data)!r}: unknown type tag 0x{tag:02x}")


def _decode_int(data: bytes, pos: int) -> tuple[int, int]:
    negative = data[pos] == 0x00
    pos += 1

    def take(n: int) -> bytes:
        nonlocal pos
        chunk = data[pos : pos + n]
        if len(chunk) != n:
            raise IndexError("truncated int")
        pos += n
        return chunk.translate(_INVERT) if negative else chunk

    len_len = take(1)[0]
    length = int.from_bytes(take(len_len), "big")
    magnitude = int.from_bytes(take(length), "big")
    return (-magnitude if negative else magnitude), pos


def _decode_escaped(data: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    while True:
        end = data.index(b"\x00", pos)
        out += data[pos:end]
        marker = data[end + 1]
        if marker == 0x01:
            return bytes(out), end + 2
        if marker != 0xFF:
            raise ValueError(f"malformed encoded key {bytes(data)!r}: bad escape")
        out.append(0x00)
        pos = end + 2


# --------------------------------------------------------------------------- hashing


def stable_hash(key_bytes: bytes) -> int:
    """64-bit xxh64 (seed 0) of encoded key bytes; identical in every process."""
    return xxhash.xxh64_intdigest(key_bytes, 0)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_num_key_groups(num_key_groups: int) -> int:
    """Return ``num_key_groups`` if it is a power of two in [1, 2**15], else raise ValueError."""
    if (
        not _is_int(num_key_groups)
        or not 1 <= num_key_groups <= MAX_KEY_GROUPS
        or num_key_groups & (num_key_groups - 1)
    ):
        raise ValueError(
            f"num_key_groups must be a power of two in [1, {MAX_KEY_GROUPS}], got {num_key_groups!r}"
        )
    return num_key_groups


def key_group(key_bytes: bytes, num_key_groups: int) -> int:
    """Key group of an encoded key: ``stable_hash(key_bytes) mod G``."""
    validate_num_key_groups(num_key_groups)
    return stable_hash(key_bytes) & (num_key_groups - 1)


# --------------------------------------------------------------------------- virtual nodes


def _validate_vnodes(num_key_groups: int, num_vnodes: int) -> None:
    validate_num_key_groups(num_key_groups)
    if not _is_int(num_vnodes) or not 1 <= num_vnodes <= num_key_groups:
        raise ValueError(
            f"num_vnodes must be an int in [1, num_key_groups={num_key_groups}], got {num_vnodes!r}"
        )


def vnode_of(key_group: int, num_key_groups: int, num_vnodes: int) -> int:
    """The vnode owning ``key_group``: the ``v`` with ``v*G//V <= key_group < (v+1)*G//V``."""
    _validate_vnodes(num_key_groups, num_vnodes)
    if not 0 <= key_group < num_key_groups:
        raise ValueError(f"key_group must be in [0, {num_key_groups}), got {key_group!r}")
    return ((key_group + 1) * num_vnodes - 1) // num_key_groups


def vnode_key_groups(vnode: int, num_key_groups: int, num_vnodes: int) -> range:
    """The contiguous key groups owned by ``vnode``."""
    _validate_vnodes(num_key_groups, num_vnodes)
    if not 0 <= vnode < num_vnodes:
        raise ValueError(f"vnode must be in [0, {num_vnodes}), got {vnode!r}")
    return range(vnode * num_key_groups // num_vnodes, (vnode + 1) * num_key_groups // num_vnodes)


# --------------------------------------------------------------------------- routing table


@dataclass(frozen=True)
class RoutingTable:
    """Immutable, versioned map vnode -> partition, valid for one epoch.

    ``assignment[v]`` is the partition hosting vnode ``v``; partitions are
    ``0 .. parallelism-1`` and may own no vnode after a handover.
    """

    assignment: tuple[int, ...]
    parallelism: int
    epoch: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignment", tuple(self.assignment))
        for name, value, low in (("parallelism", self.parallelism, 1), ("epoch", self.epoch, 0)):
            if not _is_int(value) or value < low:
                raise ValueError(f"RoutingTable {name} must be an int >= {low}, got {value!r}")
        if not self.assignment:
            raise ValueError("RoutingTable needs at least one vnode")
        for vnode, partition in enumerate(self.assignment):
            if not _is_int(partition) or not 0 <= partition < self.parallelism:
                raise ValueError(
                    f"RoutingTable vnode {vnode} maps to {partition!r}, not a partition in "
                    f"[0, {self.parallelism})"
                )

    @classmethod
    def uniform(cls, num_vnodes: int, parallelism: int, epoch: int = 0) -> RoutingTable:
        """Contiguous, balanced ranges: partition ``p`` owns vnodes ``[p*V//P, (p+1)*V//P)``."""
        if not _is_int(num_vnodes) or num_vnodes < 1:
            raise ValueError(f"num_vnodes must be an int >= 1, got {num_vnodes!r}")
        if not _is_int(parallelism) or not 1 <= parallelism <= num_vnodes:
            raise ValueError(
                f"parallelism must be an int in [1, num_vnodes={num_vnodes}] so that every partition "
                f"owns a vnode, got {parallelism!r}"
            )
        assignment = tuple((v * parallelism) // num_vnodes for v in range(num_vnodes))
        return cls(assignment, parallelism, epoch)

    @property
    def num_vnodes(self) -> int:
        """Number of vnodes (fixed for the job)."""
        return len(self.assignment)

    def partition_of_vnode(self, vnode: int) -> int:
        """Partition hosting ``vnode``."""
        if not 0 <= vnode < len(self.assignment):
            raise ValueError(f"vnode must be in [0, {len(self.assignment)}), got {vnode!r}")
        return self.assignment[vnode]

    def partition_of_key_group(self, key_group: int, num_key_groups: int) -> int:
        """Partition hosting ``key_group`` (through its vnode)."""
        return self.assignment[vnode_of(key_group, num_key_groups, len(self.assignment))]

    def vnodes_of(self, partition: int) -> tuple[int, ...]:
        """Vnodes hosted by ``partition``, ascending (possibly empty)."""
        if not 0 <= partition < self.parallelism:
            raise ValueError(f"partition must be in [0, {self.parallelism}), got {partition!r}")
        return tuple(v for v, p in enumerate(self.assignment) if p == partition)

    def moved(
        self, vnodes: Iterable[int], to_partition: int, *, parallelism: int | None = None
    ) -> RoutingTable:
        """A new table (epoch + 1) with ``vnodes`` moved to ``to_partition``.

        ``parallelism`` optionally changes the number of partitions (rescale);
        it must still cover every partition that hosts a vnode.
        """
        new_parallelism = self.parallelism if parallelism is None else parallelism
        assignment = list(self.assignment)
        for vnode in vnodes:
            if not 0 <= vnode < len(assignment):
                raise ValueError(f"vnode must be in [0, {len(assignment)}), got {vnode!r}")
            assignment[vnode] = to_partition
        return RoutingTable(tuple(assignment), new_parallelism, self.epoch + 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"epoch": self.epoch, "parallelism": self.parallelism, "assignment": list(self.assignment)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingTable:
        """Inverse of ``to_dict``; validates the content."""
        missing = {"epoch", "parallelism", "assignment"} - set(data)
        if missing:
            raise ValueError(f"RoutingTable dict is missing {sorted(missing)}")
        if not isinstance(data["assignment"], (list, tuple)):
            raise ValueError(
                f"RoutingTable assignment must be a list, got {type(data['assignment']).__name__}"
            )
        return cls(tuple(data["assignment"]), data["parallelism"], data["epoch"])
