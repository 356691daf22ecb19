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

Connections without a usable address (``rdma-peer`` of the RDMA listener, which does not yet
report the CM's peer address) all share one source key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable
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
