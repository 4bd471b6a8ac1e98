"""LiveRobin's heartbeat log rules and pulse placement at replicated sources (pure)."""

from __future__ import annotations

import contextlib
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liverobin import LiveRobinOrderer, PulseLog, PulsePlacer, PulseRecord, next_pulse
from liverobin.positions import PositionBoard
from liverobin.reader import PulseReader
from liverobin.segments import HeartbeatLog
from merge import InputQueues
from merge.queues import QueuesClosed
from replication.runtime.elements import DATA, END_ELEMENT, pulse

T = "payments"


def rec(h: int, offset: int | None, final: bool = False) -> PulseRecord:
    return PulseRecord(h, {T: {0: offset}} if offset is not None else {}, final)


def test_record_round_trip_and_malformed_records():
    r = PulseRecord(7, {T: {0: 12, 1: 30}, "b": {0: 0}}, final=True, generator="g2")
    assert PulseRecord.decode(r.encode()) == r
    for bad in (b"", b"{", b'{"h": 0, "o": {}}', b'{"h": "x", "o": {}}', b'{"o": {}}', b'{"h": 3, "o": []}', None):
        with pytest.raises(ValueError, match="malformed heartbeat record"):
            PulseRecord.decode(bad)


def test_first_record_of_each_h_wins_and_offsets_never_go_back():
    log = PulseLog()
    assert log.accept(rec(1, 10)).offsets == {T: {0: 10}}
    assert log.accept(rec(1, 50)) is None  # a second generator's h=1: ignored by every reader
    assert log.accept(rec(3, 5)).offsets == {T: {0: 10}}  # a lagging generator: raised to 10
    assert log.accept(rec(2, 99)) is None  # h went back
    assert log.accept(PulseRecord(4, {"other": {0: 1}})).offsets == {T: {0: 10}, "other": {0: 1}}
    assert log.accept(rec(5, 20, final=True)).final
    assert log.accept(rec(6, 30)) is None and log.last_h == 5  # nothing counts after the final pulse
    assert log.ignored == 3


def test_next_pulse_continues_after_the_largest_h_and_cuts_a_backlog_into_steps():
    log = PulseLog()
    r, behind = next_pulse(log, {T: {0: 2500}}, max_step=1000, starts={T: {0: 0}})
    assert (r.h, r.offsets, behind) == (1, {T: {0: 1000}}, True)
    log.accept(r)
    log.accept(rec(5, 1000))  # another generator got further in h
    r, behind = next_pulse(log, {T: {0: 2500}}, max_step=1000, final=True)
    assert (r.h, r.offsets[T][0], behind, r.final) == (6, 2000, True, False)  # not final while behind
    log.accept(r)
    r, behind = next_pulse(log, {T: {0: 2500}}, max_step=1000, final=True)
    assert (r.offsets[T][0], behind, r.final) == (2500, False, True)
    r, _ = next_pulse(log, {T: {0: 1500}}, max_step=1000)  # a stale end offset never moves back
    assert r.offsets[T][0] == 2000


def test_placer_holds_records_until_a_pulse_lies_beyond_them():
    p = PulsePlacer(T, 0)
    p.add_record(0, "r0")
    p.add_record(1, "r1")
    assert list(p.take()) == [] and p.held == 2  # no pulse known: r1 might have one before it
    p.add_pulse(rec(1, 1))
    assert list(p.take()) == [("record", "r0"), ("pulse", (1, False, 0))] and p.held == 1
    p.add_pulse(rec(2, 3))
    assert list(p.take()) == [("record", "r1")]  # offset 2 not fetched yet: pulse 2 waits
    p.fetched(3)  # offset 2 was a transaction marker: nothing below 3 is missing
    assert list(p.take()) == [("pulse", (2, False, 0))]
    p.add_pulse(rec(3, 3, final=True))
    p.add_pulse(rec(4, 3))
    assert list(p.take()) == [("pulse", (3, True, 0))] and p.ended  # nothing after the final pulse


def test_placer_says_when_its_next_pulse_waits_for_records_to_be_fetched():
    """An idle source waits for pulses, not records; once a pulse lies beyond what it fetched, it
    must wait for the records instead (or the pulse waits a whole idle wait for them)."""
    p = PulsePlacer(T, 0, fetched_to=5)
    assert not p.needs_records  # no pulse known
    p.add_pulse(rec(1, 5))
    assert not p.needs_records  # everything below it fetched
    assert list(p.take()) == [("pulse", (1, False, 0))]
    p.add_pulse(rec(2, 8))
    assert p.needs_records  # offsets 5..7 still to come
    p.add_record(5, "r5")
    assert not p.needs_records  # a record to place first
    assert list(p.take()) == [("record", "r5")] and p.needs_records
    p.fetched(8)
    assert not p.needs_records and list(p.take()) == [("pulse", (2, False, 0))]


