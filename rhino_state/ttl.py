"""State time-to-live: how a keyed state value records when it expires, and the codecs that hide
expired values from reads.

A state declared with a :class:`StateTtl` stores each value (each map entry, each list element)
as ``(expiry, value)``, where expiry is the operator's event time at the write plus the TTL.  A
value whose expiry the watermark reached is invisible from then on, on both replicas alike (the
watermark is a position in the stream, not a clock).  Every write also schedules a sweep of that
key's state at the expiry, rounded up to an eighth of the TTL so that a key written often keeps
few sweeps pending; the sweep deletes what expired, so state of keys that go quiet is removed.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from rhino_state.canonical import canonical_dumps

EXPIRED: Any = object()  # what a codec decodes an expired value to


@dataclass(frozen=True)
class StateTtl:
    """Keyed state lives ``ttl_ms`` of event time after its last write (ms)."""

    ttl_ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.ttl_ms, int) or isinstance(self.ttl_ms, bool) or self.ttl_ms <= 0:
            raise ValueError(f"StateTtl.ttl_ms must be a positive int of milliseconds, got {self.ttl_ms!r}")

    def sweep_at(self, expiry: int) -> int:
        """When to sweep a value that expires at ``expiry``: at it or up to an eighth of the TTL later."""
        grain = max(1, self.ttl_ms // 8)
        return -(-expiry // grain) * grain


class PlainCodec:
    """Values without a TTL: canonical pickles."""

    ttl: StateTtl | None = None

    def encode(self, value: Any, now: int) -> bytes:
        return canonical_dumps(value)

    def decode(self, raw: bytes, watermark: int) -> Any:
        return pickle.loads(raw)

    def expiry(self, raw: bytes) -> int | None:
        return None


class TtlCodec(PlainCodec):
    """Values with a TTL: ``(expiry, value)``; expired once the watermark reaches the expiry."""

    def __init__(self, ttl: StateTtl) -> None:
        self.ttl = ttl

    def encode(self, value: Any, now: int) -> bytes:
        assert self.ttl is not None
        return canonical_dumps((now + self.ttl.ttl_ms, value))

    def decode(self, raw: bytes, watermark: int) -> Any:
        expiry, value = pickle.loads(raw)
        return EXPIRED if expiry <= watermark else value

    def expiry(self, raw: bytes) -> int | None:
        return pickle.loads(raw)[0]


def codec_for(ttl: StateTtl | None) -> PlainCodec:
    """The codec of a state declared with ``ttl`` (None: no TTL)."""
    if ttl is None:
        return PlainCodec()
    if not isinstance(ttl, StateTtl):
        raise TypeError(f"ttl must be a StateTtl, got {type(ttl).__qualname__}")
    return TtlCodec(ttl)
