"""``replication soak`` without a cluster: what it refuses before starting anything, and its
verdict, which must catch every kind of wrong output (ops.soak, ops.soak_check)."""

from __future__ import annotations

import pytest

from ops import soak
from ops.soak_check import verify
from replication.examples.ordered import chain_step


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

    from ops import chaos

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
    from ops.soak_report import Fault

    fault = Fault("kill-two", 10.0, phases={"noticed": 5.2, "caught_up": 5.6}, last_signal_s=5.1)
    assert round(fault.back_after_last_signal_s, 2) == 0.5
    assert Fault("kill-executor", 3.0, phases={"caught_up": 0.4}).back_after_last_signal_s == 0.4


def test_kills_that_left_one_live_worker_are_counted_apart_from_the_back_within_target():
    """With one live worker a lost replica cannot run apart from its twin until Spark relaunches
    a worker: the report counts those kills apart from the ones that had room to restore."""
    from ops.soak_report import Fault, SoakReport

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


def test_without_rhino_only_faults_that_lose_no_replica_are_drawn(capsys):
    assert soak.fault_catalogue("liverobin", None, rhino=False) == ("pause-short", "kill-generator")
    assert soak.fault_catalogue("kazoo", None, rhino=False) == ("pause-short", "restart-zookeeper")
    assert soak.main(["--mode", "kazoo", "--no-rhino", "--faults", "kill-executor"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "without Rhino" in err and "kill-executor" in err


class _Table:
    def __init__(self, assignment):
        self.assignment = tuple(assignment)
        self.parallelism = max(assignment) + 1  # (a rescale to 3 would widen it)

    def vnodes_of(self, p):
        return tuple(v for v, q in enumerate(self.assignment) if q == p)


class _Handle:
    """What the soak's mover calls, answering as the test says."""

    def __init__(self, assignment, answer):
        from types import SimpleNamespace

        self.plan = SimpleNamespace(tasks=[SimpleNamespace(name="chain", parallelism=3)])
        self.table, self.answer, self.calls = _Table(assignment), answer, []

    def routing(self, task):
        return self.table

    def _call(self, *args, **kw):
        self.calls.append((args, kw))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    move_vnodes = rescale = rebalance = _call


def test_the_soak_s_handovers_are_drawn_from_the_table_and_judged_by_their_outcome():
    """A handover completes, or is cancelled or refused with nothing moved; a timeout or any other
    error fails the soak."""
    import random
    import time

    from ops.soak_handovers import HandoverMover
    from ops.soak_report import SoakReport

    cases = [({"state": "completed", "steps": [{}, {}]}, "completed"),
             ({"state": "aborted", "steps": [], "reason": "replica lost before the commit"}, "cancelled"),
             (ValueError("a rescale needs the task idle"), "refused"),
             (TimeoutError("stopped after 1 of 4 step(s)"), "timed out"),
             (RuntimeError("boom"), "failed")]
    for seed in range(12):
        for answer, outcome in cases:
            handle = _Handle([0] * 8 + [1] * 8, answer)
            mover = HandoverMover(handle, "chain", random.Random(seed), time.monotonic(), lambda text: None)
            assert mover.start_one()
            mover.join(5)
            run = mover.runs[0]
            assert run.outcome == outcome and run.accepted == (outcome in ("completed", "cancelled", "refused"))
            (args, kw), = handle.calls
            assert args[0] == "chain" and kw["timeout"] == 120.0
            if run.kind == "rescale":  # two partitions own vnodes, three are hosted: up to three
                assert args[1] == 3 and run.what.startswith("rescale 2 -> 3")
                assert "batched 2" not in run.what and "batched 4" not in run.what  # at most 16 steps
            elif run.kind == "move":
                vnodes, target = args[1], args[2]
                origins = {handle.table.assignment[v] for v in vnodes}
                assert len(origins) == 1 and target not in origins and 1 <= len(vnodes) <= 4
                assert target < 2  # the table's partitions, not the spare the task hosts
    report = SoakReport("kazoo", 1, 60, 300, 5, 4, status="finished", handovers=mover.runs)
    assert not report.ok and SoakReport("kazoo", 1, 60, 300, 5, 4, status="finished").ok  # the last one failed
    assert any("handovers 1: failed 1" in line for line in report.lines())


def test_a_handover_call_that_ends_long_past_its_timeout_is_not_accepted(monkeypatch):
    """A committed step rolls forward past the call's timeout, but one that ended only with the
    job (minutes later) is a hang, not a cancel."""
    import random
    import time

    from ops import soak_handovers

    monkeypatch.setattr(soak_handovers, "TIMEOUT_S", 0.05)
    monkeypatch.setattr(soak_handovers, "ROLL_FORWARD_S", 0.05)

    class Slow(_Handle):
        def _call(self, *args, **kw):
            time.sleep(0.2)
            return super()._call(*args, **kw)

        move_vnodes = rescale = rebalance = _call

    mover = soak_handovers.HandoverMover(Slow([0] * 8 + [1] * 8, {"state": "aborted", "steps": [], "reason": "x"}),
                                         "chain", random.Random(1), time.monotonic(), lambda text: None)
    assert mover.start_one()
    mover.join(5)
    assert mover.runs[0].outcome == "overran" and not mover.runs[0].accepted


def test_a_duplicated_dead_letter_is_named_with_the_seq_and_offset_of_each_copy():
    """The same seq twice is a late batch of a fenced writer; two seqs are replicas numbering apart."""
    ids = ["a-0"]
    letters = [("t-a", 0, 5), ("t-a", 0, 5)]
    copies = {("t-a", 0, 5): ["rseq 8 at 120", "rseq 8 at 131"]}
    v = verify(_chain("k1", ids), ids, letters, {("t-a", 0, 5)}, ("a", "b"), copies)
    assert v.dead_letters_wrong == ["t-a[0]@5 x2 (rseq 8 at 120, rseq 8 at 131)"] and not v.exact


def test_a_duplicated_output_record_is_named_with_each_copy():
    ids = ["a-0", "b-0"]
    out = _chain("k1", ids)
    written = {"a-0": ["sink 3:0 rseq 4 at [0]@10", "sink 3:0 rseq 4 at [0]@12"]}
    v = verify(out + out[:1], ids, [], set(), ("a", "b"), None, written)
    assert v.duplicated == 1 and not v.exact
    assert v.duplicates_named == ["a-0 x2 (sink 3:0 rseq 4 at [0]@10, sink 3:0 rseq 4 at [0]@12)"]


def test_a_broken_chain_is_named_with_its_check_and_both_records_places() -> None:
    ids = ["a-0", "a-1", "a-2"]
    recs = _chain("k1", ids)
    recs[2] = {**recs[2], "prev": "elsewhere"}
    written = {"a-1": ["sink 3:0 rseq 1 at [0]@1"], "a-2": ["sink 3:1 rseq 0 at [1]@0"]}
    v = verify(recs, ids, [], set(), ("a", "b"), written=written)
    assert v.broken_keys == ["k1"]
    assert v.breaks_named == ["k1 at n 3: linked to another record than the one before it (the state it saw was "
                              "not the key's); a-1 n 2 (sink 3:0 rseq 1 at [0]@1); a-2 n 3 (sink 3:1 rseq 0 at [1]@0)"]
