"""Runtime handover (issue 7, point 6): latency, duration and phases, and state moved while vnodes of a
keyed task move between its partitions under load, per mode, operation, strategy and state size.

    .venv/bin/python bench/handover.py [--sizes 1MB,20MB] [--strategies all,batched,batched:32:660KB,fluid]
                                       [--rate 200] [--modes liverobin,liverobin+rhino,kazoo,kazoo+rhino]
                                       [--rhino] [--checkpoint-every 20] [--kazoo-checkpoint-every 50]
                                       [--checkpoint-elements 200] [--operations move,rescale,none]
                                       [--also 'modes=liverobin sizes=20MB strategies=fluid' ...]
                                       [--before 8] [--after 5] [--settle 2] [--vnodes 0] [--batch 8] [--keys-per-vnode 1]
                                       [--value-bytes 1000] [--margin 0.5] [--release 0.3] [--period 10]
                                       [--warm-up 3] [--linger 2] [--burst 1] [--control-seconds 45] [--no-restart]
                                       [--out bench/results/handover]

    # a short check (one size, 16 vnodes): 80 s on 2 cores
    .venv/bin/python bench/handover.py --sizes 1MB --vnodes 16 --batch 4 --before 6 --after 3 --out /tmp/hov

The runs are every ``--operations`` x ``--modes`` x ``--sizes`` x ``--strategies``, then each ``--also``
group (space-separated ``key=a,b`` of those four, each defaulting to its flag), each combination once.

The job (defined here): one topic of 2 partitions -> ``key_by`` -> ``chain`` (parallelism 2) -> exactly-once
sink, replicated, in LiveRobin mode (``--period`` ms pulses) or KaZoo mode (ZooKeeper of the embedded stack,
1 s sessions): KaZoo has no pulses of its own, so every handover job opens a *pulse window* (the sources
hold their records for pulses of ``--period`` ms until its last pulse).  Rhino checkpoints are off, except
in modes ``liverobin+rhino`` and ``kazoo+rhino`` (or every run with ``--rhino``), one holder per replica
group: LiveRobin checkpoints every ``--checkpoint-every`` pulses, KaZoo every ``--kazoo-checkpoint-every``
order records (partitions with several inputs) or ``--checkpoint-elements`` records (one input).
``chain`` folds every key's events into a hash chain (as :mod:`replication.examples.ordered`) and keeps a
*pad* per key: a map state of ``E`` entries of ``--value-bytes`` incompressible bytes, written by the key's
first event; every event reads entry ``n mod E``, outputs its first 8 bytes and overwrites it.  The keys
are chosen so that every vnode holds exactly ``--keys-per-vnode`` keys, and ``E`` so that the whole state
is about the ``--sizes`` value: the state per vnode is controlled.  1 MB = 10^6 bytes.

Per run, on a fresh job: ``--rate`` events/s round robin over the keys; ``--before`` seconds in (every
key's pad written), the state measured per vnode (below), the operation, ``all`` at once, ``batched``
(``--batch`` vnodes per step), ``batched:N`` (N per step), ``batched:N:BYTES`` (at most N vnodes and BYTES of
state per step, ``BYTES`` as ``--sizes``: the driver measures the state per vnode first and plans the steps
from it, ``rhino_state.Batched(n, max_bytes)``) or ``fluid`` (one per step); ``--after`` more seconds of
load, drain, read the output.  Operations:

* ``move``: ``move_vnodes`` moves ``--vnodes`` of partition 0's vnodes (0: half of them) to partition 1;
* ``rescale``: the chain task is built with ``max_parallelism=3`` (``parallelism=2``: partition 2 spare),
  ``rescale(chain, 3)`` moves a third of the vnodes from partitions 0 and 1 to partition 2, ``--after``
  seconds of load, then ``rescale(chain, 2)`` moves them back: two rows (``rescale 2->3``, ``rescale 3->2``),
  one output check for both; ``--vnodes`` does not apply;
* ``none``, the control: the same job and load with no handover, ``--control-seconds`` of load after
  the settle.  The cost of the embedded broker grows with the age of the source partitions (each batch
  the load generator writes, ``--linger``, is listed again by every fetch of each reader,
  docs/embedded-broker.md), so a p99 measured before a handover rises over a run without one: every
  handover row of the same mode and size gets the control's worst per-second p99 in the same seconds
  of load (``control_worst_second_p99_ms``) and its own worst over it (``worst_vs_control``), beside
  ``worst_vs_before`` (worst per-second p99 during over the p99 before).

Measured, per handover job:

* latency by event time (sink - produced, the load generator's clock), in ``handover_timeline.csv`` per
  second since the request, all records and those of moved keys; p99 and max before the request (after
  ``--warm-up``; for ``rescale 3->2``: since ``rescale 2->3`` ended), during the handover (produced between
  the request and its end) and after (to the next request or the end of the load);
* the handover's duration and its phases, per step (``handover_steps.csv``, with the switch margin its
  pulses planned and the release margin ``release_s``, sized by the driver unless ``--release``) and summed
  per run.  A step's phases are the report's (:func:`replication.control.handover_timelines.step_phases`), from the wall-clock
  times the participants put in their acks (ms resolution), adding up to the step's instruction ->
  completion: *trigger* (-> every participant armed, committed), *to switch* (-> the upstreams reached the
  switch pulse, ``--margin`` ahead), *alignment* (-> the origins processed what was routed to them before
  the switch and cut), *transfer* (-> every cut reached the targets), *release wait* (-> the targets reached
  the release pulse, when the cut was there first), *load* (-> the targets loaded it), *catch-up* (-> they
  processed the records they held) and *acks* (-> the driver learnt it all).  Beside them, per step *held*
  (switch -> caught up: how long the moved keys' records waited; per run its largest, ``held_max_s``) and
  *blocked* (how long a target waited at the release pulse for its state; per run summed).  Per run also
  *between steps* (what of the job's time no step covers: placing each step's pulses, a byte cap's
  measurement) and, in KaZoo mode, *window open* (request -> every source replica holds its records and
  the window's pulses start) and *window close* (the last step completed -> the window's last pulse
  counted in the log), from the driver's events (stamped when its heartbeats bring them, about 200 ms
  resolution); in LiveRobin they are empty (its pulses always run);
* state entries moved (the driver's count of the origins' cuts, checked against the state model) and
  bytes moved: *model* (``bytes_moved``: key + value bytes of the moved keys' state in the job's state
  model at the request, the layout of :mod:`rhino_state.state`), *measured* (``bytes_measured``:
  ``JobHandle.state_bytes_per_vnode``, every partition's RocksDB entries per vnode, key + value, asked for
  before each handover request (``--settle`` seconds before it, so that the measurement's
  own stall is not counted as the handover's) and summed over the vnodes it moved; the smallest and largest moved
  vnode and the whole task's state too), against the state size per vnode; and what the runtime counted:
  *cut* (``bytes_cut``: key + value bytes the origins cut, one replica of each), *shipped*
  (``bytes_shipped``: what one replica of each origin sent over the network to target replicas: a target
  replica on its worker gets the cut in process; with Rhino off every other one the whole cut; with Rhino
  on none on the other origin replica's worker, one on a worker of the origin's replica group only the
  changes since the origin's last checkpoint, rebuilding the cut from its local copy of that checkpoint,
  any other the whole cut) and *from store* (``bytes_from_store``: what the targets read from their local
  checkpoint copies instead); with a byte cap, the bytes the driver planned
  (``bytes_planned``).  Per step in ``handover_steps.csv`` too.  The measurement is not part of the
  handover: *before* ends where it starts;
* cores used (from ``/proc``, sampled every second) before the handover (the same span as the
  latency before) and during it: by the job's processes in all (executors' JVMs and Python, the
  driver JVM, the broker and ZooKeeper; ``cores_*``), by the broker (``broker_cores_*``) and by the
  executors' Python workers (``workers_cores_*``).  The driver's Python runs in this process, with the
  load generator, and is not counted;
* Rhino on: checkpoints compared between the two replicas of each partition and divergences (any fails
  the run);
* exactness: every event once, every chain links up (:func:`verify_chains`), every event read the pad
  value the reference says (a lost or stale piece of moved state shows), and the vnodes ended where the
  operation puts them (``on_target``; move: on partition 1; rescale: exactly its partitions own vnodes,
  balanced to within one, read right after it);
* the restart floor (``restart.csv``, unless ``--no-restart``): the seconds to start the same job shape and
  to stop it, idle (LiveRobin, Rhino off, the move job's shape): the part of any restart that does not
  depend on the state.  The issue's stop / restore with a new parallelism / restart comparison is
  ``bench/restart.py`` (a drain into a savepoint and a new run from it, against a live rescale).

A run that fails (the handover or the job) is a row with its error, never dropped.  Writes
``handover.csv``, ``handover_steps.csv``, ``handover_timeline.csv``, ``restart.csv``, ``handover.png``
and ``machine.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    CPU_GROUPS,
    CostProbe,
    CostSampler,
    PacedFeeder,
    cores_between,
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
from replication.api import Job  # noqa: E402
from replication.examples.ordered import ChainReport, chain_step, verify_chains  # noqa: E402
from replication.functions import KeyedProcessFunction, ProcessContext, RuntimeContext  # noqa: E402
from rhino_state import AllAtOnce, Batched, Fluid  # noqa: E402
from rhino_state.keys import encode_key, key_group, vnode_of  # noqa: E402

MS = 1000.0
MB = 1_000_000
TASK, SOURCE, SINK = "chain", "source", "chain-sink"
STRATEGIES = ("all", "batched", "fluid")  # and batched:N[:BYTES] (strategy_of)
RHINO = "+rhino"  # a mode's suffix: Rhino checkpoints on
MODES = ("liverobin", "liverobin" + RHINO, "kazoo", "kazoo" + RHINO)
OPERATIONS = ("move", "rescale", "none")
CONTROL = "none"  # the same job and load with no handover: what the seconds cost without one
RESCALE_UP, RESCALE_DOWN = "rescale 2->3", "rescale 3->2"  # the rows of a rescale run
ERROR_CHARS = 300  # an error in a row: at most this many characters (bench.common.one_line)
SOURCE_NAME = "a"  # event ids are "a-<i>" (verify_chains reads the source from the id)
STATE_ID_BYTES, KEY_LEN_BYTES, KG_BYTES = 4, 4, 2  # rhino_state.state's physical key layout


# ------------------------------------------------------------------------------------------ the job
def entry_value(writer: str, j: int, size: int) -> bytes:
    """What ``writer`` (an event id, or ``<key>/init``) writes to pad entry ``j``: deterministic,
    incompressible; a shorter call gives a prefix of a longer one (SHAKE)."""
    return hashlib.shake_128(f"{writer}:{j}".encode()).digest(size)


class PaddedChain(KeyedProcessFunction):
    """Per key a hash chain (``head``, ``n``) and a pad of ``entries`` map entries of ``value_bytes``:
    the key's first event writes the pad; every event reads entry ``n mod entries`` (output: its first
    8 bytes, hex) and overwrites it."""

    def __init__(self, entries: int, value_bytes: int) -> None:
        self.entries, self.value_bytes = entries, value_bytes

    def open(self, ctx: RuntimeContext) -> None:
        self.head = ctx.value_state("head", default="")
        self.count = ctx.value_state("n", default=0)
        self.pad = ctx.map_state("pad")

    def process(self, event: dict, ctx: ProcessContext) -> Iterable[dict]:
        prev, n = self.head.value(), self.count.value() + 1
        if n == 1:
            for j in range(self.entries):
                self.pad.put(j, entry_value(f"{ctx.key}/init", j, self.value_bytes))
        j = n % self.entries
        old = self.pad.get(j)
        self.pad.put(j, entry_value(event["id"], j, self.value_bytes))
        h = chain_step(prev, event["id"])
        self.head.update(h)
        self.count.update(n)
        yield {"key": ctx.key, "n": n, "id": event["id"], "prev": prev, "h": h, "ts": event["ts"],
               "old": None if old is None else old[:8].hex()}


def build_handover_job(topic: str, out_topic: str, name: str, entries: int, value_bytes: int,
                       parallelism: int = 2, max_parallelism: int | None = None) -> Job:
    """``topic -> key_by(key) -> chain (PaddedChain) -> sink`` (the sink a task of its own); with
    ``max_parallelism``, the chain task hosts that many partitions, ``parallelism`` of them owning vnodes."""
    if __name__ != "__main__":  # imported (not run as a script): executors cannot import ``bench``
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    job = Job(name)
    src = job.source(topic, deserializer="json", timestamp=lambda e: e["ts"], name=SOURCE)
    (src.key_by(lambda e: e["key"]).process(PaddedChain(entries, value_bytes), name=TASK, parallelism=parallelism,
                                            max_parallelism=max_parallelism)
     .new_task().sink(out_topic, serializer="json", key_serializer="str", name=SINK))
    return job


# ------------------------------------------------------------------------------------------ the state model
def pick_keys(per_vnode: int, num_key_groups: int, num_vnodes: int) -> tuple[str, ...]:
    """Keys ``k<i>`` (smallest ``i`` first) so that every vnode holds exactly ``per_vnode`` of them."""
    counts = [0] * num_vnodes
    keys: list[str] = []
    i = 0
    while len(keys) < per_vnode * num_vnodes:
        key = f"k{i}"
        v = vnode_of(key_group(encode_key(key), num_key_groups), num_key_groups, num_vnodes)
        if counts[v] < per_vnode:
            counts[v] += 1
            keys.append(key)
        i += 1
    return tuple(keys)


def _pickled(value: Any) -> int:
    return len(pickle.dumps(value, protocol=5))


def key_state(key: str, n: int, entries: int, value_bytes: int) -> tuple[int, int]:
    """(state entries, key + value bytes) a key holds after ``n >= 1`` events: ``head`` and ``n``
    (value states) and the pad (map state), physical keys as :mod:`rhino_state.state` lays them out."""
    base = KG_BYTES + STATE_ID_BYTES + KEY_LEN_BYTES + len(encode_key(key))
    head = base + _pickled("0" * 16)  # chain_step gives 16 hex digits
    count = base + _pickled(n)
    pad = sum(base + len(encode_key(j)) for j in range(entries)) + entries * _pickled(b"\0" * value_bytes)
    return 2 + entries, head + count + pad


def entries_for(total_bytes: int, keys: Sequence[str], value_bytes: int) -> int:
    """The pad entries per key that bring the whole state (every key written) closest to ``total_bytes``."""
    one = sum(key_state(k, 1, 1, value_bytes)[1] for k in keys)
    two = sum(key_state(k, 1, 2, value_bytes)[1] for k in keys)
    per_entry = two - one
    return max(1, round((total_bytes - (one - per_entry)) / per_entry))


@dataclass(frozen=True)
class StateModel:
    """The job's keys, where they live and what state they hold."""

    keys: tuple[str, ...]
    entries: int
    value_bytes: int
    num_key_groups: int
    num_vnodes: int

    def vnode(self, key: str) -> int:
        return vnode_of(key_group(encode_key(key), self.num_key_groups), self.num_key_groups, self.num_vnodes)

    def keys_in(self, vnodes: Iterable[int]) -> list[str]:
        wanted = set(vnodes)
        return [k for k in self.keys if self.vnode(k) in wanted]

    def state(self, keys: Iterable[str], counts: dict[str, int] | None = None) -> tuple[int, int]:
        """(entries, bytes) of ``keys`` once each saw ``counts[key]`` events (default 1; 0: no state)."""
        entries = size = 0
        for k in keys:
            n = 1 if counts is None else counts.get(k, 0)
            if n > 0:
                e, b = key_state(k, n, self.entries, self.value_bytes)
                entries, size = entries + e, size + b
        return entries, size

    @property
    def total_bytes(self) -> int:
        return self.state(self.keys)[1]

    @property
    def bytes_per_vnode(self) -> float:
        return self.total_bytes / self.num_vnodes


