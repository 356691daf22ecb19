"""ONC RPC over TCP: NULL calls, concurrency, fragmented records, every error reply (RFC 5531)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable

import pytest

from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.errors import RpcAcceptError, RpcConnectionLost, RpcDenied, RpcTimeout
from nfsrdma.rpc.server import Dispatcher, RpcCall, null_procedure
from nfsrdma.transport.tcp import LAST_FRAGMENT, TcpConnection, connect_tcp, listen_tcp
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import U32, Writer, XdrError

PROG, VERS = 400100, 3


def _echo(call: RpcCall, w: Writer) -> None:
    if len(call.reader.buf) - call.offset != 4:
        raise XdrError("echo takes one unsigned int", call.offset)
    (n,) = struct.unpack_from(">I", call.reader.buf, call.offset)
    if n > 1000:
        raise XdrError("too big", call.offset)
    w += U32.pack(n * 2)


class _Together:
    """Procedure 2 answers only once ``expected`` calls are being served at the same time:
    proof that the server runs a connection's calls concurrently."""

    expected = 1
    barrier: asyncio.Barrier | None = None

    @classmethod
    def reset(cls, expected: int) -> None:
        cls.expected, cls.barrier = expected, asyncio.Barrier(expected)


async def _slow(call: RpcCall, w: Writer) -> None:
    if _Together.barrier is not None:
        await _Together.barrier.wait()
    w += U32.pack(call.cred.uid or 0)


def _boom(call: RpcCall, w: Writer) -> None:
    w += b"partial"
    raise RuntimeError("handler bug")


def _make_dispatcher() -> Dispatcher:
    d = Dispatcher()
    d.add(PROG, 2, {0: null_procedure})
    d.add(PROG, VERS, {0: null_procedure, 1: _echo, 2: _slow, 3: _boom})
    return d


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[int]:
    disp = _make_dispatcher()
    conns: list[TcpConnection] = []

    def on_conn(c: TcpConnection) -> None:
        conns.append(c)
        RpcConnection(c, disp)

    srv = await listen_tcp("127.0.0.1", 0, on_conn, max_record=64 * 1024)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        srv.close()
    for c in conns:
        c.close()
    await srv.wait_closed()


async def _client(port: int, **kw: int) -> RpcConnection:
    return RpcConnection(await connect_tcp("127.0.0.1", port, **kw))


def _arg(n: int) -> Callable[[Writer], None]:
    def enc(w: Writer) -> None:
        w += U32.pack(n)

    return enc


async def test_null_and_echo() -> None:
    async with serving() as port:
        await _test_null_and_echo(port)


async def _test_null_and_echo(port: int) -> None:
    c = await _client(port)
    res = await c.call(PROG, VERS, 0)
    assert res.offset == len(res.reader.buf)
    res = await c.call(PROG, VERS, 1, _arg(21))
    assert struct.unpack_from(">I", res.reader.buf, res.offset) == (42,)
    c.close()


async def test_many_concurrent_calls_with_auth_sys() -> None:
    async with serving() as port:
        await _test_many_concurrent_calls_with_auth_sys(port)


async def _test_many_concurrent_calls_with_auth_sys(port: int) -> None:
    c = await _client(port)
    cred = auth_sys(uid=1234, gid=5, gids=list(range(16)), machinename="m" * 255)
    _Together.reset(200)  # no reply before all 200 calls are in the server at once
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*[c.call(PROG, VERS, 2, cred=cred) for _ in range(200)]), 30
        )
    finally:
        _Together.barrier = None
    assert all(struct.unpack_from(">I", r.reader.buf, r.offset) == (1234,) for r in results)
    assert len({r.xid for r in results}) == 200
    c.close()


async def test_fragmented_records_both_ways() -> None:
    async with serving() as port:
        await _test_fragmented_records_both_ways(port)


