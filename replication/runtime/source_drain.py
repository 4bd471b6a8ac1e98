"""A source replica's drain without pulses (unordered, KaZoo): where it stops reading.

Drained, such a replica reports how far it reads (each Kafka partition's end by a fetch made
after the request, or further if it emitted more) and holds until the driver names where every
replica of its partition ends, the furthest report (the worker's ``drains`` service,
:class:`~replication.runtime.source_stops.DrainStops`, carries both); it reads on to there and
finishes.  A LiveRobin source drains at the final pulse of the heartbeat log instead.
"""

from __future__ import annotations

import time
from typing import Any

from transport.kafka_feeds import PartitionFeed
from transport.kafka_io import end_offsets_by_fetch


def drain_position(next_offset: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
    """How far a source replica reads in a drain without pulses: per Kafka partition, the end a
    fetch told (the high watermark; 0 for an empty partition) or its next offset if it emitted
    more."""
    return {k: max(next_offset.get(k, -1), end) for k, end in ends.items()}


class SourceDrain:
    """One source replica's drain: whether it was asked for, how far the replica reads, and where
    every replica of its partition ends."""

    def __init__(self, cfg: Any, group_id: str, topic: str, kafka_partitions: list[int]) -> None:
        self.cfg = cfg
        self.group_id = group_id  # of the consumer whose fetch tells the partitions' ends
        self.topic = topic
        self.kafka_partitions = kafka_partitions
        self.requested_at: float | None = None
        # how far this replica reads (its partitions' ends when the drain came, or further), for
        # the driver, and where every replica of the partition ends (the furthest report; -1:
        # nothing to read there), set by the worker from the driver's word
        self.position: dict[int, int] | None = None
        self.ends: dict[int, int] | None = None

    def request(self) -> bool:
        """The driver's word to drain; True the first time it comes."""
        if self.requested_at is not None:
            return False
        self.requested_at = time.monotonic()
        return True

    def hold(self, next_offset: dict[int, int]) -> bool:
        """Whether the replica waits for the driver to name the ends: drained, none named yet.
        The first time, find how far it reads (the high watermark in fetch responses; ListOffsets
        is not trusted, DESIGN §10)."""
        if self.ends is not None or self.requested_at is None:
            return False
        if self.position is None:
            conf = self.cfg.kafka_consumer_config(group_id=self.group_id)
            ends = end_offsets_by_fetch(conf, self.topic, self.kafka_partitions, timeout=30.0)
            self.position = drain_position(next_offset, ends)
        return True

    def beyond(self, k: int, offset: int) -> bool:
        """Whether the record at ``offset`` of Kafka partition ``k`` lies where the replicas end or
        past it (not emitted)."""
        ends = self.ends
        return ends is not None and offset >= ends.get(k, -1)

    def done(self, feed: PartitionFeed, next_offset: dict[int, int], start_offsets: dict[int, int]) -> bool:
        """Whether every Kafka partition is read up to where the replicas end (False before the
        driver named it)."""
        ends = self.ends
        if ends is None:
            return False
        for k in self.kafka_partitions:
            end = ends.get(k, -1)
            if end < 0:
                continue  # no replica read anything there
            read = max(next_offset.get(k, -1), feed.position(k), start_offsets.get(k, 0))
            if k not in next_offset:
                read = max(read, feed.low_watermark(k))  # nothing below it exists (an empty partition)
            if read < end:
                return False
        return True

    def progress(self, feed: PartitionFeed, next_offset: dict[int, int]) -> tuple:
        """For the metrics: how far each Kafka partition is read, the position reported and the
        ends named."""
        return ({k: max(next_offset.get(k, -1), feed.position(k)) for k in self.kafka_partitions},
                dict(self.position or {}), dict(self.ends or {}))
