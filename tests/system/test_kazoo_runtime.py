"""KaZoo on real executors, the real ZooKeeper and the real broker.

The job is the order-sensitive hash chain over the union of two topics
(``replication/examples/ordered.py``): each partition of the union task (one channel per
topic) and of the keyed chain task (one channel per union partition) has several input
channels, so each has a leader elected in ZooKeeper writing its order log.  Two
replicas that consumed differently would end in different states and a sink failover would
break the chains in the output; :func:`verify_chains` checks that from the output alone.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import Counter

import pytest

from deploy.topics import list_topics, read_all
from kazoo_leader.orders import Order
from kazoo_leader.segments import SegmentedLog
from ops.chaos import kill_executor, locate, pause_executor, resume_executor
from replication import run
from replication.control import launch
from replication.examples.ordered import build_ordered_job, verify_chains, verify_side_output
from tests.ordered_runs import (
    SIDE_EVERY,
    TIMER_MS,
    feed,
    preproduce,
    read_output,
    replicas_agree,
    rhino_conf,
    source_topics,
    start_under_load,
    wait_until,
)

pytestmark = pytest.mark.integration

KAZOO = {"spark.replication.enabled": "true", "spark.replication.mode": "kazoo",
         "spark.replication.failureTimeout": "2s", "spark.replication.kazoo.sessionTimeout": "1s"}


def _conf(stack, **extra):
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.zookeeper.connect": stack.zookeeper_connect, **KAZOO, **extra}


def _leader_of(handle, partition: str, timeout: float = 30) -> str:
    """The replica name (``chain[0]r1``) that leads ``partition`` per the workers' metrics."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = handle.master.snapshot()
        leaders = [name for name, m in snap.items() if name.startswith(partition + "r") and m.leader]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.1)
    raise AssertionError(f"no single leader of {partition} reported within {timeout}s")


def _order_log(stack, handle, task="chain", partition=0) -> list[Order]:
    """The partition's order log: the first ``per_segment`` records of each segment, up to the
    first segment that is not full."""
    tid = next(t.id for t in handle.plan.tasks if t.name == task)
    log_ = handle.plan.order_logs[(tid, partition)]
    orders: list[Order] = []
    for segment in itertools.count():
        records = read_all(stack.bootstrap_servers, log_.topic(segment))[:log_.per_segment]
        orders += [Order.decode(r.value, offset=log_.position(segment, r.offset)) for r in records]
        if len(records) < log_.per_segment:
            return orders


def _per_key_ids(outputs):
    out: dict[str, list[str]] = {}
    for rec in outputs:
        out.setdefault(rec["key"], []).append(rec["id"])
    return {key: sorted(ids) for key, ids in out.items()}


def test_order_logs_are_per_partition_andreplicas_agree(stack, spark, topic_prefix):
    """Failure-free: every multi-input partition (chain and sink) has its own order log and one
    leader; both replicas of every partition end in the same state; the output is exact."""
    a, b = source_topics(stack, topic_prefix)
    ids = preproduce(stack, a, b, 3000)
    job = build_ordered_job(a, b, f"{topic_prefix}out", name=f"{topic_prefix}kz")
    handle = run(job, spark=spark, conf=_conf(stack))
    result = handle.drain(timeout=300)
    report = verify_chains(read_output(stack, f"{topic_prefix}out"), ids)
    assert report.exact, report
    # the union (channels from source-a and source-b) and the keyed chain (from both union partitions)
    names = {handle.plan.task(t).name for t, _ in handle.plan.order_logs}
    assert names == {"union-2", "chain"} and len(handle.plan.order_logs) == 4
    assert replicas_agree(result, handle) == 2
    for p in (0, 1):
        leaders = [r for r in (0, 1) if result.per_instance[f"chain[{p}]r{r}"].orders_published]
        assert len(leaders) == 1, f"chain[{p}]: one replica orders in a failure-free run"
        orders = _order_log(stack, handle, partition=p)
        assert orders[0].is_fence and len({o.epoch for o in orders}) == 1
        # the log covers every element the partition consumed: its 2 channels' data, watermarks, ENDs
        m = result.per_instance[f"chain[{p}]r0"]
        assert sum(o.size for o in orders) >= m.records_in + 2
    assert result.metrics.gaps == 0


