"""The driver's liveness loop: a thread that declares dead the workers whose executor left the
cluster or that were silent too long, starts Rhino's pending restores and copies, and writes the
status file.

A crashed worker is usually seen sooner, when its watch on the driver ends
(:meth:`replication.control.losses.Losses.watch_ended`); silence is left for hangs and partitions,
and which silences count is :func:`replication.control.liveness.silent_workers`'s.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from replication.control.liveness import FATAL_SILENCE_FACTOR, WorkerInfo, silent_workers

if TYPE_CHECKING:
    from replication.control.master import JobMaster

log = logging.getLogger(__name__)

# How often the liveness loop asks Spark which executors are registered.  A killed executor's
# worker is usually seen dead sooner, when its process exits and its watch on the driver ends:
# both wait for the kernel to tear the JVM down.
EXECUTOR_POLL_S = 0.5


def _waited(info: WorkerInfo, now: float, patience: float) -> str:
    """Why a worker was given more than one timeout, for its reason of death."""
    if not info.heard:
        return " (waited longer: it had not sent its first heartbeat)"
    if patience > 1:
        return f" (waited longer: its heartbeats came up to {info.late_beats.worst(now):.1f}s apart lately)"
    return ""


def monitor(master: JobMaster, period_s: float = 0.1, executor_poll_s: float = EXECUTOR_POLL_S) -> None:
    """Liveness loop (a driver thread) until ``master`` ends watching; Spark's list of executors is
    asked for every ``executor_poll_s`` (a py4j call costs the driver and its JVM more than the rest
    of a round)."""
    m, losses = master, master.losses
    last_round = time.monotonic()
    next_poll = last_round
    patient_with: set[int] = set()  # silent workers whose loss would end the job
    while not m.closed.wait(period_s):
        alive_executors = None
        if m.executor_ids is not None and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + executor_poll_s
            try:
                alive_executors = set(m.executor_ids())
            except Exception as err:  # noqa: BLE001 - the SparkContext may be stopping
                log.debug("executor list unavailable: %s", err)
        status = None
        with m.locked():
            now = time.monotonic()
            if now - last_round > max(0.5, m.failure_timeout_s / 4):
                # this driver stalled (GIL, GC, a slow Spark call): the heartbeats that could not be
                # handled meanwhile say nothing about the workers
                log.warning("job master stalled for %.1fs: worker silence is counted from now", now - last_round)
                for info in m.workers.values():
                    info.last_seen = max(info.last_seen, now)
            last_round = now
            silence: dict[int, float] = {}
            for w, info in list(m.workers.items()):
                if not losses.counts(w, info):
                    continue
                if alive_executors is not None and info.executor not in alive_executors:
                    losses.declare_dead(w, f"executor {info.executor} left the cluster")
                else:
                    silence[w] = now - info.last_seen
            fatal = {w for w, s in silence.items() if s > m.failure_timeout_s and losses.ends_the_job(w)}
            for w in fatal - patient_with:
                m.event(f"worker {w} silent for {silence[w]:.1f}s, but its loss would end the job: "
                        f"declared dead only after {m.failure_timeout_s * FATAL_SILENCE_FACTOR:.1f}s")
            patient_with = fatal
            patience = {w: m.workers[w].patience(now, m.failure_timeout_s) for w in silence}
            for w in silent_workers(silence, m.failure_timeout_s, fatal=fatal, patience=patience):
                if losses.counts(w, m.workers[w]):
                    losses.declare_dead(w, f"silent for {silence[w]:.1f}s{_waited(m.workers[w], now, patience[w])}")
            if m.rhino is not None and m.lost and not m.restores.restoring:
                m.restores.start()
            if m.rhino is not None:
                m.restores.start_copies()
            status = m.status_file.due(m)
        if status is not None:  # written (fsync) outside the lock: heartbeats do not wait for the disk
            m.status_file.publish(status)
