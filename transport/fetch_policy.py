"""Which ``fetch.wait.max.ms`` a long-lived consumer should have, from what its polls return.

librdkafka fixes a consumer's fetch wait when the consumer is made, so a consumer that must
change it is made again (its owner does that; this module only decides when).  Three waits:

* **normal**, the configured one: short, because the embedded broker answers a waiting fetch
  only when its wait ends (records are seen up to half a wait late, docs/embedded-broker.md);
* **catching up** (:data:`CATCH_UP_FETCH_WAIT_MS`): a broker may answer a fetch empty when
  reading what it asked for takes longer than the wait (the embedded broker does, for records
  far behind the end of a partition under load), so a consumer whose every poll came back empty
  for :data:`STALL_S` while records wait below the high watermark fetches with a longer wait,
  until it has been at the end for a hold that doubles with each stall (a partition grown past
  what the short wait can serve would stall again at once);
* **idle** (``idle_ms``): a consumer whose polls found nothing for ``idle_after_s`` fetches
  with a long wait, because each empty fetch costs the broker the same whatever its wait, and a
  running job with no input otherwise keeps it busy with a hundred of them a second per
  consumer.  The first records after the pause are seen up to half that wait late; then the
  consumer is made again with the normal wait.
"""

from __future__ import annotations

from enum import Enum

STALL_S = 1.0
CATCH_UP_FETCH_WAIT_MS = 100
CAUGHT_UP_HOLD_S = 2.0
CAUGHT_UP_HOLD_MAX_S = 300.0


class Pace(Enum):
    NORMAL = "normal"
    CATCHING_UP = "catching up"
    IDLE = "idle"


class FetchWaitPolicy:
    """Fed each poll's outcome; says when the consumer's fetch wait should change.

    ``idle_ms`` 0 (or ``idle_after_s`` 0) never goes idle."""

    def __init__(self, normal_ms: int, idle_ms: int = 0, idle_after_s: float = 0.0, *,
                 catch_up_ms: int = CATCH_UP_FETCH_WAIT_MS, stall_s: float = STALL_S,
                 hold_s: float = CAUGHT_UP_HOLD_S, hold_max_s: float = CAUGHT_UP_HOLD_MAX_S) -> None:
        self.normal_ms = normal_ms
        self.idle_ms = idle_ms if idle_after_s > 0 and idle_ms > normal_ms else 0
        self.idle_after_s = idle_after_s
        self.catch_up_ms = catch_up_ms
        self.stall_s = stall_s
        self.hold_max_s = hold_max_s
        self.pace = Pace.NORMAL
        self.hold_s = hold_s / 2  # doubled by each stall
        self.stalls = 0  # times it went to catching up (for tests and logs)
        self.last_stall_s = 0.0  # how long the polls that made it catch up last came back empty
        self._stalled_since: float | None = None  # every poll empty while records wait
        self._caught_up_since: float | None = None  # catching up: at the end since
        self._quiet_since: float | None = None  # normal: nothing found and nothing behind since

    @property
    def wait_ms(self) -> int:
        """The fetch wait the consumer should have now."""
        if self.pace is Pace.CATCHING_UP:
            return self.catch_up_ms
        return self.idle_ms if self.pace is Pace.IDLE else self.normal_ms

    def stalled_for(self, now: float) -> float:
        """How long every poll has come back empty while records wait (0: not stalled)."""
        return 0.0 if self._stalled_since is None else now - self._stalled_since

    def on_poll(self, now: float, got: bool, behind: bool, input_behind: bool | None = None) -> Pace | None:
        """One poll's outcome (``got``: it returned records that count as input; ``behind``: an
        unpaused partition has records below its high watermark not fetched yet;
        ``input_behind``: one of input has, if not the same); the new pace when the consumer should
        be made again with :attr:`wait_ms`, else None.  Idleness follows input alone: a partition
        of control records written while idle is behind for a moment whenever one is fetched."""
        waiting = behind if input_behind is None else input_behind
        self._stalled_since = _since(self._stalled_since, behind and not got, now)
        if self.pace is Pace.IDLE:
            return self._go(Pace.NORMAL) if got or waiting else None
        if self.pace is Pace.CATCHING_UP:
            self._caught_up_since = _since(self._caught_up_since, not behind, now)
            return self._go(Pace.NORMAL) if _lasted(self._caught_up_since, self.hold_s, now) else None
        if _lasted(self._stalled_since, self.stall_s, now):
            self.hold_s = min(self.hold_max_s, 2 * self.hold_s)
            self.stalls += 1
            self.last_stall_s = self.stalled_for(now)
            return self._go(Pace.CATCHING_UP)
        if not self.idle_ms:
            return None
        self._quiet_since = _since(self._quiet_since, not got and not waiting, now)
        return self._go(Pace.IDLE) if _lasted(self._quiet_since, self.idle_after_s, now) else None

    def _go(self, pace: Pace) -> Pace:
        self.pace = pace
        self._stalled_since = self._caught_up_since = self._quiet_since = None
        return pace


def _since(since: float | None, holds: bool, now: float) -> float | None:
    """When a condition that ``holds`` now began: ``since`` if it held already, None if not."""
    if not holds:
        return None
    return now if since is None else since


def _lasted(since: float | None, seconds: float, now: float) -> bool:
    return since is not None and now - since >= seconds
