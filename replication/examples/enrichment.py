"""Enrichment joins: orders looked up in a customers table kept from a compacted topic, and orders
matched with their payments within a time bound.

* ``enriched``: each order with its customer's row (``lookup_join``; the table is read with its
  metadata, so a tombstone deletes a customer);
* ``paid``: each order with each payment of it made from the order's time to ``PAY_WITHIN_MS``
  later (``interval_join``);
* ``same_second``: each order with each payment of it in the same second of event time
  (``window_join``; optional).

:func:`add_enrichment` adds them to a job; :func:`enrichment_reference` and
:func:`same_second_reference` compute the exact expected output in plain Python, for a run whose
table was loaded before the first order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from replication.api import Job

PAY_WITHIN_MS = 500
PAIR_WINDOW_MS = 1000


def enrich(order: dict, customer: Any) -> dict:
    return {"order": order["id"], "customer": order["customer"], "amount": order["amount"],
            "tier": None if customer is None else customer["tier"]}


def paid(order: dict, payment: dict) -> dict:
    return {"order": order["id"], "payment": payment["id"], "amount": order["amount"],
            "late_by_ms": payment["ts"] - order["ts"]}




def same_second(order: dict, payment: dict) -> dict:
    return {"order": order["id"], "payment": payment["id"], "second": order["ts"] // PAIR_WINDOW_MS}


def add_enrichment(job: Job, orders_topic: str, payments_topic: str, customers_topic: str, enriched_topic: str,
                   paid_topic: str, parallelism: int | None = None, same_second_topic: str | None = None) -> None:
    """``orders ⋈ customers -> enriched``, ``orders ⋈[0, PAY_WITHIN_MS] payments -> paid`` and, with
    ``same_second_topic``, ``orders ⋈[window PAIR_WINDOW_MS] payments`` to it."""
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
    if same_second_topic is not None:
        (orders.key_by(lambda o: o["id"])
         .window_join(payments.key_by(lambda p: p["order"]), PAIR_WINDOW_MS, same_second, name="pairs",
                      parallelism=parallelism)
         .sink(same_second_topic, serializer="json", key_serializer="str", name="pairs-sink"))


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


def same_second_reference(orders: Iterable[dict], payments: Iterable[dict]) -> list[dict]:
    """What the window join emits for ``orders`` and ``payments``."""
    by_order: dict[str, list[dict]] = {}
    for p in payments:
        by_order.setdefault(p["order"], []).append(p)
    return [same_second(o, p) for o in orders for p in by_order.get(o["id"], [])
            if o["ts"] // PAIR_WINDOW_MS == p["ts"] // PAIR_WINDOW_MS]
