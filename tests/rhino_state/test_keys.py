"""Key encoding, key groups, vnodes and the routing table."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rhino_state import (
    MAX_KEY_GROUPS,
    RoutingTable,
    decode_key,
    encode_key,
    key_group,
    stable_hash,
    validate_num_key_groups,
    vnode_key_groups,
    vnode_of,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**600), max_value=2**600),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from(["", "\x00", "\x00\x01", "a\x00", b"\x00", b"\x00\xff", b"\xff", 0, -1, 0.0, -0.0]),
)
keys = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12)
group_counts = st.integers(min_value=0, max_value=15).map(lambda e: 1 << e)


def canon(key: Any) -> Any:
    """Structural identity of a key: type-tagged, floats compared as the encoding does."""
    if isinstance(key, tuple):
        return ("tuple", tuple(canon(k) for k in key))
    if isinstance(key, float):
        return ("float", "nan" if math.isnan(key) else key + 0.0)
    return (type(key).__name__, key)


# --------------------------------------------------------------------------- encoding


@given(keys)
def test_encode_round_trips(key: Any) -> None:
    encoded = encode_key(key)
    assert isinstance(encoded, bytes)
    assert canon(decode_key(encoded)) == canon(key)
    assert encode_key(decode_key(encoded)) == encoded


@given(st.lists(keys, max_size=30))
def test_encode_is_injective(batch: list[Any]) -> None:
    by_encoding = {encode_key(k): canon(k) for k in batch}
    assert len(by_encoding) == len({canon(k) for k in batch})


@given(keys, keys)
def test_encode_is_prefix_free(a: Any, b: Any) -> None:
    ea, eb = encode_key(a), encode_key(b)
    if ea != eb:
        assert not eb.startswith(ea) and not ea.startswith(eb)


@pytest.mark.parametrize(
    "values",
    [
        st.lists(st.integers(), max_size=20),
        st.lists(st.integers(min_value=-(2**300), max_value=2**300), max_size=20),
        st.lists(st.floats(allow_nan=False), max_size=20),
        st.lists(st.text(max_size=6), max_size=20),
        st.lists(st.binary(max_size=6), max_size=20),
        st.lists(st.lists(st.integers(-3, 3), max_size=3).map(tuple), max_size=20),
    ],
    ids=["int", "bigint", "float", "str", "bytes", "tuple"],
)
def test_encoding_preserves_order_within_a_type(values: st.SearchStrategy[list[Any]]) -> None:
    @given(values)
    def check(batch: list[Any]) -> None:
        assert [canon(k) for k in sorted(batch, key=encode_key)] == [canon(k) for k in sorted(batch)]

    check()


def test_equal_keys_of_a_type_encode_equally_but_types_differ() -> None:
    assert encode_key(-0.0) == encode_key(0.0)
    assert encode_key(float("nan")) == encode_key(-float("nan"))
    assert len({encode_key(1), encode_key(1.0), encode_key(True), encode_key("1"), encode_key(b"1")}) == 5
    assert encode_key(("a", 1)) != encode_key((("a", 1),))


def test_encoding_is_pinned() -> None:
    """The format is persisted in RocksDB and routes records: it must never change silently."""
    assert encode_key(None) == bytes.fromhex("01")
    assert encode_key(-256) == bytes.fromhex("0300fefdfeff")
    assert encode_key(1.5) == bytes.fromhex("04bff8000000000000")
    assert encode_key("a\x00b") == bytes.fromhex("056100ff620001")
    assert encode_key((1, ("a", b""))) == bytes.fromhex("07030101010107056100010600010000")


@pytest.mark.parametrize("bad", [[1], {"a": 1}, {1}, 1j, object(), bytearray(b"x"), (1, [2])])
def test_unsupported_key_type_names_the_type(bad: Any) -> None:
    inner = bad[1] if isinstance(bad, tuple) else bad
    with pytest.raises(TypeError, match=type(inner).__qualname__):
        encode_key(bad)


@given(st.binary(max_size=24))
def test_decode_rejects_garbage_or_round_trips(data: bytes) -> None:
    try:
        key = decode_key(data)
    except ValueError:
        return
    assert encode_key(key) == data


@pytest.mark.parametrize("data", [b"", b"\x09", b"\x01\x01", b"\x05abc", b"\x03\x01\x01\x01", b"\x07\x01"])
def test_decode_errors_are_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_key(data)


# --------------------------------------------------------------------------- hashing and key groups

PINNED_KEY_GROUPS = {  # G = 2**15; a change here re-routes every key of every stored job
    "user-42": 31933,
    "": 13084,
    0: 13238,
    -1: 19923,
    ("sensor", 7): 25057,
    b"\x00": 25199,
}


def test_stable_hash_is_xxh64_seed_0() -> None:
    assert stable_hash(b"") == 0xEF46DB3751D8E999


def test_pinned_key_groups() -> None:
    assert {k: key_group(encode_key(k), MAX_KEY_GROUPS) for k in PINNED_KEY_GROUPS} == PINNED_KEY_GROUPS


def test_key_groups_do_not_depend_on_the_process() -> None:
    code = (
        "from rhino_state import encode_key, key_group\n"
        "print([key_group(encode_key(k), 2**15) for k in ['user-42', '', 0, -1, ('sensor', 7), b'\\x00']])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == list(PINNED_KEY_GROUPS.values())


@given(keys, group_counts)
def test_key_group_in_range_and_consistent(key: Any, groups: int) -> None:
    kg = key_group(encode_key(key), groups)
    assert 0 <= kg < groups
    assert kg == stable_hash(encode_key(key)) % groups
    assert kg == key_group(encode_key(key), MAX_KEY_GROUPS) % groups  # halving G merges key groups


@pytest.mark.parametrize("bad", [0, 3, 6, 2**16, -2, True, 2.0, "8"])
def test_invalid_key_group_counts(bad: Any) -> None:
    with pytest.raises(ValueError, match="power of two"):
        validate_num_key_groups(bad)
    with pytest.raises(ValueError):
        key_group(b"k", bad)


# --------------------------------------------------------------------------- vnodes


@given(st.data())
def test_vnode_ranges_partition_the_key_groups(data: st.DataObject) -> None:
    groups = data.draw(group_counts)
    vnodes = data.draw(st.integers(1, groups))
    ranges = [vnode_key_groups(v, groups, vnodes) for v in range(vnodes)]
    assert [kg for r in ranges for kg in r] == list(range(groups))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
    for v in data.draw(st.lists(st.integers(0, vnodes - 1), max_size=5)):
        for kg in (ranges[v].start, ranges[v].stop - 1):
            assert vnode_of(kg, groups, vnodes) == v


def test_vnode_of_matches_ranges_exhaustively_for_odd_counts() -> None:
    for vnodes in (1, 3, 5, 7, 13, 16):
        for v in range(vnodes):
            assert all(vnode_of(kg, 16, vnodes) == v for kg in vnode_key_groups(v, 16, vnodes))


def test_vnode_validation() -> None:
    with pytest.raises(ValueError, match="num_vnodes"):
        vnode_of(0, 8, 9)
    with pytest.raises(ValueError, match="num_vnodes"):
        vnode_key_groups(0, 8, 0)
    with pytest.raises(ValueError, match="key_group"):
        vnode_of(8, 8, 2)
    with pytest.raises(ValueError, match="vnode"):
        vnode_key_groups(2, 8, 2)


# --------------------------------------------------------------------------- routing table


@given(st.data())
def test_uniform_routing_covers_every_vnode_once_balanced(data: st.DataObject) -> None:
    vnodes = data.draw(st.integers(1, 300))
    parallelism = data.draw(st.integers(1, vnodes))
    table = RoutingTable.uniform(vnodes, parallelism, epoch=3)
    owned = [table.vnodes_of(p) for p in range(parallelism)]
    assert sorted(v for vs in owned for v in vs) == list(range(vnodes))
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    assert all(list(vs) == list(range(vs[0], vs[-1] + 1)) for vs in owned)  # contiguous
    assert [table.partition_of_vnode(v) for v in range(vnodes)] == list(table.assignment)
    assert table.epoch == 3 and table.num_vnodes == vnodes


@given(st.data())
def test_partition_of_key_group_follows_vnodes(data: st.DataObject) -> None:
    groups = data.draw(group_counts)
    vnodes = data.draw(st.integers(1, groups))
    table = RoutingTable.uniform(vnodes, data.draw(st.integers(1, vnodes)))
    kg = data.draw(st.integers(0, groups - 1))
    assert table.partition_of_key_group(kg, groups) == table.assignment[vnode_of(kg, groups, vnodes)]


def test_moved_is_a_new_epoch_and_leaves_the_old_table_alone() -> None:
    table = RoutingTable.uniform(8, 2)
    new = table.moved([0, 1], 1)
    assert table.assignment == (0, 0, 0, 0, 1, 1, 1, 1) and table.epoch == 0
    assert new.assignment == (1, 1, 0, 0, 1, 1, 1, 1) and new.epoch == 1
    assert new.vnodes_of(0) == (2, 3)
    emptied = new.moved([2, 3], 1)
    assert emptied.vnodes_of(0) == () and emptied.epoch == 2
    scaled = table.moved([6, 7], 2, parallelism=3)
    assert scaled.parallelism == 3 and scaled.vnodes_of(2) == (6, 7)
    with pytest.raises(ValueError, match="partition"):
        table.moved([0], 2)
    with pytest.raises(ValueError, match="vnode"):
        table.moved([8], 0)
    with pytest.raises(ValueError, match="maps to"):
        scaled.moved([], 0, parallelism=2)
    with pytest.raises(AttributeError):
        table.epoch = 5  # type: ignore[misc]


def test_routing_table_dict_round_trip() -> None:
    table = RoutingTable.uniform(10, 3).moved([0], 2)
    assert RoutingTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RoutingTable.uniform(4, 5), "parallelism"),
        (lambda: RoutingTable.uniform(0, 1), "num_vnodes"),
        (lambda: RoutingTable.uniform(4, 0), "parallelism"),
        (lambda: RoutingTable.uniform(4, 2, epoch=-1), "epoch"),
        (lambda: RoutingTable((), 1), "at least one vnode"),
        (lambda: RoutingTable.from_dict({"epoch": 0, "assignment": [0]}), "parallelism"),
        (lambda: RoutingTable.from_dict({"epoch": 0, "parallelism": 2, "assignment": [0, 2]}), "maps to"),
        (lambda: RoutingTable.from_dict({"epoch": 0, "parallelism": 2, "assignment": "01"}), "list"),
        (lambda: RoutingTable.from_dict({"epoch": "1", "parallelism": 2, "assignment": [0]}), "epoch"),
    ],
)
def test_routing_table_validation(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_uniform_routing_distributes_real_keys() -> None:
    groups, table = 1 << 10, RoutingTable.uniform(64, 4)
    counts = Counter(
        table.partition_of_key_group(key_group(encode_key(f"k{i}"), groups), groups) for i in range(4000)
    )
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 800
