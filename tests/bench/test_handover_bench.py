"""bench/handover.py without Spark: its job's state against the state model (a real RocksDB), the
output check, a step's phases and bytes as a real handover coordinator reports them from the
participants' acks, KaZoo's pulse window from the driver's real event texts, per-second binning, the
CSV rows and the plot (the real runs take minutes: see the module doc)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import handover as hb  # noqa: E402
from bench.common import CostSnapshot, PacedFeeder, cores_between  # noqa: E402
from replication.control.handover_coordinator import HandoverCoordinator  # noqa: E402
from replication.control.handover_timelines import step_phases  # noqa: E402
from replication.functions import ProcessContext, RuntimeContext  # noqa: E402
from replication.heartbeat_parts import ReplicaAck  # noqa: E402
from replication.plan import plan_job  # noqa: E402
from rhino_state import RocksDBStateBackend, VnodeMove, cut_key_groups  # noqa: E402
from rhino_state.state import StateContext  # noqa: E402

G, V = 64, 16


def test_the_command_parses_its_arguments():
    proc = subprocess.run([sys.executable, str(REPO / "bench/handover.py"), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--out" in proc.stdout and "--strategies" in proc.stdout
    args = hb.parse_args(["--sizes", "1MB,2.5MB", "--strategies", "fluid,all", "--no-restart"])
    assert args.sizes == [1_000_000, 2_500_000] and args.strategies == ["fluid", "all"] and not args.restart
    with pytest.raises(SystemExit):
        hb.parse_args(["--strategies", "fluent"])
    with pytest.raises(SystemExit):
        hb.parse_args(["--sizes", "lots"])
    # the matrix: operations x modes x sizes x strategies, then --also groups (defaults from the flags), each once
    assert args.modes == ["liverobin"] and args.operations == ["move"]
    assert args.runs == [hb.RunSpec("move", "liverobin", 1_000_000, "fluid"), hb.RunSpec("move", "liverobin", 1_000_000, "all"),
                         hb.RunSpec("move", "liverobin", 2_500_000, "fluid"), hb.RunSpec("move", "liverobin", 2_500_000, "all")]
    args = hb.parse_args(["--sizes", "1MB,20MB", "--modes", "liverobin,kazoo", "--operation", "move,rescale",
                          "--strategies", "all", "--also", "modes=kazoo sizes=1MB strategy=fluid",
                          "--also", "operations=move strategies=all"])
    assert args.operations == ["move", "rescale"] and args.modes == ["liverobin", "kazoo"]
    assert len(args.runs) == 2 * 2 * 2 + 2 and args.runs[0] == hb.RunSpec("move", "liverobin", 1_000_000, "all")
    assert args.runs[-2:] == [hb.RunSpec("move", "kazoo", 1_000_000, "fluid"),
                              hb.RunSpec("rescale", "kazoo", 1_000_000, "fluid")]
    for bad in (["--modes", "zookeeper"], ["--operations", "split"], ["--also", "modes"], ["--also", "rate=5"],
                ["--also", "strategies=fluent"], ["--modes", ""], ["--strategies", "batched:0:1MB"],
                ["--strategies", "batched:8:lots"], ["--strategies", "batched:"]):
        with pytest.raises(SystemExit):
            hb.parse_args(bad)


def test_rhino_modes_and_byte_capped_strategies():
    """A +rhino mode (or --rhino) turns Rhino checkpoints on, in LiveRobin every N pulses, in KaZoo every N
    order records or M records; batched:N:BYTES caps each step's state (decimal units, as --sizes)."""
    args = hb.parse_args(["--sizes", "1MB", "--modes", "liverobin,liverobin+rhino",
                          "--strategies", "all,batched:32:660KB,batched:4"])
    assert [(r.mode, r.strategy) for r in args.runs] == [
        (m, s) for m in ("liverobin", "liverobin+rhino") for s in ("all", "batched:32:660KB", "batched:4")]
    assert hb.strategy_of("batched:32:660KB", 8) == hb.Batched(32, max_bytes=660_000)
    assert hb.strategy_of("batched:4", 8) == hb.Batched(4) and hb.strategy_of("batched", 8) == hb.Batched(8)
    assert hb.strategy_label("batched:32:660KB", 8) == "batched 32 cap 660KB"
    assert hb.strategy_label("batched:32:2.5MB", 8) == "batched 32 cap 2.5MB"
    assert hb.strategy_label("batched", 8) == "batched 8"
    assert hb.max_steps("batched:32:660KB", 32, 8) == 32 and hb.max_steps("batched:4", 32, 8) == 8
    rhino = hb.parse_args(["--rhino", "--sizes", "1MB", "--strategies", "all", "--modes", "liverobin,kazoo"])
    assert [r.mode for r in rhino.runs] == ["liverobin+rhino", "kazoo+rhino"]
    kazoo = hb.parse_args(["--sizes", "1MB", "--strategies", "all", "--modes", "kazoo",
                           "--also", "modes=kazoo+rhino sizes=20MB", "--kazoo-checkpoint-every", "30"])
    assert [(r.mode, r.size) for r in kazoo.runs] == [("kazoo", 1_000_000), ("kazoo+rhino", 20_000_000)]
    for bad in (["--modes", "kazoo+passive"], ["--checkpoint-elements", "0"], ["--kazoo-checkpoint-every", "0"]):
        with pytest.raises(SystemExit):
            hb.parse_args(bad)
    every = hb.checkpointing(kazoo)
    assert every == hb.Checkpointing(pulses=20, orders=30, elements=200)
    on = hb.job_conf("b:9092", 10, "liverobin+rhino", checkpoints=every)
    assert on["spark.replication.mode"] == "liverobin" and on["spark.replication.rhino.enabled"] == "true"
    assert on["spark.replication.rhino.checkpointEvery"] == "20" and "spark.replication.rhino.checkpointElements" not in on
    kz = hb.job_conf("b:9092", 10, "kazoo+rhino", zookeeper="z:2181", checkpoints=hb.Checkpointing())
    assert kz["spark.replication.mode"] == "kazoo" and kz["spark.replication.zookeeper.connect"] == "z:2181"
    assert (kz["spark.replication.rhino.enabled"], kz["spark.replication.rhino.checkpointEvery"],
            kz["spark.replication.rhino.checkpointElements"]) == ("true", "50", "200")
    assert hb.job_conf("b:9092", 10)["spark.replication.rhino.enabled"] == "false"
    # --period: LiveRobin's heartbeat, KaZoo's window pulses; unset, the job's default
    assert kz["spark.replication.kazoo.windowPulsePeriod"] == "10ms" and "spark.replication.liverobin.heartbeatPeriod" not in kz
    assert on["spark.replication.liverobin.heartbeatPeriod"] == "10ms"
    assert not any("Period" in k for k in hb.job_conf("b:9092", None, "kazoo", zookeeper="z:2181"))
    assert hb.job_conf("b:9092", 10, "kazoo", zookeeper="z:2181")["spark.replication.rhino.enabled"] == "false"
    with pytest.raises(ValueError, match="ZooKeeper"):
        hb.job_conf("b:9092", 10, "kazoo+rhino")
    assert [every.label(m) for m in hb.MODES] == ["off", "every 20 pulses", "off", "every 30 orders / 200 records"]
    # the state measured per vnode against the model, summed over the moved vnodes
    cols = hb.measured_columns([10, 20, 30, 40], [1, 3], 50)
    assert cols == {"bytes_measured": 60, "measured_vs_model": 1.2, "moved_vnode_bytes_min": 20,
                    "moved_vnode_bytes_max": 40, "state_bytes_measured": 100, "measured_bytes_per_vnode": 25.0}
    assert hb.measured_columns(None, [1], 50) == dict.fromkeys(hb.MEASURED_COLUMNS, "")


