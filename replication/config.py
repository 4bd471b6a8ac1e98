"""Job configuration: the ``spark.replication.*`` Spark conf keys, validated before anything starts.

Every key is declared exactly once, as a field that carries its :class:`~replication.config_keys.Key`
spec, in one of the groups of :mod:`replication.config_schema` that :class:`ReplicationConfig`
combines. Parsing, validation, :meth:`ReplicationConfig.to_mapping` and the generated reference
``docs/configuration.md`` (:func:`config_reference_markdown`) all read that declaration; how a key parses and checks a value is :mod:`replication.config_keys`.

Keys under ``spark.replication.kafka.`` that are not declared here pass through to confluent-kafka
(librdkafka) clients: ``kafka.<prop>`` to producers and consumers, ``kafka.consumer.<prop>`` to
consumers only, ``kafka.producer.<prop>`` to producers only (:mod:`replication.kafka_properties`).
"""

from __future__ import annotations

import dataclasses
import difflib
import ssl
import types
from collections.abc import Iterator, Mapping
from typing import Any

from replication.config_keys import (
    KAFKA_CONSUMER_PREFIX,
    KAFKA_PREFIX,
    KAFKA_PRODUCER_PREFIX,
    PREFIX,
    ConfigError,
    Key,
    Value,
    reference_markdown,
)
from replication.config_schema import ClusterKeys, DataflowKeys, OperationKeys, ReplicaKeys
from replication.kafka_properties import OVERRIDES, OWNED_KAFKA_PROPERTIES, kafka_problems, kafka_str
from transport.security import TlsError, TlsMaterial, load_pem


# A dataclass collects its bases' fields in reverse order: the reference lists ReplicaKeys' first.
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicationConfig(OperationKeys, DataflowKeys, ClusterKeys, ReplicaKeys):
    """Validated job configuration; constructing one (directly or from a mapping) validates it.

    The keys are declared by group in :mod:`replication.config_schema`.
    Duration attributes (``*_ms``) are in milliseconds. Pass-through librdkafka properties are in
    ``kafka_overrides`` (producers and consumers), ``consumer_overrides`` and ``producer_overrides``.
    """

    # (not in the repr: SASL passwords and key passphrases pass through here)
    kafka_overrides: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False, repr=False)
    consumer_overrides: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False, repr=False)
    producer_overrides: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        for name, _, _ in OVERRIDES:
            props = {str(k): kafka_str(v) for k, v in getattr(self, name).items()}
            object.__setattr__(self, name, types.MappingProxyType(props))
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if problems := _problems(values):
            raise ConfigError(problems)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Value]) -> ReplicationConfig:
        """Parse and validate the ``spark.replication.*`` entries of ``mapping`` (other keys are ignored)."""
        values: dict[str, Any] = {attr: key.default for attr, key in _ATTRS.items()}
        values.update({name: {} for name, _, _ in OVERRIDES})
        problems: list[tuple[str, str]] = []
        failed: set[str] = set()
        for name, raw in mapping.items():
            if not name.startswith(PREFIX):
                if _prefix_typo(name):
                    problems.append((name, _unknown(name)))
                continue
            if name in _BY_NAME:
                attr, key = _BY_NAME[name]
                try:
                    values[attr] = key.parse(raw)
                except ValueError as e:
                    problems.append((name, f"{name}={key.render(raw)}: {e}"))
                    failed.add(attr)
            elif target := _override_target(name):
                values[target[0]][target[1]] = kafka_str(raw)
            else:
                problems.append((name, _unknown(name)))
        if problems:
            raise ConfigError(problems + _problems(values, skip=failed))
        return cls(**values)

    @classmethod
    def from_spark_conf(cls, conf: Any) -> ReplicationConfig:
        """Build from a pyspark ``SparkConf`` (or anything with ``getAll()`` returning key/value pairs)."""
        return cls.from_mapping(dict(conf.getAll()))

    def to_mapping(self) -> dict[str, str]:
        """All set keys as Spark conf strings; ``from_mapping(to_mapping())`` gives an equal config."""
        out = {k.name: k.render(getattr(self, a)) for a, k in _ATTRS.items() if getattr(self, a) is not None}
        for name, prefix, _ in OVERRIDES:
            out.update({prefix + prop: value for prop, value in getattr(self, name).items()})
        return out

    def dead_letter_topic(self, job_name: str) -> str:
        """The dead-letter topic of job ``job_name``: the configured one, else ``<job name>.dlq``."""
        return self.dead_letter_topic_name or f"{job_name}.dlq"

    def heartbeat_topic(self, job_name: str) -> str:
        """The LiveRobin heartbeat log of job ``job_name``."""
        return self.liverobin_heartbeat_topic or f"_replication.{job_name}.heartbeats"

    def order_logs_prefix(self, job_name: str) -> str:
        """What the KaZoo order logs of job ``job_name`` are named after (a run adds its own id)."""
        return f"_replication.{job_name}.orders"

    @staticmethod
    def order_log(run_prefix: str, task_id: int, partition: int) -> str:
        """The KaZoo order log of one partition in a run's logs ``run_prefix`` (its segments' topics
        are named after it)."""
        return f"{run_prefix}.t{task_id}p{partition}"

    @property
    def pulse_period_ms(self) -> int:
        """How often the heartbeat generators write a pulse: ``liverobin.heartbeatPeriod``, or in
        ``kazoo`` mode (pulse windows only) ``kazoo.windowPulsePeriod``."""
        return self.kazoo_window_pulse_period_ms if self.mode == "kazoo" else self.liverobin_heartbeat_period_ms

    def kafka_consumer_config(self, group_id: str = "spark-replication") -> dict[str, Any]:
        """confluent-kafka Consumer config: brokers, pass-through properties, no auto commit.

        ``group_id`` only labels the client: sources use manual assignment and never commit.
        """
        return {
            "bootstrap.servers": self.kafka_bootstrap_servers,
            **self.kafka_overrides,
            **self.consumer_overrides,
            "group.id": group_id,
            "enable.auto.commit": False,
        }

    def kafka_producer_config(self) -> dict[str, Any]:
        """confluent-kafka Producer config: brokers, pass-through properties and the sink linger."""
        return {
            "bootstrap.servers": self.kafka_bootstrap_servers,
            **self.kafka_overrides,
            **self.producer_overrides,
            "linger.ms": self.sink_linger_ms,
        }

    def tls_material(self) -> TlsMaterial | None:
        """The PEM material of ``rpc.tls.*`` (read now), or None when TLS is off."""
        if not self.rpc_tls_enabled:
            return None
        assert self.rpc_tls_cert_chain is not None and self.rpc_tls_private_key is not None
        return TlsMaterial.from_files(self.rpc_tls_cert_chain, self.rpc_tls_private_key, self.rpc_tls_trust_certs,
                                      self.rpc_tls_server_name)

    def kafka_admin_config(self) -> dict[str, Any]:
        """confluent-kafka AdminClient config: brokers and the shared pass-through properties."""
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.kafka_overrides}


