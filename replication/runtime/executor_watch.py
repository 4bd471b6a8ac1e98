"""Watching the executor JVM that hosts this worker, so that a worker outlives its executor by
milliseconds, not by its executor's teardown.

A SIGKILLed executor JVM takes a while to die (every thread of a large process exits and its memory
is freed), and its Python worker learns of it only afterwards, from the pyspark daemon (its stdin
closes, it hangs up its workers).  Meanwhile the worker's connections stay open, so the driver and
the worker's peers wait for them to break.  The kernel marks a dying process ``PF_EXITING`` in
``/proc/<pid>/stat`` a fraction of a millisecond after the signal; a worker that reads it a few
times a second exits at once, its connections close, and the driver declares it dead from its
broken ``Attach`` watch.  A stopped (paused) JVM is not exiting: a hang stays for the silence
timeout to judge.

The check is one ``pread`` of an open file, ``CHECKS_PER_SECOND`` times a second per worker.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

PF_EXITING = 0x4
"""The kernel's flag of a process that began to exit (``include/linux/sched.h``)."""

CHECKS_PER_SECOND = 20


def exiting(stat_line: str) -> bool:
    """Whether the process whose ``/proc/<pid>/stat`` reads ``stat_line`` is exiting or dead."""
    fields = stat_line.rpartition(")")[2].split()
    if len(fields) < 7:
        return True  # the kernel always writes them: a short line is a process being torn down
    return fields[0] in ("Z", "X", "x") or bool(int(fields[6]) & PF_EXITING)


class ExecutorWatch:
    """A daemon thread calling ``on_exit()`` once, when process ``pid`` begins to exit or is gone."""

    def __init__(self, pid: int, on_exit: Callable[[], None], checks_per_second: float = CHECKS_PER_SECOND) -> None:
        self.pid = pid
        self._on_exit = on_exit
        self._period = 1.0 / checks_per_second
        self._stop = threading.Event()
        self._fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # held: the pid cannot be mistaken for a new one
        self._thread = threading.Thread(target=self._run, name=f"executor-watch-{pid}", daemon=True)

    def start(self) -> ExecutorWatch:
        self._thread.start()
        return self

    def gone(self) -> bool:
        """Whether the process is exiting or gone, now."""
        try:
            return exiting(os.pread(self._fd, 1024, 0).decode("ascii", "replace"))
        except OSError:  # ESRCH: reaped
            return True

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._period):
                if self.gone():
                    if not self._stop.is_set():
                        self._on_exit()
                    return
        finally:
            os.close(self._fd)

    def stop(self) -> None:
        """End the watch (its thread ends within one check)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2 * self._period + 1)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
