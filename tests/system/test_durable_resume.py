"""Durable checkpoints on real Spark: a job whose driver (or every process) is killed under load
goes on from its last complete cut when started again, and its output holds every record once.

The first run is ``replication run`` in a process group of its own (driver, its JVM, a
local-cluster of 3 executors and their Python workers); the second is the same job, same name
and directory, on the tests' shared cluster.  The ordered hash-chain job makes lost state
visible: a key whose state were lost would start its chain again, and a record replayed twice or
skipped would break the chain.  Output is read with kafka-python, not the runtime's client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ops.chaos import kill_executor, locate
from ops.soak_check import read_topic
from replication import run, savepoint
from replication.config import ConfigError, ReplicationConfig
from replication.control.launch import prepare
from replication.durability import rescale_savepoint_dir
from replication.examples.ordered import HashChain, build_ordered_job, verify_chains
from rhino_state.durable import DurableStore
from rhino_state.keys import RoutingTable
from tests.ordered_runs import (
    fed_without_pause,
    replicas_sharing_worker,
    rhino_conf,
    source_topics,
    wait_until,
    where_missing,
)
from tests.s3_server import s3_uri

pytestmark = pytest.mark.integration

JOB_MODULE = '''
from replication.examples.ordered import build_ordered_job


def build():
    return build_ordered_job({a!r}, {b!r}, {out!r}, name={name!r})
'''


def _conf(stack, mode: str, checkpoints: Path | str, replicated: bool = True) -> dict[str, str]:
    return rhino_conf(stack, mode, replicated, **{"spark.replication.checkpointDir": str(checkpoints)})


def _wait(cond, timeout: float, what: str) -> None:
    wait_until(cond, timeout, what, poll_s=0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _first_run(stack, tmp_path: Path, name: str, a: str, b: str, conf: dict[str, str],
               executors: int) -> tuple[subprocess.Popen, Path]:
    """``replication run`` of the ordered job in a process group of its own; returns it and its log."""
    module = tmp_path / f"{name.replace('-', '_')}_job.py"
    module.write_text(JOB_MODULE.format(a=a, b=b, out=f"{name}out", name=name))
    cmd = [sys.executable, "-m", "ops.cli", "run", f"{module.stem}:build", "--master",
           f"local-cluster[{executors},1,512]"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if "PYTHONPATH" in os.environ:  # (a worktree run: the executors import the code under test)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    logfile = tmp_path / f"{name}-first-run.log"
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, logfile


def _kill(proc: subprocess.Popen, everything: bool) -> None:
    """SIGKILL the driver alone (its JVM, executors and workers then die with the application), or
    every process of the run at once; wait until none is left."""
    try:
        if everything:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended already (the caller reports why)
    proc.wait(30)
    deadline = time.monotonic() + 90
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _group_alive(proc.pid):  # an executor that outlives its driver this long is not what is tested
        os.killpg(proc.pid, signal.SIGKILL)


def _outputs(stack, topic: str) -> list[dict]:
    import json

    return [json.loads(r.value) for r in read_topic(stack.bootstrap_servers, topic, quiet_s=1.0)]


def _killed_and_resumed(stack, spark, tmp_path: Path, name: str, mode: str, *, everything: bool,
                        replicated: bool = True, damage=None, parallelism: int = 2, checkpoints: str | None = None,
                        conf_extra: dict[str, str] | None = None, second_conf: dict[str, str] | None = None,
                        in_first_run=None, in_second_run=None):
    """Run the job under load until its directory (``checkpoints``, by default one in ``tmp_path``)
    holds two cuts (``in_first_run()`` after the first), kill it, (``damage`` the directory), start
    it again (the chain task at ``parallelism``, ``second_conf`` added; ``in_second_run(handle)``
    once it started); ``conf_extra``: for both runs.  Returns (result, fed ids, the cut resumed
    from, cuts before)."""
    a, b = source_topics(stack, name)
    checkpoints = checkpoints or str(tmp_path / "checkpoints")
    conf = {**_conf(stack, mode, checkpoints, replicated), **(conf_extra or {})}
    store = DurableStore(checkpoints, name)
    with fed_without_pause(stack, a, b) as ids:
        proc, logfile = _first_run(stack, tmp_path, name, a, b, conf, executors=3 if replicated else 2)
        try:
            # a cut with state in it, and another after it
            _wait(lambda: _latest_consumed(store) >= 150 or proc.poll() is not None, 240, "a cut with state")
            assert proc.poll() is None, logfile.read_text()[-4000:]
            if in_first_run is not None:
                in_first_run()
            first = max(store.cut_numbers())
            _wait(lambda: max(store.cut_numbers()) > first or proc.poll() is not None, 120, "one more cut")
            assert proc.poll() is None, logfile.read_text()[-4000:]
        finally:
            _kill(proc, everything)
        cuts_before = store.cut_numbers()
        if damage is not None:
            damage(store)
        cut = store.read_cut(store.cut_numbers()[-1])
        handle = run(build_ordered_job(a, b, f"{name}out", name=name, parallelism=parallelism), spark=spark,
                     conf={**conf, **(second_conf or {})})
        try:
            handle.wait_started(180)
            if parallelism == 2:
                assert handle.plan.resume is not None, "the second run did not resume"
                cut = handle.plan.resume.cut
            else:  # resumed at 2, drained into a savepoint, started at `parallelism` from it
                assert handle.plan.savepoint is not None and handle.plan.task(
                    next(t.id for t in handle.plan.tasks if t.name == "chain")).parallelism == parallelism
            time.sleep(1)  # the second run under load a while
            if in_second_run is not None:
                in_second_run(handle)
        except BaseException:
            handle.stop()
            raise
    result = handle.drain(timeout=300)
    return result, ids, cut, cuts_before


def _consumed(cut, task: str = "chain") -> int:
    """Elements ``task``'s partitions had consumed at ``cut``."""
    task_id = cut.plan["tasks"][task]["id"]
    return sum(sum(part.positions.values()) for (t, _), part in cut.parts.items() if t == task_id)


