"""Enrichment joins: orders looked up in a customers table kept from a compacted topic, and orders
matched with their payments within a time bound.

* ``enriched``: each order with its customer's row (``lookup_join``; the table is read with its
  metadata, so a tombstone deletes a customer);
* ``paid``: each order with each payment of it made from the order's time to ``PAY_WITHIN_MS``
  later (``interval_join``).

:func:`add_enrichment` adds both to a job; :func:`enrichment_reference` computes the exact expected
output in plain Python, for a run whose table was loaded before the first order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from replication.api import Job

PAY_WITHIN_MS = 500


def enrich(order: dict, customer: Any) -> dict:
    return {"order": order["id"], "customer": order["customer"], "amount": order["amount"],
            "tier": None if customer is None else customer["tier"]}


def paid(order: dict, payment: dict) -> dict:
    return {"order": order["id"], "payment": payment["id"], "amount": order["amount"],
            "late_by_ms": payment["ts"] - order["ts"]}




def add_enrichment(job: Job, orders_topic: str, payments_topic: str, customers_topic: str, enriched_topic: str,
                   paid_topic: str, parallelism: int | None = None) -> None:
    """``orders ⋈ customers -> enriched`` and ``orders ⋈[0, PAY_WITHIN_MS] payments -> paid``."""
    orders = job.source(orders_topic, deserializer="json", timestamp=lambda o: o["ts"], name="orders")
    payments = job.source(payments_topic, deserializer="json", timestamp=lambda p: p["ts"], name="payments")
    customers = job.source(customers_topic, deserializer="json", metadata=True, key_deserializer="str",
                           timestamp=lambda r: r.timestamp, name="customers")
    (orders.key_by(lambda o: o["customer"])
     .lookup_join(customers.key_by(lambda r: r.key), enrich, name="enrich", parallelism=parallelism)
     .sink(enriched_topic, serializer="json", key_serializer="str", name="enriched-sink"))
    (orders.key_by(lambda o: o["id"])
     .interval_join(payments.key_by(lambda p: p["order"]), 0, PAY_WITHIN_MS, paid, name="pay",
                    parallelism=parallelism)
     .sink(paid_topic, serializer="json", key_serializer="str", name="paid-sink"))


def enrichment_reference(orders: Iterable[dict], payments: Iterable[dict], customers: dict[str, dict | None]
                         ) -> tuple[list[dict], list[dict]]:
    """(enriched, paid) for ``orders`` and ``payments`` against the final ``customers`` table
    (customer id -> row, None: deleted)."""
    orders = list(orders)
    enriched = [enrich(o, customers.get(o["customer"])) for o in orders]
    by_order: dict[str, list[dict]] = {}
    for p in payments:
        by_order.setdefault(p["order"], []).append(p)
    matched = [paid(o, p) for o in orders for p in by_order.get(o["id"], [])
               if o["ts"] <= p["ts"] <= o["ts"] + PAY_WITHIN_MS]
    return enriched, matched
