"""Dedup under active replication and OutputChannel duplicate sending (pure Python, no Spark, no Kafka).

The dedup tests feed ``Dedup.admit`` the batches two replicas of one upstream partition would send: the
same per-channel seqs, cut at different batch boundaries, interleaved, replayed, lost or started late.
The channel tests drive ``OutputChannel`` with fake transports (callables receiving framed batches)
that collect, fail, block on an event or wait for permits, so every timing is controlled by the test.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.plan import ChannelSpec
from replication.runtime.channels import ChannelClosed, OutputChannel
from replication.runtime.dedup import Dedup
from transport import batch_format

# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _batches(n: int, cuts) -> list[tuple[int, int]]:
    """Split seqs ``0..n-1`` at ``cuts`` into ``(first_seq, count)`` batches."""
    bounds = [0, *sorted(set(cuts)), n]
    return [(a, b - a) for a, b in itertools.pairwise(bounds)]


def _cuts(n: int):
    return st.sets(st.integers(1, n - 1), max_size=n - 1) if n > 1 else st.just(set())


def _admit_all(d: Dedup, channel: int, batches) -> list[int]:
    """Admit ``batches`` in order; return the delivered seqs."""
    delivered: list[int] = []
    for first, count in batches:
        a = d.admit(channel, first, count)
        assert 0 <= a.start <= a.stop <= count
        delivered += [first + i for i in range(a.start, a.stop)]
    return delivered


def _wait_for(pred: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return pred()
        time.sleep(0.002)
    return True


class FakeTransport:
    """Collects what it receives; optionally blocks on ``gate``, waits for ``permits``, sleeps, or fails."""

    def __init__(self, *, delay: float = 0.0, gate: threading.Event | None = None,
                 permits: threading.Semaphore | None = None, fail_after: int | None = None,
                 fail_after_gate: bool = False) -> None:
        self.delay = delay
        self.gate = gate
        self.permits = permits
        self.fail_after = fail_after  # calls that succeed before every further call raises
        self.fail_after_gate = fail_after_gate
        self.calls = 0
        self.batches: list[tuple[batch_format.BatchHeader, list]] = []
        self._lock = threading.Lock()

    def __call__(self, payload: bytes) -> None:
        with self._lock:
            self.calls += 1
            call = self.calls
        if self.gate is not None:
            self.gate.wait()
            if self.fail_after_gate:
                raise ConnectionError("replica unreachable")
        if self.permits is not None:
            self.permits.acquire()
        if self.delay:
            time.sleep(self.delay)
        if self.fail_after is not None and call > self.fail_after:
            raise ConnectionError(f"send {call} failed")
        header = batch_format.decode_header(payload)
        elements = batch_format.decode_elements(payload, header)
        with self._lock:
            self.batches.append((header, elements))

    @property
    def pairs(self) -> list[tuple[int, object]]:
        """The received ``(seq, element)`` pairs, in arrival order."""
        with self._lock:
            return [(h.first_seq + i, e) for h, els in self.batches for i, e in enumerate(els)]

    @property
    def count(self) -> int:
        with self._lock:
            return sum(len(els) for _, els in self.batches)


_channel_ids = itertools.count(1000)


class Harness:
    """Builds channels with unique ids and makes sure every thread a test started ends."""

    def __init__(self) -> None:
        self.channels: list[OutputChannel] = []
        self.gates: list[threading.Event] = []
        self.semaphores: list[threading.Semaphore] = []
        self.threads: list[threading.Thread] = []

    def channel(self, transports, *, dst_task: int = 2, dst_partition: int = 3, **kw) -> OutputChannel:
        kw.setdefault("batch_size", 1)
        kw.setdefault("buffer_timeout_s", 0.005)
        spec = ChannelSpec(next(_channel_ids), 1, 0, 0, dst_task, dst_partition)
        ch = OutputChannel(spec, transports, **kw)
        self.channels.append(ch)
        return ch

    def gate(self) -> threading.Event:
        ev = threading.Event()
        self.gates.append(ev)
        return ev

    def semaphore(self) -> threading.Semaphore:
        sem = threading.Semaphore(0)
        self.semaphores.append(sem)
        return sem

    def emitter(self, ch: OutputChannel, elements) -> Emitter:
        em = Emitter(ch, elements)
        self.threads.append(em.thread)
        em.thread.start()
        return em

    def finish(self) -> None:
        for ev in self.gates:
            ev.set()
        for sem in self.semaphores:
            sem.release(10_000)
        for ch in self.channels:
            ch.abort()
        for t in self.threads:
            t.join(timeout=2)
        names = {f"send-ch{ch.spec.id}-" for ch in self.channels}

        def leftovers() -> list[str]:
            return [t.name for t in threading.enumerate() if any(t.name.startswith(n) for n in names)]

        assert _wait_for(lambda: not leftovers(), 3), f"sender threads still running: {leftovers()}"
        assert not [t.name for t in self.threads if t.is_alive()], "an emitter thread is still running"


class Emitter:
    """Emits ``elements`` on a thread, counting how many ``emit`` calls returned."""

    def __init__(self, ch: OutputChannel, elements) -> None:
        self.ch = ch
        self.elements = list(elements)
        self.emitted = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-emitter", daemon=True)

    def _run(self) -> None:
        try:
            for e in self.elements:
                self.ch.emit(e)
                self.emitted += 1
        except BaseException as err:  # noqa: BLE001 - inspected by the test
            self.error = err

    def done(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


@pytest.fixture
def harness():
    h = Harness()
    yield h
    h.finish()


# --------------------------------------------------------------------------------------------------
# 1. Dedup as used with active replication
# --------------------------------------------------------------------------------------------------


@st.composite
def _two_replica_streams(draw, min_n: int = 1, max_n: int = 120):
    """The batches of replicas A and B (same seqs 0..n-1, own boundaries), merged in a random
    interleaving that keeps each replica's own order."""
    n = draw(st.integers(min_n, max_n))
    a = _batches(n, draw(_cuts(n)))
    b = _batches(n, draw(_cuts(n)))
    order = draw(st.permutations(["A"] * len(a) + ["B"] * len(b)))
    ia, ib = iter(a), iter(b)
    merged = [(r, next(ia) if r == "A" else next(ib)) for r in order]
    return n, a, b, merged


