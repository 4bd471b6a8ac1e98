"""What the driver learns of each handover step's timing: the timeline its participants report
(:class:`StepTimes`), the step's phases (:func:`step_phases`), and the release margin a task's
steps learn from them (:class:`ReleaseMargin`, docs/handover.md).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from transport.ids import PartitionId

# The release margin of a task's first step, before any step taught it (:class:`ReleaseMargin`).
DEFAULT_RELEASE_S = 0.15


class ReleaseMargin:
    """How long after the switch pulse a task's targets release (the margin of ``R = P + k``),
    learnt from its steps so far.

    The moved keys' records wait from the switch to the release, so the margin is latency for
    them; a target that reaches the release before its state stalls there with every key until
    the state is in.  What a step needs is the time from the switch until every cut is at the
    targets (alignment, cut, transfer), modelled as ``fixed + bytes / rate``.  The margin is
    ``safety`` times the prediction plus one pulse; ``fixed`` is the (lower) median of the recent steps'
    residues, ``bytes`` the step's planned bytes or, unknown, its vnodes times the largest recent
    bytes per vnode.  Before any step: ``default_s``.

    The median, not the largest: as long as a step moves more than a hundredth of the records, a
    second's p99 is the moved keys' wait whether they wait for the margin or the target stalls
    until its state is in, so a margin set by one slow step would cost every later step of the
    history that wait for nothing.  (With the largest, one step of the KaZoo rescale benchmark
    whose alignment took 1.2 s set the next four margins to 1.9 s: held 2 s each, the rescale
    twice as long as the one before it.)"""

    def __init__(self, period_s: float, default_s: float = DEFAULT_RELEASE_S, safety: float = 1.5,
                 rate_bytes_per_s: float = 50e6, history: int = 8, max_s: float = 5.0) -> None:
        self.period_s, self.default_s, self.safety = period_s, default_s, safety
        self.rate, self.max_s = rate_bytes_per_s, max_s
        self._seen: deque[tuple[int, int, float]] = deque(maxlen=history)  # (vnodes, bytes, need s)

    def observe(self, vnodes: int, moved_bytes: int, need_s: float) -> None:
        """A completed step of ``vnodes`` moved ``moved_bytes``; its cuts were at the targets
        ``need_s`` after the switch."""
        if vnodes > 0 and need_s >= 0:
            self._seen.append((vnodes, moved_bytes, need_s))

    def margin_s(self, vnodes: int, planned_bytes: int | None = None) -> float:
        """The margin for a step of ``vnodes`` (``planned_bytes`` of state, if measured)."""
        if not self._seen:
            return self.default_s
        fixed = max(self.period_s, statistics.median_low(need - b / self.rate for _, b, need in self._seen))
        size = planned_bytes if planned_bytes is not None else vnodes * max(b / v for v, b, _ in self._seen)
        return min(self.max_s, max(2 * self.period_s, self.safety * (fixed + size / self.rate) + self.period_s))


class StepTimes:
    """Per handover: what happened, at which participant, when (wall clock; the first replica's)
    or how much (bytes cut, shipped, read from a store; records held), as the participants' acks
    say; kept for the last :data:`TIMELINES` handovers."""

    def __init__(self) -> None:
        self._times: dict[int, dict[str, dict[PartitionId, float]]] = {}

    def note(self, hid: int, kind: str, inst: PartitionId, times: Mapping[str, Any]) -> None:
        """Keep the earliest replica's time of each thing ``inst`` did (the first copy is what its
        downstreams take) and the amounts (the most one replica reported)."""
        if hid not in self._times:
            self._times[hid] = {}
            for old in sorted(self._times)[:-TIMELINES]:
                del self._times[old]
        mine = self._times[hid]
        for name, value in times.items():
            if not isinstance(value, (int, float)):
                continue
            what = _ACTION_TIME[kind] if name == "at" else name
            seen = mine.setdefault(what, {})
            seen[inst] = max(seen.get(inst, value), value) if what in _AMOUNTS else min(seen.get(inst, value), value)

    def stamp(self, hid: int, what: str, now: float) -> None:
        """What the driver itself saw happen to ``hid`` (committed, completed) at ``now``."""
        self._times.setdefault(hid, {}).setdefault(what, {})[(-1, -1)] = now

    def timeline(self, hid: int) -> dict[str, float | None]:
        """Wall-clock times of a step, each when the *last* participant of its role had done it
        (through its first replica): ``committed`` and ``completed`` (the driver learnt it),
        ``switched`` (upstreams rerouted at the switch pulse), ``cut`` (origins cut), ``arrived``
        (every cut reached a target), ``release`` (targets reached the release pulse), ``loaded``,
        ``caught_up`` (targets processed the records they held); None: not (yet) known."""
        mine = self._times.get(hid, {})
        return {name: max(mine[name].values()) if mine.get(name) else None for name in TIMELINE}

    def _total(self, hid: int, what: str) -> int:
        return int(sum(self._times.get(hid, {}).get(what, {}).values()))

    def moved_bytes(self, hid: int) -> int:
        """Key + value bytes the origins of ``hid`` cut (one replica of each origin counted)."""
        return self._total(hid, "bytes")

    def shipped_bytes(self, hid: int) -> int:
        """Key + value bytes the origins of ``hid`` sent over the network to the targets' workers
        (the most one replica of each origin sent; its twin sends about as much)."""
        return self._total(hid, "shipped")

    def held_records(self, hid: int) -> int:
        """Records of the moved keys the targets of ``hid`` held until the release (the most one
        replica of each target held)."""
        return self._total(hid, "held")

    def store_bytes(self, hid: int) -> int:
        """Key + value bytes the targets of ``hid`` read from their workers' copies of the origins'
        checkpoints instead of receiving them (the most one replica of each target read)."""
        return self._total(hid, "from_store")

    def served(self, hid: int) -> bool:
        """Whether every target of ``hid`` served the moved keys from the switch on (windows with
        mergeable aggregators) instead of holding their records until the release."""
        seen = self._times.get(hid, {}).get("served", {})  # (only targets ack LOADED)
        return bool(seen) and all(seen.values())


_ACTION_TIME = {"switched": "switched", "cut": "cut", "loaded": "caught_up"}  # what an action ack's time ends


_AMOUNTS = ("bytes", "held", "shipped", "from_store", "served")  # what action acks count rather than time


TIMELINE = ("committed", "switched", "cut", "arrived", "release", "loaded", "caught_up", "completed")


TIMELINES = 256  # the handovers whose timelines a coordinator keeps


PHASES = ("trigger", "to_switch", "alignment", "transfer", "release_wait", "load", "catch_up", "acks")


def step_phases(instructed_at: float, timeline: Mapping[str, float | None],
                served: bool = False) -> dict[str, float | None]:
    """A step's duration by phase, in seconds, from the driver's instruction (wall clock) and its
    :meth:`StepTimes.timeline`.  In order, adding up to instructed -> completed:
    *trigger* (-> every replica armed, committed), *to_switch* (-> the upstreams reached the switch
    pulse: the margin it was placed ahead), *alignment* (-> the origins consumed everything routed
    to them before the switch and cut), *transfer* (-> every cut reached the targets),
    *release_wait* (-> the targets reached the release pulse, when the cut was there first),
    *load*, *catch_up* (-> the held records processed) and *acks* (-> the driver learnt it all).
    Beside them: *held* (switch -> caught up: how long the moved keys' records waited; 0 when the
    targets ``served`` them from the switch on) and *blocked* (how long a target waited at the
    release pulse for its state, with every key).  None where a time is missing."""
    t = {"instructed": instructed_at, **timeline}
    def span(a: str, b: str) -> float | None:
        return t[b] - t[a] if t.get(a) is not None and t.get(b) is not None else None  # type: ignore[operator]
    arrived, release = t.get("arrived"), t.get("release")
    ready = "arrived" if arrived is not None and release is not None and arrived > release else "release"
    out = {"trigger": span("instructed", "committed"), "to_switch": span("committed", "switched"),
           "alignment": span("switched", "cut"), "transfer": span("cut", "arrived"),
           "release_wait": max(0.0, span("arrived", "release") or 0.0) if arrived and release else None,
           "load": span(ready, "loaded"), "catch_up": span("loaded", "caught_up"),
           "acks": span("caught_up", "completed"),
           "held": 0.0 if served and t.get("caught_up") is not None else span("switched", "caught_up"),
           "blocked": max(0.0, span("release", "arrived") or 0.0) if arrived and release else None}
    return out
