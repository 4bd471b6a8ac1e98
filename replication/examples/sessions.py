"""Sessionization: a user's clicks less than a gap apart form a session; each session comes out
once, when the watermark passes its end, with its click count, pages and time span.

:func:`add_sessions` adds the pipeline to a job; :func:`sessions_reference` computes the exact
expected output in plain Python from the same clicks, so a run can be checked record by record.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from replication.api import Job
from replication.functions import Aggregator

GAP_MS = 300


class SessionStats(Aggregator):
    """Clicks, distinct pages (sorted) and the first and last click time of a session."""

    def create(self) -> list:
        return [0, [], None, None]

    def add(self, acc: list, click: dict) -> list:
        return self.merge(acc, [1, [click["page"]], click["ts"], click["ts"]])

    def merge(self, first: list, second: list) -> list:
        times = [t for t in (first[2], second[2], first[3], second[3]) if t is not None]
        return [first[0] + second[0], sorted(set(first[1]) | set(second[1])), min(times, default=None),
                max(times, default=None)]

    def result(self, key: Any, start: int, end: int, acc: list) -> dict:
        return {"user": key, "start": start, "end": end, "clicks": acc[0], "pages": acc[1],
                "first": acc[2], "last": acc[3]}


def add_sessions(job: Job, clicks_topic: str, out_topic: str, gap_ms: int = GAP_MS,
                 parallelism: int | None = None) -> None:
    """``clicks -> key_by(user) -> session_window(gap) -> sink``."""
    clicks = job.source(clicks_topic, deserializer="json", timestamp=lambda c: c["ts"], name="clicks")
    (clicks.key_by(lambda c: c["user"])
     .session_window(gap_ms, SessionStats(), name="sessions", parallelism=parallelism)
     .sink(out_topic, serializer="json", key_serializer="str", name="sessions-sink"))


def sessions_reference(clicks: Iterable[dict], gap_ms: int = GAP_MS) -> list[dict]:
    """Every session of ``clicks``, as :func:`add_sessions` emits it (in no particular order)."""
    by_user: dict[str, list[dict]] = defaultdict(list)
    for c in clicks:
        by_user[c["user"]].append(c)
    out = []
    for user, cs in by_user.items():
        cs.sort(key=lambda c: c["ts"])
        session: list[dict] = []
        for c in cs:
            if session and c["ts"] >= max(s["ts"] for s in session) + gap_ms:
                out.append(_session(user, session, gap_ms))
                session = []
            session.append(c)
        out.append(_session(user, session, gap_ms))
    return out


def _session(user: str, clicks: list[dict], gap_ms: int) -> dict:
    first, last = clicks[0]["ts"], max(c["ts"] for c in clicks)
    return {"user": user, "start": first, "end": last + gap_ms, "clicks": len(clicks),
            "pages": sorted({c["page"] for c in clicks}), "first": first, "last": last}
