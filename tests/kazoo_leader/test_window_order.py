"""A source partition's pulse window in KaZoo order (kazoo_leader.window_order), pure.

The property: two replicas reading the same records and pulses at any pace, the order log's
records reaching the log and each replica in any interleaving, with the leader kept, replaced
while it goes on as a follower, replaced while it still orders (stale), or dead, emit the same
sequence of records and pulses, every record and pulse once, in their channels' order; and the
stretch ends at the window's last pulse on both.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kazoo_leader.orders import Order
from kazoo_leader.window_order import WindowOrder, WindowRecord

START = 100
WINDOW = 7


def _is_last(pulse):
    return pulse[1]


class _Replica:
    def __init__(self, name, records, pulses, hold_at, max_batch):
        self.name = name
        self.order = WindowOrder(WINDOW, START, _is_last, max_batch=max_batch, idle_timeout_s=0)
        self.records = [r for r in records if r[0] >= hold_at]  # what it reads from its hold position on
        self.pulses = list(pulses)
        self.read_log = 0
        self.outbox: list[WindowRecord] = []
        self.emitted: list = []
        self.alive = True
        self.now = 0.0
        self.told_end = False

    def feed_record(self):
        self.now += 1
        out = self.order.add_records([self.records.pop(0)], self.now)
        self.emitted += [("record", r) for r in out]
        self._take()

    def feed_pulse(self):
        self.now += 1
        self.order.add_pulse(self.pulses.pop(0), self.now)
        self._take()

    def read(self, log):
        self.order.on_record(log[self.read_log])
        self.read_log += 1
        self._take()

    def tell_end(self, last):
        self.told_end = True
        self.emitted += self.order.end_after(last)

    def propose(self):
        self.now += 1
        record = self.order.next_order(self.now)
        if record is not None:
            self.outbox.append(record)

    def _take(self):
        self.emitted += self.order.take()


def _run(data, failover, marked=True):
    n_records = data.draw(st.integers(0, 25), label="records")
    n_pulses = data.draw(st.integers(1, 5), label="pulses")
    records = [(START - 3 + i, f"r{i}") for i in range(n_records + 3)]  # three before the window's start
    # not marked: a later window's pulse in the heartbeat log tells each replica, at its own
    # moment once it read the last one, that the window ended
    pulses = [(h, marked and h == n_pulses) for h in range(1, n_pulses + 1)]
    a = _Replica("a", records, pulses, START - data.draw(st.integers(0, 3)), data.draw(st.integers(1, 4)))
    b = _Replica("b", records, pulses, START - data.draw(st.integers(0, 3)), data.draw(st.integers(1, 4)))
    log: list[WindowRecord] = []
    a.outbox.append(a.order.lead(1))
    failed_over = failover == "none"

    def actions():
        acts = []
        for r in (a, b):
            if not r.alive:
                continue
            if r.records:
                acts.append(r.feed_record)
            if r.pulses:
                acts.append(r.feed_pulse)
            if r.read_log < len(log):
                acts.append(lambda r=r: r.read(log))
            acts.append(r.propose)
            if not marked and not r.pulses and not r.told_end:
                acts.append(lambda r=r: r.tell_end(pulses[-1]))
            if r.outbox:
                acts.append(lambda r=r: log.append(r.outbox.pop(0)))
        return acts

    for _ in range(data.draw(st.integers(0, 120), label="steps")):
        if not failed_over and data.draw(st.booleans(), label="fail over now"):
            failed_over = True
            b.outbox.append(b.order.lead(2))
            if failover == "resign":
                a.order.resign()
            elif failover == "dies":
                a.alive = False
            # "stale": a goes on ordering until it reads b's fence
        acts = actions()
        acts[data.draw(st.integers(0, len(acts) - 1), label="action")]()
    if not failed_over:
        b.outbox.append(b.order.lead(2))
        if failover == "dies":
            a.alive = False
        elif failover == "resign":
            a.order.resign()
    for _ in range(10_000):  # then every replica gets everything, in a fixed order: it must end
        acts = actions()
        if all(not r.alive or (r.order.ended and not r.records and r.read_log == len(log)) for r in (a, b)):
            break
        for act in acts:
            act()
    else:
        pytest.fail("the window never ended")
    return a, b, records, pulses


@pytest.mark.parametrize("marked", [True, False], ids=["last-marked", "ended-by-next-window"])
@pytest.mark.parametrize("failover", ["none", "resign", "stale", "dies"])
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_both_replicas_emit_the_same_records_and_pulses_whatever_the_interleaving(failover, marked, data):
    a, b, records, pulses = _run(data, failover, marked)
    inside = [("record", r) for r in records if r[0] >= START]
    for r in (a, b):
        assert r.order.ended or not r.alive
        ours = [e for e in r.emitted if e[0] == "pulse" or e[1][0] >= START]
        if r.alive:  # every record of the window once, in offset order, and every pulse once, in order
            assert [e for e in ours if e[0] == "record"] == inside
            assert [e[1] for e in ours if e[0] == "pulse"] == pulses
    seq_a = [e for e in a.emitted if e[0] == "pulse" or e[1][0] >= START]
    seq_b = [e for e in b.emitted if e[0] == "pulse" or e[1][0] >= START]
    if a.alive:
        assert seq_a == seq_b
    else:
        assert seq_a == seq_b[: len(seq_a)]


def test_records_before_the_start_go_out_at_once_and_the_rest_wait_for_the_order():
    w = WindowOrder(WINDOW, START, _is_last, idle_timeout_s=0)
    assert w.add_records([(98, "x"), (99, "y"), (100, "z")], 0.0) == [(98, "x"), (99, "y")]
    w.add_pulse((1, True), 0.0)
    assert w.take() == [] and w.held == 1
    fence = w.lead(5)
    assert fence == WindowRecord(WINDOW, Order(5, 0))
    w.on_record(fence)
    order = w.next_order(1.0)
    assert order == WindowRecord(WINDOW, Order(5, 1, ((0, 1), (1, 1))))
    assert w.on_record(WindowRecord(WINDOW + 1, order.order)) is False  # another window's
    assert w.on_record(order) is True
    assert w.take() == [("record", (100, "z")), ("pulse", (1, True))]
    assert w.ended
    assert w.add_records([(101, "after")], 2.0) == [(101, "after")]  # the window is over


def test_a_window_record_survives_encoding():
    record = WindowRecord(12, Order(3, 4, ((0, 10), (1, 1), (0, 2))))
    assert WindowRecord.decode(record.encode()) == record
    with pytest.raises(ValueError):
        WindowRecord.decode(b"\x00")
