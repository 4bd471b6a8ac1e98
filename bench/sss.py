"""The baseline: Spark Structured Streaming (SSS) with checkpoint recovery; what an executor kill costs it.

    .venv/bin/python bench/sss.py [--logic chain|count] [--rate R] [--keys N] [--partitions P]
                                  [--duration 40] [--kill-at 15 | --no-kill] [--kill-phase any|stateful]
                                  [--trigger-ms 100] [--locality-wait 3s] [--out bench/results/sss]

Setup.  The job logic of our benchmarks, written the way an SSS user would (``--logic``):

* **``chain``** (the default): the ordered job of :mod:`replication.examples.ordered`, as
  ``bench/ordering.py`` runs it, on the same input.  *Input*: two topics ``a`` and ``b`` of 2
  partitions each, fed by ``bench/ordering.py``'s feeding code: :func:`ops.loadgen.generate_load`
  round robin over the streams a, a, b (events split 2:1) with ordering's event format
  (:func:`~replication.examples.ordered.make_events`: JSON ``{"id": "a-17", "key": "k17", "ts": wall
  clock ms at the producer}``, Kafka key ``key``, keys ``k0..k{n-1}`` round robin per source); ``--keys``
  defaults to ordering's 30 and ``--rate`` to its 400 events/s.  *Logic*: ``groupBy("key")
  .applyInPandasWithState`` keeping HashChain's state per key (``head string, n long``); a key's events
  in a micro-batch are put in the order of :func:`order_events` and folded into the chain
  (:func:`chain_frame`: ``h_n = chain_step(h_{n-1}, id)``), each yielding HashChain's record
  ``{"key","n","id","prev","h","ts"}``.  *Ordering rule*: sort by (running max of ``ts`` along the
  event's source partition in offset order, topic, partition, offset): a merge of the source
  partitions by event time that never reorders a partition (with ``ts`` non-decreasing along a
  partition, as the producer's clock is, it is plain ``(ts, topic, partition, offset)``).  It depends on
  nothing but the batch's rows, and a batch's offset ranges are in the offset log before it runs,
  so a re-executed task recomputes the same records.  ``--partitions`` (state store partitions and
  output partitions) defaults to 2, ordering's chain parallelism.  *Check*:
  :func:`~replication.examples.ordered.verify_chains` (every event once, every key's chain links
  up, a source's events of a key in production order), on the raw output and on the output with
  identical copies removed (see the sink below).
* **``count``** (the earlier baseline): one topic of ``--partitions`` (3) partitions; a feeder thread
  produces JSON ``{"id": int, "k": str, "ts": ms}``, Kafka key ``k``, keys ``k0..k{n-1}`` round robin
  (``--keys`` 64, ``--rate`` 200); ``groupBy("k").applyInPandasWithState`` keeping a running count per
  key (state ``count long``); every input record yields ``{"id","k","count","ts"}`` (records of a key
  sorted by id within a micro-batch); checked against each id's expected running count.

Common to both:

* **Source**: Spark's Kafka connector jar is not available (no Maven), so a *Python streaming data
  source* (``pyspark.sql.datasource.DataSourceStreamReader``, Spark 4.x, with the 4.2+ ``latestOffset
  (start, limit)`` signature) stands in for it, with the connector's interface: option ``subscribe``
  (comma-separated topics) and rows ``topic, partition, offset, key, value`` (strings), the JSON
  parsed with ``from_json`` in the JVM.  *One source over several topics rather than a union of two
  streams*: that is what an SSS user with the connector writes (``subscribe = "a,b"``), each
  micro-batch costs one planning round trip to the Python source runner instead of one per stream,
  and the batch's ranges of both topics are one entry of the offset log.  Offsets are ``{"<topic>":
  {"<partition>": next offset}}``; ``latestOffset`` (driver side, in Spark's Python source runner)
  reads the end offsets from a long-lived consumer that fetches every partition (the embedded broker
  under-reports ListOffsets, so end offsets come from fetches, as in the rest of the project);
  ``partitions(start, end)`` plans one task per topic-partition with new records; ``read`` (executor
  side) assigns the partition at ``start`` and reads up to ``end`` exclusive with confluent-kafka.
* **Stateful operator**: ``applyInPandasWithState`` (output mode update, no timeout) rather than
  ``transformWithStateInPandas``: the state of a group travels to Python in the same Arrow batch as
  its rows and back with its output, whereas ``transformWithStateInPandas`` reads and writes every
  state variable through a separate per-task state server (a round trip per get/update per key),
  which costs more on two cores for a small state and buys nothing here (no timers, no TTL, no
  list/map state).
* **State**: ``RocksDBStateStoreProvider`` with changelog checkpointing (each commit writes a
  changelog file; snapshots are uploaded in the background: the low-latency setting, which halved
  the commit time here); checkpoint (offset log, commit log, state) in a temp dir shared by all
  executors (one machine); ``spark.sql.shuffle.partitions`` = ``--partitions`` (instead of 200).
* **Sink**: ``foreachBatch``; each batch's rows are written from the executors (``foreachPartition``,
  one cached confluent-kafka producer per Python worker, flushed at the end of each partition) to the
  output topic as JSON (the row's fields in schema order), Kafka key the grouping key, headers
  ``sink_ts`` (wall clock at produce, ``repr`` of float seconds), ``batch_id``, and the writing task's
  ``partition``, ``attempt``, ``task`` (task attempt id, unique per attempt, also across stage
  re-attempts, where ``attempt`` starts at 0 again) and ``executor``.
* **Trigger**: processing time, ``--trigger-ms`` (default 100 ms) between micro-batch starts.  SSS runs
  one micro-batch at a time, and here a batch (source stage, shuffle, stateful + sink stage) takes
  1-2 s on two shared cores, so in practice the next batch starts as soon as the previous one ends
  and the trigger interval only matters when the job is idle.
* **Cluster**: ``local-cluster[3,1,512]`` (three executor JVMs, one core each) and the embedded
  stack (ZooKeeper + tansu), all on the same machine as the feeder.  Spark's defaults otherwise
  (``spark.locality.wait`` 3 s unless ``--locality-wait``; ``spark.task.maxFailures`` 100 from
  ``replication.spark_cluster.default_conf``).

Warm-up: one record per key (``chain``: per key and source) is fed first and awaited in the output
(the first micro-batch starts the executors' Python workers: 10-60 s depending on the machine's
load); it is checked like the rest but left out of the latency figures, as are the first 5 s of
timed feeding in the steady-state figures.

Fault experiment: steady load, at ``--kill-at`` seconds the JVM of one executor is SIGKILLed
(``replication.spark_cluster.kill_executor``): wherever the micro-batch is (``--kill-phase any``), or,
with ``--kill-phase stateful``, as soon as after that time the stateful stage is running a task on an
executor (that one is killed).  Feeding goes on to ``--duration``, then stops; the run waits until the
output holds every id (or ``--drain-timeout``) and stops the query.  Latency of a record = ``sink_ts -
ts``: it includes the broker twice, the wait for the next batch, the micro-batch and the producer
hand-over.  Per-second p50/p99/max are binned by *produce* time relative to the kill.  "p99 before" is
over the records *written* in the 10 s before the kill (all finished before it); the *stall* counts the
seconds among the 30 after the kill whose p99 is above twice that, ``stall_before_kill_s`` the seconds
before the kill above it (records in flight when it hit, which binning by produce time puts before the
kill); *recovery* is the first second after the kill whose p99 is below 2x again
(``recovered_for_good_s``: the second after the last one above 2x).  ``batches.csv`` has every
micro-batch's duration (``query.recentProgress``), ``summary.csv`` (one row, ``logic`` says which job)
the stage re-attempts of the query's jobs (Spark's status tracker), ``events.txt`` the kill, executor
removal and registration.

Max sustainable throughput (``--throughput-rates``, instead of the fault experiment): one run per offered
rate in increasing order (each a fresh query on the same session, with its warm-up, ``--throughput-duration``
seconds of timed feeding, no kill), stopping at the first run that is not *flat* by ``bench/ordering.py``'s
criteria (:func:`bench.ordering.flat_verdict`: over the steady window, from ``--throughput-warm-up`` s after
the start of the timed feeding to its end, the sink wrote at least 95% of the offered rate, the p99 of
producer->sink latency is at most 2x the ramp's lowest-rate p99 + 50 ms, the median of the second half is at
most 1.5x the first half's + 20 ms, and the output is exact).  With the ``--trigger-ms`` trigger (100 ms) the
latency is the micro-batch's (seconds), so the p99 bound is relative to SSS's own lowest-rate p99.  Writes
``throughput.csv`` (``bench/ordering.py``'s columns, the cost columns those of each run's steady window, see
below) and ``throughput.png``.

Costs (:class:`bench.common.CostProbe`, as ``bench/ordering.py`` measures its runs), over the fault-free
*steady window* of every run: from 5 s (``--throughput-warm-up`` in a ramp) after the start of the timed
feeding to the kill (just before the SIGKILL), or without a kill to the end of the feeding; the records are
the events produced in that window (in the steady state as many are written, and about as much work is in
flight at both ends; a window that starts with the feeding would count the idle pipeline's start and end
with a batch's worth of work undone).  The kill and the recovery are not measured.  CPU seconds (utime +
stime of ``/proc/<pid>/stat``, reaped children included) of the job's processes: the executor JVMs, their
Python workers (the source's ``read``, ``applyInPandasWithState``, the sink's ``foreachPartition``), the
Python processes the driver JVM starts (the streaming source's driver-side runner: ``latestOffset``,
planning; ``cpu_driver_python_s``, part of ``cpu_python_s``), the driver JVM, the broker and ZooKeeper
(``cpu_s``, ``cpu_per_1k``); this process apart (``cpu_bench_s``, ``cpu_bench_per_1k``: the load generator,
the output collector and the ``foreachBatch`` callback, which the driver JVM calls back into through py4j);
the machine's busy CPU; loopback rx bytes (``net_bytes``, ``net_bytes_per_record``).  The columns of
``bench/ordering.py``'s ``latency.csv`` (:data:`bench.common.COST_COLUMNS`), in ``summary.csv`` and the
ramp's rows, with ``cost_records`` and ``cost_processes`` (live processes per group at the window's end).

Limits, measured and reported rather than hidden:

* **The sink is at-least-once.**  ``foreachBatch`` + a plain producer is how SSS writes to Kafka (its
  own Kafka sink is at-least-once too).  A task killed after its first produce and before the driver
  saw it finish is re-run from the checkpointed state and writes its rows again (same ``batch_id``, a
  later task attempt: ``retried_writes``, ``retried_rows``); a batch re-run after a driver restart would
  rewrite the batch's whole output.  With this sink a task writes its rows in a burst at its end
  (``sink_write_ms``: about 1 ms, at most tens of ms, out of 1-2 s per batch), so a single executor kill
  rarely lands in that window and duplicates are rare rather than impossible.  ``duplicates`` counts
  ids seen more than once (``extra_copies`` the copies beyond the first), ``missing`` delivered ids
  never seen; ``count``: ``wrong_counts`` output records whose count is not the key's running count at
  that id; ``chain``: ``chains_exact`` / ``broken_chains`` / ``reordered_keys`` of ``verify_chains`` on
  the raw output, ``identical_copies`` / ``conflicting_ids`` (copies equal to / different from the
  id's first one: a re-run that recomputed something else) and ``chains_exact_dedup`` /
  ``broken_chains_dedup`` once identical copies are removed.  ``exact`` is ``yes`` only for the raw
  output: every event once and (``chain``) every chain linking up.
* The Python source adds a Python runner round trip per planning call and per task; the JVM Kafka
  source would be somewhat cheaper per batch.  Everything (feeder, broker, driver, 3 executors) shares
  the machine's two cores, as in the other benchmarks, and other work on the machine shows
  (``load_avg_start``/``load_avg_end`` in the summary).
* Executor loss is seen by polling the driver's executor list every 0.1 s (``executor_removed_s``);
  the replacement executor is started by the local-cluster Worker (``executor_added_s``).
  ``--kill-phase stateful`` reads the executors' running tasks through an internal Spark API (the
  driver's status store, via py4j).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition  # noqa: E402

from ops.loadgen import generate_load  # noqa: E402
from replication.examples.ordered import chain_step, make_events, verify_chains  # noqa: E402

MS = 1000.0
SOURCE_NAME = "sss_kafka_lite"
SOURCE_SCHEMA = "topic string, partition int, offset long, key string, value string"  # as Kafka connector's
LOGICS = ("chain", "count")
COUNT_EVENT_SCHEMA = "id long, k string, ts long"
COUNT_OUTPUT_SCHEMA = "id long, k string, count long, ts long"
COUNT_STATE_SCHEMA = "count long"
CHAIN_EVENT_SCHEMA = "id string, key string, ts long"
CHAIN_OUTPUT_SCHEMA = "key string, n long, id string, prev string, h string, ts long"  # HashChain's record
CHAIN_STATE_SCHEMA = "head string, n long"
CHAIN_TOPIC_PARTITIONS = 2  # topics a and b, as bench/ordering.py creates them
CHAIN_STREAMS = ("a", "a", "b")  # bench/ordering.py's round robin: events split 2:1 between a and b
ORDER_COLUMNS = ("topic", "partition", "offset")  # a record's position in its source
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
BEFORE_S = 10  # "p99 before": the records written in the 10 s before the kill
STALL_WINDOW_S = 30  # seconds after the kill examined for the stall
STALL_FACTOR = 2.0

TopicPartition = tuple[str, int]


# --------------------------------------------------------------------------- offsets (pure)


def offsets_to_json(positions: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{(topic, partition): next offset}`` as a JSON-able offset ``{topic: {"<partition>": offset}}``
    (keys must be strings), topics and partitions sorted."""
    out: dict[str, dict[str, int]] = {}
    for (topic, p), o in sorted(positions.items()):
        out.setdefault(topic, {})[str(p)] = int(o)
    return out


