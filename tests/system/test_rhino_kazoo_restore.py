"""KaZoo checkpoints (Rhino): an order applier restored from the state it had at a checkpoint
record continues exactly like the original, reading the log again from the next offset and the
channels from the checkpoint's positions (hypothesis over logs with leader changes)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kazoo_leader import Order, OrderApplier
from tests import interleavings
from tests.kazoo_leader.test_kazoo_orders import Cluster, channel_sequences


def consume(applier: OrderApplier, log: list[bytes], first: int, seqs: dict[int, list], rnd: random.Random,
            checkpoints: list | None = None) -> list:
    """Feed the log from index ``first`` and the channels in random chunks; the consumption order
    (and, at every due checkpoint, its state and how much was consumed before it)."""
    out: list = []
    arrivals = interleavings.schedule(seqs, rnd, 3)
    i = first

    def pull() -> None:
        while True:
            out.extend(applier.pull())
            if applier.checkpoint_due is None:
                return
            state = applier.take_checkpoint()
            if checkpoints is not None:
                checkpoints.append((state, len(out)))

    while i < len(log) or arrivals:
        if arrivals and (i >= len(log) or rnd.random() < 0.5):
            applier.push(*arrivals.pop(0))
        else:
            applier.on_record(Order.decode(log[i], offset=i))
            i += 1
        pull()
    return out


def _finished_cluster(seqs: dict[int, list], rnd: random.Random) -> Cluster:
    """A log written by a random run of leader changes, up to every channel's END."""
    cluster = Cluster(seqs, rnd)
    cluster.elect(0, others_resign=True)
    for _ in range(rnd.randint(0, 200)):
        cluster.step()
    cluster.finish()
    return cluster


def _assert_restores_continue(seqs: dict[int, list], log: list[bytes], rnd: random.Random, checkpoints: list,
                              out: list, **applier: object) -> None:
    """An applier restored from each checkpoint's state continues exactly like the original."""
    for state, consumed in checkpoints:
        restored = OrderApplier(seqs, **applier)
        restored.restore(state)
        rest = {c: seq[state.applied.get(c, 0):] for c, seq in seqs.items()}
        again = consume(restored, log, state.offset + 1, rest, rnd)
        assert again == out[consumed:]
        assert restored.finished


@settings(max_examples=200, deadline=None)
@given(channel_sequences(), st.integers(0, 2**32), st.integers(1, 4))
def test_a_restored_applier_continues_like_the_original(seqs, seed, every):
    rnd = random.Random(seed)
    cluster = _finished_cluster(seqs, rnd)
    log = cluster.log
    checkpoints: list = []
    original = OrderApplier(seqs, checkpoint_every=every)
    out = consume(original, log, 0, seqs, rnd, checkpoints)
    assert original.finished and out == cluster.replicas[0].out
    assert [s.number for s, _ in checkpoints] == [n for n in range(every, original.accepted + 1, every)]
    _assert_restores_continue(seqs, log, rnd, checkpoints, out, checkpoint_every=every)


def marked(element: tuple) -> bool:
    """A stand-in for "this record's time enters a new interval": a function of the element."""
    return element[0] == 0 and element[1].endswith(("-1", "-4"))


@settings(max_examples=200, deadline=None)
@given(channel_sequences(), st.integers(0, 2**32), st.integers(1, 50))
def test_records_holding_a_marked_element_are_checkpoints_too_on_every_replica(seqs, seed, every):
    """Besides every ``every``-th accepted record, each record holding a marked element is a
    checkpoint (large orders still checkpoint often): the same records whatever the arrival
    interleaving, so both replicas take the same checkpoints, and a restore from any of them
    continues exactly."""
    rnd = random.Random(seed)
    cluster = _finished_cluster(seqs, rnd)
    log = cluster.log
    judge, sizes = OrderApplier(seqs), []  # the accepted records' sizes, in log order
    for i, data in enumerate(log):
        order = Order.decode(data, offset=i)
        if judge.on_record(order):
            sizes.append(order.size)
    for _ in range(2):  # two replicas: the same log, their inputs arriving in other chunks
        checkpoints: list = []
        applier = OrderApplier(seqs, checkpoint_every=every, checkpoint_mark=marked)
        out = consume(applier, log, 0, seqs, rnd, checkpoints)
        assert applier.finished and out == cluster.replicas[0].out
        expected, end = [], 0
        for number, size in enumerate(sizes, 1):
            start, end = end, end + size
            if number % every == 0 or any(marked(e) for _, e in out[start:end]):
                expected.append((number, end))
        assert [(state.number, consumed) for state, consumed in checkpoints] == expected
    _assert_restores_continue(seqs, log, rnd, checkpoints, out, checkpoint_every=every, checkpoint_mark=marked)
