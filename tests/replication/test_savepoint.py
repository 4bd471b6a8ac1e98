"""Savepoints (replication.savepoint): a drained job leaves its state to its next run, which may
run its keyed task at another parallelism.  The files and checks without Spark; then the ordered
job on real Spark: every key's hash chain must link across the two runs (a key whose state was
lost or loaded twice would start its chain again or fork it) and every event is in the output
exactly once."""

from __future__ import annotations

import json
import threading

import pytest

from deploy.topics import read_all
from replication import run
from replication import savepoint as sp
from replication.config import ConfigError
from replication.examples.ordered import (
    build_ordered_job,
    build_window_count_job,
    verify_chains,
    window_counts,
)
from replication.runtime.windows import WindowOperator
from replication.windowing import Windows
from rhino_state import encode_key, key_group
from tests.ordered_runs import feed, read_output, source_topics, where_missing


def test_a_savepoint_is_complete_only_with_its_meta_and_every_partition_part(durable_dir):
    root = f"{durable_dir.partition('?')[0]}/sp?{durable_dir.partition('?')[2]}"
    assert not sp.holds_anything(root) and not sp.is_complete(root)
    sp.write_replica(root, "src", 0, 1, {"offsets": {0: 10}, "max_ts": {0: 5}, "emitted_wm": 1})
    sp.write_replica(root, "src", 0, 0, {"offsets": {0: 7}, "max_ts": {0: 5}, "emitted_wm": 1})
    sp.write_replica(root, "chain", 1, 0, {"entries": [(3, b"k", b"v")], "operators": {}})
    assert sp.missing_parts(root, {"src": 1, "chain": 2}, replicas=2) == ["chain[0]"]
    with pytest.raises(FileNotFoundError, match="no complete savepoint"):
        sp.read_meta(root)
    sp.write_replica(root, "chain", 0, 1, {"entries": [(1, b"a", b"1"), (2, b"b", b"2")],
                                           "operators": {"chain": 7}})
    assert sp.missing_parts(root, {"src": 1, "chain": 2}, replicas=2) == []
    assert sp.holds_anything(root) and not sp.is_complete(root)
    sp.write_meta(root, job="j", num_key_groups=4, tasks={"src": 1, "chain": 2}, sources=["src"], keyed=["chain"])
    meta = sp.read_meta(root)
    assert sp.is_complete(root)
    # the furthest replica of a source: the downstream consumed its longer sequence
    assert sp.source_offsets(root, "src", 1) == {0: 10}
    entries, operators, code = sp.keyed_entries(root, "chain", 2, lambda kg: kg != 2)
    assert entries == [(1, b"a", b"1"), (3, b"k", b"v")] and operators == {"chain": [7]} and code == {}
    assert meta["code_versions"] == [] and sp.replaced_code(root, meta, "chain") == {}
    ok = {"src": ("source", 1), "chain": ("keyed", 3)}
    assert sp.check(str(root), meta, num_key_groups=4, tasks=ok, key="K") == []
    problems = sp.check(str(root), meta, num_key_groups=8, tasks={"src": ("source", 2), "other": ("keyed", 2)},
                        key="K")
    assert any("spark.replication.state.keyGroups=8" in p for p in problems)
    assert any("source 'src' had 1 partitions, now 2" in p for p in problems)
    assert any("keyed task 'chain'" in p for p in problems)
    assert all("test-secret" not in p for p in problems)  # a URI's credentials are not shown
    sp.delete(root)
    assert not sp.holds_anything(root) and not sp.is_complete(root)


def test_a_savepoint_carries_the_functions_that_replaced_operators_and_their_versions(tmp_path):
    """Parts hold each replica's replaced functions, the meta names the operators and versions; a
    keyed task's come with its entries, another task's from its first part (parts of an earlier
    build hold none)."""
    root = tmp_path / "sp"
    fn = b"cloudpickled v2"
    for p in range(2):
        sp.write_replica(root, "chain", p, 0, {"entries": [(p, b"k", b"v")], "operators": {}, "code": {"chain": fn}})
        sp.write_replica(root, "enrich", p, 0, {"entries": [], "operators": {}, "code": {"tag": b"v3"}})
        sp.write_replica(root, "plain", p, 0, {"entries": [], "operators": {}})
    sp.write_meta(root, job="j", num_key_groups=4, tasks={"chain": 2, "enrich": 2, "plain": 2}, sources=[],
                  keyed=["chain"], code_versions={("enrich", "tag"): 3, ("chain", "chain"): 2})
    meta = sp.read_meta(root)
    assert meta["code_versions"] == [["chain", "chain", 2], ["enrich", "tag", 3]]
    assert sp.keyed_entries(root, "chain", 2, lambda kg: True)[2] == {"chain": fn}
    assert sp.replaced_code(root, meta, "enrich") == {"tag": b"v3"}
    assert sp.replaced_code(root, meta, "plain") == {}


def test_a_window_takes_the_fire_index_of_the_keys_it_owns_now_and_the_lowest_watermark():
    class Env:
        num_key_groups = 16
        metrics = None

        def state_context(self, name):
            class Ctx:
                def map_state(self, name):
                    return None
            return Ctx()

    window = WindowOperator("w", Env(), Windows.tumbling(10), None)
    a, b = encode_key("a"), encode_key("b")
    ka, kb = key_group(a, 16), key_group(b, 16)
    assert ka != kb
    snapshots = [(100, {110: {a: ["a", 1.0]}}), (90, {120: {b: ["b", 2.0]}, 110: {b: ["b", 3.0]}})]
    window.restore_savepoint(snapshots, lambda kg: kg == kb)
    assert window.watermark == 90
    assert window.fire_index.due == {120: {b: ["b", 2.0]}, 110: {b: ["b", 3.0]}}



