"""The driver's side of durable checkpoints (DESIGN §12): when to write a consistent cut, and writing it.

Workers upload the increments their shipping replicas take (``rhino_state.uploader``) and report
each upload.  :class:`CutTracker` (pure) keeps those reports and, given the Rhino manager's
consistent cut (every partition's *safe* checkpoint), says when a new cut can be written: every
partition has a safe checkpoint, each of them is uploaded, the set differs from the last cut
written, and no handover lies between them (each of its participants' checkpoints was taken after
it acted on it: a resume arms no handover again, and plans the next ones from the routing the cut
records).  :class:`DurableCheckpoints` writes such cuts in a thread of its own (the newest one
pending; an older pending one is superseded), then applies retention; the heartbeat handler that
feeds it never waits for the file system.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

from rhino_state.durable import CutPart, DurableCut, DurableStore, lower_order_floor
from rhino_state.keys import RoutingTable
from rhino_state.manager import CompletedCheckpoint
from transport.ids import PartitionId

__all__ = ["CutTracker", "DurableCheckpoints", "ResumePoint", "differences", "parallelism_changes", "plan_shape",
           "rescale_savepoint_dir", "resume_point", "run_lineage", "with_parallelism"]

log = logging.getLogger(__name__)

# At most one cut a second: the consistent cut moves with every checkpoint (several a second), and each
# cut written costs the driver a write and a retention pass (and an object store requests)
CUT_EVERY_S = 1.0


@dataclass
class CutTracker:
    """Uploaded checkpoints per partition, and the last cut handed out (pure: no I/O)."""

    uploads: dict[PartitionId, dict[int, str]] = field(default_factory=dict)  # checkpoint id -> file stem
    last: dict[PartitionId, int] | None = None
    # since when (wall clock) every new consistent cut fell between a handover's participants
    held_since: float | None = None

    def uploaded(self, inst: PartitionId, checkpoint_id: int, file: str) -> None:
        self.uploads.setdefault(inst, {})[checkpoint_id] = file

    def next_cut(self, safe: Mapping[PartitionId, CompletedCheckpoint], instances: Iterable[PartitionId],
                 clean: Callable[[Mapping[PartitionId, int]], bool] | None = None,
                 now: float = 0.0) -> dict[PartitionId, CutPart] | None:
        """The parts of a new cut, or None: a partition without a safe checkpoint, one whose safe
        checkpoint is not uploaded (yet), the same cut as the last one, or (``clean(ids)`` false)
        checkpoints a resume could not go on from as they are (a handover between them)."""
        ids = {}
        for inst in instances:
            cp = safe.get(inst)
            if cp is None or cp.checkpoint_id not in self.uploads.get(inst, {}):
                return None
            ids[inst] = cp.checkpoint_id
        if not ids or ids == self.last:
            return None
        if clean is not None and not clean(ids):
            self.held_since = now if self.held_since is None else self.held_since
            return None
        self.last, self.held_since = ids, None
        for inst, cid in ids.items():  # a cut never moves back: older uploads are never needed again
            self.uploads[inst] = {c: f for c, f in self.uploads[inst].items() if c >= cid}
        return {inst: CutPart(cid, self.uploads[inst][cid], safe[inst].digest, dict(safe[inst].positions),
                              dict(safe[inst].outputs), safe[inst].order_from) for inst, cid in ids.items()}


def plan_shape(plan: Any, mode: str) -> dict[str, Any]:
    """What a resume checks a job against: its tasks (id, kind, parallelism, operators), its channels,
    the key groups and the ordering mode."""
    tasks = {}
    for t in plan.tasks:
        kind = "source" if t.is_source else "keyed" if t.id in plan.routing else "other"
        tasks[t.name] = {"id": t.id, "kind": kind, "parallelism": t.parallelism,
                         "operators": [n.name for n in t.chain]}
    channels = sorted([c.id, c.src_task, c.src_partition, c.dst_task, c.dst_partition] for c in plan.channels)
    return {"tasks": tasks, "channels": channels, "key_groups": plan.num_key_groups, "mode": mode}


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Why a job shaped ``current`` cannot go on from checkpoints of a job shaped ``saved`` (empty:
    it can).  Replication on or off may change: both replicas checkpoint the same state."""
    out = []
    if saved.get("mode") != current["mode"]:
        out.append(f"the checkpoints were taken in mode {saved.get('mode')}, this run is in mode {current['mode']}")
    if saved.get("key_groups") != current["key_groups"]:
        out.append(f"the checkpoints have {saved.get('key_groups')} key groups, this run "
                   f"{current['key_groups']} (spark.replication.state.keyGroups)")
    old, new = saved.get("tasks", {}), current["tasks"]
    out += [f"task {name} of the checkpoints is not in this job (its state would be lost)" for name in old
            if name not in new]
    out += [f"task {name} is not in the checkpoints" for name in new if name not in old]
    for name in (n for n in new if n in old):
        o, n = old[name], new[name]
        if o["parallelism"] != n["parallelism"]:
            out.append(f"task {name}: parallelism {n['parallelism']} here, {o['parallelism']} in the checkpoints "
                       "(to change it, drain with a savepoint and start from that)")
        if o["operators"] != n["operators"]:
            out.append(f"task {name}: operators {n['operators']} here, {o['operators']} in the checkpoints")
        if o["id"] != n["id"] or o["kind"] != n["kind"]:
            out.append(f"task {name}: planned as {n['kind']} task {n['id']} here, {o['kind']} task {o['id']} in "
                       "the checkpoints")
    if not out and saved.get("channels") != current["channels"]:
        out.append("the job's channels differ from the checkpoints' (an edge or a partitioning changed)")
    return out


