"""Event-time timers, state TTL and seeded randomness of keyed process functions (ProcessOperator),
driven by a fake hosting instance over a real RocksDB: timers fire when the watermark reaches them,
in a deterministic order, once; expired state is invisible and removed, so the state of keys that
go quiet does not pile up; both survive a restore and move with their keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.examples.ordered import HashChain, timer_due, verify_chains, verify_side_output
from replication.functions import KeyedProcessFunction
from replication.plan import OutputEdge
from replication.runtime.elements import MAX_WATERMARK, MIN_WATERMARK
from replication.runtime.operators import MapOperator, ProcessOperator, Router
from replication.runtime.pulse_actions import replay_held
from rhino_state import RocksDBStateBackend, RoutingTable, StateTtl, encode_key, key_group
from tests.runtime.test_operators import FakeChannel, FakeEnv, G, chain, rec


class Reminders(KeyedProcessFunction):
    """A record ``{"at": [ts...], "cancel": [ts...]}`` registers and deletes timers of its key;
    a timer emits ``(key, ts, records seen by the key)`` and, with ``again``, one more timer."""

    def __init__(self, again: int | None = None) -> None:
        self.again = again

    def open(self, ctx):
        self.seen = ctx.value_state("seen", 0)

    def process(self, value, ctx):
        self.seen.update(self.seen.value() + 1)
        for ts in value.get("at", ()):
            ctx.timers.register_event_time_timer(ts)
        for ts in value.get("cancel", ()):
            ctx.timers.delete_event_time_timer(ts)
        return None

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain == "event_time" and ctx.timestamp == timestamp
        if self.again is not None and timestamp < self.again:
            ctx.timers.register_event_time_timer(timestamp + 1)
        yield (ctx.key, timestamp, self.seen.value())


def order(key, ts):
    kb = encode_key(key)
    return ts, key_group(kb, G), len(kb).to_bytes(4, "big") + kb


@pytest.fixture
def backend(tmp_path):
    with RocksDBStateBackend(tmp_path / "state") as b:
        yield b


def test_timers_fire_when_the_watermark_reaches_them_before_it_goes_downstream(backend):
    op = ProcessOperator("r", FakeEnv(backend), Reminders())
    out = chain(op)
    op.process(rec({"at": [20, 10]}, key="a", ts=1))
    op.process(rec({"at": [10, 20, 20]}, key="b", ts=2))
    op.process(rec({"at": [30]}, key="a", ts=3))
    op.on_watermark(9)
    assert out.records == [] and out.watermarks == [9]
    op.on_watermark(20)
    fired = [r[1] for r in out.records]
    assert sorted(fired, key=lambda f: order(f[0], f[1])) == fired
    assert sorted(fired) == [("a", 10, 2), ("a", 20, 2), ("b", 10, 1), ("b", 20, 1)]
    assert [(r[2], r[3], r[5]) for r in out.records] == [(f[0], f[1], None) for f in fired]  # key, event time
    assert out.watermarks == [9, 20]
    op.on_watermark(40)
    assert out.records[-1][1] == ("a", 30, 2) and len(out.records) == 5


def test_a_deleted_timer_does_not_fire_and_one_behind_the_watermark_fires_at_the_next(backend):
    op = ProcessOperator("r", FakeEnv(backend), Reminders())
    out = chain(op)
    op.on_watermark(100)
    op.process(rec({"at": [50, 60, 70]}, key=1, ts=101))
    op.process(rec({"cancel": [60]}, key=1, ts=102))
    op.state.set_current_key(1)
    assert op.timers.event_time_timers() == [50, 70]
    op.on_watermark(101)
    assert [r[1][1] for r in out.records] == [50, 70]


def test_a_timer_registered_by_a_timer_fires_in_the_same_watermark_if_due(backend):
    op = ProcessOperator("r", FakeEnv(backend), Reminders(again=13))
    out = chain(op)
    op.process(rec({"at": [10]}, key="k", ts=1))
    op.on_watermark(12)
    assert [r[1][1] for r in out.records] == [10, 11, 12]
    op.on_watermark(20)
    assert [r[1][1] for r in out.records] == [10, 11, 12, 13]


def test_timers_without_on_timer_and_a_raising_on_timer_dead_letter_naming_the_operator(backend):
    class NoTimer(KeyedProcessFunction):
        def process(self, value, ctx):
            ctx.timers.register_event_time_timer(5)

    env = FakeEnv(backend)
    op = ProcessOperator("plain", env, NoTimer())
    chain(op)
    op.process(rec("x", key="k", ts=1, origin=("in", 0, 3)))
    assert "operator 'plain' registers a timer but its function does not override on_timer" in \
        env.dead_letters[0]["reason"]

    class Raises(Reminders):
        def on_timer(self, timestamp, ctx):
            if ctx.key == "bad":
                raise ValueError("boom")
            yield ctx.key

    op = ProcessOperator("raising", env, Raises())
    out = chain(op)
    op.process(rec({"at": [5]}, key="bad", ts=1))
    op.process(rec({"at": [5]}, key="good", ts=1))
    op.on_watermark(5)
    assert out.values == ["good"]
    letter = env.dead_letters[-1]
    assert letter["operator"] == "raising" and "boom" in letter["reason"] and b'"timer": 5' in letter["payload"]


def test_state_names_starting_with_two_underscores_are_reserved(backend):
    class Greedy(KeyedProcessFunction):
        def open(self, ctx):
            ctx.value_state("__event_timers")

    with pytest.raises(ValueError, match="reserved"):
        ProcessOperator("g", FakeEnv(backend), Greedy())


def test_a_moved_key_group_takes_its_timers_along(tmp_path):
    with RocksDBStateBackend(tmp_path / "o") as ob, RocksDBStateBackend(tmp_path / "t") as tb:
        origin = ProcessOperator("r", FakeEnv(ob), Reminders())
        target = ProcessOperator("r", FakeEnv(tb), Reminders())
        origin_out, target_out = chain(origin), chain(target)
        origin.process(rec({"at": [10, 30]}, key="moved", ts=1))
        origin.process(rec({"at": [10]}, key="stays", ts=1))
        kg = key_group(encode_key("moved"), G)
        moving = list(ob.iter_key_groups(range(kg, kg + 1)))  # what a handover's cut takes out
        for g, rest, _ in moving:
            ob.delete(g, rest)
        origin.state_left(frozenset({kg}))
        origin.on_watermark(100)
        assert origin_out.values == [("stays", 10, 1)]
        target.on_watermark(20)
        for g, rest, value in moving:
            tb.put(g, rest, value)
        target.state_arrived([range(kg, kg + 1)])
        target.fire_behind()
        assert target_out.values == [("moved", 10, 1)]
        target.on_watermark(30)
        assert target_out.values == [("moved", 10, 1), ("moved", 30, 1)]


class Watcher(KeyedProcessFunction):
    """Registers the timers a record names ahead of the watermark; every record and timer emits
    the watermark it saw.  (A timer behind it fires at the next watermark, which for a key a
    handover target held is its release, not the next one the sources send.)"""

    def open(self, ctx):
        self.seen = ctx.value_state("seen", 0)

    def process(self, value, ctx):
        self.seen.update(self.seen.value() + 1)
        for ts in value:
            if ts > ctx.watermark:
                ctx.timers.register_event_time_timer(ts)
        yield (ctx.key, "record", ctx.watermark, self.seen.value())

    def on_timer(self, timestamp, ctx):
        yield (ctx.key, "timer", timestamp, ctx.watermark, self.seen.value())


WATCHED = ("a", "b", "c", "d", "e", "f")
held_script = st.lists(st.one_of(
    st.tuples(st.just("rec"), st.sampled_from(WATCHED), st.lists(st.integers(0, 60), max_size=2)),
    st.tuples(st.just("wm"), st.integers(0, 60)),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(steps=held_script, moved=st.sets(st.sampled_from(WATCHED), min_size=1), data=st.data())
def test_records_a_handover_target_held_are_processed_as_if_they_had_not_waited(tmp_path_factory, steps, moved,
                                                                                   data):
    """Keys move from an origin to a target; from the switch to the release the target holds
    their records (with the watermark each arrived at) while the other keys and the watermark go
    on.  Replayed at the release, every key's records and timers see the same watermarks, fire
    in the same places and emit the same as on one operator that had every key all along."""
    switch = data.draw(st.integers(0, len(steps)))
    release = data.draw(st.integers(switch, len(steps)))
    reference, moved_run = _move_while_watching(tmp_path_factory.mktemp("held"), steps, moved, switch, release)
    for key in WATCHED:
        assert [v for v in moved_run if v[0] == key] == [v for v in reference if v[0] == key]


def test_a_held_keys_timer_fires_at_the_watermark_that_passed_it_while_its_records_waited(tmp_path):
    steps = [("rec", "a", [5]), ("wm", 10), ("rec", "b", []), ("wm", 20), ("rec", "a", [])]
    reference, moved_run = _move_while_watching(tmp_path, steps, {"a"}, 0, len(steps))
    expected = [("a", "record", MIN_WATERMARK, 1), ("a", "timer", 5, 10, 1), ("a", "record", 20, 2)]
    assert [v for v in reference if v[0] == "a"] == expected
    assert [v for v in moved_run if v[0] == "a"] == expected
    assert moved_run[0] == ("b", "record", 10, 1)  # the key not moved did not wait


def _move_while_watching(path, steps, moved, switch, release):
    """``steps`` on one operator (the reference) and on an origin and a target that the keys of
    ``moved`` leave at step ``switch`` and reach at ``release``; both runs' outputs."""
    groups = frozenset(key_group(encode_key(k), G) for k in moved)
    moving = {k for k in WATCHED if key_group(encode_key(k), G) in groups}
    with RocksDBStateBackend(path / "r") as rb, RocksDBStateBackend(path / "o") as ob, \
            RocksDBStateBackend(path / "t") as tb:
        reference, origin, target = (ProcessOperator("w", FakeEnv(b), Watcher()) for b in (rb, ob, tb))
        reference_out, origin_out, target_out = chain(reference), chain(origin), chain(target)
        wm, held, advances, cut = MIN_WATERMARK, [], [], []
        for i in range(len(steps) + 1):
            if i == switch:  # the origin cuts the moved key groups out (what PartitionHandovers.cut takes)
                cut = [e for kg in sorted(groups) for e in ob.iter_key_groups(range(kg, kg + 1))]
                for kg, rest, _ in cut:
                    ob.delete(kg, rest)
                origin.state_left(groups)
            if i == release:  # the target loads them and processes what it held
                for kg, rest, value in cut:
                    tb.put(kg, rest, value)
                target.state_arrived([range(kg, kg + 1) for kg in sorted(groups)], cut)
                replay_held(target, tuple(held), groups, advances, wm, lambda _, r: target.process(r))
                target.fire_behind()
                held = None
            if i == len(steps):
                break
            if steps[i][0] == "wm":
                if steps[i][1] > wm:
                    wm = steps[i][1]
                    for op in (reference, origin, target):
                        op.on_watermark(wm)
                    if held:
                        advances.append(wm)
                continue
            _, key, timers = steps[i]
            r = rec(timers, key=key, ts=0)
            reference.process(r)
            if key not in moving:
                target.process(r)
            elif i < switch:
                origin.process(r)
            elif held is not None:
                held.append((0, r, wm))
            else:
                target.process(r)
        for op in (reference, origin, target):
            op.on_watermark(100)
        return reference_out.values, origin_out.values + target_out.values


