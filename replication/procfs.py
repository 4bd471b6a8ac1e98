"""Reading processes from ``/proc`` (Linux): command lines, states, parents, process trees.

Used to find the executor JVM above a Python task, to count and signal a job's
processes (the kill tooling), and by the demo's process summary.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` (raises OSError if it is gone)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = f.read()
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def arg(argv: list[str], name: str) -> str | None:
    """The value of option ``name`` in ``argv`` (``--name value`` or ``--name=value``)."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def stat_fields(text: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` text after the command name (which may hold spaces and
    parentheses): ``[0]`` is the state (field 3 of proc(5)), ``[1]`` the parent, ``[6]`` the flags,
    ``[11]`` / ``[12]`` utime / stime."""
    return text.rpartition(")")[2].split()


def stat(pid: int) -> tuple[str, str, int]:
    """``(comm, state, ppid)`` of a process, from ``/proc/<pid>/stat`` (raises OSError if gone)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = stat_fields(data)
    return data.rpartition(")")[0].partition("(")[2], fields[0], int(fields[1])


def state(pid: int) -> str | None:
    """The one-letter process state (R, S, T, Z, ...), None if there is no such process."""
    try:
        return stat(pid)[1]
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True if ``pid`` runs (or is stopped); zombies count as dead."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return state(pid) not in (None, "Z", "X")


def pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def process_tree() -> dict[int, list[int]]:
    """Parent pid -> child pids, for all processes (zombies excluded)."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        try:
            _, st, ppid = stat(pid)
        except (OSError, ValueError, IndexError):
            continue
        if st not in ("Z", "X"):
            children.setdefault(ppid, []).append(pid)
    return children


def descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (not ``root`` itself), parents before children."""
    tree = process_tree()
    out: list[int] = []
    frontier = [root]
    while frontier:
        nxt: list[int] = []
        for pid in frontier:
            for child in sorted(tree.get(pid, ())):
                if child not in out:
                    out.append(child)
                    nxt.append(child)
        frontier = nxt
    return out


def ancestors(pid: int, max_depth: int = 64) -> Iterator[int]:
    """The parent, grandparent, ... of ``pid`` up to (not including) init."""
    cur = pid
    for _ in range(max_depth):
        try:
            cur = stat(cur)[2]
        except (OSError, ValueError, IndexError):
            return
        if cur <= 1:
            return
        yield cur


def is_python(pid: int) -> bool:
    """True if ``pid`` is a Python interpreter (by its name or its executable)."""
    try:
        comm = stat(pid)[0]
    except (OSError, ValueError, IndexError):
        return False
    if comm.startswith("python"):
        return True
    with contextlib.suppress(OSError):
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python"):
            return True
    return False
