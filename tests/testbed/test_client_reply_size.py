"""Our client's reply bound against knfsd on rxe (UL-3, UL-7, TR-10): a plain ``stat`` offers no
Reply chunk and registers no memory, a large READDIR and a long symbolic link still come through
Reply chunks, and a reply larger than the bound provided for (knfsd drops the connection rather
than answer ERR_CHUNK) is fetched again on the same slot and seqid with a full Reply chunk."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from nfsrdma.client import ops
from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import parse_url
from nfsrdma.session import client as session_client
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.testbed.helpers import Knfsd
from nfsrdma.testbed.helpers import testbed_addr as guest_addr
from nfsrdma.transport.rdma.endpoint import RdmaConnection, connect_rdma
from nfsrdma.transport.rdma.pyverbs_provider import open_device
from nfsrdma.xdr.gen import nfs4

pytestmark = pytest.mark.testbed


@asynccontextmanager
async def our_client(knfsd: Knfsd) -> AsyncIterator[tuple[NfsClient, list[RdmaConnection]]]:
    device = await open_device(guest_addr())
    conns: list[RdmaConnection] = []

    async def connect() -> RdmaConnection:
        conn = await connect_rdma(device, guest_addr(), knfsd.rdma_port)
        conns.append(conn)
        return conn

    session = ClientSession(connect, SessionOptions(backchannel=False))
    try:
        await session.start()
        fs = NfsClient(session, parse_url(f"rdma://{guest_addr()}:{knfsd.rdma_port}/"))
        await fs.mount()
        try:
            yield fs, conns
        finally:
            await fs.aclose()
    finally:
        await session.close()
        waits = []
        for conn in conns:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            conn.on_closed(lambda _c, _e, f=fut: f.done() or f.set_result(None))
            conn.close()
            waits.append(fut)
        await asyncio.wait_for(asyncio.gather(*waits), 30)
        device.close()


def total(conns: list[RdmaConnection], key: str) -> int:
    return sum(c.stats[key] for c in conns)


async def test_ul3_ul7_reply_chunks_only_where_needed_against_knfsd(
    knfsd: Knfsd, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = knfsd.export / "replysize"
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir()
    names = sorted(f"{i:03d}-" + "n" * 100 for i in range(150))
    for n in names:
        (top / n).write_bytes(b"x")
    target = "t" * 100 + "/" + "u" * 3900
    os.symlink(target, top / "ln")
    try:
        async with our_client(knfsd) as (fs, conns):
            await fs.stat(f"replysize/{names[0]}")
            chunks, regs = total(conns, "reply_chunks"), total(conns, "registrations")
            for n in names[:20]:
                assert (await fs.stat(f"replysize/{n}")).st_size == 1
            # TR-10/UL-3: GETATTR replies fit inline; nothing offered, nothing registered.
            assert total(conns, "reply_chunks") == chunks
            assert total(conns, "registrations") == regs
            # Large replies: a READDIR of ~17 KiB (one call), a 4000-octet link.
            assert sorted(await fs.listdir("replysize")) == sorted([*names, "ln"])
            assert await fs.readlink("replysize/ln") == target
            assert total(conns, "reply_chunks") >= chunks + 2
            assert fs.session.stats.reply_overruns == 0 and len(conns) == 1

            # UL-7: the bound is short (as with a server's unexpectedly long owner strings).
            res = await fs.session.compound([ops.putfh(fs.base_fh), ops.lookup(b"replysize")])
            assert res.status == nfs4.NFS4_OK
            monkeypatch.setattr(session_client, "compound_reply_bound", lambda *a, **k: 200)
            readdir = ops.readdir(0, bytes(8), 32768, 32768, (nfs4.FATTR4_FILEID,))
            res = await asyncio.wait_for(
                fs.session.compound([ops.putfh(fs.base_fh), ops.lookup(b"replysize"), readdir]),
                120,
            )
            assert res.status == nfs4.NFS4_OK, res.status
            assert len(res.resarray[-1].value.value.reply.entries) >= 100
            stats = fs.session.stats
            # knfsd drops the connection (a reconnect and a resend), or answers ERR_CHUNK.
            assert stats.reply_overruns + stats.resends >= 1, stats
            monkeypatch.undo()
            assert (await fs.stat(f"replysize/{names[1]}")).st_size == 1
    finally:
        shutil.rmtree(top, ignore_errors=True)
