"""Handover cuts between workers (docs/handover.md): a worker's end of moving state at runtime.

An origin replica's cut of the moved vnodes goes to every live replica of each target partition
(:func:`rhino_state.cut.plan_delivery`): in process, as the changes since a checkpoint the
target's worker holds (rebuilt there and checked against the origin's digest), or whole.  A
target replica that misses a cut (restored from a checkpoint before the release, or its local
origin replica failed) fetches it from whichever origin replica kept it, or from its own twin.
Network sends and fetches run off the instances' threads.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from replication.handover_orders import HandoverOrder
from replication.messages import Ack, CutChunk, CutRequest, KeptCut
from replication.runtime.handover_cuts import DeltaCut, TargetCut
from rhino_state import CheckpointNotHeldError, moved_key_groups
from rhino_state.cut import Delivery, apply_changes, cut_digest, entry_bytes, plan_delivery
from transport import wire

log = logging.getLogger(__name__)

# A target waiting at its release pulse this long for a cut fetches it from a replica that kept it.
CUT_OVERDUE_S = 0.5
# A target replica fetching a cut no origin replica can give yet asks again this often, doubling up to
# the second figure while none arrives (the origins' workers may be down for seconds).
CUT_RETRY_S = (0.2, 2.0)
# How long a target waits for the checkpoint a cut's changes apply to (its increment may still be
# on its way to this worker) before fetching the whole cut.
BASE_WAIT_S = 1.0


class ReplicaNotHere(LookupError):
    """A handover's state arrived for a partition this worker runs no replica of (now)."""


def _cut_chunks(cut: TargetCut, delta: bool) -> list[list]:
    """What travels of ``cut`` to one target replica: its changes since checkpoint ``cut.base``
    (``delta``, when it has them) or its entries, in chunks."""
    return cut.changes if delta and cut.changes is not None else cut.chunks


def _cut_requests(order: HandoverOrder, origin: int, target: int, cut: TargetCut, delta: bool) -> Iterator[CutChunk]:
    """The ``HandoverState`` calls that carry ``cut`` to one replica of ``target``: its entries in
    chunks, or (``delta``) its changes since checkpoint ``cut.base`` in chunks with the digest and
    count of the entries they must rebuild."""
    delta = delta and cut.changes is not None
    chunks = _cut_chunks(cut, delta)
    for i, chunk in enumerate(chunks):
        rows = wire.pack_rows(chunk)
        yield CutChunk(order.handover_id, order.task, target, origin, i, len(chunks),
                       extras=_pack_extras(cut.extras) if i == 0 else b"",
                       entries=None if delta else rows, changes=rows if delta else None,
                       base=cut.base if delta else None, digest=cut.digest if delta else "",
                       count=cut.entries if delta else 0)


def _pack_extras(extras: dict[str, list]) -> bytes:
    """Operators' in-memory state of moved keys (user keys among it): pickled, as user records are."""
    return pickle.dumps(extras, protocol=5) if any(extras.values()) else b""


def _unpack_extras(data: bytes) -> dict[str, list]:
    return pickle.loads(data) if data else {}

