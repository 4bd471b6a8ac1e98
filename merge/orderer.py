"""The orderer decides which input channel a partition instance consumes next.

One interface, three implementations (DESIGN §5): no ordering (here), KaZoo
(``kazoo_leader``) and LiveRobin (``liverobin``).  The no-ordering baseline serves
batches first come, first served: fast, and only correct for single-input tasks
or order-insensitive operators, because two replicas may interleave differently.
"""

from __future__ import annotations

from typing import Protocol

from merge.queues import InputQueues


class Orderer(Protocol):
    def next_runs(self, timeout: float) -> list[tuple[int, list]]:
        """The next elements to process, as runs ``(channel, elements)`` in consumption order;
        empty if nothing came within ``timeout``."""
        ...


class ArrivalOrderer:
    """First come, first served across channels (the paper's "no ordering")."""

    def __init__(self, queues: InputQueues) -> None:
        self.queues = queues

    def next_runs(self, timeout: float) -> list[tuple[int, list]]:
        item = self.queues.take_any(timeout)
        return [item] if item is not None else []
