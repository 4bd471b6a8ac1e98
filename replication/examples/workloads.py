"""The BetterCloud-like benchmark workload (issue 8) and what the workloads share, each with an input generator, a pure-Python reference of the
whole job's output and a verifier of the actual output records.

**bettercloud** (after the application of paper 004, Fig. 15: SaaS activity monitored against rules
that control events update). Two sources of unbalanced rates: ``events`` (user activity: logins,
file shares / downloads / uploads, and system noise; Kafka key = customer) and ``controls`` (rule
and policy updates, a twentieth of the rate, one partition). Each source is filtered (noise events
and draft controls are dropped) and tagged; two joins run side by side, each the union of the two
tagged streams, filtered to its sides and keyed by its join key:

* ``app-rules`` (key: app): file events x per-app rules (largest allowed transfer per watched kind);
* ``customer-policies`` (key: customer): logins x per-customer policies (blocked countries).

A join (:class:`LatestValueJoin`) keeps, per key, the control update of the highest version seen so
far and a counter of the key's events; every event yields one verdict stamped with that counter
(``n``) and the version it was judged by (``v``). The two joins' verdicts are unioned into a
``flat_map`` of parallelism 2 (:func:`notifications`: one record per notification channel of a
violated rule, or one ``audit`` record) that ends in the exactly-once sink.

What is order-sensitive, i.e. deterministic only under a deterministic merge (LiveRobin, KaZoo):

* the *content* of a verdict: whether an event is judged by version ``v`` or a later one depends on
  how the join interleaved the controls' channel with the events' channels; so does the key's
  counter ``n`` when a key's events come from several channels (an app's file events come from both
  events partitions);
* the *order* of the records through the union of the two joins, the ``flat_map`` and the sink (the
  sink numbers its output, and both replicas of a sink partition must number it identically).

What is not: the filters, the routing and, for a given ``(n, v)``, the verdict and its
notifications. So the reference (:func:`bettercloud_reference`) computes the output *for a given
consumption order*, and the verifier (:func:`verify_bettercloud`) reads each event's ``(n, v)``
from the output, checks that they describe one admissible order (per key ``n`` is distinct and in
range, ``v`` never goes back along ``n`` and names an active control of that key, and each
customer's events keep their production order), and compares every record with the reference
given that ``(n, v)``: missing, duplicated, unexpected and wrong records.

The NEXMark-like workload is :mod:`replication.examples.nexmark`.
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from replication.api import Job
from replication.functions import KeyedProcessFunction, ProcessContext, RuntimeContext

# -- shared -------------------------------------------------------------------------------------


def event_time(record: dict) -> int:
    """The event time (ms) of every record of both workloads."""
    return record["ts"]


def _tag(side: str, record: dict) -> dict:
    return {"side": side, "rec": record}


def tagged(side: str) -> Callable[[dict], dict]:
    """A map that wraps a record as ``{"side": side, "rec": record}`` (the two sides of a join)."""
    return functools.partial(_tag, side)


def canonical(records: Iterable[dict]) -> list[str]:
    """Order-independent form for comparing outputs as multisets."""
    return sorted(json.dumps(r, sort_keys=True) for r in records)


@dataclass
class OutputReport:
    """What a verifier found. Entries name records (``<id>/<channel>``, ``<person>/<auction>``) or keys."""

    records: int = 0  # output records read
    expected: int = 0  # bettercloud: input events that must show up; nexmark: expected records
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)  # one entry per extra copy
    unexpected: list[str] = field(default_factory=list)  # records of nothing in the input
    wrong: list[str] = field(default_factory=list)  # records whose values differ from the reference
    broken: list[str] = field(default_factory=list)  # bettercloud: keys whose (n, v) is no admissible order

    @property
    def exact(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected or self.wrong or self.broken)

    def counts(self) -> dict[str, int]:
        """The number of entries of each kind (the CSV columns of a run)."""
        return {"missing": len(self.missing), "duplicated": len(self.duplicated),
                "unexpected": len(self.unexpected), "wrong": len(self.wrong), "broken": len(self.broken)}

    def __str__(self) -> str:
        if self.exact:
            return f"EXACT: {self.records} records ({self.expected} expected)"
        parts = [f"{kind} {len(items)} {items[:3]}" for kind, items in
                 (("missing", self.missing), ("duplicated", self.duplicated), ("unexpected", self.unexpected),
                  ("wrong", self.wrong), ("broken", self.broken)) if items]
        return f"{self.records} records ({self.expected} expected): " + ", ".join(parts)


def payload_text(rng: random.Random, n: int) -> str:
    """``n`` pseudo-random hex characters (seeded: the same on every run)."""
    return rng.randbytes((n + 1) // 2).hex()[:n]


# -- bettercloud: the job -----------------------------------------------------------------------

APPS = ("drive", "mail", "chat", "box", "git", "crm")
COUNTRIES = ("BE", "FR", "US", "BR", "JP", "IN")
CHANNELS = ("email", "chat", "ticket")
FILE_KINDS = ("share", "download", "upload")
LOGIN = "login"
NOISE = "system"
AUDIT = "audit"


@dataclass(frozen=True)
class BetterCloudTopics:
    events: str
    controls: str
    out: str

    @classmethod
    def with_prefix(cls, prefix: str) -> BetterCloudTopics:
        return cls(f"{prefix}events", f"{prefix}controls", f"{prefix}notifications")


def is_relevant(event: dict) -> bool:
    """Filter of the events source: system noise is dropped."""
    return event["kind"] != NOISE


def is_active(control: dict) -> bool:
    """Filter of the controls source: drafts are dropped."""
    return control["status"] == "active"


def for_app_rules(t: dict) -> bool:
    """The sides of the ``app-rules`` join: file events and rules."""
    rec = t["rec"]
    return rec["kind"] in FILE_KINDS if t["side"] == "event" else rec["type"] == "rule"


def for_customer_policies(t: dict) -> bool:
    """The sides of the ``customer-policies`` join: logins and policies."""
    rec = t["rec"]
    return rec["kind"] == LOGIN if t["side"] == "event" else rec["type"] == "policy"


def app_key(t: dict) -> str:
    return t["rec"]["app"]


def customer_key(t: dict) -> str:
    return t["rec"]["customer"]


JOINS: tuple[tuple[str, Callable[[dict], bool], Callable[[dict], str]], ...] = (
    ("app", for_app_rules, app_key), ("customer", for_customer_policies, customer_key))


def verdict(join: str, event: dict, control: dict | None, n: int) -> dict:
    """The verdict on ``event``, the key's ``n``-th event, judged by ``control`` (None: no rule yet)."""
    violations: list[str] = []
    if control is not None:
        if join == "app" and event["kind"] in control["watch"] and event["bytes"] > control["max_bytes"]:
            violations.append(f"{event['kind']} of {event['bytes']} bytes over {control['max_bytes']}")
        elif join == "customer" and event["country"] in control["blocked"]:
            violations.append(f"login from {event['country']}")
    return {"id": event["id"], "join": join, "key": event["app" if join == "app" else "customer"], "n": n,
            "v": control["version"] if control is not None else 0, "customer": event["customer"],
            "user": event["user"], "kind": event["kind"], "violations": violations,
            "notify": list(control["notify"]) if violations and control is not None else [], "ts": event["ts"]}


