"""The thin layer between the replication runtime and Spark.

Creates the Spark session (``local-cluster[N,C,MB]`` or any master), lists
executors, warms up Python on every executor, tells a task which executor it
runs on, and kills executor processes for fault tests (local masters only).

Facts this module relies on (measured on pip PySpark 4.3, ``local-cluster``):

* The pip wheel runs ``local-cluster`` out of the box (Java 17 on PATH, no
  ``SPARK_HOME`` needed: PySpark uses its package directory as Spark home).
  Two things must be set, though: ``spark.executor.memory`` must not exceed
  the per-worker memory of the master string (the default 1g is refused by
  ``local-cluster[N,1,512]``), and ``getExecutorIds()`` returns a Scala
  ``Seq`` that py4j cannot iterate.
* The in-process standalone Workers put each executor's working directory
  (its ``stdout``/``stderr``, i.e. everything a Python task prints) under
  ``$SPARK_HOME/work/<app-id>/<executor-id>/``. With the pip wheel that is
  inside the venv's ``site-packages/pyspark``; :func:`build_session` therefore
  points ``SPARK_HOME`` at a "shadow" Spark home (symlinks to the PySpark
  package, plus a real ``work/`` directory) under the temp directory, unless
  ``SPARK_HOME`` is already set. See :func:`executor_work_dir`.
* Executor JVMs of a ``local-cluster`` inherit the environment of the driver
  JVM (the Workers run inside it), which inherits the driver Python's. So the
  environment set here (``PYSPARK_PYTHON``, ``SPARK_LOCAL_IP``) reaches the
  executors and their Python workers.
* Process tree of a Python task: executor JVM (``CoarseGrainedExecutorBackend
  ... --executor-id N --hostname H --app-id A``) -> ``python -m
  pyspark.daemon`` -> forked worker (runs the task; reused across tasks and
  jobs with ``spark.python.worker.reuse``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark import cloudpickle

from replication import procfs

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local-cluster[3,1,512]"
DEFAULT_APP_NAME = "spark-active-replication"

#: ``local-cluster[workers, coresPerWorker, memoryPerWorkerMB]``
_LOCAL_CLUSTER_RE = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")

#: main classes of executor JVMs: standalone/local-cluster, YARN, Kubernetes
_EXECUTOR_BACKEND_SUFFIX = "ExecutorBackend"

#: how many ancestors :func:`current_executor_id` inspects before giving up
_MAX_ANCESTRY = 16


# --------------------------------------------------------------------------- session


def parse_local_cluster(master: str) -> tuple[int, int, int] | None:
    """``(workers, cores_per_worker, memory_mb)`` of a ``local-cluster[...]`` master, else None."""
    m = _LOCAL_CLUSTER_RE.match(master.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[*]``, ``local-cluster[...]``: everything runs on this machine."""
    return master.strip().startswith("local")


