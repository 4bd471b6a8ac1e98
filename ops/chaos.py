"""Fault injection on the processes hosting a job's replicas (tests, demo, :mod:`ops.chaos_cli`).

A replica runs inside a *worker* (a long-running Spark task) in a PySpark
Python worker process, a descendant of an executor JVM
(``org.apache.spark.executor.CoarseGrainedExecutorBackend --executor-id N
--app-id A``). :func:`locate` follows the job's status file
(:mod:`replication.status`) from a replica name to its worker, executor id
and Python pid, and finds the executor JVM in ``/proc`` (executors on this
machine only, e.g. ``local-cluster``). The actions then hit that process:

* :func:`kill_executor`: SIGKILL the executor JVM (a crashed host).
* :func:`pause_executor` / :func:`resume_executor`: SIGSTOP / SIGCONT the
  JVM and all its descendants, Python workers included (a hung host).
* :func:`kill_python`: SIGKILL only the Python worker hosting the replica.

Safety: a pid is signalled only if, checked again right before the signal,
it still is the job's executor JVM (its command line names the
CoarseGrainedExecutorBackend with the job's ``--app-id`` and the expected
``--executor-id``) or a descendant of it (a Python process, for
:func:`kill_python`), the job's status says ``running`` and its driver pid
is alive. Signals go through a pidfd opened *before* that check, so a pid
reused after the check cannot be hit. Anything else raises
:class:`ChaosRefused`. (:func:`resume_executor` skips the job-state check:
SIGCONT cannot hurt, and a paused executor must stay resumable after its
job stopped.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replication import procfs
from replication.status import read_status

#: the main class of a standalone / local-cluster executor JVM
EXECUTOR_BACKEND = "CoarseGrainedExecutorBackend"

#: how far up the parent chain a Python worker may sit below its executor JVM
_MAX_DEPTH = 32

ACTIONS = ("kill-executor", "pause-executor", "resume-executor", "kill-python")


class ChaosError(RuntimeError):
    """A replica or executor could not be located (unknown name, not on this machine, gone)."""


class UnknownReplica(ChaosError, LookupError):
    """The job has no replica of that name."""


class ChaosRefused(ChaosError):
    """A safety check failed: the process is not (or no longer) the job's executor or worker."""


@dataclass(frozen=True, kw_only=True)
class ExecutorTarget:
    """An executor JVM of a running job, on this machine."""

    job: str
    app_id: str
    driver_pid: int
    executor: str
    jvm_pid: int
    #: the status dict this was located from, re-checked before signalling;
    #: None: re-read the job's status file instead
    status_snapshot: Mapping[str, Any] | None = field(default=None, repr=False, compare=False, hash=False)


@dataclass(frozen=True, kw_only=True)
class ReplicaProcess(ExecutorTarget):
    """Where a replica runs: its worker, the executor JVM and the Python worker process."""

    replica: str
    worker: int
    python_pid: int


@dataclass(frozen=True)
class ReplicaRow:
    """One line of :func:`list_replicas`."""

    replica: str
    task: int | None
    partition: int | None
    index: int | None
    worker: int | None
    attempt: int | None
    executor: str | None
    address: str | None
    python_pid: int | None
    jvm_pid: int | None
    alive: bool
    note: str
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # as last reported to the driver


# --------------------------------------------------------------------------- /proc (replication.procfs)

_cmdline, _stat, _state, _alive, _arg, _pids = (procfs.cmdline, procfs.stat, procfs.state, procfs.alive,
                                                  procfs.arg, procfs.pids)
_is_python, descendants = procfs.is_python, procfs.descendants


def _is_executor_cmdline(argv: list[str]) -> bool:
    return any(a.endswith("." + EXECUTOR_BACKEND) for a in argv)


def executor_jvms(app_id: str) -> dict[str, list[int]]:
    """Executor id -> pids of the live executor JVMs of application ``app_id`` on this machine."""
    found: dict[str, list[int]] = {}
    for pid in _pids():
        try:
            argv = _cmdline(pid)
        except OSError:
            continue
        if not _is_executor_cmdline(argv) or _arg(argv, "--app-id") != app_id:
            continue
        eid = _arg(argv, "--executor-id")
        if eid is not None and _alive(pid):
            found.setdefault(eid, []).append(pid)
    return found


