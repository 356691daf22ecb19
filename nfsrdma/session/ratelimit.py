"""Rate limits on the creation of client records and sessions (SEC-12, SS-33), sans-IO.

There is no server-wide bucket: one noisy client must not be able to delay everybody else.
Creations are charged to token buckets keyed by who asks:

- the **client owner's** (co_ownerid): 16 at once, then 1 a second. An honest client creates a
  record and a session or two per mount; a client spinning EXCHANGE_ID or CREATE_SESSION with
  one owner empties its own bucket and is then refused (NFS4ERR_DELAY) without touching its
  address's bucket;
- the **source address's** (the peer host of the connection; see ``shares.source_of``), for new
  client records only: 512 at once, then 64 a second, so that a few hundred clients behind one
  address (containers, NAT, a cluster booting) set up without a single NFS4ERR_DELAY, while an
  address spinning EXCHANGE_ID with ever new owners is refused after 512, for itself only.

What is charged is decided by ``ServerSessions``: a new client record (EXCHANGE_ID cases 1, 3,
4, 5) costs a token of the owner and of the address; a session of an already confirmed client a
token of the owner (an address cannot multiply owners without creating records, and its sessions
are capped). The CREATE_SESSION that confirms a record is paid for by the EXCHANGE_ID that
created it, and an EXCHANGE_ID that creates nothing (a retry, a trunking probe, an update of
one's own confirmed record with EXCHGID4_FLAG_UPD_CONFIRMED_REC_A) is never charged. So one
EXCHANGE_ID, one CREATE_SESSION and an update always pass for an honest client, and a client
already known goes on working whatever its address's bucket holds. The one client that shares
an attacker's fate is a *new* owner at the attacker's own address (the server cannot tell two
clients of one machine apart by anything but the owner, which the attacker chooses).

The limiter's own memory is bounded: a bucket that has filled up again is the same as a new one
and is dropped (``expire``), and at most ``max_keys`` (8192) owners and as many addresses are
tracked; beyond that the least recently used is forgotten (it starts full when seen again, which
only helps an attacker who already spreads over thousands of addresses; the record and session
caps still bound memory).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


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

    def available(self, now: float) -> float:
        """The tokens held at ``now`` (refilled for the time since the last look)."""
        if self.stamp is not None and now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        if self.stamp is None or now > self.stamp:
            self.stamp = now
        return self.tokens

    def full(self, now: float) -> bool:
        return self.available(now) >= self.burst

    def allow(self, now: float, cost: float = 1.0) -> bool:
        if self.available(now) >= cost:
            self.tokens -= cost
            return True
        return False


class KeyedBuckets(Generic[K]):
    """One token bucket per key, at most ``max_keys`` of them, least recently used first."""

    def __init__(self, rate: float, burst: float, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[K, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def bucket(self, key: K, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets.move_to_end(key)
            return bucket
        if len(self._buckets) >= self.max_keys:
            self.expire(now)
            while len(self._buckets) >= self.max_keys:
                self._buckets.popitem(last=False)
        bucket = self._buckets[key] = TokenBucket(self.rate, self.burst)
        return bucket

    def expire(self, now: float) -> None:
        """Forget buckets that are full again, from the least recently used on."""
        while self._buckets:
            key, bucket = next(iter(self._buckets.items()))
            if not bucket.full(now):
                return
            del self._buckets[key]


class CreationLimiter:
    """The per-owner and per-source-address buckets of creations (see the module docstring)."""

    def __init__(
        self,
        *,
        owner_rate: float,
        owner_burst: float,
        source_rate: float,
        source_burst: float,
        max_keys: int,
    ) -> None:
        self.owners: KeyedBuckets[bytes] = KeyedBuckets(owner_rate, owner_burst, max_keys)
        self.sources: KeyedBuckets[str] = KeyedBuckets(source_rate, source_burst, max_keys)

    def allow(self, owner: bytes, source: str, now: float) -> bool:
        """Charge a new client record to both buckets, or to none when either is empty. The
        owner's is looked at first: a spinning owner is refused without draining its
        address's bucket."""
        by_owner = self.owners.bucket(owner, now)
        if by_owner.available(now) < 1:
            return False
        if not self.sources.bucket(source, now).allow(now):
            return False
        return by_owner.allow(now)

    def allow_owner(self, owner: bytes, now: float) -> bool:
        """Charge a new session of a confirmed client to its owner's bucket."""
        return self.owners.bucket(owner, now).allow(now)

    def expire(self, now: float) -> None:
        self.owners.expire(now)
        self.sources.expire(now)