EXECUTOR_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The executor JVMs' options: a replicated job's executor only hosts its Python worker, so its JVM
needs no optimizing compiler and no concurrent collector, and their start (6-8 CPU-seconds on the
JVM's defaults, 2.5-3.5 without) is what a replacement executor takes from the replicas that mask
a failure (docs/runtime.md, *The replacement executor's start*)."""


def default_conf(master: str, app_name: str = DEFAULT_APP_NAME) -> dict[str, str]:
    """The Spark configuration :func:`build_session` uses before applying overrides."""
    conf: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # A replica task is retried on a free slot when its executor dies; the
        # default of 4 failures per task would abort the long-running job after
        # the 4th executor loss (DESIGN §3).
        "spark.task.maxFailures": "100",
        # one job per replica set from its own driver thread, fair-shared
        "spark.scheduler.mode": "FAIR",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": "1g",
        # Python tracebacks of crashed workers end up in the executor stderr
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.executor.extraJavaOptions": EXECUTOR_JAVA_OPTIONS,
    }
    lc = parse_local_cluster(master)
    if lc is not None:
        # must fit into the per-worker memory of the master string (default 1g does not)
        conf["spark.executor.memory"] = f"{lc[2]}m"
        conf["spark.executor.cores"] = str(lc[1])
    if is_local_master(master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def _expected_executors(master: str, conf: Mapping[str, str]) -> int:
    lc = parse_local_cluster(master)
    if lc is not None:
        return lc[0]
    if "spark.executor.instances" in conf:
        return int(conf["spark.executor.instances"])
    return 0


def shadow_spark_home(root: Path) -> Path:
    """A Spark home whose entries are symlinks into the PySpark package, but with its own ``work/``.

    ``local-cluster`` Workers write executor directories to ``$SPARK_HOME/work``;
    this keeps them out of the venv. Everything else (``bin/spark-submit``,
    ``jars/``) resolves through the symlinks, so the JVMs are unchanged, except
    ``python/``: executors put ``$SPARK_HOME/python/lib/pyspark.zip`` first on
    their Python workers' path, and Python compiles a zip's modules from source
    at every import (no ``.pyc`` cache), about 0.5 s of CPU for each daemon and
    each forked worker, taken from the replicas that mask a failure.  Without the
    zip, the workers import the same PySpark from the venv, compiled once.
    """
    import pyspark

    pkg = Path(pyspark.__file__).resolve().parent
    home = root / "spark-home"
    home.mkdir(parents=True, exist_ok=True)
    python = home / "python"
    if python.is_symlink():
        python.unlink(missing_ok=True)  # (another process may have replaced it first)
    (python / "lib").mkdir(parents=True, exist_ok=True)
    for entry in pkg.iterdir():
        if entry.name in ("work", "python"):
            continue
        link = home / entry.name
        if link.is_symlink() and Path(os.readlink(link)) != entry:
            link.unlink(missing_ok=True)  # stale: the venv moved or PySpark was reinstalled
        if not link.is_symlink():
            try:
                link.symlink_to(entry)
            except FileExistsError:  # another process won the race
                pass
    (home / "work").mkdir(exist_ok=True)
    return home


def build_session(
    master: str = DEFAULT_MASTER,
    app_name: str = DEFAULT_APP_NAME,
    conf: Mapping[str, str] | None = None,
    *,
    expected_executors: int | None = None,
    register_timeout: float = 120.0,
    work_root: str | os.PathLike[str] | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """Create (or get) the SparkSession and wait until the expected executors registered.

    ``conf`` overrides :func:`default_conf`. ``expected_executors`` defaults to
    N of ``local-cluster[N,...]``, else ``spark.executor.instances``, else 0
    (no wait). For ``local-cluster`` without ``SPARK_HOME`` set, the executor
    work directories go to ``<work_root>/spark-home/work`` (``work_root``
    defaults to ``$TMPDIR/replication-spark``). Raises :class:`TimeoutError`
    (after stopping the session) if the executors do not register in time.

    Environment (read once, when the first session of this Python process
    starts the driver JVM; :func:`stop_session` with ``stop_jvm=True`` resets it):
    ``PYSPARK_PYTHON`` is set to the executor Python, and for local masters
    ``SPARK_LOCAL_IP`` defaults to 127.0.0.1 so driver, Workers and executors
    all advertise the loopback address instead of the first interface.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context
    if active is not None:
        log.warning(
            "a SparkContext (%s, %s) is already running: build_session returns it and static "
            "settings (master, executors, environment) are not applied",
            active.master,
            active.applicationId,
        )
    merged = default_conf(master, app_name)
    merged.update(conf or {})
    master = merged["spark.master"]

    # PySpark ships the *driver's* PYSPARK_PYTHON (not spark.pyspark.python) to
    # the executors as the Python to run; point both at the venv interpreter.
    os.environ["PYSPARK_PYTHON"] = merged["spark.pyspark.python"]
    os.environ["PYSPARK_DRIVER_PYTHON"] = merged["spark.pyspark.driver.python"]
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", merged.get("spark.driver.host", "127.0.0.1"))
    if parse_local_cluster(master) is not None and "SPARK_HOME" not in os.environ:
        root = Path(work_root) if work_root is not None else Path(tempfile.gettempdir()) / "replication-spark"
        os.environ["SPARK_HOME"] = str(shadow_spark_home(root))

    spark_conf = SparkConf(loadDefaults=False)
    for k, v in merged.items():
        spark_conf.set(k, v)
    t0 = time.monotonic()
    spark = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel(log_level)

    want = _expected_executors(master, merged) if expected_executors is None else expected_executors
    try:
        wait_for_executors(sc, want, timeout=max(0.0, register_timeout - (time.monotonic() - t0)))
    except TimeoutError:
        stop_session(spark)
        raise
    log.info(
        "Spark session %s on %s: %d executors after %.1fs",
        sc.applicationId,
        master,
        len(executor_ids(sc)),
        time.monotonic() - t0,
    )
    return spark


def wait_for_executors(sc: SparkContext, n: int, timeout: float = 60.0, poll: float = 0.1) -> list[str]:
    """Block until at least ``n`` executors are registered; return their ids or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        ids = executor_ids(sc)
        if len(ids) >= n:
            return ids
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"only {len(ids)} of {n} Spark executors registered within {timeout:.0f}s "
                f"(master={sc.master}, app={sc.applicationId}, registered={ids}); "
                f"see executor stderr under {spark_work_dir()} for launch failures"
            )
        time.sleep(poll)


def stop_session(spark: SparkSession, *, stop_jvm: bool = True, timeout: float = 30.0) -> None:
    """Stop the session; with ``stop_jvm`` also shut the driver JVM down (else it lives until Python exits).

    Stopping the SparkContext makes ``local-cluster`` tear down its Master,
    Workers and executor JVMs; the py4j gateway JVM itself (``SparkSubmit``)
    is otherwise kept for the next session of this Python process.
    """
    from pyspark import SparkContext

    spark.stop()
    if not stop_jvm:
        return
    with SparkContext._lock:
        gw = SparkContext._gateway
        SparkContext._gateway = None
        SparkContext._jvm = None
    if gw is None:
        return
    proc = getattr(gw, "proc", None)
    try:
        gw.shutdown()
    except Exception:  # noqa: BLE001 - best effort
        log.debug("py4j gateway shutdown failed", exc_info=True)
    if proc is None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # the JVM exits on EOF of its stdin
        proc.wait(timeout=timeout)
    except Exception:  # noqa: BLE001
        proc.kill()
        proc.wait(timeout=timeout)


# --------------------------------------------------------------------------- driver-side queries


def executor_ids(sc: SparkContext) -> list[str]:
    """Ids of the registered executors (the driver excluded), sorted numerically where possible."""
    return executor_lister(sc)()


def executor_lister(sc: SparkContext) -> Callable[[], list[str]]:
    """:func:`executor_ids` for calling again and again: the JVM's SparkContext is looked up
    once, so each call costs two py4j round trips instead of three, each with its reference to
    release (a liveness loop's poll costs the driver's Python and its JVM a few milliseconds)."""
    jsc = sc._jsc.sc()

    def ids() -> list[str]:
        seq = jsc.getExecutorIds()  # Scala Seq[String]: not iterable through py4j
        found = [x for x in seq.mkString("\n").split("\n") if x and x != "driver"]
        return sorted(found, key=lambda s: (0, int(s), s) if s.isdigit() else (1, 0, s))

    return ids


def spark_work_dir() -> Path:
    """Where standalone/local-cluster Workers of this process put executor directories."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).resolve().parent)
    return Path(home) / "work"


def executor_work_dir(sc: SparkContext, executor_id: str) -> Path:
    """Working directory (``stdout``, ``stderr``) of a ``local-cluster`` executor."""
    return spark_work_dir() / sc.applicationId / str(executor_id)


def driver_advertise_host(sc: SparkContext) -> str:
    """The address executors use to reach the driver (``spark.driver.host``)."""
    host = sc.getConf().get("spark.driver.host")
    return host or local_advertise_host("8.8.8.8")


def driver_bind_host(sc: SparkContext) -> str:
    """Where the driver's servers listen, as Spark's own do: ``spark.driver.bindAddress``, else
    ``spark.driver.host``, else the address that routes outward."""
    conf = sc.getConf()
    return conf.get("spark.driver.bindAddress") or conf.get("spark.driver.host") or local_advertise_host("8.8.8.8")


def executor_bind_host(peer_host: str) -> str:
    """Where a worker's servers listen: its executor's host as Spark started it (``--hostname``),
    else ``SPARK_LOCAL_IP``, else the local address that reaches ``peer_host``."""
    ep = current_executor()
    return (ep.host if ep is not None and ep.host else None) or local_advertise_host(peer_host)


def local_advertise_host(peer_host: str) -> str:
    """The local IP address this process would use to reach ``peer_host``; ``SPARK_LOCAL_IP`` wins.

    Uses a connected UDP socket (no packet is sent) and reads its local address.
    """
    env = os.environ.get("SPARK_LOCAL_IP")
    if env:
        return env
    try:
        family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((peer_host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


# --------------------------------------------------------------------------- executor identity


@dataclass(frozen=True)
class ExecutorProcess:
    """What the executor JVM's command line says about it."""

    executor_id: str
    jvm_pid: int
    host: str | None
    app_id: str | None


_ident_lock = threading.Lock()
_ident_pid: int | None = None
_ident: ExecutorProcess | None = None


def _parse_executor_cmdline(pid: int, argv: list[str]) -> ExecutorProcess | None:
    if not any(a.endswith(_EXECUTOR_BACKEND_SUFFIX) and "." in a for a in argv):
        return None
    eid = procfs.arg(argv, "--executor-id")
    if eid is None:
        return None
    return ExecutorProcess(eid, pid, procfs.arg(argv, "--hostname"), procfs.arg(argv, "--app-id"))


def _find_executor_ancestor() -> ExecutorProcess | None:
    for ppid in procfs.ancestors(os.getpid(), _MAX_ANCESTRY):
        try:
            found = _parse_executor_cmdline(ppid, procfs.cmdline(ppid))
        except OSError:
            return None
        if found is not None:
            return found
    return None


def current_executor() -> ExecutorProcess | None:
    """The executor JVM hosting this Python process, or None (driver, non-Linux). Cached per process."""
    global _ident_pid, _ident
    pid = os.getpid()
    if _ident_pid == pid:
        return _ident
    with _ident_lock:
        if _ident_pid != pid:  # also recomputed after a fork
            _ident = _find_executor_ancestor()
            _ident_pid = pid
        return _ident


def current_executor_id() -> str | None:
    """The Spark executor id of the executor running this task; None on the driver."""
    ep = current_executor()
    return None if ep is None else ep.executor_id


def current_executor_jvm_pid() -> int | None:
    """The pid of the executor JVM running this task; None on the driver."""
    ep = current_executor()
    return None if ep is None else ep.jvm_pid


def executor_jvm_pids(app: SparkContext | str) -> dict[str, int]:
    """Executor id -> JVM pid of the application's executors running on *this* machine.

    ``app`` is a SparkContext or an application id (matched against ``--app-id``).
    Useful for ``local-cluster``; remote executors are invisible.
    """
    app_id = app if isinstance(app, str) else app.applicationId
    out: dict[str, int] = {}
    for pid in procfs.pids():
        try:
            ep = _parse_executor_cmdline(pid, procfs.cmdline(pid))
        except OSError:
            continue
        if ep is not None and ep.app_id == app_id and procfs.alive(pid):
            out[ep.executor_id] = pid
    return out


def kill_executor(sc: SparkContext, executor_id: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to the JVM of a local executor; return its pid. Raises LookupError if not local."""
    pids = executor_jvm_pids(sc)
    pid = pids.get(str(executor_id))
    if pid is None:
        raise LookupError(f"executor {executor_id} of {sc.applicationId} has no JVM on this machine ({pids})")
    os.kill(pid, sig)
    return pid


# --------------------------------------------------------------------------- warm-up


@dataclass(frozen=True)
class WarmInfo:
    """Where an executor's Python worker runs."""

    executor_id: str
    host: str
    python_pid: int
    jvm_pid: int


class ExecutorsCannotLoad(RuntimeError):
    """What the warm-up's payload raised when unpickled on executors: ``errors`` maps an
    executor id to its one-line error (``ModuleNotFoundError: No module named 'myjob'``)."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        first = next(iter(self.errors.values()))
        super().__init__(f"executor(s) {', '.join(sorted(self.errors))} cannot load it: {first}")


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ")


def spark_error_line(err: BaseException) -> str:
    """A failed Spark job's error in one line: its first line and the last Python exception
    line of the worker's traceback (``ModuleNotFoundError: No module named 'myjob'``), not the
    Java and Python stacks around them."""
    lines = [line.strip().lstrip(": ") for line in str(err).splitlines() if line.strip().lstrip(": ")]
    if not lines:
        return type(err).__name__
    raised = [(m.group(1), line) for line in lines if (m := _EXCEPTION_LINE.match(line))]
    python = [line for name, line in raised if "." not in name]
    last = (python or [line for _, line in raised] or [lines[0]])[-1]
    return lines[0] if last == lines[0] else f"{lines[0].rstrip(':')}: {last}"


def _warm_probe(index: int, sleep_s: float, payload: bytes | None = None
                ) -> tuple[str | None, str, int, int | None, str | None]:
    """Runs inside a task: hold the slot briefly so the tasks spread, report identity, and
    whether ``payload`` (cloudpickled) loads here."""
    time.sleep(sleep_s)
    ep = current_executor()
    host = (ep.host if ep is not None else None) or socket.gethostname()
    error = None
    if payload is not None:
        try:
            cloudpickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - reported to the driver, in one line
            error = f"{type(exc).__name__}: {exc}"
    return (None if ep is None else ep.executor_id, host, os.getpid(), None if ep is None else ep.jvm_pid, error)


def warm_up(sc: SparkContext, rounds: int = 5, sleep_s: float = 0.3, payload: bytes | None = None
            ) -> dict[str, WarmInfo]:
    """Run tiny jobs until every registered executor has run Python; return what each reported.
    With ``payload`` (cloudpickled: the job's plan), every executor also loads it, and
    :class:`ExecutorsCannotLoad` says which could not and why (a module they cannot import).

    With one core per executor, a job of N tasks that each hold their slot for
    ``sleep_s`` lands one task per executor; should a round miss an executor
    (e.g. one registered late), the next round runs with twice the sleep.
    Raises RuntimeError if some executor is still uncovered after ``rounds``.
    """
    seen: dict[str, WarmInfo] = {}
    errors: dict[str, str] = {}
    want: list[str] = []
    prev_desc = sc.getLocalProperty("spark.job.description")
    try:
        sc.setJobDescription("replication warm-up")
        for r in range(max(1, rounds)):
            want = executor_ids(sc)
            slots = max(1, len(want) * _cores_per_executor(sc))
            s = sleep_s * (2**r)
            rows: list[Any] = (
                sc.parallelize(range(slots), slots).map(lambda i, s=s: _warm_probe(i, s, payload)).collect()
            )
            for eid, host, py_pid, jvm_pid, error in rows:
                if error is not None:
                    errors[eid or host] = error
                if eid is not None and jvm_pid is not None:
                    seen[eid] = WarmInfo(eid, host, py_pid, jvm_pid)
            if errors:
                raise ExecutorsCannotLoad(errors)
            if set(want) <= set(seen):
                return {e: seen[e] for e in executor_ids(sc) if e in seen}
            log.info("warm-up round %d covered %s of %s", r, sorted(seen), want)
    finally:
        sc.setJobDescription(prev_desc)  # type: ignore[arg-type]
    raise RuntimeError(f"warm-up covered executors {sorted(seen)} but {want} are registered")


def _cores_per_executor(sc: SparkContext) -> int:
    try:
        return max(1, int(sc.getConf().get("spark.executor.cores", "1") or "1"))
    except ValueError:
        return 1
