"""List state and state TTL (rhino_state.state, rhino_state.ttl) over a real RocksDB: expired values
are invisible once the watermark (by processing time: the pulses' time) reaches their expiry, and
the scheduled sweeps delete them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhino_state import RocksDBStateBackend, StateContext, StateTtl
from rhino_state.timers import TimerQueue

G = 16


@pytest.fixture
def ctx(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as backend:
        context = StateContext(backend, "op", G)
        context.sweeps = TimerQueue(backend, context.reserve_id("__ttl_sweeps"), G)
        context.processing_sweeps = TimerQueue(backend, context.reserve_id("__ttl_processing_sweeps"), G)
        yield context


def sweep_until(ctx: StateContext, wm: int) -> None:
    ctx.set_time(wm, wm)
    while (due := ctx.sweeps.pop_due(wm)) is not None:
        ctx.sweep(due[1], due[2])


def pulse_until(ctx: StateContext, t: int) -> None:
    ctx.processing_time = t
    while (due := ctx.processing_sweeps.pop_due(t)) is not None:
        ctx.sweep(due[1], due[2])


def entries(ctx: StateContext) -> int:
    return sum(1 for _ in ctx.backend.iter_key_groups(range(G)))


def test_list_state_appends_reads_in_order_replaces_and_clears_per_key(ctx):
    items = ctx.list_state("items")
    ctx.set_current_key("a")
    assert items.get() == [] and items.is_empty()
    items.add(1)
    items.add_all([2, {"x": 3}])
    ctx.set_current_key("b")
    items.add("other")
    ctx.set_current_key("a")
    assert items.get() == [1, 2, {"x": 3}] and not items.is_empty()
    items.update(["new"])
    assert items.get() == ["new"]
    items.clear()
    assert items.get() == [] and items.is_empty()
    ctx.set_current_key("b")
    assert items.get() == ["other"]
    with pytest.raises(ValueError, match="already registered as ListState"):
        ctx.map_state("items")


def test_a_ttl_value_is_gone_once_the_watermark_reaches_its_expiry_and_a_write_refreshes_it(ctx):
    profile = ctx.value_state("profile", default="none", ttl=StateTtl(100))
    ctx.set_current_key("k")
    ctx.set_time(1000, 900)
    profile.update("v1")  # expires at 1100
    ctx.set_time(1050, 1099)
    assert profile.value() == "v1"
    profile.update("v2")  # written at 1099: expires at 1199
    ctx.set_time(1150, 1150)
    assert profile.value() == "v2"
    ctx.set_time(1200, 1199)
    assert profile.value() == "none"
    with pytest.raises(ValueError, match="another TTL"):
        ctx.value_state("profile", default="none", ttl=StateTtl(5))
    with pytest.raises(ValueError, match="positive int"):
        StateTtl(0)


def test_map_entries_and_list_elements_expire_one_by_one_and_sweeps_delete_them(ctx):
    seen = ctx.map_state("seen", ttl=StateTtl(80))
    recent = ctx.list_state("recent", ttl=StateTtl(80))
    ctx.set_current_key(7)
    ctx.set_time(0, 0)
    seen.put("early", 1)
    recent.add("early")
    ctx.set_time(50, 0)
    seen.put("late", 2)
    recent.add("late")
    assert entries(ctx) > 4
    sweep_until(ctx, 85)  # "early" (expiry 80) went, "late" (130) stays
    ctx.set_current_key(7)
    assert dict(seen.items()) == {"late": 2} and recent.get() == ["late"]
    assert seen.contains("late") and not seen.contains("early") and seen.get("early", "gone") == "gone"
    sweep_until(ctx, 10**6)
    assert seen.is_empty() and recent.is_empty()
    assert entries(ctx) == 0  # values, entries, elements, the list's index and the sweeps: all gone


def test_a_processing_time_ttl_follows_the_pulses_time_not_the_watermark(ctx):
    by_pulse = ctx.list_state("by_pulse", ttl=StateTtl(100, time="processing"))
    by_event = ctx.list_state("by_event", ttl=StateTtl(100))
    ctx.set_current_key("k")
    ctx.processing_time = 5000
    ctx.set_time(10, 0)
    by_pulse.add("p1")  # expires at pulse time 5100, whatever the watermark
    by_event.add("e1")  # expires at watermark 110
    ctx.set_time(10**6, 10**6)
    assert by_pulse.get() == ["p1"] and by_event.get() == []
    ctx.processing_time = 5060
    by_pulse.add("p2")  # 5160
    pulse_until(ctx, 5100)
    ctx.set_current_key("k")
    assert by_pulse.get() == ["p2"]
    sweep_until(ctx, 10**6)
    pulse_until(ctx, 5160)
    assert entries(ctx) == 0


def test_a_processing_time_ttl_is_refused_where_no_pulses_carry_processing_time(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as backend:
        context = StateContext(backend, "op", G)
        with pytest.raises(TypeError, match="state 'seen' of operator 'op' has a processing-time TTL: processing "
                                            "time comes with LiveRobin's pulses"):
            context.map_state("seen", ttl=StateTtl(10, time="processing"))
        context.map_state("seen", ttl=StateTtl(10))  # by event time: fine
    with pytest.raises(ValueError, match="StateTtl.time must be 'event' or 'processing', got 'wall'"):
        StateTtl(10, time="wall")


def test_state_without_ttl_is_never_swept(ctx):
    plain = ctx.value_state("plain")
    ctx.set_current_key("k")
    ctx.set_time(0, 0)
    plain.update(1)
    sweep_until(ctx, 10**9)
    assert plain.value() == 1 and ctx.sweeps.next_timestamp() is None


@settings(max_examples=50, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["a", "b", 3]), st.sampled_from(["put", "add", "sweep"]),
                                st.integers(0, 30)), max_size=40))
def test_what_a_ttl_state_shows_equals_a_model_of_expiries(tmp_path_factory, steps):
    """Entries put or added at event time t are visible while the watermark is below t + ttl."""
    ttl = 20
    with RocksDBStateBackend(tmp_path_factory.mktemp("ttl")) as backend:
        ctx = StateContext(backend, "op", G)
        ctx.sweeps = TimerQueue(backend, ctx.reserve_id("__ttl_sweeps"), G)
        m, lst = ctx.map_state("m", ttl=StateTtl(ttl)), ctx.list_state("l", ttl=StateTtl(ttl))
        model_map: dict = {}
        model_list: dict = {}
        wm = 0
        for i, (key, op, dt) in enumerate(steps):
            wm += dt // 3
            now = wm + dt
            ctx.set_current_key(key)
            ctx.set_time(now, wm)
            if op == "put":
                m.put(i % 4, i)
                model_map[(key, i % 4)] = (now + ttl, i)
            elif op == "add":
                lst.add(i)
                model_list.setdefault(key, []).append((now + ttl, i))
            else:
                sweep_until(ctx, wm)
            for k in ("a", "b", 3):
                ctx.set_current_key(k)
                ctx.set_time(wm, wm)
                assert dict(m.items()) == {mk: v for (kk, mk), (exp, v) in model_map.items()
                                           if kk == k and exp > wm}
                assert lst.get() == [v for exp, v in model_list.get(k, []) if exp > wm]


def test_a_new_version_may_add_or_remove_a_ttl_and_each_value_keeps_what_it_was_written_with(ctx):
    """A function's replacement (or a run from a savepoint) may change whether a state has a TTL:
    values written without one stay until written again, values written with one read as their
    value, pairs included (a pair is not taken for an expiry and a value)."""
    ctx.set_time(100, 100)
    ctx.set_current_key("a")
    ctx.value_state("n", 0).update(5)
    ctx.value_state("pair").update((1, "x"))
    ctx.map_state("m").put("k", (2, 3))
    ctx.list_state("l").add_all([(4, 5), 6])
    ctx.forget_handles()
    ttl = StateTtl(1000)
    n, pair = ctx.value_state("n", 0, ttl=ttl), ctx.value_state("pair", ttl=ttl)
    m, lst = ctx.map_state("m", ttl=ttl), ctx.list_state("l", ttl=ttl)
    sweep_until(ctx, 10_000)
    assert (n.value(), pair.value(), m.get("k"), lst.get()) == (5, (1, "x"), (2, 3), [(4, 5), 6])
    n.update(7)  # written with the TTL now: it expires
    sweep_until(ctx, 20_000)
    assert n.value() == 0 and pair.value() == (1, "x")
    ctx.set_current_key("b")
    ctx.value_state("n", 0, ttl=ttl).update(9)
    ctx.map_state("m", ttl=ttl).put("k", (8, 9))
    ctx.forget_handles()
    plain_n, plain_m = ctx.value_state("n", 0), ctx.map_state("m")
    assert plain_n.value() == 9 and plain_m.get("k") == (8, 9)
    sweep_until(ctx, 50_000)  # the sweeps the TTL writes scheduled delete nothing now
    assert plain_n.value() == 9 and plain_m.get("k") == (8, 9)