@given(_two_replica_streams())
def test_two_replicas_interleaved_deliver_each_seq_once_in_order(streams):
    n, a, b, merged = streams
    d = Dedup()
    delivered = _admit_all(d, 0, [batch for _, batch in merged])
    assert delivered == list(range(n))
    total_sent = sum(c for _, c in a) + sum(c for _, c in b)
    assert total_sent == 2 * n
    assert d.dropped == total_sent - n == n
    assert d.gaps == 0
    assert d.position(0) == n - 1


@given(_two_replica_streams())
def test_admission_accounts_for_every_element_of_every_batch(streams):
    """Per batch: dropped + delivered == count, the dropped part is a prefix, and nothing is a gap."""
    _, _, _, merged = streams
    d = Dedup()
    for _, (first, count) in merged:
        before = d.position(0)
        a = d.admit(0, first, count)
        assert a.gap == 0
        assert a.dropped == a.start  # duplicates are exactly the prefix up to ``last``
        assert a.dropped + (a.stop - a.start) == count
        assert a.start == min(count, max(0, before + 1 - first))
        assert d.position(0) == max(before, first + count - 1)


@given(st.data())
def test_replays_after_reconnects_deliver_nothing_twice(data):
    """A sender that reconnects resends from an earlier seq (overlapping batches)."""
    d = Dedup()
    delivered: list[int] = []
    sent_up_to = 0  # next seq the sender has never sent
    pos = 0  # next seq the sender sends
    sent = 0
    for _ in range(data.draw(st.integers(1, 40))):
        if pos > 0 and data.draw(st.booleans()):
            pos = data.draw(st.integers(0, pos))  # reconnect: resend from an earlier seq
            continue
        count = data.draw(st.integers(1, 10))
        a = d.admit(3, pos, count)
        assert a.gap == 0
        delivered += [pos + i for i in range(a.start, a.stop)]
        sent += count
        pos += count
        sent_up_to = max(sent_up_to, pos)
    assert delivered == list(range(sent_up_to))
    assert d.dropped == sent - sent_up_to
    assert d.gaps == 0


