"""Inputs of the example jobs' tests: a compacted customers topic and orders, payments and clicks
in event-time order (the joins integration test, the harness tests and the examples' unit tests
share them, and each compares with the examples' plain-Python references)."""

from __future__ import annotations

import json

from replication.examples.sessions import GAP_MS

CUSTOMERS = 30


def customer_table() -> tuple[list[tuple[bytes, bytes | None]], dict[str, dict | None]]:
    """The customers topic (rows, a few updated, a few deleted by tombstones) and the table it ends as."""
    records: list[tuple[bytes, bytes | None]] = []
    table: dict[str, dict | None] = {}
    for i in range(CUSTOMERS):
        row = {"tier": "gold" if i % 3 == 0 else "basic"}
        records.append((f"c{i}".encode(), json.dumps(row).encode()))
        table[f"c{i}"] = row
    for i in range(0, CUSTOMERS, 7):  # updates
        table[f"c{i}"] = {"tier": "platinum"}
        records.append((f"c{i}".encode(), json.dumps(table[f"c{i}"]).encode()))
    for i in range(5, CUSTOMERS, 11):  # tombstones: the key is deleted
        table[f"c{i}"] = None
        records.append((f"c{i}".encode(), None))
    return records, table


def order_events(start_ts: int) -> tuple[list[dict], list[dict], list[dict]]:
    """Orders (to customers c0..c33: some unknown), payments of them (some too late for the join)
    and clicks with pauses (sessions), all in event-time order."""
    orders, payments, clicks = [], [], []
    for i in range(240):
        ts = start_ts + 15 * i
        orders.append({"id": f"o{i}", "customer": f"c{i % (CUSTOMERS + 4)}", "amount": i % 50 + 1, "ts": ts})
        for j, delay in enumerate((60, 380, 700)[: i % 4]):
            payments.append({"id": f"p{i}-{j}", "order": f"o{i}", "ts": ts + delay})
    for i in range(480):  # every 40 clicks all users pause for two gaps: their sessions end
        clicks.append({"user": f"u{i % 8}", "page": f"/p{i % 5}", "ts": start_ts + 8 * i + (i // 40) * 2 * GAP_MS})
    payments.sort(key=lambda p: p["ts"])
    clicks.sort(key=lambda c: c["ts"])
    return orders, payments, clicks
