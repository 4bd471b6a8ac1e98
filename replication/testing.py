"""A local test harness: a job's operators run in this process on in-memory input, without Spark
or Kafka, deterministically.

:func:`run_locally` runs every operator of a :class:`~replication.api.Job` once (one partition
each), feeds it the records given per topic and returns what each sink would have written, the
dead letters, and on request the keyed state each keyed function left per key.  The operators
are the cluster's own (:mod:`replication.runtime`): keyed state in RocksDB (in a temporary
directory), event-time timers and windows fired by watermarks that the sources make as on the
cluster, processing-time timers and TTL by pulses, side outputs, joins, the dead-letter reasons.

Input records are values or :class:`Input` (key, headers, timestamp).  A ``bytes`` value goes
through the source's deserializer (so a malformed one is dead-lettered, as on the cluster); any
other value is taken as already deserialized.  A record without a timestamp gets its index in its
topic's list (ms).  The topics are read in timestamp order (ties: in the order the topics and
records were given); every record goes through the whole job before the next is read.  With
``pulse_every_ms``, a pulse of processing time ``t`` is sent through the job each time the input's
timestamps pass ``t``, as the heartbeat generator would while the records were written, and
``idle_after_ms`` more after the last record (processing-time timers fire at pulses only, not at
the end of the input, as on the cluster).
"""

from __future__ import annotations

import heapq
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replication.api import Job, Node
from replication.functions import RESERVED_PREFIX
from replication.metrics import InstanceMetrics
from replication.plan import check_shippable
from replication.records import KafkaRecord
from replication.runtime.chain import build_chain
from replication.runtime.deadletter import describe_error
from replication.runtime.elements import DATA, MAX_WATERMARK, MIN_WATERMARK
from replication.runtime.operators import Operator, ProcessOperator, SinkBase
from replication.runtime.source_records import Rejected, SourceRecords, Watermarks
from rhino_state import RocksDBStateBackend, StateContext, encode_key, key_group
from rhino_state.state import ListState, MapState, ValueState

NUM_KEY_GROUPS = 128
WATERMARK_INTERVAL_MS = 200  # spark.replication.watermark.interval's default


@dataclass(frozen=True)
class Input:
    """One input record with its Kafka metadata (what a source with ``metadata=True`` sees)."""

    value: Any
    key: Any = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class Written:
    """What a sink wrote: the serialized value, key, headers and timestamp, and the value itself."""

    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int | None
    obj: Any


@dataclass
class LocalRun:
    """What :func:`run_locally` saw: per sink topic the values written (``outputs``) and the
    records as serialized (``written``); the dead letters; with ``keep_state``, per keyed
    function, key -> {state name: value}."""

    outputs: dict[str, list[Any]] = field(default_factory=dict)
    written: dict[str, list[Written]] = field(default_factory=dict)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, dict[Any, dict[str, Any]]] = field(default_factory=dict)


class _Env:
    """What the operators use of their hosting instance."""

    def __init__(self, node: Node, backend: RocksDBStateBackend, run: LocalRun, pulses: bool) -> None:
        self.name = f"{node.name}[0]"
        self.partition, self.parallelism = 0, 1
        self.num_key_groups = NUM_KEY_GROUPS
        self.metrics = InstanceMetrics()
        self.processing_time = pulses
        self._backend = backend
        self._run = run

    def state_context(self, operator_name: str) -> StateContext:
        return StateContext(self._backend, operator_name, self.num_key_groups)

    def dead_letter(self, *, reason: str, operator: str, origin: Any, payload: bytes,
                    payload_kind: str = "original") -> None:
        self.metrics.dead_lettered += 1
        self._run.dead_letters.append({"reason": reason, "operator": operator, "origin": origin,
                                       "payload": payload, "payload_kind": payload_kind})


class _Collect(SinkBase):
    """A sink that keeps what it would write."""

    def __init__(self, node: Node, env: _Env, run: LocalRun) -> None:
        spec = node.spec
        super().__init__(node.name, env, spec["topic"], spec["serializer"], spec["key_serializer"],
                         key_fn=spec.get("key"), headers_fn=spec.get("headers"), timestamp_fn=spec.get("timestamp"))
        self.run = run
        run.outputs.setdefault(self.topic, [])
        run.written.setdefault(self.topic, [])

    def process(self, rec: tuple) -> None:
        out = self.serialize(rec)
        if out is not None:
            value, key, headers, ts = out
            self.run.outputs[self.topic].append(rec[1])
            self.run.written[self.topic].append(Written(self.topic, value, key, headers, ts, rec[1]))

    def on_end(self) -> None:
        pass


class _Inlet:
    """One input of a node: its watermark and the pulses it delivered (a node goes on with the
    minimum of its inputs' watermarks, and passes a pulse on once every input delivered it)."""

    def __init__(self, stage: _Stage, second: bool) -> None:
        self.stage = stage
        self.second = second
        self.watermark = MIN_WATERMARK
        self.pulse = 0


