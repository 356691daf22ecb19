"""Client rules over RPC-over-RDMA: the rules see the RDMA connection's source address (the
connection manager's peer address), as over TCP. Our client and our server in this process on
the in-process verbs provider, two client devices with different addresses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import parse_url
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import connect_rdma
from nfsrdma.transport.rdma.inproc import InprocDevice, InprocFabric

SERVER, ALLOWED, OTHER, PORT = "10.9.1.1", "10.9.1.2", "10.9.1.3", 20049


@asynccontextmanager
async def mounted(device: InprocDevice, path: Path) -> AsyncIterator[NfsClient]:
    async def connect() -> Connection:
        return await connect_rdma(device, SERVER, PORT)

    session = ClientSession(connect, SessionOptions(uid=0, gid=0))
    try:
        await session.start()
        client = NfsClient(session, parse_url(f"rdma://{SERVER}{path}"))
        await client.mount()
        try:
            yield client
        finally:
            await client.aclose()
    finally:
        await session.close()


async def test_rules_apply_to_rdma_peers_by_address(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    exports = tmp_path / "exports"
    exports.write_text(f"{data} {ALLOWED}(rw,insecure,no_root_squash)\n")
    fabric = InprocFabric()
    sdev = fabric.device(SERVER)
    server = NFSServer(
        "/", bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
        state_dir=str(tmp_path / "state"), exports_file=str(exports),
    )  # fmt: skip
    await server.start()
    try:
        async with mounted(fabric.device(ALLOWED), data) as fs:
            await fs.mkdir("over-rdma")
        assert (data / "over-rdma").is_dir()
        with pytest.raises(PermissionError):
            async with mounted(fabric.device(OTHER), data):
                pass
    finally:
        if server.state is not None:
            server.state.vfs.release_identity()
        await server.close()
