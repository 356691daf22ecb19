"""A token bucket for creation of client records and sessions (SEC-12, SS-33), sans-IO."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; the clock is passed in."""

    rate: float
    burst: float
    tokens: float = -1.0  # -1: start full
    stamp: float | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def allow(self, now: float, cost: float = 1.0) -> bool:
        if self.stamp is not None and now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        if self.stamp is None or now > self.stamp:
            self.stamp = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False
