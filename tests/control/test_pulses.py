"""The driver's heartbeat generators (replication.control.pulses) and a KaZoo handover's pulse window, in
process: generators are fakes that record what they were told, the workers' acks are fed to the
job master by hand, so every interleaving is the test's to choose."""

from __future__ import annotations

import threading
import time
import types

import pytest

from liverobin.heartbeats import PulseLog
from liverobin.segments import HeartbeatLog
from replication import JobHandle
from replication.config import ReplicationConfig
from replication.control.master import JobMaster
from replication.control.outputs import OutputService
from replication.control.pulses import DriverPulses, switch_pulse
from replication.examples.ordered import build_ordered_job
from replication.heartbeat_parts import OutputProgress, ReplicaAck
from replication.plan import place, plan_job
from rhino_state import Batched


class FakeGenerator:
    """What DriverPulses needs of a HeartbeatGenerator; ``fail()`` makes its thread die of an error."""

    def __init__(self, name: str, from_segment: int, windowed: bool, last_h: int = 0) -> None:
        self.name, self.from_segment, self.windowed = name, from_segment, windowed
        self.pulses = PulseLog()
        self.pulses.last_h = last_h
        self.error: str | None = None
        self.alive = False
        self.window: tuple[int, dict] | None = None
        self.opened: list[int] = []
        self.closed_at: int | None = None  # the window's last pulse, once ended
        self.eager_s = 0.0
        self.finish_grace: float | None = None
        self.cursor = types.SimpleNamespace(segment=from_segment)  # where it reads the log

    def start(self) -> FakeGenerator:
        self.alive = True
        return self

    def kill(self, timeout: float = 5.0) -> None:
        self.alive = False

    def fail(self, error: str) -> None:
        self.error, self.alive = error, False

    def eager(self, seconds: float) -> None:
        self.eager_s = seconds

    def finish(self, grace_s: float) -> None:
        self.finish_grace = grace_s

    def open_window(self, window: int, floor: dict) -> None:
        self.window, self.closed_at = (window, floor), None
        self.opened.append(window)

    def close_window(self, timeout: float) -> int | None:
        if not self.alive:
            return None
        self.pulses.last_h += 1
        self.closed_at, self.window = self.pulses.last_h, None
        return self.closed_at


class Factory:
    def __init__(self, last_h: int = 0) -> None:
        self.made: list[FakeGenerator] = []
        self.last_h = last_h

    def __call__(self, name: str, from_segment: int, windowed: bool) -> FakeGenerator:
        gen = FakeGenerator(name, from_segment, windowed, self.last_h)
        self.made.append(gen)
        return gen


@pytest.fixture
def quiet_pulses():
    """A factory of fake generators and the DriverPulses that uses it (events dropped), closed after."""
    factory = Factory()
    pulses = DriverPulses(factory, HeartbeatLog("hb"), lambda text: None)
    yield factory, pulses
    pulses.close()


