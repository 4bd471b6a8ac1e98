"""PushLink: every channel's batches to one peer worker in few calls from one thread, never blocked
by a full queue.

A fake peer runs the receiving side in-process (dedup + bounded per-channel queues, answering
*busy* for a full queue as ``Worker._push_many`` does); the channels and the link are the real ones.
"""

from __future__ import annotations

import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from merge.queues import InputQueues
from replication.metrics import InstanceMetrics
from replication.plan import ChannelSpec
from replication.runtime.channels import OutputChannel
from replication.runtime.dedup import Dedup
from replication.runtime.intake import InputIntake
from replication.runtime.senders import (
    PUSH_BUSY,
    PUSH_OK,
    LocalSender,
    PushLink,
    decode_push_reply,
    decode_pushes,
    encode_pushes,
    receive_pushes,
)
from transport import batch_format
from transport.frames import TransportFailure


class FakeWorker:
    """The receiving worker: per-channel dedup and bounded queues; refuses unknown channels."""

    address = "fake:1"

    def __init__(self, channels: list[int], capacity: int = 2, fail_calls: int = 0) -> None:
        self.queues = InputQueues(channels, capacity, per_channel=True)
        self.dedup = Dedup()
        self.calls = 0
        self.busy = 0
        self.fail_calls = fail_calls  # the first calls fail as an unreachable peer's would

    def call(self, request: bytes, timeout: float) -> bytes:
        if self.fail_calls:
            self.fail_calls -= 1
            raise TransportFailure("unreachable")
        self.calls += 1
        return receive_pushes(request, self.deliver)

    def close(self) -> None:
        pass

    def deliver(self, h: batch_format.BatchHeader, payload: bytes) -> bool:
        """What ``InputIntake.deliver`` does, on plain dedup and queues."""
        if h.channel not in self.queues.channels:
            raise ValueError(f"channel {h.channel} is not an input here")
        adm = self.dedup.check(h.channel, h.first_seq, h.count)
        if adm.delivers and not self.queues.put(
                h.channel, batch_format.decode_elements(payload, h)[adm.start:adm.stop], block=False):
            self.busy += 1
            return False
        self.dedup.commit(h.channel, h.first_seq, adm)
        return True

    def drain(self, channel: int, n: int, timeout: float = 10.0) -> list:
        got: list = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            batch = self.queues.take_from(channel, 0.05)
            if batch:
                got += batch
        return got


def _channel(cid: int, transports: list, batch_size: int = 4) -> OutputChannel:
    return OutputChannel(ChannelSpec(cid, 0, 0, 1, 0, 0), transports, batch_size=batch_size,
                         buffer_timeout_s=0.002)


def _emit_all(ch: OutputChannel, n: int) -> threading.Thread:
    t = threading.Thread(target=lambda: [ch.emit((0, i)) for i in range(n)], daemon=True)
    t.start()
    return t


def test_push_wire_format_round_trips():
    payloads = [b"", b"a", bytes(range(256)) * 3]
    assert decode_pushes(encode_pushes(payloads)) == payloads
    assert decode_pushes(b"") == []


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=40))
def test_check_then_commit_is_admit_and_check_alone_changes_nothing(batches):
    a, b = Dedup(), Dedup()
    for first, count in batches:
        before = (dict(b.last), b.dropped, b.gaps)
        adm = b.check(0, first, count)
        assert (dict(b.last), b.dropped, b.gaps) == before
        b.commit(0, first, adm)
        assert a.admit(0, first, count) == adm
        assert (a.last, a.dropped, a.gaps) == (b.last, b.dropped, b.gaps)


def test_queue_put_without_blocking_refuses_when_full_and_keeps_nothing():
    q = InputQueues([1, 2], capacity=1, per_channel=True)
    assert q.put(1, ["x"], block=False)
    assert not q.put(1, ["y"], block=False)
    assert q.put(2, ["z"], block=False)  # another channel has room of its own
    assert q.take_from(1, 0) == ["x"] and q.take_from(1, 0) is None


def test_many_channels_share_one_link_and_each_delivers_its_sequence_exactly_once():
    ids = list(range(10))
    peer = FakeWorker(ids, capacity=400)  # room for every batch: nobody consumes until the end
    link = PushLink(peer, give_up=lambda: False)
    chans = [_channel(c, [link]) for c in ids]
    senders = [_emit_all(ch, 300) for ch in chans]
    for t in senders:
        t.join(10)
    assert all(ch.close(10) for ch in chans)
    for c in ids:
        assert peer.drain(c, 300) == [(0, i) for i in range(300)]
    assert peer.dedup.gaps == 0
    assert link.batches >= sum(ch.batches_sent[0] for ch in chans)
    assert link.calls < link.batches  # batches of several channels went in one call
    link.close()


def test_a_full_queue_makes_its_batch_busy_without_holding_up_the_other_channels():
    """The deadlock a blocking receiver would cause: channel 1 is never consumed (a merge waiting
    for channel 2), so its queue fills; channel 2 must still get everything through the same link."""
    peer = FakeWorker([1, 2], capacity=2)
    link = PushLink(peer, give_up=lambda: False)
    stuck, free = _channel(1, [link], batch_size=1), _channel(2, [link], batch_size=1)
    t1, t2 = _emit_all(stuck, 50), _emit_all(free, 50)
    assert peer.drain(2, 50) == [(0, i) for i in range(50)]
    t2.join(5)
    assert peer.busy > 0  # channel 1's batches were answered busy, and sent again
    assert peer.drain(1, 50) == [(0, i) for i in range(50)]  # consumed at last: nothing lost
    t1.join(5)
    assert stuck.close(5) and free.close(5)
    assert peer.dedup.gaps == 0
    link.close()


