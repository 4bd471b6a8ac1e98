"""The handover cuts one replica of a keyed task's partition keeps after its part (Rhino): as an
origin, its cut per target partition; as a target, each origin's cut it received.  They are kept
until the driver says every target's restore point is past the release, for a target replica
restored from an earlier checkpoint (docs/handover.md, "Origins keep their cuts; restored
targets fetch them")."""

from __future__ import annotations

import threading
from collections.abc import Collection

from replication.runtime.handover_cuts import TargetCut, chunk_entries
from rhino_state.cut import CutEntry, cut_digest


class KeptCuts:
    """The cuts a replica keeps for restored replicas to fetch (thread-safe).

    An origin keeps its cut per target partition: a target replica restored from an earlier
    checkpoint (or whose worker did not hold the checkpoint a delta applies to, or whose local
    origin replica failed) fetches it here, as the origin's own checkpoints no longer have it.  A
    target keeps each origin's cut it completed (entries and extras, chunked the first time they
    are asked for): its twin, restored from an earlier checkpoint after every origin replica that
    kept the cut was lost, fetches it here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[int, dict[int, TargetCut]] = {}  # handover id -> target partition -> cut
        # handover id -> origin partition -> cut as received (chunked on the first ask)
        self._received: dict[int, dict[int, tuple[list[CutEntry], dict[str, list]] | TargetCut]] = {}

    def keep(self, handover_id: int, per_target: dict[int, TargetCut]) -> None:
        """Keep this origin's cut of ``handover_id``, per target partition."""
        with self._lock:
            self._kept[handover_id] = per_target

    def kept_cut(self, handover_id: int, target: int) -> TargetCut | None:
        """This origin's kept cut of ``handover_id`` for partition ``target`` (None: not kept)."""
        with self._lock:
            return self._kept.get(handover_id, {}).get(target)

    def add_received(self, handover_id: int, origin: int, entries: list[CutEntry], extras: dict[str, list]) -> None:
        """Keep origin partition ``origin``'s cut of ``handover_id`` as this target completed it."""
        with self._lock:
            self._received.setdefault(handover_id, {})[origin] = (entries, extras)

    def received_cut(self, handover_id: int, origin: int, chunk_bytes: int) -> TargetCut | None:
        """Origin partition ``origin``'s cut of ``handover_id`` as this target received it, chunked
        as the origin chunks it (entries in key order, :func:`chunk_entries`), so that chunks
        fetched here and from an origin replica fit together (None: not received).  Chunked once,
        on the first ask (a fetch asks once per chunk)."""
        with self._lock:
            got = self._received.get(handover_id, {}).get(origin)
        if got is None or isinstance(got, TargetCut):
            return got
        entries = sorted(got[0])
        cut = TargetCut(chunk_entries(entries, chunk_bytes), got[1], cut_digest(entries), len(entries))
        with self._lock:
            received = self._received.get(handover_id)
            if received is not None and received.get(origin) is got:
                received[origin] = cut
        return cut

    def forget(self, still_needed: Collection[int]) -> None:
        """Drop the kept and received cuts of the handovers the driver no longer lists."""
        with self._lock:
            for table in (self._kept, self._received):
                for hid in [h for h in table if h not in still_needed]:
                    del table[hid]