def _until(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_generator_that_dies_of_an_error_is_replaced_and_goes_on_with_the_open_window():
    events: list[str] = []
    factory = Factory(last_h=340)
    pulses = DriverPulses(factory, HeartbeatLog("hb", per_segment=100), events.append)
    try:
        first = pulses.open_window(3, {"a": {0: 17}})
        assert first.windowed and first.opened == [3] and first.from_segment == 0
        first.fail("KafkaException: broker down")
        _until(lambda: len(factory.made) == 2)
        second = factory.made[1]
        # it reads the log from the segment before the largest pulse counted, and writes window 3
        # from the same floor
        assert second.windowed and second.window == (3, {"a": {0: 17}}) and second.from_segment == 2
        assert pulses.close_window(timeout=2.0) == 341 and second.closed_at == 341
        assert any("g1 died (KafkaException: broker down)" in e for e in events), events
        assert any("g2 writes pulse window 3 in its place" in e for e in events), events
        assert len(factory.made) == 2  # replaced once
    finally:
        pulses.close()


def test_a_killed_generator_stays_stopped_and_one_that_ended_the_run_is_done():
    events: list[str] = []
    factory = Factory()
    pulses = DriverPulses(factory, HeartbeatLog("hb"), events.append)
    try:
        killed, finished, failed = pulses.start(), pulses.start(), pulses.start()
        assert pulses.kill() == ["g1", "g2", "g3"]
        failed.error = "ValueError: bad record"
        _until(lambda: len(factory.made) == 4)
        time.sleep(0.5)  # the watcher's next rounds replace nothing more
        assert len(factory.made) == 4 and not factory.made[3].windowed
        assert not killed.alive and not finished.alive and factory.made[3].alive
    finally:
        pulses.close()


def test_a_generator_started_while_a_handover_waits_for_pulses_is_eager_too(quiet_pulses):
    """A LiveRobin generator restarted during a handover (a crash, then a new one) must be eager
    like the one it replaces: the steps' switch and release are pulses counted ahead, and at
    the idle rate (a pulse per source batch) a step of a soak took 20 s instead of 1."""
    _, pulses = quiet_pulses
    first = pulses.start()
    pulses.eager(30.0)
    assert first.eager_s == 30.0
    pulses.kill()
    second = pulses.start()
    assert 29.0 < second.eager_s <= 30.0
    pulses.eager(0)
    assert second.eager_s == 0 and pulses.start().eager_s == 0.0


def test_a_generator_that_dies_during_a_drain_is_replaced_by_one_that_writes_the_final_pulse(quiet_pulses):
    factory, pulses = quiet_pulses
    first = pulses.start()
    pulses.finish(0.31)
    assert first.finish_grace == 0.31
    first.fail("KafkaException: all brokers down")
    _until(lambda: len(factory.made) == 2)
    assert factory.made[1].finish_grace == 0.31  # else the sources never end


# -- a KaZoo handover's pulse window, driven in process ------------------------------------------

G, V = 64, 8


def _handle() -> tuple[JobHandle, Factory]:
    plan = plan_job(build_ordered_job("a", "b", "out", name="win"), default_parallelism=2, num_key_groups=G,
                    num_vnodes=V, topic_partitions={"a": 2, "b": 2})
    plan.replicas = 2
    plan.heartbeat_log = HeartbeatLog("win.hb")
    cfg = ReplicationConfig.from_mapping({
        "spark.replication.kafka.bootstrapServers": "127.0.0.1:9", "spark.replication.mode": "kazoo",
        "spark.replication.zookeeper.connect": "127.0.0.1:9", "spark.replication.enabled": "true"})
    placement = place(plan, 3)
    master = JobMaster(plan, placement, 3, cfg, job_name="win")
    handle = JobHandle(build_ordered_job("a", "b", "out", name="win"), cfg, plan, placement, master,
                       server=None, sc=None, group="win")
    factory = Factory(last_h=1000)
    handle.pulses = DriverPulses(factory, plan.heartbeat_log, master.event)
    return handle, factory


def _sources_hold(handle: JobHandle) -> None:
    """Every source replica reports holding for the window the driver announced (heartbeats)."""
    master = handle.master
    _until(lambda: master.windows.word is not None and master.windows.word.is_open)
    with master.locked():
        window = master.windows.word.window
        for rid in handle.placement:
            if handle.plan.task(rid[0]).is_source:
                master.windows.holding[rid] = (window, {rid[1]: 5})
        master.changed()


def _move_in_thread(outcome: dict, move) -> threading.Thread:
    """Run ``move()`` in a thread; its report or error into ``outcome``."""
    def run() -> None:
        try:
            outcome["report"] = move()
        except Exception as exc:  # noqa: BLE001 - asserted by the caller
            outcome["error"] = exc

    mover = threading.Thread(target=run)
    mover.start()
    return mover


def _first_step(handle: JobHandle) -> int:
    """The sources hold for the window; the first step's handover id once it is instructed."""
    _sources_hold(handle)
    _until(lambda: handle.master.handovers is not None and handle.master.handovers.orders)
    return next(iter(handle.master.handovers.orders))


def _committed_step(handle: JobHandle) -> int:
    """The first step, once every participant replica armed it (committed): its handover id."""
    hid = _first_step(handle)
    for role in ("upstream", "origin", "target"):
        _ack(handle, "armed", role, hid)
    assert handle.master.handovers.orders[hid].committed
    return hid


def _ack(handle: JobHandle, kind: str, role: str, hid: int) -> None:
    master = handle.master
    with master.locked():
        coordinator = master.handovers
        order = coordinator.orders[hid]
        task = order.task
        instances = {"upstream": sorted(order.upstreams), "origin": [(task, p) for p in sorted(order.origins)],
                     "target": [(task, p) for p in sorted(order.targets)]}[role]
        for text in coordinator.on_acks([ReplicaAck(hid, order.epoch, (t, p, r), kind, "d", 1, 0, -1)
                                         for t, p in instances for r in (0, 1)]):
            master.event(text)
        master.changed()


def test_a_kazoo_window_stays_open_past_the_deadline_until_the_committed_step_completes():
    """The caller's timeout passes between a step's commit and its switch pulse (a loaded machine):
    the step only rolls forward, so the window's pulses must go on.  Closing the window then (as
    the driver did) left the step short of its switch for good, and the moved keys' records held."""
    handle, factory = _handle()
    outcome: dict = {}
    mover = _move_in_thread(outcome, lambda: handle.move_vnodes("chain", [0, 1], 1, timeout=1.0, margin_s=5.0))
    try:
        hid = _committed_step(handle)
        time.sleep(1.5)  # the deadline passes with the step committed, before its switch
        gen = factory.made[0]
        assert mover.is_alive() and gen.window is not None and gen.closed_at is None, handle.master.events
        assert handle.master.windows.word.is_open, "the window closed with a committed step short of its switch"
        _ack(handle, "switched", "upstream", hid)
        _ack(handle, "cut", "origin", hid)
        _ack(handle, "loaded", "target", hid)
        mover.join(5)
        assert not mover.is_alive() and "error" not in outcome, outcome
        assert outcome["report"]["state"] == "completed", outcome
        assert gen.closed_at is not None and not handle.master.windows.word.is_open
        texts = [t for _, t in handle.master.events]
        assert any("past its deadline: it rolls forward" in t for t in texts), texts
    finally:
        mover.join(10)
        handle.pulses.close()


def test_a_step_not_committed_by_the_deadline_is_cancelled_and_the_job_stops_cleanly():
    handle, factory = _handle()
    with pytest.raises(TimeoutError, match="not committed: cancelled"):
        threading.Thread(target=_sources_hold, args=(handle,), daemon=True).start()
        handle.move_vnodes("chain", [0, 1], 1, timeout=0.5, margin_s=5.0)
    with handle.master.locked():
        coordinator = handle.master.handovers
        assert coordinator.rolling_forward() == [] and [o.cancelled for o in coordinator.orders.values()] == [True]
        assert coordinator.manager.tables[coordinator.orders[1].task].epoch == 0
    assert factory.made[0].closed_at is not None and not handle.master.windows.word.is_open


def test_a_job_past_its_deadline_stops_between_steps_and_says_how_far_it_got():
    handle, factory = _handle()
    outcome: dict = {}
    mover = _move_in_thread(outcome, lambda: handle.move_vnodes("chain", [0, 1, 2], 1, timeout=1.0, margin_s=0.1,
                                                                strategy=Batched(1)))
    try:
        hid = _first_step(handle)
        for kind, role in (("armed", "upstream"), ("armed", "origin"), ("armed", "target"), ("switched", "upstream"),
                           ("cut", "origin")):
            _ack(handle, kind, role, hid)
        time.sleep(1.2)  # past the deadline
        _ack(handle, "loaded", "target", hid)
        mover.join(5)
        assert isinstance(outcome.get("error"), TimeoutError), outcome
        assert "stopped after 1 of 3 step(s): not done within 1s" in str(outcome["error"])
        with handle.master.locked():
            table = handle.master.handovers.manager.tables[handle.master.handovers.record(hid).task]
        assert [table.partition_of_vnode(v) for v in (0, 1, 2)] == [1, 0, 0]
        assert factory.made[0].closed_at is not None
    finally:
        mover.join(10)
        handle.pulses.close()


def _regenerated(handle: JobHandle, keys) -> None:
    """A worker reports the writers of ``keys`` past what their outputs held when they took over."""
    with handle.master.locked():
        OutputService(handle.master).on_report(0, OutputProgress(regenerated=frozenset(keys)))


def test_a_resumed_kazoo_run_opens_no_window_before_its_outputs_are_past_what_the_run_before_wrote():
    """A resumed run's sources first replay records whose results the run before wrote, which the
    outputs skip by seq; a window's pulses among them would route and order them otherwise, and
    the outputs would lose some results and write others twice.  So the window waits until every
    exactly-once output's writer has produced past what its output held."""
    handle, factory = _handle()
    master = handle.master
    with master.locked():
        master.outputs.resume({})
        outputs = sorted(master.outputs.roles)
    assert outputs, "the job has exactly-once outputs"
    outcome: dict = {}
    mover = _move_in_thread(outcome, lambda: handle.move_vnodes("chain", [0, 1], 1, timeout=30, margin_s=0.1))
    try:
        _until(lambda: any("has written again what the run before wrote" in t for _, t in master.events))
        _regenerated(handle, outputs[1:])
        time.sleep(0.2)  # (the handover thread would have opened the window by now)
        assert master.windows.word is None and not any(gen.opened for gen in factory.made), master.events
        _regenerated(handle, outputs[:1])
        hid = _first_step(handle)  # the window opens, the sources hold, the step goes out
        for kind, role in (("armed", "upstream"), ("armed", "origin"), ("armed", "target"), ("switched", "upstream"),
                           ("cut", "origin"), ("loaded", "target")):
            _ack(handle, kind, role, hid)
        mover.join(10)
        assert outcome.get("report", {}).get("state") == "completed", outcome
    finally:
        mover.join(10)
        handle.pulses.close()


def test_a_resumed_kazoo_run_whose_outputs_stay_behind_refuses_a_handover_naming_them():
    handle, factory = _handle()
    with handle.master.locked():
        handle.master.outputs.resume({})
        keys = [key for key in handle.master.outputs.roles if key[2] == "dlq"]
    _regenerated(handle, keys)
    with pytest.raises(TimeoutError, match=r"not written again what the run before wrote within 0.3s \(sink chain-sink"):
        handle.move_vnodes("chain", [0, 1], 1, timeout=0.3, margin_s=0.1)
    assert not any(gen.opened for gen in factory.made) and handle.master.windows.word is None


def test_a_job_stopped_while_a_committed_step_waits_for_its_pulses_ends_the_wait():
    """No step completes once the job is stopped (its generators are killed): the handover call
    must not wait for one forever."""
    handle, factory = _handle()
    outcome: dict = {}
    mover = _move_in_thread(outcome, lambda: handle.move_vnodes("chain", [0, 1], 1, timeout=30.0, margin_s=5.0))
    try:
        _committed_step(handle)
        with handle.master.locked():
            handle.master.command = "stop"
            handle.master.changed()
        mover.join(5)
        assert not mover.is_alive(), "the handover call still waits for a stopped job"
        assert "the job ended during handover" in str(outcome.get("error")), outcome
    finally:
        mover.join(10)
        handle.pulses.close()


def test_a_handover_counts_its_margins_in_pulses_at_the_rate_they_are_written(quiet_pulses, monkeypatch):
    """A step switches at a pulse counted ahead: at 100 pulses a second 0.5 s is 50 pulses, at the
    eager gap's 20 a second only 10 (counted at the period, the step would wait 2.5 s)."""
    from replication.control import pulses as pulses_module

    factory, pulses = quiet_pulses
    gen = pulses.start()
    pulses._stopped.set()  # (the watcher samples no more: this test does)
    clock = [100.0]
    monkeypatch.setattr(pulses_module.time, "monotonic", lambda: clock[0])

    def written(h: int, after_s: float) -> None:
        clock[0] += after_s
        gen.pulses.last_h = h
        pulses._sample()

    assert pulses.period_ms(10) == 50.0  # nothing seen yet: pulses come at least every eager gap
    written(0, 0.0)
    written(100, 1.0)
    assert pulses.period_ms(10) == 10.0  # a source grows all the time: one a period
    written(125, 1.0)
    written(150, 1.0)
    assert pulses.period_ms(10) == 40.0  # over the last two seconds
    written(152, 1.0)
    written(154, 1.0)
    assert pulses.period_ms(10) == 50.0  # idle before the handover: it makes them come every 50 ms
    assert switch_pulse(154, 0.5, pulses.period_ms(10)) == 164


def test_a_kazoo_handover_counts_its_margins_at_the_rate_its_window_is_written(quiet_pulses, monkeypatch):
    """A window's pulses come at most one a period: each waits until the one before is read back
    from the log, 20-30 ms on a loaded machine.  Counted at the 10 ms period, the 3 -> 2 rescale of
    the handover benchmark released its steps 2-3 times later than planned, and its moved keys
    waited as long.  Before the window's pulses span a second their rate is not trusted: the
    margins are counted at the period then (later than planned, never sooner)."""
    from replication.control import pulses as pulses_module

    factory, pulses = quiet_pulses
    gen = pulses.start(windowed=True)
    pulses._stopped.set()
    clock = [100.0]
    monkeypatch.setattr(pulses_module.time, "monotonic", lambda: clock[0])

    def sampled(h: int, after_s: float = 0.2) -> None:
        clock[0] += after_s
        gen.pulses.last_h = h
        pulses._sample()

    for _ in range(8):
        sampled(40)  # no window: nothing written
    assert pulses.period_ms(10, windowed=True) == 10.0
    for h in (50, 60, 70, 80):
        sampled(h)  # a window opened: one pulse every 20 ms, for 0.8 s since the last quiet sample
    assert pulses.period_ms(10, windowed=True) == 10.0  # not trusted yet
    sampled(90)
    assert pulses.period_ms(10, windowed=True) == pytest.approx(20.0)
    assert switch_pulse(90, 0.5, pulses.period_ms(10, windowed=True)) == 115
    for h in (100, 110, 120, 130, 140, 150):
        sampled(h)
    assert pulses.period_ms(10, windowed=True) == pytest.approx(20.0)  # the quiet samples before the window are gone
    sampled(150)  # the window closed
    assert pulses.period_ms(10, windowed=True) == 10.0
    for h in range(151, 160):
        sampled(h, 0.4)  # a generator that barely gets the CPU: the margins assume 50 ms at most
    assert pulses.period_ms(10, windowed=True) == 50.0


def test_generators_of_a_resumed_run_read_the_log_from_the_pulse_its_cut_knew():
    """A resumed run writes on in the log of the run before, whose segments may be many: its first
    generator reads from the segment of the pulse the cut recorded, not from the first."""
    factory = Factory()
    pulses = DriverPulses(factory, HeartbeatLog("hb", per_segment=100), lambda text: None, first_h=1234)
    try:
        assert pulses.start().from_segment == 12
    finally:
        pulses.close()
    fresh = DriverPulses(Factory(), HeartbeatLog("hb", per_segment=100), lambda text: None)
    try:
        assert fresh.start().from_segment == 0
    finally:
        fresh.close()


def test_the_segments_no_reader_needs_are_deleted_and_no_others():
    """Segments go once the readers outside the driver (the sources, the restores Rhino and the
    durable store allow) and every generator, running or to be started, are past them, less a
    margin of two; nothing goes while the readers' positions are not all known."""
    factory = Factory(last_h=950)  # its generators have counted pulse 950 (segment 9)
    needed: list[int | None] = [None]
    deleted: list[str] = []
    pulses = DriverPulses(factory, HeartbeatLog("hb"), lambda text: None, needed_from=lambda: needed[0],
                          delete_topics=deleted.extend)
    try:
        gen = pulses.start()
        gen.cursor.segment = 9  # (a generator started now would read from segment 8)
        pulses._delete_unneeded()
        assert deleted == []
        needed[0] = 420  # segment 4
        pulses._delete_unneeded()
        assert deleted == ["hb.0", "hb.1"]
        needed[0], gen.cursor.segment = 900, 5  # a generator behind the sources holds the log back
        pulses._delete_unneeded()
        assert deleted == ["hb.0", "hb.1", "hb.2"]
        gen.cursor.segment = 9
        pulses._delete_unneeded()  # the generators to be started read from segment 8
        assert deleted == [f"hb.{n}" for n in range(6)]
    finally:
        pulses.close()