def test_every_vnode_gets_exactly_the_keys_asked_for():
    keys = hb.pick_keys(2, G, V)
    model = hb.StateModel(keys, 3, 100, G, V)
    assert len(keys) == len(set(keys)) == 2 * V
    assert sorted(model.vnode(k) for k in keys) == sorted(list(range(V)) * 2)
    assert len(model.keys_in([0, 5])) == 4 and set(model.keys_in([5])) <= set(keys)


def _drive(backend: RocksDBStateBackend, events: list[dict], entries: int, value_bytes: int) -> list[dict]:
    """Run the benchmark's PaddedChain over ``events`` on a real backend, as a keyed operator would."""
    state = StateContext(backend, "chain", G)
    fn = hb.PaddedChain(entries, value_bytes)
    fn.open(RuntimeContext(state, "chain", 0, 1))
    ctx, out = ProcessContext(), []
    for e in events:
        state.set_current_key(e["key"])
        ctx.key = e["key"]
        out += list(fn.process(e, ctx))
    return out


def _events(keys: list[str], n: int) -> list[dict]:
    return [{"id": f"a-{i}", "key": keys[i % len(keys)], "ts": 1000 + i} for i in range(n)]


def test_the_state_model_matches_what_the_job_writes_and_what_a_cut_takes(tmp_path):
    keys = list(hb.pick_keys(1, G, V))
    model = hb.StateModel(tuple(keys), 5, 300, G, V)
    backend = RocksDBStateBackend(str(tmp_path / "db"))
    try:
        outputs = _drive(backend, _events(keys, 3 * len(keys) + 7), model.entries, model.value_bytes)
        backend.flush()
        counts = {k: sum(1 for o in outputs if o["key"] == k) for k in keys}
        every = list(backend.iter_key_groups(range(G)))
        assert model.state(keys, counts) == (len(every), sum(2 + len(rest) + len(v) for _, rest, v in every))
        # what the origin cuts for moved vnodes 2, 3 (the runtime's own key-group ranges)
        moves = (VnodeMove(2, 0, 1), VnodeMove(3, 0, 1))
        cut = [e for groups in cut_key_groups(moves, 0, G, V) for e in backend.iter_key_groups(groups)]
        assert model.state(model.keys_in([2, 3]), counts) == (len(cut), sum(2 + len(r) + len(v) for _, r, v in cut))
        assert len(cut) == 2 * (2 + model.entries)  # one key per vnode
    finally:
        backend.close()
    # the pad size is chosen for the total asked for
    entries = hb.entries_for(200_000, keys, 300)
    assert abs(hb.StateModel(tuple(keys), entries, 300, G, V).total_bytes - 200_000) < len(keys) * 320


