"""The built-in JSON serializer (orjson, the json module where they differ) writes what the
json module writes (compact, keys sorted, non-ASCII escaped) for every value both can write."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from replication.serde import json_dumps, json_loads


def _reference(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


_scalars = st.none() | st.booleans() | st.integers() | st.text() | \
    st.floats(allow_nan=False, allow_infinity=False)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_json_dumps_reads_back_as_the_json_module_writes_it(value):
    out = json_dumps(value)
    assert out.isascii()
    assert json.loads(out) == json.loads(_reference(value))
    # the same bytes, but for the spelling of some floats (orjson: 0.00001, json: 1e-05)
    if not any(isinstance(v, float) for v in _leaves(value)):
        assert out == _reference(value)


def test_json_dumps_escapes_del_as_the_json_module_does():
    assert json_dumps({"k": "a\x7fb"}) == _reference({"k": "a\x7fb"}) == b'{"k":"a\\u007fb"}'


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_what_orjson_cannot_write_is_written_by_the_json_module():
    assert json_dumps({1: "a", 2: [2**70]}) == b'{"1":"a","2":[1180591620717411303424]}'
    assert json_dumps({"b": "é", "a": (1, 2)}) == b'{"a":[1,2],"b":"\\u00e9"}'
    assert json_dumps({"x": math.nan, "y": math.inf}) == b'{"x":null,"y":null}'


def test_json_loads_keeps_big_integers_exact():
    assert json_loads(b'{"n": 123456789012345678901234567890}') == {"n": 123456789012345678901234567890}
