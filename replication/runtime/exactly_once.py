"""Exactly-once output of one replicated partition to one Kafka partition, without relying on
``read_committed`` (the sinks and the dead letters of a replicated or checkpointed job).

Both replicas of a partition produce the same records in the same order and number them with
the same output seq.  Only the *writer* replica (chosen by the job master; replica 0 first)
produces them, in Kafka transactions, each record tagged with headers ``rsink`` (this output of
this partition of this run), ``rseq`` and ``rwriter`` (the replica and epoch that wrote it).  The
other replica keeps what is not yet known to be committed (the driver relays the writer's
committed seq).

When the writer's worker is declared dead, the master promotes the other replica with a higher
epoch.  The new writer opens a producer with the same transactional id (which fences the old
one at the broker: a hung writer that wakes up cannot write), scans the partition from the last
committed offset it heard of for the highest seq of this output, and writes only what comes
after it.  The scan reads with ``read_committed``.  The takeover runs in a thread of its own:
meanwhile the replica goes on processing (and checkpointing) and keeps its output as a standby
does, so a slow scan delays this output only, not the partition.  A writer fenced while the
master still names it (a superseded takeover's producer initialised late) says so (``fenced_at``)
and is named again with a higher epoch.

What a reader sees, exactly:

* **Apache Kafka**: a ``read_committed`` consumer sees every record once (Kafka's own
  exactly-once contract is for such readers).  The dead writer's open transaction is aborted by
  the fencing; the scan skips its records and the new writer writes them again, so a
  ``read_uncommitted`` consumer may see the records of that aborted transaction twice.
* **The embedded broker** (DESIGN §10), which does not hide aborted records: the scan sees them
  and the new writer does not write them again, so every consumer sees every record once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from replication.config import ReplicationConfig
from transport.kafka_io import produce_blocking

log = logging.getLogger(__name__)

COMMIT_EVERY = 500  # records per transaction at most
# A transaction stays open at least this many times as long as the last commits took, so that a
# writer spends at most about a fifth of its time committing: with commits slow (a loaded broker or
# machine) it would fall behind its standby, which only keeps records, and be cut off as lagging.
COMMIT_SHARE = 4

Headers = list[tuple[str, bytes]]


# The writers' transaction timeout unless the Kafka client properties set one.  A takeover's scan
# waits this long plus STALL_MARGIN_S for the partition's last stable offset to move: on Apache
# Kafka no transaction of the job's writers stays open longer (the coordinator checks for timed-out
# transactions every 10 s).
TRANSACTION_TIMEOUT_MS = 30_000
STALL_MARGIN_S = 30.0
SCAN_STALL_S = TRANSACTION_TIMEOUT_MS / 1000 + STALL_MARGIN_S
# After this long without progress the scan looks at what holds the last stable offset: when it is
# only this output's own records (its fenced writer's), the stable offset is stuck (see below).
STUCK_CHECK_S = 3.0
# The embedded broker lists every batch of a partition on each fetch and answers with nothing when
# that takes longer than the fetch's wait (docs/embedded-broker.md): a short wait never reads a
# large output partition.  But a fetch at the end of a partition waits its whole wait, and the
# output waits for the scan: a scan reads with the short wait, and when that has not reached the
# end after QUICK_SCAN_S, a second reader with the long wait reads beside it; the first at the
# end ends both.
SCAN_FETCH_WAIT_MS = 500
QUICK_SCAN_FETCH_WAIT_MS = 10
QUICK_SCAN_S = 0.5
# A consume call returns when it has a thousand records or after this long, whichever is first.
SCAN_CONSUME_S = 0.02


@dataclass
class _Scan:
    best: int = -1  # highest rseq of the output read
    at_end: bool = False  # the end of the partition was reached
    position: int = 0  # the offset read up to
    foreign: bool = False  # records of another output were read


def max_written_seq(consumer_conf: dict, topic: str, partition: int, output_id: str, start_offset: int,
                    stall_s: float = SCAN_STALL_S, consumer: Callable[[dict], Any] | None = None,
                    stuck_check_s: float = STUCK_CHECK_S, read_to: list[int] | None = None) -> int:
    """Highest ``rseq`` of ``output_id`` in ``topic``/``partition`` from ``start_offset`` on (-1: none),
    as a ``read_committed`` reader sees it, once the caller fenced the output's previous writer.

    When the partition's last stable offset does not move while records lie beyond it, the scan
    reads on ``read_uncommitted`` up to the high watermark, with a warning: at once (after
    ``stuck_check_s``) if every record beyond it is this output's own, else after ``stall_s``
    without anything new.  On Apache Kafka neither happens: fencing the previous writer aborted
    its transaction, and every other transaction of the job's writers ends within ``stall_s``.
    The embedded broker, which hides no aborted record from any reader, can leave the last
    stable offset stuck for good behind a writer fenced while its produce was in flight
    (docs/replication.md).  ``read_to`` receives the offset the scan read up to."""
    best, position = _max_written_seq(consumer_conf, topic, partition, output_id, start_offset, stall_s,
                                      consumer or Consumer, stuck_check_s)
    if read_to is not None:
        read_to.append(position)
    return best


def _max_written_seq(consumer_conf: dict, topic: str, partition: int, output_id: str, start_offset: int,
                     stall_s: float, consumer: Callable[[dict], Any], stuck_check_s: float) -> tuple[int, int]:
    key = output_id.encode()
    # offset 0, not OFFSET_BEGINNING, which costs the embedded broker's clients half a second (a
    # partition whose log starts later answers out of range, and the reader resets to its start)
    start = max(start_offset, 0)
    stuck_check_s = min(stuck_check_s, stall_s)
    committed = _scan(consumer, consumer_conf, topic, partition, key, start, "read_committed", stuck_check_s)
    if committed.at_end:
        return committed.best, committed.position
    beyond = _scan(consumer, consumer_conf, topic, partition, key, committed.position, "read_uncommitted",
                   stall_s)
    if not (beyond.at_end and not beyond.foreign):  # another writer's transaction may still end
        rest = _scan(consumer, consumer_conf, topic, partition, key, committed.position, "read_committed",
                     max(stall_s - stuck_check_s, 0.0))
        committed.best = max(committed.best, rest.best)
        if rest.at_end:
            return committed.best, rest.position
        committed.position = rest.position
        beyond = _scan(consumer, consumer_conf, topic, partition, key, rest.position, "read_uncommitted", stall_s)
    if not beyond.at_end:
        raise TimeoutError(f"scanning {topic}[{partition}] for {output_id}: no end of partition within {stall_s:g}s "
                           "of no progress, read_committed or not")
    held_by = "another writer's transaction" if beyond.foreign else "this output's fenced writer only"
    best = max(committed.best, beyond.best)
    log.warning("scanning %s[%d] for %s: the last stable offset stays at %d (held by %s); read_uncommitted up "
                "to offset %d instead: output has seq <= %d", topic, partition, output_id, committed.position,
                held_by, beyond.position, best)
    return best, beyond.position


def _scan(consumer: Callable[[dict], Any], conf: dict, topic: str, partition: int, key: bytes, start: int,
          isolation: str, stall_s: float) -> _Scan:
    """What reading with ``isolation`` from ``start`` finds, until the end of the partition or
    until ``stall_s`` passed without a record.

    The end is where the reader's position reaches the high watermark of its last fetch (every
    record of the fenced writer is below the first one it sees).  An end-of-partition event is the
    end only there too: a ``read_committed`` reader gets it at the last stable offset, which an
    open transaction holds below the high watermark, and the records from there on (the fenced
    writer's, still open) are exactly those a takeover must not miss.  (Waiting for the event
    alone would cost a fetch at the end, which waits its whole ``fetch.wait.max.ms``.)"""
    quick, patient, ended = _Scan(position=start), _Scan(position=start), threading.Event()
    args = (consumer, conf, topic, partition, key, isolation)
    backup = threading.Timer(QUICK_SCAN_S, _read, args=(*args, SCAN_FETCH_WAIT_MS, stall_s, patient, ended))
    backup.daemon = True
    if stall_s > QUICK_SCAN_S:
        backup.start()
    try:
        _read(*args, QUICK_SCAN_FETCH_WAIT_MS, stall_s, quick, ended)
    except BaseException:
        ended.set()
        raise
    finally:
        backup.cancel()
    if quick.at_end:
        return quick  # (a patient reader still waiting for its fetch closes by itself)
    if backup.ident is not None:  # started: cancelled before it fired, or reading
        backup.join()
    return max(quick, patient, key=lambda found: (found.at_end, found.position))


def _read(consumer: Callable[[dict], Any], conf: dict, topic: str, partition: int, key: bytes, isolation: str,
          wait_ms: int, stall_s: float, found: _Scan, ended: threading.Event) -> None:
    """One reader of :func:`_scan`, fetching with ``wait_ms``, until the end (then it sets
    ``ended``), ``stall_s`` without a record, or ``ended`` set by the other reader."""
    reader = consumer({**conf, "enable.auto.commit": False, "enable.partition.eof": True,
                       "isolation.level": isolation, "fetch.wait.max.ms": wait_ms, "auto.offset.reset": "earliest"})
    tp = TopicPartition(topic, partition, found.position)
    try:
        reader.assign([tp])
        last_new = time.monotonic()
        while time.monotonic() - last_new < stall_s and not ended.is_set():
            for msg in reader.consume(num_messages=1000, timeout=SCAN_CONSUME_S):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    found.position = msg.offset()
                    if _at_high_watermark(reader, tp, found.position):
                        found.at_end = True
                        ended.set()
                        return
                    continue  # at the last stable offset only: read on until stall_s passed
                last_new, found.position = time.monotonic(), msg.offset() + 1
                headers = dict(msg.headers() or ())
                if headers.get("rsink") == key:
                    found.best = max(found.best, int(headers["rseq"]))
                else:
                    found.foreign = True
            if _reached_high_watermark(reader, tp, found):
                ended.set()
                return
    finally:
        reader.close()


def _reached_high_watermark(reader: Any, tp: TopicPartition, found: _Scan) -> bool:
    """Whether ``reader`` read everything below the high watermark its fetches reported (its
    position, not the last record's offset, which stops short of a transaction's marker); then
    ``found`` is at the end there."""
    high = reader.get_watermark_offsets(tp, cached=True)[1]
    if high < 0:
        return False  # no fetch answered yet
    position = reader.position([tp])[0].offset
    if position < high:
        return False
    found.at_end, found.position = True, position
    return True


def _at_high_watermark(reader: Any, tp: TopicPartition, offset: int) -> bool:
    """Whether an end-of-partition event at ``offset`` is at the high watermark the last fetch
    reported (an unknown one: taken as the end, as the event says).  The event's offset, not the
    reader's position: a reader that met only transaction markers since it started has none."""
    high = reader.get_watermark_offsets(tp, cached=True)[1]
    return high < 0 or offset >= high


