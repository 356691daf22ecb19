"""Hostile connections against the real server on loopback (issue 9, holes 2 and 3): a flood of
empty fragments, more connections than the limit (in all, and from one source address), idle
connections, slow-loris; each is closed while an honest client keeps being served, and a
connection bound to a session is never closed for being idle."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import struct
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.rpc import message
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.server import NFSServer
from nfsrdma.transport.tcp import MAX_FRAGMENTS, connect_tcp, frame
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

from .helpers import op, op_exchange_id, op_sequence, resok, statuses

CRED = auth_sys(0, 0, (), "limits-client")
OK = nfs4.NFS4_OK
WAIT = 10.0  # seconds to wait for an event that must come (a failure, not a sleep)
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **limits: Any) -> AsyncIterator[NFSServer]:
    export = tmp_path / "export"
    export.mkdir()
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        state_dir=str(tmp_path / "state"),
        config=ServerConfig(**limits),
    )
    await server.start()  # a server that cannot start fails the test
    try:
        yield server
    finally:
        await server.close()


async def compound(conn: RpcConnection, ops: list[nfs4.nfs_argop4]) -> Any:
    def enc(w: Writer) -> None:
        nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(b"", 1, ops))

    r = await conn.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, enc, cred=CRED, timeout=WAIT)
    res, _ = nfs4.dec_COMPOUND4res(r.reader, r.offset)
    return res


async def honest_client(port: int) -> RpcConnection:
    return RpcConnection(await connect_tcp("127.0.0.1", port))


async def assert_served(conn: RpcConnection, owner: bytes = b"honest") -> None:
    res = await compound(conn, [op_exchange_id(owner)])
    assert statuses(res) == [OK]


def null_call(xid: int) -> bytes:
    w = Writer()
    message.encode_call(w, xid, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, message.AUTH_NONE_VERF)
    return b"".join(bytes(p) for p in frame(w.pieces()))


async def raw(port: int, source: str = "127.0.0.1") -> Stream:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def null_round_trip(stream: Stream, xid: int = 7) -> None:
    """A NULL call answered on a raw connection: the server holds it open and serves it."""
    reader, writer = stream
    writer.write(null_call(xid))
    (mark,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), WAIT))
    reply = await reader.readexactly(mark & 0x7FFFFFFF)
    assert struct.unpack_from(">I", reply)[0] == xid


async def closed_by_server(stream: Stream) -> None:
    """Return when the server has closed the connection (end of stream or reset)."""

    async def drain() -> None:
        with contextlib.suppress(ConnectionError):
            while await stream[0].read(65536):
                pass

    await asyncio.wait_for(drain(), WAIT)


def close_all(streams: list[Stream]) -> None:
    for _, writer in streams:
        writer.close()


# -- hole 2: fragment overhead -------------------------------------------------------------
class _Owned:
    """Something an RPC connection's context holds, to be weakly referenced."""


