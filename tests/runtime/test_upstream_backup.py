"""Upstream backup in output channels: retention up to the destination's checkpoint, replay to a
replica that rejoins after a restore (no Spark, no Kafka)."""

from __future__ import annotations

import threading
import time

import pytest

from replication.plan import ChannelSpec
from replication.runtime.channels import BackupTrimmed, OutputChannel
from replication.runtime.dedup import Dedup
from transport import batch_format

SPEC = ChannelSpec(id=5, edge_id=0, src_task=0, src_partition=0, dst_task=1, dst_partition=0)


class Receiver:
    """A destination replica: dedup and the seqs it delivered."""

    def __init__(self, next_seq: int = 0, fail: bool = False) -> None:
        self.dedup = Dedup()
        if next_seq:
            self.dedup.resume(SPEC.id, next_seq)
        self.delivered: list[int] = []
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, payload: bytes) -> None:
        if self.fail:
            raise ConnectionError("replica gone")
        h = batch_format.decode_header(payload)
        with self.lock:
            adm = self.dedup.admit(h.channel, h.first_seq, h.count)
            self.delivered += [h.first_seq + i for i in range(adm.start, adm.stop)]


def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def emit(ch: OutputChannel, n: int, start: int) -> None:
    for i in range(start, start + n):
        ch.emit(("d", i))
    ch.flush()


def test_without_retention_sent_batches_are_dropped():
    a, b = Receiver(), Receiver()
    ch = OutputChannel(SPEC, [a, b], batch_size=4, buffer_timeout_s=0.001, max_ready=100)
    emit(ch, 40, 0)
    wait_for(lambda: len(a.delivered) == 40 and len(b.delivered) == 40)
    assert ch.backup_from is None
    with pytest.raises(BackupTrimmed):
        ch.rejoin(1, Receiver(), 3)
    ch.close(1)


def test_rejoined_replica_is_replayed_from_its_checkpoint_position():
    a, b = Receiver(), Receiver(fail=True)
    ch = OutputChannel(SPEC, [a, b], batch_size=4, buffer_timeout_s=0.001, max_ready=100, retain=True)
    emit(ch, 40, 0)
    wait_for(lambda: len(a.delivered) == 40 and 1 not in ch.live_replicas)
    ch.release(10)  # the destination's last completed checkpoint consumed seqs 0..9
    assert ch.backup_from == 8  # the batch holding seq 10 starts at 8
    restored = Receiver(next_seq=10)  # restored from that checkpoint elsewhere
    ch.rejoin(1, restored, 10)
    emit(ch, 20, 40)
    wait_for(lambda: len(restored.delivered) == 50)
    assert restored.delivered == list(range(10, 60))
    assert a.delivered == list(range(60))
    assert restored.dedup.gaps == 0
    assert ch.close(1)


def test_release_trims_only_what_every_live_replica_sent():
    slow = threading.Event()
    a = Receiver()

    def blocked(payload: bytes) -> None:
        slow.wait(5)

    ch = OutputChannel(SPEC, [a, blocked], batch_size=2, buffer_timeout_s=0.001, max_ready=100, retain=True)
    emit(ch, 10, 0)
    wait_for(lambda: len(a.delivered) == 10)
    ch.release(10)  # checkpointed, but replica 1 has not received it yet: still held for it
    assert ch.backup_from == 0
    slow.set()
    wait_for(lambda: ch.backup_from == 10)
    ch.close(1)


def test_a_rejoined_replica_further_behind_than_the_lag_limit_is_replayed_not_cut_off():
    """Restored from an old checkpoint, a replica may be thousands of batches behind its twin:
    it is replayed its whole backlog (held by the backup) instead of being cut off at once."""
    a = Receiver()
    ch = OutputChannel(SPEC, [a, Receiver(fail=True)], batch_size=1, buffer_timeout_s=0.001, max_ready=2,
                       lag_limit=4, retain=True)
    emit(ch, 30, 0)
    wait_for(lambda: len(a.delivered) == 30 and 1 not in ch.live_replicas)
    restored = Receiver()
    slow = restored.__call__

    def slowly(payload: bytes) -> None:
        time.sleep(0.002)
        slow(payload)

    ch.rejoin(1, slowly, 0)  # 30 batches behind, the lag limit is 4
    emit(ch, 20, 30)
    wait_for(lambda: restored.delivered == list(range(50)))
    assert 1 in ch.live_replicas and restored.dedup.gaps == 0
    ch.close(1)


def test_backup_is_bounded_and_a_too_old_position_is_refused():
    a = Receiver()
    ch = OutputChannel(SPEC, [a, Receiver(fail=True)], batch_size=1, buffer_timeout_s=0.001, max_ready=1000,
                       retain=True, backup_limit=8)
    emit(ch, 30, 0)
    wait_for(lambda: len(a.delivered) == 30)
    assert ch.backup_overflows > 0
    assert ch.backup_from == 22  # the newest 8 batches of one element
    with pytest.raises(BackupTrimmed):
        ch.rejoin(1, Receiver(next_seq=5), 5)
    restored = Receiver(next_seq=25)
    ch.rejoin(1, restored, 25)
    wait_for(lambda: restored.delivered == list(range(25, 30)))
    ch.close(1)


