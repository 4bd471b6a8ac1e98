"""The driver's heartbeat generators: started, replaced when one dies, and KaZoo's pulse windows.

LiveRobin runs generators for the job's life; KaZoo runs one that writes only while a handover
holds a pulse window open (:class:`liverobin.windows.PulseWindows`, docs/handover.md), started
with the job so that it is ready for the first window, or when a window opens with none.  Any number
may run at once and any may die: the heartbeat log decides which pulses count
(:mod:`liverobin.generator`).  So:

* a generator whose thread *died on its own* (an error: the broker, a bug) is replaced within
  :data:`WATCH_EVERY_S` by one that continues after the log's largest pulse; in KaZoo mode the
  replacement writes the open window's pulses, same id and floor, and ends it if its end was
  due.  Without that the sources hold their records until someone starts a generator by hand.
  A generator stopped with :meth:`DriverPulses.kill` (an operator, or an injected crash the
  caller restarts) is left stopped, and one that wrote the final pulse of a drain is done;
* while a LiveRobin handover waits for pulses (:meth:`DriverPulses.eager`), every generator,
  those started meanwhile too, pulses at least every ``EAGER_PULSE_EVERY_S``: its steps switch and
  release at pulses counted ahead, at the rate pulses are written (:meth:`DriverPulses.period_ms`);
* a pulse window is ended only by :meth:`DriverPulses.close_window`; the driver calls it once no
  committed handover needs the window's pulses (a committed step only rolls forward, and it
  reaches its switch and release pulses only while pulses are written);
* given ``needed_from`` and ``delete_topics`` (LiveRobin), the watcher deletes the log's segments
  that no reader can read any more (:class:`transport.segment_retention.SegmentRetention`): a log makes a
  topic a second at the default period, and a broker's topics cost it on every request of some
  kinds (docs/embedded-broker.md), a real cluster its metadata.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from liverobin.generator import EAGER_PULSE_EVERY_S, HeartbeatGenerator
from liverobin.heartbeats import Offsets
from liverobin.segments import HeartbeatLog
from transport.segment_retention import SegmentRetention

log = logging.getLogger(__name__)

# How often the watcher looks for a generator that died (a pulse period is 10 ms by default: a
# window's sources wait this long at most for the replacement's first pulse, plus its log read).
WATCH_EVERY_S = 0.2

# How often the watcher looks for segments of the log no reader needs any more.
RETAIN_EVERY_S = 1.0

# How far back the pulses written are counted for the rate a handover's margins assume.
RATE_OVER_S = 2.0

# KaZoo: how long a pulse window's pulses must have been written before their rate is trusted
# (counted from the sample before its first pulse; earlier, one a period is assumed, which places
# a step's pulses later than planned, never sooner).
WINDOW_RATE_AFTER_S = 1.0

# name, segment to start reading the log from, windowed -> a generator, not started
GeneratorFactory = Callable[[str, int, bool], HeartbeatGenerator]


def switch_pulse(last_h: int, margin_s: float, period_ms: float) -> int:
    """The pulse about ``margin_s`` after pulse ``last_h`` (at least 5 later)."""
    return last_h + max(5, math.ceil(margin_s * 1000 / period_ms))


class DriverPulses:
    """One job's heartbeat generators, made by ``factory``, on ``heartbeat_log``; ``event``
    records what happens to them (the job master's event list)."""

    def __init__(self, factory: GeneratorFactory, heartbeat_log: HeartbeatLog, event: Callable[[str], None],
                 first_h: int = 0, needed_from: Callable[[], int | None] | None = None,
                 delete_topics: Callable[[list[str]], None] | None = None) -> None:
        """``first_h``: a pulse the log is known to hold (a resumed run's log, written by the run
        before): generators read it from that pulse's segment on, not from the first.
        ``needed_from``: the lowest pulse a reader of the log outside this driver counted or a
        restore starts after, None while that is not known; ``delete_topics``: deletes topics
        without waiting.  Without both, every segment is kept."""
        self._factory = factory
        self._log = heartbeat_log
        self._first_segment = heartbeat_log.first_read_after(first_h)
        self._event = event
        self.generators: list[HeartbeatGenerator] = []
        self._lock = threading.RLock()
        self._replaced: set[str] = set()  # generators that died and were replaced
        self._window: tuple[int, Offsets] | None = None  # the open window: (id, floor)
        self._window_gen: HeartbeatGenerator | None = None
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        self._eager_until = 0.0  # a handover waits for pulses until then: generators started meanwhile too
        self._finish_grace: float | None = None  # a drain: every generator writes the final pulse
        self._seen: deque[tuple[float, int]] = deque()  # (when, the log's largest pulse), by the watcher
        self._needed_from = needed_from
        self._delete_topics = delete_topics
        self._retention = SegmentRetention()
        self._retained_at = 0.0

    # -- generators -----------------------------------------------------------------------------
    def start(self, windowed: bool = False) -> HeartbeatGenerator:
        """Start one more generator; it reads the newest segments the others counted and goes on
        after the largest pulse there.  ``windowed``: KaZoo's, which writes only pulse windows."""
        with self._lock:
            gen = self._factory(f"g{len(self.generators) + 1}", self._start_segment(), windowed)
            self.generators.append(gen.start())
            if self._eager_until > time.monotonic():
                gen.eager(self._eager_until - time.monotonic())
            if self._finish_grace is not None:
                gen.finish(self._finish_grace)
            self._watch()
        self._event(f"heartbeat generator {gen.name} started")
        return gen

    def _start_segment(self) -> int:
        """Where a generator started now reads the log from: the newest segments the others
        counted (a resumed run's, from the pulse its cut knew)."""
        return max(self._first_segment, self._log.segment_of(self.last_h + 1) - 1)

    def kill(self) -> list[str]:
        """Stop every running generator at once, without a final pulse (a crash, as far as the log
        can tell); they are not replaced.  Their names."""
        with self._lock:
            killed = [g for g in self.generators if g.alive]
            for gen in killed:
                gen.kill()
        for gen in killed:
            self._event(f"heartbeat generator {gen.name} killed")
        return [g.name for g in killed]

    def close(self) -> None:
        """The job ended: stop watching and stop every generator."""
        self._stopped.set()
        with self._lock:
            for gen in self.generators:
                gen.kill()

    def live(self) -> list[HeartbeatGenerator]:
        with self._lock:
            return [g for g in self.generators if g.alive]

    @property
    def last_h(self) -> int:
        """The largest pulse any generator counted (the log's, as far as the driver knows)."""
        with self._lock:
            return max((g.pulses.last_h for g in self.generators), default=0)

    def period_ms(self, nominal_ms: float, windowed: bool = False) -> float:
        """The time between pulses, as written over the last :data:`RATE_OVER_S` (LiveRobin: one a
        period while a source grows, and at least one every ``EAGER_PULSE_EVERY_S`` while a
        handover waits): between ``nominal_ms`` and the eager gap.  ``windowed`` (KaZoo): pulses
        are written only in a pulse window, one a period at most (each waits for the one before
        to be read back from the log); the rate is counted from the window's pulses once they
        span :data:`WINDOW_RATE_AFTER_S`, and is ``nominal_ms`` before."""
        eager_ms = max(nominal_ms, EAGER_PULSE_EVERY_S * 1000)
        with self._lock:
            seen = list(self._seen)
        if windowed:  # from the last sample that saw no pulse written (before the window opened)
            quiet = [i for i in range(1, len(seen)) if seen[i][1] == seen[i - 1][1]]
            seen = seen[quiet[-1] if quiet else 0:]
            if len(seen) < 2 or seen[-1][0] - seen[0][0] < WINDOW_RATE_AFTER_S:
                return nominal_ms
        elif len(seen) < 2 or seen[-1][1] <= seen[0][1]:
            return eager_ms
        (t0, h0), (t1, h1) = seen[0], seen[-1]
        return min(eager_ms, max(nominal_ms, (t1 - t0) * 1000 / (h1 - h0)))

    def _sample(self) -> None:
        now, h = time.monotonic(), self.last_h
        with self._lock:
            self._seen.append((now, h))
            while len(self._seen) > 2 and now - self._seen[1][0] >= RATE_OVER_S:
                self._seen.popleft()

    def eager(self, seconds: float) -> None:
        """LiveRobin: every generator pulses at least every ``EAGER_PULSE_EVERY_S`` for ``seconds`` (a
        handover's steps switch and release at pulses counted ahead), those started meanwhile too."""
        with self._lock:
            self._eager_until = time.monotonic() + seconds
            for gen in self.live():
                gen.eager(seconds)

    def finish(self, grace_s: float) -> None:
        """LiveRobin, a drain: every generator, and any started from now on, writes the final pulse
        at the end offsets seen ``grace_s`` from then (the sources end right after it)."""
        with self._lock:
            self._finish_grace = grace_s
            gens = self.live() or [self.start()]
            for gen in gens:
                gen.finish(grace_s)

    # -- KaZoo pulse windows --------------------------------------------------------------------
    def open_window(self, window: int, floor: Offsets) -> HeartbeatGenerator:
        """Have a windowed generator write pulses tagged ``window`` from now on, none below
        ``floor`` (the positions the sources reported holding at); it is replaced if it dies
        before :meth:`close_window` ended the window."""
        gen = next((g for g in self.live() if g.windowed), None) or self.start(windowed=True)
        with self._lock:
            self._window, self._window_gen = (window, floor), gen
            gen.open_window(window, floor)
        return gen

    def close_window(self, timeout: float) -> int | None:
        """End the open window with a pulse marked last and wait until the log counted it (the
        sources stop holding right after it); its ``h``, or None if not within ``timeout``.  A
        generator that dies meanwhile is replaced and ends the window in its place."""
        deadline = time.monotonic() + timeout
        if self._window is None:
            return None
        while True:
            with self._lock:
                gen = self._window_gen
            assert gen is not None
            last = gen.close_window(timeout=max(0.0, min(deadline - time.monotonic(), WATCH_EVERY_S * 5)))
            if last is not None:
                with self._lock:
                    self._window = self._window_gen = None
                return last
            if time.monotonic() >= deadline or self._stopped.is_set():
                return None
            self._replace_dead()

    # -- the watcher -------------------------------------------------------------------------
    def _watch(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_loop, name="pulse-watcher", daemon=True)
            self._watcher.start()

    def _watch_loop(self) -> None:
        while not self._stopped.wait(WATCH_EVERY_S):
            try:
                self._sample()
                self._replace_dead()
                if time.monotonic() - self._retained_at >= RETAIN_EVERY_S:
                    self._retained_at = time.monotonic()
                    self._delete_unneeded()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("the heartbeat generators' watcher failed a round")

    def _delete_unneeded(self) -> None:
        """Delete the segments below the first one a reader may still read: the outside readers'
        (``needed_from``) and this driver's generators' own, live or to be started."""
        if self._needed_from is None or self._delete_topics is None:
            return
        needed_h = self._needed_from()
        if needed_h is None:
            return
        with self._lock:
            segments = [g.cursor.segment for g in self.generators if g.alive]
            start_from = self._start_segment()
        gone = self._retention.release(min(self._log.first_read_after(needed_h), start_from, *segments))
        if gone:
            log.info("heartbeat log: deleting segments %d to %d (pulse %d is read on)", gone[0], gone[-1], needed_h)
            self._delete_topics([self._log.topic(n) for n in gone])

    def _replace_dead(self) -> None:
        """Replace each generator that died on its own (an error), once; in a window, the
        window's generator carries on with the window."""
        with self._lock:
            if self._stopped.is_set():
                return
            dead = [g for g in self.generators
                    if not g.alive and g.error is not None and g.name not in self._replaced]
            for gen in dead:
                self._replaced.add(gen.name)
                self._event(f"heartbeat generator {gen.name} died ({gen.error}); starting another")
                new = self.start(windowed=gen.windowed)
                if gen is self._window_gen and self._window is not None:
                    window, floor = self._window
                    new.open_window(window, floor)  # (a close under way goes on with it)
                    self._window_gen = new
                    self._event(f"heartbeat generator {new.name} writes pulse window {window} in its place")