async def test_empty_fragment_flood_is_cut_off_and_released(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nfsrdma")
    async with serving(tmp_path) as server:
        honest = await honest_client(server.tcp_port)
        attacker = await raw(server.tcp_port)
        await null_round_trip(attacker)  # the server has it now
        host, port = attacker[1].get_extra_info("sockname")[:2]
        victim = next(r for r in server.connections if r.peer == f"{host}:{port}")
        # The RPC connection is watched through an object only its context holds (a compiled
        # RpcConnection takes no weak reference): the object goes when the connection goes.
        owned = _Owned()
        victim.context["test.owned"] = owned
        conn_ref, rpc_ref = weakref.ref(victim.conn), weakref.ref(owned)
        del victim, owned
        with contextlib.suppress(ConnectionError):
            # 4 MB of empty, non-final fragment marks (today: all kept, never cut off).
            for _ in range(100):
                attacker[1].write(struct.pack(">I", 0) * 10_000)
                await attacker[1].drain()
        await closed_by_server(attacker)
        await assert_served(honest)
        assert all(r.peer != f"{host}:{port}" for r in server.connections)
        gc.collect()
        assert conn_ref() is None and rpc_ref() is None  # nothing holds the connection's buffers
        assert server.admission.by_source == {"127.0.0.1": 1}  # the honest client only
        violations = [r for r in caplog.records if f"{MAX_FRAGMENTS} fragments" in r.getMessage()]
        assert len(violations) == 1  # logged once
        honest.close()
        attacker[1].close()


# -- hole 3: connection limits ---------------------------------------------------------------
async def test_connections_over_the_limit_are_closed_at_once(tmp_path: Path) -> None:
    async with serving(tmp_path, max_connections=8, max_connections_per_source=8) as server:
        honest = await honest_client(server.tcp_port)
        await assert_served(honest)
        streams = [await raw(server.tcp_port) for _ in range(20)]
        for s in streams[7:]:  # over the limit of 8: closed as soon as accepted
            await closed_by_server(s)
        for i, s in enumerate(streams[:7]):  # the first seven are admitted, and served
            await null_round_trip(s, xid=i)
        await assert_served(honest)
        assert server.admission.total == 8 and server.admission.refused == 13
        close_all(streams)
        honest.close()


async def test_one_source_gets_only_its_share(tmp_path: Path) -> None:
    async with serving(tmp_path, max_connections=16, max_connections_per_source=4) as server:
        streams = [await raw(server.tcp_port, source="127.0.0.2") for _ in range(10)]
        for s in streams[4:]:
            await closed_by_server(s)
        for i, s in enumerate(streams[:4]):
            await null_round_trip(s, xid=i)
        # Another address still gets in, and is served.
        honest = await honest_client(server.tcp_port)
        await assert_served(honest)
        assert server.admission.by_source == {"127.0.0.2": 4, "127.0.0.1": 1}
        close_all(streams)
        honest.close()


# -- hole 3: idle connections and slow-loris -----------------------------------------------
async def test_idle_connection_without_session_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nfsrdma")
    async with serving(tmp_path, idle_timeout=0.6, record_timeout=0.3) as server:
        idle = await honest_client(server.tcp_port)
        await idle.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=WAIT)
        silent = await raw(server.tcp_port)  # connects and never sends anything
        await asyncio.wait_for(idle.closed.wait(), WAIT)
        await closed_by_server(silent)
        assert server.idle_closed == 2
        text = caplog.text
        assert "closed: idle for 0.6 s" in text
        assert "closed: no complete record within 0.3 s" in text
        assert server.admission.total == 0


async def test_connection_with_a_session_survives_idle(tmp_path: Path) -> None:
    # The set-up must beat the timeouts: they are short, not tiny, for a loaded machine.
    async with serving(tmp_path, idle_timeout=0.8, record_timeout=0.4) as server:
        with_session = await honest_client(server.tcp_port)
        res = await compound(with_session, [op_exchange_id(b"keeper")])
        eir = resok(res, 0)
        fore = nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 4, [])
        back = nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, [])
        args = nfs4.CREATE_SESSION4args(
            eir.eir_clientid, eir.eir_sequenceid, 0, fore, back, 0x40000000,
            [nfs4.callback_sec_parms4(0)],
        )  # fmt: skip
        res = await compound(with_session, [op(nfs4.OP_CREATE_SESSION, args)])
        sid = resok(res, 0).csr_sessionid
        # Three idle connections without session, opened one after another after the session's
        # last call, each closed for idleness: meanwhile the session's connection was checked
        # past its own idle deadline, and kept.
        for _ in range(3):
            other = await honest_client(server.tcp_port)
            await other.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=WAIT)
            await asyncio.wait_for(other.closed.wait(), WAIT)
        assert not with_session.closed.is_set()
        assert server.idle_closed == 3
        res = await compound(with_session, [op_sequence(sid, 1)])
        assert statuses(res) == [OK]
        with_session.close()


