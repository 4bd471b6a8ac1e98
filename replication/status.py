"""The per-job status file the driver publishes for tooling (``replication replicas``/``kill``/``status``).

One JSON file per running job, at :func:`status_path`::

    {"job": "fraud-monitor", "app_id": "app-...-0000", "driver_pid": 123, "updated": 1795292584.1,
     "state": "running",
     "workers": {"0": {"executor": "1", "address": "127.0.0.1:4567", "python_pid": 2345,
                       "attempt": 0, "alive": true}},
     "replicas": {"fraud-rule[0]r1": {"task": 3, "partition": 0, "replica": 1, "worker": 1}}}

The driver also publishes ``sinks`` (writer replica -> epoch, committed seq), ``events`` (the
last 50), ``checkpoints`` (Rhino: per partition its group and last completed checkpoint),
``divergences``, ``metrics`` (per replica), ``ordering``, ``replicated``, ``rhino``, ``tasks``
(the task graph), ``lost`` (replicas lost and not restored), ``recoveries``,
``checkpoints_compared``, ``metrics_url`` and ``durable`` (the checkpoint directory's last cut);
:func:`format_status` renders it all for
``replication status``.

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

from replication.procfs import alive

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


# -- `replication status JOB` ---------------------------------------------------------------------
def _pid_alive(pid: Any) -> bool:
    return isinstance(pid, int) and alive(pid)


def _ago(then: Any, now: float) -> str:
    return f"{max(0.0, now - then):.1f} s ago" if isinstance(then, (int, float)) else "?"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            .rstrip() for r in rows]


def _role(name: str, m: dict[str, Any], sinks: dict[str, Any]) -> str:
    roles = []
    if name in sinks:  # the driver's word on who writes a sink partition
        epoch = sinks[name].get("epoch", 0)
        roles.append(f"writer (epoch {epoch})" if epoch else "writer")
    elif any(w.rsplit("r", 1)[0] == name.rsplit("r", 1)[0] for w in sinks):  # its twin writes
        roles.append("standby")
    elif m.get("role"):
        roles.append(str(m["role"]))
    if m.get("leader"):
        roles.append(f"leader (epoch {m.get('order_epoch', '?')})")
    elif m.get("order_epoch", -1) >= 0:
        roles.append("follower")
    return ", ".join(roles) or "-"


def format_status(status: dict[str, Any], now: float | None = None) -> str:
    """``replication status``: the job's tasks, then per partition where each replica runs, its role,
    counters and lag, the partition's last completed checkpoint and replica group, then recoveries,
    divergences and recent events.  Fields missing from older status files are shown as ``-``."""
    now = time.time() if now is None else now
    workers = status.get("workers") or {}
    metrics = status.get("metrics") or {}
    sinks = status.get("sinks") or {}
    lost = set(status.get("lost") or ())
    checkpoints = status.get("checkpoints") or {}
    driver = status.get("driver_pid")
    driver_note = "alive" if _pid_alive(driver) else "gone" + (
        ": this status is stale" if status.get("state") == "running" else "")
    out = [f"job {status.get('job')}: {status.get('state')}, application {status.get('app_id')}, driver pid "
           f"{driver} ({driver_note}), status updated {_ago(status.get('updated'), now)}"]
    alive = sum(1 for w in workers.values() if w.get("alive", True))
    out.append(f"ordering {status.get('ordering', '-')}, "
               f"{'2 replicas per partition' if status.get('replicated', True) else 'not replicated'}, "
               f"Rhino checkpoints {'on' if status.get('rhino') else 'off'}; "
               f"workers: {alive} alive, {len(workers) - alive} dead")
    if status.get("metrics_url"):
        out.append(f"Prometheus metrics: {status['metrics_url']}")
    if status.get("tasks"):
        out.append("tasks:")
        out += [f"  task {t['id']} {t['name']} x{t['parallelism']}: {' -> '.join(t.get('operators', []))}  "
                f"(inputs: {', '.join(t.get('inputs') or []) or 'kafka'})" for t in status["tasks"]]

    for task, r in (status.get("routing") or {}).items():
        counts = r.get("vnodes") or []
        spare = len(counts) - int(r.get("active", len(counts)))
        out.append(f"  vnodes of {task} (epoch {r.get('epoch', 0)}): "
                   + ", ".join(f"p{p} {n}" for p, n in enumerate(counts))
                   + (f"  ({spare} spare partition(s) for rescale)" if spare > 0 else ""))
    if status.get("handovers"):
        out.append("handovers in progress:")
        out += [f"  handover {h['id']} of {h['task']}: {h['what']}, {h['state']}" for h in status["handovers"]]
    window = status.get("pulse_window")
    if window and window[1]:
        out.append(f"pulse window {window[0]} open: the sources hold their records for pulses (KaZoo handover)")
    if status.get("drained"):
        out.append(f"drained workers (no replica is restored there): {', '.join(map(str, status['drained']))}")

    # replicas grouped by partition, in plan order
    parts: dict[tuple[int, int], list[tuple[int, str, dict[str, Any]]]] = {}
    for name, e in (status.get("replicas") or {}).items():
        parts.setdefault((int(e["task"]), int(e["partition"])), []).append((int(e["replica"]), name, e))
    with_cp = bool(status.get("rhino") or checkpoints)
    header = ["PARTITION", "REPLICA", "WORKER", "EXECUTOR", "ROLE", "STATE", "IN", "OUT", "LAG", "QUEUE", "P99 MS"]
    header += ["LAST CHECKPOINT", "GROUP"] if with_cp else []
    rows = [header]
    for (_, p), reps in sorted(parts.items()):
        reps.sort()
        task = reps[0][1].rsplit("[", 1)[0]
        part = f"{task}[{p}]"

        def is_lost(name: str, e: dict[str, Any]) -> bool:
            w = workers.get(str(e.get("worker")))
            return name in lost or (w is not None and not w.get("alive", True))

        live = [(name, metrics[name]) for _, name, e in reps if not is_lost(name, e) and name in metrics]
        pulses = any(m.get("pulse", 0) > 0 for _, m in live)
        top = max((m.get("pulse", 0) if pulses else m.get("in", 0) for _, m in live
                   if pulses or m.get("restored_from", -1) < 0), default=0)
        for i, (r, name, e) in enumerate(reps):
            m = metrics.get(name, {})
            w = workers.get(str(e.get("worker")), {})
            if is_lost(name, e):
                state, lag = "LOST", "-"
            else:
                state = "finished" if m.get("finished") else "live" if m else "not reported"
                if m.get("restored_from", -1) >= 0:
                    state += f" (restored from {m['restored_from']})"
                comparable = pulses or m.get("restored_from", -1) < 0
                lag = f"{top - (m.get('pulse', 0) if pulses else m.get('in', 0)):,}" if m and comparable else "-"
            row = [part if i == 0 else "", f"r{r}", str(e.get("worker", "-")), str(w.get("executor") or "-"),
                   _role(name, m, sinks), state, f"{m['in']:,}" if "in" in m else "-",
                   f"{m['out']:,}" if "out" in m else "-", lag, str(m.get("queue", "-")),
                   f"{m['p99_ms']:g}" if m.get("p99_ms") else "-"]
            if with_cp:
                cp = checkpoints.get(part, {})
                row += ["", ""] if i else [
                    f"{cp['completed']} ({_ago(cp.get('completed_at'), now)})" if "completed" in cp else "none yet",
                    ", ".join(map(str, cp.get("group", []))) or "-"]
            rows.append(row)
    out += ["", "ROLE: writer/standby = the sink replica writing to Kafka and its twin; leader/follower = KaZoo "
            "ordering. LAG: how far the replica trails the furthest live replica of its partition, in "
            "LiveRobin pulses when the job has them, else in input records ('-' for a restored replica, whose "
            "counters restarted). QUEUE: input batches waiting." + (
                " GROUP: the workers holding the partition's checkpoints." if with_cp else "")]
    out += _table(rows, right={6, 7, 8, 9, 10}) if len(rows) > 1 else ["(no replicas yet)"]

    out.append("")
    recoveries = status.get("recoveries") or []
    out.append(f"recoveries (two live replicas again): {len(recoveries)}")
    out += [f"  {r.get('replica')} restored on worker {r.get('worker')} from checkpoint {r.get('checkpoint_id')}, "
            f"caught up {r.get('recovery_s', 0):.2f} s after the failure ({_ago(r.get('caught_up_at'), now)})"
            for r in recoveries[-10:]]
    durable = status.get("durable")
    if durable:
        last = durable.get("last_cut")
        out.append(f"durable checkpoints in {durable.get('uri')}: " + (
            f"cut {last} written {_ago(durable.get('last_cut_at'), now)}" if last is not None else "no cut written yet")
            + f", {durable.get('cuts_written', 0)} this run" + (
                f", {durable['failures']} failed writes" if durable.get("failures") else "") + (
                f"; no newer cut until a handover's participants checkpoint after it (waiting "
                f"{max(0.0, now - held):.1f} s)" if isinstance(held := durable.get("held_by_handover_since"), (int, float))
                else ""))
    divergences = status.get("divergences") or []
    compared = status.get("checkpoints_compared")
    out.append(f"divergences: {len(divergences) or 'none'}"
               + (f" ({compared:,} checkpoints compared)" if isinstance(compared, int) else ""))
    out += [f"  {d}" for d in divergences]
    events = status.get("events") or []
    out.append(f"recent events (failovers, restores, failures; newest last): {'none' if not events else ''}".rstrip())
    out += [f"  {_ago(ev.get('time'), now):>12}  {ev.get('text')}" for ev in events[-15:]]
    return "\n".join(out)
