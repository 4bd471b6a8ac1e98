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
import sysconfig
import traceback
from pathlib import Path
from typing import Any

from replication.config import ReplicationConfig
from replication.runtime.elements import Origin
from replication.runtime.exactly_once import ExactlyOnceOutput, WritesExactlyOnce
from transport.kafka_io import produce_blocking

log = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parents[2]
# where a frame is not the user's: this project's packages (its examples excepted), the standard
# library and installed packages
_NOT_USER = tuple(str(p) for p in (
    *(_ROOT / pkg for pkg in ("replication", "rhino_state", "liverobin", "kazoo_leader", "merge", "transport")),
    *{Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
_USER_AFTER_ALL = str(_ROOT / "replication" / "examples")


def _is_user_frame(filename: str) -> bool:
    return filename.startswith(_USER_AFTER_ALL) or not filename.startswith(_NOT_USER)


def describe_error(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` of the innermost frame of the user's code (no
    place when the error was raised outside it, e.g. by a check of what a function returned)."""
    user = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user_frame(f.filename)]
    where = f" (at {user[-1].filename}:{user[-1].lineno} in {user[-1].name})" if user else ""
    return f"{type(exc).__name__}: {exc}{where}"


def payload_of(value: Any) -> tuple[bytes, str]:
    """A value past the source as bytes, and how it was encoded (``bytes``, ``json`` or ``repr``)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), "bytes"
    try:
        return json.dumps(value, sort_keys=True).encode(), "json"
    except (TypeError, ValueError):
        return repr(value).encode(), "repr"


def _letter(job_name: str, reason: str, operator: str, origin: Origin | None,
            payload_kind: str) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """The key and headers of a dead letter: the reason, the operator, the job, how the payload
    is encoded and the source coordinates (the key identifies the record)."""
    headers = [("reason", reason.encode()), ("operator", operator.encode()), ("job", job_name.encode()),
               ("payload", payload_kind.encode())]
    if origin is not None:
        topic, partition, offset = origin
        headers += [("source.topic", topic.encode()), ("source.partition", str(partition).encode()),
                    ("source.offset", str(offset).encode())]
    key = f"{operator}/{origin[0]}/{origin[1]}/{origin[2]}".encode() if origin is not None else None
    return key, headers


class DeadLetterWriter:
    """Writes dead letters with a confluent-kafka producer shared by a worker (a job that is
    neither replicated nor checkpointed: one instance per partition, at most once on a failure)."""

    def __init__(self, producer: Any, topic: str, job_name: str) -> None:
        self.producer = producer
        self.topic = topic
        self.job_name = job_name

    def send(self, *, reason: str, operator: str, origin: Origin | None, payload: bytes,
             payload_kind: str = "original") -> None:
        """``payload_kind`` is ``original`` for the record's bytes as read from Kafka, else how
        the in-flight value was encoded (see :func:`payload_of`)."""
        key, headers = _letter(self.job_name, reason, operator, origin, payload_kind)
        produce_blocking(self.producer, self.topic, key=key, value=payload, headers=headers)
        log.warning("dead letter from %s: %s (origin %s)", operator, reason, origin)


class ExactlyOnceDeadLetters(WritesExactlyOnce):
    """One partition replica's dead letters, written once for the partition: both replicas meet
    the same bad records in the same order, number them alike, and only the partition's writer
    replica writes them, fenced like a sink (:class:`replication.runtime.exactly_once.ExactlyOnceOutput`,
    output ``<sink id>:dlq``).  Its seq is checkpointed with the replica."""

    kind = "dlq"  # which of the partition's outputs the driver's writer role is for

    def __init__(self, name: str, cfg: ReplicationConfig, replica: int, sink_id: str, topic: str,
                 job_name: str) -> None:
        self.job_name = job_name
        self.out = ExactlyOnceOutput(f"{name} dead letters", cfg, replica, f"{sink_id}:dlq", topic, 0,
                                     cfg.channel_buffer_timeout_ms / 1000)

    def send(self, *, reason: str, operator: str, origin: Origin | None, payload: bytes,
             payload_kind: str = "original") -> None:
        key, headers = _letter(self.job_name, reason, operator, origin, payload_kind)
        self.out.append(payload, key, headers)
        if self.out.writer or self.out.taking_over:  # (the writer logs it, once for the partition)
            log.warning("dead letter from %s: %s (origin %s)", operator, reason, origin)