# ------------------------------------------------------------------------------------------ verification
@dataclass
class Verdict:
    chains: ChainReport
    wrong_pad: int = 0  # events that read another pad value than the reference's
    failure: str | None = None  # the job failed (or did not drain)

    @property
    def exact(self) -> bool:
        return self.failure is None and self.chains.exact and not self.wrong_pad

    @property
    def outcome(self) -> str:
        c = self.chains
        parts = [f"job failed: {self.failure}"] if self.failure else []
        if c.missing or c.duplicated or c.unexpected:
            parts.append(f"{len(c.missing)} missing, {len(c.duplicated)} duplicated, {len(c.unexpected)} unexpected")
        if c.broken or c.reordered:
            parts.append(f"{len(c.broken)} broken chains, {len(c.reordered)} keys reordered (of {c.keys})")
        if self.wrong_pad:
            parts.append(f"{self.wrong_pad} events read a wrong pad value")
        return "; ".join(parts) or "yes"


def wrong_pad_reads(outputs: Iterable[dict], entries: int) -> int:
    """Output records whose ``old`` is not what the pad entry held in the key's order (by ``n``): the
    key's init value, or the value the last earlier event of that entry wrote."""
    by_key: dict[str, list[dict]] = {}
    for rec in outputs:
        by_key.setdefault(rec["key"], []).append(rec)
    wrong = 0
    for key, recs in by_key.items():
        last: dict[int, str] = {}
        seen: set[int] = set()
        for rec in sorted(recs, key=lambda r: r["n"]):
            if rec["n"] in seen:  # a duplicate: verify_chains reports it
                continue
            seen.add(rec["n"])
            j = rec["n"] % entries
            if rec.get("old") != entry_value(last.get(j, f"{key}/init"), j, 8).hex():
                wrong += 1
            last[j] = rec["id"]
    return wrong


def verify(outputs: list[dict], event_ids: Iterable[str], entries: int, failure: str | None = None) -> Verdict:
    return Verdict(verify_chains(outputs, event_ids), wrong_pad_reads(outputs, entries), failure)


# ------------------------------------------------------------------------------------------ phases
STEP_PHASES = ("trigger", "to_switch", "alignment", "transfer", "release_wait", "load", "catch_up", "acks")
PHASE_COLUMNS = ("window_open_s", *(f"{p}_s" for p in STEP_PHASES), "between_steps_s", "window_close_s",
                 "held_max_s", "blocked_s")


def _total(values: Iterable[float | None]) -> float | str:
    """The sum of ``values``: "" when one is unknown (None) or there is none."""
    known = list(values)
    return "" if not known or None in known else sum(known)  # type: ignore[arg-type]


def _blank(value: float | None) -> float | str:
    return "" if value is None else value


def step_span(step: dict[str, Any]) -> float | None:
    """A step of a handover report from its instruction to the driver learning of its completion (what
    its ``phases`` add up to), in seconds; None when it did not complete."""
    completed = step["timeline"].get("completed")
    return completed - step["instructed_at"] if completed is not None else None


def run_phases(steps: Sequence[dict[str, Any]], total_s: float,
               window: tuple[float | str, float | str] | None = None) -> dict[str, float | str]:
    """A run's :data:`PHASE_COLUMNS`: each of :data:`STEP_PHASES` summed over the report's ``steps`` (their
    ``phases``, from the participants' acks), the largest ``held`` and the summed ``blocked``;
    *between steps*: what of ``total_s`` (the whole job) no step (instruction -> completion) nor the pulse
    window's opening and closing covers.  ``window`` (KaZoo mode): the seconds from the request to the
    window open and from the last step's completion to the window closed (:func:`window_spans`); ``None``
    (LiveRobin: its pulses run all the time): both empty.  Each "" where a value it needs is unknown."""
    spans = _total(step_span(s) for s in steps)
    opening, closing = window if window is not None else ("", "")
    between = (max(0.0, total_s - spans - (opening or 0.0) - (closing or 0.0))  # type: ignore[operator]
               if spans != "" and (window is None or "" not in window) else "")
    held = [s["phases"]["held"] for s in steps]
    return {"window_open_s": opening, **{f"{p}_s": _total(s["phases"][p] for s in steps) for p in STEP_PHASES},
            "between_steps_s": between, "window_close_s": closing,
            "held_max_s": "" if not held or None in held else max(held),
            "blocked_s": _total(s["phases"]["blocked"] for s in steps)}