def offsets_from_json(offsets: Mapping[str, Mapping[str, Any]]) -> dict[TopicPartition, int]:
    """The inverse of :func:`offsets_to_json`."""
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def plan_end_offsets(start: Mapping[str, Any], available: Mapping[TopicPartition, int],
                     max_rows: int | None = None) -> dict[str, dict[str, int]]:
    """End offsets of the next micro-batch: every topic-partition up to what is ``available`` (its next
    offset as seen by a fetch), never below ``start``; with ``max_rows``, at most that many records in
    total, shared in proportion to each partition's backlog (largest remainders first)."""
    begin = offsets_from_json(start)
    for tp in available:
        begin.setdefault(tp, 0)  # a partition the start does not know yet begins at 0
    backlog = {tp: max(0, int(available.get(tp, o)) - o) for tp, o in begin.items()}
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        take = backlog
    else:
        if max_rows < 0:
            raise ValueError(f"max_rows must be >= 0, got {max_rows}")
        shares = {tp: max_rows * n / total for tp, n in backlog.items()}
        take = {tp: int(s) for tp, s in shares.items()}
        left = max_rows - sum(take.values())
        for tp in sorted(shares, key=lambda q: (-(shares[q] - take[q]), q))[:left]:
            take[tp] += 1
    return offsets_to_json({tp: o + take[tp] for tp, o in begin.items()})


