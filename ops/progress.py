"""A live status line for long work: redrawn in place on a terminal, a line every few seconds otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StatusLine:
    def __init__(self, stream: TextIO | None = None, plain_every_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.plain_every_s = plain_every_s
        self._last_plain = 0.0
        self._width = 0

    def update(self, text: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
            self.stream.flush()
        elif time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            self.stream.write(text + "\n")
            self.stream.flush()

    def done(self, text: str | None = None) -> None:
        """Finish the line (always printed, also when not a terminal)."""
        if self.tty:
            self.update(text or "")
            self.stream.write("\n")
        elif text:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._width = 0


def bar(fraction: float, width: int = 24) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    filled = int(round(fraction * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"
