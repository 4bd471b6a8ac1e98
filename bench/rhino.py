"""Rhino checkpoints: time from an executor kill to two live replicas again, per state size, and
the same kill with replication off (checkpoint-restart from the same checkpoints, the passive
baseline); bytes shipped per checkpoint vs bytes changed; the cost of checkpointing for steady-state
latency.

    .venv/bin/python bench/rhino.py [--workload synthetic|nexmark] [--sizes 10MB,100MB] [--rate 200]
                                    [--entries 64] [--value-bytes 1000]
                                    [--checkpoint-every 100] [--steady 5] [--after 5] [--victim 'stateful[0]r0']
                                    [--latency-size 10MB] [--latency-duration 20] [--latency-modes on,off]
                                    [--latency-runs 1] [--out bench/results/rhino] [--replot]

``--sizes 1GB`` works (about 3 minutes on 2 cores, 90 s of it building the state; give it
``--recovery-timeout 300 --group-timeout 240``): full snapshots of 1 GB then take 6-10 s each.

The job (defined here): one Kafka topic of small records (1 partition) -> ``key_by`` (64 keys) ->
``stateful`` (a keyed process function with one map state, parallelism 1) -> exactly-once sink.
Record ``i`` is a *grow* record while ``i < n_grow``: it writes ``--entries`` map entries
``(i, j)`` of ``--value-bytes`` bytes each (SHAKE-128 of ``"i:j"``: deterministic, incompressible),
so the state grows by about 64 KB per record until it holds the target size; every later record is an
*update*: it reads one existing entry (spread over the whole state), outputs the first 8 bytes of the
old value and overwrites it (steady state: about one entry changes per record).  Every record gives
one small output record, so the sink measures the end-to-end latency, and the outputs are checked
against a plain-Python reference: every id exactly once, and every update saw the value the reference
says (the state, restored or not, was right).  State size = the logical bytes RocksDB holds for the
operator (physical key + pickled value, what a full checkpoint ships), 1 MB = 10^6 bytes; with
parallelism 1 the restored replica holds all of it.

``--workload nexmark`` runs the same experiments on the NEXMark-like windowed join of
:mod:`replication.examples.workloads` (``bench/workloads.py``'s ``nexmark``: persons and auctions, 2
partitions each -> tag -> union -> ``key_by`` person -> the join, 2 partitions, state never cleared ->
exactly-once sink) instead (:class:`NexmarkWorkload`): the input round robin person, auction x3 at
``--rate``; the first ``--nexmark-grow-s`` seconds of it carry the payload that makes the join's state
about the size named (the whole join's: the killed partition holds about half), later events
``--nexmark-payload`` bytes (the state keeps growing slowly, as the query's does); the default victim is
``person-auction-join[0]r0``; the state model (:func:`~replication.examples.nexmark.nexmark_state_bytes`)
is kept per event and per partition (from the plan's routing table); the output is checked with
:func:`~replication.examples.nexmark.verify_nexmark` (every pair of the same window exactly once).
``recovery.csv`` then also has ``state_at_kill_bytes`` / ``victim_state_bytes`` (the model at the kill,
of the join and of the killed partition); bytes are over both partitions of the join.  The rest of this
module (waiting for the state, the kill, the recovery phases, the checkpoint log) is the same for both.

Everything runs on one embedded stack and one ``local-cluster[3,1,512]`` Spark, replicated
(``spark.replication.enabled``, ``mode=liverobin``), with Rhino (``rhino.enabled``, ``rhino.replicas=1``):

1. Recovery, per ``--sizes``: feed ``--rate`` records/s; once both replicas of ``stateful[0]`` have
   consumed every grow record and a checkpoint taken after that completed (and every partition has a
   completed checkpoint on a live group member), ``--steady`` more seconds; then SIGKILL the executor of
   ``--victim`` (``ops.chaos``) and wait until ``JobHandle.recoveries()`` lists every replica that
   executor hosted; then until the new replica group holds a checkpoint again, ``--after`` seconds, drain.
   Phases of the victim's recovery (Rhino's Table 1: scheduling, state fetch, state load):
   *detect* kill -> the driver declared the worker dead (Spark's notice: the scheduling part),
   *dispatch* dead -> restore started on the group member (the driver's Restore RPC),
   *fetch* none (the member already holds the checkpoint: 0 bytes over the network; the bytes
   hard-linked and copied are read from the member's snapshot the restore linked), *load* the hard-link restore of the
   RocksDB files (the driver's ``load_s``), *start* the rest of the restore on the worker (rebuild the
   instance, open RocksDB, rejoin the channels), *catch-up* restored -> its pulse reached its twin's (the driver's
   "caught up"), and the total kill -> two live replicas.  ``--recovery-modes`` runs each size
   ``active`` (as above) and/or ``passive``: ``spark.replication.enabled=false``, one instance per
   partition, the victim rolled back to its safe checkpoint and replayed (catch-up: until its pulse
   reaches the one it had).  Latency around the kill is by event time (sink - produced, the load
   generator's clock: a rolled-back source reads records again, so their ingest time would hide the
   stall): p99 before, the worst per-second p99 after, the *stall* (seconds of the first 30 whose p99
   is over twice the one before) and per second in ``kill_timeline.csv`` / ``kill_latency.png``.
2. Bytes: every checkpoint seen in the metrics (``checkpoint_bytes_changed`` / ``_shipped``, sampled at
   10 Hz; the jobs report metrics with every heartbeat, ``metrics.interval=200ms``), summed per phase
   (growth, steady, recovery, after the kill) over the replica that ships (the lowest live one), the
   first one and those that carry at least half the state counted as full snapshots; the other
   replica's increments in a row of their own (it writes them too, and the metric counts them).
3. Latency: the same job and rate with Rhino on and off (replication on in both), no kill: p50/p99/p99.9
   of sink time - ingest time over the update records once the state reached ``--latency-size``.

Writes ``recovery.csv``, ``kill_timeline.csv``, ``bytes.csv``, ``latency.csv``, ``checkpoints.csv``
(every checkpoint seen), ``latency_timeline.csv`` (per-second p50/p99 of the latency runs),
``recovery.png``, ``kill_latency.png``, ``latency.png``, ``bytes.png`` and ``machine.txt``.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import glob
import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import PacedFeeder, forget_topics, format_row, one_line, write_csv, write_machine  # noqa: E402
from deploy.stack import EmbeddedStack, StackEndpoints, require_java17  # noqa: E402
from deploy.topics import create_topics, read_all  # noqa: E402
from ops.chaos import kill_executor, locate  # noqa: E402
from ops.progress import StatusLine, bar  # noqa: E402
from ops.workload import Latencies, Sample, percentile, sample_of  # noqa: E402
from replication import JobFailedError, JobHandle, run  # noqa: E402
from replication.api import Job  # noqa: E402
from replication.examples.nexmark import (  # noqa: E402
    NEXMARK_JOIN,
    NexmarkConfig,
    NexmarkGenerator,
    NexmarkTopics,
    build_nexmark_job,
    nexmark_state_bytes,
    payload_for_state,
    verify_nexmark,
)
from replication.functions import KeyedProcessFunction, ProcessContext, RuntimeContext  # noqa: E402
from replication.plan import PhysicalPlan, replica_name  # noqa: E402
from replication.spark_cluster import build_session, stop_session, wait_for_executors  # noqa: E402
from rhino_state.keys import encode_key, key_group  # noqa: E402

MS = 1000.0
MB = 1_000_000
STATEFUL = "stateful"  # the keyed operator (and its task); the sink is a task of its own
SOURCE, SINK = "source", "sink"
EXECUTORS = 3


# ------------------------------------------------------------------------------------------ the job
def entry_value(writer: int, j: int, size: int) -> bytes:
    """The value record ``writer`` writes to entry ``j``: deterministic, incompressible bytes."""
    return hashlib.shake_128(f"{writer}:{j}".encode()).digest(size)


class GrowThenUpdate(KeyedProcessFunction):
    """Grow records (``n`` set) write entries ``(g, 0..n-1)``; update records rewrite entry ``(g, j)``
    and output the first 8 bytes of its old value (so the output depends on the state)."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = value_bytes

    def open(self, ctx: RuntimeContext) -> None:
        self.entries = ctx.map_state("entries")

    def process(self, e: dict, ctx: ProcessContext) -> Iterable[dict]:
        if "n" in e:
            g = e["id"]
            for j in range(e["n"]):
                self.entries.put((g, j), entry_value(g, j, self.value_bytes))
            yield {"id": g, "ts": e["ts"]}
        else:
            old = self.entries.get((e["g"], e["j"]))
            self.entries.put((e["g"], e["j"]), entry_value(e["id"], e["j"], self.value_bytes))
            yield {"id": e["id"], "old": None if old is None else old[:8].hex(), "ts": e["ts"]}


