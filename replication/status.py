"""The per-job status file the driver publishes for tooling (``replication replicas``/``kill``).

One JSON file per running job, at :func:`status_path`::

    {"job": "fraud-monitor", "app_id": "app-...-0000", "driver_pid": 123, "updated": 1795292584.1,
     "state": "running",
     "workers": {"0": {"executor": "1", "address": "127.0.0.1:4567", "python_pid": 2345,
                       "attempt": 0, "alive": true}},
     "replicas": {"fraud-rule[0]r1": {"task": 3, "partition": 0, "replica": 1, "worker": 1}}}

``state`` is ``running``, ``finished``, ``stopped`` or ``failed``. A worker
entry is missing until that worker registered; ``alive`` turns false once
the driver declared it dead. Writes are atomic (temp file + ``os.replace``),
so a reader never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

#: environment variable overriding the directory of status files
STATUS_DIR_ENV = "REPLICATION_STATUS_DIR"

#: the values of ``state``
STATES = ("running", "finished", "stopped", "failed")


def status_dir() -> Path:
    """The directory holding the status files: ``$REPLICATION_STATUS_DIR`` or ``<tmp>/replication-jobs``."""
    return Path(os.environ.get(STATUS_DIR_ENV) or Path(tempfile.gettempdir()) / "replication-jobs")


def _check_name(job_name: str) -> str:
    if not isinstance(job_name, str) or not job_name or job_name in (".", "..") or any(
        c in job_name for c in "/\\\0"
    ):
        raise ValueError(f"invalid job name for a status file: {job_name!r}")
    return job_name


def status_path(job_name: str) -> Path:
    """Where the status file of ``job_name`` lives."""
    return status_dir() / f"{_check_name(job_name)}.json"


def write_status(job_name: str, status: dict[str, Any]) -> Path:
    """Atomically publish ``status`` for ``job_name`` and return the file's path.

    ``job`` and ``updated`` are filled in when missing. The JSON goes to a
    temp file in the same directory, is fsynced, then renamed over the old
    file: readers see the old or the new status, never a mix.
    """
    path = status_path(job_name)
    payload = dict(status)
    payload.setdefault("job", job_name)
    payload.setdefault("updated", time.time())
    data = json.dumps(payload, indent=1, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def read_status(job_name: str) -> dict[str, Any]:
    """The last status published for ``job_name``.

    Raises FileNotFoundError ("no running job named ...") when there is none,
    ValueError when the file is not a JSON object.
    """
    path = status_path(job_name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"no running job named {job_name!r} (no status file at {path})") from None
    try:
        status = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"status file {path} is not valid JSON: {err}") from None
    if not isinstance(status, dict):
        raise ValueError(f"status file {path} does not hold a JSON object")
    return status


def remove_status(job_name: str) -> bool:
    """Delete the status file of ``job_name``; True if there was one."""
    try:
        status_path(job_name).unlink()
    except FileNotFoundError:
        return False
    return True


def list_status_jobs() -> list[str]:
    """Names of the jobs that have a status file, sorted."""
    try:
        return sorted(p.stem for p in status_dir().glob("*.json") if not p.name.startswith("."))
    except OSError:
        return []