def parallelism_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, int] | None:
    """When a job differs from its checkpoints only in the parallelism of tasks other than sources
    (the channels follow from it): those tasks and their parallelism in the checkpoints; else None."""
    if saved.get("mode") != current["mode"] or saved.get("key_groups") != current["key_groups"]:
        return None
    old, new = saved.get("tasks", {}), current["tasks"]
    if set(old) != set(new):
        return None
    changed = {}
    for name, n in new.items():
        o = old[name]
        if (o["operators"], o["id"], o["kind"]) != (n["operators"], n["id"], n["kind"]):
            return None
        if o["parallelism"] != n["parallelism"]:
            if n["kind"] == "source":
                return None
            changed[name] = int(o["parallelism"])
    return changed or None


def rescale_savepoint_dir(checkpoint_dir: str, job: str) -> str:
    """Where a resume at another parallelism puts the savepoint it goes through: beside the job's
    checkpoints (an absolute path, or a URI with the checkpoint directory's query)."""
    base, sep, query = checkpoint_dir.partition("?")
    if "://" not in base:
        base = os.path.abspath(base)
    return f"{base.rstrip('/')}/{job}.rescale-savepoint{sep}{query}"


def with_parallelism(job: Any, parallelism: Mapping[str, int]) -> Any:
    """A copy of ``job`` whose tasks named in ``parallelism`` (by their first operator) run at it."""
    copy = deepcopy(job)
    for node in copy.nodes:
        if node.name in parallelism:
            node.parallelism = parallelism[node.name]
    return copy


@dataclass(frozen=True)
class ResumePoint:
    """The cut a run starts from: every partition restores its part of it.  ``parallelism``: the
    tasks whose parallelism the cut has and this run's job does not (the run goes on at the cut's,
    drains into a savepoint, and starts again at its own from there)."""

    uri: str
    cut: DurableCut
    notes: tuple[str, ...] = ()  # what was found on the way (newer cuts skipped, and why)
    parallelism: dict[str, int] = field(default_factory=dict)


# A resumed run's election epochs start this far above the run before's (a ZooKeeper sequence
# number, which the epoch of a run's elections is, stays far below it)
EPOCH_STRIDE = 1 << 32
# How far apart the pulse-window ids of consecutive runs start (a run opens fewer windows than that)
WINDOW_STRIDE = 1 << 32


