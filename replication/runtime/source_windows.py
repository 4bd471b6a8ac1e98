"""A KaZoo source replica's pulse windows: holding its records while a handover needs pulses.

Out of a window a KaZoo source emits records as it reads them.  When the driver opens a window
(its word reaches :attr:`KazooWindows.pending_window` through the worker's ``pulse_windows``
service), the replica holds its records from where it is and reports that position
(:attr:`KazooWindows.holding`); the heartbeat generator writes the window's pulses from the
furthest such position on, and both replicas place them between the same records
(:class:`liverobin.PulsePlacer`).  After the window's last pulse the records held beyond it go out
and reading goes on.  A restored replica first reads the heartbeat log to its end, so a window
written while it was away is placed from the log, not announced again
(:mod:`liverobin.windows` decides; this is the source's side of it).
"""

from __future__ import annotations

import logging
from typing import Any

from liverobin import PulsePlacer
from liverobin.windows import HOLD, LEAVE, PulseWindows
from transport.kafka_feeds import PartitionFeed

log = logging.getLogger(__name__)


class KazooWindows:
    """The pulse-window part of :class:`~replication.runtime.source.SourceInstance` (a mixin: it
    runs on the source replica's thread, with the replica's feed, pulses and emitter)."""

    _windows: PulseWindows | None
    _pulses: Any
    _reader: Any
    pending_window: tuple | None
    _window_word: tuple | None
    holding: tuple[int, dict[int, int]] | None
    kafka_partitions: list[int]
    topic: str
    _next_offset: dict[int, int]
    start_offsets: dict[int, int]
    metrics: Any
    name: str
    stop_requested: Any
    _emit_counted: Any  # (msg, ingest time): one record out, counted for checkpoints

    def _window_changed(self, placer: PulsePlacer | None, feed: PartitionFeed) -> PulsePlacer | None:
        """The driver's word on the pulse window changed: start holding (and report where this
        replica is), or stop because the window closed before any pulse was written."""
        word = self._window_word = self.pending_window
        assert self._windows is not None and word is not None
        action = self._windows.announce(*word)
        if action == LEAVE:
            if placer is not None:
                placer = self._leave_window(placer, feed)
            action = self._windows.announce(*word)  # the same word may open the next window
        if action == HOLD:
            return self._hold(word[0])
        return placer

    def _show_window(self, placer: PulsePlacer | None) -> None:
        windows, metrics = self._windows, self.metrics
        assert windows is not None
        metrics.window = (-1 if windows.current is None else windows.current, windows.handled,
                          -1 if windows.pending is None else windows.pending)
        metrics.held_records = 0 if placer is None else placer.held

    def _hold(self, window: int) -> PulsePlacer:
        """Start holding for ``window`` (announced open) at this replica's position and report it."""
        placer = self._placer_here()
        self.holding = (window, {placer.partition: placer.fetched_to})
        self._windows.queue(self._pulses.take(0))
        self._feed(placer)
        return placer

    def _placer_here(self) -> PulsePlacer:
        k = self.kafka_partitions[0]
        return PulsePlacer(self.topic, k, fetched_to=self._next_offset.get(k, self.start_offsets.get(k, 0)))

    def _feed(self, placer: PulsePlacer) -> None:
        """Give ``placer`` the queued pulses of the window held for."""
        assert self._windows is not None
        for record in self._windows.to_place():
            placer.add_pulse(record)

    # -- a restored replica: the windows written before it came back -----------------------------
    def _start_replay(self) -> PulsePlacer | None:
        """Read the heartbeat log to its end as it was now before emitting anything: a window whose
        pulses are already in it is not announced to this replica again, and a record may only go
        out once no pulse before it can still be unknown.  Restored inside a window: hold again."""
        assert self._reader is not None and self._windows is not None
        while not self._reader.caught_up.wait(0.1):
            if self.stop_requested.is_set():
                return None
        self._windows.queue(self._pulses.take(0))
        if self._windows.current is None:
            return None
        placer = self._placer_here()
        self._feed(placer)
        return placer

    def _next_window(self) -> PulsePlacer | None:
        """Out of any window: enter the next window of the queued pulses (written before it was
        restored, or while it was not yet among the replicas a window waited for), else hold for
        the window announced while it still placed others; None: neither."""
        windows = self._windows
        assert windows is not None
        entered = windows.next_window()
        if entered == HOLD:
            return self._hold(windows.current)
        if not entered:
            return None
        self._entered_from_log()
        placer = self._placer_here()
        self._feed(placer)
        return placer

    def _entered_from_log(self) -> None:
        assert self._windows is not None
        log.warning("%s: places the pulses of window %d from the heartbeat log (it came back behind them)",
                    self.name, self._windows.current)
        self.metrics.windows_from_log += 1

    def _after_window(self, placer: PulsePlacer, feed: PartitionFeed) -> PulsePlacer | None:
        """The window's last pulse is out.  If the next window's pulses are already queued, the records
        held may lie on both sides of them: hold on with the same placer; else leave."""
        assert self._windows is not None
        if self._windows.enter_queued():
            self._entered_from_log()
            self._feed(placer)
            return placer
        return self._leave_window(placer, feed)

    def _leave_window(self, placer: PulsePlacer, feed: PartitionFeed) -> None:
        """Emit the records held beyond the window's last pulse; from now on records go out as read."""
        for item in placer.release_records():
            self._emit_counted(*item)
        feed.resume()
        self.holding = None
        return None
