"""The fault soak's verdict: the output and dead-letter topics read with kafka-python (another
Kafka client than the runtime's) and checked record by record: every input event exactly once,
each key's records a gapless hash chain in the order of its sources with consistent counts,
every malformed record dead-lettered exactly once, both replicas of every partition ending with
equal state and no checkpoint divergence (:mod:`ops.soak` runs the job)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replication.examples.ordered import chain_step


def read_topic(bootstrap: str, topic: str, quiet_s: float = 3.0, timeout_s: float = 120.0) -> list[Any]:
    """Every record of ``topic`` with kafka-python (not the runtime's client): read until each
    partition is at the high watermark its fetches report and nothing new came for ``quiet_s``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             consumer_timeout_ms=500)
    try:
        deadline = time.monotonic() + timeout_s
        while not (known := consumer.partitions_for_topic(topic)):  # None until metadata came in
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metadata for {topic} within {timeout_s}s")
            consumer.topics()  # asks the broker
            time.sleep(0.1)
        parts = [TopicPartition(topic, p) for p in sorted(known)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        records: list[Any] = []
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500, max_records=5000)
            for recs in batch.values():
                records.extend(recs)
            if batch:
                last_new = time.monotonic()
            at_end = all((hw := consumer.highwater(tp)) is not None and consumer.position(tp) >= hw for tp in parts)
            if at_end and time.monotonic() - last_new >= quiet_s:
                return records
        raise TimeoutError(f"reading {topic} did not reach its end within {timeout_s}s")
    finally:
        consumer.close()


@dataclass
class Verdict:
    events: int = 0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    broken_keys: list[str] = field(default_factory=list)  # chain gaps, wrong links or counts, reordered
    duplicates_named: list[str] = field(default_factory=list)  # the first few duplicated records, each copy
    breaks_named: list[str] = field(default_factory=list)  # the first few broken keys: where and how
    dead_letters_expected: int = 0
    dead_letters: int = 0
    dead_letters_missing: int = 0
    dead_letters_duplicated: int = 0  # the same malformed record's letter more than once
    dead_letters_unexpected: int = 0  # letters naming a record the feed did not report malformed
    dead_letters_wrong: list[str] = field(default_factory=list)  # the first few of either, named
    replicas_compared: int = 0
    replicas_differing: list[str] = field(default_factory=list)
    divergences: int = 0

    @property
    def exact(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.broken_keys
                    or self.dead_letters_missing or self.dead_letters_duplicated or self.dead_letters_unexpected
                    or self.replicas_differing
                    or self.divergences)


def verify(outputs: list[dict], ids: list[str], letters: list[tuple[str, int, int]],
           malformed: set[tuple[str, int, int]], sources: Sequence[str],
           copies: Mapping[tuple[str, int, int], list[str]] | None = None,
           written: Mapping[str, list[str]] | None = None) -> Verdict:
    """Exactly once, per-key chains in their sources' order with consistent counts, dead letters
    exactly once (the replicas' part is added by :func:`compare_replicas`).  An event id is
    ``<source>-<index>``, the indexes increasing per source; ``copies`` describes each letter's
    copies and ``written`` each output record's, by event id, for naming a duplicated one."""
    v = Verdict(events=len(ids), records=len(outputs))
    seen: dict[str, int] = {}
    for rec in outputs:
        seen[rec["id"]] = seen.get(rec["id"], 0) + 1
    expected = set(ids)
    v.lost = len(expected - set(seen))
    v.duplicated = sum(n - 1 for n in seen.values() if n > 1)
    v.duplicates_named = [f"{i} x{n}" + _described(written, i)
                          for i, n in sorted(seen.items()) if n > 1][:5]
    v.unexpected = len(set(seen) - expected)
    by_key: dict[str, list[dict]] = {}
    for rec in outputs:
        by_key.setdefault(rec["key"], []).append(rec)
    for key, recs in sorted(by_key.items()):
        recs = sorted({r["n"]: r for r in recs}.values(), key=lambda r: r["n"])
        prev, counts, last = "", dict.fromkeys(sources, 0), dict.fromkeys(sources, -1)
        for i, rec in enumerate(recs, start=1):
            source, index = rec["id"].split("-", 1)
            counts[source] += 1
            why = _chain_break(rec, i, prev, counts[source], int(index), last[source])
            if why:
                v.broken_keys.append(key)
                if len(v.breaks_named) < 5:
                    before = recs[i - 2] if i > 1 else None
                    v.breaks_named.append(f"{key} at n {rec['n']}: {why}; " + "; ".join(
                        f"{r['id']} n {r['n']}" + _described(written, r["id"])
                        for r in (before, rec) if r is not None))
                break
            prev, last[source] = rec["h"], int(index)
    v.dead_letters_expected, v.dead_letters = len(malformed), len(letters)
    got: dict[tuple[str, int, int], int] = {}
    for letter in letters:
        got[letter] = got.get(letter, 0) + 1
    v.dead_letters_missing = len(malformed - set(got))
    v.dead_letters_duplicated = sum(n - 1 for n in got.values() if n > 1)
    unexpected = sorted(set(got) - malformed)
    v.dead_letters_unexpected = len(unexpected)
    v.dead_letters_wrong = ([f"{t}[{p}]@{o} x{n}" + _described(copies, (t, p, o))
                             for (t, p, o), n in sorted(got.items()) if n > 1]
                            + [f"{t}[{p}]@{o} not malformed" for t, p, o in unexpected])[:5]
    return v


def _described(copies: Mapping[Any, list[str]] | None, key: Any) -> str:
    """`` (copy, copy...)``: how ``copies`` describes the copies of ``key``; "" if it does not."""
    return f" ({', '.join(copies[key])})" if copies and key in copies else ""


def _chain_break(rec: Mapping[str, Any], i: int, prev: str, seen: int, index: int, last_index: int) -> str:
    """Why ``rec``, the ``i``-th record of its key and the ``index``-th of its source, does not
    follow the one before it ("" if it does)."""
    if rec["n"] != i:
        return f"count {rec['n']} where {i} was due (a record of the key is missing or counted twice)"
    if rec["prev"] != prev:
        return "linked to another record than the one before it (the state it saw was not the key's)"
    if rec["h"] != chain_step(prev, rec["id"]):
        return "its hash is not the chain's next one"
    if rec["seen"] != seen:
        return f"{rec['seen']} records of its source seen where {seen} were"
    if index < last_index:
        return f"its source's index {index} after {last_index} (reordered)"
    return ""


def compare_replicas(result: Any, plan: Any, v: Verdict) -> None:
    """Both replicas of every partition ended with equal state; no checkpoint diverged."""
    for t in plan.tasks:
        for p in range(t.parallelism):
            digests = {r: m.state_digest for r in range(plan.replicas)
                       if (m := result.per_instance.get(f"{t.name}[{p}]r{r}")) is not None and m.state_digest}
            if len(digests) == plan.replicas:
                v.replicas_compared += 1
                if len(set(digests.values())) > 1:
                    v.replicas_differing.append(f"{t.name}[{p}]")
    v.divergences = len(result.divergences)
