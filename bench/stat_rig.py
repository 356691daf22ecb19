"""Our server and our client in one process on the in-process verbs provider, an export of
``FILES`` one-byte files mounted over RPC-over-RDMA, the handles cached: the setting of the
host's plain ``stat`` benches (``client_reply_size.py``, ``rdma_call_batch.py``).

nfsrdma is imported when the rig is entered, not with this module, so a bench may measure
another checkout by putting it first on ``sys.path`` before that."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

SERVER, CLIENT, PORT = "10.9.3.1", "10.9.3.2", 20049
FILES = 300


@contextlib.asynccontextmanager
async def stat_rig(
    rtrext: bool, prepare: Callable[[Any], None] | None = None
) -> AsyncIterator[tuple[Any, list[Any]]]:
    """(the mounted ``NfsClient``, the client's RDMA connections); ``prepare(session)`` runs
    before the session starts."""
    from nfsrdma.client.fs import NfsClient, gather_limited
    from nfsrdma.client.url import parse_url
    from nfsrdma.server import NFSServer
    from nfsrdma.session.client import ClientSession
    from nfsrdma.session.client_setup import SessionOptions
    from nfsrdma.transport.base import Connection
    from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions, connect_rdma
    from nfsrdma.transport.rdma.inproc import InprocFabric

    with tempfile.TemporaryDirectory(prefix="bench-stat-") as top:
        export = Path(top) / "export"
        export.mkdir()
        for i in range(FILES):
            (export / f"f{i:04d}").write_bytes(b"x")
        fabric = InprocFabric()
        sdev, cdev = fabric.device(SERVER), fabric.device(CLIENT)
        server = NFSServer(
            str(export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
            root_squash=False, state_dir=f"{top}/state",
        )  # fmt: skip
        await server.start()
        conns: list[RdmaConnection] = []

        async def connect() -> Connection:
            conn = await connect_rdma(cdev, SERVER, PORT, RdmaOptions(rtrext=rtrext))
            conns.append(conn)
            return conn

        session = ClientSession(connect, SessionOptions(uid=0, gid=0))
        if prepare is not None:
            prepare(session)
        try:
            await session.start()
            fs = NfsClient(session, parse_url(f"rdma://{SERVER}/"))
            await fs.mount()
            names = [f"f{i:04d}" for i in range(FILES)]
            await gather_limited([fs.stat(x) for x in names], 32)  # handles cached
            yield fs, conns
            await fs.aclose()
        finally:
            await session.close()
            await server.close()