def test_a_stale_sender_of_the_old_place_cannot_move_the_new_position():
    release_old = threading.Event()
    calls = []

    def hung(payload: bytes) -> None:
        calls.append(batch_format.decode_header(payload).first_seq)
        release_old.wait(5)
        raise ConnectionError("old place finally failed")

    a = Receiver()
    ch = OutputChannel(SPEC, [a, hung], batch_size=2, buffer_timeout_s=0.001, max_ready=100, retain=True)
    emit(ch, 6, 0)
    wait_for(lambda: calls)  # replica 1's sender is stuck in a call to the old place
    ch.cut_off(1, "declared dead")
    restored = Receiver()
    ch.rejoin(1, restored, 0)
    release_old.set()  # the stale call fails now: it must not cut off the rejoined replica
    emit(ch, 4, 6)
    wait_for(lambda: restored.delivered == list(range(10)))
    assert 1 in ch.live_replicas
    ch.close(1)


def test_rejoin_ahead_of_the_channel_starts_at_its_next_seq():
    a = Receiver(next_seq=100)
    ch = OutputChannel(SPEC, [a, Receiver(fail=True)], batch_size=2, buffer_timeout_s=0.001, max_ready=100,
                       retain=True, first_seq=100)
    emit(ch, 4, 0)
    wait_for(lambda: len(a.delivered) == 4)
    # a restored upstream (this channel, from its own older checkpoint) behind a restored destination
    restored = Receiver(next_seq=110)
    ch.rejoin(1, restored, 110)
    emit(ch, 12, 4)
    wait_for(lambda: len(a.delivered) == 16)
    wait_for(lambda: restored.delivered == list(range(110, 116)))
    assert restored.dedup.dropped == 6  # 104..109 arrived again: dropped, never a gap
    ch.close(1)


def test_every_destination_replica_lost_keeps_the_output_for_a_rollback_then_blocks():
    """Both replicas of the destination die (a rollback will restore it): with a backup the
    channel keeps what is emitted, up to its limit, then blocks the emitter; the restored
    replica rejoins and gets everything from its checkpoint on.  Without a backup it is an error."""
    from replication.runtime.channels import ChannelClosed

    a, b = Receiver(), Receiver()
    ch = OutputChannel(SPEC, [a, b], batch_size=4, buffer_timeout_s=0.001, max_ready=100, retain=True,
                       backup_limit=8)
    emit(ch, 20, 0)
    wait_for(lambda: len(a.delivered) == 20)
    ch.release(12)  # the destination's safe checkpoint is at 12
    ch.cut_off(0, "dead")
    ch.cut_off(1, "dead")
    emit(ch, 12, 20)  # kept: 3 more batches, within the limit of 8
    blocked = threading.Thread(target=emit, args=(ch, 40, 32))
    blocked.start()
    time.sleep(0.3)
    assert blocked.is_alive(), "the emitter must block once the backup is full"
    restored = Receiver(next_seq=12)
    ch.rejoin(0, restored, 12)
    blocked.join(5)
    assert not blocked.is_alive()
    wait_for(lambda: len(restored.delivered) == 72 - 12)
    assert restored.delivered == list(range(12, 72))
    ch.close(1)

    plain = OutputChannel(SPEC, [Receiver(), Receiver()], batch_size=4, buffer_timeout_s=0.001)
    plain.cut_off(0, "dead")
    plain.cut_off(1, "dead")
    with pytest.raises(ChannelClosed, match="every replica"):
        plain.emit(("d", 0))
    plain.close(1)


def test_close_waits_for_a_destination_being_restored_to_rejoin_and_get_everything():
    """Both destination replicas are lost and the partition is being rolled back (a backup is
    kept): an upstream that finishes meanwhile waits for a restored replica to rejoin instead of
    failing with "could not deliver its last batches"; without one in time, it does fail."""
    a, b = Receiver(fail=True), Receiver(fail=True)
    ch = OutputChannel(SPEC, [a, b], batch_size=4, buffer_timeout_s=0.001, max_ready=100, retain=True)
    emit(ch, 12, 0)
    wait_for(lambda: ch.live_replicas == [])
    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(ch.close(5)))
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive()  # not given up on the lost destination
    restored = Receiver()
    ch.rejoin(0, restored, 0)
    closer.join(5)
    assert closed == [True] and restored.delivered == list(range(12))

    lost = OutputChannel(SPEC, [Receiver(fail=True)], batch_size=4, buffer_timeout_s=0.001, retain=True)
    emit(lost, 4, 0)
    wait_for(lambda: lost.live_replicas == [])
    assert lost.close(0.2) is False  # nobody came back in time
