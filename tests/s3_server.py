"""An S3-compatible server for the tests (moto's, in a process of its own): durable checkpoints are
tested on an object store's semantics (no rename, no directories, an upload visible only once
complete), not only on a local file system.  A process, not a thread: a job's driver runs in the
test process and must not share its interpreter with the uploads of every executor."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

ACCESS_KEY, SECRET_KEY = "test-key", "test-secret"
_LISTENING = re.compile(rb"Running on http://([\d.]+):(\d+)")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``host:port`` of a running S3 server (one per test session)."""
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        endpoint = _wait_listening(proc, timeout_s=60)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(params=["path", "s3"])
def durable_dir(request, tmp_path) -> str:
    """A directory for durable files, once as a local path and once as a bucket of the S3 server."""
    if request.param == "s3":
        return s3_uri(request.getfixturevalue("s3_endpoint"))
    return str(tmp_path / "dir")


def _wait_listening(proc: subprocess.Popen, timeout_s: float) -> str:
    """The address the server prints once it listens; its request log is drained from then on."""
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:  # read to the end: a full pipe would block the server
            if not found and (m := _LISTENING.search(line)):
                found.append(f"{m.group(1).decode()}:{m.group(2).decode()}")
                ready.set()

    threading.Thread(target=read, name="moto-log", daemon=True).start()
    if not ready.wait(timeout_s):
        raise RuntimeError(f"the S3 test server did not start within {timeout_s:.0f}s (exit code {proc.poll()})")
    return found[0]


def s3_uri(endpoint: str, prefix: str = "checkpoints") -> str:
    """A ``pyarrow.fs`` URI under a fresh bucket on ``endpoint``, created (credentials and endpoint
    in the URI, so that every process of a test, executors included, reaches it without environment)."""
    from pyarrow import fs as pafs

    bucket = f"b{uuid.uuid4().hex[:12]}"
    query = f"scheme=http&endpoint_override={endpoint}&region=us-east-1"
    fs, _ = pafs.FileSystem.from_uri(f"s3://{ACCESS_KEY}:{SECRET_KEY}@{bucket}?{query}&allow_bucket_creation=true")
    fs.create_dir(bucket)
    return f"s3://{ACCESS_KEY}:{SECRET_KEY}@{bucket}/{prefix}?{query}"
