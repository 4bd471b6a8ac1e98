"""Random arrival schedules for the ordering tests: what two replicas see differently."""

from __future__ import annotations

import random


def schedule(seqs: dict[int, list], rnd: random.Random, max_batch: int) -> list[tuple[int, list]]:
    """Cut each channel's sequence into random batches of 1..``max_batch`` elements and interleave
    the batches randomly, keeping each channel's order."""
    chunks: dict[int, list[list]] = {c: [] for c in seqs}
    for c, seq in seqs.items():
        i = 0
        while i < len(seq):
            j = i + rnd.randint(1, max_batch)
            chunks[c].append(seq[i:j])
            i = j
    out = []
    while any(chunks.values()):
        c = rnd.choice([c for c, v in chunks.items() if v])
        out.append((c, chunks[c].pop(0)))
    return out
