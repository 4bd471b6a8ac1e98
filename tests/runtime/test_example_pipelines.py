"""The sessionization and enrichment examples' operators on a fake hosting instance: their output
equals the examples' plain-Python references of the same input (the integration test runs them
on real executors with a kill and a move)."""

from __future__ import annotations

import json
from collections import Counter

from replication.aggregators import Count
from replication.api import _RunningReduce
from replication.examples.clickstream import (
    FLUSH_AFTER_MS,
    SLIDING_SIZE_MS,
    SLIDING_SLIDE_MS,
    BatchByProcessingTime,
    add_up,
    batched_clicks,
    clicks_counted,
    one_click,
    pages_reference,
    running_reference,
)
from replication.examples.enrichment import (
    PAIR_WINDOW_MS,
    PAY_WITHIN_MS,
    enrich,
    enrichment_reference,
    paid,
    same_second,
    same_second_reference,
)
from replication.examples.fraud import FraudRule, PaymentGenerator, generate, is_valid, reference
from replication.examples.sessions import (
    GAP_MS,
    RecentClicks,
    SessionStats,
    recent_clicks_reference,
    sessions_reference,
)
from replication.joins import IntervalJoin, LookupJoin, WindowJoin
from replication.records import KafkaRecord
from replication.runtime.elements import MAX_WATERMARK
from replication.runtime.operators import ProcessOperator
from replication.runtime.windows import SessionWindowOperator, WindowOperator
from replication.windowing import Windows
from rhino_state import RocksDBStateBackend
from tests.runtime.test_operators import FakeEnv, chain, rec
from tests.system.test_joins_runtime import _events, _table


def stored(backend) -> int:
    return sum(1 for _ in backend.iter_key_groups(range(FakeEnv().num_key_groups)))


def counted(records):
    return Counter(json.dumps(r, sort_keys=True) for r in records)


def test_the_examples_operators_give_their_references(tmp_path):
    orders, payments, clicks = _events(1_000_000)
    rows, table = _table()
    with RocksDBStateBackend(tmp_path / "db") as backend:
        sessions = SessionWindowOperator("sessions", FakeEnv(backend), Windows.session(GAP_MS), SessionStats())
        out = chain(sessions)
        for c in clicks:
            sessions.process(rec(c, key=c["user"], ts=c["ts"]))
            sessions.on_watermark(c["ts"] - 1)
        sessions.on_watermark(MAX_WATERMARK)
        assert counted(out.values) == counted(sessions_reference(clicks))

    with RocksDBStateBackend(tmp_path / "recent") as backend:
        recent = ProcessOperator("recent", FakeEnv(backend), RecentClicks())
        out = chain(recent)
        most = 0
        for i, c in enumerate(clicks):
            recent.process(rec(c, key=c["user"], ts=c["ts"]))
            recent.on_watermark(c["ts"] - 40)
            if i % 40 == 39:
                most = max(most, stored(backend))
        assert counted(out.values) == counted(recent_clicks_reference(clicks))
        assert most < len(clicks) // 2  # swept as it goes: a user keeps only its last span's clicks
        recent.on_watermark(MAX_WATERMARK)
        assert stored(backend) == 0

        lookup = ProcessOperator("enrich", FakeEnv(backend), LookupJoin(enrich))
        enriched = chain(lookup)
        for offset, (key, value) in enumerate(rows):
            row = KafkaRecord(value=None if value is None else json.loads(value), key=key.decode(), headers=(),
                              timestamp=0, topic="customers", partition=0, offset=offset)
            lookup.process2(rec(row, key=key.decode(), ts=0))
        pay = ProcessOperator("pay", FakeEnv(backend), IntervalJoin(0, PAY_WITHIN_MS, paid))
        matched = chain(pay)
        pairs = ProcessOperator("pairs", FakeEnv(backend), WindowJoin(PAIR_WINDOW_MS, same_second))
        paired = chain(pairs)
        timeline = sorted([(o["ts"], 0, o) for o in orders] + [(p["ts"], 1, p) for p in payments],
                          key=lambda e: (e[0], e[1]))
        for ts, side, value in timeline:
            if side == 0:
                lookup.process(rec(value, key=value["customer"], ts=ts))
                pay.process(rec(value, key=value["id"], ts=ts))
                pairs.process(rec(value, key=value["id"], ts=ts))
            else:
                pay.process2(rec(value, key=value["order"], ts=ts))
                pairs.process2(rec(value, key=value["order"], ts=ts))
            pay.on_watermark(ts - 1)
            pairs.on_watermark(ts - 1)
        pay.on_watermark(MAX_WATERMARK)
        pairs.on_watermark(MAX_WATERMARK)
        want_enriched, want_paid = enrichment_reference(orders, payments, table)
        assert counted(enriched.values) == counted(want_enriched)
        assert counted(matched.values) == counted(want_paid)
        assert counted(paired.values) == counted(same_second_reference(orders, payments))
        assert 0 < len(paired.values) < len(payments)  # some payments fall in the next second


