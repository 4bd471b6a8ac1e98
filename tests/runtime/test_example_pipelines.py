"""Examples' operators on a fake hosting instance, where a test drives them by hand: the TTL'd
list state of the clicks stays bounded while a lagging watermark moves, and the demo's fraud rule
expires idle cards.  (Every example's output against its reference: tests/replication/
test_testing.py, through the harness; on real executors with a kill and a move:
tests/system/test_joins_runtime.py.)"""

from __future__ import annotations

import json
from collections import Counter

from replication.examples.fraud import FraudRule, PaymentGenerator, generate, is_valid, reference
from replication.examples.sessions import RecentClicks, recent_clicks_reference
from replication.runtime.elements import MAX_WATERMARK
from replication.runtime.operators import ProcessOperator
from rhino_state import RocksDBStateBackend
from tests.example_inputs import order_events
from tests.runtime.test_operators import FakeEnv, chain, rec


def stored(backend) -> int:
    return sum(1 for _ in backend.iter_key_groups(range(FakeEnv().num_key_groups)))


def counted(records):
    return Counter(json.dumps(r, sort_keys=True) for r in records)


def test_the_recent_clicks_ttl_keeps_the_state_bounded_by_its_span(tmp_path):
    _, _, clicks = order_events(1_000_000)
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

