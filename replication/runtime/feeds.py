"""What a worker's replicas read and elect through, shared by all of them and opened on first use.

One Kafka consumer for every hosted source replica (each reads its partitions through a feed of
it), one reader of the LiveRobin heartbeat log, one reader and writer of the KaZoo order logs and
one ZooKeeper session for the elections.  A replica restored while the worker runs gets a pulse
reader or order log of its own (the shared ones cannot follow a log from a new position once
started).  :meth:`WorkerFeeds.start` starts the shared ones once the worker's replicas are built.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kazoo_leader.election import ElectionClient
from kazoo_leader.order_log import OrderLog
from liverobin.heartbeats import PulseRecord
from liverobin.reader import PulseReader
from replication.config import ReplicationConfig
from transport.kafka_feeds import SharedConsumer
from transport.kafka_io import TopicMaker

log = logging.getLogger(__name__)

# How long the broker may hold an empty fetch of the sources' consumer (unless the job sets
# ``fetch.wait.max.ms``).  Short, so that new records (and a drain's fresh high watermark) are
# seen quickly: the embedded broker answers a waiting fetch only when the wait ends.
SOURCE_FETCH_WAIT_MS = 10


def _idle_fetch(cfg: ReplicationConfig) -> dict[str, Any]:
    """How a worker's long-lived consumers fetch once they find no input (``kafka.idle*``)."""
    return {"idle_fetch_wait_ms": cfg.kafka_idle_fetch_wait_ms, "idle_after_s": cfg.kafka_idle_after_ms / 1000}


def election_identity(worker: int, attempt: int) -> str:
    """What a worker attempt's election nodes hold: the driver evicts a dead worker's nodes by it."""
    return f"w{worker}a{attempt}"


def election_membership(election_root: str, worker: int, attempt: int) -> str:
    """The node whose deletion (the driver declaring the worker dead) bars it from every election."""
    return f"{election_root}/members/{election_identity(worker, attempt)}"


class WorkerFeeds:
    """The shared consumers, logs and ZooKeeper session of worker ``index``'s attempt ``attempt``."""

    def __init__(self, boot: Any, index: int, attempt: int) -> None:
        self.boot, self.cfg, self.plan = boot, boot.cfg, boot.plan
        self.job_name, self.index, self.attempt = boot.job_name, index, attempt
        self._lock = threading.Lock()  # (a standby opens its session while a restore may need it)
        self._started = False
        self._pulse_reader: PulseReader | None = None
        self._source_consumer: SharedConsumer | None = None
        self._own_pulse_readers: list[PulseReader] = []
        self._own_order_logs: list[OrderLog] = []
        self._order_log: OrderLog | None = None
        self._election: ElectionClient | None = None
        self._segments = TopicMaker(self.cfg.kafka_admin_config())  # the order logs' next segments

    def start(self) -> None:
        """Start what the replicas built so far opened; what is opened later starts at once."""
        with self._lock:
            self._started = True
            election = self._election
        if self._pulse_reader is not None:
            self._pulse_reader.start()
        if self._order_log is not None:
            self._order_log.start()
        if election is not None:
            election.start(timeout_s=self.cfg.start_timeout_ms / 1000)

    def close_election(self) -> None:
        if self._election is not None:
            self._election.close()

    def close(self) -> None:
        for reader in [*self._own_pulse_readers, *([self._pulse_reader] if self._pulse_reader else [])]:
            reader.close()
        if self._source_consumer is not None:
            self._source_consumer.close()
        self.close_election()
        for order_log in [*self._own_order_logs, *([self._order_log] if self._order_log else [])]:
            order_log.close()

    def pulse_reader(self) -> PulseReader:
        """The worker's reader of the LiveRobin heartbeat log (shared by its source replicas)."""
        if self._pulse_reader is None:
            assert self.plan.heartbeat_log is not None
            self._pulse_reader = PulseReader(self.plan.heartbeat_log, self.cfg.kafka_consumer_config(
                group_id=f"replication-{self.job_name}-pulses-w{self.index}"), shared=self.source_consumer())
        return self._pulse_reader

    def source_consumer(self) -> SharedConsumer:
        """The worker's one Kafka consumer, shared by the source replicas it hosts (each reads
        its partitions through a feed of it)."""
        if self._source_consumer is None:
            conf = self.cfg.kafka_consumer_config(group_id=f"replication-{self.job_name}-sources-w{self.index}")
            conf.setdefault("fetch.wait.max.ms", SOURCE_FETCH_WAIT_MS)
            self._source_consumer = SharedConsumer(conf, name=f"sources-w{self.index}", **_idle_fetch(self.cfg))
        return self._source_consumer

    def own_pulse_reader(self, after: PulseRecord | None) -> PulseReader:
        """A reader of the heartbeat log for one restored source (it subscribes, then starts it),
        from right after ``after``, the last pulse its checkpoint placed (None: from this run's
        start)."""
        assert self.plan.heartbeat_log is not None
        reader = PulseReader(self.plan.heartbeat_log, self.cfg.kafka_consumer_config(
            group_id=f"replication-{self.job_name}-pulses-w{self.index}-{len(self._own_pulse_readers)}"), after)
        self._own_pulse_readers.append(reader)
        return reader

    def order_log(self) -> OrderLog:
        """The worker's reader and writer of its replicas' KaZoo order logs."""
        if self._order_log is None:
            self._order_log = OrderLog(
                self.cfg.kafka_consumer_config(group_id=f"replication-{self.job_name}-orders-w{self.index}"),
                self.cfg.kafka_producer_config(), self._segments, name=f"w{self.index}",
                rest_after_s=self.cfg.kafka_idle_after_ms / 1000)
        return self._order_log

    def own_order_log(self) -> OrderLog:
        """A reader and writer of one restored replica's order log (register, then start it): the
        worker's shared one cannot follow a log from a new position once started."""
        n = len(self._own_order_logs)
        log_ = OrderLog(self.cfg.kafka_consumer_config(group_id=f"replication-{self.job_name}-orders-w{self.index}-{n}"),
                        self.cfg.kafka_producer_config(), self._segments, name=f"w{self.index}-restored{n}",
                        rest_after_s=self.cfg.kafka_idle_after_ms / 1000)
        self._own_order_logs.append(log_)
        return log_

    def election(self) -> ElectionClient:
        """The worker's ZooKeeper session for its replicas' KaZoo elections (started before them, or
        at once for a replica restored here while the worker runs)."""
        with self._lock:
            if self._election is None:
                assert self.cfg.zookeeper_connect is not None
                assert self.boot.election_root is not None
                client = ElectionClient(
                    self.cfg.zookeeper_connect, self.cfg.kazoo_session_timeout_ms / 1000,
                    identity=election_identity(self.index, self.attempt),
                    membership=election_membership(self.boot.election_root, self.index, self.attempt),
                    digest=self.cfg.zookeeper_digest, epoch_base=self.boot.epoch_base)
                if self._started:
                    client.start(timeout_s=self.cfg.start_timeout_ms / 1000)
                self._election = client
            return self._election

    def open_election(self) -> None:
        """A KaZoo standby's ZooKeeper session, opened before a restore here needs it (a restore
        that comes first opens it itself)."""
        try:
            self.election()
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down for now: the first restore here tries again
            log.warning("worker %d: no ZooKeeper session opened ahead of restores: %s", self.index, exc)