_WINDOW_OPEN = re.compile(r"^pulse window (\d+) open: ")
_WINDOW_CLOSED = re.compile(r"^pulse window (\d+)(?: closed at pulse |: its last pulse was not written)")


def window_marks(events: Iterable[tuple[float, str]], requested: float) -> tuple[float | None, float | None]:
    """KaZoo: the wall time the handover job's pulse window opened (the first window opened at or after
    ``requested``, the wall clock just before the request) and closed (None: no such event)."""
    opened = window = closed = None
    for at, text in events:
        if window is None and at >= requested and (m := _WINDOW_OPEN.match(text)):
            opened, window = at, m.group(1)
        elif window is not None and (m := _WINDOW_CLOSED.match(text)) and m.group(1) == window:
            closed = at
            break
    return opened, closed


def window_spans(events: Iterable[tuple[float, str]], requested: float,
                 steps: Sequence[dict[str, Any]]) -> tuple[float | str, float | str]:
    """(request -> window open, the last of ``steps`` completed -> window closed) in seconds, "" where
    unknown."""
    opened, closed = window_marks(events, requested)
    last = steps[-1]["timeline"].get("completed") if steps else None
    return (opened - requested if opened is not None else "",
            closed - last if closed is not None and last is not None else "")


# ------------------------------------------------------------------------------------------ latency
@dataclass(frozen=True)
class Obs:
    """One output record: produced (event time) and written by the sink (wall clock, s), moved key or not."""

    produced: float
    sink: float
    moved: bool

    @property
    def latency(self) -> float:
        return self.sink - self.produced


