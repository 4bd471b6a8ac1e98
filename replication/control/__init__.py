"""The driver side of a job: start it, watch it, recover it, move state while it runs.

| module | owns |
|---|---|
| `launch` | :func:`run`: config, plan, resume, placement, the servers, the workers' Spark job |
| `handle` | :class:`JobHandle`: what the caller holds; metrics, drain, savepoints, stop |
| `master` | :class:`JobMaster`: the control-plane state and the workers' calls on it |
| `attempts` | a worker attempt's registration (the start barrier) and its end report |
| `losses` | a dead worker or a cut-off replica: who takes over, what is rolled back |
| `watch` | the liveness loop: executors that left, silent workers, pending restores |
| `liveness` | which silences count (pure), what the driver knows of a worker |
| `bells` | ringing workers whose next heartbeat reply changed; quiet workers |
| `outputs` | the exactly-once outputs' writers and epochs |
| `restores` | Rhino: checkpoint reports, digests, restores and copies of lost replicas |
| `handover_calls`, `handover_steps` | moves, rescales, rebalances, drains, operator swaps |
| `pulses`, `retention` | the heartbeat generators and KaZoo's pulse windows; the log segments still needed |
| `elections` | KaZoo: a dead worker's leaderships fail over at once |
| `status_view`, `prometheus` | the status file and the metrics endpoint |

It imports the worker side (:mod:`replication.runtime`) only for what starts it; the worker
side imports nothing of it.
"""
