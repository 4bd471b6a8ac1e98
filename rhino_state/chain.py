"""Chain replication of checkpoint increments (Rhino §4.2.2, DESIGN §6), as pure state machines.

No I/O, threads or clocks here: the machines are fed events and return what to do
(:mod:`rhino_state.transfer` is the gRPC edge that executes it).

* :class:`ChainOrigin` runs at the owner of an instance's primary copy.  It queues the
  instance's increments, hands out the ones the flow-control window admits to the chain
  head, and completes checkpoints when the chain's *tail* acks them.  Completing
  checkpoint ``k`` completes every earlier one, because every member stores increments in
  order (a delta is only stored on top of its ``previous_id``).
* :class:`ChainMember` runs on every worker that holds secondary copies: it stores an
  increment once, then forwards it to its successor or, at the tail, acks it to the origin.

Chains are written ``[origin, member 1, ..., member r]``; a member at ``position`` forwards to
``chain[position + 1]``; the tail acks to ``chain[0]``.

Delivery model: the origin sends an instance's increments to the head one at a time, in
order; a member forwards them in the order it stored them.  A failure of checkpoint ``k``
(the send to the head failed, a member rejected it, an ack timed out) puts ``k`` and every
later in-flight increment back in the queue (go-back-N); members drop the duplicates this
causes without storing them twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rhino_state.increments import IncrementMeta
from transport.ids import PartitionId

__all__ = [
    "Ack",
    "ChainMember",
    "ChainOrigin",
    "Forward",
    "Outcome",
    "Reject",
    "Send",
    "Store",
    "increment_size",
]

DEFAULT_MAX_BYTES_IN_FLIGHT = 64 * 1024 * 1024
OVERFLOW_FACTOR = 16  # deltas held past max_pending, at most this many times it (see ChainOrigin)


def increment_size(meta: IncrementMeta) -> int:
    """Bytes an increment puts on the wire (flow-control weight): payload plus runtime state."""
    return meta.bytes_shipped + len(meta.runtime)


# -- origin ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Ship ``meta`` (payload ``payload_ref``) to ``to``, the head of the chain ``group``."""

    instance: PartitionId
    meta: IncrementMeta
    payload_ref: Any
    to: str
    group: tuple[str, ...]

    @property
    def checkpoint_id(self) -> int:
        return self.meta.checkpoint_id


@dataclass(frozen=True)
class Outcome:
    """What an event did at the origin.

    ``accepted`` is False when the event was refused or ignored (``reason`` says why);
    ``completed`` lists newly completed checkpoints in order; ``released`` lists payload refs
    the origin no longer needs (completed, dropped or refused): the caller deletes them.
    """

    accepted: bool = True
    completed: tuple[IncrementMeta, ...] = ()
    released: tuple[Any, ...] = ()
    reason: str = ""


@dataclass
class _Entry:
    meta: IncrementMeta
    ref: Any
    in_flight: bool = False


