"""A LiveRobin merge restored from its checkpoint state continues exactly like the original
(hypothesis: random per-channel sequences, pulses, arrival interleavings, checkpoint pulses)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from liverobin import LiveRobinMerge
from replication.runtime.elements import DATA, END_ELEMENT, PULSE, pulse
from tests import interleavings


def channel_sequences(rnd: random.Random, channels: int, pulses: int) -> dict[int, list[tuple]]:
    seqs = {}
    for c in range(channels):
        seq: list[tuple] = []
        for h in range(1, pulses + 1):
            seq += [(DATA, f"c{c}-h{h}-{i}") for i in range(rnd.randint(0, 4))]
            seq.append(pulse(h))
        seqs[c] = [*seq, END_ELEMENT]
    return seqs


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(3, 8), st.integers(1, 3))
def test_restored_merge_continues_like_the_original(seed, channels, pulses, every):
    rnd = random.Random(seed)
    seqs = channel_sequences(rnd, channels, pulses)
    original = LiveRobinMerge(seqs, checkpoint_every=every)
    steps = []
    for c, chunk in interleavings.schedule(seqs, rnd, 3):
        original.push(c, chunk)
        steps += original.pull()
    assert original.finished
    # every checkpoint pulse: the consumed positions per channel and the state kept for it
    consumed = dict.fromkeys(seqs, 0)
    checkpoints = []
    for i, step in enumerate(steps):
        consumed[step.channel] += 1
        if step.forward and step.element[0] == PULSE and step.element[1] % every == 0:
            checkpoints.append((i, dict(consumed), original.take_state(step.element[1])))
    assert checkpoints and not original.states
    for i, positions, state in checkpoints:
        restored = LiveRobinMerge(seqs)
        restored.restore(state)
        rest = {c: seq[positions[c]:] for c, seq in seqs.items()}
        again = []
        for c, chunk in interleavings.schedule(rest, rnd, 3):
            restored.push(c, chunk)
            again += restored.pull()
        assert [(s.channel, s.element, s.forward) for s in again] == \
            [(s.channel, s.element, s.forward) for s in steps[i + 1:]]
