"""Wire format of a channel batch.

A batch carries consecutive elements of one channel.  The fixed header names the
destination instance, the channel and the seq of the first element; element ``i``
of the batch has seq ``first_seq + i``.  The header can be read without
unpickling the payload, so a receiver drops a duplicate batch cheaply.

Layout (big-endian): magic ``b"RB"``, version (1 byte), task id (u32), partition
(u32), channel id (u64), first seq (u64), count (u32), then the pickled list of
elements.  Payloads are pickled: channels connect processes of one job only.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass

MAGIC = b"RB"
VERSION = 1
_HEADER = struct.Struct(">2sBIIQQI")
HEADER_SIZE = _HEADER.size
MAX_SEQ = 2**64 - 1


class FramingError(ValueError):
    """A batch that cannot be decoded (wrong magic, version or truncated)."""


@dataclass(frozen=True)
class BatchHeader:
    task: int
    partition: int
    channel: int
    first_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


def encode_batch(task: int, partition: int, channel: int, first_seq: int, elements: list) -> bytes:
    """Frame ``elements`` (seq ``first_seq``..) for the instance ``(task, partition)``."""
    if not elements:
        raise ValueError("a batch holds at least one element")
    if first_seq < 0 or first_seq + len(elements) - 1 > MAX_SEQ:
        raise ValueError(f"seq {first_seq} out of the 64-bit range")
    header = _HEADER.pack(MAGIC, VERSION, task, partition, channel, first_seq, len(elements))
    return header + pickle.dumps(elements, protocol=5)


def decode_header(data: bytes) -> BatchHeader:
    """Read the header only."""
    if len(data) < HEADER_SIZE:
        raise FramingError(f"batch of {len(data)} bytes is shorter than its header")
    magic, version, task, partition, channel, first_seq, count = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FramingError(f"bad magic {magic!r}")
    if version != VERSION:
        raise FramingError(f"unsupported batch version {version}")
    return BatchHeader(task, partition, channel, first_seq, count)


def decode_elements(data: bytes, header: BatchHeader) -> list:
    """Unpickle the elements of a batch whose header was read already."""
    elements = pickle.loads(memoryview(data)[HEADER_SIZE:])
    if len(elements) != header.count:
        raise FramingError(f"header says {header.count} elements, payload has {len(elements)}")
    return elements
