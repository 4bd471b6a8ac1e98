"""LiveRobin's deterministic merge (Algorithm 1 of paper 004), as a pure state machine.

Batches are pushed per input channel in whatever order they arrive; :meth:`LiveRobinMerge.pull`
returns the elements in the one order that every replica computes from the same per-channel
sequences, whatever the arrival timing:

* read the current channel, blocking (here: stopping) until it has an element;
* a pulse ``h`` seen for the first time (``h > gen``) is forwarded downstream in place;
* after any pulse the channel leaves the active set until every active channel has delivered
  its pulse of this cycle; then all channels are active again;
* round robin over the active channels after every element.

Paper note: Algorithm 1's indentation puts line 15 (``A <- A \\ {next}``) under the
first-reception test, but the text says the queue is removed in both cases ("It then removes
the current queue..."), and only that keeps cycles aligned: a channel whose pulse is not the
first one of its cycle must leave the active set too.  We follow the text.

Not in the paper, for a graceful drain: END closes a channel for good (it leaves the channel
set); the merge is finished when every channel has ended.

Checkpoints (Rhino): with ``checkpoint_every`` N, the merge's state right after forwarding pulse
``h`` (N divides ``h``) is kept in ``states`` until the runtime takes it (:meth:`take_state`): the
runtime consumes steps later than the merge makes them, and a checkpoint at ``h`` must record
the merge as it was at ``h``.  :meth:`restore` starts a merge from such a state, with empty
queues (the channels are replayed from the checkpoint's positions).

No I/O, no threads, no clock: the runtime feeds it and acts on the steps it returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

# Element kinds (first tuple field) the merge acts on; the rest is payload to it.  They are the
# runtime's (replication.runtime.elements, pinned by a test): liverobin does not import the runtime.
END = 2
PULSE = 3
_kind = itemgetter(0)


@dataclass(frozen=True)
class Step:
    """One consumed element: ``forward`` is True for a pulse seen for the first time (send it on)."""

    channel: int
    element: tuple
    forward: bool = False


MergeState = tuple[tuple[int, ...], tuple[int, ...], int, int]  # open, active, next, gen


class LiveRobinMerge:
    def __init__(self, channels: Iterable[int], checkpoint_every: int = 0) -> None:
        self.channels: list[int] = sorted(set(channels))
        if not self.channels:
            raise ValueError("a merge needs at least one input channel")
        self.open: set[int] = set(self.channels)
        self.active: set[int] = set(self.channels)
        self.next: int = self.channels[0]
        self.gen = 0  # highest pulse seen
        self._queues: dict[int, deque[tuple]] = {c: deque() for c in self.channels}
        self._pulses = dict.fromkeys(self.channels, 0)  # pulses pushed and not consumed yet
        self.checkpoint_every = checkpoint_every
        self.states: dict[int, MergeState] = {}

    # -- checkpoints -----------------------------------------------------------------------
    def state(self) -> MergeState:
        """The merge's state (without the queued elements)."""
        return tuple(sorted(self.open)), tuple(sorted(self.active)), self.next, self.gen

    def take_state(self, h: int) -> MergeState:
        """The state right after pulse ``h`` was forwarded (``checkpoint_every`` divides ``h``)."""
        return self.states.pop(h)

    def restore(self, state: MergeState) -> None:
        """Continue from ``state``; whatever was queued is dropped (it will be replayed)."""
        open_, active, self.next, self.gen = state
        self.open, self.active = set(open_), set(active)
        for queue in self._queues.values():
            queue.clear()
        self._pulses = dict.fromkeys(self.channels, 0)
        self.states.clear()

    # -- input ---------------------------------------------------------------------------
    def push(self, channel: int, elements: Sequence[tuple]) -> None:
        """Elements of ``channel``, in its FIFO order (already deduplicated)."""
        if channel not in self._queues:
            raise KeyError(f"channel {channel} is not an input of this merge")
        self._queues[channel].extend(elements)
        self._pulses[channel] += list(map(_kind, elements)).count(PULSE)

    def holds_pulse(self, channel: int) -> bool:
        """Whether a pulse of ``channel`` was pushed and is not consumed yet: the merge holds the
        rest of that channel's current cycle."""
        return self._pulses[channel] > 0

    # -- output --------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return not self.open

    @property
    def blocked_on(self) -> int | None:
        """The channel the merge waits for (None once finished)."""
        return None if self.finished else self.next

    def pull(self, limit: int | None = None) -> list[Step]:
        """Every step possible with what has been pushed (at most ``limit``)."""
        steps: list[Step] = []
        while self.open and (limit is None or len(steps) < limit):
            queue = self._queues[self.next]
            if not queue:
                break
            steps.append(self._consume(self.next, queue.popleft()))
        return steps

    def _consume(self, channel: int, element: tuple) -> Step:
        kind = element[0]
        forward = False
        if kind == PULSE:
            self._pulses[channel] -= 1
            h = element[1]
            if h > self.gen:
                forward = True
                self.gen = h
            self._leave_cycle(channel)
        elif kind == END:
            self.open.discard(channel)
            self._leave_cycle(channel)
        self._advance(channel)
        if forward and self.checkpoint_every and element[1] % self.checkpoint_every == 0:
            self.states[element[1]] = self.state()
        return Step(channel, element, forward)

    def _leave_cycle(self, channel: int) -> None:
        self.active.discard(channel)
        self.active &= self.open
        if not self.active:
            self.active = set(self.open)  # every open channel delivered this cycle's pulse

    def _advance(self, current: int) -> None:
        if not self.active:
            return
        later = [c for c in sorted(self.active) if c > current]
        self.next = later[0] if later else min(self.active)
