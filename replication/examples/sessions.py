"""Sessionization: a user's clicks less than a gap apart form a session; each session comes out
once, when the watermark passes its end, with its click count, pages and time span.  Beside it,
each click with the number of its user's clicks in the span before it, kept in list state with a
TTL, so the state of users who go quiet is swept away.

:func:`add_sessions` and :func:`add_recent_clicks` add the pipelines to a job;
:func:`sessions_reference` and :func:`recent_clicks_reference` compute the exact expected output
in plain Python from the same clicks, so a run can be checked record by record.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from replication.api import DataStream, Job
from replication.functions import Aggregator, KeyedProcessFunction, StateTtl

GAP_MS = 300
RECENT_MS = 4 * GAP_MS


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
                 parallelism: int | None = None) -> DataStream:
    """``clicks -> key_by(user) -> session_window(gap) -> sink``; the clicks' stream, for more
    pipelines on it."""
    clicks = job.source(clicks_topic, deserializer="json", timestamp=lambda c: c["ts"], name="clicks")
    (clicks.key_by(lambda c: c["user"])
     .session_window(gap_ms, SessionStats(), name="sessions", parallelism=parallelism)
     .sink(out_topic, serializer="json", key_serializer="str", name="sessions-sink"))
    return clicks


class RecentClicks(KeyedProcessFunction):
    """Each click with how many clicks its user made in the ``span_ms`` of event time up to it
    (itself included).  The click times are kept in list state with a TTL of the span: an element
    is visible while it may still count (the watermark never passes a click being processed), and
    swept once it cannot."""

    def __init__(self, span_ms: int = RECENT_MS) -> None:
        self.span_ms = span_ms

    def open(self, ctx):
        self.times = ctx.list_state("click_times", ttl=StateTtl(self.span_ms))

    def process(self, click: dict, ctx):
        self.times.add(click["ts"])
        since = click["ts"] - self.span_ms
        yield {"user": ctx.key, "ts": click["ts"], "recent": sum(1 for t in self.times.get() if t > since)}


def add_recent_clicks(clicks: DataStream, out_topic: str, span_ms: int = RECENT_MS,
                      parallelism: int | None = None) -> None:
    """``clicks -> key_by(user) -> process(RecentClicks) -> sink`` (``clicks``: the stream
    :func:`add_sessions` returns)."""
    (clicks.key_by(lambda c: c["user"])
     .process(RecentClicks(span_ms), name="recent", parallelism=parallelism)
     .sink(out_topic, serializer="json", key_serializer="str", name="recent-sink"))


def recent_clicks_reference(clicks: Iterable[dict], span_ms: int = RECENT_MS) -> list[dict]:
    """What :func:`add_recent_clicks` emits for ``clicks`` (a user's clicks have distinct times)."""
    by_user: dict[str, list[int]] = defaultdict(list)
    for c in clicks:
        by_user[c["user"]].append(c["ts"])
    return [{"user": user, "ts": t, "recent": sum(1 for u in times if t - span_ms < u <= t)}
            for user, times in by_user.items() for t in times]


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
