"""State time-to-live: how a keyed state value records when it expires, and the codecs that hide
expired values from reads.

A state declared with a :class:`StateTtl` stores each value (each map entry, each list element)
as ``(expiry, value)``, marked as such, where expiry is the operator's time at the write plus the
TTL.  By event
time (the default), that time is the record's event time, and a value whose expiry the watermark
reached is invisible from then on; by processing time, it is the time of the last pulse the
operator passed (the heartbeat generator's clock, stamped into each pulse), and a value is
invisible once a pulse of its expiry or later passed.  Either is a position in the stream, not a
replica's clock, so both replicas see the same values.  Every write also schedules a sweep of that
key's state at the expiry, rounded up to an eighth of the TTL so that a key written often keeps
few sweeps pending; the sweep deletes what expired, so state of keys that go quiet is removed.

A new version of a function may add or remove a state's TTL (``replace_operator``, or a run
from a savepoint): a value keeps what it was written with.  One written without a TTL never
expires until it is written again; one written with a TTL is read by a state without one as its
value (the mark tells them apart; savepoint and durable-cut formats 2 on).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from rhino_state.canonical import canonical_dumps

EXPIRED: Any = object()  # what a codec decodes an expired value to

# The first byte of a value written with a TTL; a pickle (protocol 2 and up) starts with 0x80.
TTL_MARK = b"\x01"


EVENT_TIME, PROCESSING_TIME = "event", "processing"


@dataclass(frozen=True)
class StateTtl:
    """Keyed state lives ``ttl_ms`` after its last write (ms), by event time (``time="event"``:
    the watermark expires it) or by processing time (``time="processing"``: the time stamped into
    LiveRobin's pulses or KaZoo's orders expires it; not in ``unordered`` mode)."""

    ttl_ms: int
    time: str = EVENT_TIME

    def __post_init__(self) -> None:
        if not isinstance(self.ttl_ms, int) or isinstance(self.ttl_ms, bool) or self.ttl_ms <= 0:
            raise ValueError(f"StateTtl.ttl_ms must be a positive int of milliseconds, got {self.ttl_ms!r}")
        if self.time not in (EVENT_TIME, PROCESSING_TIME):
            raise ValueError(f"StateTtl.time must be {EVENT_TIME!r} or {PROCESSING_TIME!r}, got {self.time!r}")

    def sweep_at(self, expiry: int) -> int:
        """When to sweep a value that expires at ``expiry``: at it or up to an eighth of the TTL later."""
        grain = max(1, self.ttl_ms // 8)
        return -(-expiry // grain) * grain


class PlainCodec:
    """Values without a TTL: canonical pickles (one written with a TTL: its value)."""

    ttl: StateTtl | None = None

    def encode(self, value: Any, now: int) -> bytes:
        return canonical_dumps(value)

    def decode(self, raw: bytes, horizon: int) -> Any:
        if raw[:1] == TTL_MARK:
            return pickle.loads(raw[1:])[1]
        return pickle.loads(raw)

    def expiry(self, raw: bytes) -> int | None:
        return None


class TtlCodec(PlainCodec):
    """Values with a TTL: ``(expiry, value)``; expired once the horizon (the watermark, or the
    processing time) reaches the expiry."""

    def __init__(self, ttl: StateTtl) -> None:
        self.ttl = ttl

    def encode(self, value: Any, now: int) -> bytes:
        assert self.ttl is not None
        return TTL_MARK + canonical_dumps((now + self.ttl.ttl_ms, value))

    def decode(self, raw: bytes, horizon: int) -> Any:
        expiry, value = _expiring(raw)
        return EXPIRED if expiry is not None and expiry <= horizon else value

    def expiry(self, raw: bytes) -> int | None:
        return _expiring(raw)[0]


def _expiring(raw: bytes) -> tuple[int | None, Any]:
    """``(expiry, value)`` of a value read by a state with a TTL (expiry None: written without
    one, it does not expire)."""
    if raw[:1] == TTL_MARK:
        return pickle.loads(raw[1:])
    return None, pickle.loads(raw)


def codec_for(ttl: StateTtl | None) -> PlainCodec:
    """The codec of a state declared with ``ttl`` (None: no TTL)."""
    if ttl is None:
        return PlainCodec()
    if not isinstance(ttl, StateTtl):
        raise TypeError(f"ttl must be a StateTtl, got {type(ttl).__qualname__}")
    return TtlCodec(ttl)
