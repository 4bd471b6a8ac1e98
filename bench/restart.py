"""Rescaling a keyed task from 2 to 3 partitions under load, two ways (issue 7): a live handover against
"stop the job, restore from its savepoint with the new parallelism, restart".

    .venv/bin/python bench/restart.py [--sizes 1MB,20MB] [--ways live,restart] [--rate 200] [--before 8]
                                      [--after 5] [--keys-per-vnode 1] [--value-bytes 1000] [--margin 0.5]
                                      [--release 0.3] [--period 10] [--warm-up 3] [--savepoint-dir DIR]
                                      [--keep-savepoints] [--quick] [--replot] [--out bench/results/restart]

    # a smoke run (1 MB, both ways, shorter load)
    .venv/bin/python bench/restart.py --quick --out /tmp/restart-quick

The job, the load and the state are :mod:`bench.handover`'s, at its defaults: one topic of 2 partitions ->
``key_by`` -> ``chain`` (a hash chain and a padded map state per key, one key per vnode, the pad sized so the
whole state is ``--sizes``) -> exactly-once sink (its topic created with 3 partitions, so the sink can grow
with the chain); replicated, LiveRobin (``--period`` ms pulses), Rhino off; ``--rate`` events/s round robin
over the keys (:class:`bench.handover.Feeder`, stamped with the producer's clock).  Per size, each way on a
fresh job, ``--before`` seconds of load (and every key's pad written) before the request:

* **live**: the chain built with ``parallelism=2, max_parallelism=3`` (partition 2 idle);
  ``handle.rescale("chain", 3)`` all at once, while the load flows.  The operation ends when the call
  returns.  Its parts are the handover's phases as its report gives them (its step's ``phases``,
  :func:`replication.control.handover_timelines.step_phases`: from the wall-clock times the participants put in their
  acks, ms resolution), in ``restart.csv`` as ``bench/handover.py``'s columns (``trigger_s``,
  ``to_switch_s``, ``alignment_s``, ``transfer_s``, ``release_wait_s``, ``load_s``, ``catch_up_s``,
  ``acks_s``); the table and the plot group them into parts that each end at a milestone of the step:
  *trigger* (-> every participant armed, committed), *to switch + alignment* (-> the upstreams reached the
  switch pulse, ``--margin`` ahead, and the origins processed what was routed to them before it and cut),
  *transfer + release wait* (-> every cut reached the targets and they reached the release pulse,
  ``--release`` after the switch), *load + catch-up* (-> the targets loaded it and processed the records
  they held) and *acks* (-> the driver learnt it all).  ``other_s``: the rest of the call (the request ->
  the step's instruction, its completion -> ``rescale`` returned).
* **restart**: the chain built with ``parallelism=2``; ``handle.drain(savepoint=DIR)``; then a new
  ``run(...)`` of the same job with the chain at ``parallelism=3`` and
  ``spark.replication.restoreFrom=DIR``.  The load generator keeps producing into the input topic the whole
  time: what is produced during the gap waits in Kafka, and the new run starts from the savepoint's
  offsets.  The operation ends with the new run's first output record (its sink time).  Its parts:
  *drain* (the request -> ``drain`` returned: every replica drained and wrote its part, the meta file
  written; *arm* is the part of it until every worker knew of the savepoint), *launch* (``run()``:
  planning, the savepoint check, Kafka, the executors' warm-up, the Spark job submitted), *workers*
  (-> ``wait_started``: every worker task registered), *restore* (``restore_s``: -> every replica of the
  new run built, which is where a keyed partition loads its key groups from the savepoint, and reported
  its first metrics; polled every 20 ms) and *first output* (-> the first record the new run's sink
  wrote: sources fetch, pulses, processing).  The Spark application itself is not restarted: the new run
  is a new Spark job on the same session, whose executors are up and warm.  ``spark_app_start_s``
  (restart rows, for reference) is what starting this process's application (session and 3 executors)
  took: what a restart of the whole application would add.

Measured per run: latency by event time (sink time - the producer's timestamp), per second of event time
around the request (``restart_timeline.csv``: p50, p99, max); p99 and max before the request (after
``--warm-up``), *during* the operation (records produced from the request to its end: live, ``rescale``
returned; restart, the new run's first output) and *after* it (to the end of the load; for the restart it
includes the backlog's catch-up); ``normal_from_s``: the first second of event time since the request whose
p99 is within the larger of twice the p99 before and the p99 before + 100 ms (empty: none within the run);
the operation's duration and its parts (live: they and ``other_s`` add up to it; the restart's parts are
consecutive); the savepoint's bytes on disk (both replicas' parts; restart) and the state entries moved
(live: the origins' cuts) or loaded (restart: replica 0 of every new partition) against the state model's;
exactness of the whole output, across both runs for the restart (:func:`bench.handover.verify`: every
event once, every key's chain links up, every event read the pad value the reference says).

After the operation the load goes on for ``--after`` seconds (restart: once the new run caught up with
the backlog, waited for at most 90 s); then the load stops, the job drains and its output is read.
Writes ``restart.csv``, ``restart_timeline.csv``, ``restart.png`` and ``machine.txt`` under ``--out``
(the CSV files again after every run).  A run that fails is a row with its error; the command then exits 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import handover as hb  # noqa: E402
from bench.common import (  # noqa: E402
    forget_topics,
    format_row,
    one_line,
    print_plain_table,
    read_csv_rows,
    write_csv,
    write_machine,
)
from ops.progress import StatusLine, bar  # noqa: E402
from ops.workload import percentile  # noqa: E402
from rhino_state import AllAtOnce  # noqa: E402

MS, MB = hb.MS, hb.MB
TASK = hb.TASK
WAYS = ("live", "restart")
ERROR_CHARS = 300
LOAD_POLL_S = 0.02  # how often the new run's first metrics are looked for
CATCH_UP_TIMEOUT_S = 90.0
RESTART_PARTS = ("drain_s", "launch_s", "workers_s", "restore_s", "first_output_s")
LIVE_PHASES = tuple(f"{p}_s" for p in hb.STEP_PHASES)  # the handover's phases, as bench/handover.py's columns
# the live parts the table and the plot show: the phases in groups, each ending at a milestone of the step
LIVE_PARTS = {"trigger_s": ("trigger_s",),  # -> every participant armed, committed
              "to_switch+alignment_s": ("to_switch_s", "alignment_s"),  # -> the origins cut
              "transfer+release_wait_s": ("transfer_s", "release_wait_s"),  # -> at the targets, released
              "load+catch_up_s": ("load_s", "catch_up_s"),  # -> loaded, the held records processed
              "acks_s": ("acks_s",)}  # -> the driver learnt it all
RUN_COLUMNS = ("size", "way", "state_bytes", "keys", "pad_entries", "error", "exact", "outcome", "produced",
               "records", "op_s", *RESTART_PARTS, "arm_s", "start_s", *LIVE_PHASES, "other_s",
               "spark_app_start_s", "savepoint_bytes", "entries", "entries_model", "entries_match",
               "gap_records", "p99_before_ms", "max_before_ms", "p99_during_ms", "max_during_ms",
               "p99_after_ms", "max_after_ms", "worst_second_p99_ms", "normal_from_s")
SHOWN = ("size", "way", "exact", "op_s", "drain_s", "start_s", "restore_s", "first_output_s", *LIVE_PARTS,
         "other_s", "savepoint_bytes", "p99_before_ms", "p99_during_ms", "max_during_ms", "normal_from_s")


# ------------------------------------------------------------------------------------------ pure helpers
def dir_bytes(root: str | Path) -> int:
    """Bytes of every file under ``root`` (0 if it does not exist)."""
    root = Path(root)
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def first_after(times: Iterable[float], t: float) -> float | None:
    """The earliest of ``times`` after ``t`` (None: none)."""
    return min((x for x in times if x > t), default=None)


def restart_parts(marks: dict[str, float]) -> dict[str, float | str]:
    """A restart's duration and its parts from the wall clock of its marks: ``requested`` (drain called),
    ``armed`` (every worker knew of the savepoint), ``drained`` (drain returned, the savepoint complete),
    ``launched`` (the new ``run()`` returned), ``registered`` (``wait_started`` returned), ``loaded``
    (every replica reported: ``restore_s`` ends there) and ``first_output`` (the new run's first sink
    record).  A part whose marks are missing is empty; so is ``op_s`` without ``first_output``.  The parts
    are consecutive: they add up to ``op_s`` (``other_s`` is left empty).  ``start_s``: launch + workers."""
    def span(a: str, b: str) -> float | str:
        return marks[b] - marks[a] if a in marks and b in marks else ""

    parts = {"drain_s": span("requested", "drained"), "launch_s": span("drained", "launched"),
             "workers_s": span("launched", "registered"), "restore_s": span("registered", "loaded"),
             "first_output_s": span("loaded", "first_output")}
    return {"op_s": span("requested", "first_output"), **parts, "arm_s": span("requested", "armed"),
            "start_s": span("drained", "registered")}


def live_parts(op_s: float, steps: Sequence[dict[str, Any]]) -> dict[str, float | str]:
    """A live rescale's duration (request -> ``rescale`` returned) and the handover's phases
    (:data:`LIVE_PHASES`: the report's ``steps``' own, from the participants' acks, summed over them by
    :func:`bench.handover.run_phases`); ``other_s``: what of ``op_s`` no step covers (the request ->
    the step's instruction, its completion -> the call returned), empty when a step did not complete."""
    cols = hb.run_phases(steps, op_s)
    return {"op_s": op_s, **{c: cols[c] for c in LIVE_PHASES}, "other_s": cols["between_steps_s"]}


def part(row: dict[str, Any], name: str) -> Any:
    """A column of a restart.csv row, or a live part (:data:`LIVE_PARTS`): the sum of its phases, empty
    when one is unknown."""
    if name not in LIVE_PARTS:
        return row.get(name, "")
    values = [row.get(c, "") for c in LIVE_PARTS[name]]
    return "" if any(v in ("", None) for v in values) else sum(values)


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """What the printed table shows of a row (:data:`SHOWN`)."""
    return {k: part(row, k) for k in SHOWN}


def ms_stats(lat: Sequence[float], prefix: str = "") -> dict[str, float | str]:
    """p50 / p99 / max in ms of latencies in seconds; empty strings when there are none."""
    if not lat:
        return {f"{prefix}p50_ms": "", f"{prefix}p99_ms": "", f"{prefix}max_ms": ""}
    values = list(lat)
    return {f"{prefix}p50_ms": percentile(values, .5) * MS, f"{prefix}p99_ms": percentile(values, .99) * MS,
            f"{prefix}max_ms": max(values) * MS}


def window_stats(obs: Sequence[hb.Obs], lo: float, hi: float, name: str) -> dict[str, float | str]:
    """p99 and max (ms) of the records produced in ``[lo, hi)``."""
    lat = [o.latency for o in obs if lo <= o.produced < hi]
    return {f"p99_{name}_ms": percentile(lat, .99) * MS if lat else "",
            f"max_{name}_ms": max(lat) * MS if lat else ""}


def normal_from(obs: Sequence[hb.Obs], requested: float, threshold_s: float) -> int | str:
    """The first second of event time since ``requested`` (>= 0) whose p99 is within ``threshold_s``
    (empty: none).  A later spike does not count here (it is in the timeline and in the p99 after)."""
    for sec, group in hb.per_second(obs, requested).items():
        if sec >= 0 and percentile([o.latency for o in group], .99) <= threshold_s:
            return sec
    return ""


def normal_threshold_s(p99_before_s: float) -> float:
    """The per-second p99 that counts as normal again: twice the p99 before the request, and at least
    100 ms above it (a p99 of 45 ms before: 145 ms)."""
    return max(2 * p99_before_s, p99_before_s + 0.1)


def latency_columns(obs: Sequence[hb.Obs], requested: float, ended: float, load: tuple[float, float],
                    warm_up_s: float) -> dict[str, float | int | str]:
    """Before the request (after ``warm_up_s``), during the operation, after it (to the end of the load),
    the worst per-second p99 from the request on, and :func:`normal_from` (:func:`normal_threshold_s`)."""
    cols: dict[str, Any] = {**window_stats(obs, load[0] + warm_up_s, requested, "before"),
                            **window_stats(obs, requested, ended, "during"),
                            **window_stats(obs, ended, load[1], "after")}
    worst = [percentile([o.latency for o in g], .99) for sec, g in hb.per_second(obs, requested).items()
             if sec >= 0]
    cols["worst_second_p99_ms"] = max(worst) * MS if worst else ""
    before = cols["p99_before_ms"]
    cols["normal_from_s"] = (normal_from(obs, requested, normal_threshold_s(before / MS)) if before != ""
                             else "")
    return cols


def timeline_rows(obs: Sequence[hb.Obs], requested: float, labels: dict[str, Any], before_s: float,
                  ended: float | None = None, since: float = 0.0) -> list[dict[str, Any]]:
    """restart_timeline.csv rows: per second of event time since the request (from ``before_s`` before
    it, and not before ``since``: the end of the warm-up), the records produced in it and their latency;
    ``in_operation``: the second starts before the operation ended (``ended``)."""
    rows = []
    lo = max(requested - before_s, since)
    for sec, group in hb.per_second([o for o in obs if o.produced >= lo], requested).items():
        inside = "yes" if sec >= 0 and ended is not None and requested + sec < ended else "no"
        rows.append({**labels, "second": sec, "records": len(group), "in_operation": inside,
                     **ms_stats([o.latency for o in group])})
    return rows


def run_row(labels: dict[str, Any], **values: Any) -> dict[str, Any]:
    """One restart.csv row: every :data:`RUN_COLUMNS`, empty where there is nothing."""
    row: dict[str, Any] = dict.fromkeys(RUN_COLUMNS, "")
    row.update(labels)
    row.update({k: v for k, v in values.items() if k in row})
    return row


def entries_columns(measured: int | None, model: int) -> dict[str, Any]:
    if measured is None:
        return {"entries": "", "entries_model": model, "entries_match": ""}
    return {"entries": measured, "entries_model": model,
            "entries_match": "yes" if measured == model else "no"}


# ------------------------------------------------------------------------------------------ runs
@dataclass
class RunContext:
    stack: Any
    spark: Any
    args: argparse.Namespace
    status: StatusLine
    savepoints: Path
    app_start_s: float | str = ""  # this process's Spark application start (session, executors): a reference


@dataclass
class RunResult:
    row: dict[str, Any]
    timeline: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Setup:
    """What both ways share: the configuration, the state model, the topics, the load."""

    conf: dict[str, str]
    model: hb.StateModel
    topic: str
    out: str
    stamp: str
    feeder: hb.Feeder
    labels: dict[str, Any]
    extra: dict[str, Any]


def setup(ctx: RunContext, size: int, way: str) -> Setup:
    from deploy.topics import create_topics

    args, bootstrap = ctx.args, ctx.stack.bootstrap_servers
    conf = hb.job_conf(bootstrap, args.period)
    model = hb.state_model(size, args, conf)
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topic, out = f"rst{stamp}-in", f"rst{stamp}-out"
    create_topics(bootstrap, {topic: 2, out: 3})  # the sink may run on 3 partitions
    return Setup(conf, model, topic, out, stamp, hb.Feeder(bootstrap, topic, model.keys, args.rate),
                 {"size": f"{size / MB:g}MB", "way": way},
                 {"state_bytes": model.total_bytes, "keys": len(model.keys), "pad_entries": model.entries})


def read_outputs(bootstrap: str, topic: str) -> tuple[list[dict], list[float]]:
    """The output records (decoded) and their sink times."""
    from deploy.topics import read_all
    from ops.workload import sample_of

    raw = read_all(bootstrap, topic)
    return [json.loads(r.value) for r in raw], [sample_of(r).sink for r in raw]


def check_new_run_ready(handle: Any) -> bool:
    """Every replica of the run has reported metrics (it was built: its savepoint state loaded)."""
    from replication.plan import replica_name

    names = {replica_name(t.name, p, r) for t in handle.plan.tasks for p in range(t.parallelism)
             for r in range(handle.plan.replicas)}
    return names <= set(handle.master.snapshot())


def finish_job(handle: Any) -> tuple[Any, str | None]:
    """Drain ``handle``: its result (None if it failed) and failure."""
    try:
        return handle.drain(timeout=180), None
    except Exception as err:  # noqa: BLE001 - JobFailedError, TimeoutError: recorded
        if handle.running:
            try:
                handle.stop(30)
            except Exception:  # noqa: BLE001 - it failed already; the row says why
                pass
        return None, one_line(err, ERROR_CHARS)


def live_run(ctx: RunContext, size: int) -> RunResult:
    """A fresh job with the chain on 2 of 3 partitions, under load; ``rescale(chain, 3)`` all at once."""
    from replication import run

    args = ctx.args
    s = setup(ctx, size, "live")
    phase = {"text": "starting the job"}
    job = hb.build_handover_job(s.topic, s.out, f"rst-live-{s.stamp}", s.model.entries, s.model.value_bytes,
                                parallelism=2, max_parallelism=3)
    handle = run(job, spark=ctx.spark, conf=s.conf)

    def status_text() -> str:
        m = handle.sink_metrics()
        return (f"{s.labels['size']} live: {phase['text']}; {s.feeder.produced:,} produced, "
                f"{m.records_out // handle.plan.replicas:,} out")

    ticker = hb.Ticker(ctx.status, status_text)
    ticker.start()
    report = error = None
    requested = ended = 0.0
    try:
        handle.wait_started(120)
        s.feeder.start()
        phase["text"] = f"load, rescale in {args.before:.0f}s"
        hb.wait_for_state(handle, s.feeder, len(s.model.keys), args.before)
        phase["text"] = "rescale 2->3 (live handover)"
        requested = time.time()
        try:
            report = handle.rescale(TASK, 3, timeout=60.0, margin_s=args.margin, release_s=args.release,
                                    strategy=AllAtOnce())
        except Exception as err:  # noqa: BLE001 - recorded in the row
            error = one_line(err, ERROR_CHARS)
        ended = time.time()
        phase["text"] = f"rescale {'failed' if error else 'done'}, {args.after:.0f}s more load"
        time.sleep(args.after)
    except Exception as err:  # noqa: BLE001 - the job did not start, or the load failed
        error = error or one_line(err, ERROR_CHARS)
    finally:
        produced, load_error = hb.stop_feeder(s.feeder)
        error = error or load_error
    phase["text"] = "draining"
    _result, failure = finish_job(handle)
    phase["text"] = "reading and verifying the output"
    outputs, sinks, read_error = _read(ctx, s, produced)
    ticker.stop()
    error = error or read_error
    values: dict[str, Any] = {**s.extra, "produced": produced, "error": error or ""}
    values.update(_verdict(s, outputs, produced, failure))
    obs = [hb.Obs(o["ts"] / MS, sink, False) for sink, o in zip(sinks, outputs, strict=True)]
    timeline: list[dict[str, Any]] = []
    if report is not None:
        values.update(live_parts(ended - requested, report["steps"]))
        moved = sorted({v for st in report["steps"] for v in st["vnodes"]})
        values.update(entries_columns(report["entries_moved"], s.model.state(s.model.keys_in(moved))[0]))
        if report["state"] != "completed":
            values["error"] = values["error"] or f"rescale {report['state']}: {report.get('reason')}"
    if obs and requested:
        load = (s.feeder.started_at, s.feeder.ended_at or time.time())
        values.update(latency_columns(obs, requested, ended, load, args.warm_up))
        timeline = timeline_rows(obs, requested, s.labels, args.before, ended, load[0] + args.warm_up)
    return RunResult(run_row(s.labels, **values), timeline)


def restart_run(ctx: RunContext, size: int) -> RunResult:
    """A fresh job with the chain on 2 partitions, under load; drained into a savepoint; the same job
    again with the chain on 3 partitions from it, the load going on throughout."""
    from replication import run

    args = ctx.args
    s = setup(ctx, size, "restart")
    name = f"rst-restart-{s.stamp}"
    root = ctx.savepoints / name
    phase = {"text": "starting the job"}
    marks: dict[str, float] = {}
    handles: list[Any] = []
    written = {"first": 0}  # records the first run wrote

    def job(parallelism: int) -> Any:
        return hb.build_handover_job(s.topic, s.out, name, s.model.entries, s.model.value_bytes,
                                     parallelism=parallelism)

    def status_text() -> str:  # the first run's output, then what it wrote plus the second run's
        current = handles[-1] if handles else None
        out = written["first"] if len(handles) > 1 else 0
        if current is not None and current.master.started_at is not None:
            out += run_output(current)
        gap = f", {time.time() - marks['requested']:.1f}s since the request" if "requested" in marks else ""
        return (f"{s.labels['size']} restart: {phase['text']}{gap}; {s.feeder.produced:,} produced, "
                f"{out:,} out")

    ticker = hb.Ticker(ctx.status, status_text)
    ticker.start()
    error = failure = None
    second = None
    try:
        handles.append(run(job(2), spark=ctx.spark, conf=s.conf))
        first = handles[0]
        first.wait_started(120)
        s.feeder.start()
        phase["text"] = f"load, restart in {args.before:.0f}s"
        hb.wait_for_state(first, s.feeder, len(s.model.keys), args.before)
        phase["text"] = "draining into a savepoint"
        marks["requested"] = time.time()
        try:
            result1 = first.drain(timeout=180, savepoint=root)
        except Exception as err:  # noqa: BLE001 - the first run's failure: no second run
            failure = f"first run: {one_line(err, ERROR_CHARS)}"
            raise
        marks["drained"] = time.time()
        armed = [at for at, text in result1.events
                 if text.startswith("savepoint to ") and at >= marks["requested"]]
        if armed:
            marks["armed"] = armed[0]
        written["first"] = result1.records_written
        phase["text"] = "starting the job from the savepoint (chain x3)"
        restore = {**s.conf, "spark.replication.restoreFrom": str(root)}
        handles.append(run(job(3), spark=ctx.spark, conf=restore))
        second = handles[1]
        marks["launched"] = time.time()
        second.wait_started(120)
        marks["registered"] = time.time()
        phase["text"] = "loading the state"
        deadline = time.monotonic() + 120
        while not check_new_run_ready(second):
            if time.monotonic() > deadline or not second.running:
                raise RuntimeError("the new run's replicas did not all report within 120 s")
            time.sleep(LOAD_POLL_S)
        marks["loaded"] = time.time()
        phase["text"] = "waiting for the first output"
        _wait_for(lambda: second.sink_metrics().records_out > 0, 60, "the new run wrote nothing within 60 s")
        backlog = s.feeder.produced
        phase["text"] = f"catching up with the backlog ({backlog - written['first']:,} records)"
        _wait_for(lambda: written["first"] + run_output(second) >= backlog, CATCH_UP_TIMEOUT_S,
                  f"the new run did not catch up with the {backlog:,} records produced until its first "
                  f"output within {CATCH_UP_TIMEOUT_S:.0f} s")
        phase["text"] = f"caught up, {args.after:.0f}s more load"
        time.sleep(args.after)
    except Exception as err:  # noqa: BLE001 - recorded in the row
        error = one_line(err, ERROR_CHARS)
    finally:
        produced, load_error = hb.stop_feeder(s.feeder)
        error = error or load_error
    if second is not None:
        phase["text"] = "draining the new run"
        result2, failure2 = finish_job(second)
        failure = failure or (f"second run: {failure2}" if failure2 else None)
    else:
        result2 = None
        if handles and handles[0].running:
            finish_job(handles[0])
    phase["text"] = "reading and verifying the output"
    outputs, sinks, read_error = _read(ctx, s, produced)
    ticker.stop()
    error = error or read_error
    values: dict[str, Any] = {**s.extra, "produced": produced, "error": error or "",
                              "spark_app_start_s": ctx.app_start_s,
                              "savepoint_bytes": dir_bytes(root) if root.exists() else ""}
    if not args.keep_savepoints:
        shutil.rmtree(root, ignore_errors=True)
    values.update(_verdict(s, outputs, produced, failure))
    if "drained" in marks:
        if (first_out := first_after(sinks, marks["drained"])) is not None:
            marks["first_output"] = first_out
        values["gap_records"] = sum(1 for o in outputs if marks["requested"] <= o["ts"] / MS
                                    < marks.get("first_output", float("inf")))
    values.update(restart_parts(marks))
    if result2 is not None:
        loaded = sum(m.savepoint_entries for n, m in result2.per_instance.items()
                     if n.startswith(f"{TASK}[") and n.endswith("r0"))
        values.update(entries_columns(loaded, s.model.state(s.model.keys)[0]))
    obs = [hb.Obs(o["ts"] / MS, sink, False) for sink, o in zip(sinks, outputs, strict=True)]
    timeline: list[dict[str, Any]] = []
    if obs and "requested" in marks:
        ended = marks.get("first_output", marks["requested"])
        load = (s.feeder.started_at, s.feeder.ended_at or time.time())
        values.update(latency_columns(obs, marks["requested"], ended, load, args.warm_up))
        timeline = timeline_rows(obs, marks["requested"], s.labels, args.before, marks.get("first_output"),
                                 load[0] + args.warm_up)
    return RunResult(run_row(s.labels, **values), timeline)


def run_output(handle: Any) -> int:
    """Records a run's sinks wrote so far (once, whatever the replication), as last reported."""
    return handle.sink_metrics().records_out // handle.plan.replicas


def _wait_for(cond: Any, timeout: float, error: str, on_tick: Any = None, tick_s: float = 10.0) -> None:
    """Poll ``cond`` every 50 ms; RuntimeError(``error``) after ``timeout`` seconds.  ``on_tick``
    is called every ``tick_s`` seconds while waiting, and once more when giving up."""
    deadline = time.monotonic() + timeout
    next_tick = time.monotonic() + tick_s
    while not cond():
        now = time.monotonic()
        if now > deadline:
            if on_tick is not None:
                on_tick()
            raise RuntimeError(error)
        if on_tick is not None and now >= next_tick:
            on_tick()
            next_tick = now + tick_s
        time.sleep(0.05)


def _read(ctx: RunContext, s: Setup, produced: int) -> tuple[list[dict], list[float], str | None]:
    if not produced:
        return [], [], None
    try:
        outputs, sinks = read_outputs(ctx.stack.bootstrap_servers, s.out)
    except Exception as err:  # noqa: BLE001 - no output to verify: recorded
        return [], [], f"reading the output: {one_line(err, ERROR_CHARS)}"
    forget_topics(ctx.stack.bootstrap_servers, s.stamp)
    return outputs, sinks, None


def _verdict(s: Setup, outputs: list[dict], produced: int, failure: str | None) -> dict[str, Any]:
    if not produced:
        return {"exact": "no", "outcome": failure or "nothing produced"}
    verdict = hb.verify(outputs, s.feeder.ids, s.model.entries, failure)
    return {"exact": "yes" if verdict.exact else "no", "outcome": verdict.outcome,
            "records": verdict.chains.records}


# ------------------------------------------------------------------------------------------ the command
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MB,20MB",
                    help="total state sizes, comma-separated (1MB = 10^6 bytes)")
    ap.add_argument("--ways", default=",".join(WAYS),
                    help="comma-separated, of: live, restart (each on every size)")
    ap.add_argument("--rate", type=float, default=200.0, help="offered events/s, round robin over the keys")
    ap.add_argument("--before", type=float, default=8.0, help="seconds of load before the request")
    ap.add_argument("--after", type=float, default=5.0,
                    help="seconds of load after the operation (restart: after the backlog was caught up)")
    ap.add_argument("--keys-per-vnode", type=int, default=1, help="keys in every vnode")
    ap.add_argument("--value-bytes", type=int, default=1000, help="bytes of one pad entry")
    ap.add_argument("--margin", type=float, default=0.5,
                    help="live: the switch pulse this far ahead (margin_s)")
    ap.add_argument("--release", type=float, default=0.3,
                    help="live: the release after the switch (release_s)")
    ap.add_argument("--period", type=int, default=10, help="LiveRobin heartbeat period (ms)")
    ap.add_argument("--warm-up", type=float, default=3.0, help="seconds of load not counted in 'before'")
    ap.add_argument("--savepoint-dir", default=None,
                    help="where the savepoints go (default: a temporary directory, removed at the end)")
    ap.add_argument("--keep-savepoints", action="store_true",
                    help="do not delete each savepoint after its run")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: --sizes 1MB --before 5 --after 3 (unless given)")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw restart.png from the CSV files under --out")
    ap.add_argument("--out", default=str(REPO / "bench/results/restart"))
    raw = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(raw)
    if args.quick:
        given = {a.split("=", 1)[0] for a in raw}
        for flag, value in (("--sizes", "1MB"), ("--before", 5.0), ("--after", 3.0)):
            if flag not in given:
                setattr(args, flag[2:], value)
    try:
        args.sizes = [hb.parse_size(x) for x in args.sizes.split(",") if x.strip()]
    except argparse.ArgumentTypeError as err:
        ap.error(str(err))
    args.ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if not args.sizes or not args.ways:
        ap.error("--sizes and --ways must not be empty")
    if unknown := [w for w in args.ways if w not in WAYS]:
        ap.error(f"--ways: unknown {', '.join(unknown)} (choose from {', '.join(WAYS)})")
    for flag in ("keys_per_vnode", "value_bytes", "period"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.before < 0 or args.after < 0:
        ap.error("--before and --after must be >= 0")
    args.runs = [(size, way) for size in args.sizes for way in args.ways]
    return args


@dataclass
class Results:
    runs: list[dict] = field(default_factory=list)  # restart.csv
    timeline: list[dict] = field(default_factory=list)  # restart_timeline.csv


def run_benchmark(ctx: RunContext, res: Results, out: Path | None = None) -> Results:
    t0 = time.monotonic()
    for i, (size, way) in enumerate(ctx.args.runs):
        n = len(ctx.args.runs)
        print(f"== run {i + 1}/{n} {bar(i / n, 12)}: {size / MB:g}MB of state, {way}, "
              f"{ctx.args.rate:.0f} events/s ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
        try:
            done = (live_run if way == "live" else restart_run)(ctx, size)
        except Exception as err:  # noqa: BLE001 - e.g. the job could not be planned: a row of its own
            ctx.status.done()
            done = RunResult(run_row({"size": f"{size / MB:g}MB", "way": way},
                                     error=one_line(err, ERROR_CHARS), exact="no"))
        res.runs.append(done.row)
        res.timeline += done.timeline
        print("   " + format_row(shown(done.row)), flush=True)
        if out is not None:
            write_csvs(out, res)
    return res


def print_table(res: Results) -> None:
    print_plain_table("rescale 2 -> 3: live handover vs drain + savepoint + restart (seconds; latency by event "
                      "time, ms)", [shown(r) for r in res.runs], SHOWN)
    for r in res.runs:
        if r["error"] or r["exact"] != "yes" or r["entries_match"] == "no":
            print(f"   {r['size']} {r['way']}: error {r['error'] or '-'}; output {r['outcome'] or '-'}; "
                  f"entries {r['entries']} vs model {r['entries_model']}")


def problems(res: Results) -> list[str]:
    return [f"{r['size']} {r['way']}" for r in res.runs
            if r["error"] or r["exact"] != "yes" or r["entries_match"] == "no"]


def write_csvs(out: Path, res: Results) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("restart", res.runs), ("restart_timeline", res.timeline)):
        if rows:
            write_csv(out / f"{name}.csv", rows, digits=3)  # the live phases to the ms
    write_machine(out)


def load_results(out: Path) -> Results:
    """The CSV files under ``out`` back (numbers as floats)."""
    return Results(read_csv_rows(out / "restart.csv"), read_csv_rows(out / "restart_timeline.csv"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.replot:
        plot(out, load_results(out))
        print(f"wrote {out / 'restart.png'}")
        return 0
    from deploy.stack import EmbeddedStack, require_java17
    from replication.spark_cluster import build_session, stop_session

    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    t0 = time.monotonic()
    res = Results()
    temp = args.savepoint_dir is None
    savepoints = Path(args.savepoint_dir or tempfile.mkdtemp(prefix="restart-bench-"))
    savepoints.mkdir(parents=True, exist_ok=True)
    try:
        with EmbeddedStack() as stack:
            started = time.monotonic()
            spark = build_session("local-cluster[3,1,512]", app_name="bench-restart")
            app_start_s = time.monotonic() - started
            print(f"== Spark application started in {app_start_s:.1f}s (session and 3 executors)", flush=True)
            try:
                run_benchmark(RunContext(stack, spark, args, StatusLine(), savepoints, app_start_s), res, out)
            finally:
                stop_session(spark)
    finally:  # interrupted too: what was measured is written
        write_csvs(out, res)
        if res.runs:
            plot(out, res)
        if temp and not args.keep_savepoints:
            shutil.rmtree(savepoints, ignore_errors=True)
    print_table(res)
    names = [n for n in ("restart.csv", "restart_timeline.csv", "restart.png") if (out / n).exists()]
    print(f"wrote {', '.join(names)} under {out} in {time.monotonic() - t0:.0f}s")
    if bad := problems(res):
        print(f"NOT OK: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


# ------------------------------------------------------------------------------------------ plot
WAY_COLORS = {"live": "#4c72b0", "restart": "#c44e52"}
PART_COLORS = {"trigger_s": "#a6bddb", "to_switch+alignment_s": "#6f94cd",
               "transfer+release_wait_s": "#4c72b0", "load+catch_up_s": "#2b4c8c", "acks_s": "#16284d",
               "drain_s": "#e8a0a0", "launch_s": "#dd8452", "workers_s": "#c4ad66", "restore_s": "#55a868",
               "first_output_s": "#8172b3", "other_s": "#bbbbbb"}
PART_NAMES = {"trigger_s": "live: trigger (-> committed)",
              "to_switch+alignment_s": "live: to switch + alignment (-> cut)",
              "transfer+release_wait_s": "live: transfer + release wait (-> at the targets, released)",
              "load+catch_up_s": "live: load + catch-up (-> held records processed)",
              "acks_s": "live: acks (-> the driver knows)",
              "drain_s": "restart: drain + savepoint write",
              "launch_s": "restart: run() (plan, warm-up, submit)",
              "workers_s": "restart: workers register",
              "restore_s": "restart: replicas built, state restored",
              "first_output_s": "restart: -> first output",
              "other_s": "live: outside the step (before its instruction, after its completion)"}


def _num(v: Any) -> float:
    return v if isinstance(v, (int, float)) else 0.0


def plot(out: Path, res: Results) -> None:
    """``restart.png``: per state size, the per-second p99 (solid) and max (dotted) latency by event time
    around the request, live vs restart (a shaded span: the operation); below, each run's duration by part,
    with the savepoint's size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r["size"] for r in res.runs))
    fig = plt.figure(figsize=(max(12, 6.5 * len(sizes)), 10))
    grid = fig.add_gridspec(2, max(len(sizes), 1))
    for k, size in enumerate(sizes):
        ax = fig.add_subplot(grid[0, k])
        drawn = False
        for r in (r for r in res.runs if r["size"] == size):
            way, color = r["way"], WAY_COLORS.get(r["way"], "k")
            pts = [t for t in res.timeline if t["size"] == size and t["way"] == way and t["p99_ms"] != ""]
            verdict = "exact" if r["exact"] == "yes" else "NOT exact"
            dur = f"{r['op_s']:.1f}s" if r["op_s"] != "" else "failed"
            ax.plot([t["second"] for t in pts], [t["p99_ms"] for t in pts], color=color, marker=".",
                    label=f"{way}: p99 per second ({dur}, {verdict})")
            ax.plot([t["second"] for t in pts], [t["max_ms"] for t in pts], color=color, linestyle=":",
                    label=f"{way}: max per second")
            drawn = drawn or bool(pts)
            if r["op_s"] != "":
                ax.axvspan(0, r["op_s"], color=color, alpha=.12)
        ax.axvline(0, color="k", linestyle="--", linewidth=1)
        ax.set(xlabel="event second since the request (shaded: the operation)",
               ylabel="producer → sink latency (ms)", yscale="log" if drawn else "linear",
               title=f"Rescale 2→3 under load, {size} of state" + ("" if drawn else ": no output"))
        ax.grid(alpha=.3, which="both")
        ax.legend(fontsize="x-small")

    ax = fig.add_subplot(grid[1, :])
    names = [f"{r['size']} {r['way']}" for r in res.runs]
    bottom = [0.0] * len(res.runs)
    for col in (*LIVE_PARTS, *RESTART_PARTS, "other_s"):
        vals = [max(0.0, _num(part(r, col))) for r in res.runs]
        if any(vals):
            ax.bar(range(len(vals)), vals, bottom=bottom, color=PART_COLORS[col], label=PART_NAMES[col])
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, r in enumerate(res.runs):
        label = f"{r['op_s']:.1f}s" if r["op_s"] != "" else "failed"
        if r.get("savepoint_bytes") not in ("", None):
            label += f"\nsavepoint {r['savepoint_bytes'] / MB:.1f} MB"
        ax.annotate(label, (i, bottom[i]), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(range(len(names)), names)
    ax.set(ylabel="seconds (request -> serving again)", title="Duration of the rescale by part")
    ax.set_ylim(0, max(bottom, default=1.0) * 1.25 or 1.0)
    ax.grid(alpha=.3, axis="y")
    ax.legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "restart.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
