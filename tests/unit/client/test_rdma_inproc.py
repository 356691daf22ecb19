"""The client over RPC-over-RDMA against our own server, both in this process on the in-process
verbs provider: the API end to end, READ data placed straight into the caller's buffer by the
server's RDMA Writes (no copy in ``readinto``; RFC 8267 6.4.1, SS-29), WRITE data pulled by the
server's RDMA Reads, many calls in flight, and a reconnect that resends on the same slot."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import parse_url
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import RdmaConnection, connect_rdma
from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.xdr.gen import nfs4

SERVER, CLIENT, PORT = "10.9.0.1", "10.9.0.2", 20049


@asynccontextmanager
async def rdma_client(
    export: Path, **opts: object
) -> AsyncIterator[tuple[NfsClient, list[RdmaConnection]]]:
    from nfsrdma.server import NFSServer

    fabric = InprocFabric()
    sdev, cdev = fabric.device(SERVER), fabric.device(CLIENT)
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
        root_squash=False, lease_time=10,
    )  # fmt: skip
    await server.start()
    conns: list[RdmaConnection] = []

    async def connect() -> Connection:
        conn = await connect_rdma(cdev, SERVER, PORT)
        conns.append(conn)
        return conn

    opts.setdefault("uid", 0)
    opts.setdefault("gid", 0)
    session = ClientSession(connect, SessionOptions(**opts))  # type: ignore[arg-type]
    try:
        await session.start()
        client = NfsClient(session, parse_url(f"rdma://{SERVER}/"))
        await client.mount()
        try:
            yield client, conns
        finally:
            await client.aclose()
    finally:
        await session.close()
        await server.close()


async def test_io_over_rdma_places_read_data_in_the_callers_buffer(tmp_path: Path) -> None:
    size = 8 << 20
    data = os.urandom(size)
    async with rdma_client(tmp_path, rsize=256 << 10, wsize=256 << 10, slots=32) as (fs, conns):
        await fs.mkdir("d")
        async with fs.open("d/f", "wb") as f:
            await f.write(data)  # WRITE data as Read chunks
        assert (tmp_path / "d" / "f").read_bytes() == data
        buf = bytearray(size)
        async with fs.open("d/f", "rb") as f:
            assert await f.readinto(buf) == size
        assert hashlib.sha256(buf).digest() == hashlib.sha256(data).digest()
        assert fs.io_stats.placed_reads == size // (256 << 10)
        assert fs.io_stats.copied_reads == 0
        assert fs.session.slots.stats.max_in_flight >= 8
        # Metadata and a symlink (READLINK data is DDP-eligible too) over RDMA.
        await fs.symlink("d/f", "ln")
        assert await fs.readlink("ln") == "d/f"
        assert [e.name async for e in fs.scandir("d")] == ["f"]
        await fs.rename("d/f", "d/g")
        assert (await fs.stat("d/g")).st_size == size
        assert all(c.kind == "rdma" for c in conns)


async def test_rdma_connection_lost_mid_write_resends_on_the_same_slot(tmp_path: Path) -> None:
    """SS-13 over RDMA: fresh connection, BIND_CONN_TO_SESSION, the same slot and seqid with
    fresh chunks (TR-24); the content comes out right."""
    data = os.urandom(4 << 20)
    async with rdma_client(tmp_path, rsize=256 << 10, wsize=256 << 10) as (fs, conns):
        f = await fs.open("w", "wb")
        await f.write(data[: 1 << 20])
        conns[0].close()  # the connection goes away under the session
        await f.write(data[1 << 20 :])
        await f.close()
        assert fs.session.stats.connects == 2 and fs.session.stats.binds == 1
        assert (tmp_path / "w").read_bytes() == data
        assert fs.session.stats.sessions == 1
        res = await fs.session.compound([nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)])
        assert res.status == nfs4.NFS4_OK


async def test_ul11_ul19_two_writes_by_read_chunks_in_one_compound(tmp_path: Path) -> None:
    """UL-11: Read chunks are told apart by position, so a COMPOUND with two WRITEs whose data
    both go by Read chunk (our requester allowed beyond the baseline, UL-19) writes both files
    right. Anonymous stateids keep the COMPOUND to PUTFH/WRITE pairs."""
    from nfsrdma.transport.rdma.endpoint import RdmaOptions

    export = tmp_path / "export"
    export.mkdir()
    fabric = InprocFabric()
    sdev, cdev = fabric.device(SERVER), fabric.device(CLIENT)
    from nfsrdma.server import NFSServer

    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
        root_squash=False,
    )  # fmt: skip
    await server.start()
    conns: list[RdmaConnection] = []

    async def connect() -> Connection:
        conn = await connect_rdma(cdev, SERVER, PORT, RdmaOptions(max_read_chunks=2))
        conns.append(conn)
        return conn

    session = ClientSession(connect, SessionOptions(uid=0, gid=0, backchannel=False))
    await session.start()
    try:
        for name in ("a", "b"):
            (export / name).write_bytes(b"")
        fhs = []
        for name in ("a", "b"):
            res = await session.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTROOTFH),
                    nfs4.nfs_argop4(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name.encode())),
                    nfs4.nfs_argop4(nfs4.OP_GETFH),
                ]
            )
            fhs.append(res.resarray[2].value.value.object)
        one, two = os.urandom(30_000), os.urandom(50_001)
        anon = nfs4.stateid4(0, bytes(12))
        before = conns[-1].stats["read_chunks"]
        res = await session.compound(
            [
                nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fhs[0])),
                nfs4.nfs_argop4(nfs4.OP_WRITE, nfs4.WRITE4args(anon, 0, nfs4.FILE_SYNC4, one)),
                nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fhs[1])),
                nfs4.nfs_argop4(nfs4.OP_WRITE, nfs4.WRITE4args(anon, 0, nfs4.FILE_SYNC4, two)),
            ]
        )
        assert res.status == nfs4.NFS4_OK
        assert conns[-1].stats["read_chunks"] - before == 2
        assert (export / "a").read_bytes() == one and (export / "b").read_bytes() == two
    finally:
        await session.close()
        await server.close()
