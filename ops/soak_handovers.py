"""The fault soak's handovers: the keyed task's vnodes moved, rescaled and rebalanced at random
moments while the faults go on, each recorded with its outcome.

One handover runs at a time, in a thread of its own, so a fault may land in the middle of it: a
participant lost before the commit cancels the step cleanly, one lost after it is restored and the
step rolls forward (docs/handover.md).  What the soak accepts of each: it completed, it was
cancelled with nothing moved (the job's state ``aborted``), or it was refused before any step with
the reason (ValueError: a participant lost, another handover running).  A timeout or any other
error is not accepted.  The output is checked record by record at the end, as for the faults.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rhino_state import AllAtOnce, Batched, Fluid
from rhino_state.handover import Strategy

KINDS = ("move", "rescale", "rebalance")
# a handover call's timeout (a committed step past it still completes, then the job stops): a KaZoo
# step takes about a second on two loaded cores, and a rescale of 8-vnode steps has up to 16
TIMEOUT_S = 120.0
# how long past its timeout a call may still end accepted: its committed step rolling forward
ROLL_FORWARD_S = 60.0
ACCEPTED = ("completed", "cancelled", "refused")


@dataclass
class HandoverRun:
    kind: str
    at_s: float  # since the job started
    what: str = ""
    outcome: str = ""  # completed | cancelled | refused | timed out | overran | failed | running (never ended)
    seconds: float = 0.0
    steps: int = 0
    note: str = ""

    @property
    def accepted(self) -> bool:
        return self.outcome in ACCEPTED


class HandoverMover:
    """Starts handovers of ``task`` on ``handle`` when told to (:meth:`start_one`), one at a time,
    each drawn with ``rnd``; ``runs`` lists them."""

    def __init__(self, handle: Any, task: str, rnd: random.Random, started: float,
                 say: Callable[[str], None]) -> None:
        self.handle, self.task, self.rnd, self.started, self.say = handle, task, rnd, started, say
        self.runs: list[HandoverRun] = []
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start_one(self) -> bool:
        """Start the next handover unless one runs; whether one started."""
        if self.busy:
            return False
        run = HandoverRun(self.rnd.choice(KINDS), time.monotonic() - self.started, outcome="running")
        self.runs.append(run)
        call = self._draw(run)
        self._thread = threading.Thread(target=self._run, args=(run, call), name="soak-handover", daemon=True)
        self._thread.start()
        return True

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _strategy(self, vnodes: int, smallest: int = 2) -> tuple[Strategy, str]:
        """All at once, in batches (of at least ``smallest`` vnodes) or one at a time (a few vnodes)."""
        pick = self.rnd.choice(("all", "batched", "fluid") if vnodes <= 8 else ("all", "batched"))
        if pick == "batched":
            n = self.rnd.choice([n for n in (2, 4, 8, 16) if n >= smallest])
            return Batched(n), f"batched {n}"
        return (Fluid(), "fluid") if pick == "fluid" else (AllAtOnce(), "all at once")

    def _draw(self, run: HandoverRun) -> Callable[[], dict[str, Any]]:
        """What ``run`` does, drawn now from the routing table as it stands."""
        handle, task = self.handle, self.task
        table = handle.routing(task)
        owning = sorted(set(table.assignment))
        hosted = next(t.parallelism for t in handle.plan.tasks if t.name == task)  # max_parallelism
        if run.kind == "rescale":
            to = len(owning) + 1 if len(owning) < hosted else len(owning) - 1
            strategy, label = self._strategy(len(table.assignment), smallest=8)
            run.what = f"rescale {len(owning)} -> {to} ({label})"
            return lambda: handle.rescale(task, to, timeout=TIMEOUT_S, strategy=strategy)
        if run.kind == "rebalance":
            run.what = "rebalance up to half the busiest partition's vnodes"
            return lambda: handle.rebalance(task, fraction=0.5, window_s=2.0, timeout=TIMEOUT_S)
        origin = self.rnd.choice(owning)
        mine = table.vnodes_of(origin)
        vnodes = sorted(self.rnd.sample(list(mine), self.rnd.randint(1, max(1, len(mine) // 2))))
        target = self.rnd.choice([p for p in range(table.parallelism) if p != origin])  # (rescale widens it)
        strategy, label = self._strategy(len(vnodes))
        run.what = f"move {len(vnodes)} vnode(s) {origin} -> {target} ({label})"
        return lambda: handle.move_vnodes(task, vnodes, target, timeout=TIMEOUT_S, strategy=strategy)

    def _run(self, run: HandoverRun, call: Callable[[], dict[str, Any]]) -> None:
        began = time.monotonic()
        try:
            report = call()
            run.steps = len(report.get("steps", []))
            run.outcome = "completed" if report["state"] == "completed" else \
                "cancelled" if report["state"] == "aborted" else "failed"
            run.note = report.get("reason") or ""
        except ValueError as exc:
            run.outcome, run.note = "refused", str(exc)
        except TimeoutError as exc:
            run.outcome, run.note = "timed out", str(exc)
        except Exception as exc:  # noqa: BLE001 - the soak reports it as not accepted
            run.outcome, run.note = "failed", f"{type(exc).__name__}: {exc}"
        run.seconds = time.monotonic() - began
        if run.accepted and run.seconds > TIMEOUT_S + ROLL_FORWARD_S:  # e.g. it ended only with the job
            run.outcome, run.note = "overran", f"{run.note} (past its {TIMEOUT_S:g} s timeout by more than " \
                f"{ROLL_FORWARD_S:g} s)".strip()
        self.say(f"   {run.at_s:6.1f}s handover: {run.what}: {run.outcome} in {run.seconds:.1f}s"
                 + (f" ({run.steps} step(s))" if run.steps else "") + (f": {run.note}" if run.note else ""))
