"""KaZoo pulse windows, a source replica's side (pure).

KaZoo mode has pulses only inside *windows* (a handover switches at a pulse, and the rest of the
time KaZoo sources must not wait for pulses).  The driver opens window ``w``; each source replica
starts holding its records as LiveRobin does and reports its position; only once every live
replica holds does a generator write pulses tagged ``w``, at offsets no lower than those
positions, and it ends the window with a pulse marked *last*.  A replica places the pulses of its
window up to that last one, then emits its records freely again.  A window the driver closes
before any pulse was written ends at once.

The driver's word (:class:`WindowWord`, in every heartbeat reply) only says where the windows
stand *now*: a replica that was restored, or lagged, may have missed windows, or words.  What
it places is therefore decided by the heartbeat log, which both replicas read alike:

* a window whose pulses are in the log and that this replica has not placed (it was restored
  from before it, or still placed an earlier one) is entered from the log, as its twin did;
* a window announced open is held for only once every window the driver says had pulses
  (``last_pulsed``) is placed;
* a pulse of a later window in the log ends the window held for (with the last of its own
  pulses, or at once if it had none), so a missed "closed before any pulse" word, or a last
  pulse never written, cannot leave a replica holding for good.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from liverobin.heartbeats import PulseRecord

HOLD, LEAVE, FROM_LOG = "hold", "leave", "from the log"


class WindowWord(NamedTuple):
    """The driver's word on the pulse windows: the latest window, whether it is open, whether it
    closed with pulses written, and the latest window up to it whose pulses were written."""

    window: int
    is_open: bool
    pulses: bool
    last_pulsed: int | None = None  # None: not said


class PulseWindows:
    """One KaZoo source replica's pulse windows (see the module docstring).

    Feed it the driver's word (:meth:`announce`) and the counted pulses read from the log
    (:meth:`queue`); :meth:`to_place` gives those of the window held for, :meth:`placed` is told
    of each one emitted, and :meth:`next_window` says, out of any window, which to hold for or
    place from the log next.  Window ids only grow; a window left is never entered again."""

    def __init__(self) -> None:
        self.current: int | None = None  # the window this replica holds for
        self.handled = 0  # the latest window entered (and left, unless current)
        self.end_h: int | None = None  # the current window's last pulse, once known
        self.pending: int | None = None  # a window announced open, held for once the owed ones are placed
        self.owed = 0  # windows up to this one had pulses: those after ``handled`` come from the log
        self.closed = 0  # the latest window the driver said closed (an "open" for it is stale)
        self.later: deque[PulseRecord] = deque()  # counted pulses of windows not held for yet
        self.after_pulse = 0  # a restored replica: pulses up to this one are behind it
        self._admitted: int | None = None  # the current window's latest pulse given to place
        self._placed = 0  # the latest pulse placed

    def state(self) -> tuple[int | None, int]:
        """For a checkpoint: the window held for and the latest handled (the last pulse is read
        from the log again after a restore, so it is not kept)."""
        return self.current, self.handled

    def restore(self, current: int | None, handled: int) -> None:
        """A new replica's windows as its checkpoint left them (:meth:`state`)."""
        self.current, self.handled = current, handled

    def _enter(self, window: int) -> None:
        self.current, self.handled, self.end_h, self._admitted = window, window, None, None
        if self.pending is not None and self.pending <= window:
            self.pending = None

    # -- the driver's word -------------------------------------------------------------------
    def announce(self, window: int, is_open: bool, pulses: bool, last_pulsed: int | None = None) -> str:
        """The driver's latest word: ``HOLD`` (start holding now and report the position),
        ``LEAVE`` (stop holding now: the window held for closed before any pulse was written;
        then hear the same word again, it may open the next window) or ``""``."""
        if pulses:
            self.owed = max(self.owed, window)
        if last_pulsed is not None:
            self.owed = max(self.owed, last_pulsed)
            if self.current is not None and window > self.current > last_pulsed:
                return self._leave()  # it closed with no pulse (this replica missed that word)
        if is_open:
            if window <= max(self.handled, self.closed):
                return ""  # a stale word
            if self.current is not None or self.owed > self.handled:
                self.pending = window  # after the window held for, and those owed from the log
                return ""
            self._enter(window)
            return HOLD
        self.closed = max(self.closed, window)
        if pulses:
            return ""  # its pulses are in the log: placed as they come, or entered from there
        if window == self.pending:
            self.pending = None
        if window == self.current and self._admitted is None and self.end_h is None:
            return self._leave()
        return ""

    def _leave(self) -> str:
        self.current = self.end_h = self._admitted = None
        return LEAVE

    # -- the pulses of the log ---------------------------------------------------------------
    def queue(self, records: Iterable[PulseRecord]) -> None:
        """Counted pulses read from the log, in log order (a restored replica's own reader reads the
        log from its run's start: those up to :attr:`after_pulse` are behind it)."""
        self.later.extend(r for r in records if r.h > self.after_pulse)

    def to_place(self) -> list[PulseRecord]:
        """The queued pulses of the window held for, in log order, up to its last; those of
        windows behind it are dropped, those of later windows kept."""
        out: list[PulseRecord] = []
        keep: deque[PulseRecord] = deque()
        while self.later:
            record = self.later.popleft()
            if self.current is not None and record.window == self.current:
                if self.admits(record):
                    out.append(record)
            elif record.window > (self.current or self.handled):
                if self.current is not None and self.end_h is None:
                    self._ended_by_a_later_window()
                keep.append(record)
        self.later = keep
        return out

    def _ended_by_a_later_window(self) -> None:
        """A later window's pulse follows the current one's in the log, and the current one's last
        pulse was not among them: it ends with the last of its pulses (at once if it had none,
        or all are placed)."""
        if self._admitted is None or self._admitted <= self._placed:
            self.current = self.end_h = self._admitted = None
        else:
            self.end_h = self._admitted

    def admits(self, record: PulseRecord) -> bool:
        """Whether this counted pulse is to be placed (one of the current window's, up to its last)."""
        if self.current is None or record.window != self.current or self.end_h is not None:
            return False
        if record.last:
            self.end_h = record.h
        self._admitted = record.h
        return True

    def placed(self, h: int) -> bool:
        """Pulse ``h`` was emitted; True if it was the window's last (stop holding now)."""
        self._placed = max(self._placed, h)
        if self.end_h is not None and h >= self.end_h:
            self.current = self.end_h = self._admitted = None
            return True
        return False

    # -- out of any window -------------------------------------------------------------------
    def next_window(self) -> str:
        """``FROM_LOG`` if it entered the window of the first queued pulse after the ones it
        handled, else ``HOLD`` for the window announced while it was still placing others, else
        ``""``."""
        if self.current is not None:
            return ""
        if self.enter_queued():
            return FROM_LOG
        if self.take_pending():
            return HOLD
        return ""

    def enter_queued(self) -> bool:
        """Enter the window of the first queued pulse after the windows handled, if any."""
        while self.later and not self.enter_from_log(self.later[0]):
            self.later.popleft()  # a window it already handled
        return self.current is not None

    def take_pending(self) -> bool:
        """Out of any window: hold for the window announced meanwhile, once the owed are placed."""
        if self.pending is None or self.current is not None or self.owed > self.handled:
            return False
        if self.pending <= max(self.handled, self.closed):
            self.pending = None
            return False
        self._enter(self.pending)
        return True

    def enter_from_log(self, record: PulseRecord) -> bool:
        """Enter ``record``'s window if it is after every window this replica handled (a replica
        restored from before it, or that was not among the replicas the window waited for).
        Which pulses count is decided by the log alone, so it places the same ones its twin did."""
        if self.current is not None or record.window <= self.handled:
            return False
        self._enter(record.window)
        return True
