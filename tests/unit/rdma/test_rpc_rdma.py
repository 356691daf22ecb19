"""ONC RPC over RPC-over-RDMA v1 end to end on the in-process provider: chunks, long
messages, DDP placement, errors, credits and invalidation (RFC 8166, 8267, 8797)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import Dispatcher, RpcCall, null_procedure
from nfsrdma.transport.base import Inbound, ReplyExpectation, TransportCallError
from nfsrdma.transport.rdma import header as H
from nfsrdma.transport.rdma.endpoint import (
    CallContext,
    RdmaConnection,
    RdmaListener,
    RdmaOptions,
    connect_rdma,
)
from nfsrdma.transport.rdma.inproc import InprocFabric, call_read
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, Writer, XdrError, unpack_from
from tests.unit.conditions import Changes
from tests.unit.rdma.faults import BAD_HEADERS, expect_rdma_error
from tests.unit.rdma.helpers import Patchable

PROG, VERS = 400200, 1
P_WRITE, P_READ, P_READLINK, P_BLOB, P_SLOW = 1, 2, 3, 4, 5
STATEID = nfs4.stateid4(0, bytes(12))


def _write(call: RpcCall, w: Writer) -> None:
    args, off = unpack_from(nfs4.dec_WRITE4args, call.reader, call.offset)
    if off != len(call.reader.buf):
        raise XdrError("trailing bytes", off)
    w += U32.pack(len(args.data))
    w += hashlib.sha256(args.data).digest()


def _read(call: RpcCall, w: Writer) -> None:
    (n,) = struct.unpack_from(">I", call.reader.buf, call.offset)
    w.ddp_tag = 0
    data = bytes(i % 251 for i in range(n))
    nfs4.enc_READ4res(w, nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(True, data)))


def _readlink(call: RpcCall, w: Writer) -> None:
    (n,) = struct.unpack_from(">I", call.reader.buf, call.offset)
    nfs4.enc_utf8str_cs(w, b"L" * n)  # not DDP-eligible: a long reply needs the Reply chunk


def _blob(call: RpcCall, w: Writer) -> None:
    blob, _ = nfs4.dec_utf8str_cs(call.reader, call.offset)
    w += hashlib.sha256(blob).digest()


@dataclass
class Rig:
    """A server and a client on the in-process fabric. P_SLOW calls are held at the server
    until ``gate`` is set; ``until(...)`` waits for the server-side counts by event."""

    server: list[RdmaConnection] = field(default_factory=list)
    server_rpc: list[RpcConnection] = field(default_factory=list)
    client: RdmaConnection | None = None
    rpc: RpcConnection | None = None
    in_flight: int = 0
    max_in_flight: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    changes: Changes = field(default_factory=Changes)

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        await self.changes.until(predicate, timeout=5, what=what)


@contextlib.asynccontextmanager
async def rig(
    server_opts: RdmaOptions | None = None,
    client_opts: RdmaOptions | None = None,
    *,
    connection: type[RdmaConnection] = RdmaConnection,
) -> AsyncIterator[Rig]:
    """Our client and server over an in-process fabric; both connections of ``connection``'s
    class (``Patchable`` where a test replaces their methods)."""
    fabric = InprocFabric()
    sdev, cdev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    r = Rig()

    async def slow(call: RpcCall, w: Writer) -> None:
        r.in_flight += 1
        r.max_in_flight = max(r.max_in_flight, r.in_flight)
        r.changes.notify()
        try:
            await r.gate.wait()
        finally:
            r.in_flight -= 1
            r.changes.notify()

    disp = Dispatcher()
    disp.add(
        PROG,
        VERS,
        {
            0: null_procedure,
            P_WRITE: _write,
            P_READ: _read,
            P_READLINK: _readlink,
            P_BLOB: _blob,
            P_SLOW: slow,
        },
    )

    def accepted(c: RdmaConnection) -> None:
        r.server.append(c)
        r.server_rpc.append(RpcConnection(c, disp))
        r.changes.notify()

    listener = RdmaListener(sdev, 20049, accepted, server_opts, connection=connection)
    await listener.start()
    r.client = await connect_rdma(cdev, "10.0.0.1", 20049, client_opts, connection=connection)
    r.rpc = RpcConnection(r.client, disp)  # answers backward calls too (RFC 8167)
    await r.until(lambda: bool(r.server), "the server side accepted")
    try:
        yield r
    finally:
        r.gate.set()
        r.client.close()
        await listener.close()
        await asyncio.gather(*(closed(c) for c in [r.client, *r.server]))
        sdev.close()
        cdev.close()


async def closed(conn: RdmaConnection) -> None:
    """Wait until ``conn`` has finished closing (its ``on_closed`` callbacks ran)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn.on_closed(lambda c, e: fut.done() or fut.set_result(None))
    await asyncio.wait_for(fut, 5)


