"""LiveRobin: leaderless deterministic merge of input channels (paper 004, Algorithm 1).

So far the merge itself (:class:`LiveRobinMerge`); the heartbeat generator, pulse placement
at the sources and the wiring into the runtime are the rest of the LiveRobin issue.
"""

from liverobin.merge import LiveRobinMerge, Step

__all__ = ["LiveRobinMerge", "Step"]
