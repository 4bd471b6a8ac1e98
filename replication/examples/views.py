"""Page views counted per page, with a plain-Python reference of the exact output:

* repeats (a view sent again by a retrying client, same ``id``) are dropped by a keyed function
  that remembers each id in value state with a **processing-time TTL**: the memory of an id is
  gone a few seconds after its last view, so the state stays flat however many ids come;
* the unique views are counted per page in **tumbling windows** of one second of event time with
  **allowed lateness**: a view for a window that has fired, within the lateness, updates it (the
  window is emitted again with the new count); a view later than that goes to a **side output**
  of its own instead of the dead-letter topic.

:func:`add_page_views` builds it; :func:`views_reference` gives what it emits for views fed in two
phases (the on-time views, then late ones once the first windows have fired).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from replication.aggregators import Count
from replication.api import Job
from replication.functions import KeyedProcessFunction, OutputTag, StateTtl

VIEW_WINDOW_MS = 1000
VIEW_LATENESS_MS = 10_000
# of processing time: a repeat comes right after its original, but may be processed later (a
# handover's target holds the moved keys' records until its release: 3 s in the tests)
REPEAT_TTL_MS = 10_000
LATE_VIEWS = OutputTag("late-views")


class DropRepeats(KeyedProcessFunction):
    """Each view once (keyed by its id): an id seen in the last ``ttl_ms`` of processing time is a
    repeat."""

    def __init__(self, ttl_ms: int = REPEAT_TTL_MS) -> None:
        self.ttl_ms = ttl_ms

    def open(self, ctx):
        self.seen = ctx.value_state("seen", default=False, ttl=StateTtl(self.ttl_ms, time="processing"))

    def process(self, view: dict, ctx):
        if not self.seen.value():
            self.seen.update(True)
            yield view


def add_page_views(job: Job, views_topic: str, counts_topic: str, late_topic: str,
                   parallelism: int | None = None) -> None:
    """``views -> key_by(id) -> process(DropRepeats) -> key_by(page) -> window(1 s, Count,
    lateness 10 s) -> sink``, and the window's too-late views to ``late_topic``."""
    views = job.source(views_topic, deserializer="json", timestamp=lambda v: v["ts"], name="views")
    counts = (views.key_by(lambda v: v["id"])
              .process(DropRepeats(), name="unique", parallelism=parallelism)
              .key_by(lambda v: v["page"])
              .window(VIEW_WINDOW_MS, Count(), allowed_lateness_ms=VIEW_LATENESS_MS, late_output=LATE_VIEWS,
                      name="views-per-page", parallelism=parallelism))
    counts.sink(counts_topic, serializer="json", key_serializer="str", name="views-sink")
    counts.side_output(LATE_VIEWS).sink(late_topic, serializer="json", key_serializer="str",
                                        name="late-views-sink")


def page_views(start_ts: int, pages: int = 5, n: int = 400, repeat_every: int = 7) -> tuple[list[dict], list[dict]]:
    """The two phases of the input: on-time views (every ``repeat_every``-th sent twice in a row),
    from the window-aligned ``start_ts`` on, in event-time order; then per page one view for the
    first window (late, within the lateness) and one 20 s before it (later than the lateness)."""
    on_time: list[dict] = []
    for i in range(n):
        view = {"id": f"v{i}", "page": f"/p{i % pages}", "ts": start_ts + 15 * i}
        on_time += [view, view] if i % repeat_every == 0 else [view]
    late = []
    for p in range(pages):
        late.append({"id": f"late{p}", "page": f"/p{p}", "ts": start_ts + 500 + p})
        late.append({"id": f"lost{p}", "page": f"/p{p}", "ts": start_ts - 20_000 + p})
    return on_time, late


def views_reference(on_time: Iterable[dict], late: Iterable[dict]) -> tuple[Counter, list[dict]]:
    """What :func:`add_page_views` emits when ``late`` is fed once every page's first window has
    fired and before any later view: the windows as a multiset of ``(page, start, count)`` (a
    window a late view updated is there twice: its count at the fire, then one more), and the
    views that went to the side output."""
    seen: set[str] = set()
    counts: Counter = Counter()
    for v in on_time:
        if v["id"] not in seen:
            seen.add(v["id"])
            counts[(v["page"], v["ts"] - v["ts"] % VIEW_WINDOW_MS)] += 1
    emitted = Counter((page, start, n) for (page, start), n in counts.items())
    # the watermark when the late views come: past the end of the first windows (they fired), and
    # at most the newest on-time view's time
    first_end = min(start for _, start in counts) + VIEW_WINDOW_MS
    newest = max(v["ts"] for v in on_time)
    too_late = []
    for v in late:
        start = v["ts"] - v["ts"] % VIEW_WINDOW_MS
        end = start + VIEW_WINDOW_MS
        if end + VIEW_LATENESS_MS <= first_end:
            too_late.append(v)
        elif end <= first_end and end + VIEW_LATENESS_MS > newest:
            counts[(v["page"], start)] += 1
            emitted[(v["page"], start, counts[(v["page"], start)])] += 1
        else:
            raise ValueError(f"view {v['id']} may or may not be late: the reference cannot tell")
    return emitted, too_late