def write_args(data: bytes) -> Writer:
    w = Writer()
    nfs4.enc_WRITE4args(w, nfs4.WRITE4args(STATEID, 0, nfs4.UNSTABLE4, data))
    return w


async def call_write(r: Rig, data: bytes) -> tuple[int, bytes]:
    assert r.rpc is not None
    res = await r.rpc.call(PROG, VERS, P_WRITE, lambda w: _extend(w, write_args(data)))
    n = struct.unpack_from(">I", res.reader.buf, res.offset)[0]
    return n, bytes(res.reader.buf[res.offset + 4 : res.offset + 36])


def _extend(w: Writer, part: Writer) -> None:
    base = len(w)
    w += part
    for item in part.ddp:
        item.offset += base
        w.ddp.append(item)


async def test_pd7_thresholds_and_null_call() -> None:
    async with rig() as r:
        assert r.client is not None and r.rpc is not None
        assert r.client.thresholds.client_to_server == 4096
        assert r.server[0].thresholds.server_to_client == 4096
        await r.rpc.call(PROG, VERS, 0)
        assert r.client.stats["registrations"] == 0  # the inline path registers nothing


async def test_tr15_a_backward_reply_grants_the_backchannel_receives_not_the_forward_credits() -> (
    None
):
    """RFC 8167: the credits in a reply bound the calls its requester may have outstanding in
    that direction. The client posts ``backchannel`` receives for the server's callbacks, so its
    backward replies grant that many, not the forward grant (32) it never provisioned."""
    opts = RdmaOptions(backchannel=4)
    async with rig(client_opts=opts) as r:
        assert r.rpc is not None
        await r.rpc.call(PROG, VERS, 0)
        server_side = r.server[0]
        await r.server_rpc[0].call(PROG, VERS, 0)  # a callback on the client's connection
        assert server_side.credits.granted == opts.backchannel
        assert r.client is not None and r.client.credits.granted > opts.backchannel


async def test_ul23_a_backward_call_too_large_for_inline_fails_without_exposing_memory() -> None:
    """UL-23 / SEC-6: the server exposes none of its memory, so a callback that would need a
    Read chunk (or a reply that would need a Reply chunk) fails at once on the server's side,
    with nothing registered, and the connection carries on."""
    async with rig() as r:
        assert r.rpc is not None
        await r.rpc.call(PROG, VERS, 0)
        server_side = r.server[0]
        big = b"b" * (2 * server_side.thresholds.server_to_client)

        def args(w: Writer) -> None:
            nfs4.enc_utf8str_cs(w, big)

        before = server_side.stats["registrations"]
        with pytest.raises(TransportCallError, match="does not fit inline"):
            await r.server_rpc[0].call(PROG, VERS, P_BLOB, args)
        with pytest.raises(TransportCallError, match="does not fit inline"):
            await r.server_rpc[0].call(
                PROG, VERS, 0, expect=ReplyExpectation([], 4 * len(big))
            )  # a reply bound beyond the inline threshold would need a Reply chunk
        assert server_side.stats["registrations"] == before
        await r.server_rpc[0].call(PROG, VERS, 0)  # small callbacks still go
        await r.rpc.call(PROG, VERS, 0)


async def test_pd14_thresholds_follow_each_connections_private_data() -> None:
    async with rig(RdmaOptions(inline_size=2048), RdmaOptions(inline_size=8192)) as r:
        assert r.client is not None
        t = r.client.thresholds
        assert (t.client_to_server, t.server_to_client) == (2048, 2048)


