"""``replication soak`` without a cluster: what it refuses before starting anything, and its
verdict, which must catch every kind of wrong output (replication.soak, replication.soak_check)."""

from __future__ import annotations

import pytest

from replication import soak
from replication.examples.ordered import chain_step
from replication.soak_check import verify


def test_a_fault_outside_the_mode_s_catalogue_is_refused_in_one_line(capsys):
    assert soak.main(["--mode", "kazoo", "--faults", "pause-long,kill-generator"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "kill-generator" in err and "kazoo catalogue" in err


def test_run_soak_refuses_unknown_faults_before_starting_a_stack():
    with pytest.raises(ValueError, match="not in the liverobin catalogue"):
        soak.run_soak("liverobin", 10, 1, faults=("restart-zookeeper",))


def _chain(key: str, ids: list[str]) -> list[dict]:
    out, prev, seen = [], "", {}
    for n, event_id in enumerate(ids, start=1):
        source = event_id.split("-", 1)[0]
        seen[source] = seen.get(source, 0) + 1
        h = chain_step(prev, event_id)
        out.append({"key": key, "n": n, "id": event_id, "prev": prev, "h": h, "source": source,
                    "seen": seen[source]})
        prev = h
    return out


def test_the_verdict_passes_exact_output_and_names_every_kind_of_fault():
    ids = ["a-0", "b-0", "a-1", "b-1"]
    good = _chain("k1", ["a-0", "b-0"]) + _chain("k2", ["a-1", "b-1"])
    letters = [("t-a", 0, 5)]
    assert verify(good, ids, letters, {("t-a", 0, 5)}, ("a", "b")).exact
    lost = verify(good[:-1], ids, letters, {("t-a", 0, 5)}, ("a", "b"))
    assert lost.lost == 1 and not lost.exact
    twice = verify(good + good[:1], ids, letters, {("t-a", 0, 5)}, ("a", "b"))
    assert twice.duplicated == 1 and not twice.exact
    reordered = _chain("k1", ["b-0", "a-0"]) + _chain("k2", ["b-1", "a-1"])  # a valid chain, other order
    assert verify(reordered, ids, letters, {("t-a", 0, 5)}, ("a", "b")).exact
    swapped = _chain("k1", ["a-1", "a-0"]) + _chain("k2", ["b-0", "b-1"])  # a source's order broken
    assert verify(swapped, ids, letters, {("t-a", 0, 5)}, ("a", "b")).broken_keys == ["k1"]
    letters_twice = verify(good, ids, letters * 2, {("t-a", 0, 5), ("t-b", 1, 2)}, ("a", "b"))
    assert (letters_twice.dead_letters_missing, letters_twice.dead_letters_duplicated) == (1, 1)
    assert letters_twice.dead_letters_wrong == ["t-a[0]@5 x2"] and not letters_twice.exact
    stray = verify(good, ids, [*letters, ("t-a", 0, 9)], {("t-a", 0, 5)}, ("a", "b"))
    assert (stray.dead_letters_duplicated, stray.dead_letters_unexpected) == (0, 1) and not stray.exact
    assert stray.dead_letters_wrong == ["t-a[0]@9 not malformed"]


def test_a_fault_s_clock_starts_when_its_signal_goes_out_not_while_its_target_is_looked_for(monkeypatch):
    """Recovery times are counted from the kill: finding the process (reading /proc, slow on a
    loaded machine) is the soak's own time, not the job's."""
    import random
    import time
    from types import SimpleNamespace

    from replication import chaos

    signals: list[float] = []
    injector = soak.Injector(handle=None, stack=None, rnd=random.Random(1))
    located = SimpleNamespace(executor="3", worker=1)

    def slow_locate(replica):
        time.sleep(0.2)
        return located

    monkeypatch.setattr(injector, "_replicas", lambda: ["chain[0]r1"])
    monkeypatch.setattr(injector, "_locate", slow_locate)
    monkeypatch.setattr(injector, "_lost", lambda worker: lambda: True)
    monkeypatch.setattr(chaos, "kill_executor", lambda target: signals.append(time.monotonic()))
    before = time.monotonic()
    injector.inject("kill-executor")
    assert injector.struck_at is not None and injector.struck_at >= before + 0.2
    assert injector.struck_at <= signals[0]


def test_fewer_than_one_checkpoint_holder_is_refused_in_one_line(capsys):
    assert soak.main(["--rhino-replicas", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--rhino-replicas" in err


def test_a_fault_of_two_kills_is_back_counted_from_its_second():
    """kill-two's phases run from its first kill; what it is back after is the second one."""
    from replication.soak import Fault

    fault = Fault("kill-two", 10.0, phases={"noticed": 5.2, "caught_up": 5.6}, last_signal_s=5.1)
    assert round(fault.back_after_last_signal_s, 2) == 0.5
    assert Fault("kill-executor", 3.0, phases={"caught_up": 0.4}).back_after_last_signal_s == 0.4


def test_kills_that_left_one_live_worker_are_counted_apart_from_the_back_within_target():
    """With one live worker a lost replica cannot run apart from its twin until Spark relaunches
    a worker: the report counts those kills apart from the ones that had room to restore."""
    from replication.soak import Fault, SoakReport

    report = SoakReport("liverobin", 1, 600, 300, 5, 4, faults=[
        Fault("kill-executor", 10.0, survived=True, phases={"caught_up": 0.6}, live_workers=3),
        Fault("kill-two", 30.0, survived=True, phases={"caught_up": 9.0}, last_signal_s=5.0, live_workers=2),
        Fault("kill-two", 50.0, survived=True, phases={"caught_up": 19.0}, last_signal_s=5.0, live_workers=1),
        Fault("pause-long", 70.0, survived=True, phases={"caught_up": 3.4}, live_workers=3),
    ])
    lines = report.lines()
    assert any("kills back within 3 s of the last kill: 1 of the 2 that left two live workers or more; 1 left "
               "fewer" in line for line in lines), lines
    assert any("1 live worker(s): waited for a relaunch" in line for line in lines)
