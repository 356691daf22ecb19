"""The session operations end to end through COMPOUND processing (compound.py): real RPC
calls decoded from bytes, the real local VFS, replies decoded from the bytes produced."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nfsrdma.nfs4.compound import compound
from nfsrdma.nfs4.inprocess import MemoryConnection, compound_call, rpc_call
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.session.server import ServerSessions
from nfsrdma.vfs import Export, LocalVfs
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import Writer, unpack

from .helpers import (
    op,
    op_create_session,
    op_exchange_id,
    op_reclaim_complete,
    op_sequence,
    resok,
    statuses,
)

ROOT_CRED = auth_sys(0, 0, (), "client-host")
USER_CRED = auth_sys(1000, 1000, (), "client-host")
OK = nfs4.NFS4_OK


@dataclass
class Server:
    state: ServerState
    expired: list[int] = field(default_factory=list)
    xid: int = 0

    @property
    def sessions(self) -> ServerSessions:
        return self.state.sessions

    def connection(self, name: str = "peer") -> RpcConnection:
        return RpcConnection(MemoryConnection(name))

    async def call(
        self,
        conn: RpcConnection,
        ops: list[nfs4.nfs_argop4],
        cred: rpc.opaque_auth = ROOT_CRED,
        minor: int = 1,
    ) -> tuple[nfs4.COMPOUND4res, bytes]:
        self.xid += 1
        call = rpc_call(conn, compound_call(self.xid, ops, cred, tag=b"t", minor=minor))
        out = Writer()
        pending = compound(self.state, call, out)  # runs synchronously unless I/O must wait
        if pending is not None:
            await pending
        data = out.flatten()
        return unpack(nfs4.dec_COMPOUND4res, data), data

    # -- the usual steps -------------------------------------------------------------------
    async def mount(self, conn: RpcConnection, owner: bytes = b"linux-client") -> bytes:
        res, _ = await self.call(conn, [op_exchange_id(owner)])
        assert res.status == OK
        eir = resok(res, 0)
        res, _ = await self.call(conn, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
        assert res.status == OK
        sessionid: bytes = resok(res, 0).csr_sessionid
        return sessionid


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    export = tmp_path / "export"
    export.mkdir()
    vfs = LocalVfs(Export(root=str(export), state_dir=str(tmp_path / "state")))
    cfg = ServerConfig(lease_time=30, slots=8, max_response_size_cached=8192)
    srv = Server(None)  # type: ignore[arg-type]
    sessions = ServerSessions.from_config(cfg, on_client_expired=srv.expired.append)
    srv.state = ServerState(cfg, vfs, sessions, StateManager(vfs))
    yield srv
    srv.state.close()


async def test_mount_sequence_like_linux(server: Server) -> None:
    conn = server.connection()
    res, _ = await server.call(conn, [op_exchange_id(b"Linux NFSv4.1 host")])
    assert statuses(res) == [OK]
    eir = resok(res, 0)
    assert eir.eir_flags & nfs4.EXCHGID4_FLAG_USE_NON_PNFS
    assert not eir.eir_flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R
    res, _ = await server.call(conn, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
    assert statuses(res) == [OK]
    csr = resok(res, 0)
    # UL-33..UL-36 as seen on the wire.
    assert csr.csr_flags == nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    assert csr.csr_fore_chan_attrs == nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 8, [])
    assert csr.csr_back_chan_attrs == nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, [])
    res, _ = await server.call(conn, [op_sequence(csr.csr_sessionid, 1), op_reclaim_complete()])
    assert statuses(res) == [OK, OK]
    sr = resok(res, 0)
    assert (sr.sr_slotid, sr.sr_highest_slotid, sr.sr_status_flags) == (0, 7, 0)
    # The second EXCHANGE_ID of a mount finds the confirmed record.
    res, _ = await server.call(conn, [op_exchange_id(b"Linux NFSv4.1 host")])
    assert resok(res, 0).eir_flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R


async def test_ss7_replay_answers_from_the_cache_byte_for_byte(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    ops = [op_sequence(sid, 1), op_reclaim_complete()]
    first, first_bytes = await server.call(conn, ops)
    assert statuses(first) == [OK, OK]
    # Resent on a new connection (SS-13): executed once, the same reply.
    _, again_bytes = await server.call(server.connection("reconnected"), ops)
    assert again_bytes == first_bytes
    # RECLAIM_COMPLETE really ran once: a new request gets COMPLETE_ALREADY.
    res, _ = await server.call(conn, [op_sequence(sid, 2), op_reclaim_complete()])
    assert statuses(res) == [OK, nfs4.NFS4ERR_COMPLETE_ALREADY]
    assert res.status == nfs4.NFS4ERR_COMPLETE_ALREADY


async def test_ss7_retry_of_an_uncached_request(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    ops = [op_sequence(sid, 1, cachethis=False), op_reclaim_complete()]
    res, _ = await server.call(conn, ops)
    assert statuses(res) == [OK, OK]
    res, _ = await server.call(conn, ops)
    assert statuses(res) == [OK, nfs4.NFS4ERR_RETRY_UNCACHED_REP]
    assert res.status == nfs4.NFS4ERR_RETRY_UNCACHED_REP
    res, _ = await server.call(conn, [op_sequence(sid, 2)])
    assert statuses(res) == [OK]


async def test_slot_is_released_when_a_later_operation_fails(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    res, _ = await server.call(conn, [op_sequence(sid, 1), op_reclaim_complete(one_fs=True)])
    assert statuses(res) == [OK, nfs4.NFS4ERR_NOFILEHANDLE]
    res, _ = await server.call(conn, [op_sequence(sid, 2)])
    assert statuses(res) == [OK]
    session = server.sessions.session(sid)
    assert session is not None and session.slots.busy == 0


async def test_sequence_errors_on_the_wire(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    res, _ = await server.call(conn, [op_sequence(sid, 2)])
    assert res.status == nfs4.NFS4ERR_SEQ_MISORDERED and statuses(res) == [res.status]
    res, _ = await server.call(conn, [op_sequence(sid, 1, slot=8)])
    assert res.status == nfs4.NFS4ERR_BADSLOT
    res, _ = await server.call(conn, [op_sequence(b"\0" * 16, 1)])
    assert res.status == nfs4.NFS4ERR_BADSESSION
    # ca_maxoperations is 8 (what the client asked): nine operations are too many (SS-27).
    res, _ = await server.call(conn, [op_sequence(sid, 1)] + [op_reclaim_complete()] * 8)
    assert res.status == nfs4.NFS4ERR_TOO_MANY_OPS and len(res.resarray) == 1


async def test_create_session_errors_on_the_wire(server: Server) -> None:
    conn = server.connection()
    res, _ = await server.call(conn, [op_create_session(0xDEAD, 1)])
    assert res.status == nfs4.NFS4ERR_STALE_CLIENTID
    res, _ = await server.call(conn, [op_exchange_id(b"someone")])
    eir = resok(res, 0)
    # Confirmed by another principal than the one that sent EXCHANGE_ID.
    res, _ = await server.call(
        conn, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)], cred=USER_CRED
    )
    assert res.status == nfs4.NFS4ERR_CLID_INUSE


async def test_exchange_id_collision_between_principals(server: Server) -> None:
    conn = server.connection()
    await server.mount(conn, owner=b"shared-owner")
    res, _ = await server.call(conn, [op_exchange_id(b"shared-owner")], cred=USER_CRED)
    assert res.status == nfs4.NFS4ERR_CLID_INUSE


async def test_bind_conn_to_session_alone_on_a_new_connection(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    other = server.connection("second")
    args = nfs4.BIND_CONN_TO_SESSION4args(sid, nfs4.CDFC4_BACK_OR_BOTH, True)
    res, _ = await server.call(other, [op(nfs4.OP_BIND_CONN_TO_SESSION, args)])
    assert res.status == OK
    assert resok(res, 0) == nfs4.BIND_CONN_TO_SESSION4resok(sid, nfs4.CDFS4_BOTH, False)
    # SS-11: not alone is refused by COMPOUND processing.
    res, _ = await server.call(
        other, [op(nfs4.OP_BIND_CONN_TO_SESSION, args), op_reclaim_complete()]
    )
    assert res.status == nfs4.NFS4ERR_NOT_ONLY_OP
    session = server.sessions.session(sid)
    assert session is not None
    server.sessions.connection_closed(other)
    assert server.sessions.callback_path(session.clientid) == (session, conn)


async def test_destroy_session_then_clientid(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    session = server.sessions.session(sid)
    assert session is not None
    clientid = session.clientid
    destroy = op(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(sid))
    # Its own session, not last: NOT_ONLY_OP.
    res, _ = await server.call(conn, [op_sequence(sid, 1), destroy, op_reclaim_complete()])
    assert statuses(res) == [OK, nfs4.NFS4ERR_NOT_ONLY_OP]
    res, _ = await server.call(conn, [op_sequence(sid, 2), destroy])
    assert statuses(res) == [OK, OK]
    res, _ = await server.call(conn, [op_sequence(sid, 3)])
    assert res.status == nfs4.NFS4ERR_BADSESSION
    dc = op(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(clientid))
    res, _ = await server.call(conn, [dc])
    assert res.status == OK
    assert server.expired == [clientid]
    res, _ = await server.call(conn, [dc])
    assert res.status == nfs4.NFS4ERR_STALE_CLIENTID


async def test_backchannel_ctl_on_the_wire(server: Server) -> None:
    conn = server.connection()
    sid = await server.mount(conn)
    args = nfs4.BACKCHANNEL_CTL4args(0x40000007, [nfs4.callback_sec_parms4(0)])
    res, _ = await server.call(conn, [op_sequence(sid, 1), op(nfs4.OP_BACKCHANNEL_CTL, args)])
    assert statuses(res) == [OK, OK]
    session = server.sessions.session(sid)
    assert session is not None and session.cb_program == 0x40000007