def join_step(join: str, t: dict, latest: dict | None, n: int) -> tuple[dict | None, int, list[dict]]:
    """One record through a join: (the key's latest control, its event count, the verdicts emitted).
    A control replaces the latest one only if its version is higher (versions of one key may arrive
    out of order: the one-partition controls source reaches the union's partitions round robin)."""
    rec = t["rec"]
    if t["side"] == "control":
        if latest is None or rec["version"] > latest["version"]:
            latest = rec
        return latest, n, []
    return latest, n + 1, [verdict(join, rec, latest, n + 1)]


class LatestValueJoin(KeyedProcessFunction):
    """A join of a union of tagged events and controls keyed by the join key: the latest control
    (by version) and the event count in value state; one verdict per event (:func:`join_step`)."""

    def __init__(self, join: str) -> None:
        self.join = join

    def open(self, ctx: RuntimeContext) -> None:
        self.latest = ctx.value_state("latest")
        self.count = ctx.value_state("n", default=0)

    def process(self, t: dict, ctx: ProcessContext) -> list[dict]:
        before, n_before = self.latest.value(), self.count.value()
        latest, n, out = join_step(self.join, t, before, n_before)
        if latest is not before:
            self.latest.update(latest)
        if n != n_before:
            self.count.update(n)
        return out


