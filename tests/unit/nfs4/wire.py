"""Several NFSv4.1 clients of one server through the real COMPOUND path, on a stopped clock.

Each :class:`Client` is its own client ID with its own session; every call goes through
``compound.py`` as bytes (the ``Server`` of ``tests/unit/session/test_ops_compound.py``), so the
session layer, the operation handlers, the state manager and the local VFS all run for real.
The server is wired as ``NFSServer.start`` wires it (lease expiry releases state, the session
layer asks the state layer which clients hold state). Time is a :class:`Clock` the tests move:
COMPOUND processing reads it as ``compound.time``, the lease reaper is ``reap(clock.now)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.nfs4 import compound as compound_module
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.session.server import ServerSessions, SessionCaps
from nfsrdma.vfs import Export, LocalVfs
from nfsrdma.vfs.resolver import HandleMode
from nfsrdma.xdr.gen import nfs4

from ..session.helpers import op, op_create_session, op_exchange_id, op_sequence, resok
from ..session.test_ops_compound import Server

OK = nfs4.NFS4_OK
LEASE = 30


class Clock:
    """The monotonic clock COMPOUND processing reads, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def install_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(compound_module, "monotonic", clock.monotonic)
    return clock


def build(
    tmp_path: Path,
    caps: SessionCaps | None = None,
    lease: int = LEASE,
    handle_mode: HandleMode = "auto",
) -> Server:
    export = tmp_path / "export"
    export.mkdir(parents=True)
    vfs = LocalVfs(
        Export(root=str(export), root_squash=False, state_dir=str(tmp_path / "state")),
        handle_mode=handle_mode,
    )
    cfg = ServerConfig(lease_time=lease, slots=8, max_response_size_cached=8192)
    state = StateManager(vfs)
    sessions = ServerSessions.from_config(
        cfg, on_client_expired=state.client_expired, has_state=state.client_has_state, caps=caps
    )
    return Server(ServerState(cfg, vfs, sessions, state))


def close(srv: Server) -> None:
    """Shut the server down and give this thread back the server's file-system identity."""
    srv.state.vfs.release_identity()
    srv.state.close()


def name_of(status: int) -> str:
    return nfs4.nfsstat4(status).name


def status_list(res: nfs4.COMPOUND4res) -> list[str]:
    """``OP_NAME:STATUS`` of each result, for assertion messages."""
    out = []
    for r in res.resarray:
        v: Any = r.value
        out.append(f"{r.resop.name}:{name_of(getattr(v, dataclasses.fields(v)[0].name))}")
    return out


class Client:
    """One client ID and session; ``call`` prepends SEQUENCE with the next seqid of slot 0."""

    def __init__(self, srv: Server, owner: bytes, host: str = "192.0.2.1", minor: int = 1) -> None:
        self.srv = srv
        self.minor = minor  # the minor version of every COMPOUND
        self.owner = owner
        self.conn: RpcConnection = srv.connection(f"{host}:{800 + len(owner)}")
        self.sessionid = b""
        self.clientid = 0
        self.seqid = 1

    async def mount(self) -> Client:
        res, _ = await self.srv.call(self.conn, [op_exchange_id(self.owner)], minor=self.minor)
        assert res.status == OK, status_list(res)
        eir = resok(res, 0)
        res, _ = await self.srv.call(
            self.conn, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)], minor=self.minor
        )
        assert res.status == OK, status_list(res)
        self.sessionid = resok(res, 0).csr_sessionid
        self.clientid = eir.eir_clientid
        self.seqid = 1
        await self.expect(OK, op(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False)))
        return self

    async def bare(self, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        """A COMPOUND without SEQUENCE (the sessionless operations)."""
        res, _ = await self.srv.call(self.conn, list(ops), minor=self.minor)
        return res

    async def call(self, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        seq = op_sequence(self.sessionid, self.seqid)
        self.seqid += 1
        res, _ = await self.srv.call(self.conn, [seq, *ops], minor=self.minor)
        return res

    async def expect(self, status: int, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        res = await self.call(*ops)
        assert name_of(res.status) == name_of(status), status_list(res)
        return res

    @staticmethod
    def value(res: nfs4.COMPOUND4res, i: int) -> Any:
        """The result body of operation ``i`` counting SEQUENCE as 0."""
        return getattr(res.resarray[i].value, "value", None)
