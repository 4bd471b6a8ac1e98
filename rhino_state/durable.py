"""Durable checkpoints (DESIGN §12): a job's consistent cuts in a file system that outlives the job.

Rhino's copies live on executors; this store keeps them where a job whose driver, or whole
cluster, died finds them again: a local or shared path, or any URI ``pyarrow.fs`` opens
(``s3://``, ``gs://``, ``hdfs://``...).  Layout under ``<root>/<job>/``::

    increments/t{task}-p{partition}/{id:012d}-{token}.inc    an increment's payload, as the backend wrote it
    increments/t{task}-p{partition}/{id:012d}-{token}.json   its meta, the increment it applies to, size, sha256
    cuts/{n:012d}.json                                       a consistent cut, checksummed

The shipping replica of each partition uploads every increment it ships (:mod:`rhino_state.uploader`),
payload first, meta second: an increment without its meta is an unfinished upload.  A delta names
the file it applies to, so a checkpoint's *chain* (its full snapshot, then every delta up to it) is
found by following those names back.  The driver writes a cut once every partition's checkpoint of
the consistent cut is uploaded (``rhino_state.manager``: for every channel, the upstream's output seq
at its checkpoint is at most the downstream's position at its own); the cut is written last, as
one object (a rename on a local file system), so a reader sees it whole or not at all.

Reading verifies everything a resume would use: the cut's own checksum, and for every partition each
file of its chain (present, its size and sha256).  :meth:`DurableStore.latest_complete_cut` takes the
newest cut that passes and reports why each newer one did not.  Retention keeps the newest cuts and
every increment a kept cut's chains, or a later cut's, may still need.

No Spark, no Kafka; pickles only inside the opaque ``runtime`` bytes, as in the increments themselves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pyarrow import fs as pafs

from rhino_state.increments import IncrementMeta
from rhino_state.replica_store import ReplicaStore
from transport.ids import PartitionId

__all__ = ["CUT_FORMAT", "CutPart", "DamagedCheckpointError", "DurableCut", "DurableStore", "UploadedIncrement",
           "file_system", "lower_order_floor", "open_whole", "without_credentials"]

CUT_FORMAT = 2  # 2: values of states with a TTL carry rhino_state.ttl.TTL_MARK
CHUNK = 4 * 1024 * 1024
_INCREMENT_RE = re.compile(r"(\d{12})-([0-9a-f]+)\.json")
_CUT_RE = re.compile(r"(\d{12})\.json")


class Retained(NamedTuple):
    """What :meth:`DurableStore.retain` did: cuts and increment files deleted, and the cuts left."""
    cuts: int
    files: int
    left: list[int]


class DamagedCheckpointError(Exception):
    """A cut or one of the files it needs is missing, partial or does not match its checksum."""


@dataclass(frozen=True)
class UploadedIncrement:
    """An uploaded increment: its meta, the stem of its file, and the stem of the file it applies to."""

    meta: IncrementMeta
    file: str
    previous_file: str | None
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        m = self.meta
        return {"task": m.instance[0], "partition": m.instance[1], "checkpoint_id": m.checkpoint_id,
                "previous_id": m.previous_id, "digest": m.digest, "changed_keys": m.changed_keys,
                "bytes_changed": m.bytes_changed, "bytes_shipped": m.bytes_shipped,
                "runtime": base64.b64encode(m.runtime).decode(), "file": self.file,
                "previous_file": self.previous_file, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> UploadedIncrement:
        meta = IncrementMeta((int(d["task"]), int(d["partition"])), int(d["checkpoint_id"]),
                             None if d["previous_id"] is None else int(d["previous_id"]), d["digest"],
                             int(d["changed_keys"]), int(d["bytes_changed"]), int(d["bytes_shipped"]),
                             base64.b64decode(d["runtime"]))
        return cls(meta, d["file"], d["previous_file"], int(d["size"]), d["sha256"])


@dataclass(frozen=True)
class CutPart:
    """One partition's checkpoint in a cut."""

    checkpoint_id: int
    file: str  # the stem of its increment file
    digest: str
    positions: dict[int, int] = field(default_factory=dict)  # input channel -> next seq it needs
    outputs: dict[int, int] = field(default_factory=dict)  # output channel -> next seq at the checkpoint
    order_from: int | None = None  # KaZoo: where a restore from it reads the order log on (None: not known)