def test_placer_of_an_idle_partition_emits_every_pulse():
    p = PulsePlacer(T, 0, fetched_to=40)
    for h in range(1, 4):
        p.add_pulse(rec(h, 40))
    assert list(p.take()) == [("pulse", (1, False, 0)), ("pulse", (2, False, 0)), ("pulse", (3, False, 0))]


@st.composite
def partition_and_log(draw):
    n = draw(st.integers(0, 60))
    offsets = sorted(draw(st.sets(st.integers(0, 200), min_size=n, max_size=n)))  # gaps: markers
    end = (offsets[-1] + 1) if offsets else 0
    log = []
    for h in range(1, draw(st.integers(1, 12)) + 1):
        log.append(PulseRecord(draw(st.integers(1, h + 2)), {T: {0: draw(st.integers(0, end))}}))
    return offsets, log, end


def _place(offsets, log, end, rnd: random.Random) -> list:
    """One replica: records and log records interleaved at random, random fetch positions."""
    placer, counted, out = PulsePlacer(T, 0), PulseLog(), []
    recs, logq = list(offsets), list(log)
    while recs or logq:
        if recs and (not logq or rnd.random() < 0.5):
            placer.add_record(recs[0], recs[0])
            recs.pop(0)
        else:
            c = counted.accept(logq.pop(0))
            if c is not None:
                placer.add_pulse(c)
        out += placer.take()
    placer.fetched(end)
    return out + list(placer.take())