def test_replay_of_an_overlapping_range_delivers_only_the_new_tail():
    d = Dedup()
    assert _admit_all(d, 0, [(0, 10), (10, 10)]) == list(range(20))
    a = d.admit(0, 5, 10)  # reconnect from 5: 5..14 were delivered already
    assert (a.start, a.stop, a.dropped, a.gap) == (10, 10, 10, 0) and not a.delivers
    a = d.admit(0, 15, 10)  # 15..19 again, 20..24 new
    assert (a.start, a.stop, a.dropped, a.gap) == (5, 10, 5, 0)
    assert d.position(0) == 24 and d.dropped == 15 and d.gaps == 0


def test_gap_is_counted_not_delivered_and_stream_resumes_when_missing_batch_arrives():
    d = Dedup()
    assert _admit_all(d, 0, [(0, 5)]) == [0, 1, 2, 3, 4]
    a = d.admit(0, 10, 5)  # 5..9 missing
    assert (a.start, a.stop, a.dropped, a.gap) == (0, 0, 0, 5) and not a.delivers
    assert d.gaps == 1 and d.position(0) == 4 and d.dropped == 0
    a = d.admit(0, 12, 3)  # still beyond last + 1
    assert (a.gap, a.delivers) == (7, False)
    assert d.gaps == 2 and d.position(0) == 4
    a = d.admit(0, 5, 5)  # the missing batch
    assert (a.start, a.stop, a.dropped, a.gap) == (0, 5, 0, 0)
    assert d.position(0) == 9
    a = d.admit(0, 10, 5)  # the batch that was a gap, re-sent
    assert (a.start, a.stop, a.dropped, a.gap) == (0, 5, 0, 0)
    assert d.position(0) == 14 and d.gaps == 2 and d.dropped == 0


def test_gap_right_at_the_start_of_a_channel():
    d = Dedup()
    a = d.admit(4, 1, 3)  # seq 0 never arrived
    assert (a.gap, a.delivers, d.position(4)) == (1, False, -1)
    assert _admit_all(d, 4, [(0, 1), (1, 3)]) == [0, 1, 2, 3]


@given(st.integers(2, 80).flatmap(lambda n: st.tuples(st.just(n), _cuts(n))), st.data())
def test_lost_batch_makes_every_later_batch_a_gap_until_it_is_resent(n_cuts, data):
    n, cuts = n_cuts
    batches = _batches(n, cuts)
    lost = data.draw(st.integers(0, len(batches) - 1))
    d = Dedup()
    delivered = _admit_all(d, 0, batches[:lost])
    for first, count in batches[lost + 1:]:
        a = d.admit(0, first, count)
        assert a.gap == first - batches[lost][0] > 0 and not a.delivers
    assert d.gaps == len(batches) - lost - 1
    assert d.position(0) == batches[lost][0] - 1  # ``last`` did not move past the hole
    delivered += _admit_all(d, 0, batches[lost:])  # the sender retransmits from the lost batch
    assert delivered == list(range(n))
    assert d.dropped == 0


