"""What one data-plane call costs: a signed gRPC unary call against the same signed bytes as frames
on a plain socket (transport.frames).

    .venv/bin/python bench/frames.py [--calls 3000] [--sizes 256,4096,65536] [--out bench/results/frames]

Both servers and their clients in this one process on 127.0.0.1, with the job's signing (HMAC
over method, time and payload; a signed reply): per payload size, ``--calls`` calls one after
another, as a :class:`replication.runtime.senders.PushLink` makes them (one in flight per peer).  The
CPU per call is this process's (both ends, and gRPC's own threads), from ``time.process_time``;
the wall time per call is the round trip.  Writes ``frames.csv``, ``frames.png`` and
``machine.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import print_plain_table, write_csv, write_machine  # noqa: E402
from transport import rpc  # noqa: E402
from transport.frames import FramePeer, FrameServer  # noqa: E402
from transport.security import RpcSecurity  # noqa: E402

REPLY = b"\x00" * 8  # a PushMany reply: a status byte per batch


def _timed(call, payload: bytes, calls: int) -> tuple[float, float]:
    """(CPU us, wall us) per call of ``call(payload)``, after a few warm-up calls."""
    for _ in range(20):
        call(payload)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        call(payload)
    return (time.process_time() - cpu0) / calls * 1e6, (time.perf_counter() - wall0) / calls * 1e6


def measure(calls: int, sizes: list[int]) -> list[dict]:
    security = RpcSecurity.generate()
    grpc_server = rpc.serve({"PushMany": lambda _: REPLY}, security=security, bind_host="127.0.0.1", max_workers=8)
    frame_server = FrameServer("PushMany", lambda _: REPLY, security=security, bind_host="127.0.0.1",
                               max_connections=4)
    grpc_peer = rpc.Peer(f"127.0.0.1:{grpc_server.port}", security)
    frame_peer = FramePeer("127.0.0.1", frame_server.port, "PushMany", security)
    transports = {"gRPC unary": lambda p: grpc_peer.call_bytes("PushMany", p, timeout=10),
                  "frames": lambda p: frame_peer.call(p, timeout=10)}
    rows = []
    try:
        for size in sizes:
            payload = os.urandom(size)
            for name, call in transports.items():
                cpu_us, wall_us = _timed(call, payload, calls)
                rows.append({"transport": name, "payload_bytes": size, "calls": calls,
                             "cpu_us_per_call": cpu_us, "wall_us_per_call": wall_us})
    finally:
        grpc_peer.close()
        frame_peer.close()
        grpc_server.stop(0)
        frame_server.stop()
    for size in sizes:
        g, f = (next(r for r in rows if r["transport"] == t and r["payload_bytes"] == size)
                for t in transports)
        for r in (g, f):
            r["cpu_vs_grpc"] = r["cpu_us_per_call"] / g["cpu_us_per_call"]
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["payload_bytes"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for i, name in enumerate(("gRPC unary", "frames")):
        ys = [next(r["cpu_us_per_call"] for r in rows if r["transport"] == name and r["payload_bytes"] == s)
              for s in sizes]
        ax.bar([x + (i - 0.5) * width for x in range(len(sizes))], ys, width, label=name)
    ax.set_xticks(range(len(sizes)), [f"{s:,} B" for s in sizes])
    ax.set_ylabel("CPU per call, both ends (us)")
    ax.set_title("A signed data-plane call: gRPC against frames on a socket")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--sizes", default="256,4096,65536")
    ap.add_argument("--out", default=str(REPO / "bench/results/frames"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.calls, [int(s) for s in args.sizes.split(",")])
    write_csv(out / "frames.csv", rows)
    plot(rows, out / "frames.png")
    write_machine(out)
    print_plain_table("one signed call", rows, tuple(rows[0]))
    print(f"wrote {out}: frames.csv, frames.png, machine.txt")


if __name__ == "__main__":
    main()
