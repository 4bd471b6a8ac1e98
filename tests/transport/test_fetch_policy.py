"""The fetch-wait policy of long-lived consumers: a pure state machine fed with poll outcomes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from transport.fetch_policy import FetchWaitPolicy, Pace


def polls(policy: FetchWaitPolicy, start: float, seconds: float, got: bool, behind: bool,
          every: float = 0.02) -> list[Pace]:
    """Feed ``seconds`` of polls; the changes the policy asked for."""
    changes, t = [], start
    while t < start + seconds:
        change = policy.on_poll(t, got, behind)
        if change is not None:
            changes.append(change)
        t += every
    return changes


def test_a_quiet_consumer_goes_idle_and_comes_back_with_the_first_records() -> None:
    policy = FetchWaitPolicy(10, idle_ms=200, idle_after_s=5.0)
    assert polls(policy, 0.0, 4.9, got=False, behind=False) == []
    assert policy.wait_ms == 10
    assert polls(policy, 4.9, 0.2, got=False, behind=False) == [Pace.IDLE]
    assert policy.wait_ms == 200
    assert polls(policy, 5.1, 60, got=False, behind=False) == []  # stays idle, no remakes
    assert policy.on_poll(65.2, got=True, behind=False) is Pace.NORMAL
    assert policy.wait_ms == 10


def test_records_now_and_then_keep_it_at_the_short_wait() -> None:
    policy = FetchWaitPolicy(10, idle_ms=200, idle_after_s=5.0)
    for second in range(60):
        assert polls(policy, second * 4.0, 4.0, got=False, behind=False) == []
        assert policy.on_poll(second * 4.0 + 4.0, got=True, behind=False) is None
    assert policy.pace is Pace.NORMAL


def test_records_waiting_below_the_high_watermark_end_idleness() -> None:
    policy = FetchWaitPolicy(10, idle_ms=200, idle_after_s=1.0)
    assert polls(policy, 0.0, 1.1, got=False, behind=False) == [Pace.IDLE]
    assert policy.on_poll(2.0, got=False, behind=True) is Pace.NORMAL


def test_without_an_idle_wait_it_never_goes_idle() -> None:
    for policy in (FetchWaitPolicy(10), FetchWaitPolicy(10, idle_ms=0, idle_after_s=1.0),
                   FetchWaitPolicy(10, idle_ms=200, idle_after_s=0.0), FetchWaitPolicy(100, idle_ms=50, idle_after_s=1)):
        assert polls(policy, 0.0, 30, got=False, behind=False) == []
        assert policy.wait_ms == policy.normal_ms


def test_a_stall_switches_to_the_catch_up_wait_and_back_after_a_doubling_hold() -> None:
    policy = FetchWaitPolicy(10, idle_ms=200, idle_after_s=5.0, catch_up_ms=100, stall_s=1.0, hold_s=2.0)
    assert polls(policy, 0.0, 1.1, got=False, behind=True) == [Pace.CATCHING_UP]
    assert policy.wait_ms == 100 and policy.stalls == 1 and policy.hold_s == 2.0
    assert polls(policy, 1.1, 1.9, got=False, behind=False) == []  # at the end, but not for the hold yet
    assert polls(policy, 3.0, 0.2, got=False, behind=False) == [Pace.NORMAL]
    assert polls(policy, 3.2, 1.1, got=False, behind=True) == [Pace.CATCHING_UP]
    assert policy.hold_s == 4.0 and policy.stalls == 2


def test_records_arriving_while_behind_are_no_stall() -> None:
    policy = FetchWaitPolicy(10, idle_ms=200, idle_after_s=5.0)
    assert polls(policy, 0.0, 30, got=True, behind=True) == []
    assert policy.pace is Pace.NORMAL and policy.stalled_for(30.0) == 0.0


def test_the_hold_never_exceeds_its_maximum() -> None:
    policy = FetchWaitPolicy(10, catch_up_ms=100, stall_s=1.0, hold_s=2.0, hold_max_s=8.0)
    t = 0.0
    for _ in range(6):
        assert polls(policy, t, 1.1, got=False, behind=True) == [Pace.CATCHING_UP]
        t += 1.1
        assert polls(policy, t, policy.hold_s + 0.1, got=False, behind=False) == [Pace.NORMAL]
        t += policy.hold_s + 0.1
    assert policy.hold_s == 8.0


@given(st.lists(st.tuples(st.floats(0.001, 2.0), st.booleans(), st.booleans()), max_size=300))
def test_the_wait_always_matches_the_pace_and_idleness_needs_quiet(outcomes) -> None:
    """Whatever the polls, the wait asked for is the pace's, and the policy only goes idle after
    ``idle_after_s`` of polls that found nothing and had nothing behind."""
    policy = FetchWaitPolicy(10, idle_ms=200, idle_after_s=3.0, catch_up_ms=100)
    t, quiet_since = 0.0, 0.0
    for gap, got, behind in outcomes:
        t += gap
        before = policy.pace
        change = policy.on_poll(t, got, behind)
        assert policy.wait_ms == {Pace.NORMAL: 10, Pace.IDLE: 200, Pace.CATCHING_UP: 100}[policy.pace]
        assert (change is not None) == (policy.pace is not before)
        if change is Pace.IDLE:
            assert before is Pace.NORMAL and not got and not behind and t - quiet_since >= 3.0
        if policy.pace is Pace.IDLE:
            assert not got and not behind
        if got or behind or change is not None:
            quiet_since = t