class CutExchange:
    """The cuts a worker's replicas send, serve and fetch.  ``worker`` is the
    :class:`~replication.runtime.worker.Worker` hosting them: its instances, placement, peers."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.plan = worker.plan
        self.cfg = worker.cfg
        self.index = worker.index
        self._lock = threading.Lock()
        self._senders: ThreadPoolExecutor | None = None  # cuts to other workers, off the instances' threads
        self._fetching: set[str] = set()  # target replicas fetching cuts they miss

    def close(self) -> None:
        if self._senders is not None:
            self._senders.shutdown(wait=False, cancel_futures=True)

    def fetch_missing(self, inst: Any) -> None:
        """A replica restored here that misses cuts fetches them in the background."""
        if inst.handovers is None or not inst.handovers.missing_cuts():
            return
        with self._lock:
            self._fetching.add(inst.name)
        threading.Thread(target=self._fetch_cuts, args=(inst,), name=f"fetch-cuts-{inst.name}", daemon=True).start()

    def send(self, order: HandoverOrder, origin: int, per_target: dict[int, TargetCut]) -> int:
        """Deliver origin partition ``origin``'s cut of ``order``'s vnodes to every live replica of
        each target (:func:`rhino_state.cut.plan_delivery`): in process on this worker, the changes
        since the origin's last checkpoint to a worker holding it, nothing to a worker where the
        other origin replica runs (it hands its own cut over there; with Rhino a target that misses
        it fetches a kept cut), the whole cut otherwise.  Network sends run in the background, so
        the origin goes on processing.  Returns the bytes sent over the network."""
        key = (order.task, origin)
        rhino = self.worker.checkpoints is not None
        placement = self.worker.routes.placement()
        origin_workers = {w for (t, p, _), w in placement.items() if (t, p) == key and w not in self.worker.routes.dead_workers}
        targets = [(target, r, placement[(order.task, target, r)])
                   for target in per_target for r in range(self.plan.replicas)]
        holders = set(self.worker.checkpoints.holders(key, self.worker.routes.addresses())) if rhino else set()
        shipped = 0
        for target, _, w in targets:
            cut = per_target[target]
            if w in self.worker.routes.dead_workers:
                continue
            how = plan_delivery(w, self.index, origin_workers, holders, cut.base is not None, rhino)
            if how is Delivery.SKIP:
                continue
            requests = list(_cut_requests(order, origin, target, cut, delta=how is Delivery.DELTA))
            if how is Delivery.LOCAL:
                try:
                    for req in requests:
                        self.receive_chunk(req)
                except ReplicaNotHere as exc:  # lost or replaced meanwhile: restored, it fetches a kept cut
                    log.warning("handover %d: state for %s[%d] not delivered here: %s", order.handover_id,
                                self.plan.task(order.task).name, target, exc)
                continue
            shipped += sum(entry_bytes(chunk) for chunk in _cut_chunks(cut, how is Delivery.DELTA))
            self._pool().submit(self._send_cut, order.handover_id, w, requests)
        return shipped

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._senders is None:
                self._senders = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"handover-send-w{self.index}")
            return self._senders

    def _send_cut(self, hid: int, w: int, requests: list[CutChunk]) -> None:
        try:
            for req in requests:
                if w in self.worker.routes.dead_workers or self.worker.stopping.is_set():
                    return
                self.worker.peer(self.worker.routes.address_of(w)).call("HandoverState", req, Ack, timeout=30)
        except Exception as exc:  # noqa: BLE001 - the other origin replica's copy, or a fetch, carries it
            log.warning("handover %d: state for %s[%d] not delivered to worker %d: %s", hid,
                        self.plan.task(requests[0].task).name, requests[0].partition, w, exc)

    def serve_kept_cut(self, req: CutRequest) -> KeptCut:
        """Chunk ``req.chunk`` of the cut an origin replica here keeps for a target partition
        (Rhino: for a target replica restored from a checkpoint before the release, or one that
        could not rebuild the cut from its copy of the origin's checkpoint)."""
        inst = self.worker.instances.get((req.task, req.origin))
        kept = inst.handovers.kept_cuts.kept_cut(req.handover, req.partition) if inst and inst.handovers else None
        twin = self.worker.instances.get((req.task, req.partition))  # the asking target's twin, if it runs here
        if kept is None and twin is not None and twin.handovers is not None:
            kept = twin.handovers.kept_cuts.received_cut(req.handover, req.origin, self.cfg.handover_chunk_bytes)
        if kept is None or not 0 <= req.chunk < len(kept.chunks):
            return KeptCut(missing=True)
        i = req.chunk
        return KeptCut(entries=wire.pack_rows(kept.chunks[i]), chunks=len(kept.chunks),
                       extras=_pack_extras(kept.extras) if i == 0 else b"")

    def _fetch_cuts(self, inst: Any, blocked_for: float | None = None) -> None:
        """Fetch the origins' cuts a target replica misses from whichever origin replica kept them
        (an origin replica that cuts again after its own restore sends them too), until none is
        missing: a replica restored from a checkpoint before a release, or (``blocked_for``) one
        waiting at its release pulse that long (its local origin replica failed)."""
        assert inst.handovers is not None
        wait, failed = CUT_RETRY_S[0], set()
        try:
            while not (inst.stop_requested.is_set() or self.worker.stopping.is_set()):
                missing = inst.handovers.missing_cuts(blocked_for)
                if not missing:
                    return
                arrived = [self._fetch_cut(inst, hid, origin, failed) for hid, origin in missing]
                time.sleep(wait)
                wait = CUT_RETRY_S[0] if any(arrived) else min(CUT_RETRY_S[1], 2 * wait)
        finally:
            with self._lock:
                self._fetching.discard(inst.name)

    def _fetch_cut(self, inst: Any, hid: int, origin: int, failed: set | None = None) -> bool:
        """One try at the cut of ``hid`` from origin partition ``origin``, from each of its replicas
        in turn, then from the twin of ``inst`` (which keeps the cuts it received: the origin
        replicas that kept it may be lost); whether it arrived.  A worker that failed is logged
        once per cut (``failed``: those logged)."""
        assert inst.handovers is not None
        task = inst.task.id
        sources = [(origin, r) for r in range(self.plan.replicas)]
        sources += [(inst.partition, r) for r in range(self.plan.replicas) if r != inst.replica]
        for partition, r in sources:
            w = self.worker.routes.placement().get((task, partition, r))
            if w is None or w in self.worker.routes.dead_workers or self.worker.routes.address_of(w) is None:
                continue
            try:
                i, chunks = 0, 1
                while i < chunks:
                    req = CutRequest(hid, task, origin, inst.partition, i)
                    reply = (self.serve_kept_cut(req) if w == self.index
                             else self.worker.peer(self.worker.routes.address_of(w)).call("HandoverCut", req, KeptCut, timeout=30))
                    if reply.missing:
                        break
                    chunks = reply.chunks
                    inst.handovers.state_arrived(hid, origin, wire.unpack_rows(reply.entries), i, chunks,
                                                 _unpack_extras(reply.extras))
                    i += 1
                if i and i == chunks:
                    log.warning("%s: fetched the cut of handover %d of %s[%d] from %s[%d] replica %d (%d chunk(s))",
                                inst.name, hid, inst.task.name, origin, inst.task.name, partition, r, chunks)
                    return True
            except Exception as exc:  # noqa: BLE001 - the other origin replica, or the next round
                if failed is None or (hid, origin, w) not in failed:
                    why = exc.code() if callable(getattr(exc, "code", None)) else exc
                    log.warning("%s: fetching the cut of handover %d from worker %d failed: %s (asked again until "
                                "it arrives)", inst.name, hid, w, why)
                    if failed is not None:
                        failed.add((hid, origin, w))
        return False

    def fetch_overdue_cuts(self) -> None:
        """Target replicas waiting at a release pulse for a cut that does not come: fetch it."""
        for inst in self.worker.hosted():
            if inst.handovers is None or not inst.handovers.missing_cuts(CUT_OVERDUE_S):
                continue
            with self._lock:
                if inst.name in self._fetching:
                    continue
                self._fetching.add(inst.name)
            threading.Thread(target=self._fetch_cuts, args=(inst, CUT_OVERDUE_S), name=f"fetch-cuts-{inst.name}",
                             daemon=True).start()

    def receive_chunk(self, req: CutChunk) -> Ack:
        self.worker.wait_ready()
        inst = self.worker.instances.get((req.task, req.partition))
        if inst is None or inst.handovers is None:
            raise ReplicaNotHere(f"worker {self.index} hosts no replica of ({req.task}, {req.partition})")
        extras = _unpack_extras(req.extras)
        if req.changes is None:
            inst.handovers.state_arrived(req.handover, req.origin, wire.unpack_rows(req.entries) if req.entries else [],
                                         req.chunk, req.chunks, extras)
            return Ack()
        assert req.base is not None
        delta = inst.handovers.delta_arrived(req.handover, req.origin, req.base, wire.unpack_rows(req.changes),
                                             req.chunk, req.chunks, req.digest, req.count, extras)
        if delta is not None:
            threading.Thread(target=self._rebuild_cut, args=(inst, delta), name=f"rebuild-cut-{inst.name}",
                             daemon=True).start()
        return Ack()

    def _rebuild_cut(self, inst: Any, delta: DeltaCut) -> None:
        """Rebuild an origin's cut from this worker's copy of its checkpoint ``delta.base`` and the
        changes since (waiting a little for that checkpoint if its increment is still on its way
        here); fetch the whole cut if the copy is not here or the result does not check out."""
        assert inst.handovers is not None and self.worker.checkpoints is not None
        step = inst.handovers.step(delta.handover_id)
        if step is None:
            return
        key = (inst.task.id, delta.origin)
        groups = moved_key_groups(step.order.moves, delta.origin, inst.partition, self.plan.num_key_groups,
                                  inst.handovers.num_vnodes)
        store = self.worker.checkpoints.store
        deadline = time.monotonic() + BASE_WAIT_S
        why = ""
        while not (inst.stop_requested.is_set() or self.worker.stopping.is_set()):
            try:
                base = store.read_key_groups(key, delta.base, groups)
            except CheckpointNotHeldError as exc:
                last = store.last_applied(key)
                if time.monotonic() < deadline and (last is None or last.checkpoint_id < delta.base):
                    time.sleep(0.01)  # its increment is on its way here
                    continue
                why = str(exc)
                break
            entries = apply_changes(base, delta.changes)
            if len(entries) == delta.entries and cut_digest(entries) == delta.digest:
                changed = {(kg, rest) for kg, rest, _ in delta.changes}
                local = entry_bytes(e for e in entries if (e[0], e[1]) not in changed)  # what did not travel
                inst.handovers.cut_rebuilt(delta.handover_id, delta.origin, entries, delta.extras, local)
                return
            why = f"rebuilt {len(entries)} entries, digest {cut_digest(entries)[:12]}, the origin cut " \
                  f"{delta.entries}, digest {delta.digest[:12]}"
            break
        else:
            return
        log.warning("%s: cannot rebuild the cut of handover %d from the checkpoint %d of %s[%d] here (%s): "
                    "fetching it whole", inst.name, delta.handover_id, delta.base, inst.task.name, delta.origin, why)
        while not (inst.stop_requested.is_set() or self.worker.stopping.is_set()) and \
                (delta.handover_id, delta.origin) in inst.handovers.missing_cuts():
            if not self._fetch_cut(inst, delta.handover_id, delta.origin):
                time.sleep(0.2)
