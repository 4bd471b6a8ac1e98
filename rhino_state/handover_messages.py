"""The words of the handover protocol (:mod:`rhino_state.handover`): a step's states, the
instructions the manager sends, the acks the participants answer with, commit, cancel, release."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rhino_state.handover import Transfer, VnodeMove, transfers_of
from rhino_state.keys import RoutingTable
from transport.ids import PartitionId, ReplicaId


class HandoverState(enum.Enum):
    """Where a handover step (or operator replacement) is."""

    PLANNED = "planned"  # a step of a job not instructed yet
    INSTRUCTED = "instructed"  # instruction sent, collecting ARMED acks: abort is clean
    ARMED = "armed"  # every participant replica armed, nobody switched: abort is clean
    COMMITTED = "committed"  # commit sent: routers switch at the position; only roll forward from here
    SWITCHED = "switched"  # every upstream rerouted at the position
    CUT = "cut"  # every origin cut the final increment of the moved vnodes
    LOADED = "loaded"  # every target loaded it and processed its held records
    COMPLETED = "completed"
    ABORTED = "aborted"


STATE_ORDER = {s: i for i, s in enumerate(HandoverState)}
BEFORE_COMMIT = (HandoverState.INSTRUCTED, HandoverState.ARMED)
IN_FLIGHT = (HandoverState.INSTRUCTED, HandoverState.ARMED, HandoverState.COMMITTED, HandoverState.SWITCHED,
              HandoverState.CUT)


class AckKind(enum.Enum):
    """What a participant replica acknowledges."""

    ARMED = "armed"  # installed the instruction before its position
    LATE = "late"  # could not: already at or past its position
    SWITCHED = "switched"  # upstream: rerouted at the position (operator replacement: switched function)
    CUT = "cut"  # origin: aligned and cut the final increment of exactly the moved key groups
    LOADED = "loaded"  # target: loaded the state and released the held records
    REWIRED = "rewired"  # downstream: its merge took in / let go of the joining / leaving channels


class AckOutcome(enum.Enum):
    """What the manager made of an ack."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"  # unknown or aborted handover, another epoch, or an old / fenced attempt
    UNEXPECTED = "unexpected"  # a protocol violation (kept in ``HandoverManager.violations``)
    ABORTED = "aborted"  # accepted, and the handover was aborted because of it (a LATE ack)


@dataclass(frozen=True)
class HandoverAck:
    """An acknowledgement from one replica (``attempt``: its incarnation, bumped by a restore)."""

    handover_id: int
    epoch: int
    replica: ReplicaId
    kind: AckKind
    attempt: int = 0
    digest: str = ""  # CUT: digest of the final increment (both origin replicas must agree)


@dataclass(frozen=True)
class Instruction:
    """What every participant replica of a vnode handover step gets.

    ``table`` is the routing table in force from the switch on (epoch ``epoch``);
    ``switch_at[u]`` the position at which upstream instance ``u`` switches; ``participants``
    maps a role to its instances: upstream (reroute), origin (cut; leaving partitions too),
    target (load; joining partitions too, even with nothing to load), downstream (rewire, only
    when partitions join or leave).  ``committed`` is set on the copies given to replicas
    restored after the commit."""

    handover_id: int
    task: int
    epoch: int
    table: RoutingTable
    previous_parallelism: int
    moves: tuple[VnodeMove, ...]
    switch_at: dict[PartitionId, int]
    participants: dict[str, frozenset[PartitionId]]
    committed: bool = False

    def position_for(self, instance: PartitionId) -> int:
        """The switch position of upstream ``instance``."""
        if instance not in self.switch_at:
            raise ValueError(f"instance {instance} is not an upstream of handover {self.handover_id}")
        return self.switch_at[instance]

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """The moves grouped by (origin, target)."""
        return transfers_of(self.moves)

    @property
    def joining(self) -> tuple[int, ...]:
        """Partitions whose channels open at the switch."""
        return tuple(range(self.previous_parallelism, self.table.parallelism))

    @property
    def leaving(self) -> tuple[int, ...]:
        """Partitions whose channels close at the switch."""
        return tuple(range(self.table.parallelism, self.previous_parallelism))


@dataclass(frozen=True)
class CodeInstruction:
    """What every replica of ``task`` gets to replace ``operator`` by ``version`` at
    ``switch_at[instance]`` (the element at that position is the first the new version handles)."""

    handover_id: int
    task: int
    operator: str
    version: int
    switch_at: dict[PartitionId, int]
    participants: dict[str, frozenset[PartitionId]]
    committed: bool = False

    @property
    def epoch(self) -> int:
        """Acks of an operator replacement carry the version as their epoch."""
        return self.version


@dataclass(frozen=True)
class Commit:
    """Sent to every participant once all armed: switch at the instructed positions."""

    handover_id: int
    epoch: int


@dataclass(frozen=True)
class Cancel:
    """Sent to every participant when a handover aborts: drop the instruction and go on."""

    handover_id: int
    epoch: int
    reason: str


@dataclass(frozen=True)
class Release:
    """To be placed *in-band* at the targets (LiveRobin: on a future pulse of the heartbeat log;
    KaZoo: a record of the target's order log): where they release their held records."""

    handover_id: int
    epoch: int
    targets: frozenset[PartitionId]


class JobState(enum.Enum):
    """Where a multi-step operation (a job) is."""

    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
