"""Which silent workers the failure detector declares dead (replication.control.liveness), and the job
master applying it."""

from __future__ import annotations

import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from replication.control import watch
from replication.control.liveness import (
    FATAL_SILENCE_FACTOR,
    SHARED_SILENCE_FACTOR,
    STRAIN_WINDOW_S,
    LateBeats,
    WorkerInfo,
    silent_workers,
)
from replication.messages import Heartbeat
from tests.control.test_job_master import _master


def test_a_worker_silent_alone_is_declared_at_the_timeout():
    assert silent_workers({0: 0.1, 1: 2.5, 2: 0.3}, 2.0) == [1]
    assert silent_workers({0: 0.1, 1: 1.9, 2: 0.3}, 2.0) == []


def test_a_silence_most_workers_share_is_held_to_the_longer_timeout():
    assert silent_workers({0: 2.5, 1: 2.5, 2: 0.3}, 2.0) == []
    assert silent_workers({0: 2.5, 1: 2.5, 2: 2.5}, 2.0) == []
    assert silent_workers({0: 8.5, 1: 2.5, 2: 8.1}, 2.0) == [0, 2]
    assert silent_workers({0: 2.5, 1: 2.5, 2: 0.3, 3: 0.2}, 2.0) == [0, 1]  # half, not most


def test_a_silence_that_would_end_the_job_is_held_to_the_longest_timeout():
    assert silent_workers({0: 2.5, 1: 0.1, 2: 0.3}, 2.0, fatal={0}) == []
    assert silent_workers({0: 8.5, 1: 0.1, 2: 0.3}, 2.0, fatal={0}) == []
    assert silent_workers({0: 20.5, 1: 0.1, 2: 0.3}, 2.0, fatal={0}) == [0]
    assert silent_workers({0: 2.5, 1: 2.5, 2: 0.3, 3: 0.2}, 2.0, fatal={0}) == [1]
    assert silent_workers({0: 8.5, 1: 8.5, 2: 8.5}, 2.0, fatal={0}) == [1, 2]  # shared, but 0 would end the job


def test_a_worker_whose_heartbeats_came_late_lately_is_given_twice_its_longest_gap():
    beats = LateBeats()
    beats.heard(10.0, 0.2, 2.0)
    beats.heard(10.4, 0.4, 2.0)  # (short gaps: not remembered)
    assert beats.patience(11.0, 2.0) == 1.0
    beats.heard(12.0, 1.5, 2.0)
    assert beats.patience(12.5, 2.0) == 1.5  # 2 x 1.5 s = 3 s: one and a half timeouts
    beats.heard(13.0, 6.0, 2.0)
    assert beats.patience(13.5, 2.0) == SHARED_SILENCE_FACTOR  # never more than the shared timeout
    assert beats.patience(12.0 + STRAIN_WINDOW_S + 0.5, 2.0) == SHARED_SILENCE_FACTOR  # the 6 s gap still counts
    assert beats.patience(13.0 + STRAIN_WINDOW_S + 0.5, 2.0) == 1.0  # a calm minute: the plain timeout again
    assert silent_workers({0: 2.5, 1: 0.1, 2: 0.1}, 2.0, patience={0: 1.5}) == []
    assert silent_workers({0: 3.1, 1: 0.1, 2: 0.1}, 2.0, patience={0: 1.5}) == [0]


silences = st.dictionaries(st.integers(0, 9), st.floats(0, 30, allow_nan=False), max_size=10)


