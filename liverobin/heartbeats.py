"""The heartbeat log and deterministic pulse placement at replicated sources (pure).

LiveRobin needs pulse ``h`` at the *same position* of both replicas of a source partition,
although the two replicas read Kafka at their own pace.  The position comes from a log that
both read (DESIGN §5): a generator appends :class:`PulseRecord` ``(h, {topic: {partition:
offset}})`` to a single-partition heartbeat topic, and a source replica emits pulse ``h`` right
after its record at ``offset - 1`` (before the record at ``offset``).

:class:`PulseLog` says which records count, from the log alone, so every reader agrees:

* the first record of each ``h`` wins: a record counts only if its ``h`` exceeds every counted
  one (several generators may run; a late or duplicate record is ignored by everybody);
* offsets never go back: a record's offset is raised to the previous pulse's (a lagging
  generator cannot reorder pulses and records), and a partition it omits keeps its offset;
* a *final* record ends the log: sources emit it, then end (a graceful drain at a position
  both replicas agree on, whatever their timing).

KaZoo mode has pulses only inside *windows* (a handover switches at a pulse, and the rest of the
time KaZoo sources must not wait for pulses): :mod:`liverobin.windows` is a source replica's side.
The driver opens window ``w``; each source replica starts holding its records as LiveRobin does
and reports its position; only once every replica holds does a generator write pulses tagged
``w``, at offsets no lower than those positions (``floor``), and it ends the window with a pulse
marked *last*.  A replica places the pulses of its window up to that last one, then emits its
records freely again.  Which pulses a replica places is decided by the log and the window id.

:class:`PulsePlacer` is one source replica's side: it holds back a record until a counted
pulse lies beyond it (only then is it known that no pulse comes first), so the output order
of records and pulses is a function of the log and the partition, nothing else.  The price is
latency: a record waits for the next pulse (about half a period plus a log round trip).

:func:`next_pulse` is the generator's rule: the next ``h`` after the largest in the log (a
restarted generator never starts over), offsets at the partitions' ends but at most
``max_step`` records past the previous pulse, so that a backlog is cut into bounded cycles.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Offsets = Mapping[str, Mapping[int, int]]  # topic -> partition -> offset


@dataclass(frozen=True)
class PulseRecord:
    """One heartbeat-log record: pulse ``h`` goes before the record at each offset."""

    h: int
    offsets: Offsets
    final: bool = False
    generator: str = ""  # who wrote it (diagnostics only; never affects placement)
    window: int = 0  # KaZoo: the pulse window it belongs to (0: LiveRobin, no windows)
    last: bool = False  # KaZoo: the last pulse of its window
    at: int = field(default=-1, compare=False)  # the heartbeat-log offset it was read at (not written)
    # the generator's wall clock when it wrote it (ms; 0: not stamped): processing time, the same
    # for every reader of the log
    t: int = field(default=0, compare=False)

    def encode(self) -> bytes:
        body: dict[str, Any] = {"h": self.h, "o": {t: {str(k): o for k, o in parts.items()}
                                                    for t, parts in self.offsets.items()}}
        if self.final:
            body["final"] = True
        if self.generator:
            body["g"] = self.generator
        if self.window:
            body["w"] = self.window
        if self.last:
            body["last"] = True
        if self.t:
            body["t"] = self.t
        return json.dumps(body, separators=(",", ":")).encode()

    @staticmethod
    def decode(raw: bytes | None, at: int = -1) -> PulseRecord:
        try:
            body = json.loads(raw or b"")
            h = body["h"]
            offsets = {str(t): {int(k): int(o) for k, o in parts.items()} for t, parts in body["o"].items()}
            if not isinstance(h, int) or h < 1:
                raise ValueError(f"h must be a positive integer, got {h!r}")
            return PulseRecord(h, offsets, bool(body.get("final", False)), str(body.get("g", "")),
                               int(body.get("w", 0)), bool(body.get("last", False)), at, int(body.get("t", 0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed heartbeat record {(raw or b'')[:80]!r}: {exc}") from exc


class PulseLog:
    """The counted pulses of a heartbeat log, fed its records in log order."""

    def __init__(self) -> None:
        self.last_h = 0
        self.offsets: dict[str, dict[int, int]] = {}
        self.final = False
        self.ignored = 0

    @classmethod
    def after(cls, counted: PulseRecord) -> PulseLog:
        """The log as counted up to and including ``counted`` (a record :meth:`accept` returned):
        fed the records after ``counted.at``, it counts the same pulses as one fed from the start."""
        log = cls()
        log.last_h, log.final = counted.h, counted.final
        log.offsets = {t: dict(parts) for t, parts in counted.offsets.items()}
        return log

    def accept(self, record: PulseRecord) -> PulseRecord | None:
        """The record as it counts (offsets raised to the previous pulse's), or None if it does not."""
        if self.final or record.h <= self.last_h:
            self.ignored += 1
            return None
        merged = {t: dict(parts) for t, parts in self.offsets.items()}
        for topic, parts in record.offsets.items():
            known = merged.setdefault(topic, {})
            for k, off in parts.items():
                known[k] = max(off, known.get(k, off))
        self.last_h, self.offsets, self.final = record.h, merged, record.final
        return PulseRecord(record.h, {t: dict(p) for t, p in merged.items()}, record.final, record.generator,
                           record.window, record.last, record.at, record.t)


def next_pulse(log: PulseLog, ends: Offsets, max_step: int, *, starts: Offsets | None = None,
               final: bool = False, generator: str = "", floor: Offsets | None = None, window: int = 0,
               last: bool = False, now_ms: int = 0) -> tuple[PulseRecord, bool]:
    """The generator's next record after what ``log`` has counted, and whether it is still behind
    ``ends`` (then the next one is due at once).  ``starts``: where the sources begin, for
    partitions no pulse has named yet.  A final record is only made once caught up.  ``floor``
    (KaZoo windows): no offset below it, whatever the log's last pulse (the sources emitted
    everything below it before they started holding).  ``now_ms``: the generator's clock, stamped
    into the record (its readers' processing time)."""
    behind = False
    offsets: dict[str, dict[int, int]] = {}
    for topic, parts in ends.items():
        prev = {**(starts or {}).get(topic, {}), **log.offsets.get(topic, {})}
        for k, low in (floor or {}).get(topic, {}).items():
            prev[k] = max(prev.get(k, low), low)
        out = offsets[topic] = {}
        for k, end in parts.items():
            if k not in prev:
                out[k] = end
                continue
            target = max(prev[k], end)
            if target - prev[k] > max_step:
                target = prev[k] + max_step
                behind = True
            out[k] = target
    return PulseRecord(log.last_h + 1, offsets, final and not behind, generator, window, last, t=now_ms), behind


PULSE_ITEM = "pulse"
RECORD_ITEM = "record"


@dataclass
class PulsePlacer:
    """Orders the records of one source partition and the counted pulses of the log.

    ``fetched_to``: every record below this offset has been added (records are added in
    offset order; :meth:`fetched` also moves it, e.g. past transaction markers or to the low
    watermark of an empty partition).
    """

    topic: str
    partition: int
    fetched_to: int = 0
    _pulses: deque[tuple[int, PulseRecord]] = field(default_factory=deque)  # (offset, counted record)
    _records: deque[tuple[int, Any]] = field(default_factory=deque)  # (offset, item)
    ended: bool = False
    last_placed: PulseRecord | None = None  # the counted record of the last pulse taken

    def add_pulse(self, record: PulseRecord) -> None:
        """A counted record (from :meth:`PulseLog.accept`)."""
        off = record.offsets.get(self.topic, {}).get(self.partition)
        if off is None:
            off = self._pulses[-1][0] if self._pulses else 0
        self._pulses.append((off, record))

    def add_record(self, offset: int, item: Any) -> None:
        self._records.append((offset, item))
        self.fetched(offset + 1)

    def fetched(self, position: int) -> None:
        if position > self.fetched_to:
            self.fetched_to = position

    def release_records(self) -> list[Any]:
        """Every record held, in offset order, and no more holding of them (a KaZoo source
        leaving a pulse window after its last pulse: no pulse comes before them)."""
        items = [item for _, item in self._records]
        self._records.clear()
        return items

    @property
    def held(self) -> int:
        """Records waiting for a pulse beyond them."""
        return len(self._records)

    @property
    def needs_records(self) -> bool:
        """The next pulse is known and waits for records below its offset still to be fetched."""
        if not self._pulses or self.ended:
            return False
        return not self._records and self.fetched_to < self._pulses[0][0]

    def take(self) -> Iterable[tuple[str, Any]]:
        """What can be emitted now, in order: ``("record", item)`` and ``("pulse", (h, final, t))``
        (``t``: the pulse's processing time); nothing after a final pulse."""
        pulses, records = self._pulses, self._records
        while pulses and not self.ended:
            off, record = pulses[0]
            if records and records[0][0] < off:
                yield RECORD_ITEM, records.popleft()[1]
            elif records or self.fetched_to >= off:
                pulses.popleft()
                self.ended = record.final
                self.last_placed = record
                yield PULSE_ITEM, (record.h, record.final, record.t)
            else:
                return  # records below the pulse's offset are still to be fetched
