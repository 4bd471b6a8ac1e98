"""What every benchmark writes besides its own figures: CSV files, the machine record, and the costs of a run
(CPU seconds per process group and loopback bytes, from ``/proc``); and what several of them share: an error
on one line, a load generator producing at a fixed rate, deleting a finished run's topics."""

from __future__ import annotations

import csv
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.topics import delete_topics_containing


def write_csv(path: Path, rows: list[dict], digits: int = 2) -> None:
    """Rows (same keys) as CSV, floats rounded to ``digits`` decimals."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: round(v, digits) if isinstance(v, float) else v for k, v in r.items()})


def print_plain_table(title: str, rows: list[dict[str, Any]], cols: tuple[str, ...]) -> None:
    """``rows`` as a right-aligned plain-text table of ``cols`` under ``== title`` (floats to 2 places)."""
    cells = [[f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"== {title}")
    for row in [list(cols), *cells]:
        print("   " + "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)), flush=True)


def read_csv_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV written by :func:`write_csv` (none if it does not exist), numbers as floats."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{k: _cell(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _cell(v: str) -> Any:
    try:
        return float(v) if v != "" else ""
    except ValueError:
        return v


def write_machine(out: Path) -> None:
    """``machine.txt``: platform, Python, cores, time and the command line of this run."""
    (out / "machine.txt").write_text(
        f"{platform.platform()}, {platform.processor() or platform.machine()}, python {platform.python_version()}, "
        f"cores {os.cpu_count()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        f"command: {' '.join(sys.argv)}\n")


def format_row(row: dict, skip: tuple[str, ...] = ()) -> str:
    """A result row as ``key=value, ...`` (floats with one decimal) for the progress log."""
    return ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k not in skip)


def error_text(err: BaseException) -> str:
    """An error's message on one line, without a Spark error's Java stack trace (its ``\tat ...`` lines)."""
    return " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("\tat "))


def one_line(err: BaseException, limit: int = 400) -> str:
    """``<type>: <message>`` on one line (:func:`error_text`), at most ``limit`` characters."""
    return f"{type(err).__name__}: {error_text(err)}"[:limit]


def forget_topics(bootstrap: str, stamp: str) -> None:
    """Delete a finished run's topics (its input, output and the job's own, all named with ``stamp``):
    each topic the embedded broker keeps makes every later run's produces slower, so runs late in a
    benchmark would measure the runs before them (``bench/results/broker_topics/``)."""
    try:
        delete_topics_containing(bootstrap, stamp)
    except Exception as err:  # noqa: BLE001 - the run is measured; the next ones may be slower
        print(f"   (the run's topics were not deleted: {one_line(err, 300)})", flush=True)


# --------------------------------------------------------------------------- load at a fixed rate

#: a record of a paced feeder: ``make(i) -> (topic, key, value)``, called when record ``i`` is due
MakeRecord = Callable[[int], tuple[str, bytes, bytes]]


class PacedFeeder(threading.Thread):
    """Produces ``rate`` records/s until stopped: record ``i`` is ``make(i)``, produced at start + i/rate,
    or with ``burst`` > 1 in bursts of that many back to back every ``burst / rate`` s (idempotent
    producer, ``acks=all``, ``linger_ms``); ``produced`` counts them, ``started_at`` / ``ended_at`` are the
    wall clock of the start and of the last one; a delivery error is kept in ``error`` and raised by
    :meth:`stop`."""

    def __init__(self, bootstrap: str, make: MakeRecord, rate: float, name: str = "paced-feeder",
                 linger_ms: float = 2, burst: int = 1) -> None:
        super().__init__(name=name, daemon=True)
        if burst < 1:
            raise ValueError(f"a burst is at least one record, not {burst}")
        self.bootstrap, self.make, self.rate, self.linger_ms, self.burst = bootstrap, make, rate, linger_ms, burst
        self.produced = 0
        self.started_at = self.ended_at = 0.0
        self.error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        from transport.kafka_io import produce_blocking

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": self.linger_ms})
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        start = time.monotonic()
        self.started_at = time.time()
        try:
            while not self._halt.wait(max(0.0, start + self._due(self.produced) - time.monotonic())):
                topic, key, value = self.make(self.produced)
                produce_blocking(producer, topic, key=key, value=value, on_delivery=delivered)
                self.produced += 1
            self.ended_at = time.time()
            remaining = producer.flush(60)
            if remaining or errors:
                self.error = f"{remaining} undelivered, {len(errors)} failed ({errors[:1]})"
        except Exception as exc:  # noqa: BLE001 - reported with the run
            self.error = f"{type(exc).__name__}: {exc}"

    def _due(self, i: int) -> float:
        """Seconds after the start at which record ``i`` is produced."""
        return (i - i % self.burst) / self.rate

    def stop(self) -> int:
        """Stop producing; the number of records produced (RuntimeError if some were not delivered)."""
        self._halt.set()
        self.join(90)
        if self.error:
            raise RuntimeError(f"load generator: {self.error}")
        return self.produced


# --------------------------------------------------------------------------- costs: CPU and loopback bytes

#: the job's process groups (the benchmark process, ``bench``, is counted apart: it also runs the load generator)
CPU_GROUPS = ("executor_jvm", "python", "driver_jvm", "broker", "zookeeper")
# An idle job is measured this long after it started: its first checkpoints, elections and pulses,
# and its consumers' switch to the idle fetch wait (spark.replication.kafka.idleAfter, 5 s) are over.
IDLE_SETTLE_S = 10.0
#: the cost columns of a run's CSV row, in order (see :func:`cost_columns`)
COST_COLUMNS = ("window_s", "cpu_s", "cpu_per_1k", *(f"cpu_{g}_s" for g in CPU_GROUPS), "cpu_bench_s",
                "cpu_bench_per_1k", "cpu_machine_s", "net_bytes", "net_bytes_per_record")


def stat_ticks(text: str) -> int:
    """utime + stime + cutime + cstime (clock ticks) from the text of ``/proc/<pid>/stat``: the process's
    CPU and that of its children it reaped, so a group's sum only grows while its processes come and go
    (:func:`replication.procfs.stat` reads the same file for the name, state and parent)."""
    fields = text.rpartition(")")[2].split()  # fields[0] is field 3 (state): utime..cstime are fields 14-17
    return sum(int(f) for f in fields[11:15])


def busy_ticks(proc_stat: str) -> int:
    """Clock ticks every CPU of the machine spent busy (user, nice, system, irq, softirq, steal), from
    the text of ``/proc/stat``."""
    for line in proc_stat.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            return v[0] + v[1] + v[2] + sum(v[5:8])
    raise ValueError("no 'cpu' line in /proc/stat")


def rx_bytes(net_dev: str, iface: str = "lo") -> int:
    """Bytes received by ``iface`` from the text of ``/proc/net/dev``.  On the loopback interface every
    byte sent between two processes of the machine is received once: its rx total is all their traffic."""
    for line in net_dev.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == iface:
            return int(counters.split()[0])
    raise ValueError(f"no interface {iface!r} in /proc/net/dev")


def pid_ticks(pid: int) -> int:
    """:func:`stat_ticks` of a live process, 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return stat_ticks(f.read())
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class CostSnapshot:
    """Counters at one moment: ticks per process group, the machine's busy ticks, loopback rx bytes."""

    at: float  # time.monotonic()
    ticks: dict[str, int]
    machine: int
    loopback: int
    processes: dict[str, int] = field(default_factory=dict)  # live processes per group (for the record)


