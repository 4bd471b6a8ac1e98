"""Prometheus metrics of a running job, served by the driver (text exposition format 0.0.4).

:func:`collect` copies what the job master knows into a :class:`DriverState` of plain data (under
the master's lock); :func:`render` turns that into the text format (a pure function: unit-tested
without Spark); :class:`MetricsServer` serves ``GET /metrics`` from a daemon thread.  The
``JobHandle`` starts one when ``spark.replication.metrics.port`` is set.

Latency histograms: a :class:`~replication.metrics.LatencyHistogram` has 16 log buckets per factor
of two; the exported ``le`` bounds are the powers of two :data:`LATENCY_BUCKETS` (about 0.24 ms to
32 s), which are edges of those buckets, so every cumulative count is exact (a value exactly equal
to a bound counts in the next bucket up).
"""

from __future__ import annotations

import base64
import hmac
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from replication.metrics import InstanceMetrics, LatencyHistogram
from replication.plan import replica_name
from transport.rpc import host_port

if TYPE_CHECKING:
    from replication.control.master import JobMaster

log = logging.getLogger(__name__)

#: the Content-Type of the text exposition format
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: ``le`` bounds of the latency histograms, in seconds (2**-12 .. 2**5; ``+Inf`` is added)
LATENCY_BUCKETS: tuple[float, ...] = tuple(2.0 ** k for k in range(-12, 6))

_SCALE = LatencyHistogram._SCALE  # internal buckets per factor of two


@dataclass(frozen=True)
class ReplicaState:
    """One replica: its place in the plan, whether it is live, and what it last reported."""

    task: str
    partition: int
    replica: int
    live: bool
    metrics: InstanceMetrics | None = None  # None until it reported


@dataclass(frozen=True)
class PartitionState:
    """One partition: replicas placed and live, and (Rhino) its replica group and last checkpoint."""

    task: str
    partition: int
    replicas: int
    live_replicas: int
    group: tuple[int, ...] | None = None  # workers of its Rhino replica group; None without Rhino
    checkpoint_id: int | None = None  # the latest completed checkpoint
    checkpoint_completed_at: float | None = None  # when the driver learned of it (wall clock)


@dataclass(frozen=True)
class DriverState:
    """Everything :func:`render` needs, as plain data."""

    job: str
    now: float  # wall clock, for checkpoint ages
    replicas: list[ReplicaState] = field(default_factory=list)
    partitions: list[PartitionState] = field(default_factory=list)
    events: int = 0
    divergences: int = 0
    recoveries: int = 0
    checkpoints_compared: int = 0
    workers_alive: int = 0
    workers_dead: int = 0
    rpc_refused: dict[str, int] = field(default_factory=dict)  # process ("driver", "worker 3") -> calls


def collect(master: JobMaster, now: float | None = None) -> DriverState:
    """A consistent copy of the job master's state (taken under its lock)."""
    with master.locked():
        plan = master.plan
        placement = dict(master.placement)
        dead, lost = set(master.dead), set(master.lost)
        metrics = dict(master.metrics)
        replicas = []
        live_count: dict[tuple[int, int], int] = {}
        placed: dict[tuple[int, int], int] = {}
        for (t, p, r), w in sorted(placement.items()):
            name = plan.task(t).name
            live = (t, p, r) not in lost and w not in dead
            placed[(t, p)] = placed.get((t, p), 0) + 1
            live_count[(t, p)] = live_count.get((t, p), 0) + live
            replicas.append(ReplicaState(name, p, r, live, metrics.get(replica_name(name, p, r))))
        partitions = []
        for (t, p), n in sorted(placed.items()):
            group = cp = None
            if master.rhino is not None:
                group = tuple(master.rhino.groups.get((t, p), ()))
                cp = master.rhino.completed.get((t, p))
            partitions.append(PartitionState(
                plan.task(t).name, p, n, live_count[(t, p)], group,
                None if cp is None else cp.checkpoint_id, None if cp is None else cp.completed_at))
        alive = sum(1 for w, info in master.workers.items() if w not in dead or info.standby)
        return DriverState(
            job=master.job_name or plan.job_name, now=time.time() if now is None else now,
            replicas=replicas, partitions=partitions, events=len(master.events),
            divergences=len(master.divergences), recoveries=len(master.recoveries),
            checkpoints_compared=master.checkpoints_compared, workers_alive=alive,
            workers_dead=len(master.workers) - alive, rpc_refused=master.refused_calls())