class _Stage(Operator):
    """A node's operator, with the edges out of it: the tail of its one-node chain."""

    def __init__(self, node: Node, env: _Env, run: LocalRun) -> None:
        super().__init__(node.name, env)
        self.node = node
        self.inlets: list[_Inlet] = []
        self.outlets: list[tuple[Any, _Inlet]] = []  # (edge, the downstream input it feeds)
        self.watermark = MIN_WATERMARK
        self.pulse = 0
        self.keys: dict[bytes, Any] = {}  # every key a keyed function saw (keep_state)
        if node.kind == "sink":
            self.head: Operator = _Collect(node, env, run)
            self.head.next = self
        elif node.kind in ("source", "union", "side_output"):
            self.head = self
        else:
            self.head = build_chain([node], env, tail=self)

    def deliver(self, inlet: _Inlet, rec: tuple) -> None:
        if self.head is self:
            self.process(rec)
            return
        if isinstance(self.head, ProcessOperator) and rec[2] is not None:
            self.keys.setdefault(encode_key(rec[2]), rec[2])
        (self.head.process2 if inlet.second else self.head.process)(rec)

    def deliver_watermark(self, inlet: _Inlet, wm: int) -> None:
        inlet.watermark = max(inlet.watermark, wm)
        low = min(i.watermark for i in self.inlets)
        if low > self.watermark:
            self.watermark = low
            (self.on_watermark if self.head is self else self.head.on_watermark)(low)

    def deliver_pulse(self, inlet: _Inlet, h: int, t: int) -> None:
        inlet.pulse = h
        if h > self.pulse and all(i.pulse >= h for i in self.inlets):
            self.pulse = h
            (self.on_pulse if self.head is self else self.head.on_pulse)(h, t)

    # -- the tail: the node's results go along its out edges
    def process(self, rec: tuple) -> None:
        self._route(None, rec)

    def side(self, tag: str, rec: tuple) -> None:
        self._route(tag, rec)

    def _route(self, tag: str | None, rec: tuple) -> None:
        for edge, inlet in self.outlets:
            if edge.tag != tag:
                continue
            out = rec
            if edge.key_fn is not None:
                try:
                    key = edge.key_fn(rec[1])
                    key_group(encode_key(key), NUM_KEY_GROUPS)  # an unencodable key fails here, as on the cluster
                except Exception as exc:  # noqa: BLE001 - user code
                    self.dead_letter(rec, "key_by: " + describe_error(exc))
                    continue
                out = (DATA, rec[1], key, rec[3], rec[4], rec[5])
            inlet.stage.deliver(inlet, out)

    def on_watermark(self, wm: int) -> None:
        for _, inlet in self.outlets:
            inlet.stage.deliver_watermark(inlet, wm)

    def on_pulse(self, h: int, t: int = 0) -> None:
        for _, inlet in self.outlets:
            inlet.stage.deliver_pulse(inlet, h, t)

    def on_end(self) -> None:
        pass


class _Message:
    """An input record as the source reads it from Kafka."""

    def __init__(self, topic: str, offset: int, record: Any) -> None:
        if not isinstance(record, Input):
            record = Input(record)
        self.record = record
        self.topic, self.offset = topic, offset
        self.timestamp = offset if record.timestamp is None else int(record.timestamp)


def _with_metadata(msg: _Message, value: Any, key_deserializer: Any) -> KafkaRecord:
    record = msg.record
    key = record.key
    if isinstance(key, bytes) and key_deserializer is not None:
        key = key_deserializer(key)
    return KafkaRecord(value=value, key=key, headers=tuple(record.headers), timestamp=msg.timestamp,
                       topic=msg.topic, partition=0, offset=msg.offset)


class _Source:
    """A source node reading its topic's records as a source partition of the cluster does
    (:mod:`replication.runtime.source_records`); values given decoded skip the deserializer."""

    def __init__(self, stage: _Stage, env: _Env, watermark_interval_ms: int) -> None:
        spec = stage.node.spec
        self.stage, self.env = stage, env
        deserializer = spec["deserializer"]
        self.records = SourceRecords(spec, _with_metadata, lambda msg: msg.timestamp,
                                     lambda raw: deserializer(raw) if isinstance(raw, bytes) else raw)
        self.watermarks = Watermarks([0], spec["max_out_of_orderness_ms"], watermark_interval_ms)

    def read(self, msg: _Message) -> None:
        raw = msg.record.value
        try:
            value, ts = self.records.decode(raw, msg)
        except Rejected as rejected:
            payload = raw if isinstance(raw, bytes) else repr(raw).encode()
            self.env.dead_letter(reason=rejected.reason, operator=self.stage.node.name,
                                 origin=(msg.topic, 0, msg.offset), payload=payload)
            return
        self.stage.process((DATA, value, None, ts, 0.0, (msg.topic, 0, msg.offset)))
        wm = self.watermarks.observe(0, ts)
        if wm is not None:
            self.stage.on_watermark(wm)


