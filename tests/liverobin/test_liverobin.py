"""LiveRobin's merge (paper 004, Algorithm 1): pure, so its determinism is checked with hypothesis."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liverobin import LiveRobinMerge
from liverobin import merge as lr
from replication.runtime import elements
from replication.runtime.elements import DATA, END_ELEMENT, pulse
from tests import interleavings


def d(name: str) -> tuple:
    return (DATA, name)


def test_element_kinds_match_the_runtime():
    assert (lr.END, lr.PULSE) == (elements.END, elements.PULSE)


def run(merge: LiveRobinMerge, schedule: list[tuple[int, list[tuple]]]) -> list:
    steps = []
    for channel, chunk in schedule:
        merge.push(channel, chunk)
        steps += merge.pull()
    return [(s.channel, s.element, s.forward) for s in steps]


def test_round_robin_without_pulses():
    m = LiveRobinMerge([0, 1])
    out = run(m, [(1, [d("b1"), d("b2")]), (0, [d("a1"), d("a2")])])
    assert [e[1] for _, e, _ in out] == ["a1", "b1", "a2", "b2"]
    m.push(1, [d("b3")])
    assert m.pull() == [] and m.blocked_on == 0  # channel 0's turn: b3 waits, whatever arrives first


def test_a_channel_leaves_the_cycle_after_any_pulse_not_only_the_first_seen():
    """The paper's text, not its indentation: channel 1's pulse 1 is not the first seen, yet
    channel 1 must wait for the next cycle too, else channel 0 would starve."""
    m = LiveRobinMerge([0, 1])
    out = run(m, [(0, [pulse(1), d("x0")]), (1, [d("a1"), pulse(1), d("b1")])])
    assert out == [(0, pulse(1), True), (1, d("a1"), False), (1, pulse(1), False),
                   (0, d("x0"), False), (1, d("b1"), False)]


def test_end_closes_a_channel_and_the_rest_go_on():
    m = LiveRobinMerge([0, 1, 2])
    out = run(m, [(0, [d("a"), END_ELEMENT]), (1, [d("b"), pulse(1), d("c"), END_ELEMENT]),
                  (2, [pulse(1), d("e"), END_ELEMENT])])
    assert m.finished and m.blocked_on is None
    assert [e for _, e, _ in out].count(END_ELEMENT) == 3
    assert sum(f for _, _, f in out) == 1
    with pytest.raises(KeyError):
        m.push(9, [d("z")])
    with pytest.raises(ValueError):
        LiveRobinMerge([])


@st.composite
def channel_sequences(draw):
    """Per channel: data, pulse 1, data, pulse 2, ..., data, END (every channel carries every pulse,
    as pulses are propagated on every output channel)."""
    n = draw(st.integers(1, 4))
    k = draw(st.integers(0, 5))
    seqs = {}
    for c in range(n):
        seq = []
        for h in range(1, k + 2):
            seq += [d(f"c{c}-h{h}-{i}") for i in range(draw(st.integers(0, 4)))]
            if h <= k:
                seq.append(pulse(h))
        seqs[c * 10] = seq + [END_ELEMENT]  # channel ids need not be dense
    return seqs


def schedule(seqs: dict[int, list], rnd: random.Random) -> list[tuple[int, list]]:
    return interleavings.schedule(seqs, rnd, max_batch=4)


@settings(max_examples=300, deadline=None)
@given(channel_sequences(), st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_same_output_whatever_the_arrival_order(seqs, rnd_a, rnd_b):
    a = run(LiveRobinMerge(seqs), schedule(seqs, rnd_a))
    b = run(LiveRobinMerge(seqs), schedule(seqs, rnd_b))
    assert a == b


@settings(max_examples=300, deadline=None)
@given(channel_sequences(), st.randoms(use_true_random=False))
def test_everything_consumed_once_in_channel_order_cycles_aligned(seqs, rnd):
    m = LiveRobinMerge(seqs)
    out = run(m, schedule(seqs, rnd))
    assert m.finished  # liveness: with every pulse and END delivered, nothing is stuck
    for c, seq in seqs.items():
        assert [e for ch, e, _ in out if ch == c] == seq  # once each, FIFO per channel
    k = max((e[1] for seq in seqs.values() for e in seq if e[0] == elements.PULSE), default=0)
    assert [e[1] for _, e, f in out if f] == list(range(1, k + 1))  # each pulse forwarded once, in order
    # a cycle ends only when every open channel delivered its pulse: nothing after pulse h on any
    # channel is consumed before pulse h of every channel
    position = {(ch, e): i for i, (ch, e, _) in enumerate(out)}
    for h in range(1, k + 1):
        last_pulse_h = max(position[(c, pulse(h))] for c in seqs)
        for c, seq in seqs.items():
            after = seq[seq.index(pulse(h)) + 1:]
            assert all(position[(c, e)] > last_pulse_h for e in after)


@settings(max_examples=200, deadline=None)
@given(channel_sequences(), st.randoms(use_true_random=False))
def test_outputs_so_far_are_always_a_prefix_of_the_final_order(seqs, rnd):
    """Replicas that are at different points agree on everything both have emitted."""
    final = run(LiveRobinMerge(seqs), schedule(seqs, random.Random(0)))
    m = LiveRobinMerge(seqs)
    steps = []
    for channel, chunk in schedule(seqs, rnd):
        m.push(channel, chunk)
        steps += [(s.channel, s.element, s.forward) for s in m.pull(limit=rnd.randint(0, 3))]
        assert steps == final[:len(steps)]


# -- Algorithm 1 edge cases (issue 5) -------------------------------------------------------
def test_an_empty_channel_blocks_the_merge_until_its_pulse_arrives():
    m = LiveRobinMerge([0, 1])
    m.push(0, [d("a1"), d("a2"), pulse(1), d("a3")])
    assert [s.element for s in m.pull()] == [d("a1")] and m.blocked_on == 1  # channel 1's turn
    m.push(1, [pulse(1)])  # an idle upstream: only heartbeats
    # its pulse ends its cycle; channel 0 finishes the cycle alone, then the merge waits for 1 again
    assert [s.element for s in m.pull()] == [pulse(1), d("a2"), pulse(1)] and m.blocked_on == 1


def test_a_channel_carrying_only_heartbeats_never_holds_the_others_back_longer_than_a_cycle():
    m = LiveRobinMerge([0, 1])
    busy = [d(f"b{i}") for i in range(50)]
    out = run(m, [(0, busy[:25] + [pulse(1)] + busy[25:] + [pulse(2)]), (1, [pulse(1), pulse(2)])])
    assert [e for _, e, _ in out if e[0] == DATA] == busy
    assert [(c, e) for c, e, f in out if f] == [(1, pulse(1)), (1, pulse(2))]


def test_many_channels_and_very_unbalanced_rates():
    channels = list(range(16))
    m = LiveRobinMerge(channels)
    sequences = {c: [d(f"{c}:{i}") for i in range(1000 if c == 0 else c % 3)] + [pulse(1)] for c in channels}
    order = list(channels)
    random.Random(7).shuffle(order)
    out = run(m, [(c, sequences[c]) for c in order])
    assert len(out) == sum(len(s) for s in sequences.values())
    # within the cycle: round robin over all channels while each has data, then channel 0 alone
    firsts = [e[1] for _, e, _ in out[:3]]
    assert firsts == ["0:0", "1:0", "2:0"]
    assert [e[1] for _, e, _ in out[-10:-1]] == [f"0:{i}" for i in range(991, 1000)]


def test_a_channel_that_stops_stalls_the_merge_until_it_resumes_or_ends():
    m = LiveRobinMerge([0, 1])
    m.push(0, [d("a1"), pulse(1), d("a2"), pulse(2)])
    m.push(1, [d("b1"), pulse(1)])
    out = m.pull()
    assert [s.element for s in out] == [d("a1"), d("b1"), pulse(1), pulse(1), d("a2")]
    assert m.blocked_on == 1  # channel 1 stopped sending: its turn comes, the merge waits
    m.push(0, [d("a3")])
    assert m.pull() == []
    m.push(1, [END_ELEMENT])  # it ends: the others carry on alone
    assert [s.element for s in m.pull()] == [END_ELEMENT, pulse(2), d("a3")]
