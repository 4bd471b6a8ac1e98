"""A replica's hand-out of its order log (kazoo_leader.order_log.OrderHandOut): fed what its
reader reads and what its writer's acknowledgements say, it hands out the log's records once each,
in log order, whichever comes first.  Pure, no Kafka."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kazoo_leader.order_log import OrderHandOut
from kazoo_leader.orders import Order
from kazoo_leader.segments import SegmentedLog


def _order(seq: int, epoch: int = 1) -> bytes:
    return Order(epoch, seq, ((0, 1),)).encode()


def _handed(orders: list[Order]) -> list[tuple[int, int, int]]:
    return [(o.offset, o.epoch, o.seq) for o in orders]


def _hand_out(log: SegmentedLog, start: int = 0) -> tuple[OrderHandOut, list[Order]]:
    got: list[Order] = []
    return OrderHandOut(log, start, got.extend), got


def test_an_acknowledged_order_next_in_the_log_is_handed_out_at_once_and_not_again_when_read() -> None:
    hand_out, got = _hand_out(SegmentedLog("o", per_segment=1000))
    assert _handed(hand_out.acknowledged(0, 0, _order(1))) == [(0, 1, 1)]
    assert _handed(hand_out.acknowledged(0, 1, _order(2))) == [(1, 1, 2)]
    assert hand_out.read([(0, 0, _order(1)), (0, 1, _order(2))]) == []  # the reader reaches them later
    assert _handed(got) == [(0, 1, 1), (1, 1, 2)] and hand_out.from_acks == 2
    assert hand_out.reading()[1] == {"o.0": 2}


def test_the_position_read_on_from_follows_what_was_handed_out_across_segments() -> None:
    """What a replica reports to the driver, which keeps its order log from there on."""
    hand_out, _ = _hand_out(SegmentedLog("o", per_segment=2), start=1)
    assert hand_out.position == 1
    hand_out.read([(0, 1, _order(1)), (1, 0, _order(2))])
    assert hand_out.position == 3 and hand_out.segment == 1
    hand_out.acknowledged(1, 1, _order(3))
    assert hand_out.position == 4 and hand_out.segment == 2


def test_an_acknowledged_order_after_an_unread_record_waits_for_the_reader() -> None:
    hand_out, got = _hand_out(SegmentedLog("o", per_segment=10))
    # another writer's record (a deposed leader's) landed at offset 0 and is not read yet
    assert hand_out.acknowledged(0, 1, _order(1, epoch=2)) == []
    assert _handed(hand_out.read([(0, 0, _order(7, epoch=1)), (0, 1, _order(1, epoch=2))])) == [
        (0, 1, 7), (1, 2, 1)]
    assert _handed(got) == [(0, 1, 7), (1, 2, 1)] and hand_out.from_acks == 0


def test_an_acknowledgement_past_a_full_segment_or_in_the_next_one_hands_out_nothing_early() -> None:
    hand_out, got = _hand_out(SegmentedLog("o", per_segment=2))
    hand_out.acknowledged(0, 0, _order(1))
    assert hand_out.acknowledged(1, 0, _order(3)) == []  # the next segment: after segment 0 completes
    assert _handed(hand_out.acknowledged(0, 1, _order(2))) == [(1, 1, 2), (2, 1, 3)]
    assert hand_out.acknowledged(0, 2, _order(4)) == []  # past the end of segment 0: not the log's
    assert _handed(got) == [(0, 1, 1), (1, 1, 2), (2, 1, 3)]


@settings(max_examples=300, deadline=None)
@given(
    full=st.lists(st.integers(3, 5), max_size=3),
    last=st.integers(0, 5),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 1000)), max_size=80),
    start=st.integers(0, 3),
)
def test_reads_and_acknowledgements_in_any_interleaving_hand_out_the_log_once_in_order(full, last, steps,
                                                                                        start) -> None:
    """Segments of 3 records, every one but the last full (some written past the end, as writers
    do that have not read the segment full yet); any record may be acknowledged, at any moment,
    while the reader reads each segment the hand-out names in its order."""
    log = SegmentedLog("o", per_segment=3)
    sizes = [*full, last]
    start = min(start, 3 * len(sizes) - 1)
    segments = [[_order(100 * n + o) for o in range(size)] for n, size in enumerate(sizes)]
    expected = [(log.position(n, o), 1, 100 * n + o) for n, records in enumerate(segments)
                for o in range(len(records)) if o < 3 and log.position(n, o) >= start]
    hand_out, got = _hand_out(log, start)
    read: dict[int, int] = {}  # segment -> next offset the reader reads

    def readable() -> list[tuple[int, int]]:
        topics, offsets = hand_out.reading()
        out = []
        for topic, segment in topics.items():
            at = max(offsets[topic], read.get(segment, 0))
            if segment < len(segments) and at < len(segments[segment]):
                out.append((segment, at))
        return out

    written = [(n, o) for n, records in enumerate(segments) for o in range(len(records))]
    for is_ack, pick in steps:
        if is_ack and written:
            n, o = written[pick % len(written)]
            hand_out.acknowledged(n, o, segments[n][o])
        elif ready := readable():
            n, o = ready[pick % len(ready)]
            read[n] = o + 1
            hand_out.read([(n, o, segments[n][o])])
    while ready := readable():  # the reader reads on to the end
        n, o = ready[0]
        read[n] = o + 1
        hand_out.read([(n, o, segments[n][o])])
    assert _handed(got) == expected