def notifications(v: dict) -> list[dict]:
    """The ``flat_map``: one record per notification channel of a violated rule, else one audit record."""
    base = {k: v[k] for k in ("id", "join", "key", "n", "v", "customer", "user", "kind", "ts")}
    if v["violations"]:
        reason = "; ".join(v["violations"])
        return [{**base, "channel": ch, "reason": reason} for ch in v["notify"]]
    return [{**base, "channel": AUDIT, "reason": ""}]


def build_bettercloud_job(topics: BetterCloudTopics, name: str = "bettercloud", join_parallelism: int = 1,
                          notify_parallelism: int = 2) -> Job:
    """events -> filter -> tag, controls -> filter -> tag; two joins (each: union -> filter its sides
    -> key_by -> :class:`LatestValueJoin`); union of the verdicts -> ``flat_map`` -> exactly-once sink."""
    job = Job(name)
    events = (job.source(topics.events, deserializer="json", timestamp=event_time, name="events")
              .filter(is_relevant, name="relevant-events").map(tagged("event"), name="tag-events"))
    controls = (job.source(topics.controls, deserializer="json", timestamp=event_time, name="controls")
                .filter(is_active, name="active-controls").map(tagged("control"), name="tag-controls"))
    by_app = (events.union(controls).filter(for_app_rules, name="files-and-rules").key_by(app_key)
              .process(LatestValueJoin("app"), name="app-rules", parallelism=join_parallelism))
    by_customer = (events.union(controls).filter(for_customer_policies, name="logins-and-policies")
                   .key_by(customer_key)
                   .process(LatestValueJoin("customer"), name="customer-policies", parallelism=join_parallelism))
    (by_app.union(by_customer).flat_map(notifications, name="notify", parallelism=notify_parallelism)
     .sink(topics.out, serializer="json", name="notifications-sink"))
    return job


# -- bettercloud: input, reference, verifier ----------------------------------------------------

