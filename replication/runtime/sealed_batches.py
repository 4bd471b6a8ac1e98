"""Which sealed batches an output channel (:mod:`replication.runtime.channels`) holds: each until
every live destination replica sent it and, with an upstream backup (Rhino, DESIGN §6), until the
destination checkpointed past it, at most ``limit`` batches of backup."""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger(__name__)


class SealedBatches:
    """A channel's sealed batches by first seq, oldest first: the framed payload and element count
    of each.  Not thread-safe: the channel's condition guards it."""

    def __init__(self, channel: int, first_seq: int, retain: bool, limit: int) -> None:
        self._channel = channel  # (for its log)
        self._order: deque[int] = deque()  # first seqs of the batches held
        self._batches: dict[int, tuple[bytes, int]] = {}  # first seq -> (framed payload, count)
        # upstream backup: batches from this seq on are kept for a restored replica (None: off)
        self.retain_from: int | None = first_seq if retain else None
        self.limit = limit
        self.overflows = 0  # trims that gave up the oldest backup to stay within ``limit``

    @property
    def keeps_backup(self) -> bool:
        """Whether it keeps an upstream backup."""
        return self.retain_from is not None

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, first_seq: int) -> bool:
        return first_seq in self._batches

    def __getitem__(self, first_seq: int) -> tuple[bytes, int]:
        return self._batches[first_seq]

    def add(self, first_seq: int, payload: bytes, count: int) -> None:
        """Hold the batch just sealed."""
        self._batches[first_seq] = (payload, count)
        self._order.append(first_seq)

    def clear(self) -> None:
        self._order.clear()
        self._batches.clear()

    def first(self, next_seq: int) -> int:
        """The first seq of the oldest batch held (``next_seq``, the open batch's, if none is)."""
        return self._order[0] if self._order else next_seq

    def start_of(self, seq: int, next_seq: int) -> int | None:
        """The first seq of the held batch that holds ``seq`` (``next_seq`` from the open batch on);
        None: it is no longer held."""
        if seq >= next_seq:
            return next_seq
        held = [s for s in self._order if s <= seq]
        return held[-1] if held else None

    def count_from(self, first_seq: int) -> int:
        """How many held batches start at or after ``first_seq``."""
        return sum(1 for s in self._order if s >= first_seq)

    def release(self, seq: int) -> bool:
        """The destination checkpointed everything below ``seq``: True if the backup may now drop
        more (then :meth:`trim`)."""
        if self.retain_from is None or seq <= self.retain_from:
            return False
        self.retain_from = seq
        return True

    def trim(self, sent: int) -> None:
        """Drop the batches below ``sent`` (every live replica sent them) that the backup does not
        keep; past ``limit`` batches the backup gives up its oldest."""
        low = sent
        if self.retain_from is not None:
            low = min(sent, self.retain_from)
            if len(self._order) > self.limit:  # keep memory bounded: give up the oldest backup
                over = self._order[len(self._order) - self.limit]
                if over > low:
                    self.overflows += 1
                    if self.overflows == 1:
                        log.warning("channel %d: upstream backup beyond %d batches: dropping its oldest "
                                    "(the destination's checkpoints do not complete)", self._channel, self.limit)
                    low = self.retain_from = min(over, sent)
        while self._order and self._order[0] + self._batches[self._order[0]][1] <= low:
            del self._batches[self._order.popleft()]
