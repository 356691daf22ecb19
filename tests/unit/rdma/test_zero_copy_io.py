"""READ and WRITE data over RPC-over-RDMA are not copied in Python on the server: READ reads the
file into registered memory the transport lends and the RDMA Write goes out of it; WRITE data
pulled by RDMA Read is written to the file from the registered buffer it landed in. Our client
and server in this process on the in-process verbs provider; the server's own file I/O is
watched (which memory it reads into and writes from) and its transport counters are read."""

from __future__ import annotations

import ctypes
import os
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
from nfsrdma.transport.rdma.endpoint import RdmaConnection, connect_rdma
from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.vfs.openfile import LocalOpenFile

SERVER, CLIENT, PORT = "10.9.1.1", "10.9.1.2", 20049
RSIZE = 256 << 10


def _address(buf: memoryview | bytes | bytearray) -> int | None:
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):
        return None  # read-only memory (bytes): certainly not a registered buffer


@asynccontextmanager
async def rdma_pair(export: Path) -> AsyncIterator[tuple[NfsClient, NFSServer]]:
    fabric = InprocFabric()
    sdev, cdev = fabric.device(SERVER), fabric.device(CLIENT)
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
        root_squash=False, lease_time=10,
    )  # fmt: skip
    await server.start()

    async def connect() -> Connection:
        return await connect_rdma(cdev, SERVER, PORT)

    opts = SessionOptions(uid=0, gid=0, rsize=RSIZE, wsize=RSIZE)  # type: ignore[call-arg]
    session = ClientSession(connect, opts)
    try:
        await session.start()
        client = NfsClient(session, parse_url(f"rdma://{SERVER}/"))
        await client.mount()
        try:
            yield client, server
        finally:
            await client.aclose()
    finally:
        await session.close()
        await server.close()


def _server_rdma(server: NFSServer) -> RdmaConnection:
    conns = [c.conn for c in server.connections if isinstance(c.conn, RdmaConnection)]
    assert len(conns) == 1
    return conns[0]


def _in_data_pool(conn: RdmaConnection, addr: int | None, n: int) -> bool:
    assert conn.data_pool is not None
    region = conn.data_pool.region.buffer
    base = _address(region)
    assert base is not None
    return addr is not None and base <= addr and addr + n <= base + len(region)


async def test_read_and_write_data_stay_in_registered_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = 4 * RSIZE
    data = os.urandom(size)
    reads: list[tuple[int | None, int]] = []
    writes: list[tuple[int | None, int]] = []
    readinto, write = LocalOpenFile.readinto, LocalOpenFile.write

    def watched_readinto(self: LocalOpenFile, offset: int, buf: memoryview | bytearray):  # type: ignore[no-untyped-def]
        reads.append((_address(buf), len(buf)))
        return readinto(self, offset, buf)

    def watched_write(
        self: LocalOpenFile, offset: int, buf: bytes | memoryview | bytearray, stable: bool = False
    ):  # type: ignore[no-untyped-def]
        writes.append((_address(buf), len(buf)))
        return write(self, offset, buf, stable)

    monkeypatch.setattr(LocalOpenFile, "readinto", watched_readinto)
    monkeypatch.setattr(LocalOpenFile, "write", watched_write)
    async with rdma_pair(tmp_path) as (fs, server):
        async with fs.open("f", "wb") as f:
            await f.write(data)  # WRITE data by Read chunks
        assert (tmp_path / "f").read_bytes() == data
        buf = bytearray(size)
        async with fs.open("f", "rb") as f:
            assert await f.readinto(buf) == size  # READ data by Write chunks
        assert buf == data
        conn = _server_rdma(server)
        # Every WRITE went to the file from the buffer its RDMA Reads filled ...
        big_writes = [w for w in writes if w[1] == RSIZE]
        assert len(big_writes) == size // RSIZE
        assert all(_in_data_pool(conn, a, n) for a, n in big_writes)
        # ... every READ read the file into registered memory, and each RDMA Write went out of
        # that memory: not one byte of READ data was copied by the responder.
        big_reads = [r for r in reads if r[1] == RSIZE]
        assert len(big_reads) == size // RSIZE
        assert all(_in_data_pool(conn, a, n) for a, n in big_reads)
        assert conn.stats["rdma_writes_in_place"] == size // RSIZE
        assert conn.stats["rdma_write_bytes_copied"] == 0
        assert conn.data_pool is not None
        # Every lent buffer came back, but those of RDMA Writes posted unsignalled that no
        # completion has covered yet (reused after the next signalled one).
        held = [c for k, c in conn._wr_ctx.values() if k == "write"]
        assert conn.data_pool.in_use == len(held) < conn.options.signal_every


def test_only_transports_that_lend_are_asked() -> None:
    """READ asks a transport for memory only if its class can lend (``Connection.lends``,
    set by whether it overrides ``lend``): RPC-over-RDMA's can, TCP's cannot, and so can any
    class that overrides it."""
    from nfsrdma.transport.tcp import TcpConnection

    class Lending(TcpConnection):
        def lend(self, request: object, size: int) -> memoryview | None:  # type: ignore[override]
            return None

    assert RdmaConnection.lends and Lending.lends
    assert not TcpConnection.lends and not Connection.lends
