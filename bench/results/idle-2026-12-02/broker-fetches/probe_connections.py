"""Requests into the broker per client connection over a window, from ``ss -tnpi``.

Usage: ``probe_connections.py BROKER_PORT SECONDS`` beside a running job: one line per connection
that received anything (its process, file descriptor, TCP segments and bytes received a second),
then one per process.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path


def snapshot() -> dict[tuple[str, str], tuple[tuple[str, str, str] | None, int, int]]:
    """(local, peer) -> ((name, pid, fd) of the owner, segments received, bytes received)."""
    out = subprocess.run(["ss", "-tnpiH", "state", "established"], capture_output=True, text=True,
                         check=False).stdout
    conns: dict = {}
    current = None
    for line in out.splitlines():
        if not line.startswith(("\t", " ")):
            parts = line.split()
            users = re.search(r'users:\(\("([^"]+)",pid=(\d+),fd=(\d+)', line)
            current = (parts[2], parts[3], users.groups() if users else None)
        elif current is not None:
            segs = re.search(r"segs_in:(\d+)", line)
            received = re.search(r"bytes_received:(\d+)", line)
            conns[current[:2]] = (current[2], int(segs.group(1)) if segs else 0,
                                  int(received.group(1)) if received else 0)
    return conns


def main() -> None:
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    before = snapshot()
    time.sleep(seconds)
    after = snapshot()
    per_process: dict = defaultdict(lambda: [0, 0, 0])
    for key, (owner, segs, received) in after.items():
        if not key[1].endswith(f":{port}") or owner is None or key not in before:
            continue
        _, pid, fd = owner
        d_segs, d_bytes = segs - before[key][1], received - before[key][2]
        if d_segs:
            print(f"  {pid} fd {fd}: {d_segs / seconds:.1f} segments/s, {d_bytes / seconds:.0f} bytes/s")
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:60]
        except OSError:
            cmd = owner[0]
        row = per_process[(pid, cmd)]
        row[0], row[1], row[2] = row[0] + 1, row[1] + d_segs, row[2] + d_bytes
    for (pid, cmd), (n, segs, received) in sorted(per_process.items(), key=lambda kv: -kv[1][1]):
        print(f"{pid:>7} {cmd:60s} connections={n:3d} segments/s={segs / seconds:8.1f} "
              f"bytes/s={received / seconds:10.0f}")


if __name__ == "__main__":
    main()