@settings(max_examples=300, deadline=None)
@given(partition_and_log(), st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_both_replicas_place_every_pulse_at_the_same_position(case, rnd_a, rnd_b):
    offsets, log, end = case
    a, b = _place(offsets, log, end, rnd_a), _place(offsets, log, end, rnd_b)
    assert a == b
    # and at the right place: pulse h right after the records below its (counted) offset
    counted = PulseLog()
    for r in log:
        c = counted.accept(r)
        if c is not None:
            i = a.index(("pulse", (c.h, False, 0)))
            assert {x for k, x in a[:i] if k == "record"} == {o for o in offsets if o < c.offsets[T][0]}


@st.composite
def multi_partition_log(draw):
    """Records of two generators for two partitions (some late, some omitting a partition, one
    maybe final), each with the log offset it was read at."""
    log = []
    for at in range(draw(st.integers(1, 30))):
        offsets = {T: {k: draw(st.integers(0, 100)) for k in draw(st.sets(st.integers(0, 1), max_size=2))}}
        log.append(PulseRecord(draw(st.integers(1, at + 3)), offsets, draw(st.booleans()) and at > 20, at=at))
    return log


def _counted(log_: PulseLog, records) -> list:
    return [c for r in records if (c := log_.accept(r)) is not None]


@settings(max_examples=300, deadline=None)
@given(multi_partition_log(), st.data())
def test_counting_resumed_after_a_counted_record_counts_what_the_whole_log_counts(log, data):
    """A restored source reads the log from right after the last pulse it placed: the pulses it
    counts from there are those a reader from the start counts after that pulse, offsets too."""
    whole = _counted(PulseLog(), log)
    cut = data.draw(st.integers(0, len(whole) - 1))
    resumed = _counted(PulseLog.after(whole[cut]), [r for r in log if r.at > whole[cut].at])
    assert [(c.h, c.offsets, c.final, c.at) for c in resumed] == [(c.h, c.offsets, c.final, c.at)
                                                                   for c in whole[cut + 1:]]


def test_a_reader_for_a_restored_source_starts_right_after_the_pulse_its_checkpoint_placed():
    log = HeartbeatLog("hb", per_segment=100)
    placed = PulseLog().accept(PulseRecord(109, {T: {0: 30, 1: 12}}, at=140))
    reader = PulseReader(log, {"bootstrap.servers": "unused"}, after=placed)
    assert reader.cursor.positions() == {"hb.1": 141, "hb.2": 0}
    assert reader.pulses.last_h == 109 and reader.pulses.offsets == {T: {0: 30, 1: 12}}
    assert PulseReader(log, {}).cursor.positions() == {"hb.0": 0, "hb.1": 0}  # none: from this run's start


def test_pulses_handed_over_ring_the_subscriptions_that_wait_on_something_else_too():
    """A source waits on its records and is woken by pulses through ``on_pulse``: every hand-over
    (and a failure of the reader) rings it, after the pulses are there to take."""
    reader = PulseReader(HeartbeatLog("hb"), {"bootstrap.servers": "unused"})
    rung, quiet = reader.subscribe(), reader.subscribe()
    seen: list[list[PulseRecord] | str] = []
    rung.on_pulse = lambda: seen.append(rung.take() if reader.error is None else "error")
    pulse_record = PulseLog().accept(PulseRecord(1, {T: {0: 3}}, at=0))
    reader._hand_over([pulse_record])
    assert seen == [[pulse_record]]
    assert quiet.take() == [pulse_record]
    reader._fail(RuntimeError("broker gone"))
    assert seen[1:] == ["error"]  # rung again: its take raises the reader's error from now on
    with pytest.raises(RuntimeError, match="broker gone"):
        rung.take()


def test_the_placer_names_the_counted_record_of_the_last_pulse_taken():
    p = PulsePlacer(T, 0)
    p.add_record(0, "r0")
    p.add_pulse(PulseLog().accept(PulseRecord(1, {T: {0: 1}}, at=7)))
    assert p.last_placed is None
    assert list(p.take()) == [("record", "r0"), ("pulse", (1, False, 0))]
    assert p.last_placed.h == 1 and p.last_placed.at == 7


def test_orderer_feeds_the_merge_from_per_channel_queues():
    with pytest.raises(ValueError, match="per-channel"):
        LiveRobinOrderer(InputQueues([0, 1], 4))
    q = InputQueues([0, 1], 4, per_channel=True)
    o = LiveRobinOrderer(q)
    q.put(1, [(DATA, "b1"), pulse(1)])
    assert o.next_runs(0.01) == []  # channel 0's turn: nothing consumed out of order
    q.put(0, [(DATA, "a1"), (DATA, "a2"), pulse(1), END_ELEMENT])
    runs = o.next_runs(0.01)  # round robin per element; then channel 1's turn again (END waits)
    assert runs == [(0, [(DATA, "a1")]), (1, [(DATA, "b1")]), (0, [(DATA, "a2")]), (1, [pulse(1)]), (0, [pulse(1)])]
    assert o.gen == 1 and q.size() == 0 and o.merge.blocked_on == 1


def _cross_fed(cycles: int, per_cycle: int, capacity: int, timeout_s: float) -> list[int]:
    """Two upstreams each feeding two LiveRobin downstreams (hash partitioning, skewed) through
    bounded per-channel queues: per cycle, ``per_cycle`` one-element batches to its near downstream,
    then one to the far one.  Elements each downstream consumed within ``timeout_s``."""
    #     (downstream, channel): near first        D0 reads channels 0 (U0), 1 (U1); D1 2 (U1), 3 (U0)
    channels = {"U0": [(0, 0), (1, 3)], "U1": [(1, 2), (0, 1)]}
    queues = [InputQueues([0, 1], capacity, per_channel=True), InputQueues([2, 3], capacity, per_channel=True)]
    orderers = [LiveRobinOrderer(q) for q in queues]
    consumed = [0, 0]

    def upstream(name: str) -> None:
        with contextlib.suppress(QueuesClosed):
            (near, near_ch), (far, far_ch) = channels[name]
            for h in range(1, cycles + 1):  # most of the cycle to one downstream, then one to the other
                for i in range(per_cycle):
                    queues[near].put(near_ch, [(DATA, f"{name}-{h}-{i}")])
                queues[far].put(far_ch, [(DATA, f"{name}-{h}-far")])
                for d, ch in channels[name]:
                    queues[d].put(ch, [pulse(h)])
            for d, ch in channels[name]:
                queues[d].put(ch, [END_ELEMENT])

    def downstream(d: int) -> None:
        while not orderers[d].merge.finished and not queues[d].closed:
            for _, elements in orderers[d].next_runs(0.05):
                consumed[d] += len(elements)

    threads = [threading.Thread(target=upstream, args=(n,), daemon=True) for n in channels]
    threads += [threading.Thread(target=downstream, args=(d,), daemon=True) for d in (0, 1)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for q in queues:
        q.close()
    return consumed


def test_a_cycle_larger_than_the_queues_cannot_deadlock_a_cross_fed_merge():
    """D0 waits for U0's cycle while U0 waits for room at D1, which waits for U1's cycle while U1
    waits for room at D0: with bounded queues alone, a cycle bigger than a queue stops all four for
    good (seen after restores, when one pulse cycle carried many batches).  A merge waiting for one
    channel takes the current cycle of the others in, so every upstream can finish its cycle."""
    cycles, per_cycle = 5, 20
    expected = cycles * (per_cycle + 1) + cycles * 2 + 2  # near: data, pulse; far: one datum, pulse; ENDs
    assert _cross_fed(cycles, per_cycle, capacity=2, timeout_s=20) == [expected, expected]


# ---------------------------------------------------------------------------------- KaZoo windows


def test_window_records_round_trip_and_keep_their_tags_when_counted():
    r = PulseRecord(4, {T: {0: 9}}, window=3, last=True)
    assert PulseRecord.decode(r.encode()) == r
    counted = PulseLog().accept(r)
    assert counted is not None and (counted.window, counted.last) == (3, True)


def test_a_window_pulse_is_never_below_the_floor_even_long_after_the_last_pulse():
    """The sources emitted everything below their reported positions before they held: the first
    pulse of a window may not go there, however far the log's last pulse is behind (max_step)."""
    log = PulseLog()
    log.accept(rec(1, 10))
    record, behind = next_pulse(log, {T: {0: 12}}, max_step=5, floor={T: {0: 500}}, window=2)
    assert record.offsets[T][0] == 500 and not behind and record.window == 2 and record.h == 2
    record, _ = next_pulse(log, {T: {0: 900}}, max_step=5, floor={T: {0: 500}})
    assert record.offsets[T][0] == 505  # the backlog above the floor is still cut into steps
    record, _ = next_pulse(PulseLog(), {T: {0: 3}}, max_step=5, floor={T: {0: 7}})
    assert record.offsets[T][0] == 7  # a partition no pulse named yet


def test_pulse_windows_hold_from_the_announcement_to_the_last_pulse_of_the_window():
    from liverobin.windows import HOLD, LEAVE, PulseWindows

    w = PulseWindows()
    assert not w.admits(PulseRecord(1, {}, window=1))  # not holding: nothing to place
    assert w.announce(1, True, False) == HOLD
    assert w.announce(1, True, False) == ""  # repeated in every heartbeat reply
    assert not w.admits(PulseRecord(2, {}, window=7))  # another window's
    assert w.admits(PulseRecord(3, {}, window=1)) and not w.placed(3)
    assert w.admits(PulseRecord(4, {}, window=1, last=True))
    assert not w.admits(PulseRecord(5, {}, window=1))  # after the last one (a second generator's)
    assert w.announce(1, False, True) == ""  # closed: leave at the last pulse, not now
    assert w.placed(4) and w.current is None
    assert w.announce(1, True, False) == ""  # a stale reply: a window left is never entered again
    assert w.announce(2, False, False) == ""  # closed before this replica saw it open
    assert w.announce(2, True, False) == ""
    assert w.announce(3, True, False) == HOLD
    assert w.announce(3, False, False) == LEAVE  # closed before any pulse was written


def test_a_replica_in_a_window_enters_a_window_announced_meanwhile_only_once_it_left_the_first():
    from liverobin.windows import HOLD, PulseWindows

    w = PulseWindows()
    assert w.announce(1, True, False) == HOLD
    assert w.announce(2, True, False) == ""  # still placing window 1's pulses: 2 waits
    assert w.admits(PulseRecord(5, {}, window=1, last=True)) and w.placed(5)
    assert w.take_pending() and w.current == 2 and w.handled == 2
    assert not w.take_pending()
    w2 = PulseWindows()
    w2.announce(1, True, False)
    w2.announce(2, True, False)
    w2.announce(2, False, False)  # closed before any pulse was written: nothing to enter later
    assert w2.admits(PulseRecord(5, {}, window=1, last=True)) and w2.placed(5)
    assert not w2.take_pending() and w2.announce(2, True, False) == ""  # a stale word for it


def test_a_restored_replica_enters_the_windows_of_the_log_after_the_ones_it_handled():
    from liverobin.windows import PulseWindows

    w = PulseWindows()
    w.restore(None, 3)  # its checkpoint: out of any window, windows up to 3 handled
    assert not w.enter_from_log(PulseRecord(9, {}, window=3))  # behind it
    assert w.enter_from_log(PulseRecord(10, {}, window=4)) and w.current == 4
    assert not w.enter_from_log(PulseRecord(11, {}, window=5))  # one window at a time
    assert w.admits(PulseRecord(10, {}, window=4)) and w.admits(PulseRecord(12, {}, window=4, last=True))
    assert not w.admits(PulseRecord(13, {}, window=4))  # after its last pulse
    assert w.placed(12) and w.state() == (None, 4)
    restored = PulseWindows()
    restored.restore(4, 4)  # restored inside window 4: its last pulse is read from the log again
    assert restored.admits(PulseRecord(12, {}, window=4, last=True)) and restored.end_h == 12


def test_a_window_closed_with_pulses_that_a_replica_has_not_placed_is_entered_from_the_log():
    """A replica restored from before windows 5 and 6 (or still placing window 4) hears that 6
    closed with pulses written: it has not placed them yet, so it must not count 6 as handled.
    Its twin placed them, and the log says where; marking it handled left the replica without
    them, and its downstreams and checkpoints diverged (the fault soak with handovers)."""
    from liverobin.windows import PulseWindows

    restored = PulseWindows()
    restored.restore(None, 4)
    assert restored.enter_from_log(PulseRecord(20, {}, window=5))
    assert restored.announce(6, False, True) == ""  # the driver's latest word, while it replays 5
    assert restored.admits(PulseRecord(21, {}, window=5, last=True)) and restored.placed(21)
    assert restored.handled == 5
    assert restored.enter_from_log(PulseRecord(22, {}, window=6, last=True)) and restored.current == 6
    lagging = PulseWindows()
    assert lagging.announce(4, True, False) == "hold"
    assert lagging.announce(5, False, True) == ""  # 5 opened and closed while it still placed 4
    assert lagging.admits(PulseRecord(9, {}, window=4, last=True)) and lagging.placed(9)
    assert lagging.enter_from_log(PulseRecord(10, {}, window=5))
    closed_empty = PulseWindows()
    assert closed_empty.announce(7, False, False) == ""  # no pulse: nothing to place
    assert closed_empty.announce(7, True, False) == "" and closed_empty.current is None  # a stale word for it



def test_a_window_announced_while_placing_another_and_then_entered_from_the_log_is_not_held_again():
    """A replica restored inside window 1 hears that 2 is open while it still places 1; by the
    time it left 1, window 2's pulses are in the log, so it enters 2 from there and places
    them.  Holding for 2 again after that waits for pulses that were all placed: the replica
    held its records for good, window 3 never saw it hold, and the job could not drain (the
    KaZoo fault soak with handovers)."""
    from liverobin.windows import HOLD, PulseWindows

    w = PulseWindows()
    w.restore(1, 1)
    assert w.announce(2, True, False) == ""  # still placing 1: 2 is pending
    assert w.admits(PulseRecord(5, {}, window=1, last=True)) and w.placed(5)
    assert w.enter_from_log(PulseRecord(6, {}, window=2))
    assert w.admits(PulseRecord(7, {}, window=2, last=True)) and w.placed(7)
    assert not w.take_pending() and w.current is None and w.handled == 2
    assert w.announce(3, True, False) == HOLD  # the next window is held for at once



def test_a_source_replicas_windows_are_described_for_events_and_reports():
    from replication.metrics import InstanceMetrics, window_text

    assert window_text(InstanceMetrics()) == ""  # not a KaZoo source, or no window yet
    stuck = InstanceMetrics(window=(2, 2, 3), held_records=417)
    assert window_text(stuck) == "in window 2 (3 announced meanwhile), windows up to 2 handled, 417 record(s) held"
    assert window_text(InstanceMetrics(window=(-1, 4, -1))) == \
        "in no window, windows up to 4 handled, 0 record(s) held"
    from replication.metrics import drain_text

    assert drain_text(InstanceMetrics()) == ""
    assert drain_text(InstanceMetrics(drain=({0: 12}, {}, {}))) == \
        "drain: reads at {0: 12}, reported nothing yet, ends at not settled"
    assert drain_text(InstanceMetrics(drain=({0: 12}, {0: 12}, {0: 14}))) == \
        "drain: reads at {0: 12}, reported {0: 12}, ends at {0: 14}"



@st.composite
def window_history(draw):
    """The driver's words and the log's pulses of a run of KaZoo pulse windows, in the order they
    happen: each window opens, then gets 1-3 pulses (the last marked) and closes, or closes before
    any pulse was written."""
    events: list = []
    h = pulsed = 0
    for w in range(1, draw(st.integers(1, 5)) + 1):
        events.append(("word", (w, True, False, pulsed)))
        pulses = draw(st.integers(0, 3))
        for i in range(pulses):
            h += 1
            events.append(("pulse", PulseRecord(h, {}, window=w, last=i == pulses - 1)))
        pulsed = w if pulses else pulsed
        events.append(("word", (w, False, pulses > 0, pulsed)))
    return events


class _WindowedSource:
    """A KaZoo source replica's window handling as ``SourceInstance.run`` drives it, records always
    at hand (so a pulse given to the placer is placed at once); ``inbox``: the pulses its reader
    has read and not handed out yet (``take`` hands them all out, as ``PulseReader.take`` does)."""

    def __init__(self, windows):
        from liverobin.windows import PulseWindows

        self.windows: PulseWindows = windows
        self.holding = False  # a placer is out: records wait for pulses
        self.placed: list[int] = []
        self.word = None
        self.inbox: list = []

    def take(self) -> list:
        out, self.inbox = self.inbox, []
        return out

    def place(self) -> None:
        for record in self.windows.to_place():
            self.placed.append(record.h)
            if self.windows.placed(record.h):
                break
        if self.holding and self.windows.current is None:  # its last pulse is out
            if self.windows.enter_queued():
                self.place()
            else:
                self.holding = False

    def loop(self, word) -> None:
        from liverobin.windows import HOLD, LEAVE

        w = self.windows
        if not self.holding:
            w.queue(self.take())
        if not self.holding and (w.later or w.pending):
            entered = w.next_window()
            if entered:
                self.holding = True
                if entered == HOLD:
                    w.queue(self.take())
                self.place()
        if word is not None and word != self.word:
            self.word = word
            action = w.announce(*word)
            if action == LEAVE:
                self.holding = False
                action = w.announce(*word)
            if action == HOLD:
                self.holding = True
                w.queue(self.take())
                self.place()
        if self.holding:
            w.queue(self.take())
            self.place()


@settings(max_examples=300, deadline=None)
@given(window_history(), st.data())
def test_a_restored_source_replica_places_every_window_of_the_log_once_and_ends_out_of_any(events, data):
    """A replica restored from its twin's checkpoint at any point of a run of windows, hearing the
    driver's latest word and reading the log at any pace in between, places exactly the pulses
    its twin placed after that checkpoint, in order, and ends holding nothing."""
    from liverobin.windows import PulseWindows

    twin = _WindowedSource(PulseWindows())
    # where its checkpoints may be: out of any window, or right after a pulse (records only go out
    # around pulses inside a window): event index -> (windows, last pulse placed)
    states = {0: (twin.windows.state(), 0)}
    for i, (kind, item) in enumerate(events, start=1):
        if kind == "pulse":
            twin.inbox.append(item)
        twin.loop(item if kind == "word" else twin.word)
        if kind == "pulse" or not twin.holding:
            states[i] = (twin.windows.state(), twin.placed[-1] if twin.placed else 0)
    assert not twin.holding and twin.windows.current is None
    checkpoint = data.draw(st.sampled_from(sorted(states)), label="checkpoint after event")
    (current, handled), after_pulse = states[checkpoint]
    restored_at = data.draw(st.integers(checkpoint, len(events)), label="restored after event")
    windows = PulseWindows()
    windows.restore(current, handled)
    windows.after_pulse = after_pulse
    replica = _WindowedSource(windows)
    happened, later = events[:restored_at], events[restored_at:]
    windows.queue([item for kind, item in happened if kind == "pulse"])  # the log to its end first
    if current is not None:
        replica.holding = True
        replica.place()
    unread: list = []  # written, not read yet
    while later or unread or replica.word != _latest_word(happened):
        steps = (["event"] if later else []) + (["read"] if unread else []) + ["loop"]
        step = data.draw(st.sampled_from(steps))
        if step == "event":
            kind, item = later.pop(0)
            happened.append((kind, item))
            if kind == "pulse":
                unread.append(item)
        elif step == "read":
            replica.inbox.append(unread.pop(0))
        else:
            replica.loop(_latest_word(happened))
    for _ in range(3):
        replica.loop(_latest_word(happened))
    assert replica.placed == [h for h in twin.placed if h > after_pulse]
    assert not replica.holding and windows.current is None and windows.pending is None


def _latest_word(happened: list):
    return next((item for kind, item in reversed(happened) if kind == "word"), None)


class _RecordingConsumer:
    """A consumer that reads nothing and records what it was assigned."""

    made: list[_RecordingConsumer] = []

    def __init__(self, conf: dict) -> None:
        self.assigned: set[str] = set()
        _RecordingConsumer.made.append(self)

    def assign(self, tps: list) -> None:
        self.assigned |= {tp.topic for tp in tps}

    def pause(self, tps: list) -> None:
        pass

    def resume(self, tps: list) -> None:
        pass

    def poll(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.005))

    def consume(self, num_messages: int = 1, timeout: float = 0) -> list:
        return []

    def get_watermark_offsets(self, tp, cached: bool = False) -> tuple[int, int]:
        return (0, -1)

    def close(self) -> None:
        pass


def test_the_generator_reads_no_source_data_and_places_pulses_at_reported_positions(monkeypatch):
    """The driver fetches nothing from the sources (its cost would grow with the input): pulses go
    where the source replicas say records exist, the furthest report of each partition, and the
    first pulse waits until every partition was reported (it names them all)."""
    from liverobin import generator as gen_module

    _RecordingConsumer.made = []
    written: list[PulseRecord] = []
    monkeypatch.setattr(gen_module, "Consumer", _RecordingConsumer)
    monkeypatch.setattr(_RecordingConsumer, "get_watermark_offsets", lambda self, tp, cached=False: (0, 0))
    monkeypatch.setattr(gen_module, "Producer", lambda conf: type("P", (), {
        "poll": lambda s, t: 0, "flush": lambda s, t: 0,
        "produce": lambda s, topic, value, key, partition, on_delivery: written.append(PulseRecord.decode(value)),
    })())
    board = PositionBoard()
    board.update([("payments", 0, 0, 7), ("payments", 1, 0, 3)])
    board.update([("payments", 0, 0, 5)])  # the twin, behind: the furthest report counts
    log_ = HeartbeatLog("hb")
    gen = gen_module.HeartbeatGenerator(name="g", heartbeat_log=log_, sources={"payments": [0, 1], "refunds": [0]},
                                        positions=board, starts={}, period_s=0.01, max_step=10, consumer_conf={},
                                        producer_conf={}, create_topics=lambda topics: None).start()
    time.sleep(0.2)
    assert not written  # refunds[0] not reported yet
    board.update([("refunds", 0, 2, 2)])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not written:
        time.sleep(0.01)
    gen.kill()
    assert gen.error is None
    assert written[0].offsets == {"payments": {0: 7, 1: 3}, "refunds": {0: 2}}
    assigned = set().union(*(c.assigned for c in _RecordingConsumer.made))
    assert assigned and assigned <= {log_.topic(0), log_.topic(1)}


class _EchoLog:
    """A heartbeat log in memory: what the fake producer writes, the fake consumer reads back."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, float]] = []  # (topic, value, when written)
        self.lock = threading.Lock()

    def producer(self, conf: dict):
        log_ = self

        class Producer:
            def poll(self, timeout: float) -> int:
                return 0

            def flush(self, timeout: float) -> int:
                return 0

            def produce(self, topic, value, key, partition, on_delivery) -> None:
                with log_.lock:
                    log_.records.append((topic, value, time.monotonic()))

        return Producer()

    def consumer(self, conf: dict):
        log_ = self

        class Message:
            def __init__(self, topic: str, offset: int, value: bytes) -> None:
                self._t, self._o, self._v = topic, offset, value

            def topic(self) -> str:
                return self._t

            def offset(self) -> int:
                return self._o

            def value(self) -> bytes:
                return self._v

            def error(self) -> None:
                return None

        class Consumer(_RecordingConsumer):
            read = 0

            def poll(self, timeout: float):
                got = self.consume(1, timeout)
                return got[0] if got else None

            def consume(self, num_messages: int = 1, timeout: float = 0) -> list:
                with log_.lock:
                    new = log_.records[self.read:self.read + num_messages]
                if not new:
                    time.sleep(min(timeout, 0.005))
                    return []
                start, self.read = self.read, self.read + len(new)
                return [Message(t, start + i, v) for i, (t, v, _) in enumerate(new)]

            def get_watermark_offsets(self, tp, cached: bool = False) -> tuple[int, int]:
                return (0, self.read)

        return Consumer(conf)


def test_an_eager_generator_writes_a_pulse_that_places_nothing_new_at_most_every_eager_gap(monkeypatch):
    """While a handover waits for pulses the generator writes them although no source grows, but
    no more often than every EAGER_PULSE_EVERY_S: every pulse costs each replica of the job, and
    one every period saturated a loaded job.  Once no longer eager, once a second again."""
    from liverobin import generator as gen_module

    echo = _EchoLog()
    monkeypatch.setattr(gen_module, "Consumer", echo.consumer)
    monkeypatch.setattr(gen_module, "Producer", echo.producer)
    board = PositionBoard()
    board.update([("payments", 0, 0, 7)])  # reported once: nothing grows after the first pulse
    gen = gen_module.HeartbeatGenerator(name="g", heartbeat_log=HeartbeatLog("hb"), sources={"payments": [0]},
                                        positions=board, starts={}, period_s=0.01, max_step=10, consumer_conf={},
                                        producer_conf={}, create_topics=lambda topics: None).start()
    try:
        _wait_for(lambda: len(echo.records) >= 1)
        gen.eager(30.0)
        _wait_for(lambda: len(echo.records) >= 8)
        gen.eager(0)
        stopped = time.monotonic()
        with echo.lock:
            eager_at = [when for _, _, when in echo.records[1:8]]
        time.sleep(0.5)
        with echo.lock:  # (one decided just before eager(0) may still come)
            after = [when for _, _, when in echo.records if when > stopped + 0.02]
    finally:
        gen.kill()
    assert gen.error is None
    gaps = [b - a for a, b in zip(eager_at, eager_at[1:], strict=False)]
    assert min(gaps) >= gen_module.EAGER_PULSE_EVERY_S - 0.005, gaps  # not one a period (10 ms)
    assert not after  # idle again: one a second at most


def _wait_for(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_pulse_carries_its_generators_clock_through_the_log_and_the_placer():
    log = PulseLog()
    record, _ = next_pulse(log, {T: {0: 5}}, max_step=10, starts={T: {0: 0}}, now_ms=1_700_000_000_123)
    read = PulseRecord.decode(record.encode(), at=7)
    assert read.t == 1_700_000_000_123 and log.accept(read).t == read.t
    assert PulseRecord.decode(PulseRecord(1, {T: {0: 1}}).encode()).t == 0  # unstamped, as earlier versions wrote
    p = PulsePlacer(T, 0)
    p.add_pulse(read)
    p.fetched(10)
    assert list(p.take()) == [("pulse", (1, False, 1_700_000_000_123))]


def test_a_windowed_generator_is_ready_before_its_window_and_stops_fetching_outside_it(monkeypatch):
    """KaZoo's generator runs from the job's start: outside a window it reads the log to its end,
    makes the next segments' topics and pauses its reading of the log, so that a window's first
    pulse (every source holds its records until then) waits for neither; once the window's last
    pulse is counted it pauses again."""
    from liverobin import generator as gen_module

    echo = _EchoLog()
    paused: list[bool] = []

    def consumer(conf: dict):
        made = echo.consumer(conf)
        made.pause = lambda tps: paused.append(True)
        made.resume = lambda tps: paused.append(False)
        made.seek = lambda tp: None
        made.position = lambda tps: tps
        return made

    monkeypatch.setattr(gen_module, "Consumer", consumer)
    monkeypatch.setattr(gen_module, "Producer", echo.producer)
    created: list[str] = []
    board = PositionBoard()
    log_ = HeartbeatLog("hb")
    gen = gen_module.HeartbeatGenerator(name="g", heartbeat_log=log_, sources={"payments": [0]},
                                        positions=board, starts={}, period_s=0.01, max_step=10, consumer_conf={},
                                        producer_conf={}, create_topics=created.extend, windowed=True).start()
    try:
        _wait_for(lambda: paused[-1:] == [True])
        assert log_.topic(0) in created and log_.topic(2) in created and not echo.records
        made = list(created)
        gen.open_window(1, {"payments": {0: 7}})
        _wait_for(lambda: len(echo.records) >= 2)
        assert created == made  # nothing left to make before the first pulse
        assert gen.close_window(timeout=10) is not None
        _wait_for(lambda: paused[-1:] == [True])
    finally:
        gen.kill()
    assert gen.error is None
    pulses = [PulseRecord.decode(value) for _, value, _ in echo.records]
    assert pulses[0].window == 1 and pulses[0].offsets == {"payments": {0: 7}} and pulses[-1].last
    assert paused.count(False) >= 1  # read again once the window's first pulse was out