def test_the_output_check_finds_a_wrong_pad_value_a_lost_and_a_doubled_event(tmp_path):
    keys = ["k1", "k2", "k3"]
    backend = RocksDBStateBackend(str(tmp_path / "db"))
    try:
        outputs = _drive(backend, _events(keys, 40), 4, 64)
    finally:
        backend.close()
    ids = [f"a-{i}" for i in range(40)]
    assert hb.verify(outputs, ids, 4).exact and hb.verify(outputs, ids, 4).outcome == "yes"
    stale = [dict(o) for o in outputs]
    stale[20]["old"] = stale[16]["old"]  # the value before the last write: state from before a move
    v = hb.verify(stale, ids, 4)
    assert not v.exact and v.wrong_pad == 1 and "1 events read a wrong pad value" in v.outcome
    v = hb.verify(outputs[:-1] + [outputs[3]], ids, 4)
    assert not v.exact and "1 missing, 1 duplicated" in v.outcome
    assert "job failed: boom" in hb.verify(outputs, ids, 4, failure="boom").outcome


# a step's wall-clock times as its participants put them in their acks (the coordinator receives each
# ack at the time it comes with, ``now``): instructed 10.0, committed 10.2, upstreams switched 10.5, the
# origin cut 10.55, its cut at the target 10.6, the target at the release pulse 10.8, loaded 10.85,
# the held records processed 10.9, the driver knows 11.0
INSTRUCTED = 10.0
CUT = {"at": 10.55, "bytes": 48_000, "shipped": 6_000}
LOADED = {"at": 10.9, "arrived": 10.6, "release": 10.8, "loaded": 10.85, "from_store": 42_000}


