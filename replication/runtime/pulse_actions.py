"""What a processing replica does at a pulse: operator replacements and handover steps.

Both replicas of a partition reach every pulse at the same point of their input, so what a
handover or an operator replacement changes happens there on both: an operator swaps its
function after the pulse a replacement switches at (:meth:`PulseActions._replace_operators_at`);
an origin cuts the moved key groups out of its state and ships them, a target loads what it got
and processes the records it held (:meth:`PulseActions._handovers_at_pulse`).  Each waits, where
it must, until the driver decided whether the step was committed, and acks what it did.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

from replication.runtime.chain import chain_operators
from replication.runtime.handover_cuts import split_cut
from replication.runtime.operators import Router
from rhino_state.cut import entry_bytes


class PulseActions:
    """The pulse-time part of :class:`~replication.runtime.processing.ProcessingInstance` (a mixin:
    it runs on the replica's thread, with its chain, state and handovers)."""

    chain: Any
    code: dict[str, bytes]
    code_switches: Any
    handovers: Any
    stop_requested: Any
    cfg: Any
    worker: Any
    partition: int
    num_key_groups: int
    handover_ack: Any  # (handover id, epoch, kind, ...): queue an ack for the driver
    state_backend: Any  # (): the replica's RocksDB state
    _element: Any  # (channel, element): one held element into the chain
    _current_wm: int  # the watermark the chain has

    def _replace_operators_at(self, h: int) -> bool:
        """Pulse ``h`` was forwarded: the operator replacements due take effect from the next element.
        False: stopping while waiting to know whether one was committed."""
        for order in self.code_switches.at_pulse(h):
            decided = self.code_switches.decided(order.handover_id, self.stop_requested.is_set)
            if decided is None:
                return False
            if decided:
                op = next(o for o in chain_operators(self.chain) if o.name == order.operator)
                op.replace_fn(pickle.loads(order.fn))
                self.code[op.name] = order.fn
                self.handover_ack(order.handover_id, order.epoch, "switched")
            self.code_switches.done(order.handover_id)
        return True

    def _handovers_at_pulse(self, h: int) -> bool:
        """Before forwarding pulse ``h``: cut what this origin gives away (h = P + 1), load what this
        target gets and process the records it held (h = R).  False: stopping while waiting."""
        handovers = self.handovers
        assert handovers is not None
        stopping = self.stop_requested.is_set
        cuts, releases = handovers.at_pulse(h)
        for order in cuts:
            decided = handovers.decided(order.handover_id, stopping)
            if decided is None:
                return False
            step = handovers.step(order.handover_id)
            if not decided:
                if step is not None:
                    handovers.drop(step)
                continue
            moving = frozenset(kg for r in handovers.cut_groups(order) for kg in r)
            extras = {op.name: op.cut_keys(moving.__contains__)
                      for op in chain_operators(self.chain) if hasattr(op, "cut_keys")}
            # Rhino: a target whose worker holds this origin's last checkpoint gets the changes since
            cut = handovers.cut(order, self.state_backend(), incremental=self.cfg.rhino_enabled)
            for op in chain_operators(self.chain):
                op.state_left(moving)
            cut_at = time.time()  # before the send: the transfer is a phase of its own
            per_target = split_cut(order, self.partition, cut, extras, self.num_key_groups,
                                   self.cfg.handover_chunk_bytes)
            if self.cfg.rhino_enabled:
                handovers.kept_cuts.keep(order.handover_id, per_target)
            shipped = self.worker.cuts.send(order, self.partition, per_target)
            self.handover_ack(order.handover_id, order.epoch, "cut", cut.digest, len(cut.entries),
                              {"at": cut_at, "bytes": entry_bytes(cut.entries), "shipped": shipped})
        for step in releases:
            decided = handovers.decided(step.order.handover_id, stopping)
            if decided is None:
                return False
            windows = [op for op in chain_operators(self.chain) if hasattr(op, "adopt_keys")]
            arrived = handovers.load_groups(step.order)
            if decided:
                merge = _merger(windows) if handovers.serve_through else None
                held = handovers.release(step, self.state_backend(), stopping, merge)
                if held is None:
                    return False
                for origin in sorted(step.extras):  # the moved keys' fire index, before their held records
                    for op in windows:
                        op.adopt_keys(step.extras[origin].get(op.name, ()))
                entries = step.state
                for op in chain_operators(self.chain):
                    op.state_arrived(arrived, entries)
            else:
                held = handovers.drop(step)
            replay_held(self.chain, held, frozenset(kg for r in arrived for kg in r), handovers.advances,
                        self._current_wm, self._element)
            if decided:
                for op in chain_operators(self.chain):
                    op.fire_behind()
                # acked once the held records are processed: its time ends the catch-up
                self.handover_ack(step.order.handover_id, step.order.epoch, "loaded", entries=step.entries,
                                  times={**step.times(), "held": len(held), "served": int(handovers.serve_through)})
            for tail in chain_operators(self.chain)[-1:]:
                if isinstance(tail, Router):
                    tail.forward_withheld()
        return True


def replay_held(chain: Any, held: tuple[tuple[int, tuple, int], ...], key_groups: frozenset[int],
                advances: list[int], watermark: int, process: Callable[[int, tuple], None]) -> None:
    """Process the records a handover target held of ``key_groups`` (``(channel, record, the
    watermark it arrived at)``, in arrival order) as if they had not waited: event time for those
    key groups goes back to the first one's watermark and rises again through ``advances`` (what
    the chain's watermark rose to meanwhile) up to ``watermark`` (the chain's now), each record
    processed at its own, with what of those key groups falls due fired at its place."""
    if not held:
        return
    at = held[0][2]
    chain.catch_up(at, key_groups)
    marks = sorted({a for a in (*advances, watermark) if a > at})
    i = 0
    for channel, record, wm in held:
        while i < len(marks) and marks[i] <= wm:
            chain.catch_up(marks[i], key_groups)
            i += 1
        process(channel, record)
    for mark in marks[i:]:
        chain.catch_up(mark, key_groups)


def _merger(windows: list[Any]) -> Any:
    """A target serving through a move: merges a moved accumulator with the one it built since the
    switch, by the window operator whose state the entry is (its state id starts the key)."""
    mergers = {op.state_prefix: op.merge_raw for op in windows}
    return lambda rest, moved, served: mergers[rest[:4]](moved, served)