@pytest.mark.parametrize("size", [0, 1000, 4097, 200_000])
async def test_tr7_ul1_write_data_by_read_chunk(size: int) -> None:
    data = bytes((i * 7) % 256 for i in range(size))
    async with rig() as r:
        n, digest = await call_write(r, data)
        assert (n, digest) == (size, hashlib.sha256(data).digest())
        # The responder reads chunks into its pre-registered data pool: no registration.
        assert r.server[0].stats["registrations"] == 0
        assert r.client is not None
        assert r.client.stats["read_chunks"] == (1 if size > 4000 else 0)


@pytest.mark.parametrize("size", [10, 3000, 70_000])
async def test_ul14_read_data_lands_in_the_callers_buffer(size: int) -> None:
    async with rig() as r:
        assert r.rpc is not None
        out, sink = await call_read(r.rpc, PROG, VERS, P_READ, size)
        assert bytes(out.data) == bytes(i % 251 for i in range(size))
        assert out.data.obj is sink.obj  # placed directly: no copy
        assert r.client is not None and r.client.stats["write_chunks"] == 1
        assert bytes(sink[:size]) == bytes(out.data)


async def test_tr10_long_reply_through_the_reply_chunk() -> None:
    async with rig() as r:
        assert r.rpc is not None
        res = await r.rpc.call(
            PROG,
            VERS,
            P_READLINK,
            lambda w: w.extend(U32.pack(20_000)),
            expect=ReplyExpectation([], max_size=32_768),
        )
        text, _ = nfs4.dec_utf8str_cs(res.reader, res.offset)
        assert text == b"L" * 20_000


async def test_tr21_reply_without_resources_fails_with_err_chunk_and_connection_lives() -> None:
    async with rig() as r:
        assert r.rpc is not None
        with pytest.raises(TransportCallError, match="ERR_CHUNK"):
            await r.rpc.call(PROG, VERS, P_READLINK, lambda w: w.extend(U32.pack(20_000)))
        await r.rpc.call(PROG, VERS, 0)


async def test_tr9_ul37_long_call_by_position_zero_chunk() -> None:
    blob = b"b" * 30_000  # not DDP-eligible: the whole call goes by a position-zero chunk
    async with rig() as r:
        assert r.rpc is not None
        res = await r.rpc.call(PROG, VERS, P_BLOB, lambda w: nfs4.enc_utf8str_cs(w, blob))
        assert bytes(res.reader.buf[res.offset :]) == hashlib.sha256(blob).digest()


async def test_tr18_bad_arguments_in_a_good_header_get_garbage_args() -> None:
    from nfsrdma.rpc.errors import RpcAcceptError

    async with rig() as r:
        assert r.rpc is not None
        with pytest.raises(RpcAcceptError, match="GARBAGE_ARGS"):
            await r.rpc.call(PROG, VERS, P_WRITE, lambda w: w.extend(b"\0" * 8))


@pytest.mark.parametrize(("message", "err", "why"), BAD_HEADERS)
async def test_tr17_bad_headers_get_rdma_error_and_the_connection_survives(
    message: bytes, err: str, why: str
) -> None:
    async with rig() as r:
        assert r.rpc is not None and r.client is not None
        assert err in await expect_rdma_error(r.rpc, r.client, message), why
        await r.rpc.call(PROG, VERS, 0)


async def test_tr14_ul24_client_never_exceeds_the_servers_grant() -> None:
    """Three credits, one kept back for the probe (UL-26): with 20 calls waiting, exactly two
    are at the server, and no third arrives while they are held there."""
    async with rig(RdmaOptions(credits=3)) as r:
        assert r.rpc is not None and r.client is not None
        await r.rpc.call(PROG, VERS, 0)  # learn the grant
        calls = [asyncio.create_task(r.rpc.call(PROG, VERS, P_SLOW)) for _ in range(20)]
        await r.until(lambda: r.in_flight == 2, "two calls at the server")
        # The probe's reply comes after anything sent before it (one connection, in order):
        # had a third ordinary call gone out, the server would hold it by now.
        await asyncio.wait_for(r.rpc.call(PROG, VERS, 0, probe=True), 5)
        assert r.in_flight == 2 and not any(c.done() for c in calls)
        r.gate.set()
        await asyncio.gather(*calls)
        assert r.max_in_flight == 2
        assert r.client.credits.granted == 3