def _coordinator_step() -> dict:
    """A move of vnodes 0 and 1 through a real HandoverCoordinator, its acks carrying the participants'
    times and bytes as the workers send them: the completed step as ``JobHandle.move_vnodes`` reports it."""
    plan = plan_job(hb.build_handover_job("in", "out", "x", 2, 10), default_parallelism=2, num_key_groups=G,
                    num_vnodes=V, topic_partitions={"in": 2})
    plan.replicas = 2
    chain = next(t for t in plan.tasks if t.name == hb.TASK)
    coord = HandoverCoordinator(plan)

    def feed(order, kind, instances, now, entries=0, times=None):
        acks = [ReplicaAck(order.handover_id, order.epoch, (t, p, r), kind, "d", entries, 0, -1, *([times] if times else []))
                for t, p in instances for r in (0, 1)]
        coord.on_acks(acks, now=now)

    done = coord.start_move(chain.id, [0, 1], 1, switch_at=100, release_at=110)
    feed(done, "armed", sorted(done.upstreams) + [(chain.id, 0), (chain.id, 1)], 10.2)
    feed(done, "switched", sorted(done.upstreams), 10.7, times={"at": 10.5})
    feed(done, "cut", [(chain.id, 0)], 10.7, entries=12, times=CUT)
    feed(done, "loaded", [(chain.id, 1)], 11.0, times=LOADED)
    hid = done.handover_id
    timeline = coord.times.timeline(hid)
    step = {"handover_id": hid, "vnodes": [0, 1], "origins": sorted(done.origins), "targets": sorted(done.targets),
            "state": coord.state(hid).value, "switch_at": 100, "release_at": 110, "pulse_at_request": 50,
            "entries_moved": coord.moved_entries(hid), "bytes_moved": coord.times.moved_bytes(hid),
            "bytes_shipped": coord.times.shipped_bytes(hid), "bytes_from_store": coord.times.store_bytes(hid),
            "bytes_planned": None, "release_s": 0.1, "instructed_at": INSTRUCTED, "timeline": timeline,
            "phases": step_phases(INSTRUCTED, timeline), "seconds": 1.05}
    return step


def test_a_steps_phases_and_bytes_come_from_the_participants_acks():
    step = _coordinator_step()
    assert step["state"] == "completed" and step["entries_moved"] == 12
    assert (step["bytes_moved"], step["bytes_shipped"], step["bytes_from_store"]) == (48_000, 6_000, 42_000)
    assert hb.step_span(step) == pytest.approx(1.0)
    # two steps like it in a job of 2.5 s: every phase summed, the rest is between the steps
    cols = hb.run_phases([step, step], total_s=2.5)
    assert list(cols) == list(hb.PHASE_COLUMNS)
    assert (cols.pop("window_open_s"), cols.pop("window_close_s")) == ("", "")  # LiveRobin: no pulse window
    assert cols == pytest.approx({"trigger_s": 0.4, "to_switch_s": 0.6, "alignment_s": 0.1, "transfer_s": 0.1,
                                  "release_wait_s": 0.4, "load_s": 0.1, "catch_up_s": 0.1, "acks_s": 0.2,
                                  "between_steps_s": 0.5, "held_max_s": 0.4, "blocked_s": 0.0})
    # the cut arrived after the release pulse: the target blocked there, and loading starts on arrival;
    # its held records were processed later too: the run's held is the longest
    late = {**step, "phases": step_phases(INSTRUCTED, {**step["timeline"], "arrived": 10.82, "caught_up": 10.95})}
    cols = hb.run_phases([step, late], total_s=2.5)
    assert (cols["transfer_s"], cols["release_wait_s"], cols["blocked_s"], cols["load_s"]) == pytest.approx(
        (0.05 + 0.27, 0.2, 0.02, 0.05 + 0.03))
    assert (cols["catch_up_s"], cols["acks_s"], cols["held_max_s"]) == pytest.approx((0.05 + 0.1, 0.1 + 0.05, 0.45))
    # KaZoo: the pulse window's opening and closing are phases of their own, not "between steps"
    cols = hb.run_phases([step, step], total_s=2.5, window=(0.3, 0.1))
    assert (cols["window_open_s"], cols["between_steps_s"], cols["window_close_s"]) == pytest.approx((0.3, 0.1, 0.1))
    assert hb.run_phases([step], 1.5, window=("", 0.1))["between_steps_s"] == ""
    # a step that never completed: what it lacks is unknown, never a wrong sum
    unfinished = {**step, "timeline": {**step["timeline"], "caught_up": None, "completed": None}}
    unfinished["phases"] = step_phases(INSTRUCTED, unfinished["timeline"])
    cols = hb.run_phases([step, unfinished], 2.0)
    assert cols["trigger_s"] == pytest.approx(0.4) and cols["load_s"] == pytest.approx(0.1)
    assert cols["catch_up_s"] == cols["acks_s"] == cols["held_max_s"] == cols["between_steps_s"] == ""
    assert hb.run_phases([], 1.0)["trigger_s"] == ""