class ChainOrigin:
    """The origin side of one instance's replica chain.

    ``group`` is the replica group in chain order (member ids; the transfer layer uses
    addresses).  At most ``max_in_flight`` increments and ``max_bytes_in_flight`` bytes are
    sent but not yet acked by the tail (one increment is always admitted when nothing is in
    flight, however big).  ``max_pending`` bounds the increments held (queued + in flight),
    which bounds the origin's disk use when the chain stalls or the group is empty: on
    overflow everything before the newest full snapshot is dropped; failing that, deltas are
    kept while they add up to less than the last full snapshot offered (sending them is still
    cheaper than a new full one), up to ``OVERFLOW_FACTOR`` times ``max_pending``; beyond that
    everything is dropped and :attr:`needs_full` is raised (a delta queue with a hole is
    useless; the owner's next full snapshot restarts the chain).

    Group changes (:meth:`set_group`): a member that was not in the previous non-empty group
    holds nothing, so every increment not completed is dropped and the origin refuses deltas
    (:attr:`needs_full`) until a full snapshot is offered.  A group that only shrank or was
    reordered keeps its increments and resends the in-flight ones along the new chain.  An
    empty group means nothing can be sent or completed (:attr:`can_complete` is False);
    increments stay queued, bounded by ``max_pending``, and resume if the same members come back.

    Restarting from a known state: pass ``completed_id`` (the checkpoint the group is known to
    hold) and the origin accepts a delta on top of it first.
    """

    def __init__(
        self,
        instance: PartitionId,
        group: Sequence[str],
        max_in_flight: int = 2,
        max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT,
        *,
        max_pending: int = 16,
        completed_id: int | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if max_bytes_in_flight < 1:
            raise ValueError(f"max_bytes_in_flight must be >= 1, got {max_bytes_in_flight}")
        if max_pending < max_in_flight:
            raise ValueError(f"max_pending ({max_pending}) must be >= max_in_flight ({max_in_flight})")
        self.instance = instance
        self.max_in_flight = max_in_flight
        self.max_bytes_in_flight = max_bytes_in_flight
        self.max_pending = max_pending
        self._group = _check_group(group)
        self._holders = frozenset(self._group)  # the last non-empty group: who holds the chain so far
        self._pending: list[_Entry] = []  # in offer order: in-flight entries first, then queued ones
        self._completed_id = completed_id
        self._last_offered = completed_id
        self._needs_full = completed_id is None
        self._full_bytes: int | None = None  # the size of the last full snapshot offered
        self.last_failure: str | None = None

    # -- properties ------------------------------------------------------------------------
    @property
    def group(self) -> tuple[str, ...]:
        return self._group

    @property
    def completed_id(self) -> int | None:
        """The latest checkpoint the whole group acknowledged (None: none yet)."""
        return self._completed_id

    @property
    def needs_full(self) -> bool:
        """True until a full snapshot is offered: deltas are refused meanwhile."""
        return self._needs_full

    @property
    def can_complete(self) -> bool:
        """False while the group is empty: increments queue up but nothing completes."""
        return bool(self._group)

    @property
    def in_flight(self) -> int:
        return sum(1 for e in self._pending if e.in_flight)

    @property
    def queued(self) -> int:
        return sum(1 for e in self._pending if not e.in_flight)

    @property
    def bytes_in_flight(self) -> int:
        return sum(increment_size(e.meta) for e in self._pending if e.in_flight)

    @property
    def in_flight_ids(self) -> tuple[int, ...]:
        return tuple(e.meta.checkpoint_id for e in self._pending if e.in_flight)

    @property
    def pending(self) -> tuple[IncrementMeta, ...]:
        """Increments held and not completed (in flight and queued), oldest first."""
        return tuple(e.meta for e in self._pending)

    # -- events ----------------------------------------------------------------------------
    def offer(self, meta: IncrementMeta, payload_ref: Any) -> Outcome:
        """Queue a new increment.  Refused (and released) when it is a delta while :attr:`needs_full`,
        or when it overflows ``max_pending`` with no full snapshot to keep (see the class docstring).

        Raises ValueError for increments of another instance, ids that do not increase, or a
        delta whose ``previous_id`` is not the previously offered checkpoint.
        """
        if meta.instance != self.instance:
            raise ValueError(f"increment of {meta.instance} offered to the chain of {self.instance}")
        if self._last_offered is not None and meta.checkpoint_id <= self._last_offered:
            raise ValueError(f"checkpoint ids must increase: {meta.checkpoint_id} after {self._last_offered}")
        if not meta.full and self._needs_full:
            return Outcome(accepted=False, released=(payload_ref,),
                           reason="the replica group needs a full snapshot first")
        if not meta.full and meta.previous_id != self._last_offered:
            raise ValueError(f"delta {meta.checkpoint_id} applies to {meta.previous_id}, "
                             f"but the last offered checkpoint is {self._last_offered}")
        self._last_offered = meta.checkpoint_id
        self._pending.append(_Entry(meta, payload_ref))
        if meta.full:
            self._needs_full = False
            self._full_bytes = increment_size(meta)
        if len(self._pending) <= self.max_pending:
            return Outcome()
        return self._overflow()

    def _overflow(self) -> Outcome:
        fulls = [i for i, e in enumerate(self._pending) if e.meta.full]
        superseded: tuple[Any, ...] = ()
        if fulls and fulls[-1] > 0:
            dropped, self._pending = self._pending[:fulls[-1]], self._pending[fulls[-1]:]
            superseded = tuple(e.ref for e in dropped)
        deltas = [e for e in self._pending if not e.meta.full]
        if len(self._pending) <= self.max_pending or (
                self._full_bytes is not None and len(self._pending) <= OVERFLOW_FACTOR * self.max_pending
                and sum(increment_size(e.meta) for e in deltas) < self._full_bytes):
            reason = f"queue over {self.max_pending}: dropped what the newest full snapshot supersedes" \
                if superseded else ""  # (or kept deltas still smaller than a full snapshot)
            return Outcome(released=superseded, reason=reason)
        released = superseded + self._drop_all()  # including the increment just offered
        return Outcome(accepted=False, released=released,
                       reason=f"queue over {self.max_pending}: dropped all, needs a full snapshot")

    def sendable(self) -> list[Send]:
        """Queued increments the window admits now, in order (send them in this order)."""
        if not self._group:
            return []
        count, size, out = self.in_flight, self.bytes_in_flight, []
        for e in self._pending:
            if e.in_flight:
                continue
            weight = increment_size(e.meta)
            if count >= self.max_in_flight or (count and size + weight > self.max_bytes_in_flight):
                break
            out.append(Send(self.instance, e.meta, e.ref, self._group[0], self._group))
            count, size = count + 1, size + weight
        return out

    def on_sent(self, checkpoint_id: int) -> Outcome:
        """The transfer of ``checkpoint_id`` to the head started: it is in flight until acked or failed.

        Must be the first queued increment (sends go in order); unknown ids (dropped meanwhile)
        and ones already in flight are ignored.
        """
        entry = self._find(checkpoint_id)
        if entry is None or entry.in_flight:
            return Outcome(accepted=False, reason="not queued")
        sendable = self.sendable()
        if not sendable or sendable[0].checkpoint_id != checkpoint_id:
            raise ValueError(f"checkpoint {checkpoint_id} is not the next sendable increment")
        entry.in_flight = True
        return Outcome()

    def on_ack(self, checkpoint_id: int, from_member: str) -> Outcome:
        """An ack from ``from_member``: completes ``checkpoint_id`` and everything before it if the
        sender is the current tail and the increment is still held; otherwise ignored."""
        if not self._group or from_member != self._group[-1]:
            return Outcome(accepted=False, reason=f"ack from {from_member}, which is not the tail")
        index = self._index(checkpoint_id)
        if index is None:
            return Outcome(accepted=False, reason=f"ack of checkpoint {checkpoint_id}, which is not pending")
        done, self._pending = self._pending[:index + 1], self._pending[index + 1:]
        self._completed_id = checkpoint_id
        return Outcome(completed=tuple(e.meta for e in done), released=tuple(e.ref for e in done))

    def on_failure(self, checkpoint_id: int, reason: str, *, missing_base: bool = False) -> Outcome:
        """Sending ``checkpoint_id`` failed: it and every later in-flight increment go back to the queue.

        ``missing_base``: a member has no base for deltas (it lost its copy), so everything
        pending is dropped and a full snapshot is needed.  Ignored for ids not in flight.
        """
        entry = self._find(checkpoint_id)
        if entry is None or not entry.in_flight:
            return Outcome(accepted=False, reason=f"checkpoint {checkpoint_id} is not in flight")
        self.last_failure = f"checkpoint {checkpoint_id}: {reason}"
        if missing_base:
            return Outcome(released=self._drop_all(), reason=f"{reason}: needs a full snapshot")
        index = self._pending.index(entry)
        for e in self._pending[index:]:
            e.in_flight = False
        return Outcome(reason=reason)

    def set_group(self, group: Sequence[str]) -> Outcome:
        """Replace the replica group (chain order).  See the class docstring for what is kept."""
        new = _check_group(group)
        if new == self._group:
            return Outcome(accepted=False, reason="same group")
        self._group = new
        if not new:
            for e in self._pending:
                e.in_flight = False
            return Outcome(reason="empty replica group: checkpoints cannot complete")
        fresh = [m for m in new if m not in self._holders]
        self._holders = frozenset(new)
        if fresh:
            return Outcome(released=self._drop_all(),
                           reason=f"new members {fresh} hold nothing: needs a full snapshot")
        for e in self._pending:  # the path changed: resend what was in flight along the new chain
            e.in_flight = False
        return Outcome(reason="group shrank or was reordered")

    def abandon(self) -> Outcome:
        """Drop everything pending (the instance stops being replicated from here)."""
        return Outcome(released=self._drop_all(), reason="abandoned")

    # -- helpers ---------------------------------------------------------------------------
    def _drop_all(self) -> tuple[Any, ...]:
        dropped, self._pending = self._pending, []
        self._needs_full = True
        return tuple(e.ref for e in dropped)

    def _index(self, checkpoint_id: int) -> int | None:
        for i, e in enumerate(self._pending):
            if e.meta.checkpoint_id == checkpoint_id:
                return i
        return None

    def _find(self, checkpoint_id: int) -> _Entry | None:
        index = self._index(checkpoint_id)
        return None if index is None else self._pending[index]


def _check_group(group: Sequence[str]) -> tuple[str, ...]:
    members = tuple(group)
    if len(set(members)) != len(members):
        raise ValueError(f"a replica group lists a member twice: {list(members)}")
    return members


# -- member ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    """Store the increment locally; report the result with ``on_stored`` / ``on_store_failed``."""

    meta: IncrementMeta


@dataclass(frozen=True)
class Forward:
    """Send the increment to ``to``, which sits at ``position`` of ``chain``."""

    to: str
    meta: IncrementMeta
    chain: tuple[str, ...]
    position: int


@dataclass(frozen=True)
class Ack:
    """Tell the origin ``to`` that the whole chain stored ``checkpoint_id``."""

    to: str
    instance: PartitionId
    checkpoint_id: int
    from_member: str


@dataclass(frozen=True)
class Reject:
    """Refuse the increment; the sender retries.  ``missing_base``: this member holds nothing
    for the instance, so only a full snapshot can help."""

    reason: str
    missing_base: bool = False


MemberAction = Store | Forward | Ack | Reject


class ChainMember:
    """One worker's side of every chain it belongs to.

    Two steps per increment: :meth:`on_increment` answers ``[Store]`` for a new increment, and
    only :meth:`on_stored` (the store succeeded) emits the ``Forward`` / ``Ack``, so an ack never
    precedes durable storage and a retry arriving while the first copy is still being stored
    is rejected ("busy") rather than forwarded ahead of it.  A duplicate (an id at or below the
    last stored one, e.g. a go-back-N resend) is not stored again but forwarded / acked at once:
    the member holds that checkpoint, or a later full snapshot that supersedes it.
    A delta that does not apply to the last stored checkpoint is rejected.

    ``stored`` seeds the last stored checkpoint per instance (e.g. from a replica store on disk).
    """

    def __init__(self, self_id: str, stored: Mapping[PartitionId, int] | None = None) -> None:
        self.self_id = self_id
        self._last: dict[PartitionId, int] = dict(stored or {})
        self._storing: dict[PartitionId, int] = {}

    def last_stored(self, instance: PartitionId) -> int | None:
        return self._last.get(instance)

    def on_increment(self, meta: IncrementMeta, chain: Sequence[str], position: int) -> list[MemberAction]:
        """An increment arrived for ``chain[position]`` (this member)."""
        chain = tuple(chain)
        if not 1 <= position < len(chain) or chain[position] != self.self_id:
            return [Reject(f"{self.self_id} is not at position {position} of chain {list(chain)}")]
        instance, cid = meta.instance, meta.checkpoint_id
        if instance in self._storing:
            return [Reject(f"busy: still storing checkpoint {self._storing[instance]} of {instance}")]
        last = self._last.get(instance)
        if last is not None and cid <= last:
            return [self._next_hop(meta, chain, position)]
        if not meta.full and meta.previous_id != last:
            return [Reject(f"delta {cid} of {instance} applies to {meta.previous_id}, but {self.self_id} "
                           f"holds {last}", missing_base=last is None)]
        self._storing[instance] = cid
        return [Store(meta)]

    def on_stored(self, meta: IncrementMeta, chain: Sequence[str], position: int) -> list[MemberAction]:
        """The store of ``meta`` succeeded: forward it, or ack it at the tail."""
        self._finish(meta)
        self._last[meta.instance] = meta.checkpoint_id
        return [self._next_hop(meta, tuple(chain), position)]

    def on_store_failed(self, meta: IncrementMeta, reason: str) -> list[MemberAction]:
        """The store of ``meta`` failed: nothing was stored; the sender will retry."""
        self._finish(meta)
        return [Reject(f"store of checkpoint {meta.checkpoint_id} failed: {reason}")]

    def _finish(self, meta: IncrementMeta) -> None:
        if self._storing.get(meta.instance) != meta.checkpoint_id:
            raise ValueError(f"checkpoint {meta.checkpoint_id} of {meta.instance} is not being stored")
        del self._storing[meta.instance]

    def _next_hop(self, meta: IncrementMeta, chain: tuple[str, ...], position: int) -> Forward | Ack:
        if position + 1 < len(chain):
            return Forward(chain[position + 1], meta, chain, position + 1)
        return Ack(chain[0], meta.instance, meta.checkpoint_id, self.self_id)
