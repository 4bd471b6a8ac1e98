"""Which silent workers the failure detector declares dead (pure; no clock, no I/O).

A crashed worker is noticed without waiting: its connection to the driver closes (the ``Attach``
watch) or Spark reports its executor lost. Silence is left for hangs and partitions, and there
one worker's silence and every worker's silence mean different things: a host starved of CPU,
a stalled driver or a broken network makes the observer deaf to all of them at once. So, as
Kubernetes' node controller stops evicting in a full disruption, a silence shared by more than
half of the watched workers (at least two) is held to a longer timeout before anyone is
declared dead; a worker silent alone is declared at the plain timeout.
"""
from __future__ import annotations

from collections.abc import Mapping

SHARED_SILENCE_FACTOR = 4.0
"""How many plain timeouts a silence shared by most workers must last before it counts."""


def silent_workers(silence_s: Mapping[int, float], timeout_s: float,
                   shared_factor: float = SHARED_SILENCE_FACTOR) -> list[int]:
    """The workers to declare dead, given how long each watched worker has been silent.

    ``silence_s`` holds every worker whose death would count (alive, started, not ended), silent
    or not: the share of silent ones is judged against all of them.
    """
    over = sorted(w for w, s in silence_s.items() if s > timeout_s)
    if len(over) >= 2 and 2 * len(over) > len(silence_s):
        return [w for w in over if silence_s[w] > timeout_s * shared_factor]
    return over