def plan_ranges(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[tuple[str, int, int, int]]:
    """``(topic, partition, from, until)`` of every topic-partition with records in ``[start, end)``,
    sorted.  Raises ValueError if an end offset is behind its start."""
    begin, stop = offsets_from_json(start), offsets_from_json(end)
    out = []
    for (topic, p), e in sorted(stop.items()):
        s = begin.get((topic, p), 0)
        if e < s:
            raise ValueError(f"{topic}[{p}]: end offset {e} is behind start {s}")
        if e > s:
            out.append((topic, p, s, e))
    return out


# --------------------------------------------------------------------------- the source


def _worker_cache() -> dict:
    """A dict that lives as long as the (reused) Python worker process: a synthetic module in
    ``sys.modules``, because this file's functions reach the executors pickled by value."""
    import types

    mod = sys.modules.get("_sss_worker_cache")
    if mod is None:
        mod = types.ModuleType("_sss_worker_cache")
        mod.cache = {}  # type: ignore[attr-defined]
        sys.modules["_sss_worker_cache"] = mod
    return mod.cache  # type: ignore[attr-defined]


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int,
               timeout_s: float = 60.0) -> Iterator[tuple[str, int, int, str | None, str]]:
    """The records ``[start, end)`` of one partition as ``(topic, partition, offset, key, value)``
    (runs in an executor task)."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaPartition

    cache = _worker_cache()
    consumer = cache.get(("consumer", bootstrap))
    if consumer is None:
        consumer = cache[("consumer", bootstrap)] = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"sss-read-{os.getpid()}",
            "enable.auto.commit": False, "enable.partition.eof": False, "fetch.wait.max.ms": 10,
            "allow.auto.create.topics": False})
    consumer.assign([KafkaPartition(topic, partition, start)])
    nxt = start
    deadline = time.monotonic() + timeout_s
    try:
        while nxt < end:
            msgs = consumer.consume(num_messages=min(10_000, end - nxt), timeout=0.1)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {topic}[{partition}]: {err.str()}")
                off = m.offset()
                if off < nxt:
                    continue
                if off >= end:
                    nxt = end
                    break
                key = m.key()
                yield topic, partition, off, None if key is None else key.decode(), m.value().decode()
                nxt = off + 1
            if not msgs and nxt < end:
                # an offset gap (e.g. a control record) ends the range once the position is past it
                pos = consumer.position([KafkaPartition(topic, partition)])[0].offset
                if pos >= end:
                    nxt = end
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}[{partition}]: at offset {nxt} of [{start}, {end}) "
                                       f"after {timeout_s}s")
    finally:
        consumer.unassign()


def subscribed_topics(option: str) -> list[str]:
    """The topics of a ``subscribe`` option (comma-separated, blanks ignored, order kept, no repeats)."""
    topics = list(dict.fromkeys(t.strip() for t in option.split(",") if t.strip()))
    if not topics:
        raise ValueError(f"subscribe: no topic in {option!r}")
    return topics


class KafkaLiteStreamReader(DataSourceStreamReader):
    """Offsets ``{"<topic>": {"<partition>": next offset}}``; one input partition per topic-partition
    with data."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.topics = subscribed_topics(options["subscribe"])
        self.max_rows = int(options["maxRecordsPerBatch"]) if options.get("maxRecordsPerBatch") else None
        self._consumer: Any = None
        self._next: dict[TopicPartition, int] = {}

    def _partition_ids(self) -> list[TopicPartition]:
        from confluent_kafka.admin import AdminClient

        # all topics' metadata: naming a topic would make tansu auto-create it
        metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=10).topics
        out: list[TopicPartition] = []
        for topic in self.topics:
            md = metadata.get(topic)
            if md is None or md.error is not None or not md.partitions:
                raise RuntimeError(f"source topic {topic!r} not found")
            out += [(topic, p) for p in sorted(md.partitions)]
        return out

    def initialOffset(self) -> dict:
        return offsets_to_json(dict.fromkeys(self._partition_ids(), 0))

    def _available(self, start: Mapping[str, Any]) -> dict[TopicPartition, int]:
        """Next offset per topic-partition as far as fetched so far (the fetch high watermark or the
        last record seen + 1, whichever is higher)."""
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as KafkaPartition

        if self._consumer is None:
            begin = offsets_from_json(start)
            self._next = dict(begin)
            self._consumer = Consumer({
                "bootstrap.servers": self.bootstrap, "group.id": f"sss-offsets-{os.getpid()}",
                "enable.auto.commit": False, "fetch.wait.max.ms": 10, "allow.auto.create.topics": False})
            self._consumer.assign([KafkaPartition(t, p, o) for (t, p), o in begin.items()])
        while True:
            msgs = self._consumer.consume(num_messages=10_000, timeout=0)
            for m in msgs:
                if m.error() is None:
                    tp = (m.topic(), m.partition())
                    self._next[tp] = max(self._next.get(tp, 0), m.offset() + 1)
            if len(msgs) < 10_000:
                break
        for (t, p), o in list(self._next.items()):
            high = self._consumer.get_watermark_offsets(KafkaPartition(t, p), cached=True)[1]
            if high is not None and high > o:
                self._next[(t, p)] = high
        return dict(self._next)

    def latestOffset(self, start: dict, limit: Any) -> dict:  # the 4.2+ signature (admission control)
        from pyspark.sql.streaming.datasource import ReadMaxRows

        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan_end_offsets(start, self._available(start), max_rows)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        # plain InputPartition: partitions cross to the executors with the standard pickle, by reference
        return [InputPartition(r) for r in plan_ranges(start, end)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        topic, p, s, e = partition.value
        return read_range(self.bootstrap, topic, p, s, e)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the broker keeps the data; the checkpoint is Spark's

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class KafkaLiteDataSource(DataSource):
    """``spark.readStream.format("sss_kafka_lite").option("bootstrap", ...).option("subscribe", "a,b")``:
    rows ``topic, partition, offset, key, value`` as from Spark's Kafka connector (strings, not bytes)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaLiteStreamReader(self.options)


# --------------------------------------------------------------------------- logic and sink


def count_per_key(key: tuple, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState function: a running count per key, one output row per input row."""
    import numpy as np
    import pandas as pd

    frames = [f for f in pdfs if len(f)]
    if not frames:
        return
    pdf = pd.concat(frames, ignore_index=True).sort_values("id", kind="stable")
    before = int(state.get[0]) if state.exists else 0
    n = len(pdf)
    state.update((before + n,))
    yield pd.DataFrame({"id": pdf["id"].to_numpy(), "k": pdf["k"].to_numpy(),
                        "count": np.arange(before + 1, before + n + 1, dtype="int64"),
                        "ts": pdf["ts"].to_numpy()})


def order_events(events: Any) -> Any:
    """A key's events of one micro-batch (a pandas frame with ``ts`` and ``topic, partition, offset``) in
    the order the chain folds them: by (running max of ``ts`` along the event's source partition in
    offset order, topic, partition, offset).  A total order on the rows, whatever order they come in;
    each source partition's events stay in offset order; with ``ts`` non-decreasing along every
    partition it is plain (ts, topic, partition, offset)."""
    by_source = events.sort_values(list(ORDER_COLUMNS), kind="stable")
    run_ts = by_source.groupby(["topic", "partition"], sort=False)["ts"].cummax()
    return (by_source.assign(_run_ts=run_ts).sort_values(["_run_ts", *ORDER_COLUMNS], kind="stable")
            .drop(columns="_run_ts").reset_index(drop=True))


def chain_frame(key: str, events: Any, head: str, n: int) -> tuple[Any, str, int]:
    """HashChain on a frame: fold ``events`` (in their row order; columns ``id``, ``ts``) into the key's
    chain whose head is ``head`` after ``n`` events.  Returns HashChain's records ``key, n, id, prev, h,
    ts`` as a frame, and the new head and count (the state to keep)."""
    import numpy as np
    import pandas as pd

    ids = [str(i) for i in events["id"]]
    prevs, hashes = [], []
    for event_id in ids:
        prevs.append(head)
        head = chain_step(head, event_id)
        hashes.append(head)
    out = pd.DataFrame({"key": [key] * len(ids), "n": np.arange(n + 1, n + len(ids) + 1, dtype="int64"),
                        "id": ids, "prev": prevs, "h": hashes,
                        "ts": np.asarray(events["ts"], dtype="int64")})
    return out, head, n + len(ids)


def chain_per_key(key: tuple, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState function: HashChain per key (state ``head, n``), the batch's events of the
    key in :func:`order_events` order, one output record per event."""
    import pandas as pd

    frames = [f for f in pdfs if len(f)]
    if not frames:
        return
    events = order_events(pd.concat(frames, ignore_index=True))
    head, n = (str(state.get[0]), int(state.get[1])) if state.exists else ("", 0)
    out, head, n = chain_frame(str(key[0]), events, head, n)
    state.update((head, n))
    yield out


def keyed_job(stream: Any, logic: str) -> Any:
    """The stateful part of the job on the source's rows: parse the JSON value (in the JVM, as one does
    with the Kafka connector), group by the key, ``applyInPandasWithState``."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    if logic == "count":
        events = stream.select(F.from_json("value", COUNT_EVENT_SCHEMA).alias("e")).select("e.*")
        return events.groupBy("k").applyInPandasWithState(
            count_per_key, COUNT_OUTPUT_SCHEMA, COUNT_STATE_SCHEMA, "Update", GroupStateTimeout.NoTimeout)
    if logic == "chain":
        events = (stream.select(F.from_json("value", CHAIN_EVENT_SCHEMA).alias("e"), *ORDER_COLUMNS)
                  .select("e.*", *ORDER_COLUMNS))
        return events.groupBy("key").applyInPandasWithState(
            chain_per_key, CHAIN_OUTPUT_SCHEMA, CHAIN_STATE_SCHEMA, "Update", GroupStateTimeout.NoTimeout)
    raise ValueError(f"logic must be one of {LOGICS}, got {logic!r}")


def sink_partition(rows: Iterator[Any], bootstrap: str, topic: str, batch_id: int, key_field: str) -> None:
    """Write one partition of a micro-batch's output (runs in an executor task): each row as JSON (its
    fields in schema order), Kafka key its ``key_field``; raises unless every record was acknowledged,
    so a failed write fails the task and Spark retries it."""
    from confluent_kafka import Producer
    from pyspark import TaskContext

    from replication.spark_cluster import current_executor_id

    cache = _worker_cache()
    producer = cache.get(("producer", bootstrap))
    if producer is None:
        producer = cache[("producer", bootstrap)] = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, "enable.idempotence": True})
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    ctx = TaskContext.get()
    task = [("batch_id", str(batch_id).encode()),
            ("partition", str(ctx.partitionId() if ctx else -1).encode()),
            ("attempt", str(ctx.attemptNumber() if ctx else -1).encode()),
            ("task", str(ctx.taskAttemptId() if ctx else -1).encode()),
            ("executor", str(current_executor_id() or "?").encode())]
    n = 0
    for r in rows:
        value = json.dumps(r.asDict())
        while True:
            try:
                producer.produce(topic, key=str(r[key_field]).encode(), value=value.encode(),
                                 on_delivery=on_delivery,
                                 headers=[("sink_ts", repr(time.time()).encode()), *task])
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        n += 1
    remaining = producer.flush(60)
    if remaining or errors:
        raise RuntimeError(f"sink: {remaining} of {n} undelivered, {len(errors)} failed {errors[:1]}")


