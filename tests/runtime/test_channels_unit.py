"""Channel framing, seq stamping, dedup and bounded queues (no Spark, no Kafka)."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from merge import ArrivalOrderer, InputQueues, QueuesClosed
from replication.plan import ChannelSpec
from replication.runtime.channels import OutputChannel
from replication.runtime.dedup import Dedup
from replication.runtime.elements import END_ELEMENT, record, watermark
from transport import batch_format


def test_batch_round_trip_keeps_header_and_elements():
    els = [record({"a": 1}, key="k", ts=5, ingest_ts=1.5, origin=("t", 0, 9)), watermark(4), END_ELEMENT]
    data = batch_format.encode_batch(3, 1, 2**40, 2**63, els)
    h = batch_format.decode_header(data)
    assert (h.task, h.partition, h.channel, h.first_seq, h.count, h.last_seq) == (3, 1, 2**40, 2**63, 3, 2**63 + 2)
    assert batch_format.decode_elements(data, h) == els


def test_framing_rejects_garbage_and_seq_overflow():
    with pytest.raises(batch_format.FramingError):
        batch_format.decode_header(b"xx")
    with pytest.raises(batch_format.FramingError):
        batch_format.decode_header(b"XX" + bytes(batch_format.HEADER_SIZE))
    with pytest.raises(ValueError):
        batch_format.encode_batch(0, 0, 0, batch_format.MAX_SEQ, [1, 2])
    with pytest.raises(ValueError):
        batch_format.encode_batch(0, 0, 0, 0, [])


def test_dedup_delivers_in_order_drops_duplicates_reports_gaps():
    d = Dedup()
    a = d.admit(7, 0, 10)
    assert (a.start, a.stop, a.dropped, a.gap) == (0, 10, 0, 0)
    assert d.admit(7, 0, 10).delivers is False  # full duplicate
    a = d.admit(7, 5, 10)  # overlaps: 5..9 dup, 10..14 new
    assert (a.start, a.stop, a.dropped) == (5, 10, 5)
    assert d.position(7) == 14
    g = d.admit(7, 20, 3)  # 15..19 missing
    assert g.gap == 5 and not g.delivers and d.gaps == 1 and d.position(7) == 14
    assert d.admit(8, 0, 1).delivers  # channels are independent
    assert d.dropped == 15


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=60))
def test_dedup_never_delivers_a_seq_twice_or_out_of_order(batches):
    """Whatever batches arrive (duplicates, overlaps, gaps), the delivered seqs are 0,1,2,... once."""
    d = Dedup()
    delivered = []
    for first, count in batches:
        a = d.admit(0, first, count)
        delivered += [first + i for i in range(a.start, a.stop)]
    assert delivered == list(range(len(delivered)))


def _put_in_thread(q: InputQueues, channel: int, batch: list) -> tuple[threading.Thread, threading.Event]:
    """Put from another thread; the event is set once the put returned."""
    done = threading.Event()

    def producer():
        q.put(channel, batch)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    return t, done


def test_queues_block_when_full_and_serve_in_arrival_order():
    q = InputQueues([1, 2], capacity=2)
    q.put(2, ["a"])
    q.put(1, ["b"])
    t, blocked = _put_in_thread(q, 2, ["c"])
    assert not blocked.wait(0.2), "put must block while the queues are full"
    orderer = ArrivalOrderer(q)
    assert orderer.next_runs(1) == [(2, ["a"])]
    assert blocked.wait(2)
    assert q.take_from(2, 1) == ["c"]  # a per-channel take skips other channels
    assert orderer.next_runs(1) == [(1, ["b"])]
    assert orderer.next_runs(0.05) == []
    q.close()
    with pytest.raises(QueuesClosed):
        q.put(1, ["d"])
    t.join()


def test_per_channel_queues_never_block_a_channel_behind_the_others():
    """An ordered merge waits for one channel: that channel's sender must get through even
    when another channel has filled its share."""
    q = InputQueues([1, 2], capacity=2, per_channel=True)
    q.put(1, ["a"])
    q.put(1, ["b"])
    q.put(2, ["x"])  # would block with a total capacity of 2
    t, blocked = _put_in_thread(q, 1, ["c"])
    assert not blocked.wait(0.2), "channel 1 is full: its put must block"
    assert q.take_from(2, 1) == ["x"]
    assert not blocked.wait(0.1), "room on channel 2 does not unblock channel 1"
    assert q.take_from(1, 1) == ["a"]
    assert blocked.wait(2)
    t.join()


def _collecting_transport(out: list, delay: float = 0.0):
    def send(payload: bytes) -> None:
        time.sleep(delay)
        h = batch_format.decode_header(payload)
        out.append((h.first_seq, batch_format.decode_elements(payload, h)))
    return send


def test_output_channel_batches_stamps_consecutive_seqs_and_flushes_on_timeout():
    sent: list = []
    ch = OutputChannel(ChannelSpec(5, 0, 0, 0, 1, 0), _collecting_transport(sent), batch_size=4,
                       buffer_timeout_s=0.02)
    for i in range(10):
        ch.emit(i)
    deadline = time.time() + 2
    while sum(len(b) for _, b in sent) < 10 and time.time() < deadline:
        time.sleep(0.01)  # the last 2 elements leave by the buffer timeout, without a flush
    assert [b for _, b in sent] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [s for s, _ in sent] == [0, 4, 8]
    assert ch.close(1) and ch.next_seq == 10


def test_a_drained_emitter_sends_at_once_when_nothing_is_on_its_way_else_when_it_arrives():
    """``flush_if_free`` (the instance has no input left): the open batch goes now if no batch of the
    channel is on its way, else the moment the one on its way is delivered; never by the timer."""
    sent: list = []
    gate = threading.Event()

    def send(payload: bytes) -> None:
        gate.wait(10)
        h = batch_format.decode_header(payload)
        sent.append((h.first_seq, batch_format.decode_elements(payload, h)))

    ch = OutputChannel(ChannelSpec(2, 0, 0, 0, 1, 0), send, batch_size=100, buffer_timeout_s=60)
    ch.emit(0)
    ch.flush_if_free()  # nothing on its way: sealed and sent (held at the gate)
    ch.emit(1)
    ch.flush_if_free()  # the first batch is on its way: the open one waits, and takes more
    ch.emit(2)
    gate.set()
    deadline = time.monotonic() + 5
    while len(sent) < 2:
        assert time.monotonic() < deadline, f"sent {sent}: the open batch did not follow the delivered one"
        time.sleep(0.01)
    assert sent == [(0, [0]), (1, [1, 2])]
    ch.emit(3)
    ch.flush_if_free()  # nothing on its way again
    while len(sent) < 3:
        assert time.monotonic() < deadline, f"sent {sent}"
        time.sleep(0.01)
    assert sent[2] == (3, [3]) and ch.close(1)


def test_output_channel_applies_back_pressure():
    sent: list = []
    ch = OutputChannel(ChannelSpec(1, 0, 0, 0, 1, 0), _collecting_transport(sent, delay=0.2), batch_size=1,
                       buffer_timeout_s=0.001, max_ready=2)
    start = time.monotonic()
    for i in range(6):
        ch.emit(i)
    # 6 one-element batches, at most 2 waiting + 1 in flight: the emitter waited for ~3 sends
    assert time.monotonic() - start >= 0.4
    assert ch.close(5)
    assert [b[0] for _, b in sent] == list(range(6))


def test_a_sender_that_is_behind_sends_the_waiting_batches_in_one_call():
    """One call per sealed batch caps a transport at 1 / call latency; a sender behind its replica
    re-frames what waits (up to batch_size elements) into one call.  Nothing is lost or reordered."""
    spec = ChannelSpec(id=3, edge_id=0, src_task=0, src_partition=0, dst_task=1, dst_partition=0)
    gate = threading.Event()
    calls: list[tuple[int, int]] = []
    got: list = []

    def slow(payload: bytes) -> None:
        gate.wait(5)
        h = batch_format.decode_header(payload)
        calls.append((h.first_seq, h.count))
        got.extend(batch_format.decode_elements(payload, h))

    ch = OutputChannel(spec, slow, batch_size=8, buffer_timeout_s=0.001, max_ready=100)
    for i in range(20):
        ch.emit(("d", i))
        ch.flush()  # 20 sealed batches of one element (like a pulse sealing a batch every period)
    gate.set()
    assert ch.close(5)
    assert got == [("d", i) for i in range(20)]
    assert len(calls) < 20 and all(count <= 8 for _, count in calls)
    assert [first for first, _ in calls] == sorted(first for first, _ in calls)


def test_the_driver_s_word_about_a_worker_spares_a_replica_restored_elsewhere_since():
    """Replica 0 of the destination ran on worker 1 and was restored on worker 3: when worker 1 is
    declared dead (again, after a relaunch) or finishes, the channel keeps sending to replica 0 on
    worker 3.  It used to cut it off, and the restored replica waited for that channel for good."""
    sent: list = []
    spec = ChannelSpec(id=7, edge_id=0, src_task=2, src_partition=1, dst_task=3, dst_partition=1)
    ch = OutputChannel(spec, [_collecting_transport(sent), _collecting_transport([])], batch_size=1,
                       buffer_timeout_s=0.001, retain=True, destinations=[1, 2])
    ch.cut_off(0, "worker 1 declared dead", worker=1)
    assert ch.live_replicas == [1]
    ch.rejoin(0, _collecting_transport(sent), 0, worker=3)
    ch.cut_off(0, "worker 1 declared dead by the driver", worker=1)
    ch.retire(0, worker=1)
    assert ch.live_replicas == [0, 1]
    ch.emit(("d", 1))
    ch.cut_off(0, "worker 3 declared dead by the driver", worker=3)
    assert ch.live_replicas == [1]
    assert ch.close(2)