def test_kazoo_pulse_window_spans_from_the_driver_events():
    """The texts JobHandle._open_pulse_window / _close_pulse_window write: the window opened after the
    request (an earlier one is another handover job's), and the same window's close, after the last
    step's completion (its timeline's)."""
    events = [(5.0, "pulse window 1 open: every source replica holds its records (a handover)"),
              (6.0, "pulse window 1 closed at pulse 412"),
              (10.4, "pulse window 2 open: every source replica holds its records (a handover)"),
              (10.9, "handover job 2 of chain: rescale to 3 partitions (AllAtOnce, 1 step(s))"),
              (11.2, "pulse window 3 closed at pulse 9"),  # not ours
              (11.6, "pulse window 2 closed at pulse 530")]
    assert hb.window_marks(events, requested=10.0) == (10.4, 11.6)
    steps = [{"timeline": {"completed": 11.0}}, {"timeline": {"completed": 11.3}}]
    assert hb.window_spans(events, 10.0, steps) == pytest.approx((0.4, 0.3))
    failed = [(10.4, "pulse window 2 open: every source replica holds its records (a handover)"),
              (12.0, "pulse window 2: its last pulse was not written (timeout); the sources hold their records "
                     "until a generator ends it")]
    assert hb.window_marks(failed, 10.0) == (10.4, 12.0)
    assert hb.window_marks(events[:2], 10.0) == (None, None) and hb.window_spans(events[:2], 10.0, steps) == ("", "")
    assert hb.window_spans(events, 10.0, []) == pytest.approx((0.4, ""))


def test_a_rescale_is_on_target_when_exactly_its_partitions_own_vnodes_balanced():
    from rhino_state import RoutingTable

    up = hb.balanced_on([0, 1, 2])
    down = hb.balanced_on([0, 1])
    three = RoutingTable(tuple(i % 3 for i in range(V)), 3, 2)
    assert up(three, [2, 5]) and not down(three, [2, 5])
    two = RoutingTable(tuple(i % 2 for i in range(V)), 2, 3)
    assert down(two, [2, 5]) and not up(two, [2])
    lopsided = RoutingTable(tuple(0 if i < 10 else 1 for i in range(V)), 2, 3)
    assert not down(lopsided, [2])
    assert hb.max_steps("batched", 85, 8) == 11 and hb.max_steps("fluid", 85, 8) == 85 and hb.max_steps("all", 85, 8) == 1


def _obs() -> list[hb.Obs]:
    """Records at 100 ms steps from -3 s to +5 s around a request at t=100; the moved keys' records
    produced in [100, 101) are held 800 ms, and the first second of the load was slow (1 s: warm-up)."""
    out = []
    for i in range(-30, 50):
        t = 100 + i / 10
        moved = i % 2 == 0
        out.append(hb.Obs(t, t + 0.01 + (0.8 if moved and 0 <= i < 10 else 0.0) + (1.0 if i < -20 else 0.0), moved))
    return out


def test_per_second_binning_and_the_latency_windows():
    obs = _obs()
    bins = hb.per_second(obs, 100.0)
    assert list(bins) == list(range(-3, 5)) and all(len(g) == 10 for g in bins.values())
    assert [o.produced for o in bins[-1]][0] == pytest.approx(99.0)
    rows = hb.timeline_rows(obs, 100.0, {"size": "1MB", "strategy": "fluid"})
    by = {r["second"]: r for r in rows}
    assert by[0]["moved_records"] == 5 and by[0]["moved_max_ms"] == pytest.approx(810)
    assert by[0]["max_ms"] == pytest.approx(810) and by[1]["max_ms"] == pytest.approx(10)
    assert by[-2]["p50_ms"] == pytest.approx(10) and by[-2]["size"] == "1MB" and by[-3]["p50_ms"] == pytest.approx(1010)
    cols = hb.latency_columns(obs, requested=100.0, ended=101.0, load=(97.0, 105.0), warm_up_s=1.0)
    assert cols["max_before_ms"] == pytest.approx(10) and cols["max_during_ms"] == pytest.approx(810)
    assert cols["moved_p99_during_ms"] == pytest.approx(810) and cols["p99_after_ms"] == pytest.approx(10)
    assert cols["worst_second_p99_ms"] == pytest.approx(810) and cols["unmoved_worst_second_p99_ms"] == pytest.approx(10)
    assert hb.window_columns(obs, 200.0, 201.0, "x") == {"p99_x_ms": "", "max_x_ms": "", "moved_p99_x_ms": "",
                                                        "moved_max_x_ms": ""}