@given(st.integers(101, 250).flatmap(lambda n: st.tuples(st.just(n), _cuts(n), _cuts(100))))
def test_late_replica_is_dropped_until_it_catches_up_then_takes_over_seamlessly(streams):
    n, b_cuts, a_cuts = streams
    a = _batches(100, a_cuts)  # A delivers 0..99, then dies (its stream stops)
    b = _batches(n, b_cuts)  # B starts late, from seq 0, with its own boundaries
    d = Dedup()
    delivered = _admit_all(d, 0, a)
    assert delivered == list(range(100))
    for first, count in b:
        adm = d.admit(0, first, count)
        assert adm.gap == 0
        if first + count <= 100:  # everything up to 99 is a duplicate
            assert (adm.start, adm.stop, adm.dropped) == (count, count, count)
        else:  # from 100 on B takes over; a batch straddling 99/100 delivers its tail
            assert adm.start == adm.dropped == max(0, 100 - first)
            assert adm.stop == count
        delivered += [first + i for i in range(adm.start, adm.stop)]
    assert delivered == list(range(n))
    assert d.dropped == 100 and d.gaps == 0 and d.position(0) == n - 1


@given(st.data())
def test_channels_are_independent(data):
    """Several channels, each fed by two replicas, merged arbitrarily: each channel's dedup stands alone."""
    channels = data.draw(st.lists(st.sampled_from([0, 1, 7, 2**40]), min_size=1, max_size=3, unique=True))
    streams = {c: data.draw(_two_replica_streams(max_n=40)) for c in channels}
    queue = [(c, batch) for c in channels for _, batch in streams[c][3]]
    labels = data.draw(st.permutations([c for c, _ in queue]))
    per_channel = {c: iter([b for cc, b in queue if cc == c]) for c in channels}
    d = Dedup()
    delivered: dict[int, list[int]] = {c: [] for c in channels}
    for c in labels:
        first, count = next(per_channel[c])
        a = d.admit(c, first, count)
        delivered[c] += [first + i for i in range(a.start, a.stop)]
    for c in channels:
        assert delivered[c] == list(range(streams[c][0]))
        assert d.position(c) == streams[c][0] - 1
    assert d.dropped == sum(n for n, *_ in streams.values())
    assert d.position(12345) == -1


def test_a_gap_on_one_channel_does_not_affect_another():
    d = Dedup()
    assert d.admit(1, 0, 3).delivers
    assert d.admit(1, 10, 1).gap == 7  # channel 1 has a hole
    assert _admit_all(d, 2, [(0, 4), (2, 4)]) == [0, 1, 2, 3, 4, 5]
    assert (d.position(1), d.position(2), d.gaps, d.dropped) == (2, 5, 1, 2)
    assert not d.admit(1, 4, 1).delivers  # channel 1 still waits for seq 3
    assert d.admit(1, 3, 1).delivers


# --------------------------------------------------------------------------------------------------
# 2. OutputChannel: duplicate sending to every replica
# --------------------------------------------------------------------------------------------------


def test_both_replicas_receive_every_element_with_identical_seqs(harness):
    t0, t1 = FakeTransport(), FakeTransport(delay=0.0005)
    ch = harness.channel([t0, t1], batch_size=7, buffer_timeout_s=0.005, max_ready=4, dst_task=2, dst_partition=3)
    elements = [("rec", i) for i in range(500)]
    for e in elements:
        ch.emit(e)
    assert ch.close(3)
    expected = list(enumerate(elements))
    assert t0.pairs == expected
    assert t1.pairs == expected
    # sealing is shared, so both replicas got the very same batches
    assert [(h.first_seq, h.count) for h, _ in t0.batches] == [(h.first_seq, h.count) for h, _ in t1.batches]
    for h, els in t0.batches + t1.batches:
        assert (h.task, h.partition, h.channel) == (2, 3, ch.spec.id)
        assert 1 <= h.count <= 7 and len(els) == h.count
    assert ch.elements_sent == [500, 500] and ch.batches_sent == [len(t0.batches), len(t1.batches)]
    assert ch.live_replicas == [0, 1] and ch.next_seq == 500


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, 3), max_size=80))
def test_replicas_get_the_same_complete_sequence_whatever_the_batching_and_flushes(batch_size, ops):
    """ops: 0 = flush, otherwise emit that many elements."""
    h = Harness()
    try:
        t0, t1 = FakeTransport(), FakeTransport()
        ch = h.channel([t0, t1], batch_size=batch_size, buffer_timeout_s=0.002, max_ready=3)
        n = 0
        for op in ops:
            if op == 0:
                ch.flush()
            for _ in range(op):
                ch.emit(n)
                n += 1
        assert ch.close(3)
        assert t0.pairs == t1.pairs == [(i, i) for i in range(n)]
        assert all(hd.count <= batch_size for hd, _ in t0.batches)
    finally:
        h.finish()


