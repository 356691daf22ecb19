"""Fair shares of what clients make the server hold (SEC-12, SS-33), sans-IO.

One client, or one machine with many client ids, must not lock out the others. Every server-wide
bound is therefore split by **source address** (the peer host of the connection a request came
on: an IPv4 address, an IPv6 /64, since one host gets a whole /64; see ``source_of``) and by
**client owner** (co_ownerid), and a newcomer is always left a minimal session. The defaults
(``SessionCaps``) and why:

- Client records: 4096 server-wide (memory: a record is small, but state hangs off it); one
  source holds at most 1024 of them. At a bound, the oldest *unconfirmed* record is evicted (of
  that source, or server-wide) once older than 5 s: an honest client confirms within a round
  trip, a flood of EXCHANGE_IDs never does. Otherwise the newcomer gets NFS4ERR_DELAY.
- Creation rates: new records per owner and per source address, further sessions per owner
  (``ratelimit``), never server-wide.
- Sessions: 2048 server-wide, 512 per source address (a few hundred clients behind one address
  fit), 16 per client (the client's own business, NFS4ERR_NOSPC beyond).
- Reply cache (``drc_budget``, 256 MiB): a session reserves slots x (ca_maxresponsesize_cached +
  256 octets). A **reserve** of (max_sessions + 1) minimal sessions (4 slots x (4 KiB + 256),
  about 36 MiB by default, at most half the budget) is kept for minimal sessions; the rest is the
  general pool, of which one source address may reserve a quarter and one client owner a
  sixteenth. CREATE_SESSION grants the slots asked for as far as the general pool and both shares
  allow; when that is fewer than 4 slots, it grants a minimal session instead (4 slots, cached
  replies of at most 4 KiB: what a Linux client asks for fits) out of the reserve (it does not
  count against the shares; should the reserve be spent, out of the pool regardless of shares).
  Since the reserve holds a minimal session for every session the server may have, a
  CREATE_SESSION is refused NFS4ERR_NOSPC for lack of reply cache only if the server is
  genuinely out of it; four client ids with 16 large sessions each from one address take at
  most a quarter of the pool, and a newcomer elsewhere gets all it asks for. It takes four
  addresses at their full share (sixteen owners at theirs) to spend the pool; newcomers then
  get minimal sessions until idle slots or expired leases give room back.
- Idle slots are given back: a session that has used no slot above the minimal 4 for 60 s
  (``slot_idle_time``) is shrunk to 4 slots at the next reap; its SEQUENCE replies then carry
  the lower sr_highest_slotid and sr_target_highest_slotid (RFC 8881 section 2.10.6.1; the Linux
  client shrinks its table to match) and its reservation is returned to the pool. When the
  client later uses its highest slot again, the table grows back towards what was negotiated, as
  far as the pool and its shares allow.
- Clients whose lease expired are reaped with their sessions, which returns their reservations.
- Slots under pressure (RFC 8881 sections 2.10.6.1, 20.8; ``DrcPressure``, ``shed``). When the
  pool's reservations reach a high-water mark (90 %), or a CREATE_SESSION had to be cut down
  while they are above the low-water mark (75 %), the server is under pressure: the sessions
  holding the most of the pool above their fair share (the pool divided by the number of
  sessions) are asked, largest excess first, to make do with their fair share (never fewer
  than the minimal 4 slots) until the reservations would be back at the low-water mark. Their
  SEQUENCE replies carry the lower sr_target_highest_slotid, and those with a working back
  channel get CB_RECALL_SLOT. Once a session's sa_highest_slotid shows it no longer uses the
  slots above its target, they are reclaimed: cached replies dropped, the table shrunk
  (sr_highest_slotid), the reservation returned. While under pressure no table grows. When
  the reservations are below the low-water mark again, the recalled sessions grow back
  towards what they negotiated, as far as their shares allow and only up to the low-water mark
  (growing to the high-water mark would bring the pressure straight back); beyond that they
  grow as any table does, when the client uses its highest slot. The pressure is assessed where
  the budget changes (CREATE_SESSION, session destruction, reap), never by polling; a recall
  whose slots are still not given back a lease later is sent again (the callback may be lost).

Connections without a usable address (``rdma-peer`` of the RDMA listener, which does not yet
report the CM's peer address) all share one source key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

SOURCE_IPV6_PREFIX = 64


def source_of(peer: str) -> str:
    """The source key of a connection's peer ("host:port", "[v6]:port" or a bare name)."""
    host = peer
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1 or (host.count(":") > 1 and _is_v6_with_port(host)):
        host = host.rsplit(":", 1)[0]
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        net = ipaddress.IPv6Network((addr, SOURCE_IPV6_PREFIX), strict=False)
        return str(net)
    return str(addr)


