"""RPC-over-RDMA against the kernel's peers on rxe (issue 5): the private data both kernel
peers send, our requester doing DDP READ/WRITE with knfsd, and bad input against our server."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

from nfsrdma.nfs4.attr_decode import decode_values
from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.testbed.helpers import Knfsd, MountFactory
from nfsrdma.testbed.helpers import testbed_addr as guest_addr
from nfsrdma.testbed.ours import OURS_RDMA_PORT, OurServer, our_server
from nfsrdma.transport.base import ReplyExpectation, TransportCallError
from nfsrdma.transport.rdma import privdata
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions, connect_rdma
from nfsrdma.transport.rdma.provider import Access
from nfsrdma.transport.rdma.pyverbs_provider import PyverbsDevice, open_device
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer
from tests.unit.rdma.faults import BAD_HEADERS, expect_rdma_error
from tests.unit.rdma.helpers import Patchable

pytestmark = pytest.mark.testbed
MiB = 1 << 20


@pytest.fixture(scope="module")
def ours(knfsd: Knfsd) -> Iterator[OurServer]:
    with our_server("rdma-peers") as srv:
        yield srv


def closed(conn: RdmaConnection) -> asyncio.Future[BaseException | None]:
    """Resolves (with the cause) once ``conn`` has finished closing, for whatever reason."""
    fut: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    conn.on_closed(lambda c, exc: fut.done() or fut.set_result(exc))
    return fut


@asynccontextmanager
async def rdma_to(
    port: int,
    options: RdmaOptions | None = None,
    connection: type[RdmaConnection] = RdmaConnection,
) -> AsyncIterator[tuple[PyverbsDevice, RdmaConnection, RpcConnection]]:
    device = await open_device(guest_addr())
    conn = await connect_rdma(device, guest_addr(), port, options, connection=connection)
    rpc = RpcConnection(conn)
    try:
        yield device, conn, rpc
    finally:
        done = closed(conn)
        conn.close()
        await asyncio.wait_for(done, 30)  # its resources are released before the device goes
        device.close()


def test_pd2_pd7_linux_client_private_data_seen_by_our_server(
    ours: OurServer, nfs_mount: MountFactory
) -> None:
    """PD-2/PD-7/PD-12: the Linux client sends the v1 block at offset 0 (R=1, 4096/4096 on
    6.1); our server decodes it and both thresholds come out 4096."""
    with nfs_mount(ours.server("rdma")) as m:
        assert m.stats().xprt == "rdma"
        (m.mountpoint / "pd").write_bytes(b"x")
    log = ours.proc.log.read_text()
    found = re.findall(r"inline c->s (\d+) s->c (\d+), peer R=(\w+)", log)
    assert found, "no negotiated thresholds in the server log"
    assert found[-1] == ("4096", "4096", "True")
    # RT-1, RT-X1: the Linux client sends no rtrext block, so the extension stays off.
    rtr = re.findall(r"peer R=\w+, rtrext RtrState\(enabled=(\w+)", log)
    assert rtr and rtr[-1] == "False"


async def test_pd7_ul9_our_requester_does_ddp_read_write_with_knfsd(knfsd: Knfsd) -> None:
    """Our requester against knfsd on 20049: knfsd's accept carries a v1 block (R=0,
    4096/4096); EXCHANGE_ID, CREATE_SESSION, SEQUENCE, then 4 MiB written through Read
    chunks and read back through Write chunks into our buffer, checksums compared with the
    file knfsd stored (TR-7, TR-11, UL-13, UL-14)."""
    device = await open_device(guest_addr())
    conns: list[RdmaConnection] = []

    async def connect() -> RdmaConnection:
        conn = await connect_rdma(device, guest_addr(), knfsd.rdma_port)
        conns.append(conn)
        return conn

    session = ClientSession(connect, SessionOptions(backchannel=False))
    await session.start()
    try:
        conn = conns[-1]
        assert conn.peer_pd == privdata.PrivateData(4096, 4096, remote_invalidate=False)
        assert not conn.rtr.enabled  # RT-1: knfsd sends no rtrext block
        t = conn.thresholds
        assert (t.client_to_server, t.server_to_client) == (4096, 4096)
        data = os.urandom(4 * MiB)
        how = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(
                nfs4.UNCHECKED4, nfs4.fattr4([0, 1 << (nfs4.FATTR4_MODE - 32)], b"\0\0\x01\xa4")
            ),
        )
        res = await session.compound(
            [
                nfs4.nfs_argop4(nfs4.OP_PUTROOTFH),
                nfs4.nfs_argop4(
                    nfs4.OP_OPEN,
                    nfs4.OPEN4args(
                        0,
                        nfs4.OPEN4_SHARE_ACCESS_BOTH,
                        nfs4.OPEN4_SHARE_DENY_NONE,
                        nfs4.state_owner4(0, b"ddp-test"),
                        how,
                        nfs4.open_claim4(nfs4.CLAIM_NULL, b"ddp-4mib"),
                    ),
                ),
                nfs4.nfs_argop4(nfs4.OP_GETFH),
            ]
        )
        assert res.status == nfs4.NFS4_OK, res
        sid = res.resarray[1].value.value.stateid
        fh = res.resarray[2].value.value.object
        # The server's I/O limits (knfsd scales them with the guest's memory).
        res = await session.compound(
            [
                nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                nfs4.nfs_argop4(
                    nfs4.OP_GETATTR,
                    nfs4.GETATTR4args(bitmap_of([nfs4.FATTR4_MAXREAD, nfs4.FATTR4_MAXWRITE])),
                ),
            ]
        )
        limits = decode_values(res.resarray[1].value.value.obj_attributes)
        io = min(MiB, limits[nfs4.FATTR4_MAXREAD], limits[nfs4.FATTR4_MAXWRITE])
        assert io >= 64 * 1024
        before = conn.stats["read_chunks"]
        for off in range(0, len(data), io):
            res = await session.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    nfs4.nfs_argop4(
                        nfs4.OP_WRITE,
                        nfs4.WRITE4args(sid, off, nfs4.FILE_SYNC4, data[off : off + io]),
                    ),
                ]
            )
            assert res.status == nfs4.NFS4_OK and res.resarray[1].value.value.count == io
        assert conn.stats["read_chunks"] - before == len(data) // io  # WRITE data by Read chunk
        on_server = knfsd.export / "ddp-4mib"
        assert hashlib.sha256(on_server.read_bytes()).digest() == hashlib.sha256(data).digest()
        back = bytearray(4 * MiB)
        view = memoryview(back)
        before = conn.stats["write_chunks"]
        for off in range(0, len(data), io):
            sink = view[off : off + io]
            res = await session.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    nfs4.nfs_argop4(nfs4.OP_READ, nfs4.READ4args(sid, off, io)),
                ],
                sinks=[sink],
                reply_size=512,
            )
            ok = res.resarray[1].value.value
            assert len(ok.data) == io
            assert ok.data.obj is back  # placed by knfsd's RDMA Write into our buffer (UL-14)
        assert bytes(back) == data
        assert conn.stats["write_chunks"] - before == len(data) // io  # READ data by Write chunk
    finally:
        await session.close()
        ends = [closed(c) for c in conns]
        for c in conns:
            c.close()
        await asyncio.wait_for(asyncio.gather(*ends), 30)
        device.close()


@pytest.mark.parametrize(("message", "err", "why"), BAD_HEADERS)
async def test_bad_headers_against_our_server_get_rdma_error(
    ours: OurServer, message: bytes, err: str, why: str
) -> None:
    """TR-3/TR-4/TR-17/SEC-8 on rxe: each bad header draws RDMA_ERROR with its XID and the
    connection keeps serving."""
    async with rdma_to(OURS_RDMA_PORT) as (_, conn, rpc):
        assert err in await expect_rdma_error(rpc, conn, message), why
        await rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=30)


async def test_tr21_reply_chunk_too_small_is_err_chunk(ours: OurServer) -> None:
    """A reply larger than the inline threshold, with a Reply chunk too small for it: the
    server answers ERR_CHUNK (TR-21) and the connection stays up; a big enough chunk works.
    (COMPOUND echoes its tag, so a 5000-octet tag makes a 5 KiB reply.)"""
    tag = b"t" * 5000

    def args(w: Writer) -> None:
        nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(tag, 1, []))

    async with rdma_to(OURS_RDMA_PORT) as (_, _conn, rpc):
        with pytest.raises(TransportCallError, match="ERR_CHUNK"):
            await rpc.call(
                nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, args, expect=ReplyExpectation([], 4500),
                timeout=30,
            )  # fmt: skip
        res = await rpc.call(
            nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, args, expect=ReplyExpectation([], 8192), timeout=30
        )
        assert res.reader.buf[res.offset + 4 : res.offset + 8] == (5000).to_bytes(4, "big")


async def test_sec9_inline_over_the_receive_size_breaks_only_that_connection(
    ours: OurServer,
) -> None:
    """A Send larger than the server's posted receives fails at the server's RNIC and ends
    that connection (PD-8, SEC-9); another connection keeps working."""
    async with rdma_to(OURS_RDMA_PORT) as (device, _good, good_rpc):
        async with rdma_to(OURS_RDMA_PORT) as (_, bad, _rpc):
            region = device.pd.register(8192, Access.LOCAL_WRITE)
            assert bad.qp is not None
            broken = closed(bad)
            # A work request the connection knows, with no buffer of its own (the compiled
            # build checks the context's type): its completion in error ends the connection.
            bad.qp.post_send(bad._wr_id("oversized", None), [region.sge(0, 8192)])
            cause = await asyncio.wait_for(broken, 30)
            assert bad.closed and isinstance(cause, ConnectionError), cause
            region.deregister()
        await good_rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=30)


async def test_tr14_a_client_flooding_past_its_credits_is_disconnected_others_are_not(
    ours: OurServer,
) -> None:
    """TR-14 / SS-24: a requester must never have more calls outstanding than its grant; our
    responder ends the connection of one that does (RFC 8166 section 3.3.1 allows it) and keeps
    serving everyone else (TR-15). Exactly: that connection is closed, the server logged the
    credit overrun as the reason, the calls on it failed with the lost connection (any
    answered got its right reply), and another connection is served as before.

    Deterministic, with no race between the flood and the server's answers: the flooding
    client first stops posting receives and lets the server's replies use up the ones it had,
    so the next reply the server sends it (to a NULL call) meets no receive and waits for one
    (receiver not ready, retried for ever: rnr_retry 7). A reliable connection executes a queue
    pair's work requests in order, so every RDMA Read the server posts after that Send waits
    behind it. The flood is Long calls (a 6 KiB tag goes by a position-zero Read chunk): the
    server reposts each receive at once but can answer none of them, since it cannot pull them
    (at most its ORD of Reads, 16, posted before that Send, could complete). The flood, eight
    times the grant, piles up at the server past its credits (grant plus backchannel)
    however fast or slow it runs. The same test on the host: tests/unit/rdma/test_rpc_rdma.py
    ::test_tr14_long_calls_behind_a_reply_the_requester_cannot_receive_end_it."""
    tag = b"f" * 6000

    def args(w: Writer) -> None:
        nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(tag, 1, []))

    def empty(w: Writer) -> None:
        nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(b"", 1, []))

    log_before = len(ours.proc.log.read_text())
    async with rdma_to(OURS_RDMA_PORT) as (_, _good, good_rpc):
        # Plain v1 (rtrext off): the flood must be Long calls by position-zero Read chunk; with
        # rtrext they would go as continued Sends, which need no RDMA Read.
        # Patchable: its ``_post_recv`` is replaced below, in the compiled build too.
        flooding = rdma_to(OURS_RDMA_PORT, RdmaOptions(rtrext=False), Patchable)
        async with flooding as (_, conn, rpc):
            await rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=30)
            n = 8 * conn.credits.granted
            # Every receive is posted now; from here on, none is posted again, and one reply
            # per receive uses them all up.
            conn._post_recv = lambda buf: buf.release()  # type: ignore[method-assign]
            for _ in range(conn.recv_pool.count):
                await rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=30)
            conn.credits.granted = conn.credits.local_max = 1000  # pretend we were granted more
            ended = closed(conn)
            stalled = asyncio.create_task(rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=120))
            calls = [
                asyncio.create_task(
                    rpc.call(
                        nfs4.NFS4_PROGRAM,
                        nfs4.NFS_V4,
                        1,
                        args,
                        expect=ReplyExpectation([], 16384),
                        timeout=120,
                    )
                )
                for _ in range(n)
            ]
            await asyncio.wait_for(ended, 60)  # the server closed it: nothing else could
            assert conn.closed
            with pytest.raises(ConnectionError):
                await stalled  # its reply never found a receive
            done = await asyncio.gather(*calls, return_exceptions=True)
            failed = [d for d in done if isinstance(d, BaseException)]
            answered = [d for d in done if not isinstance(d, BaseException)]
            assert len(failed) > n // 2 and all(isinstance(e, ConnectionError) for e in failed)
            for res in answered:  # none is expected; any must be right: NFS4_OK, the tag
                assert res.reader.buf[res.offset : res.offset + 8] == bytes(4) + (6000).to_bytes(
                    4, "big"
                )
        res = await good_rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, empty, timeout=30)
        assert res.reader.buf[res.offset : res.offset + 4] == bytes(4)  # NFS4_OK
    assert "calls beyond the" in ours.proc.log.read_text()[log_before:]


async def test_rtx3_our_client_and_server_continue_long_messages_on_rxe(ours: OurServer) -> None:
    """RT-X1/RT-X3 on rxe: our client and our server negotiate rtrext; a COMPOUND with a
    10,000-octet tag and 20 GETATTRs (a call and a reply of about 10 KiB) crosses as several
    Sends each way, with no Read or Reply chunk; the results equal those of the same COMPOUND
    with the extension off, which needs both chunks."""
    device = await open_device(guest_addr())
    conns: list[RdmaConnection] = []

    async def results(rtrext: bool) -> tuple[bytes, RdmaConnection]:
        async def connect() -> RdmaConnection:
            opts = RdmaOptions(rtrext=rtrext)
            conn = await connect_rdma(device, guest_addr(), OURS_RDMA_PORT, opts)
            conns.append(conn)
            return conn

        session = ClientSession(connect, SessionOptions(backchannel=False))
        await session.start()
        try:
            conn = conns[-1]
            assert conn.rtr.enabled is rtrext
            attrs = bitmap_of([nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE, nfs4.FATTR4_OWNER])
            ops = [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)]
            ops += [nfs4.nfs_argop4(nfs4.OP_GETATTR, nfs4.GETATTR4args(attrs))] * 20
            res = await session.compound(ops, reply_size=16 * 1024, tag=b"t" * 10_000)
            assert res.status == nfs4.NFS4_OK and len(res.resarray) == 21
            w = Writer()
            nfs4.enc_COMPOUND4res(w, res)
            return bytes(w), conn
        finally:
            await session.close()

    try:
        on, conn_on = await results(True)
        off, conn_off = await results(False)
        assert on == off
        assert conn_on.stats["rtr_calls"] >= 1 and conn_on.stats["rtr_sends"] >= 2
        assert conn_on.stats["read_chunks"] == conn_on.stats["reply_chunks"] == 0
        assert conn_off.stats["rtr_sends"] == 0 and conn_off.stats["read_chunks"] >= 1
    finally:
        ends = [closed(c) for c in conns]
        for c in conns:
            c.close()
        await asyncio.wait_for(asyncio.gather(*ends), 30)
        device.close()