async def _test_fragmented_records_both_ways(port: int) -> None:
    # The client sends every record in 8-byte fragments; the server reassembles them.
    c = await _client(port, max_fragment=8)
    res = await c.call(PROG, VERS, 1, _arg(7))
    assert struct.unpack_from(">I", res.reader.buf, res.offset) == (14,)
    c.close()


@pytest.mark.parametrize(
    ("prog", "vers", "proc", "stat", "mismatch"),
    [
        (PROG + 1, VERS, 0, rpc.PROG_UNAVAIL, None),
        (PROG, 9, 0, rpc.PROG_MISMATCH, (2, 3)),
        (PROG, VERS, 77, rpc.PROC_UNAVAIL, None),
        (PROG, VERS, 3, rpc.SYSTEM_ERR, None),
    ],
)
async def test_accept_errors(
    prog: int,
    vers: int,
    proc: int,
    stat: int,
    mismatch: tuple[int, int] | None,
) -> None:
    async with serving() as port:
        await _accept_errors(port, prog, vers, proc, stat, mismatch)


async def _accept_errors(
    port: int, prog: int, vers: int, proc: int, stat: int, mismatch: tuple[int, int] | None
) -> None:
    c = await _client(port)
    with pytest.raises(RpcAcceptError) as e:
        await c.call(prog, vers, proc)
    assert e.value.stat == stat and e.value.mismatch == mismatch
    # The connection is still good afterwards.
    await c.call(PROG, VERS, 0)
    c.close()


async def test_garbage_args() -> None:
    async with serving() as port:
        await _test_garbage_args(port)


async def _test_garbage_args(port: int) -> None:
    c = await _client(port)
    for enc in (None, _arg(5000)):  # truncated arguments, then arguments the handler refuses
        with pytest.raises(RpcAcceptError) as e:
            await c.call(PROG, VERS, 1, enc)
        assert e.value.stat == rpc.GARBAGE_ARGS
    with pytest.raises(RpcAcceptError) as e:
        await c.call(PROG, VERS, 0, _arg(1))  # NULL takes no arguments
    assert e.value.stat == rpc.GARBAGE_ARGS
    c.close()


async def _raw_exchange(port: int, record: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(struct.pack(">I", LAST_FRAGMENT | len(record)) + record)
    (mark,) = struct.unpack(">I", await reader.readexactly(4))
    reply = await reader.readexactly(mark & 0x7FFFFFFF)
    writer.close()
    return reply


async def test_rpc_mismatch_and_auth_errors() -> None:
    async with serving() as port:
        await _test_rpc_mismatch_and_auth_errors(port)


async def _test_rpc_mismatch_and_auth_errors(port: int) -> None:
    # RPC version 3: MSG_DENIED / RPC_MISMATCH (2, 2), byte for byte.
    call = struct.pack(">IIIIIIIIII", 0xABC, 0, 3, PROG, VERS, 0, 0, 0, 0, 0)
    assert await _raw_exchange(port, call) == struct.pack(">IIIIII", 0xABC, 1, 1, 0, 2, 2)
    # An unknown credential flavour: MSG_DENIED / AUTH_ERROR / AUTH_BADCRED.
    call = struct.pack(">IIIIIIIIII", 0xABD, 0, 2, PROG, VERS, 0, 99, 0, 0, 0)
    assert await _raw_exchange(port, call) == struct.pack(">IIIII", 0xABD, 1, 1, 1, 1)
    # A malformed AUTH_SYS body (gid list longer than 16) is a bad credential too.
    parms = struct.pack(">III", 0, 0, 0) + struct.pack(">III", 0, 0, 17) + b"\0" * 68
    call = struct.pack(">IIIIIII", 0xABE, 0, 2, PROG, VERS, 0, 1) + struct.pack(">I", len(parms))
    call += parms + struct.pack(">II", 0, 0)
    assert await _raw_exchange(port, call) == struct.pack(">IIIII", 0xABE, 1, 1, 1, 1)
    c = await _client(port)
    with pytest.raises(RpcDenied) as e:
        await c.call(PROG, VERS, 0, cred=rpc.opaque_auth(rpc.AUTH_DH, b"x"))
    assert e.value.auth == rpc.AUTH_BADCRED
    c.close()


async def test_oversized_record_closes_only_that_connection() -> None:
    async with serving() as port:
        await _oversized(port)


async def _oversized(port: int) -> None:
    good = await _client(port)
    bad = await _client(port)
    big = b"\0" * (70 * 1024)
    with pytest.raises(RpcConnectionLost):
        await bad.call(PROG, VERS, 1, lambda w: w.extend(big), timeout=5)
    res = await good.call(PROG, VERS, 1, _arg(4))
    assert struct.unpack_from(">I", res.reader.buf, res.offset) == (8,)
    good.close()


async def test_reply_with_unknown_xid_is_ignored_and_timeouts_release_the_xid() -> None:
    replies: list[bytes] = []

    async def fake_server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        (mark,) = struct.unpack(">I", await r.readexactly(4))
        body = await r.readexactly(mark & 0x7FFFFFFF)
        (xid,) = struct.unpack_from(">I", body)
        stray = struct.pack(">IIIIII", xid ^ 1, 1, 0, 0, 0, 0)
        ok = struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0)
        for rec in (stray, ok):
            w.write(struct.pack(">I", LAST_FRAGMENT | len(rec)) + rec)
            replies.append(rec)
        await r.read()  # then stay silent

    srv = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    c = await _client(port)
    await c.call(PROG, VERS, 0)
    with pytest.raises(RpcTimeout):
        await c.call(PROG, VERS, 0, timeout=0.2)
    assert c.pending == {}
    c.close()
    srv.close()
    assert len(replies) == 2