def test_rows_csv_and_plot(tmp_path):
    step = _coordinator_step()
    steps = [step]
    report = {"state": "completed", "steps": steps, "entries_moved": 12, "seconds": 1.2}
    labels = {"mode": "liverobin", "operation": "move", "size": "1MB", "strategy": "all-at-once"}
    obs = _obs()
    latency = hb.latency_columns(obs, 100.0, 101.0, (97.0, 105.0), 1.0)
    verdict = hb.Verdict(hb.verify_chains([], []))
    extra = {"state_bytes": 1_000_000, "vnodes": 256, "bytes_per_vnode": 3906.25, "vnodes_moved": 2,
             "error": "", "on_target": "yes", "produced": 0}
    row = hb.run_row(labels, report, (12, 48_000), verdict, latency,
                     {**extra, **hb.measured_columns([30_000, 19_000] + [0] * 254, [0, 1], 48_000)})
    assert list(row) == list(hb.RUN_COLUMNS)
    assert row["bytes_measured"] == 49_000 and row["bytes_planned"] == ""  # no byte cap: nothing planned
    assert (row["bytes_cut"], row["bytes_shipped"], row["bytes_from_store"]) == (48_000, 6_000, 42_000)
    assert row["entries_match"] == "yes" and row["bytes_moved"] == 48_000 and row["exact"] == "yes"
    assert row["between_steps_s"] == pytest.approx(0.2) and row["max_during_ms"] == pytest.approx(810)
    assert (row["transfer_s"], row["held_max_s"]) == pytest.approx((0.05, 0.4))
    assert hb.run_row(labels, report, (13, 1), verdict, latency, extra)["entries_match"] == "no"
    assert row["mode"] == "liverobin" and row["operation"] == "move" and row["window_open_s"] == ""
    failed = hb.run_row(labels, None, (0, 0), None, {}, {"error": "TimeoutError: x", "exact": "no"})
    assert failed["error"] == "TimeoutError: x" and failed["handover_s"] == "" and failed["exact"] == "no"
    assert failed["bytes_shipped"] == "" and failed["trigger_s"] == ""
    # a KaZoo rescale row: its pulse window's spans are phases, its steps name origins and targets
    up = {"mode": "kazoo", "operation": hb.RESCALE_UP, "size": "20MB", "strategy": "batched 8"}
    kz_steps = [{**step, "origins": [0, 1], "targets": [2]}]
    kz = hb.run_row(up, {**report, "steps": kz_steps, "seconds": 1.6}, (12, 48_000), verdict, latency, extra,
                    window=(0.25, 0.15))
    assert kz["window_open_s"] == 0.25 and kz["between_steps_s"] == pytest.approx(0.2) and kz["mode"] == "kazoo"
    # a KaZoo + Rhino byte-capped row: the driver's plan per step, the measured bytes of each step's vnodes
    capped = {"mode": "kazoo+rhino", "operation": "move", "size": "20MB", "strategy": "batched 32 cap 60KB"}
    cap_steps = [{**step, "bytes_planned": 49_000}, {**step, "bytes_planned": 11_000, "bytes_shipped": 0}]
    rh = hb.run_row(capped, {**report, "steps": cap_steps, "seconds": 2.2}, (12, 48_000), verdict, latency,
                    {**extra, "checkpoints": 40, "divergences": 0}, window=(0.3, 0.1))
    assert rh["bytes_planned"] == 60_000 and rh["max_step_bytes_planned"] == 49_000 and rh["checkpoints"] == 40
    assert (rh["bytes_cut"], rh["bytes_shipped"], rh["bytes_from_store"]) == (96_000, 6_000, 84_000)
    assert (rh["trigger_s"], rh["catch_up_s"], rh["held_max_s"]) == pytest.approx((0.4, 0.1, 0.4))
    measured = [30_000, 19_000] + [0] * 254
    cap_rows = hb.step_rows(capped, cap_steps, 10, measured)
    assert [r["bytes_planned"] for r in cap_rows] == [49_000, 11_000] and cap_rows[0]["bytes_measured"] == 49_000
    assert [r["step"] for r in cap_rows] == [1, 2] and cap_rows[1]["bytes_shipped"] == 0
    assert hb.step_rows(labels, steps, 10)[0]["bytes_measured"] == ""
    assert not hb.problems(hb.Results(runs=[rh])) and hb.problems(hb.Results(runs=[{**rh, "divergences": 1}]))
    res = hb.Results(runs=[row, {**failed, "strategy": "fluid"}, kz, rh],
                     steps=hb.step_rows(labels, steps, 10) + hb.step_rows(up, kz_steps, 10) + cap_rows,
                     timeline=hb.timeline_rows(obs, 100.0, labels) + hb.timeline_rows(obs, 100.0, up),
                     restart=[{"what": "idle", "start_s": 9.5, "stop_s": 1.5, "restart_s": 11.0, "status": "stopped"}])
    assert hb.problems(res) == ["liverobin move 1MB fluid"]
    hb.write_results(tmp_path, res)
    hb.print_tables(res)
    runs = list(csv.DictReader((tmp_path / "handover.csv").open()))
    assert [r["strategy"] for r in runs] == ["all-at-once", "fluid", "batched 8", "batched 32 cap 60KB"]
    assert runs[0]["trigger_s"] == "0.2" and runs[0]["bytes_measured"] == "49000"
    assert runs[0]["alignment_s"] == "0.05" and runs[0]["bytes_shipped"] == "6000"  # to the ms
    assert [(r["mode"], r["operation"]) for r in runs] == [("liverobin", "move")] * 2 + [("kazoo", "rescale 2->3"),
                                                                                     ("kazoo+rhino", "move")]
    first, kz_step, *_ = csv.DictReader((tmp_path / "handover_steps.csv").open())
    assert (first["alignment_s"], first["release_wait_s"], first["held_s"], first["blocked_s"]) == (
        "0.05", "0.2", "0.4", "0.0")
    assert (first["switch_at"], first["mode"], first["release_s"], first["total_s"]) == ("100", "liverobin", "0.1", "1.0")
    assert first["planned_switch_s"] == "0.5" and first["bytes_moved"] == "48000" and first["bytes_from_store"] == "42000"
    assert (kz_step["origins"], kz_step["targets"], kz_step["operation"]) == ("0 1", "2", "rescale 2->3")
    timeline = list(csv.DictReader((tmp_path / "handover_timeline.csv").open()))
    assert {r["mode"] for r in timeline} == {"liverobin", "kazoo"}
    for name in ("handover_timeline.csv", "restart.csv", "handover.png", "machine.txt"):
        assert (tmp_path / name).stat().st_size > 0, name
    # the CSV files read back (numbers as floats) redraw the plot
    back = hb.load_results(tmp_path)
    assert back.runs[2]["window_open_s"] == 0.25 and back.runs[1]["handover_s"] == "" and len(back.steps) == 4
    assert back.runs[3]["held_max_s"] == 0.4
    (tmp_path / "handover.png").unlink()
    assert hb.main(["--replot", "--out", str(tmp_path)]) == 0 and (tmp_path / "handover.png").stat().st_size > 0


