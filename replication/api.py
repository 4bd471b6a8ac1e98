"""The job builder: a small, Flink-like DataStream API that builds a logical graph.

Example::

    job = Job("fraud-monitor")
    eu = job.source("payments-eu", deserializer="json", timestamp=lambda p: p["ts"])
    us = job.source("payments-us", deserializer="json", timestamp=lambda p: p["ts"])
    payments = eu.union(us).filter(lambda p: p["amount"] > 0)
    payments.key_by(lambda p: p["card"]).process(FraudRule()).sink("alerts")
    payments.key_by(lambda p: p["merchant"]).window(1000, MerchantTotals()).sink("totals")

Nothing runs until the job is handed to :func:`replication.run`.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from replication import serde
from replication.functions import (
    Aggregator,
    CoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessContext,
    RuntimeContext,
    mergeable,
)
from replication.joins import IntervalJoin, LookupJoin, WindowJoin
from replication.windowing import Windows

FORWARD = "forward"
HASH = "hash"
REBALANCE = "rebalance"
# event-time spans below this are probably seconds meant as milliseconds: warned about
SHORT_SPAN_MS = 1000


def _undefined(obj: Any, base: type, methods: tuple[str, ...]) -> list[str]:
    """Which of ``methods`` ``obj``'s class leaves as ``base`` has them (not implemented)."""
    return [m for m in methods if getattr(type(obj), m) is getattr(base, m)]


def _label(what: str, name: str | None) -> str:
    """How an error names an operator: its kind, and its name if it was given one."""
    return what if name is None else f"{what} {name!r}"


def _serde(where: str, spec: Any, table: dict[str, Callable], what: str) -> Callable:
    """A (de)serializer given by name or as a callable; anything else is refused naming ``where``."""
    try:
        return serde.resolve(spec, table, what)
    except ValueError as e:
        raise JobDefinitionError(f"{where}: {e}") from None


def _warn_if_short(what: str, name: str | None, span_ms: int) -> None:
    if isinstance(span_ms, int) and 0 < span_ms < SHORT_SPAN_MS:
        warnings.warn(f"{_label(what, name)}: {span_ms} ms is under a second; event-time spans are in "
                      "milliseconds", UserWarning, stacklevel=3)


class JobDefinitionError(ValueError):
    """The job graph is not valid (raised while building or planning, before anything starts)."""


@dataclass
class Edge:
    """A logical connection into a node. ``key_fn`` is set for HASH edges."""

    source: Node
    partitioning: str = FORWARD
    key_fn: Callable[[Any], Any] | None = None
    chain: bool = True  # False: the consuming operator starts a new task
    tag: str | None = None  # the side output of ``source`` it carries (None: its main output)


@dataclass(eq=False)
class Node:
    """A logical operator."""

    id: int
    kind: str  # source | map | filter | flat_map | process | window | union | side_output | sink
    name: str
    parallelism: int | None
    inputs: list[Edge] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Node({self.id}, {self.kind}, {self.name!r}, p={self.parallelism})"


_STATELESS = ("map", "filter", "flat_map")


