"""Where the driver has source replicas stop, as the worker's control-plane services.

KaZoo pulse windows (:class:`WindowHolds`): the driver's word opens a window; each hosted source
replica holds its records for it and reports where (:class:`Holding`) until pulses are written.
Drains without pulses (:class:`DrainStops`): each drained source replica reports where it stopped
reading (:class:`DrainPositions`) and reads on to where the driver settles every replica of its
partition ends (:class:`DrainEnds`).
"""

from __future__ import annotations

from typing import Any

from replication.heartbeat_parts import (
    DRAINS,
    PULSE_WINDOWS,
    DrainEnds,
    DrainPositions,
    Holding,
    WindowWordPart,
)


def _sources(worker: Any) -> list[Any]:
    return [inst for inst in worker.hosted() if inst.task.is_source]


class WindowHolds:
    """The hosted sources' holds for KaZoo pulse windows."""

    name = PULSE_WINDOWS

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def report(self) -> Holding | None:
        holding = {(inst.task.id, inst.partition, inst.replica): inst.holding for inst in _sources(self.worker)
                   if inst.holding is not None}
        return Holding(holding) if holding else None

    def settle(self, part: Holding, delivered: bool) -> None:
        """(Each report says everything: a lost one is made good by the next.)"""

    def apply(self, part: WindowWordPart) -> None:
        word = tuple(part.word)
        for inst in _sources(self.worker):
            if word != inst.pending_window:
                inst.pending_window = word
                inst.wake()


class DrainStops:
    """Where the hosted sources stopped reading when drained, and where they end."""

    name = DRAINS

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def report(self) -> DrainPositions | None:
        stopped = {(inst.task.id, inst.partition, inst.replica): inst.drain.position for inst in _sources(self.worker)
                   if inst.drain.position is not None and inst.drain.ends is None}
        return DrainPositions(stopped) if stopped else None

    def settle(self, part: DrainPositions, delivered: bool) -> None:
        """(Reported until the driver says where to end.)"""

    def apply(self, part: DrainEnds) -> None:
        for inst in _sources(self.worker):
            if inst.drain.ends is None and (inst.task.id, inst.partition) in part.partitions:
                inst.drain.ends = part.partitions[(inst.task.id, inst.partition)]
                inst.wake()
