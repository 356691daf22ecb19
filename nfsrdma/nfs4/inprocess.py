"""The server's COMPOUND processing driven in process, for tests and benchmarks: no transport,
no socket. ``local_state`` builds a server (``ServerState``) over a local export directory;
``CompoundDriver`` encodes RPC calls as a client would, hands them to ``compound`` as the RPC
layer does (on a connection with nothing behind it) and gives back the reply's bytes or its
decoded COMPOUND4res; ``mount`` takes the usual first steps (EXCHANGE_ID, CREATE_SESSION,
RECLAIM_COMPLETE, the root's filehandle) and ``sequence`` numbers the requests of one slot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from nfsrdma.nfs4.compound import compound
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc import message
from nfsrdma.rpc.auth import auth_sys, credential_of
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import RpcCall
from nfsrdma.session.server import ServerSessions
from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation
from nfsrdma.vfs import Export, LocalVfs
from nfsrdma.vfs.base import Vfs
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import Reader, Writer, unpack

ROOT_CRED = auth_sys(0, 0, (), "client-host")  # AUTH_SYS root, the drivers' default caller
# The fore channel a mount asks for: 1 MiB requests and replies, 3428 octets cached, 64 slots.
FORE_CHANNEL = nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 64, [])
BACK_CHANNEL = nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, [])


class MemoryConnection(Connection):
    """A transport connection with nothing behind it: the COMPOUND layer needs only its
    identity (its peer's address and its kind)."""

    kind = "mem"

    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        raise ConnectionError("no peer")

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        pass

    def close(self) -> None:
        self._closed(None)


class CompoundFailed(Exception):
    """A set-up COMPOUND (``CompoundDriver.result``) did not succeed."""

    def __init__(self, status: int) -> None:
        super().__init__(nfs4.nfsstat4(status).name)
        self.status = status


def resok(res: nfs4.COMPOUND4res, i: int) -> Any:
    """The successful result of operation ``i`` of a COMPOUND's reply (its resok4 arm)."""
    result: Any = res.resarray[i].value
    return result.value


def argop(num: int, args: Any = None) -> nfs4.nfs_argop4:
    """One operation of a COMPOUND's argarray."""
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


def local_state(
    root: Path,
    *,
    config: ServerConfig | None = None,
    vfs: Vfs | None = None,
    watch_moves: bool = True,
    root_squash: bool = False,
    random_bytes: Callable[[int], bytes] | None = None,
    instance: bytes | None = None,
    on_client_expired: Callable[[int], None] | None = None,
) -> ServerState:
    """A server over ``vfs``, by default a local export of ``root``/export (which must exist),
    root squashed or not, its state in ``root``/state. ``random_bytes`` (session ids) and
    ``instance`` (stateids) make two servers built alike answer alike."""
    if vfs is None:
        vfs = LocalVfs(
            Export(
                root=str(root / "export"), state_dir=str(root / "state"), root_squash=root_squash
            ),
            watch_moves=watch_moves,
        )
    cfg = config or ServerConfig()
    extra: dict[str, object] = {} if random_bytes is None else {"random_bytes": random_bytes}
    sessions = ServerSessions.from_config(
        cfg, on_client_expired=on_client_expired or (lambda _c: None), **extra
    )
    return ServerState(cfg, vfs, sessions, StateManager(vfs, instance=instance))


def compound_call(
    xid: int,
    ops: list[nfs4.nfs_argop4],
    cred: rpc.opaque_auth = ROOT_CRED,
    *,
    tag: bytes = b"",
    minor: int = 1,
) -> bytes:
    """An encoded NFSPROC4_COMPOUND call of ``ops``, as a client sends it."""
    w = Writer()
    message.encode_call(w, xid, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, cred)
    nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(tag, minor, ops))
    return bytes(w.flatten())


