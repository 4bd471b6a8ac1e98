"""KaZoo's order records and what every replica does with them (DESIGN §5).

* :class:`Order`: one record of the single-partition order log, ``(epoch, seq, entries, clock)``;
  ``entries`` are runs ``(channel, count)`` ("consume the next ``count`` elements of
  ``channel``"); ``clock`` is the leader's wall clock when it wrote the record (ms; 0: none), the
  processing time of every replica from that record on.  Empty entries without a clock make an
  epoch-start (fence) record; with one, a time-only record (time passes with no input).
* :class:`OrderApplier`: every replica, the leader too, consumes its input channels only as the
  log's records say, in the log's order.  Which records count is decided from the log alone:
  a record whose epoch is below the highest epoch seen is ignored (stale leader), a record of a
  higher epoch is accepted and makes that epoch current, and within an epoch only a ``seq``
  strictly above the last accepted one is accepted (so a re-published record is harmless).

The leader's side, which writes the records, is :class:`kazoo_leader.proposer.OrderProposer`.

Where the original KaZoo (paper 004, §IV) was fragile, and what this design does instead:

* It ordered from a FIFO of local arrivals, so after a failover the new leader could order an
  element the old leader had already ordered (consumed twice) or skip one (never consumed).
  Here coverage is counted per channel from the accepted log records: once the new leader's
  fence is accepted, every later accepted record is one of its own orders until a higher epoch
  appears (and then it is deposed): older epochs are ignored from then on by everyone.  So
  ``received - covered`` is exactly what nobody ordered, and each order extends every channel's
  covered prefix without gap or overlap, whatever the leader saw arrive and when.
* It had no notion of epoch, so a leader that lost its ZooKeeper session could keep publishing
  next to its successor.  Here every record carries the leader's epoch; a stale leader's record
  is applied by all replicas if it lands before the successor's fence (the successor then counts
  it as covered) and ignored by all if it lands after.
* A deposed leader does not kill itself: its proposer turns into a follower's on seeing a
  higher epoch in the log; its applier never stops.

Epochs must be unique per leadership (issued by the election, e.g. from a ZooKeeper counter):
two leaders never share one.  No I/O, no threads, no clock: time is passed in as ``now``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

# Element kinds (first tuple field).  Only END matters here; they are the runtime's
# (replication.runtime.elements, pinned by a test): kazoo_leader does not import the runtime.
DATA = 0
WATERMARK = 1
END = 2
PULSE = 3
CLOCK = 4  # (CLOCK, t): processing time reaches t (ms), handed out on CLOCK_CHANNEL
CLOCK_CHANNEL = -1

_VERSION, _CLOCKED_VERSION = 1, 2  # (a record without a clock keeps the first format)
_HEADER = struct.Struct(">BqqI")  # version, epoch, seq, number of entries
_CLOCK = struct.Struct(">q")  # the clock of a version 2 record, after the header
_ENTRY = struct.Struct(">qI")  # channel, count


class OrderLogCorrupt(Exception):
    """An accepted order names an unknown channel or elements past a channel's END.

    The proposer never produces such an order; seeing one means the log or the runtime is broken,
    and every replica reading the same log raises at the same record.
    """


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Order:
    """One order log record: ``entries`` are runs ``(channel, count)``; ``clock`` the leader's wall
    clock (ms; 0: none); no entries and no clock: a fence."""

    epoch: int
    seq: int
    entries: tuple[tuple[int, int], ...] = ()
    offset: int = field(default=-1, compare=False)  # its position in the log (kazoo_leader.segments; -1: not read)
    clock: int = 0

    def __post_init__(self) -> None:
        if not _is_int(self.epoch) or self.epoch < 0:
            raise ValueError(f"order epoch must be an int >= 0, got {self.epoch!r}")
        if not _is_int(self.seq) or self.seq < 0:
            raise ValueError(f"order seq must be an int >= 0, got {self.seq!r}")
        if not _is_int(self.clock) or self.clock < 0:
            raise ValueError(f"order clock must be an int >= 0, got {self.clock!r}")
        entries = tuple(tuple(e) for e in self.entries)
        for e in entries:
            if len(e) != 2 or not _is_int(e[0]) or not _is_int(e[1]) or e[1] < 1:
                raise ValueError(f"order entry must be (channel, count >= 1), got {e!r}")
        object.__setattr__(self, "entries", entries)

    @property
    def key(self) -> tuple:
        """What tells this record from every other of its log (its writer's bookkeeping)."""
        return self.epoch, self.seq

    @property
    def is_fence(self) -> bool:
        """True for an epoch-start record (orders nothing, carries no time)."""
        return not self.entries and not self.clock

    @property
    def size(self) -> int:
        """Number of elements the record orders."""
        return sum(n for _, n in self.entries)

    def encode(self) -> bytes:
        """Compact binary form: a 21-byte header, the clock (8 bytes, if any) and 12 bytes per run."""
        try:
            version = _CLOCKED_VERSION if self.clock else _VERSION
            clock = _CLOCK.pack(self.clock) if self.clock else b""
            return _HEADER.pack(version, self.epoch, self.seq, len(self.entries)) + clock + b"".join(
                _ENTRY.pack(c, n) for c, n in self.entries
            )
        except struct.error as exc:
            raise ValueError(f"order {self} does not fit the record format: {exc}") from None

    @classmethod
    def decode(cls, data: bytes, offset: int = -1) -> Order:
        """Parse :meth:`encode`'s output (read at ``offset`` of the log); ValueError on anything else."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"order record must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise ValueError(f"order record too short: {len(data)} bytes, header is {_HEADER.size}")
        version, epoch, seq, n = _HEADER.unpack_from(data)
        if version not in (_VERSION, _CLOCKED_VERSION):
            raise ValueError(f"unknown order record version {version} (expected {_VERSION} or {_CLOCKED_VERSION})")
        start = _HEADER.size + (_CLOCK.size if version == _CLOCKED_VERSION else 0)
        expected = start + n * _ENTRY.size
        if len(data) != expected:
            raise ValueError(f"order record is {len(data)} bytes, {n} entries need {expected}")
        clock = _CLOCK.unpack_from(data, _HEADER.size)[0] if version == _CLOCKED_VERSION else 0
        if version == _CLOCKED_VERSION and clock <= 0:
            raise ValueError(f"malformed order record: a version {version} record needs a clock > 0, got {clock}")
        entries = tuple(_ENTRY.unpack_from(data, start + i * _ENTRY.size) for i in range(n))
        try:
            return cls(epoch, seq, entries, offset, clock)
        except ValueError as exc:
            raise ValueError(f"malformed order record: {exc}") from None


class OrderApplier:
    """Consumes the input channels in the order the accepted log records give (every replica)."""

    def __init__(self, channels: Iterable[int], checkpoint_every: int = 0,
                 checkpoint_mark: Callable[[tuple], bool] | None = None) -> None:
        self.channels: list[int] = sorted(set(channels))
        if not self.channels:
            raise ValueError("an order applier needs at least one input channel")
        # Rhino: every checkpoint_every-th accepted record, and every record holding an element
        # checkpoint_mark is true of (e.g. its record time enters a new interval: a function of the
        # applied sequence, so the same on every replica), once it and all before it are applied,
        # pull() stops there and sets checkpoint_due to the state a restore continues from
        self.checkpoint_every = checkpoint_every
        self.checkpoint_mark = checkpoint_mark if checkpoint_every else None
        self.checkpoint_due: ApplierState | None = None
        # accepted, not fully applied: [number, offset, remaining, epoch, seq, marked, clock]
        self._records: deque[list] = deque()
        self._queues: dict[int, deque[tuple]] = {c: deque() for c in self.channels}
        self._received = dict.fromkeys(self.channels, 0)
        self._covered = dict.fromkeys(self.channels, 0)
        self._applied = dict.fromkeys(self.channels, 0)
        self._end_at: dict[int, int] = {}  # channel -> number of elements including its END
        self._ended: set[int] = set()  # channels whose END was applied
        self._runs: deque[list[int]] = deque()  # [channel, remaining] of accepted orders, log order
        self.epoch: int | None = None  # highest (= current) epoch seen in the log
        self.last_seq = -1  # seq of the last accepted record
        self.accepted = 0
        self.ignored = 0

    # -- input ---------------------------------------------------------------------------
    def push(self, channel: int, elements: Sequence[tuple]) -> None:
        """Elements of ``channel`` in its FIFO order (already deduplicated)."""
        if channel not in self._queues:
            raise KeyError(f"channel {channel} is not an input of this applier")
        if not elements:
            return
        if channel in self._end_at:
            raise ValueError(f"channel {channel} got elements after its END")
        for i, element in enumerate(elements):
            if element[0] == END:
                if i != len(elements) - 1:
                    raise ValueError(f"channel {channel} got elements after its END")
                end_at = self._received[channel] + len(elements)
                if self._covered[channel] > end_at:
                    raise OrderLogCorrupt(
                        f"orders cover {self._covered[channel]} elements of channel {channel}, "
                        f"which ends after {end_at}"
                    )
                self._end_at[channel] = end_at
        self._queues[channel].extend(elements)
        self._received[channel] += len(elements)

    def on_record(self, order: Order) -> bool:
        """The order log's next record; returns whether it was accepted."""
        if self.epoch is not None and order.epoch < self.epoch:
            self.ignored += 1  # a stale leader's record
            return False
        if order.epoch == self.epoch and order.seq <= self.last_seq:
            self.ignored += 1  # a duplicate (re-published) or out-of-sequence record
            return False
        self._check(order)
        self.epoch = order.epoch
        self.last_seq = order.seq
        self.accepted += 1
        self._records.append([self.accepted, order.offset, order.size, order.epoch, order.seq, False, order.clock])
        for channel, count in order.entries:
            self._covered[channel] += count
            if self._runs and self._runs[-1][0] == channel:
                self._runs[-1][1] += count
            else:
                self._runs.append([channel, count])
        return True

    def _check(self, order: Order) -> None:
        extra: dict[int, int] = {}
        for channel, count in order.entries:
            if channel not in self._covered:
                raise OrderLogCorrupt(f"order {order.epoch}/{order.seq} names unknown channel {channel}")
            extra[channel] = extra.get(channel, 0) + count
        for channel, count in extra.items():
            end_at = self._end_at.get(channel)
            if end_at is not None and self._covered[channel] + count > end_at:
                raise OrderLogCorrupt(
                    f"order {order.epoch}/{order.seq} names elements of channel {channel} past its END "
                    f"(covered {self._covered[channel]} + {count} > {end_at})"
                )

    # -- output --------------------------------------------------------------------------
    def pull(self, limit: int | None = None) -> list[tuple[int, tuple]]:
        """Every ``(channel, element)`` consumable now by the accepted orders (at most ``limit``);
        a record's clock comes first, as ``(CLOCK_CHANNEL, (CLOCK, t))``."""
        out: list[tuple[int, tuple]] = []
        runs = self._runs
        if self.checkpoint_due is not None:
            return out  # the runtime takes the checkpoint before anything else is consumed
        if self._records and self._complete_records(out):
            return out
        while runs and (limit is None or len(out) < limit):
            run = runs[0]
            channel = run[0]
            queue = self._queues[channel]
            take = min(run[1], len(queue))
            if limit is not None:
                take = min(take, limit - len(out))
            take = min(take, self._records[0][2])  # a merged run may span records: stop at the head's end
            if take == 0:
                break  # blocked on this channel
            mark = self.checkpoint_mark
            for _ in range(take):
                element = queue.popleft()
                if element[0] == END:
                    self._ended.add(channel)
                elif mark is not None and mark(element):
                    self._records[0][5] = True
                out.append((channel, element))
            self._applied[channel] += take
            run[1] -= take
            if run[1] == 0:
                runs.popleft()
            self._records[0][2] -= take
            if self._complete_records(out):
                break
        return out

    def _complete_records(self, out: list[tuple[int, tuple]]) -> bool:
        """Hand out the head record's clock, and pop the fully applied records in order; True if
        one of them is a checkpoint position (the next record's clock comes after it)."""
        records = self._records
        while records:
            head = records[0]
            if head[6]:
                out.append((CLOCK_CHANNEL, (CLOCK, head[6])))
                head[6] = 0
            if head[2]:
                return False
            number, offset, _, epoch, seq, marked, _ = records.popleft()
            if marked or (self.checkpoint_every and number % self.checkpoint_every == 0):
                self.checkpoint_due = ApplierState(number, offset, epoch, seq, dict(self._applied),
                                                   sorted(self._ended))
                return True
        return False

    def start_state(self, log_start: int) -> ApplierState:
        """The state before any record was applied (a replica's first checkpoint, at its start): a
        restore from it reads the log from position ``log_start``."""
        return ApplierState(0, log_start - 1, self.epoch, self.last_seq, dict(self._applied), sorted(self._ended))

    def take_checkpoint(self) -> ApplierState:
        """The due checkpoint's state (the runtime took it); consumption goes on."""
        state, self.checkpoint_due = self.checkpoint_due, None
        assert state is not None
        return state

    def restore(self, state: ApplierState) -> None:
        """Continue after ``state``'s record: the log is read again from the next offset and the
        channels are replayed from ``state.applied``."""
        self.epoch, self.last_seq, self.accepted = state.epoch, state.seq, state.number
        for c in self.channels:
            self._received[c] = self._covered[c] = self._applied[c] = state.applied.get(c, 0)
            self._queues[c].clear()
        self._ended = set(state.ended)
        self._end_at = {c: self._applied[c] for c in self._ended}
        self._runs.clear()
        self._records.clear()
        self.checkpoint_due = None

    @property
    def blocked_on(self) -> int | None:
        """The channel whose next element the current order waits for, else None."""
        if self._runs and not self._queues[self._runs[0][0]]:
            return self._runs[0][0]
        return None

    @property
    def finished(self) -> bool:
        """Every channel delivered its END through an applied order."""
        return len(self._ended) == len(self.channels)

    @property
    def received(self) -> dict[int, int]:
        """Per channel, elements pushed so far."""
        return dict(self._received)

    @property
    def covered(self) -> dict[int, int]:
        """Per channel, elements named by all accepted orders (applied or not)."""
        return dict(self._covered)

    @property
    def applied(self) -> dict[int, int]:
        """Per channel, elements consumed through orders."""
        return dict(self._applied)

    @property
    def backlog(self) -> int:
        """Elements covered by accepted orders and not yet consumed."""
        return sum(n for _, n in self._runs)

    # cheap per-channel reads for the proposer (no dict copies)
    def _received_of(self, channel: int) -> int:
        return self._received[channel]

    def _covered_of(self, channel: int) -> int:
        return self._covered[channel]


@dataclass(frozen=True)
class ApplierState:
    """Where a Rhino checkpoint of an ordered partition stands: right after the ``number``-th
    accepted record (at position ``offset`` of the order log, with ``epoch``/``seq``) was fully applied."""

    number: int
    offset: int
    epoch: int | None  # None: no record accepted yet
    seq: int
    applied: dict[int, int]
    ended: list[int]
