"""The heartbeat generator: a driver thread appending pulses to the heartbeat log.

Every period it takes how far the source replicas have read each source partition, as they
report it (:mod:`liverobin.positions`: the driver fetches no source data), and appends the next
:class:`PulseRecord` to the segment of the log it belongs to (:mod:`liverobin.segments`),
``acks=all``.  It writes its first pulse once every source partition was reported.  The rules that
make it safe to kill, restart or run twice are in :mod:`liverobin.heartbeats` and
:mod:`liverobin.segments` and depend on the log alone:

* before its first pulse a generator reads the log to its end (from ``from_segment``: the
  newest segments are enough) and continues after the largest ``h`` there (a restart never
  starts over at 1);
* it writes into a segment only once the last pulse of the segment before it was read back as
  counted (a lost one is written again), and makes the topics of the next segments exist first;
* it reads the log back and builds on what counted, whoever wrote it (plus its own few pulses
  still in flight); when two generators write the same ``h`` the first record wins for every
  reader and the loser simply goes on after it;
* while no source partition grows it writes a pulse only once a second: with every record
  already placed before the last pulse, no merge waits for another one (unless told to be
  :meth:`eager`: a handover waits for pulses; then every :data:`EAGER_PULSE_EVERY_S`);
* once no partition grew for a second, every pulse of its own was read back and no other
  generator's was read for a while, it stops fetching the log until it writes the next one (an
  idle job's log costs the broker a fetch or two a second, not one per fetch wait); a new
  generator's pulses are read then, and whichever record of an ``h`` came first counts.  Until
  then it sleeps until a source reports a new position, its own word changes (a drain, a
  window, eager, stop: :meth:`PositionBoard.ring`) or the next idle pulse is due, not every period;
* on a drain it writes one *final* pulse at the end offsets a fetch made after the drain request
  shows (the one time it reads the sources); they end right after it, at the same position on
  both replicas.

``windowed=True`` (KaZoo mode) writes nothing outside pulse windows: :meth:`open_window` starts
one at offsets no lower than the sources' reported positions, :meth:`close_window` ends it
with a pulse marked *last* (:class:`liverobin.windows.PulseWindows`).  Outside a window it reads
the log to its end, makes the next segments' topics and stops fetching, so that the next window's
first pulse (every source holds its records until then) waits for neither.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from liverobin.heartbeats import Offsets, PulseLog, PulseRecord, next_pulse
from liverobin.positions import PositionBoard, Positions
from liverobin.segments import HeartbeatLog, LogCursor
from transport.kafka_io import consume_ready, end_offsets_by_fetch, resume_now

log = logging.getLogger(__name__)

# Pulses written but not read back yet; the next one builds on the last of them (readers raise
# any offset that would go back, so building ahead of the log is safe).
MAX_IN_FLIGHT = 4
# A pulse not read back within this long is taken as lost (the next one supersedes it).
IN_FLIGHT_TIMEOUT_S = 2.0
# While no source partition grows, a pulse would place nothing new (every record is already
# before the last one, so no merge waits for it): only this often then, to show liveness.
IDLE_PULSE_EVERY_S = 1.0
# While a handover waits for pulses (eager), this often instead: its steps switch and release at
# pulses counted ahead, so they must come; but each pulse costs every replica of the job, and a
# pulse every period on top of the growing partitions' saturated a loaded job (its replicas fell
# a minute behind the log).  The driver counts a step's margins in pulses at the observed rate.
EAGER_PULSE_EVERY_S = 0.05
# The heartbeat log's fetch long-poll: how soon a pulse written is seen counted.
FETCH_WAIT_MS = 5
# While another generator's pulses were read this recently, keep reading the log between our own.
OTHERS_RECENT_S = 2.0
# librdkafka takes poll timeouts in whole milliseconds (a shorter one is 0): waiting for a tick
# less than this away would spin.
MIN_WAIT_S = 0.001


def pulse_producer_conf(producer_conf: Mapping[str, Any]) -> dict[str, Any]:
    """The generator's producer: not idempotent (a retried pulse that lands twice or late is
    ignored by the counting rules, and every idempotent produce makes the embedded broker rewrite
    its table of topics and producers: docs/embedded-broker.md), and without librdkafka's periodic
    metadata refresh, which names every topic the producer wrote to: the embedded broker creates a
    topic named in a metadata request, so the segments the driver deletes came back (with four
    partitions).  A produce error still refreshes what it needs."""
    return {**producer_conf, "enable.idempotence": False, "acks": "all", "linger.ms": 0,
            "topic.metadata.refresh.interval.ms": -1}


class HeartbeatGenerator:
    """Writes pulses every ``period_s`` to ``heartbeat_log`` for the partitions of ``sources``
    (topic -> partitions) at the positions the sources report to ``positions``; ``starts`` are
    the sources' first offsets where the driver resolved them (the first report's start is used
    for the others)."""

    def __init__(self, *, name: str, heartbeat_log: HeartbeatLog, sources: Mapping[str, list[int]],
                 positions: PositionBoard, starts: Offsets, period_s: float, max_step: int,
                 consumer_conf: Mapping[str, Any],
                 producer_conf: Mapping[str, Any], create_topics: Callable[[list[str]], None],
                 from_segment: int = 0, windowed: bool = False) -> None:
        self.name = name
        self.log = heartbeat_log
        self._create_topics = create_topics
        self._created = -1  # segments up to this one are known to exist
        self.cursor = LogCursor(heartbeat_log, segment=from_segment)
        self.sources = {t: list(ks) for t, ks in sources.items()}
        self.positions = positions
        self.starts = {t: dict(ks) for t, ks in starts.items()}
        self.period_s = period_s
        self.max_step = max_step
        self._consumer_conf = {**consumer_conf, "fetch.wait.max.ms": FETCH_WAIT_MS, "enable.auto.commit": False}
        self._producer_conf = pulse_producer_conf(producer_conf)
        self.written = 0  # records this generator produced
        self.error: str | None = None
        self._stop = threading.Event()
        self._finish_at: float | None = None
        self._final_ends: Offsets | None = None  # the sources' ends by fetches made after the drain request
        self._eager_until = 0.0  # until then a pulse every EAGER_PULSE_EVERY_S even while none grows
        self._thread: threading.Thread | None = None
        self.windowed = windowed
        self._window: tuple[int, Offsets] | None = None  # (id, floor) of the open window
        self._closing = False  # the open window's last pulse is due
        self._last_h = 0  # the last pulse of the closing window, once written
        self._closed = threading.Condition()

    # -- control (any thread) ---------------------------------------------------------------
    def start(self) -> HeartbeatGenerator:
        self._thread = threading.Thread(target=self._main, name=f"pulses-{self.name}", daemon=True)
        self._thread.start()
        return self

    def kill(self, timeout: float = 5.0) -> None:
        """Stop at once, without a final pulse (a crash, as far as the log can tell)."""
        self._stop.set()
        self.positions.ring()
        if self._thread is not None:
            self._thread.join(timeout)

    def finish(self, grace_s: float) -> None:
        """Write the final pulse at the end offsets seen ``grace_s`` from now (a drain)."""
        if self._finish_at is None:
            self._finish_at = time.monotonic() + grace_s
            self.positions.ring()

    def eager(self, seconds: float) -> None:
        """For ``seconds``, write a pulse every :data:`EAGER_PULSE_EVERY_S` even while no source
        partition grows (a handover switches at a pulse: it should come soon, not once a second)."""
        self._eager_until = time.monotonic() + seconds
        self.positions.ring()

    def open_window(self, window: int, floor: Offsets) -> None:
        """Windowed: write pulses tagged ``window`` every period, none below ``floor``."""
        with self._closed:
            self._window, self._closing, self._last_h = (window, {t: dict(p) for t, p in floor.items()}), False, 0
        self.positions.ring()

    def close_window(self, timeout: float) -> int | None:
        """Windowed: end the open window with a pulse marked last and wait until the log counted
        it; its ``h`` (None: not within ``timeout``, or no window was opened)."""
        with self._closed:
            if self._window is None:
                return self._last_h or None  # ended already (by an earlier call)
            self._closing = True
            self.positions.ring()
            self._closed.wait_for(lambda: self._window is None or self.error is not None or not self.alive, timeout)
            return self._last_h if self._window is None else None

    @property
    def pulses(self) -> PulseLog:
        """What this generator counted of the log so far (its own pulses read back, and others')."""
        return self.cursor.pulses

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def done(self) -> bool:
        """The log holds a final pulse (written by this generator or another)."""
        return self.pulses.final

    # -- the loop ---------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported through .error and the driver's log
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("heartbeat generator %s failed", self.name)

    def _run(self) -> None:
        consumer = Consumer(self._consumer_conf)  # the heartbeat log: our pulses back, others' pulses
        producer = Producer(self._producer_conf)
        cursor = self.cursor
        segments: dict[str, int] = {}  # the heartbeat-log topics assigned -> their segment
        in_flight: list[tuple[PulseRecord, float]] = []  # written, not read back: (record, when)
        next_tick = time.monotonic()
        last_write = 0.0
        blocked = False  # a pulse is due but must wait for the log (or a fetch): sleep until it moves
        caught_up = False  # the log was read to its end once (the largest h there is known)
        paused = False  # no fetches of the log while none of our pulses is out
        quiet = False  # the last pulse due placed nothing new (an idle job)
        moved_at = 0.0  # when a pulse that placed something new was last written
        others_at = -OTHERS_RECENT_S  # when a pulse of another generator was last read
        news = self.positions.version  # the sources' positions (and this generator's word) as last seen
        try:
            while not self._stop.is_set() and not self.pulses.final:
                # never poll with a zero timeout while there is nothing to do: with one the loop spun
                # (about 30,000 empty polls a second at a 10 ms period, ~6% of a core taken from the job)
                if paused:  # idle: nothing to read; sleep until a source moves, a word comes or a pulse is due
                    now = time.monotonic()
                    if self.windowed and self._window is None:
                        due = IDLE_PULSE_EVERY_S  # nothing to write before a window opens (open_window rings)
                    else:
                        due = last_write + (IDLE_PULSE_EVERY_S if now >= self._eager_until
                                            else EAGER_PULSE_EVERY_S) - now
                    news = self.positions.wait_news(news, max(due, self.period_s))
                    next_tick = min(next_tick, time.monotonic())
                    wait = 0.0
                elif blocked:  # what unblocks it is a message (our pulse back)
                    wait = FETCH_WAIT_MS / 1000
                else:
                    wait = min(max(next_tick - time.monotonic(), 0.0), 0.05)
                    if wait > 0:
                        wait = max(wait, MIN_WAIT_S)
                blocked = False
                if set(segments.values()) != {cursor.segment, cursor.segment + 1}:
                    segments = self._follow(consumer)
                    if paused:  # (a partition assigned again stays paused)
                        resume_now(consumer, self._reading_at())
                        paused = False
                for msg in consume_ready(consumer, 1000, wait):
                    segment = segments.get(msg.topic())
                    if msg.error() is not None or segment is None:
                        continue
                    try:
                        record = PulseRecord.decode(msg.value(), at=msg.offset())
                    except ValueError as exc:
                        log.error("heartbeat log %s offset %d skipped: %s", msg.topic(), msg.offset(), exc)
                        continue
                    cursor.add(segment, record)
                    if record.generator != self.name:
                        others_at = time.monotonic()
                    # ours came back (counted, or beaten by another generator's record of that h)
                    in_flight = [(r, t) for r, t in in_flight if r.h > record.h]
                    if self._last_h and self.pulses.last_h >= self._last_h:
                        with self._closed:  # the window's last pulse is counted: quiet until the next
                            self._window, self._closing = None, False
                            self._closed.notify_all()
                producer.poll(0)
                now = time.monotonic()
                in_flight = [(r, t) for r, t in in_flight if now - t < IN_FLIGHT_TIMEOUT_S]
                if (caught_up and quiet and not in_flight and not paused and now - others_at > OTHERS_RECENT_S
                        and now - moved_at > IDLE_PULSE_EVERY_S):
                    # idle, and every pulse of ours read back: nothing to wait for in the log until
                    # the next one (a new generator's pulses are read then; the first of each h counts)
                    consumer.pause(self._reading_at())
                    paused = True
                window = self._window
                if self.windowed:
                    if window is None:  # outside a window: nothing to write; be ready for the next one
                        self._make_segments(cursor.segment)
                        caught_up = caught_up or self._at_log_end(consumer)
                        if caught_up and not in_flight and not paused and now - others_at > OTHERS_RECENT_S:
                            consumer.pause(self._reading_at())
                            paused = True
                        next_tick = now + self.period_s
                        continue
                    if self._last_h:
                        if any(r.h == self._last_h and now - t < IN_FLIGHT_TIMEOUT_S for r, t in in_flight):
                            next_tick = now + self.period_s  # the last pulse is out: wait for it to count
                            continue
                        self._last_h = 0  # it was lost: write the last pulse again
                if now < next_tick:
                    continue
                blocked = True  # until a pulse is written below
                if len(in_flight) >= MAX_IN_FLIGHT:
                    continue
                if not self._at_log_end(consumer):
                    continue  # read the log to its end first: continue after its largest h
                caught_up = True
                ends = self._ends(window[1] if window else None)
                if ends is None:
                    continue
                finishing = self._finish_at is not None and now >= self._finish_at and not self.windowed
                if finishing:
                    ends = self._with_final_ends(ends)
                closing = window is not None and self._closing
                if (finishing or closing) and in_flight:
                    continue  # the final (or a window's last) pulse builds on everything written before it
                base = self.pulses
                if in_flight:
                    base = copy.deepcopy(self.pulses)
                    for r, _ in in_flight:
                        base.accept(r)
                if not cursor.may_write(base.last_h + 1):
                    continue  # this segment's last pulse, in flight, must be read back first
                blocked = False
                record, behind = next_pulse(base, ends, self.max_step, starts=self.starts,
                                            final=finishing, generator=self.name,
                                            floor=window[1] if window else None, window=window[0] if window else 0,
                                            last=closing, now_ms=int(time.time() * 1000))
                moves = _moves(record, base)
                idle_every = IDLE_PULSE_EVERY_S if now >= self._eager_until else EAGER_PULSE_EVERY_S
                if not record.final and not moves and now - last_write < idle_every and window is None:
                    next_tick = max(next_tick + self.period_s, now)
                    quiet = True
                    continue
                if moves:
                    moved_at = now
                quiet = False
                last_write = now
                segment = self.log.segment_of(record.h)
                self._make_segments(segment)
                producer.produce(self.log.topic(segment), value=record.encode(), key=str(record.h).encode(),
                                 partition=0, on_delivery=_report_failure)
                self.written += 1
                in_flight.append((record, now))
                if paused:
                    resume_now(consumer, self._reading_at())
                    paused = False
                if record.last:
                    self._last_h = record.h
                next_tick = now if behind or finishing else max(next_tick + self.period_s, now)
            producer.flush(5)
        finally:
            consumer.close()

    def _at_log_end(self, consumer: Consumer) -> bool:
        """Whether the log was read to its end as the last fetch saw it (its largest h is known)."""
        hb = TopicPartition(self.log.topic(self.cursor.segment), 0)
        log_end = consumer.get_watermark_offsets(hb, cached=True)[1]
        return log_end >= 0 and self.cursor.next_offset(self.cursor.segment) >= log_end

    def _make_segments(self, segment: int) -> None:
        """Make the topics of ``segment`` and the next ones exist before a pulse goes there (the
        readers of a segment read the next one ahead)."""
        if self._created < segment + 2:
            self._create_topics([self.log.topic(n) for n in range(self._created + 1, segment + 5)])
            self._created = segment + 4

    def _follow(self, consumer: Consumer) -> dict[str, int]:
        """Assign the cursor's two segments; the segment of each topic."""
        consumer.assign(self._reading_at())
        return self.cursor.segments()

    def _reading_at(self) -> list[TopicPartition]:
        """The log's partitions followed, at the offsets reading goes on from."""
        return [TopicPartition(topic, 0, offset) for topic, offset in self.cursor.positions().items()]

    def _with_final_ends(self, ends: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
        """``ends``, raised to what fetches made after the drain request tell: the sources may not
        have read the last records produced ahead of the drain yet, and a final pulse below them
        would end the run without them."""
        if self._final_ends is None:
            self._final_ends = {t: end_offsets_by_fetch(self._consumer_conf, t, ks) for t, ks in self.sources.items()}
        return {t: {k: max(end, ends.get(t, {}).get(k, end)) for k, end in fetched.items()}
                for t, fetched in self._final_ends.items()}

    def _ends(self, floor: Offsets | None) -> Positions | None:
        """How far the sources have read each partition, as reported, and at least ``floor`` (a
        window's, which names every partition with a live replica); without one, None until every
        partition is known (the first pulse names them all, so where pulses go does not depend on
        which source reported first)."""
        for topic, parts in self.positions.starts(self.sources).items():
            for k, start in parts.items():
                self.starts.setdefault(topic, {}).setdefault(k, start)
        ends = self.positions.positions(self.sources)
        for topic, parts in (floor or {}).items():
            known = ends.setdefault(topic, {})
            for k, low in parts.items():
                known[k] = max(known.get(k, low), low)
        if floor is None and any(k not in ends.get(topic, {}) for topic, parts in self.sources.items() for k in parts):
            return None
        return ends


def _moves(record: PulseRecord, base: PulseLog) -> bool:
    """Whether ``record`` places a partition past where the log's last pulse did (or names a new one)."""
    return any(off > base.offsets.get(t, {}).get(k, -1) for t, parts in record.offsets.items() for k, off in parts.items())


def _report_failure(err: Any, msg: Any) -> None:
    if err is not None:
        log.warning("heartbeat record not written: %s (the next pulse supersedes it)", err)
