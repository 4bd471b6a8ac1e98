"""The demo job: card-payment monitoring with keyed state, a window and a two-input union.

Two regional payment topics are unioned; invalid amounts are filtered out; per
card a stateful rule decides on every payment and lists the alerts it raises (a
large amount against the card's running average, a country change within a
minute, a new merchant for an established card); a card idle for ``CARD_IDLE_MS`` of
event time starts afresh, and an event-time timer removes its state once the watermark
says it went idle; per merchant a one-second tumbling window totals the payments.  :func:`reference` computes the exact expected output
in plain Python from the same input, so a run can be checked record by record.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from replication.api import Job
from replication.functions import Aggregator, KeyedProcessFunction, ProcessContext, RuntimeContext

WINDOW_MS = 1000
COUNTRY_HOP_MS = 60_000
CARD_IDLE_MS = 4_000  # a card's history expires after this long without a payment


@dataclass(frozen=True)
class Topics:
    eu: str
    us: str
    decisions: str
    totals: str

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        return cls(f"{prefix}payments-eu", f"{prefix}payments-us", f"{prefix}decisions", f"{prefix}merchant-totals")


def is_valid(payment: dict) -> bool:
    return payment["amount"] > 0


class FraudRule(KeyedProcessFunction):
    """Per card: running count/total and last country (value state), merchants seen (map state);
    a timer per card at its last payment + ``CARD_IDLE_MS`` clears them if no payment came since."""

    def open(self, ctx: RuntimeContext) -> None:
        self.profile = ctx.value_state("profile")
        self.merchants = ctx.map_state("merchants")

    def process(self, p: dict, ctx: ProcessContext) -> Iterable[dict]:
        profile = self.profile.value()
        if profile is not None:
            ctx.timers.delete_event_time_timer(profile["ts"] + CARD_IDLE_MS)
            if idle(profile, p["ts"]):  # its timer has not fired yet (the watermark lags): expire it now
                self._forget()
                profile = None
        ctx.timers.register_event_time_timer(p["ts"] + CARD_IDLE_MS)
        yield fraud_step(p, profile, self.merchants.get(p["merchant"], 0),
                         self.profile.update, lambda n: self.merchants.put(p["merchant"], n))

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> None:
        profile = self.profile.value()
        if profile is not None and idle(profile, timestamp):
            self._forget()

    def _forget(self) -> None:
        self.profile.clear()
        self.merchants.clear()


def idle(profile: dict, ts: int) -> bool:
    """Whether a card whose last payment ``profile`` holds went idle by event time ``ts``."""
    return ts - profile["ts"] >= CARD_IDLE_MS


def fraud_step(p: dict, profile: dict | None, merchant_count: int, set_profile: Any, set_merchant: Any) -> dict:
    """One step of the rule, shared by the operator and the reference: the decision on ``p``."""
    alerts = []
    if profile is not None:
        if profile["count"] >= 3 and p["amount"] > 5 * profile["total"] / profile["count"]:
            alerts.append({"card": p["card"], "rule": "large-amount", "txn": p["id"], "amount": p["amount"]})
        if p["country"] != profile["country"] and p["ts"] - profile["ts"] < COUNTRY_HOP_MS:
            alerts.append({"card": p["card"], "rule": "country-hop", "txn": p["id"],
                           "from": profile["country"], "to": p["country"]})
        if merchant_count == 0 and profile["count"] >= 40:
            alerts.append({"card": p["card"], "rule": "new-merchant", "txn": p["id"], "merchant": p["merchant"]})
    count, total = (profile["count"], profile["total"]) if profile else (0, 0)
    set_profile({"count": count + 1, "total": total + p["amount"], "country": p["country"], "ts": p["ts"]})
    set_merchant(merchant_count + 1)
    return {"txn": p["id"], "card": p["card"], "amount": p["amount"], "ts": p["ts"], "alerts": alerts}


class MerchantTotals(Aggregator):
    def create(self) -> list[int]:
        return [0, 0, 0]

    def add(self, acc: list[int], p: dict) -> list[int]:
        return [acc[0] + 1, acc[1] + p["amount"], max(acc[2], p["amount"])]

    def result(self, key: Any, start: int, end: int, acc: list[int]) -> dict:
        return {"merchant": key, "start": start, "end": end, "count": acc[0], "total": acc[1], "max": acc[2]}

    def merge(self, first: list[int], second: list[int]) -> list[int]:
        return [first[0] + second[0], first[1] + second[1], max(first[2], second[2])]


def build_job(topics: Topics, name: str = "fraud-monitor", parallelism: int | None = None) -> Job:
    job = Job(name)
    eu = job.source(topics.eu, deserializer="json", timestamp=lambda p: p["ts"])
    us = job.source(topics.us, deserializer="json", timestamp=lambda p: p["ts"])
    payments = eu.union(us).filter(is_valid, name="valid-amount")
    (payments.key_by(lambda p: p["card"])
     .process(FraudRule(), name="fraud-rule", parallelism=parallelism)
     .sink(topics.decisions, serializer="json", key_serializer="str"))
    (payments.key_by(lambda p: p["merchant"])
     .window(WINDOW_MS, MerchantTotals(), name="merchant-totals", parallelism=parallelism)
     .sink(topics.totals, serializer="json", key_serializer="str"))
    return job


# -- input generation and the reference ---------------------------------------------------------

@dataclass
class PaymentGenerator:
    """Deterministic payments for one region; cards are region-specific, merchants shared."""

    region: str
    seed: int = 7
    cards: int = 200
    merchants: int = 40
    bad_every: int = 0  # every n-th record is malformed (0: never)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}-{self.region}")
        self._n = 0
        self._country = {}

    def next(self, ts: int) -> tuple[str, bytes, dict | None]:
        """(card key, value bytes, the payment, or None if the record is deliberately bad)."""
        self._n += 1
        rng = self._rng
        card = f"{self.region}-card-{rng.randrange(self.cards)}"
        if self.bad_every and self._n % self.bad_every == 0:
            if self._n % (2 * self.bad_every) == 0:
                return card, b'{"id": ' + str(self._n).encode() + b', "amount": ', None  # truncated JSON
            bad = {"id": f"{self.region}-{self._n}", "card": card, "merchant": "m-0", "amount": "12.50",
                   "country": "XX", "ts": ts}  # amount is a string: user code raises
            return card, json.dumps(bad).encode(), None
        country = self._country.get(card, self.region.upper())
        if rng.random() < 0.02:
            country = rng.choice(["DE", "FR", "US", "BR", "JP"])
            self._country[card] = country
        amount = rng.randrange(100, 10_000) if rng.random() > 0.03 else rng.randrange(50_000, 500_000)
        if rng.random() < 0.02:
            amount = -amount  # refunds are filtered out
        p = {"id": f"{self.region}-{self._n}", "card": card, "merchant": f"m-{rng.randrange(self.merchants)}",
             "amount": amount, "country": country, "ts": ts}
        return card, json.dumps(p, separators=(",", ":")).encode(), p


def reference(payments_by_region: Iterable[list[dict]], idle_ms: int = CARD_IDLE_MS) -> tuple[list[dict], list[dict]]:
    """Expected (decisions, merchant totals) for payments given per region in production order
    (``idle_ms``: when a card's history expires).

    Each card lives in one region and (keyed by card) in one Kafka partition, so its
    payments reach the rule in production order: the reference replays them in that order.
    """
    profiles: dict[str, dict] = {}
    merchants: dict[tuple[str, str], int] = defaultdict(int)
    windows: dict[tuple[str, int], list[int]] = {}
    decisions: list[dict] = []
    agg = MerchantTotals()
    for payments in payments_by_region:
        for p in payments:
            if not is_valid(p):
                continue
            if p["card"] in profiles and p["ts"] - profiles[p["card"]]["ts"] >= idle_ms:
                del profiles[p["card"]]
                for k in [k for k in merchants if k[0] == p["card"]]:
                    del merchants[k]
            decisions.append(fraud_step(p, profiles.get(p["card"]), merchants[(p["card"], p["merchant"])],
                                 lambda v, c=p["card"]: profiles.__setitem__(c, v),
                                        lambda n, k=(p["card"], p["merchant"]): merchants.__setitem__(k, n)))
            start = p["ts"] - p["ts"] % WINDOW_MS
            key = (p["merchant"], start)
            windows[key] = agg.add(windows.get(key, agg.create()), p)
    totals = [agg.result(m, s, s + WINDOW_MS, acc) for (m, s), acc in windows.items()]
    return decisions, totals


def canonical(records: Iterable[dict]) -> list[str]:
    """Order-independent form for comparing outputs as multisets."""
    return sorted(json.dumps(r, sort_keys=True) for r in records)


def generate(gen: PaymentGenerator, n: int, start_ts: int, step_ms: int) -> tuple[list[tuple], list[dict], int]:
    """``n`` records at event times ``start_ts + i * step_ms``: (Kafka records (key, value),
    the valid-JSON payments in order, the number of deliberately bad records)."""
    records, payments, bad = [], [], 0
    for i in range(n):
        key, value, p = gen.next(start_ts + i * step_ms)
        records.append((key.encode(), value))
        if p is None:
            bad += 1
        else:
            payments.append(p)
    return records, payments, bad


def build_replicated_job(payments_topic: str, decisions_topic: str, name: str = "fraud-replicated") -> Job:
    """The single-input variant for replication without an ordering mode: every task has one
    input channel per partition, so both replicas see the same order.

    The payments topic is keyed by card, so ``key_by(card, prepartitioned=True)`` keeps each
    card in its source partition (no shuffle); the sink is a task of its own so that its
    replicas can fail independently of the rule's.
    """
    job = Job(name)
    (job.source(payments_topic, deserializer="json", timestamp=lambda p: p["ts"])
     .filter(is_valid, name="valid-amount")
     .key_by(lambda p: p["card"], prepartitioned=True)
     .process(FraudRule(), name="fraud-rule")
     .new_task()
     .sink(decisions_topic, serializer="json", key_serializer="str", name="decisions-sink"))
    return job