@dataclass
class _Takeover:
    """A takeover as writer in progress (its own thread): fence the old writer, scan the output."""

    epoch: int
    from_offset: int
    done: threading.Event = field(default_factory=threading.Event)
    producer: Any = None
    written: int = -1
    error: BaseException | None = None
    started: float = field(default_factory=time.monotonic)
    fenced_s: float = 0.0  # how long fencing the old writer took (init_transactions)
    scanned_s: float = 0.0  # and then the scan
    read_to: list[int] = field(default_factory=list)  # the offset the scan read up to
    spare: Any = None  # the producer made ahead for it, if any


def _writes_no_more(error: KafkaError) -> bool:
    """A producer this writer cannot go on with: a fatal error (fenced), the local ``_FATAL`` that
    librdkafka raises for every produce once it learned of one elsewhere (a delivery report), or a
    transaction that can only be aborted (``txn_requires_abort``, or the local ``_STATE`` a produce
    raises while the transaction is in that state, e.g. after the broker timed it out).  The writer
    steps down rather than abort and write again itself: the embedded broker does not hide aborted
    records, so only a takeover's scan knows which of them readers already see."""
    return error.fatal() or error.txn_requires_abort() or error.code() in (KafkaError._FATAL, KafkaError._STATE)


class ExactlyOnceOutput:
    """One partition replica's side of one exactly-once output (the instance thread's object).

    ``append`` numbers and keeps a record (and writes it when this replica writes); ``control``
    applies the driver's role; ``on_idle`` commits what is due; ``finish`` waits until the output
    is confirmed.  ``on_role`` hears "writer"/"standby"; ``on_written`` the wall-clock time a
    record was produced and its ingest time (latency); ``on_committed`` the committed seq and
    offset as they advance.  ``ready_producer``: while a standby, keep the producer a takeover
    would open made and connected, so that the takeover fences at once (a producer asked before
    its first connection is up waits for librdkafka's coordinator timer, about half a second:
    ``bench/fetch_wait.py``): for the outputs a reader waits for."""

    def __init__(self, name: str, cfg: ReplicationConfig, replica: int, output_id: str, topic: str,
                 kafka_partition: int, linger_s: float, on_role: Callable[[str], None] | None = None,
                 on_written: Callable[[float, float], None] | None = None,
                 on_committed: Callable[[int, int], None] | None = None, ready_producer: bool = False) -> None:
        self.name, self.cfg, self.replica = name, cfg, replica
        self.output_id, self.topic, self.kafka_partition = output_id, topic, kafka_partition
        self.seq = -1  # last output seq assigned
        self.buffer: deque[tuple] = deque()  # (seq, value, key, headers, timestamp) not yet known committed
        self.writer = False
        self.epoch = -1
        self.producer: Producer | None = None
        self.txn_records = 0
        self.txn_started = 0.0
        self.txn_last_seq = -1
        self.commit_s = 0.0  # how long commits take, lately
        self.committed_seq = -1
        self.committed_offset = -1
        self.held_at_takeover = -1  # the highest seq the output held when this replica took over
        self._offset_seen = -1
        self._linger_s = linger_s
        self._on_role = on_role or (lambda role: None)
        self._on_written = on_written
        self._on_committed = on_committed or (lambda seq, offset: None)
        self._takeover: _Takeover | None = None
        self._ready_producer = ready_producer
        self._spare: Producer | None = None  # made ahead for a takeover (not initialised: fences nobody)
        # the epoch this replica wrote at when a producer of the same output fenced it (-1: not
        # fenced since its last assignment); the driver names a writer again when that is still its
        # current one (a superseded takeover that fenced late, a local fatal producer error)
        self.fenced_at = -1

    # -- records ------------------------------------------------------------------------
    def append(self, value: bytes, key: bytes | None, headers: Headers, ingest_ts: float | None = None,
               timestamp: int | None = None) -> None:
        if self._takeover is not None:
            self._poll_takeover()  # before this record is kept: a finished takeover writes what is kept
        self.seq += 1
        if self.seq <= self.committed_seq:
            return  # regenerated after a restore from a checkpoint: the output has it already
        entry = (self.seq, value, key, [("rsink", self.output_id.encode()), ("rseq", str(self.seq).encode()),
                                        *headers], timestamp)
        self.buffer.append(entry)
        if self.writer:
            self._write(entry, ingest_ts)
            if self.writer:
                self._maybe_commit()

    def on_idle(self) -> None:
        if self._takeover is not None:
            self._poll_takeover()
        if self.writer:
            self._maybe_commit()

    def due_in(self) -> float | None:
        """Seconds until :meth:`on_idle` has something to do (a takeover to follow, a transaction
        to commit), None if nothing: lets an idle instance sleep instead of polling."""
        if self._takeover is not None:
            return self._linger_s
        if self.writer and self.txn_records:
            return max(0.0, self.txn_started + max(self._linger_s, COMMIT_SHARE * self.commit_s) - time.monotonic())
        return None

    def _write(self, entry: tuple, ingest_ts: float | None = None) -> None:
        assert self.producer is not None
        seq, value, key, headers, *rest = entry  # (checkpoints of earlier versions: no timestamp)
        timestamp = rest[0] if rest else None
        now = time.time()
        try:
            if self.txn_records == 0:
                self.producer.begin_transaction()
                self.txn_started = time.monotonic()
            produce_blocking(self.producer, self.topic, partition=self.kafka_partition, value=value, key=key,
                             headers=[*headers, ("sink_ts", repr(now).encode()), ("rwriter", self._writer_tag)],
                             on_delivery=self._delivered, **({} if timestamp is None else {"timestamp": timestamp}))
        except KafkaException as err:  # fenced meanwhile, or its transaction was aborted
            if not _writes_no_more(err.args[0]):
                raise
            self._fenced(err)
            return
        self.txn_records += 1
        self.txn_last_seq = seq
        if ingest_ts is not None and self._on_written is not None:
            self._on_written(now, ingest_ts)

    @property
    def _writer_tag(self) -> bytes:
        """Which replica wrote a record, at which epoch (header ``rwriter``): tells one writer's
        records from another's when an output is read back."""
        return f"r{self.replica}e{self.epoch}".encode()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self._offset_seen = max(self._offset_seen, msg.offset())

    def _maybe_commit(self, force: bool = False) -> None:
        if self.txn_records == 0:
            return
        if not force and self.txn_records < COMMIT_EVERY and \
                time.monotonic() - self.txn_started < max(self._linger_s, COMMIT_SHARE * self.commit_s):
            return
        assert self.producer is not None
        started = time.monotonic()
        try:
            self.producer.commit_transaction(30)
        except KafkaException as err:
            self._fenced(err)
            return
        self.commit_s += (time.monotonic() - started - self.commit_s) / 4  # a moving average
        self.txn_records = 0
        self._committed(self.txn_last_seq, self._offset_seen)

    def _committed(self, seq: int, offset: int) -> None:
        self.committed_seq = max(self.committed_seq, seq)
        self.committed_offset = max(self.committed_offset, offset)
        while self.buffer and self.buffer[0][0] <= self.committed_seq:
            self.buffer.popleft()
        self._on_committed(self.committed_seq, self.committed_offset)

    def _fenced(self, err: KafkaException) -> None:
        log.warning("%s: lost its producer as writer at epoch %d (%s): writes again only when named anew",
                    self.name, self.epoch, err.args[0])
        self.fenced_at = self.epoch
        self.writer = False
        self.txn_records = 0
        self.producer = None
        self._on_role("standby")

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint_state(self) -> tuple[int, list[tuple]]:
        """What a checkpoint keeps of this output: the last seq assigned and the records not known
        committed yet.  A partition restored from it when no replica of it is left (a rollback, a
        resume) writes them again unless the output has them; without them, the records the
        checkpoint counted but no commit reached would be lost."""
        return self.seq, list(self.buffer)

    def restore_state(self, state: int | tuple[int, list[tuple]]) -> None:
        """Take back :meth:`checkpoint_state` (an older checkpoint kept the seq alone)."""
        if isinstance(state, int):
            self.seq = state
            return
        self.seq, entries = state
        self.buffer = deque(tuple(e) for e in entries if e[0] > self.committed_seq)

    # -- roles (the instance thread, with the master's view) -------------------------------
    def control(self, writer_replica: int, epoch: int, committed_seq: int, committed_offset: int) -> None:
        if epoch < self.epoch:
            return
        self._committed(committed_seq, committed_offset)
        if epoch > self.epoch:
            self.fenced_at = -1  # a new assignment: what fenced this replica before is settled
        # only a strictly newer assignment makes a writer: a fenced writer never reopens at its own epoch
        if writer_replica == self.replica and epoch > self.epoch:
            self.epoch = epoch
            self._become_writer(epoch)
        elif writer_replica != self.replica and self.writer:
            self.writer = False  # demoted: the new writer's producer fences ours
            self.producer = None
            self.txn_records = 0
        self.epoch = epoch
        if self._takeover is not None:
            self._poll_takeover()  # a takeover for an older epoch is dropped
        if self._ready_producer and not self.writer and self._takeover is None and self._spare is None:
            self._spare = Producer(self._producer_conf())

    @property
    def regenerated(self) -> bool:
        """This replica writes, and has produced every seq the output held when it took over: what
        it produces from now on is new (a resumed run's output past what the run before wrote)."""
        return self.writer and self.seq >= self.held_at_takeover

    @property
    def taking_over(self) -> bool:
        """A takeover as writer is in progress (fencing the old writer, scanning the output)."""
        return self._takeover is not None

    def _producer_conf(self) -> dict[str, Any]:
        conf = self.cfg.kafka_producer_config()
        conf.update({"transactional.id": f"replication.{self.output_id}", "enable.idempotence": True,
                     "acks": "all"})
        conf.setdefault("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
        return conf

    @staticmethod
    def _producer(conf: dict[str, Any], spare: Producer | None = None) -> Producer:
        producer = spare or Producer(conf)
        producer.init_transactions(30)  # fences any older producer of this output
        return producer

    def _become_writer(self, epoch: int) -> None:
        """Named writer at ``epoch``: open the producer now (fencing any older one, while a hung
        old writer is still frozen: on the embedded broker a batch of it in flight during the
        fencing can land after it, DESIGN §10), and, taking over, scan what it wrote."""
        spare, self._spare = self._spare, None
        if epoch == 0:  # the first writer: nothing written before it
            self._start_writing(self._producer(self._producer_conf(), spare))
            return
        # taking over: what did the previous writer get into the log?  Found in a thread of its own
        # (the scan can take long), while this replica goes on and keeps its records meanwhile
        self._takeover = takeover = _Takeover(epoch, self.committed_offset, spare=spare)
        threading.Thread(target=self._take_over, args=(takeover,), name=f"takeover-{self.name}",
                         daemon=True).start()

    def _take_over(self, takeover: _Takeover) -> None:
        try:
            conf = self._producer_conf()
            producer = self._producer(conf, takeover.spare)
            takeover.fenced_s = time.monotonic() - takeover.started
            takeover.written = max_written_seq(
                self.cfg.kafka_consumer_config(group_id=f"scan-{self.output_id}"), self.topic,
                self.kafka_partition, self.output_id, takeover.from_offset,
                stall_s=int(conf["transaction.timeout.ms"]) / 1000 + STALL_MARGIN_S, read_to=takeover.read_to)
            takeover.scanned_s = time.monotonic() - takeover.started - takeover.fenced_s
            takeover.producer = producer
        except BaseException as exc:  # noqa: BLE001 - raised on the instance thread
            takeover.error = exc
        finally:
            takeover.done.set()

    def _poll_takeover(self) -> None:
        """Finish a takeover whose scan is done (the instance thread)."""
        takeover = self._takeover
        if takeover is None or not takeover.done.is_set():
            return
        self._takeover = None
        if takeover.epoch != self.epoch:
            return  # superseded meanwhile: a newer writer fences this producer
        if takeover.error is not None:
            raise RuntimeError(f"{self.name}: taking over as writer (epoch {takeover.epoch}) failed: "
                               f"{takeover.error}") from takeover.error
        log.warning("%s: took over as writer (epoch %d): output has seq <= %d (offsets %d to %s read), %d records "
                    "buffered; fenced in %.3fs, scanned in %.3fs, writing %.3fs after the role came", self.name,
                    takeover.epoch, takeover.written, takeover.from_offset,
                    takeover.read_to[0] if takeover.read_to else "?", len(self.buffer), takeover.fenced_s,
                    takeover.scanned_s, time.monotonic() - takeover.started)
        self._committed(takeover.written, self.committed_offset)
        self.held_at_takeover = self.committed_seq
        self._start_writing(takeover.producer)

    def _start_writing(self, producer: Producer) -> None:
        self.producer = producer
        self.writer = True
        self._on_role("writer")
        for entry in list(self.buffer):
            if not self.writer:
                return  # fenced already
            self._write(entry)
            if self.writer:
                self._maybe_commit()  # a long backlog in transactions of the usual size, not one
        if self.writer:
            self._maybe_commit(force=True)

    def finish(self, poll_control: Callable[[], None]) -> None:
        """At the end: commit (the writer), or wait until the writer confirmed everything."""
        deadline = time.monotonic() + self.cfg.stop_timeout_ms / 1000 * 3
        while True:
            self._poll_takeover()
            if self.writer:
                self._maybe_commit(force=True)
                if self.writer and self.producer is not None:
                    self.producer.flush(30)
                    return
            elif self.committed_seq >= self.seq:
                return  # the writer has everything this replica produced
            if time.monotonic() > deadline and self._takeover is None:  # a takeover's scan has its own bound
                raise RuntimeError(f"{self.name}: output up to seq {self.seq} not confirmed by a writer "
                                   f"(committed {self.committed_seq})")
            poll_control()
            time.sleep(0.02)


class WritesExactlyOnce:
    """What a partition's exactly-once output (a sink, its dead letters) shows its instance and the
    driver, delegated to its :class:`ExactlyOnceOutput` ``out``."""

    out: ExactlyOnceOutput

    def on_idle(self) -> None:
        self.out.on_idle()

    def due_in(self) -> float | None:
        return self.out.due_in()

    def control(self, writer_replica: int, epoch: int, committed_seq: int, committed_offset: int) -> None:
        self.out.control(writer_replica, epoch, committed_seq, committed_offset)

    @property
    def committed(self) -> tuple[int, int]:
        """(seq, offset) this output is known to have committed, for the driver."""
        return self.out.committed_seq, self.out.committed_offset

    @property
    def fenced_at(self) -> int:
        """The epoch this replica wrote at when it was fenced, or -1 (see ExactlyOnceOutput)."""
        return self.out.fenced_at

    @property
    def regenerated(self) -> bool:
        """See :attr:`ExactlyOnceOutput.regenerated`."""
        return self.out.regenerated