class Dice(KeyedProcessFunction):
    def process(self, value, ctx):
        yield (ctx.key, ctx.random().random(), ctx.random().randrange(10**9))


@pytest.mark.parametrize("ttl", [False, True])
def test_random_draws_are_the_same_on_both_replicas_differ_per_key_and_call_and_survive_a_restore(tmp_path, ttl):
    """With ``ttl`` every state of the function has one, and the keys' draw counts expire midway."""
    make, value = (LuckySessions, "p") if ttl else (Dice, None)
    runs = []
    for replica in ("one", "two"):
        path = tmp_path / replica
        with RocksDBStateBackend(path) as b:
            op = ProcessOperator("dice", FakeEnv(b), make())
            out = chain(op)
            for i, key in enumerate(["a", "b", "a"]):
                op.process(rec(value, key=key, ts=i))
            if ttl:
                op.on_watermark(500)  # a's and b's counts expired
                op.process(rec(value, key="a", ts=501))
            snapshot = op.snapshot()
        with RocksDBStateBackend(path) as b:  # the replica restored from its state
            op = ProcessOperator("dice", FakeEnv(b), make())
            op.restore(snapshot)
            out2 = chain(op)
            op.process(rec(value, key="a", ts=502))
        runs.append(out.values + out2.values)
    assert runs[0] == runs[1]
    draws = [v[-1] for v in runs[0]]
    assert len(set(draws)) == len(draws)  # keys, successive records and successive calls differ


