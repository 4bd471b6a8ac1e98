"""The ``replicas`` and ``kill`` commands of ``replication``: a running job's replicas as a table,
and :mod:`ops.chaos`'s actions on the processes hosting one."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ops.chaos import (
    ACTIONS,
    ChaosError,
    ExecutorTarget,
    ReplicaRow,
    kill_executor,
    kill_python,
    list_replicas,
    locate,
    locate_executor,
    pause_executor,
    paused_executors,
    resume_executor,
)
from replication import procfs
from replication.status import list_status_jobs, read_status


def format_table(rows: Sequence[ReplicaRow]) -> str:
    """The rows of :func:`list_replicas` as an aligned text table."""
    header = ["REPLICA", "WORKER", "ATTEMPT", "EXECUTOR", "JVM PID", "PYTHON PID", "IN", "OUT", "DEDUP DROPS",
              "GAPS", "QUEUE", "P99 MS", "ROLE", "ALIVE"]

    def cell(v: Any) -> str:
        return "-" if v is None else str(v)

    lines = [header] + [
        [r.replica, cell(r.worker), cell(r.attempt), cell(r.executor), cell(r.jvm_pid), cell(r.python_pid),
         *(cell(r.metrics.get(k)) for k in ("in", "out", "dedup_dropped", "gaps", "queue", "p99_ms")),
         r.metrics.get("role") or "-", ("yes" if r.alive else "no") + (f" ({r.note})" if r.note else "")]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _describe_job(status: Mapping[str, Any]) -> str:
    driver = status.get("driver_pid")
    driver_state = "alive" if isinstance(driver, int) and procfs.alive(driver) else "not alive"
    updated = status.get("updated")
    age = f", updated {time.time() - updated:.1f} s ago" if isinstance(updated, (int, float)) else ""
    return (f"job {status.get('job')}: {status.get('state')}, application {status.get('app_id')}, "
            f"driver pid {driver} ({driver_state}){age}")


def _cmd_replicas(args: argparse.Namespace) -> int:
    status = read_status(args.job)
    rows = list_replicas(args.job, status=status)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    print(_describe_job(status))
    print(format_table(rows) if rows else "(no replicas)")
    paused = paused_executors(status["app_id"]) if status.get("app_id") else {}
    if paused:
        print("paused executors: " + ", ".join(f"{e} (jvm pid {p})" for e, p in sorted(paused.items())))
    return 0


def _cmd_kill(args: argparse.Namespace) -> int:
    if (args.replica is None) == (args.executor is None):
        raise ValueError("name a REPLICA or pass --executor ID (one of them)")
    if args.action == "kill-python" and args.replica is None:
        raise ValueError("kill-python needs a REPLICA")
    target: ExecutorTarget
    if args.replica is not None:
        rp = locate(args.replica, job=args.job)
        target = rp
        where = (f"{rp.replica} (worker {rp.worker}, executor {rp.executor}, jvm pid {rp.jvm_pid}, "
                 f"python pid {rp.python_pid})")
    else:
        target = locate_executor(args.executor, job=args.job)
        where = f"executor {target.executor} (jvm pid {target.jvm_pid})"
    if args.action == "resume-executor" and procfs.state(target.jvm_pid) != "T":
        paused = paused_executors(target.app_id)
        hint = ("; paused executors: " + ", ".join(f"{e} (jvm pid {p})" for e, p in sorted(paused.items()))
                + " (resume one with --executor ID)") if paused else "; no executor of this job is paused"
        raise ChaosError(f"executor {target.executor} is not paused{hint}")
    action: Callable[..., list[int]] = {
        "kill-executor": kill_executor, "pause-executor": pause_executor,
        "resume-executor": resume_executor, "kill-python": kill_python,
    }[args.action]
    pids = action(target)
    sig = {"kill-executor": "SIGKILL", "pause-executor": "SIGSTOP", "resume-executor": "SIGCONT",
           "kill-python": "SIGKILL"}[args.action]
    print(f"{args.action} {where}: {sig} sent to pid{'s' if len(pids) > 1 else ''} "
          f"{', '.join(map(str, pids))}")
    return 0


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except FileNotFoundError as err:
            jobs = list_status_jobs()
            known = f"; jobs with a status file: {', '.join(jobs)}" if jobs else ""
            print(f"error: {err}{known}", file=sys.stderr)
        except KeyError as err:
            print(f"error: malformed status file: missing key {err}", file=sys.stderr)
        except (ChaosError, ValueError, TypeError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
        return 2

    return run


def add_subcommands(sub: Any) -> None:
    """Add ``replicas`` and ``kill`` to an argparse subparsers action (used by ``replication``)."""
    r = sub.add_parser("replicas", help="show where a running job's replicas run (workers, executors, pids)")
    r.add_argument("job", help="the job name")
    r.add_argument("--json", action="store_true", help="print the rows as JSON")
    r.set_defaults(fn=_guarded(_cmd_replicas))
    k = sub.add_parser("kill", help="kill, pause or resume the processes hosting a replica (local executors)")
    k.add_argument("job", help="the job name")
    k.add_argument("replica", nargs="?", help="the replica, e.g. 'fraud-rule[0]r1' (see `replicas JOB`)")
    k.add_argument("--action", required=True, choices=ACTIONS,
                   help="kill-executor: SIGKILL the executor JVM; pause-/resume-executor: SIGSTOP/SIGCONT "
                        "the JVM and its Python workers; kill-python: SIGKILL the replica's Python worker")
    k.add_argument("--executor", metavar="ID",
                   help="target this executor instead of a replica's (e.g. to resume a paused one)")
    k.set_defaults(fn=_guarded(_cmd_kill))


def main(argv: Sequence[str] | None = None) -> int:
    """``replicas JOB`` / ``kill JOB REPLICA --action A``; errors print ``error: ...`` and return 2."""
    p = argparse.ArgumentParser(prog="replication", description="locate and hit a job's replica processes")
    sub = p.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # argparse usage errors (already printed) and --help
        return exc.code if isinstance(exc.code, int) else 2
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
