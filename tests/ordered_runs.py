"""The order-sensitive two-topic job on the session's stack, for the ordering modes' runtime tests:
its input (pre-produced or fed live), its output, and replica agreement."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

from confluent_kafka import Producer

from deploy.topics import create_topics, produce, read_all
from ops.soak_check import read_topic
from replication import run
from replication.examples.ordered import build_ordered_job, make_events
from replication.spark_cluster import spark_work_dir
from transport.kafka_io import produce_blocking

START_TS = 1_700_000_000_000

# Rhino checkpoints at a test's pace. LiveRobin: every 20 pulses, about 5 checkpoints a second;
# KaZoo: every 50 orders or 200 records
RHINO_MODES = {
    "liverobin": {"spark.replication.rhino.checkpointEvery": "20"},
    "kazoo": {"spark.replication.rhino.checkpointEvery": "50", "spark.replication.rhino.checkpointElements": "200"},
}


def rhino_conf(stack, mode: str, replicated: bool = True, **extra) -> dict[str, str]:
    """The ordered job's conf with Rhino checkpoints in ``mode`` (``extra``: more keys, in full)."""
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.enabled": str(replicated).lower(), "spark.replication.mode": mode,
            "spark.replication.rhino.enabled": "true", **RHINO_MODES[mode], **extra}
    if mode == "kazoo":
        conf["spark.replication.zookeeper.connect"] = stack.zookeeper_connect
    return conf