@pytest.mark.integration
# KaZoo in the slow set (the default suite's time): its savepoint differs from LiveRobin's only in how
# the drain ends the sources, which tests/system/test_kazoo_runtime.py's drains cover
@pytest.mark.parametrize("mode", ["liverobin", pytest.param("kazoo", marks=pytest.mark.slow)])
def test_a_drained_job_goes_on_from_its_savepoint_at_another_parallelism(stack, spark, topic_prefix, tmp_path,
                                                                           mode):
    """Run 1: the chain task on 2 partitions, replicated, under load; drained into a savepoint.
    Run 2: the same job with the chain on 3 partitions from that savepoint, more load, drained.
    The output of both runs together is exactly once and every key's chain links up across the
    restart; a savepoint with other key groups is refused before anything starts, naming the key."""
    name = f"{topic_prefix}sp{mode[0]}"
    a, b = source_topics(stack, name)
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers, "spark.replication.enabled": "true",
            "spark.replication.mode": mode}
    if mode == "kazoo":
        conf["spark.replication.zookeeper.connect"] = stack.zookeeper_connect
    root = tmp_path / "savepoint"
    ids: list[str] = []

    first = run(build_ordered_job(a, b, f"{name}out", name=name, parallelism=2), spark=spark, conf=conf)
    first.wait_started(120)
    feeder = threading.Thread(target=feed, args=(stack, a, b, ids), kwargs={"rounds": 20})
    feeder.start()
    feeder.join()
    result1 = first.drain(timeout=300, savepoint=root)
    assert result1.status == "finished"
    meta = sp.read_meta(root)
    assert meta["tasks"]["chain"] == 2 and meta["keyed"] == ["chain"]
    after_first = len(read_output(stack, f"{name}out"))
    assert after_first == len(ids)  # nothing held back: the sink flushed everything it got

    with pytest.raises(ConfigError, match="restoreFrom") as refused:
        run(build_ordered_job(a, b, f"{name}out", name=name, parallelism=3), spark=spark,
            conf={**conf, "spark.replication.restoreFrom": str(tmp_path / "nothing-here")})
    assert refused.value.key == "spark.replication.restoreFrom"
    with pytest.raises(ConfigError, match="keyGroups=1024 but the savepoint"):
        run(build_ordered_job(a, b, f"{name}out", name=name, parallelism=3), spark=spark,
            conf={**conf, "spark.replication.restoreFrom": str(root), "spark.replication.state.keyGroups": "1024"})

    second = run(build_ordered_job(a, b, f"{name}out", name=name, parallelism=3), spark=spark,
                 conf={**conf, "spark.replication.restoreFrom": str(root)})
    second.wait_started(120)
    feed(stack, a, b, ids, rounds=20, first_round=20)
    result2 = second.drain(timeout=300)
    assert result2.status == "finished", result2.failure
    loaded = sum(result2.per_instance[f"chain[{p}]r0"].savepoint_entries for p in range(3))
    assert loaded > 0, "the second run loaded no state"
    output = verify_chains(read_output(stack, f"{name}out"), ids)
    assert output.exact, f"{output}; {where_missing(stack, name, output.missing)}"
    assert output.keys == 30


@pytest.mark.integration
def test_windows_open_at_the_savepoint_fire_in_the_next_run_with_every_count(stack, spark, topic_prefix, tmp_path):
    """A keyed tumbling-window count: the drain into a savepoint fires no window that is still
    open (no final watermark); the next run, at another parallelism, takes each open window's
    accumulator with its key's state and its fire-index entry, and fires it with the counts of
    both runs.  Every (key, window) of the input is in the output once, with its exact count."""
    name = f"{topic_prefix}spwin"
    a, b = source_topics(stack, name)
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers, "spark.replication.enabled": "true",
            "spark.replication.mode": "liverobin"}
    root = tmp_path / "savepoint"
    ids: list[str] = []
    first = run(build_window_count_job(a, b, f"{name}out", name=name, parallelism=2), spark=spark, conf=conf)
    first.wait_started(120)
    feed(stack, a, b, ids, rounds=20)
    first.drain(timeout=300, savepoint=root)
    fired_first = len(read_output(stack, f"{name}out"))
    second = run(build_window_count_job(a, b, f"{name}out", name=name, parallelism=3), spark=spark,
                 conf={**conf, "spark.replication.restoreFrom": str(root)})
    second.wait_started(120)
    feed(stack, a, b, ids, rounds=20, first_round=20)
    result = second.drain(timeout=300)
    expected = window_counts(json.loads(r.value) for t in (a, b) for r in read_all(stack.bootstrap_servers, t))
    got = [(w["key"], w["start"], w["value"]) for w in read_output(stack, f"{name}out")]
    assert 0 < fired_first < len(got)
    assert len(got) == len({(k, s) for k, s, _ in got}), "a window was emitted twice"
    assert {(k, s): n for k, s, n in got} == expected
    assert result.metrics.dead_lettered == 0 and result.metrics.late_records == 0