class BetterCloudGenerator:
    """Deterministic activity events and control updates (seeded). Events are keyed by customer (a
    customer's events stay in one Kafka partition, in production order); control versions count
    per rule (app) and per policy (customer), drafts included."""

    def __init__(self, seed: int = 5, customers: int = 12, users: int = 4, draft_share: float = 0.1) -> None:
        self.rng = random.Random(f"bettercloud-{seed}")
        self.customers = customers
        self.users = users
        self.draft_share = draft_share
        self.events = 0
        self.controls = 0
        self.versions: Counter = Counter()

    def event(self, ts: int) -> tuple[bytes, dict]:
        """The next activity event: (Kafka key, event)."""
        rng = self.rng
        customer = f"c{rng.randrange(self.customers)}"
        kind = rng.choices((LOGIN, *FILE_KINDS, NOISE), weights=(4, 2, 2, 1, 1))[0]
        e = {"id": f"e{self.events}", "customer": customer, "user": f"{customer}-u{rng.randrange(self.users)}",
             "app": rng.choice(APPS), "kind": kind, "country": rng.choice(COUNTRIES),
             "bytes": int(rng.paretovariate(1.2) * 1000), "ts": ts}
        self.events += 1
        return customer.encode(), e

    def control(self, ts: int) -> tuple[bytes, dict]:
        """The next rule (per app) or policy (per customer) update: (Kafka key, control)."""
        rng = self.rng
        status = "draft" if rng.random() < self.draft_share else "active"
        notify = sorted(rng.sample(CHANNELS, rng.randint(1, len(CHANNELS))))
        if rng.random() < 0.5:
            app = rng.choice(APPS)
            self.versions["rule", app] += 1
            c = {"id": f"r{self.controls}", "type": "rule", "status": status, "app": app,
                 "version": self.versions["rule", app], "max_bytes": rng.choice((1000, 2000, 5000, 20000)),
                 "watch": sorted(rng.sample(FILE_KINDS, rng.randint(1, len(FILE_KINDS)))), "notify": notify,
                 "ts": ts}
            key = app
        else:
            customer = f"c{rng.randrange(self.customers)}"
            self.versions["policy", customer] += 1
            c = {"id": f"p{self.controls}", "type": "policy", "status": status, "customer": customer,
                 "version": self.versions["policy", customer],
                 "blocked": sorted(rng.sample(COUNTRIES, rng.randint(1, 3))), "notify": notify, "ts": ts}
            key = customer
        self.controls += 1
        return key.encode(), c

    def batch(self, events: int, control_every: int, start_ts: int, step_ms: int = 1
              ) -> tuple[list[dict], list[dict]]:
        """``events`` events and one control update after every ``control_every`` of them, at event
        times ``start_ts + i * step_ms``: (events, controls), each in production order."""
        evs, ctls = [], []
        for i in range(events):
            evs.append(self.event(start_ts + i * step_ms)[1])
            if (i + 1) % control_every == 0:
                ctls.append(self.control(start_ts + i * step_ms)[1])
        return evs, ctls


def bettercloud_reference(consumed: Iterable[tuple[str, dict]]) -> list[dict]:
    """The whole job's output for one consumption order: ``consumed`` lists ``("event", e)`` and
    ``("control", c)`` in the order the joins see them (only each join key's own order matters)."""
    latest: dict[tuple[str, str], dict | None] = {}
    counts: dict[tuple[str, str], int] = {}
    out: list[dict] = []
    for side, rec in consumed:
        if not (is_relevant(rec) if side == "event" else is_active(rec)):
            continue
        t = _tag(side, rec)
        for join, selects, key_of in JOINS:
            if selects(t):
                k = (join, key_of(t))
                latest[k], counts[k], verdicts = join_step(join, t, latest.get(k), counts.get(k, 0))
                for v in verdicts:
                    out.extend(notifications(v))
    return out


def _route(t: dict) -> tuple[str, str] | None:
    """(join, key) a tagged record goes to, None if no join takes it."""
    for join, selects, key_of in JOINS:
        if selects(t):
            return join, key_of(t)
    return None


def _active_versions(controls: Iterable[dict]) -> dict[tuple[str, str], dict[int, dict]]:
    """(join, key) -> version -> the active control of that version."""
    versions: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for c in controls:
        if is_active(c) and (route := _route(_tag("control", c))) is not None:
            versions[route][c["version"]] = c
    return versions


def _relevant_events(events: Iterable[dict]) -> dict[str, tuple[int, dict, str, str]]:
    """Event id -> (production index, event, join, key) of the events some join takes."""
    out = {}
    for i, e in enumerate(events):
        if is_relevant(e) and (route := _route(_tag("event", e))) is not None:
            out[e["id"]] = (i, e, *route)
    return out


