"""CLI for the embedded stack.

    python -m deploy start  [--run-dir D] [--foreground] [--zk-tick-ms N] [--timeout S]
    python -m deploy stop   --run-dir D
    python -m deploy status --run-dir D
    python -m deploy health --run-dir D

Exit codes: 0 ok, 1 unhealthy/not running (status, health), 2 errors.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from deploy.stack import (
    EmbeddedStack,
    ProcessStatus,
    StackEndpoints,
    StackError,
    check_health,
    read_endpoints,
    run_dir_status,
    stop_run_dir,
)


def _endpoints_json(ep: StackEndpoints) -> str:
    return json.dumps({"bootstrap_servers": ep.bootstrap_servers, "zookeeper_connect": ep.zookeeper_connect,
                       "run_dir": str(ep.run_dir)}, indent=2)


def _print_status(statuses: list[ProcessStatus]) -> None:
    for st in statuses:
        state = "alive" if st.alive else ("dead" if st.pid is not None else "no pid file")
        print(f"{st.name:10} pid={st.pid if st.pid is not None else '-':<8} port={st.port or '-':<6} {state:12} log={st.log}")


def _start(args: argparse.Namespace) -> int:
    stack = EmbeddedStack(args.run_dir, zk_tick_ms=args.zk_tick_ms, start_timeout_s=args.timeout,
                          stop_at_exit=args.foreground)
    t0 = time.monotonic()
    endpoints = stack.start()
    print(_endpoints_json(endpoints))
    print(f"started in {time.monotonic() - t0:.2f}s", file=sys.stderr)
    if not args.foreground:
        print(f"stop with: python -m deploy stop --run-dir {endpoints.run_dir}", file=sys.stderr)
        return 0

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        while all(st.alive for st in stack.status()):
            time.sleep(1.0)
        dead = [st.name for st in stack.status() if not st.alive]
        print(f"error: {', '.join(dead)} exited unexpectedly; stopping (logs in {stack.run_dir})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
        return 0
    finally:
        stack.stop()


def _stop(args: argparse.Namespace) -> int:
    statuses = stop_run_dir(args.run_dir)
    _print_status(statuses)
    if any(st.alive for st in statuses):
        print("error: some processes are still alive", file=sys.stderr)
        return 2
    return 0


def _status(args: argparse.Namespace) -> int:
    statuses = run_dir_status(args.run_dir)
    _print_status(statuses)
    return 0 if all(st.alive for st in statuses) else 1


def _health(args: argparse.Namespace) -> int:
    health = check_health(read_endpoints(args.run_dir))
    print(json.dumps(health))
    return 0 if all(health.values()) else 1


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m deploy", description="Embedded ZooKeeper + Kafka stack")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start ZooKeeper and the broker (detached unless --foreground)")
    start.add_argument("--run-dir", type=Path, help="run directory (default: a new one under .runs/)")
    start.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C/SIGTERM stops the stack")
    start.add_argument("--zk-tick-ms", type=int, default=200, help="ZooKeeper tickTime (default 200)")
    start.add_argument("--timeout", type=float, default=60.0, help="startup timeout in seconds (default 60)")
    for name, text in (("stop", "stop the processes of a run directory"),
                       ("status", "show the processes of a run directory"),
                       ("health", "check ZooKeeper and Kafka of a run directory")):
        sub.add_parser(name, help=text).add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    handler = {"start": _start, "stop": _stop, "status": _status, "health": _health}[args.command]
    try:
        return handler(args)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 2
    except Exception as exc:  # no bare tracebacks on the command line
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
