"""A running server's figures in one snapshot (plain, JSON-able data), gathered when asked:
the operation tables the COMPOUND loop feeds, the RPC-over-RDMA counters of every connection
(live ones, plus what closed ones counted) and the session registry's figures. Nothing here
runs per request."""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nfsrdma.stats.core import BOUNDS, ServerStats
from nfsrdma.transport.rdma.connection_base import RdmaConnectionBase

if TYPE_CHECKING:
    from nfsrdma.rpc.connection import RpcConnection
    from nfsrdma.session.server import ServerSessions
    from nfsrdma.transport.base import Connection

TRANSPORTS = ("tcp", "rdma")


class Collector:
    def __init__(self, stats: ServerStats, started: float) -> None:
        self.stats = stats
        self.started = started  # monotonic seconds
        self.rdma_closed: collections.Counter[str] = collections.Counter()
        self.rdma_connections_closed = 0

    def connection_closed(self, conn: Connection) -> None:
        """Keep what a closing RDMA connection counted."""
        if isinstance(conn, RdmaConnectionBase):
            self.rdma_closed.update(conn.stats)
            self.rdma_connections_closed += 1

    def snapshot(
        self,
        now: float,
        connections: Iterable[RpcConnection],
        sessions: ServerSessions | None,
        *,
        buckets: bool = False,
    ) -> dict[str, Any]:
        conns = [c.conn for c in connections]
        transports: dict[str, Any] = {}
        for kind in [*TRANSPORTS, *sorted(set(self.stats.tables) - set(TRANSPORTS))]:
            table = self.stats.tables.get(kind)
            one: dict[str, Any] = {"connections": sum(1 for c in conns if c.kind == kind)}
            one.update(
                table.snapshot(buckets=buckets)
                if table is not None
                else {"compounds": 0, "replays": 0, "ops": {}}
            )
            transports[kind] = one
        rdma = [c for c in conns if isinstance(c, RdmaConnectionBase)]
        counters = collections.Counter(self.rdma_closed)
        for c in rdma:
            counters.update(c.stats)
        snap: dict[str, Any] = {
            "uptime_s": round(now - self.started, 3),
            "transports": transports,
            "rdma": {
                "connections": len(rdma),
                "connections_closed": self.rdma_connections_closed,
                "credits_granted": sum(c.policy.grant for c in rdma),
                "counters": dict(sorted(counters.items())),
            },
            "sessions": session_figures(sessions),
        }
        if buckets:
            snap["bounds_s"] = list(BOUNDS)
        return snap


def session_figures(sessions: ServerSessions | None) -> dict[str, int]:
    if sessions is None:
        return {}
    live = list(sessions.sessions.values())
    return {
        "clients": len(sessions.clients),
        "sessions": len(live),
        "slots": sum(s.slots.count for s in live),
        "slots_in_use": sum(s.slots.busy for s in live),
        "reply_cache_bytes": sum(s.slots.cached_bytes for s in live),
        "reply_cache_reserved_bytes": sessions.drc_reserved,
    }