@pytest.mark.parametrize("failing", [0, 1])
@pytest.mark.parametrize("fail_after", [0, 3])
def test_failing_transport_is_cut_off_and_the_other_gets_everything(harness, caplog, failing, fail_after):
    transports = [FakeTransport(), FakeTransport()]
    transports[failing] = FakeTransport(fail_after=fail_after)
    bad, good = transports[failing], transports[1 - failing]
    ch = harness.channel(transports, batch_size=4, max_ready=2)
    with caplog.at_level(logging.WARNING, logger="replication.runtime.channels"):
        em = harness.emitter(ch, range(400))
        assert em.done(3), "emit blocked on a failed replica"
        assert em.error is None and em.emitted == 400
        assert _wait_for(lambda: ch.live_replicas == [1 - failing])
        assert ch.close(3)
    assert good.pairs == [(i, i) for i in range(400)]
    assert bad.pairs == [(i, i) for i in range(4 * fail_after)]  # what it got before the failure
    assert bad.calls == fail_after + 1  # never called again after the failure
    assert any("send failed" in r.getMessage() for r in caplog.records)


def test_blocked_replica_is_cut_off_exactly_when_it_lags_more_than_lag_limit(harness):
    gate = harness.gate()
    fast, blocked = FakeTransport(), FakeTransport(gate=gate)
    ch = harness.channel([fast, blocked], batch_size=1, max_ready=2, lag_limit=8)
    # keep the fast replica caught up, so the lag is exactly the number of batches emitted
    for i in range(9):
        ch.emit(i)
        assert _wait_for(lambda i=i: fast.count == i + 1)
    assert ch.live_replicas == [0, 1], "cut off with a lag of only lag_limit batches"
    ch.emit(9)  # the blocked replica now lags 9 > 8 batches
    assert ch.live_replicas == [0]
    # the emitter goes on far beyond max_ready while the blocked transport still hangs
    em = harness.emitter(ch, range(10, 310))
    assert em.done(3) and em.error is None
    assert not gate.is_set() and blocked.calls <= 1
    gate.set()
    assert ch.close(3)
    assert fast.pairs == [(i, i) for i in range(310)]
    assert blocked.count <= 1  # at most the batch it was stuck on; nothing after the cut


def test_a_replica_cut_off_by_the_channel_itself_is_reported_with_its_worker(harness):
    """The lag cut-off and a failed send are the channel's own decisions: reported (so the driver
    replaces the replica), with the worker it was sent to; a cut-off the driver ordered is not."""
    gate = harness.gate()
    reported: list[tuple] = []
    fast, blocked, failing = FakeTransport(), FakeTransport(gate=gate), FakeTransport(fail_after=0)
    ch = harness.channel([fast, blocked], batch_size=1, max_ready=2, lag_limit=4, destinations=[7, 8],
                         on_cut_off=lambda spec, r, w, why: reported.append((spec.dst_task, r, w, why)))
    for i in range(6):
        ch.emit(i)
        assert _wait_for(lambda i=i: fast.count == i + 1)
    assert reported and reported[0][:3] == (2, 1, 8) and "behind the other replica" in reported[0][3]
    gate.set()
    other = harness.channel([fast, failing], destinations=[7, 9],
                            on_cut_off=lambda spec, r, w, why: reported.append((spec.dst_task, r, w, why)))
    other.emit(0)
    assert _wait_for(lambda: len(reported) == 2) and reported[1][1:3] == (1, 9) and "send failed" in reported[1][3]
    third = harness.channel([FakeTransport(), FakeTransport()], destinations=[7, 9],
                            on_cut_off=lambda spec, r, w, why: reported.append(why))
    third.cut_off(1, "worker 9 declared dead by the driver")
    third.rejoin(1, FakeTransport(), 0, worker=5)
    assert len(reported) == 2  # the driver's own decision is not reported back to it


