"""The ``replication`` command: run the demo, run a job, show a plan, manage the embedded stack.

  replication demo [--rate R] [--duration S] [--executors N] [--mode M] [--rhino]
  replication run MODULE:FACTORY [--master M] [--conf KEY=VALUE ...] [--drain-after S]
  replication plan MODULE:FACTORY --conf spark.replication.kafka.bootstrapServers=HOST:PORT
  replication config                       # the configuration reference
  replication stack start|stop|status|health [--run-dir D]
  replication replicas JOB [--json]        # where a running job's replicas run
  replication status JOB [--json]          # a running job: replicas, roles, lag, checkpoints, failovers
  replication kill JOB REPLICA --action kill-executor|pause-executor|resume-executor|kill-python

``MODULE:FACTORY`` names a function returning a :class:`replication.Job`.
Errors in configuration or job definition are printed as one clear message
(exit code 2), never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ops import chaos_cli, soak
from replication.api import Job, JobDefinitionError
from replication.config import ConfigError, ReplicationConfig, config_reference_markdown
from transport.kafka_io import KafkaUnavailable


def _load_job(spec: str) -> tuple[Job, ModuleType]:
    """The job ``MODULE:FACTORY`` names (the factory called, or a Job itself); the current
    directory is on the import path, as for ``python -m``."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise JobDefinitionError(f"expected MODULE:FACTORY, got {spec!r}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, attr)
    except (ImportError, AttributeError) as err:
        raise JobDefinitionError(f"cannot load {spec!r}: {err}") from err
    try:
        job = factory() if callable(factory) and not isinstance(factory, Job) else factory
    except JobDefinitionError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's factory: its error, in one line
        raise JobDefinitionError(f"{spec!r} failed: {type(err).__name__}: {err}") from err
    if not isinstance(job, Job):
        raise JobDefinitionError(f"{spec!r} did not return a replication.Job (got {type(job).__name__})")
    return job, module


def _ship_module(sc: Any, module: ModuleType) -> None:
    """Send a single-file job module to the executors (like --py-files), unless it is installed."""
    path = getattr(module, "__file__", None)
    if path and Path(path).name != "__init__.py" and "site-packages" not in Path(path).parts:
        sc.addPyFile(path)