@given(silences, st.floats(0.1, 5), st.frozensets(st.integers(0, 9)))
def test_the_declared_are_silent_past_the_timeout_and_a_long_silence_always_counts(silence, timeout, fatal):
    declared = silent_workers(silence, timeout, fatal=fatal)
    assert all(silence[w] > timeout for w in declared)
    # a straining worker's patience (at most the shared factor) never holds back a silence past that
    strained = silent_workers(silence, timeout, fatal=fatal, patience={w: SHARED_SILENCE_FACTOR for w in silence})
    assert set(strained) <= set(declared)
    assert all(w in strained for w, s in silence.items() if s > timeout * SHARED_SILENCE_FACTOR and w not in fatal)
    assert all(silence[w] > timeout * FATAL_SILENCE_FACTOR for w in declared if w in fatal)
    assert all(w in declared for w, s in silence.items() if s > timeout * FATAL_SILENCE_FACTOR)
    assert all(w in declared for w, s in silence.items() if s > timeout * SHARED_SILENCE_FACTOR and w not in fatal)
    over = [w for w, s in silence.items() if s > timeout]
    if 2 * len(over) <= len(silence):
        assert declared == sorted(w for w in over if w not in fatal or silence[w] > timeout * FATAL_SILENCE_FACTOR)


def _beat_until_declared(master, victim: int, others: tuple[int, ...], timeout: float = 5.0) -> None:
    """Keep ``others`` heard from until ``victim`` is declared dead (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and victim not in master.dead:
        for w in others:
            master.workers[w].last_seen = time.monotonic()
        time.sleep(0.02)


def test_the_job_master_waits_out_a_silence_every_worker_shares_and_declares_one_alone():
    master = _master(mode="liverobin", workers=3)
    master.failure_timeout_s = 0.5
    monitor = threading.Thread(target=watch.monitor, args=(master, 0.02,), daemon=True)
    try:
        old = time.monotonic() - 0.6
        for info in master.workers.values():
            info.last_seen = old
        monitor.start()
        time.sleep(0.2)  # every worker 0.8 s silent: past the timeout, short of the shared one (2 s)
        assert master.dead == {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(master.dead) < 3:
            time.sleep(0.02)
        assert sorted(master.dead) == [0, 1, 2]
    finally:
        master.end_watching()
        monitor.join(2)

    master = _master(mode="liverobin", workers=3)
    master.failure_timeout_s = 0.5
    monitor = threading.Thread(target=watch.monitor, args=(master, 0.02,), daemon=True)
    try:
        master.workers[1].last_seen = time.monotonic() - 1.0
        monitor.start()
        _beat_until_declared(master, 1, others=(0, 2))
        assert list(master.dead) == [1] and "silent for" in master.dead[1]
    finally:
        master.end_watching()
        monitor.join(2)


def test_the_job_master_waits_longer_for_a_silent_worker_whose_loss_would_end_the_job():
    master = _master(mode="liverobin", workers=3)
    master.failure_timeout_s = 0.2
    assert not any(master.losses.ends_the_job(w) for w in range(3))  # every partition has a twin elsewhere
    with master.locked():
        master.declare_dead(0, "killed")
    last = {w for (t, p, r), w in master.placement.items() if w != 0
            and any(master.placement[(t, p, rr)] == 0 for rr in range(master.plan.replicas) if rr != r)}
    fatal = min(last)  # runs the twin of a replica worker 0 ran: the partition's last replica
    other = ({1, 2} - {fatal}).pop()
    assert master.losses.ends_the_job(fatal)
    monitor = threading.Thread(target=watch.monitor, args=(master, 0.02,), daemon=True)
    try:
        master.workers[fatal].last_seen = time.monotonic() - 0.5
        started = time.monotonic()
        monitor.start()
        deadline = started + 15
        while time.monotonic() < deadline and fatal not in master.dead:
            master.workers[other].last_seen = time.monotonic()
            time.sleep(0.02)
        waited = time.monotonic() - started + 0.5
        assert fatal in master.dead and "silent for" in master.dead[fatal]
        # (at least the longer timeout: a lower bound, which a slow machine cannot break)
        assert waited >= master.failure_timeout_s * FATAL_SILENCE_FACTOR
        assert any("its loss would end the job" in text for _, text in master.events)
    finally:
        master.end_watching()
        monitor.join(2)


def test_the_job_master_gives_a_worker_whose_heartbeats_came_late_lately_longer():
    """Two workers fall silent alone; the one whose last heartbeat came 0.6 s after the one
    before it (a starved host, timeout 0.5 s) is declared only after twice that gap."""
    master = _master(mode="liverobin", workers=4)
    master.failure_timeout_s = 0.5
    now = time.monotonic()
    for w in range(4):
        master.workers[w].last_seen = now - 0.05
        master.heartbeat(Heartbeat(worker=w, attempt=0))
    master.workers[1].last_seen = time.monotonic() - 0.6
    master.heartbeat(Heartbeat(worker=1, attempt=0))  # 0.6 s after the one before
    monitor = threading.Thread(target=watch.monitor, args=(master, 0.02,), daemon=True)
    try:
        started = time.monotonic()
        monitor.start()
        deadline = started + 10
        while time.monotonic() < deadline and not {0, 1} <= set(master.dead):
            for w in (2, 3):
                master.workers[w].last_seen = time.monotonic()
            time.sleep(0.02)
        assert {0, 1} <= set(master.dead)
        assert "apart lately" in master.dead[1] and "apart lately" not in master.dead[0]
        # 1 outlived 0, both silent from the start (a round of the monitor never spans the 0.7 s between:
        # a longer one counts as a stall of the driver, and silence is counted from then on)
        order = [w for _, text in master.events for w in (0, 1)
                 if text.startswith(f"worker {w} (executor") and "declared dead" in text]
        assert order == [0, 1]
    finally:
        master.end_watching()
        monitor.join(2)


def test_a_worker_is_given_the_shared_timeout_until_its_first_heartbeat():
    info = WorkerInfo(0, 0, "0", "127.0.0.1:4000", last_seen=10.0)
    assert info.patience(11.0, 2.0) == SHARED_SILENCE_FACTOR
    info.heard = True
    assert info.patience(11.0, 2.0) == 1.0


def test_the_job_master_waits_longer_for_a_worker_building_its_replicas_before_its_first_heartbeat():
    """Between its registration and its first heartbeat a worker builds its replicas (their state,
    a savepoint's entries, its sources) on a host where other executors start too: silent alone
    that long, it is declared dead only after the shared timeout, and the reason says why."""
    master = _master(mode="liverobin", workers=3)
    master.failure_timeout_s = 0.2
    master.workers[1].heard = False
    monitor = threading.Thread(target=watch.monitor, args=(master, 0.02,), daemon=True)
    try:
        started = time.monotonic()
        master.workers[1].last_seen = started
        monitor.start()
        _beat_until_declared(master, 1, others=(0, 2), timeout=10)
        waited = time.monotonic() - started
        assert list(master.dead) == [1] and "had not sent its first heartbeat" in master.dead[1]
        assert waited >= master.failure_timeout_s * SHARED_SILENCE_FACTOR  # (a lower bound)
    finally:
        master.end_watching()
        monitor.join(2)


def test_the_job_master_asks_spark_for_its_executors_at_the_poll_period_not_every_round():
    """Spark's list of executors is a py4j call: asked for every ``executor_poll_s``, while the
    loop's rounds (silence, restores, the status file) go on every ``period_s``; an executor
    gone from the list is declared dead at the next poll."""
    master = _master(mode="liverobin", workers=3)
    registered = ["0", "1", "2"]
    asked: list[float] = []

    def executor_ids() -> list[str]:
        asked.append(time.monotonic())
        return list(registered)

    master.executor_ids = executor_ids
    monitor = threading.Thread(target=watch.monitor, args=(master, 0.01, 0.25), daemon=True)
    try:
        started = time.monotonic()
        monitor.start()
        while time.monotonic() - started < 1.0:
            for info in master.workers.values():
                info.last_seen = time.monotonic()
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        assert 1 <= len(asked) <= elapsed / 0.25 + 1  # not once per 10 ms round
        assert master.dead == {}
        registered.remove("1")
        _beat_until_declared(master, 1, others=(0, 2))
        assert list(master.dead) == [1] and "executor 1 left the cluster" in master.dead[1]
    finally:
        master.end_watching()
        monitor.join(2)
