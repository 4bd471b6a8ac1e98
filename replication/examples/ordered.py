"""An order-sensitive two-source job, for the ordering modes' tests and benchmarks.

Two topics of events are unioned, keyed by ``key`` and folded per key into a hash chain:
every output record carries the event, its position ``n`` in the key's sequence and the hash of
the chain so far.  The result depends on the order in which the task consumes its input
channels, so two replicas that interleave differently end in different states, and a sink
failover from one replica's output to the other's breaks the chain where it happens.

:func:`verify_chains` therefore checks exactly-once *and* replica agreement from the output
alone: every input event appears once, each key's records are numbered 1..N without gaps, and
each record's ``prev`` is the ``h`` of the key's previous record.  With ``timer_ms`` every event
also sets an event-time timer at the end of its ``timer_ms`` bucket, which reports the key's chain
as it stands when the timer fires: each (key, bucket end) once, at a point of the key's chain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from replication.api import Job
from replication.functions import Aggregator, KeyedProcessFunction, OutputTag, ProcessContext, RuntimeContext

EVERY_NTH = OutputTag("every-nth")  # HashChain's side output


def chain_step(prev: str, event_id: str) -> str:
    """The next hash of a key's chain (stable across processes: no salted ``hash()``)."""
    return hashlib.sha256(f"{prev}|{event_id}".encode()).hexdigest()[:16]


def timer_due(ts: int, timer_ms: int) -> int:
    """The end of the ``timer_ms`` bucket of event time ``ts``: when its event's timer fires."""
    return ts - ts % timer_ms + timer_ms


class HashChain(KeyedProcessFunction):
    """Per key: ``h_n = chain_step(h_{n-1}, salt + id)``; emits one record per event.  ``salt``
    (default none) makes a visibly different version of the function, e.g. for replacing the
    operator at runtime: its records carry ``"salt"``.  ``timer_ms``: each event sets a timer at
    :func:`timer_due`, which emits ``{key, timer, n, h}``: the key's chain when it fired.
    ``side_every``: every key's n-th, 2n-th ... record also goes to the side output
    :data:`EVERY_NTH` as ``{key, n, id}``."""

    def __init__(self, salt: str = "", timer_ms: int | None = None, side_every: int | None = None) -> None:
        self.salt = salt
        self.timer_ms = timer_ms
        self.side_every = side_every

    def open(self, ctx: RuntimeContext) -> None:
        self.head = ctx.value_state("head", default="")
        self.count = ctx.value_state("n", default=0)

    def process(self, event: dict, ctx: ProcessContext) -> Iterable[dict]:
        prev = self.head.value()
        h = chain_step(prev, self.salt + event["id"])
        n = self.count.value() + 1
        self.head.update(h)
        self.count.update(n)
        # ts: the event's own time (the load generators set it to the wall clock at production)
        out = {"key": ctx.key, "n": n, "id": event["id"], "prev": prev, "h": h, "ts": event["ts"]}
        if self.salt:
            out["salt"] = self.salt
        if self.timer_ms:
            ctx.timers.register_event_time_timer(timer_due(event["ts"], self.timer_ms))
        if self.side_every and n % self.side_every == 0:
            ctx.output(EVERY_NTH, {"key": ctx.key, "n": n, "id": event["id"]})
        yield out

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[dict]:
        yield {"key": ctx.key, "timer": timestamp, "n": self.count.value(), "h": self.head.value()}


def build_ordered_job(topic_a: str, topic_b: str, out_topic: str, name: str = "hash-chain",
                      parallelism: int = 2, identity_maps: int = 0, max_parallelism: int | None = None,
                      timer_ms: int | None = None, side_every: int | None = None) -> Job:
    """``a ∪ b -> key_by(key) -> chain [-> map]* -> sink``: the chain task has one input channel per
    source partition; the sink is a task of its own (its replicas fail independently).
    ``identity_maps`` adds that many tasks of an identity map before the sink, each fed round robin
    by every partition of the task before (so each has several input channels to order: the
    paper's MiB 1 pipeline shape, for the benchmarks).  ``max_parallelism``: the chain task hosts
    that many partitions, the ones beyond ``parallelism`` spare (for ``JobHandle.rescale``).
    ``timer_ms``: the chain sets a timer per event (:class:`HashChain`); ``side_every``: its side
    output goes to ``<out_topic>-side`` (check it with :func:`verify_side_output`)."""
    job = Job(name)
    a = job.source(topic_a, deserializer="json", timestamp=lambda e: e["ts"], name="source-a")
    b = job.source(topic_b, deserializer="json", timestamp=lambda e: e["ts"], name="source-b")
    chain = (a.union(b).key_by(lambda e: e["key"])
             .process(HashChain(timer_ms=timer_ms, side_every=side_every), name="chain", parallelism=parallelism,
                      max_parallelism=max_parallelism))
    stream = chain
    for i in range(identity_maps):
        stream = stream.rebalance().map(_identity, name=f"identity-{i + 1}")
    if side_every:
        chain.side_output(EVERY_NTH).sink(f"{out_topic}-side", serializer="json", key_serializer="str",
                                           name="chain-side-sink")
    stream.new_task().sink(out_topic, serializer="json", key_serializer="str", name="chain-sink")
    return job