async def test_tr20_memory_is_invalidated_on_every_path() -> None:
    async with rig(connection=Patchable) as r:
        assert r.rpc is not None and r.client is not None
        client = r.client
        regions: list[object] = []
        orig = client._register

        def spy(length: int, access: object) -> object:
            region = orig(length, access)  # type: ignore[arg-type]
            regions.append(region)
            return region

        client._register = spy  # type: ignore[method-assign,assignment]
        await call_write(r, b"x" * 10_000)  # reply path
        task = asyncio.create_task(
            r.rpc.call(PROG, VERS, P_SLOW, lambda w: _extend(w, write_args(b"y" * 9000)))
        )
        await r.until(lambda: r.in_flight == 1, "the call at the server")
        task.cancel()  # cancellation path, while the server holds the call
        with contextlib.suppress(asyncio.CancelledError):
            await task
        from nfsrdma.rpc.errors import RpcTimeout

        with pytest.raises(RpcTimeout):  # timeout path
            await r.rpc.call(
                PROG, VERS, P_SLOW, lambda w: _extend(w, write_args(b"z" * 9000)), timeout=0.001
            )
        assert len(regions) == 3
        assert all(not reg.registered for reg in regions)  # type: ignore[attr-defined]
        assert client._out == {}


async def test_tr14_calls_beyond_the_grant_end_that_connection() -> None:
    """A requester that ignores its grant and keeps calls piling up on the responder beyond
    its credits (plus the backchannel's) is disconnected; the responder stays up."""
    async with rig(RdmaOptions(credits=3)) as r:
        assert r.rpc is not None and r.client is not None
        await r.rpc.call(PROG, VERS, 0)
        r.client.credits.granted = r.client.credits.local_max = 100  # ignore the grant
        done = await asyncio.gather(
            *[r.rpc.call(PROG, VERS, P_SLOW, timeout=5) for _ in range(20)],
            return_exceptions=True,
        )
        # The server holds every call: the fifth outstanding one (3 credits + 1 for the
        # backchannel) ends the connection, and every call fails with it.
        assert all(isinstance(d, ConnectionError) for d in done), done
        assert r.client.closed and r.server[0].stats["credit_overruns"] == 1


async def test_tr14_long_calls_behind_a_reply_the_requester_cannot_receive_end_it() -> None:
    """The test bed's flood (tests/testbed/test_rdma_peers.py), here: the requester stops
    posting receives and uses up those it had, so the responder's next reply waits for a
    receive for ever, and every RDMA Read the responder posts after it waits behind it (work
    requests execute in order). Long calls then stay outstanding at the responder, whatever
    the timing, until they pass its credits and it ends the connection. (Plain v1: with
    rtrext, calls this long would come as continued Sends, needing no RDMA Read.)"""
    async with rig(RdmaOptions(credits=3), RdmaOptions(rtrext=False), connection=Patchable) as r:
        assert r.rpc is not None and r.client is not None
        client, rpc = r.client, r.rpc
        await rpc.call(PROG, VERS, 0)
        client._post_recv = lambda buf: buf.release()  # type: ignore[method-assign]
        for _ in range(client.recv_pool.count):  # one reply per receive still posted
            await rpc.call(PROG, VERS, 0)
        client.credits.granted = client.credits.local_max = 100  # ignore the grant
        stalled = asyncio.create_task(rpc.call(PROG, VERS, 0, timeout=5))
        done = await asyncio.gather(
            *[
                rpc.call(PROG, VERS, 0, lambda w: w.extend(bytes(6000)), timeout=5)
                for _ in range(20)
            ],
            return_exceptions=True,
        )
        assert all(isinstance(d, ConnectionError) for d in done), done
        with pytest.raises(ConnectionError):
            await stalled
        assert r.server[0].stats["credit_overruns"] == 1
        assert client.stats["read_chunks"] == 20  # they were Long calls


