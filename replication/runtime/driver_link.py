"""A worker's link to the job master: heartbeats up, the driver's replies down, source positions.

A heartbeat thread sends one :class:`~replication.messages.Heartbeat` every interval (at once when
the driver rings or a replica has news, such as a handover's ack; every :data:`QUIET_BEAT_SHARE` of
``failureTimeout`` while quiet: its last beat reported nothing new, its hosted replicas handled no
record since the one before, and the driver's reply was the same as before), whatever the worker's main
loop is busy with: errors, metrics every metrics interval, and the reports of the worker's
control-plane services (:mod:`.services`: sink progress, checkpoints, handover acks, drain
positions, cut-offs, ...).  Each reply
goes to a :class:`Mailbox` the main loop takes it from (a reply carries the driver's whole view,
so a newer one replaces one not applied yet).  The hosted sources' read positions go to the
driver's heartbeat generators on a stream of their own (LiveRobin), opened again whenever it ends.

Heartbeats travel as signed frames (:mod:`transport.frames`) to a port of their own on the driver,
not as gRPC calls: a worker beats five times a second while it works (and two and a half times
while quiet, at the defaults), and a gRPC unary call costs several times the CPU of the same bytes
on a socket at both ends.  The driver's
other calls, its watch (which tells it at once that the process died) and the position stream
stay on gRPC.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from liverobin.positions import PositionOutbox
from replication.messages import Heartbeat, Instructions, SourcePositions, quiet_after
from transport import rpc, wire
from transport.frames import FrameCallFailed, FramePeer, TransportFailure
from transport.ids import PartitionId
from transport.security import RpcSecurity

log = logging.getLogger(__name__)

# A replica restored here reports its progress with every heartbeat for this long (not every
# metrics interval): the driver sees it caught up within a heartbeat of it.
RESTORED_REPORT_S = 10.0
# Beats at most this often when the driver rings (a restore storm rings many times a second).
BEAT_GAP_S = 0.02
# The frame method of the driver's heartbeat port.
HEARTBEAT_METHOD = "Heartbeat"
HEARTBEAT_TIMEOUT_S = 5.0
# A quiet worker beats every this share of ``failureTimeout`` (under a quarter, so the driver's
# silence detector never counts the gap as a late beat), at most every QUIET_BEAT_MAX_S (what the
# driver does not ring for reaches it within that) and at least every ``heartbeatInterval``.
QUIET_BEAT_SHARE = 0.2
QUIET_BEAT_MAX_S = 1.0


class HeartbeatPeer:
    """The worker's end of the driver's heartbeat port: one connection, one beat at a time."""

    def __init__(self, host: str, port: int, security: RpcSecurity) -> None:
        self._peer = FramePeer(host, port, HEARTBEAT_METHOD, security)

    def beat(self, req: Heartbeat, timeout: float) -> Instructions:
        """The driver's reply; raises :class:`TransportFailure` or :class:`FrameCallFailed`."""
        return wire.decode(self._peer.call(wire.encode(req), timeout), Instructions)

    def close(self) -> None:
        self._peer.close()


