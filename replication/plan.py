"""Physical planning: chain operators into tasks, number the channels, place instances.

Like Flink, a stateless operator is chained to its single upstream when the edge
is a forward edge of equal parallelism and that upstream feeds nobody else.
Sources, unions and keyed operators start a task.  A *channel* is the FIFO
stream from one upstream partition to one downstream partition over one edge;
channel ids are global integers fixed by the plan, so both ends (and, later, both
replicas of each end) agree on them.

Instances (task, partition) are placed on *workers*: long-running Spark tasks
that host many instances each, so the executor count does not grow with the
partition count (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark import cloudpickle

from kazoo_leader.segments import SegmentedLog
from liverobin.segments import HeartbeatLog
from replication.api import FORWARD, HASH, REBALANCE, Job, JobDefinitionError, Node
from replication.durability import ResumePoint
from rhino_state import RoutingTable
from transport.ids import PartitionId, ReplicaId


def replica_name(task_name: str, partition: int, replica: int) -> str:
    """How a replica is named in metrics, logs and the kill tooling: ``task[partition]r<replica>``."""
    return f"{task_name}[{partition}]r{replica}"


@dataclass(frozen=True)
class ChannelSpec:
    id: int
    edge_id: int
    src_task: int
    src_partition: int
    dst_task: int
    dst_partition: int


@dataclass
class InputEdge:
    edge_id: int
    src_task: int
    partitioning: str
    index: int = 0  # which input of the task's head it feeds (a two-input function's second: 1)


@dataclass
class OutputEdge:
    edge_id: int
    dst_task: int
    partitioning: str
    key_fn: Any
    dst_parallelism: int
    tag: str | None = None  # a side output of the task's last operator (None: its main output)


@dataclass
class TaskSpec:
    id: int
    name: str
    parallelism: int
    chain: list[Node]
    inputs: list[InputEdge] = field(default_factory=list)
    outputs: list[OutputEdge] = field(default_factory=list)

    @property
    def head(self) -> Node:
        return self.chain[0]

    @property
    def is_source(self) -> bool:
        return self.head.kind == "source"

    @property
    def keyed(self) -> bool:
        return any(n.kind in ("process", "window") for n in self.chain)

    @property
    def keyed_functions(self) -> bool:
        """Runs a keyed process function (which may use processing time: timers, TTL)."""
        return any(n.kind == "process" for n in self.chain)


@dataclass
class PhysicalPlan:
    job_name: str
    tasks: list[TaskSpec]
    channels: list[ChannelSpec]
    num_key_groups: int
    routing: dict[int, RoutingTable]  # keyed task id -> vnode routing table
    source_partitions: dict[int, dict[int, list[int]]]  # source task -> partition -> Kafka partitions
    # source task -> Kafka partition -> first offset to read, resolved once by the driver so that
    # every copy of a source partition starts at the same record (absent: from the beginning)
    source_start_offsets: dict[int, dict[int, int]] = field(default_factory=dict)
    replicas: int = 1  # copies of every partition: 2 with spark.replication.enabled
    sink_topic_partitions: dict[str, int] = field(default_factory=dict)  # set by the driver
    # LiveRobin (KaZoo: for pulse windows): this run's heartbeat log, set by the driver; both
    # replicas of a source partition read it from its start, so they count the same pulses
    heartbeat_log: HeartbeatLog | None = None
    # KaZoo: the order log of every partition with several input channels, set by the driver; both
    # replicas follow it from its start (a resumed run's, restored from its cut, from their checkpoint)
    order_logs: dict[PartitionId, SegmentedLog] = field(default_factory=dict)
    order_logs_prefix: str | None = None  # what this run's order logs are named after
    # KaZoo: the order log of every source partition, where its leader places the pulses of the
    # handovers' pulse windows (replication.runtime.window_placement); read from its start (a resumed
    # run goes on in the run before's, its restored sources from their checkpoints)
    window_order_logs: dict[PartitionId, SegmentedLog] = field(default_factory=dict)
    window_order_logs_prefix: str | None = None
    # a savepoint this run starts from: (directory, its _meta.json), set by the driver
    savepoint: tuple[str, dict] | None = None
    # whether the operators replaced at runtime in the run that wrote the savepoint keep their
    # functions here (a durable resume's savepoint), instead of running the job's own
    savepoint_code: bool = False
    resume: ResumePoint | None = None  # the durable cut this run goes on from, set by the driver
    # (task id, operator) -> the version its function was replaced to by the runs this one resumes
    # (its checkpoints hold the function): the next replacement counts on from there
    code_versions: dict[tuple[int, str], int] = field(default_factory=dict)

    def source_topics(self) -> dict[str, list[int]]:
        """Every source topic with the Kafka partitions the job reads of it."""
        out: dict[str, list[int]] = {}
        for t in self.tasks:
            if t.is_source:
                parts = out.setdefault(t.head.spec["topic"], [])
                parts.extend(k for ks in self.source_partitions[t.id].values() for k in ks)
        return {topic: sorted(set(parts)) for topic, parts in out.items()}

    def multi_input_tasks(self) -> list[TaskSpec]:
        """Tasks whose partitions have more than one input channel (their input order is not
        deterministic without an ordering mode)."""
        return [t for t in self.tasks if any(len(self.input_channels(t.id, p)) > 1 for p in range(t.parallelism))]

    def ordered_partitions(self) -> list[PartitionId]:
        """The partitions KaZoo orders: those with more than one input channel, and those of
        keyed functions (their order log carries processing time)."""
        return [(t.id, p) for t in self.tasks if not t.is_source for p in range(t.parallelism)
                if t.keyed_functions or len(self.input_channels(t.id, p)) > 1]

    def source_partition_ids(self) -> list[PartitionId]:
        return [(t.id, p) for t in self.tasks if t.is_source for p in range(t.parallelism)]

    def task(self, task_id: int) -> TaskSpec:
        return self.tasks[task_id]

    def instances(self) -> list[PartitionId]:
        return [(t.id, p) for t in self.tasks for p in range(t.parallelism)]

    def input_channels(self, task_id: int, partition: int) -> list[ChannelSpec]:
        return [c for c in self.channels if c.dst_task == task_id and c.dst_partition == partition]

    def second_input_channels(self, task_id: int, partition: int) -> frozenset[int]:
        """The input channels of ``(task_id, partition)`` that feed the second input of a two-input
        keyed function (none for other tasks)."""
        second = {e.edge_id for e in self.tasks[task_id].inputs if e.index == 1}
        return frozenset(c.id for c in self.input_channels(task_id, partition) if c.edge_id in second)

    def output_channels(self, task_id: int, partition: int, edge_id: int) -> list[ChannelSpec]:
        """Channels of one output edge from ``(task_id, partition)``, ordered by destination partition."""
        chans = [c for c in self.channels
                 if c.src_task == task_id and c.src_partition == partition and c.edge_id == edge_id]
        return sorted(chans, key=lambda c: c.dst_partition)

    def describe(self) -> str:
        lines = [f"job {self.job_name}: {len(self.tasks)} tasks, {len(self.instances())} instances, "
                 f"{len(self.channels)} channels"]
        for t in self.tasks:
            ops = " -> ".join(n.name for n in t.chain)
            ins = ", ".join(f"{self.tasks[i.src_task].name}[{i.partitioning}]" for i in t.inputs) or "kafka"
            spare = t.parallelism - self.routing[t.id].parallelism if t.id in self.routing else 0
            size = f"x{t.parallelism}" + (f" ({spare} spare, for rescale)" if spare else "")
            lines.append(f"  task {t.id} {t.name!r} {size}: {ops}  (inputs: {ins})")
        return "\n".join(lines)


def _resolve_parallelism(job: Job, default: int, topic_partitions: Mapping[str, int],
                         active: dict[int, int]) -> dict[int, int]:
    """Partitions hosted per node; ``active`` gets those of keyed nodes with spare partitions."""
    par: dict[int, int] = {}
    for node in job.nodes:  # nodes are created in topological order
        if node.kind == "source":
            topic = node.spec["topic"]
            if topic not in topic_partitions:
                raise JobDefinitionError(f"source {node.name!r}: topic {topic!r} does not exist")
            available = topic_partitions[topic]
            p = node.parallelism or available
            if p > available:
                raise JobDefinitionError(
                    f"source {node.name!r}: parallelism {p} > {available} partitions of topic {topic!r}")
        elif node.parallelism is not None:
            p = node.parallelism
        elif node.kind in ("process", "window"):
            edge = node.inputs[0]  # prepartitioned (forward) keyed input: stay with the input
            p = par[edge.source.id] if edge.partitioning == FORWARD else default
        elif node.kind == "union":
            p = max(par[e.source.id] for e in node.inputs)
        else:  # stateless and sinks follow their input
            p = par[node.inputs[0].source.id]
        par[node.id] = p
        if node.spec.get("max_parallelism"):
            if p > node.spec["max_parallelism"]:
                raise JobDefinitionError(f"process {node.name!r}: max_parallelism {node.spec['max_parallelism']} "
                                         f"is below its parallelism {p}")
            active[node.id] = p  # the partitions owning vnodes at the start; the others are spare
            par[node.id] = node.spec["max_parallelism"]
    return par


def check_shippable(job: Job) -> None:
    """Every function and object of ``job`` can be pickled for the executors (with cloudpickle, as
    Spark ships them); raises JobDefinitionError naming the operator, the part and why not."""
    for node in job.nodes:
        parts = [("function" if what == "fn" else what, value) for what, value in node.spec.items() if value is not None]
        parts += [("key_by function", edge.key_fn) for edge in node.inputs if edge.key_fn is not None]
        for what, value in parts:
            try:
                cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001 - any reason pickling fails is the user's to fix
                raise JobDefinitionError(f"{node.kind} {node.name!r}: its {what} cannot be shipped to the executors "
                                         f"(pickling failed: {type(exc).__name__}: {exc})") from None


def plan_job(
    job: Job,
    *,
    default_parallelism: int,
    num_key_groups: int,
    num_vnodes: int,
    topic_partitions: Mapping[str, int],
) -> PhysicalPlan:
    """Turn the logical graph into tasks and channels.  Raises JobDefinitionError."""
    job.validate()
    check_shippable(job)
    active: dict[int, int] = {}
    par = _resolve_parallelism(job, default_parallelism, topic_partitions, active)
    consumers: dict[int, list[Node]] = {n.id: [] for n in job.nodes}
    for node in job.nodes:
        for e in node.inputs:
            consumers[e.source.id].append(node)

    def chains_to_upstream(node: Node) -> bool:
        if node.kind in ("source", "union", "process", "window", "side_output") or len(node.inputs) != 1:
            return False
        edge = node.inputs[0]
        return (edge.partitioning == FORWARD and edge.chain and par[edge.source.id] == par[node.id]
                and len(consumers[edge.source.id]) == 1)

    task_of: dict[int, int] = {}
    tasks: list[TaskSpec] = []
    for node in job.nodes:
        if chains_to_upstream(node):
            t = tasks[task_of[node.inputs[0].source.id]]
            t.chain.append(node)
        else:
            t = TaskSpec(len(tasks), node.name, par[node.id], [node])
            tasks.append(t)
        task_of[node.id] = t.id

    channels: list[ChannelSpec] = []
    edge_ids = iter(range(1 << 30))
    for t in tasks:
        for index, edge in enumerate(t.head.inputs):
            src = tasks[task_of[edge.source.id]]
            if src.chain[-1] is not edge.source:
                raise JobDefinitionError(f"internal: {edge.source.name} is not the tail of its task")
            partitioning = edge.partitioning
            if partitioning == FORWARD and src.parallelism != t.parallelism:
                if edge.key_fn is not None:
                    raise JobDefinitionError(
                        f"{t.name!r}: key_by(prepartitioned=True) needs the parallelism of its input "
                        f"{src.name!r} ({src.parallelism}), got {t.parallelism}")
                partitioning = REBALANCE
            eid = next(edge_ids)
            t.inputs.append(InputEdge(eid, src.id, partitioning, index if t.head.kind == "process" else 0))
            src.outputs.append(OutputEdge(eid, t.id, partitioning, edge.key_fn, t.parallelism, edge.tag))
            for sp in range(src.parallelism):
                dsts = [sp] if partitioning == FORWARD else range(t.parallelism)
                for dp in dsts:
                    channels.append(ChannelSpec(len(channels), eid, src.id, sp, t.id, dp))

    routing = {}
    for t in tasks:
        if any(i.partitioning == HASH for i in t.inputs):
            if t.parallelism > num_vnodes:
                raise JobDefinitionError(
                    f"task {t.name!r}: parallelism {t.parallelism} exceeds spark.replication.state.vnodes={num_vnodes}")
            routing[t.id] = RoutingTable.uniform(num_vnodes, active.get(t.head.id, t.parallelism))
    for t in tasks:
        for n in t.chain[1:]:
            if n.kind in ("process", "window"):
                raise JobDefinitionError(f"internal: keyed operator {n.name} chained")

    source_partitions: dict[int, dict[int, list[int]]] = {}
    for t in tasks:
        if t.is_source:
            n = topic_partitions[t.head.spec["topic"]]
            source_partitions[t.id] = {p: [k for k in range(n) if k % t.parallelism == p]
                                       for p in range(t.parallelism)}
    return PhysicalPlan(job.name, tasks, channels, num_key_groups, routing, source_partitions)


def place(plan: PhysicalPlan, num_workers: int) -> dict[ReplicaId, int]:
    """Spread replicas over workers round robin: partition ``i`` (counted over all tasks) has
    replica ``r`` on worker ``(i + r) mod W``, so the replicas of a partition are never on the
    same worker, and the partitions of one task are on distinct workers as far as W allows."""
    if num_workers < plan.replicas:
        raise JobDefinitionError(
            f"placement needs at least {plan.replicas} worker(s) (executors) for {plan.replicas} replica(s) "
            f"per partition, got {num_workers}")
    placement: dict[ReplicaId, int] = {}
    i = 0
    for t in plan.tasks:
        for p in range(t.parallelism):
            for r in range(plan.replicas):
                placement[(t.id, p, r)] = (i + r) % num_workers
            i += 1
    return placement


def check_replicable(plan: PhysicalPlan, topic_partitions: Mapping[str, int]) -> None:
    """With replication (and with LiveRobin's pulse placement), both replicas of a source partition
    must emit the identical sequence: each source partition reads exactly one Kafka partition
    (interleaving several is not deterministic)."""
    for t in plan.tasks:
        if t.is_source:
            topic = t.head.spec["topic"]
            if t.parallelism != topic_partitions[topic]:
                raise JobDefinitionError(
                    f"source {t.name!r}: with spark.replication.enabled or an ordering mode its parallelism must equal the "
                    f"{topic_partitions[topic]} partitions of topic {topic!r} (got {t.parallelism}), so that "
                    "both replicas read the same records in the same order")
