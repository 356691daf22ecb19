"""The session layer in the real server over TCP: mount steps, a reconnect that loses the back
channel (SS-2, SS-13, SS-26), the retry answered from the reply cache on the new connection,
and the Linux-style BIND_CONN_TO_SESSION repair (UL-39)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.server import NFSServer
from nfsrdma.transport.tcp import TcpConnection, connect_tcp
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

from .helpers import (
    op,
    op_create_session,
    op_exchange_id,
    op_reclaim_complete,
    op_sequence,
    resok,
    statuses,
)

CRED = auth_sys(0, 0, (), "tcp-client")
OK = nfs4.NFS4_OK


async def compound(conn: RpcConnection, ops: list[nfs4.nfs_argop4]) -> tuple[Any, bytes]:
    def enc(w: Writer) -> None:
        nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(b"", 1, ops))

    r = await conn.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, enc, cred=CRED, timeout=10)
    body = bytes(r.reader.buf[r.offset :])
    res, _ = nfs4.dec_COMPOUND4res(r.reader, r.offset)
    return res, body


async def test_reconnect_replay_and_back_channel_repair(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, state_dir=str(tmp_path / "state"), slots=4
    )
    await server.start()
    try:
        port = server.tcp_port
        c1 = RpcConnection(await connect_tcp("127.0.0.1", port))
        res, _ = await compound(c1, [op_exchange_id(b"tcp-client")])
        eir = resok(res, 0)
        res, _ = await compound(c1, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
        sid = resok(res, 0).csr_sessionid
        ops = [op_sequence(sid, 1), op_reclaim_complete()]
        res, first = await compound(c1, ops)
        assert statuses(res) == [OK, OK]
        assert resok(res, 0).sr_status_flags == 0

        state = server.state
        assert state is not None
        session = state.sessions.session(sid)
        assert session is not None
        (server_side,) = session.connections
        assert isinstance(server_side, RpcConnection)
        # Our callback runs after the server's own close handling (callbacks run in order).
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        server_side.conn.on_closed(lambda c, e: gone.done() or gone.set_result(None))
        c1.close()
        await c1.closed.wait()
        await asyncio.wait_for(gone, 10)  # the server saw the close
        assert session.connections == {}

        c2 = RpcConnection(await connect_tcp("127.0.0.1", port))
        # The retry on the new connection: answered from the cache, executed once.
        res, again = await compound(c2, ops)
        assert again == first
        res, _ = await compound(c2, [op_sequence(sid, 2)])
        assert resok(res, 0).sr_status_flags & nfs4.SEQ4_STATUS_CB_PATH_DOWN
        bind = nfs4.BIND_CONN_TO_SESSION4args(sid, nfs4.CDFC4_BACK_OR_BOTH, False)
        res, _ = await compound(c2, [op(nfs4.OP_BIND_CONN_TO_SESSION, bind)])
        assert resok(res, 0) == nfs4.BIND_CONN_TO_SESSION4resok(sid, nfs4.CDFS4_BOTH, False)
        res, _ = await compound(c2, [op_sequence(sid, 3)])
        assert resok(res, 0).sr_status_flags == 0
        path = state.sessions.callback_path(session.clientid)
        assert path is not None and path[0] is session
        assert isinstance(path[1], RpcConnection)
        c2.close()
    finally:
        await server.close()


async def test_an_exchange_id_flood_from_one_address_delays_that_address_only(
    tmp_path: Path,
) -> None:
    """Issue 9 hole 4a over real sockets: the source key is the peer address the TCP
    transport reports (127.0.0.2 floods, 127.0.0.1 mounts at once)."""
    export = tmp_path / "export"
    export.mkdir()
    server = NFSServer(str(export), bind="127.0.0.1", tcp_port=0, state_dir=str(tmp_path / "st"))
    await server.start()
    try:
        port = server.tcp_port
        loop = asyncio.get_running_loop()
        _, flood_conn = await loop.create_connection(
            lambda: TcpConnection(), "127.0.0.1", port, local_addr=("127.0.0.2", 0)
        )
        flood = RpcConnection(flood_conn)
        sent = 0
        while True:
            res, _ = await compound(flood, [op_exchange_id(b"flood-%d" % sent)])
            sent += 1
            if res.status != OK:
                break
        assert res.status == nfs4.NFS4ERR_DELAY
        honest = RpcConnection(await connect_tcp("127.0.0.1", port))
        res, _ = await compound(honest, [op_exchange_id(b"honest")])
        assert res.status == OK
        eir = resok(res, 0)
        res, _ = await compound(honest, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
        assert res.status == OK
        state = server.state
        assert state is not None
        session = state.sessions.session(resok(res, 0).csr_sessionid)
        assert session is not None and session.source == "127.0.0.1"
        assert state.sessions.clients.per_source["127.0.0.2"] == sent - 1 >= 512
        flood.close()
        honest.close()
    finally:
        await server.close()