# -- the text format ------------------------------------------------------------------------------
def escape_label_value(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float | int | bool) -> str:
    """A sample value: integers as such, floats in Go-parsable form, ``+Inf``/``-Inf``/``NaN``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, Labels, float | int | bool]] = field(default_factory=list)

    def add(self, labels: Labels, value: float | int | bool, suffix: str = "") -> None:
        self.samples.append((self.name + suffix, labels, value))

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {_escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.type}"
        for name, labels, value in self.samples:
            inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
            yield f"{name}{{{inner}}} {format_value(value)}" if inner else f"{name} {format_value(value)}"


def histogram_buckets(hist: LatencyHistogram, bounds: Iterable[float] = LATENCY_BUCKETS) -> list[tuple[float, int]]:
    """Cumulative ``(le, count)`` pairs of ``hist`` for ascending ``bounds``, ending with
    ``(inf, hist.count)``: the count of every internal bucket whose upper edge is <= the bound
    (exact when the bounds are powers of two, which are internal bucket edges)."""
    out = []
    for le in bounds:
        limit = math.log2(le) * _SCALE  # internal bucket b holds [2**(b/S), 2**((b+1)/S))
        out.append((le, sum(n for b, n in hist.buckets.items() if b + 1 <= limit + 1e-9)))
    out.append((math.inf, hist.count))
    return out


# (attribute of InstanceMetrics, metric name, type, help)
_REPLICA_METRICS = (
    ("records_in", "replication_records_in_total", "counter",
     "Records read from Kafka (sources) or elements consumed from input channels, since the replica started."),
    ("records_out", "replication_records_out_total", "counter",
     "Records emitted downstream (sinks: output records numbered, by both replicas; the writer writes them)."),
    ("dead_lettered", "replication_dead_lettered_total", "counter", "Records sent to the dead-letter topic."),
    ("late_records", "replication_late_records_total", "counter", "Records behind the watermark, dropped."),
    ("dedup_dropped", "replication_dedup_dropped_total", "counter",
     "Duplicate elements dropped by the receiver's per-channel dedup (the twin upstream's copies)."),
    ("gaps", "replication_sequence_gaps_total", "counter", "Per-channel sequence gaps seen (must stay 0)."),
    ("queue_batches", "replication_queue_batches", "gauge", "Batches waiting in the replica's input queues."),
    ("leader", "replication_leader", "gauge", "1 while this replica is its partition's KaZoo leader."),
    ("order_epoch", "replication_order_epoch", "gauge",
     "Current leader epoch of the partition's KaZoo order log as seen by this replica (-1: none)."),
    ("pulse", "replication_pulse", "gauge", "Highest LiveRobin pulse this replica emitted or consumed."),
    ("finished", "replication_finished", "gauge", "1 once the replica has finished (drained or stopped)."),
)


def render(state: DriverState) -> str:
    """The text exposition (format 0.0.4) of ``state``; ends with a newline."""
    job = (("job", state.job),)
    fams: list[_Family] = []

    def family(name: str, type_: str, help_: str) -> _Family:
        fams.append(_Family(name, type_, help_))
        return fams[-1]

    live = family("replication_replica_live", "gauge",
                  "1 if the replica runs (0: lost with its worker and not restored yet).")
    per_replica = [(attr, family(name, t, h)) for attr, name, t, h in _REPLICA_METRICS]
    latency = family("replication_latency_seconds", "histogram",
                     "Source-to-sink latency (read from Kafka to written to Kafka) of the records this sink "
                     "replica wrote as its partition's writer.")
    for rep in state.replicas:
        labels = job + (("task", rep.task), ("partition", str(rep.partition)), ("replica", str(rep.replica)))
        live.add(labels, rep.live)
        m = rep.metrics
        if m is None:
            continue
        for attr, fam in per_replica:
            fam.add(labels, getattr(m, attr))
        if m.latency.count:  # only sink replicas that wrote record latencies: no empty histograms
            for le, count in histogram_buckets(m.latency):
                latency.add(labels + (("le", format_value(le)),), count, "_bucket")
            latency.add(labels, m.latency.total, "_sum")
            latency.add(labels, m.latency.count, "_count")

    placed = family("replication_partition_replicas", "gauge", "Replicas placed for the partition.")
    live_p = family("replication_partition_live_replicas", "gauge",
                    "Replicas of the partition that run (placed minus lost, not yet restored).")
    group = family("replication_replica_group_size", "gauge",
                   "Workers in the partition's Rhino replica group (holders of its checkpoints).")
    cp_id = family("replication_checkpoint_last_completed_id", "gauge",
                   "Id of the partition's latest completed Rhino checkpoint.")
    cp_age = family("replication_checkpoint_age_seconds", "gauge",
                    "Seconds since the driver learned that the partition's latest checkpoint completed.")
    for part in state.partitions:
        labels = job + (("task", part.task), ("partition", str(part.partition)))
        placed.add(labels, part.replicas)
        live_p.add(labels, part.live_replicas)
        if part.group is not None:
            group.add(labels, len(part.group))
        if part.checkpoint_id is not None:
            cp_id.add(labels, part.checkpoint_id)
            if part.checkpoint_completed_at:
                cp_age.add(labels, max(0.0, state.now - part.checkpoint_completed_at))

    for name, type_, help_, value in (
        ("replication_events_total", "counter", "Events the driver recorded (failures, failovers, restores...).",
         state.events),
        ("replication_divergences_total", "counter",
         "Checkpoints whose two replicas reported different state digests.", state.divergences),
        ("replication_recoveries_total", "counter",
         "Lost replicas restored from a Rhino checkpoint that caught up (two live replicas again).",
         state.recoveries),
        ("replication_checkpoints_compared_total", "counter",
         "Checkpoints whose two replicas' digests the driver compared.", state.checkpoints_compared),
        ("replication_workers_alive", "gauge", "Registered workers that are alive (standbys included).",
         state.workers_alive),
        ("replication_workers_dead", "gauge", "Registered workers declared dead.", state.workers_dead),
    ):
        family(name, type_, help_).add(job, value)
    refused = family("replication_rpc_refused_calls_total", "counter",
                     "Calls an RPC server of the job refused before reading them (unsigned, wrongly signed or "
                     "stale): someone who is not part of the job reached its port.")
    for process, count in sorted(state.rpc_refused.items()):
        refused.add(job + (("process", process),), count)
    return "".join(line + "\n" for fam in fams if fam.samples for line in fam.lines())


# -- the HTTP endpoint ----------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], render_metrics: Callable[[], str],
                 basic_auth: str | None = None) -> None:
        self.render_metrics = render_metrics
        self.authorization = None if basic_auth is None else \
            "Basic " + base64.b64encode(basic_auth.encode()).decode()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "replication-metrics"

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
               head: bool = False, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _authorized(self, head: bool) -> bool:
        expected = self.server.authorization
        if expected is None or hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected.encode()):
            return True
        self._reply(401, b"unauthorized: this endpoint wants HTTP basic authentication\n", head=head,
                    headers={"WWW-Authenticate": 'Basic realm="replication metrics", charset="UTF-8"'})
        return False

    def _metrics(self, head: bool) -> None:
        if not self._authorized(head):
            return
        if urlsplit(self.path).path != "/metrics":
            self._reply(404, b"not found: the metrics are at /metrics\n", head=head)
            return
        try:
            body = self.server.render_metrics().encode()
        except Exception as err:  # noqa: BLE001 - a scrape must not kill the server thread
            log.exception("rendering the metrics failed")
            self._reply(500, f"rendering the metrics failed: {err}\n".encode(), head=head)
            return
        self._reply(200, body, CONTENT_TYPE, head=head)

    def do_GET(self) -> None:
        self._metrics(head=False)

    def do_HEAD(self) -> None:
        self._metrics(head=True)

    def _other(self) -> None:
        if urlsplit(self.path).path == "/metrics":
            self._reply(405, b"method not allowed: GET /metrics\n", headers={"Allow": "GET, HEAD"})
        else:
            self._reply(404, b"not found: the metrics are at /metrics\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics endpoint: " + format, *args)


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (port 0: an ephemeral one), served from a daemon thread;
    ``render_metrics`` is called once per scrape; with ``basic_auth`` (``user:password``) a scrape
    without those credentials gets 401.  Raises OSError if the port cannot be bound."""

    def __init__(self, render_metrics: Callable[[], str], port: int, host: str = "",
                 basic_auth: str | None = None) -> None:
        self._server = _Server((host, port), render_metrics, basic_auth)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"metrics-http-{self.port}", daemon=True)
        self._thread.start()
        self._closed = False

    def url(self, host: str | None = None) -> str:
        """The scrape URL, with ``host`` (default: the bound host, or 127.0.0.1 when bound to all)."""
        return f"http://{host_port(host or self.host or '127.0.0.1', self.port)}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
