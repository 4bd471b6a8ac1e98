"""How the driver runs a handover: its steps one by one at pulses counted ahead, inside a window of
pulses (caller-side of :class:`replication.control.handover_coordinator.HandoverCoordinator`).

LiveRobin's generators pulse eagerly while a handover runs; in KaZoo mode a pulse window is
opened (every source replica holds its records, a windowed generator writes pulses from their
positions) and closed once no committed step needs its pulses: a committed step only rolls
forward, and reaches its switch and release only while pulses are written.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from liverobin.windows import WindowWord
from replication.config import ReplicationConfig
from replication.control.handover_coordinator import HandoverCoordinator
from replication.control.handover_timelines import step_phases
from replication.control.master import JobFailedError, JobMaster
from replication.control.pulses import DriverPulses, switch_pulse
from replication.metrics import InstanceMetrics, window_text
from replication.plan import PhysicalPlan
from rhino_state import Batched, HandoverState, JobState
from rhino_state.handover import Strategy
from transport.ids import ReplicaId

# A handover job aborted because a participant was already past the switch pulse goes again this often.
LATE_RETRIES = 2


class HandoverSteps:
    """Runs handover jobs step by step for a :class:`JobHandle`'s calls."""

    def __init__(self, master: JobMaster, plan: PhysicalPlan, cfg: ReplicationConfig, placement: dict[ReplicaId, int],
                 pulses: Callable[[], DriverPulses | None], running: Callable[[], bool],
                 measure: Callable[[str, float], list[int]]) -> None:
        self.master, self.plan, self.cfg, self.placement = master, plan, cfg, placement
        self._pulses = pulses  # the handle's generators (None: neither LiveRobin nor KaZoo)
        self._running = running
        self._measure = measure  # state bytes per vnode of a task, within a timeout

    @property
    def pulses(self) -> DriverPulses | None:
        return self._pulses()

    def run_job(self, task: str, submit: Callable[[HandoverCoordinator, list[int] | None], int],
                what: str, strategy: Strategy, timeout: float, margin_s: float, release_s: float | None,
                gap_s: float) -> dict[str, Any]:
        """Submit a handover job and run its steps one by one, each at pulses about ``margin_s``
        ahead; the report of :meth:`HandoverCalls.move_vnodes`.  A byte cap (``Batched(max_bytes=...)``) plans
        the steps from the state bytes per vnode, measured first.  A job aborted because a
        participant was past the switch pulse when it heard of the step (a loaded worker's
        heartbeats were late) goes again for what is left, the switch twice as far ahead, up to
        :data:`LATE_RETRIES` times."""
        started = time.monotonic()
        deadline = started + timeout
        steps: list[dict[str, Any]] = []
        capped = (isinstance(strategy, Batched) and strategy.max_bytes is not None) or \
            self.cfg.handover_max_bytes_in_flight > 0
        sizes = self._measure(task, min(30.0, timeout)) if capped else None
        with self.window("a handover", timeout) as coordinator:
            master = self.master
            jobs: list[int] = []
            while True:
                job = submit(coordinator, sizes)
                jobs.append(job)
                master.event(f"handover job {job} of {task}: {what} ({type(strategy).__name__}, "
                             f"{len(coordinator.manager.job(job).steps)} step(s))")
                self._run_steps(coordinator, job, task, sizes, deadline, timeout, margin_s, release_s, gap_s, steps)
                ended = coordinator.manager.job(job)
                if not (ended.state is JobState.ABORTED and ended.late and len(jobs) <= LATE_RETRIES):
                    break
                # nothing of the aborted step happened: the rest goes again, its switch further ahead
                margin_s = 2 * max(margin_s, 0.25)
                master.event(f"handover job {job} of {task}: {ended.reason}; the rest again, the switch "
                             f"{margin_s:g}s ahead")
            state = coordinator.job_state(job)
            reason = coordinator.manager.job(job).reason
            table = coordinator.manager.tables[coordinator.manager.job(job).task]
        return {"job": job, "jobs": jobs, "state": state.value, "reason": reason, "steps": steps,
                "entries_moved": sum(s["entries_moved"] for s in steps), "seconds": time.monotonic() - started,
                "partitions": sorted(set(table.assignment))}

    def _run_steps(self, coordinator: HandoverCoordinator, job: int, task: str, sizes: list[int] | None,
                   deadline: float, timeout: float, margin_s: float, release_s: float | None, gap_s: float,
                   steps: list[dict[str, Any]]) -> None:
        """Instruct the steps of handover ``job`` one by one until it ends, each at pulses about
        ``margin_s`` ahead; each step's report is appended to ``steps``.  Past ``deadline`` no
        step is instructed: the job stops between two steps and TimeoutError says how far it got
        (a step committed before the deadline completes first: it only rolls forward)."""
        master = self.master
        while coordinator.job_state(job) is JobState.RUNNING:
            if time.monotonic() >= deadline:  # (why_not_next: what the job waits for, if anything)
                self._stop_job(coordinator, job, task, timeout, coordinator.manager.why_not_next(job))
            step_started = time.monotonic()
            period_ms = self._pulse_period_ms()
            pulse, switch_at = self.switch_pulse(margin_s, period_ms)
            margin = coordinator.next_release_s(job, sizes) if release_s is None else release_s
            release_at = switch_at + max(2, math.ceil(margin * 1000 / period_ms))
            instructed_at = time.time()
            order = coordinator.instruct_next(job, switch_at, release_at)
            if order is None:  # e.g. a lost replica not restored yet, or the bytes-in-flight cap: wait
                master.pause(0.1)
                continue
            master.ring_workers()  # the participants arm it from their next reply on
            hid = order.handover_id
            self.await_handover(coordinator, hid, deadline, f"during handover {hid}",
                                 f"handover {hid} of {task} not completed within {timeout}s")
            times = coordinator.times
            timeline, served = times.timeline(hid), times.served(hid)
            steps.append({"handover_id": hid, "vnodes": sorted(m.vnode for m in order.moves),
                          "origins": sorted(order.origins), "targets": sorted(order.targets),
                          "state": coordinator.state(hid).value,
                          "switch_at": switch_at, "release_at": release_at, "pulse_at_request": pulse,
                          "entries_moved": coordinator.moved_entries(hid),
                          "bytes_moved": times.moved_bytes(hid),
                          "bytes_shipped": times.shipped_bytes(hid),
                          "bytes_from_store": times.store_bytes(hid),
                          "bytes_planned": coordinator.record(hid).size_bytes if sizes else None,
                          "release_s": (release_at - switch_at) * period_ms / 1000,
                          "instructed_at": instructed_at, "timeline": timeline,
                          "phases": step_phases(instructed_at, timeline, served),
                          "served": served, "held_records": times.held_records(hid),
                          "seconds": time.monotonic() - step_started})
            if gap_s and coordinator.job_state(job) is JobState.RUNNING:
                master.pause(gap_s)

    def switch_pulse(self, margin_s: float, period_ms: float | None = None) -> tuple[int, int]:
        """The generators' last pulse, and the pulse about ``margin_s`` after it."""
        assert self.pulses is not None
        pulse = self.pulses.last_h
        return pulse, switch_pulse(pulse, margin_s, self._pulse_period_ms() if period_ms is None else period_ms)

    def _pulse_period_ms(self) -> float:
        """The time between pulses a handover counts its margins with: as the generators write
        them (``DriverPulses.period_ms``; KaZoo: in the open window)."""
        nominal = self.cfg.pulse_period_ms
        if self.pulses is None:
            return nominal
        return self.pulses.period_ms(nominal, windowed=self.cfg.mode == "kazoo")

    def _stop_job(self, coordinator: HandoverCoordinator, job: int, task: str, timeout: float,
                  why: str | None = None) -> None:
        """Stop handover ``job`` between two steps (its deadline passed) and raise TimeoutError."""
        manager = coordinator.manager
        ended = manager.job(job)
        manager.stop_job(job, f"not done within {timeout:g}s" + (f" ({why})" if why else ""))
        self.master.event(f"handover job {job} of {task}: {ended.reason}; the routing table stays at epoch "
                          f"{manager.tables[ended.task].epoch}")
        raise TimeoutError(f"handover job {job} of {task}: {ended.reason}")

    @contextlib.contextmanager
    def window(self, what: str, timeout: float) -> Iterator[HandoverCoordinator]:
        """The heartbeat generators pulse every period for up to ``timeout`` (``what`` switches at a
        pulse): LiveRobin's running ones, or in KaZoo mode one that writes a pulse window (the
        sources hold their records until it ends).  Inside, the caller holds the master's lock and
        has its coordinator.  The pulses go on until no committed handover needs them."""
        pulses = self.pulses
        if pulses is None:
            raise ValueError(f"{what} switches at a pulse: it needs spark.replication.mode=liverobin or kazoo")
        if self.cfg.mode == "kazoo":
            window = self._open_pulse_window(what, timeout)
        else:
            window = None
            if not pulses.live():
                raise ValueError(f"no heartbeat generator runs (start one with start_pulse_generator()): {what} "
                                 "switches at a pulse")
            pulses.eager(timeout)
        coordinator = None
        try:
            with self.master.locked():
                if self.master.handovers is None:
                    self.master.handovers = HandoverCoordinator(
                        self.plan, retain=self.cfg.rhino_enabled,
                        max_bytes_in_flight=self.cfg.handover_max_bytes_in_flight or None,
                        period_s=self.cfg.pulse_period_ms / 1000)
                    # replicas restored before it existed ack as their incarnation; lost ones take part in nothing
                    manager = self.master.handovers.manager
                    manager.attempts.update(self.master.restores.attempts)
                    manager.lost.update(set(self.master.lost) - self.master.restores.restoring)
                coordinator = self.master.handovers
                yield coordinator
        finally:
            if coordinator is not None:
                self._await_rolled_forward(coordinator, what)
            if window is None:
                pulses.eager(0)
            else:
                self._close_pulse_window(window)

    def _job_over(self) -> bool:
        """The job failed, was told to stop, or its workers all ended: no step completes any more."""
        return self.master.failure is not None or self.master.command == "stop" or not self._running()

    def _await_rolled_forward(self, coordinator: HandoverCoordinator, what: str) -> None:
        """Until no committed handover waits for pulses (or the job is over): a committed step only
        rolls forward, and it reaches its switch and release only while pulses are written."""
        master = self.master
        waited = 0
        with master.locked():
            while not self._job_over() and (pending := coordinator.rolling_forward()):
                if waited % 300 == 0:  # at once, then every 30 s
                    master.event(f"{what}: handover(s) {pending} committed, not completed: the pulses go on "
                                 "until they complete")
                master.pause(0.1)
                waited += 1

    def _open_pulse_window(self, what: str, timeout: float, hold_timeout: float = 15.0) -> int:
        """KaZoo: tell every source replica to hold its records, and once all live ones do, have
        a windowed generator write pulses from their positions on (liverobin.heartbeats); the
        window's id.  A resumed run first regenerates what the run before wrote (``timeout``)."""
        master = self.master
        sources = [(t, p, r) for (t, p, r) in self.placement if self.plan.task(t).is_source]
        with master.locked():
            self._await_regenerated(what, timeout)
            windows = master.windows
            window, pulsed = windows.next_window()
            windows.word = WindowWord(window, True, False, pulsed)
            master.status_changed()
            master.ring_workers()  # (every record waits from a replica's hold to the window's first pulse)

            def live() -> list[ReplicaId]:
                return [rid for rid in sources if self.placement[rid] not in master.dead]

            held = master.wait_for(lambda: master.failure is not None or all(
                                   windows.held(rid) == window for rid in live()), hold_timeout)
            if master.failure is not None or not held:
                windows.word = WindowWord(window, False, False, pulsed)  # no pulse: they stop holding
                master.ring_workers()
                missing = [master.replica_label(t, p, r) for t, p, r in live() if windows.held((t, p, r)) != window]
                where = "; ".join(f"{name}: {text}" for name in missing
                                  if (text := window_text(master.metrics.get(name, InstanceMetrics()))))
                raise TimeoutError(f"{what}: source replicas {missing} did not hold their records for window "
                                   f"{window} within {hold_timeout:g}s" + (f" ({where})" if where else "")
                                   if not held else f"job failed: {master.failure}")
            floor: dict[str, dict[int, int]] = {}
            for t, p, r in live():
                topic = self.plan.task(t).head.spec["topic"]
                for k, position in windows.holding[(t, p, r)][1].items():
                    floor.setdefault(topic, {})[k] = max(floor.get(topic, {}).get(k, 0), position)
            master.event(f"pulse window {window} open: every source replica holds its records ({what})")
        assert self.pulses is not None
        self.pulses.open_window(window, floor)
        return window

    def _await_regenerated(self, what: str, timeout: float) -> None:
        """A resumed run opens no window before each exactly-once output is written past what the
        run before wrote (caller holds the master's lock).  Until then its sources replay records
        whose results that run wrote, and the outputs skip what they hold by seq: a window's
        pulses among those records would route and order them otherwise than the first time,
        and the outputs would lose some results and write others twice.  (LiveRobin needs no
        wait: a record goes out only below a pulse of the log, and new pulses lie beyond it.)"""
        master = self.master
        behind = master.outputs.regenerating
        if not behind:
            return
        master.event(f"{what}: waits until the resumed run has written again what the run before wrote "
                     f"({', '.join(master.outputs.labels(behind))})")
        done = master.wait_for(lambda: master.failure is not None or not master.outputs.regenerating, timeout)
        if master.failure is not None:
            raise JobFailedError(f"job failed before {what}: {master.failure}")
        if not done:
            raise TimeoutError(f"{what}: the resumed run has not written again what the run before wrote within "
                               f"{timeout:g}s ({', '.join(master.outputs.labels(master.outputs.regenerating))})")

    def _close_pulse_window(self, window: int) -> None:
        assert self.pulses is not None
        last = self.pulses.close_window(timeout=15.0)
        with self.master.locked():
            self.master.windows.word = WindowWord(window, False, True, window)  # they stop at the last pulse
            self.master.event(f"pulse window {window} closed at pulse {last}" if last is not None else
                              f"pulse window {window}: its last pulse was not written within 15 s; "
                              "the sources hold their records until a generator ends it")

    def await_handover(self, coordinator: HandoverCoordinator, hid: int, deadline: float, during: str,
                        timed_out: str) -> None:
        """Until handover ``hid`` completed or aborted (caller holds the master's lock); raises if the
        job failed meanwhile.  At ``deadline`` a step not committed yet is cancelled (TimeoutError);
        a committed one only rolls forward, so it is waited for to the end."""
        master = self.master

        def ended() -> bool:
            return coordinator.state(hid) in (HandoverState.COMPLETED, HandoverState.ABORTED) or self._job_over()

        done = master.wait_for(ended, max(0.0, deadline - time.monotonic()))
        if not done:
            for text in coordinator.give_up(hid, timed_out):
                master.event(text)
            master.ring_workers()
            if coordinator.state(hid) is HandoverState.ABORTED:
                raise TimeoutError(f"{timed_out} (not committed: cancelled)")
            master.event(f"handover {hid} is {coordinator.state(hid).value} past its deadline: it rolls forward "
                         "to completion")
            waited = 0
            while not master.wait_for(ended, 1.0):
                waited += 1
                if waited % 30 == 0:
                    master.event(f"handover {hid} still {coordinator.state(hid).value} {waited} s past its deadline")
        if master.failure is not None:
            raise JobFailedError(f"job failed {during}: {master.failure}")
        if coordinator.state(hid) not in (HandoverState.COMPLETED, HandoverState.ABORTED):
            raise JobFailedError(f"the job ended {during} (handover {hid} {coordinator.state(hid).value})")
