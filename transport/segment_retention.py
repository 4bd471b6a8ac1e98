"""Which segments of a log cut into topics no reader can read any more (pure).

The heartbeat log (:mod:`liverobin.segments`) and the KaZoo order logs (:mod:`kazoo_leader.segments`)
are each a sequence of single-partition topics, *segments*, numbered from 0, and every reader
reads forward from a segment on.  Given the first segment some reader or restore may still read,
:class:`SegmentRetention` names the segments below it, less a margin, once each: the driver deletes
them (a broker charges for every topic it keeps, docs/embedded-broker.md).
"""

from __future__ import annotations

__all__ = ["DELETE_PER_ROUND", "KEEP_BEHIND", "SegmentRetention"]

# Segments kept below the lowest one a reader may still read: a margin, not a rule (readers
# never go back), so that no off-by-one of a reader's report deletes what it reads.
KEEP_BEHIND = 2
# The most segments deleted in one round (a resumed run's log may hold thousands before it).
DELETE_PER_ROUND = 200


class SegmentRetention:
    """The segments of one log to delete: those below the first segment still needed, less
    :data:`KEEP_BEHIND`; each named once, at most :data:`DELETE_PER_ROUND` a call."""

    def __init__(self) -> None:
        self.deleted_below = 0  # segments below this one were named for deletion

    def release(self, needed_from: int) -> list[int]:
        """The segments to delete now that no reader reads a segment before ``needed_from``."""
        end = min(needed_from - KEEP_BEHIND, self.deleted_below + DELETE_PER_ROUND)
        gone = list(range(self.deleted_below, end))
        self.deleted_below = max(self.deleted_below, end)
        return gone