def run_lineage(resume: ResumePoint | None, run_id: str) -> dict[str, Any]:
    """What a run keeps of the run it resumes: its outputs' ids (the sinks' writers scan for what the
    old run wrote under them), an election epoch base above every epoch its order logs hold, and a
    KaZoo pulse-window base above every window its heartbeat log holds."""
    if resume is None:
        return {"output_prefix": run_id, "epoch_base": 0, "window_base": 0}
    before = resume.cut.run
    return {"output_prefix": before["output_prefix"], "epoch_base": int(before["epoch_base"]) + EPOCH_STRIDE,
            "window_base": int(before.get("window_base", 0)) + WINDOW_STRIDE}


def resume_point(store: DurableStore, shape: Mapping[str, Any], *, ignore: bool,
                 on_event: Callable[[str], None]) -> ResumePoint | None:
    """What a run of the job shaped ``shape`` starts from in ``store``: its newest complete cut, or
    None (no cut; or ``ignore``: every checkpoint of the job is deleted first).  ``ValueError``
    says why the run cannot start: no complete cut among those there, or a job that differs."""
    if ignore:
        if store.cut_numbers() or store.instances():
            on_event(f"durable checkpoints: starting empty (checkpointDir.ignore=true): deleting the checkpoints "
                     f"of job {store.job} in {store.where}")
        store.clear()
        return None
    cut, skipped = store.latest_complete_cut()
    notes = tuple(f"durable checkpoints: cut {number} skipped: {why}" for number, why in skipped)
    for note in notes:
        on_event(note)
    if cut is None:
        if skipped:
            raise ValueError(f"none of the {len(skipped)} cuts in {store.where} for job {store.job} is complete "
                             f"(newest: {skipped[0][1]}); set checkpointDir.ignore=true to start empty")
        store.clear()  # increments no cut names: a run that never completed one
        return None
    problems = differences(cut.plan, shape)
    rescaled = parallelism_changes(cut.plan, shape) if problems else None
    if problems and rescaled is None:
        raise ValueError(f"cut {cut.number} in {store.where} does not fit this job: {'; '.join(problems)}; set "
                         "checkpointDir.ignore=true to start empty")
    resuming = (f"durable checkpoints: resuming from cut {cut.number} of {store.where} (written "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(cut.written_at))})")
    if rescaled:
        resuming += (" at the parallelism it has (" + ", ".join(f"{t} {p}" for t, p in sorted(rescaled.items()))
                     + "), then through a savepoint at this job's")
    on_event(resuming)
    return ResumePoint(store.uri, cut, (*notes, resuming), rescaled or {})


