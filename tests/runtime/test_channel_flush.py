"""An instance with no input left sends what its output channels hold at once, on real executors.

The ordered job runs with the longest buffer timeout there is (10 s per channel, two channels
between source and sink): a few records fed to the running job reach its output topic long before
any batch could be sealed by its timer, in every ordering mode, because each instance that runs
out of input flushes its open batches.  Nothing else seals a batch that is not full.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from deploy.topics import partitions_of, produce
from replication import run
from replication.examples.ordered import build_ordered_job, make_events
from tests.ordered_runs import START_TS, source_topics

pytestmark = pytest.mark.integration

BUFFER_TIMEOUT_S = 10


@pytest.mark.parametrize("mode, replicated", [("unordered", False), ("liverobin", True), ("kazoo", True)])
def test_records_leave_without_waiting_for_the_buffer_timeout(stack, spark, topic_prefix, mode, replicated):
    name = f"{topic_prefix}flush-{mode}-"
    a, b = source_topics(stack, name)
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.enabled": str(replicated).lower(), "spark.replication.mode": mode,
            "spark.replication.channel.bufferTimeout": f"{BUFFER_TIMEOUT_S}s"}
    if mode == "kazoo":
        conf["spark.replication.zookeeper.connect"] = stack.zookeeper_connect
    handle = run(build_ordered_job(a, b, f"{name}out", name=name.rstrip("-")), spark=spark, conf=conf)
    reader = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": f"{name}reader",
                       "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 10})
    try:
        handle.wait_started(120)
        reader.assign([TopicPartition(f"{name}out", k, 0) for k in partitions_of(stack.bootstrap_servers, f"{name}out")])
        events = make_events("a", 10, keys=5, start_ts=START_TS) + make_events("b", 10, keys=5, start_ts=START_TS)
        produce(stack.bootstrap_servers, a, events[:10])
        produce(stack.bootstrap_servers, b, events[10:])
        wanted = {json.loads(v)["id"] for _, v in events}
        # every record crosses two channels whose timers would seal its batch after 10 s each (read
        # uncommitted: an exactly-once sink commits after the buffer timeout as well, so that it does
        # not pay a transaction per input batch; this is about the channels)
        got: set[str] = set()
        deadline = time.monotonic() + BUFFER_TIMEOUT_S * 0.8
        while not wanted <= got:
            assert time.monotonic() < deadline, f"{len(wanted - got)} of 20 records not out within 8 s"
            for msg in reader.consume(100, 0.2):
                if msg.error() is None:
                    got.add(json.loads(msg.value())["id"])
    finally:
        reader.close()
        handle.stop()
