"""Savepoints: a job stopped at a consistent point keeps its state for its next run, which may run
its keyed tasks at another parallelism (docs/savepoints.md).

Taken by :meth:`replication.driver.JobHandle.drain` with ``savepoint=DIR``: the job drains as
usual (LiveRobin: at a final pulse; KaZoo and unordered: every source reads to the end of a fetch
made after the request), but instead of firing every window at the end, each replica writes what
it holds to ``DIR/<task>/p<partition>-r<replica>.pkl``:

* a source: the next offset of each Kafka partition, its event-time high marks and the watermark
  it emitted;
* a processing replica: its keyed state (every RocksDB entry: key group, key, value) and its
  operators' state outside keyed state (watermarks, a window's fire index).

The driver then checks that every partition of every task wrote one (either replica) and writes
``DIR/_meta.json`` last: a savepoint without it is incomplete.

Restored by a new run with ``spark.replication.restoreFrom=DIR``: checked before anything starts
(:func:`check`), the sources start at the saved offsets, and each partition of a keyed task loads
the entries of the key groups it owns under the new plan, from every old partition's file (key
groups are stable: same key, same group, whatever the parallelism), and the fire-index entries of
its keys.  No I/O but files here; the runtime calls these functions at the edges.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

META = "_meta.json"
FORMAT = 1


def replica_file(root: str | os.PathLike[str], task: str, partition: int, replica: int) -> Path:
    return Path(root) / task / f"p{partition}-r{replica}.pkl"


def write_replica(root: str | os.PathLike[str], task: str, partition: int, replica: int,
                  content: Mapping[str, Any]) -> Path:
    """Write one replica's part of a savepoint atomically (temp file, then rename)."""
    path = replica_file(root, task, partition, replica)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        pickle.dump(dict(content), f, protocol=5)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_partition(root: str | os.PathLike[str], task: str, partition: int, replicas: int = 2) -> dict[str, Any]:
    """One partition's part (the first replica that wrote one)."""
    for r in range(replicas):
        path = replica_file(root, task, partition, r)
        if path.exists():
            with open(path, "rb") as f:
                return pickle.load(f)
    raise FileNotFoundError(f"savepoint {root}: no part of {task}[{partition}]")


def missing_parts(root: str | os.PathLike[str], tasks: Mapping[str, int], replicas: int) -> list[str]:
    """The ``task[partition]`` of which no replica wrote its part."""
    return [f"{task}[{p}]" for task, n in sorted(tasks.items()) for p in range(n)
            if not any(replica_file(root, task, p, r).exists() for r in range(replicas))]


def write_meta(root: str | os.PathLike[str], *, job: str, num_key_groups: int, tasks: Mapping[str, int],
               sources: Iterable[str], keyed: Iterable[str]) -> Path:
    """Mark the savepoint complete: written last, once every part is there."""
    meta = {"format": FORMAT, "job": job, "num_key_groups": num_key_groups, "tasks": dict(tasks),
            "sources": sorted(sources), "keyed": sorted(keyed), "created": time.time()}
    path = Path(root) / META
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, path)
    return path


def read_meta(root: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(root) / META
    if not path.exists():
        raise FileNotFoundError(f"{root} holds no complete savepoint (no {META}: the drain that wrote it did not "
                                "finish, or this is not a savepoint directory)")
    return json.loads(path.read_text())


def check(root: str, meta: Mapping[str, Any], *, num_key_groups: int, tasks: Mapping[str, tuple[str, int]],
          key: str) -> list[str]:
    """Why the savepoint at ``root`` cannot restore a plan with ``tasks`` (name -> (kind, parallelism),
    kind ``source``, ``keyed`` or ``other``); empty when it can.  ``key`` names the config key."""
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


def source_offsets(root: str | os.PathLike[str], task: str, partitions: int, replicas: int = 2) -> dict[int, int]:
    """The next offset of every Kafka partition a source's partitions read: the furthest of its
    replicas (without LiveRobin's final pulse they may end a few records apart; the downstream
    consumed the longer sequence, its copies deduplicated)."""
    out: dict[int, int] = {}
    for p in range(partitions):
        for r in range(replicas):
            path = replica_file(root, task, p, r)
            if path.exists():
                with open(path, "rb") as f:
                    for k, offset in pickle.load(f)["offsets"].items():
                        out[k] = max(offset, out.get(k, offset))
    return out


def keyed_entries(root: str | os.PathLike[str], task: str, old_partitions: int,
                  owns: Callable[[int], bool]) -> tuple[list[tuple[int, bytes, bytes]], dict[str, list]]:
    """Every old partition's entries of the key groups ``owns`` accepts, and per operator the
    old partitions' operator state (each old partition's snapshot, in partition order)."""
    entries: list[tuple[int, bytes, bytes]] = []
    operators: dict[str, list] = {}
    for p in range(old_partitions):
        part = read_partition(root, task, p)
        entries += [e for e in part["entries"] if owns(e[0])]
        for name, snapshot in part["operators"].items():
            operators.setdefault(name, []).append(snapshot)
    return entries, operators