def _is_v6_with_port(host: str) -> bool:
    """An IPv6 address, a colon and a port ("::1:2049", as the TCP transport writes it)?"""
    head, _, tail = host.rpartition(":")
    if not tail.isdigit():
        return False
    try:
        ipaddress.IPv6Address(head)
    except ValueError:
        return False
    return True


class Tally(Generic[K]):
    """Amounts by key; keys at zero are forgotten (memory stays bounded by what is held)."""

    def __init__(self) -> None:
        self._amounts: dict[K, int] = {}

    def __getitem__(self, key: K) -> int:
        return self._amounts.get(key, 0)

    def __len__(self) -> int:
        return len(self._amounts)

    def add(self, key: K, amount: int) -> None:
        total = self._amounts.get(key, 0) + amount
        if total > 0:
            self._amounts[key] = total
        else:
            self._amounts.pop(key, None)


class ReplyCacheBudget:
    """Reservations of the reply-cache budget: the general pool, shared out by source address
    and client owner, and the reserve for minimal sessions."""

    def __init__(
        self, total: int, *, reserve: int, source_share: float, owner_share: float
    ) -> None:
        self.total = total
        self.reserve = max(0, min(reserve, total // 2))
        self.pool = total - self.reserve
        self.source_cap = int(self.pool * source_share)
        self.owner_cap = int(self.pool * owner_share)
        self.pool_used = 0
        self.reserve_used = 0
        self.by_source: Tally[str] = Tally()  # of the pool
        self.by_owner: Tally[bytes] = Tally()

    @property
    def reserved(self) -> int:
        return self.pool_used + self.reserve_used

    def room(self, source: str, owner: bytes) -> int:
        """Octets of the pool ``owner`` at ``source`` may reserve now."""
        return max(
            0,
            min(
                self.pool - self.pool_used,
                self.source_cap - self.by_source[source],
                self.owner_cap - self.by_owner[owner],
            ),
        )

    def take(self, source: str, owner: bytes, amount: int) -> None:
        """Reserve ``amount`` octets of the pool (negative: give them back)."""
        self.pool_used += amount
        self.by_source.add(source, amount)
        self.by_owner.add(owner, amount)

    def give_back(self, source: str, owner: bytes, amount: int) -> None:
        self.take(source, owner, -amount)

    def take_minimal(self, source: str, owner: bytes, amount: int) -> int | None:
        """Reserve a minimal session's ``amount``: out of the reserve, else out of what the
        pool has left regardless of shares. Returns the octets that came out of the reserve,
        or None when the budget is genuinely spent."""
        if self.reserve_used + amount <= self.reserve:
            self.reserve_used += amount
            return amount
        if self.pool_used + amount <= self.pool:
            self.take(source, owner, amount)
            return 0
        return None

    def give_back_reserve(self, amount: int) -> None:
        self.reserve_used -= amount


@dataclass(slots=True)
class DrcPressure:
    """Is the reply-cache pool under pressure? Hysteresis between two marks (fractions of the
    pool), so that shedding and growing back do not chase each other."""

    high_water: float = 0.9
    low_water: float = 0.75
    on: bool = False

    def assess(self, pool_used: int, pool: int, *, cut_down: bool = False) -> bool:
        """Update from the pool's reservations; ``cut_down``: a CREATE_SESSION just got fewer
        slots than it asked for. Returns whether the pool is under pressure."""
        if pool_used >= self.high_water * pool or (cut_down and pool_used >= self.low_mark(pool)):
            self.on = True
        elif pool_used < self.low_mark(pool):
            self.on = False
        return self.on

    def low_mark(self, pool: int) -> int:
        return int(self.low_water * pool)


@dataclass(frozen=True, slots=True)
class SlotHolding(Generic[K]):
    """One session as the pressure decision sees it."""

    key: K
    slots: int  # slots it may use now (its target, when one is set below its table)
    per_slot: int  # octets of the budget per slot
    pooled: int  # octets of the general pool those slots hold
    floor: int  # it is never asked to go below this many slots (the minimal session)


def shed(holdings: Iterable[SlotHolding[K]], *, pool: int, need: int) -> dict[K, int]:
    """Under pressure: which sessions to ask for fewer slots, and how many each may keep, to
    free ``need`` octets of the pool. The sessions holding the most above their fair share
    (``pool`` / number of sessions) go first, each down to its fair share (at least its
    floor); sessions at or below their share are left alone, even when that frees less than
    ``need``."""
    holdings = list(holdings)
    if need <= 0 or not holdings:
        return {}
    fair = pool // len(holdings)
    over = sorted((h for h in holdings if h.pooled > fair), key=lambda h: fair - h.pooled)
    targets: dict[K, int] = {}
    for h in over:
        if need <= 0:
            break
        keep = max(h.floor, min(h.slots, fair // h.per_slot))
        if keep >= h.slots:
            continue
        targets[h.key] = keep
        need -= (h.slots - keep) * h.per_slot
    return targets
