"""Our server for the conformance harness's tests, in this process: as it is, over TCP or the
in-process RDMA provider, and misbehaving on purpose: ``MisbehavingServer`` passes every
COMPOUND reply through a ``Mutation`` (decoded arguments and results in, replacement results
or None out) so one rule can be broken at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from nfsrdma.client.url import parse_url
from nfsrdma.conform.harness import Harness
from nfsrdma.rpc.server import RpcCall
from nfsrdma.server import NFSServer
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, Writer, XdrError

Mutation = Callable[[nfs4.COMPOUND4args, nfs4.COMPOUND4res], nfs4.COMPOUND4res | None]
# Changes how the server's side of one RPC-over-RDMA connection behaves (a transport fault).
RdmaFault = Callable[[Any], None]
RDMA_SERVER, RDMA_CLIENT, RDMA_PORT = "10.9.0.1", "10.9.0.2", 20049


class Replying:
    """The connection whose reply a mutation is looking at (set around each call)."""

    conn: Any = None


class MisbehavingServer(NFSServer):
    def __init__(
        self,
        export: str,
        mutation: Mutation | None = None,
        rdma_fault: RdmaFault | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(export, **kw)
        self.mutation = mutation
        self.rdma_fault = rdma_fault
        self.mutated = 0  # replies changed: a test can tell the mutation was reached

    async def start(self) -> None:
        await super().start()
        if self.rdma_fault is not None and self.rdma is not None:
            # Connections whose methods a fault may replace on the instance, in both builds.
            from tests.unit.rdma.helpers import Patchable

            self.rdma.connection = Patchable

    def _accept(self, conn: Any) -> None:
        if self.rdma_fault is not None and conn.kind == "rdma":
            self.rdma_fault(conn)
        super()._accept(conn)

    def _compound(self, call: RpcCall, w: Writer) -> Awaitable[None] | None:
        head = len(w)
        r = call.reader  # decoded from a copy: decoding moves a reader's chunk position
        try:
            args, _ = nfs4.dec_COMPOUND4args(
                Reader(r.buf, dict(r.chunks) if r.chunks else None, r.ordered), call.offset
            )
        except XdrError:  # e.g. an undefined operation number: the mutation sees no arguments
            args = nfs4.COMPOUND4args(b"", 1, [])
        running = super()._compound(call, w)
        if running is None:
            self._patch(args, w, head, call.conn)
            return None

        async def then() -> None:
            await running
            self._patch(args, w, head, call.conn)

        return then()

    def _patch(self, args: nfs4.COMPOUND4args, w: Writer, head: int, conn: Any) -> None:
        if self.mutation is None:
            return
        stream = b"".join(bytes(p) for p in w.pieces())
        res, _ = nfs4.dec_COMPOUND4res(Reader(stream[head:]), 0)
        Replying.conn = conn
        try:
            new = self.mutation(args, res)
        finally:
            Replying.conn = None
        if new is None:
            return
        self.mutated += 1
        del w[head:]
        w.ddp.clear()
        nfs4.enc_COMPOUND4res(w, new)


@asynccontextmanager
async def served(
    export: Path,
    transport: str = "tcp",
    mutation: Mutation | None = None,
    rdma_fault: RdmaFault | None = None,
    timeout: float = 10.0,
    lease_time: int | None = None,
) -> AsyncIterator[tuple[Harness, NFSServer]]:
    """Our server on ``export`` and a Harness pointed at it (TCP on 127.0.0.1, or RDMA on an
    in-process fabric). A server that does not start raises: the test fails."""
    kw: dict[str, Any] = dict(
        bind="127.0.0.1", tcp_port=0, root_squash=False, rdma_port=None, lease_time=lease_time
    )
    connector = rdma_connector = None
    if transport == "rdma":
        from nfsrdma.transport.rdma.connection_base import RdmaOptions
        from nfsrdma.transport.rdma.endpoint import connect_rdma
        from nfsrdma.transport.rdma.inproc import InprocFabric

        fabric = InprocFabric()
        sdev, cdev = fabric.device(RDMA_SERVER), fabric.device(RDMA_CLIENT)
        kw.update(rdma_port=RDMA_PORT, rdma_device=sdev)

        async def rdma_connector(options: Any) -> Any:
            opts = options or RdmaOptions(rtrext=False)  # RPC-over-RDMA v1, as knfsd speaks it
            return await connect_rdma(cdev, RDMA_SERVER, RDMA_PORT, opts)

        async def connector() -> Any:
            return await rdma_connector(None)

    server = (
        NFSServer(str(export), **kw)
        if mutation is None and rdma_fault is None
        else MisbehavingServer(str(export), mutation, rdma_fault, **kw)
    )
    await server.start()
    try:
        if transport == "rdma":
            url = parse_url(f"rdma://{RDMA_SERVER}:{RDMA_PORT}/")
        else:
            url = parse_url(f"nfs://127.0.0.1:{server.tcp_port}/")
        yield (
            Harness(url, connector=connector, rdma_connector=rdma_connector, timeout=timeout),
            server,
        )
    finally:
        await server.close()