def cost_columns(before: CostSnapshot | None, after: CostSnapshot | None, records: int,
                 hz: int | None = None) -> dict[str, Any]:
    """The :data:`COST_COLUMNS` of a run from its two snapshots: CPU seconds of the job's processes
    (:data:`CPU_GROUPS`, summed in ``cpu_s``) and of the benchmark process (``cpu_bench_s``), the
    machine's busy CPU seconds, loopback bytes, and per 1,000 ``records`` / per record.  Empty strings
    without snapshots; per-record columns empty without records."""
    if before is None or after is None:
        return dict.fromkeys(COST_COLUMNS, "")
    hz = hz or os.sysconf("SC_CLK_TCK")

    def cpu(group: str) -> float:
        return (after.ticks.get(group, 0) - before.ticks.get(group, 0)) / hz

    def per(value: float, n: float) -> float | str:
        return value / records * n if records else ""

    job = sum(cpu(g) for g in CPU_GROUPS)
    net = after.loopback - before.loopback
    return {"window_s": after.at - before.at, "cpu_s": job, "cpu_per_1k": per(job, 1000),
            **{f"cpu_{g}_s": cpu(g) for g in CPU_GROUPS}, "cpu_bench_s": cpu("bench"),
            "cpu_bench_per_1k": per(cpu("bench"), 1000), "cpu_machine_s": (after.machine - before.machine) / hz,
            "net_bytes": net, "net_bytes_per_record": per(net, 1)}


def spark_process_groups(app_id: str, driver_jvm: int | None, stack_pids: dict[str, int],
                         driver_python: bool = False) -> dict[str, list[int]]:
    """The live processes of a Spark job on this machine by group: ``executor_jvm`` (the executor JVMs of
    application ``app_id``, found as :mod:`ops.chaos` finds them), ``python`` (their descendants:
    the PySpark daemon and workers), ``driver_jvm``, ``broker`` and ``zookeeper`` (``stack_pids``: pid by
    name, each with its descendants) and ``bench`` (this process).

    With ``driver_python``, ``python`` also holds the driver JVM's descendants that are not executors nor
    theirs (in ``local-cluster`` mode the executors are the driver JVM's children): the Python processes
    the driver JVM starts, e.g. a Python streaming data source's driver-side runner (``latestOffset``,
    planning), also listed apart as ``driver_python`` (not a :data:`CPU_GROUPS` member: not summed twice)."""
    from ops import chaos
    from replication import procfs

    executors = sorted(p for ps in chaos.executor_jvms(app_id).values() for p in ps)
    groups = {"executor_jvm": executors,
              "python": sorted({d for e in executors for d in procfs.descendants(e)}),
              "driver_jvm": [driver_jvm] if driver_jvm else [], "bench": [os.getpid()]}
    if driver_python and driver_jvm:
        known = {*executors, *groups["python"]}
        groups["driver_python"] = sorted(p for p in procfs.descendants(driver_jvm) if p not in known)
        groups["python"] = sorted({*groups["python"], *groups["driver_python"]})
    for name, pid in stack_pids.items():
        groups[name] = [pid, *procfs.descendants(pid)]
    return groups


