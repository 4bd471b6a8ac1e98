"""The exactly-once output's roles without a broker: a writer whose producer the broker fenced
steps down instead of failing its replica."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from replication.config import ReplicationConfig
from replication.exactly_once import ExactlyOnceOutput


class FencedProducer:
    """A transactional producer the broker fenced: produce raises the fatal error, or, once
    librdkafka learned of it elsewhere (a delivery report, its background thread), a local
    ``_FATAL`` ("Unable to produce message: Local: Fatal error") whose ``fatal()`` is False."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args, **kwargs) -> None:
        raise KafkaException(self.error)


@pytest.mark.parametrize("error", [KafkaError(KafkaError._FATAL), KafkaError(KafkaError._FENCED, fatal=True)],
                         ids=["local-fatal", "fenced"])
def test_a_writer_whose_producer_was_fenced_steps_down_and_keeps_its_records(error):
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    roles: list[str] = []
    out = ExactlyOnceOutput("src[0]r0 dead letters", cfg, 0, "run:0:0:dlq", "dlq", 0, 0.1, on_role=roles.append)
    out.writer, out.epoch, out.producer = True, 0, FencedProducer(error)
    out.append(b"payload", None, [])
    assert not out.writer and out.producer is None and roles == ["standby"]
    assert [seq for seq, *_ in out.buffer] == [0]  # kept until a writer confirms it


def test_any_other_produce_error_is_raised():
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.1)
    out.writer, out.epoch, out.producer = True, 0, FencedProducer(KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaException):
        out.append(b"payload", None, [])