def test_blocked_replica_does_not_stall_a_free_running_emitter(harness):
    gate = harness.gate()
    fast, blocked = FakeTransport(), FakeTransport(gate=gate)
    ch = harness.channel([fast, blocked], batch_size=5, max_ready=2, lag_limit=16)
    em = harness.emitter(ch, range(2000))  # 400 batches, 200 x max_ready
    assert em.done(3), f"emitter stalled after {em.emitted} elements"
    assert em.error is None
    assert ch.live_replicas == [0]
    assert _wait_for(lambda: fast.count == 2000)
    gate.set()
    assert ch.close(3)
    assert fast.pairs == [(i, i) for i in range(2000)]
    assert ch.elements_sent[1] <= 5


def test_cut_off_stops_sending_to_that_replica(harness, caplog):
    t0, t1 = FakeTransport(), FakeTransport()
    ch = harness.channel([t0, t1], batch_size=2)
    for i in range(10):
        ch.emit(i)
    assert _wait_for(lambda: t0.count == t1.count == 10)
    with caplog.at_level(logging.WARNING, logger="replication.runtime.channels"):
        ch.cut_off(1, "worker 4 declared dead by the driver")
        ch.cut_off(1, "again")  # idempotent
    assert ch.live_replicas == [0]
    assert [r.getMessage() for r in caplog.records if "cut off" in r.getMessage()] == [
        f"channel {ch.spec.id}: replica 1 of 2[3] cut off: worker 4 declared dead by the driver"]
    for i in range(10, 30):
        ch.emit(i)
    assert ch.close(3)
    assert t0.pairs == [(i, i) for i in range(30)]
    assert t1.pairs == [(i, i) for i in range(10)]
    assert t1.calls == 5


def test_cut_off_wakes_an_emitter_blocked_by_that_replica(harness):
    """Back-pressure follows the live replicas only: cutting the fastest (stuck) one off lets the
    emitter follow the remaining one."""
    sem0, sem1 = harness.semaphore(), harness.semaphore()
    t0, t1 = FakeTransport(permits=sem0), FakeTransport(permits=sem1)
    ch = harness.channel([t0, t1], batch_size=1, max_ready=2)
    em = harness.emitter(ch, range(6))
    assert _wait_for(lambda: em.emitted == 2)
    sem1.release(10_000)  # replica 1 flows, replica 0 is stuck
    assert em.done(3) and em.error is None
    ch.cut_off(0, "test")
    sem0.release(10_000)  # let replica 0's sender leave the batch it is stuck on
    assert ch.close(3)
    assert t1.pairs == [(i, i) for i in range(6)]


def test_emit_raises_channel_closed_naming_the_lost_partition_when_every_replica_failed(harness):
    t0, t1 = FakeTransport(fail_after=0), FakeTransport(fail_after=0)
    ch = harness.channel([t0, t1], batch_size=1, dst_task=6, dst_partition=4)
    ch.emit("x")
    assert _wait_for(lambda: ch.live_replicas == [])
    with pytest.raises(ChannelClosed, match="every replica of partition 4 of task 6 is lost"):
        ch.emit("y")
    assert not ch.close(1)