def test_the_demos_fraud_rule_expires_idle_cards_and_gives_its_reference(tmp_path):
    """The rule decides as the reference does (a card idle for CARD_IDLE_MS starts afresh, whether
    its timer fired before its next payment or not), and its timers clear idle cards' state."""
    eu, us = PaymentGenerator("eu"), PaymentGenerator("us")
    _, pay_eu, _ = generate(eu, 800, start_ts=1_700_000_000_000, step_ms=20)
    _, pay_us, _ = generate(us, 800, start_ts=1_700_000_000_000, step_ms=20)
    expected, _ = reference([pay_eu, pay_us])
    with RocksDBStateBackend(tmp_path / "db") as backend:
        op = ProcessOperator("fraud-rule", FakeEnv(backend), FraudRule())
        out = chain(op)
        for i, p in enumerate(sorted(pay_eu + pay_us, key=lambda p: p["ts"])):
            if is_valid(p):
                op.process(rec(p, key=p["card"], ts=p["ts"]))
            if i % 50 == 0:
                op.on_watermark(p["ts"] - 3_000)  # a lagging watermark: some timers fire late
        assert counted(out.values) == counted(expected)
        assert any(d != e for d, e in zip(expected, reference([pay_eu, pay_us], idle_ms=10**12)[0], strict=True))
        op.on_watermark(MAX_WATERMARK)
        assert stored(backend) == 0


def test_the_clickstream_pipelines_give_their_references(tmp_path):
    _, _, clicks = _events(1_000_000)
    with RocksDBStateBackend(tmp_path / "db") as backend:
        running = ProcessOperator("running", FakeEnv(backend), _RunningReduce(add_up))
        pages = WindowOperator("pages", FakeEnv(backend), Windows.sliding(SLIDING_SIZE_MS, SLIDING_SLIDE_MS), Count())
        batches = ProcessOperator("batches", FakeEnv(backend), BatchByProcessingTime())
        outs = [chain(op) for op in (running, pages, batches)]
        clock = 5_000
        for i, c in enumerate(clicks):
            running.process(rec(one_click(c), key=c["user"], ts=c["ts"]))
            pages.process(rec(c, key=c["page"], ts=c["ts"]))
            batches.process(rec(c, key=c["user"], ts=c["ts"]))
            for op in (running, pages, batches):
                op.on_watermark(c["ts"] - 1)
            if i % 7 == 0:  # a pulse: processing time goes on at its own pace
                clock += 60
                batches.on_pulse(i, clock)
        batches.on_pulse(10**6, clock + FLUSH_AFTER_MS)
        for op in (running, pages, batches):
            op.on_watermark(MAX_WATERMARK)
    assert counted(outs[0].values) == counted(running_reference(clicks))
    assert {(w["key"], w["start"]): w["value"] for w in outs[1].values} == pages_reference(clicks)
    assert len(outs[1].values) == len(pages_reference(clicks))
    assert batched_clicks(outs[2].values) == clicks_counted(clicks)
    assert all(b["clicks"] == sorted(b["clicks"]) for b in outs[2].values)
    assert 1 < len(outs[2].values) < len(clicks) / 2  # batched: several clicks a batch
