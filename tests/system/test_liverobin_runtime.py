"""LiveRobin on real executors, the real broker and the heartbeat log.

The job is order-sensitive (a hash chain per key over the union of two topics, see
``replication/examples/ordered.py``): its chain task has four input channels per partition,
so replicas that interleaved them differently would end in different states and a sink
failover would break the chains in the output.
"""

from __future__ import annotations

import time

import pytest

from deploy.topics import list_topics, read_all
from liverobin.heartbeats import PulseLog, PulseRecord
from ops.chaos import kill_executor, locate
from replication import run
from replication.examples.ordered import build_ordered_job, chain_heads, verify_chains, verify_side_output
from tests.ordered_runs import (
    SIDE_EVERY,
    TIMER_MS,
    preproduce,
    read_output,
    replicas_agree,
    rhino_conf,
    source_topics,
    start_under_load,
    wait_until,
)

pytestmark = pytest.mark.integration

LIVEROBIN = {"spark.replication.enabled": "true", "spark.replication.mode": "liverobin",
             "spark.replication.failureTimeout": "2s"}


def _conf(stack, **extra):
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers, **LIVEROBIN, **extra}


def _sink_written(handle) -> int:
    return handle.sink_metrics().records_out // 2


def test_replicas_agree_and_a_kill_does_not_change_the_output(stack, spark, topic_prefix):
    """Pre-produced input: pulse positions depend on the log alone, so two runs consume in the
    same order.  Run 1 is failure-free; run 2 SIGKILLs the executor of a chain replica mid-run.
    Both runs' outputs are exact chains, both replicas agree, and run 2's output equals run 1's."""
    a, b = source_topics(stack, topic_prefix)
    ids = preproduce(stack, a, b, 6000)

    outputs = []
    for attempt, victim in enumerate([None, "chain[0]r0"]):
        out = f"{topic_prefix}out{attempt}"
        job = build_ordered_job(a, b, out, name=f"{topic_prefix}lr{attempt}")
        handle = run(job, spark=spark, conf=_conf(stack, **{"spark.replication.liverobin.maxPulseStep": "200"}))
        handle.wait_started(120)
        if victim:
            deadline = time.monotonic() + 60
            while _sink_written(handle) < 1500 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _sink_written(handle) < len(ids), "the job finished before the kill: make it longer"
            kill_executor(locate(victim, job=job.name))
        result = handle.drain(timeout=300)
        got = read_output(stack, out)
        report = verify_chains(got, ids)
        assert report.exact, report
        assert replicas_agree(result, handle) >= (2 if victim is None else 1)
        assert result.metrics.gaps == 0
        if victim:
            assert sum("declared dead" in text for _, text in result.events) == 1, result.events
        outputs.append(got)
    key = lambda r: (r["key"], r["n"])  # noqa: E731
    assert sorted(outputs[0], key=key) == sorted(outputs[1], key=key)
    assert chain_heads(outputs[0]) == chain_heads(outputs[1])


@pytest.mark.parametrize("rhino", [False, True], ids=["replicas", "replicas+rhino"])
def test_the_heartbeat_log_segments_no_reader_needs_are_deleted_while_the_job_runs(stack, spark, topic_prefix,
                                                                                   rhino):
    """Input waiting for the job, at most 8 records of a partition between two pulses: the log
    gets a segment of 100 pulses every second or so; once every source replica is three segments
    past one, and with Rhino every source checkpoint a restore may still use, the driver deletes
    it, and the job's output stays exact."""
    a, b = source_topics(stack, topic_prefix)
    ids = preproduce(stack, a, b, 10_000)  # 5,000 a partition: over 600 pulses
    name = f"{topic_prefix}lrseg"
    step = {"spark.replication.liverobin.maxPulseStep": "8"}
    conf = rhino_conf(stack, "liverobin", **step) if rhino else _conf(stack, **step)
    handle = run(build_ordered_job(a, b, f"{name}out", name=name), spark=spark, conf=conf)
    handle.wait_started(120)
    hb = handle.plan.heartbeat_log

    def segments() -> list[int]:
        return sorted(int(t.rsplit(".", 1)[1]) for t in list_topics(stack.bootstrap_servers)
                      if t.startswith(f"{hb.prefix}."))

    wait_until(lambda: segments() and segments()[0] >= 2, 90, "the first two segments to be deleted",
               detail=segments, poll_s=0.5)
    result = handle.drain(timeout=300)
    assert result.status == "finished", result.failure
    report = verify_chains(read_output(stack, f"{name}out"), ids)
    assert report.exact, report
    left = segments()
    assert left == list(range(left[0], left[-1] + 1))  # the newest are all there
    assert left[-1] >= hb.segment_of(handle.pulses.last_h)