@pytest.mark.parametrize("rhino", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["replicas", "replicas+rhino"])
def test_the_order_log_segments_no_reader_needs_are_deleted_while_the_job_runs(stack, spark, topic_prefix, rhino,
                                                                               monkeypatch):
    """Segments of 100 orders, an order per element (``kazoo.maxBatch`` 1), 600 records a topic
    waiting and a trickle of input throughout (with Rhino it moves the checkpoints, and the oldest
    one a restore may use, on).  Once both replicas, and with Rhino every checkpoint a restore may
    use, read three segments past one, the driver deletes it.  With Rhino an executor is killed
    then, and input follows: its replicas are restored from checkpoints and read their logs on
    from there.  The output is exact, the replicas agree, and the segments left of a log are its
    newest, none missing between."""
    monkeypatch.setattr(launch, "SegmentedLog", functools.partial(SegmentedLog, per_segment=100))
    a, b = source_topics(stack, topic_prefix)
    ids = preproduce(stack, a, b, 600)
    name = f"{topic_prefix}kzseg"
    conf = _conf(stack, **{"spark.replication.kazoo.maxBatch": "1"})
    if rhino:
        conf.update(rhino_conf(stack, "kazoo"))
    handle = run(build_ordered_job(a, b, f"{name}out", name=name), spark=spark, conf=conf)
    handle.wait_started(120)
    chain = next(t.id for t in handle.plan.tasks if t.name == "chain")
    logs = [handle.plan.order_logs[(chain, p)] for p in (0, 1)]

    def segments(log_) -> list[int]:
        return sorted(int(rest) for t in list_topics(stack.bootstrap_servers)
                      if t.startswith(f"{log_.prefix}.") and (rest := t[len(log_.prefix) + 1:]).isdigit())

    fed: list[str] = []
    stop = threading.Event()

    def trickle() -> None:
        first = 400  # (feed's ids after preproduce's)
        while not stop.is_set():
            feed(stack, a, b, fed, rounds=2, per_round=10, first_round=first)
            first += 2

    feeder = threading.Thread(target=trickle, name="trickle")
    feeder.start()
    try:
        wait_until(lambda: any(segments(log_)[:1] >= [2] for log_ in logs), 120, "the first two segments to be "
                   "deleted", detail=lambda: {log_.prefix: segments(log_) for log_ in logs}, poll_s=0.5)
        if rhino:
            kill_executor(locate("chain[0]r0", job=name))
            time.sleep(3)
    finally:
        stop.set()
        feeder.join()
    result = handle.drain(timeout=300)
    assert result.status == "finished", result.failure
    report = verify_chains(read_output(stack, f"{name}out"), ids + fed)
    assert report.exact, report
    assert replicas_agree(result, handle) == 2
    if rhino:
        assert any("chain[0]r0 restored on worker" in text for _, text in result.events), result.events
    for log_, p in zip(logs, (0, 1), strict=True):
        left = segments(log_)
        assert left == list(range(left[0], left[-1] + 1)), left
        read_to = max(result.per_instance[f"chain[{p}]r{r}"].order_log_at for r in (0, 1))
        assert left[-1] >= log_.segment_of(read_to), (left, read_to)


def _run_under_load(stack, spark, name, victim_of=None, fault=kill_executor, timer_ms=None, side_every=None):
    """The ordered job under about 4 s of live input; ``victim_of(handle)`` names the replica whose
    executor gets ``fault`` (SIGKILL) 1.5 s in.  Returns (handle, result, outputs, ids, victim).
    ``timer_ms``: the chain sets event-time timers; ``side_every``: it has a side output."""
    job, handle, ids, feeder = start_under_load(stack, spark, name, _conf(stack), timer_ms, side_every)
    victim = None
    if victim_of is not None:
        time.sleep(1.5)
        victim = victim_of(handle)
        fault(locate(victim, job=job.name))
    feeder.join()
    result = handle.drain(timeout=300)
    outputs = read_output(stack, f"{name}out")
    return handle, result, outputs, ids, victim


def _other(replica: str) -> str:
    return replica[:-1] + ("1" if replica.endswith("0") else "0")