_ATTRS: dict[str, Key] = {f.name: f.metadata["key"] for f in dataclasses.fields(ReplicationConfig) if f.metadata}
_BY_NAME: dict[str, tuple[str, Key]] = {k.name: (a, k) for a, k in _ATTRS.items()}
KEYS: tuple[Key, ...] = tuple(_ATTRS.values())


def _problems(values: Mapping[str, Any], skip: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Every problem of a full set of parsed values (keys in ``skip`` already failed to parse)."""
    out: list[tuple[str, str]] = []
    bad = set(skip)
    for attr, key in _ATTRS.items():
        if attr not in skip and (why := key.check(values[attr])) is not None:
            value = values[attr]
            out.append((key.name, f"{key.name}: {why}" if value is None else f"{key.name}={key.render(value)}: {why}"))
            bad.add(attr)
    # Cross-key checks.
    for small, large in _AT_MOST:
        if not bad & {small, large} and values[small] > values[large]:
            name, limit = _ATTRS[small].name, _ATTRS[large].name
            out.append((name, f"{name}={values[small]}: must be <= {limit} ({values[large]})"))
    if values["mode"] == "kazoo" and not values["zookeeper_connect"] and "zookeeper_connect" not in bad:
        out.append((PREFIX + "zookeeper.connect",
                     f"{PREFIX}zookeeper.connect: required by {PREFIX}mode=kazoo (leader election)"))
    if values["rhino_enabled"] and "mode" not in bad and values["mode"] == "unordered":
        out.append((PREFIX + "rhino.enabled",
                    f"{PREFIX}rhino.enabled=true: needs {PREFIX}mode=liverobin or kazoo (checkpoints are taken "
                    "at pulses or orders, the positions a restored partition and its upstreams agree on)"))
    if values["checkpoint_dir"] is not None and not values["rhino_enabled"] and "rhino_enabled" not in bad:
        out.append((PREFIX + "checkpointDir",
                    f"{PREFIX}checkpointDir: needs {PREFIX}rhino.enabled=true (the "
                    "durable cuts are Rhino's checkpoints)"))
    return out + list(_tls_problems(values, bad)) + list(kafka_problems(values, _suggestion))


def _tls_problems(values: Mapping[str, Any], bad: set[str]) -> Iterator[tuple[str, str]]:
    """With ``rpc.tls.enabled``: the PEM files must be there, readable, and the key must fit the chain."""
    if not values["rpc_tls_enabled"] or "rpc_tls_enabled" in bad:
        return
    files = (("rpc_tls_cert_chain", "certificate chain", "CERTIFICATE"), ("rpc_tls_private_key", "private key", "PRIVATE KEY"),
             ("rpc_tls_trust_certs", "trusted certificates", "CERTIFICATE"))
    usable = True
    for attr, what, marker in files:
        name, path = _ATTRS[attr].name, values[attr]
        if path is None:
            if attr != "rpc_tls_trust_certs":
                usable = False
                yield name, f"{name}: is required by {PREFIX}rpc.tls.enabled=true (or spark.ssl.rpc.enabled=true)"
            continue
        try:
            load_pem(path, what, marker)
        except TlsError as exc:
            usable = False
            yield name, f"{name}={path}: {exc}"
    if usable:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(values["rpc_tls_cert_chain"],
                                                                     values["rpc_tls_private_key"])
        except (ssl.SSLError, OSError) as exc:
            name = _ATTRS["rpc_tls_private_key"].name
            yield name, f"{name}={values['rpc_tls_private_key']}: does not fit {PREFIX}rpc.tls.certChain " \
                        f"({getattr(exc, 'reason', None) or exc})"


#: Cross-key bounds (attribute, attribute it must not exceed).
_AT_MOST = (("state_vnodes", "state_key_groups"), ("kazoo_min_batch", "kazoo_max_batch"))


#: Spark's TLS settings for its RPC, which ``rpc.tls.*`` follows where it is not set itself
SPARK_SSL_FALLBACKS = (
    ("rpc.tls.certChain", ("spark.ssl.rpc.certChain", "spark.ssl.certChain")),
    ("rpc.tls.privateKey", ("spark.ssl.rpc.privateKey", "spark.ssl.privateKey")),
)


def follow_spark_ssl(spark_conf: Mapping[str, Any]) -> dict[str, str]:
    """The ``spark.replication.rpc.tls.*`` settings implied by Spark's own ``spark.ssl.*`` (to be
    overridden by explicit ones): TLS on when Spark encrypts its RPC, with its PEM files."""
    def on(key: str) -> bool:
        return str(spark_conf.get(key, "")).strip().lower() == "true"

    enabled = on("spark.ssl.rpc.enabled") if "spark.ssl.rpc.enabled" in spark_conf else on("spark.ssl.enabled")
    if not enabled:
        return {}
    out = {PREFIX + "rpc.tls.enabled": "true"}
    for ours, theirs in SPARK_SSL_FALLBACKS:
        value = next((spark_conf[k] for k in theirs if spark_conf.get(k)), None)
        if value:
            out[PREFIX + ours] = str(value)
    return out


def _override_target(name: str) -> tuple[str, str] | None:
    """(override field, librdkafka property) for a pass-through key, or None if it is not one."""
    for field, prefix in (("consumer_overrides", KAFKA_CONSUMER_PREFIX), ("producer_overrides", KAFKA_PRODUCER_PREFIX),
                          ("kafka_overrides", KAFKA_PREFIX)):
        if name.startswith(prefix):
            return (field, name[len(prefix):]) if len(name) > len(prefix) else None
    return None


def _suggestion(name: str) -> str | None:
    """The declared key closest to ``name`` (compared case-insensitively after the prefix), if any is close."""
    parts = name.split(".", 2)
    suffix = parts[2].lower() if len(parts) == 3 else name.lower()
    suffixes = {k.name[len(PREFIX):].lower(): k.name for k in KEYS}
    match = difflib.get_close_matches(suffix, suffixes, n=1, cutoff=0.6)
    return suffixes[match[0]] if match else None


def _prefix_typo(name: str) -> bool:
    """Whether ``name`` looks like a misspelt ``spark.replication.`` key (e.g. ``spark.replicaton.x``)."""
    head = ".".join(name.split(".")[:2])
    return name.count(".") >= 2 and difflib.SequenceMatcher(None, head.lower(), PREFIX[:-1]).ratio() >= 0.9


def _unknown(name: str) -> str:
    """The problem text for an unknown key, with a suggestion when one is close."""
    hint = _suggestion(name)
    return f"{name}: unknown key" + (f" (did you mean {hint}?)" if hint else "; see docs/configuration.md")


def config_reference_markdown() -> str:
    """The configuration reference (``docs/configuration.md``), generated from the declarations."""
    return reference_markdown(KEYS, OWNED_KAFKA_PROPERTIES)


if __name__ == "__main__":
    print(config_reference_markdown(), end="")