def test_the_control_run_once_per_mode_and_size_and_each_row_against_its_seconds():
    """Operation none runs once per mode and size whatever the strategies; a handover row is compared
    with the control's per-second p99 in the same seconds of load, shifted by where each was requested."""
    args = hb.parse_args(["--modes", "kazoo", "--operations", "move,none", "--strategies", "all,batched"])
    assert args.runs == [hb.RunSpec(o, "kazoo", z, s) for o in ("move", "none") for z in (1_000_000, 20_000_000)
                         for s in (("all", "batched") if o == "move" else ("all",))]
    assert [r for r in args.runs if r.operation == "none"] == [hb.RunSpec("none", "kazoo", s, "all") for s in args.sizes]
    report = hb.idle_report(0.0)
    assert report["steps"] == [] and report["state"] == "no handover"
    control = {"mode": "kazoo", "operation": "none", "size": "20MB", "requested_at_s": 10.0, "handover_s": 45.0,
               "worst_second_p99_ms": 90.0, "p99_before_ms": 30.0}
    # requested 15.4 s into its load, 2.5 s long: its seconds 0..2 are the control's 5..7
    move = {"mode": "kazoo", "operation": "move", "size": "20MB", "requested_at_s": 15.4, "handover_s": 2.5,
            "worst_second_p99_ms": 120.0, "p99_before_ms": 20.0}
    other = {**move, "mode": "liverobin"}  # no control of its mode
    late = {**move, "requested_at_s": 60.0}  # past what the control covered
    timeline = [{"mode": "kazoo", "operation": "none", "size": "20MB", "second": s, "p99_ms": 10.0 * s}
                for s in range(-3, 50)]
    rows = [move, control, other, late]
    hb.compare_with_control(rows, timeline)
    assert move["control_worst_second_p99_ms"] == pytest.approx(70.0)
    assert move["worst_vs_control"] == pytest.approx(120 / 70) and move["worst_vs_before"] == pytest.approx(6.0)
    assert "control_worst_second_p99_ms" not in other and other["worst_vs_before"] == pytest.approx(6.0)
    assert "control_worst_second_p99_ms" not in late and "worst_vs_control" not in control
    assert control["worst_vs_before"] == pytest.approx(3.0)