def wait_until(cond, timeout: float, what: str, detail=lambda: "", poll_s: float = 0.05) -> None:
    """Poll ``cond`` every ``poll_s``; fail naming ``what`` (and ``detail()``) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what} {detail()}"
        time.sleep(poll_s)


def source_topics(stack, prefix: str) -> tuple[str, str]:
    """Topics ``<prefix>a`` and ``<prefix>b``, two partitions each."""
    a, b = f"{prefix}a", f"{prefix}b"
    create_topics(stack.bootstrap_servers, {a: 2, b: 2})
    return a, b


def preproduce(stack, a: str, b: str, per_topic: int) -> list[str]:
    """``per_topic`` events into each topic before the job starts; returns their ids."""
    events = make_events("a", per_topic, keys=40, start_ts=START_TS) + \
        make_events("b", per_topic, keys=40, start_ts=START_TS, step_ms=2)
    produce(stack.bootstrap_servers, a, events[:per_topic])
    produce(stack.bootstrap_servers, b, events[per_topic:])
    return [json.loads(v)["id"] for _, v in events]


def feed(stack, a: str, b: str, ids: list[str], rounds: int = 40, per_round: int = 100,
         first_round: int = 0) -> None:
    """About 4 s of live input, topic b at half the rate of topic a; appends the ids to ``ids``
    (``first_round``: continue the ids of an earlier call)."""
    # idempotent: a retried batch neither duplicates nor overtakes the next one (the checks compare
    # each source's order in the output with the id order); every delivery is confirmed
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 2, "acks": "all",
                         "enable.idempotence": True})
    failed: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            failed.append(f"{msg.topic()}: {err}")

    for i in range(first_round, first_round + rounds):
        ea = make_events("a", per_round, keys=30, start_ts=START_TS, first=i * per_round)
        eb = make_events("b", per_round // 2, keys=30, start_ts=START_TS, first=i * per_round // 2, step_ms=2)
        for topic, recs in ((a, ea), (b, eb)):
            for key, value in recs:
                produce_blocking(producer, topic, key=key, value=value, on_delivery=delivered)
        left = producer.flush(30)
        if left or failed:
            raise RuntimeError(f"feeding round {i}: {left} records undelivered after 30 s, failed: {failed[:3]}")
        ids.extend(json.loads(v)["id"] for _, v in ea + eb)
        time.sleep(0.1)


@contextlib.contextmanager
def fed_without_pause(stack, a: str, b: str, first_round: int = 0) -> Iterator[list[str]]:
    """Feed topics ``a`` and ``b`` (as :func:`feed`, round after round, from ``first_round``) until
    the block ends; yields the list of fed event ids, complete once the block is left."""
    ids: list[str] = []
    done = threading.Event()

    def keep_feeding() -> None:
        first = first_round
        while not done.is_set():
            feed(stack, a, b, ids, rounds=5, first_round=first)
            first += 5

    feeder = threading.Thread(target=keep_feeding, name="feeder")
    feeder.start()
    try:
        yield ids
    finally:
        done.set()
        feeder.join()


TIMER_MS = 100  # the ordered job's timers (HashChain): one per key and 100 ms of event time
SIDE_EVERY = 5  # the ordered job's side output: every key's 5th, 10th ... record


def start_under_load(stack, spark, name: str, conf: dict, timer_ms: int | None = None,
                     side_every: int | None = None):
    """The ordered job on topics ``<name>a``/``<name>b``, output ``<name>out``, with a feeder thread
    producing about 4 s of input; returns (job, handle, the fed event ids, the feeder).
    ``timer_ms``: the chain sets event-time timers; ``side_every``: it has a side output, to
    ``<name>out-side`` (:class:`HashChain`)."""
    a, b = source_topics(stack, name)
    job = build_ordered_job(a, b, f"{name}out", name=name, timer_ms=timer_ms, side_every=side_every)
    handle = run(job, spark=spark, conf=conf)
    handle.wait_started(120)
    ids: list[str] = []
    feeder = threading.Thread(target=feed, args=(stack, a, b, ids))
    feeder.start()
    return job, handle, ids, feeder


def read_output(stack, topic: str) -> list[dict]:
    return [json.loads(r.value) for r in read_all(stack.bootstrap_servers, topic)]


def where_missing(stack, name: str, missing: list[str]) -> str:
    """For a failed check: where each missing id of the job on ``<name>a`` / ``<name>b`` is in
    its input topic, and where a reader on another client (kafka-python, which reads aborted and
    open transactions too) finds it in ``<name>out``, with the headers that name its writer; then
    each output partition's high watermark and how far a ``read_committed`` reader gets (an open
    transaction holds it back): tells a feed, runtime, broker or reader fault apart."""
    wanted = set(missing[:20])
    found = {json.loads(r.value)["id"]: f"{r.topic}[{r.partition}]@{r.offset}"
             for t in (f"{name}a", f"{name}b") for r in read_topic(stack.bootstrap_servers, t)
             if json.loads(r.value)["id"] in wanted}
    raw = read_topic(stack.bootstrap_servers, f"{name}out")
    out = {}
    for r in raw:
        if (i := json.loads(r.value)["id"]) in wanted:
            h = {k: v.decode() for k, v in r.headers or () if k in ("rsink", "rseq", "rwriter")}
            out[i] = f"[{r.partition}]@{r.offset} {h}"
    committed: dict[int, int] = {}
    for r in read_all(stack.bootstrap_servers, f"{name}out", held_s=2.0):
        committed[r.partition] = max(committed.get(r.partition, -1), r.offset)
    high: dict[int, int] = {}
    for r in raw:
        high[r.partition] = max(high.get(r.partition, -1), r.offset)
    ends = ", ".join(f"[{p}] last offset {high[p]}, last committed {committed.get(p, -1)}" for p in sorted(high))
    return "; ".join(f"{i}: input {found.get(i, 'absent')}, output {out.get(i, 'absent')}"
                     for i in sorted(wanted)) + f"; output partitions: {ends}"


def output_difference(stack, topic: str, expected: list[dict], events=()) -> str:
    """Empty if ``topic`` holds exactly ``expected`` (as a ``read_committed`` reader sees it, by
    count); else what differs and where it could have gone: the missing and extra records, whether
    a reader on another client (kafka-python, which reads aborted and open transactions too) finds
    the missing ones and with which writer headers, the gaps in each sink partition's output seqs
    (a gap: lost in the output's writing; none: never produced), and the job's events that tell
    who wrote and what moved."""
    def as_text(record: dict) -> str:
        return json.dumps(record, sort_keys=True)

    committed = read_all(stack.bootstrap_servers, topic)
    got = Counter(as_text(json.loads(r.value)) for r in committed)
    want = Counter(as_text(r) for r in expected)
    if got == want:
        return ""
    missing, extra = sorted((want - got).elements()), sorted((got - want).elements())
    raw = {as_text(json.loads(r.value)): {k: v.decode() for k, v in r.headers or () if k in ("rsink", "rseq", "rwriter")}
           for r in read_topic(stack.bootstrap_servers, topic)}
    seqs: dict[str, set[int]] = {}
    for r in committed:
        h = {k: v.decode() for k, v in r.headers or ()}
        seqs.setdefault(h.get("rsink", "?"), set()).add(int(h.get("rseq", -1)))
    gaps = "; ".join(f"{sink}: seqs {min(s)}..{max(s)}, gaps {sorted(set(range(min(s), max(s) + 1)) - s)[:10]}"
                     for sink, s in sorted(seqs.items()))
    told = [text for _, text in events
            if any(w in text for w in ("declared dead", "restored", "rolled back", "relaunched", "handover job", "writ"))]
    return (f"{topic}: {len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}; the missing as any "
            f"reader sees them: {[raw.get(m, 'absent') for m in missing[:5]]}; output seqs: {gaps}; "
            f"events: {told[-20:]}")


WRITER_LOG_MARKS = ("took over as writer", "lost its producer", "scanning ")


def writer_log_lines(spark, since: float, limit: int = 40) -> list[str]:
    """For a failed check: what the executors of the tests' Spark application logged about
    exactly-once writers (takeovers with the seq their scan found and the records they kept,
    fenced writers) from wall-clock ``since`` on, oldest first."""
    found = []
    for stderr in (spark_work_dir() / spark.sparkContext.applicationId).glob("*/stderr"):
        for line in stderr.read_text(errors="replace").splitlines():
            if not any(mark in line for mark in WRITER_LOG_MARKS):
                continue
            try:
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if at >= since:
                found.append((at, f"executor {stderr.parent.name}: {line[24:][:300]}"))
    return [text for _, text in sorted(found)[-limit:]]


def replicas_agree(result, handle, task: str = "chain") -> int:
    """Digest equality of both replicas of every partition whose two replicas survived; returns
    how many partitions were compared."""
    tid = next(t.id for t in handle.plan.tasks if t.name == task)
    compared = 0
    for p in range(handle.plan.task(tid).parallelism):
        if any(handle.placement[(tid, p, r)] in handle.master.dead for r in (0, 1)):
            continue
        d0, d1 = (result.per_instance[f"{task}[{p}]r{r}"].state_digest for r in (0, 1))
        assert d0 and d0 == d1, f"{task}[{p}]: replicas diverged"
        compared += 1
    return compared


def replicas_sharing_worker(handle, replica: str) -> int:
    """How many replicas share the worker of ``replica`` (all are lost when its executor dies)."""
    master = handle.master
    w = next(w for (t, p, r), w in master.placement.items() if master.replica_label(t, p, r) == replica)
    return sum(1 for ww in master.placement.values() if ww == w)


def every_partition_restorable(master) -> bool:
    """Every partition's restore point (its safe checkpoint) is held apart from each of its
    replicas: a replica lost now, with its worker, can be restored (``survives_a_loss``)."""
    with master.locked():
        rhino = master.rhino
        return all(rhino.survives_a_loss(inst, master.drained) for inst in rhino.instances())
