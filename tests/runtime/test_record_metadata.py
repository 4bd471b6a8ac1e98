"""Record metadata: a source's KafkaRecord (key, headers, timestamp, position) and a sink's key,
headers and timestamp taken from the record (plain and exactly-once sinks)."""

from __future__ import annotations

import pytest

from replication.api import Job, JobDefinitionError
from replication.records import KafkaRecord, kafka_record
from replication.runtime.exactly_once import ExactlyOnceOutput
from replication.runtime.operators import SinkOperator
from replication.serde import utf8_decode
from tests.runtime.test_operators import FakeEnv, rec


class Message:
    """What confluent-kafka's Message offers a source."""

    def __init__(self, key, headers, ts=1234, topic="in", partition=2, offset=40):
        self._key, self._headers, self._ts = key, headers, ts
        self._topic, self._partition, self._offset = topic, partition, offset

    def key(self):
        return self._key

    def headers(self):
        return self._headers

    def timestamp(self):
        return (1, self._ts)

    def topic(self):
        return self._topic

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset


def test_a_kafka_record_carries_the_key_headers_timestamp_and_position():
    record = kafka_record(Message(b"card-7", [("trace", b"a"), ("trace", b"b"), ("empty", None)]), {"x": 1}, utf8_decode)
    assert record == KafkaRecord(value={"x": 1}, key="card-7", headers=(("trace", b"a"), ("trace", b"b"),
                                                                          ("empty", None)),
                                 timestamp=1234, topic="in", partition=2, offset=40)
    assert record.header("trace") == b"b" and record.header("missing", b"-") == b"-"
    raw = kafka_record(Message(b"\x00\x01", None), "v", None)
    assert raw.key == b"\x00\x01" and raw.headers == ()
    assert kafka_record(Message(None, None), "v", utf8_decode).key is None


def test_a_sink_takes_the_key_headers_and_timestamp_from_the_record():
    env = FakeEnv()
    sink = SinkOperator("sink:out", env, "out", lambda v: v["v"].encode(), lambda k: k.encode(),
                        key_fn=lambda v: v["user"], headers_fn=lambda v: [("src", v["src"])],
                        timestamp_fn=lambda v: v["at"])
    sink.process(rec({"v": "x", "user": "u1", "src": b"s", "at": 99}, key="stream-key", ts=5, ingest=1.0))
    (msg,) = env.producer.produced
    assert msg["key"] == b"u1" and msg["timestamp"] == 99
    assert [h for h, _ in msg["headers"]] == ["src", "ingest_ts", "sink_ts"] and msg["headers"][0] == ("src", b"s")


def test_a_bad_header_dead_letters_the_record_and_the_sink_goes_on():
    env = FakeEnv()
    sink = SinkOperator("sink:out", env, "out", lambda v: b"v", None, headers_fn=lambda v: v)
    sink.process(rec([("n", "not bytes")], ts=5))
    sink.process(rec([("n", b"ok")], ts=6))
    assert len(env.producer.produced) == 1 and "header is a (str, bytes) pair" in env.dead_letters[0]["reason"]


class Producer:
    def __init__(self) -> None:
        self.produced: list[dict] = []

    def begin_transaction(self):
        pass

    def produce(self, topic, **kw):
        self.produced.append(kw)

    def poll(self, timeout):
        return 0


def test_an_exactly_once_output_writes_the_records_timestamp_and_reads_old_checkpoints():
    out = ExactlyOnceOutput.__new__(ExactlyOnceOutput)  # only what _write uses
    out.producer, out.topic, out.kafka_partition, out.txn_records, out.replica, out.epoch = Producer(), "o", 0, 1, 0, 1
    out._on_written = None
    out._write((1, b"v", b"k", [("rseq", b"1")], 77))
    out._write((2, b"v", b"k", [("rseq", b"2")]))  # an entry kept by a checkpoint of an earlier version
    first, second = out.producer.produced
    assert first["timestamp"] == 77 and "timestamp" not in second


def test_sink_and_source_options_are_checked_when_the_job_is_defined():
    stream = Job("j").source("in", metadata=True, key_deserializer="str")
    for call, match in [(lambda: stream.sink("o", key=lambda v: v), "needs a key_serializer"),
                        (lambda: stream.sink("o", headers="h"), "headers must be a function"),
                        (lambda: Job("k").source("in", key_deserializer="str"), "needs metadata=True"),
                        (lambda: Job("k").source("in", metadata=True, key_deserializer="avro"), "unknown key")]:
        with pytest.raises((JobDefinitionError, ValueError), match=match):
            call()
