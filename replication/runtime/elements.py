"""Stream elements as they travel between operators and over channels.

Elements are plain tuples (cheap to build and to pickle); the first field is the
kind.  Every element, data and control alike, gets a per-channel sequence number
when it is put on a channel (see :mod:`replication.runtime.channels`); the seq is not part
of the tuple, it is implied by the element's position in its batch.

* ``(DATA, value, key, ts, ingest_ts, origin)``: a record.  ``key`` is set once the
  stream is keyed, ``ts`` is the event time (ms), ``ingest_ts`` the wall-clock time
  (s, float) at which the source read it, ``origin`` its source coordinates
  ``(topic, partition, offset)`` or None for derived records (window results).
* ``(WATERMARK, ts)``: event time has reached ``ts`` on this channel.
* ``(END,)``: the channel is finished (graceful drain).
* ``(PULSE, h, t)``: LiveRobin heartbeat number ``h`` (delimits consumption cycles), written
  by the generator at its wall clock ``t`` (ms; 0: unknown): the processing time of every replica
  that consumes it.
* ``(CLOCK, t)``: KaZoo, a task with keyed functions: the leader's clock ``t`` (ms) when it wrote
  the next order, the processing time of that task's replicas from there on (handed out by the
  orderer, run down the task's chain; never on a channel).
"""

from __future__ import annotations

from typing import Any

DATA = 0
WATERMARK = 1
END = 2
PULSE = 3
CLOCK = 4

MAX_WATERMARK = 2**63 - 1
MIN_WATERMARK = -(2**63)

Origin = tuple[str, int, int]


def record(value: Any, key: Any = None, ts: int = 0, ingest_ts: float = 0.0, origin: Origin | None = None) -> tuple:
    """Build a data element."""
    return (DATA, value, key, ts, ingest_ts, origin)


def watermark(ts: int) -> tuple:
    """Build a watermark element."""
    return (WATERMARK, ts)


END_ELEMENT = (END,)


def pulse(h: int, t: int = 0) -> tuple:
    """Build a LiveRobin heartbeat element (``t``: its processing time, ms)."""
    return (PULSE, h, t)