def test_a_burst_of_the_load_generator_comes_back_to_back_at_the_same_mean_rate():
    """With ``--burst N`` the feeder produces N events at once every N/rate s: the same mean rate, fewer
    batches for the broker; ``--burst 0`` is refused before anything starts."""
    steady = PacedFeeder("unused:9092", lambda i: ("t", b"k", b"v"), rate=200.0)
    bursts = PacedFeeder("unused:9092", lambda i: ("t", b"k", b"v"), rate=200.0, burst=10)
    assert [steady._due(i) for i in (0, 1, 9, 10)] == pytest.approx([0.0, 0.005, 0.045, 0.05])
    assert [bursts._due(i) for i in (0, 1, 9, 10, 19, 20)] == pytest.approx([0.0, 0.0, 0.0, 0.05, 0.05, 0.1])
    with pytest.raises(ValueError, match="at least one record"):
        PacedFeeder("unused:9092", lambda i: ("t", b"k", b"v"), rate=200.0, burst=0)
    with pytest.raises(SystemExit):
        hb.parse_args(["--burst", "0"])


def test_the_cores_of_a_span_come_from_the_samples_inside_it():
    """Cores per group between the first and the last sample inside a span; a span with fewer than two
    samples has none; a handover row gets them before and during it, the job's processes summed."""
    def snap(at: float, broker: int, python: int) -> CostSnapshot:
        return CostSnapshot(at, {"broker": broker, "python": python, "executor_jvm": 0, "driver_jvm": 0,
                                 "zookeeper": 0, "bench": 999}, 0, 0)

    samples = [(1000.0 + t, snap(50.0 + t, 100 * t, 30 * t if t < 5 else 150 + 90 * (t - 5))) for t in range(11)]
    assert cores_between(samples, 1000.5, 1010.0, hz=100) == pytest.approx(
        {"broker": 1.0, "python": (150 + 450 - 30) / 100 / 9, "executor_jvm": 0, "driver_jvm": 0,
         "zookeeper": 0, "bench": 0})
    assert cores_between(samples, 1004.5, 1005.5, hz=100) == {}
    columns = hb.cpu_columns(samples, (1000.0, 1005.0), (1005.0, 1010.0))
    assert columns["broker_cores_before"] == pytest.approx(100 / os.sysconf("SC_CLK_TCK"))
    assert columns["workers_cores_during"] == pytest.approx(90 / os.sysconf("SC_CLK_TCK"))
    assert columns["cores_during"] == pytest.approx(190 / os.sysconf("SC_CLK_TCK"))
    assert hb.cpu_columns(samples, (0.0, 1005.0), (2000.0, 2010.0)) == dict.fromkeys(
        ("cores_before", "broker_cores_before", "workers_cores_before", "cores_during", "broker_cores_during",
         "workers_cores_during"), "")


def test_a_bench_whose_every_run_failed_writes_its_rows_and_draws_nothing(tmp_path, capsys):
    labels = {"mode": "kazoo", "operation": "move", "size": "1MB", "strategy": "all-at-once"}
    failed = hb.run_row(labels, None, (0, 0), None, {}, {"error": "NameError: x", "exact": "no"})
    hb.write_results(tmp_path, hb.Results(runs=[failed]))
    assert [r["error"] for r in csv.DictReader((tmp_path / "handover.csv").open())] == ["NameError: x"]
    assert not (tmp_path / "handover.png").exists() and "no run measured any latency" in capsys.readouterr().out
