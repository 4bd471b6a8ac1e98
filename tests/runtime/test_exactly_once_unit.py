"""The exactly-once output's roles without a broker: a writer whose producer the broker fenced
steps down instead of failing its replica."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from replication.config import ReplicationConfig
from replication.runtime import exactly_once
from replication.runtime.exactly_once import ExactlyOnceOutput, max_written_seq


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


@pytest.mark.parametrize("error", [KafkaError(KafkaError._FATAL), KafkaError(KafkaError._FENCED, fatal=True),
                                   KafkaError(KafkaError._STATE),
                                   KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True)],
                         ids=["local-fatal", "fenced", "transaction-abortable-on-produce", "abortable"])
def test_a_writer_whose_producer_was_fenced_steps_down_and_keeps_its_records(error):
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    roles: list[str] = []
    out = ExactlyOnceOutput("src[0]r0 dead letters", cfg, 0, "run:0:0:dlq", "dlq", 0, 0.1, on_role=roles.append)
    out.writer, out.epoch, out.producer = True, 0, FencedProducer(error)
    out.append(b"payload", None, [])
    assert not out.writer and out.producer is None and roles == ["standby"]
    assert [seq for seq, *_ in out.buffer] == [0]  # kept until a writer confirms it
    assert out.fenced_at == 0  # reported to the driver, which names it again if it is still the writer
    out.control(1, 1, -1, -1)  # named anew (here: the twin)
    assert out.fenced_at == -1 and not out.writer


class CountingProducer:
    """A transactional producer that works, counting its transactions."""

    def __init__(self) -> None:
        self.begun = self.committed = self.open = 0
        self.largest = 0

    def begin_transaction(self) -> None:
        self.begun += 1

    def produce(self, *args, **kwargs) -> None:
        self.open += 1
        self.largest = max(self.largest, self.open)

    def poll(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        self.committed += 1
        self.open = 0


def test_a_new_writer_writes_a_long_backlog_in_transactions_of_the_usual_size():
    from replication.runtime.exactly_once import COMMIT_EVERY
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r1", cfg, 1, "run:1:0", "out", 0, 60.0)
    for _ in range(2 * COMMIT_EVERY + 7):  # kept as a standby does
        out.append(b"payload", None, [])
    producer = CountingProducer()
    out._start_writing(producer)
    assert out.writer and producer.largest == COMMIT_EVERY  # not one transaction outlasting its timeout
    assert producer.committed == producer.begun == 3 and out.committed_seq == 2 * COMMIT_EVERY + 6
    assert not out.buffer


def test_any_other_produce_error_is_raised():
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.1)
    out.writer, out.epoch, out.producer = True, 0, FencedProducer(KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaException):
        out.append(b"payload", None, [])


class _Msg:
    def __init__(self, offset: int, seq: int | None = None, eof: bool = False) -> None:
        self._offset, self._seq, self._eof = offset, seq, eof

    def error(self):
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def offset(self) -> int:
        return self._offset

    def headers(self):
        return [("rsink", b"out-1"), ("rseq", str(self._seq).encode())]


def _partition(stable: int, high: int):
    """A scan's consumers on a partition whose records 0..high-1 carry seqs 0..high-1 and whose
    last stable offset is ``stable``: read_committed readers get records up to it and, as
    librdkafka gives them, the end-of-partition event there (not at the high watermark, which
    their fetches report all the same)."""
    made = []

    class Reader:
        def __init__(self, conf: dict) -> None:
            self.committed = conf["isolation.level"] == "read_committed"
            self.at = 0
            made.append(conf["isolation.level"])

        def assign(self, parts) -> None:
            self.at = max(parts[0].offset, 0)
            self.fetched = False

        def consume(self, num_messages: int, timeout: float):
            self.fetched = True
            end = stable if self.committed else high
            if self.at < end:
                out = [_Msg(o, o) for o in range(self.at, end)]
                self.at = end
                return out
            return [_Msg(end, eof=True)]

        def get_watermark_offsets(self, tp, cached: bool = False) -> tuple[int, int]:
            return (0, high) if self.fetched else (-1001, -1001)

        def position(self, parts):
            return [TopicPartition(parts[0].topic, parts[0].partition, self.at)]

        def close(self) -> None:
            pass

    return Reader, made


def test_a_takeover_scan_reads_up_to_the_end_of_the_partition_as_read_committed():
    reader, made = _partition(stable=10, high=10)
    read_to: list[int] = []
    assert max_written_seq({}, "out", 0, "out-1", 3, stall_s=0.3, consumer=reader, read_to=read_to) == 9
    assert made == ["read_committed"] and read_to == [10]  # (the takeover logs how far it read)


def test_a_takeover_scan_fetches_with_a_short_wait_first_and_a_long_one_if_that_reads_nothing():
    """A fetch at the end of a partition answers when its wait ends, and the new writer's output
    waits for the scan: the scan's first reader fetches with a short wait.  On the embedded
    broker a fetch whose listing of a long partition outlasts its wait answers with nothing: when
    the short-wait reader has not reached the end after half a second, a reader whose wait is
    long enough reads beside it, and the first at the end ends the scan."""
    reader, made = _partition(stable=10, high=10)
    waits: list[int] = []

    class Recording(reader):
        def __init__(self, conf: dict) -> None:
            super().__init__(conf)
            waits.append(conf["fetch.wait.max.ms"])
            self.wait_ms = conf["fetch.wait.max.ms"]

    class ListingOutlastsShortWaits(Recording):
        def consume(self, num_messages: int, timeout: float):
            return [] if self.wait_ms < 100 else super().consume(num_messages, timeout)

    assert max_written_seq({}, "out", 0, "out-1", 3, stall_s=5, consumer=ListingOutlastsShortWaits) == 9
    assert waits == [exactly_once.QUICK_SCAN_FETCH_WAIT_MS, exactly_once.SCAN_FETCH_WAIT_MS]
    waits.clear()
    assert max_written_seq({}, "out", 0, "out-1", 3, stall_s=5, consumer=Recording) == 9
    assert waits == [exactly_once.QUICK_SCAN_FETCH_WAIT_MS]  # the partition listed within the short wait


def test_a_takeover_scan_of_an_output_never_written_reads_from_offset_0_not_a_logical_offset():
    """A logical start (OFFSET_BEGINNING) costs the embedded broker's clients half a second of
    offset lookup before the first fetch; offset 0 with an earliest reset reads the same."""
    reader, _ = _partition(stable=3, high=3)
    seen: list[tuple[int, str]] = []

    class Recording(reader):
        def __init__(self, conf: dict) -> None:
            super().__init__(conf)
            self.reset = conf["auto.offset.reset"]

        def assign(self, parts) -> None:
            seen.append((parts[0].offset, self.reset))
            super().assign(parts)

    assert max_written_seq({}, "out", 0, "out-1", -1, stall_s=5, consumer=Recording) == 2
    assert seen == [(0, "earliest")]


def test_a_takeover_scan_ends_at_the_high_watermark_without_an_end_of_partition_fetch():
    """A fetch at the end of a partition answers only when its wait ends (half a second): the
    scan stops once its position, past the last transaction's marker, reaches the high watermark
    its fetches reported, and never asks for that empty fetch."""
    reader, made = _partition(stable=10, high=10)

    class MarkerLast(reader):
        def consume(self, num_messages: int, timeout: float):
            if self.at >= high_watermark:
                raise AssertionError("fetched at the end of the partition")
            out = [msg for msg in super().consume(num_messages, timeout) if msg._offset < 9]  # 9: a marker
            return out

    high_watermark = 10
    assert max_written_seq({}, "out", 0, "out-1", 3, stall_s=0.3, consumer=MarkerLast) == 8
    assert made == ["read_committed"]


def test_a_takeover_scan_whose_last_stable_offset_is_stuck_reads_what_the_log_holds(caplog):
    """The embedded broker can leave a partition's last stable offset stuck for good (a fenced
    writer's batch filed after the abort): the scan would wait for ever and the new writer would
    rewrite records every reader sees.  After the stall it reads up to the high watermark."""
    reader, made = _partition(stable=4, high=10)
    assert max_written_seq({}, "out", 0, "out-1", -1, stall_s=0.3, consumer=reader) == 9
    assert made == ["read_committed", "read_uncommitted"]
    assert "the last stable offset stays at 4" in caplog.text


def test_a_takeover_scan_that_reaches_no_end_either_way_fails():
    reader, _ = _partition(stable=4, high=10)

    class Never(reader):
        def consume(self, num_messages: int, timeout: float):
            return []

    with pytest.raises(TimeoutError, match="no end of partition"):
        max_written_seq({}, "out", 0, "out-1", -1, stall_s=0.2, consumer=Never)


class SlowCommitProducer:
    """A transactional producer whose commits take ``commit_s`` (a loaded broker)."""

    def __init__(self, commit_s: float) -> None:
        self.commit_s, self.commits, self.produced = commit_s, 0, 0

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args, **kwargs) -> None:
        self.produced += 1

    def poll(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        time.sleep(self.commit_s)
        self.commits += 1


def test_a_writer_whose_commits_are_slow_commits_less_often_and_keeps_up():
    """Commits of 20 ms with a 1 ms linger: committing after every record would leave no time for
    anything else.  The writer keeps each transaction open four times as long as its commits take,
    so that committing takes about a fifth of its time."""
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.001)
    producer = SlowCommitProducer(0.02)
    out.writer, out.epoch, out.producer = True, 0, producer
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        out.append(b"v", None, [])
        time.sleep(0.001)
    spent = producer.commits * producer.commit_s
    assert producer.produced > 300 and spent < 0.35, (producer.commits, producer.produced)
    out.on_idle()
    out._maybe_commit(force=True)
    assert out.committed_seq == out.seq  # everything committed in the end


def _partition_of(stable: int, high: int, foreign: set[int]):
    """As :func:`_partition`, with the records at offsets ``foreign`` written by another output."""
    reader, made = _partition(stable, high)

    class Mixed(reader):
        def consume(self, num_messages: int, timeout: float):
            out = super().consume(num_messages, timeout)
            for msg in out:
                if msg._offset in foreign:
                    msg.headers = lambda: [("rsink", b"other"), ("rseq", b"0")]
            return out

    return Mixed, made


def test_a_last_stable_offset_held_only_by_the_outputs_own_fenced_writer_is_passed_at_once(caplog):
    """Fencing the old writer ended its transaction: if nothing but its records lies beyond the
    last stable offset, that offset is stuck (the embedded broker), and waiting the transaction
    timeout out would only stall the new writer."""
    reader, made = _partition_of(stable=4, high=10, foreign=set())
    started = time.monotonic()
    assert max_written_seq({}, "out", 0, "out-1", -1, stall_s=30, consumer=reader, stuck_check_s=0.2) == 9
    assert time.monotonic() - started < 5
    assert made == ["read_committed", "read_uncommitted"]
    assert "fenced writer only" in caplog.text


def test_a_last_stable_offset_held_by_another_writer_is_waited_for():
    """Records of another output beyond the stable offset: that writer's transaction may still
    commit, so the scan waits ``stall_s`` for it before it reads what the log holds."""
    reader, made = _partition_of(stable=4, high=10, foreign={6})
    started = time.monotonic()
    assert max_written_seq({}, "out", 0, "out-1", -1, stall_s=0.6, consumer=reader, stuck_check_s=0.1) == 9
    assert time.monotonic() - started >= 0.5
    assert made == ["read_committed", "read_uncommitted", "read_committed", "read_uncommitted"]


class TransactionalProducer:
    """A transactional producer that records what it writes."""

    def __init__(self, conf: dict) -> None:
        self.values: list[bytes] = []
        self.commits = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic, value=None, **kwargs) -> None:
        self.values.append(value)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1


def test_a_replica_taking_over_goes_on_while_its_scan_runs(monkeypatch):
    """The takeover's scan can take long (a stuck last stable offset: up to the transaction timeout
    and more).  Meanwhile the replica must go on (its checkpoints, its downstreams and the safe cut
    of the whole job wait for it otherwise): it keeps its records as a standby does and writes
    those the scan did not find once the scan is done."""
    from replication.runtime import exactly_once

    scanning, release = threading.Event(), threading.Event()
    producers: list[TransactionalProducer] = []

    def scan(*args, **kwargs) -> int:
        scanning.set()
        release.wait(30)
        return 1  # the lost writer got seqs 0 and 1 into the output

    def producer(conf: dict) -> TransactionalProducer:
        producers.append(TransactionalProducer(conf))
        return producers[-1]

    monkeypatch.setattr(exactly_once, "max_written_seq", scan)
    monkeypatch.setattr(exactly_once, "Producer", producer)
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    roles: list[str] = []
    out = ExactlyOnceOutput("sink[0]r1", cfg, 1, "run:1:0", "out", 0, 0.001, on_role=roles.append)
    out.control(0, 0, -1, -1)
    for i in range(3):
        out.append(b"%d" % i, None, [])
    done = threading.Event()

    def promoted() -> None:
        out.control(1, 1, -1, -1)  # the writer died: this replica takes over (epoch 1)
        for i in range(3, 6):
            out.append(b"%d" % i, None, [])
        done.set()

    threading.Thread(target=promoted, daemon=True).start()
    assert scanning.wait(5) and done.wait(5), "the replica waited for its takeover's scan"
    assert out.taking_over and not out.writer and roles == []
    release.set()
    assert out._takeover.done.wait(5)  # the scan is done; the instance thread learns it with its next record
    out.append(b"6", None, [])
    assert out.writer and not out.taking_over and roles == ["writer"]
    out._maybe_commit(force=True)
    # what the lost writer had not written, each once
    assert producers[-1].values == [b"2", b"3", b"4", b"5", b"6"]
    assert out.committed_seq == 6 and not out.buffer


def test_a_writer_that_took_over_says_once_it_produced_past_what_the_output_held(monkeypatch):
    """What a resumed run waits for before it opens a KaZoo window: its outputs' writers have
    produced every seq the run before wrote (the scan found), so what follows is new."""
    from replication.runtime import exactly_once

    monkeypatch.setattr(exactly_once, "max_written_seq", lambda *a, **k: 3)  # the run before wrote seqs <= 3
    monkeypatch.setattr(exactly_once, "Producer", TransactionalProducer)
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    standby = ExactlyOnceOutput("sink[0]r1", cfg, 1, "run:1:0", "out", 0, 0.001)
    out = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.001)
    for output in (out, standby):
        output.restore_state(0)  # from the cut: seq 0 assigned, and committed
        output.control(0, 1, 0, 10)  # a resumed run: replica 0 takes over
    assert out._takeover is None or out._takeover.done.wait(5)  # (the scan may be done already)
    regenerated = []
    for i in range(1, 6):
        for output in (out, standby):
            output.append(b"%d" % i, None, [])
        regenerated.append(out.regenerated)
    assert regenerated == [False, False, True, True, True]  # seq 3 is the last the run before wrote
    assert not standby.regenerated  # (its writer says so)
    out._maybe_commit(force=True)
    assert out.producer.values == [b"4", b"5"]
    first = ExactlyOnceOutput("sink[1]r0", cfg, 0, "run:1:1", "out", 1, 0.001)
    first.control(0, 0, -1, -1)  # the first writer of a run not resumed: nothing was written before it
    assert first.regenerated


def test_a_takeover_superseded_before_its_scan_ended_does_not_write(monkeypatch):
    from replication.runtime import exactly_once

    release = threading.Event()
    monkeypatch.setattr(exactly_once, "max_written_seq", lambda *a, **k: release.wait(30) and -1)
    monkeypatch.setattr(exactly_once, "Producer", TransactionalProducer)
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r1", cfg, 1, "run:1:0", "out", 0, 0.001)
    out.control(1, 1, -1, -1)
    out.append(b"0", None, [])
    out.control(0, 2, -1, -1)  # the other replica (restored) writes now
    release.set()
    time.sleep(0.1)
    out.on_idle()
    assert not out.writer and not out.taking_over and out.producer is None
    assert [seq for seq, *_ in out.buffer] == [0]


def test_a_failed_takeover_fails_its_replica(monkeypatch):
    from replication.runtime import exactly_once

    def scan(*args, **kwargs) -> int:
        raise TimeoutError("no end of partition")

    monkeypatch.setattr(exactly_once, "max_written_seq", scan)
    monkeypatch.setattr(exactly_once, "Producer", TransactionalProducer)
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r1", cfg, 1, "run:1:0", "out", 0, 0.001)
    out.append(b"0", None, [])  # held, not yet confirmed by the writer that died
    with pytest.raises(RuntimeError, match="taking over as writer .epoch 1. failed: no end of partition"):
        out.control(1, 1, -1, -1)
        for _ in range(500):
            out.on_idle()
            time.sleep(0.01)


class OpenProducer:
    """A transactional producer that takes everything (no broker)."""

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args, **kwargs) -> None:
        pass

    def poll(self, timeout: float = 0) -> int:
        return 0


def test_an_idle_output_asks_to_be_woken_only_when_a_commit_is_due():
    """An instance with nothing to commit sleeps until input comes (no polling every buffer
    timeout); with an open transaction, until its commit is due."""
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    out = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.05)
    assert out.due_in() is None  # a standby: nothing to do until it is named writer
    out.writer, out.epoch, out.producer = True, 0, OpenProducer()
    assert out.due_in() is None  # a writer with no open transaction
    out.append(b"payload", None, [])
    assert 0.0 < out.due_in() <= 0.05
    time.sleep(0.06)
    assert out.due_in() == 0.0


def test_a_partition_restored_with_no_replica_left_writes_what_its_checkpoint_counted_but_no_commit_reached(
        monkeypatch):
    """A checkpoint taken while records wait for their commit, then every replica lost (a rollback,
    or a resume after the whole job died): the restored partition regenerates only what comes after
    the checkpoint, so the records the checkpoint counted come from the checkpoint itself."""
    from replication.runtime import exactly_once

    monkeypatch.setattr(exactly_once, "Producer", TransactionalProducer)
    monkeypatch.setattr(exactly_once, "max_written_seq", lambda *a, **k: 1)  # the output holds seqs 0 and 1
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    lost = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 60.0)
    lost.control(0, 0, -1, -1)
    for value in (b"0", b"1", b"2", b"3"):
        lost.append(value, None, [])
    lost._committed(1, 7)  # 0 and 1 committed; 2 and 3 in the open transaction
    state = lost.checkpoint_state()
    restored = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.001)
    restored.restore_state(state)
    restored.control(0, 1, -1, -1)  # named writer: takes over, scans (seq 1 found), writes the rest
    deadline = time.monotonic() + 5
    while not restored.writer and time.monotonic() < deadline:
        restored.on_idle()  # the instance thread learns the scan ended
        time.sleep(0.01)
    restored.append(b"4", None, [])  # the first record after the checkpoint
    restored._maybe_commit(force=True)
    assert restored.producer.values == [b"2", b"3", b"4"]
    old_format = ExactlyOnceOutput("sink[0]r0", cfg, 0, "run:1:0", "out", 0, 0.001)
    old_format.restore_state(3)  # a checkpoint of an earlier version: the seq alone
    assert old_format.seq == 3 and not old_format.buffer


def test_a_standby_sink_takes_over_with_the_producer_it_made_ahead(monkeypatch):
    """A producer asked to fence before its first connection is up waits half a second for
    librdkafka's coordinator timer, and the output waits with it: a standby of an output made
    with ``ready_producer`` keeps one made (not initialised: it fences nobody) and a takeover
    initialises that one; a standby without keeps none."""
    from replication.runtime import exactly_once

    made: list[TransactionalProducer] = []
    inits: list[TransactionalProducer] = []

    class Counted(TransactionalProducer):
        def __init__(self, conf: dict) -> None:
            super().__init__(conf)
            made.append(self)

        def init_transactions(self, timeout: float) -> None:
            inits.append(self)

    monkeypatch.setattr(exactly_once, "max_written_seq", lambda *a, **k: -1)
    monkeypatch.setattr(exactly_once, "Producer", Counted)
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1"})
    plain = ExactlyOnceOutput("sink[0]r1 dead letters", cfg, 1, "run:1:0:dlq", "dlq", 0, 0.001)
    plain.control(0, 0, -1, -1)
    assert made == []
    out = ExactlyOnceOutput("sink[0]r1", cfg, 1, "run:1:0", "out", 0, 0.001, ready_producer=True)
    out.control(0, 0, -1, -1)  # the other replica writes: this one stands by with a producer made
    assert len(made) == 1 and inits == []
    out.append(b"0", None, [])
    out.control(1, 1, -1, -1)  # its writer died: this replica takes over
    deadline = time.monotonic() + 5
    while not out.writer and time.monotonic() < deadline:
        out.on_idle()  # (follows the takeover's thread)
        time.sleep(0.01)
    assert out.writer and out.producer is made[0] and inits == [made[0]] and len(made) == 1
    out.control(0, 2, 0, 0)  # demoted again (the other replica restored and named): a new one made
    assert not out.writer and len(made) == 2 and inits == [made[0]]