def make_batch_writer(bootstrap: str, topic: str, key_field: str) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function (runs on the driver)."""

    def write_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(lambda rows: sink_partition(rows, bootstrap, topic, batch_id, key_field))

    return write_batch


# --------------------------------------------------------------------------- metrics (pure)


@dataclass(frozen=True)
class OutRecord:
    id: Any  # count: an int; chain: "a-17"
    k: str
    count: int  # count: the running count; chain: n, the position in the key's chain
    ts_ms: int
    sink_ts: float
    batch_id: int
    partition: int = -1  # Spark partition (= state store partition) of the writing task
    attempt: int = 0  # the writing task's attempt number (> 0: a retry; 0 again in a re-attempted stage)
    executor: str = "?"
    task: int = -1  # the writing task's attempt id (unique per task attempt)
    value: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # the record as written


def out_record(value: Mapping[str, Any], headers: Mapping[str, str]) -> OutRecord:
    """An output record from its JSON value (count: ``id, k, count, ts``; chain: HashChain's ``key, n,
    id, prev, h, ts``) and its decoded headers (``sink_ts``, ``batch_id``, the writing task's)."""
    chain = "n" in value
    return OutRecord(str(value["id"]) if chain else int(value["id"]), str(value["key" if chain else "k"]),
                     int(value["n" if chain else "count"]), int(value["ts"]), float(headers["sink_ts"]),
                     int(headers["batch_id"]), int(headers.get("partition", -1)),
                     int(headers.get("attempt", 0)), headers.get("executor", "?"),
                     int(headers.get("task", -1)), dict(value))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank q-quantile (as ops.workload.percentile); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def retried_spans(outputs: Sequence[OutRecord]) -> dict[tuple[int, int, int, int], list[OutRecord]]:
    """The rows of every retried task write, by ``(batch, partition, attempt, task)``: a write with
    ``attempt`` > 0, or any write of a (batch, partition) after the first task that wrote it (a
    re-attempted stage numbers its tasks' attempts from 0 again)."""
    spans: dict[tuple[int, int, int, int], list[OutRecord]] = defaultdict(list)
    for r in outputs:
        spans[(r.batch_id, r.partition, r.attempt, r.task)].append(r)
    first: dict[tuple[int, int], tuple[float, tuple[int, int, int, int]]] = {}
    for span, rs in spans.items():
        start = (min(r.sink_ts for r in rs), span)
        first[span[:2]] = min(first.get(span[:2], start), start)
    return {span: rs for span, rs in spans.items() if span[2] > 0 or first[span[:2]][1] != span}


def account(produced: Mapping[Any, tuple[str, int, int | None]],
            outputs: Sequence[OutRecord]) -> dict[str, Any]:
    """Compare the output with what was produced (``id -> (key, ts_ms, expected count or None)``; None:
    not known in advance, as a chain position).

    Latency samples use each id's *first* output copy.  Returns counts and ``first``: id -> OutRecord."""
    copies: dict[Any, list[OutRecord]] = defaultdict(list)
    for r in outputs:
        copies[r.id].append(r)
    first = {i: min(rs, key=lambda r: r.sink_ts) for i, rs in copies.items()}
    dups = {i: rs for i, rs in copies.items() if len(rs) > 1}
    same_batch = sum(1 for rs in dups.values() if len({r.batch_id for r in rs}) == 1)
    wrong = sum(1 for r in outputs if r.id in produced and produced[r.id][2] is not None
                and r.count != produced[r.id][2])
    spans: dict[tuple[int, int, int, int], list[float]] = defaultdict(list)
    for r in outputs:
        spans[(r.batch_id, r.partition, r.attempt, r.task)].append(r.sink_ts)
    write_ms = [(max(v) - min(v)) * MS for v in spans.values()]
    retried = retried_spans(outputs)
    return {
        "records_out": len(outputs), "distinct_out": len(copies),
        "duplicates": len(dups), "extra_copies": sum(len(rs) - 1 for rs in dups.values()),
        "dup_ids_same_batch": same_batch, "dup_ids_across_batches": len(dups) - same_batch,
        "dup_batches": sorted({r.batch_id for rs in dups.values() for r in rs}),
        "missing": sum(1 for i in produced if i not in copies),
        "unexpected": sum(1 for i in copies if i not in produced),
        "wrong_counts": wrong,
        "retried_writes": sorted(f"b{b}/p{p}/a{a}" for b, p, a, _t in retried),
        "retried_rows": sum(len(rs) for rs in retried.values()),
        "sink_write_ms_p50": percentile(write_ms, .5), "sink_write_ms_max": max(write_ms, default=math.nan),
        "first": first,
    }


def chain_checks(outputs: Sequence[OutRecord], event_ids: Iterable[str]) -> dict[str, Any]:
    """:func:`~replication.examples.ordered.verify_chains` on the chain job's output as written (the
    exactness verdict), and again once the copies identical to an earlier one of the same id are
    removed (what an idempotent consumer would see).  ``identical_copies``: the copies removed;
    ``conflicting_ids``: ids with copies of different content (a re-run computed something else)."""
    ids = list(event_ids)
    raw = verify_chains([r.value for r in outputs], ids)
    seen: dict[Any, set[str]] = defaultdict(set)
    kept, identical = [], 0
    for r in sorted(outputs, key=lambda r: r.sink_ts):
        content = json.dumps(r.value, sort_keys=True)
        if content in seen[r.id]:
            identical += 1
            continue
        seen[r.id].add(content)
        kept.append(r.value)
    dedup = verify_chains(kept, ids)
    return {"chains_exact": "yes" if raw.exact else "no", "chain_keys": raw.keys,
            "broken_chains": len(raw.broken), "reordered_keys": len(raw.reordered),
            "identical_copies": identical, "conflicting_ids": sum(1 for v in seen.values() if len(v) > 1),
            "chains_exact_dedup": "yes" if dedup.exact else "no", "broken_chains_dedup": len(dedup.broken),
            "reordered_keys_dedup": len(dedup.reordered), "chain_check": str(raw)[:300]}


def is_exact(summary: Mapping[str, Any]) -> bool:
    """The run's output as written is exactly the input's: every record once, no query error, and
    (count) every running count right or (chain) every chain linking up in production order."""
    ok = summary["missing"] == 0 and summary["duplicates"] == 0 and summary["unexpected"] == 0 \
        and not summary["query_error"]
    if summary["logic"] == "chain":
        return ok and summary["chains_exact"] == "yes"
    return ok and summary["wrong_counts"] == 0


def per_second(samples: Sequence[tuple[float, float]], origin: float) -> list[dict[str, Any]]:
    """``(produce time s, latency ms)`` samples -> rows per second of produce time relative to
    ``origin`` (floor), with count, p50, p99 and max in ms; seconds without samples are absent."""
    bins: dict[int, list[float]] = defaultdict(list)
    for ts, lat in samples:
        bins[math.floor(ts - origin)].append(lat)
    return [{"second": s, "count": len(v), "p50_ms": percentile(v, .5), "p99_ms": percentile(v, .99),
             "max_ms": max(v)} for s, v in sorted(bins.items())]


def fault_stats(samples: Sequence[tuple[float, float]], timeline: Sequence[Mapping[str, Any]],
                kill_at: float, window_s: int = STALL_WINDOW_S, factor: float = STALL_FACTOR,
                before_s: float = BEFORE_S, not_before: float | None = None) -> dict[str, Any]:
    """p99 before the kill, worst per-second p99 after, stall, recovery (``timeline`` relative to the kill).

    * ``p99_before_ms``: p99 of the samples *written* in the ``before_s`` seconds before the kill (and
      produced at or after ``not_before``): all finished before it, so none is affected by it, whatever
      the latency (binning by produce time would mix in records still in flight at the kill);
    * ``worst_p99_after_ms`` / ``worst_second``: the highest per-second p99 among seconds 0..window-1;
    * ``stall_s``: how many of those seconds have a p99 above ``factor`` x p99 before;
    * ``stall_before_kill_s``: seconds produced in the ``before_s`` before the kill above it (their
      records were in flight when the kill hit);
    * ``recovery_s``: the first second >= 0 whose p99 is back under it (None if none in the window);
    * ``recovered_for_good_s``: 1 + the last second above it in the window (0 if none).
    """
    before = [lat for ts, lat in samples if kill_at - before_s <= ts + lat / MS < kill_at
              and (not_before is None or ts >= not_before)]
    p99_before = percentile(before, .99)
    limit = factor * p99_before
    after = [r for r in timeline if 0 <= r["second"] < window_s]
    above = [r["second"] for r in after if r["p99_ms"] > limit]
    worst = max(after, key=lambda r: r["p99_ms"], default=None)
    recovery = next((r["second"] for r in after if r["p99_ms"] <= limit), None)
    return {"p99_before_ms": p99_before, "before_samples": len(before),
            "worst_p99_after_ms": worst["p99_ms"] if worst else math.nan,
            "worst_second": worst["second"] if worst else None, "stall_s": len(above),
            "stall_before_kill_s": sum(1 for r in timeline
                                       if -before_s <= r["second"] < 0 and r["p99_ms"] > limit),
            "recovery_s": recovery, "recovered_for_good_s": (max(above) + 1) if above else 0}


# --------------------------------------------------------------------------- feeder, collector


class Feeder(threading.Thread):
    """Produces ids 0.., keys ``k0..`` round robin, ``ts`` = wall clock ms: first ``warmup`` records at
    once (then waits for ``go``), then ``rate`` records/s until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: float, keys: int, warmup: int = 0,
                 linger_ms: float = 1.0) -> None:
        super().__init__(name="sss-feeder", daemon=True)
        self.bootstrap, self.topic, self.rate, self.keys, self.warmup = bootstrap, topic, rate, keys, warmup
        self.linger_ms = linger_ms
        self.stop_event = threading.Event()
        self.go = threading.Event()
        self.warm_sent = threading.Event()
        self.produced: dict[int, tuple[str, int, int]] = {}  # id -> (k, ts ms, expected count)
        self.delivered: set[int] = set()
        self.errors: list[str] = []
        self.started_at = math.nan  # wall clock when the timed feeding began
        self.stopped_at = math.nan
        self._counts: dict[str, int] = defaultdict(int)

    @property
    def warm_ids(self) -> set[int]:
        """The ids of the warm-up records."""
        return set(range(self.warmup))

    def _produce(self, producer: Any, i: int) -> None:
        k = f"k{i % self.keys}"
        self._counts[k] += 1
        ts = int(time.time() * 1000)
        self.produced[i] = (k, ts, self._counts[k])
        value = json.dumps({"id": i, "k": k, "ts": ts}).encode()
        while True:
            try:
                producer.produce(self.topic, key=k.encode(), value=value,
                                 on_delivery=lambda err, _msg, i=i: self._delivered(err, i))
                return
            except BufferError:
                producer.poll(0.05)

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": self.linger_ms})
        try:
            for i in range(self.warmup):
                self._produce(producer, i)
            producer.flush(60)
            self.warm_sent.set()
            while not self.go.wait(0.05):
                if self.stop_event.is_set():
                    return
            start = time.monotonic()
            self.started_at = math.floor(time.time() * MS) / MS  # <= the ts of the first timed record
            n = 0
            while not self.stop_event.is_set():
                due = int((time.monotonic() - start) * self.rate) + 1
                while n < due:
                    self._produce(producer, self.warmup + n)
                    n += 1
                producer.poll(0)
                time.sleep(max(0.0, min(0.01, start + n / self.rate - time.monotonic())))
        finally:
            self.stopped_at = time.time()
            left = producer.flush(60)
            if left:
                self.errors.append(f"{left} undelivered at the end")

    def _delivered(self, err: Any, i: int) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered.add(i)


def ordering_stream(source: str, keys: int, produced: dict[str, tuple[str, int, None]]
                    ) -> Callable[[int], tuple[bytes, bytes, str]]:
    """bench/ordering.py's event maker for ``source`` (``make(ts) -> (key, value, id)`` for
    :func:`~ops.loadgen.generate_load`): event ``i`` of the source is ``make_events``'s, id
    ``<source>-<i>``, key ``k<i % keys>``, ``ts`` the given wall clock; records each event in ``produced``
    (``id -> (key, ts, None)``: a chain position is not known in advance)."""
    counter = [0]

    def make(ts: int) -> tuple[bytes, bytes, str]:
        i = counter[0]
        counter[0] += 1
        # as bench/ordering.py: make_events numbers event i with ts = start_ts + i ms, so start at ts - i
        key, value = make_events(source, 1, keys, start_ts=ts - i, first=i)[0]
        event_id = f"{source}-{i}"
        produced[event_id] = (key.decode(), ts, None)
        return key, value, event_id

    return make


class ChainFeeder(threading.Thread):
    """bench/ordering.py's load on topics ``{"a": ..., "b": ...}``: first one event per key of each
    source at once (the warm-up; then waits for ``go``), then :func:`~ops.loadgen.generate_load`
    round robin over a, a, b at ``rate`` events/s for ``duration_s`` (once started it runs its whole
    duration: ``stop_event`` only cancels before it)."""

    def __init__(self, bootstrap: str, topics: Mapping[str, str], rate: float, keys: int,
                 duration_s: float, linger_ms: float = 2.0) -> None:
        super().__init__(name="sss-chain-feeder", daemon=True)
        self.bootstrap, self.topics, self.rate, self.keys = bootstrap, dict(topics), rate, keys
        self.linger_ms = linger_ms
        self.duration_s = duration_s
        self.stop_event = threading.Event()
        self.go = threading.Event()
        self.warm_sent = threading.Event()
        self.produced: dict[str, tuple[str, int, None]] = {}  # id -> (key, ts ms, None)
        self.delivered: set[str] = set()
        self.warm_ids: set[str] = set()
        self.errors: list[str] = []
        self.started_at = math.nan  # wall clock when the timed feeding began
        self.stopped_at = math.nan
        self.makers = {s: ordering_stream(s, keys, self.produced) for s in self.topics}

    def _warm_up(self) -> None:
        from confluent_kafka import Producer

        from transport.kafka_io import produce_blocking

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 1})
        for source, topic in self.topics.items():
            for _ in range(self.keys):
                key, value, event_id = self.makers[source](int(time.time() * MS))
                self.warm_ids.add(event_id)
                produce_blocking(producer, topic, key=key, value=value,
                                 on_delivery=lambda err, _m, i=event_id: self._delivered(err, i))
        if producer.flush(60):
            self.errors.append("warm-up records undelivered")

    def run(self) -> None:
        try:
            self._warm_up()
            self.warm_sent.set()
            while not self.go.wait(0.05):
                if self.stop_event.is_set():
                    return
            self.started_at = math.floor(time.time() * MS) / MS  # <= the ts of the first timed record
            warm = len(self.produced)
            streams = [(self.topics[s], self.makers[s]) for s in CHAIN_STREAMS]
            try:
                generate_load(self.bootstrap, streams, rate=self.rate, duration_s=self.duration_s,
                              producer_conf={"linger.ms": self.linger_ms})
            except Exception as exc:  # noqa: BLE001 - reported (feed_errors), delivery of the rest unknown
                self.errors.append(f"{type(exc).__name__}: {exc}")
            # generate_load returns only once every record is acknowledged (and raises otherwise)
            self.delivered.update(list(self.produced)[warm:])
        finally:
            self.stopped_at = time.time()

    def _delivered(self, err: Any, event_id: str) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered.add(event_id)


class Collector(threading.Thread):
    """Reads the output topic from offset 0 of every partition until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: Sequence[int]) -> None:
        super().__init__(name="sss-collector", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, list(partitions)
        self.stop_event = threading.Event()
        self.records: list[OutRecord] = []
        self.ids: set[int] = set()
        self.errors: list[str] = []
        self.ready = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"sss-collect-{os.getpid()}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 20,
                             "allow.auto.create.topics": False})
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in self.partitions])
            self.ready.set()
            while not self.stop_event.is_set():
                for m in consumer.consume(num_messages=5000, timeout=0.1):
                    if m.error() is not None:
                        self.errors.append(m.error().str())
                        continue
                    rec = out_record(json.loads(m.value()), {k: x.decode() for k, x in (m.headers() or [])})
                    self.records.append(rec)
                    self.ids.add(rec.id)
        finally:
            consumer.close()


