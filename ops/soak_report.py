"""The fault soak's report: each fault with its recovery phases, each handover with its outcome,
the verdict on the output, and the lines the soak prints (:mod:`ops.soak` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ops.soak_check import Verdict
from ops.soak_handovers import HandoverRun

KILLS = ("kill-executor", "kill-python", "kill-two", "kill-leader")  # faults that lose replicas at once
BACK_TARGET_S = 3.0  # issue 20: a killed replica is back (restored, caught up) within this


@dataclass
class Fault:
    kind: str
    at_s: float  # since the job started
    target: str = ""
    recovered_s: float | None = None  # from the injection (its first signal) until healthy again
    survived: bool = False
    note: str = ""
    # seconds from the injection until: the driver noticed it, no replica was lost or restoring, none
    # was catching up (the replicas are back), every partition was restorable again (protected
    # from the next fault: recovered_s), and every worker was live again (full_strength)
    phases: dict[str, float] = field(default_factory=dict)
    last_signal_s: float = 0.0  # from the injection until its last signal (kill-two: the second kill)
    # the fewest of the job's workers alive at once until the replicas were back: below two, a
    # lost replica has nowhere to run apart from its twin until Spark relaunches a worker
    live_workers: int | None = None
    trail: list[tuple[float, str]] = field(default_factory=list)  # (s after the injection, why not healthy)

    @property
    def back_s(self) -> float | None:
        return self.phases.get("caught_up")

    @property
    def back_after_last_signal_s(self) -> float | None:
        """Back (caught up) counted from the fault's last signal: the second kill of a kill-two."""
        back = self.back_s
        return None if back is None else back - self.last_signal_s


@dataclass
class SoakReport:
    mode: str
    seed: int
    duration_s: float
    rate: float
    executors: int
    workers: int
    faults: list[Fault] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)
    status: str = ""
    failure: str | None = None
    feed_failed: int = 0  # records the feeder's producer could not deliver (an event is then missing)
    rhino_replicas: int = 1  # workers holding each partition's checkpoints (spark.replication.rhino.replicas)
    rhino: bool = True  # Rhino checkpoints on (off: no replica is restored, so no fault may lose one)
    handovers: list[HandoverRun] = field(default_factory=list)

    @property
    def setup(self) -> str:
        if not self.rhino:
            return f"{self.mode}, Rhino off"
        return f"{self.mode} + Rhino" + (f" ({self.rhino_replicas} checkpoint holders)" if self.rhino_replicas > 1
                                         else "")

    @property
    def survived(self) -> int:
        return sum(f.survived for f in self.faults)

    @property
    def ok(self) -> bool:
        return (self.status == "finished" and self.failure is None and self.verdict.exact
                and self.survived == len(self.faults) and all(h.accepted for h in self.handovers))

    def lines(self) -> list[str]:
        v = self.verdict
        worst = max((f.recovered_s for f in self.faults if f.recovered_s is not None), default=None)
        worst_back = max((f.back_after_last_signal_s for f in self.faults if f.back_s is not None), default=None)
        out = [f"soak {self.setup}, seed {self.seed}: {self.duration_s:.0f} s at {self.rate:.0f} events/s, "
               f"{self.workers} workers on {self.executors} executors: {'PASSED' if self.ok else 'FAILED'}",
               f"  faults injected {len(self.faults)}, survived {self.survived}"
               + (f"; worst: replicas back (restored, caught up) {worst_back:.2f} s after a fault's last signal"
                  if worst_back is not None else "")
               + (f", protected again (every partition restorable) {worst:.2f} s" if worst is not None else "")]
        kills = [f for f in self.faults if f.kind in KILLS and f.back_s is not None]
        room = [f for f in kills if f.live_workers is None or f.live_workers >= 2]
        if kills:
            fast = sum(1 for f in room if (f.back_after_last_signal_s or 0.0) <= BACK_TARGET_S)
            out.append(f"  kills back within {BACK_TARGET_S:.0f} s of the last kill: {fast} of the {len(room)} that left "
                       f"two live workers or more; {len(kills) - len(room)} left fewer (a lost replica waits for "
                       "Spark to relaunch a worker)")
        for f in self.faults:
            rec = f"protected in {f.recovered_s:.2f} s" if f.recovered_s is not None else "NOT RECOVERED"
            phases = ", ".join(f"{k} {v:.1f}" for k, v in f.phases.items())
            if f.last_signal_s > 0 and f.back_after_last_signal_s is not None:
                phases += f"; last signal at {f.last_signal_s:.1f}, back {f.back_after_last_signal_s:.1f} after it"
            if f.live_workers is not None and f.live_workers < 2:
                phases += f"; {f.live_workers} live worker(s): waited for a relaunch"
            out.append(f"    {f.at_s:7.1f} s  {f.kind:17s} {rec:22s} {f.target}{'  ' + f.note if f.note else ''}"
                       + (f"  [{phases}]" if phases else ""))
        if self.handovers:
            outcomes = {o: sum(h.outcome == o for h in self.handovers) for o in dict.fromkeys(
                h.outcome for h in self.handovers)}
            out.append(f"  handovers {len(self.handovers)}: "
                       + ", ".join(f"{o} {n}" for o, n in outcomes.items()))
            for h in self.handovers:
                out.append(f"    {h.at_s:7.1f} s  {h.what:45s} {h.outcome} in {h.seconds:.1f} s"
                           + (f", {h.steps} step(s)" if h.steps else "") + (f": {h.note}" if h.note else ""))
        out += [f"  job {self.status}" + (f": {self.failure}" if self.failure else ""),
                f"  events {v.events:,}, output records {v.records:,}: lost {v.lost}, duplicated {v.duplicated}, "
                f"unexpected {v.unexpected}, keys out of order or broken {len(v.broken_keys)}"
                + (f" (duplicated: {'; '.join(v.duplicates_named)})" if v.duplicates_named else "")
                + (f" (broken: {' | '.join(v.breaks_named)})" if v.breaks_named else ""),
                f"  dead letters {v.dead_letters} of {v.dead_letters_expected} malformed: missing "
                f"{v.dead_letters_missing}, duplicated {v.dead_letters_duplicated}, unexpected "
                f"{v.dead_letters_unexpected}" + (f" ({', '.join(v.dead_letters_wrong)})" if v.dead_letters_wrong
                                                  else "") + f"; feed deliveries failed {self.feed_failed}",
                f"  replicas compared {v.replicas_compared}, differing {v.replicas_differing or 0}, "
                f"checkpoint divergences {v.divergences}"]
        return out
