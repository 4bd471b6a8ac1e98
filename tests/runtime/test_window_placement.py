"""A KaZoo source replica's pulse windows placed by the partition's order (runtime.window_placement), pure.

The property: two replicas of a source partition, each holding for a window from its own
position, reading records, the window's pulses and the order log at any pace, with the leader
kept, replaced while it follows on, or dead, and each window's end marked on its last pulse or
told later (a next window's pulse in the heartbeat log): both emit the same sequence, every
record and pulse once, records in offset order, and each window's pulses where the other put them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from kazoo_leader.orders import Order
from kazoo_leader.window_order import WindowRecord
from liverobin.heartbeats import PULSE_ITEM, RECORD_ITEM, PulseRecord
from replication.runtime.window_placement import ORDERED_ITEM, WindowOrders, WindowPlacer

TOPIC, PARTITION = "in", 0


class _Replica:
    """What a source replica does with its placer (replication.runtime.source and source_windows)."""

    def __init__(self, name, n_records, windows):
        self.name, self.windows = name, windows  # windows: [pulses, or None until written]
        self.orders = WindowOrders(max_batch=3, idle_timeout_s=0)
        self.now = 0.0
        self.next_offset = 0
        self.n_records = n_records
        self.window = 0  # index of the next or current window
        self.placer: WindowPlacer | None = None
        self.given = 0  # pulses of the current window given to the placer
        self.end_h: int | None = None
        self.read_log = 0
        self.emitted: list = []
        self.alive = True

    def clock(self):
        return self.now

    # -- actions ---------------------------------------------------------------------------
    def can_hold(self):
        return self.placer is None and self.window < len(self.windows)

    def hold(self):
        """The driver opened the next window: hold from here (the window's start is at or beyond)."""
        self.placer = WindowPlacer(TOPIC, PARTITION, self.next_offset, self.orders, self.clock)
        self.given, self.end_h = 0, None

    def can_read(self):
        return self.next_offset < self.n_records

    def read_record(self):
        self.now += 1
        offset = self.next_offset
        self.next_offset += 1
        if self.placer is None:
            self.emitted.append((RECORD_ITEM, offset))
        else:
            self.placer.add_record(offset, offset)
            self.take()

    def can_pulse(self):
        pulses = self.windows[self.window] if self.placer is not None else None
        return pulses is not None and self.given < len(pulses)

    def give_pulse(self):
        self.now += 1
        pulse = self.windows[self.window][self.given]
        self.given += 1
        if pulse.last:
            self.end_h = pulse.h
        self.placer.add_pulse(pulse)
        self.take()

    def can_tell_end(self):
        pulses = self.windows[self.window] if self.placer is not None else None
        return pulses is not None and self.end_h is None and self.given == len(pulses)

    def tell_end(self):
        """The next window's first pulse shows this one's last (none was marked)."""
        self.end_h = self.windows[self.window][-1].h
        if self.placer.last_placed is not None and self.placer.last_placed.h >= self.end_h:
            self._after_window()
        else:
            self.placer.end_window()
            self.take()

    def read(self, log):
        self.orders.on_records([log[self.read_log]])
        self.read_log += 1
        if self.placer is not None:
            self.take()

    def propose(self, outbox):
        self.now += 1
        outbox += [(self, r) for r in self.orders.due(self.now)]

    def take(self):
        for kind, item in self.placer.take():
            if kind == PULSE_ITEM:
                self.emitted.append((PULSE_ITEM, item[0]))
                if self.end_h is not None and item[0] >= self.end_h:
                    self._after_window()
                    return
            else:
                self.emitted.append((kind, item))

    def _after_window(self):
        self.placer.end_window()
        self.emitted += [(RECORD_ITEM, offset) for offset in self.placer.release_records()]
        self.placer = None
        self.window += 1


@pytest.mark.parametrize("failover", ["none", "resign", "dies"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_both_replicas_emit_the_same_sequence_whatever_the_pace(failover, data):
    n_records = data.draw(st.integers(0, 20), label="records")
    shapes = [(data.draw(st.integers(1, 3), label="pulses"), data.draw(st.booleans(), label="last marked"))
              for _ in range(data.draw(st.integers(1, 2), label="windows"))]
    windows: list = [None] * len(shapes)
    a, b = (_Replica(r, n_records, windows) for r in "ab")
    log, outbox = [], []
    a.orders.on_leadership(1)
    failed_over = failover == "none"
    h = 0

    def write_pulses():
        """Once every live replica holds for the next window, the generator writes its pulses,
        the first at an offset at or beyond every position held at."""
        nonlocal h
        live = [r for r in (a, b) if r.alive]
        w = min(r.window for r in live)
        if w >= len(windows) or windows[w] is not None or any(r.placer is None or r.window != w for r in live):
            return
        held_at = max(r.placer.fetched_to for r in live)  # (records below it exist: the positions reported)
        start = min(held_at + data.draw(st.integers(0, 2), label="floor"), max(held_at, n_records))
        n_pulses, marked = shapes[w]
        pulses = []
        for i in range(n_pulses):
            h += 1
            pulses.append(PulseRecord(h, {TOPIC: {PARTITION: start if i == 0 else n_records + 99}}, window=w + 1,
                                      last=marked and i == n_pulses - 1))
        windows[w] = pulses

    def actions():
        acts = []
        for r in (a, b):
            if not r.alive:
                continue
            for can, act in ((r.can_hold, r.hold), (r.can_read, r.read_record), (r.can_pulse, r.give_pulse),
                             (r.can_tell_end, r.tell_end)):
                if can():
                    acts.append(act)
            if r.read_log < len(log):
                acts.append(lambda r=r: r.read(log))
            acts.append(lambda r=r: r.propose(outbox))
        if outbox:
            acts.append(lambda: log.append(outbox.pop(0)[1]))
        return acts

    def fail_over():
        b.orders.on_leadership(2)
        if failover == "resign":
            a.orders.on_leadership(None)
        elif failover == "dies":
            a.alive = False
            outbox[:] = [(r, rec) for r, rec in outbox if r is not a]

    for _ in range(data.draw(st.integers(0, 150), label="steps")):
        if not failed_over and data.draw(st.booleans(), label="fail over now"):
            failed_over = True
            fail_over()
        write_pulses()
        acts = actions()
        acts[data.draw(st.integers(0, len(acts) - 1), label="action")]()
    if not failed_over:
        fail_over()
    for _ in range(5_000):  # then everything reaches everyone, in a fixed order: both must finish
        if all(not r.alive or (r.window == len(windows) and not r.can_read() and r.read_log == len(log))
               for r in (a, b)) and not outbox:
            break
        for act in actions():
            act()
            write_pulses()
    else:
        pytest.fail(f"not finished: a in window {a.window}, b in window {b.window} of {len(windows)}")

    note(f"windows {[[(p.h, p.offsets[TOPIC][PARTITION], p.last) for p in ps] for ps in windows]}")
    note(f"a {a.emitted}")
    note(f"b {b.emitted}")
    for r in (a, b):
        if not r.alive:
            continue
        assert [o for kind, o in r.emitted if kind != PULSE_ITEM] == list(range(n_records)), r.name
        assert [e for e in r.emitted if e[0] == PULSE_ITEM] == [(PULSE_ITEM, p.h) for ps in windows for p in ps]
        for pulses in windows:
            start = pulses[0].offsets[TOPIC][PARTITION]
            first, last = (r.emitted.index((PULSE_ITEM, p.h)) for p in (pulses[0], pulses[-1]))
            # the records below a window's start go out before its first pulse
            assert all(o >= start for kind, o in r.emitted[first:] if kind != PULSE_ITEM)
            # and no record from the start to the last pulse goes out as free: no checkpoint among them
            assert all(kind == ORDERED_ITEM for kind, o in r.emitted[:last] if kind != PULSE_ITEM and o >= start)
    if a.alive:  # (a record after a window's last pulse may be out before a replica knows it was the last)
        assert [(RECORD_ITEM if kind == ORDERED_ITEM else kind, x) for kind, x in a.emitted] == \
            [(RECORD_ITEM if kind == ORDERED_ITEM else kind, x) for kind, x in b.emitted]


def test_records_wait_only_for_the_order_not_for_a_pulse_beyond_them():
    orders = WindowOrders(max_batch=10, idle_timeout_s=0)
    orders.on_leadership(1)
    placer = WindowPlacer(TOPIC, PARTITION, 5, orders, lambda: 0.0)
    for offset in (5, 6):
        placer.add_record(offset, f"r{offset}")
    assert list(placer.take()) == []  # held until the window's first pulse says where it starts
    placer.add_pulse(PulseRecord(1, {TOPIC: {PARTITION: 6}}, window=3))
    assert list(placer.take()) == [(RECORD_ITEM, "r5")]  # below the start: out at once
    log = orders.due(0.0)
    orders.on_records(log)  # the fence is back: the leader orders what arrived
    log = orders.due(0.0)
    assert [r.order.entries for r in log] == [((0, 1), (1, 1))]
    orders.on_records(log)
    assert list(placer.take()) == [(ORDERED_ITEM, "r6"), (PULSE_ITEM, (1, False, 0))]
    placer.add_record(7, "r7")  # no pulse beyond it will come soon: it goes out after one order
    assert list(placer.take()) == []
    orders.on_records(orders.due(0.0))
    assert list(placer.take()) == [(ORDERED_ITEM, "r7")]
    placer.add_pulse(PulseRecord(2, {}, window=3, last=True))
    placer.add_record(8, "r8")
    orders.on_records(orders.due(0.0))
    assert list(placer.take()) == [(PULSE_ITEM, (2, False, 0))]
    assert placer.release_records() == ["r8"]  # after the last pulse: in no stretch
    assert orders.current is None


def test_a_replica_reading_the_log_from_its_start_applies_only_the_window_it_begins():
    """A restored replica reads its partition's order log from the start: the records of windows
    it left behind are dropped, those of a window it has not begun yet wait for it."""
    leader, follower = WindowOrders(max_batch=10, idle_timeout_s=0), WindowOrders(max_batch=10, idle_timeout_s=0)
    leader.on_leadership(1)
    log = []
    for window, start in ((1, 0), (2, 3)):
        placer = WindowPlacer(TOPIC, PARTITION, start, leader, lambda: 0.0)
        placer.add_pulse(PulseRecord(window, {TOPIC: {PARTITION: start}}, window=window, last=True))
        placer.add_record(start, f"r{start}")
        for _ in range(3):
            due = leader.due(0.0)
            log += due
            leader.on_records(due)
        assert [kind for kind, _ in placer.take()] == [PULSE_ITEM]  # (ordered as it arrived)
        assert placer.release_records() == [f"r{start}"]
    follower.finish(1)  # its checkpoint: window 1 handled
    follower.on_records(log)  # read from the start before it reaches window 2
    placer = WindowPlacer(TOPIC, PARTITION, 3, follower, lambda: 0.0)
    placer.add_record(3, "r3")
    placer.add_pulse(PulseRecord(2, {TOPIC: {PARTITION: 3}}, window=2, last=True))
    assert [kind for kind, _ in placer.take()] == [PULSE_ITEM]
    assert placer.release_records() == ["r3"] and follower.current is None


def _logged(records, log):
    """``records`` as read from the order log ``log`` (appended; each with its position)."""
    out = [WindowRecord(r.window, replace(r.order, offset=len(log) + i)) for i, r in enumerate(records)]
    log += out
    return out


def _window(orders, log, window, start, records):
    """The leader orders window ``window`` (its records from ``start``, one last pulse); what its
    placer emitted."""
    placer = WindowPlacer(TOPIC, PARTITION, start, orders, lambda: 0.0)
    placer.add_pulse(PulseRecord(window, {TOPIC: {PARTITION: start}}, window=window, last=True))
    for offset in range(start, start + records):
        placer.add_record(offset, f"r{offset}")
    for _ in range(4):
        orders.on_records(_logged(orders.due(0.0), log))
    return [*placer.take(), *((RECORD_ITEM, r) for r in placer.release_records())]


def test_a_restored_replica_reads_the_order_log_from_the_first_record_of_a_window_not_over():
    """A checkpoint says where a restore reads the order log from: the first record of a window
    the replica had not finished (read so far), else everything it read; what a replica restored
    from there places equals what one that reads the log from its start places."""
    leader = WindowOrders(max_batch=10, idle_timeout_s=0)
    leader.on_leadership(1)
    log: list[WindowRecord] = []
    assert leader.resume_from == 0
    _window(leader, log, 1, 0, 2)
    assert leader.resume_from == len(log)  # window 1 over: nothing before the log's end is needed
    second = len(log)
    twin = WindowOrders(max_batch=10, idle_timeout_s=0)
    twin.on_records(log[:second])
    twin.finish(1)
    _window(leader, log, 2, 2, 3)
    twin.on_records(log[second:second + 1])  # the twin read window 2's fence, not the rest
    assert twin.resume_from == second  # its checkpoint now (window 1 handled) starts at window 2
    assert twin.resume_from == min(r.order.offset for r in log if r.window == 2)
    placed = []
    for start in (0, twin.resume_from):  # from the log's start, and from the checkpoint's position
        restored = WindowOrders(max_batch=10, idle_timeout_s=0)
        restored.finish(1)
        restored.on_records(log[start:])
        placer = WindowPlacer(TOPIC, PARTITION, 2, restored, lambda: 0.0)
        for offset in range(2, 5):
            placer.add_record(offset, f"r{offset}")
        placer.add_pulse(PulseRecord(2, {TOPIC: {PARTITION: 2}}, window=2, last=True))
        placed.append([*placer.take(), *((RECORD_ITEM, r) for r in placer.release_records())])
        assert restored.current is None
    assert placed[0] == placed[1] and [kind for kind, _ in placed[0]].count(PULSE_ITEM) == 1
    unknown = WindowOrders(max_batch=10, idle_timeout_s=0)
    unknown.on_records([WindowRecord(3, Order(1, 0))])
    assert unknown.resume_from == 0  # records without positions: from the start