def _is_descendant(pid: int, root: int) -> bool:
    return root in procfs.ancestors(pid, _MAX_DEPTH)


# --------------------------------------------------------------------------- safety checks


def _check_job(status: Mapping[str, Any], job: str, app_id: str | None = None) -> None:
    """Refuse unless the job is running under a live driver (and still is application ``app_id``)."""
    state = status.get("state")
    if state != "running":
        raise ChaosRefused(f"job {job!r} is {state!r}, not 'running': refusing to signal its processes")
    if app_id is not None and status.get("app_id") != app_id:
        raise ChaosRefused(
            f"job {job!r} now runs as application {status.get('app_id')!r}, not {app_id!r}: locate it again"
        )
    driver = status.get("driver_pid")
    if not isinstance(driver, int) or not _alive(driver):
        raise ChaosRefused(
            f"driver pid {driver} of job {job!r} is not alive (stale status file?): refusing to signal"
        )


def _recheck_job(target: ExecutorTarget) -> None:
    if target.status_snapshot is not None:
        status: Mapping[str, Any] = target.status_snapshot
    else:
        try:
            status = read_status(target.job)
        except FileNotFoundError as err:
            raise ChaosRefused(f"{err}: the job has ended, refusing to signal") from None
    _check_job(status, target.job, target.app_id)


def _verify_executor(pid: int, target: ExecutorTarget) -> None:
    """Refuse unless ``pid`` is the live executor JVM ``target.executor`` of ``target.app_id``."""
    state = _state(pid)
    if state is None or state in ("Z", "X"):
        raise ChaosError(f"executor {target.executor} (jvm pid {pid}) has exited")
    try:
        argv = _cmdline(pid)
    except OSError as err:
        raise ChaosRefused(f"cannot read the command line of pid {pid}: {err}") from None
    if not _is_executor_cmdline(argv):
        raise ChaosRefused(f"pid {pid} is not a Spark {EXECUTOR_BACKEND} ({' '.join(argv)[:120]!r})")
    app = _arg(argv, "--app-id")
    if app != target.app_id:
        raise ChaosRefused(f"pid {pid} is an executor of application {app!r}, not {target.app_id!r}")
    eid = _arg(argv, "--executor-id")
    if eid != target.executor:
        raise ChaosRefused(f"pid {pid} is executor {eid!r}, not {target.executor!r}")


def _verify_descendant(pid: int, target: ExecutorTarget, *, python: bool) -> None:
    if not _alive(pid):
        raise ChaosError(f"pid {pid} has exited")
    if not _is_descendant(pid, target.jvm_pid):
        raise ChaosRefused(
            f"pid {pid} does not descend from executor {target.executor} (jvm pid {target.jvm_pid})"
        )
    if python and not _is_python(pid):
        raise ChaosRefused(f"pid {pid} is not a Python process")