script = st.lists(st.one_of(
    st.tuples(st.just("rec"), st.sampled_from(["a", "b", 7, ("t", 1)]),
              st.lists(st.integers(0, 40), max_size=3), st.lists(st.integers(0, 40), max_size=2)),
    st.tuples(st.just("wm"), st.integers(0, 45)),
    st.tuples(st.just("restore"),),
), max_size=40)


@settings(max_examples=40, deadline=None)
@given(steps=script)
def test_timer_output_equals_a_plain_python_reference_across_restores(tmp_path_factory, steps):
    """Whatever the records, watermarks and restores, the fired timers are those of a plain-Python
    model: a set of (key, ts) fired in (ts, key group, key) order once the watermark reaches them."""
    path = tmp_path_factory.mktemp("p")
    backend = RocksDBStateBackend(path)
    op = ProcessOperator("r", FakeEnv(backend), Reminders())
    out = chain(op)
    timers: set = set()
    seen: dict = {}
    expected = []
    wm = -1
    fired = []
    for step in steps:
        if step[0] == "rec":
            _, key, at, cancel = step
            op.process(rec({"at": at, "cancel": cancel}, key=key, ts=0))
            seen[key] = seen.get(key, 0) + 1
            timers |= {(key, t) for t in at}
            timers -= {(key, t) for t in cancel}
        elif step[0] == "wm":
            if step[1] <= wm:
                continue  # watermarks only rise
            wm = step[1]
            op.on_watermark(wm)
            due = sorted((t for t in timers if t[1] <= wm), key=lambda t: order(*t))
            expected += [(k, t, seen[k]) for k, t in due]
            timers -= set(due)
        else:
            snapshot = op.snapshot()
            fired += out.values
            backend.close()
            backend = RocksDBStateBackend(path)
            op = ProcessOperator("r", FakeEnv(backend), Reminders())
            op.restore(snapshot)
            out = chain(op)
    fired += out.values
    backend.close()
    assert fired == expected