@pytest.mark.parametrize("victim", ["chain-sink[0]r0", "source-a[1]r1"], ids=["sink-writer", "source-replica"])
def test_executor_kill_under_live_load_is_masked(stack, spark, topic_prefix, victim):
    """Input produced while the job runs; the executor of a replica dies (with it the other
    replicas it hosts, a sink writer among them): the survivors carry on, a standby sink
    replica takes over writing, and every chain still links up (the replicas agreed); every
    event-time timer fires once, at a point of its key's chain, and the side output holds every
    fifth record of each key once.  How long the kill holds the output is measured by
    ``bench/kill_latency.py``, not bounded here: a wall-clock bound fails on a loaded machine."""
    job, handle, ids, feeder = start_under_load(stack, spark, f"{topic_prefix}lrkill", _conf(stack), TIMER_MS,
                                                SIDE_EVERY)
    time.sleep(1.5)
    kill_executor(locate(victim, job=job.name))
    feeder.join()
    result = handle.drain(timeout=300)
    outputs = read_output(stack, f"{job.name}out")
    report = verify_chains(outputs, ids, TIMER_MS)
    assert report.exact and report.timers > 0, report
    side = read_output(stack, f"{job.name}out-side")
    assert side and verify_side_output(side, outputs, SIDE_EVERY) == []
    assert any("takes over writing" in text for _, text in result.events), result.events
    replicas_agree(result, handle)


def test_generator_kill_and_restart_resumes_without_divergence(stack, spark, topic_prefix):
    """The heartbeat generator dies: sources hold their records (no pulse says where they go),
    then a new generator continues after the largest pulse in the log, a second one runs beside
    it for a while, and the job catches up: exact chains, replicas agree."""
    job, handle, ids, feeder = start_under_load(stack, spark, f"{topic_prefix}lrgen", _conf(stack))
    time.sleep(1.0)
    first = handle.pulse_generators[0]
    assert handle.kill_pulse_generators() == ["g1"]
    last_h = first.pulses.last_h
    time.sleep(1.5)  # pulses in flight land, and the metrics (reported every second) catch up
    stalled_at = _sink_written(handle)
    time.sleep(1.5)
    assert _sink_written(handle) == stalled_at, "records left the sources without a pulse to place them"
    second = handle.start_pulse_generator()
    third = handle.start_pulse_generator()  # two at once: the first record of each h wins
    feeder.join()
    third.kill()
    result = handle.drain(timeout=300)
    report = verify_chains(read_output(stack, f"{job.name}out"), ids)
    assert report.exact, report
    assert replicas_agree(result, handle) == 2
    assert second.pulses.last_h > last_h and second.done
    # the restarted generators continued the numbering (no h went back), every pulse is in the
    # segment of its h, and the log counts up to the final pulse the drain wrote
    log_ = handle.plan.heartbeat_log
    counted = PulseLog()
    for n in range(log_.segment_of(second.pulses.last_h) + 1):
        records = [PulseRecord.decode(r.value) for r in read_all(stack.bootstrap_servers, log_.topic(n))]
        assert {log_.segment_of(r.h) for r in records} == {n}
        for r in records:
            counted.accept(r)
    assert counted.final and counted.last_h == second.pulses.last_h > last_h