class _Pid:
    """A handle on one process: a pidfd where available, so a pid reused later is never signalled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise ChaosError(f"pid {pid} has exited") from None
        except (AttributeError, OSError):  # no pidfd (old kernel / platform): plain kill after the check
            self.fd = None

    def send(self, sig: int) -> None:
        if self.fd is None:
            os.kill(self.pid, sig)
        else:
            signal.pidfd_send_signal(self.fd, sig)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_verified(pid: int, verify: Callable[[int], None]) -> _Pid | None:
    """A handle on ``pid`` if it passes ``verify``; None if it exited or failed the check."""
    try:
        handle = _Pid(pid)
    except ChaosError:
        return None
    try:
        verify(pid)
    except ChaosError:
        handle.close()
        return None
    return handle


def _signal(pid: int, sig: int, verify: Callable[[int], None]) -> None:
    """Send ``sig`` to ``pid`` if ``verify(pid)`` passes; the pidfd is opened before the check."""
    handle = _Pid(pid)
    try:
        verify(pid)
        handle.send(sig)
    finally:
        handle.close()


# --------------------------------------------------------------------------- locate


def _status_for(job: str | None, status: Mapping[str, Any] | None) -> tuple[str, Mapping[str, Any]]:
    if status is None:
        if job is None:
            raise ValueError("locate needs a job name or a status dict")
        return job, read_status(job)
    name = status.get("job")
    if job is not None and name is not None and name != job:
        raise ValueError(f"the status given is for job {name!r}, not {job!r}")
    if job is None and not isinstance(name, str):
        raise ValueError("the status given has no job name; pass job=")
    return str(job or name), status


def _find_jvm(app_id: str, executor: str) -> int:
    pids = executor_jvms(app_id).get(executor, [])
    if not pids:
        raise ChaosError(
            f"no executor JVM with --executor-id {executor} --app-id {app_id} on this machine "
            "(it exited, or runs on another host)"
        )
    if len(pids) > 1:
        raise ChaosRefused(f"several JVMs claim to be executor {executor} of {app_id}: {pids}")
    return pids[0]


def _app_id(status: Mapping[str, Any], job: str) -> str:
    app_id = status.get("app_id")
    if not isinstance(app_id, str) or not app_id:
        raise ChaosError(f"the status of job {job!r} has no app_id")
    return app_id


def locate(replica: str, *, job: str | None = None, status: Mapping[str, Any] | None = None) -> ReplicaProcess:
    """Find the processes hosting ``replica`` of a running job.

    Reads the job's status file (or uses ``status``), then finds the executor
    JVM in ``/proc`` and checks the worker's Python pid is alive and descends
    from it. Raises :class:`UnknownReplica` (listing the known replicas),
    :class:`ChaosError` when a process cannot be found, :class:`ChaosRefused`
    when the job is not running or the processes do not match.
    """
    job_name, st = _status_for(job, status)
    _check_job(st, job_name)
    app_id = _app_id(st, job_name)
    replicas = st.get("replicas") or {}
    entry = replicas.get(replica)
    if entry is None:
        known = ", ".join(sorted(replicas, key=_natural)) or "(none)"
        raise UnknownReplica(f"job {job_name!r} has no replica {replica!r}; known replicas: {known}")
    worker = int(entry["worker"])
    w = (st.get("workers") or {}).get(str(worker))
    if w is None:
        raise ChaosError(f"replica {replica} is placed on worker {worker}, which has not registered yet")
    if not w.get("alive", True):
        raise ChaosError(
            f"worker {worker} hosting {replica} was declared dead by the driver (it is being relaunched); "
            "try again in a few seconds"
        )
    executor = str(w["executor"])
    python_pid = int(w["python_pid"])
    target = ReplicaProcess(
        job=job_name, app_id=app_id, driver_pid=int(st["driver_pid"]), executor=executor,
        jvm_pid=_find_jvm(app_id, executor), replica=replica, worker=worker, python_pid=python_pid,
        status_snapshot=status,
    )
    if not _alive(python_pid):
        raise ChaosError(
            f"python pid {python_pid} of worker {worker} (hosting {replica}) is not alive; "
            "the driver may not have noticed yet"
        )
    _verify_descendant(python_pid, target, python=True)
    return target


def locate_executor(
    executor: str, *, job: str | None = None, status: Mapping[str, Any] | None = None
) -> ExecutorTarget:
    """Find the JVM of executor ``executor`` of a running job (e.g. to resume one that lost its replicas)."""
    job_name, st = _status_for(job, status)
    _check_job(st, job_name)
    app_id = _app_id(st, job_name)
    return ExecutorTarget(
        job=job_name, app_id=app_id, driver_pid=int(st["driver_pid"]), executor=str(executor),
        jvm_pid=_find_jvm(app_id, str(executor)), status_snapshot=status,
    )


# --------------------------------------------------------------------------- actions


def kill_executor(target: ExecutorTarget) -> list[int]:
    """SIGKILL the executor JVM. Descendants left paused by :func:`pause_executor` are SIGKILLed too
    (a stopped process would never notice its executor died). Returns the pids signalled."""
    _recheck_job(target)
    jvm = _Pid(target.jvm_pid)
    paused: list[_Pid] = []
    try:
        _verify_executor(target.jvm_pid, target)
        for pid in descendants(target.jvm_pid):
            if _state(pid) == "T":
                handle = _open_verified(pid, lambda p: _verify_descendant(p, target, python=False))
                if handle is not None:
                    paused.append(handle)
        jvm.send(signal.SIGKILL)
        done = [target.jvm_pid]
        for handle in paused:
            with contextlib.suppress(OSError):
                handle.send(signal.SIGKILL)
                done.append(handle.pid)
        return done
    finally:
        jvm.close()
        for handle in paused:
            handle.close()


def pause_executor(target: ExecutorTarget) -> list[int]:
    """SIGSTOP the executor JVM, then all its descendants (Python workers too): a hung host.

    The JVM is stopped first so it cannot start new children; descendants are
    then stopped until no new one shows up. Returns the pids signalled.
    """
    _recheck_job(target)
    _signal(target.jvm_pid, signal.SIGSTOP, lambda pid: _verify_executor(pid, target))
    done = [target.jvm_pid]
    for _ in range(10):
        fresh = [p for p in descendants(target.jvm_pid) if p not in done]
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(ChaosError):  # a child exiting meanwhile is not an error
                _signal(pid, signal.SIGSTOP, lambda p: _verify_descendant(p, target, python=False))
                done.append(pid)
    return done


def resume_executor(target: ExecutorTarget) -> list[int]:
    """SIGCONT the executor JVM and all its descendants. Returns the pids signalled.

    Checks the JVM is the job's executor, but not that the job still runs:
    a paused executor must stay resumable.
    """
    _signal(target.jvm_pid, signal.SIGCONT, lambda pid: _verify_executor(pid, target))
    done = [target.jvm_pid]
    for pid in descendants(target.jvm_pid):
        with contextlib.suppress(ChaosError):
            _signal(pid, signal.SIGCONT, lambda p: _verify_descendant(p, target, python=False))
            done.append(pid)
    return done


def kill_python(target: ReplicaProcess) -> list[int]:
    """SIGKILL only the Python worker process hosting the replica. Returns the pids signalled."""
    _recheck_job(target)

    def verify(pid: int) -> None:
        _verify_executor(target.jvm_pid, target)
        _verify_descendant(pid, target, python=True)

    _signal(target.python_pid, signal.SIGKILL, verify)
    return [target.python_pid]


def paused_executors(app_id: str) -> dict[str, int]:
    """Executor id -> JVM pid of the application's executors that are stopped (state T)."""
    return {eid: pids[0] for eid, pids in executor_jvms(app_id).items() if _state(pids[0]) == "T"}