async def test_malformed_reply_header_raises_xdr_error() -> None:
    async def fake_server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        (mark,) = struct.unpack(">I", await r.readexactly(4))
        body = await r.readexactly(mark & 0x7FFFFFFF)
        rec = body[:4] + struct.pack(">II", 1, 7)  # reply_stat 7 does not exist
        w.write(struct.pack(">I", LAST_FRAGMENT | len(rec)) + rec)
        await r.read()

    srv = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    c = await _client(srv.sockets[0].getsockname()[1])
    with pytest.raises(XdrError):
        await c.call(PROG, VERS, 0)
    c.close()
    srv.close()


def test_record_parser_across_arbitrary_chunking() -> None:
    """Records split at every possible point, in fragments, come out whole and in order."""
    from nfsrdma.transport.tcp import RecordParser, frame

    records = [b"a" * 5, b"", b"xyz" * 100, bytes(range(256)) * 3]
    stream = b"".join(
        b"".join(bytes(p) for p in frame([r], max_fragment=7 if i % 2 else 1 << 20))
        for i, r in enumerate(records)
    )
    for size in (1, 3, 4, 5, 11, 64, len(stream)):
        parser = RecordParser()
        got: list[bytes] = []
        for i in range(0, len(stream), size):
            got += parser.feed(stream[i : i + size])
        assert got == records, size


def _raw_call(xid: int, proc: int, arg: bytes = b"") -> bytes:
    w = Writer()
    w += struct.pack(">IIIIII", xid, rpc.CALL, 2, PROG, VERS, proc)
    w += struct.pack(">IIII", rpc.AUTH_NONE, 0, rpc.AUTH_NONE, 0)
    w += arg
    return struct.pack(">I", LAST_FRAGMENT | len(w)) + bytes(w)


async def _replies(reader: asyncio.StreamReader, n: int) -> list[tuple[int, bytes]]:
    """``n`` replies as (xid, results after the accepted-reply header)."""
    out = []
    for _ in range(n):
        (mark,) = struct.unpack(">I", await reader.readexactly(4))
        reply = await reader.readexactly(mark & 0x7FFFFFFF)
        xid, mtype, stat, _flavor, _len, accept = struct.unpack_from(">IIIIII", reply)
        assert (mtype, stat, accept) == (rpc.REPLY, rpc.MSG_ACCEPTED, rpc.SUCCESS)
        out.append((xid, reply[24:]))
    return out


