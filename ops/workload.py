"""The fraud workload under load, verified and measured: shared by the demo and the benchmarks.

:func:`run_fraud_workload` starts the job of :mod:`replication.examples.fraud` on a
running Spark, drives it with the load generator, drains it, compares every
output record with the plain-Python reference, and collects per-record
latencies from the sink's headers (DESIGN §11: one clock, sink time minus
source ingest time).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deploy.topics import create_topics, read_all
from ops.loadgen import LoadResult, generate_load
from ops.progress import StatusLine
from replication import JobHandle, JobResult, run
from replication.examples.fraud import (
    PaymentGenerator,
    Topics,
    build_job,
    build_replicated_job,
    canonical,
    reference,
)


@dataclass
class Check:
    name: str
    got: int
    expected: int
    exact: bool


@dataclass
class Sample:
    """One output record's clocks (seconds since the epoch)."""

    produced: float  # event time = wall clock at the load generator
    ingest: float  # source read it
    sink: float  # sink wrote it


class SampleStats:
    """Latency statistics over ``self.samples`` (for :class:`WorkloadReport` and :class:`Latencies`)."""

    samples: list[Sample]

    def by_second(self, origin: float | None = None) -> dict[int, list[float]]:
        """Source->sink latencies (s) grouped by ingest second since ``origin`` (default: the first ingest)."""
        if not self.samples:
            return {}
        origin = min(s.ingest for s in self.samples) if origin is None else origin
        groups: dict[int, list[float]] = {}
        for s in self.samples:
            groups.setdefault(int((s.ingest - origin) // 1), []).append(s.sink - s.ingest)
        return dict(sorted(groups.items()))

    def by_event_second(self, origin: float) -> dict[int, list[float]]:
        """Producer->sink latencies (s) grouped by event second since ``origin``: by the load
        generator's clock, which a partition rolled back from a checkpoint cannot hide (its records'
        ingest time is when they were read again)."""
        groups: dict[int, list[float]] = {}
        for s in self.samples:
            groups.setdefault(int((s.produced - origin) // 1), []).append(s.sink - s.produced)
        return dict(sorted(groups.items()))

    def per_second(self, origin: float | None = None) -> list[tuple[int, int, float]]:
        """(second since ``origin``, records, p99 seconds), by ingest time (see :meth:`by_second`)."""
        return [(sec, len(v), percentile(v, 0.99)) for sec, v in self.by_second(origin).items()]

    def steady(self, warm_up_s: float) -> list[Sample]:
        """Samples after the first ``warm_up_s`` seconds of the run."""
        if not self.samples:
            return []
        start = min(s.ingest for s in self.samples)
        return [s for s in self.samples if s.ingest - start >= warm_up_s]

    @property
    def throughput(self) -> float:
        """Output records per second between the first ingest and the last sink write."""
        if not self.samples:
            return 0.0
        span = max(s.sink for s in self.samples) - min(s.ingest for s in self.samples)
        return len(self.samples) / max(span, 1e-9)


@dataclass
class Latencies(SampleStats):
    """Samples of a run that is not a :class:`WorkloadReport` (e.g. a benchmark's own job)."""

    samples: list[Sample]


@dataclass
class WorkloadReport(SampleStats):
    load: LoadResult
    result: JobResult
    handle: JobHandle
    checks: list[Check]
    samples: list[Sample]
    decisions: int = 0
    alerts: int = 0
    window_totals: int = 0
    fault_at: float | None = None  # wall clock of the injected fault
    fault: str = ""  # what it did
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return all(c.exact for c in self.checks) and self.result.status == "finished"


def sample_of(record: Any, produced: float = 0.0) -> Sample:
    """The clocks of one output record, from the ``ingest_ts`` / ``sink_ts`` headers every sink writes."""
    h = {k: float(v) for k, v in record.headers if k in ("ingest_ts", "sink_ts")}
    return Sample(produced, h["ingest_ts"], h["sink_ts"])


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank q-quantile (0 < q <= 1) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def run_fraud_workload(
    bootstrap: str,
    spark: Any,
    *,
    rate: float,
    duration_s: float,
    partitions: int = 2,
    bad_every: int = 200,
    conf: dict[str, str] | None = None,
    replicated: bool = False,
    mode: str = "unordered",
    fault: Callable[[JobHandle], str] | None = None,
    fault_at_s: float = 0.0,
    status: StatusLine | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> WorkloadReport:
    """Run the fraud job for ``duration_s`` at ``rate`` events/s, drain it, verify, measure.

    ``replicated``: with ``spark.replication.enabled``; in ``mode`` ``unordered`` that is the
    single-input variant (the two regions' union and the window need an ordering mode), with
    ``liverobin`` or ``kazoo`` the full two-region job (``kazoo`` needs
    ``spark.replication.zookeeper.connect`` in ``conf``).  ``fault(handle)`` is called ``fault_at_s`` into
    the load and returns a description of what it did."""
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topics = Topics.with_prefix(f"w{stamp}-")
    conf = {"spark.replication.kafka.bootstrapServers": bootstrap, **(conf or {})}
    single_input = replicated and mode == "unordered"
    if replicated:
        conf["spark.replication.enabled"] = "true"
        conf["spark.replication.mode"] = mode
    if single_input:
        create_topics(bootstrap, {topics.eu: partitions})
        job = build_replicated_job(topics.eu, topics.decisions, name=f"fraud-replicated-{stamp}")
        regions = [topics.eu]
    else:
        create_topics(bootstrap, {topics.eu: partitions, topics.us: partitions})
        job = build_job(topics, name=f"fraud-monitor-{stamp}")
        regions = [topics.eu, topics.us]
    handle = run(job, spark=spark, conf=conf)
    say(handle.plan.describe())
    handle.wait_started()
    say("   placement (replica -> worker -> executor):\n" + handle.placement_table())

    def make(gen: PaymentGenerator):
        def f(ts: int):
            key, value, parsed = gen.next(ts)
            return key.encode(), value, parsed
        return f

    def job_status() -> str:
        m = handle.sink_metrics()
        return f"job: {m.records_out // handle.plan.replicas:,} out, p99 {m.latency.percentile(0.99) * 1000:.0f} ms"

    injected: dict[str, Any] = {}
    timer = None
    if fault is not None:
        def inject() -> None:
            injected["at"] = time.time()
            injected["what"] = fault(handle)
        timer = threading.Timer(fault_at_s, inject)

    say(f"== load: {rate:.0f} events/s for {duration_s:.0f}s into {', '.join(regions)}")
    if timer is not None:
        timer.start()
    load = generate_load(bootstrap, [(t, make(PaymentGenerator(t.rsplit("-", 1)[-1], bad_every=bad_every)))
                                     for t in regions],
                         rate=rate, duration_s=duration_s, status=status, extra_status=job_status)
    if timer is not None:
        timer.join()
        say(f"== fault at {fault_at_s:.0f}s: {injected.get('what', '?')}")
    say("== draining: sources read to the end, windows flush, the job finishes")
    result = handle.drain(timeout=300)

    say("== verifying the output against a plain-Python reference")
    decisions_raw = read_all(bootstrap, topics.decisions)
    decisions = [json.loads(r.value) for r in decisions_raw]
    dead = read_all(bootstrap, f"{job.name}.dlq")
    exp_decisions, exp_totals = reference([load.parsed[t] for t in regions])
    checks = [Check("decisions", len(decisions), len(exp_decisions), canonical(decisions) == canonical(exp_decisions))]
    totals: list = []
    if not single_input:
        totals = [json.loads(r.value) for r in read_all(bootstrap, topics.totals)]
        checks.append(Check("window totals", len(totals), len(exp_totals), canonical(totals) == canonical(exp_totals)))
    # every malformed record once (one replica of a partition writes its dead letters)
    distinct_dead = {tuple(dict(r.headers).get(f"source.{k}") for k in ("topic", "partition", "offset")) for r in dead}
    checks.append(Check("dead letters", len(dead), load.malformed,
                        len(dead) == len(distinct_dead) == load.malformed))
    samples = [sample_of(r, d["ts"] / 1000) for r, d in zip(decisions_raw, decisions, strict=True)]
    return WorkloadReport(load, result, handle, checks, samples, decisions=len(decisions),
                          alerts=sum(bool(d["alerts"]) for d in decisions), window_totals=len(totals),
                          fault_at=injected.get("at"), fault=injected.get("what", ""))