async def test_ul26_a_probe_uses_the_credit_kept_back() -> None:
    """With every ordinary credit in use, a keepalive probe still goes out (UL-26)."""
    async with rig(RdmaOptions(credits=3)) as r:
        assert r.rpc is not None
        await r.rpc.call(PROG, VERS, 0)  # learn the grant: 3, of which 2 for ordinary calls
        slow = [asyncio.create_task(r.rpc.call(PROG, VERS, P_SLOW)) for _ in range(3)]
        await r.until(lambda: r.in_flight == 2, "two calls at the server")
        # Both ordinary credits are held at the server; the probe still gets through.
        await asyncio.wait_for(r.rpc.call(PROG, VERS, 0, probe=True), 5)
        assert r.in_flight == 2 and not any(t.done() for t in slow)  # the third one waits
        r.gate.set()
        await asyncio.gather(*slow)


async def test_pd24_a_message_before_our_side_is_established_is_answered_after() -> None:
    """The passive side may receive before its own ESTABLISHED (the peer's side completes
    first): anything it sends meanwhile waits for establishment instead of failing."""
    fabric = InprocFabric()
    sdev, cdev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    early: list[RdmaConnection] = []
    disp = Dispatcher()
    disp.add(PROG, VERS, {0: null_procedure})

    def accepted(c: RdmaConnection) -> None:
        early.append(c)
        assert not c.ready
        c._bad_header(H.HeaderError("an early bad call", 5, H.ERR_CHUNK))  # before ESTABLISHED
        RpcConnection(c, disp)

    listener = RdmaListener(sdev, 20049, accepted)
    await listener.start()
    client = await asyncio.wait_for(connect_rdma(cdev, "10.0.0.1", 20049), 5)
    # The server's early RDMA_ERROR was sent before the reply to this call: one connection
    # delivers in order, so once the reply is here, so is the error.
    await asyncio.wait_for(RpcConnection(client).call(PROG, VERS, 0), 5)
    assert client.stats["rdma_errors"] == 1 and early and early[0].ready
    client.close()
    await listener.close()
    sdev.close()
    cdev.close()


async def test_chunks_larger_than_the_data_pool_get_their_own_registration() -> None:
    data = b"w" * 20_000
    async with rig(RdmaOptions(data_buffer_size=8192)) as r:
        n, digest = await call_write(r, data)
        assert (n, digest) == (len(data), hashlib.sha256(data).digest())
        assert r.server[0].stats["registrations"] == 1
        assert r.server[0].data_pool is not None and r.server[0].data_pool.in_use == 0


async def test_tr2_transport_xid_is_the_rpc_xid() -> None:
    async with rig(connection=Patchable) as r:
        assert r.rpc is not None
        seen: list[tuple[int, int]] = []
        server = r.server[0]
        deliver = server._deliver

        def spy(inbound: Inbound) -> None:
            ctx = inbound.context
            assert isinstance(ctx, CallContext)
            seen.append((ctx.header.xid, int.from_bytes(bytes(inbound.reader.buf[:4]), "big")))
            deliver(inbound)

        server._deliver = spy  # type: ignore[method-assign]
        res = await r.rpc.call(PROG, VERS, 0)
        await call_write(r, b"q" * 9000)  # with a Read chunk too
        assert len(seen) == 2 and all(a == b for a, b in seen) and seen[0][0] == res.xid


async def test_tr12_a_reply_carrying_read_chunks_fails_that_call() -> None:
    """Replies never carry Read chunks (TR-12): such a reply fails its RPC, the connection
    stays up."""
    async with rig() as r:
        assert r.rpc is not None and r.client is not None
        from nfsrdma.transport.rdma.endpoint import _OutCall
        from nfsrdma.transport.rdma.header import ReadChunk, Segment

        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        r.rpc.pending[0x99] = fut  # type: ignore[assignment]
        r.client._out[0x99] = _OutCall(0x99, counted=False)
        reply = words(0x99, 1, 0, 0, 0, 0)  # an accepted RPC reply
        head = H.encode(0x99, 1, H.RDMA_MSG, [ReadChunk(4, [Segment(1, 8, 0)])])
        r.server[0]._send([head, reply])
        with pytest.raises(TransportCallError, match="Read list"):
            await asyncio.wait_for(fut, 2)
        await r.rpc.call(PROG, VERS, 0)


def words(*ws: int) -> bytes:
    return b"".join(struct.pack(">I", w) for w in ws)