def run_locally(job: Job, inputs: Mapping[str, Sequence[Any]], *, pulse_every_ms: int | None = None,
                idle_after_ms: int = 0, watermark_interval_ms: int = WATERMARK_INTERVAL_MS,
                keep_state: bool = False, state_dir: str | Path | None = None) -> LocalRun:
    """Run ``job`` on ``inputs`` (topic -> records, see the module's docstring) to the end of its
    input: the final watermark fires every window and event-time timer.  ``pulse_every_ms``:
    processing time (timers, TTL) advances with the input's timestamps, by pulses this far
    apart, and for ``idle_after_ms`` after the last record; None: no processing time (refused,
    as in ``unordered`` mode).  ``keep_state``: the keyed functions' state per key at
    the end, in :attr:`LocalRun.state`."""
    job.validate()
    check_shippable(job)  # what fails on the cluster fails here
    unknown = set(inputs) - {n.spec["topic"] for n in job.nodes if n.kind == "source"}
    if unknown:
        raise ValueError(f"inputs for topics no source of job {job.name!r} reads: {sorted(unknown)}")
    run = LocalRun()
    pulses = pulse_every_ms is not None
    with tempfile.TemporaryDirectory(prefix="replication-local-", dir=state_dir) as tmp, \
            RocksDBStateBackend(str(Path(tmp) / "state")) as backend:
        stages = {node.id: _Stage(node, _Env(node, backend, run, pulses), run) for node in job.nodes}
        for node in job.nodes:
            for i, edge in enumerate(node.inputs):
                inlet = _Inlet(stages[node.id], second=node.kind == "process" and i == 1)
                stages[node.id].inlets.append(inlet)
                stages[edge.source.id].outlets.append((edge, inlet))
        sources = {n.spec["topic"]: _Source(stages[n.id], stages[n.id].env, watermark_interval_ms)
                   for n in job.nodes if n.kind == "source"}
        clock = _PulseClock(sources.values(), pulse_every_ms)
        last = None
        for msg in _interleaved(inputs):
            clock.until(msg.timestamp)
            sources[msg.topic].read(msg)
            last = msg.timestamp
        if last is not None:
            clock.until(last + idle_after_ms)
        for source in sources.values():
            source.stage.on_watermark(MAX_WATERMARK)
        for stage in stages.values():
            if stage.head is not stage:
                stage.head.on_end()
        if keep_state:
            run.state = {s.node.name: _state_of(s) for s in stages.values() if isinstance(s.head, ProcessOperator)}
    return run


class _PulseClock:
    """Pulses through every source, the first at the first record, then one each ``every_ms`` of
    the input's time (None: none)."""

    def __init__(self, sources: Iterable[_Source], every_ms: int | None) -> None:
        if every_ms is not None and (not isinstance(every_ms, int) or every_ms <= 0):
            raise ValueError(f"pulse_every_ms must be a positive int of milliseconds, got {every_ms!r}")
        self.sources = list(sources)
        self.every = every_ms
        self.h = 0
        self.next: int | None = None

    def until(self, t: int) -> None:
        """The pulses due up to time ``t``."""
        if self.every is None:
            return
        if self.next is None:
            self.next = t
        while self.next <= t:
            self.h += 1
            for source in self.sources:
                source.stage.on_pulse(self.h, self.next)
            self.next += self.every


def _interleaved(inputs: Mapping[str, Sequence[Any]]) -> Iterable[_Message]:
    """Every topic's records, by timestamp (ties: topic order, then record order)."""
    streams = [[(m.timestamp, t, m.offset, m) for m in (_Message(topic, i, r) for i, r in enumerate(records))]
               for t, (topic, records) in enumerate(inputs.items())]
    for _, _, _, msg in heapq.merge(*(sorted(s, key=lambda e: e[:3]) for s in streams), key=lambda e: e[:3]):
        yield msg


def _state_of(stage: _Stage) -> dict[Any, dict[str, Any]]:
    """key -> {state name: value} of every state the keyed function registered (what is visible:
    expired TTL values are not)."""
    op = stage.head
    assert isinstance(op, ProcessOperator)
    context = op.state
    out: dict[Any, dict[str, Any]] = {}
    for key in stage.keys.values():
        context.set_current_key(key)
        values: dict[str, Any] = {}
        for name, handle in context.handles().items():
            if name.startswith(RESERVED_PREFIX):
                continue
            if isinstance(handle, ValueState):
                if handle.contains():
                    values[name] = handle.value()
            elif isinstance(handle, MapState) and not handle.is_empty():
                values[name] = dict(handle.items())
            elif isinstance(handle, ListState) and not handle.is_empty():
                values[name] = handle.get()
        if values:
            out[key] = values
    return out


__all__ = ["Input", "LocalRun", "Written", "run_locally"]