class CostProbe:
    """Takes :class:`CostSnapshot` s of a set of process groups, found again at every snapshot (an
    executor relaunched or a Python worker started in between is counted)."""

    def __init__(self, groups: Callable[[], dict[str, list[int]]]) -> None:
        self.groups = groups

    def snapshot(self) -> CostSnapshot:
        groups = self.groups()
        ticks = {name: sum(pid_ticks(p) for p in pids) for name, pids in groups.items()}
        return CostSnapshot(time.monotonic(), ticks, busy_ticks(Path("/proc/stat").read_text()),
                            rx_bytes(Path("/proc/net/dev").read_text()),
                            {name: len(pids) for name, pids in groups.items()})

    @classmethod
    def for_spark(cls, spark: Any, stack_run_dir: Path | None, driver_python: bool = False) -> CostProbe:
        """A probe of ``spark``'s job processes (:func:`spark_process_groups`, ``driver_python`` passed on)
        and of the embedded stack whose run directory is ``stack_run_dir`` (None: an external stack, not
        counted)."""
        from deploy.stack import run_dir_status

        sc = spark.sparkContext
        proc = getattr(getattr(sc, "_gateway", None), "proc", None)  # the driver JVM PySpark launched
        driver = proc.pid if proc is not None else None
        names = {"kafka": "broker", "zookeeper": "zookeeper"}
        stack = {names[s.name]: s.pid for s in (run_dir_status(stack_run_dir) if stack_run_dir else [])
                 if s.pid is not None and s.alive and s.name in names}
        app_id = sc.applicationId
        return cls(lambda: spark_process_groups(app_id, driver, stack, driver_python))


def snapshot_cores(first: CostSnapshot, last: CostSnapshot, hz: float | None = None) -> dict[str, float]:
    """Cores each process group used between two snapshots (``hz``: clock ticks per second, /proc's)."""
    hz = hz or os.sysconf("SC_CLK_TCK")
    span = last.at - first.at
    return {g: (last.ticks.get(g, 0) - first.ticks.get(g, 0)) / hz / span for g in {**first.ticks, **last.ticks}}


class CostSampler(threading.Thread):
    """Takes a :class:`CostProbe` snapshot every ``period`` s until stopped, each with its wall clock
    (``samples``), so that the cores of a stretch of a run are known afterwards (:func:`cores_between`)."""

    def __init__(self, probe: CostProbe, period: float = 1.0) -> None:
        super().__init__(name="cost-sampler", daemon=True)
        self.probe, self.period = probe, period
        self.samples: list[tuple[float, CostSnapshot]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append((time.time(), self.probe.snapshot()))
            if self._halt.wait(self.period):
                return

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5 * self.period)


def cores_between(samples: Sequence[tuple[float, CostSnapshot]], start: float, end: float,
                  hz: int | None = None) -> dict[str, float]:
    """Cores used per process group from wall clock ``start`` to ``end``, between the first sample at or
    after ``start`` and the last one at or before ``end`` ({} unless two such samples exist)."""
    inside = [s for t, s in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1].at <= inside[0].at:
        return {}
    return snapshot_cores(inside[0], inside[-1], hz)


# --------------------------------------------------------------------------- max sustainable throughput

@dataclass(frozen=True)
class Ramp:
    """One configuration's throughput ramp: the highest offered rate whose run was flat (None: not even the
    lowest), and the rate and verdict that stopped the ramp (None: every rate tried was flat)."""

    config: str
    max_rate: float | None
    stopped_at: float | None
    reason: str

    @property
    def text(self) -> str:
        """``800``, ``>= 1,600`` (no rate tried failed) or ``< 200`` (the lowest failed)."""
        if self.stopped_at is None:
            return f">= {self.max_rate:,.0f}" if self.max_rate is not None else "-"
        return f"{self.max_rate:,.0f}" if self.max_rate is not None else f"< {self.stopped_at:,.0f}"


def max_sustainable(rows: list[dict[str, Any]]) -> dict[str, Ramp]:
    """Per configuration (in order of appearance) of throughput rows (``config``, ``offered_rate``,
    ``verdict``: ``flat`` or why not, as numbers or CSV strings): the highest flat rate below the first
    rate that was not flat."""
    by_config: dict[str, list[tuple[float, str]]] = {}
    for r in rows:
        by_config.setdefault(r["config"], []).append((float(r["offered_rate"]), r["verdict"]))
    out = {}
    for config, runs in by_config.items():
        best, stop, reason = None, None, ""
        for rate, verdict in sorted(runs):
            if verdict != "flat":
                stop, reason = rate, verdict
                break
            best = rate
        out[config] = Ramp(config, best, stop, reason)
    return out