def test_emitter_blocked_by_back_pressure_raises_when_the_last_replica_fails(harness):
    gate = harness.gate()
    t0, t1 = FakeTransport(gate=gate, fail_after_gate=True), FakeTransport(gate=gate, fail_after_gate=True)
    ch = harness.channel([t0, t1], batch_size=1, max_ready=2, dst_task=1, dst_partition=0)
    em = harness.emitter(ch, range(10))
    assert _wait_for(lambda: em.emitted == 2)
    assert not em.done(0.1), "emit should block on back-pressure"
    gate.set()  # both replicas fail
    assert em.done(3)
    assert isinstance(em.error, ChannelClosed)
    assert "every replica of partition 0 of task 1 is lost" in str(em.error)
    assert em.emitted == 2 and ch.live_replicas == []


def test_cut_off_of_the_last_replica_closes_the_channel_for_emit(harness):
    t0, t1 = FakeTransport(), FakeTransport()
    ch = harness.channel([t0, t1])
    ch.emit(0)
    ch.cut_off(0, "dead")
    ch.cut_off(1, "dead")
    with pytest.raises(ChannelClosed, match="partition 3 of task 2"):
        ch.emit(1)


def test_close_waits_for_a_slow_but_alive_replica(harness):
    fast, slow = FakeTransport(), FakeTransport(delay=0.01)
    ch = harness.channel([fast, slow], batch_size=1, max_ready=30)  # no back-pressure from 20 batches
    for i in range(20):
        ch.emit(i)
    assert slow.count < 20  # the slow replica is still busy when close starts
    start = time.monotonic()
    assert ch.close(3)
    assert time.monotonic() - start >= 0.05
    assert fast.pairs == slow.pairs == [(i, i) for i in range(20)]


def test_close_waits_as_long_as_the_replicas_keep_receiving(harness):
    """Both replicas slow (a drain into a busy downstream): everything takes about a second to
    arrive, far longer than close's timeout, which only bounds a wait without progress."""
    t0, t1 = FakeTransport(delay=0.05), FakeTransport(delay=0.05)
    ch = harness.channel([t0, t1], batch_size=1, max_ready=30)
    for i in range(20):
        ch.emit(i)
    assert ch.close(0.3)
    assert t0.pairs == t1.pairs == [(i, i) for i in range(20)]


def test_close_gives_up_once_no_replica_receives_anything_for_its_timeout(harness):
    gate = harness.gate()
    ch = harness.channel([FakeTransport(gate=gate), FakeTransport(gate=gate)], batch_size=1, max_ready=5)
    for i in range(3):
        ch.emit(i)
    releaser = threading.Timer(0.5, gate.set)  # close() joins the stuck senders: let them go afterwards
    releaser.start()
    try:
        started = time.monotonic()
        assert not ch.close(0.1)
        assert time.monotonic() - started < 0.45
    finally:
        releaser.join()


def test_close_flushes_the_open_batch(harness):
    t0, t1 = FakeTransport(), FakeTransport()
    ch = harness.channel([t0, t1], batch_size=100, buffer_timeout_s=60)  # never sealed by size or time
    for i in range(5):
        ch.emit(i)
    assert ch.close(3)
    assert t0.pairs == t1.pairs == [(i, i) for i in range(5)]


def test_close_is_true_when_one_live_replica_got_everything_after_the_other_failed(harness):
    good, bad = FakeTransport(), FakeTransport(fail_after=1)
    ch = harness.channel([good, bad], batch_size=1)
    for i in range(10):
        ch.emit(i)
    assert ch.close(3)
    assert ch.live_replicas == [0]
    assert good.pairs == [(i, i) for i in range(10)]


def test_close_is_false_when_every_replica_is_lost(harness):
    ch = harness.channel([FakeTransport(fail_after=0), FakeTransport(fail_after=0)], batch_size=1)
    ch.emit(0)
    assert _wait_for(lambda: ch.live_replicas == [])
    assert not ch.close(1)


