"""Window assigners: which event-time windows a record belongs to (tumbling, sliding, session) and
how long a fired window still takes late records (allowed lateness).

Pure and deterministic: a record's windows depend on its event time only.
"""

from __future__ import annotations

from dataclasses import dataclass


def _positive(name: str, value: object, zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} int (ms), got {value!r}")


@dataclass(frozen=True)
class Windows:
    """Fixed windows of ``size_ms``, one starting every ``slide_ms`` (tumbling: slide = size);
    ``session_gap_ms`` instead: per key, records less than the gap apart share one window, which
    ends a gap after its last record.  A window fires once the watermark reaches its end and keeps
    its state ``allowed_lateness_ms`` longer: a record for it in that time updates the result."""

    size_ms: int = 0
    slide_ms: int = 0
    session_gap_ms: int = 0
    allowed_lateness_ms: int = 0

    @classmethod
    def tumbling(cls, size_ms: int, allowed_lateness_ms: int = 0) -> Windows:
        return cls.sliding(size_ms, size_ms, allowed_lateness_ms)

    @classmethod
    def sliding(cls, size_ms: int, slide_ms: int, allowed_lateness_ms: int = 0) -> Windows:
        _positive("window size", size_ms)
        _positive("window slide", slide_ms)
        _positive("allowed lateness", allowed_lateness_ms, zero=True)
        if slide_ms > size_ms:
            raise ValueError(f"window slide {slide_ms} ms is longer than its size {size_ms} ms: records "
                             "between the windows would belong to none")
        return cls(size_ms=size_ms, slide_ms=slide_ms, allowed_lateness_ms=allowed_lateness_ms)

    @classmethod
    def session(cls, gap_ms: int, allowed_lateness_ms: int = 0) -> Windows:
        _positive("session gap", gap_ms)
        _positive("allowed lateness", allowed_lateness_ms, zero=True)
        return cls(session_gap_ms=gap_ms, allowed_lateness_ms=allowed_lateness_ms)

    @property
    def sessions(self) -> bool:
        return self.session_gap_ms > 0

    def starts(self, ts: int) -> list[int]:
        """The starts of the fixed windows holding event time ``ts``, ascending."""
        first = -(-(ts - self.size_ms + 1) // self.slide_ms) * self.slide_ms  # the first start > ts - size
        return list(range(first, ts - ts % self.slide_ms + 1, self.slide_ms))

    def describe(self) -> str:
        if self.sessions:
            return f"session windows (gap {self.session_gap_ms} ms)"
        if self.slide_ms == self.size_ms:
            return f"tumbling windows of {self.size_ms} ms"
        return f"sliding windows of {self.size_ms} ms every {self.slide_ms} ms"
