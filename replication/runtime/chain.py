"""A task's chain of operators, built from its planned nodes: the user's functions, windows and
the sink, in front of the tail (a :class:`Router` or nothing)."""

from __future__ import annotations

import copy
from typing import Any

from replication.runtime.operators import (
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    Operator,
    ProcessOperator,
    SinkOperator,
)
from replication.runtime.sink import ExactlyOnceSink
from replication.runtime.windows import SessionWindowOperator, WindowOperator


def chain_operators(head: Operator | None) -> list[Operator]:
    """The operators of a chain, head first (none before it is built)."""
    if head is None:
        return []
    ops = [head]
    while (nxt := getattr(ops[-1], "next", None)) is not None:
        ops.append(nxt)
    return ops


def build_chain(nodes: list, env: Any, tail: Operator | None) -> Operator:
    """Instantiate the operators of ``nodes`` (a task's chain, source excluded) in front of ``tail``."""
    ops: list[Operator] = []
    for node in nodes:
        kind, spec = node.kind, node.spec
        if kind == "map":
            ops.append(MapOperator(node.name, env, spec["fn"]))
        elif kind == "filter":
            ops.append(FilterOperator(node.name, env, spec["fn"]))
        elif kind == "flat_map":
            ops.append(FlatMapOperator(node.name, env, spec["fn"]))
        elif kind == "process":
            # one copy of the user's object per instance: a worker may host several partitions
            ops.append(ProcessOperator(node.name, env, copy.deepcopy(spec["fn"])))
        elif kind == "window":
            windows = SessionWindowOperator if spec["windows"].sessions else WindowOperator
            ops.append(windows(node.name, env, spec["windows"], copy.deepcopy(spec["aggregator"]),
                               spec.get("late_output")))
        elif kind == "sink":
            if getattr(env, "exactly_once_sink", False):
                cls: type[Operator] = ExactlyOnceSink
            else:
                cls = SinkOperator
            ops.append(cls(node.name, env, spec["topic"], spec["serializer"], spec["key_serializer"],
                           key_fn=spec.get("key"), headers_fn=spec.get("headers"), timestamp_fn=spec.get("timestamp")))
        elif kind in ("union", "source", "side_output"):
            continue  # a union is its input channels, a side output its input; the source drives the chain
        else:
            raise ValueError(f"unknown operator kind {kind!r}")
    if tail is not None:
        ops.append(tail)
    if not ops:
        raise ValueError("empty chain")
    for a, b in zip(ops, ops[1:], strict=False):
        a.next = b
    return ops[0]