class Mailbox:
    """The latest heartbeat reply, from the heartbeat thread to the worker's main loop."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._reply: Instructions | None = None
        self._done = False
        self._unreachable_since: float | None = None

    def post(self, reply: Instructions | None, done: bool, at: float) -> None:
        with self._cond:
            if reply is None:
                self._unreachable_since = self._unreachable_since or at
            else:
                self._unreachable_since = None
                self._reply, self._done = reply, done
            self._cond.notify_all()

    def take(self, timeout: float) -> tuple[Instructions | None, bool, float | None]:
        """The newest reply not taken yet (None after ``timeout``), whether every instance had
        finished when it was asked for, and since when the driver has been unreachable."""
        with self._cond:
            self._cond.wait_for(lambda: self._reply is not None, timeout)
            reply, self._reply = self._reply, None
            return reply, self._done, self._unreachable_since


class DriverLink:
    """What a worker tells the driver and when.  ``worker`` is the
    :class:`~replication.runtime.worker.Worker`: its hosted replicas, checkpoints, savepoint."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.index, self.attempt, self.cfg = worker.index, worker.attempt, worker.cfg
        self._ring = threading.Event()  # the driver rang, or a replica has news for it
        self._restored_at: dict[PartitionId, float] = {}  # replicas restored here: when (monotonic)
        # how far the hosted sources read, streamed to the driver's heartbeat generators (LiveRobin)
        self._positions = PositionOutbox(self.cfg.pulse_period_ms / 1000) \
            if worker.plan.heartbeat_log is not None and self.cfg.mode == "liverobin" else None
        self._position_stream: rpc.OpenCall | None = None
        self.mailbox = Mailbox()
        # the previous beat's report (metrics apart) with how many records the hosted replicas had
        # handled, and the driver's reply to it: a beat that changes neither leaves the worker quiet
        self._last_report: tuple[Heartbeat, int] | None = None
        self._last_reply: Instructions | None = None
        self.quiet = False
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self.beats: HeartbeatPeer | None = None  # set by :meth:`connect`

    def connect(self, host: str, port: int, security: RpcSecurity) -> None:
        """Where the heartbeats go: the driver's heartbeat port (connected at the first beat)."""
        self.beats = HeartbeatPeer(host, port, security)

    # -- what the worker and its replicas hand in ---------------------------------------------
    def ring(self) -> None:
        """Send the next heartbeat now, not at the interval (rings within ``BEAT_GAP_S`` merge)."""
        self._ring.set()

    def report_position(self, topic: str, partition: int, start: int, position: int) -> None:
        """Every record of ``partition`` of ``topic`` below ``position`` exists (a hosted source
        replica reading it from ``start`` saw it)."""
        if self._positions is not None:
            self._positions.report(topic, partition, start, position)

    def restored(self, inst: PartitionId) -> None:
        """A replica was restored here: its metrics go with every heartbeat for a while."""
        self._restored_at[inst] = time.monotonic()

    # -- what goes up ---------------------------------------------------------------------------
    def stream_positions(self, master: rpc.Peer) -> None:
        """Keep the stream of the hosted sources' positions to the driver open: opened again (from
        every position known) when it ended while this attempt runs, or a source's last position
        might never reach the generators."""
        call = self._position_stream
        if self._positions is None or self.worker.stopping.is_set() or (call is not None and not call.ended):
            return
        if call is not None:
            log.warning("worker %d: the stream of source positions to the driver ended: opening it again", self.index)
        self._position_stream = master.stream("SourcePositions", self._positions.batches(
            lambda reports: SourcePositions(self.index, self.attempt, reports)))

    def metrics(self) -> dict[str, Any]:
        return {inst.name: inst.metrics for inst in self.worker.hosted()}

    def _catching_up_metrics(self) -> dict[str, Any] | None:
        """The metrics of the replicas restored here in the last :data:`RESTORED_REPORT_S`."""
        since = time.monotonic() - RESTORED_REPORT_S
        recent = [inst for key, inst in list(self.worker.instances.items())
                  if self._restored_at.get(key, since) > since]
        return {inst.name: inst.metrics for inst in recent} or None

    def heartbeat(self, with_metrics: bool) -> Instructions | None:
        """One heartbeat; the driver's reply, or None if it could not be reached."""
        assert self.beats is not None, "connect() first"
        hosted = self.worker.hosted()
        services, server = self.worker.services, self.worker.server
        parts = services.reports()
        req = Heartbeat(
            self.index, self.attempt, errors=[inst.error for inst in hosted if inst.error],
            metrics=self.metrics() if with_metrics else self._catching_up_metrics(),
            rpc_refused=server.refused if server is not None else 0, parts=parts)
        report = (replace(req, metrics=None), self._records_handled(hosted))
        req = replace(req, unchanged=report == self._last_report)
        self._last_report = report
        self.quiet = False
        try:
            reply = self.beats.beat(req, HEARTBEAT_TIMEOUT_S)
        except (TransportFailure, FrameCallFailed) as err:
            log.warning("heartbeat failed: %s", err)
            services.settle(parts, delivered=False)  # what the driver would never hear of goes with the next
            self._last_reply = None
            return None
        services.settle(parts, delivered=True)
        self.quiet = quiet_after(req, reply, self._last_reply)
        self._last_reply = reply
        return reply

    def beat_gap(self) -> float:
        """Seconds from one heartbeat to the next unless rung: longer while quiet."""
        interval = self.cfg.heartbeat_interval_ms / 1000
        if not self.quiet:
            return interval
        return max(interval, min(QUIET_BEAT_MAX_S, QUIET_BEAT_SHARE * self.cfg.failure_timeout_ms / 1000))

    @staticmethod
    def _records_handled(hosted: list[Any]) -> int:
        return sum(inst.metrics.records_in + inst.metrics.records_out + inst.metrics.dead_lettered for inst in hosted)

    # -- the heartbeat thread -----------------------------------------------------------------
    def start(self, master: rpc.Peer) -> None:
        """Start the heartbeat thread; its replies arrive in :attr:`mailbox`."""
        self._stop.clear()
        self._beater = threading.Thread(target=self._beat, args=(master, self._stop, self.mailbox),
                                        name=f"heartbeat-w{self.index}", daemon=True)
        self._beater.start()

    def stop(self) -> None:
        self._stop.set()
        self._ring.set()
        if self._beater is not None:
            self._beater.join(5)

    def close(self) -> None:
        """End the position stream (after the worker reported its end)."""
        if self._positions is not None:
            self._positions.close()
        if self._position_stream is not None:
            self._position_stream.close()
        if self.beats is not None:
            self.beats.close()

    def _beat(self, master: rpc.Peer, stop: threading.Event, mailbox: Mailbox) -> None:
        """The liveness loop: a heartbeat every interval, whatever the main loop is busy with
        (applying a reply may wait on a restore's locks for a while); each reply goes to
        ``mailbox`` with whether every instance had finished when it was asked for."""
        interval = self.cfg.heartbeat_interval_ms / 1000
        metrics_every = self.cfg.metrics_interval_ms / 1000
        next_metrics = 0.0
        last = time.monotonic()
        while not stop.is_set():
            started = time.monotonic()
            if started - last > 4 * interval:
                log.warning("heartbeat thread of worker %d ran %.2fs after its last beat (starved)", self.index,
                            started - last)
            last = started
            done = self.worker.all_finished()
            reply = self.heartbeat(with_metrics=done or started >= next_metrics)
            self.stream_positions(master)
            if time.monotonic() - started > 1.0:
                log.warning("heartbeat of worker %d took %.2fs", self.index, time.monotonic() - started)
            if started >= next_metrics:
                next_metrics = started + metrics_every
            mailbox.post(reply, done, started)
            self._ring.wait(max(0.0, self.beat_gap() - (time.monotonic() - started)))
            self._ring.clear()
            stop.wait(max(0.0, started + BEAT_GAP_S - time.monotonic()))  # (rings merge into one beat)
