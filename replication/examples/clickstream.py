"""More pipelines on a stream of clicks, each with a plain-Python reference of its exact output:

* a running count per user (``KeyedStream.reduce``), written with the Kafka key, timestamp and a
  header taken from each result;
* how many clicks each page got in sliding windows (``window`` with ``slide_ms`` and ``Count``);
* each user's clicks in batches flushed by processing time (a processing-time timer per user and
  list state; ``liverobin`` or ``kazoo`` mode): whenever a batch goes out, every click comes out exactly once;
* a sample of each user's clicks drawn by ``ctx.random()``: the same sample on both replicas,
  after a restore or a move, as in a run of the local harness (:func:`sampled_reference`).

:func:`add_clickstream` adds them to the clicks' stream (as :func:`~replication.examples.sessions.add_sessions`
returns it); the ``*_reference`` functions give what each emits.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from replication.aggregators import Count
from replication.api import DataStream, Job
from replication.functions import KeyedProcessFunction
from replication.testing import run_locally

SLIDING_SIZE_MS, SLIDING_SLIDE_MS = 1200, 300
FLUSH_AFTER_MS = 200
SAMPLE_SHARE = 0.25


def one_click(click: dict) -> dict:
    return {"user": click["user"], "clicks": 1, "last": click["ts"]}


def add_up(total: dict, more: dict) -> dict:
    return {"user": total["user"], "clicks": total["clicks"] + more["clicks"], "last": more["last"]}


class BatchByProcessingTime(KeyedProcessFunction):
    """Buffers each user's clicks in list state and flushes them ``after_ms`` of processing time
    after the first of a batch: ``{"user", "clicks": [their times, as they came]}``."""

    def __init__(self, after_ms: int = FLUSH_AFTER_MS) -> None:
        self.after_ms = after_ms

    def open(self, ctx):
        self.batch = ctx.list_state("batch")

    def process(self, click: dict, ctx):
        if self.batch.is_empty():
            ctx.timers.register_processing_time_timer(ctx.timers.current_processing_time() + self.after_ms)
        self.batch.add(click["ts"])

    def on_timer(self, timestamp: int, ctx):
        times = self.batch.get()
        self.batch.clear()
        yield {"user": ctx.key, "clicks": times}


class SampleClicks(KeyedProcessFunction):
    """About ``share`` of each user's clicks, each kept or not by a draw of ``ctx.random()``."""

    def __init__(self, share: float = SAMPLE_SHARE) -> None:
        self.share = share

    def process(self, click: dict, ctx):
        if ctx.random().random() < self.share:
            yield click


def add_sampled_clicks(clicks: DataStream, out_topic: str, parallelism: int | None = None) -> None:
    """``clicks -> key_by(user) -> process(SampleClicks) -> sink``."""
    (clicks.key_by(lambda c: c["user"])
     .process(SampleClicks(), name="sampled", parallelism=parallelism)
     .sink(out_topic, serializer="json", key_serializer="str", name="sampled-sink"))


def add_clickstream(clicks: DataStream, counts_topic: str, pages_topic: str, batches_topic: str,
                    parallelism: int | None = None, batch_after_ms: int = FLUSH_AFTER_MS) -> None:
    """The running counts, the sliding page counts and the processing-time batches, flushed
    ``batch_after_ms`` after their first click, each to its topic."""
    (clicks.map(one_click, name="one-click").key_by(lambda c: c["user"])
     .reduce(add_up, name="running", parallelism=parallelism)
     .sink(counts_topic, serializer="json", key_serializer="str", key=lambda r: r["user"],
           timestamp=lambda r: r["last"], headers=lambda r: [("clicks", str(r["clicks"]).encode())],
           name="running-sink"))
    (clicks.key_by(lambda c: c["page"])
     .window(SLIDING_SIZE_MS, Count(), slide_ms=SLIDING_SLIDE_MS, name="pages", parallelism=parallelism)
     .sink(pages_topic, serializer="json", key_serializer="str", name="pages-sink"))
    (clicks.key_by(lambda c: c["user"])
     .process(BatchByProcessingTime(batch_after_ms), name="batches", parallelism=parallelism)
     .sink(batches_topic, serializer="json", key_serializer="str", name="batches-sink"))


def running_reference(clicks: Iterable[dict]) -> list[dict]:
    """Each click's running count of its user (clicks in event-time order)."""
    totals: Counter[str] = Counter()
    out = []
    for c in clicks:
        totals[c["user"]] += 1
        out.append({"user": c["user"], "clicks": totals[c["user"]], "last": c["ts"]})
    return out


def pages_reference(clicks: Iterable[dict]) -> dict[tuple[str, int], int]:
    """(page, window start) -> clicks, for every sliding window that holds one."""
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for c in clicks:
        ts = c["ts"]
        start = ts - ts % SLIDING_SLIDE_MS
        while start > ts - SLIDING_SIZE_MS:
            counts[(c["page"], start)] += 1
            start -= SLIDING_SLIDE_MS
    return dict(counts)


def batched_clicks(batches: Iterable[dict[str, Any]]) -> Counter[tuple[str, int]]:
    """The (user, time) of every click in ``batches``, counted: each click once, whenever its
    batch went out (compare with :func:`clicks_counted` of the input)."""
    return Counter((b["user"], t) for b in batches for t in b["clicks"])


def clicks_counted(clicks: Iterable[dict]) -> Counter[tuple[str, int]]:
    """The (user, time) of every click, counted."""
    return Counter((c["user"], c["ts"]) for c in clicks)


def sampled_reference(clicks: Iterable[dict]) -> list[dict]:
    """The clicks :func:`add_sampled_clicks` keeps: what one failure-free run draws, by the local
    harness (the draws are seeded by the operator, the user and how often the user drew)."""
    job = Job("sampled-reference")
    add_sampled_clicks(job.source("clicks", deserializer="json", timestamp=lambda c: c["ts"]), "sampled")
    return run_locally(job, {"clicks": list(clicks)}).outputs.get("sampled", [])