def test_a_refused_batch_cuts_that_replica_off_and_the_other_replica_gets_everything(caplog):
    peer = FakeWorker([5])
    link = PushLink(peer, give_up=lambda: False)
    got: list = []
    ch = _channel(9, [link, lambda payload: got.extend(batch_format.decode_elements(
        payload, batch_format.decode_header(payload)))])  # channel 9 is not an input of the fake worker
    _emit_all(ch, 40).join(5)
    assert ch.close(5)
    assert got == [(0, i) for i in range(40)]
    assert ch.live_replicas == [1]
    assert "is not an input here" in caplog.text
    link.close()


def test_an_unreachable_peer_is_retried_until_it_answers():
    peer = FakeWorker([3], capacity=8, fail_calls=3)
    link = PushLink(peer, give_up=lambda: False, retry_s=0.001)
    ch = _channel(3, [link])
    ch.emit((0, "a"))
    assert peer.drain(3, 1) == [(0, "a")]
    assert ch.close(5) and ch.live_replicas == [0]
    link.close()


def test_a_peer_given_up_cuts_its_replicas_off_and_reports_it():
    peer = FakeWorker([3], fail_calls=10**9)
    link = PushLink(peer, give_up=lambda: True)
    reported: list = []
    ch = OutputChannel(ChannelSpec(3, 0, 0, 1, 0, 0), [link], batch_size=4, buffer_timeout_s=0.002,
                       on_cut_off=lambda spec, replica, worker, reason: reported.append((replica, reason)))
    ch.emit((0, "a"))
    deadline = time.monotonic() + 5
    while ch.live_replicas and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ch.live_replicas == []
    assert reported and reported[0][0] == 0 and "send failed" in reported[0][1]
    link.close()


def test_one_sending_thread_per_destination_however_many_channels():
    """A worker's threads must not grow with its channels: 40 channels of two replicas each, to two
    destinations, start two sending threads."""
    before = set(threading.enumerate())
    peers = [FakeWorker(list(range(40)), capacity=100), FakeWorker(list(range(40)), capacity=100)]
    links = [PushLink(p, give_up=lambda: False) for p in peers]
    chans = [_channel(c, links) for c in range(40)]
    started = [t for t in threading.enumerate() if t not in before and t.name.startswith("send-")]
    assert len(started) == 2
    for ch in chans:
        for i in range(10):
            ch.emit((0, i))
    assert all(ch.close(10) for ch in chans)
    for p in peers:
        for c in range(40):
            assert p.drain(c, 10) == [(0, i) for i in range(10)]
    for link in links:
        link.close()


def _receiving_side(channels: list[int], capacity: int):
    """A processing replica's receiving side itself (:class:`InputIntake`: its channel locks, dedup
    and per-channel queues), without an instance or a worker around it."""
    intake = InputIntake("chain[0]r1", channels, InputQueues(channels, capacity, per_channel=True), InstanceMetrics())
    return intake, intake.deliver


def _batch(channel: int, first_seq: int) -> tuple[batch_format.BatchHeader, bytes]:
    payload = batch_format.encode_batch(0, 0, channel, first_seq, [(0, first_seq)])
    return batch_format.decode_header(payload), payload


def test_a_same_worker_sender_facing_a_full_queue_does_not_hold_up_a_remote_call():
    """A same-worker upstream sends channel 1 to a full queue; meanwhile a PushMany from another
    worker carries a batch of channel 1 and one of channel 2.  That call must answer at once (1:
    busy, 2: delivered): were the local sender to wait holding the channel's lock, the call (and
    every channel behind it) would wait until channel 1 is consumed, which a merge waiting for
    channel 2 never does.  The local batches arrive once channel 1 is consumed."""
    intake, deliver = _receiving_side([1, 2], capacity=1)
    assert deliver(*_batch(1, 0))  # channel 1 is full now
    local = LocalSender("local", deliver)
    ch = OutputChannel(ChannelSpec(1, 0, 0, 1, 0, 0), [local], batch_size=1, buffer_timeout_s=0.001,
                       first_seq=1, max_ready=8)
    ch.emit((0, 1))
    ch.emit((0, 2))
    time.sleep(0.1)  # the local sender is answered busy over and over
    replies: list[bytes] = []
    remote = threading.Thread(daemon=True, target=lambda: replies.append(receive_pushes(
        encode_pushes([_batch(1, 1)[1], _batch(2, 0)[1]]), deliver)))
    remote.start()
    remote.join(2.0)
    assert not remote.is_alive(), "the remote call waited behind the same-worker sender"
    statuses, _ = decode_push_reply(replies[0], 2)
    assert list(statuses) == [PUSH_BUSY, PUSH_OK]
    assert intake.queues.take_from(2, 0) == [(0, 0)]
    assert intake.queues.take_from(1, 0) == [(0, 0)]  # consumed: the local batches go through now
    assert [intake.queues.take_from(1, 2.0) for _ in range(2)] == [[(0, 1)], [(0, 2)]]
    assert ch.close(2) and intake.dedup.gaps == 0
    local.close()
