"""Bounded input queues of one partition instance, one FIFO per input channel.

Producers (channel receivers) block while the instance holds ``capacity`` batches
in total (or, with ``per_channel``, while their own channel holds ``capacity``):
back-pressure travels to the sender instead of memory growing.  Ordered merges need
the per-channel bound: a merge waiting for one channel must never find that channel
blocked behind a total filled by the others.  The
order in which the instance consumes its channels is the orderer's business
(:mod:`merge.orderer`); the queues keep arrival order so the no-ordering baseline
can serve first come, first served.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable


class QueuesClosed(Exception):
    """Raised to a blocked producer when the queues are closed."""


class InputQueues:
    def __init__(self, channels: Iterable[int], capacity: int, per_channel: bool = False) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.per_channel = per_channel
        self._queues: dict[int, deque[list]] = {c: deque() for c in channels}
        self._arrivals: deque[int] = deque()
        self._size = 0
        self._closed = False
        self._woken = False
        self._cond = threading.Condition()

    @property
    def channels(self) -> list[int]:
        return list(self._queues)

    def put(self, channel: int, elements: list, block: bool = True) -> bool:
        """Append a batch of ``channel``; while full, blocks (or with ``block=False`` returns False
        at once); True once appended; raises QueuesClosed once closed."""
        with self._cond:
            queue = self._queues[channel]
            while (len(queue) if self.per_channel else self._size) >= self.capacity and not self._closed:
                if not block:
                    return False
                self._cond.wait()
            if self._closed:
                raise QueuesClosed()
            queue.append(elements)
            self._arrivals.append(channel)
            self._size += 1
            self._cond.notify_all()
            return True

    def take_any(self, timeout: float | None = None) -> tuple[int, list] | None:
        """The oldest batch of any channel (arrival order), or None after ``timeout`` or a
        :meth:`wake`."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._arrivals or self._closed or self._woken, timeout):
                return None
            self._woken = False
            if not self._arrivals:
                return None
            channel = self._arrivals.popleft()
            batch = self._queues[channel].popleft()
            self._size -= 1
            self._cond.notify_all()
            return channel, batch

    def take_from(self, channel: int, timeout: float | None = None) -> list | None:
        """The oldest batch of ``channel``, or None after ``timeout`` (for ordered merges)."""
        with self._cond:
            queue = self._queues[channel]
            if not self._cond.wait_for(lambda: queue or self._closed, timeout):
                return None
            if not queue:
                return None
            batch = queue.popleft()
            self._arrivals.remove(channel)  # first occurrence is the oldest of this channel
            self._size -= 1
            self._cond.notify_all()
            return batch

    def wait(self, channels: Iterable[int] | None, timeout: float) -> None:
        """Until a batch of one of ``channels`` (None: any) is queued, :meth:`wake` is called or the
        queues close, at most ``timeout``: lets an orderer that also waits for other events (order
        records, leadership) sleep on one condition."""
        with self._cond:
            queues = list(self._queues.values()) if channels is None else [self._queues[c] for c in channels]
            self._cond.wait_for(lambda: self._woken or self._closed or any(queues), timeout)
            self._woken = False

    def wake(self) -> None:
        """Wake the consumer blocked in :meth:`wait` (from any thread); a wake while nobody waits is
        kept for the next :meth:`wait`."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def size(self) -> int:
        with self._cond:
            return self._size

    def close(self) -> None:
        """Wake everybody; later puts raise QueuesClosed, takes return what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
