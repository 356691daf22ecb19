"""A server's statistics service: the collector, the admin socket and the metrics endpoint,
started and stopped with the server (``NFSServer(admin_socket=..., metrics=...)``)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from nfsrdma.stats.admin import AdminSocket, socket_path
from nfsrdma.stats.collect import Collector
from nfsrdma.vfs.secret import default_state_dir

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from nfsrdma.server import NFSServer
    from nfsrdma.stats.metrics import MetricsEndpoint
    from nfsrdma.transport.base import Connection


class StatsService:
    def __init__(
        self,
        server: NFSServer,
        *,
        admin_socket: bool = False,
        metrics: tuple[str, int] | None = None,
    ) -> None:
        self.server = server
        self.want_admin = admin_socket
        self.want_metrics = metrics
        self.collector: Collector | None = None
        self.admin: AdminSocket | None = None
        self.metrics: MetricsEndpoint | None = None

    @property
    def admin_path(self) -> str:
        return socket_path(self.server.export.state_dir or default_state_dir())

    async def start(self) -> None:
        state = self.server.state
        assert state is not None
        self.collector = Collector(state.stats, time.monotonic())
        if self.want_admin:
            admin = AdminSocket(self.admin_path, {"stats": self._stats_command})
            try:
                if await admin.start():
                    self.admin = admin
            except OSError as e:  # statistics are not worth refusing to serve for
                log.error("no admin socket (nfsrdma stats) at %s: %s", self.admin_path, e)
        if self.want_metrics is not None:
            try:
                from nfsrdma.stats.metrics import MetricsEndpoint  # prometheus-client: an extra
            except ImportError as e:
                raise OSError(f"metrics need prometheus-client (nfsrdma[metrics]): {e}") from None

            host, port = self.want_metrics
            self.metrics = MetricsEndpoint(host, port, lambda: self.snapshot(buckets=True))
            await self.metrics.start()

    async def close(self) -> None:
        if self.admin is not None:
            await self.admin.close()
            self.admin = None
        if self.metrics is not None:
            await self.metrics.close()
            self.metrics = None

    def connection_closed(self, conn: Connection) -> None:
        if self.collector is not None:
            self.collector.connection_closed(conn)

    def snapshot(self, *, buckets: bool = False) -> dict[str, Any]:
        """The server's figures now (``nfsrdma.stats.collect``)."""
        assert self.collector is not None
        state = self.server.state
        return self.collector.snapshot(
            time.monotonic(),
            self.server.connections,
            state.sessions if state is not None else None,
            buckets=buckets,
        )

    def _stats_command(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"stats": self.snapshot(buckets=bool(request.get("buckets")))}


def parse_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` for ``--metrics`` (``[v6]:PORT`` for IPv6; ``:PORT`` for all addresses)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not ADDR:PORT: {text!r}")
    return host.strip("[]"), int(port)