@dataclass(frozen=True)
class DurableCut:
    """A consistent cut of every partition of a job, with what a resume checks it against."""

    number: int
    job: str
    parts: dict[PartitionId, CutPart]
    plan: dict[str, Any] = field(default_factory=dict)  # the job's shape: tasks, parallelism, key groups
    run: dict[str, Any] = field(default_factory=dict)  # what the run's logs were (heartbeat, order topics)
    sinks: dict[str, list[int]] = field(default_factory=dict)  # "task-partition-kind" -> [seq, offset] committed
    written_at: float = 0.0

    def body(self) -> dict[str, Any]:
        return {"format": CUT_FORMAT, "number": self.number, "job": self.job, "written_at": self.written_at,
                "plan": self.plan, "run": self.run, "sinks": self.sinks,
                "parts": {f"{t}-{p}": {"checkpoint_id": c.checkpoint_id, "file": c.file, "digest": c.digest,
                                       "positions": {str(k): v for k, v in sorted(c.positions.items())},
                                       "outputs": {str(k): v for k, v in sorted(c.outputs.items())},
                                       **({} if c.order_from is None else {"order_from": c.order_from})}
                          for (t, p), c in sorted(self.parts.items())}}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> DurableCut:
        if body.get("format") != CUT_FORMAT:
            raise DamagedCheckpointError(f"cut format {body.get('format')!r}, this version reads {CUT_FORMAT}")
        parts = {}
        for name, c in body["parts"].items():
            t, p = (int(x) for x in name.split("-"))
            parts[(t, p)] = CutPart(int(c["checkpoint_id"]), c["file"], c["digest"],
                                    {int(k): int(v) for k, v in c["positions"].items()},
                                    {int(k): int(v) for k, v in c["outputs"].items()},
                                    int(c["order_from"]) if c.get("order_from") is not None else None)
        return cls(int(body["number"]), body["job"], parts, dict(body["plan"]), dict(body["run"]),
                   {k: list(v) for k, v in body["sinks"].items()}, float(body["written_at"]))


def lower_order_floor(floor: dict[PartitionId, int | None], cut: DurableCut) -> None:
    """Lower ``floor`` (partition -> the lowest KaZoo order-log position a resume reads from; None:
    not known) to where a resume from ``cut`` reads."""
    for inst, part in cut.parts.items():
        known = floor.get(inst, part.order_from)
        floor[inst] = None if known is None or part.order_from is None else min(known, part.order_from)


def file_system(where: str) -> tuple[pafs.FileSystem, str]:
    """The file system and path of ``where``: a local path (relative ones taken from the current
    directory) or any URI ``pyarrow.fs`` opens; a URI's query (``?endpoint_override=...``) configures
    the file system, not the path."""
    if "://" not in where:
        where = os.path.abspath(where)
    fs, path = pafs.FileSystem.from_uri(where)
    return fs, path.rstrip("/")


def open_whole(fs: pafs.FileSystem, path: str) -> _Whole:
    """A writable stream whose content stays at ``path`` only if it is written whole (:class:`_Whole`)."""
    return _Whole(fs, path, rename=isinstance(fs, pafs.LocalFileSystem))