def verify_bettercloud(outputs: Iterable[dict], events: list[dict], controls: list[dict]) -> OutputReport:
    """Compare the output with the reference given each event's ``(n, v)`` as read from its records,
    and check that these describe one admissible consumption order (see the module doc). ``events``
    in production order; the events topic must be keyed by customer."""
    relevant = _relevant_events(events)
    versions = _active_versions(controls)
    report = OutputReport(expected=len(relevant))
    by_id: dict[str, list[dict]] = defaultdict(list)
    for rec in outputs:
        report.records += 1
        by_id[rec.get("id")].append(rec)
    claimed: dict[str, tuple[Any, Any]] = {}
    for eid, recs in by_id.items():
        if eid not in relevant:
            report.unexpected += [f"{eid}/{r.get('channel')}" for r in recs]
            continue
        _, event, join, key = relevant[eid]
        n, v = claimed[eid] = (recs[0].get("n"), recs[0].get("v"))
        control = versions[join, key].get(v) if v else None
        expected = {r["channel"]: r for r in notifications(verdict(join, event, control, n))}
        copies: Counter = Counter()
        for rec in recs:
            channel = rec.get("channel")
            copies[channel] += 1
            if copies[channel] > 1:
                report.duplicated.append(f"{eid}/{channel}")
            elif expected.get(channel) != rec:
                report.wrong.append(f"{eid}/{channel}")
        report.missing += [f"{eid}/{ch}" for ch in expected if ch not in copies]
    report.missing += sorted(eid for eid in relevant if eid not in by_id)
    report.broken = _order_problems(claimed, relevant, versions)
    return report


def _order_problems(claimed: dict[str, tuple[Any, Any]], relevant: dict[str, tuple[int, dict, str, str]],
                    versions: dict[tuple[str, str], dict[int, dict]]) -> list[str]:
    """Keys whose events' ``(n, v)`` describe no admissible consumption order, with why."""
    size: Counter = Counter((join, key) for _, _, join, key in relevant.values())
    per_key: dict[tuple[str, str], list[tuple[Any, Any, int, str]]] = defaultdict(list)
    for eid, (n, v) in claimed.items():
        index, event, join, key = relevant[eid]
        per_key[join, key].append((n, v, index, event["customer"]))
    problems = []
    for (join, key), items in sorted(per_key.items()):
        name = f"{join}:{key}"
        ns = [n for n, _, _, _ in items]
        if not all(isinstance(n, int) and 1 <= n <= size[join, key] for n in ns) or len(set(ns)) != len(ns):
            problems.append(f"{name}: event counters are not distinct in 1..{size[join, key]}")
            continue
        if unknown := sorted({v for _, v, _, _ in items if v != 0 and v not in versions[join, key]}, key=str):
            problems.append(f"{name}: judged by versions {unknown} that are no active control")
        along_n = [v for _, v, _, _ in sorted(items, key=lambda x: x[0])]
        if any(not isinstance(v, int) for v in along_n) or along_n != sorted(along_n):
            problems.append(f"{name}: the version went back")
        for customer in sorted({c for _, _, _, c in items}):
            mine = [n for n, _, _, _ in sorted((x for x in items if x[3] == customer), key=lambda x: x[2])]
            if mine != sorted(mine):
                problems.append(f"{name}: events of {customer} left their production order")
                break
    return problems


def consumption_order(outputs: Iterable[dict], events: list[dict], controls: list[dict]
                      ) -> list[tuple[str, dict]]:
    """A consumption order consistent with the ``(n, v)`` of the output: per join key its events by
    ``n``, each after the active controls of its key up to the version ``v`` it was judged by; then
    what the output does not place (controls never applied, events without output, filtered
    records). :func:`bettercloud_reference` of it equals an exact output as a multiset."""
    relevant = _relevant_events(events)
    versions = _active_versions(controls)
    claimed = {}
    for rec in outputs:
        if rec.get("id") in relevant:
            claimed.setdefault(rec["id"], (rec.get("n"), rec.get("v")))
    order: list[tuple[str, dict]] = []
    placed_controls: set[str] = set()
    per_key: dict[tuple[str, str], list[tuple[int, int, dict]]] = defaultdict(list)
    for eid, (n, v) in claimed.items():
        _, event, join, key = relevant[eid]
        per_key[join, key].append((n, v, event))
    for (join, key), items in sorted(per_key.items()):
        pending = sorted(versions[join, key].items())
        for _, v, event in sorted(items, key=lambda x: x[0]):
            while pending and pending[0][0] <= v:
                order.append(("control", pending.pop(0)[1]))
                placed_controls.add(order[-1][1]["id"])
            order.append(("event", event))
    order += [("control", c) for c in controls if c["id"] not in placed_controls]
    order += [("event", e) for e in events if e["id"] not in claimed]
    return order
