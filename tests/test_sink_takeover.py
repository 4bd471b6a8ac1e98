"""The exactly-once sink protocol against the real broker, without Spark: a writer that dies in
the middle of a transaction, a standby that takes over, and the zombie that tries to go on."""

from __future__ import annotations

import time

import pytest

from deploy.topics import create_topics, read_all
from replication import sink as sink_module
from replication.config import ReplicationConfig
from replication.elements import DATA
from replication.metrics import InstanceMetrics
from replication.sink import ExactlyOnceSink

pytestmark = pytest.mark.integration


class SinkEnv:
    """What a sink operator sees of its hosting replica."""

    def __init__(self, cfg: ReplicationConfig, replica: int, sink_id: str) -> None:
        self.cfg, self.replica, self.sink_id = cfg, replica, sink_id
        self.metrics = InstanceMetrics()
        self.sinks: list = []
        self.dead: list = []

    def sink_partition(self, topic: str) -> int:
        return 0

    def register_sink(self, sink) -> None:
        self.sinks.append(sink)

    def poll_control(self) -> None:
        pass

    def dead_letter(self, **kw) -> None:
        self.dead.append(kw)


def _rec(i: int) -> tuple:
    return (DATA, {"i": i}, f"k{i % 7}", i, time.time(), None)


def _seqs(bootstrap: str, topic: str, sink_id: str) -> list[int]:
    out = []
    for r in read_all(bootstrap, topic):
        h = dict(r.headers)
        if h["rsink"] == sink_id.encode():
            out.append(int(h["rseq"]))
    return sorted(out)


def test_takeover_after_a_writer_dies_mid_transaction_writes_every_record_once(stack, topic_prefix, monkeypatch):
    topic, sink_id = f"{topic_prefix}out", f"{topic_prefix}run:2:0"
    create_topics(stack.bootstrap_servers, {topic: 1})
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers})
    envs = [SinkEnv(cfg, r, sink_id) for r in (0, 1)]
    writer, standby = (ExactlyOnceSink("sink", env, topic, lambda v: repr(v).encode(), str.encode) for env in envs)
    writer.control(0, 0, -1, -1)
    standby.control(0, 0, -1, -1)
    assert writer.writer and not standby.writer

    for i in range(300):
        writer.process(_rec(i))
        standby.process(_rec(i))
    writer._maybe_commit(force=True)
    assert writer.committed_seq == 299
    standby.control(0, 0, writer.committed_seq, writer.committed_offset)  # progress reaches the standby
    assert len(standby.buffer) == 0

    # 100 more records: the writer produces them in a transaction it never commits, then "dies"
    monkeypatch.setattr(sink_module, "COMMIT_EVERY", 10**9)
    writer._linger_s = 1e9
    for i in range(300, 400):
        writer.process(_rec(i))
        standby.process(_rec(i))
    writer.producer.flush(10)  # the records reached the broker inside the open transaction
    assert writer.txn_records == 100 and len(standby.buffer) == 100

    standby.control(1, 1, 299, writer.committed_offset)  # the driver promotes replica 1 (epoch 1)
    assert standby.writer

    # the zombie wakes up and tries to finish its transaction: fenced, and it stops writing
    writer.process(_rec(400))
    writer._maybe_commit(force=True)
    assert not writer.writer and writer.producer is None

    for i in range(400, 500):
        standby.process(_rec(i))
    standby.on_end()

    # every output seq exactly once as a plain consumer reads the topic (the embedded broker shows
    # the aborted transaction's records, so the new writer must not have rewritten them)
    assert _seqs(stack.bootstrap_servers, topic, sink_id) == list(range(500))
    # a fenced writer never reopens at its own epoch, even if told again
    writer.control(0, 0, -1, -1)
    assert not writer.writer
