"""Exactly-once sink for replicated jobs (and for checkpointed ones without replication: a
partition restored from a checkpoint takes over as writer like a replica does), without relying
on ``read_committed``.

Both replicas of a sink partition see the same records in the same order and
number them with the same output seq.  Only the *writer* replica (chosen by the
job master; replica 0 first) produces them, in Kafka transactions, to output
partition ``sink partition mod N``, each record tagged with headers ``rsink``
(this sink partition of this run) and ``rseq``.  The other replica keeps what
is not yet known to be committed.

When the writer's worker is declared dead, the master promotes the other
replica with a higher epoch.  The new writer opens a producer with the same
transactional id (which fences the old one at the broker: a hung writer that
wakes up cannot write), scans the output partition from the last committed
offset it heard of for the highest seq of this sink partition, and writes only
what comes after it.  The scan reads with ``read_committed``: on Apache Kafka
it skips the old writer's aborted records (and so rewrites them), on the
embedded broker it sees them (and so does not); either way a plain consumer of
that broker sees every record once (DESIGN §7, §10).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from replication.kafka_io import produce_blocking
from replication.operators import SinkBase

log = logging.getLogger(__name__)

COMMIT_EVERY = 500  # records per transaction at most


class SinkFenced(RuntimeError):
    """This replica was fenced as a writer: another replica took over."""


def max_written_seq(consumer_conf: dict, topic: str, partition: int, sink_id: str, start_offset: int,
                    timeout_s: float = 30.0) -> int:
    """Highest ``rseq`` of ``sink_id`` in ``topic``/``partition`` from ``start_offset`` on (-1: none)."""
    consumer = Consumer({**consumer_conf, "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    sink_key = sink_id.encode()
    best = -1
    try:
        start = start_offset if start_offset >= 0 else OFFSET_BEGINNING
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"scanning {topic}[{partition}] for {sink_id} took over {timeout_s}s")
            for msg in consumer.consume(num_messages=1000, timeout=0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return best
                    raise KafkaException(err)
                headers = dict(msg.headers() or ())
                if headers.get("rsink") == sink_key:
                    best = max(best, int(headers["rseq"]))
    finally:
        consumer.close()


class ExactlyOnceSink(SinkBase):
    def __init__(self, name: str, env: Any, topic: str, serializer: Callable, key_serializer: Callable | None) -> None:
        super().__init__(name, env, topic, serializer, key_serializer)
        self.sink_id = env.sink_id
        self.kafka_partition = env.sink_partition(topic)
        self.seq = -1  # last output seq assigned
        self.buffer: deque[tuple[int, bytes, bytes | None, list]] = deque()  # not yet known committed
        self.writer = False
        self.epoch = -1
        self.producer: Producer | None = None
        self.txn_records = 0
        self.txn_started = 0.0
        self.txn_last_seq = -1
        self.committed_seq = -1
        self.committed_offset = -1
        self._offset_seen = -1
        self._linger_s = env.cfg.channel_buffer_timeout_ms / 1000
        env.register_sink(self)

    # -- records ------------------------------------------------------------------------
    def process(self, rec: tuple) -> None:
        out = self.serialize(rec)
        if out is None:
            return
        value, key = out
        self.seq += 1
        self.env.metrics.records_out += 1
        if self.seq <= self.committed_seq:
            return  # regenerated after a restore from a checkpoint: the output has it already
        entry = (self.seq, value, key, [("rsink", self.sink_id.encode()), ("rseq", str(self.seq).encode()),
                                        ("ingest_ts", repr(rec[4]).encode())])
        self.buffer.append(entry)
        if self.writer:
            self._write(entry, rec[4])
            self._maybe_commit()

    def on_idle(self) -> None:
        if self.writer:
            self._maybe_commit()

    def _write(self, entry: tuple, ingest_ts: float | None = None) -> None:
        assert self.producer is not None
        if self.txn_records == 0:
            self.producer.begin_transaction()
            self.txn_started = time.monotonic()
        seq, value, key, headers = entry
        now = time.time()
        produce_blocking(self.producer, self.topic, partition=self.kafka_partition, value=value, key=key,
                         headers=[*headers, ("sink_ts", repr(now).encode())], on_delivery=self._delivered)
        self.txn_records += 1
        self.txn_last_seq = seq
        if ingest_ts is not None:
            self.env.metrics.latency.record(now - ingest_ts)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self._offset_seen = max(self._offset_seen, msg.offset())

    def _maybe_commit(self, force: bool = False) -> None:
        if self.txn_records == 0:
            return
        if not force and self.txn_records < COMMIT_EVERY and time.monotonic() - self.txn_started < self._linger_s:
            return
        try:
            self.producer.commit_transaction(30)
        except KafkaException as err:
            self._fenced(err)
            return
        self.txn_records = 0
        self._committed(self.txn_last_seq, self._offset_seen)

    def _committed(self, seq: int, offset: int) -> None:
        self.committed_seq = max(self.committed_seq, seq)
        self.committed_offset = max(self.committed_offset, offset)
        while self.buffer and self.buffer[0][0] <= self.committed_seq:
            self.buffer.popleft()
        m = self.env.metrics
        m.sink_committed_seq, m.sink_committed_offset = self.committed_seq, self.committed_offset

    def _fenced(self, err: KafkaException) -> None:
        log.warning("%s: fenced as writer (%s): another replica took over", self.name, err.args[0])
        self.writer = False
        self.txn_records = 0
        self.producer = None
        self.env.metrics.role = "standby"

    def snapshot(self) -> Any:
        return self.seq

    def restore(self, snapshot: Any) -> None:
        self.seq = snapshot  # records after it are produced again, with the same seqs

    # -- roles (called by the instance thread with the master's view) ---------------------------
    def control(self, writer_replica: int, epoch: int, committed_seq: int, committed_offset: int) -> None:
        if epoch < self.epoch:
            return
        self._committed(committed_seq, committed_offset)
        # only a strictly newer assignment makes a writer: a fenced writer never reopens at its own epoch
        if writer_replica == self.env.replica and epoch > self.epoch:
            self._become_writer(epoch)
        elif writer_replica != self.env.replica and self.writer:
            self.writer = False  # demoted: the new writer's producer fences ours
            self.producer = None
            self.txn_records = 0
        self.epoch = epoch

    def _become_writer(self, epoch: int) -> None:
        conf = self.env.cfg.kafka_producer_config()
        conf.update({"transactional.id": f"replication.{self.sink_id}", "enable.idempotence": True, "acks": "all"})
        producer = Producer(conf)
        producer.init_transactions(30)  # fences any older producer of this sink partition
        if epoch > 0:  # taking over: what did the previous writer get into the log?
            written = max_written_seq(self.env.cfg.kafka_consumer_config(group_id=f"scan-{self.sink_id}"),
                                      self.topic, self.kafka_partition, self.sink_id, self.committed_offset)
            log.warning("%s: took over as writer (epoch %d): output has seq <= %d, %d records buffered",
                        self.name, epoch, written, len(self.buffer))
            self._committed(written, self.committed_offset)
        self.producer = producer
        self.writer = True
        self.env.metrics.role = "writer"
        for entry in list(self.buffer):
            self._write(entry)
        self._maybe_commit(force=True)

    def on_end(self) -> None:
        deadline = time.monotonic() + self.env.cfg.stop_timeout_ms / 1000 * 3
        while True:
            if self.writer:
                self._maybe_commit(force=True)
                if self.writer and self.producer is not None:
                    self.producer.flush(30)
                    return
            elif self.committed_seq >= self.seq:
                return  # the writer has everything this replica produced
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: output up to seq {self.seq} not confirmed by a writer "
                                   f"(committed {self.committed_seq})")
            self.env.poll_control()
            time.sleep(0.02)