# --------------------------------------------------------------------------- costs (pure)


def cost_summary(window: Sequence[tuple[float, Any]], produced_ms: Iterable[int], hz: int | None = None
                 ) -> dict[str, Any]:
    """The cost columns of a run's steady window ``[(wall clock s, CostSnapshot) at its start, at its end]``
    (fewer than two: not measured, empty columns): :func:`bench.common.cost_columns` per event produced in
    the window (``produced_ms``: every delivered event's ``ts``, wall clock ms; in the steady state as many
    events are written as produced, and the work in flight at both ends is about the same), then
    ``cost_records`` (those events), ``cpu_driver_python_s`` (the Python processes the driver JVM started,
    e.g. the streaming source's runner: part of ``cpu_python_s``) and ``cost_processes`` (the number of
    processes per group at the end)."""
    from bench.common import cost_columns

    if len(window) < 2:
        return {**cost_columns(None, None, 0), "cost_records": "", "cpu_driver_python_s": "", "cost_processes": ""}
    (start, before), (end, after) = window[0], window[1]
    records = sum(1 for ts in produced_ms if start <= ts / MS < end)
    cols = cost_columns(before, after, records, hz)
    hz = hz or os.sysconf("SC_CLK_TCK")
    driver_py = (after.ticks.get("driver_python", 0) - before.ticks.get("driver_python", 0)) / hz
    return {**cols, "cost_records": records, "cpu_driver_python_s": driver_py,
            "cost_processes": " ".join(f"{g}:{n}" for g, n in after.processes.items())}


# --------------------------------------------------------------------------- the experiment


def _set_confs(spark: Any, confs: Mapping[str, str]) -> dict[str, str | None]:
    old = {}
    for k, v in confs.items():
        old[k] = spark.conf.get(k, None)
        spark.conf.set(k, v)
    return old