def test_close_with_a_stuck_live_replica_reports_the_replica_that_got_everything(harness):
    gate = harness.gate()
    fast, stuck = FakeTransport(), FakeTransport(gate=gate)
    ch = harness.channel([fast, stuck], batch_size=1, max_ready=2, lag_limit=100)
    for i in range(5):
        ch.emit(i)
    assert _wait_for(lambda: fast.count == 5)
    releaser = threading.Timer(0.15, gate.set)  # close() joins the stuck sender: let it go soon
    releaser.start()
    try:
        assert ch.close(0.05)
    finally:
        releaser.join()


def test_back_pressure_with_two_slow_replicas(harness):
    t0, t1 = FakeTransport(delay=0.05), FakeTransport(delay=0.05)
    ch = harness.channel([t0, t1], batch_size=1, max_ready=2)
    start = time.monotonic()
    for i in range(8):
        ch.emit(i)
    elapsed = time.monotonic() - start
    # emit j waits until batch j-2 is sent (at ~(j-1) x 50 ms): the last one at ~300 ms
    assert elapsed >= 0.25, f"8 emits took {elapsed:.3f}s: no back-pressure"
    assert ch.close(3)
    assert t0.pairs == t1.pairs == [(i, i) for i in range(8)]


def test_back_pressure_follows_the_fastest_live_replica_step_by_step(harness):
    """Transports send one batch per permit: the emitter advances exactly as far as the fastest
    replica's backlog (sealed batches not yet sent, the one in flight included) allows."""
    sem0, sem1 = harness.semaphore(), harness.semaphore()
    t0, t1 = FakeTransport(permits=sem0), FakeTransport(permits=sem1)
    ch = harness.channel([t0, t1], batch_size=1, max_ready=3)
    em = harness.emitter(ch, range(12))

    def settles_at(n: int) -> bool:
        if not _wait_for(lambda: em.emitted >= n):
            return False
        time.sleep(0.05)  # and goes no further
        return em.emitted == n

    assert settles_at(3), em.emitted  # nothing sent: max_ready batches waiting, emit blocks
    sem0.release()  # replica 0 sends batch 0
    assert settles_at(4), em.emitted
    sem1.release(2)  # replica 1 overtakes: batches 0 and 1 sent, its backlog is 2
    assert settles_at(5), em.emitted
    sem1.release(3)
    assert settles_at(8), em.emitted
    assert ch.live_replicas == [0, 1]  # a lag of 4-5 batches is far below the default lag_limit
    sem0.release(10_000)
    sem1.release(10_000)
    assert em.done(3) and em.error is None
    assert ch.close(3)
    assert t0.pairs == t1.pairs == [(i, i) for i in range(12)]


def test_two_upstream_replicas_with_different_batching_feed_one_receiver_exactly_once(harness):
    """End to end: both replicas of an upstream partition emit the same sequence through their own
    channel (different batch sizes and timeouts); the receiver's dedup delivers each seq once, in order."""
    receiver = Dedup()
    delivered: list[int] = []
    lock = threading.Lock()

    def receive(payload: bytes) -> None:
        h = batch_format.decode_header(payload)
        with lock:
            a = receiver.admit(h.channel, h.first_seq, h.count)
            assert a.gap == 0
            delivered.extend(batch_format.decode_elements(payload, h)[a.start:a.stop])

    spec = ChannelSpec(77, 1, 0, 0, 2, 3)  # the same channel id on both upstream replicas
    ch_a = OutputChannel(spec, [receive], batch_size=7, buffer_timeout_s=0.002)
    ch_b = OutputChannel(spec, [receive], batch_size=3, buffer_timeout_s=0.004)
    harness.channels += [ch_a, ch_b]
    em_a = harness.emitter(ch_a, range(600))
    em_b = harness.emitter(ch_b, range(600))
    assert em_a.done(3) and em_b.done(3)
    assert ch_a.close(3) and ch_b.close(3)
    assert delivered == list(range(600))
    assert receiver.dropped == 600 and receiver.gaps == 0