def without_credentials(uri: str) -> str:
    """``uri`` with the user and password it may carry (``s3://key:secret@bucket/...``) masked."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1***@", uri)


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _instance_dir(instance: PartitionId) -> str:
    return f"t{instance[0]}-p{instance[1]}"


class DurableStore:
    """One job's durable checkpoints under ``uri`` (a path or a ``pyarrow.fs`` URI)."""

    def __init__(self, uri: str, job: str) -> None:
        if "://" not in uri:
            uri = os.path.abspath(uri)
        self.fs, base = file_system(uri)
        self.uri = uri
        self.job = job
        self.root = f"{base}/{job}"
        self._chain_starts: dict[tuple[PartitionId, str], int] = {}  # files never change: their chain's start
        self._retained: dict[PartitionId, int] = {}  # each partition's floor retention last applied
        self._cuts_read: dict[int, DurableCut] = {}  # the kept cuts, as read (a cut never changes)

    def __repr__(self) -> str:
        return f"DurableStore({self.where!r}, job={self.job!r})"

    @property
    def where(self) -> str:
        """The URI as messages and the status show it: without the credentials it may carry."""
        return without_credentials(self.uri)

    # -- writing ---------------------------------------------------------------------------------
    def upload(self, meta: IncrementMeta, payload: str | os.PathLike[str], previous_file: str | None,
               file: str | None = None) -> UploadedIncrement:
        """Upload one increment (payload, then meta); ``previous_file``: the stem of the file a delta
        applies to (None for a full snapshot).  Returns what was written."""
        if meta.full != (previous_file is None):
            raise ValueError(f"checkpoint {meta.checkpoint_id} of {meta.instance}: a full snapshot has no "
                             "previous file and a delta needs one")
        file = file or self.new_file_name(meta.checkpoint_id)
        directory = f"{self.root}/increments/{_instance_dir(meta.instance)}"
        self.fs.create_dir(directory, recursive=True)
        digest = hashlib.sha256()
        size = 0
        with open(payload, "rb") as src, self._output(f"{directory}/{file}.inc") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        uploaded = UploadedIncrement(meta, file, previous_file, size, digest.hexdigest())
        with self._output(f"{directory}/{file}.json") as out:
            out.write(_canonical(uploaded.to_json()))
        return uploaded

    @staticmethod
    def new_file_name(checkpoint_id: int) -> str:
        return f"{checkpoint_id:012d}-{uuid.uuid4().hex[:12]}"

    def write_cut(self, cut: DurableCut) -> str:
        """Write ``cut`` (its number must be new) as one object; returns its path."""
        body = cut.body()
        body["sha256"] = hashlib.sha256(_canonical(body)).hexdigest()
        self.fs.create_dir(f"{self.root}/cuts", recursive=True)
        path = self.cut_path(cut.number)
        with self._output(path) as out:
            out.write(_canonical(body))
        return path

    def cut_path(self, number: int) -> str:
        """Where cut ``number`` is (or would be) written."""
        return f"{self.root}/cuts/{number:012d}.json"

    def _output(self, path: str) -> _Whole:
        return open_whole(self.fs, path)

    # -- reading ---------------------------------------------------------------------------------
    def cut_numbers(self) -> list[int]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/cuts", allow_not_found=True))
        return sorted(int(m[1]) for i in infos if (m := _CUT_RE.fullmatch(os.path.basename(i.path))))

    def read_cut(self, number: int) -> DurableCut:
        """Cut ``number``, its checksum verified (:class:`DamagedCheckpointError` otherwise)."""
        try:
            body = json.loads(self._read(self.cut_path(number)))
        except (OSError, ValueError) as exc:
            raise DamagedCheckpointError(f"cut {number}: unreadable ({exc})") from None
        if not isinstance(body, dict):
            raise DamagedCheckpointError(f"cut {number}: not a cut")
        claimed = body.pop("sha256", None)
        if claimed != hashlib.sha256(_canonical(body)).hexdigest():
            raise DamagedCheckpointError(f"cut {number}: checksum mismatch")
        try:
            return DurableCut.from_body(body)
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedCheckpointError(f"cut {number}: malformed ({exc})") from None

    def increment(self, instance: PartitionId, file: str) -> UploadedIncrement:
        path = f"{self.root}/increments/{_instance_dir(instance)}/{file}.json"
        try:
            return UploadedIncrement.from_json(json.loads(self._read(path)))
        except FileNotFoundError:
            raise DamagedCheckpointError(f"{_instance_dir(instance)}: increment {file} missing") from None
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise DamagedCheckpointError(f"{_instance_dir(instance)}: increment {file} unreadable ({exc})") from None

    def chain(self, instance: PartitionId, file: str) -> list[UploadedIncrement]:
        """The increments a restore of ``file`` applies, full snapshot first."""
        chain = [self.increment(instance, file)]
        while chain[-1].previous_file is not None:
            chain.append(self.increment(instance, chain[-1].previous_file))
            if len(chain) > 1_000_000:
                raise DamagedCheckpointError(f"{_instance_dir(instance)}: increment chain of {file} loops")
        chain.reverse()
        return chain

    def chain_start(self, instance: PartitionId, file: str) -> int:
        """The checkpoint id of the full snapshot ``file``'s chain starts with (remembered: reading
        one meta per new file, not the whole chain each time)."""
        walked: list[str] = []
        current: str | None = file
        start = None
        while current is not None and (start := self._chain_starts.get((instance, current))) is None:
            inc = self.increment(instance, current)
            walked.append(current)
            if inc.previous_file is None:
                start = inc.meta.checkpoint_id
            current = inc.previous_file
            if len(walked) > 1_000_000:
                raise DamagedCheckpointError(f"{_instance_dir(instance)}: increment chain of {file} loops")
        assert start is not None
        for name in walked:
            self._chain_starts[(instance, name)] = start
        return start

    def verify(self, cut: DurableCut, *, checksums: bool = True) -> int:
        """Check every file ``cut`` needs: present, whole, and (``checksums``) its sha256.  Returns the
        bytes it covers; :class:`DamagedCheckpointError` names the first problem."""
        total = 0
        for inst, part in sorted(cut.parts.items()):
            chain = self.chain(inst, part.file)
            last = chain[-1].meta
            if last.checkpoint_id != part.checkpoint_id or last.digest != part.digest:
                raise DamagedCheckpointError(f"{_instance_dir(inst)}: increment {part.file} is not checkpoint "
                                             f"{part.checkpoint_id} of the cut")
            for inc in chain:
                path = f"{self.root}/increments/{_instance_dir(inst)}/{inc.file}.inc"
                info = self.fs.get_file_info(path)
                if info.type == pafs.FileType.NotFound:
                    raise DamagedCheckpointError(f"{_instance_dir(inst)}: payload {inc.file} missing")
                if info.size != inc.size:
                    raise DamagedCheckpointError(f"{_instance_dir(inst)}: payload {inc.file} has {info.size} "
                                                 f"bytes, {inc.size} were uploaded")
                if checksums and self._sha256(path) != inc.sha256:
                    raise DamagedCheckpointError(f"{_instance_dir(inst)}: payload {inc.file} checksum mismatch")
                total += inc.size
        return total

    def latest_complete_cut(self, *, checksums: bool = True) -> tuple[DurableCut | None, list[tuple[int, str]]]:
        """The newest cut whose every file verifies, and ``(number, why)`` of each newer one skipped."""
        skipped: list[tuple[int, str]] = []
        for number in reversed(self.cut_numbers()):
            try:
                cut = self.read_cut(number)
                self.verify(cut, checksums=checksums)
            except DamagedCheckpointError as exc:
                skipped.append((number, str(exc)))
                continue
            return cut, skipped
        return None, skipped

    def restore(self, instance: PartitionId, file: str, target_dir: str | os.PathLike[str],
                scratch: str | os.PathLike[str] | None = None) -> IncrementMeta:
        """Build the checkpoint ``file`` of ``instance`` at ``target_dir`` (absent or empty): its chain
        downloaded, each increment applied and checked (payload checksum, content digest) as a replica
        group member applies them.  ``RocksDBStateBackend(target_dir)`` opens it."""
        chain = self.chain(instance, file)
        work = Path(tempfile.mkdtemp(prefix="durable-restore-", dir=scratch))
        try:
            store = ReplicaStore(work / "store")
            try:
                for inc in chain:
                    local = work / f"{inc.file}.inc"
                    self._download(f"{self.root}/increments/{_instance_dir(instance)}/{inc.file}.inc", local, inc)
                    store.apply(inc.meta, local)
                    local.unlink()
                last = chain[-1].meta
                store.complete(instance, last.checkpoint_id)
                return store.restore(instance, target_dir, last.checkpoint_id)
            finally:
                store.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _download(self, path: str, local: Path, inc: UploadedIncrement) -> None:
        digest = hashlib.sha256()
        with self.fs.open_input_stream(path) as src, open(local, "wb") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != inc.sha256:
            raise DamagedCheckpointError(f"{path}: checksum mismatch")

    def _read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as src:
            return src.read()

    def _sha256(self, path: str) -> str:
        digest = hashlib.sha256()
        with self.fs.open_input_stream(path) as src:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def clear(self) -> None:
        """Delete every cut and increment of the job."""
        self.fs.delete_dir_contents(self.root, missing_dir_ok=True)

    # -- retention -------------------------------------------------------------------------------
    def oldest_checkpoint(self, numbers: list[int] | None = None) -> int | None:
        """The lowest checkpoint id of any partition in the oldest cut that reads (None: no cut
        reads): nothing a resume from a kept cut restores is older.  ``numbers``: the cuts there
        are, if known (else listed)."""
        for number in self.cut_numbers() if numbers is None else numbers:
            try:
                cut = self._cuts_read.get(number) or self.read_cut(number)
            except DamagedCheckpointError:
                continue
            return min((part.checkpoint_id for part in cut.parts.values()), default=None)
        return None

    def order_log_floor(self, numbers: list[int] | None = None) -> dict[PartitionId, int | None]:
        """Per partition, the lowest order-log position a resume from any cut that reads starts
        from (None where a cut does not say: one of an earlier build).  ``numbers``: the cuts
        there are, if known (else listed)."""
        floor: dict[PartitionId, int | None] = {}
        for number in self.cut_numbers() if numbers is None else numbers:
            try:
                cut = self._cuts_read.get(number) or self.read_cut(number)
            except DamagedCheckpointError:
                continue
            lower_order_floor(floor, cut)
        return floor

    def retain(self, keep: int) -> Retained:
        """Delete all but the newest ``keep`` cuts, and the increments of each partition older than
        the oldest chain a kept cut needs (a later cut's chain starts at or after it: a new chain
        starts with a full snapshot newer than every completed checkpoint).  Returns the cuts and
        files deleted and the cuts left.  A cut that does not read is never the oldest kept one."""
        numbers = self.cut_numbers()
        kept = numbers[-keep:] if keep > 0 else []
        floor: dict[PartitionId, int] = {}
        readable = []
        for number in kept:
            try:
                cut = self._cuts_read.get(number) or self.read_cut(number)
                for inst, part in cut.parts.items():
                    first = self.chain_start(inst, part.file)
                    floor[inst] = min(first, floor.get(inst, first))
                self._cuts_read[number] = cut
                readable.append(number)
            except DamagedCheckpointError:
                continue
        self._cuts_read = {n: c for n, c in self._cuts_read.items() if n in readable}
        if not readable:
            return Retained(0, 0, numbers)  # nothing to keep in its place: delete nothing
        cuts = [n for n in numbers if n < readable[0]]
        for number in cuts:
            self.fs.delete_file(self.cut_path(number))
        files = 0
        for inst, lowest in floor.items():
            if self._retained.get(inst) == lowest:
                continue  # nothing below it was left the last time
            self._retained[inst] = lowest
            self._chain_starts = {k: v for k, v in self._chain_starts.items() if k[0] != inst or v >= lowest}
            directory = f"{self.root}/increments/{_instance_dir(inst)}"
            for info in self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
                name = os.path.basename(info.path)
                m = re.fullmatch(r"(\d{12})-[0-9a-f]+\.(inc|json)", name)
                if m and int(m[1]) < lowest:
                    self.fs.delete_file(info.path)
                    files += 1
        return Retained(len(cuts), files, [n for n in numbers if n >= readable[0]])

    def instances(self) -> list[PartitionId]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/increments", allow_not_found=True))
        out = []
        for i in infos:
            m = re.fullmatch(r"t(\d+)-p(\d+)", os.path.basename(i.path))
            if m:
                out.append((int(m[1]), int(m[2])))
        return sorted(out)

    def uploaded(self, instance: PartitionId) -> list[str]:
        """The stems of ``instance``'s increments whose meta was written, oldest first."""
        directory = f"{self.root}/increments/{_instance_dir(instance)}"
        infos = self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        return sorted(os.path.basename(i.path)[:-5] for i in infos if _INCREMENT_RE.fullmatch(os.path.basename(i.path)))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Whole:
    """Write ``path`` so that what a reader finds there was written whole.

    On a local file system (``rename``): a temporary file beside it, synced to disk and renamed
    when closed without error.  On an object store, which has no rename but makes an object
    visible only once its upload completes: the object itself; when writing fails, what the closed
    stream made visible (pyarrow completes a multipart upload on close, and has no abort) is
    deleted at once.  Readers check sizes and checksums, so even in that moment a partial object
    is never used."""

    def __init__(self, fs: pafs.FileSystem, path: str, rename: bool) -> None:
        self.fs, self.path = fs, path
        self.target = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if rename else path
        self.stream = fs.open_output_stream(self.target)

    def write(self, data: bytes) -> None:
        self.stream.write(data)

    def __enter__(self) -> _Whole:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.stream.close()
            if self.target != self.path:
                _fsync(self.target)  # on the disk before it takes the name: a crash leaves no empty file there
                self.fs.move(self.target, self.path)
            return
        try:
            self.stream.close()
        except OSError:
            pass  # the write failed already: that error is the one raised
        try:
            self.fs.delete_file(self.target)
        except FileNotFoundError:
            pass

