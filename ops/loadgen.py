"""Load generator: writes timestamped events to Kafka at a chosen rate, with a live progress line.

Each stream is a topic and a function ``make(ts_ms) -> (key, value_bytes, parsed)``;
``parsed`` is kept (None for deliberately malformed records) so a run can be
checked against a reference.  Event time is the wall clock at production,
non-decreasing per stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from ops.progress import StatusLine, bar
from transport.kafka_io import produce_blocking

MakeRecord = Callable[[int], tuple[bytes | None, bytes, Any]]


@dataclass
class LoadResult:
    produced: int = 0
    malformed: int = 0
    elapsed_s: float = 0.0
    parsed: dict[str, list[Any]] = field(default_factory=dict)  # topic -> valid records in order

    @property
    def rate(self) -> float:
        return self.produced / self.elapsed_s if self.elapsed_s else 0.0


def generate_load(
    bootstrap: str,
    streams: Sequence[tuple[str, MakeRecord]],
    *,
    rate: float,
    duration_s: float,
    status: StatusLine | None = None,
    extra_status: Callable[[], str] | None = None,
    producer_conf: dict[str, Any] | None = None,
) -> LoadResult:
    """Produce ``rate`` records/s in total, round robin over ``streams``, for ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, **(producer_conf or {})})
    errors: list[str] = []
    result = LoadResult(parsed={topic: [] for topic, _ in streams})
    total = int(rate * duration_s)
    last_ts = {topic: 0 for topic, _ in streams}
    start = time.monotonic()
    next_status = start

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(total):
        due = start + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        topic, make = streams[i % len(streams)]
        ts = last_ts[topic] = max(last_ts[topic], int(time.time() * 1000))
        key, value, parsed = make(ts)
        produce_blocking(producer, topic, value=value, key=key, on_delivery=on_delivery)
        result.produced += 1
        if parsed is None:
            result.malformed += 1
        else:
            result.parsed[topic].append(parsed)
        if status is not None and time.monotonic() >= next_status:
            next_status = time.monotonic() + 0.25
            elapsed = time.monotonic() - start
            line = (f"load {bar((i + 1) / total)} {i + 1}/{total} events, "
                    f"{(i + 1) / max(elapsed, 1e-9):,.0f}/s, {elapsed:4.1f}s")
            status.update(line + (f" | {extra_status()}" if extra_status else ""))
    remaining = producer.flush(60)
    result.elapsed_s = time.monotonic() - start
    if remaining or errors:
        raise RuntimeError(f"load generator: {remaining} undelivered, {len(errors)} failed ({errors[:1]})")
    if status is not None:
        status.done(f"load: {result.produced} events in {result.elapsed_s:.1f}s ({result.rate:,.0f}/s), "
                    f"{result.malformed} malformed on purpose")
    return result