def rpc_call(conn: RpcConnection, data: bytes) -> RpcCall:
    """An encoded RPC CALL as the RPC layer hands it to its procedure, on ``conn``."""
    reader = Reader(data)
    xid, body, off = message.decode_call(reader)
    return RpcCall(
        xid,
        body.prog,
        body.vers,
        body.proc,
        credential_of(body.cred, body.verf),
        reader,
        off,
        conn,
        Inbound(reader),
    )


class CompoundDriver:
    """Calls into one server's COMPOUND processing, from one client connection."""

    def __init__(
        self, state: ServerState, peer: str = "peer", cred: rpc.opaque_auth = ROOT_CRED
    ) -> None:
        self.state = state
        self.conn = RpcConnection(MemoryConnection(peer))
        self.cred = cred
        self.xid = 0
        self.sessionid = b""
        self.seqid = 0  # slot 0's last sequence id (``sequence``)

    def request(
        self,
        ops: list[nfs4.nfs_argop4],
        cred: rpc.opaque_auth | None = None,
        *,
        tag: bytes = b"",
        minor: int = 1,
    ) -> bytes:
        """An encoded NFSPROC4_COMPOUND call of ``ops`` (the next xid; the driver's caller
        unless ``cred`` is given)."""
        self.xid += 1
        return compound_call(
            self.xid, ops, self.cred if cred is None else cred, tag=tag, minor=minor
        )

    async def send(self, data: bytes) -> Writer:
        """Run an encoded call's COMPOUND; its results (after no RPC reply header). Raises
        XdrError where the RPC layer would answer GARBAGE_ARGS."""
        out = Writer()
        pending = compound(self.state, rpc_call(self.conn, data), out)
        if pending is not None:  # an operation had to wait (the I/O thread pool)
            await pending
        return out

    async def call(
        self,
        ops: list[nfs4.nfs_argop4],
        cred: rpc.opaque_auth | None = None,
        *,
        tag: bytes = b"",
        minor: int = 1,
    ) -> nfs4.COMPOUND4res:
        """``ops`` run, the reply decoded (whatever its status)."""
        out = await self.send(self.request(ops, cred, tag=tag, minor=minor))
        return unpack(nfs4.dec_COMPOUND4res, out.flatten())

    async def result(self, ops: list[nfs4.nfs_argop4]) -> nfs4.COMPOUND4res:
        """``ops`` run, the reply decoded; CompoundFailed unless it is NFS4_OK."""
        res = await self.call(ops)
        if res.status != nfs4.NFS4_OK:
            raise CompoundFailed(res.status)
        return res

    async def mount(
        self,
        owner: bytes = b"in-process client",
        fore: nfs4.channel_attrs4 = FORE_CHANNEL,
        cb_program: int = 0x40000000,
    ) -> bytes:
        """A client ID and a session (no flags; ``cb_program``: the back channel's RPC
        program), RECLAIM_COMPLETE; the root's filehandle."""
        owner4 = nfs4.client_owner4(b"boot0001", owner)
        eia = nfs4.EXCHANGE_ID4args(owner4, 0, nfs4.state_protect4_a(nfs4.SP4_NONE), [])
        eir = resok(await self.result([argop(nfs4.OP_EXCHANGE_ID, eia)]), 0)
        csa = nfs4.CREATE_SESSION4args(
            eir.eir_clientid, eir.eir_sequenceid, 0, fore, BACK_CHANNEL, cb_program, []
        )
        csr = resok(await self.result([argop(nfs4.OP_CREATE_SESSION, csa)]), 0)
        self.sessionid = csr.csr_sessionid
        await self.result(
            [self.sequence(), argop(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False))]
        )
        root = await self.result([self.sequence(), argop(nfs4.OP_PUTROOTFH), argop(nfs4.OP_GETFH)])
        fh: bytes = resok(root, 2).object
        return fh

    def sequence(self, cachethis: bool = False) -> nfs4.nfs_argop4:
        """SEQUENCE on slot 0 with its next sequence id (every request runs: no replay)."""
        self.seqid += 1
        args = nfs4.SEQUENCE4args(self.sessionid, self.seqid, 0, 0, cachethis)
        return argop(nfs4.OP_SEQUENCE, args)