def verify_side_output(side: Iterable[dict], outputs: Iterable[dict], every: int) -> list[str]:
    """What is wrong with :class:`HashChain`'s side output (empty: nothing): every chain record
    whose ``n`` is a multiple of ``every`` there once, and nothing else."""
    expected = {(r["key"], r["n"], r["id"]) for r in outputs if "timer" not in r and r["n"] % every == 0}
    seen: set[tuple[str, int, str]] = set()
    faults = []
    for r in side:
        at = (r["key"], r["n"], r["id"])
        faults += [f"doubled {at}"] if at in seen else [] if at in expected else [f"unexpected {at}"]
        seen.add(at)
    return faults + [f"missing {at}" for at in sorted(expected - seen)]


class WindowCountWithoutMerge(Aggregator):
    """Records per key and tumbling window (the windowed variant of the ordered job's input); no
    ``merge``, so a handover holds the moved keys' records until their state arrives."""

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1


class WindowCount(WindowCountWithoutMerge):
    """:class:`WindowCountWithoutMerge` with ``merge``: a handover serves the moved keys throughout."""

    def merge(self, first: int, second: int) -> int:
        return first + second


def build_window_count_job(topic_a: str, topic_b: str, out_topic: str, name: str = "window-count",
                           size_ms: int = 200, parallelism: int = 2, mergeable: bool = True,
                           out_of_orderness_ms: int = 0, slide_ms: int | None = None,
                           allowed_lateness_ms: int = 0) -> Job:
    """``a ∪ b -> key_by(key) -> window(size_ms, count) -> sink``: output ``{key, start, end, value}``
    once per key and window (check it with :func:`window_counts` of the input); ``mergeable``: its
    aggregator defines ``merge``; ``out_of_orderness_ms``: the sources' watermark lag; ``slide_ms``:
    sliding windows; ``allowed_lateness_ms``: fired windows keep their state that long."""
    job = Job(name)
    a = job.source(topic_a, deserializer="json", timestamp=lambda e: e["ts"], name="source-a",
                   max_out_of_orderness_ms=out_of_orderness_ms)
    b = job.source(topic_b, deserializer="json", timestamp=lambda e: e["ts"], name="source-b",
                   max_out_of_orderness_ms=out_of_orderness_ms)
    count = WindowCount() if mergeable else WindowCountWithoutMerge()
    (a.union(b).key_by(lambda e: e["key"])
     .window(size_ms, count, slide_ms=slide_ms, allowed_lateness_ms=allowed_lateness_ms, name="counts",
             parallelism=parallelism)
     .new_task().sink(out_topic, serializer="json", key_serializer="str", name="counts-sink"))
    return job


def window_counts(events: Iterable[dict], size_ms: int = 200, slide_ms: int | None = None
                  ) -> dict[tuple[str, int], int]:
    """What :func:`build_window_count_job` must output: records per (key, window start)."""
    slide = slide_ms or size_ms
    counts: dict[tuple[str, int], int] = {}
    for e in events:
        last = e["ts"] - e["ts"] % slide
        for start in range(last, e["ts"] - size_ms, -slide):
            counts[(e["key"], start)] = counts.get((e["key"], start), 0) + 1
    return counts


def _identity(value: Any) -> Any:
    return value