class Job:
    """A dataflow graph under construction."""

    def __init__(self, name: str) -> None:
        if not name or any(c.isspace() for c in name):
            raise JobDefinitionError(f"job name {name!r} must be non-empty and contain no spaces")
        self.name = name
        self.nodes: list[Node] = []
        self._ids = itertools.count()
        self._names: set[str] = set()

    def _add(self, kind: str, name: str | None, parallelism: int | None, inputs: list[Edge], **spec: Any) -> Node:
        if parallelism is not None and (not isinstance(parallelism, int) or isinstance(parallelism, bool)
                                        or parallelism < 1):
            raise JobDefinitionError(f"{_label(kind, name)}: parallelism must be a positive int, got {parallelism!r}")
        node_id = next(self._ids)
        name = name or f"{kind}-{node_id}"
        if name in self._names:
            raise JobDefinitionError(f"operator name {name!r} is used twice; names identify state")
        if kind in ("process", "window") and "/" in name:  # the name is the state namespace (StateContext uid)
            raise JobDefinitionError(f"{kind} operator name {name!r} must not contain '/'")
        self._names.add(name)
        node = Node(node_id, kind, name, parallelism, inputs, spec)
        self.nodes.append(node)
        return node

    def source(
        self,
        topic: str,
        *,
        deserializer: str | Callable[[bytes], Any] = "json",
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: int = 0,
        starting_offsets: str = "earliest",
        parallelism: int | None = None,
        name: str | None = None,
        metadata: bool = False,
        key_deserializer: str | Callable[[bytes], Any] | None = None,
    ) -> DataStream:
        """Read a Kafka topic.  Each source partition reads its Kafka partitions by manual
        assignment.  ``timestamp`` extracts the event time (ms) from the deserialized
        value (default: the Kafka record timestamp).  ``parallelism`` defaults to the
        topic's partition count.  ``metadata=True``: each value is a
        :class:`~replication.records.KafkaRecord` (value, key, headers, timestamp, topic, partition,
        offset; ``timestamp`` then gets it too), its key deserialized by ``key_deserializer``."""
        if key_deserializer is not None and not metadata:
            raise JobDefinitionError(f"source {topic!r}: key_deserializer needs metadata=True (the key is "
                                     "only delivered with the record's metadata)")
        if starting_offsets not in ("earliest", "latest"):
            raise JobDefinitionError(f"source {topic!r}: starting_offsets must be 'earliest' or 'latest'")
        if max_out_of_orderness_ms < 0:
            raise JobDefinitionError(f"source {topic!r}: max_out_of_orderness_ms must be >= 0")
        reader = next((n.name for n in self.nodes if n.kind == "source" and n.spec["topic"] == topic), None)
        if reader is not None:  # two readers of a partition would take it from each other in a worker
            raise JobDefinitionError(f"source {topic!r}: the topic is read by source {reader!r} already; read a "
                                     "topic once and use that stream for every pipeline")
        node = self._add(
            "source", name or f"source:{topic}", parallelism, [],
            topic=topic,
            deserializer=_serde(f"source {topic!r}", deserializer, serde.DESERIALIZERS, "deserializer"),
            timestamp=timestamp,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            starting_offsets=starting_offsets,
            metadata=bool(metadata),
            key_deserializer=None if key_deserializer is None
            else _serde(f"source {topic!r}", key_deserializer, serde.DESERIALIZERS, "key deserializer"),
        )
        return DataStream(self, node)

    def sinks(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "sink"]

    def validate(self) -> None:
        """Graph-level checks that need the whole graph."""
        if not any(n.kind == "source" for n in self.nodes):
            raise JobDefinitionError(f"job {self.name!r} has no source")
        if not self.sinks():
            raise JobDefinitionError(f"job {self.name!r} has no sink: its results would go nowhere")
        consumed = {id(e.source) for n in self.nodes for e in n.inputs}
        for node in self.nodes:
            if node.kind != "sink" and id(node) not in consumed:
                raise JobDefinitionError(
                    f"operator {node.name!r} has no consumer; end the stream with .sink(topic)")