class DurableCheckpoints:
    """Writes the job's consistent cuts to ``store`` as they become complete, keeping ``retain``."""

    def __init__(self, store: DurableStore, *, plan: dict[str, Any], run: dict[str, Any], retain: int,
                 on_event: Callable[[str], None] = lambda text: None) -> None:
        self.store = store
        self.plan, self.run, self.retain = plan, run, retain
        self.on_event = on_event
        self.pulse: Callable[[], int] = lambda: 0  # the heartbeat log's largest pulse, as the driver knows it
        self.on_first_cut: Callable[[], None] | None = None  # called once this run's first cut is written
        self.tracker = CutTracker()
        self.next_number = (max(store.cut_numbers(), default=0)) + 1
        # the lowest checkpoint id of the oldest kept cut (None: the store holds none), as of its
        # last write: a resume may go back that far
        self.oldest_kept: int | None = store.oldest_checkpoint()
        self._floor = store.order_log_floor()  # of the cuts written (KaZoo order logs)
        self.cuts_written = 0
        self.last_written: DurableCut | None = None
        self.last_written_at: float | None = None
        self.write_s = 0.0  # the last cut's write and retention
        self.failures = 0
        self._pending: DurableCut | None = None
        self._writing: DurableCut | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="durable-cuts", daemon=True)
        self._thread.start()

    def uploaded(self, entries: Iterable[tuple[int, int, int, str]]) -> None:
        """Uploads a worker reported: ``(task, partition, checkpoint id, file)``."""
        for t, p, cid, file in entries:
            self.tracker.uploaded((t, p), cid, file)

    def consider(self, safe: Mapping[PartitionId, CompletedCheckpoint], instances: Iterable[PartitionId],
                 sinks: Mapping[tuple[int, int, str], list[int]], routing: Mapping[int, RoutingTable] | None = None,
                 clean: Callable[[Mapping[PartitionId, int]], bool] | None = None,
                 code_versions: Mapping[tuple[int, str], int] | None = None) -> bool:
        """Queue a new cut if the consistent cut moved, is uploaded and (``clean``) lies past every
        handover, with the keyed tasks' ``routing`` its checkpoints route with (a resume plans the
        next handovers from it) and the ``code_versions`` of the operators replaced so far (their
        functions are in the checkpoints); whether one was queued."""
        parts = self.tracker.next_cut(safe, instances, clean, now=time.time())
        if parts is None:
            return False
        committed = {f"{t}-{p}-{kind}": [entry[2], entry[3]] for (t, p, kind), entry in sorted(sinks.items())}
        run = {**self.run, "pulse": self.pulse(),
               "routing": {str(task): table.to_dict() for task, table in sorted((routing or {}).items())},
               "code_versions": [[task, op, version] for (task, op), version in sorted((code_versions or {}).items())]}
        with self._cond:
            cut = DurableCut(self.next_number, self.store.job, parts, self.plan, run, committed, time.time())
            self.next_number += 1
            self._pending = cut
            self._cond.notify_all()
        return True

    def order_log_floor(self) -> dict[PartitionId, int | None]:
        """Per partition, the lowest position of its KaZoo order log a resume reads from, from a
        cut kept, queued or being written (None: a cut that does not say, of an earlier build)."""
        with self._cond:
            floor = dict(self._floor)
            cuts = [cut for cut in (self._pending, self._writing) if cut is not None]
        for cut in cuts:
            lower_order_floor(floor, cut)
        return floor

    def flush(self, timeout: float) -> bool:
        """Wait until the cut queued last is written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and self._writing is None, timeout)

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)

    def status(self) -> dict[str, Any]:
        last = self.last_written
        return {"uri": self.store.where, "cuts_written": self.cuts_written, "failures": self.failures,
                "last_cut": None if last is None else last.number, "last_cut_at": self.last_written_at,
                "last_cut_checkpoints": None if last is None else
                {f"{t}-{p}": part.checkpoint_id for (t, p), part in sorted(last.parts.items())},
                "held_by_handover_since": self.tracker.held_since}

    def _run(self) -> None:
        written_at = -CUT_EVERY_S
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                pause = written_at + CUT_EVERY_S - time.monotonic()
                if pause > 0 and not self._closed:  # a newer cut queued meanwhile supersedes this one
                    self._cond.wait(pause)
                    continue
                cut, self._pending = self._pending, None
                self._writing = cut
            written_at = time.monotonic()
            try:
                self._write(cut)
            finally:
                with self._cond:
                    self._writing = None
                    self._cond.notify_all()

    def _write(self, cut: DurableCut) -> None:
        started = time.monotonic()
        try:
            self.store.write_cut(cut)
            retained = self.store.retain(self.retain)  # the one listing of the cuts per cut written
            self.oldest_kept = self.store.oldest_checkpoint(retained.left)
            floor = self.store.order_log_floor(retained.left)
            with self._cond:
                self._floor = floor
        except Exception as exc:  # noqa: BLE001 - the next cut tries again; the older ones stay valid
            self.failures += 1
            text = f"durable checkpoints: cut {cut.number} not written to {self.store.where}: {exc}"
            log.warning(text)
            self.on_event(text)
            return
        self.cuts_written += 1
        self.last_written, self.last_written_at = cut, time.time()
        if self.cuts_written == 1 and self.on_first_cut is not None:
            self.on_first_cut()
        self.write_s = time.monotonic() - started
        log.info("durable checkpoints: cut %d written (%d partitions) in %.3fs; retention deleted %d cuts, %d files",
                 cut.number, len(cut.parts), self.write_s, retained.cuts, retained.files)