def test_the_ordered_jobs_timers_fire_once_each_at_a_point_of_their_chain(backend):
    """The hash-chain job's timers (what the integration tests kill and move under) and the check
    of its output: exact on a real run, and it names a missing, doubled or off-chain timer."""
    op = ProcessOperator("chain", FakeEnv(backend), HashChain(timer_ms=10, side_every=3))
    out = chain(op)
    ids = []
    for i in range(40):
        event = {"id": f"a-{i}", "key": f"k{i % 3}", "ts": 1000 + 3 * i}
        ids.append(event["id"])
        op.process(rec(event, key=event["key"], ts=event["ts"]))
        if i % 7 == 6:
            op.on_watermark(1000 + 3 * i - 5)
    op.on_watermark(MAX_WATERMARK)
    records = out.values
    report = verify_chains(records, ids, 10)
    assert report.exact and report.timers == len({(f"k{i % 3}", timer_due(1000 + 3 * i, 10)) for i in range(40)})
    timers = [r for r in records if "timer" in r]
    assert any(0 < t["n"] < 14 for t in timers)  # some fired while their key's chain went on
    assert not verify_chains([r for r in records if r is not timers[0]], ids, 10).exact
    assert not verify_chains(records + [timers[0]], ids, 10).exact
    shifted = [{**r, "n": r["n"] - 1} if r is timers[-1] else r for r in records]
    assert not verify_chains(shifted, ids, 10).exact
    side = [r[1] for tag, r in out.sides if tag == "every-nth"]
    assert len(side) == 12 and verify_side_output(side, records, 3) == []
    assert verify_side_output(side[1:], records, 3) == [f"missing {tuple(side[0].values())}"]
    assert verify_side_output(side + side[:1], records, 3) == [f"doubled {tuple(side[0].values())}"]