# --------------------------------------------------------------------------- listing


def _natural(name: str) -> list[Any]:
    """Sort key putting ``op[2]r0`` before ``op[10]r0``."""
    out: list[Any] = []
    num = ""
    for ch in name + "\0":
        if ch.isdigit():
            num += ch
            continue
        if num:
            out.append((0, int(num), ""))
            num = ""
        out.append((1, 0, ch))
    return out


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def list_replicas(job: str | None = None, *, status: Mapping[str, Any] | None = None) -> list[ReplicaRow]:
    """One row per replica of the job: its worker, executor, pids and whether it is alive.

    Works for a job in any state (display only, nothing is signalled).
    """
    job_name, st = _status_for(job, status)
    app_id = st.get("app_id")
    jvms = executor_jvms(app_id) if isinstance(app_id, str) and app_id else {}
    workers = st.get("workers") or {}
    rows = []
    for name, entry in sorted((st.get("replicas") or {}).items(), key=lambda kv: _natural(kv[0])):
        worker = _int_or_none(entry.get("worker"))
        w = workers.get(str(worker)) if worker is not None else None
        executor = None if w is None or w.get("executor") is None else str(w["executor"])
        python_pid = None if w is None else _int_or_none(w.get("python_pid"))
        jvm = jvms.get(executor or "", [])
        jvm_pid = jvm[0] if len(jvm) == 1 else None
        if w is None:
            alive, note = False, "not registered"
        elif not w.get("alive", True):
            alive, note = False, "declared dead"
        elif python_pid is None or not _alive(python_pid):
            alive, note = False, "process gone"
        elif jvm_pid is not None and _state(jvm_pid) == "T":
            alive, note = True, "paused"
        else:
            alive, note = True, ""
        rows.append(ReplicaRow(
            replica=name, task=_int_or_none(entry.get("task")), partition=_int_or_none(entry.get("partition")),
            index=_int_or_none(entry.get("replica")), worker=worker,
            attempt=None if w is None else _int_or_none(w.get("attempt")), executor=executor,
            address=None if w is None else w.get("address"), python_pid=python_pid, jvm_pid=jvm_pid,
            alive=alive, note=note, metrics=(st.get("metrics") or {}).get(name, {}),
        ))
    return rows
