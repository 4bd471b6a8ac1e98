"""The typed parts of the heartbeat: what each control-plane service reports and is told.

A :class:`~replication.messages.Heartbeat` carries, besides liveness, one *report* per service
that has news; an :class:`~replication.messages.Instructions` reply one *word* per service that
has something to say (``parts``, keyed by the service's name).  Each pair below belongs to one
service, on the worker side in :mod:`replication.runtime` and on the driver side in
:mod:`replication.control` (the contracts: :mod:`replication.runtime.services`,
:mod:`replication.control.services`).  A new service adds its pair here and registers itself on
both sides; the heartbeat loops and the other services stay as they are.  :class:`ServiceSet`
is what both sides' sets of services are built on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from transport import wire
from transport.ids import PartitionId, ReplicaId

OUTPUTS = "outputs"
CHECKPOINTS = "checkpoints"
HANDOVERS = "handovers"
PULSE_WINDOWS = "pulse_windows"
DRAINS = "drains"
CUT_OFFS = "cut_offs"
SAVEPOINT = "savepoint"
STATE_MEASUREMENT = "state_measurement"

# (task, partition, kind "out" | "dlq"): one exactly-once output
OutputKey = tuple[int, int, str]


class Named(Protocol):
    name: str


S = TypeVar("S", bound=Named)


class ServiceSet(Generic[S]):
    """The services of one side, each under a name of its own, in the order they were added."""

    def __init__(self, services: Iterable[S] = ()) -> None:
        self._services: list[S] = []
        for service in services:
            self.add(service)

    def add(self, service: S) -> None:
        if any(s.name == service.name for s in self._services):
            raise ValueError(f"two control-plane services are named {service.name!r}")
        self._services.append(service)

    def names(self) -> list[str]:
        """The services' names, in their order."""
        return [s.name for s in self._services]


# -- exactly-once outputs: who writes each, and how far it committed --------------------------------

@wire.record
@dataclass(frozen=True)
class OutputProgress:
    """What each exactly-once output of the worker's replicas committed: (seq, offset); the
    outputs whose writer a newer producer fenced: (task, partition, replica, kind) -> its epoch;
    and those whose writer produced past every seq the output held when it took over."""

    committed: dict[OutputKey, tuple[int, int]] = field(default_factory=dict)
    fenced: dict[tuple[int, int, int, str], int] = field(default_factory=dict)
    regenerated: frozenset[OutputKey] = frozenset()


@wire.record
@dataclass(frozen=True)
class WriterRoles:
    """The writer of every exactly-once output: key -> (writer replica, epoch, seq, offset)."""

    roles: dict[OutputKey, tuple[int, int, int, int]] = field(default_factory=dict)


# -- Rhino checkpoints -------------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class CheckpointCompleted:
    """A checkpoint the chain of its partition's group acknowledged, as its shipper saw it."""

    task: int
    partition: int
    checkpoint_id: int
    positions: dict[int, int]  # input channel -> next seq a restore from it needs
    digest: str
    holders: list[str]  # addresses of the workers that hold it
    outputs: dict[int, int]  # output channel -> next seq at it
    order_from: int | None = None  # KaZoo: where a restore from it reads the partition's order log on


@wire.record
@dataclass(frozen=True)
class CheckpointReport:
    """Checkpoints taken (task, partition, replica, id, digest), completed and uploaded to the
    durable store (task, partition, id, file) since the last report."""

    taken: list[tuple] = field(default_factory=list)
    completed: list[CheckpointCompleted] = field(default_factory=list)
    durable: list[tuple] = field(default_factory=list)


@wire.record
@dataclass(frozen=True)
class CheckpointView:
    """The driver's Rhino view: replica groups (addresses, chain order), the latest completed
    checkpoint of each partition, where upstream backups may be trimmed to, which snapshots members
    keep, which replica ships each partition, and where restored replicas run (with their restore's
    attempt, address, replay positions and pulse)."""

    groups: dict[PartitionId, list[str]] = field(default_factory=dict)
    completed: dict[PartitionId, int] = field(default_factory=dict)
    trim: dict[PartitionId, dict[int, int]] = field(default_factory=dict)
    retain: dict[PartitionId, int] = field(default_factory=dict)
    shippers: dict[PartitionId, int] = field(default_factory=dict)
    moves: dict[ReplicaId, tuple[int, str, dict[int, int], int]] = field(default_factory=dict)


# -- handovers ----------------------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class ReplicaAck:
    """A replica's acknowledgement of a handover step: what it did (``kind``), as which incarnation
    (``attempt``), at which checkpoint, the digest and entries of a cut, and ``times``: when it did
    it (``at``) and what else the driver cannot see (a cut's arrival, bytes cut, ...)."""

    handover_id: int
    epoch: int
    replica: ReplicaId
    kind: str
    digest: str = ""
    entries: int = 0
    attempt: int = 0
    checkpoint: int = -1
    times: dict[str, Any] = field(default_factory=dict)


@wire.record
@dataclass(frozen=True)
class HandoverAcks:
    """The handover acks of the worker's replicas since its last delivered heartbeat."""

    acks: list[ReplicaAck] = field(default_factory=list)


@wire.record
@dataclass(frozen=True)
class HandoverOrders:
    """The handovers not completed, in wire form (``handover_orders``); with Rhino, the handovers
    whose cuts origins keep for restored targets (None: without Rhino)."""

    orders: list[dict[str, Any]] = field(default_factory=list)
    retained: list[int] | None = None


# -- KaZoo pulse windows ---------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class Holding:
    """Source replicas holding their records for a pulse window: replica -> (window, where each
    Kafka partition holds)."""

    replicas: dict[ReplicaId, tuple[int, dict[int, int]]] = field(default_factory=dict)


@wire.record
@dataclass(frozen=True)
class WindowWordPart:
    """The driver's latest word on the pulse windows (a ``liverobin.windows.WindowWord`` as a tuple)."""

    word: tuple


# -- drains without pulses -------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class DrainPositions:
    """Where source replicas stopped reading when drained: replica -> Kafka partition -> next offset."""

    replicas: dict[ReplicaId, dict[int, int]] = field(default_factory=dict)


@wire.record
@dataclass(frozen=True)
class DrainEnds:
    """Where every replica of each source partition ends its drain (the furthest reported)."""

    partitions: dict[PartitionId, dict[int, int]] = field(default_factory=dict)


# -- replicas cut off by their upstreams --------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class CutOffs:
    """Destination replicas the worker's channels cut off by themselves (failed sends, too far
    behind): replica -> (the worker it ran on, why)."""

    replicas: dict[ReplicaId, tuple[int, str]] = field(default_factory=dict)


@wire.record
@dataclass(frozen=True)
class Drops:
    """Replicas to stop wherever they run, up to the restore attempt given: the driver replaces them."""

    replicas: dict[ReplicaId, int] = field(default_factory=dict)


# -- savepoints ----------------------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class SavepointDirectory:
    """A drain that ends in a savepoint: the directory its replicas write their parts to (from the
    driver), or the one the worker's replicas know (from the worker)."""

    directory: str


# -- measuring state ---------------------------------------------------------------------------------

@wire.record
@dataclass(frozen=True)
class MeasureRequests:
    """Keyed task -> the latest request to measure its state per vnode (answered in the metrics)."""

    requests: dict[int, int] = field(default_factory=dict)