async def test_slow_loris_is_closed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nfsrdma")
    async with serving(tmp_path, idle_timeout=600, record_timeout=0.5) as server:
        honest = await honest_client(server.tcp_port)
        await assert_served(honest)
        loris = await raw(server.tcp_port)
        await null_round_trip(loris)  # one valid record first: the idle timeout is far away
        first_loris = await raw(server.tcp_port)  # dribbles its very first record

        async def dribble(stream: Stream) -> None:
            with contextlib.suppress(ConnectionError):
                stream[1].write(struct.pack(">I", 0x80000000 | 1000))
                for _ in range(1000):  # a byte every 50 ms: 50 s for the record
                    stream[1].write(b"x")
                    await stream[1].drain()
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(dribble(s)) for s in (loris, first_loris)]
        await closed_by_server(loris)
        await closed_by_server(first_loris)
        for t in tasks:
            t.cancel()
        await assert_served(honest)  # the honest client, idle meanwhile, is a different case:
        assert not honest.closed.is_set()  # its idle timeout (600 s) is far away
        assert "closed: record incomplete for 0.5 s" in caplog.text
        assert "closed: no complete record within 0.5 s" in caplog.text
        honest.close()


# -- the same accounting for RPC-over-RDMA connections ---------------------------------------
async def test_rdma_connections_are_admitted_by_the_same_limits(tmp_path: Path) -> None:
    from nfsrdma.transport.rdma.endpoint import connect_rdma
    from nfsrdma.transport.rdma.inproc import InprocFabric
    from nfsrdma.transport.rdma.provider import ConnectionRejected

    fabric = InprocFabric()
    sdev, cdev = fabric.device("10.9.0.1"), fabric.device("10.9.0.2")
    export = tmp_path / "export"
    export.mkdir()
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=20049, rdma_device=sdev,
        state_dir=str(tmp_path / "state"),
        config=ServerConfig(max_connections=2, max_connections_per_source=1),
    )  # fmt: skip
    await server.start()
    try:
        first = RpcConnection(await connect_rdma(cdev, "10.9.0.1", 20049))
        await assert_served(first, b"rdma-1")
        # The second RDMA connection from the same peer is over its share: the connection
        # manager rejects the request, so the client's connect fails at once and the server
        # makes no connection for it.
        assert server.rdma is not None
        accepted: list[Any] = []
        serve_connection = server.rdma.on_connection

        def watch(conn: Any) -> None:
            accepted.append(conn)
            serve_connection(conn)

        server.rdma.on_connection = watch
        with pytest.raises(ConnectionRejected):
            await asyncio.wait_for(connect_rdma(cdev, "10.9.0.1", 20049), WAIT)
        assert accepted == []
        assert server.admission.refused == 1
        # TCP from another source takes the last place; one more is over the total.
        honest = await honest_client(server.tcp_port)
        await assert_served(honest)
        extra = await raw(server.tcp_port, source="127.0.0.2")
        await closed_by_server(extra)
        assert server.admission.refused == 2 and server.admission.total == 2
        await assert_served(first, b"rdma-1")
        honest.close()
        first.close()
        extra[1].close()
    finally:
        await server.close()


# -- logging under a flood, and in ordinary operation ----------------------------------------
def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_connection_lines_are_rate_limited_under_a_flood(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nfsrdma")
    async with serving(tmp_path, max_connections=4, max_connections_per_source=4) as server:
        # Ordinary operation: one line for a connection the client opens and closes.
        client = await honest_client(server.tcp_port)
        await assert_served(client)
        host, port = client.conn.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
        client.close()
        await client.closed.wait()
        admitted = await raw(server.tcp_port)
        await null_round_trip(admitted)  # the server has seen the client's close by now
        assert len(_lines(caplog, f"{host}:{port}")) == 1
        # A flood of 200 connections over the limit: every one refused and closed, a few lines.
        loop = asyncio.get_running_loop()
        start = loop.time()
        flood = [await raw(server.tcp_port) for _ in range(3 + 200)]
        for s in flood[3:]:
            await closed_by_server(s)
        seconds = loop.time() - start
        refusals = _lines(caplog, "refused")
        burst = server._refusal_lines.burst
        assert server.admission.refused == 200
        assert len(refusals) <= burst * (int(seconds) + 2)
        reported = sum(int(m.rsplit("(", 1)[1].split()[0]) for m in refusals if "suppressed)" in m)
        # Every refusal is either a line, or counted in a later line or the pending summary.
        assert len(refusals) + reported + server._refusal_lines.suppressed == 200
        close_all([admitted, *flood])
