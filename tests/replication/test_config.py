"""Tests for replication/config.py: parsing, validation, pass-through and the generated reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from replication.config import (
    KEYS,
    PREFIX,
    ConfigError,
    ReplicationConfig,
    config_reference_markdown,
)

BOOT = {"spark.replication.kafka.bootstrapServers": "127.0.0.1:9092"}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def cfg(**entries: object) -> ReplicationConfig:
    """Config from BOOT plus ``entries`` (keys given without the prefix, dots as '__')."""
    return ReplicationConfig.from_mapping({**BOOT, **{PREFIX + k.replace("__", "."): v for k, v in entries.items()}})


def refused(mapping: dict[str, object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        ReplicationConfig.from_mapping({**BOOT, **mapping})
    return info.value


def test_prefix_and_defaults() -> None:
    assert PREFIX == "spark.replication."
    c = ReplicationConfig.from_mapping(BOOT)
    assert c.enabled is False
    assert c.kafka_bootstrap_servers == "127.0.0.1:9092"
    assert c.zookeeper_connect is None and c.state_dir is None and c.dead_letter_topic_name is None
    assert (c.parallelism, c.workers, c.channel_batch_size, c.channel_queue_capacity) == (2, 0, 256, 64)
    assert (c.state_key_groups, c.state_vnodes, c.state_cache_entries) == (32768, 256, 10_000)
    assert c.handover_chunk_bytes == 8 * 1024 * 1024
    assert (c.channel_buffer_timeout_ms, c.watermark_interval_ms, c.stop_timeout_ms) == (5, 200, 10_000)
    assert (c.start_timeout_ms, c.metrics_interval_ms, c.sink_linger_ms) == (120_000, 1_000, 100)
    assert c.metrics_port == 0 and cfg(metrics__port="9464").metrics_port == 9464
    assert c.dead_letter_topic("orders") == "orders.dlq"
    assert cfg(deadLetterTopic="bad-records").dead_letter_topic("orders") == "bad-records"
    assert (c.mode, c.liverobin_heartbeat_period_ms, c.liverobin_max_pulse_step) == ("unordered", 10, 1_000)
    assert c.unordered_allow_divergence is False
    assert c.heartbeat_topic("orders") == "_replication.orders.heartbeats"
    assert cfg(mode="liverobin", **{"liverobin.heartbeatPeriod": "50ms"}).liverobin_heartbeat_period_ms == 50
    # the generators' period: LiveRobin's heartbeat, or in KaZoo mode its pulse windows'
    assert cfg(mode="liverobin").pulse_period_ms == 10 and c.kazoo_window_pulse_period_ms == 30
    kazoo = {"mode": "kazoo", "zookeeper.connect": "z:2181", "liverobin.heartbeatPeriod": "50ms"}
    assert cfg(**kazoo).pulse_period_ms == 30
    assert cfg(**kazoo, **{"kazoo.windowPulsePeriod": "20ms"}).pulse_period_ms == 20
    assert c == ReplicationConfig(kafka_bootstrap_servers="127.0.0.1:9092")
    assert {k.name for k in KEYS} >= {PREFIX + "parallelism", PREFIX + "sink.lingerMs"} and len(KEYS) == 56


def test_other_keys_ignored_and_values_typed() -> None:
    c = ReplicationConfig.from_mapping({**BOOT, "spark.master": "local[2]", "spark.executor.memory": "x"})
    assert c.parallelism == 2
    c = ReplicationConfig.from_mapping({**BOOT, PREFIX + "parallelism": 8, PREFIX + "enabled": False})
    assert c.parallelism == 8 and c.enabled is False


@pytest.mark.parametrize("raw, expected", [("false", False), ("FALSE", False), (" False ", False), (False, False)])
def test_parse_bool(raw: object, expected: bool) -> None:
    assert cfg(enabled=raw).enabled is expected


@pytest.mark.parametrize("raw, expected", [("4", 4), (" 16 ", 16), (32, 32), (64.0, 64), ("1_000", 1000)])
def test_parse_int(raw: object, expected: int) -> None:
    assert cfg(parallelism=raw).parallelism == expected


@pytest.mark.parametrize(
    "raw, expected",
    [("500", 500), (500, 500), ("10ms", 10), ("2s", 2000), ("1.5s", 1500), ("1m", 60_000), ("1H", 3_600_000)],
)
def test_parse_duration(raw: object, expected: int) -> None:
    assert cfg(watermark__interval=raw).watermark_interval_ms == expected


def test_parse_str_and_empty_means_unset() -> None:
    c = cfg(state__dir=" /data/state ", zookeeper__connect="zk1:2181,zk2:2181/app", deadLetterTopic="")
    assert c.state_dir == "/data/state"
    assert c.zookeeper_connect == "zk1:2181,zk2:2181/app"
    assert c.dead_letter_topic_name is None
    assert cfg(kafka__bootstrapServers="PLAINTEXT://b1:9092, b2:9093,[::1]:9094").kafka_bootstrap_servers


def test_parse_float_and_enum_keys() -> None:
    """No declared key is float or enum yet; the Key spec parses and checks them all the same."""
    from replication.config_keys import ENUM, FLOAT, Key

    f = Key(PREFIX + "x", FLOAT, 0.5, "doc", min=0, max=1)
    assert f.parse("0.25") == 0.25 and f.parse(1) == 1.0 and f.check(f.parse("2")) == "must be between 0 and 1"
    for bad in ("nan", "abc", True):
        with pytest.raises(ValueError):
            f.parse(bad)
    e = Key(PREFIX + "mode", ENUM, "kazoo", "doc", choices=("kazoo", "liverobin"))
    assert e.parse("LiveRobin") == "liverobin" and e.check("x") == "must be one of kazoo, liverobin"


@pytest.mark.parametrize(
    "key, raw, fragment",
    [
        ("enabled", "yes", "expected true or false"),
        ("parallelism", "abc", "expected an integer"),
        ("parallelism", "2.5", "expected an integer"),
        ("parallelism", True, "not a bool"),
        ("watermark.interval", "5 parsecs", "expected a duration"),
        ("watermark.interval", "0.5ms", "whole number of milliseconds"),
        ("parallelism", "0", "must be between 1 and 1024"),
        ("parallelism", "1025", "must be between 1 and 1024"),
        ("workers", "-1", "must be between 0 and 4096"),
        ("channel.batchSize", "100001", "must be between 1 and 100000"),
        ("channel.bufferTimeout", "11s", "must be between 0 ms and 10000 ms"),
        ("channel.queueCapacity", "0", "must be between 1 and 100000"),
        ("state.keyGroups", "1000", "must be a power of two"),
        ("state.keyGroups", "65536", "must be between 1 and 32768"),
        ("state.vnodes", "0", "must be between 1 and 32768"),
        ("state.cacheEntries", "0", "must be between"),
        ("watermark.interval", "0", "must be between 1 ms"),
        ("stopTimeout", "50ms", "must be between 100 ms and 600000 ms"),
        ("startTimeout", "2h", "must be between 1000 ms"),
        ("metrics.interval", "1", "must be between 10 ms"),
        ("metrics.port", "-1", "must be between 0 and 65535"),
        ("metrics.port", "65536", "must be between 0 and 65535"),
        ("metrics.port", "http", "expected an integer"),
        ("sink.lingerMs", "-1", "must be between 0 and 900000"),
        ("kafka.bootstrapServers", "localhost", "expected host:port"),
        ("kafka.bootstrapServers", "h:1,h:99999", "expected host:port"),
        ("kafka.bootstrapServers", "", "is required"),
        ("zookeeper.connect", "zk1", "expected host:port[,host:port...][/chroot]"),
        ("deadLetterTopic", "bad topic!", "expected a Kafka topic name"),
    ],
)
def test_constraint_errors_name_the_key(key: str, raw: object, fragment: str) -> None:
    err = refused({PREFIX + key: raw})
    assert err.key == PREFIX + key and err.keys == [PREFIX + key]
    assert len(err.problems) == 1 and err.problems[0].startswith(PREFIX + key)
    assert fragment in str(err)


def test_bootstrap_servers_required() -> None:
    with pytest.raises(ConfigError, match=r"spark\.replication\.kafka\.bootstrapServers: is required"):
        ReplicationConfig.from_mapping({})


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("spark.replication.paralelism", "spark.replication.parallelism"),
        ("spark.replication.channel.batchsize", "spark.replication.channel.batchSize"),
        ("spark.replication.state.vnode", "spark.replication.state.vnodes"),
        ("spark.replicaton.workers", "spark.replication.workers"),
    ],
)
def test_unknown_key_suggests(key: str, suggestion: str) -> None:
    err = refused({key: "1"})
    assert err.key == key
    assert str(err) == f"{key}: unknown key (did you mean {suggestion}?)"


def test_unknown_key_without_close_match() -> None:
    assert "unknown key; see docs/configuration.md" in str(refused({PREFIX + "zzzzzz": "1"}))


def test_all_problems_collected_in_one_error() -> None:
    err = refused({
        PREFIX + "paralelism": "3",
        PREFIX + "workers": "many",
        PREFIX + "channel.batchSize": "0",
        PREFIX + "mode": "fifo",
        PREFIX + "kafka.producer.no.such.property": "1",
    })
    assert err.keys == [
        PREFIX + "paralelism",
        PREFIX + "workers",  # failed to parse: reported first
        PREFIX + "mode",
        PREFIX + "channel.batchSize",
        PREFIX + "kafka.producer.no.such.property",
    ]
    message = str(err)
    assert message.startswith("5 configuration problems:")
    assert all(f"  - {p}" in message for p in err.problems)


def test_cross_key_vnodes_le_key_groups() -> None:
    err = refused({PREFIX + "state.keyGroups": "64", PREFIX + "state.vnodes": "128"})
    assert err.key == PREFIX + "state.vnodes"
    assert str(err) == "spark.replication.state.vnodes=128: must be <= spark.replication.state.keyGroups (64)"
    assert cfg(state__keyGroups="64", state__vnodes="64").state_vnodes == 64
    # a key that already failed on its own is not reported again by the cross-key check
    assert refused({PREFIX + "state.keyGroups": "63", PREFIX + "state.vnodes": "128"}).keys == [PREFIX + "state.keyGroups"]


def test_enabled_true_accepted_and_mode_validated() -> None:
    for raw in ("true", "True", True):
        assert cfg(enabled=raw).enabled is True
    assert cfg().mode == "unordered"
    assert cfg(enabled="true", mode="liverobin").mode == "liverobin"
    err = refused({PREFIX + "enabled": "true", PREFIX + "mode": "fifo"})
    assert err.keys == [PREFIX + "mode"] and "must be one of unordered, liverobin, kazoo" in str(err)


def test_direct_construction_validates() -> None:
    with pytest.raises(ConfigError) as info:
        ReplicationConfig(kafka_bootstrap_servers="h:1", parallelism="4", state_key_groups=3)  # type: ignore[arg-type]
    assert info.value.keys == [PREFIX + "parallelism", PREFIX + "state.keyGroups"]
    assert "expected int, got str" in info.value.problems[0]


def test_kafka_pass_through() -> None:
    c = ReplicationConfig.from_mapping({
        **BOOT,
        PREFIX + "kafka.security.protocol": "plaintext",
        PREFIX + "kafka.client.id": "job-7",
        PREFIX + "kafka.consumer.fetch.min.bytes": 1024,
        PREFIX + "kafka.producer.acks": "all",
        PREFIX + "kafka.producer.enable.idempotence": True,
        PREFIX + "sink.lingerMs": "20",
    })
    shared = {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "plaintext", "client.id": "job-7"}
    assert c.kafka_consumer_config() == {
        **shared, "fetch.min.bytes": "1024", "group.id": "spark-replication", "enable.auto.commit": False,
    }
    assert c.kafka_consumer_config("g")["group.id"] == "g"
    assert c.kafka_producer_config() == {**shared, "acks": "all", "enable.idempotence": "true", "linger.ms": 20}
    assert c.kafka_admin_config() == shared
    with pytest.raises(TypeError):
        c.kafka_overrides["x"] = "y"  # type: ignore[index]


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("kafka.no.such.property", "1", 'No such configuration property: "no.such.property"'),
        ("kafka.consumer.fetch.min.bytes", "lots", "Invalid value"),
        ("kafka.producer.enable.idempotence", "maybe", "Expected bool value"),
        ("kafka.producer.fetch.min.bytes", "1", "is a consumer property and will be ignored by this producer"),
        ("kafka.consumer.acks", "all", "is a producer property and will be ignored by this consumer"),
        ("kafka.consumer.", "1", "unknown key"),
    ],
)
def test_kafka_pass_through_invalid(key: str, value: str, fragment: str) -> None:
    err = refused({PREFIX + key: value})
    assert err.key == PREFIX + key and len(err.problems) == 1
    assert fragment in str(err)


def test_kafka_pass_through_suggestions() -> None:
    assert "(did you mean spark.replication.kafka.consumer.fetch.min.bytes?)" in str(
        refused({PREFIX + "kafka.producer.fetch.min.bytes": "1"})
    )
    assert "(did you mean spark.replication.kafka.bootstrapServers?)" in str(
        refused({PREFIX + "kafka.bootstrapservers": "h:1"})
    )


@pytest.mark.parametrize(
    "key, reason",
    [
        ("kafka.bootstrap.servers", "set spark.replication.kafka.bootstrapServers instead"),
        ("kafka.consumer.group.id", "sources read with manual partition assignment"),
        ("kafka.consumer.enable.auto.commit", "never auto-committed"),
        ("kafka.enable.partition.eof", "owned by the runtime"),
        ("kafka.producer.linger.ms", "set spark.replication.sink.lingerMs instead"),
        ("kafka.producer.transactional.id", "owned by the runtime"),
    ],
)
def test_owned_kafka_properties_refused(key: str, reason: str) -> None:
    err = refused({PREFIX + key: "x"})
    assert err.key == PREFIX + key
    assert str(err).startswith(f"{PREFIX}{key}: cannot be set, ") and reason in str(err)


def test_from_spark_conf() -> None:
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False)  # no SparkContext, so no JVM: a plain Python dict underneath
    conf.setMaster("local[1]").set("spark.executor.memory", "512m")
    conf.set("spark.replication.kafka.bootstrapServers", "b:9092").set("spark.replication.parallelism", "6")
    conf.set("spark.replication.stopTimeout", "3s").set("spark.replication.kafka.producer.acks", "1")
    c = ReplicationConfig.from_spark_conf(conf)
    assert (c.kafka_bootstrap_servers, c.parallelism, c.stop_timeout_ms) == ("b:9092", 6, 3000)
    assert dict(c.producer_overrides) == {"acks": "1"}
    with pytest.raises(ConfigError, match="spark.replication.parallelism"):
        ReplicationConfig.from_spark_conf(conf.set("spark.replication.parallelism", "0"))


def test_round_trip() -> None:
    c = cfg(
        parallelism="7", channel__bufferTimeout="2s", state__dir="/tmp/s", zookeeper__connect="zk:2181",
        state__keyGroups="1024", state__vnodes="1024", deadLetterTopic="dlq", kafka__client__id="c",
        kafka__consumer__fetch__min__bytes="8", kafka__producer__acks="all",
    )
    mapping = c.to_mapping()
    assert mapping[PREFIX + "channel.bufferTimeout"] == "2000ms" and mapping[PREFIX + "enabled"] == "false"
    assert mapping[PREFIX + "kafka.consumer.fetch.min.bytes"] == "8"
    assert PREFIX + "zookeeper.connect" in mapping and all(isinstance(v, str) for v in mapping.values())
    assert ReplicationConfig.from_mapping(mapping) == c
    defaults = ReplicationConfig.from_mapping(BOOT)
    assert ReplicationConfig.from_mapping(defaults.to_mapping()) == defaults
    assert hash(c) == hash(ReplicationConfig.from_mapping(mapping))


def test_schema_is_declared_once() -> None:
    fields = {f.name: f for f in dataclasses.fields(ReplicationConfig) if f.metadata}
    assert len(fields) == len(KEYS)
    for f in fields.values():
        key = f.metadata["key"]
        assert key.name.startswith(PREFIX) and key.doc
        assert key.required or f.default == key.default


def test_generated_docs_up_to_date() -> None:
    assert DOCS.read_text() == config_reference_markdown(), (
        "docs/configuration.md is stale: run `python -m replication.config > docs/configuration.md`"
    )
    text = config_reference_markdown()
    assert all(f"`{k.name}`" in text for k in KEYS)


def test_kazoo_needs_zookeeper_and_batch_bounds() -> None:
    err = refused({PREFIX + "enabled": "true", PREFIX + "mode": "kazoo"})
    assert err.keys == [PREFIX + "zookeeper.connect"] and "required by spark.replication.mode=kazoo" in str(err)
    c = cfg(enabled="true", mode="kazoo", zookeeper__connect="127.0.0.1:2181")
    assert (c.kazoo_session_timeout_ms, c.kazoo_max_batch, c.kazoo_min_batch, c.kazoo_idle_timeout_ms) == (
        2_000, 1_000, 1, 2)
    err = refused({PREFIX + "mode": "kazoo", PREFIX + "zookeeper.connect": "127.0.0.1:2181",
                   PREFIX + "kazoo.minBatch": "50", PREFIX + "kazoo.maxBatch": "10"})
    assert str(err) == "spark.replication.kazoo.minBatch=50: must be <= spark.replication.kazoo.maxBatch (10)"


def test_rhino_checkpoints_need_a_mode_with_checkpoint_positions() -> None:
    for extra in ({PREFIX + "enabled": "true"}, {}):  # unordered, replicated or not: no checkpoint positions
        err = refused({PREFIX + "rhino.enabled": "true", **extra})
        assert err.key == PREFIX + "rhino.enabled" and "mode=liverobin or kazoo" in str(err)
    ok = cfg(rhino__enabled="true", enabled="true", mode="liverobin", rhino__checkpointEvery="50")
    assert (ok.rhino_enabled, ok.rhino_replicas, ok.rhino_checkpoint_every) == (True, 1, 50)
    passive = cfg(rhino__enabled="true", mode="liverobin")  # checkpoint-restart without replication
    assert passive.rhino_enabled and not passive.enabled


def test_a_checkpoint_directory_needs_rhino_checkpoints() -> None:
    err = refused({PREFIX + "checkpointDir": "/shared/cp", PREFIX + "mode": "liverobin"})
    assert err.key == PREFIX + "checkpointDir" and "needs spark.replication.rhino.enabled=true" in str(err)
    ok = cfg(rhino__enabled="true", mode="liverobin", checkpointDir="s3://bucket/jobs")
    assert (ok.checkpoint_dir, ok.checkpoint_dir_retain, ok.checkpoint_dir_ignore) == ("s3://bucket/jobs", 3, False)
    assert refused({PREFIX + "checkpointDir.retain": "0"}).key == PREFIX + "checkpointDir.retain"
