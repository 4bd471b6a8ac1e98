"""Replicas cut off by this worker's channels, and those the driver replaces, as a control-plane
service of the worker.

A channel that cannot send to a destination replica (failed sends, too far behind the other
replica) cuts it off by itself and says so (:meth:`CutOffReports.cut_off`); the driver hears of
it with the next heartbeat (:class:`CutOffs`), replaces the replica, and has it stopped wherever
it runs (:class:`Drops`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from replication.heartbeat_parts import CUT_OFFS, CutOffs, Drops
from transport.ids import ReplicaId

log = logging.getLogger(__name__)


class CutOffReports:
    """The cut-offs not reported yet, and the replicas the driver drops."""

    name = CUT_OFFS

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # its hosted replicas
        self._lock = threading.Lock()
        self._cut_offs: dict[ReplicaId, tuple[int, str]] = {}

    def cut_off(self, replica: ReplicaId, worker: int, why: str) -> None:
        """A channel cut ``replica`` (on ``worker``) off by itself (any thread)."""
        with self._lock:
            self._cut_offs[replica] = (worker, why)

    def report(self) -> CutOffs | None:
        with self._lock:
            return CutOffs(dict(self._cut_offs)) if self._cut_offs else None

    def settle(self, part: CutOffs, delivered: bool) -> None:
        if delivered:
            with self._lock:
                for replica in part.replicas:
                    self._cut_offs.pop(replica, None)

    def apply(self, part: Drops) -> None:
        """Stop the replicas the driver replaces (an upstream cut them off: they failed or lagged),
        unless the one hosted here is a later incarnation (restored after that decision)."""
        instances = self.worker.instances
        for (t, p, r), attempt in part.replicas.items():
            inst = instances.get((t, p))
            if inst is None or inst.replica != r or inst.attempt > attempt:
                continue
            log.warning("%s: stopped, the driver replaces it (an upstream cut it off)", inst.name)
            del instances[(t, p)]
            inst.request_stop()
