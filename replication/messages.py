"""The typed messages of the control plane: worker <-> driver, worker <-> worker, CLI -> driver.

Each RPC method takes one of these dataclasses and answers with one (``transport.rpc.typed``);
they travel in :mod:`transport.wire`'s safe encoding, never pickled.  What they carry is plain
data; the heartbeat's per-service parts are the typed records of :mod:`.heartbeat_parts`.  User
objects (moved operator state, keys) travel only inside them as opaque pickled ``bytes``, read by
the runtime that hosts the user's code, after the call was authenticated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replication import heartbeat_parts  # noqa: F401  (registers the parts' records with the wire)
from replication.metrics import InstanceMetrics, LatencyHistogram
from transport import wire
from transport.ids import ReplicaId

wire.register(InstanceMetrics, LatencyHistogram)


# -- worker -> driver ----------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class Register:
    """A worker attempt announces itself (``Register``)."""

    worker: int
    attempt: int
    executor: str | None
    address: str
    python_pid: int


@wire.record
@dataclass(frozen=True)
class Attach:
    """A registered worker attempt's watch on the driver (``Attach``): held open while its process
    lives, so the driver learns at once that the process exited."""

    worker: int
    attempt: int


@wire.record
@dataclass(frozen=True)
class SourcePositions:
    """Where a worker's source replicas know records exist (``SourcePositions``, a stream): for
    each Kafka partition (topic, partition, where reading started, an offset every record below
    which exists); the heartbeat generators place pulses there (:mod:`liverobin.positions`)."""

    worker: int
    attempt: int
    positions: list[tuple[str, int, int, int]]


@wire.record
@dataclass(frozen=True)
class Heartbeat:
    """Liveness, errors and metrics of one worker attempt (``Heartbeat``), and the reports of its
    control-plane services that have news: ``parts``, by service name (:mod:`.heartbeat_parts`)."""

    worker: int
    attempt: int
    errors: list[str] = field(default_factory=list)
    metrics: dict[str, InstanceMetrics] | None = None
    rpc_refused: int = 0  # calls its server refused (unauthenticated) so far
    parts: dict[str, Any] = field(default_factory=dict)
    # the report (metrics apart) and the records its replicas handled are as at the beat before:
    # with the same reply as then, the worker is quiet and beats seldom until the driver rings
    unchanged: bool = False


@wire.record
@dataclass(frozen=True)
class WorkerFinished:
    """A worker attempt's end (``Finished``): ``status`` is finished, stopped, failed, evicted,
    standby, aborted or driver-lost."""

    worker: int
    attempt: int
    status: str
    reason: str = ""
    errors: list[str] = field(default_factory=list)
    metrics: dict[str, InstanceMetrics] = field(default_factory=dict)
    sinks: dict[tuple[int, int, str], tuple[int, int]] = field(default_factory=dict)


# -- driver -> worker ----------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class Instructions:
    """What the driver tells every worker on each heartbeat reply (and on registration): the
    command (run | drain | stop | evicted), the dead and the finished workers, and the word of each
    control-plane service that has something to say: ``parts``, by service name."""

    command: str
    dead: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    parts: dict[str, Any] = field(default_factory=dict)


def quiet_after(req: Heartbeat, reply: Instructions, previous: Instructions | None) -> bool:
    """Whether a worker is quiet after the beat ``req`` the driver answered with ``reply``: it
    reported nothing new, and the reply is the one it got before (``previous``), the job running.
    Both ends decide it from the same three: the worker to beat seldom, the driver to ring it when
    its reply would change."""
    return req.unchanged and reply.command == "run" and reply == previous


@wire.record
@dataclass(frozen=True)
class Registered:
    """The answer to :class:`Register`: ``status`` ok, standby or abort, and, unless aborted,
    every worker's address and the instructions in force."""

    status: str
    reason: str = ""
    addresses: dict[int, str] = field(default_factory=dict)
    instructions: Instructions | None = None


@wire.record
@dataclass(frozen=True)
class RestoreReplica:
    """Run the lost replica ``replica`` on the worker called, from the completed checkpoint it
    holds, or (``source``: a holder's address) one it pulls from there first, or (``durable_file``)
    the checkpoint of the resumed cut it builds from the durable store.  ``placement`` and
    ``lost`` (the replicas running nowhere now; their placement is where they ran) are as of the
    driver's first ``restores_seen`` restores: it sends to no lost replica until it learns of a
    later restore that runs it again."""

    replica: ReplicaId
    checkpoint_id: int
    placement: dict[ReplicaId, int]
    sinks: dict[tuple[int, int, str], tuple[int, int, int, int]]
    addresses: dict[int, str]
    attempt: int
    handovers: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    durable_file: str = ""
    lost: frozenset[ReplicaId] = frozenset()
    restores_seen: int = 0


@wire.record
@dataclass(frozen=True)
class CopyCheckpoint:
    """Hold completed checkpoint ``checkpoint_id`` of ``instance`` too: pull it from ``source``."""

    instance: tuple[int, int]
    checkpoint_id: int
    source: str


@wire.record
@dataclass(frozen=True)
class Restored:
    """Where a restored replica's upstreams replay from, and how long the restore took."""

    checkpoint_id: int
    positions: dict[int, int]
    load_s: float
    restore_s: float
    pulse: int


# -- worker <-> worker: handover state -----------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class CutChunk:
    """Chunk ``chunk`` of ``chunks`` of an origin partition's cut for one target partition
    (``HandoverState``): its entries (``transport.wire.pack_rows``), or the changes since the
    origin's checkpoint ``base`` with the ``digest`` and ``count`` of the entries they rebuild.
    ``extras``: the moved keys' operator state, pickled (user keys), in chunk 0 only."""

    handover: int
    task: int
    partition: int
    origin: int
    chunk: int
    chunks: int
    extras: bytes = b""
    entries: bytes | None = None
    changes: bytes | None = None
    base: int | None = None
    digest: str = ""
    count: int = 0


@wire.record
@dataclass(frozen=True)
class CutRequest:
    """Ask for chunk ``chunk`` of the cut an origin replica keeps for a target (``HandoverCut``)."""

    handover: int
    task: int
    origin: int
    partition: int
    chunk: int


@wire.record
@dataclass(frozen=True)
class KeptCut:
    """The answer to :class:`CutRequest`: ``missing`` (not kept here), or the chunk."""

    missing: bool = False
    entries: bytes = b""
    chunks: int = 0
    extras: bytes = b""


@wire.record
@dataclass(frozen=True)
class Ack:
    """An empty answer."""


# -- CLI -> driver ------------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class HandoverRequest:
    """A ``replication move``/``rescale``/``rebalance``/``drain`` of a running job (``MoveVnodes``):
    which one is given by the fields set."""

    strategy: str = "all"
    timeout: float | None = None
    task: str | None = None
    vnodes: list[int] | None = None
    target: int | None = None
    parallelism: int | None = None
    fraction: float | None = None
    window: float | None = None
    executor: str | None = None


@wire.record
@dataclass(frozen=True)
class HandoverReport:
    """The answer to :class:`HandoverRequest`: the report (plain data), or why it failed."""

    report: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