def _conf_pairs(pairs: Sequence[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError([(pair, f"--conf expects KEY=VALUE, got {pair!r}")])
        conf[key.strip()] = value.strip()
    return conf


def _cmd_demo(args: argparse.Namespace) -> int:
    from ops.demo import DemoOptions, main

    if args.rhino and (args.no_replication or args.mode == "unordered"):
        print("error: --rhino needs --mode liverobin or --mode kazoo (checkpoints are taken at pulses or orders)",
              file=sys.stderr)
        return 2
    return main(DemoOptions(rate=args.rate, duration_s=args.duration, executors=args.executors,
                            replicated=not args.no_replication, mode=args.mode, victim=args.kill,
                            rhino=args.rhino))


def _cmd_run(args: argparse.Namespace) -> int:
    from replication import run
    from replication.spark_cluster import build_session, stop_session

    conf = _conf_pairs(args.conf)
    ReplicationConfig.from_mapping(conf)  # refuse a bad config before Spark starts
    job, module = _load_job(args.job)
    spark = build_session(args.master, app_name=job.name, conf=conf)
    try:
        _ship_module(spark.sparkContext, module)
        handle = run(job, spark=spark, conf=conf)
        print(handle.plan.describe(), flush=True)
        if handle.metrics_url:
            print(f"Prometheus metrics at {handle.metrics_url}", flush=True)
        print(f"job {job.name} {handle.serve(args.drain_after, args.savepoint).summary()}", flush=True)
        if args.savepoint:
            print(f"savepoint in {args.savepoint}: run again with --conf spark.replication.restoreFrom="
                  f"{args.savepoint}", flush=True)
        return 0
    finally:
        stop_session(spark)


def _cmd_plan(args: argparse.Namespace) -> int:
    from replication.control.launch import plan_offline, prepare

    conf = _conf_pairs(args.conf)
    if args.offline:  # no broker is asked: the key it requires may be left out
        conf.setdefault("spark.replication.kafka.bootstrapServers", "offline.invalid:9092")
    cfg = ReplicationConfig.from_mapping(conf)
    job = _load_job(args.job)[0]
    if args.offline:
        print(plan_offline(job, cfg, _partition_counts(args.partitions)).describe())
    else:
        print(prepare(job, cfg).describe())
    return 0


def _partition_counts(pairs: Sequence[str]) -> dict[str, int]:
    counts = {}
    for pair in pairs:
        topic, sep, n = pair.rpartition("=")
        if not sep or not topic or not n.isdigit() or int(n) < 1:
            raise JobDefinitionError(f"--partitions expects TOPIC=N with N a positive int, got {pair!r}")
        counts[topic] = int(n)
    return counts


def _cmd_status(args: argparse.Namespace) -> int:
    from replication.status import format_status, list_status_jobs, read_status

    try:
        status = read_status(args.job)
    except FileNotFoundError as err:
        jobs = list_status_jobs()
        print(f"error: {err}" + (f"; jobs with a status file: {', '.join(jobs)}" if jobs else ""), file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(status, indent=1, sort_keys=True))
        return 0
    try:
        text = format_status(status)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        print(f"error: malformed status file for job {args.job!r} ({type(err).__name__}: {err}); "
              "--json prints it as it is", file=sys.stderr)
        return 2
    print(text)
    return 0


def _cmd_move(args: argparse.Namespace) -> int:
    from replication.handover_orders import parse_vnodes

    try:
        vnodes = parse_vnodes(args.vnodes)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return _handover_request(args, task=args.task, vnodes=vnodes, target=args.target)


def _cmd_rescale(args: argparse.Namespace) -> int:
    return _handover_request(args, task=args.task, parallelism=args.parallelism)


def _cmd_rebalance(args: argparse.Namespace) -> int:
    return _handover_request(args, task=args.task, fraction=args.fraction, window=args.window, target=args.target)


def _cmd_drain(args: argparse.Namespace) -> int:
    return _handover_request(args, executor=args.executor)


def _handover_request(args: argparse.Namespace, **what: Any) -> int:
    """Send a handover request (move, rescale, rebalance, drain) to the job's driver and print its report."""
    from replication.handover_orders import format_vnodes, parse_strategy
    from replication.messages import HandoverReport, HandoverRequest
    from replication.security import read_cli_credentials
    from replication.status import read_status
    from transport import rpc

    try:
        parse_strategy(args.strategy)
        address = read_status(args.job).get("control_address")
        security = read_cli_credentials(args.job)
    except FileNotFoundError as err:
        print(f"error: job {args.job!r}: {err.filename or err} not found (is the job running on this machine, "
              "as this user?)", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not address:
        print(f"error: job {args.job!r} does not publish a control address (an older driver?)", file=sys.stderr)
        return 2
    peer = rpc.Peer(address, security)
    try:
        answer = peer.call("MoveVnodes", HandoverRequest(strategy=args.strategy, timeout=args.timeout, **what),
                           HandoverReport, timeout=args.timeout + 30)
    except Exception as err:  # noqa: BLE001 - grpc.RpcError: the driver is gone
        print(f"error: the driver of job {args.job!r} at {address} did not answer: {err}", file=sys.stderr)
        return 2
    finally:
        peer.close()
    if answer.error is not None:
        print(f"error: {answer.error}", file=sys.stderr)
        return 2
    report = answer.report
    if "executor" in what:
        print(f"executor {report['executor']} drained in {report['seconds']:.1f} s: {len(report['restored'])} "
              f"replica(s) restored elsewhere and caught up")
        for rec in report["restored"]:
            print(f"  {rec['replica']}: on worker {rec['worker']} from checkpoint {rec['checkpoint_id']}, "
                  f"{rec['recovery_s']:.2f} s")
        return 0
    print(f"handover job {report['job']} of {args.task}: {report['state']} in {report['seconds']:.1f} s, "
          f"{len(report['steps'])} step(s), {report['entries_moved']} state entries moved; partitions owning "
          f"vnodes now: {report['partitions']}")
    if "load_before" in report:
        print(f"  records/s per partition: {report['load_before']} before, {report['load_after']} as planned")
    for step in report["steps"]:
        print(f"  handover {step['handover_id']}: vnodes {format_vnodes(step['vnodes'])} "
              f"({len(step['vnodes'])}) from {step['origins']} to {step['targets']}, switch at pulse "
              f"{step['switch_at']}, release at {step['release_at']}, {step['entries_moved']} entries, "
              f"{step['seconds']:.2f} s: {step['state']}")
        phases = step.get("phases") or {}
        if phases.get("held") is not None:
            parts = ", ".join(f"{name.replace('_', ' ')} {phases[name] * 1000:.0f}"
                              for name in ("alignment", "transfer", "release_wait", "load", "catch_up", "blocked")
                              if phases.get(name) is not None)
            print(f"    moved keys' records held {phases['held'] * 1000:.0f} ms (release margin "
                  f"{step['release_s'] * 1000:.0f} ms; ms: {parts}), {step['bytes_moved']:,} bytes cut, "
                  f"{step['bytes_shipped']:,} sent over the network, {step['bytes_from_store']:,} read from the "
                  "targets' copies of the origins' checkpoints")
    return 0 if report["state"] == "completed" else 2


def _cmd_stack(args: argparse.Namespace) -> int:
    from deploy.__main__ import main as stack_main

    return stack_main([args.action, *(["--run-dir", args.run_dir] if args.run_dir else [])])


def _handover_parser(sub: Any, name: str, what: str, timeout: float) -> argparse.ArgumentParser:
    """A subcommand that runs a handover job on a keyed task of a running job (its job, task,
    strategy and timeout arguments)."""
    p = sub.add_parser(name, help=f"{what} (LiveRobin or KaZoo mode)")
    p.add_argument("job", help="the job name")
    p.add_argument("task", help="the keyed task")
    p.add_argument("--strategy", default="all", help="all (one step), fluid (one vnode per step), batched:N, or "
                                                     "batched:N:BYTES (at most BYTES of state per step, e.g. 8MiB)")
    p.add_argument("--timeout", type=float, default=timeout, help="seconds to wait for it to complete")
    return p


def version() -> str:
    """The installed distribution's version."""
    try:
        return importlib.metadata.version("spark-active-replication")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replication", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the demo on an embedded stack and a local-cluster Spark")
    d.add_argument("--rate", type=float, default=1500.0, help="events per second (default 1500)")
    d.add_argument("--duration", type=float, default=20.0, help="seconds of load (default 20)")
    d.add_argument("--executors", type=int, default=3, help="executor JVMs (default 3)")
    d.add_argument("--kill", default="fraud-rule[0]r0", metavar="REPLICA",
                   help="replica whose executor is killed halfway (default fraud-rule[0]r0)")
    d.add_argument("--mode", choices=["unordered", "liverobin", "kazoo"], default="unordered",
                   help="unordered (default): the single-input job; liverobin / kazoo: the two-region job "
                        "with a union and a window, replicated, ordered by LiveRobin / by KaZoo leaders")
    d.add_argument("--rhino", action="store_true",
                   help="with --mode liverobin or kazoo: Rhino checkpoints, so the killed executor's replicas are "
                        "restored from them (the demo prints when each caught up)")
    d.add_argument("--no-replication", action="store_true",
                   help="run the two-region job with a union and a window, without replication or kill")
    d.set_defaults(fn=_cmd_demo)
    r = sub.add_parser("run", help="run a job until Ctrl-C (graceful stop) or --drain-after")
    r.add_argument("job", help="MODULE:FACTORY returning a replication.Job")
    r.add_argument("--master", default="local-cluster[3,1,512]")
    r.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--drain-after", type=float, default=0.0, metavar="S",
                   help="after S seconds, read the inputs to their end, flush and finish")
    r.add_argument("--savepoint", metavar="DIR",
                   help="end (Ctrl-C or --drain-after) by draining into a savepoint in DIR instead of flushing the "
                        "windows; a later run goes on from it with --conf spark.replication.restoreFrom=DIR")
    r.set_defaults(fn=_cmd_run)
    pl = sub.add_parser("plan", help="print the physical plan of a job (reads the partition counts from Kafka and "
                                     "creates its topics, or with --offline neither)")
    pl.add_argument("job", help="MODULE:FACTORY (the current directory is on the import path)")
    pl.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    pl.add_argument("--offline", action="store_true", help="plan without Kafka: partition counts from --partitions "
                                                           "(or the sources' parallelism); nothing is created")
    pl.add_argument("--partitions", action="append", default=[], metavar="TOPIC=N",
                    help="a source topic's partition count, for --offline")
    pl.set_defaults(fn=_cmd_plan)
    c = sub.add_parser("config", help="print the configuration reference")
    c.set_defaults(fn=lambda _: print(config_reference_markdown()) or 0)
    s = sub.add_parser("stack", help="the embedded ZooKeeper + broker")
    s.add_argument("action", choices=["start", "stop", "status", "health"])
    s.add_argument("--run-dir")
    s.set_defaults(fn=_cmd_stack)
    st = sub.add_parser("status", help="show a running job: where each replica runs, its role and lag, "
                                       "checkpoints, recent failovers and recoveries")
    st.add_argument("job", help="the job name")
    st.add_argument("--json", action="store_true", help="print the status file the driver publishes, as it is")
    st.set_defaults(fn=_cmd_status)
    mv = _handover_parser(sub, "move", "move vnodes of a keyed task to another of its partitions while the job "
                                       "runs", timeout=60.0)
    mv.add_argument("vnodes", help="vnodes, e.g. 0-31,40")
    mv.add_argument("target", type=int, help="the partition they move to")
    mv.set_defaults(fn=_cmd_move)
    rs = _handover_parser(sub, "rescale", "run a keyed task on more or fewer of its partitions while the job runs "
                                          "(up to its max_parallelism)", timeout=120.0)
    rs.add_argument("parallelism", type=int, help="the partitions that own vnodes afterwards")
    rs.set_defaults(fn=_cmd_rescale)
    rb = _handover_parser(sub, "rebalance", "measure the records per vnode of a keyed task, then move load off its "
                                            "busiest partition while the job runs", timeout=120.0)
    rb.add_argument("--fraction", type=float, default=0.5,
                    help="at most this fraction of the busiest partition's vnodes move (default 0.5)")
    rb.add_argument("--target", type=int, help="the partition they move to (default: the least loaded)")
    rb.add_argument("--window", type=float, default=3.0, help="seconds over which the load is measured")
    rb.set_defaults(fn=_cmd_rebalance)
    dr = sub.add_parser("drain", help="move every replica off an executor while the job runs (replication and "
                                      "Rhino on): the twins serve, the replicas are restored from checkpoints elsewhere")
    dr.add_argument("job", help="the job name")
    dr.add_argument("executor", help="the Spark executor id (see `replication status JOB`)")
    dr.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for every replica to be restored")
    dr.set_defaults(fn=_cmd_drain, strategy="all")
    sk = sub.add_parser("soak", help="the fault soak: a replicated job under load and a seeded schedule of single "
                                     "faults (own stack and Spark), every output record checked (exit code 1: not "
                                     "everything held)")
    soak.add_arguments(sk)
    sk.set_defaults(fn=soak.command)
    chaos_cli.add_subcommands(sub)  # replicas, kill (they print their own errors, exit code 2)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except ConfigError as err:
        print(f"error: invalid configuration:\n{err}", file=sys.stderr)
    except JobDefinitionError as err:
        print(f"error: invalid job: {err}", file=sys.stderr)
    except KafkaUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - named errors from deploy and the driver
        name = type(err).__name__
        if name in ("StackError", "JobFailedError"):
            print(f"error: {err}", file=sys.stderr)
        else:
            raise
    return 2


if __name__ == "__main__":
    sys.exit(main())
