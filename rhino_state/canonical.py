"""Canonical pickling of state values: equal values give equal bytes in every process.

Values are pickled (protocol 5) with sets and frozensets in a sorted order, so that the two
replicas' state digests agree (a set of strings iterates in an order that depends on the
process's ``PYTHONHASHSEED``).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

_PICKLE_PROTOCOL = 5


# the opcodes with which protocol 5 writes a set or frozenset (the C pickler's fast path)
_EMPTY_SET, _FROZENSET = pickle.EMPTY_SET, pickle.FROZENSET


def _sorted(items: set | frozenset) -> list:
    try:
        return sorted(items)
    except TypeError:  # elements of mixed or unorderable types
        return sorted(items, key=canonical_dumps)


class _CanonicalPickler(pickle._Pickler):
    """The pure-Python pickler (the C one pickles exact sets without consulting any hook), with
    sets and frozensets written in sorted order; everything else as ``pickle`` writes it."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_set(self, obj: set) -> None:
        self.write(pickle.EMPTY_SET)
        self.memoize(obj)
        items = _sorted(obj)
        for i in range(0, len(items), self._BATCHSIZE):
            self.write(pickle.MARK)
            for item in items[i:i + self._BATCHSIZE]:
                self.save(item)
            self.write(pickle.ADDITEMS)

    def _save_frozenset(self, obj: frozenset) -> None:
        self.write(pickle.MARK)
        for item in _sorted(obj):
            self.save(item)
        if id(obj) in self.memo:  # recursive: drop what was pushed, fetch it from the memo
            self.write(pickle.POP_MARK + self.get(self.memo[id(obj)][0]))
            return
        self.write(pickle.FROZENSET)
        self.memoize(obj)

    dispatch[set] = _save_set
    dispatch[frozenset] = _save_frozenset


def canonical_dumps(value: Any) -> bytes:
    """``value`` pickled (protocol 5) so that equal values give equal bytes in every process:
    by ``pickle`` itself when that wrote no set (the usual case, at C speed), else again by
    :class:`_CanonicalPickler` (also when those opcode bytes only occur inside a string)."""
    data = pickle.dumps(value, protocol=_PICKLE_PROTOCOL)
    if _EMPTY_SET not in data and _FROZENSET not in data:
        return data
    out = io.BytesIO()
    _CanonicalPickler(out, protocol=_PICKLE_PROTOCOL).dump(value)
    return out.getvalue()