def _latest_consumed(store: DurableStore) -> int:
    numbers = store.cut_numbers()
    return _consumed(store.read_cut(numbers[-1])) if numbers else 0


def _check(stack, name: str, result, ids) -> None:
    outputs = _outputs(stack, f"{name}out")
    report = verify_chains(outputs, ids)
    assert report.exact, f"{report}; {where_missing(stack, name, report.missing)}"
    assert not result.divergences


@pytest.mark.parametrize("mode, replicated, where", [
    ("liverobin", True, "s3"),
    pytest.param("kazoo", True, "path", marks=pytest.mark.slow),
    pytest.param("liverobin", False, "path", marks=pytest.mark.slow),
])
def test_a_job_goes_on_exactly_once_after_its_driver_is_killed(request, stack, spark, topic_prefix, tmp_path, mode,
                                                               replicated, where):
    """By default on an object store (an S3 server): every executor uploads there and every worker
    of the second run builds its state from there."""
    name = f"{topic_prefix}dk{mode[:2]}{int(replicated)}"
    checkpoints = s3_uri(request.getfixturevalue("s3_endpoint")) if where == "s3" else None
    result, ids, cut, before = _killed_and_resumed(stack, spark, tmp_path, name, mode, everything=False,
                                                   replicated=replicated, checkpoints=checkpoints)
    assert cut.number == before[-1] and _consumed(cut) >= 100, cut
    _check(stack, name, result, ids)


