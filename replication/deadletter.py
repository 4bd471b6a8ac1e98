"""The dead-letter topic: records that cannot be processed, with the reason.

A record that fails to deserialize, whose event time cannot be extracted, that
makes user code raise, or that arrives behind the watermark of a window, is
written here with the reason, the operator, the source coordinates and the
original bytes as read from Kafka.  Past the source the original bytes are no
longer at hand: the value is written as JSON (or repr), the ``payload`` header
says which, and the source coordinates lead to the original record.  The job goes
on; nothing is dropped silently.
"""

from __future__ import annotations

import json
import logging
import traceback
from typing import Any

from replication.elements import Origin
from replication.kafka_io import produce_blocking

log = logging.getLogger(__name__)


def describe_error(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` of the innermost user frame."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def payload_of(value: Any) -> tuple[bytes, str]:
    """A value past the source as bytes, and how it was encoded (``bytes``, ``json`` or ``repr``)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), "bytes"
    try:
        return json.dumps(value, sort_keys=True).encode(), "json"
    except (TypeError, ValueError):
        return repr(value).encode(), "repr"


class DeadLetterWriter:
    """Writes dead letters with a confluent-kafka producer shared by a worker."""

    def __init__(self, producer: Any, topic: str, job_name: str) -> None:
        self.producer = producer
        self.topic = topic
        self.job_name = job_name

    def send(self, *, reason: str, operator: str, origin: Origin | None, payload: bytes,
             payload_kind: str = "original") -> None:
        """``payload_kind`` is ``original`` for the record's bytes as read from Kafka, else how
        the in-flight value was encoded (see :func:`payload_of`)."""
        headers = [("reason", reason.encode()), ("operator", operator.encode()), ("job", self.job_name.encode()),
                   ("payload", payload_kind.encode())]
        if origin is not None:
            topic, partition, offset = origin
            headers += [("source.topic", topic.encode()), ("source.partition", str(partition).encode()),
                        ("source.offset", str(offset).encode())]
        # the key identifies the record: with replication each live replica writes its dead letters
        key = f"{operator}/{origin[0]}/{origin[1]}/{origin[2]}".encode() if origin is not None else None
        produce_blocking(self.producer, self.topic, key=key, value=payload, headers=headers)
        log.warning("dead letter from %s: %s (origin %s)", operator, reason, origin)
