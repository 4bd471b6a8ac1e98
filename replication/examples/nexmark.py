"""A NEXMark-like benchmark workload (issue 8): its job, input generator, reference and verifier.

**nexmark** (NEXMark Q8-like: persons who opened an auction in the tumbling event-time window in
which they registered). Two sources, ``persons`` and ``auctions``, tagged, unioned and keyed by
person id (an auction by its seller) into :class:`PersonAuctionJoin`, which keeps every person
(value state) and every auction of the person (map state) and emits one record per (person,
auction) pair of the same window, when the later of the two arrives. The state grows with every
person and auction (``payload_bytes`` of description in each), so a run reaches a chosen state size
(:func:`payload_for_state`); :func:`nexmark_state_bytes` gives the logical bytes the join's
RocksDB holds. The output's *content* does not depend on the consumption order (whichever side
comes second emits the same pair), only its order does, so :func:`nexmark_reference` is exact from
the input alone.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from replication.api import Job
from replication.examples.workloads import OutputReport, event_time, payload_text, tagged
from replication.functions import KeyedProcessFunction, ProcessContext, RuntimeContext
from rhino_state.keys import encode_key

# -- nexmark: the job ---------------------------------------------------------------------------

CITIES = ("Brussels", "Lyon", "Austin", "Recife", "Osaka", "Pune")
NEXMARK_JOIN = "person-auction-join"


@dataclass(frozen=True)
class NexmarkTopics:
    persons: str
    auctions: str
    out: str

    @classmethod
    def with_prefix(cls, prefix: str) -> NexmarkTopics:
        return cls(f"{prefix}persons", f"{prefix}auctions", f"{prefix}q8")


def window_start(ts: int, window_ms: int) -> int:
    """Start of the tumbling event-time window of ``ts``."""
    return ts - ts % window_ms


def person_key(t: dict) -> int:
    """The join key: a person's id, an auction's seller."""
    return t["rec"]["id"] if t["side"] == "person" else t["rec"]["seller"]


def person_entry(p: dict, window_ms: int) -> dict:
    """What the join keeps of a person (value state)."""
    return {"name": p["name"], "city": p["city"], "window": window_start(p["ts"], window_ms), "ts": p["ts"],
            "extra": p["extra"]}


def auction_entry(a: dict, window_ms: int) -> dict:
    """What the join keeps of an auction (map state of its seller, by auction id)."""
    return {"window": window_start(a["ts"], window_ms), "category": a["category"], "reserve": a["reserve"],
            "ts": a["ts"], "extra": a["extra"]}


def q8_pair(person_id: int, person: dict, auction_id: int, auction: dict) -> dict:
    """The output record of a person and an auction of theirs opened in the same window."""
    return {"person": person_id, "name": person["name"], "city": person["city"], "auction": auction_id,
            "category": auction["category"], "reserve": auction["reserve"], "window": person["window"],
            "ts": max(person["ts"], auction["ts"])}


class PersonAuctionJoin(KeyedProcessFunction):
    """Per person: the person (value state) and all their auctions (map state); emits each pair of
    the same window once, when the later of the two arrives. Nothing is ever cleared: the state
    grows with every person and auction."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.person = ctx.value_state("person")
        self.auctions = ctx.map_state("auctions")

    def process(self, t: dict, ctx: ProcessContext) -> list[dict]:
        rec = t["rec"]
        if t["side"] == "person":
            person = person_entry(rec, self.window_ms)
            self.person.update(person)
            return [q8_pair(rec["id"], person, aid, a) for aid, a in self.auctions.items()
                    if a["window"] == person["window"]]
        auction = auction_entry(rec, self.window_ms)
        self.auctions.put(rec["id"], auction)
        person = self.person.value()
        if person is None or person["window"] != auction["window"]:
            return []
        return [q8_pair(rec["seller"], person, rec["id"], auction)]


def build_nexmark_job(topics: NexmarkTopics, window_ms: int, name: str = "nexmark-q8", parallelism: int = 2) -> Job:
    """persons -> tag, auctions -> tag; union -> key_by(person) -> :class:`PersonAuctionJoin` ->
    exactly-once sink (a task of its own)."""
    job = Job(name)
    persons = (job.source(topics.persons, deserializer="json", timestamp=event_time, name="persons")
               .map(tagged("person"), name="tag-persons"))
    auctions = (job.source(topics.auctions, deserializer="json", timestamp=event_time, name="auctions")
                .map(tagged("auction"), name="tag-auctions"))
    (persons.union(auctions).key_by(person_key)
     .process(PersonAuctionJoin(window_ms), name=NEXMARK_JOIN, parallelism=parallelism)
     .new_task().sink(topics.out, serializer="json", name="q8-sink"))
    return job


# -- nexmark: input, reference, verifier, state size --------------------------------------------

@dataclass(frozen=True)
class NexmarkConfig:
    window_ms: int = 2000
    payload_bytes: int = 100  # description characters in every person and auction
    active_sellers: int = 8  # an auction's seller is one of the latest this many persons
    seed: int = 11


