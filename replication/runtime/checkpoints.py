"""A worker's Rhino checkpoint runtime (DESIGN §6): the I/O around ``rhino_state``'s pieces.

As an *origin*, it turns the checkpoints its replicas take into increments: the shipper replica
of a partition (the driver names it: the lowest live replica) offers them to its replica
group's chain; the other replica only reports its digest (the driver compares the two).  A
replica that takes over shipping from a dead twin starts with a full snapshot.  The shipper
applies each increment to its own store too and reports itself among the holders of what
completes: losing the group's only member then leaves a holder (a source to pull from or copy)
instead of none until the consistent cut reaches a checkpoint a new member received.

As a *replica-group member*, it stores the increments of other partitions in a
:class:`~rhino_state.replica_store.ReplicaStore` (standby copies) and restores a lost replica
from there by hard links.  A worker that holds no copy restores by pulling the checkpoint from a
holder (``rhino_state.fetch``); every holder serves its completed checkpoints so.  A member
likewise pulls a restore point whose only holder runs a replica of its partition, so that
losing that worker does not lose the only copy.

As an *upstream*, it trims its output channels' backups to the positions of the destinations'
safe checkpoints (the consistent cut a rollback restores from, see ``rhino_state.manager``).

A replica rolled back to an older checkpoint regenerates checkpoints that completed before: it
reports their digests (the driver compares them with the originals) but ships nothing until it
is past the latest completed one.

With a durable checkpoint directory, the shipper also hands each increment it ships to an
:class:`~rhino_state.uploader.IncrementUploader` and reports what was uploaded (the driver writes
the consistent cuts, ``replication.durability``).
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from replication.heartbeat_parts import CHECKPOINTS, CheckpointCompleted, CheckpointReport, CheckpointView
from rhino_state.durable import DurableStore, UploadedIncrement
from rhino_state.fetch import CheckpointExporter, fetch_checkpoint
from rhino_state.increments import IncrementMeta
from rhino_state.replica_store import ReplicaStore, ReplicaStoreClosedError
from rhino_state.shipper import ChainShipper
from rhino_state.standby_db import restore_full
from rhino_state.transfer import IncrementService
from rhino_state.uploader import IncrementUploader
from transport import rpc
from transport.ids import PartitionId

log = logging.getLogger(__name__)


class WorkerCheckpoints:
    """A worker's Rhino checkpoints (see the module docstring); its control-plane service reports
    what was taken, completed and uploaded, and applies the driver's Rhino view."""

    name = CHECKPOINTS

    def __init__(self, worker: Any, root: Path, durable: DurableStore | None = None) -> None:
        self.worker = worker
        self.root = root
        self.store = ReplicaStore(root / "store")
        self.service = IncrementService(self.store.apply, root / "spool", security=worker.security)
        self.shipper = ChainShipper(security=worker.security, on_completed=self._on_completed)
        self.exporter = CheckpointExporter(self.store, root / "exports")
        self._lock = threading.Lock()
        self._taken: list[tuple[int, int, int, int, str]] = []  # (task, part, replica, id, digest)
        self._completed: list[CheckpointCompleted] = []
        # a checkpoint in flight (instance, id) -> what the driver learns of it once it completes:
        # input and output positions, and where a restore from it reads the order log on (KaZoo)
        self._positions: dict[tuple[PartitionId, int], tuple[dict[int, int], dict[int, int], int | None]] = {}
        self._full_next: set[PartitionId] = set()  # took over shipping: the next checkpoint is a full one
        self._groups: dict[PartitionId, list[str]] = {}  # the instances this worker ships, and their groups
        self._known_completed: dict[PartitionId, int] = {}
        self._group_view: dict[PartitionId, list[str]] = {}  # every instance's replica group (addresses)
        self.address: str | None = None  # this worker's, named among the holders of what it ships
        self._uploaded: list[tuple[int, int, int, str]] = []  # (task, part, id, file) since the last report
        self.uploader = None if durable is None else IncrementUploader(
            durable, root / "durable-spool", self._on_uploaded, self._on_upload_failed)

    def handlers(self) -> dict[str, Any]:
        return {**self.service.handlers(), **self.shipper.handlers(), **self.exporter.handlers()}

    def start(self, address: str) -> None:
        self.address = address
        self.exporter.start()
        self.service.start(address)
        self.shipper.start(address)

    def close(self) -> None:
        if self.uploader is not None:
            self.uploader.close()
        self.shipper.close()
        self.service.close()
        self.store.close()

    # -- origin ------------------------------------------------------------------------------
    def take(self, inst: Any, checkpoint_id: int, runtime: bytes, positions: Mapping[int, int],
             outputs: Mapping[int, int], order_from: int | None = None) -> tuple[IncrementMeta, bool]:
        """Checkpoint ``inst``'s state now; returns its meta and whether it was handed to the
        shipper (only the shipping replica's are, only while its group has members, and not one
        a rolled-back replica regenerates)."""
        key: PartitionId = (inst.task.id, inst.partition)
        out = self.root / "out" / f"t{key[0]}p{key[1]}"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{checkpoint_id}.inc"
        with self._lock:
            # an empty group takes nothing: no O(state) full snapshot for nobody (the first one
            # after members come back is full)
            regenerated = checkpoint_id <= self._known_completed.get(key, -1)
            shipping = bool(self._groups.get(key)) and not regenerated
            try:
                full = shipping and (key in self._full_next or self.shipper.needs_full(key)
                                     or (self.uploader is not None and self.uploader.wants_full(key)))
            except KeyError:  # the group is being set (or dropped) by the heartbeat thread: next time
                shipping = full = False
            if full:
                self._full_next.discard(key)
        meta = inst.state_backend().checkpoint(checkpoint_id, path, runtime=runtime, full=full)
        with self._lock:
            self._taken.append((*key, inst.replica, checkpoint_id, meta.digest))
            self._positions[(key, checkpoint_id)] = (dict(positions), dict(outputs), order_from)
            if key in self._groups and not shipping and not regenerated:
                self._full_next.add(key)
        if not shipping:  # the twin ships (this one only reports its digest), or nobody to ship to
            path.unlink(missing_ok=True)
            return meta, False
        if self.uploader is not None and not self.uploader.offer(meta, path):
            with self._lock:  # a delta the durable copy cannot chain: the next checkpoint starts a new chain
                self._full_next.add(key)
        self._keep_own(inst.name, meta, path)  # (before offering it: the shipper owns the file then)
        try:
            offered = self.shipper.offer(meta, path)
        except ValueError as exc:  # out of sequence (e.g. just took over shipping): start over
            log.warning("%s: checkpoint %d not shipped (%s): the next one is a full snapshot", inst.name,
                        checkpoint_id, exc)
            offered = False
            with self._lock:
                self._full_next.add(key)
        except KeyError:  # the driver's view just handed shipping to the twin (a restored one ships again)
            log.info("%s: checkpoint %d not shipped: its twin ships now", inst.name, checkpoint_id)
            offered = False
        if not offered:
            path.unlink(missing_ok=True)
        return meta, offered

    def _keep_own(self, name: str, meta: IncrementMeta, path: Path) -> None:
        """Apply an increment this worker ships to its own store (the payload is linked there)."""
        try:
            self.store.apply(meta, path)
        except Exception as exc:  # noqa: BLE001 - only this copy is missing; the next full one restarts it
            log.warning("%s: checkpoint %d not kept here (%s): the next one is a full snapshot", name,
                        meta.checkpoint_id, exc)
            with self._lock:
                self._full_next.add(meta.instance)

    def _holds_own(self, meta: IncrementMeta) -> bool:
        """Mark a completed checkpoint this worker shipped completed in its own store too; whether
        it holds it (it did not if applying it here failed)."""
        if self.address is None:
            return False
        try:
            self.store.complete(meta.instance, meta.checkpoint_id)
        except (ValueError, ReplicaStoreClosedError):
            return False
        return meta.checkpoint_id in self.store.completed_ids(meta.instance)

    def _on_completed(self, meta: IncrementMeta, chain: tuple[str, ...]) -> None:
        """``chain``: the members that hold it (the group may have changed since); this worker too."""
        holders = list(chain) + ([self.address] if self._holds_own(meta) else [])
        with self._lock:
            positions, outputs, order_from = self._positions.pop((meta.instance, meta.checkpoint_id), ({}, {}, None))
            for old in [k for k in self._positions if k[0] == meta.instance and k[1] < meta.checkpoint_id]:
                del self._positions[old]
            self._completed.append(CheckpointCompleted(*meta.instance, meta.checkpoint_id, positions, meta.digest,
                                                       holders, outputs, order_from))

    def _on_uploaded(self, uploaded: UploadedIncrement) -> None:
        with self._lock:
            self._uploaded.append((*uploaded.meta.instance, uploaded.meta.checkpoint_id, uploaded.file))

    def _on_upload_failed(self, key: PartitionId) -> None:
        with self._lock:
            self._full_next.add(key)

    def report(self) -> CheckpointReport | None:
        """Checkpoints taken, completed and uploaded since the last report (for the driver's heartbeat)."""
        with self._lock:
            taken, self._taken = self._taken, []
            completed, self._completed = self._completed, []
            uploaded, self._uploaded = self._uploaded, []
        return CheckpointReport(taken, completed, uploaded) if taken or completed or uploaded else None

    def settle(self, part: CheckpointReport, delivered: bool) -> None:
        """A report the driver did not get (its heartbeat failed) goes with the next one, first."""
        if not delivered:
            with self._lock:
                self._taken[:0] = part.taken
                self._completed[:0] = part.completed
                self._uploaded[:0] = part.durable

    # -- the driver's view ---------------------------------------------------------------------
    def apply(self, view: CheckpointView) -> None:
        """The driver's Rhino view (each heartbeat): where restored replicas run now (the channels
        replay to them), groups, shippers, completed checkpoints, where upstream backups may be
        trimmed to and which snapshots members keep."""
        self.worker.routes.apply_moves(view.moves, self.worker.hosted())
        self._group_view = dict(view.groups)
        completed = view.completed
        for key, inst in list(self.worker.instances.items()):
            if view.shippers.get(key) == inst.replica:
                self._ship(key, view.groups.get(key, []), completed.get(key))
            elif key in self._groups:  # its twin ships again (e.g. restored): stop, or both would
                with self._lock:
                    del self._groups[key]
                self.shipper.remove_instance(key)
            for ch in inst.outputs:
                cut = view.trim.get((ch.spec.dst_task, ch.spec.dst_partition))
                if cut is not None and ch.spec.id in cut:
                    ch.release(cut[ch.spec.id])
        for key, from_id in view.retain.items():
            if self.store.last_applied(key) is not None:
                self.store.retain(key, from_id)
        for key, cid in completed.items():
            if self._known_completed.get(key, -1) >= cid:
                continue
            self._known_completed[key] = cid
            if self.store.last_applied(key) is not None:
                try:
                    self.store.complete(key, cid)
                except Exception as exc:  # noqa: BLE001 - the standby may lag; the next completion fixes it
                    log.debug("complete %s at %d: %s", key, cid, exc)

    def holders(self, key: PartitionId, addresses: Mapping[int, str]) -> list[int]:
        """The workers (of ``addresses``) in ``key``'s replica group: their stores hold its checkpoints."""
        group = set(self._group_view.get(key, ()))
        return [w for w, address in addresses.items() if address in group]

    def _ship(self, key: PartitionId, group: list[str], completed_id: int | None) -> None:
        with self._lock:
            if key not in self._groups:
                # the first shipper, or a takeover from a dead one: what the group holds is a
                # checkpoint this replica's own chain of deltas does not continue
                self._full_next.add(key)
            self._groups[key] = list(group)
        self.shipper.set_group(key, group, completed_id=completed_id)

    # -- member: restore ------------------------------------------------------------------------
    def restore(self, key: PartitionId, target: Path, checkpoint_id: int | None = None) -> IncrementMeta:
        """Materialise the completed checkpoint ``checkpoint_id`` (default: the latest) of ``key``
        at ``target`` (hard links); an older one must be kept for a rollback."""
        if checkpoint_id is not None:
            latest = self.store.latest_completed(key)
            if latest is None or latest.checkpoint_id < checkpoint_id:
                self.store.complete(key, checkpoint_id)
        shutil.rmtree(target, ignore_errors=True)
        return self.store.restore(key, target, checkpoint_id)

    def fetch(self, key: PartitionId, target: Path, checkpoint_id: int, holder: rpc.Peer) -> IncrementMeta:
        """Materialise completed checkpoint ``checkpoint_id`` of ``key``, which this worker does not
        hold, at ``target``: pulled from ``holder`` as a full increment, checked, then built."""
        shutil.rmtree(target, ignore_errors=True)
        return self._pull(key, checkpoint_id, holder, lambda meta, payload: restore_full(meta, payload, target))

    def copy(self, key: PartitionId, checkpoint_id: int, holder: rpc.Peer) -> None:
        """Hold completed checkpoint ``checkpoint_id`` of ``key`` too, pulled from ``holder``: a
        second copy of a restore point whose only other holder runs a replica of ``key``."""
        self._pull(key, checkpoint_id, holder, self.store.import_completed)

    def _pull(self, key: PartitionId, checkpoint_id: int, holder: rpc.Peer,
              use: Callable[[IncrementMeta, Path], None]) -> IncrementMeta:
        """Pull ``checkpoint_id`` of ``key`` from ``holder`` into a file of its own, ``use`` it,
        delete the file."""
        payload = self.root / "fetched" / f"t{key[0]}p{key[1]}-{checkpoint_id}-{uuid.uuid4().hex}.inc"
        payload.parent.mkdir(parents=True, exist_ok=True)
        try:
            meta = fetch_checkpoint(holder, key, checkpoint_id, payload)
            use(meta, payload)
        finally:
            payload.unlink(missing_ok=True)
        return meta
