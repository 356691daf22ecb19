"""One of our servers and one of our clients over RDMA in this process, for the rtrext benches.

``Rig`` starts our server on an export with the given RDMA options, opens the client's device
after the server's (the order matters on rxe: see ``bench/rtrext.py``'s doc), connects a
``ClientSession`` acting as the server's own identity, and counts the explicit RDMA work both
sides did: RDMA Reads and Writes posted by the server, memory registrations made by the client.

On the in-process provider (``inproc``) each rig has its own fabric; on the test bed (``rxe``)
both sides use rxe0 at the test-bed address. Several rigs may run at once on different ports.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions, connect_rdma
from nfsrdma.transport.rdma.provider import Device
from nfsrdma.xdr.gen import nfs4


class Rig:
    def __init__(
        self,
        export: Path,
        provider: str,
        port: int,
        server_opts: RdmaOptions,
        client_opts: RdmaOptions | None = None,
    ) -> None:
        self.port = port
        self.client_opts = client_opts or server_opts
        self.served: list[RdmaConnection] = []  # the server's side of each connection
        self.clients: list[RdmaConnection] = []  # the client's
        self._inproc: Device | None = None
        if provider == "inproc":
            from nfsrdma.transport.rdma.inproc import InprocFabric

            fabric = InprocFabric()
            self.addr = "10.9.0.1"
            self._inproc = fabric.device("10.9.0.2")
            device: Device | None = fabric.device(self.addr)
            bind = "127.0.0.1"
        else:
            from nfsrdma.testbed.helpers import testbed_addr

            self.addr = bind = testbed_addr()
            device = None  # the server opens rxe0 itself, in start()
        self.server = NFSServer(
            str(export), bind=bind, tcp_port=0, rdma_port=port, rdma_device=device,
            root_squash=False, rdma_options=server_opts,
        )  # fmt: skip
        self._device: Device | None = None
        self._session: ClientSession | None = None

    @property
    def session(self) -> ClientSession:
        assert self._session is not None, "the rig is not started"
        return self._session

    async def __aenter__(self) -> Rig:
        await self.server.start()
        assert self.server.rdma is not None
        accept = self.server.rdma.on_connection

        def record(conn: RdmaConnection) -> None:
            self.served.append(conn)
            accept(conn)

        self.server.rdma.on_connection = record
        if self._inproc is not None:
            self._device = self._inproc
        else:
            from nfsrdma.transport.rdma.pyverbs_provider import open_device

            self._device = await open_device(self.addr)
        device = self._device

        async def connect() -> Connection:
            conn = await connect_rdma(device, self.addr, self.port, self.client_opts)
            self.clients.append(conn)
            return conn

        # The client calls as the server process itself (same uid, gid and groups), so the
        # server's VFS never switches the event-loop thread's fs identity.
        me = SessionOptions(
            backchannel=False, uid=os.geteuid(), gid=os.getegid(), gids=tuple(os.getgroups())
        )
        self._session = ClientSession(connect, me)
        await self._session.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._session is not None:
                await self._session.close()
        finally:
            await self.server.close()
            if self._device is not None:
                self._device.close()

    def server_rdma(self) -> int:
        """RDMA Reads and Writes the server posted so far."""
        return sum(c.stats["rdma_reads"] + c.stats["rdma_writes"] for c in self.served)

    def explicit(self) -> int:
        """``server_rdma()`` plus the client's memory registrations so far."""
        return self.server_rdma() + sum(c.stats["registrations"] for c in self.clients)

    async def lookup(self, *names: bytes) -> bytes:
        """The handle of a path below the export's root."""
        ops = [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)]
        ops += [nfs4.nfs_argop4(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(n)) for n in names]
        ops.append(nfs4.nfs_argop4(nfs4.OP_GETFH))
        res = await self.session.compound(ops)
        fh: bytes = res.resarray[-1].value.value.object
        return fh