def per_second(obs: Iterable[Obs], origin: float) -> dict[int, list[Obs]]:
    """Records by event second since ``origin`` (floor: -0.2 s is second -1)."""
    groups: dict[int, list[Obs]] = {}
    for o in obs:
        groups.setdefault(int((o.produced - origin) // 1), []).append(o)
    return dict(sorted(groups.items()))


def _ms_stats(lat: list[float], prefix: str) -> dict[str, float | str]:
    """p50 / p99 / max (ms) of ``lat`` (s); empty strings when there is none."""
    if not lat:
        return {f"{prefix}p50_ms": "", f"{prefix}p99_ms": "", f"{prefix}max_ms": ""}
    return {f"{prefix}p50_ms": percentile(lat, .5) * MS, f"{prefix}p99_ms": percentile(lat, .99) * MS,
            f"{prefix}max_ms": max(lat) * MS}


def timeline_rows(obs: Sequence[Obs], origin: float, labels: dict[str, Any]) -> list[dict[str, Any]]:
    """handover_timeline.csv rows: per event second since ``origin`` (the request), all records and
    the moved keys' records."""
    rows = []
    for sec, group in per_second(obs, origin).items():
        moved = [o.latency for o in group if o.moved]
        rows.append({**labels, "second": sec, "records": len(group), **_ms_stats([o.latency for o in group], ""),
                     "moved_records": len(moved), **_ms_stats(moved, "moved_")})
    return rows


def window_columns(obs: Sequence[Obs], lo: float, hi: float, name: str) -> dict[str, float | str]:
    """p99 and max (ms) of the records produced in ``[lo, hi)``, all and moved keys only."""
    inside = [o for o in obs if lo <= o.produced < hi]
    moved = [o.latency for o in inside if o.moved]
    every = [o.latency for o in inside]
    return {f"p99_{name}_ms": percentile(every, .99) * MS if every else "",
            f"max_{name}_ms": max(every) * MS if every else "",
            f"moved_p99_{name}_ms": percentile(moved, .99) * MS if moved else "",
            f"moved_max_{name}_ms": max(moved) * MS if moved else ""}


def latency_columns(obs: Sequence[Obs], requested: float, ended: float, load: tuple[float, float],
                    warm_up_s: float, before_end: float | None = None) -> dict[str, float | str]:
    """Before the request (from ``warm_up_s`` after the load started to ``before_end``, default the
    request: the bench's own state measurement just before it is in no window), during the handover
    (produced between the request and its end) and after it (to the end of the load); the worst
    per-second p99 during it, of every key and of the keys not moved (whose records no step holds)."""
    during = [g for sec, g in per_second(obs, requested).items() if sec >= 0 and requested + sec < ended]
    unmoved = [lat for g in during if (lat := [o.latency for o in g if not o.moved])]
    return {**window_columns(obs, load[0] + warm_up_s, min(before_end or requested, requested), "before"),
            **window_columns(obs, requested, ended, "during"),
            **window_columns(obs, ended, load[1], "after"),
            "worst_second_p99_ms": max((percentile([o.latency for o in g], .99) for g in during), default=0.0) * MS,
            "unmoved_worst_second_p99_ms": max((percentile(lat, .99) for lat in unmoved), default=0.0) * MS}


# ------------------------------------------------------------------------------------------ CSV rows
# the runtime's byte counts per run, summed over the steps' (STEP_BYTES): cut, sent over the network, read
# from the targets' local checkpoint copies
BYTES_COLUMNS = ("bytes_cut", "bytes_shipped", "bytes_from_store")
STEP_BYTES = ("bytes_moved", "bytes_shipped", "bytes_from_store")
MEASURED_COLUMNS = ("bytes_measured", "measured_vs_model", "moved_vnode_bytes_min", "moved_vnode_bytes_max",
                    "state_bytes_measured", "measured_bytes_per_vnode")
RUN_COLUMNS = ("mode", "rhino", "operation", "size", "strategy", "state_bytes", "vnodes", "bytes_per_vnode",
               "keys", "pad_entries", "value_bytes", "vnodes_moved", "steps", "state", "error", "exact", "outcome",
               "on_target", "produced", "records", "checkpoints", "divergences", "divergence",
               "handover_s", *PHASE_COLUMNS, "max_step_s", "entries_moved", "entries_model", "entries_match",
               "bytes_moved", *BYTES_COLUMNS, *MEASURED_COLUMNS, "measure_s", "bytes_planned", "max_step_bytes_planned",
               "p99_before_ms", "max_before_ms", "moved_p99_before_ms", "moved_max_before_ms",
               "p99_during_ms", "max_during_ms", "moved_p99_during_ms", "moved_max_during_ms", "p99_after_ms",
               "max_after_ms", "moved_p99_after_ms", "moved_max_after_ms", "worst_second_p99_ms",
               "unmoved_worst_second_p99_ms", "requested_at_s", "control_worst_second_p99_ms",
               "worst_vs_before", "worst_vs_control", *(f"{g}cores_{p}" for g in ("", "broker_", "workers_")
                                                           for p in ("before", "during")))


def measured_columns(sizes: Sequence[int] | None, vnodes: Sequence[int], model_bytes: int) -> dict[str, Any]:
    """The state the partitions measured per vnode (``sizes``, None: not measured) against the model:
    summed over the moved ``vnodes`` (``bytes_measured``; ``model_bytes``: the model's bytes of the moved
    keys), its smallest and largest moved vnode, and the whole task's state."""
    if not sizes:
        return dict.fromkeys(MEASURED_COLUMNS, "")
    moved = [sizes[v] for v in vnodes]
    total = sum(moved)
    return {"bytes_measured": total, "measured_vs_model": total / model_bytes if model_bytes else "",
            "moved_vnode_bytes_min": min(moved, default=""), "moved_vnode_bytes_max": max(moved, default=""),
            "state_bytes_measured": sum(sizes), "measured_bytes_per_vnode": sum(sizes) / len(sizes)}


def run_row(labels: dict[str, Any], report: dict[str, Any] | None, moved: tuple[int, int],
            verdict: Verdict | None, latency: dict[str, Any], extra: dict[str, Any],
            window: tuple[float | str, float | str] | None = None) -> dict[str, Any]:
    """One handover.csv row (every :data:`RUN_COLUMNS`, empty where a failed run has nothing).
    ``moved``: (entries, bytes) of the moved keys in the state model; ``extra``: the other columns;
    ``window``: KaZoo's pulse window spans (:func:`run_phases`)."""
    row: dict[str, Any] = dict.fromkeys(RUN_COLUMNS, "")
    row.update(labels)
    row.update(extra)
    if report is not None:
        steps = report["steps"]
        measured = report["entries_moved"]
        row.update({"steps": len(steps), "state": report["state"], "handover_s": report["seconds"],
                    **run_phases(steps, report["seconds"], window),
                    "max_step_s": max((s["seconds"] for s in steps), default=""),
                    "entries_moved": measured, "entries_model": moved[0],
                    "entries_match": "yes" if measured == moved[0] else "no", "bytes_moved": moved[1],
                    **{col: sum(s[key] for s in steps)
                       for col, key in zip(BYTES_COLUMNS, STEP_BYTES, strict=True)}})
        planned = [s["bytes_planned"] for s in steps if s.get("bytes_planned") is not None]
        if planned:  # a byte cap: the driver's plan, from the state it measured per vnode
            row.update({"bytes_planned": sum(planned), "max_step_bytes_planned": max(planned)})
    if verdict is not None:
        row.update({"exact": "yes" if verdict.exact else "no", "outcome": verdict.outcome,
                    "records": verdict.chains.records})
    row.update({k: v for k, v in latency.items() if k in row})
    return row


def step_rows(labels: dict[str, Any], steps: Sequence[dict], period_ms: int,
              measured: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """handover_steps.csv rows: one per step of a handover report, its pulses, the switch margin they
    plan (pulses x ``period_ms``) and the release margin, its phases (:data:`STEP_PHASES`, *held*,
    *blocked*; instruction -> completion as ``total_s``), its bytes cut (``bytes_moved``), sent and read
    from local checkpoint copies, those a byte cap planned and those its vnodes held as ``measured``
    (per vnode) just before the handover job."""
    return [{**labels, "step": i + 1, "handover_id": s["handover_id"], "vnodes": len(s["vnodes"]),
             "origins": " ".join(map(str, s.get("origins", ()))), "targets": " ".join(map(str, s.get("targets", ()))),
             "state": s["state"], "switch_at": s["switch_at"], "release_at": s["release_at"],
             "pulse_at_request": s["pulse_at_request"],
             "planned_switch_s": (s["switch_at"] - s["pulse_at_request"]) * period_ms / MS,
             "release_s": s["release_s"],
             **{f"{p}_s": _blank(s["phases"][p]) for p in (*STEP_PHASES, "held", "blocked")},
             "total_s": _blank(step_span(s)), "seconds": s["seconds"], "entries_moved": s["entries_moved"],
             **{key: s[key] for key in STEP_BYTES},
             "bytes_planned": s.get("bytes_planned") if s.get("bytes_planned") is not None else "",
             "bytes_measured": sum(measured[v] for v in s["vnodes"]) if measured else ""}
            for i, s in enumerate(steps)]


# ------------------------------------------------------------------------------------------ load
class Feeder(PacedFeeder):
    """Produces ``rate`` events/s round robin over ``keys`` until stopped: event ``i`` is
    ``{"id": "a-<i>", "key": keys[i % K], "ts": <wall clock ms>}``, keyed by its key."""

    def __init__(self, bootstrap: str, topic: str, keys: Sequence[str], rate: float, linger_ms: float,
                 burst: int) -> None:
        super().__init__(bootstrap, self.event, rate, name="handover-feeder", linger_ms=linger_ms, burst=burst)
        self.topic, self.keys = topic, keys

    def event(self, i: int) -> tuple[str, bytes, bytes]:
        key = self.keys[i % len(self.keys)]
        event = {"id": f"{SOURCE_NAME}-{i}", "key": key, "ts": int(time.time() * 1000)}
        return self.topic, key.encode(), json.dumps(event).encode()

    @property
    def ids(self) -> list[str]:
        return [f"{SOURCE_NAME}-{i}" for i in range(self.produced)]


class Ticker(threading.Thread):
    """Redraws the live status line from ``text()`` 4 times a second until stopped."""

    def __init__(self, status: StatusLine, text: Callable[[], str]) -> None:
        super().__init__(name="handover-status", daemon=True)
        self.status, self.text = status, text
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.25):
            try:
                self.status.update(self.text())
            except Exception:  # noqa: BLE001 - a status line must never break the run
                pass

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.status.done()


# ------------------------------------------------------------------------------------------ runs
_BATCHED = re.compile(r"batched:(\d+)(?::([^:]+))?", re.IGNORECASE)


def strategy_parts(name: str, batch: int) -> tuple[str, int | None, int | None]:
    """``all`` / ``fluid`` / ``batched`` (``batch`` vnodes per step) / ``batched:N`` (N per step) /
    ``batched:N:BYTES`` (N per step and at most BYTES of state, measured, per step; BYTES as ``--sizes``:
    ``660KB`` = 660,000 bytes) -> (kind, vnodes per step, byte cap)."""
    if name in ("all", "fluid"):
        return name, None, None
    if name == "batched":
        return name, batch, None
    m = _BATCHED.fullmatch(name)
    if not m:
        raise argparse.ArgumentTypeError(f"not a strategy: {name!r} (all, fluid, batched, batched:N or "
                                         "batched:N:BYTES, e.g. batched:32:660KB)")
    n, cap = int(m.group(1)), parse_size(m.group(2)) if m.group(2) else None
    if n < 1 or (cap is not None and cap < 1):
        raise argparse.ArgumentTypeError(f"strategy {name!r}: N and BYTES must be at least 1")
    return "batched", n, cap


def strategy_of(name: str, batch: int) -> AllAtOnce | Batched | Fluid:
    kind, n, cap = strategy_parts(name, batch)
    return {"all": AllAtOnce, "fluid": Fluid}[kind]() if n is None else Batched(n, max_bytes=cap)


def size_text(n: int) -> str:
    """Bytes the way ``--sizes`` writes them: 20MB, 660KB, 512B."""
    return f"{n / MB:g}MB" if n >= MB else f"{n / 1000:g}KB" if n >= 1000 else f"{n}B"


def strategy_label(name: str, batch: int) -> str:
    kind, n, cap = strategy_parts(name, batch)
    if n is None:
        return {"all": "all-at-once", "fluid": "fluid"}[kind]
    return f"batched {n}" + (f" cap {size_text(cap)}" if cap is not None else "")


def rhino_on(mode: str) -> bool:
    return mode.endswith(RHINO)


def base_mode(mode: str) -> str:
    """The replication mode of a bench mode: ``liverobin+rhino`` -> ``liverobin``."""
    return mode.removesuffix(RHINO)


@dataclass(frozen=True)
class Checkpointing:
    """How often the replicas checkpoint with Rhino on: in LiveRobin every ``pulses`` pulses; in KaZoo
    every ``orders`` order records (partitions with several inputs) or ``elements`` records read or
    consumed (sources, tasks with one input)."""

    pulses: int = 20
    orders: int = 50
    elements: int = 200

    def conf(self, mode: str) -> dict[str, str]:
        """The Rhino keys of bench mode ``mode`` (Rhino on: one holder per replica group)."""
        if not rhino_on(mode):
            return {"spark.replication.rhino.enabled": "false"}
        kazoo = base_mode(mode) == "kazoo"
        conf = {"spark.replication.rhino.enabled": "true", "spark.replication.rhino.replicas": "1",
                "spark.replication.rhino.checkpointEvery": str(self.orders if kazoo else self.pulses)}
        if kazoo:
            conf["spark.replication.rhino.checkpointElements"] = str(self.elements)
        return conf

    def label(self, mode: str) -> str:
        """The ``rhino`` column: ``off``, or how often the replicas checkpoint."""
        if not rhino_on(mode):
            return "off"
        if base_mode(mode) == "kazoo":
            return f"every {self.orders} orders / {self.elements} records"
        return f"every {self.pulses} pulses"


def job_conf(bootstrap: str, period_ms: int | None, mode: str = "liverobin", zookeeper: str | None = None,
             checkpoints: Checkpointing = Checkpointing()) -> dict[str, str]:
    """The job's configuration in ``mode``: LiveRobin with ``period_ms`` pulses, or KaZoo (ZooKeeper at
    ``zookeeper``), whose handovers open pulse windows of ``period_ms`` pulses (None: the mode's
    default); Rhino off, or on for a ``+rhino`` mode (``checkpoints``)."""
    kazoo = base_mode(mode) == "kazoo"
    conf = {"spark.replication.kafka.bootstrapServers": bootstrap, "spark.replication.enabled": "true",
            "spark.replication.mode": base_mode(mode), **checkpoints.conf(mode)}
    if period_ms is not None:
        period_key = "kazoo.windowPulsePeriod" if kazoo else "liverobin.heartbeatPeriod"
        conf[f"spark.replication.{period_key}"] = f"{period_ms}ms"
    if kazoo:
        if not zookeeper:
            raise ValueError("KaZoo mode needs ZooKeeper's address")
        conf.update({"spark.replication.zookeeper.connect": zookeeper,
                     "spark.replication.kazoo.sessionTimeout": "1s"})
    return conf


def checkpointing(args: argparse.Namespace) -> Checkpointing:
    """The Rhino checkpoint intervals the flags ask for."""
    return Checkpointing(args.checkpoint_every, args.kazoo_checkpoint_every, args.checkpoint_elements)


def state_model(size: int, args: argparse.Namespace, conf: dict[str, str]) -> StateModel:
    """The keys and pad of a run at ``size`` bytes, for the key groups and vnodes ``conf`` gives."""
    from replication.control.launch import resolve_config

    cfg = resolve_config(None, conf)
    keys = pick_keys(args.keys_per_vnode, cfg.state_key_groups, cfg.state_vnodes)
    return StateModel(keys, entries_for(size, keys, args.value_bytes), args.value_bytes, cfg.state_key_groups,
                      cfg.state_vnodes)


@dataclass
class RunContext:
    stack: Any
    spark: Any
    args: argparse.Namespace
    status: StatusLine


@dataclass
class RunResult:
    row: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class RunSpec:
    """One run: a fresh job, its ``operation`` (``move``: one handover; ``rescale``: 2 -> 3 -> 2, two)."""

    operation: str  # move, rescale (2 -> 3 -> 2, two handovers) or none (the control: no handover)
    mode: str
    size: int
    strategy: str


@dataclass
class Op:
    """One handover job of a run: ``call`` runs it (its report), ``check`` tells from the routing table
    after it whether the vnodes are where they should be; filled in as it runs."""

    name: str
    call: Callable[[], dict[str, Any]]
    check: Callable[[Any, list[int]], bool]
    vnodes: list[int] = field(default_factory=list)  # moved (move: asked for; rescale: from the report)
    report: dict[str, Any] | None = None
    error: str | None = None
    requested: float = 0.0
    ended: float = 0.0
    table: Any = None  # the routing table right after it
    measured: list[int] | None = None  # state bytes per vnode just before it (state_bytes_per_vnode)
    measure_error: str | None = None
    measured_at: float = 0.0  # wall clock: the measurement was asked for

    def moved_vnodes(self) -> list[int]:
        if self.vnodes:
            return self.vnodes
        return sorted({v for s in (self.report or {}).get("steps", ()) for v in s["vnodes"]})


def first_operation(operation: str) -> str:
    """The operation column of a run's first row."""
    return RESCALE_UP if operation == "rescale" else operation


def idle_report(seconds: float) -> dict[str, Any]:
    """The control's "handover": ``seconds`` of load with none, reported as a job of no steps."""
    time.sleep(seconds)
    return {"state": "no handover", "seconds": seconds, "steps": [], "entries_moved": 0}


def compare_with_control(rows: Sequence[dict[str, Any]], timeline: Sequence[dict[str, Any]]) -> None:
    """Each handover row's worst per-second p99 over its p99 before (``worst_vs_before``, the ratio issue
    26 asks about) and over the control run's worst per-second p99 in the same seconds of load
    (``control_worst_second_p99_ms``, ``worst_vs_control``): the same job, mode, size and rate with no
    handover, so what the machine and the broker add as the run ages is in both."""
    def num(value: Any) -> float | None:
        return None if value in ("", None) else float(value)

    controls = {(c["mode"], c["size"]): c for c in reversed(rows) if c["operation"] == CONTROL}
    control_p99: dict[tuple[str, str], dict[int, float]] = {}
    for t in timeline:
        if t["operation"] == CONTROL and t["p99_ms"] not in ("", None):
            control_p99.setdefault((t["mode"], t["size"]), {})[int(float(t["second"]))] = float(t["p99_ms"])
    for r in rows:
        worst, before = num(r.get("worst_second_p99_ms")), num(r.get("p99_before_ms"))
        r["worst_vs_before"] = worst / before if worst is not None and before else ""
        control = controls.get((r["mode"], r["size"]))
        at, span = num(r.get("requested_at_s")), num(r.get("handover_s"))
        if r["operation"] == CONTROL or control is None or at is None or span is None:
            continue
        shift = at - float(control["requested_at_s"])
        seconds = range(int(shift // 1), int((shift + span) // 1) + 1)
        p99 = control_p99.get((r["mode"], r["size"]), {})
        if all(s in p99 for s in seconds):
            r["control_worst_second_p99_ms"] = max(p99[s] for s in seconds)
            r["worst_vs_control"] = worst / r["control_worst_second_p99_ms"] if worst is not None else ""


def cpu_columns(samples: Sequence[tuple[float, Any]], before: tuple[float, float],
                during: tuple[float, float]) -> dict[str, float | str]:
    """Cores used before a handover and during it (wall-clock spans): by the job's processes in all
    (``CPU_GROUPS``), by the broker, and by the executors' Python workers."""
    out: dict[str, float | str] = {}
    for phase, (start, end) in (("before", before), ("during", during)):
        cores = cores_between(samples, start, end) if start and end else {}
        out[f"cores_{phase}"] = sum(cores.get(g, 0.0) for g in CPU_GROUPS) if cores else ""
        out[f"broker_cores_{phase}"] = cores.get("broker", "")
        out[f"workers_cores_{phase}"] = cores.get("python", "")
    return out


def balanced_on(partitions: Sequence[int]) -> Callable[[Any, list[int]], bool]:
    """A rescale's check: exactly ``partitions`` own vnodes, to within one vnode each, and every moved
    vnode is on one of them."""
    def check(table: Any, moved: list[int]) -> bool:
        counts = [table.assignment.count(p) for p in partitions]
        return (sorted(set(table.assignment)) == sorted(partitions) and max(counts) - min(counts) <= 1
                and all(table.partition_of_vnode(v) in partitions for v in moved))
    return check


def max_steps(strategy: str, vnodes: int, batch: int) -> int:
    """The most steps ``strategy`` can take for ``vnodes`` (a byte cap: as many as vnodes)."""
    kind, n, cap = strategy_parts(strategy, batch)
    if n is None:
        return {"all": 1, "fluid": vnodes}[kind]
    return vnodes if cap is not None else -(-vnodes // n)


def handover_run(ctx: RunContext, spec: RunSpec) -> list[RunResult]:
    """A fresh job at ``spec.size`` in ``spec.mode``, under load, then its handover(s) with
    ``spec.strategy`` (see the module doc): one row per handover job."""
    from deploy.topics import create_topics, read_all
    from ops.workload import sample_of
    from replication.control.launch import resolve_config, run

    args, bootstrap = ctx.args, ctx.stack.bootstrap_servers
    checkpoints = checkpointing(args)
    conf = job_conf(bootstrap, args.period, spec.mode, getattr(ctx.stack, "zookeeper_connect", None), checkpoints)
    model = state_model(spec.size, args, conf)
    control = spec.operation == CONTROL
    label = "-" if control else strategy_label(spec.strategy, args.batch)
    base = {"mode": spec.mode, "size": f"{spec.size / MB:g}MB", "strategy": label}
    extra: dict[str, Any] = {"rhino": checkpoints.label(spec.mode),
                             "state_bytes": model.total_bytes,
                             "vnodes": model.num_vnodes,
                             "bytes_per_vnode": model.bytes_per_vnode, "keys": len(model.keys),
                             "pad_entries": model.entries, "value_bytes": model.value_bytes}
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topic, out = f"hov{stamp}-in", f"hov{stamp}-out"
    create_topics(bootstrap, {topic: 2})
    phase = {"text": "starting the job"}
    rescale = spec.operation == "rescale"
    name = re.sub(r"[^A-Za-z0-9-]+", "-", f"hov-{spec.operation}-{spec.mode}-{spec.strategy}-{stamp}")
    handle = run(build_handover_job(topic, out, name,
                                    model.entries, model.value_bytes, max_parallelism=3 if rescale else None),
                 spark=ctx.spark, conf=conf)
    feeder = Feeder(bootstrap, topic, model.keys, args.rate, args.linger, args.burst)
    strategy = strategy_of(spec.strategy, args.batch)
    timing = {"timeout": 30.0, "margin_s": args.margin, "release_s": args.release, "strategy": strategy}

    def status_text() -> str:
        m = handle.sink_metrics()
        return (f"{spec.mode} {spec.operation} {base['size']} {label}: {phase['text']}; {feeder.produced:,} produced, "
                f"{m.records_out // handle.plan.replicas:,} out, p99 {m.latency.percentile(0.99) * MS:.0f} ms")

    ticker = Ticker(ctx.status, status_text)
    ticker.start()
    sampler = CostSampler(CostProbe.for_spark(ctx.spark, getattr(ctx.stack, "run_dir", None)))
    ops: list[Op] = []
    error = failure = None  # the run's own (the job did not start, the load failed, the output unread); the job's
    try:
        handle.wait_started(120)
        table = handle.plan.routing[next(t.id for t in handle.plan.tasks if t.name == TASK)]
        if (handle.plan.num_key_groups, table.num_vnodes) != (model.num_key_groups, model.num_vnodes):
            raise RuntimeError(f"the job has {handle.plan.num_key_groups} key groups and {table.num_vnodes} "
                               f"vnodes, the model {model.num_key_groups} and {model.num_vnodes}")
        if control:  # the load goes on for as long as the handovers of a rescale run, none requested
            ops = [Op(CONTROL, lambda: idle_report(args.control_seconds), lambda t, moved: True)]
        elif rescale:  # a third of the vnodes go to the spare partition, and back
            steps = max_steps(spec.strategy, model.num_vnodes // 3 + 1, args.batch)
            timing["timeout"] = 30.0 + 5 * steps
            ops = [Op(RESCALE_UP, lambda: handle.rescale(TASK, 3, **timing), balanced_on([0, 1, 2])),
                   Op(RESCALE_DOWN, lambda: handle.rescale(TASK, 2, **timing), balanced_on([0, 1]))]
        else:
            own = table.vnodes_of(0)
            vnodes = list(own[:args.vnodes or len(own) // 2])
            timing["timeout"] = 30.0 + 5 * max_steps(spec.strategy, len(vnodes), args.batch)
            ops = [Op("move", lambda: handle.move_vnodes(TASK, vnodes, 1, **timing),
                      lambda t, moved: all(t.partition_of_vnode(v) == 1 for v in moved), vnodes=vnodes)]
        feeder.start()
        sampler.start()
        phase["text"] = f"load, handover in {args.before:.0f}s"
        wait_for_state(handle, feeder, len(model.keys), args.before)
        for i, op in enumerate(ops):
            if i and ops[i - 1].error:
                op.error = "not run: the handover before it failed"
                continue
            phase["text"] = f"measuring the state per vnode before {op.name}"
            op.measured_at = time.time()
            try:  # what the moved vnodes hold just before the request, as the partitions measure it
                op.measured = handle.state_bytes_per_vnode(TASK, timeout=30.0)
            except Exception as err:  # noqa: BLE001 - recorded in the row; the handover still runs
                op.measure_error = f"measuring the state per vnode: {one_line(err, ERROR_CHARS)}"
            # the measurement reads every partition's state on its thread: let that backlog drain
            # first, or the handover's first second pays for it
            time.sleep(args.settle)
            phase["text"] = f"{op.name} ({label})"
            op.requested = time.time()
            try:  # (with a byte cap, the driver measures the state per vnode first)
                op.report = op.call()
            except Exception as err:  # noqa: BLE001 - recorded in the row
                op.error = one_line(err, ERROR_CHARS)
            op.ended = time.time()
            op.table = handle.routing(TASK)
            phase["text"] = f"{op.name} {'failed' if op.error else 'done'}, {args.after:.0f}s more load"
            time.sleep(args.after)
    except Exception as err:  # noqa: BLE001 - the job did not start, or the load failed: recorded
        error = one_line(err, ERROR_CHARS)
    finally:
        produced, load_error = stop_feeder(feeder)
        if sampler.is_alive():
            sampler.stop()
        error = error or load_error
    phase["text"] = "draining"
    checkpoints: dict[str, Any] = {}
    try:
        result = handle.drain(timeout=180)
        events = result.events
        if rhino_on(spec.mode):
            first = one_line(result.divergences[0], ERROR_CHARS) if result.divergences else ""
            checkpoints = {"checkpoints": result.checkpoints_compared, "divergences": len(result.divergences),
                           "divergence": first}
    except Exception as err:  # noqa: BLE001 - JobFailedError, TimeoutError: recorded
        failure = one_line(err, ERROR_CHARS)
        events = list(handle.master.events)
        if handle.running:
            try:
                handle.stop(30)
            except Exception:  # noqa: BLE001 - it failed already; the row says why
                pass
    phase["text"] = "reading and verifying the output"
    try:
        raw = read_all(bootstrap, out) if produced else []
    except Exception as err:  # noqa: BLE001 - no output to verify: recorded
        raw, error = [], error or f"reading the output: {one_line(err, ERROR_CHARS)}"
    ticker.stop()
    forget_topics(bootstrap, stamp)
    outputs = [json.loads(r.value) for r in raw]
    sinks = [sample_of(r).sink for r in raw]
    verdict = verify(outputs, feeder.ids, model.entries, failure) if produced else None
    load_end = feeder.ended_at or time.time()
    if not ops:  # the job did not start: one row for the run
        ops = [Op(first_operation(spec.operation), dict, lambda t, m: False)]
    results = []
    for i, op in enumerate(ops):
        labels = {"mode": spec.mode, "operation": op.name, **{k: v for k, v in base.items() if k != "mode"}}
        vnodes = op.moved_vnodes()
        moved_keys = set(model.keys_in(vnodes))
        obs = [Obs(o["ts"] / MS, sink, o["key"] in moved_keys) for sink, o in zip(sinks, outputs, strict=True)]
        steps = op.report["steps"] if op.report is not None else []
        window = window_spans(events, op.requested, steps) if base_mode(spec.mode) == "kazoo" else None
        # before: from the load's start (after the warm-up) or the previous handover's end to the bench's
        # state measurement (not part of the handover); after: to the next measurement or the load's end
        since = ops[i - 1].ended if i else feeder.started_at
        until = ops[i + 1].measured_at if i + 1 < len(ops) and ops[i + 1].measured_at else load_end
        latency = (latency_columns(obs, op.requested, op.ended, (since, until), 0.0 if i else args.warm_up,
                                   before_end=op.measured_at or None)
                   if obs and op.requested else {})
        on_target = ("yes" if op.check(op.table, vnodes) else "no") if op.report is not None and op.table else ""
        # the moved keys' state at the cut: each saw about the events produced before the request
        counts = {k: sum(1 for o in outputs if o["key"] == k and o["ts"] / MS < op.requested) for k in moved_keys}
        moved_model = model.state(moved_keys, counts)
        row = run_row(labels, op.report, moved_model, verdict, latency,
                      {**extra, **checkpoints, **measured_columns(op.measured, vnodes, moved_model[1]),
                       "vnodes_moved": len(vnodes),
                       "measure_s": op.requested - op.measured_at if op.measured_at else "",
                       "error": "; ".join(e for e in (op.error or error, op.measure_error) if e),
                       "on_target": on_target, "produced": produced,
                       "requested_at_s": op.requested - feeder.started_at if op.requested and feeder.started_at
                       else "",
                       **cpu_columns(sampler.samples, (since + (0.0 if i else args.warm_up), op.measured_at),
                                     (op.requested, op.ended))}, window)
        lo, hi = op.requested - args.before, op.ended + args.after
        timeline = timeline_rows([o for o in obs if lo <= o.produced < hi], op.requested, labels) \
            if op.requested else []
        results.append(RunResult(row, step_rows(labels, steps, resolve_config(None, conf).pulse_period_ms,
                                                op.measured), timeline))
    return results


def stop_feeder(feeder: Feeder) -> tuple[int, str | None]:
    """Stop the load (if it started): events produced, and the load generator's error if any."""
    if not feeder.is_alive() and not feeder.produced:
        return 0, feeder.error
    try:
        return feeder.stop(), None
    except RuntimeError as err:
        return feeder.produced, str(err)


def wait_for_state(handle: Any, feeder: Feeder, keys: int, before_s: float) -> None:
    """Wait ``before_s`` seconds of load, and at least until every key's first event came out (its pad
    is written): RuntimeError after 60 s more."""
    deadline = time.monotonic() + before_s + 60
    until = time.monotonic() + before_s
    while time.monotonic() < until or handle.sink_metrics().records_out // handle.plan.replicas < keys:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the state was not built within {before_s + 60:.0f}s: fewer than {keys} outputs")
        if feeder.error or not feeder.is_alive():
            raise RuntimeError(f"load generator stopped: {feeder.error}")
        time.sleep(0.1)


def restart_floor(ctx: RunContext) -> dict[str, Any]:
    """Start the job shape (smallest size, idle) and stop it: the seconds each takes."""
    from deploy.topics import create_topics
    from replication import run

    args, bootstrap = ctx.args, ctx.stack.bootstrap_servers
    conf = job_conf(bootstrap, args.period)
    model = state_model(min(args.sizes), args, conf)
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topic, out = f"hovrs{stamp}-in", f"hovrs{stamp}-out"
    create_topics(bootstrap, {topic: 2})
    ctx.status.update("restart floor: starting the job")
    t0 = time.monotonic()
    handle = run(build_handover_job(topic, out, f"hov-restart-{stamp}", model.entries, model.value_bytes),
                 spark=ctx.spark, conf=conf)
    handle.wait_started(120)
    started = time.monotonic()
    ctx.status.update("restart floor: stopping the job")
    result = handle.stop(60)
    stopped = time.monotonic()
    ctx.status.done()
    return {"what": "start + stop of the same job shape, idle (no state restored, no rescale)",
            "start_s": started - t0, "stop_s": stopped - started, "restart_s": stopped - t0,
            "status": result.status}


# ------------------------------------------------------------------------------------------ the command
def parse_size(text: str) -> int:
    """``1MB`` / ``500KB`` / ``2.5MB`` / ``1000`` -> bytes (10^3 multiples)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(KB|MB|GB|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1MB, 500KB)")
    return int(float(m.group(1)) * {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[(m.group(2) or "B").upper()])


def _names(text: str, allowed: Sequence[str], flag: str) -> list[str]:
    """A comma-separated list of names out of ``allowed`` (ArgumentTypeError naming the unknown ones)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if unknown := [s for s in names if s not in allowed]:
        raise argparse.ArgumentTypeError(f"{flag}: unknown {', '.join(unknown)} (choose from {', '.join(allowed)})")
    if not names:
        raise argparse.ArgumentTypeError(f"{flag}: empty")
    return names


def _strategies(text: str, flag: str) -> list[str]:
    """A comma-separated list of strategies (:func:`strategy_parts`), each checked."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{flag}: empty")
    for name in names:
        try:
            strategy_parts(name, 1)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{flag}: {err}") from None
    return names


def with_rhino(spec: RunSpec) -> RunSpec:
    """``--rhino``: the run with Rhino on."""
    return RunSpec(spec.operation, spec.mode if rhino_on(spec.mode) else spec.mode + RHINO, spec.size, spec.strategy)


def _sizes(text: str) -> list[int]:
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("--sizes: empty")
    return sizes


GROUP_KEYS = {"operations": "operations", "operation": "operations", "modes": "modes", "mode": "modes",
              "sizes": "sizes", "size": "sizes", "strategies": "strategies", "strategy": "strategies"}


def run_specs(operations: Sequence[str], modes: Sequence[str], sizes: Sequence[int],
              strategies: Sequence[str]) -> list[RunSpec]:
    """Every operation x mode x size x strategy, in that order (the control once per mode and size)."""
    return list(dict.fromkeys(RunSpec(o, m, z, strategies[0] if o == CONTROL else s)
                              for o in operations for m in modes for z in sizes for s in strategies))


def parse_group(text: str, args: argparse.Namespace) -> list[RunSpec]:
    """An ``--also`` group: space-separated ``key=value`` (keys operations, modes, sizes, strategies, each
    comma-separated, each defaulting to its flag's value) -> its runs."""
    chosen: dict[str, Any] = {"operations": args.operations, "modes": args.modes, "sizes": args.sizes,
                              "strategies": args.strategies}
    for part in text.split():
        key, eq, value = part.partition("=")
        if not eq or key not in GROUP_KEYS:
            raise argparse.ArgumentTypeError(f"--also: {part!r} is not one of {', '.join(sorted(set(GROUP_KEYS.values())))}"
                                             "=a,b")
        key = GROUP_KEYS[key]
        chosen[key] = (_sizes(value) if key == "sizes" else
                       _names(value, MODES, "--also modes") if key == "modes" else
                       _strategies(value, "--also strategies") if key == "strategies" else
                       _names(value, OPERATIONS, f"--also {key}"))
    return run_specs(chosen["operations"], chosen["modes"], chosen["sizes"], chosen["strategies"])


def _release(text: str) -> float | None:
    """``--release``: seconds, or ``auto`` (None: the driver sizes it)."""
    if text.strip().lower() == "auto":
        return None
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--release {text!r}: seconds > 0 or 'auto'")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MB,20MB", help="total state sizes, comma-separated (1MB = 10^6 bytes)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"handover strategies, comma-separated, of: {', '.join(STRATEGIES)}, batched:N (N vnodes "
                    "per step) and batched:N:BYTES (at most N vnodes and BYTES of state per step, from the state "
                    "the driver measures per vnode first; BYTES as --sizes, e.g. batched:32:660KB)")
    ap.add_argument("--modes", default="liverobin",
                    help=f"replication modes, comma-separated, of: {', '.join(MODES)} (KaZoo: each handover job "
                    "opens a pulse window; +rhino: with Rhino checkpoints on)")
    ap.add_argument("--rhino", action="store_true",
                    help="every run with Rhino checkpoints on (its mode gets +rhino)")
    ap.add_argument("--checkpoint-every", type=int, default=20,
                    help="LiveRobin with Rhino on: spark.replication.rhino.checkpointEvery (pulses; 20 at 10 ms: "
                    "5 a second)")
    ap.add_argument("--kazoo-checkpoint-every", type=int, default=50,
                    help="KaZoo with Rhino on: spark.replication.rhino.checkpointEvery (order records)")
    ap.add_argument("--checkpoint-elements", type=int, default=200,
                    help="KaZoo with Rhino on: spark.replication.rhino.checkpointElements (records read or "
                    "consumed, by sources and tasks with one input)")
    ap.add_argument("--operations", "--operation", dest="operations", default="move",
                    help="handover operations, comma-separated: move (vnodes of partition 0 to 1), rescale (the "
                    "task built with max_parallelism=3, parallelism=2: rescale to 3, then back to 2)")
    ap.add_argument("--also", action="append", default=[], metavar="'KEY=A,B ...'",
                    help="one more group of runs after the product of the flags above: space-separated key=value "
                    "of operations, modes, sizes, strategies, each defaulting to its flag's value (repeatable), "
                    "e.g. --also 'modes=liverobin sizes=1MB strategies=fluid'")
    ap.add_argument("--rate", type=float, default=200.0, help="offered events/s, round robin over the keys")
    ap.add_argument("--linger", type=float, default=2.0,
                    help="the load generator's linger.ms: on the embedded broker every batch it writes costs each "
                    "reader of the partition a listing of all its batches (docs/embedded-broker.md)")
    ap.add_argument("--burst", type=int, default=1,
                    help="events the load generator produces back to back, every burst/rate seconds: fewer "
                    "batches for the embedded broker to list, no wait added (--linger adds one)")
    ap.add_argument("--control-seconds", type=float, default=45.0,
                    help="operation none: seconds of load after the settle with no handover (cover the "
                    "seconds of the handover rows it is compared with)")
    ap.add_argument("--before", type=float, default=8.0, help="seconds of load before the handover request")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of load after the handover ended")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds of load between the state measurement and the request (its backlog drains)")
    ap.add_argument("--vnodes", type=int, default=0, help="vnodes of partition 0 to move (0: half of them)")
    ap.add_argument("--batch", type=int, default=8, help="vnodes per step of the batched strategy")
    ap.add_argument("--keys-per-vnode", type=int, default=1, help="keys in every vnode")
    ap.add_argument("--value-bytes", type=int, default=1000, help="bytes of one pad entry")
    ap.add_argument("--margin", type=float, default=0.5, help="move_vnodes margin_s: the switch pulse this far ahead")
    ap.add_argument("--release", type=_release, default=None,
                    help="move_vnodes release_s: the release after the switch, seconds or 'auto' (the default: "
                         "sized by the driver from the task's earlier steps)")
    ap.add_argument("--period", type=int, default=None,
                    help="pulse period (ms): LiveRobin's heartbeat period, KaZoo's window pulse period "
                         "(default: the job's, 10 and 30)")
    ap.add_argument("--warm-up", type=float, default=3.0, help="seconds of load not counted in 'before'")
    ap.add_argument("--no-restart", dest="restart", action="store_false", help="skip the restart floor")
    ap.add_argument("--replot", action="store_true", help="only redraw handover.png from the CSV files under --out")
    ap.add_argument("--out", default=str(REPO / "bench/results/handover"))
    args = ap.parse_args(argv)
    try:
        args.sizes = _sizes(args.sizes)
        args.strategies = _strategies(args.strategies, "--strategies")
        args.modes = _names(args.modes, MODES, "--modes")
        args.operations = _names(args.operations, OPERATIONS, "--operations")
        specs = run_specs(args.operations, args.modes, args.sizes, args.strategies)
        for group in args.also:
            specs += parse_group(group, args)
        if args.rhino:
            specs = [with_rhino(s) for s in specs]
    except argparse.ArgumentTypeError as err:
        ap.error(str(err))
    args.runs = list(dict.fromkeys(specs))  # in order, each once
    for flag in ("batch", "burst", "keys_per_vnode", "value_bytes", "period", "checkpoint_every", "kazoo_checkpoint_every",
                 "checkpoint_elements"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.vnodes < 0:
        ap.error("--vnodes must be >= 0")
    return args


@dataclass
class Results:
    runs: list[dict] = field(default_factory=list)  # handover.csv
    steps: list[dict] = field(default_factory=list)  # handover_steps.csv
    timeline: list[dict] = field(default_factory=list)  # handover_timeline.csv
    restart: list[dict] = field(default_factory=list)  # restart.csv


def run_benchmark(ctx: RunContext, res: Results | None = None, out: Path | None = None) -> Results:
    """Every size x strategy on a fresh job, then the restart floor, into ``res``; with ``out``, the CSV
    files are written again after every run (an interrupted benchmark keeps what it measured)."""
    res = res if res is not None else Results()
    t0 = time.monotonic()
    runs = ctx.args.runs
    for i, spec in enumerate(runs):
        print(f"== run {i + 1}/{len(runs)} {bar(i / len(runs), 12)}: {spec.mode}, {spec.operation}, "
              f"{spec.size / MB:g}MB of state, {strategy_label(spec.strategy, ctx.args.batch)}, "
              f"{ctx.args.rate:.0f} events/s ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
        try:
            done = handover_run(ctx, spec)
        except Exception as err:  # noqa: BLE001 - e.g. the job could not be planned: a row of its own
            ctx.status.done()
            labels = {"mode": spec.mode, "rhino": checkpointing(ctx.args).label(spec.mode),
                      "operation": first_operation(spec.operation),
                      "size": f"{spec.size / MB:g}MB", "strategy": strategy_label(spec.strategy, ctx.args.batch)}
            done = [RunResult(run_row(labels, None, (0, 0), None, {},
                                      {"error": one_line(err, ERROR_CHARS), "exact": "no"}))]
        for r in done:
            res.runs.append(r.row)
            res.steps += r.steps
            res.timeline += r.timeline
            print("   " + format_row({k: r.row[k] for k in SHOWN}), flush=True)
        compare_with_control(res.runs, res.timeline)
        if out is not None:
            write_csvs(out, res)
    if ctx.args.restart:
        print(f"== restart floor ({time.monotonic() - t0:.0f}s elapsed)", flush=True)
        try:
            res.restart.append(restart_floor(ctx))
        except Exception as err:  # noqa: BLE001 - recorded
            ctx.status.done()
            res.restart.append({"what": "start + stop of the same job shape, idle", "start_s": "", "stop_s": "",
                                "restart_s": "", "status": f"error: {one_line(err, ERROR_CHARS)}"})
        print("   " + format_row(res.restart[-1], skip=("what",)), flush=True)
    return res


SHOWN = ("mode", "operation", "size", "strategy", "state", "exact", "handover_s", *PHASE_COLUMNS, "entries_moved",
         "bytes_moved", "bytes_measured", *BYTES_COLUMNS, "bytes_planned", "p99_before_ms", "p99_during_ms",
         "max_during_ms", "worst_second_p99_ms", "unmoved_worst_second_p99_ms", "moved_max_during_ms",
         "worst_vs_before", "control_worst_second_p99_ms", "worst_vs_control", "cores_before", "cores_during",
         "broker_cores_before", "broker_cores_during", "checkpoints", "divergences")


def print_tables(res: Results) -> None:
    """The runs as a plain table, then what went wrong."""
    print_plain_table("handover (seconds; latency by event time, ms)", res.runs, SHOWN)
    for r in res.runs:
        if (r["error"] or r["exact"] != "yes" or r["entries_match"] == "no" or r["on_target"] == "no"
                or _diverged(r)):
            print(f"   {run_name(r)}: error {r['error'] or '-'}; output {r['outcome'] or '-'}; "
                  f"entries moved {r['entries_moved']} vs model {r['entries_model']}; on target {r['on_target']}; "
                  f"divergences {r.get('divergences') or 0} {r.get('divergence') or ''}")
    for r in res.restart:
        print(f"== restart floor: {format_row(r)}")


def write_csvs(out: Path, res: Results) -> None:
    """The CSV files (of the runs so far) and ``machine.txt`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("handover", res.runs), ("handover_steps", res.steps),
                       ("handover_timeline", res.timeline), ("restart", res.restart)):
        if rows:
            write_csv(out / f"{name}.csv", rows, digits=3)  # phases to the ms
    write_machine(out)


def write_results(out: Path, res: Results) -> None:
    """The CSV files, ``machine.txt`` and the plot under ``out``."""
    write_csvs(out, res)
    if any(r.get("p99_before_ms") not in ("", None) for r in res.runs):
        _plot(out, res)
    elif res.runs:
        print(f"no run measured any latency (see the error column of {out / 'handover.csv'}): no handover.png")


def run_name(row: dict[str, Any]) -> str:
    return f"{row.get('mode') or 'liverobin'} {row.get('operation') or 'move'} {row['size']} {row['strategy']}"


def _diverged(row: dict[str, Any]) -> bool:
    return row.get("divergences") not in ("", None, 0, 0.0, "0")


def problems(res: Results) -> list[str]:
    """What makes the command fail: an error, an inexact output, a wrong entry count, vnodes not moved,
    (Rhino on) replicas whose checkpoints diverged."""
    return [run_name(r) for r in res.runs
            if r["error"] or r["exact"] != "yes" or r["entries_match"] != "yes" or r["on_target"] != "yes"
            or _diverged(r)]


def load_results(out: Path) -> Results:
    """The CSV files under ``out`` back (numbers as floats)."""
    return Results(*(read_csv_rows(out / f"{name}.csv")
                     for name in ("handover", "handover_steps", "handover_timeline", "restart")))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        _plot(Path(args.out), load_results(Path(args.out)))
        print(f"wrote {Path(args.out) / 'handover.png'}")
        return 0
    from deploy.stack import EmbeddedStack, require_java17
    from replication.spark_cluster import build_session, stop_session

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    require_java17()
    t0 = time.monotonic()
    res = Results()
    try:
        with EmbeddedStack() as stack:
            spark = build_session("local-cluster[3,1,512]", app_name="bench-handover")
            try:
                run_benchmark(RunContext(stack, spark, args, StatusLine()), res, out)
            finally:
                stop_session(spark)
    finally:  # interrupted too: what was measured is written
        write_results(out, res)
    print_tables(res)
    names = [n for n in ("handover.csv", "handover_steps.csv", "handover_timeline.csv", "restart.csv", "handover.png")
             if (out / n).exists()]
    print(f"wrote {', '.join(names)} under {out} in {time.monotonic() - t0:.0f}s")
    if bad := problems(res):
        print(f"NOT OK: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


# ------------------------------------------------------------------------------------------ plot
# the phases that add up to a run's duration, stacked in this order: (colour, legend)
STACKED_PHASES = {"window_open_s": ("#c4ad66", "KaZoo: pulse window opens"),
                  "trigger_s": ("#4c72b0", "trigger (-> committed)"),
                  "to_switch_s": ("#8fa8d8", "to switch (-> switch pulse)"),
                  "alignment_s": ("#dd8452", "alignment (-> cut)"),
                  "transfer_s": ("#55a868", "transfer (-> cut at the targets)"),
                  "release_wait_s": ("#b5dfb0", "release wait (-> release pulse)"),
                  "load_s": ("#8172b3", "load (-> loaded)"),
                  "catch_up_s": ("#c44e52", "catch-up (-> held records processed)"),
                  "acks_s": ("#937860", "acks (-> the driver knows)"),
                  "between_steps_s": ("#8c8c8c", "between steps"),
                  "window_close_s": ("#da8bc3", "KaZoo: pulse window closes")}
MODE_STYLE = {"liverobin": ("-", "o"), "liverobin" + RHINO: ("-.", "^"), "kazoo": ("--", "s"),
              "kazoo" + RHINO: (":", "D")}
MODE_SHORT = {"liverobin": "li", "liverobin" + RHINO: "li+rh", "kazoo": "ka", "kazoo" + RHINO: "ka+rh"}


def _mode(r: dict[str, Any]) -> str:
    return r.get("mode") or "liverobin"


def _short(r: dict[str, Any]) -> str:
    return f"{MODE_SHORT.get(_mode(r), _mode(r)[:2])} {r['operation']}\n{r['size']} {r['strategy']}"


def _plot_bytes(fig: Any, grid: Any, half: int, res: Results) -> None:
    """The bottom row: bytes moved per run, the model's against what the partitions measured per vnode
    just before the handover (and a byte cap's plan), what the origins cut, sent over the network and the
    targets read from their checkpoint copies; the measured bytes of every step."""
    ax = fig.add_subplot(grid[2, :half + half // 2])
    runs = [r for r in res.runs if r.get("bytes_moved") not in ("", None) and r["operation"] != CONTROL]
    x = range(len(runs))
    bars = (("bytes_moved", "model (moved keys' state)", "#4c72b0"),
            ("bytes_measured", "measured (state_bytes_per_vnode, moved vnodes)", "#55a868"),
            ("bytes_planned", "planned by the byte cap", "#c44e52"),
            ("bytes_cut", "cut by the origins", "#8172b3"),
            ("bytes_shipped", "sent over the network", "#dd8452"),
            ("bytes_from_store", "read from the targets' checkpoint copies", "#c4ad66"))
    width = 0.8 / len(bars)
    for k, (col, name, color) in enumerate(bars):
        vals = [r.get(col) if r.get(col) not in ("", None) else 0.0 for r in runs]
        if any(vals):
            ax.bar([i + (k - (len(bars) - 1) / 2) * width for i in x], [v / 1000 for v in vals], width=width,
                   color=color, label=name)
    ax.set_xticks(list(x), [_short(r) for r in runs], fontsize="x-small", rotation=40, ha="right")
    ax.set(ylabel="KB", yscale="log", title="Bytes moved: model, measured per vnode, cut, sent, read locally")
    ax.grid(alpha=.3, axis="y", which="both")
    ax.legend(fontsize="x-small")

    ax = fig.add_subplot(grid[2, half + half // 2:])
    stepped = [r for r in runs if "cap " in str(r["strategy"]) or (r.get("steps") not in ("", None)
                                                                  and float(r["steps"]) > 1)]
    for i, r in enumerate(stepped):
        per_step = [s["bytes_measured"] for s in res.steps if s.get("bytes_measured") not in ("", None)
                    and all(s.get(k) == r.get(k) for k in ("mode", "operation", "size", "strategy"))]
        if per_step:
            ax.plot([i] * len(per_step), [v / 1000 for v in per_step], linestyle="", marker="_",
                    markersize=14, color="#55a868")
        cap = re.search(r"cap (\S+)$", str(r["strategy"]))
        if cap:
            ax.plot([i - .4, i + .4], [parse_size(cap.group(1)) / 1000] * 2, color="#c44e52", linewidth=1.5)
    ax.set_xticks(range(len(stepped)), [_short(r) for r in stepped], fontsize="x-small", rotation=40,
                  ha="right")
    ax.set(ylabel="KB (measured just before)", yscale="log",
           title="Bytes per step (runs of several steps or a cap; red: the cap)")
    ax.grid(alpha=.3, axis="y", which="both")


def _plot(out: Path, res: Results) -> None:
    """``handover.png``: per-second p99 around the request per run, one panel per operation (the line
    style tells the mode); the duration by phase (stacked) per run, with how long the moved keys'
    records were held at most, and the restart floor; the handover's duration against the state per
    vnode, per mode, operation and strategy; the bytes (:func:`_plot_bytes`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    operations = list(dict.fromkeys(r["operation"] for r in res.runs))
    fig = plt.figure(figsize=(max(19, 6.5 * len(operations)), 16))
    grid = fig.add_gridspec(3, max(len(operations), 2) * 2)
    width = max(len(operations), 2) * 2 // len(operations)
    for k, operation in enumerate(operations):
        ax = fig.add_subplot(grid[0, k * width:(k + 1) * width])
        for r in (r for r in res.runs if r["operation"] == operation):
            pts = [t for t in res.timeline if t["size"] == r["size"] and t["strategy"] == r["strategy"]
                   and t.get("mode", "liverobin") == _mode(r) and t.get("operation", "move") == operation
                   and t["p99_ms"] != ""]
            verdict = "exact" if r["exact"] == "yes" else f"NOT exact: {r['outcome'] or r['error']}"[:60]
            dur = f"{r['handover_s']:.1f}s" if r["handover_s"] != "" else "failed"
            style, marker = MODE_STYLE.get(_mode(r), ("-", "."))
            (line,) = ax.plot([t["second"] for t in pts], [t["p99_ms"] for t in pts], linestyle=style,
                              marker=".", label=f"{_mode(r)} {r['size']} {r['strategy']}: {dur}, {verdict}")
            if r["handover_s"] != "":
                ax.axvline(r["handover_s"], color=line.get_color(), linestyle=":", linewidth=1)
        ax.axvline(0, color="red", linestyle="--", linewidth=1)
        ax.set(xlabel="seconds since the request (event time; dotted: its end)",
               ylabel="per-second p99 producer→sink (ms)", yscale="log",
               title=f"Latency around: {operation}\n(solid LR, dash-dot LR + Rhino, dashed KaZoo, dotted KaZoo + Rhino)")
        ax.grid(alpha=.3, which="both")
        ax.legend(fontsize="x-small")

    half = max(len(operations), 2)
    ax = fig.add_subplot(grid[1, :half + half // 2])
    handovers = [r for r in res.runs if r["operation"] != CONTROL]  # the control's latency only
    names = [_short(r) for r in handovers]
    bottom = [0.0] * len(handovers)
    for col, (color, name) in STACKED_PHASES.items():
        vals = [r.get(col) if r.get(col) not in ("", None) else 0.0 for r in handovers]
        ax.bar(range(len(vals)), vals, bottom=bottom, color=color, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    held = [(i, r["held_max_s"]) for i, r in enumerate(handovers) if r.get("held_max_s") not in ("", None)]
    if held:
        ax.plot([i for i, _ in held], [h for _, h in held], linestyle="", marker="_", markersize=16, color="black",
                label="moved keys' records held (max of its steps)")
    for rs in res.restart:
        if rs["start_s"] != "":
            x = len(names)
            names.append("restart floor\n(idle, no state)")
            ax.bar(x, rs["start_s"], color="#c44e52", alpha=.6, label="start the job")
            ax.bar(x, rs["stop_s"], bottom=rs["start_s"], color="#8172b3", alpha=.6, label="stop the job")
    ax.set_xticks(range(len(names)), names, fontsize="x-small", rotation=40, ha="right")
    ax.set(ylabel="seconds", title="Handover duration by phase, from the participants' acks (li: LiveRobin, "
           "ka: KaZoo, +rh: with Rhino)")
    ax.grid(alpha=.3, axis="y")
    ax.legend(fontsize="x-small")

    ax = fig.add_subplot(grid[1, half + half // 2:])
    for key in dict.fromkeys((_mode(r), r["operation"], r["strategy"]) for r in handovers):
        pts = [r for r in handovers if (_mode(r), r["operation"], r["strategy"]) == key and r["handover_s"] != ""]
        style, marker = MODE_STYLE.get(key[0], ("-", "o"))
        ax.plot([r["bytes_per_vnode"] / 1000 for r in pts], [r["handover_s"] for r in pts], linestyle=style,
                marker=marker, label=" ".join(key))
    ax.set(xlabel="state per vnode (KB)", ylabel="handover duration (s)", yscale="log",
           title="Duration vs state per vnode")
    ax.grid(alpha=.3, which="both")
    ax.legend(fontsize="xx-small", ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    _plot_bytes(fig, grid, half, res)
    fig.tight_layout()
    fig.savefig(out / "handover.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
