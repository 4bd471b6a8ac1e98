"""LiveRobin as the orderer of a partition instance: the merge fed from the input queues.

Input stays in the bounded per-channel input queues (``InputQueues(per_channel=True)``), so
back-pressure reaches the senders and a channel the merge waits for is never stuck behind the
others, with one exception.  While the merge waits for one channel, it takes in the other
channels' current cycles (up to and including their next pulse).  Bounded queues alone can
deadlock: an upstream that feeds several partitions blocks on the full queue of one of them, the
one whose merge waits for another upstream, itself blocked on the full queue of the first
upstream's partner.  Holding one cycle per channel, every upstream can always emit the cycle the
slowest merge needs, so no cycle of waits can form; a cycle's size is bounded at the sources
(``liverobin.maxPulseStep``).
"""

from __future__ import annotations

import time

from liverobin.merge import LiveRobinMerge
from merge.queues import InputQueues

# Steps pulled from the merge per call: bounds the time between two checks of the instance's
# stop flag and control messages.
PULL_LIMIT = 1024


class LiveRobinOrderer:
    def __init__(self, queues: InputQueues, checkpoint_every: int = 0) -> None:
        if not queues.per_channel:
            raise ValueError("LiveRobin needs per-channel input queues (InputQueues(per_channel=True))")
        self.queues = queues
        self.merge = LiveRobinMerge(queues.channels, checkpoint_every)

    @property
    def gen(self) -> int:
        """The highest pulse consumed so far."""
        return self.merge.gen

    def next_runs(self, timeout: float) -> list[tuple[int, list]]:
        """Everything consumable now; waits up to ``timeout`` only while nothing is."""
        merge, queues = self.merge, self.queues
        steps = merge.pull(PULL_LIMIT)
        deadline: float | None = None
        while len(steps) < PULL_LIMIT:
            channel = merge.blocked_on
            if channel is None:
                break
            batch = queues.take_from(channel, 0)
            if batch is not None:
                merge.push(channel, batch)
                steps += merge.pull(PULL_LIMIT - len(steps))
                continue
            others = self._take_cycles(channel)
            if steps:
                break
            now = time.monotonic()
            deadline = now + timeout if deadline is None else deadline
            if now >= deadline or queues.closed:
                break
            queues.wait([channel, *others], deadline - now)
        runs: list[tuple[int, list]] = []
        for step in steps:
            if runs and runs[-1][0] == step.channel:
                runs[-1][1].append(step.element)
            else:
                runs.append((step.channel, [step.element]))
        return runs

    def _take_cycles(self, waiting_for: int) -> list[int]:
        """Move the other channels' queued batches into the merge up to their next pulse; the
        channels that may still need taking from (no pulse held yet)."""
        merge, queues = self.merge, self.queues
        open_ = []
        for c in merge.channels:
            if c == waiting_for or c not in merge.open:
                continue
            while not merge.holds_pulse(c):
                batch = queues.take_from(c, 0)
                if batch is None:
                    open_.append(c)
                    break
                merge.push(c, batch)
        return open_