@pytest.mark.parametrize("who", ["leader", "follower"])
def test_executor_kill_of_a_leader_or_follower_is_masked(stack, spark, topic_prefix, who):
    """SIGKILL the executor of chain[0]'s leader (a new leader takes over with a higher epoch and
    orders only what nobody ordered) or of its follower: every chain links up, every event is
    there once, every event-time timer fires once, the side output holds every fifth record of each
    key once, and the surviving replicas of every partition agree."""
    pick = (lambda h: _leader_of(h, "chain[0]")) if who == "leader" else (
        lambda h: _other(_leader_of(h, "chain[0]")))
    name = f"{topic_prefix}kz{who}"
    handle, result, outputs, ids, victim = _run_under_load(stack, spark, name, pick, timer_ms=TIMER_MS,
                                                           side_every=SIDE_EVERY)
    report = verify_chains(outputs, ids, TIMER_MS)
    assert report.exact and report.timers > 0, report
    side = read_output(stack, f"{name}out-side")
    assert side and verify_side_output(side, outputs, SIDE_EVERY) == []
    assert sum("declared dead" in text for _, text in result.events) == 1, result.events
    replicas_agree(result, handle)
    survivor = result.per_instance[_other(victim)]
    orders = _order_log(stack, handle, partition=0)
    epochs = [o.epoch for o in orders if o.is_fence]
    if who == "leader":
        assert len(epochs) >= 2 and epochs == sorted(epochs), epochs
        assert survivor.leader and survivor.order_epoch == epochs[-1] and survivor.first_order_at > 0
    else:
        assert survivor.leader  # the leader was not touched (its own executor did not die)
    assert survivor.finished and result.metrics.gaps == 0


def test_output_equals_the_failure_free_run_per_key(stack, spark, topic_prefix):
    """Same input twice, once with the leader's executor killed: the same events reach every key
    (which interleaving of the two topics a key sees is the leader's choice in each run)."""
    a, b = source_topics(stack, topic_prefix)
    ids = preproduce(stack, a, b, 5000)
    outputs = []
    for attempt, kill in enumerate([False, True]):
        out = f"{topic_prefix}out{attempt}"
        job = build_ordered_job(a, b, out, name=f"{topic_prefix}kz{attempt}")
        handle = run(job, spark=spark, conf=_conf(stack, **{"spark.replication.kazoo.maxBatch": "50"}))
        handle.wait_started(120)
        if kill:
            victim = _leader_of(handle, "chain[1]")
            deadline = time.monotonic() + 60
            while handle.sink_metrics().records_out // 2 < 1000 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert handle.sink_metrics().records_out // 2 < len(ids), "finished before the kill"
            kill_executor(locate(victim, job=job.name))
        handle.drain(timeout=300)
        got = read_output(stack, out)
        report = verify_chains(got, ids)
        assert report.exact, report
        outputs.append(got)
    assert _per_key_ids(outputs[0]) == _per_key_ids(outputs[1])
    assert Counter(r["key"] for r in outputs[0]) == Counter(r["key"] for r in outputs[1])


def test_hung_leader_is_replaced_and_never_orders_again(stack, spark, topic_prefix):
    """SIGSTOP the executor of chain[0]'s leader for 5 s (beyond the session and failure timeouts),
    then SIGCONT it: the other replica leads with a higher epoch meanwhile; the woken worker is
    evicted, and no record of the old epoch counts after the new fence.  Output exact."""
    def hang(target):
        pause_executor(target)
        threading.Timer(5.0, lambda: resume_executor(target)).start()

    handle, result, outputs, ids, victim = _run_under_load(
        stack, spark, f"{topic_prefix}kzhung", lambda h: _leader_of(h, "chain[0]"), fault=hang)
    report = verify_chains(outputs, ids)
    assert report.exact, report
    texts = [t for _, t in result.events]
    assert any("silent for" in t for t in texts), texts  # (its session expired first: nothing to evict)
    survivor = result.per_instance[_other(victim)]
    assert survivor.leader and survivor.finished
    orders = _order_log(stack, handle, partition=0)
    fences = [i for i, o in enumerate(orders) if o.is_fence]
    assert len(fences) >= 2
    # the woken worker re-entered the election behind the new leader: it never led again
    assert orders[fences[-1]].epoch == survivor.order_epoch == max(o.epoch for o in orders)