def _restore_confs(spark: Any, old: Mapping[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def _progress_row(p: Mapping[str, Any]) -> dict[str, Any]:
    from datetime import datetime

    d = p.get("durationMs", {}) or {}
    start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return {"batch_id": int(p["batchId"]), "start": start, "rows": int(p.get("numInputRows", 0)),
            "trigger_ms": float(d.get("triggerExecution", math.nan)),
            "add_batch_ms": float(d.get("addBatch", math.nan)),
            "latest_offset_ms": float(d.get("latestOffset", math.nan)),
            "planning_ms": float(d.get("queryPlanning", math.nan)),
            "wal_commit_ms": float(d.get("walCommit", math.nan)),
            "commit_offsets_ms": float(d.get("commitOffsets", math.nan))}


def _task_failures(sc: Any, job_group: str) -> dict[str, Any]:
    """Failed tasks and re-attempted stages of the query's jobs (Spark's status tracker; the streaming
    query runs its jobs in the job group named after its run id).  Counts are of each stage's last
    attempt."""
    tracker = sc.statusTracker()
    failed, reattempts, jobs = 0, [], 0
    try:
        for jid in sorted(tracker.getJobIdsForGroup(job_group)):
            info = tracker.getJobInfo(jid)
            if info is None:
                continue
            jobs += 1
            for sid in info.stageIds:
                st = tracker.getStageInfo(sid)
                if st is None:
                    continue
                failed += st.numFailedTasks
                if st.currentAttemptId > 0 or st.numFailedTasks:
                    reattempts.append(f"job{jid}/stage{sid}.{st.currentAttemptId}:{st.numFailedTasks}failed")
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return {"spark_jobs": jobs, "failed_tasks": -1, "stage_retries": f"unavailable: {exc}"}
    return {"spark_jobs": jobs, "failed_tasks": failed, "stage_retries": " ".join(reattempts)}


def _busy_executors(sc: Any) -> set[str]:
    """Executors with a running task, from the driver's live status store (via py4j)."""
    try:
        seq = sc._jsc.sc().statusStore().executorList(True)
        return {str(e.id()) for e in (seq.apply(i) for i in range(seq.length()))
                if e.activeTasks() > 0 and str(e.id()) != "driver"}
    except Exception:  # noqa: BLE001 - internal API: without it, any executor is taken
        return set()


def _wait_for_stateful_stage(sc: Any, timeout_s: float,
                             victim: str | None) -> tuple[int | None, str | None, float]:
    """Poll Spark's status tracker until the stateful stage of a micro-batch (the result stage, run by
    ``foreachPartition`` from py4j, not the source's shuffle-map stage ``run at ...``) has running
    tasks on ``victim`` (None: on any executor); returns the stage id (None on timeout), the executor
    running one of its tasks, and the time waited."""
    tracker = sc.statusTracker()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        for sid in tracker.getActiveStageIds():
            st = tracker.getStageInfo(sid)
            if st is None or st.numActiveTasks == 0 or st.name.startswith("run at"):
                continue
            busy = _busy_executors(sc)
            pick = victim if victim in busy else (sorted(busy)[0] if busy and victim is None else None)
            if pick is not None:
                return sid, pick, time.monotonic() - t0
        time.sleep(0.005)
    return None, None, time.monotonic() - t0


def _register_source(spark: Any) -> None:
    """Register the data source; this module's code must reach the executors by value (``bench`` is
    not an installed package) unless it is ``__main__``, which cloudpickle ships by value anyway."""
    from pyspark import cloudpickle

    mod = sys.modules[__name__]
    if __name__ != "__main__":
        cloudpickle.register_pickle_by_value(mod)
    spark.dataSource.register(KafkaLiteDataSource)


def input_topics(logic: str, prefix: str, partitions: int) -> dict[str, int]:
    """The input topics of ``logic`` and their partition counts: ``chain``: ``<prefix>a`` and ``<prefix>b``
    of 2 partitions (as bench/ordering.py); ``count``: ``<prefix>in`` of ``partitions``."""
    if logic == "chain":
        return {f"{prefix}{s}": CHAIN_TOPIC_PARTITIONS for s in dict.fromkeys(CHAIN_STREAMS)}
    if logic == "count":
        return {f"{prefix}in": partitions}
    raise ValueError(f"logic must be one of {LOGICS}, got {logic!r}")


def run_sss_experiment(bootstrap: str, spark: Any, *, rate: float, keys: int, duration_s: float,
                       kill_at_s: float | None, trigger_ms: int, out_topic_prefix: str, status: Any = None,
                       partitions: int | None = None, victim: str | None = None,
                       drain_timeout_s: float = 90.0, warmup_s: float = 5.0, warmup_timeout_s: float = 300.0,
                       changelog_checkpointing: bool = True, kill_phase: str = "any",
                       logic: str = "chain", probe: Any = None, feeder_linger_ms: float = 2.0) -> dict[str, Any]:
    """Run the SSS job on ``spark`` against the broker at ``bootstrap``: feed ``rate`` records/s for
    ``duration_s`` (the feeder's producer lingering ``feeder_linger_ms``), SIGKILL an executor at
    ``kill_at_s`` (None: no fault), drain, stop the query.

    ``logic``: ``"chain"`` (bench/ordering.py's hash chain job and input: topics ``<prefix>a`` and
    ``<prefix>b`` of 2 partitions fed 2:1) or ``"count"`` (a running count per key on one topic
    ``<prefix>in`` of ``partitions`` partitions).  ``partitions``: state store partitions
    (``spark.sql.shuffle.partitions``) and output topic partitions (None: :func:`logic_defaults`).

    ``kill_phase``: ``"any"`` kills at ``kill_at_s`` wherever the micro-batch is; ``"stateful"`` waits
    from there (up to 10 s) until the stateful stage's tasks are running (the state update + sink
    stage) and kills an executor running one of them (``victim`` if given), so the kill lands inside a
    task.

    Before the timed feeding, one record per key (chain: per key and source) is fed and awaited in the
    output (the first micro-batch starts the executors' Python workers and the state stores: tens of
    seconds on a busy machine); those records are checked like the others but left out of the latency
    figures, as are the first ``warmup_s`` of the timed feeding in the steady-state figures.

    With a ``probe`` (:class:`bench.common.CostProbe`), the costs of the fault-free steady window (from
    ``warmup_s`` after the start of the timed feeding to the kill, or without a kill to the end of the
    feeding): :data:`bench.common.COST_COLUMNS` per event produced in that window (:func:`cost_summary`).

    Returns ``{"summary": dict, "timeline": [per-second rows], "batches": [micro-batch progress rows],
    "events": [(seconds relative to the origin, text)], "costs": the cost columns, ...}``; the timeline's
    seconds are relative to the kill (or to the start of feeding without a kill).  ``status``: anything
    with ``update(text)``.
    """
    from deploy.topics import create_topics
    from replication.spark_cluster import executor_ids, kill_executor

    if rate <= 0 or duration_s <= 0 or keys <= 0 or trigger_ms <= 0:
        raise ValueError("rate, duration, keys and trigger must be positive")
    if kill_phase not in ("any", "stateful"):
        raise ValueError(f"kill_phase must be 'any' or 'stateful', got {kill_phase!r}")
    if logic not in LOGICS:
        raise ValueError(f"logic must be one of {LOGICS}, got {logic!r}")
    if kill_at_s is not None and not 0 < kill_at_s < duration_s:
        raise ValueError(f"kill_at_s must be within (0, {duration_s})")
    partitions = logic_defaults(logic)["partitions"] if partitions is None else partitions
    sc = spark.sparkContext
    inputs, out_topic = input_topics(logic, out_topic_prefix, partitions), f"{out_topic_prefix}out"
    create_topics(bootstrap, {**inputs, out_topic: partitions})
    _register_source(spark)
    old_confs = _set_confs(spark, {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
        # commit = one changelog file per batch instead of a RocksDB checkpoint uploaded every batch
        # (the low-latency setting; snapshots are then uploaded by the maintenance thread)
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled":
            str(changelog_checkpointing).lower(),
    })
    ckpt = tempfile.mkdtemp(prefix="sss-checkpoint-")
    feeder: Feeder | ChainFeeder
    if logic == "chain":
        sources = {t[len(out_topic_prefix):]: t for t in inputs}
        feeder = ChainFeeder(bootstrap, sources, rate, keys, duration_s, linger_ms=feeder_linger_ms)
    else:
        feeder = Feeder(bootstrap, next(iter(inputs)), rate, keys, warmup=keys, linger_ms=feeder_linger_ms)
    collector = Collector(bootstrap, out_topic, range(partitions))
    events: list[tuple[float, str]] = []
    batches: dict[int, dict[str, Any]] = {}
    query = None
    query_error = ""
    kill_wall: float | None = None
    victim_pid = None
    removed_at = added_at = None
    drained = False
    load_start = math.nan
    run_id = ""
    cost_at: list[tuple[float, Any]] = []  # (wall clock, CostSnapshot): the steady window's start and end
    try:
        collector.start()
        collector.ready.wait(30)
        stream = (spark.readStream.format(SOURCE_NAME).option("bootstrap", bootstrap)
                  .option("subscribe", ",".join(inputs)).load())
        writer = make_batch_writer(bootstrap, out_topic, "key" if logic == "chain" else "k")
        query = (keyed_job(stream, logic).writeStream.outputMode("update").foreachBatch(writer)
                 .trigger(processingTime=f"{trigger_ms} milliseconds")
                 .option("checkpointLocation", ckpt).queryName(f"sss-{out_topic_prefix.strip('-')}").start())
        feeder.start()
        feeder.warm_sent.wait(60)
        warm_ids = feeder.warm_ids
        warm_deadline = time.monotonic() + warmup_timeout_s
        warm_t0 = time.monotonic()
        while not warm_ids <= collector.ids:
            if query.exception() is not None or time.monotonic() > warm_deadline:
                raise RuntimeError(f"SSS warm-up: {len(warm_ids & collector.ids)} of {len(warm_ids)} records "
                                   f"out after {time.monotonic() - warm_t0:.0f}s ({query.exception()})")
            if status is not None:
                status.update(f"sss {logic} warm-up {time.monotonic() - warm_t0:5.1f}s: "
                              f"{len(warm_ids & collector.ids)}/{len(warm_ids)} records out")
            time.sleep(0.1)
        events.append((time.time(), f"warm-up done in {time.monotonic() - warm_t0:.1f}s"))
        run_id = str(query.runId)
        before_ids = set(executor_ids(sc))
        load_start = os.getloadavg()[0]
        feeder.go.set()
        t0 = time.monotonic()
        feed_end = t0 + duration_s
        drain_end = None
        while True:
            now = time.monotonic()
            if query.exception() is not None or not query.isActive:
                query_error = str(query.exception() or "query stopped")[:500]
                events.append((time.time(), f"query terminated: {query_error[:120]}"))
                break
            if probe is not None and not cost_at and kill_wall is None and now - t0 >= warmup_s:
                cost_at.append((time.time(), probe.snapshot()))  # the steady window starts
            if kill_at_s is not None and kill_wall is None and now - t0 >= kill_at_s:
                note = ""
                if kill_phase == "stateful":
                    stage, busy, waited = _wait_for_stateful_stage(sc, 10.0, victim)
                    victim = busy or victim
                    note = (f", {waited * MS:.0f} ms after {kill_at_s:g}s: running a task of stateful "
                            f"stage {stage}" if stage is not None else ", no stateful task seen within 10 s")
                victim = victim if victim is not None else executor_ids(sc)[0]
                if len(cost_at) == 1:  # the steady window ends just before the kill
                    cost_at.append((time.time(), probe.snapshot()))
                kill_wall = time.time()
                victim_pid = kill_executor(sc, victim)
                events.append((kill_wall, f"SIGKILL executor {victim} (pid {victim_pid}){note}"))
            if kill_wall is not None and (removed_at is None or added_at is None):
                ids = set(executor_ids(sc))
                if removed_at is None and victim not in ids:
                    removed_at = time.time()
                    events.append((removed_at, f"executor {victim} removed by the driver"))
                if added_at is None and ids - before_ids:
                    added_at = time.time()
                    events.append((added_at, f"executor {sorted(ids - before_ids)} registered"))
            p = query.lastProgress
            if p is not None:
                batches.setdefault(int(p["batchId"]), _progress_row(p))
            if drain_end is None and now >= feed_end:
                if len(cost_at) == 1:  # no kill: the steady window ends with the feeding
                    cost_at.append((time.time(), probe.snapshot()))
                feeder.stop_event.set()
                feeder.join(90)
                drain_end = time.monotonic() + drain_timeout_s
                events.append((time.time(), "feeding stopped"))
            if drain_end is not None:
                if feeder.delivered and feeder.delivered <= collector.ids:
                    drained = True
                    break
                if time.monotonic() > drain_end:
                    events.append((time.time(), f"drain timeout after {drain_timeout_s:.0f}s"))
                    break
            if status is not None:
                phase = "feeding" if drain_end is None else "draining"
                kill = "" if kill_wall is None else f", kill +{time.time() - kill_wall:.1f}s"
                status.update(f"sss {logic} {phase} {now - t0:5.1f}s: in {len(feeder.produced)}, out "
                              f"{len(collector.ids)} ids / {len(collector.records)} records, batch "
                              f"{max(batches, default=-1)}{kill}")
            time.sleep(0.1)
    finally:
        feeder.stop_event.set()
        if feeder.is_alive():
            feeder.join(90)
        if query is not None:
            try:
                for p in query.recentProgress:
                    batches[int(p["batchId"])] = _progress_row(p)
            except Exception as exc:  # noqa: BLE001 - the query may be gone already
                events.append((time.time(), f"no progress: {exc}"))
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001
                events.append((time.time(), f"query.stop failed: {exc}"))
        collector.stop_event.set()
        collector.join(30)
        failures = _task_failures(sc, run_id) if run_id else {}
        _restore_confs(spark, old_confs)
        shutil.rmtree(ckpt, ignore_errors=True)

    delivered = {i: feeder.produced[i] for i in feeder.delivered}
    acc = account(delivered, collector.records)
    first = acc.pop("first")
    samples = sorted((r.ts_ms / MS, r.sink_ts * MS - r.ts_ms) for r in first.values()
                     if r.ts_ms / MS >= feeder.started_at)  # not the warm-up records
    origin = kill_wall if kill_wall is not None else feeder.started_at
    timeline = per_second(samples, origin)
    produced_per_s: dict[int, int] = defaultdict(int)
    for _key, ts, _count in delivered.values():
        produced_per_s[math.floor(ts / MS - origin)] += 1
    for row in timeline:
        row["produced"] = produced_per_s.get(row["second"], 0)
    # steady state: after the warm-up and, with a kill, written before it
    steady = [lat for ts, lat in samples if ts - feeder.started_at >= warmup_s
              and (kill_wall is None or ts + lat / MS < kill_wall)]
    last_sink = max((r.sink_ts for r in collector.records), default=math.nan)
    summary: dict[str, Any] = {
        "kill": "none" if kill_wall is None else f"executor {victim} at {kill_at_s:g}s ({kill_phase})",
        "logic": logic,
        "input": ", ".join(f"{t[len(out_topic_prefix):]}: {n} partitions" for t, n in inputs.items())
        + (" (fed 2:1)" if logic == "chain" else ""),
        "rate": rate, "keys": keys, "partitions": partitions, "trigger_ms": trigger_ms,
        "duration_s": duration_s, "records_in": len(delivered), "feed_errors": len(feeder.errors),
        **{k: v for k, v in acc.items() if k not in ("dup_batches", "retried_writes")},
        "dup_batches": " ".join(map(str, acc["dup_batches"])),
        "retried_writes": " ".join(acc["retried_writes"]), **failures,
        **(chain_checks(collector.records, delivered) if logic == "chain" else {}),
        "drained": drained, "query_error": query_error,
        "steady_p50_ms": percentile(steady, .5), "steady_p99_ms": percentile(steady, .99),
        "steady_max_ms": max(steady, default=math.nan),
        "load_avg_start": load_start, "load_avg_end": os.getloadavg()[0],
        "throughput_per_s": len(samples) / (last_sink - feeder.started_at) if samples else 0.0,
    }
    costs = cost_summary(cost_at, [ts for _key, ts, _count in delivered.values()])
    summary.update(costs)
    if kill_wall is not None:
        summary.update(fault_stats(samples, timeline, kill_wall, not_before=feeder.started_at + warmup_s))
        worst = max((x for x in samples if x[0] - feeder.started_at >= warmup_s), key=lambda x: x[1],
                    default=None)
        summary["worst_record_ms"] = worst[1] if worst else math.nan
        summary["worst_record_at_s"] = (worst[0] - kill_wall) if worst else math.nan
        summary["executor_removed_s"] = (removed_at - kill_wall) if removed_at else math.nan
        summary["executor_added_s"] = (added_at - kill_wall) if added_at else math.nan
        summary["victim_pid"] = victim_pid
    rows = sorted(batches.values(), key=lambda b: b["batch_id"])
    steady_batches = [b["trigger_ms"] for b in rows
                      if b["rows"] and b["start"] - feeder.started_at >= warmup_s
                      and (kill_wall is None or b["start"] + b["trigger_ms"] / MS < kill_wall)]
    for b in rows:
        b["start_s"] = b.pop("start") - origin
    summary["batches"] = len(rows)
    summary["batch_p50_ms"] = percentile(steady_batches, .5)
    if kill_wall is not None:
        at_kill = [b for b in rows if b["start_s"] <= 0 <= b["start_s"] + b["trigger_ms"] / MS]
        summary["batch_at_kill"] = at_kill[0]["batch_id"] if at_kill else None
        summary["batch_at_kill_ms"] = at_kill[0]["trigger_ms"] if at_kill else math.nan
        after = [b for b in rows if b["start_s"] >= -1]
        summary["longest_batch_after_ms"] = max((b["trigger_ms"] for b in after), default=math.nan)
    if logic == "chain":
        summary["wrong_counts"] = ""  # chain positions are not known in advance: verify_chains checks them
    summary["exact"] = "yes" if is_exact(summary) else "no"
    summary["state_store"] = f"RocksDB, changelog checkpointing {'on' if changelog_checkpointing else 'off'}"
    summary["locality_wait"] = sc.getConf().get("spark.locality.wait", "3s (default)")
    return {"summary": summary, "timeline": timeline, "batches": rows,
            "events": [(t - origin, e) for t, e in events],
            # the timed records' first copies: (produced, written) wall clock (s), for the throughput ramp
            "writes": sorted((r.ts_ms / MS, r.sink_ts) for r in first.values() if r.ts_ms / MS >= feeder.started_at),
            "load_window": (feeder.started_at, feeder.stopped_at),
            "produced_timed": sum(1 for _key, ts, _count in delivered.values() if ts / MS >= feeder.started_at),
            "costs": costs}


# --------------------------------------------------------------------------- CLI


def _plot(out: Path, result: Mapping[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, timeline, batches = result["summary"], result["timeline"], result["batches"]
    killed = "p99_before_ms" in s
    lo, hi = (-12, STALL_WINDOW_S + 2) if killed else (-1, int(s["duration_s"]) + 1)
    pts = [r for r in timeline if lo <= r["second"] <= hi]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1.3]})
    ax.plot([r["second"] + .5 for r in pts], [r["p99_ms"] for r in pts], marker=".", label="per-second p99")
    ax.plot([r["second"] + .5 for r in pts], [r["max_ms"] for r in pts], marker=".", alpha=.6,
            label="per-second max")
    ax.plot([r["second"] + .5 for r in pts], [r["p50_ms"] for r in pts], alpha=.6, label="per-second p50")
    ax.set_ylim(bottom=0)
    if killed:
        ax.axhline(STALL_FACTOR * s["p99_before_ms"], color="grey", linestyle=":", linewidth=1,
                   label=f"2 x p99 before ({STALL_FACTOR * s['p99_before_ms']:.0f} ms)")
        for x in (ax, bx):
            x.axvline(0, color="red", linestyle="--", linewidth=1)
        ax.text(0.2, ax.get_ylim()[1] * 0.93, "SIGKILL", color="red")
        for t, text in result["events"]:
            if "removed" in text or "registered" in text:
                ax.axvline(t, color="purple", linestyle=":", linewidth=1)
                ax.text(t + .1, ax.get_ylim()[1] * 0.02, text.split(" by ")[0], color="purple", rotation=90,
                        fontsize=7, va="bottom")
    job = "hash chain on topics a + b fed 2:1" if s.get("logic") == "chain" else "running count per key"
    title = (f"Spark Structured Streaming: {job}, {s['rate']:.0f} rec/s, {s['keys']} keys\n"
             f"applyInPandasWithState, RocksDB state store, trigger {s['trigger_ms']} ms")
    ax.set(ylabel="sink_ts - ts (ms), by produce second", title=title)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=.3)
    bpts = [b for b in batches if lo <= b["start_s"] <= hi]
    bx.bar([b["start_s"] for b in bpts], [b["trigger_ms"] for b in bpts],
           width=[max(.05, b["trigger_ms"] / MS) for b in bpts], align="edge", alpha=.6, color="tab:green")
    bx.set(xlabel="seconds since the kill" if killed else "seconds since the start of feeding",
           ylabel="micro-batch (ms)")
    bx.grid(alpha=.3)
    fig.tight_layout()
    path = out / ("sss_kill.png" if killed else "sss_steady.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def logic_defaults(logic: str) -> dict[str, Any]:
    """``--rate``, ``--keys`` and ``--partitions`` when not given: ``chain`` as bench/ordering.py (400
    events/s, its 30 keys, state partitions = its chain task's parallelism 2); ``count`` as before."""
    if logic == "chain":
        from bench.ordering import KEYS

        return {"rate": 400.0, "keys": KEYS, "partitions": 2}
    if logic == "count":
        return {"rate": 200.0, "keys": 64, "partitions": 3}
    raise ValueError(f"logic must be one of {LOGICS}, got {logic!r}")


def not_exact_text(s: Mapping[str, Any]) -> str:
    """Why a run's output is not exact, in one line."""
    text = (f"NOT EXACT: {s['missing']} missing, {s['duplicates']} ids duplicated ({s['extra_copies']} extra "
            f"copies, {s['retried_rows']} rows written by retried tasks), {s['unexpected']} unexpected")
    if s["logic"] == "chain":
        text += (f"; chains as written: {s['chain_check']}; with identical copies removed: "
                 f"{'exact' if s['chains_exact_dedup'] == 'yes' else 'NOT exact'} ({s['identical_copies']} "
                 f"identical copies removed, {s['conflicting_ids']} ids with differing copies, "
                 f"{s['broken_chains_dedup']} broken chains)")
    else:
        text += f", {s['wrong_counts']} wrong counts"
    return text + (", query failed" if s["query_error"] else "")


def ramp_label(trigger_ms: int) -> str:
    """The configuration name of an SSS ramp in ``throughput.csv`` (and the report)."""
    return f"Spark Structured Streaming, trigger {trigger_ms} ms"


def throughput_row(result: Mapping[str, Any], offered: float, warm_up_s: float, base_p99_ms: float | None,
                   label: str) -> dict[str, Any]:
    """A ``throughput.csv`` row of one SSS run (no kill), with ``bench/ordering.py``'s columns and verdict
    (:func:`bench.ordering.flat_verdict`; the ramp's first run sets the base when ``base_p99_ms`` is None);
    a query that failed or an output that is not exact makes the run not flat.  The cost columns are those of
    the run's steady window (``result["costs"]``, :func:`cost_summary`; empty without a probe)."""
    from bench.ordering import THROUGHPUT_COLUMNS, flat_verdict, p99_bound_ms, ramp_stats
    from ops.workload import Sample

    s = result["summary"]
    samples = [Sample(produced=p, ingest=p, sink=w) for p, w in result["writes"]]
    start, end = result["load_window"]
    st = ramp_stats(samples, (start, end), warm_up_s)
    base = st.p99_ms if base_p99_ms is None else base_p99_ms
    exact = s["exact"] == "yes"
    outcome = "yes" if exact else not_exact_text(s)
    problem = "" if exact else (f"query failed: {s['query_error'][:200]}" if s["query_error"]
                                else f"output not exact: {outcome}")
    produced = result["produced_timed"]
    costs = result.get("costs") or {}
    return {**dict.fromkeys(THROUGHPUT_COLUMNS, ""), "config": label, "offered_rate": offered,
           "produced_rate": produced / (end - start) if end > start else 0.0, "achieved": st.achieved,
           "records": len(samples), "p50_ms": st.p50_ms, "p99_ms": st.p99_ms,
           "first_half_p50_ms": st.first_half_p50_ms, "second_half_p50_ms": st.second_half_p50_ms,
           "p99_bound_ms": p99_bound_ms(base), "exact": "yes" if exact else "no", "outcome": outcome,
           "verdict": flat_verdict(offered, st, base, problem),
           **{k: costs.get(k, "") for k in ("cpu_s", "cpu_per_1k", "cpu_bench_per_1k", "net_bytes_per_record")}}


def session_conf(locality_wait: str | None) -> dict[str, str]:
    """The SSS sessions' Spark settings: SSS runs its operators in the executor JVMs, so they keep
    the JVM's own compiler and collector (not the replicated jobs' executor options)."""
    conf = {"spark.executor.extraJavaOptions": ""}
    if locality_wait is not None:
        conf["spark.locality.wait"] = locality_wait
    return conf


def throughput_main(args: argparse.Namespace, out: Path) -> int:
    """The SSS throughput ramp (module doc): ``throughput.csv``, ``throughput.png``, ``machine.txt``."""
    from bench.common import CostProbe, error_text, format_row, max_sustainable, write_csv, write_machine
    from bench.ordering import THROUGHPUT_COLUMNS, _plot_throughput
    from deploy.stack import EmbeddedStack
    from ops.progress import StatusLine
    from replication.spark_cluster import build_session, stop_session

    label = ramp_label(args.trigger_ms)
    rows: list[dict[str, Any]] = []
    base: float | None = None
    t0 = time.monotonic()
    with EmbeddedStack() as stack:
        conf = session_conf(args.locality_wait)
        spark = build_session("local-cluster[3,1,512]", app_name="bench-sss-throughput", conf=conf)
        try:
            probe = CostProbe.for_spark(spark, stack.run_dir, driver_python=True)
            status = StatusLine()
            for j, rate in enumerate(args.throughput_rates):
                print(f"== SSS {args.logic} throughput ramp, step {j + 1}/{len(args.throughput_rates)}: {rate:.0f} "
                      f"records/s for {args.throughput_duration:.0f}s, trigger {args.trigger_ms} ms "
                      f"({time.monotonic() - t0:.0f}s elapsed)", flush=True)
                try:
                    result = run_sss_experiment(
                        stack.bootstrap_servers, spark, rate=rate, keys=args.keys, duration_s=args.throughput_duration,
                        kill_at_s=None, trigger_ms=args.trigger_ms, out_topic_prefix=f"sss{os.getpid()}r{j}-",
                        status=status, partitions=args.partitions, drain_timeout_s=args.drain_timeout,
                        warmup_s=args.throughput_warm_up, logic=args.logic, probe=probe,
                        feeder_linger_ms=args.feeder_linger)
                    status.done()
                    row = throughput_row(result, rate, args.throughput_warm_up, base, label)
                except Exception as err:  # noqa: BLE001 - reported in throughput.csv, not hidden
                    status.done()
                    row = {**dict.fromkeys(THROUGHPUT_COLUMNS, ""), "config": label, "offered_rate": rate,
                           "verdict": f"error: {type(err).__name__}: {error_text(err)[:300]}"}
                rows.append(row)
                print("   " + format_row(row, skip=("outcome",)), flush=True)
                if row["verdict"] != "flat":
                    break
                base = row["p99_ms"] if base is None else base
        finally:
            stop_session(spark)
    write_csv(out / "throughput.csv", rows)
    _plot_throughput(out, rows)
    write_machine(out)
    ramp = max_sustainable(rows)[label]
    print(f"   {label}: max sustainable {ramp.text} records/s"
          + (f" (at {ramp.stopped_at:,.0f}/s {ramp.reason})" if ramp.stopped_at is not None else ""))
    print(f"wrote {out}/throughput.csv, throughput.png in {time.monotonic() - t0:.0f}s")
    bad = [r for r in rows if r["verdict"].startswith("error") or r["exact"] != "yes"]
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    from bench.common import CostProbe, format_row, write_csv, write_machine
    from deploy.stack import EmbeddedStack, require_java17
    from ops.progress import StatusLine
    from replication.spark_cluster import build_session, stop_session

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logic", choices=LOGICS, default="chain",
                    help="chain: bench/ordering.py's hash chain job on topics a, b (2 partitions each, "
                         "fed 2:1); count: a running count per key on one topic")
    ap.add_argument("--rate", type=float, default=None, help="records/s fed (default: chain 400, count 200)")
    ap.add_argument("--keys", type=int, default=None, help="keys (default: chain 30, count 64)")
    ap.add_argument("--partitions", type=int, default=None,
                    help="state store and output partitions, count: input partitions too "
                         "(default: chain 2, count 3)")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of feeding")
    kill = ap.add_mutually_exclusive_group()
    kill.add_argument("--kill-at", type=float, default=15.0, help="SIGKILL an executor this many s in")
    kill.add_argument("--no-kill", action="store_true")
    ap.add_argument("--kill-phase", choices=("any", "stateful"), default="any",
                    help="any: kill at --kill-at; stateful: from then, wait until the stateful stage's "
                         "tasks run")
    ap.add_argument("--victim", default=None, help="executor id to kill (default: the lowest alive)")
    ap.add_argument("--trigger-ms", type=int, default=100)
    ap.add_argument("--drain-timeout", type=float, default=90.0)
    ap.add_argument("--locality-wait", default=None,
                    help="spark.locality.wait for the session (default: Spark's 3s); a stateful task waits "
                         "this long for the executor that last held its state store before going elsewhere")
    ap.add_argument("--throughput-rates", default="",
                    help="max sustainable throughput instead of the fault experiment: offered records/s of the ramp, "
                         "tried in increasing order until a run is not flat (bench/ordering.py's criteria)")
    ap.add_argument("--feeder-linger", type=float, default=2.0,
                    help="the load generator's linger.ms in the throughput ramp (bench/capacity.py passes its own)")
    ap.add_argument("--throughput-duration", type=float, default=20.0, help="seconds of timed feeding per ramp run")
    ap.add_argument("--throughput-warm-up", type=float, default=5.0,
                    help="seconds of timed feeding left out of each ramp run's steady window")
    ap.add_argument("--out", default=str(REPO / "bench/results/sss"))
    args = ap.parse_args(argv)
    args.throughput_rates = sorted({float(x) for x in args.throughput_rates.split(",") if x.strip()})
    for name, value in logic_defaults(args.logic).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    kill_at = None if args.no_kill else args.kill_at
    if args.throughput_rates:
        return throughput_main(args, out)
    with EmbeddedStack() as stack:
        conf = session_conf(args.locality_wait)
        spark = build_session("local-cluster[3,1,512]", app_name="bench-sss", conf=conf)
        try:
            print(f"== SSS {args.logic}: {args.rate:.0f} records/s, {args.keys} keys, {args.duration:.0f}s, "
                  f"trigger {args.trigger_ms} ms, "
                  + ("no kill" if kill_at is None else f"kill at {kill_at:.0f}s"),
                  flush=True)
            status = StatusLine()
            probe = CostProbe.for_spark(spark, stack.run_dir, driver_python=True)
            result = run_sss_experiment(
                stack.bootstrap_servers, spark, rate=args.rate, keys=args.keys, duration_s=args.duration,
                kill_at_s=kill_at, trigger_ms=args.trigger_ms, out_topic_prefix=f"sss{os.getpid()}-",
                status=status, partitions=args.partitions, victim=args.victim,
                drain_timeout_s=args.drain_timeout, kill_phase=args.kill_phase, logic=args.logic, probe=probe)
            status.done("sss: done")
        finally:
            stop_session(spark)
    s = result["summary"]
    write_csv(out / "summary.csv", [s])
    write_csv(out / "timeline.csv", result["timeline"])
    if result["batches"]:
        write_csv(out / "batches.csv", result["batches"])
    (out / "events.txt").write_text("".join(f"{t:+8.2f}s {e}\n" for t, e in result["events"]))
    png = _plot(out, result)
    write_machine(out)
    print("   " + format_row(s, skip=("chain_check",)), flush=True)
    for t, e in result["events"]:
        print(f"   {t:+8.2f}s {e}")
    print(f"wrote {out}/summary.csv, timeline.csv, batches.csv, events.txt, {png.name}, machine.txt")
    exact = s["exact"] == "yes"
    if not exact:
        print(not_exact_text(s), flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
