"""An in-memory NFSv4.1 server and transport for unit tests of the client session.

``FakeServer`` keeps client ids, sessions with a real per-slot reply cache (RFC 8881 2.10.6),
and just enough operations (RENAME counts executions, WRITE/READ a byte array, OPEN hands out
stateids). ``FakeConnection`` is a ``Connection`` whose calls go straight to the server; a
``fault`` hook decides per call: drop the connection before or after executing it, never
answer, answer NFS4ERR_DELAY, or send garbage. Tests wait for the server's state by event:
``await server.until(lambda: ...)`` resumes after the call, reply or callback that made it true."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nfsrdma.rpc import message
from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, Reader, Writer
from tests.unit.conditions import Changes

Fault = Callable[["FakeConnection", int, list[int]], str | None]


@dataclass
class FakeSlot:
    seqid: int = 0
    reply: nfs4.COMPOUND4res | None = None
    cached: bool = False


@dataclass
class FakeSession:
    sessionid: bytes
    clientid: int
    slots: list[FakeSlot]
    cb_program: int
    back: bool
    target: int


@dataclass
class FakeServer:
    max_slots: int = 64
    lease: int = 30
    target: int | None = None  # sr_target_highest_slotid (default: all slots)
    fault: Fault | None = None
    clients: dict[bytes, int] = field(default_factory=dict)  # owner -> clientid
    sessions: dict[bytes, FakeSession] = field(default_factory=dict)
    log: list[tuple[int, list[int], int | None, int | None]] = field(default_factory=list)
    renames: int = 0
    executed: list[list[int]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    delegreturns: list[nfs4.stateid4] = field(default_factory=list)
    callbacks: list[nfs4.CB_COMPOUND4res] = field(default_factory=list)
    connections: list[FakeConnection] = field(default_factory=list)
    hold: list[tuple[FakeConnection, int, bytes]] | None = None  # replies held back
    too_big_to_cache: bool = False  # RENAME with cachethis: NFS4ERR_REP_TOO_BIG_TO_CACHE
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    _stateids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    changes: Changes = field(default_factory=Changes)

    async def until(
        self, predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
    ) -> None:
        """Wait until ``predicate()`` holds, re-checked after every call, reply and callback."""
        await self.changes.until(predicate, timeout=timeout, what=what)

    # -- test controls -------------------------------------------------------------------------
    def connect(self) -> FakeConnection:
        conn = FakeConnection(self)
        self.connections.append(conn)
        return conn

    def forget_sessions(self) -> None:
        self.sessions.clear()

    def forget_clients(self) -> None:
        self.sessions.clear()
        self.clients.clear()

    def release_held(self) -> None:
        held, self.hold = self.hold or [], None
        for conn, _xid, reply in held:
            conn.deliver(reply)

    def ops_sent(self, op: int) -> list[tuple[int, list[int], int | None, int | None]]:
        return [e for e in self.log if op in e[1]]

    # -- calls -----------------------------------------------------------------------------------
    def on_call(self, conn: FakeConnection, data: bytes) -> None:
        try:
            self._on_call(conn, data)
        finally:
            self.changes.notify()

    def _on_call(self, conn: FakeConnection, data: bytes) -> None:
        r = Reader(data)
        xid, body, off = message.decode_call(r)
        if body.proc == 0:
            verdict = self.fault(conn, xid, []) if self.fault is not None else None
            if verdict != "silent":
                self._answer(conn, xid, None)
            return
        args, _ = nfs4.dec_COMPOUND4args(r, off)
        ops = [int(a.argop) for a in args.argarray]
        first = args.argarray[0].value if args.argarray else None
        slot = first.sa_slotid if isinstance(first, nfs4.SEQUENCE4args) else None
        seqid = first.sa_sequenceid if isinstance(first, nfs4.SEQUENCE4args) else None
        self.log.append((conn.cid, ops, slot, seqid))
        verdict = self.fault(conn, xid, ops) if self.fault is not None else None
        if verdict == "drop_before":
            conn.close()
            return
        if verdict == "silent":
            return
        if verdict == "delay":
            res = nfs4.COMPOUND4res(
                nfs4.NFS4ERR_DELAY,
                b"",
                [nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4ERR_DELAY))],
            )
            self._answer(conn, xid, res)
            return
        if verdict == "garbage":
            w = Writer()
            message.encode_accepted(w, xid)
            w += b"\xff\xff\xff\xff"
            conn.deliver(w.flatten())
            return
        res = self.compound(conn, args)
        if verdict == "drop_after":
            conn.close()
            return
        self._answer(conn, xid, res)

    def _answer(self, conn: FakeConnection, xid: int, res: nfs4.COMPOUND4res | None) -> None:
        w = Writer()
        message.encode_accepted(w, xid)
        if res is not None:
            nfs4.enc_COMPOUND4res(w, res)
        if self.hold is not None:
            self.hold.append((conn, xid, w.flatten()))
            return
        conn.deliver(w.flatten())

    def compound(self, conn: FakeConnection, args: nfs4.COMPOUND4args) -> nfs4.COMPOUND4res:
        res = nfs4.COMPOUND4res(nfs4.NFS4_OK, args.tag, [])
        ctx: dict[str, Any] = {"fh": None}
        slot: FakeSlot | None = None
        cachethis = False
        for i, a in enumerate(args.argarray):
            op = a.argop
            if op == nfs4.OP_SEQUENCE:
                sa = a.value
                assert isinstance(sa, nfs4.SEQUENCE4args) and i == 0
                sess = self.sessions.get(sa.sa_sessionid)
                if sess is None:
                    return self._fail(res, op, nfs4.SEQUENCE4res(nfs4.NFS4ERR_BADSESSION))
                if sa.sa_slotid >= len(sess.slots):
                    return self._fail(res, op, nfs4.SEQUENCE4res(nfs4.NFS4ERR_BADSLOT))
                s = sess.slots[sa.sa_slotid]
                if sa.sa_sequenceid == s.seqid:
                    if s.cached and s.reply is not None:
                        return s.reply
                    res.resarray.append(nfs4.nfs_resop4(op, self._seq_ok(sess, sa)))
                    if len(args.argarray) > 1:
                        nxt = args.argarray[1].argop
                        return self._fail(res, nxt, _err(nxt, nfs4.NFS4ERR_RETRY_UNCACHED_REP))
                    return res
                if sa.sa_sequenceid != (s.seqid + 1) & 0xFFFFFFFF:
                    return self._fail(res, op, nfs4.SEQUENCE4res(nfs4.NFS4ERR_SEQ_MISORDERED))
                s.seqid = sa.sa_sequenceid
                s.reply, s.cached = None, sa.sa_cachethis
                slot, cachethis = s, sa.sa_cachethis
                ctx["session"] = sess
                res.resarray.append(nfs4.nfs_resop4(op, self._seq_ok(sess, sa)))
                continue
            if op == nfs4.OP_RENAME and cachethis and self.too_big_to_cache:
                result = _err(op, nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE)  # not run
            else:
                result = self._op(conn, op, a.value, ctx)
            res.resarray.append(nfs4.nfs_resop4(op, result))
            status = getattr(result, dataclasses.fields(result)[0].name)
            if status != nfs4.NFS4_OK:
                res.status = status
                break
        self.executed.append([int(a.argop) for a in args.argarray])
        if slot is not None:
            slot.reply = res if cachethis else None
        return res

    def _seq_ok(self, sess: FakeSession, sa: nfs4.SEQUENCE4args) -> nfs4.SEQUENCE4res:
        n = len(sess.slots) - 1
        target = n if self.target is None else self.target
        return nfs4.SEQUENCE4res(
            nfs4.NFS4_OK,
            nfs4.SEQUENCE4resok(sa.sa_sessionid, sa.sa_sequenceid, sa.sa_slotid, n, target, 0),
        )

    @staticmethod
    def _fail(res: nfs4.COMPOUND4res, op: int, result: Any) -> nfs4.COMPOUND4res:
        res.resarray.append(nfs4.nfs_resop4(nfs4.nfs_opnum4(op), result))
        res.status = getattr(result, dataclasses.fields(result)[0].name)
        return res

    def _op(self, conn: FakeConnection, op: int, a: Any, ctx: dict[str, Any]) -> Any:
        if op == nfs4.OP_EXCHANGE_ID:
            owner = a.eia_clientowner.co_ownerid
            confirmed = owner in self.clients
            if not confirmed:
                self.clients[owner] = next(self._ids)
            flags = nfs4.EXCHGID4_FLAG_USE_NON_PNFS | (
                nfs4.EXCHGID4_FLAG_CONFIRMED_R if confirmed else 0
            )
            return nfs4.EXCHANGE_ID4res(
                nfs4.NFS4_OK,
                nfs4.EXCHANGE_ID4resok(
                    self.clients[owner],
                    1,
                    flags,
                    nfs4.state_protect4_r(nfs4.SP4_NONE),
                    nfs4.server_owner4(0, b"fake"),
                    b"fake",
                    [],
                ),
            )
        if op == nfs4.OP_CREATE_SESSION:
            if a.csa_clientid not in self.clients.values():
                return nfs4.CREATE_SESSION4res(nfs4.NFS4ERR_STALE_CLIENTID)
            fore = a.csa_fore_chan_attrs
            n = min(fore.ca_maxrequests, self.max_slots)
            sid = os.urandom(16)
            back = bool(a.csa_flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN)
            self.sessions[sid] = FakeSession(
                sid, a.csa_clientid, [FakeSlot() for _ in range(n)], a.csa_cb_program, back, n - 1
            )
            conn.session = sid
            granted = nfs4.channel_attrs4(
                0, fore.ca_maxrequestsize, fore.ca_maxresponsesize, 4096, 16, n, []
            )
            return nfs4.CREATE_SESSION4res(
                nfs4.NFS4_OK,
                nfs4.CREATE_SESSION4resok(
                    sid,
                    a.csa_sequence,
                    a.csa_flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
                    granted,
                    a.csa_back_chan_attrs,
                ),
            )
        if op == nfs4.OP_BIND_CONN_TO_SESSION:
            if a.bctsa_sessid not in self.sessions:
                return nfs4.BIND_CONN_TO_SESSION4res(nfs4.NFS4ERR_BADSESSION)
            conn.session = a.bctsa_sessid
            return nfs4.BIND_CONN_TO_SESSION4res(
                nfs4.NFS4_OK,
                nfs4.BIND_CONN_TO_SESSION4resok(a.bctsa_sessid, nfs4.CDFS4_BOTH, False),
            )
        if op == nfs4.OP_DESTROY_SESSION:
            self.sessions.pop(a.dsa_sessionid, None)
            return nfs4.DESTROY_SESSION4res(nfs4.NFS4_OK)
        if op == nfs4.OP_DESTROY_CLIENTID:
            return nfs4.DESTROY_CLIENTID4res(nfs4.NFS4_OK)
        if op == nfs4.OP_RECLAIM_COMPLETE:
            return nfs4.RECLAIM_COMPLETE4res(nfs4.NFS4_OK)
        if op in (nfs4.OP_PUTROOTFH,):
            ctx["fh"] = b"root"
            return nfs4.PUTROOTFH4res(nfs4.NFS4_OK)
        if op == nfs4.OP_PUTFH:
            ctx["fh"] = a.object
            return nfs4.PUTFH4res(nfs4.NFS4_OK)
        if op == nfs4.OP_GETFH:
            return nfs4.GETFH4res(nfs4.NFS4_OK, nfs4.GETFH4resok(ctx["fh"] or b"root"))
        if op == nfs4.OP_GETATTR:
            vals = U32.pack(self.lease) if a.attr_request == [1 << nfs4.FATTR4_LEASE_TIME] else b""
            mask = a.attr_request if vals else []
            return nfs4.GETATTR4res(nfs4.NFS4_OK, nfs4.GETATTR4resok(nfs4.fattr4(mask, vals)))
        if op == nfs4.OP_RENAME:
            self.renames += 1
            ci = nfs4.change_info4(True, 0, 1)
            return nfs4.RENAME4res(nfs4.NFS4_OK, nfs4.RENAME4resok(ci, ci))
        if op == nfs4.OP_WRITE:
            end = a.offset + len(a.data)
            if len(self.data) < end:
                self.data.extend(bytes(end - len(self.data)))
            self.data[a.offset : end] = a.data
            return nfs4.WRITE4res(
                nfs4.NFS4_OK, nfs4.WRITE4resok(len(a.data), nfs4.FILE_SYNC4, bytes(8))
            )
        if op == nfs4.OP_READ:
            chunk = bytes(self.data[a.offset : a.offset + a.count])
            eof = a.offset + len(chunk) >= len(self.data)
            return nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(eof, chunk))
        if op == nfs4.OP_OPEN:
            sid = nfs4.stateid4(1, next(self._stateids).to_bytes(12, "big"))
            deleg = nfs4.open_delegation4(nfs4.OPEN_DELEGATE_NONE)
            ctx.setdefault("claims", []).append(a.claim.claim)
            self.claims.append(a.claim.claim)
            return nfs4.OPEN4res(
                nfs4.NFS4_OK,
                nfs4.OPEN4resok(sid, nfs4.change_info4(True, 0, 1), 0, [], deleg),
            )
        if op == nfs4.OP_DELEGRETURN:
            self.delegreturns.append(a.deleg_stateid)
            return nfs4.DELEGRETURN4res(nfs4.NFS4_OK)
        return _err(op, nfs4.NFS4ERR_NOTSUPP)

    claims: list[int] = field(default_factory=list)

    # -- callbacks -------------------------------------------------------------------------------
    def callback(self, conn: FakeConnection, ops: list[nfs4.nfs_cb_argop4], seqid: int = 1) -> int:
        """Send CB_COMPOUND (CB_SEQUENCE on slot 0 first) on ``conn``; returns the xid."""
        sess = self.sessions[conn.session]
        seq = nfs4.CB_SEQUENCE4args(sess.sessionid, seqid, 0, 0, False, [])
        args = nfs4.CB_COMPOUND4args(
            b"", 1, 0, [nfs4.nfs_cb_argop4(nfs4.OP_CB_SEQUENCE, seq), *ops]
        )
        xid = next(self._ids)
        w = Writer()
        message.encode_call(w, xid, sess.cb_program, 1, nfs4.CB_COMPOUND, message.AUTH_NONE_VERF)
        nfs4.enc_CB_COMPOUND4args(w, args)
        conn.deliver(w.flatten())
        return xid

    def on_reply(self, conn: FakeConnection, data: bytes) -> None:
        _header, off = message.decode_reply(Reader(data))
        res, _ = nfs4.dec_CB_COMPOUND4res(Reader(data), off)
        self.callbacks.append(res)
        self.changes.notify()


def _err(op: int, status: int) -> Any:
    return nfs4.OPERATIONS.get(op, nfs4.OPERATION_ILLEGAL).error(status)


_cids = itertools.count(1)


class FakeConnection(Connection):
    kind = "fake"

    def __init__(self, server: FakeServer) -> None:
        super().__init__("fake")
        self.server = server
        self.cid = next(_cids)
        self.session: bytes = b""
        self.done: list[int] = []  # xids released by the requester (call_done)
        self.expectations: list[ReplyExpectation | None] = []

    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.expectations.append(expect)
        data = msg.flatten()
        asyncio.get_running_loop().call_soon(self.server.on_call, self, data)

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        self.server.on_reply(self, msg.flatten())

    def call_done(self, xid: int) -> None:
        self.done.append(xid)

    def deliver(self, data: bytes) -> None:
        if not self.closed:
            asyncio.get_running_loop().call_soon(self._deliver_now, data)

    def _deliver_now(self, data: bytes) -> None:
        if not self.closed:
            self._deliver(Inbound(Reader(data)))

    def close(self) -> None:
        if not self.closed:
            asyncio.get_running_loop().call_soon(self._closed, None)

    def abort(self) -> None:
        self._closed(ConnectionAbortedError("aborted"))