class DataStream:
    """A stream of values produced by one logical node."""

    def __init__(self, job: Job, node: Node) -> None:
        self.job = job
        self.node = node

    def _then(self, kind: str, name: str | None, parallelism: int | None, edge: Edge, **spec: Any) -> DataStream:
        return DataStream(self.job, self.job._add(kind, name, parallelism, [edge], **spec))

    def map(self, fn: Callable[[Any], Any], *, name: str | None = None, parallelism: int | None = None) -> DataStream:
        """One output per input."""
        return self._then("map", name, parallelism, Edge(self.node), fn=fn)

    def filter(self, fn: Callable[[Any], bool], *, name: str | None = None, parallelism: int | None = None) -> DataStream:
        """Keep the values for which ``fn`` is true."""
        return self._then("filter", name, parallelism, Edge(self.node), fn=fn)

    def flat_map(
        self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None, parallelism: int | None = None
    ) -> DataStream:
        """Zero or more outputs per input."""
        return self._then("flat_map", name, parallelism, Edge(self.node), fn=fn)

    def key_by(self, key_fn: Callable[[Any], Any], *, prepartitioned: bool = False) -> KeyedStream:
        """Partition by key (str, bytes, int, float, bool, None or tuples of those).

        ``prepartitioned=True``: the stream is already partitioned by this key (for example a
        Kafka topic keyed by it, one Kafka partition per source partition), so records stay in
        their partition (a forward edge, one input channel per keyed partition) and the keyed
        operator needs the same parallelism as its input."""
        return KeyedStream(self, key_fn, prepartitioned)

    def connect(self, other: DataStream) -> ConnectedStreams:
        """Two streams into one two-input keyed function: ``a.connect(b).key_by(ka, kb).process(fn)``
        with a :class:`~replication.functions.CoProcessFunction`."""
        if not isinstance(other, DataStream) or other.job is not self.job:
            raise JobDefinitionError("connect() needs another stream of the same job")
        return ConnectedStreams(self, other)

    def side_output(self, tag: OutputTag) -> DataStream:
        """The records this keyed function (``ctx.output(tag, ...)``) or window (``late_output``)
        emits to ``tag``: a stream of its own, exactly once like the main output."""
        if not isinstance(tag, OutputTag):
            raise JobDefinitionError("side_output() needs an OutputTag")
        if self.node.kind not in ("process", "window"):
            raise JobDefinitionError(f"side_output({tag.name!r}): {self.node.name!r} is a {self.node.kind}; only "
                                     "keyed functions and windows have side outputs")
        edge = Edge(self.node, FORWARD, chain=False, tag=tag.name)
        return DataStream(self.job, self.job._add("side_output", f"{self.node.name}.{tag.name}", None, [edge]))

    def rebalance(self) -> DataStream:
        """Round-robin to the next operator (which then is not chained)."""
        return _Repartitioned(self, REBALANCE)

    def new_task(self) -> DataStream:
        """The next operator starts a new task instead of being chained to this one
        (forward edge: each partition feeds the same partition of the next task)."""
        return _Repartitioned(self, FORWARD, chain=False)

    def union(self, *others: DataStream) -> DataStream:
        """Merge streams into one task with one input channel per upstream partition."""
        if not others:
            raise JobDefinitionError("union needs at least one other stream")
        for other in others:
            if other.job is not self.job:
                raise JobDefinitionError("union of streams from different jobs")
        edges = [s._edge() for s in (self, *others)]
        return DataStream(self.job, self.job._add("union", None, None, edges))

    def sink(
        self,
        topic: str,
        *,
        serializer: str | Callable[[Any], bytes] = "json",
        key_serializer: str | Callable[[Any], bytes] | None = None,
        name: str | None = None,
        parallelism: int | None = None,
        key: Callable[[Any], Any] | None = None,
        headers: Callable[[Any], Iterable[tuple[str, bytes]]] | None = None,
        timestamp: Callable[[Any], int] | None = None,
    ) -> None:
        """Write every value to a Kafka topic.  The Kafka key is ``key_serializer`` of ``key(value)``
        (default: of the stream's key); ``headers(value)`` gives (name, bytes) pairs to add and
        ``timestamp(value)`` the record's Kafka timestamp (ms; default: the producer's clock)."""
        for what, fn in (("key", key), ("headers", headers), ("timestamp", timestamp)):
            if fn is not None and not callable(fn):
                raise JobDefinitionError(f"sink {topic!r}: {what} must be a function of the record")
        if key is not None and key_serializer is None:
            raise JobDefinitionError(f"sink {topic!r}: key= needs a key_serializer")
        self._then(
            "sink", name or f"sink:{topic}", parallelism, self._edge(),
            topic=topic,
            serializer=_serde(f"sink {topic!r}", serializer, serde.SERIALIZERS, "serializer"),
            key_serializer=None if key_serializer is None
            else _serde(f"sink {topic!r}", key_serializer, serde.SERIALIZERS, "key serializer"),
            key=key, headers=headers, timestamp=timestamp,
        )

    def _edge(self) -> Edge:
        return Edge(self.node)


