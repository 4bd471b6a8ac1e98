"""Source positions for the heartbeat generator: the worker's outbox and the driver's board."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from liverobin.positions import PositionBoard, PositionOutbox

reports = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 5),
                             st.integers(0, 1000)), max_size=40)


@given(reports, st.randoms())
def test_the_board_keeps_the_furthest_position_whatever_the_order_of_reports(entries, rnd):
    board, shuffled = PositionBoard(), list(entries)
    rnd.shuffle(shuffled)
    for entry in shuffled:
        board.update([entry])
    expected: dict[str, dict[int, int]] = {}
    for topic, k, _, position in entries:
        expected.setdefault(topic, {})[k] = max(position, expected.get(topic, {}).get(k, -1))
    assert board.positions({"a": [0, 1, 2], "b": [0, 1, 2]}) == expected
    assert board.positions({"a": [0]}) == ({"a": {0: expected["a"][0]}} if 0 in expected.get("a", {}) else {})


def test_the_board_keeps_the_first_start_of_a_partition():
    board = PositionBoard()
    board.update([("a", 0, 10, 12)])
    board.update([("a", 0, 40, 45)])  # (a replica restored later starts further on)
    assert board.starts({"a": [0, 1]}) == {"a": {0: 10}}
    assert board.positions({"a": [0, 1]}) == {"a": {0: 45}}


def test_the_outbox_coalesces_reports_per_partition_and_ends_when_closed_while_waiting():
    outbox = PositionOutbox(period_s=0.0)
    outbox.report("a", 0, 0, 5)
    outbox.report("a", 0, 0, 9)
    outbox.report("a", 1, 3, 4)
    outbox.report("a", 0, 0, 8)  # (another replica's report, behind: the furthest is kept)
    batches = outbox.batches(sorted)
    assert next(batches) == [("a", 0, 0, 9), ("a", 1, 3, 4)]
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(batches))
    reader.start()  # blocks: nothing reported
    outbox.report("b", 0, 0, 1)
    outbox.close()
    reader.join(10)
    assert not reader.is_alive()
    assert got in ([], [[("b", 0, 0, 1)]])  # (close may come before the report is taken)


def test_the_outbox_hands_nothing_until_something_is_reported_and_paces_batches():
    outbox = PositionOutbox(period_s=30.0)
    outbox.report("a", 0, 0, 1)
    batches = outbox.batches(list)
    assert next(batches) == [("a", 0, 0, 1)]  # the first after a quiet spell: at once
    outbox.report("a", 0, 0, 2)
    taken = threading.Event()
    reader = threading.Thread(target=lambda: (next(batches, None), taken.set()))
    reader.start()
    assert not taken.wait(0.2)  # the next one waits out the period ...
    outbox.close()  # ... unless closed
    reader.join(10)
    assert taken.is_set()


def test_a_new_sender_starts_with_every_position_known_and_the_old_one_stops():
    """The stream to the driver broke and is opened again: a partition that stopped moving must
    still reach the generators, whatever the old sender had taken."""
    outbox = PositionOutbox(period_s=0.0)
    outbox.report("a", 0, 0, 5)
    outbox.report("a", 1, 0, 7)
    old = outbox.batches(list)
    assert next(old) == [("a", 0, 0, 5), ("a", 1, 0, 7)]
    new = outbox.batches(list)
    assert next(new) == [("a", 0, 0, 5), ("a", 1, 0, 7)]
    assert next(old, None) is None
    outbox.report("a", 1, 0, 9)
    outbox.report("a", 1, 0, 8)  # behind what is known: nothing to send
    assert next(new) == [("a", 1, 0, 9)]


def test_an_idle_generator_s_wait_ends_when_a_position_moves_or_it_is_rung_and_not_otherwise():
    """An idle heartbeat generator sleeps on the board instead of waking every period: a report
    that moves a position (or a ring: a drain, a window, stop) ends its wait, one that moves
    nothing does not."""
    board = PositionBoard()
    board.update([("a", 0, 0, 10)])
    seen = board.version
    assert board.wait_news(seen, 0.01) == seen  # nothing new: the whole timeout
    board.update([("a", 0, 0, 10), ("a", 0, 0, 7)])  # reports, nothing moved
    assert board.wait_news(seen, 0.01) == seen
    woke: list[int] = []
    waiter = threading.Thread(target=lambda: woke.append(board.wait_news(seen, 30)))
    waiter.start()
    board.update([("a", 0, 0, 11)])
    waiter.join(30)
    assert woke and woke[0] > seen
    seen = woke[0]
    waiter = threading.Thread(target=lambda: woke.append(board.wait_news(seen, 30)))
    waiter.start()
    board.ring()
    waiter.join(30)
    assert len(woke) == 2 and woke[1] > seen
