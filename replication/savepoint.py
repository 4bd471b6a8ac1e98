"""Savepoints: a job stopped at a consistent point keeps its state for its next run, which may run
its keyed tasks at another parallelism (docs/savepoints.md).

Taken by :meth:`replication.control.handle.JobHandle.drain` with ``savepoint=DIR`` (a path every executor
reaches, or a URI ``pyarrow.fs`` opens, as for durable checkpoints): the job drains as
usual (LiveRobin: at a final pulse; KaZoo and unordered: every source reads to the end of a fetch
made after the request), but instead of firing every window at the end, each replica writes what
it holds to ``DIR/<task>/p<partition>-r<replica>.pkl``:

* a source: the next offset of each Kafka partition, its event-time high marks and the watermark
  it emitted;
* a processing replica: its keyed state (every RocksDB entry: key group, key, value), its
  operators' state outside keyed state (watermarks, a window's fire index) and the functions that
  replaced its operators at runtime (cloudpickled).

The driver then checks that every partition of every task wrote one (either replica) and writes
``DIR/_meta.json`` last: a savepoint without it is incomplete.  The meta names the operators replaced
at runtime and their versions.

Restored by a new run with ``spark.replication.restoreFrom=DIR``: checked before anything starts
(:func:`check`), the sources start at the saved offsets, and each partition of a keyed task loads
the entries of the key groups it owns under the new plan, from every old partition's file (key
groups are stable: same key, same group, whatever the parallelism), and the fire-index entries of
its keys.  A new run takes the job's own functions, except from the savepoint a durable resume at
another parallelism goes through, which goes on with the replaced ones as any durable resume does
(:func:`replaced_code`).  No I/O but files here; the runtime calls these functions at the edges.  Every file is
written whole or not at all (a rename on a path, a completed upload on an object store).
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyarrow import fs as pafs

from rhino_state.durable import file_system, open_whole, without_credentials

META = "_meta.json"
FORMAT = 2  # 2: values of states with a TTL carry rhino_state.ttl.TTL_MARK

Where = str | os.PathLike[str]  # a directory: a path, or a pyarrow.fs URI


def canonical(root: Where) -> str:
    """``root`` as the workers and the next run are told it: an absolute path, or the URI itself."""
    root = os.fspath(root)
    return root if "://" in root else os.path.abspath(root)


def _shown(root: Where) -> str:
    """``root`` for messages: without credentials a URI may carry."""
    return without_credentials(os.fspath(root))


def _opened(root: Where) -> tuple[pafs.FileSystem, str]:
    """The file system of ``root`` and the path of ``root`` in it (opened once per call below)."""
    return file_system(os.fspath(root))


def _part(base: str, task: str, partition: int, replica: int) -> str:
    """Where one replica's part lies under the savepoint's directory ``base``."""
    return f"{base}/{task}/p{partition}-r{replica}.pkl"


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.File


def write_replica(root: Where, task: str, partition: int, replica: int, content: Mapping[str, Any]) -> None:
    """Write one replica's part of a savepoint, whole or not at all."""
    fs, base = _opened(root)
    path = _part(base, task, partition, replica)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with open_whole(fs, path) as out:
        pickle.dump(dict(content), out, protocol=5)


def _load(fs: pafs.FileSystem, path: str) -> Any:
    with fs.open_input_stream(path) as f:
        return pickle.load(f)


def read_partition(root: Where, task: str, partition: int, replicas: int = 2) -> dict[str, Any]:
    """One partition's part (the first replica that wrote one)."""
    fs, base = _opened(root)
    for r in range(replicas):
        if _exists(fs, path := _part(base, task, partition, r)):
            return _load(fs, path)
    raise FileNotFoundError(f"savepoint {_shown(root)}: no part of {task}[{partition}]")


def missing_parts(root: Where, tasks: Mapping[str, int], replicas: int) -> list[str]:
    """The ``task[partition]`` of which no replica wrote its part."""
    fs, base = _opened(root)
    return [f"{task}[{p}]" for task, n in sorted(tasks.items()) for p in range(n)
            if not any(_exists(fs, _part(base, task, p, r)) for r in range(replicas))]


def write_meta(root: Where, *, job: str, num_key_groups: int, tasks: Mapping[str, int],
               sources: Iterable[str], keyed: Iterable[str],
               code_versions: Mapping[tuple[str, str], int] | None = None) -> None:
    """Mark the savepoint complete: written last, once every part is there.  ``code_versions``:
    (task, operator) -> the version its function was replaced to at runtime."""
    meta = {"format": FORMAT, "job": job, "num_key_groups": num_key_groups, "tasks": dict(tasks),
            "sources": sorted(sources), "keyed": sorted(keyed), "created": time.time(),
            "code_versions": [[task, op, v] for (task, op), v in sorted((code_versions or {}).items())]}
    fs, base = _opened(root)
    with open_whole(fs, f"{base}/{META}") as out:
        out.write(json.dumps(meta, indent=1).encode())