def build_rhino_job(topic: str, out_topic: str, name: str, value_bytes: int) -> Job:
    if __name__ != "__main__":  # imported (not run as a script): executors cannot import ``bench``
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    job = Job(name)
    src = job.source(topic, deserializer="json", timestamp=lambda e: e["ts"], name=SOURCE)
    (src.key_by(lambda e: e["k"]).process(GrowThenUpdate(value_bytes), name=STATEFUL, parallelism=1)
     .new_task().sink(out_topic, serializer="json", name=SINK))
    return job


@dataclass
class Workload:
    """The synthetic job's workload (the module doc): which record is what, the state it builds, and the
    output the reference expects.  With :class:`NexmarkWorkload`, what :class:`Run` needs of a workload:
    ``task`` (the stateful task), ``n_grow`` (records that build the state), ``state_bytes``, the input
    topics, the job, ``make`` (record ``i``), ``bind`` (to the plan), ``state_after`` / ``state_of``
    (the model) and ``check`` (the verdict of the output)."""

    kind = "synthetic"
    task = STATEFUL

    target_bytes: int
    entries: int = 64
    value_bytes: int = 1000
    keys: int = 64
    n_grow: int = 0
    cumulative: list[int] = field(default_factory=list)  # state bytes after grow record i

    def __post_init__(self) -> None:
        value_len = len(pickle.dumps(b"\0" * self.value_bytes, protocol=5))
        total = 0
        while total < self.target_bytes:
            g = len(self.cumulative)
            key_len = len(encode_key(self.key_of(g)))
            # physical key: key group (2) + state id (4) + key length (4) + key + map key
            total += sum(10 + key_len + len(encode_key((g, j))) + value_len for j in range(self.entries))
            self.cumulative.append(total)
        self.n_grow = len(self.cumulative)

    @property
    def state_bytes(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0

    def state_after(self, records: int) -> int:
        """State bytes once the first ``records`` records were processed."""
        n = min(records, self.n_grow)
        return self.cumulative[n - 1] if n > 0 else 0

    def grow_records_for(self, size: int) -> int:
        """How many grow records it takes to hold ``size`` bytes."""
        return min(self.n_grow, bisect.bisect_left(self.cumulative, size) + 1)

    def key_of(self, g: int) -> str:
        return f"k{g % self.keys}"

    def target(self, i: int) -> tuple[int, int]:
        """The entry (g, j) update record ``i`` rewrites (spread over the whole state)."""
        return (i * 2654435761) % self.n_grow, i % self.entries

    def record(self, i: int, ts_ms: int) -> tuple[bytes, bytes]:
        if i < self.n_grow:
            event = {"id": i, "k": self.key_of(i), "n": self.entries, "ts": ts_ms}
        else:
            g, j = self.target(i)
            event = {"id": i, "k": self.key_of(g), "g": g, "j": j, "ts": ts_ms}
        return event["k"].encode(), json.dumps(event, separators=(",", ":")).encode()

    def topics(self) -> dict[str, int]:
        """Input topics by logical name, with their partitions."""
        return {"in": 1}

    def build_job(self, topics: dict[str, str], out_topic: str, name: str) -> Job:
        return build_rhino_job(topics["in"], out_topic, name, self.value_bytes)

    def extra_conf(self) -> dict[str, str]:
        return {}

    def bind(self, plan: PhysicalPlan) -> None:
        """Nothing to learn from the plan: one partition."""

    def make(self, i: int, ts_ms: int) -> tuple[str, bytes, bytes]:
        """Record ``i`` at wall clock ``ts_ms``: (logical topic, key, value)."""
        return ("in", *self.record(i, ts_ms))

    def state_of(self, partition: int, records_in: int, restored: bool) -> int:
        """State bytes of a replica of ``task[partition]`` that consumed ``records_in`` records (a restored
        replica counts anew: it holds the whole state)."""
        return self.state_bytes if restored else self.state_after(records_in)

    def partition_state(self, partition: int) -> int:
        """State bytes of ``task[partition]`` once every record produced so far was processed."""
        return self.state_bytes

    def check(self, outputs: list[dict], produced: int) -> Verdict:
        return verify(outputs, self, produced)

    def describe(self) -> str:
        return (f"{self.n_grow:,} grow records of {self.entries} x {self.value_bytes} B "
                f"({self.state_bytes / MB:,.1f} MB of state), then updates")

    def expected_old(self, produced: int) -> dict[int, str]:
        """Update record id -> the 8-byte prefix (hex) of the value it must have read."""
        last: dict[tuple[int, int], int] = {}
        out: dict[int, str] = {}
        for i in range(self.n_grow, produced):
            g, j = self.target(i)
            writer = last.get((g, j), g)
            out[i] = entry_value(writer, j, 8).hex()  # SHAKE: a prefix of the longer output
            last[(g, j)] = i
        return out


@dataclass
class Verdict:
    records: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    wrong_state: int = 0  # update records that read another value than the reference's

    @property
    def exact(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected or self.wrong_state)

    def describe(self) -> str:
        if self.exact:
            return f"exact ({self.records:,} outputs, each id once, every update read the right value)"
        return (f"{self.missing} missing, {self.duplicated} duplicated, {self.unexpected} unexpected, "
                f"{self.wrong_state} updates read a wrong value (of {self.records:,} outputs)")


def verify(outputs: list[dict], workload: Workload, produced: int) -> Verdict:
    v = Verdict(records=len(outputs))
    seen: set[int] = set()
    expected = workload.expected_old(produced)
    for out in outputs:
        i = out["id"]
        if i in seen:
            v.duplicated += 1
            continue
        seen.add(i)
        if not 0 <= i < produced:
            v.unexpected += 1
        elif i >= workload.n_grow and out.get("old") != expected[i]:
            v.wrong_state += 1
    v.missing = produced - len(seen & set(range(produced)))
    return v


@dataclass
class NexmarkVerdict(Verdict):
    """:class:`Verdict` of the NEXMark-like join: ``wrong_state`` counts pairs whose values differ from the
    reference's; ``report`` is :func:`verify_nexmark`'s."""

    report: Any = None

    def describe(self) -> str:
        if self.exact:
            return f"exact ({self.records:,} outputs: every pair of the reference once)"
        return str(self.report)


class NexmarkWorkload:
    """The NEXMark-like windowed join of :mod:`replication.examples.workloads` (persons and auctions, 2
    partitions each, joined per person in tumbling windows; its state is never cleared) as a recovery
    workload: the input round robin person, auction, auction, auction (as ``bench/workloads.py``), the
    first ``n_grow`` events (``grow_s`` seconds at ``rate``) with the payload that makes the join's state
    about ``target_bytes`` (:func:`payload_for_state`), then ``steady_payload`` bytes per event (the state
    keeps growing, slowly).  The state model (:func:`nexmark_state_bytes`) is kept per event and per
    partition of the join (the key's partition from the plan's routing table), and the output is checked
    with :func:`verify_nexmark` against every event produced."""

    kind = "nexmark"
    task = NEXMARK_JOIN
    PERSON_EVERY = 4  # one person, then 3 auctions (NEXMark: 1 person : 3 auctions)

    def __init__(self, target_bytes: int, rate: float, grow_s: float = 20.0, steady_payload: int = 100,
                 window_ms: int = 2000, seed: int = 5, cache_entries: int = 200) -> None:
        self.target_bytes, self.steady_payload, self.cache_entries = target_bytes, steady_payload, cache_entries
        self.n_grow = max(self.PERSON_EVERY, int(rate * grow_s))
        persons = -(-self.n_grow // self.PERSON_EVERY)
        self.config = NexmarkConfig(window_ms=window_ms, seed=seed)
        self.config = NexmarkConfig(window_ms=window_ms, seed=seed, payload_bytes=payload_for_state(
            target_bytes, persons, self.n_grow - persons, self.config))
        self.generator = NexmarkGenerator(self.config)
        self.events: list[tuple[str, dict]] = []  # ("person" | "auction", record) in production order
        self.cumulative: list[int] = []  # model bytes of the whole join after event i
        self.by_partition: dict[int, list[int]] = {}  # partition -> model bytes after each of its events
        self._route: Callable[[int], int] = lambda person: 0
        self._lock = threading.Lock()

    @property
    def value_bytes(self) -> int:
        return self.config.payload_bytes

    @property
    def state_bytes(self) -> int:
        """The model after the grow events (the target until they were produced)."""
        return self.cumulative[self.n_grow - 1] if len(self.cumulative) >= self.n_grow else self.target_bytes

    def topics(self) -> dict[str, int]:
        return {"persons": 2, "auctions": 2}

    def build_job(self, topics: dict[str, str], out_topic: str, name: str) -> Job:
        return build_nexmark_job(NexmarkTopics(topics["persons"], topics["auctions"], out_topic),
                                 self.config.window_ms, name=name)

    def extra_conf(self) -> dict[str, str]:
        # few cached entries, so that the state is in RocksDB (as bench/workloads.py)
        return {"spark.replication.state.cacheEntries": str(self.cache_entries)}

    def bind(self, plan: PhysicalPlan) -> None:
        """Learn where each person's state lives: the join's routing table at the start (no handover here)."""
        table, g = plan.routing[next(t.id for t in plan.tasks if t.name == self.task)], plan.num_key_groups
        self._route = lambda person: table.partition_of_key_group(key_group(encode_key(person), g), g)

    def partition_of(self, person: int) -> int:
        """The join's partition that holds ``person``'s state (0 before :meth:`bind`)."""
        return self._route(person)

    def make(self, i: int, ts_ms: int) -> tuple[str, bytes, bytes]:
        if i == self.n_grow:  # the state is built: small events from now on
            self.generator.config = NexmarkConfig(self.config.window_ms, self.steady_payload,
                                                  self.config.active_sellers, self.config.seed)
        if i % self.PERSON_EVERY == 0:
            key, rec = self.generator.person(ts_ms)
            side, topic, person, size = "person", "persons", rec["id"], nexmark_state_bytes(
                [rec], [], self.config.window_ms)
        else:
            key, rec = self.generator.auction(ts_ms)
            side, topic, person, size = "auction", "auctions", rec["seller"], nexmark_state_bytes(
                [], [rec], self.config.window_ms)
        with self._lock:
            self.events.append((side, rec))
            self.cumulative.append((self.cumulative[-1] if self.cumulative else 0) + size)
            mine = self.by_partition.setdefault(self.partition_of(person), [])
            mine.append((mine[-1] if mine else 0) + size)
        return topic, key, json.dumps(rec, separators=(",", ":")).encode()

    def state_after(self, records: int) -> int:
        """Model bytes of the whole join once its partitions processed ``records`` events."""
        n = min(records, len(self.cumulative))
        return self.cumulative[n - 1] if n > 0 else 0

    def state_of(self, partition: int, records_in: int, restored: bool) -> int:
        mine = self.by_partition.get(partition, [])
        n = len(mine) if restored else min(records_in, len(mine))
        return mine[n - 1] if n > 0 else 0

    def partition_state(self, partition: int) -> int:
        mine = self.by_partition.get(partition, [])
        return mine[-1] if mine else 0

    def check(self, outputs: list[dict], produced: int) -> Verdict:
        with self._lock:
            events = self.events[:produced]
        persons = [r for side, r in events if side == "person"]
        auctions = [r for side, r in events if side == "auction"]
        report = verify_nexmark(outputs, persons, auctions, self.config.window_ms)
        c = report.counts()
        return NexmarkVerdict(records=report.records, missing=c["missing"], duplicated=c["duplicated"],
                              unexpected=c["unexpected"], wrong_state=c["wrong"], report=report)

    def describe(self) -> str:
        return (f"NEXMark-like join: {self.n_grow:,} events of {self.config.payload_bytes:,} B payload "
                f"(about {self.target_bytes / MB:,.0f} MB of join state), then {self.steady_payload} B per event")


AnyWorkload = Workload | NexmarkWorkload


def make_workload(args: argparse.Namespace, size: int) -> AnyWorkload:
    """The ``--workload`` at ``size`` bytes of state."""
    if args.workload == "nexmark":
        return NexmarkWorkload(size, args.rate, args.nexmark_grow_s, args.nexmark_payload, args.nexmark_window_ms,
                               args.seed, args.state_cache_entries)
    return Workload(size, args.entries, args.value_bytes, args.keys)


# ------------------------------------------------------------------------------------------ checkpoints
class CheckpointLog(threading.Thread):
    """Samples the workers' metrics at 10 Hz and keeps one row per checkpoint seen (or per group of
    checkpoints taken between two samples): bytes changed and shipped, whether that replica was the
    shipper (the lowest live replica of its partition), the run phase, the state size at the time."""

    def __init__(self, handle: JobHandle, workload: AnyWorkload | None, label: str) -> None:
        super().__init__(name="rhino-ckpt-log", daemon=True)
        self.handle, self.workload, self.label = handle, workload, label
        self.phase = "growth"
        self.rows: list[dict] = []
        self._prev: dict[str, tuple[int, int, int]] = {}
        self._halt = threading.Event()
        self.t0 = time.time()

    def _shippers(self) -> dict[tuple[int, int], int]:
        master = self.handle.master
        with master.locked():
            if master.rhino is None:
                return {}
            out: dict[tuple[int, int], int] = {}
            for (t, p, r), w in sorted(master.rhino.placement.items()):
                if w not in master.dead and (t, p) not in out:
                    out[(t, p)] = r
            return out

    def sample(self) -> None:
        snap = self.handle.master.snapshot()
        shippers = self._shippers()
        plan = self.handle.plan
        for t in plan.tasks:
            for p in range(t.parallelism):
                for r in range(plan.replicas):
                    name = replica_name(t.name, p, r)
                    m = snap.get(name)
                    if m is None:
                        continue
                    now = (m.checkpoints_taken, m.checkpoint_bytes_changed, m.checkpoint_bytes_shipped)
                    prev = self._prev.get(name, (0, 0, 0))
                    if now[0] < prev[0]:  # a restored replica reports fresh counters
                        prev = (0, 0, 0)
                    self._prev[name] = now
                    if now[0] == prev[0]:
                        continue
                    state = 0
                    if self.workload is not None and t.name == self.workload.task:  # (a restored one counts anew)
                        state = self.workload.state_of(p, m.records_in, m.restored_from >= 0)
                    self.rows.append({
                        "run": self.label, "t_s": time.time() - self.t0, "phase": self.phase, "replica": name,
                        "shipper": "yes" if shippers.get((t.id, p)) == r else "no",
                        "restored": "yes" if m.restored_from >= 0 else "no",
                        "checkpoints": now[0] - prev[0], "checkpoint_id": m.checkpoint_id,
                        "bytes_changed": now[1] - prev[1], "bytes_shipped": now[2] - prev[2],
                        "checkpoint_ms": m.checkpoint_ms, "state_bytes": state})

    def run(self) -> None:
        while not self._halt.wait(0.1):
            try:
                self.sample()
            except Exception:  # noqa: BLE001, S112 - a sample lost is no reason to stop sampling
                continue

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()


# ------------------------------------------------------------------------------------------ runs
class RunFailed(RuntimeError):
    pass


@dataclass
class RunContext:
    stack: StackEndpoints
    spark: Any
    args: argparse.Namespace
    status: StatusLine
    state_dir: Path


def job_conf(ctx: RunContext, rhino: bool, replicated: bool = True, extra: dict[str, str] | None = None
             ) -> dict[str, str]:
    conf = {"spark.replication.kafka.bootstrapServers": ctx.stack.bootstrap_servers,
            "spark.replication.enabled": str(replicated).lower(), "spark.replication.mode": "liverobin",
            "spark.replication.state.dir": str(ctx.state_dir),
            # metrics with every heartbeat (default: once a second): the driver's "caught up" and this
            # benchmark's checkpoint log see a replica's progress within 0.2 s
            "spark.replication.metrics.interval": "200ms",
            "spark.replication.failureTimeout": ctx.args.failure_timeout}
    if rhino:
        conf.update({"spark.replication.rhino.enabled": "true",
                     "spark.replication.rhino.checkpointEvery": str(ctx.args.checkpoint_every),
                     "spark.replication.rhino.replicas": "1"})
    return {**conf, **(extra or {})}


class Run:
    """One job run: start, feed, watch (status line), stop feeding, drain, verify."""

    def __init__(self, ctx: RunContext, label: str, workload: AnyWorkload, rhino: bool,
                 replicated: bool = True) -> None:
        self.ctx, self.label, self.workload, self.rhino = ctx, label, workload, rhino
        self.stamp = stamp = f"{int(time.time() * 1000) % 10**10}"
        self.topics = {name: f"rh{stamp}-{name}" for name in workload.topics()}
        self.out_topic = f"rh{stamp}-out"
        self.name = f"rhino-{re.sub(r'[^A-Za-z0-9]', '', label)}-{stamp}"
        create_topics(ctx.stack.bootstrap_servers, {self.topics[n]: k for n, k in workload.topics().items()})
        self.handle = run(workload.build_job(self.topics, self.out_topic, self.name), spark=ctx.spark,
                          conf=job_conf(ctx, rhino, replicated, workload.extra_conf()))
        try:
            self.handle.wait_started(120)
        except BaseException:
            if self.handle.running:
                try:
                    self.handle.stop(30)
                except (JobFailedError, TimeoutError):
                    pass
            raise
        self.plan = self.handle.plan
        self.task = next(t for t in self.plan.tasks if t.name == workload.task)
        workload.bind(self.plan)

        def record(i: int) -> tuple[str, bytes, bytes]:
            topic, key, value = workload.make(i, int(time.time() * 1000))
            return self.topics[topic], key, value

        self.feeder = PacedFeeder(ctx.stack.bootstrap_servers, record, ctx.args.rate, name="rhino-feeder")
        self.ckpts = CheckpointLog(self.handle, workload, label)
        self.started = time.time()
        self.phase = "growth"
        self.feeder.start()
        self.ckpts.start()
        self.produced = 0
        self.failure: str | None = None  # the job failed (or the load generator)
        self.problem: str | None = None  # the experiment did not go as planned (a wait timed out)
        self.samples: list[Sample] = []
        self.verdict: Verdict | None = None
        self.result: Any = None

    # -- watching ----------------------------------------------------------------------------
    def set_phase(self, phase: str) -> None:
        """Checkpoints taken so far belong to the old phase: they reach the driver with the next
        heartbeat (``spark.replication.heartbeatInterval``, 200 ms), so sample once more first."""
        time.sleep(0.3)
        self.ckpts.sample()
        self.phase = self.ckpts.phase = phase

    def consumed(self) -> int:
        """Records the stateful task has consumed, over its partitions (the slower replica of each)."""
        snap = self.handle.master.snapshot()
        total = 0
        for p in range(self.task.parallelism):
            ins = [m.records_in for r in range(self.plan.replicas)
                   if (m := snap.get(replica_name(self.task.name, p, r))) is not None]
            if len(ins) < self.plan.replicas:
                return 0
            total += min(ins)
        return total

    def completed_checkpoint(self) -> int:
        rhino = self.handle.master.rhino
        cp = rhino.completed.get((self.task.id, 0)) if rhino is not None else None
        return cp.checkpoint_id if cp is not None else -1

    def status_line(self) -> str:
        w = self.workload
        n = self.consumed()
        sm = self.handle.sink_metrics()
        sink, p99 = sm.records_out // self.plan.replicas, sm.latency.percentile(0.99) * MS
        text = (f"{self.label} {self.phase}: fed {self.feeder.produced:,}, state {bar(n / max(w.n_grow, 1), 12)} "
                f"{w.state_after(n) / MB:,.0f}/{w.state_bytes / MB:,.0f} MB, out {sink:,}, p99 {p99:,.0f} ms")
        if self.rhino:
            text += f", ckpt done #{self.completed_checkpoint()}"
        return text

    def wait_for(self, cond: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll ``cond`` (status line meanwhile); returns the wall time it held; raises RunFailed."""
        deadline = time.monotonic() + timeout
        next_status = 0.0
        while True:
            if cond():
                return time.time()
            master = self.handle.master
            if master.failure or not self.handle.running:
                raise RunFailed(f"job failed while waiting for {what}: {master.failure or 'Spark job ended'}")
            if self.feeder.error:
                raise RunFailed(f"load generator: {self.feeder.error}")
            if time.monotonic() > deadline:
                raise RunFailed(f"timed out after {timeout:.0f}s waiting for {what}")
            if time.monotonic() >= next_status:
                self.ctx.status.update(self.status_line())
                next_status = time.monotonic() + 0.25
            time.sleep(0.05)

    def pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.wait_for(lambda: time.monotonic() >= end, seconds + 5, f"{seconds:.0f}s to pass")

    def state_at_size(self, timeout: float) -> float:
        """Wait until both replicas consumed the grow records (they hold the workload's state) and (with
        Rhino) a checkpoint taken after that completed; returns when all that held."""
        need = self.workload.n_grow
        self.wait_for(lambda: self.consumed() >= need, timeout,
                      f"the state to reach {self.workload.state_bytes / MB:,.0f} MB")
        # and the backlog of the growth worked off: the job less than a second behind the feed
        at = self.wait_for(lambda: self.consumed() >= self.feeder.produced - self.ctx.args.rate, timeout,
                           "the job to catch up with the feed")
        if self.rhino:  # a checkpoint taken after both: the first (full) snapshot is behind us too
            snap = self.handle.master.snapshot()
            taken = max([self.completed_checkpoint()] + [m.checkpoint_id for r in range(self.plan.replicas)
                                                         if (m := snap.get(replica_name(self.task.name, 0, r)))])
            taken = max(taken, self.ctx.args.checkpoint_every)  # (the first checkpoint is a full one)
            at = self.wait_for(lambda: self.completed_checkpoint() > taken, timeout,
                               f"a checkpoint after checkpoint {taken} to complete")
        return at

    def every_checkpoint_on_a_live_member(self) -> bool:
        """Every partition's latest completed checkpoint is held by a live worker that runs none
        of its replicas (where it can be restored)."""
        master = self.handle.master
        with master.locked():
            rhino = master.rhino
            return rhino is not None and all(
                (cp := rhino.completed.get(inst)) is not None and cp.holders - rhino.dead
                and cp.holders - rhino.dead - rhino.replica_workers(inst) for inst in rhino.instances())

    # -- the end -------------------------------------------------------------------------------
    def finish(self, problem: str | None = None) -> None:
        """Stop feeding, drain (stop instead if the job failed), read and verify the output.
        ``problem``: what went wrong in the experiment before (a wait that timed out); the job is
        still drained and verified if it runs."""
        self.problem = problem
        self.set_phase("drain")
        try:
            self.produced = self.feeder.stop()
        except RuntimeError as err:
            self.produced = self.feeder.produced
            self.failure = str(err)
        master = self.handle.master
        self.ctx.status.update(f"{self.label}: draining ({self.produced:,} records fed)")
        try:
            if master.failure or not self.handle.running:
                self.failure = self.failure or master.failure or "the Spark job ended"
                self.result = self.handle.stop(30)
            else:
                self.result = self.handle.drain(timeout=300)
        except (JobFailedError, TimeoutError) as err:
            self.failure = self.failure or one_line(err)
            if self.handle.running:
                try:
                    self.handle.stop(30)
                except (JobFailedError, TimeoutError):
                    pass
        self.ckpts.stop()
        self.ctx.status.update(f"{self.label}: reading and verifying the output")
        raw = read_all(self.ctx.stack.bootstrap_servers, self.out_topic, max_wait_s=120)
        forget_topics(self.ctx.stack.bootstrap_servers, self.stamp)
        outputs = []
        for r in raw:
            out = json.loads(r.value)
            outputs.append(out)
            self.samples.append(sample_of(r, produced=out.get("ts", 0) / MS))
        self.verdict = self.workload.check(outputs, self.produced)
        self.ctx.status.done()

    @property
    def outcome(self) -> str:
        parts = [f"experiment: {self.problem}"] if self.problem else []
        parts += [f"job failed: {self.failure}"] if self.failure else []
        if self.verdict is not None:
            parts.append(self.verdict.describe())
        div = getattr(self.result, "divergences", None)
        if div:
            parts.append(f"{len(div)} checkpoint divergences ({div[0]})")
        return "; ".join(parts)

    @property
    def exact(self) -> bool:
        return self.failure is None and self.verdict is not None and self.verdict.exact and not getattr(
            self.result, "divergences", None)

    def replicas_agree(self) -> str:
        """Whether both replicas of the stateful task's partition 0 ended with the same state digest."""
        if self.result is None:
            return "n/a"
        digests = {m.state_digest for r in range(self.plan.replicas)
                   if (m := self.result.per_instance.get(replica_name(self.task.name, 0, r)))}
        if "" in digests:
            return "n/a (not drained)"
        return "yes" if len(digests) == 1 else f"no ({len(digests)} digests)"


# ------------------------------------------------------------------------------------------ recovery
def restored_files(state_dir: Path, job: str, worker: int, task: int, checkpoint_id: int) -> tuple[int, int, int]:
    """(bytes hard-linked, bytes copied, files) by the restore of checkpoint ``checkpoint_id`` of
    ``task``'s partition 0 on ``worker``: its source is the group member's completed snapshot
    (``rhino/store/t<task>-p0/snap-<id>``), whose SST/blob files the restore hard-links and whose other
    files (CURRENT, MANIFEST, OPTIONS, WAL) it copies (``rhino_state.standby_db.link_db``)."""
    linked = copied = files = 0
    pattern = state_dir / job / "*" / f"w{worker}-a*" / "rhino" / "store" / f"t{task}-p0" / f"snap-{checkpoint_id}"
    for d in glob.glob(str(pattern)):
        for entry in os.scandir(d):
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
            files += 1
            if entry.name.endswith((".sst", ".blob")):
                linked += size
            else:
                copied += size
    return linked, copied, files


def store_snapshots(state_dir: Path, job: str, task: int) -> str:
    """Which worker's replica store holds which completed snapshot of ``task``'s partition 0 (the
    newest ``snap-<id>`` per worker directory ``w<worker>-a<attempt>``), e.g. ``w0-a0:300 w1-a1:2500``."""
    out = []
    for d in sorted(glob.glob(str(state_dir / job / "*" / "w*-a*" / "rhino" / "store" / f"t{task}-p0"))):
        try:
            ids = [int(n[5:]) for n in os.listdir(d) if n.startswith("snap-") and n[5:].isdigit()]
        except FileNotFoundError:
            continue
        out.append(f"{Path(d).parents[2].name}:{max(ids) if ids else '-'}")
    return " ".join(out)


def recovery_run(ctx: RunContext, size: int, mode: str = "active") -> tuple[dict, list[dict], Run | None]:
    """One recovery experiment (module doc, 1.); ``mode`` ``active``: two replicas, ``passive``: one
    instance per partition (checkpoint-restart).  Returns the recovery.csv row (with its per-second
    ``timeline`` around the kill), the checkpoint rows and the run (None if the job did not start)."""
    args = ctx.args
    replicated = mode == "active"
    label = f"{size / MB:g}MB" + ("" if replicated else "-passive")
    victim = args.victim if replicated else re.sub(r"r1$", "r0", args.victim)  # the only instance
    workload = make_workload(args, size)
    row: dict[str, Any] = {"workload": workload.kind, "run": label, "mode": mode, "size_mb": size / MB,
                           "state_bytes": workload.state_bytes, "grow_records": workload.n_grow, "victim": victim}
    print(f"== recovery {label} ({'two replicas' if replicated else 'one instance per partition: checkpoint-restart'}"
          f"): {workload.describe()}; {args.rate:.0f} records/s; SIGKILL the executor of {victim}", flush=True)
    try:
        r = Run(ctx, label, workload, rhino=True, replicated=replicated)
    except Exception as err:  # noqa: BLE001 - recorded
        row.update(outcome=f"job did not start: {one_line(err)}", exact="no")
        return row, [], None
    handle = r.handle
    failure = None
    lost: list[str] = []
    recs: dict[str, dict] = {}
    try:
        t_full = r.state_at_size(args.grow_timeout)
        row["grow_s"] = t_full - r.started
        row["state_bytes"] = workload.state_bytes  # (nexmark: the model of the grow events, now produced)
        r.wait_for(r.every_checkpoint_on_a_live_member, 60, "a completed checkpoint of every partition")
        r.set_phase("steady")
        r.pause(args.steady)
        target = locate(victim, job=r.name)
        lost = sorted(replica_name(handle.plan.task(t).name, p, rr)
                      for (t, p, rr), w in handle.placement.items() if w == target.worker)
        row["lost"] = " ".join(lost)
        r.set_phase("recovery")
        row["checkpoint_at_kill"] = r.completed_checkpoint()
        row["snapshots_before_kill"] = store_snapshots(ctx.state_dir, r.name, r.task.id)
        # the model at the kill: the whole stateful task, and the victim's partition (nexmark: 2 partitions)
        row["state_at_kill_bytes"] = workload.state_after(r.feeder.produced)
        row["victim_state_bytes"] = workload.partition_state(victim_partition(victim))
        killed_at = time.time()
        kill_executor(target)
        row["kill_t_s"] = killed_at - r.ckpts.t0  # on the clock of checkpoints.csv's t_s
        row["killed"] = f"executor {target.executor} (JVM pid {target.jvm_pid}), worker {target.worker}"

        restored_bytes: dict[str, Any] = {}
        victim_task = next(t.id for t in handle.plan.tasks if victim.startswith(t.name + "["))

        def watch_restore() -> None:
            """Right after the victim's restore: what its directory holds (before RocksDB rewrites it)."""
            pattern = re.compile(rf"^{re.escape(victim)} (?:restored|rolled back) on worker (\d+) from checkpoint (\d+) ")
            deadline = time.monotonic() + args.recovery_timeout
            while time.monotonic() < deadline and not restored_bytes:
                for ts, text in list(handle.master.events):
                    if ts >= killed_at and (m := pattern.match(text)):
                        restored_bytes["v"] = restored_files(ctx.state_dir, r.name, int(m.group(1)),
                                                             victim_task, int(m.group(2)))
                        break
                time.sleep(0.02)

        watcher = threading.Thread(target=watch_restore, daemon=True)
        watcher.start()

        def restored_all() -> bool:
            for rec in handle.recoveries():
                recs[rec["replica"]] = rec
            return set(lost) <= set(recs) or any(
                ts >= killed_at and ("cannot be restored" in text or text.startswith("restoring "))
                for ts, text in list(handle.master.events))

        r.wait_for(restored_all, args.recovery_timeout, f"{', '.join(lost)} to be restored and catch up")
        watcher.join(2)
        if victim not in recs:
            raise RunFailed(f"{victim} was not restored: " + "; ".join(
                text for ts, text in handle.master.events if ts >= killed_at and victim in text))
        rec = recs[victim]
        phases = {  # in ms (the CSV keeps 2 decimals)
            "detect_ms": rec["failed_at"] - killed_at,
            "dispatch_ms": rec["restored_at"] - rec["restore_s"] - rec["failed_at"],
            "fetch_ms": 0.0,
            "load_ms": rec["load_s"],
            "start_ms": rec["restore_s"] - rec["load_s"],
            "catch_up_ms": rec["caught_up_at"] - rec["restored_at"],
        }
        row.update({k: v * MS for k, v in phases.items()})
        row["total_s"] = rec["caught_up_at"] - killed_at
        row["recovery_s"] = rec["recovery_s"]
        row["restored_from_checkpoint"] = rec["checkpoint_id"]
        row["restored_on_worker"] = rec["worker"]
        row["fetched_bytes"] = 0
        if "v" in restored_bytes:
            linked, copied, files = restored_bytes["v"]
            row.update(linked_bytes=linked, copied_bytes=copied, restored_files=files)
        row["others"] = "; ".join(f"{name} {recs[name]['caught_up_at'] - killed_at:.2f}s" if name in recs
                                  else f"{name} not restored" for name in lost if name != victim)
        r.set_phase("after")
        t_group = r.wait_for(r.every_checkpoint_on_a_live_member, args.group_timeout,
                             "every partition's checkpoint on a live group member again")
        row["group_again_s"] = t_group - killed_at
        r.pause(args.after)
        row["snapshots_at_end"] = store_snapshots(ctx.state_dir, r.name, r.task.id)
        row["killed_at"] = killed_at
    except Exception as err:  # noqa: BLE001 - recorded in the row, the run is still drained and verified
        failure = one_line(err)
    r.finish(failure)
    row["problem"] = r.problem or ""
    row["produced"] = r.produced
    row["exact"] = "yes" if r.exact else "no"
    row["replicas_agree"] = r.replicas_agree()
    row["checkpoints_compared"] = getattr(r.result, "checkpoints_compared", "")
    if "killed_at" in row:
        killed_at = row.pop("killed_at")
        row.update(kill_latency(r.samples, killed_at))
        row["timeline"] = [{"run": label, "mode": mode, "size_mb": size / MB, **sec}
                           for sec in kill_timeline(r.samples, killed_at)]
    row["outcome"] = r.outcome
    row["events"] = " | ".join(f"{ts - r.started:.2f}s {text}" for ts, text in handle.master.events
                               if "restored" in text or "caught up" in text or "declared dead" in text
                               or "relaunched" in text or "takes over" in text
                               or "rolled back" in text or "writes once restored" in text)
    return row, r.ckpts.rows, r


def victim_partition(replica: str) -> int:
    """The partition of a replica name (``person-auction-join[1]r0`` -> 1)."""
    m = re.search(r"\[(\d+)\]r\d+$", replica)
    return int(m.group(1)) if m else 0


def kill_latency(samples: list[Sample], killed_at: float) -> dict[str, Any]:
    """By event time (the load generator's clock; a rolled-back source reads records again, so their
    ingest time would hide the stall): p99 of the 5 s before the kill; per second after it, the worst
    p99 of the first 10 s and of the rest of the run (when the relaunched worker joins the replica group
    and gets a full snapshot); the *stall*: seconds among the first 30 whose p99 is over twice the one
    before; and the worst latency of a record produced from 5 s before the kill on."""
    before = [s.sink - s.produced for s in samples if -6 <= s.produced - killed_at < -1]
    p99s = {sec: percentile(v, 0.99) for sec, v in Latencies(samples).by_event_second(killed_at).items() if sec >= 0}
    base = percentile(before, 0.99)
    first = max(((p, sec) for sec, p in p99s.items() if sec < 10), default=(0.0, ""))
    rest = max(((p, sec) for sec, p in p99s.items() if sec >= 10), default=(0.0, ""))
    worst = max((s.sink - s.produced for s in samples if s.produced >= killed_at - 5), default=0.0)
    return {"p99_before_ms": base * MS, "worst_p99_10s_ms": first[0] * MS, "worst_p99_10s_at": first[1],
            "worst_p99_later_ms": rest[0] * MS, "worst_p99_later_at": rest[1],
            "stall_s": sum(1 for sec, p in p99s.items() if sec < 30 and p > 2 * base), "worst_ms": worst * MS}


def kill_timeline(samples: list[Sample], killed_at: float, before_s: int = 10, after_s: int = 40) -> list[dict]:
    """Per second of event time around the kill: records, p50, p99 and max latency (sink - produced)."""
    return [{"second": sec, "records": len(v), "p50_ms": percentile(v, .5) * MS, "p99_ms": percentile(v, .99) * MS,
             "max_ms": max(v) * MS} for sec, v in Latencies(samples).by_event_second(killed_at).items()
            if -before_s <= sec < after_s]


def bytes_rows(label: str, ckpt_rows: list[dict], task_prefix: str = STATEFUL + "[") -> list[dict]:
    """Per phase, over the shipping replica of ``stateful[0]``: checkpoints, bytes changed and shipped."""
    out = []
    shipped_rows = [c for c in ckpt_rows if c["replica"].startswith(task_prefix) and c["shipper"] == "yes"]
    first = shipped_rows[0] if shipped_rows else None  # the first checkpoint shipped: always a full snapshot
    phases = ["growth", "steady", "recovery", "after", "drain"]
    for phase in [*phases, "all"]:
        rows = [c for c in ckpt_rows if c["replica"].startswith(task_prefix) and c["shipper"] == "yes"
                and (phase == "all" or c["phase"] == phase)]
        if not rows:
            continue
        n = sum(c["checkpoints"] for c in rows)
        changed = sum(c["bytes_changed"] for c in rows)
        shipped = sum(c["bytes_shipped"] for c in rows)
        full = [c for c in rows if c is first or (c["phase"] != "growth" and c["state_bytes"] > 0
                                                  and c["bytes_changed"] >= c["state_bytes"] / 2)]
        deltas = [c for c in rows if c not in full]
        state = max(c["state_bytes"] for c in rows)
        n_delta = sum(c["checkpoints"] for c in deltas)
        out.append({"run": label, "phase": phase, "checkpoints": n,
                    "full_snapshots": len(full),
                    "bytes_changed": changed, "bytes_shipped": shipped,
                    "shipped_per_changed": shipped / changed if changed else 0.0,
                    "mean_shipped_per_checkpoint": shipped / n if n else 0.0,
                    "mean_delta_shipped": sum(c["bytes_shipped"] for c in deltas) / n_delta if n_delta else 0.0,
                    "state_bytes": state,
                    "delta_shipped_per_state": (sum(c["bytes_shipped"] for c in deltas) / n_delta / state
                                                if n_delta and state else 0.0),
                    "full_shipped": sum(c["bytes_shipped"] for c in full),
                    "mean_checkpoint_ms": sum(c["checkpoint_ms"] for c in rows) / len(rows),
                    "max_checkpoint_ms": max(c["checkpoint_ms"] for c in rows)})
    others = [c for c in ckpt_rows if c["replica"].startswith(task_prefix) and c["shipper"] == "no"]
    if others:
        fulls = [c for c in others if c["state_bytes"] > 0 and c["bytes_changed"] >= c["state_bytes"] / 2]
        n = sum(c["checkpoints"] for c in others)
        out.append({"run": label, "phase": "all, other replica", "checkpoints": n, "full_snapshots": len(fulls),
                    "bytes_changed": sum(c["bytes_changed"] for c in others),
                    "bytes_shipped": sum(c["bytes_shipped"] for c in others),
                    "shipped_per_changed": 0.0, "mean_shipped_per_checkpoint": 0.0, "mean_delta_shipped": 0.0,
                    "state_bytes": max(c["state_bytes"] for c in others), "delta_shipped_per_state": 0.0,
                    "full_shipped": sum(c["bytes_shipped"] for c in fulls),
                    "mean_checkpoint_ms": sum(c["checkpoint_ms"] for c in others) / len(others),
                    "max_checkpoint_ms": max(c["checkpoint_ms"] for c in others)})
    return out


# ------------------------------------------------------------------------------------------ latency
def latency_run(ctx: RunContext, rhino: bool, size: int, rep: int) -> tuple[dict, list[dict]]:
    args = ctx.args
    label = f"rhino-{'on' if rhino else 'off'}" + (f"-{rep}" if args.latency_runs > 1 else "")
    workload = make_workload(args, size)
    row: dict[str, Any] = {"workload": workload.kind, "rhino": "on" if rhino else "off", "repeat": rep, "size_mb": size / MB,
                           "rate": args.rate}
    print(f"== latency, Rhino {'on' if rhino else 'off'} (run {rep}): grow to {workload.state_bytes / MB:,.1f} MB, "
          f"then {args.latency_duration:.0f}s of updates at {args.rate:.0f} records/s", flush=True)
    try:
        r = Run(ctx, label, workload, rhino=rhino)
    except Exception as err:  # noqa: BLE001 - recorded
        row.update(outcome=f"job did not start: {one_line(err)}", exact="no")
        return row, []
    failure = None
    ready = None
    try:
        ready = r.state_at_size(args.grow_timeout)
        r.set_phase("steady")
        r.pause(args.latency_duration)
    except Exception as err:  # noqa: BLE001 - recorded
        failure = one_line(err)
    r.finish(failure)
    row["problem"] = r.problem or ""
    lat = sorted(s.sink - s.ingest for s in r.samples if ready is not None and s.ingest >= ready + args.warm_up)
    steady_ckpts = [c for c in r.ckpts.rows if c["phase"] == "steady" and c["replica"].startswith(workload.task + "[")]
    row.update({"records": len(lat), "p50_ms": percentile(lat, .5) * MS, "p99_ms": percentile(lat, .99) * MS,
                "p999_ms": percentile(lat, .999) * MS, "max_ms": (lat[-1] if lat else 0.0) * MS,
                "checkpoints": sum(c["checkpoints"] for c in steady_ckpts if c["shipper"] == "yes"),
                "mean_checkpoint_ms": (sum(c["checkpoint_ms"] for c in steady_ckpts) / len(steady_ckpts)
                                       if steady_ckpts else 0.0),
                "max_checkpoint_ms": max((c["checkpoint_ms"] for c in steady_ckpts), default=0.0),
                "exact": "yes" if r.exact else "no", "outcome": r.outcome})
    if ready is not None:  # per-second p50/p99 by ingest time since the state reached its size
        seconds: dict[int, list[float]] = {}
        for smp in r.samples:
            if smp.ingest >= ready:
                seconds.setdefault(int(smp.ingest - ready), []).append(smp.sink - smp.ingest)
        row["timeline"] = [{"run": label, "second": sec, "records": len(v), "p50_ms": percentile(v, .5) * MS,
                            "p99_ms": percentile(v, .99) * MS} for sec, v in sorted(seconds.items())]
    return row, r.ckpts.rows


# ------------------------------------------------------------------------------------------ main
def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(KB|MB|GB|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 10MB, 1GB)")
    unit = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[(m.group(2) or "B").upper()]
    return int(float(m.group(1)) * unit)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("synthetic", "nexmark"), default="synthetic",
                    help="synthetic: the grow-then-update job defined here; nexmark: the NEXMark-like windowed "
                         "join of replication.examples.workloads (bench/workloads.py's), victim its partition 0")
    ap.add_argument("--sizes", default="10MB,100MB",
                    help="state sizes of the recovery runs, comma-separated (1GB works but is slow on 2 cores); "
                         "nexmark: of the whole join (2 partitions)")
    ap.add_argument("--rate", type=float, default=200.0, help="records/s fed to the job")
    ap.add_argument("--entries", type=int, default=64, help="map entries written per grow record")
    ap.add_argument("--value-bytes", type=int, default=1000, help="bytes per map entry value")
    ap.add_argument("--keys", type=int, default=64, help="distinct keys")
    ap.add_argument("--checkpoint-every", type=int, default=100, help="spark.replication.rhino.checkpointEvery")
    ap.add_argument("--steady", type=float, default=5.0, help="seconds of steady state before the kill")
    ap.add_argument("--after", type=float, default=5.0,
                    help="seconds of load after the replica group holds checkpoints again")
    ap.add_argument("--victim", default=None,
                    help=f"the replica whose executor is killed (default {STATEFUL}[0]r0, nexmark {NEXMARK_JOIN}[0]r0)")
    ap.add_argument("--nexmark-grow-s", type=float, default=20.0,
                    help="nexmark: seconds of input (at --rate) whose payload builds the state to its size")
    ap.add_argument("--nexmark-payload", type=int, default=100,
                    help="nexmark: payload bytes per event once the state is built (it keeps growing slowly)")
    ap.add_argument("--nexmark-window-ms", type=int, default=2000, help="nexmark: tumbling window of the join")
    ap.add_argument("--state-cache-entries", type=int, default=200,
                    help="nexmark: spark.replication.state.cacheEntries (as bench/workloads.py: the state in RocksDB)")
    ap.add_argument("--seed", type=int, default=5, help="nexmark: seed of the input generator")
    ap.add_argument("--failure-timeout", default="2s",
                    help="spark.replication.failureTimeout: with 1 GB on 2 cores a worker busy with a full "
                         "snapshot can be silent for longer than the 2 s default and is then declared dead")
    ap.add_argument("--recovery-modes", default="active,passive",
                    help="recovery runs per size: active (two replicas) and/or passive (replication off, "
                         "checkpoint-restart from the same Rhino checkpoints)")
    ap.add_argument("--grow-timeout", type=float, default=900.0, help="seconds allowed to build the state")
    ap.add_argument("--recovery-timeout", type=float, default=180.0, help="seconds allowed for the recovery")
    ap.add_argument("--group-timeout", type=float, default=120.0,
                    help="seconds allowed after the recovery for the replica group to hold a checkpoint again")
    ap.add_argument("--latency-size", default="10MB", help="state size of the latency runs")
    ap.add_argument("--latency-duration", type=float, default=20.0, help="seconds of steady load per latency run")
    ap.add_argument("--latency-modes", default="on,off", help="Rhino on/off for the latency runs ('' for none)")
    ap.add_argument("--latency-runs", type=int, default=1, help="latency runs per mode (interleaved)")
    ap.add_argument("--warm-up", type=float, default=2.0,
                    help="seconds after the state reached its size dropped from the latency figures")
    ap.add_argument("--out", default=str(REPO / "bench/results/rhino"))
    ap.add_argument("--replot", action="store_true", help="only redraw the PNGs from the CSV files in --out")
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.latency_size = parse_size(args.latency_size)
    args.latency_modes = [m.strip() for m in args.latency_modes.split(",") if m.strip()]
    if bad := [m for m in args.latency_modes if m not in ("on", "off")]:
        ap.error(f"--latency-modes: unknown {', '.join(bad)} (on, off)")
    args.recovery_modes = [m.strip() for m in args.recovery_modes.split(",") if m.strip()]
    if bad := [m for m in args.recovery_modes if m not in ("active", "passive")]:
        ap.error(f"--recovery-modes: unknown {', '.join(bad)} (active, passive)")
    if args.workload == "nexmark":
        args.victim = args.victim or f"{NEXMARK_JOIN}[0]r0"
        if not re.fullmatch(rf"{re.escape(NEXMARK_JOIN)}\[[01]\]r[01]", args.victim):
            ap.error(f"--victim: with --workload nexmark, one of {NEXMARK_JOIN}[0 or 1]r0/r1")
    else:
        args.victim = args.victim or f"{STATEFUL}[0]r0"
        if not re.fullmatch(rf"{STATEFUL}\[0\]r[01]|{SOURCE}\[0\]r[01]|{SINK}\[0\]r[01]", args.victim):
            ap.error(f"--victim: one of {STATEFUL}[0]r0/r1, {SOURCE}[0]r0/r1, {SINK}[0]r0/r1")
    return args


@dataclass
class Results:
    recovery: list[dict] = field(default_factory=list)
    bytes: list[dict] = field(default_factory=list)
    latency: list[dict] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)  # latency runs: per-second p50/p99
    kill_timeline: list[dict] = field(default_factory=list)  # recovery runs: per second around the kill


def run_benchmark(ctx: RunContext) -> Results:
    args = ctx.args
    res = Results()
    t0 = time.monotonic()
    for size, mode in [(size, mode) for size in args.sizes for mode in args.recovery_modes]:
        row, ckpts, r = recovery_run(ctx, size, mode)
        res.kill_timeline += row.pop("timeline", [])
        res.recovery.append(row)
        res.checkpoints += ckpts
        res.bytes += bytes_rows(row["run"], ckpts, (NEXMARK_JOIN if args.workload == "nexmark" else STATEFUL) + "[")
        print("   " + format_row(row, skip=("events", "outcome", "others", "lost", "killed")), flush=True)
        print(f"   outcome: {row['outcome']}", flush=True)
        ctx.status.update("waiting for the replacement executor")
        try:
            wait_for_executors(ctx.spark.sparkContext, EXECUTORS, timeout=120)
        except TimeoutError as err:
            print(f"   {err}", flush=True)
        ctx.status.done()
        print(f"   ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
    for rep in range(1, args.latency_runs + 1):
        for mode in args.latency_modes:
            row, ckpts = latency_run(ctx, mode == "on", args.latency_size, rep)
            res.timeline += row.pop("timeline", [])
            res.latency.append(row)
            res.checkpoints += ckpts
            print("   " + format_row(row, skip=("outcome",)), flush=True)
            if row.get("exact") != "yes":
                print(f"   outcome: {row['outcome']}", flush=True)
            print(f"   ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
    return res


PHASES = [("detect_ms", "detect (kill → declared dead)"), ("dispatch_ms", "dispatch (restore RPC)"),
          ("fetch_ms", "state fetch (none: local)"), ("load_ms", "state load (hard links)"),
          ("start_ms", "start (rebuild, open, rejoin)"), ("catch_up_ms", "catch-up (replay → twin's pulse)")]


def print_tables(res: Results) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    def table(rows: list[dict], cols: list[str]) -> None:
        cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        for row in [cols, *cells]:
            print("   " + "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)), flush=True)

    if res.recovery:
        print("== recovery of the victim (phases in ms, total and group again in s; latency by event time)")
        table(res.recovery, ["run", *[p for p, _ in PHASES], "total_s", "group_again_s", "linked_bytes",
                             "copied_bytes", "p99_before_ms", "worst_p99_10s_ms", "stall_s", "worst_ms", "exact"])
        for r in res.recovery:
            print(f"   {r['run']}: {r['outcome']}" + (f"; also restored: {r['others']}" if r.get("others") else ""))
            if r.get("snapshots_at_end"):
                print(f"   {r['run']}: completed snapshots of partition 0 in the replica stores (worker "
                      f"dir:checkpoint id) before the kill {r.get('snapshots_before_kill')}, at the end "
                      f"{r['snapshots_at_end']}")
    if res.bytes:
        print("== bytes per checkpoint (the shipping replica of each partition of the stateful task)")
        table(res.bytes, ["run", "phase", "checkpoints", "full_snapshots", "bytes_changed", "bytes_shipped",
                          "shipped_per_changed", "mean_delta_shipped", "state_bytes", "max_checkpoint_ms"])
    if res.latency:
        print("== steady-state latency (ms, update records after the state reached its size)")
        table(res.latency, ["rhino", "repeat", "records", "p50_ms", "p99_ms", "p999_ms", "max_ms", "checkpoints",
                            "mean_checkpoint_ms", "max_checkpoint_ms", "exact"])


def write_results(out: Path, res: Results) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("recovery", res.recovery), ("bytes", res.bytes), ("latency", res.latency),
                       ("checkpoints", res.checkpoints), ("latency_timeline", res.timeline),
                       ("kill_timeline", res.kill_timeline)):
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            write_csv(out / f"{name}.csv", [{k: r.get(k, "") for k in keys} for r in rows])
    _plot(out, res)
    write_machine(out)


def read_results(out: Path) -> Results:
    """The CSV files of an earlier run (numbers as numbers), for ``--replot``."""
    def value(v: str) -> Any:
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v

    def rows(name: str) -> list[dict]:
        path = out / f"{name}.csv"
        if not path.exists():
            return []
        with path.open(newline="") as f:
            return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]

    return Results(rows("recovery"), rows("bytes"), rows("latency"), rows("checkpoints"), rows("latency_timeline"),
                   rows("kill_timeline"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.replot:
        _plot(out, read_results(out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    status = StatusLine()
    t0 = time.monotonic()
    state_dir = Path(tempfile.mkdtemp(prefix="bench-rhino-state-"))
    try:
        with EmbeddedStack() as stack:
            spark = build_session(f"local-cluster[{EXECUTORS},1,512]", app_name="bench-rhino")
            try:
                res = run_benchmark(RunContext(stack, spark, args, status, state_dir))
            finally:
                stop_session(spark)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    write_results(out, res)
    print_tables(res)
    print(f"wrote {out}/recovery.csv, kill_timeline.csv, bytes.csv, latency.csv, checkpoints.csv, recovery.png, "
          f"kill_latency.png, latency.png, bytes.png in {time.monotonic() - t0:.0f}s")
    bad = [f"recovery {r['run']}" for r in res.recovery if r.get("exact") != "yes"]
    bad += [f"latency rhino {r['rhino']}" for r in res.latency if r.get("exact") != "yes"]
    if bad:
        print(f"NOT EXACT: {', '.join(bad)}", flush=True)
    problems = [f"recovery {r['run']}: {r['problem']}" for r in res.recovery if r.get("problem")]
    problems += [f"latency rhino {r['rhino']}: {r['problem']}" for r in res.latency if r.get("problem")]
    if problems:
        print(f"PROBLEMS: {'; '.join(problems)}", flush=True)
    return 1 if bad or problems else 0


def _plot(out: Path, res: Results) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res.recovery if "total_s" in r]
    if rows:
        fig, ax = plt.subplots(figsize=(11, 4.8))
        labels = [f"{r['size_mb']:g} MB\n{r.get('mode', 'active')}" + ("" if r["exact"] == "yes" else "\n(NOT exact)")
                  for r in rows]
        bottom = [0.0] * len(rows)
        for key, text in PHASES:
            vals = [max(float(r.get(key) or 0.0), 0.0) / MS for r in rows]
            ax.bar(labels, vals, bottom=bottom, label=text, width=0.5)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        for i, r in enumerate(rows):
            ax.text(i, bottom[i], f"{r['total_s']:.2f} s", ha="center", va="bottom")
        ax.set(ylabel="seconds from the SIGKILL", title="Rhino: kill → two live replicas (active) or the partition "
               "back (passive), by phase; local-cluster on 2 cores")
        ax.set_ylim(0, max(bottom) * 1.12)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=.3, axis="y")
        fig.tight_layout()
        fig.savefig(out / "recovery.png", dpi=110)
        plt.close(fig)
    if res.kill_timeline:
        sizes = list(dict.fromkeys(r["size_mb"] for r in res.kill_timeline))
        fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False, sharey=True)
        for ax, size in zip(axes[0], sizes, strict=True):
            for run_label in dict.fromkeys(r["run"] for r in res.kill_timeline if r["size_mb"] == size):
                pts = [r for r in res.kill_timeline if r["run"] == run_label]
                mode = pts[0]["mode"]
                ax.plot([r["second"] for r in pts], [max(r["p99_ms"], 0.1) for r in pts], ".-",
                        label=f"{mode}: p99", color="tab:blue" if mode == "active" else "tab:red")
                ax.plot([r["second"] for r in pts], [max(r["max_ms"], 0.1) for r in pts], ":",
                        label=f"{mode}: max", color="tab:blue" if mode == "active" else "tab:red")
            ax.axvline(0, color="k", linestyle="--", linewidth=1)
            ax.set(yscale="log", xlabel="seconds since the SIGKILL (by event time)", title=f"{size:g} MB of state")
            ax.grid(alpha=.3, which="both")
            ax.legend(fontsize="small")
        axes[0][0].set_ylabel("sink - produced (ms), per second")
        fig.suptitle("Latency around the kill of the stateful partition's executor: two replicas (active) vs "
                     "checkpoint-restart (passive)")
        fig.tight_layout()
        fig.savefig(out / "kill_latency.png", dpi=110)
        plt.close(fig)
    lat = [r for r in res.latency if "p99_ms" in r]
    if lat:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        names = [f"Rhino {r['rhino']}" + (f" #{r['repeat']}" if len(lat) > 2 else "") for r in lat]
        xs = range(len(lat))
        for k, (col, text) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"))):
            ax.bar([x + (k - 1) * 0.27 for x in xs], [r[col] for r in lat], width=0.27, label=text)
        ax.set_xticks(list(xs), names)
        ax.set(ylabel="sink - ingest (ms)", title=f"Steady-state latency at {lat[0]['rate']:.0f} records/s, "
               f"{lat[0]['size_mb']:g} MB of state, replication on")
        ax.legend()
        ax.grid(alpha=.3, axis="y")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
    ck = [c for c in res.checkpoints if c["replica"].startswith((STATEFUL + "[", NEXMARK_JOIN + "["))
          and not c["run"].startswith("rhino-")]
    if ck:
        from matplotlib.ticker import FuncFormatter

        fig, ax = plt.subplots(figsize=(11, 4.8))
        kills = {r.get("run", f"{r['size_mb']:g}MB"): r.get("kill_t_s") for r in res.recovery}
        for run_label in dict.fromkeys(c["run"] for c in ck):
            pts = [c for c in ck if c["run"] == run_label and c["shipper"] == "yes"]
            others = [c for c in ck if c["run"] == run_label and c["shipper"] == "no"]
            (line,) = ax.plot([c["t_s"] for c in pts], [max(c["bytes_shipped"], 1) for c in pts], ".-",
                              label=f"{run_label}: shipped per checkpoint (shipping replica)")
            ax.plot([c["t_s"] for c in others], [max(c["bytes_shipped"], 1) for c in others], "x",
                    color=line.get_color(), label=f"{run_label}: increments of the other replica")
            ax.plot([c["t_s"] for c in pts], [max(c["state_bytes"], 1) for c in pts], ":", color=line.get_color(),
                    label=f"{run_label}: state size")
            if kills.get(run_label) not in (None, ""):
                ax.axvline(kills[run_label], color=line.get_color(), linestyle="--", linewidth=1)
                ax.text(kills[run_label], 0.02, " kill", color=line.get_color(), transform=ax.get_xaxis_transform())
        ax.set(yscale="log", xlabel="seconds since the job started", ylabel="bytes",
               title="Rhino increments of stateful[0] per checkpoint vs state size (full snapshots reach the line)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / MB:g} MB"))
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=.3, which="both")
        fig.tight_layout()
        fig.savefig(out / "bytes.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
