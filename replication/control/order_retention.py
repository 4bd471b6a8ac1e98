"""Which segments of a KaZoo job's order logs no reader can read any more; the driver deletes them.

Every ordered partition has an order log, and every source partition a pulse-window order log,
each a sequence of topics of :data:`kazoo_leader.segments.SEGMENT_ORDERS` records: under load a
job makes a topic every minute or so per ordered partition, and every topic costs a broker (the
embedded one on each idempotent produce and transaction step, docs/embedded-broker.md; a real
cluster its metadata).  Once a second the driver finds, per log, the lowest position still
needed (:func:`order_log_needed_from`), and deletes the segments below that position's less
:data:`transport.segment_retention.KEEP_BEHIND`.  Needed are the positions:

* where each live replica of the partition reads on (``InstanceMetrics.order_log_at``); a replica
  lost or being restored counts by its checkpoints (the one a restore uses is pinned, below), and
  one that has not reported yet, or was just restored, keeps the whole log until it reports;
* with Rhino, where a restore from each checkpoint the driver keeps of the partition reads on
  (``CompletedCheckpoint.order_from``); before the first one completed, the whole log (the
  checkpoints being shipped read it from further back than the replicas);
* with a durable store, where a resume from each cut kept, queued or being written reads on (a
  resumed run goes on in the order logs of the run before).

A checkpoint or cut that does not say (one of an earlier build) keeps the whole log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kazoo_leader.segments import SegmentedLog
from transport.ids import PartitionId
from transport.segment_retention import SegmentRetention

if TYPE_CHECKING:
    from replication.control.master import JobMaster

log = logging.getLogger(__name__)

RETAIN_EVERY_S = 1.0


def order_log_needed_from(master: JobMaster, inst: PartitionId) -> int | None:
    """The lowest position of ``inst``'s order log a replica or a restore may still read; None
    while that is not known (keep the whole log)."""
    t, p = inst
    needed: list[int] = []
    with master.locked():
        for r in range(master.plan.replicas):
            w = master.placement.get((t, p, r))
            if w is None or w in master.dead or (t, p, r) in master.lost:
                continue  # (restored from a checkpoint, below, or never)
            m = master.metrics.get(master.replica_label(t, p, r))
            if m is None or m.order_log_at < 0:
                return None
            needed.append(m.order_log_at)
        if master.rhino is not None:
            kept = master.rhino.kept(inst)
            if not kept or any(cp.order_from is None for cp in kept):
                return None  # (a checkpoint still shipping needs the log from an older position)
            needed += [cp.order_from for cp in kept]
        durable = master.durable
    if durable is not None:
        floor = durable.order_log_floor()
        if inst in floor:
            resumes_from = floor[inst]
            if resumes_from is None:
                return None
            needed.append(resumes_from)
    return min(needed, default=None)


class OrderLogRetention:
    """Deletes, once a second until the job master closes, the segments of ``logs`` no reader can
    read any more; ``delete_topics`` deletes topics without waiting."""

    def __init__(self, master: JobMaster, logs: Mapping[PartitionId, SegmentedLog],
                 delete_topics: Callable[[list[str]], None],
                 needed_from: Callable[[JobMaster, PartitionId], int | None] = order_log_needed_from) -> None:
        self.master = master
        self.logs = dict(logs)
        self._delete_topics = delete_topics
        self._needed_from = needed_from
        self._retention = {inst: SegmentRetention() for inst in self.logs}
        self.deleted = 0  # segments asked to be deleted so far

    def start(self) -> OrderLogRetention:
        threading.Thread(target=self._loop, name="order-log-retention", daemon=True).start()
        return self

    def _loop(self) -> None:
        while not self.master.closed.wait(RETAIN_EVERY_S):
            try:
                self.round()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("the order logs' retention failed a round")

    def round(self) -> None:
        """Delete what no reader of each log can read any more."""
        for inst, order_log in self.logs.items():
            needed = self._needed_from(self.master, inst)
            if needed is None:
                continue
            gone = self._retention[inst].release(order_log.segment_of(needed))
            if gone:
                log.info("order log %s: deleting segments %d to %d (position %d is read on)", order_log.prefix,
                         gone[0], gone[-1], needed)
                self._delete_topics([order_log.topic(n) for n in gone])
                self.deleted += len(gone)