def _cli(tmp_path: Path, *args: str, timeout: float = 120) -> str:
    """``replication <args>`` (the operator's command line) on this machine; its output."""
    done = subprocess.run([sys.executable, "-m", "ops.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("mode", ["kazoo", pytest.param("liverobin", marks=pytest.mark.slow)])
def test_a_job_resumed_after_a_handover_routes_as_its_cut_and_hands_over_again(stack, spark, topic_prefix, tmp_path,
                                                                               mode):
    """The first run moves vnodes (``replication move``), runs on past a cut that followed, and
    its driver is killed; the cut is the one the second run resumes from (the newer ones are
    deleted), so that run first replays what the first one wrote over 15 s.  A cut lies past
    every handover (each participant checkpointed after acting on it), and says how the keyed
    task routes: the resumed run plans from there, so it moves vnodes back (KaZoo: in a pulse
    window numbered above the first run's, which its restored sources had handled), and the
    output is exact.  Before, the resumed driver planned from the job's initial routing and a
    cut could fall between a handover's participants: the output held duplicates and broken
    chains, and the second move never switched.  And a KaZoo window opened during the replay:
    its pulses fell among records whose results the first run had written, so they were ordered
    otherwise the second time, and the outputs, which skip by seq what they hold, lost some
    results and wrote others twice (a window now waits until the outputs are past the replay)."""
    name = f"{topic_prefix}dkhov{mode[0]}"
    store = DurableStore(str(tmp_path / "checkpoints"), name)
    resume_from: list[int] = []

    def move_away() -> None:
        _cli(tmp_path, "move", name, "chain", "0-3", "1")
        before = max(store.cut_numbers())
        _wait(lambda: max(store.cut_numbers()) > before, 60, "a cut after the move")
        resume_from.append(max(store.cut_numbers()))
        time.sleep(15)  # what the first run writes past that cut, the second replays

    def back_to(store_: DurableStore) -> None:
        for number in store_.cut_numbers():
            if number > resume_from[0]:
                store_.fs.delete_file(store_.cut_path(number))

    def move_back(handle) -> None:  # (KaZoo: the timeout includes the wait for the replay)
        report = handle.move_vnodes("chain", handle.routing("chain").vnodes_of(1)[:4], 0, timeout=120)
        assert report["state"] == "completed", report

    result, ids, cut, _ = _killed_and_resumed(stack, spark, tmp_path, name, mode, everything=False, damage=back_to,
                                              conf_extra={"spark.replication.checkpointDir.retain": "100"},
                                              in_first_run=move_away, in_second_run=move_back)
    assert cut.number == resume_from[0], (cut.number, resume_from)
    chain = cut.plan["tasks"]["chain"]["id"]
    assert RoutingTable.from_dict(cut.run["routing"][str(chain)]).vnodes_of(1)[:4] == (0, 1, 2, 3), cut.run
    _check(stack, name, result, ids)


@pytest.mark.parametrize("parallelism", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_an_operator_replaced_at_runtime_keeps_its_new_function_across_a_resume(stack, spark, topic_prefix,
                                                                                tmp_path, parallelism):
    """The first run replaces the chain function by a salted version, a cut follows, and the run
    ends.  The second run is started with the job's original function: every partition restores
    its checkpoint, which holds the replacement, so every record of the second run is salted and
    the chains link up across both runs (the new version kept the state).  Its own replacement
    is version 2: the cut says which version the operator runs.  Started with the chain on 3
    partitions, the second run goes through a savepoint (resumed at 2, drained, started at 3
    from it), which carries the function and its version as well."""
    name = f"{topic_prefix}dkcode{parallelism}"
    a, b = source_topics(stack, name)
    checkpoints = str(tmp_path / "checkpoints")
    conf = _conf(stack, "liverobin", checkpoints)
    store = DurableStore(checkpoints, name)
    with fed_without_pause(stack, a, b) as ids:
        first = run(build_ordered_job(a, b, f"{name}out", name=name), spark=spark, conf=conf)
        try:
            first.wait_started(120)
            _wait(lambda: _latest_consumed(store) >= 150, 120, "a cut with state")
            report = first.replace_operator("chain", "chain", HashChain(salt="v2|"))
            assert report["state"] == "completed", report
            # a cut queued before the commit may be written after it: the cut says what it holds
            _wait(lambda: store.read_cut(max(store.cut_numbers())).run.get("code_versions"), 120,
                  "a cut after the replacement")
        finally:
            first.stop()
        cut = store.read_cut(max(store.cut_numbers()))
        chain = cut.plan["tasks"]["chain"]["id"]
        assert cut.run["code_versions"] == [[chain, "chain", 1]], cut.run
        first_run_n: dict[str, int] = {}
        for rec in _outputs(stack, f"{name}out"):
            first_run_n[rec["key"]] = max(first_run_n.get(rec["key"], 0), rec["n"])
        second = run(build_ordered_job(a, b, f"{name}out", name=name, parallelism=parallelism), spark=spark,
                     conf=conf)
        try:
            second.wait_started(120)
            if parallelism == 2:
                assert second.plan.resume is not None and second.plan.resume.cut.number >= cut.number
            else:
                assert second.plan.savepoint_code and second.plan.savepoint is not None, second.plan.savepoint
            time.sleep(1)  # the second run under load a while
            again = second.replace_operator("chain", "chain", HashChain(salt="v3|"))
            assert again["state"] == "completed" and again["version"] == 2, again
            time.sleep(1)
        except BaseException:
            second.stop()
            raise
    result = second.drain(timeout=300)
    _check(stack, name, result, ids)
    outputs = _outputs(stack, f"{name}out")
    by_key: dict[str, list[dict]] = {}
    for rec in outputs:
        by_key.setdefault(rec["key"], []).append(rec)
    versions = {"": 0, "v2|": 2, "v3|": 3}
    for recs in by_key.values():  # per key: each version from some element on, never an older one again
        salts = [versions[rec.get("salt", "")] for rec in sorted(recs, key=lambda r: r["n"])]
        assert salts == sorted(salts), salts
    second_run = [rec for rec in outputs if rec["n"] > first_run_n.get(rec["key"], 0) and "timer" not in rec]
    assert second_run and all(rec.get("salt") in ("v2|", "v3|") for rec in second_run), second_run[:5]
    assert any(rec.get("salt") == "v3|" for rec in second_run)


@pytest.mark.slow
def test_a_resumed_job_that_loses_an_executor_before_its_own_first_checkpoint_rolls_back_to_the_cut(
        stack, spark, topic_prefix, tmp_path):
    """Replication off (checkpoint-restart), LiveRobin. The second run takes no checkpoint of its
    own (``checkpointEvery`` at its maximum), so no worker holds one when an executor dies: every
    partition instance on it is rolled back to the cut it resumed from, built from the directory
    on a free worker, and the output is still exact."""
    name = f"{topic_prefix}dlost"

    def kill_an_executor(handle) -> None:
        victim = "chain[0]r0"
        lost = replicas_sharing_worker(handle, victim)
        _wait(lambda: handle.sink_metrics().records_out > 0, 60, "output of the second run")
        kill_executor(locate(victim, job=name))
        _wait(lambda: len(handle.recoveries()) >= lost, 180, f"{lost} partitions rolled back to the cut")

    result, ids, cut, before = _killed_and_resumed(
        stack, spark, tmp_path, name, "liverobin", everything=False, replicated=False,
        second_conf={"spark.replication.rhino.checkpointEvery": "1000000"}, in_second_run=kill_an_executor)
    _check(stack, name, result, ids)
    assert result.recoveries and all(rec["rollback"] for rec in result.recoveries), result.recoveries
    for rec in result.recoveries:  # each from its partition's checkpoint in the cut
        task, rest = rec["replica"].split("[", 1)
        inst = (cut.plan["tasks"][task]["id"], int(rest.split("]", 1)[0]))
        assert rec["checkpoint_id"] == cut.parts[inst].checkpoint_id, (rec, cut.parts[inst])
    assert any("built from the durable cut" in text for _, text in result.events), result.events


def _corrupt_the_newest_increment(store: DurableStore) -> str:
    """Flip a byte in the payload of a checkpoint the latest cut has and the one before it does not
    (the previous cut stays whole); returns the file."""
    latest, previous = (store.read_cut(n) for n in store.cut_numbers()[-1:-3:-1])
    older = {inc.file for inst, part in previous.parts.items() for inc in store.chain(inst, part.file)}
    inst, part = next((inst, part) for inst, part in sorted(latest.parts.items()) if part.file not in older)
    path = f"{store.root}/increments/t{inst[0]}-p{inst[1]}/{part.file}.inc"
    with store.fs.open_input_stream(path) as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF
    with store.fs.open_output_stream(path) as f:
        f.write(bytes(data))
    return part.file


@pytest.mark.parametrize("mode, replicated", [
    ("kazoo", False),
    pytest.param("kazoo", True, marks=pytest.mark.slow),
    pytest.param("liverobin", True, marks=pytest.mark.slow),
])
def test_every_process_killed_and_the_latest_cut_damaged_it_goes_on_from_the_one_before(
        stack, spark, topic_prefix, tmp_path, mode, replicated):
    """The driver, its JVM, the executors and their workers all killed at once; the newest cut has
    a corrupted increment, so the run resumes from the cut before it, with more to replay, and the
    output is still exact (by default KaZoo without replication: checkpoint-restart)."""
    name = f"{topic_prefix}da{mode[:2]}{int(replicated)}"
    damaged = []
    result, ids, cut, before = _killed_and_resumed(
        stack, spark, tmp_path, name, mode, everything=True, replicated=replicated,
        damage=lambda store: damaged.append(_corrupt_the_newest_increment(store)))
    assert cut.number == before[-2] and _consumed(cut) >= 100, (cut, before)
    assert any(f"cut {before[-1]} skipped" in text and damaged[0] in text and "checksum mismatch" in text
               for _, text in result.events), result.events
    _check(stack, name, result, ids)


def _uploaded_part(store: DurableStore, tmp_path: Path):
    """A full checkpoint 7 of instance (2, 0), uploaded to ``store``: a cut's part."""
    from rhino_state.durable import CutPart
    from tests.rhino_state.test_rhino_store import Origin

    origin = Origin(tmp_path, instance=(2, 0))
    try:
        origin.write(0, 10, b"x")
        meta, payload = origin.checkpoint(7, full=True)
        return CutPart(7, store.upload(meta, payload, None).file, meta.digest)
    finally:
        origin.close()


def test_a_job_that_does_not_fit_its_checkpoints_is_refused_before_it_starts(stack, topic_prefix, tmp_path):
    """Checked by ``prepare`` (no Spark): other key groups are refused in one line naming the key;
    another parallelism is a resume at the checkpoints' first; with ``checkpointDir.ignore=true``
    the job starts empty and the old checkpoints are gone."""
    from replication.durability import plan_shape
    from rhino_state.durable import DurableCut

    name = f"{topic_prefix}dfit"
    a, b = source_topics(stack, name)
    checkpoints = tmp_path / "checkpoints"
    cfg = ReplicationConfig.from_mapping(_conf(stack, "liverobin", checkpoints))
    plan = prepare(build_ordered_job(a, b, f"{name}out", name=name), cfg)
    assert plan.resume is None
    store = DurableStore(str(checkpoints), name)
    part = _uploaded_part(store, tmp_path)
    store.write_cut(DurableCut(1, name, {(2, 0): part}, plan=plan_shape(plan, "liverobin"),
                               run={"output_prefix": "r0", "epoch_base": 0, "heartbeat_log": None}))
    assert prepare(build_ordered_job(a, b, f"{name}out", name=name), cfg).resume.cut.number == 1
    # another parallelism: resumed at the checkpoints' (then through a savepoint: run() does that)
    assert prepare(build_ordered_job(a, b, f"{name}out", name=name, parallelism=3), cfg).resume.parallelism == {
        "chain": 2, "chain-sink": 2}  # (the sink task follows the chain's parallelism)
    other_groups = ReplicationConfig.from_mapping({**_conf(stack, "liverobin", checkpoints),
                                                   "spark.replication.state.keyGroups": "256"})
    with pytest.raises(ConfigError) as refused:
        prepare(build_ordered_job(a, b, f"{name}out", name=name), other_groups)
    text = str(refused.value)
    assert text.startswith("spark.replication.checkpointDir=") and "\n" not in text
    assert "this run 256 (spark.replication.state.keyGroups)" in text
    ignore = ReplicationConfig.from_mapping({**_conf(stack, "liverobin", checkpoints),
                                             "spark.replication.checkpointDir.ignore": "true"})
    assert prepare(build_ordered_job(a, b, f"{name}out", name=name, parallelism=3), ignore).resume is None
    assert store.cut_numbers() == []


def test_a_kazoo_resume_goes_on_in_the_order_logs_its_cut_names(stack, topic_prefix, tmp_path):
    """Checked by ``prepare`` (no Spark): a KaZoo job resumed from a cut follows the order logs of
    the run that wrote it; a cut that names none (an earlier build's) is refused in one line."""
    from replication.durability import plan_shape
    from rhino_state.durable import DurableCut

    name = f"{topic_prefix}dko"
    a, b = source_topics(stack, name)
    checkpoints = tmp_path / "checkpoints"
    cfg = ReplicationConfig.from_mapping(_conf(stack, "kazoo", checkpoints))
    fresh = prepare(build_ordered_job(a, b, f"{name}out", name=name), cfg)
    assert fresh.resume is None and fresh.order_logs_prefix.startswith(f"_replication.{name}.orders.")
    assert {log_.prefix for log_ in fresh.order_logs.values()} == {
        f"{fresh.order_logs_prefix}.t{t}p{p}" for t, p in fresh.ordered_partitions()}
    store = DurableStore(str(checkpoints), name)
    part = _uploaded_part(store, tmp_path)
    run = {"output_prefix": "r0", "epoch_base": 0, "heartbeat_log": None}
    store.write_cut(DurableCut(1, name, {(2, 0): part}, plan=plan_shape(fresh, "kazoo"),
                               run=run))
    with pytest.raises(ConfigError) as refused:
        prepare(build_ordered_job(a, b, f"{name}out", name=name), cfg)
    text = str(refused.value)
    assert text.startswith("spark.replication.checkpointDir=") and "\n" not in text
    assert "names no KaZoo order logs" in text
    store.write_cut(DurableCut(2, name, {(2, 0): part}, plan=plan_shape(fresh, "kazoo"),
                               run={**run, "order_logs": fresh.order_logs_prefix}))
    resumed = prepare(build_ordered_job(a, b, f"{name}out", name=name), cfg)
    assert resumed.resume.cut.number == 2 and resumed.order_logs == fresh.order_logs


@pytest.mark.slow
@pytest.mark.parametrize("where", ["path", "s3"])
def test_a_job_killed_at_one_parallelism_goes_on_exactly_once_at_another(request, stack, spark, topic_prefix,
                                                                        tmp_path, where):
    """The chain task on 2 partitions, the driver killed; started again with the chain on 3: the job
    resumes at 2, drains into a savepoint beside the checkpoints and starts at 3 from it (its keys'
    state where their records now go). Every chain links across the three runs."""
    name = f"{topic_prefix}dpar"
    checkpoints = s3_uri(request.getfixturevalue("s3_endpoint")) if where == "s3" else str(tmp_path / "checkpoints")
    result, ids, cut, before = _killed_and_resumed(stack, spark, tmp_path, name, "liverobin", everything=False,
                                                   parallelism=3, checkpoints=checkpoints)
    assert cut.number == before[-1] and _consumed(cut) >= 100
    _check(stack, name, result, ids)
    store = DurableStore(checkpoints, name)
    # the old checkpoints went with the savepoint; the new run's cuts have the new parallelism
    assert store.cut_numbers() and all(store.read_cut(n).plan["tasks"]["chain"]["parallelism"] == 3
                                       for n in store.cut_numbers())
    assert not savepoint.holds_anything(rescale_savepoint_dir(checkpoints, name))


def _a_rescale_savepoint(stack, name: str, tmp_path: Path) -> tuple[Any, ReplicationConfig, Path, Path]:
    """The job (chain on 3), its config, checkpoint directory and the savepoint beside it of a resume
    at another parallelism, with its sources' parts written and no meta yet."""
    a, b = source_topics(stack, name)
    checkpoints = tmp_path / "checkpoints"
    between = checkpoints / f"{name}.rescale-savepoint"
    for task in ("source-a", "source-b"):
        for p in range(2):
            savepoint.write_replica(between, task, p, 0, {"offsets": {p: 40 + p}, "max_ts": {}, "emitted_wm": 0})
    cfg = ReplicationConfig.from_mapping(_conf(stack, "liverobin", checkpoints))
    return build_ordered_job(a, b, f"{name}out", name=name, parallelism=3), cfg, checkpoints, between


def _complete(between: Path, name: str, cfg: ReplicationConfig, **code_versions: int) -> None:
    """Write the meta of the savepoint of :func:`_a_rescale_savepoint` (``code_versions``: the
    chain task's replaced operators)."""
    savepoint.write_meta(between, job=name, num_key_groups=cfg.state_key_groups,
                         tasks={"source-a": 2, "source-b": 2, "chain": 2}, sources=["source-a", "source-b"],
                         keyed=["chain"], code_versions={("chain", op): v for op, v in code_versions.items()})


def test_only_a_durable_resume_s_savepoint_keeps_the_functions_replaced_at_runtime(stack, topic_prefix, tmp_path,
                                                                                    caplog):
    """Checked by ``prepare`` (no Spark): the savepoint a resume at another parallelism goes
    through runs the replaced functions and counts their versions on, as the resume would have;
    the same savepoint given as ``restoreFrom`` to a job without those checkpoints is an upgrade
    path: the job's own functions run, the versions start over, and a warning names them."""
    name = f"{topic_prefix}dspc"
    job, cfg, _, between = _a_rescale_savepoint(stack, name, tmp_path)
    _complete(between, name, cfg, chain=2)
    plan = prepare(job, cfg)
    chain = next(t.id for t in plan.tasks if t.name == "chain")
    assert plan.savepoint is not None and plan.savepoint_code and plan.code_versions == {(chain, "chain"): 2}
    upgrade = ReplicationConfig.from_mapping({**rhino_conf(stack, "liverobin", True),
                                              "spark.replication.restoreFrom": str(between)})
    with caplog.at_level("WARNING", logger="replication.control.launch"):
        plan = prepare(job, upgrade)
    assert plan.savepoint is not None and not plan.savepoint_code and plan.code_versions == {}
    assert "starts with the job's own functions" in caplog.text and "operator 'chain' of task 'chain' (version 2)" \
        in caplog.text, caplog.text


def test_a_start_between_a_rescaling_resume_and_its_first_cut_goes_on_from_its_savepoint(stack, topic_prefix,
                                                                                          tmp_path):
    """Checked by ``prepare`` (no Spark): the job's checkpoints were deleted once the savepoint of a
    resume at another parallelism was complete; until the new run writes a cut, a new start goes on
    from that savepoint; ``checkpointDir.ignore=true`` deletes it too."""
    name = f"{topic_prefix}dsp"
    job, cfg, checkpoints, between = _a_rescale_savepoint(stack, name, tmp_path)
    assert prepare(job, cfg).savepoint is None  # no meta file: not a complete savepoint
    _complete(between, name, cfg)
    plan = prepare(job, cfg)
    assert plan.resume is None and plan.savepoint is not None and plan.savepoint[0] == str(between)
    source_a = next(t.id for t in plan.tasks if t.name == "source-a")
    assert plan.source_start_offsets[source_a] == {0: 40, 1: 41}
    ignore = ReplicationConfig.from_mapping({**_conf(stack, "liverobin", checkpoints),
                                             "spark.replication.checkpointDir.ignore": "true"})
    assert prepare(job, ignore).savepoint is None and not between.exists()
