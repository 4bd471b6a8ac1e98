"""Counters and a mergeable latency histogram, reported by workers to the driver."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class LatencyHistogram:
    """Log-bucketed histogram of seconds (about 4.5% relative resolution), mergeable."""

    buckets: Counter = field(default_factory=Counter)
    count: int = 0
    total: float = 0.0
    max: float = 0.0

    _SCALE = 16  # buckets per factor 2

    def record(self, seconds: float) -> None:
        seconds = max(seconds, 1e-6)
        self.buckets[int(math.floor(math.log2(seconds) * self._SCALE))] += 1
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def merge(self, other: LatencyHistogram) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    def percentile(self, q: float) -> float:
        """Upper edge of the bucket holding the q-quantile (0 < q <= 1); 0 when empty."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= rank:
                return min(2 ** ((b + 1) / self._SCALE), self.max)
        return self.max

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass
class InstanceMetrics:
    """What one partition instance counts.  Plain data: pickled into heartbeats."""

    records_in: int = 0
    records_out: int = 0
    dead_lettered: int = 0
    late_records: int = 0
    dedup_dropped: int = 0
    gaps: int = 0
    queue_batches: int = 0
    watermark: int = 0
    pulse: int = 0  # LiveRobin: the highest pulse this instance has emitted or consumed
    # KaZoo (partitions with an order log): leadership and the log's progress as seen here
    leader: bool = False
    order_epoch: int = -1  # the log's current leader epoch
    orders_accepted: int = 0  # order records applied (fences included)
    orders_published: int = 0  # by this replica, as leader
    elected_at: float = 0.0  # wall time this replica last became leader
    first_order_at: float = 0.0  # wall time the first order of that leadership was read back
    # where this replica reads its order log on (a KaZoo source: its window order log); -1: it reads none
    order_log_at: int = -1
    finished: bool = False
    role: str = ""  # sinks of replicated jobs: writer | standby
    sink_committed_seq: int = -1
    sink_committed_offset: int = -1
    state_digest: str = ""  # of the keyed state when the instance ended (replicas must agree)
    # Rhino: the latest checkpoint this replica took, and the completed one its group holds
    checkpoints_taken: int = 0
    checkpoint_id: int = -1
    checkpoint_digest: str = ""
    checkpoint_ms: float = 0.0  # time the instance thread spent on its latest checkpoint
    checkpoint_bytes_changed: int = 0  # summed over the checkpoints taken
    checkpoint_bytes_shipped: int = 0
    restored_from: int = -1  # the checkpoint this replica was restored from (-1: original)
    # records routed per vnode of each keyed task fed (task id -> counts by vnode): the load a
    # rebalance is planned from (both replicas count the same; not restored with a checkpoint)
    routed: dict[int, list[int]] = field(default_factory=dict)
    # keyed state bytes per vnode, measured on the driver's request: (request id, bytes by vnode)
    vnode_bytes: tuple[int, list[int]] = (0, [])
    savepoint_entries: int = 0  # keyed state entries loaded from a savepoint at the start
    windows_from_log: int = 0  # KaZoo source restored behind pulse windows: those it placed from the log
    # KaZoo source: the pulse window it holds for (-1: none), the highest handled, one announced
    # meanwhile (-1: none), and the records it holds back
    window: tuple[int, int, int] = (-1, 0, -1)
    held_records: int = 0
    # a source in a drain without pulses: where it reads ({Kafka partition: next offset}), where it
    # reported reading to, and where the driver says every replica of the partition ends
    drain: tuple[dict, dict, dict] | None = None
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)


def window_text(m: InstanceMetrics) -> str:
    """A KaZoo source replica's pulse windows, for events and reports; "" for any other."""
    current, handled, pending = m.window
    if current < 0 and pending < 0 and not handled:
        return ""
    where = f"in window {current}" if current >= 0 else "in no window"
    return (f"{where}" + (f" ({pending} announced meanwhile)" if pending >= 0 else "")
            + f", windows up to {handled} handled, {m.held_records} record(s) held")


def drain_text(m: InstanceMetrics) -> str:
    """A source replica in a drain without pulses, for reports; "" for any other."""
    if m.drain is None:
        return ""
    reads, reported, ends = m.drain
    return (f"drain: reads at {reads}, reported {reported or 'nothing yet'}, "
            f"ends at {ends or 'not settled'}")


def aggregate(per_instance: dict) -> InstanceMetrics:
    """Sum instance metrics (watermark: the minimum)."""
    total = InstanceMetrics()
    wms = []
    for m in per_instance.values():
        total.records_in += m.records_in
        total.records_out += m.records_out
        total.dead_lettered += m.dead_lettered
        total.late_records += m.late_records
        total.dedup_dropped += m.dedup_dropped
        total.gaps += m.gaps
        total.queue_batches += m.queue_batches
        total.latency.merge(m.latency)
        wms.append(m.watermark)
    total.watermark = min(wms) if wms else 0
    total.finished = bool(per_instance) and all(m.finished for m in per_instance.values())
    return total
