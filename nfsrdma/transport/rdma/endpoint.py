"""RPC-over-RDMA version 1 endpoints: the connection (requester and responder in one, over a
verbs provider), connecting as a client, and accepting as a server.

The pieces live by job: ``connection_base`` (buffers, credits, set-up steps, receive path,
teardown), ``requester`` and ``responder`` (the two directions), ``calls`` (per-call state),
``marshal``/``header``/``privdata``/``credits`` (the sans-IO protocol decisions).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from nfsrdma._mypyc import mypyc_attr
from nfsrdma.transport.rdma import rtrext
from nfsrdma.transport.rdma.calls import CallContext
from nfsrdma.transport.rdma.calls import OutCall as _OutCall  # tests/unit/rdma use this name
from nfsrdma.transport.rdma.connection_base import RdmaOptions
from nfsrdma.transport.rdma.provider import ConnectRequest, Device, Listener
from nfsrdma.transport.rdma.responder import Responder

__all__ = [
    "CallContext",
    "RdmaConnection",
    "RdmaListener",
    "RdmaOptions",
    "_OutCall",
    "connect_rdma",
]

log = logging.getLogger(__name__)


@mypyc_attr(allow_interpreted_subclasses=True)
class RdmaConnection(Responder):
    """One RC connection carrying RPC messages both ways (RFC 8167): ``Responder`` derives
    from ``Requester``, which derives from ``RdmaConnectionBase``."""


# -- connection set-up ------------------------------------------------------------------


async def connect_rdma(
    device: Device,
    host: str,
    port: int,
    options: RdmaOptions | None = None,
    *,
    connection: type[RdmaConnection] = RdmaConnection,
) -> RdmaConnection:
    """Connect as a requester (client): private data out, the server's back (PD-1).
    ``connection``: the class of the connection made (tests: a subclass that breaks a rule)."""
    opts = options or RdmaOptions()
    conn = connection(device, opts, server=False, peer=f"{host}:{port}")
    qp = await device.resolve(host, port, conn.qp_config(), conn.on_event)
    conn.attach(qp)
    caps = device.caps
    peer = await qp.establish(
        conn.private_data(accept=False),
        responder_resources=min(caps.max_qp_rd_atom, 16),  # the server reads our chunks
        initiator_depth=0,  # we never read (TR-26)
    )
    conn.negotiated(peer)
    conn.established()
    return conn


class RdmaListener:
    """Accepts RPC-over-RDMA connections (port 20049 by default, UL-9)."""

    def __init__(
        self,
        device: Device,
        port: int,
        on_connection: Callable[[RdmaConnection], None],
        options: RdmaOptions | None = None,
        screen: Callable[[str], bool] | None = None,
        *,
        connection: type[RdmaConnection] = RdmaConnection,
    ) -> None:
        """``screen(peer)`` is asked before a request is accepted; False rejects it at the
        connection manager, so the peer's connect fails at once and no resources are made.
        ``connection`` is the class of the connections made (tests: a subclass that breaks a
        rule; read at each request)."""
        self.device = device
        self.connection = connection
        self.requested_port = port
        self.on_connection = on_connection
        self.options = options or RdmaOptions()
        self.screen = screen
        self.listener: Listener | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.listener = await self.device.listen(self.requested_port)
        self._task = asyncio.create_task(self._accept_loop())

    @property
    def port(self) -> int:
        return self.listener.port if self.listener is not None else self.requested_port

    async def _accept_loop(self) -> None:
        assert self.listener is not None
        while True:
            req = await self.listener.get_request()
            task = asyncio.create_task(self._accept(req))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _accept(self, req: ConnectRequest) -> None:
        if self.screen is not None and not self.screen(req.peer):
            req.reject()
            return
        conn = self.connection(self.device, self._options_for(req), server=True, peer=req.peer)
        try:
            qp = req.create_connection(conn.qp_config(), conn.on_event)
            conn.attach(qp)
            conn.negotiated(req.private_data)
            # Receivers are in place before the first call can arrive (PD-24).
            self.on_connection(conn)
            caps = self.device.caps
            await qp.establish(
                conn.private_data(accept=True),
                responder_resources=0,
                # RDMA Reads we may have outstanding: no more than the peer allows (TR-26).
                initiator_depth=min(req.initiator_depth, caps.max_qp_init_rd_atom, 16),
            )
            conn.established()
        except Exception as e:
            log.warning("rdma: accepting a connection failed: %s", e)
            conn._teardown(e)

    def _options_for(self, req: ConnectRequest) -> RdmaOptions:
        """Placement-capable (larger) receives only for a peer that offered rtrext: a Linux
        client never sends TBSN, so its connection keeps plain receive buffers."""
        opts = self.options
        if opts.rtrext_tbsn and rtrext.decode(req.private_data) is None:
            return dataclasses.replace(opts, rtrext_tbsn=False)
        return opts

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in list(self._pending):
            t.cancel()
        if self.listener is not None:
            self.listener.close()
