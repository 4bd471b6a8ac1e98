"""LiveRobin: leaderless deterministic ordering of input channels (paper 004, Algorithm 1).

* :mod:`liverobin.merge`: the merge itself, a pure state machine;
* :mod:`liverobin.heartbeats`: the heartbeat log rules and deterministic pulse placement at
  replicated sources (pure);
* :mod:`liverobin.windows`: KaZoo's pulse windows, a source replica's side (pure);
* :mod:`liverobin.orderer`: the merge as a partition instance's orderer;
* :mod:`liverobin.generator`: the heartbeat generator (a driver thread; Kafka I/O).
"""

from liverobin.heartbeats import PulseLog, PulsePlacer, PulseRecord, next_pulse
from liverobin.merge import LiveRobinMerge, Step
from liverobin.orderer import LiveRobinOrderer
from liverobin.windows import PulseWindows

__all__ = ["LiveRobinMerge", "LiveRobinOrderer", "PulseLog", "PulsePlacer", "PulseRecord", "PulseWindows", "Step",
           "next_pulse"]