class Sessions(KeyedProcessFunction):
    """Per key, with a TTL of 100 ms (of event time, or of processing time): a count, the pages
    seen and the recent values."""

    def __init__(self, time: str = "event") -> None:
        self.time = time

    def open(self, ctx):
        ttl = StateTtl(100, time=self.time)
        self.count = ctx.value_state("count", 0, ttl=ttl)
        self.pages = ctx.map_state("pages", ttl=ttl)
        self.recent = ctx.list_state("recent", ttl=ttl)

    def process(self, value, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        self.pages.put(value, self.pages.get(value, 0) + 1)
        self.recent.add(value)
        yield (ctx.key, n, dict(self.pages.items()), self.recent.get())


def stored(backend) -> int:
    return sum(1 for _ in backend.iter_key_groups(range(G)))


class LuckySessions(Sessions):
    """:class:`Sessions` that also draws for every record (``keep``: one more state, without a TTL)."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.keep = keep

    def open(self, ctx):
        super().open(ctx)
        if self.keep:
            self.kept = ctx.value_state("kept", 0)

    def process(self, value, ctx):
        for out in super().process(value, ctx):
            yield (*out, ctx.random().randrange(10**9))


@pytest.mark.parametrize("keep", [False, True])
def test_a_keys_draw_count_expires_with_its_state_and_a_new_life_draws_new_numbers(backend, keep):
    """With every state under a TTL, the draw count lives as long as the longest: a key that goes
    quiet leaves nothing behind, and one seen again draws numbers it did not draw before.  With a
    state without a TTL the count stays, as that state does."""
    op = ProcessOperator("s", FakeEnv(backend), LuckySessions(keep))
    out = chain(op)
    for i in range(5):
        op.process(rec("p", key="k", ts=i))
    first = [v[-1] for v in out.values]
    op.on_watermark(10**6)
    assert stored(backend) == (1 if keep else 0)
    for i in range(5):
        op.process(rec("p", key="k", ts=10**6 + 1 + i))
    again = [v[-1] for v in out.values[5:]]
    assert len(set(first + again)) == 10  # nothing repeated
    op.on_watermark(2 * 10**6)
    assert stored(backend) == (1 if keep else 0)


@pytest.mark.parametrize("time", ["event", "processing"])
def test_the_state_of_keys_that_go_quiet_expires_so_its_size_stays_flat(backend, time):
    op = ProcessOperator("s", FakeEnv(backend), Sessions(time))
    out = chain(op)

    def advance(to: int) -> None:  # the watermark, or processing time by a pulse
        op.on_watermark(to) if time == "event" else op.on_pulse(to, to)

    sizes = []
    for rnd in range(12):  # each round its own 20 keys, then the time moves 200 ms on
        base = rnd * 200
        advance(base)
        for i in range(60):
            op.process(rec(f"p{i % 3}", key=f"r{rnd}-k{i % 20}", ts=base + i))
        sizes.append(stored(backend))
    assert max(sizes[2:]) <= sizes[1] * 1.1, sizes  # flat: only the live rounds' keys are kept
    advance(10**6)
    assert stored(backend) == 0
    # a key seen again after its state expired starts afresh
    op.process(rec("p0", key="r0-k0", ts=10**6 + 1))
    assert out.records[-1][1] == ("r0-k0", 1, {"p0": 1}, ["p0"])


@pytest.mark.parametrize("clock", ["liverobin-pulse", "kazoo-order"])
def test_a_processing_time_ttl_expires_between_pulses_never_by_event_time(backend, clock):
    op = ProcessOperator("s", FakeEnv(backend), Sessions("processing"))
    out = chain(op)

    def advance(h: int, t: int) -> None:
        op.on_pulse(h, t) if clock == "liverobin-pulse" else op.on_processing_time(t)

    advance(1, 1000)
    op.process(rec("a", key="k", ts=5))  # expires at processing time 1100
    op.on_watermark(10**9)  # event time means nothing to it
    op.process(rec("b", key="k", ts=6))  # written at 1000 too
    advance(2, 1099)
    op.process(rec("c", key="k", ts=7))  # 1199
    assert out.values[-1] == ("k", 3, {"a": 1, "b": 1, "c": 1}, ["a", "b", "c"])
    advance(3, 1100)
    op.process(rec("d", key="k", ts=8))
    # the count was last written at 1099 and lives on; the pages and elements of 1000 are gone
    assert out.values[-1] == ("k", 4, {"c": 1, "d": 1}, ["c", "d"])


@pytest.mark.parametrize("time", ["event", "processing"])
def test_ttl_state_expires_the_same_after_a_restore_and_after_a_move(tmp_path, time):
    with RocksDBStateBackend(tmp_path / "o") as ob:
        op = ProcessOperator("s", FakeEnv(ob), Sessions(time))
        chain(op)
        op.on_pulse(1, 50)
        op.process(rec("p", key="moved", ts=10))
        op.process(rec("p", key="stays", ts=10))
        snapshot = op.snapshot()
    with RocksDBStateBackend(tmp_path / "o") as ob, RocksDBStateBackend(tmp_path / "t") as tb:
        origin = ProcessOperator("s", FakeEnv(ob), Sessions(time))  # restored from its state
        origin.restore(snapshot)
        target = ProcessOperator("s", FakeEnv(tb), Sessions(time))
        chain(origin), chain(target)
        kg = key_group(encode_key("moved"), G)
        moving = list(ob.iter_key_groups(range(kg, kg + 1)))
        for g, rest, _ in moving:
            ob.delete(g, rest)
        origin.state_left(frozenset({kg}))
        for g, rest, value in moving:
            tb.put(g, rest, value)
        target.state_arrived([range(kg, kg + 1)])
        assert stored(ob) > 0 and stored(tb) > 0
        if time == "event":
            origin.on_watermark(109)
            target.on_watermark(109)
        else:
            assert origin.state.processing_time == 50  # restored with its operator's snapshot
            origin.on_pulse(2, 149)
            target.on_pulse(2, 149)
        assert stored(ob) > 0 and stored(tb) > 0  # not expired yet: one ms short
        if time == "event":
            origin.on_watermark(200)
            target.on_watermark(200)
        else:
            origin.on_pulse(3, 200)
            target.on_pulse(3, 200)
        assert stored(ob) == 0 and stored(tb) == 0  # each swept what it holds


class Timeout(KeyedProcessFunction):
    """A processing-time timeout per key: each record (re)arms a timer 50 ms after the current
    processing time; it fires at the first pulse at or after it."""

    def open(self, ctx):
        self.armed = ctx.value_state("armed")

    def process(self, value, ctx):
        old = self.armed.value()
        if old is not None:
            ctx.timers.delete_processing_time_timer(old)
        at = ctx.timers.current_processing_time() + 50
        ctx.timers.register_processing_time_timer(at)
        self.armed.update(at)

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain == "processing_time"
        self.armed.clear()
        yield (ctx.key, timestamp)


def test_processing_time_timers_fire_at_the_first_pulse_of_their_time_and_survive_a_restore(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        op = ProcessOperator("t", FakeEnv(b), Timeout())
        out = chain(op)
        op.on_pulse(1, 1000)
        op.process(rec("x", key="a", ts=1))  # due at 1050
        op.on_pulse(2, 1030)
        op.process(rec("x", key="b", ts=2))  # due at 1080
        op.process(rec("x", key="a", ts=3))  # re-armed: due at 1080, the 1050 one deleted
        op.on_pulse(3, 1060)
        assert out.values == []
        op.on_pulse(4, 1020)  # a generator with a slower clock: time never goes back
        op.state.set_current_key("a")
        assert op.timers.processing_time_timers() == [1080] and op.timers.current_processing_time() == 1060
        snapshot = op.snapshot()
    with RocksDBStateBackend(tmp_path / "db") as b:  # the replica restored from its state
        op = ProcessOperator("t", FakeEnv(b), Timeout())
        op.restore(snapshot)
        out = chain(op)
        op.on_pulse(5, 1100)
        assert out.values == [("a", 1080), ("b", 1080)] and [r[3] for r in out.records] == [1080, 1080]
        assert [p for p in out.pulses] == [(5, 1100)]


def test_a_kazoo_orders_clock_fires_processing_time_timers_down_the_chain_and_stops_at_the_router(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        env = FakeEnv(b, routing={7: RoutingTable.uniform(16, 2)})
        op, passing = ProcessOperator("t", env, Timeout()), MapOperator("m", env, lambda v: v)
        out = chain(op, passing)
        op.on_processing_time(1000)
        op.process(rec("x", key="a", ts=1))  # due at 1050
        op.on_processing_time(1040)
        op.on_processing_time(1030)  # a new leader with a slower clock: time never goes back
        assert out.values == [] and out.clocks == [1000, 1040, 1030] and out.pulses == []
        op.on_processing_time(1050)
        assert out.values == [("a", 1050)] and [r[3] for r in out.records] == [1050]
        chans = [FakeChannel(0), FakeChannel(1)]
        router = Router("r", env, [(OutputEdge(0, 7, "hash", str, 2), chans)])
        router.on_processing_time(2000)  # a task's clock is its own: nothing goes to the next task
        assert all(ch.elements == [] for ch in chans)


def test_a_processing_time_ttl_is_refused_without_pulses_when_the_function_opens(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        env = FakeEnv(b)
        env.processing_time = False  # (mode unordered)
        with pytest.raises(TypeError, match="state 'count' of operator 's' has a processing-time TTL: processing "
                                            r"time comes with LiveRobin's pulses or KaZoo's orders \(spark.replication.mode=liverobin or kazoo\)"):
            ProcessOperator("s", env, Sessions("processing"))


def test_processing_time_timers_are_refused_without_pulses_naming_the_mode(tmp_path):
    with RocksDBStateBackend(tmp_path / "db") as b:
        env = FakeEnv(b)
        env.processing_time = False  # (mode unordered)
        op = ProcessOperator("t", env, Timeout())
        chain(op)
        op.process(rec("x", key="a", ts=1))
        assert "processing time comes with LiveRobin's pulses" in env.dead_letters[0]["reason"]
