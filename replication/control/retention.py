"""Which part of the LiveRobin heartbeat log is still needed: a segment before the pulse every
live source replica counted, and every restore point (a Rhino checkpoint, the durable store's
oldest cut) starts after, is read by nobody, and the driver deletes it
(:class:`transport.segment_retention.SegmentRetention`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replication.control.master import JobMaster


def log_needed_from(master: JobMaster) -> int | None:
    """LiveRobin: the lowest pulse a source replica counted, or a restore of one (from a Rhino
    checkpoint or the durable store's oldest cut) starts after; None while not every live
    source replica has reported one.  Log segments before that pulse's are read by nobody."""
    with master.locked():
        sources = {t.id for t in master.plan.tasks if t.is_source}
        needed: list[int] = []
        for (t, p, r), w in master.placement.items():
            if t not in sources or w in master.dead or (t, p, r) in master.lost:
                continue  # (a lost replica is restored from a checkpoint, below, or never)
            m = master.metrics.get(master.replica_label(t, p, r))
            if m is None:
                return None
            if not m.finished:
                needed.append(m.pulse)
        if master.rhino is not None:  # a source checkpoint's id is the last pulse it placed
            for inst in master.rhino.instances():
                if inst[0] in sources:
                    kept = master.rhino.retain_from(inst)
                    if kept is None:
                        return None
                    needed.append(kept)
        if master.durable is not None and master.durable.oldest_kept is not None:
            needed.append(master.durable.oldest_kept)
        return min(needed, default=None)
