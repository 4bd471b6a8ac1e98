"""What a source with ``metadata=True`` delivers: a Kafka record with its key, headers, timestamp
and position, as both replicas of the source read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KafkaRecord:
    """One Kafka record: ``value`` and ``key`` deserialized (the key by the source's
    ``key_deserializer``; raw bytes without one), ``headers`` as ``(name, bytes)`` pairs in their
    order, ``timestamp`` the record's Kafka timestamp (ms), and where it was read."""

    value: Any
    key: Any
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    topic: str
    partition: int
    offset: int

    def header(self, name: str, default: bytes | None = None) -> bytes | None:
        """The value of the last header called ``name``, or ``default``."""
        for header_name, value in reversed(self.headers):
            if header_name == name:
                return value
        return default


def kafka_time(msg: Any) -> int:
    """A confluent-kafka message's timestamp (ms)."""
    return msg.timestamp()[1]


def kafka_record(msg: Any, value: Any, key_deserializer: Any | None) -> KafkaRecord:
    """The :class:`KafkaRecord` of a confluent-kafka message whose value deserialized to ``value``."""
    key = msg.key()
    return KafkaRecord(value=value, key=key if key is None or key_deserializer is None else key_deserializer(key),
                       headers=tuple((str(n), v) for n, v in (msg.headers() or ())), timestamp=msg.timestamp()[1],
                       topic=msg.topic(), partition=msg.partition(), offset=msg.offset())
