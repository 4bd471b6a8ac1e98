"""The librdkafka properties a job passes through to its Kafka clients (``spark.replication.kafka.*``
keys not declared as keys of their own): which the runtime owns, which client roles each goes
to, and how each is checked by librdkafka itself (a throwaway client, no broker needed)."""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from replication.config_keys import KAFKA_CONSUMER_PREFIX, KAFKA_PREFIX, KAFKA_PRODUCER_PREFIX

#: librdkafka properties the runtime owns; pass-through of these is refused with the reason.
OWNED_KAFKA_PROPERTIES: dict[str, str] = {
    "bootstrap.servers": "set spark.replication.kafka.bootstrapServers instead",
    "metadata.broker.list": "set spark.replication.kafka.bootstrapServers instead",
    "linger.ms": "set spark.replication.sink.lingerMs instead",
    "queue.buffering.max.ms": "set spark.replication.sink.lingerMs instead",
    "group.id": "owned by the runtime: sources read with manual partition assignment",
    "enable.auto.commit": "owned by the runtime: source offsets live in checkpoints, never auto-committed",
    "auto.commit.enable": "owned by the runtime: source offsets live in checkpoints, never auto-committed",
    "enable.auto.offset.store": "owned by the runtime: source offsets live in checkpoints",
    "enable.partition.eof": "owned by the runtime: it decides where end-of-partition events are needed",
    "transactional.id": "owned by the runtime: one transactional id per sink partition fences zombie writers",
    **{
        cb: "callbacks are installed by the runtime"
        for cb in ("logger", "error_cb", "stats_cb", "throttle_cb", "oauth_cb", "on_delivery", "on_commit")
    },
}


OVERRIDES = (  # field, key prefix, client roles it goes to
    ("kafka_overrides", KAFKA_PREFIX, ("producer", "consumer")),
    ("consumer_overrides", KAFKA_CONSUMER_PREFIX, ("consumer",)),
    ("producer_overrides", KAFKA_PRODUCER_PREFIX, ("producer",)),
)


_PROBE_BOOTSTRAP = "127.0.0.1:1"


def kafka_str(value: Any) -> str:
    """A pass-through value as the string librdkafka expects."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def kafka_problems(values: Mapping[str, Any], suggest: Callable[[str], str | None]) -> Iterator[tuple[str, str]]:
    """Problems of the pass-through librdkafka properties: owned, unknown, bad value, wrong client role.

    Each property is probed alone; one that fails alone is probed again beside every other
    property its clients get (``security.protocol=SASL_SSL`` needs its ``sasl.mechanisms``)."""
    for field, prefix, roles in OVERRIDES:
        for prop, value in values[field].items():
            name = prefix + prop
            if prop in OWNED_KAFKA_PROPERTIES:
                yield name, f"{name}: cannot be set, {OWNED_KAFKA_PROPERTIES[prop]}"
                continue
            for role in roles:
                error, ignored = _probe(role, {prop: value})
                if error and not error.startswith("No such configuration"):
                    error = _probe(role, {**_role_properties(values, role), prop: value})[0] and error
                if error:
                    hint = suggest(name) if error.startswith("No such configuration") else None
                    yield name, f"{name}={value}: {error}" + (f" (did you mean {hint}?)" if hint else "")
                    break
                if ignored and len(roles) == 1:
                    other = KAFKA_CONSUMER_PREFIX if role == "producer" else KAFKA_PRODUCER_PREFIX
                    yield name, f"{name}={value}: {ignored} (did you mean {other}{prop}?)"


def _role_properties(values: Mapping[str, Any], role: str) -> dict[str, str]:
    """Every pass-through property a client of ``role`` gets (not the owned ones)."""
    out: dict[str, str] = {}
    for field, _, roles in OVERRIDES:
        if role in roles:
            out.update({p: v for p, v in values[field].items() if p not in OWNED_KAFKA_PROPERTIES})
    return out


def _probe(role: str, props: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Construct a throwaway confluent-kafka client with ``props`` (no broker needed).

    Returns (librdkafka's error, or None; its warning that a property is ignored by this role, or None).
    """
    import confluent_kafka

    logger = logging.Logger(f"{__name__}.probe")  # unmanaged: never propagates anywhere
    records = logging.handlers.BufferingHandler(capacity=1_000_000)
    logger.addHandler(records)
    conf: dict[str, Any] = {"bootstrap.servers": _PROBE_BOOTSTRAP, "logger": logger, **props}
    try:
        if role == "consumer":
            client: Any = confluent_kafka.Consumer({**conf, "group.id": "spark-replication-config-probe"})
        else:
            client = confluent_kafka.Producer(conf)
    except confluent_kafka.KafkaException as e:
        return (e.args[0].str() if e.args and hasattr(e.args[0], "str") else str(e)), None
    except (TypeError, ValueError) as e:
        return str(e), None
    try:
        client.poll(0)  # delivers the construction-time log lines to the logger
    finally:
        if close := getattr(client, "close", None):
            close()
    for record in records.buffer:
        message = record.getMessage()
        if "will be ignored by this" in message:
            return None, message.split("]: ", 1)[-1]
    return None, None
