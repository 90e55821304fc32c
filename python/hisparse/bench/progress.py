"""A minimal progress bar on stderr (no dependency).

It redraws one line with a carriage return, so it is on only when the stream
is a terminal unless forced; phases are named so a long run says what it is
doing.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

__all__ = ["Progress"]


class Progress:
    """``total`` units of work over named phases: ``advance`` / ``phase`` / ``close``."""

    def __init__(self, total: int, *, stream: Optional[TextIO] = None, enabled: Optional[bool] = None,
                 width: int = 28) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.total = max(int(total), 1)
        self.done = 0
        self.width = width
        self.label = ""
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False

    def phase(self, label: str) -> None:
        self.label = label
        self._draw(force=True)

    def advance(self, units: int = 1) -> None:
        self.done = min(self.total, self.done + units)
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last_draw < 0.1 and self.done < self.total:
            return
        self._last_draw = now
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {100 * self.done // self.total:3d}% {now - self.start:6.1f}s {self.label}"
        # Padded to a fixed width so a shorter label clears a longer one.
        self.stream.write("\r" + line[:100].ljust(100))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.done = self.total
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