def is_complete(root: Where) -> bool:
    """Whether ``root`` holds a complete savepoint (its meta was written)."""
    fs, base = _opened(root)
    return _exists(fs, f"{base}/{META}")


def holds_anything(root: Where) -> bool:
    """Whether anything lies under ``root`` (a savepoint, complete or not)."""
    fs, base = _opened(root)
    return bool(fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)))


def prepare(root: Where) -> None:
    """Create the directory a savepoint is about to be written to."""
    fs, base = _opened(root)
    fs.create_dir(base, recursive=True)


def delete(root: Where) -> None:
    """Delete a savepoint (nothing if there is none)."""
    fs, base = _opened(root)
    fs.delete_dir_contents(base, missing_dir_ok=True)
    try:
        fs.delete_dir(base)
    except (FileNotFoundError, OSError):
        pass  # an object store has no directory left to delete


def read_meta(root: Where) -> dict[str, Any]:
    fs, base = _opened(root)
    if not _exists(fs, path := f"{base}/{META}"):
        raise FileNotFoundError(f"{_shown(root)} holds no complete savepoint (no {META}: the drain that wrote it did "
                                "not finish, or this is not a savepoint directory)")
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


def check(root: Where, meta: Mapping[str, Any], *, num_key_groups: int, tasks: Mapping[str, tuple[str, int]],
          key: str) -> list[str]:
    """Why the savepoint at ``root`` cannot restore a plan with ``tasks`` (name -> (kind, parallelism),
    kind ``source``, ``keyed`` or ``other``); empty when it can.  ``key`` names the config key."""
    root = _shown(root)
    problems = []
    if meta.get("format") != FORMAT:
        problems.append(f"{key}={root}: savepoint format {meta.get('format')!r}, this version reads {FORMAT}")
    if meta["num_key_groups"] != num_key_groups:
        problems.append(f"spark.replication.state.keyGroups={num_key_groups} but the savepoint at {root} has "
                        f"{meta['num_key_groups']} key groups (they must be equal: keys are placed by key group)")
    for name in meta["sources"]:
        kind, n = tasks.get(name, (None, 0))
        if kind != "source":
            problems.append(f"{key}={root}: the savepoint has source {name!r}, the job has no source of that name")
        elif n != meta["tasks"][name]:
            problems.append(f"{key}={root}: source {name!r} had {meta['tasks'][name]} partitions, now {n} (its "
                            "topic's partition count must not change)")
    for name in meta["keyed"]:
        if tasks.get(name, (None, 0))[0] != "keyed":
            problems.append(f"{key}={root}: the savepoint has state of keyed task {name!r}, the job has no keyed "
                            "task of that name (its state would be lost)")
    return problems


def source_offsets(root: Where, task: str, partitions: int, replicas: int = 2) -> dict[int, int]:
    """The next offset of every Kafka partition a source's partitions read: the furthest of its
    replicas (without LiveRobin's final pulse they may end a few records apart; the downstream
    consumed the longer sequence, its copies deduplicated)."""
    fs, base = _opened(root)
    out: dict[int, int] = {}
    for p in range(partitions):
        for r in range(replicas):
            if _exists(fs, path := _part(base, task, p, r)):
                for k, offset in _load(fs, path)["offsets"].items():
                    out[k] = max(offset, out.get(k, offset))
    return out


def keyed_entries(root: Where, task: str, old_partitions: int,
                  owns: Callable[[int], bool]) -> tuple[list[tuple[int, bytes, bytes]], dict[str, list], dict[str, bytes]]:
    """Every old partition's entries of the key groups ``owns`` accepts, per operator the old
    partitions' operator state (each old partition's snapshot, in partition order), and the
    functions that replaced operators at runtime (operator -> cloudpickled function)."""
    entries: list[tuple[int, bytes, bytes]] = []
    operators: dict[str, list] = {}
    code: dict[str, bytes] = {}
    for p in range(old_partitions):
        part = read_partition(root, task, p)
        entries += [e for e in part["entries"] if owns(e[0])]
        for name, snapshot in part["operators"].items():
            operators.setdefault(name, []).append(snapshot)
        code.update(part.get("code", {}))  # the same in every partition: all switch at one pulse
    return entries, operators, code


def replaced_code(root: Where, meta: Mapping[str, Any], task: str) -> dict[str, bytes]:
    """The functions that replaced operators of ``task``, a task without keyed state, at runtime
    (operator -> cloudpickled function; a keyed task's come with :func:`keyed_entries`): from its
    first partition's part, as every partition switched at the same pulse; empty when the meta
    names none of ``task``'s operators."""
    if not any(name == task for name, _, _ in meta.get("code_versions", [])):
        return {}
    return dict(read_partition(root, task, 0).get("code", {}))