class NexmarkGenerator:
    """Deterministic persons (new ids 0, 1, ...) and auctions (ids 0, 1, ..., seller among the latest
    ``active_sellers`` persons; the first person-to-be before any person exists)."""

    def __init__(self, config: NexmarkConfig) -> None:
        self.config = config
        self.rng = random.Random(f"nexmark-{config.seed}")
        self.persons = 0
        self.auctions = 0

    def person(self, ts: int) -> tuple[bytes, dict]:
        rng, pid = self.rng, self.persons
        p = {"id": pid, "name": f"person-{pid}", "email": f"p{pid}@example.com", "city": rng.choice(CITIES),
             "extra": payload_text(rng, self.config.payload_bytes), "ts": ts}
        self.persons += 1
        return str(pid).encode(), p

    def auction(self, ts: int) -> tuple[bytes, dict]:
        rng, aid = self.rng, self.auctions
        seller = self.persons - 1 - rng.randrange(min(self.config.active_sellers, self.persons)) if self.persons else 0
        a = {"id": aid, "seller": seller, "category": rng.randrange(10), "reserve": rng.randrange(100, 10_000),
             "extra": payload_text(rng, self.config.payload_bytes), "ts": ts}
        self.auctions += 1
        return str(seller).encode(), a

    def batch(self, persons: int, auctions_per_person: int, start_ts: int, step_ms: int = 1
              ) -> tuple[list[dict], list[dict]]:
        """``persons`` persons, each followed by ``auctions_per_person`` auctions, one event per
        ``step_ms`` from ``start_ts``: (persons, auctions)."""
        ps, aus, ts = [], [], start_ts
        for _ in range(persons):
            ps.append(self.person(ts)[1])
            ts += step_ms
            for _ in range(auctions_per_person):
                aus.append(self.auction(ts)[1])
                ts += step_ms
        return ps, aus


def nexmark_reference(persons: Iterable[dict], auctions: Iterable[dict], window_ms: int) -> list[dict]:
    """Every (person, auction) pair of the same window: the job's output, in any consumption order."""
    by_id = {p["id"]: person_entry(p, window_ms) for p in persons}
    out = []
    for a in auctions:
        person, auction = by_id.get(a["seller"]), auction_entry(a, window_ms)
        if person is not None and person["window"] == auction["window"]:
            out.append(q8_pair(a["seller"], person, a["id"], auction))
    return out


_STATE_KEY_BYTES = 2 + 4 + 4  # key group, state id, length of the encoded key (rhino_state.state)


def _pickled_len(value: Any) -> int:
    return len(pickle.dumps(value, protocol=5))


def nexmark_state_bytes(persons: Iterable[dict], auctions: Iterable[dict], window_ms: int) -> int:
    """Logical bytes (keys + values) the join's RocksDB holds once it has seen ``persons`` and
    ``auctions``: the layout of :mod:`rhino_state.state`."""
    total = 0
    for p in persons:
        total += _STATE_KEY_BYTES + len(encode_key(p["id"])) + _pickled_len(person_entry(p, window_ms))
    for a in auctions:
        total += (_STATE_KEY_BYTES + len(encode_key(a["seller"])) + len(encode_key(a["id"]))
                  + _pickled_len(auction_entry(a, window_ms)))
    return total


def payload_for_state(target_bytes: int, persons: int, auctions: int, config: NexmarkConfig) -> int:
    """The ``payload_bytes`` with which ``persons`` persons and ``auctions`` auctions make about
    ``target_bytes`` of join state (the payload is stored once per event; the rest is measured on a
    sample with :func:`nexmark_state_bytes`)."""
    events = persons + auctions
    if events <= 0:
        raise ValueError("no events to hold the state")
    sample = NexmarkGenerator(NexmarkConfig(config.window_ms, 0, config.active_sellers, config.seed))
    ps, aus = sample.batch(20, 3, 1_700_000_000_000)
    overhead = nexmark_state_bytes(ps, aus, config.window_ms) / (len(ps) + len(aus))
    return max(0, int(target_bytes / events - overhead))


def verify_nexmark(outputs: Iterable[dict], persons: list[dict], auctions: list[dict], window_ms: int
                   ) -> OutputReport:
    """Compare the output records with :func:`nexmark_reference`, identified by (person, auction)."""
    expected = {(r["person"], r["auction"]): r for r in nexmark_reference(persons, auctions, window_ms)}
    report = OutputReport(expected=len(expected))
    copies: Counter = Counter()
    for rec in outputs:
        report.records += 1
        ident = (rec.get("person"), rec.get("auction"))
        name = f"{ident[0]}/{ident[1]}"
        copies[ident] += 1
        if ident not in expected:
            report.unexpected.append(name)
        elif copies[ident] > 1:
            report.duplicated.append(name)
        elif rec != expected[ident]:
            report.wrong.append(name)
    report.missing = [f"{p}/{a}" for p, a in expected if (p, a) not in copies]
    return report
