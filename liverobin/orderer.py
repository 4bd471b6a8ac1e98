"""LiveRobin as the orderer of a partition instance: the merge fed from the input queues.

The merge holds at most the batch it is working through per channel; everything else stays
in the bounded per-channel input queues, so back-pressure still reaches the senders and a
channel the merge waits for is never stuck behind the others (``InputQueues(per_channel=True)``).
"""

from __future__ import annotations

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
        merge = self.merge
        steps = merge.pull(PULL_LIMIT)
        while len(steps) < PULL_LIMIT:
            channel = merge.blocked_on
            if channel is None:
                break
            batch = self.queues.take_from(channel, 0 if steps else timeout)
            if batch is None:
                break
            merge.push(channel, batch)
            steps += merge.pull(PULL_LIMIT - len(steps))
        runs: list[tuple[int, list]] = []
        for step in steps:
            if runs and runs[-1][0] == step.channel:
                runs[-1][1].append(step.element)
            else:
                runs.append((step.channel, [step.element]))
        return runs