class _Repartitioned(DataStream):
    def __init__(self, stream: DataStream, partitioning: str, chain: bool = True) -> None:
        super().__init__(stream.job, stream.node)
        self._partitioning = partitioning
        self._chain = chain

    def _edge(self) -> Edge:
        return Edge(self.node, self._partitioning, chain=self._chain)

    def _then(self, kind: str, name: str | None, parallelism: int | None, edge: Edge, **spec: Any) -> DataStream:
        return super()._then(kind, name, parallelism, self._edge(), **spec)


class KeyedStream:
    """A stream partitioned by key; its operators see one key at a time with keyed state."""

    def __init__(self, stream: DataStream, key_fn: Callable[[Any], Any], prepartitioned: bool = False) -> None:
        if not callable(key_fn):
            raise JobDefinitionError("key_by needs a callable")
        self.stream = stream
        self.key_fn = key_fn
        self.prepartitioned = prepartitioned

    def _edge(self) -> Edge:
        return Edge(self.stream.node, FORWARD if self.prepartitioned else HASH, self.key_fn)

    def process(
        self, fn: KeyedProcessFunction, *, name: str | None = None, parallelism: int | None = None,
        max_parallelism: int | None = None,
    ) -> DataStream:
        """Run a stateful :class:`KeyedProcessFunction` per key.

        ``max_parallelism``: host this many partitions from the start, ``parallelism`` of them
        owning the task's vnodes and the others spare, so that ``JobHandle.rescale`` can take the
        running task up to ``max_parallelism`` and back (docs/handover.md, "Rescale")."""
        if not isinstance(fn, KeyedProcessFunction):
            raise JobDefinitionError("process() needs a KeyedProcessFunction instance")
        if isinstance(fn, CoProcessFunction):
            raise JobDefinitionError(f"process {name!r}: a CoProcessFunction takes two inputs: "
                                     "a.connect(b).key_by(ka, kb).process(fn)")
        if _undefined(fn, KeyedProcessFunction, ("process",)):
            raise JobDefinitionError(f"process {name or type(fn).__name__!r}: {type(fn).__qualname__} does not "
                                     "define process(value, ctx)")
        if max_parallelism is not None:
            if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int) or max_parallelism < 1:
                raise JobDefinitionError(f"process {name!r}: max_parallelism must be a positive int, "
                                         f"got {max_parallelism!r}")
            if parallelism is not None and max_parallelism < parallelism:
                raise JobDefinitionError(f"process {name!r}: max_parallelism {max_parallelism} is below its "
                                         f"parallelism {parallelism}")
            if self.prepartitioned:
                raise JobDefinitionError(f"process {name!r}: max_parallelism needs a hash-partitioned input "
                                         "(key_by without prepartitioned=True): a forward edge keeps the partitions")
        job = self.stream.job
        return DataStream(job, job._add("process", name, parallelism, [self._edge()], fn=fn,
                                        max_parallelism=max_parallelism))

    def window(
        self, size_ms: int, aggregator: Aggregator, *, slide_ms: int | None = None, allowed_lateness_ms: int = 0,
        late_output: OutputTag | None = None, name: str | None = None, parallelism: int | None = None,
    ) -> DataStream:
        """Event-time windows of ``size_ms`` aggregated incrementally: tumbling, or sliding with
        one window starting every ``slide_ms``.  A window's result is emitted once the watermark
        reaches its end; for ``allowed_lateness_ms`` after that a record for it updates it and emits
        the new result.  Records later than that go to the side output ``late_output`` (read it with
        ``side_output``), else to the dead-letter topic (reason ``late``)."""
        try:
            windows = Windows.sliding(size_ms, size_ms if slide_ms is None else slide_ms, allowed_lateness_ms)
        except ValueError as e:
            raise JobDefinitionError(f"window {name!r}: {e}") from None
        _warn_if_short("window", name, size_ms)
        return self._windowed("window", name, parallelism, windows, aggregator, late_output)

    def session_window(
        self, gap_ms: int, aggregator: Aggregator, *, allowed_lateness_ms: int = 0,
        late_output: OutputTag | None = None, name: str | None = None, parallelism: int | None = None,
    ) -> DataStream:
        """Session windows per key: records less than ``gap_ms`` of event time apart share a
        window, which ends ``gap_ms`` after its last record; sessions that a record bridges merge
        (the aggregator must define ``merge``).  Emitted and late as :meth:`window`."""
        try:
            windows = Windows.session(gap_ms, allowed_lateness_ms)
        except ValueError as e:
            raise JobDefinitionError(f"session_window {name!r}: {e}") from None
        _warn_if_short("session_window", name, gap_ms)
        if isinstance(aggregator, Aggregator) and not mergeable(aggregator):
            raise JobDefinitionError(f"session_window {name!r}: its aggregator {type(aggregator).__name__} must "
                                     "define merge (sessions merge when a record bridges them)")
        return self._windowed("session_window", name, parallelism, windows, aggregator, late_output)

    def _windowed(self, what: str, name: str | None, parallelism: int | None, windows: Windows,
                  aggregator: Aggregator, late_output: OutputTag | None) -> DataStream:
        if not isinstance(aggregator, Aggregator):
            raise JobDefinitionError(f"{what}() needs an Aggregator instance")
        undefined = _undefined(aggregator, Aggregator, ("create", "add"))
        if undefined:
            raise JobDefinitionError(f"{_label(what, name)}: its aggregator {type(aggregator).__qualname__} does not define "
                                     + " and ".join(f"{m}()" for m in undefined))
        if late_output is not None and not isinstance(late_output, OutputTag):
            raise JobDefinitionError(f"{what}() late_output must be an OutputTag")
        job = self.stream.job
        spec: dict[str, Any] = {"windows": windows, "aggregator": aggregator}
        if late_output is not None:
            spec["late_output"] = late_output.name
        return DataStream(job, job._add("window", name, parallelism, [self._edge()], **spec))

    def interval_join(self, other: KeyedStream, lower_ms: int, upper_ms: int, fn: Callable[[Any, Any], Any], *,
                      name: str | None = None, parallelism: int | None = None) -> DataStream:
        """``fn(a, b)`` for every record ``a`` of this stream and ``b`` of ``other`` with equal keys
        and ``a.ts + lower_ms <= b.ts <= a.ts + upper_ms`` (event time), once each pair."""
        try:
            join = IntervalJoin(lower_ms, upper_ms, fn)
        except (TypeError, ValueError) as e:
            raise JobDefinitionError(f"interval_join {name!r}: {e}") from None
        return self._joined(other, join, name, parallelism)

    def window_join(self, other: KeyedStream, size_ms: int, fn: Callable[[Any, Any], Any], *,
                    name: str | None = None, parallelism: int | None = None) -> DataStream:
        """``fn(a, b)`` for every record ``a`` of this stream and ``b`` of ``other`` with equal keys
        in the same tumbling event-time window of ``size_ms``, when the watermark ends it."""
        try:
            join = WindowJoin(size_ms, fn)
        except (TypeError, ValueError) as e:
            raise JobDefinitionError(f"window_join {name!r}: {e}") from None
        return self._joined(other, join, name, parallelism)

    def lookup_join(self, table: KeyedStream, fn: Callable[[Any, Any], Any], *, inner: bool = False,
                    name: str | None = None, parallelism: int | None = None) -> DataStream:
        """``fn(record, row)`` with the latest row of the record's key in ``table`` (a stream of
        rows, e.g. a compacted topic read with ``metadata=True``, whose tombstones delete a key;
        ``row`` None when the key has none, and no output then with ``inner``)."""
        try:
            join = LookupJoin(fn, inner)
        except TypeError as e:
            raise JobDefinitionError(f"lookup_join {name!r}: {e}") from None
        return self._joined(table, join, name, parallelism)

    def _joined(self, other: KeyedStream, join: CoProcessFunction, name: str | None,
                parallelism: int | None) -> DataStream:
        if not isinstance(other, KeyedStream) or other.stream.job is not self.stream.job:
            raise JobDefinitionError("a join needs another keyed stream of the same job (key_by it first)")
        return ConnectedKeyedStreams(self, other).process(join, name=name, parallelism=parallelism)

    def reduce(
        self, fn: Callable[[Any, Any], Any], *, name: str | None = None, parallelism: int | None = None
    ) -> DataStream:
        """A running reduction per key: each record emits ``fn(previous result, record)`` (the
        first record of a key emits itself), kept in keyed state."""
        if not callable(fn):
            raise JobDefinitionError("reduce() needs a callable of two values")
        return self.process(_RunningReduce(fn), name=name, parallelism=parallelism)


