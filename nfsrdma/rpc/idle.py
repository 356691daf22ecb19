"""When to close a connection that does nothing useful (sans-IO; times in seconds).

A connection that carries no session and no outstanding call is closed when

- it has not delivered one whole message within ``record`` seconds of being opened (it sent
  nothing useful: a connect-and-sit, or a first record dribbled a byte at a time);
- a record it has begun stays incomplete for ``record`` seconds (slow-loris);
- it has been idle (no message) for ``idle`` seconds.

A connection bound to a session is never closed here: the client keeps it for the back channel.
The tracker is consulted at checks (a timer), not on every byte: what it knows of a connection is
what each check saw (how many messages so far, whether a record is half-way), so its deadlines
are counted from the first check that saw a change, never from before it. It closes late by at
most one check period (``record`` seconds), never early. A timeout of 0 turns that rule off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdleTimeouts:
    idle: float = 300.0  # no message for this long: close (0: never)
    record: float = 30.0  # first message, or a begun record, not complete in this long (0: never)

    @property
    def enabled(self) -> bool:
        return self.idle > 0 or self.record > 0

    @property
    def period(self) -> float:
        """How often a connection is looked at when nothing is due sooner."""
        return min(t for t in (self.idle, self.record) if t > 0)


@dataclass(frozen=True, slots=True)
class Verdict:
    close: str | None  # why to close the connection now; None: keep it
    check_at: float  # when kept: when to look again


class IdleTracker:
    """What checks have seen of one connection, and the verdict at each check."""

    def __init__(self, timeouts: IdleTimeouts, now: float) -> None:
        self.timeouts = timeouts
        self.opened = now
        self.messages = 0  # messages the connection had delivered at the last check
        self.active: float | None = None  # first check that saw the latest message (or a call)
        self.partial: float | None = None  # first check that saw the current incomplete record

    def first_check(self) -> float:
        return self.opened + self.timeouts.period

    def check(
        self, now: float, *, messages: int, receiving: bool, busy: bool, has_session: bool
    ) -> Verdict:
        """``messages``: whole messages delivered so far; ``receiving``: part of a record has
        arrived; ``busy``: calls outstanding in either direction; ``has_session``: a session's
        fore or back channel is bound to the connection."""
        t = self.timeouts
        if messages != self.messages:
            self.messages = messages
            self.active = now
            self.partial = None
        if busy or has_session:
            if busy:
                self.active = now
            self.partial = None
            return Verdict(None, now + t.period)
        if self.active is None and t.record > 0:
            deadline = self.opened + t.record
            if now >= deadline:
                return Verdict(f"no complete record within {t.record:g} s", now)
            return Verdict(None, deadline)
        if receiving and t.record > 0:
            if self.partial is None:
                self.partial = now
            deadline = self.partial + t.record
            if now >= deadline:
                return Verdict(f"record incomplete for {t.record:g} s", now)
            return Verdict(None, deadline)
        self.partial = None
        if t.idle > 0:
            deadline = (self.opened if self.active is None else self.active) + t.idle
            if now >= deadline:
                return Verdict(f"idle for {t.idle:g} s", now)
            # Look again before then if a record might begin meanwhile (slow-loris).
            return Verdict(None, min(deadline, now + t.record) if t.record > 0 else deadline)
        return Verdict(None, now + t.period)
