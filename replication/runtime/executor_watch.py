"""Watching the executor JVM that hosts this worker, so that a worker outlives its executor by
milliseconds, not by its executor's teardown.

A SIGKILLed executor JVM takes a while to die (every thread of a large process exits and its memory
is freed), and its Python worker learns of it only afterwards, from the pyspark daemon (its stdin
closes, it hangs up its workers).  Meanwhile the worker's connections stay open, so the driver and
the worker's peers wait for them to break.  A worker that watches the JVM itself exits as soon as
the JVM begins to exit: its connections close, and the driver declares it dead from its broken
``Attach`` watch.  Two signs, whichever comes first: the JVM's pidfd turns readable when it has
exited (a thread blocked in ``poll`` hears it at once, at no cost while it runs), and the kernel
marks a dying process ``PF_EXITING`` in ``/proc/<pid>/stat`` a fraction of a millisecond after the
signal, read ``CHECKS_PER_SECOND`` times a second (one ``pread`` of a held file) for a JVM whose
teardown takes long.  A stopped (paused) JVM is not exiting: a hang stays for the silence timeout
to judge.  Both files refer to the process, never to a later one given the same pid.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

from replication.procfs import stat_fields

PF_EXITING = 0x4
"""The kernel's flag of a process that began to exit (``include/linux/sched.h``)."""

CHECKS_PER_SECOND = 4


def exiting(stat_line: str) -> bool:
    """Whether the process whose ``/proc/<pid>/stat`` reads ``stat_line`` is exiting or dead."""
    fields = stat_fields(stat_line)
    if len(fields) < 7:
        return True  # the kernel always writes them: a short line is a process being torn down
    return fields[0] in ("Z", "X", "x") or bool(int(fields[6]) & PF_EXITING)


class ExecutorWatch:
    """A daemon thread calling ``on_exit()`` once, when process ``pid`` begins to exit or is gone
    (:meth:`start` it once made: it owns its files until its thread ends)."""

    def __init__(self, pid: int, on_exit: Callable[[], None], checks_per_second: float = CHECKS_PER_SECOND) -> None:
        self.pid = pid
        self._on_exit = on_exit
        self._period_ms = max(1, int(1000 / checks_per_second))
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the thread closes its files under it, stop() writes under it
        self._closed = False
        self._stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        self._wake_r, self._wake_w = os.pipe()  # stop() writes to it: the poll returns at once
        self._poll = select.poll()
        self._poll.register(self._wake_r, select.POLLIN)
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
            self._poll.register(self._pidfd, select.POLLIN)
        except (AttributeError, OSError):  # no pidfd (Linux < 5.3): the stat reads alone
            pass
        self._thread = threading.Thread(target=self._run, name=f"executor-watch-{pid}", daemon=True)

    def start(self) -> ExecutorWatch:
        self._thread.start()
        return self

    def gone(self) -> bool:
        """Whether the process is exiting or gone, now."""
        try:
            return exiting(os.pread(self._stat, 1024, 0).decode("ascii", "replace"))
        except OSError:  # ESRCH: reaped
            return True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                ready = self._poll.poll(self._period_ms)
                if self._stop.is_set():
                    return
                if any(fd == self._pidfd for fd, _ in ready) or self.gone():
                    self._on_exit()
                    return
        finally:
            with self._lock:
                self._closed = True
                for fd in (self._stat, self._wake_r, self._wake_w, self._pidfd):
                    if fd is not None:
                        os.close(fd)

    def stop(self) -> None:
        """End the watch (its thread ends at once)."""
        self._stop.set()
        with self._lock:
            if not self._closed:
                os.write(self._wake_w, b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
