"""Security settings without Spark: TLS files checked before start, Spark's own settings followed,
secrets kept out of reprs, and Kafka SASL/TLS properties reaching every client the project creates."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from replication.config import PREFIX, ConfigError, ReplicationConfig, follow_spark_ssl
from replication.security import (
    job_security,
    read_cli_credentials,
    remove_cli_credentials,
    write_cli_credentials,
)
from tests.transport.test_transport import tls_files

BASE = {PREFIX + "kafka.bootstrapServers": "127.0.0.1:9092"}


def _config(**settings: str) -> ReplicationConfig:
    return ReplicationConfig.from_mapping({**BASE, **{PREFIX + k: v for k, v in settings.items()}})


def _refused(**settings: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        _config(**settings)
    return err.value


# -- TLS ---------------------------------------------------------------------------------------

def test_tls_with_good_files_gives_the_material(tmp_path: Path) -> None:
    files = tls_files(tmp_path)
    cfg = _config(**{"rpc.tls.enabled": "true", "rpc.tls.certChain": files["chain"],
                     "rpc.tls.privateKey": files["key"], "rpc.tls.trustCerts": files["ca"]})
    tls = cfg.tls_material()
    assert tls is not None and b"CERTIFICATE" in tls.cert_chain and b"PRIVATE KEY" in tls.private_key
    assert "PRIVATE KEY" not in repr(tls)
    assert _config().tls_material() is None


@pytest.mark.parametrize("case, key, words", [
    ("missing chain", "rpc.tls.certChain", "is required"),
    ("no such file", "rpc.tls.privateKey", "cannot read"),
    ("not pem", "rpc.tls.certChain", "no PEM certificate"),
    ("key of another cert", "rpc.tls.privateKey", "does not fit"),
    ("trust not pem", "rpc.tls.trustCerts", "no PEM certificate"),
])
def test_bad_tls_files_are_refused_before_start_naming_the_key(tmp_path: Path, case, key, words) -> None:
    files, other = tls_files(tmp_path), tls_files(tmp_path, "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    settings = {"rpc.tls.enabled": "true", "rpc.tls.certChain": files["chain"], "rpc.tls.privateKey": files["key"]}
    if case == "missing chain":
        del settings["rpc.tls.certChain"]
    elif case == "no such file":
        settings["rpc.tls.privateKey"] = str(tmp_path / "nothing.pem")
    elif case == "not pem":
        settings["rpc.tls.certChain"] = str(junk)
    elif case == "key of another cert":
        settings["rpc.tls.privateKey"] = other["key"]
    else:
        settings["rpc.tls.trustCerts"] = str(junk)
    err = _refused(**settings)
    assert err.key == PREFIX + key and words in str(err) and "\n" not in str(err), str(err)


def test_spark_ssl_turns_tls_on_with_its_pem_files() -> None:
    assert follow_spark_ssl({"spark.ssl.enabled": "false"}) == {}
    assert follow_spark_ssl({"spark.ssl.rpc.enabled": "true", "spark.ssl.rpc.certChain": "/c.pem",
                             "spark.ssl.privateKey": "/k.pem"}) == {
        PREFIX + "rpc.tls.enabled": "true", PREFIX + "rpc.tls.certChain": "/c.pem",
        PREFIX + "rpc.tls.privateKey": "/k.pem"}
    # spark.ssl.rpc.enabled decides over spark.ssl.enabled
    assert follow_spark_ssl({"spark.ssl.enabled": "true", "spark.ssl.rpc.enabled": "false"}) == {}
    # Spark with a JKS keystore only: refused, naming our key (gRPC reads PEM)
    settings = {**BASE, **follow_spark_ssl({"spark.ssl.enabled": "true", "spark.ssl.keyStore": "/ks.jks"})}
    with pytest.raises(ConfigError) as err:
        ReplicationConfig.from_mapping(settings)
    assert err.value.key == PREFIX + "rpc.tls.certChain" and "spark.ssl.rpc.enabled" in str(err.value)


# -- secrets -----------------------------------------------------------------------------------

def test_the_rpc_secret_follows_spark_authenticate(tmp_path: Path) -> None:
    cfg = _config()
    generated = job_security({}, cfg)
    assert generated.secret != job_security({}, cfg).secret  # fresh per run
    spark = {"spark.authenticate": "true", "spark.authenticate.secret": "shared by the application"}
    assert job_security(spark, cfg).secret == job_security(spark, cfg).secret
    secret_file = tmp_path / "secret"
    secret_file.write_text("shared by the application\n")
    assert job_security({"spark.authenticate": "true", "spark.authenticate.secret.file": str(secret_file)},
                        cfg).secret == job_security(spark, cfg).secret
    assert job_security({"spark.authenticate": "false", "spark.authenticate.secret": "x" * 20}, cfg).secret \
        != job_security({"spark.authenticate": "false", "spark.authenticate.secret": "x" * 20}, cfg).secret
    assert "shared" not in repr(job_security(spark, cfg)) and generated.secret.hex() not in repr(generated)


def test_the_cli_credentials_are_readable_by_their_owner_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("REPLICATION_STATUS_DIR", str(tmp_path))
    security = job_security({}, _config())
    path = write_cli_credentials("job", security, _config())
    assert path.stat().st_mode & 0o077 == 0
    assert read_cli_credentials("job").secret == security.secret
    remove_cli_credentials("job")
    with pytest.raises(FileNotFoundError):
        read_cli_credentials("job")


def test_passwords_stay_out_of_the_config_repr() -> None:
    cfg = _config(**{"metrics.basicAuth": "scraper:pw-metrics", "zookeeper.digest": "job:pw-zk",
                     "kafka.sasl.username": "u", "kafka.sasl.password": "pw-kafka",
                     "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanisms": "PLAIN"})
    assert not any(pw in repr(cfg) for pw in ("pw-metrics", "pw-zk", "pw-kafka")), repr(cfg)
    assert _refused(**{"zookeeper.digest": "no-colon"}).key == PREFIX + "zookeeper.digest"
    assert _refused(**{"metrics.basicAuth": ":pw"}).key == PREFIX + "metrics.basicAuth"


# -- Kafka SASL/TLS everywhere ----------------------------------------------------------------

class _Made(Exception):
    """Raised by a recording client constructor, once it recorded its configuration."""


@pytest.fixture
def kafka_security(tmp_path: Path) -> dict[str, str]:
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "job",
            "sasl.password": "pw", "ssl.ca.location": tls_files(tmp_path)["ca"]}


def test_kafka_sasl_and_tls_settings_reach_every_client(kafka_security, monkeypatch) -> None:
    """Sources, sinks and dead letters (their writers and takeover scans), the order log, the
    heartbeat log (generator and readers), the plain dead-letter writer and the admin client all
    get the pass-through properties."""
    import replication.runtime.exactly_once as exactly_once
    import replication.runtime.worker as worker
    import transport.kafka_io as kafka_io
    from kazoo_leader.order_log import OrderLog
    from liverobin.generator import HeartbeatGenerator
    from liverobin.positions import PositionBoard
    from liverobin.reader import PulseReader
    from liverobin.segments import HeartbeatLog
    from replication.runtime.feeds import WorkerFeeds

    cfg = _config(**{f"kafka.{k}": v for k, v in kafka_security.items()})
    made: dict[str, dict] = {}

    def recorder(role: str):
        def make(conf, *args, **kwargs):
            made[role] = dict(conf)
            raise _Made(role)
        return make

    monkeypatch.setattr(worker, "Producer", recorder("the worker's producer (plain dead letters and sinks)"))
    monkeypatch.setattr(exactly_once, "Producer", recorder("sink and dead-letter writer"))
    monkeypatch.setattr(exactly_once, "Consumer", recorder("sink and dead-letter takeover scan"))
    monkeypatch.setattr(kafka_io, "Consumer", recorder("end offsets"))
    monkeypatch.setattr(kafka_io, "AdminClient", recorder("admin"))
    calls = {
        "the worker's producer (plain dead letters and sinks)": lambda: worker.Worker._build_host(SimpleNamespace(cfg=cfg, job_name="j"), {}),
        "sink and dead-letter writer": lambda: exactly_once.ExactlyOnceOutput(
            "sink", cfg, 0, "s", "t", 0, 0.005).control(0, 0, -1, -1),
        "sink and dead-letter takeover scan": lambda: exactly_once.max_written_seq(
            cfg.kafka_consumer_config(group_id="scan"), "t", 0, "s", 0),
        "end offsets": lambda: kafka_io.end_offsets_by_fetch(cfg.kafka_consumer_config(), "t", [0]),
        "admin": lambda: kafka_io.admin_client(cfg.kafka_admin_config()),
    }
    for role, call in calls.items():
        with pytest.raises(_Made):
            call()
        assert role in made, role
    order_log = OrderLog(cfg.kafka_consumer_config(), cfg.kafka_producer_config(), lambda topics: None)
    made["order log reader"], made["order log writer"] = order_log._consumer_conf, order_log._producer_conf
    generator = HeartbeatGenerator(name="g", heartbeat_log=HeartbeatLog("hb"), sources={}, positions=PositionBoard(),
                                   starts={}, period_s=0.01,
                                   max_step=10, consumer_conf=cfg.kafka_consumer_config(),
                                   producer_conf=cfg.kafka_producer_config(), create_topics=lambda topics: None)
    made["pulse generator reader"], made["pulse generator writer"] = generator._consumer_conf, generator._producer_conf
    made["sources"] = WorkerFeeds(SimpleNamespace(cfg=cfg, plan=None, job_name="j"), 0, 0).source_consumer()._conf
    made["pulse reader"] = PulseReader(HeartbeatLog("hb"), cfg.kafka_consumer_config())._conf
    assert len(made) == 11
    for role, conf in made.items():
        assert {k: conf.get(k) for k in kafka_security} == kafka_security, role
