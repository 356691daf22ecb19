"""A limit on how many log lines of one kind are written, for lines a peer can provoke.

At most ``burst`` lines in each ``period`` seconds get through; the others are counted, and the
count is reported with the next line let through (or by ``flush``, called from time to time so
that the end of a flood is reported too). Ordinary operation, a line now and then, is never
suppressed. Sans-IO: the clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class LineRateLimiter:
    burst: int = 5
    period: float = 1.0
    window_start: float | None = None
    lines: int = 0  # lines let through in the current window
    suppressed: int = 0  # lines suppressed and not yet reported

    def allow(self, now: float) -> int | None:
        """May a line be written at ``now``? None: no (it is counted); otherwise how many lines
        were suppressed since the last one written (to report with this one)."""
        if self.window_start is None or now - self.window_start >= self.period:
            self.window_start = now
            self.lines = 0
        if self.lines >= self.burst:
            self.suppressed += 1
            return None
        self.lines += 1
        suppressed, self.suppressed = self.suppressed, 0
        return suppressed

    def flush(self, now: float) -> int:
        """How many lines were suppressed and not yet reported, once their window is over
        (0 while it lasts: the next line let through will carry the count)."""
        if self.window_start is not None and now - self.window_start < self.period:
            return 0
        suppressed, self.suppressed = self.suppressed, 0
        return suppressed
