"""What a source makes of a Kafka record, the same on the cluster and in the local harness.

:class:`SourceRecords` turns a record's bytes into the element's value (a
:class:`~replication.records.KafkaRecord` when the source asked for metadata) and its event time,
or rejects it with the dead-letter reason; :class:`Watermarks` follows the largest event time of
every Kafka partition read and says when a watermark goes out.  Both are pure: the source
instance (:mod:`.source`) and :mod:`replication.testing` feed them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from replication.runtime.deadletter import describe_error
from replication.runtime.elements import MIN_WATERMARK


class Rejected(Exception):
    """A record the source cannot turn into an element; ``reason`` goes to the dead-letter topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SourceRecords:
    """A source's deserializer and event time, from its spec (``job.source(...)``);
    ``with_metadata(record, value, key_deserializer)`` wraps a value in the metadata of the record
    it was read from, for a source that asks for them, and ``kafka_time(record)`` is the record's
    Kafka timestamp (ms), its event time when the source has no timestamp function."""

    __slots__ = ("deserializer", "key_deserializer", "metadata", "timestamp_fn", "with_metadata", "kafka_time")

    def __init__(self, spec: Mapping[str, Any], with_metadata: Callable[[Any, Any, Any], Any],
                 kafka_time: Callable[[Any], int], deserializer: Callable[[Any], Any] | None = None) -> None:
        self.deserializer = spec["deserializer"] if deserializer is None else deserializer
        self.key_deserializer = spec.get("key_deserializer")
        self.metadata: bool = spec.get("metadata", False)
        self.timestamp_fn = spec["timestamp"]
        self.with_metadata = with_metadata
        self.kafka_time = kafka_time

    def decode(self, raw: Any, record: Any) -> tuple[Any, int]:
        """The value of ``record``, read as ``raw`` (None: a tombstone, kept as None with
        metadata), and its event time.  Raises :class:`Rejected`."""
        try:
            value = None if raw is None and self.metadata else self.deserializer(raw)
            if self.metadata:
                value = self.with_metadata(record, value, self.key_deserializer)
        except Exception as exc:  # noqa: BLE001 - the user's deserializer
            raise Rejected("deserialize: " + describe_error(exc)) from None
        if self.timestamp_fn is None:
            return value, self.kafka_time(record)
        try:
            return value, int(self.timestamp_fn(value))
        except Exception as exc:  # noqa: BLE001 - the user's timestamp function
            raise Rejected("timestamp: " + describe_error(exc)) from None


class Watermarks:
    """The largest event time read in each Kafka partition; the watermark is the smallest of
    them less the allowed out-of-orderness, and goes out once it moved by ``interval_ms``
    (the first one at once).  A function of the records' positions alone, so both replicas of a
    source partition emit the same watermarks at the same places."""

    __slots__ = ("max_ts", "emitted", "out_of_orderness", "interval")

    def __init__(self, partitions: Iterable[int], out_of_orderness_ms: int, interval_ms: int) -> None:
        self.max_ts: dict[int, int] = {k: MIN_WATERMARK for k in partitions}
        self.emitted = MIN_WATERMARK
        self.out_of_orderness = out_of_orderness_ms
        self.interval = interval_ms

    def observe(self, partition: int, ts: int) -> int | None:
        """A record of ``partition`` with event time ``ts`` went out: the watermark to emit after
        it, if any."""
        if ts <= self.max_ts[partition]:
            return None
        self.max_ts[partition] = ts
        wm = min(self.max_ts.values()) - self.out_of_orderness
        emitted = self.emitted
        if wm >= emitted + self.interval or (emitted == MIN_WATERMARK and wm > MIN_WATERMARK // 2):
            self.emitted = wm
            return wm
        return None