@contextlib.asynccontextmanager
async def _counting_writes() -> AsyncIterator[tuple[int, list[int]]]:
    """A server whose connections count their transport's writes (pieces per write)."""
    disp = _make_dispatcher()
    writes: list[int] = []
    conns: list[TcpConnection] = []

    def on_conn(c: TcpConnection) -> None:
        conns.append(c)
        RpcConnection(c, disp)
        t = c.transport
        assert t is not None
        real = t.writelines

        def writelines(pieces: list[bytes | bytearray | memoryview]) -> None:
            writes.append(len(pieces))
            real(pieces)

        t.writelines = writelines  # type: ignore[method-assign]

    srv = await listen_tcp("127.0.0.1", 0, on_conn)
    try:
        yield srv.sockets[0].getsockname()[1], writes
    finally:
        srv.close()
        for c in conns:
            c.close()
        await srv.wait_closed()


async def test_replies_to_one_receive_are_written_together() -> None:
    """Calls that arrive in one receive and are answered at once leave in one write, in
    order; a call answered after a wait is written on its own when it is done."""
    async with _counting_writes() as (port, writes):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(_raw_call(10 + n, 1, struct.pack(">I", n)) for n in range(3)))
        got = await _replies(reader, 3)
        assert got == [(10 + n, struct.pack(">I", 2 * n)) for n in range(3)]
        assert writes == [3 * 2]  # one write: a mark and the reply, three times
        writes.clear()
        _Together.reset(1)
        try:
            # The slow procedure awaits (a barrier of one): its reply is not held back for
            # the echo behind it, and comes when it is done, in its own write.
            writer.write(_raw_call(20, 2) + _raw_call(21, 1, struct.pack(">I", 7)))
            got = await _replies(reader, 2)
        finally:
            _Together.barrier = None
        assert sorted(got) == [(20, struct.pack(">I", 0)), (21, struct.pack(">I", 14))]
        assert writes == [2, 2]
        # A single call is written at once, as before.
        writes.clear()
        writer.write(_raw_call(30, 1, struct.pack(">I", 5)))
        assert await _replies(reader, 1) == [(30, struct.pack(">I", 10))]
        assert writes == [2]
        writer.close()


async def test_calls_made_in_one_turn_are_written_together() -> None:
    """The requester's calls made while the loop runs what is ready now leave in one write (a
    system call), in order, when that turn is over; a call made later is written in its own;
    a close writes queued calls first."""
    async with serving() as port:
        c = await _client(port)
        t = c.conn.transport  # type: ignore[attr-defined]
        assert t is not None
        writes: list[int] = []
        real = t.writelines

        def writelines(pieces: list[bytes | bytearray | memoryview]) -> None:
            writes.append(len(pieces))
            real(pieces)

        t.writelines = writelines
        calls = [asyncio.ensure_future(c.call(PROG, VERS, 1, _arg(n))) for n in range(5)]
        got = await asyncio.wait_for(asyncio.gather(*calls), 10)
        assert [struct.unpack_from(">I", r.reader.buf, r.offset)[0] for r in got] == [
            2 * n for n in range(5)
        ]
        assert writes == [5 * 2]  # one write: a mark and the call, five times
        writes.clear()
        res = await c.call(PROG, VERS, 1, _arg(4))
        assert struct.unpack_from(">I", res.reader.buf, res.offset) == (8,)
        assert writes == [2]
        # Queued and then closed in the same turn: the call still goes out before the FIN.
        writes.clear()
        lost = asyncio.ensure_future(c.call(PROG, VERS, 1, _arg(1)))
        await asyncio.sleep(0)  # the call is made and queued
        c.close()
        with pytest.raises(RpcConnectionLost):
            await lost
        assert writes == [2]
