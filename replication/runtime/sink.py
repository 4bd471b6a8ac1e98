"""The exactly-once sink of replicated jobs (and of checkpointed ones without replication: a
partition restored from a checkpoint takes over as writer like a replica does): the sink
operator over :class:`replication.runtime.exactly_once.ExactlyOnceOutput`, which writes output sink
partition ``p`` to output partition ``p mod N`` (what a reader sees, exactly, is in that
module's docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replication.runtime.exactly_once import ExactlyOnceOutput, WritesExactlyOnce
from replication.runtime.operators import SinkBase


class ExactlyOnceSink(WritesExactlyOnce, SinkBase):
    kind = "out"  # which of the partition's outputs the driver's writer role is for

    def __init__(self, name: str, env: Any, topic: str, serializer: Callable, key_serializer: Callable | None,
                 **record_fns: Callable | None) -> None:
        super().__init__(name, env, topic, serializer, key_serializer, **record_fns)
        metrics = env.metrics

        def role(r: str) -> None:
            metrics.role = r

        def written(now: float, ingest_ts: float) -> None:
            metrics.latency.record(now - ingest_ts)

        def committed(seq: int, offset: int) -> None:
            metrics.sink_committed_seq, metrics.sink_committed_offset = seq, offset

        self.out = ExactlyOnceOutput(name, env.cfg, env.replica, env.sink_id, topic, env.sink_partition(topic),
                                     env.cfg.channel_buffer_timeout_ms / 1000, role, written, committed,
                                     ready_producer=True)
        env.register_sink(self)

    def process(self, rec: tuple) -> None:
        out = self.serialize(rec)
        if out is None:
            return
        value, key, headers, ts = out
        self.env.metrics.records_out += 1
        self.out.append(value, key, [*headers, ("ingest_ts", repr(rec[4]).encode())], rec[4], ts)

    def snapshot(self) -> Any:
        return self.out.checkpoint_state()

    def restore(self, snapshot: Any) -> None:
        self.out.restore_state(snapshot)  # records after it are produced again, with the same seqs

    def on_end(self) -> None:
        self.out.finish(self.env.poll_control)