class ConnectedStreams:
    """Two streams on their way into one two-input keyed function; key both with :meth:`key_by`."""

    def __init__(self, first: DataStream, second: DataStream) -> None:
        self.first = first
        self.second = second

    def key_by(self, first_key: Callable[[Any], Any], second_key: Callable[[Any], Any]) -> ConnectedKeyedStreams:
        """Partition the first stream by ``first_key`` and the second by ``second_key``: records of
        both with equal keys meet in the same partition, with the same keyed state."""
        return ConnectedKeyedStreams(KeyedStream(self.first, first_key), KeyedStream(self.second, second_key))


class ConnectedKeyedStreams:
    """Two keyed streams whose records of equal keys meet in one two-input keyed function."""

    def __init__(self, first: KeyedStream, second: KeyedStream) -> None:
        self.first = first
        self.second = second

    def process(self, fn: CoProcessFunction, *, name: str | None = None,
                parallelism: int | None = None) -> DataStream:
        """Run ``fn`` per key: ``process1`` on the first stream's records, ``process2`` on the
        second's.  Its task has several input channels, so with replication it needs an ordering
        mode (``liverobin`` or ``kazoo``)."""
        if not isinstance(fn, CoProcessFunction):
            raise JobDefinitionError("a connected stream's process() needs a CoProcessFunction instance")
        undefined = _undefined(fn, CoProcessFunction, ("process1", "process2"))
        if undefined:
            raise JobDefinitionError(f"process {name or type(fn).__name__!r}: {type(fn).__qualname__} does not define "
                                     + " and ".join(f"{m}(value, ctx)" for m in undefined))
        job = self.first.stream.job
        return DataStream(job, job._add("process", name, parallelism, [self.first._edge(), self.second._edge()],
                                        fn=fn, max_parallelism=None))


class _RunningReduce(KeyedProcessFunction):
    """:meth:`KeyedStream.reduce`: the key's running result in a value state."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def open(self, ctx: RuntimeContext) -> None:
        self.result = ctx.value_state("reduced", default=_NOTHING)

    def process(self, value: Any, ctx: ProcessContext) -> Iterable[Any]:
        previous = self.result.value()
        current = value if previous == _NOTHING else self.fn(previous, value)
        self.result.update(current)
        yield current


_NOTHING = ("__replication_nothing_reduced__",)