def make_events(source: str, n: int, keys: int, start_ts: int, first: int = 0, step_ms: int = 1
                ) -> list[tuple[bytes, bytes]]:
    """``n`` events of ``source`` as (key, value) records, ids ``<source>-<i>``, keys round robin."""
    out = []
    for i in range(first, first + n):
        key = f"k{i % keys}"
        event = {"id": f"{source}-{i}", "key": key, "ts": start_ts + i * step_ms}
        out.append((key.encode(), json.dumps(event).encode()))
    return out


@dataclass
class ChainReport:
    records: int = 0
    keys: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # keys whose chain does not link up
    reordered: list[str] = field(default_factory=list)  # keys whose events of one source changed order
    timers: int = 0  # timer records
    timer_faults: list[str] = field(default_factory=list)  # missing, doubled, unexpected, off the chain

    @property
    def exact(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected or self.broken or self.reordered
                    or self.timer_faults)

    def __str__(self) -> str:
        if self.exact:
            return f"EXACT: {self.records} records, {self.keys} keys, every chain links up"
        return (f"{self.records} records: missing {self.missing[:5]} ({len(self.missing)}), duplicated "
                f"{self.duplicated[:5]} ({len(self.duplicated)}), unexpected {len(self.unexpected)}, "
                f"broken chains {self.broken[:5]} ({len(self.broken)}), reordered {self.reordered[:5]} "
                f"({len(self.reordered)}), timers {self.timer_faults[:5]} ({len(self.timer_faults)})")


def verify_chains(outputs: Iterable[dict], event_ids: Iterable[str], timer_ms: int | None = None) -> ChainReport:
    """Exactly once (each event id once), one consistent order per key (the chain links up), and
    in it each source's events of the key in the order they were produced (a key's events of one
    topic are in one Kafka partition, read in order, sent over one FIFO channel).  ``timer_ms``:
    the job set timers (:class:`HashChain`): each (key, bucket end) of its events fired once, and
    reported a point of the key's chain."""
    expected = set(event_ids)
    report = ChainReport()
    by_key: dict[str, list[dict]] = {}
    seen: set[str] = set()
    outputs = list(outputs)
    timers = [rec for rec in outputs if "timer" in rec]
    outputs = [rec for rec in outputs if "timer" not in rec]
    for rec in outputs:
        report.records += 1
        if rec["id"] in seen:
            report.duplicated.append(rec["id"])
        seen.add(rec["id"])
        by_key.setdefault(rec["key"], []).append(rec)
    report.missing = sorted(expected - seen)
    report.unexpected = sorted(seen - expected)
    report.keys = len(by_key)
    for key, recs in sorted(by_key.items()):
        recs.sort(key=lambda r: r["n"])
        prev = ""
        for i, rec in enumerate(recs, start=1):
            if rec["n"] != i or rec["prev"] != prev or rec["h"] != chain_step(prev, rec.get("salt", "") + rec["id"]):
                report.broken.append(key)
                break
            prev = rec["h"]
        last: dict[str, int] = {}
        for rec in recs:
            source, _, index = rec["id"].rpartition("-")
            if int(index) < last.get(source, -1):
                report.reordered.append(key)
                break
            last[source] = int(index)
    report.timer_faults = _timer_faults(timers, by_key, timer_ms)
    report.timers = len(timers)
    return report


def _timer_faults(timers: list[dict], by_key: dict[str, list[dict]], timer_ms: int | None) -> list[str]:
    due = {(key, timer_due(r["ts"], timer_ms)) for key, recs in by_key.items() for r in recs} if timer_ms else set()
    faults = []
    fired: set[tuple[str, int]] = set()
    for t in timers:
        at = (t["key"], t["timer"])
        if at in fired:
            faults.append(f"doubled {at}")
        elif at not in due:
            faults.append(f"unexpected {at}")
        else:
            chain = by_key[t["key"]]  # sorted by n
            if not 1 <= t["n"] <= len(chain) or chain[t["n"] - 1]["h"] != t["h"]:
                faults.append(f"off the chain {at}: n={t['n']}")
        fired.add(at)
    faults += [f"missing {at}" for at in sorted(due - fired)]
    return faults


def chain_heads(outputs: Iterable[dict]) -> dict[str, str]:
    """The last hash of every key's chain: equal for two runs that consumed in the same order."""
    heads: dict[str, tuple[int, str]] = {}
    for rec in outputs:
        if rec["n"] > heads.get(rec["key"], (0, ""))[0]:
            heads[rec["key"]] = (rec["n"], rec["h"])
    return {k: h for k, (_, h) in heads.items()}
