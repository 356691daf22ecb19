"""What checks are given: fresh connections, a raw COMPOUND sender (any operations, any
bytes), sessions with explicit slot and seqid control, and a scratch directory under the
export. Every exchange a check makes is logged, so a failing check can show it decoded.

Built on the client library's lower layers: ``nfsrdma.client.transports`` connects (TCP or
RPC-over-RDMA), ``RpcConnection.call`` carries the RPC, the generated ``nfs4`` codec encodes
and decodes, ``nfsrdma.session.client_setup`` builds EXCHANGE_ID and CREATE_SESSION."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nfsrdma.client import ops
from nfsrdma.client.transports import open_connection
from nfsrdma.client.url import NfsUrl
from nfsrdma.conform.registry import Failed, Skipped
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.errors import RpcError, RpcTimeout
from nfsrdma.session.client_setup import (
    SessionOptions,
    back_channel_attrs,
    create_session_args,
    exchange_id_args,
    fore_channel_attrs,
)
from nfsrdma.transport.base import Connection, ReplyExpectation
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer, XdrError

Connector = Callable[[], Awaitable[Connection]]
# An RPC-over-RDMA connection provisioned as a check asks (an ``RdmaOptions``).
RdmaConnector = Callable[[Any], Awaitable[Connection]]
Op = nfs4.nfs_argop4
OK = nfs4.NFS4_OK
REPLY_SIZE = 256 << 10  # the largest reply a check expects (sessions ask for 64 KiB I/O)


def op(opnum: int, args: Any = None) -> Op:
    return Op(nfs4.nfs_opnum4(opnum), args)


def status_name(status: int) -> str:
    try:
        return nfs4.nfsstat4(status).name
    except ValueError:
        return str(status)


def op_name(opnum: int) -> str:
    try:
        return nfs4.nfs_opnum4(opnum).name.removeprefix("OP_")
    except ValueError:
        return f"op{opnum}"


def result_status(value: Any) -> int:
    """The nfsstat4 of one operation's result (its first field)."""
    return int(getattr(value, dataclasses.fields(value)[0].name))


@dataclass(slots=True)
class Exchange:
    """One COMPOUND and what came back, for the failure report."""

    transport: str
    ops: list[Op] | None  # None when the arguments were hand-made bytes
    note: str = ""
    res: nfs4.COMPOUND4res | None = None
    error: str = ""
    transport_error: BaseException | None = None  # what the transport raised, if it failed


@dataclass(slots=True)
class WireRecord:
    """One message as it crossed a connection (for checks that look at transport headers,
    and for ``--trace``): TCP stream bytes, or one whole RPC-over-RDMA Send."""

    conn: int  # the harness's number for the connection
    outbound: bool
    data: bytes
    at: float  # time.time()


@dataclass(slots=True)
class Reply:
    res: nfs4.COMPOUND4res
    body: bytes  # the COMPOUND4res bytes as received (after the RPC reply header)

    @property
    def status(self) -> int:
        return int(self.res.status)

    @property
    def statuses(self) -> list[int]:
        return [result_status(r.value) for r in self.res.resarray]

    def resok(self, i: int) -> Any:
        """Operation ``i``'s resok; Failed if it is missing or did not succeed."""
        if i >= len(self.res.resarray):
            raise Failed(f"a result for operation {i}", f"{len(self.res.resarray)} results")
        value = self.res.resarray[i].value
        st = result_status(value)
        if st != OK:
            name = op_name(self.res.resarray[i].resop)
            raise Failed(f"{name} NFS4_OK", status_name(st))
        return getattr(value, "value", value) if value is not None else None

    def expect(self, *statuses: int, what: str = "") -> None:
        """The per-operation statuses must be exactly ``statuses``."""
        if self.statuses != list(statuses):
            raise Failed(
                (what + ": " if what else "") + _names(list(statuses)), _names(self.statuses)
            )

    def expect_status(self, *allowed: int, what: str = "") -> None:
        """The COMPOUND status must be one of ``allowed``."""
        if self.status not in allowed:
            exp = " or ".join(status_name(s) for s in allowed)
            raise Failed((what + ": " if what else "") + exp, _names(self.statuses))


def _names(statuses: list[int]) -> str:
    return (
        "[" + ", ".join(status_name(s) for s in statuses) + "]" if statuses else "[] (no results)"
    )


class Conn:
    """One transport connection carrying raw COMPOUNDs."""

    def __init__(self, h: Harness, rpc: RpcConnection) -> None:
        self.h = h
        self.rpc = rpc
        self.number = next(h._conn_numbers)
        wire = h.wire

        def tap(outbound: bool, data: bytes) -> None:
            wire.append(WireRecord(self.number, outbound, data, time.time()))

        rpc.conn.tap = tap

    def received(self) -> list[bytes]:
        """The messages this connection received so far (in this check)."""
        return [r.data for r in self.h.wire if r.conn == self.number and not r.outbound]

    async def compound(
        self, ops_: list[Op], *, tag: bytes = b"", minor: int = 1, note: str = "",
        sinks: list[memoryview] | None = None, reply_size: int | None = None,
    ) -> Reply:  # fmt: skip
        """``sinks``: buffers for DDP-eligible results (RPC-over-RDMA Write chunks of their
        size); ``reply_size``: the largest reply to provide for (a Reply chunk over RDMA)."""

        def encode(w: Writer) -> None:
            nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(tag, minor, ops_))

        expect = ReplyExpectation(list(sinks or []), reply_size or self.h.reply_size)
        return await self._call(encode, Exchange(self.h.transport, list(ops_), note), expect)

    async def compound_raw(self, encode: Callable[[Writer], None], note: str) -> Reply:
        """A COMPOUND whose arguments ``encode`` writes as it likes (invalid ones included)."""
        return await self._call(encode, Exchange(self.h.transport, None, note))

    async def _call(
        self,
        encode: Callable[[Writer], None],
        x: Exchange,
        expect: ReplyExpectation | None = None,
    ) -> Reply:
        self.h.log.append(x)
        try:
            r = await self.rpc.call(
                nfs4.NFS4_PROGRAM,
                nfs4.NFS_V4,
                nfs4.NFSPROC4_COMPOUND,
                encode,
                cred=self.h.cred,
                timeout=self.h.timeout,
                # RPC-over-RDMA: room for a large reply (a Reply chunk); TCP ignores it.
                expect=expect or ReplyExpectation([], self.h.reply_size),
            )
        except RpcTimeout:
            x.error = f"no reply in {self.h.timeout} s"
            raise Failed(f"a reply within {self.h.timeout} s", "no reply") from None
        except (RpcError, ConnectionError, XdrError) as e:
            x.error = f"{type(e).__name__}: {e}"
            x.transport_error = e
            raise Failed("a COMPOUND reply", x.error) from None
        body = bytes(r.reader.buf[r.offset :])
        try:
            res, _ = nfs4.dec_COMPOUND4res(r.reader, r.offset)
        except XdrError as e:
            x.error = f"undecodable COMPOUND4res: {e}"
            raise Failed("a well-formed COMPOUND4res", x.error) from None
        x.res = res
        return Reply(res, body)

    async def null(self) -> None:
        await self.rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=self.h.timeout)

    def close(self) -> None:
        self.rpc.close()

    async def closed(self) -> None:
        self.close()
        await self.rpc.closed.wait()


@dataclass(slots=True)
class Client:
    """A client ID from EXCHANGE_ID."""

    owner: bytes
    verifier: bytes
    clientid: int
    sequenceid: int  # eir_sequenceid: the csa_sequence the first CREATE_SESSION uses
    flags: int


@dataclass
class Session:
    """A session: its ID, what the server granted, and the seqid each slot used last."""

    h: Harness
    conn: Conn
    client: Client
    sessionid: bytes
    fore: nfs4.channel_attrs4
    back: nfs4.channel_attrs4
    flags: int
    seqids: dict[int, int] = field(default_factory=dict)
    destroyed: bool = False

    @property
    def slots(self) -> int:
        return int(self.fore.ca_maxrequests)

    def next_seqid(self, slot: int = 0) -> int:
        return (self.seqids.get(slot, 0) + 1) & 0xFFFFFFFF

    def sequence(
        self, slot: int = 0, seqid: int | None = None, *, cachethis: bool = False,
        highest: int | None = None, sessionid: bytes | None = None,
    ) -> Op:  # fmt: skip
        return op(
            nfs4.OP_SEQUENCE,
            nfs4.SEQUENCE4args(
                self.sessionid if sessionid is None else sessionid,
                self.next_seqid(slot) if seqid is None else seqid,
                slot,
                slot if highest is None else highest,
                cachethis,
            ),
        )

    async def call(
        self, ops_: list[Op], *, slot: int = 0, seqid: int | None = None,
        cachethis: bool = False, conn: Conn | None = None, note: str = "",
    ) -> Reply:  # fmt: skip
        """SEQUENCE on ``slot`` (the next seqid unless given) then ``ops_``. The slot's seqid
        advances when the server accepted a new request."""
        seq = self.sequence(slot, seqid, cachethis=cachethis)
        args = seq.value
        assert isinstance(args, nfs4.SEQUENCE4args)
        r = await (conn or self.conn).compound([seq, *ops_], note=note)
        if (
            r.res.resarray
            and r.res.resarray[0].resop == nfs4.OP_SEQUENCE
            and r.statuses[0] == OK
            and args.sa_sequenceid == self.next_seqid(slot)
        ):
            self.seqids[slot] = args.sa_sequenceid
        return r

    async def reclaim_complete(self) -> None:
        """RECLAIM_COMPLETE for the whole client, on the highest slot (its result is not
        checked: NFS4ERR_COMPLETE_ALREADY is as good)."""
        rc = op(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False))
        r = await self.call([rc], slot=max(0, self.slots - 1), note="RECLAIM_COMPLETE")
        if r.statuses[:1] != [OK]:
            raise Failed("SEQUENCE NFS4_OK before RECLAIM_COMPLETE", _names(r.statuses))

    async def ok(self, ops_: list[Op], **kw: Any) -> Reply:
        """``call``, and every operation must succeed."""
        r = await self.call(ops_, **kw)
        if r.status != OK:
            raise Failed("NFS4_OK for every operation", _names(r.statuses))
        return r

    async def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        conn = self.conn
        if conn.rpc.conn.closed:
            conn = await self.h.connect()
        await conn.compound(
            [op(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(self.sessionid))]
        )


class Harness:
    """One per run; ``begin``/``end`` bracket each check (``end`` drops what it made)."""

    def __init__(
        self,
        url: NfsUrl,
        *,
        connector: Connector | None = None,
        rdma_connector: RdmaConnector | None = None,
        uid: int = 0,
        gid: int = 0,
        timeout: float = 10.0,
    ) -> None:
        self.url = url
        self.transport = url.transport
        self._rdma_connector = rdma_connector or _url_rdma_connector(url)
        # RPC-over-RDMA v1 as RFC 8166 defines it: no rtrext extension offered.
        self._connector: Connector = connector or (
            (lambda: self._rdma_connector(None))
            if url.transport == "rdma"
            else (lambda: open_connection(url))
        )
        self.cred = auth_sys(uid, gid, (), "nfsrdma-conform")
        self.uid = uid
        self.gid = gid
        self.timeout = timeout
        self.reply_size = REPLY_SIZE
        self.log: list[Exchange] = []
        self.wire: list[WireRecord] = []  # this check's messages, every connection
        self._conn_numbers = itertools.count(1)
        self._conns: list[Conn] = []
        self._sessions: list[Session] = []
        self._clients: list[Client] = []
        self._names = itertools.count(1)
        self._run_id = f"{socket.gethostname()[:40]}.{os.getpid()}.{os.urandom(4).hex()}"
        self._scratch: tuple[str, bytes] | None = None
        self._service: Session | None = None

    # -- per check ----------------------------------------------------------------------------
    def begin(self) -> None:
        self.log = []
        self.wire.clear()

    async def end(self) -> None:
        """Destroy the sessions and client IDs the check made, close its connections."""
        sessions, self._sessions = self._sessions, []
        clients, self._clients = self._clients, []
        conns, self._conns = self._conns, []
        log = self.log
        with contextlib.suppress(Exception):
            for s in sessions:
                with contextlib.suppress(Failed):
                    await s.destroy()
            if clients:
                conn = await self.connect()
                for client in clients:
                    with contextlib.suppress(Failed):
                        await conn.compound(
                            [
                                op(
                                    nfs4.OP_DESTROY_CLIENTID,
                                    nfs4.DESTROY_CLIENTID4args(client.clientid),
                                )
                            ]
                        )
        conns += self._conns  # opened by the clean-up itself
        self._conns = []
        for c in conns:
            c.close()
        self.log = log  # clean-up exchanges are not the check's
        self.wire.clear()

    def name(self, what: str = "f") -> bytes:
        """A fresh file name for the scratch directory."""
        return f"{what}{next(self._names)}".encode()

    # -- building blocks ----------------------------------------------------------------------
    async def connect(self, options: Any = None) -> Conn:
        """A new connection; ``options`` (an ``RdmaOptions``) provisions an RPC-over-RDMA one
        as a check needs (its inline size, hence the private data it sends)."""
        try:
            if options is not None:
                conn = await self._rdma_connector(options)
            else:
                conn = await self._connector()
        except OSError as e:
            raise Failed(f"a connection to {self.url}", f"{type(e).__name__}: {e}") from None
        c = Conn(self, RpcConnection(conn))
        self._conns.append(c)
        return c

    def track(self, s: Session) -> Session:
        """Have a session a check made by hand destroyed after the check."""
        self._sessions.append(s)
        return s

    def owner(self) -> bytes:
        return f"nfsrdma-conform/{self._run_id}/{next(self._names)}".encode()

    async def exchange_id(
        self, conn: Conn | None = None, *, owner: bytes | None = None,
        verifier: bytes | None = None, flags: int = 0,
    ) -> tuple[Client, Reply]:  # fmt: skip
        conn = conn or await self.connect()
        owner = owner or self.owner()
        verifier = verifier or os.urandom(8)
        args = exchange_id_args(owner, verifier)
        args.eia_flags = flags
        r = await conn.compound([op(nfs4.OP_EXCHANGE_ID, args)])
        eir = r.resok(0)
        c = Client(owner, verifier, eir.eir_clientid, eir.eir_sequenceid, eir.eir_flags)
        if all(x.clientid != c.clientid for x in self._clients):
            self._clients.append(c)
        return c, r

    def session_options(self, **kw: Any) -> SessionOptions:
        kw.setdefault("backchannel", False)
        kw.setdefault("slots", 8)
        kw.setdefault("rsize", 64 << 10)
        kw.setdefault("wsize", 64 << 10)
        kw.setdefault("max_response_size_cached", 4096)
        kw.setdefault("max_operations", 16)
        return SessionOptions(uid=self.uid, gid=self.gid, owner=b"unused", **kw)

    def create_session_args(
        self, client: Client, sequence: int | None = None, **kw: Any
    ) -> nfs4.CREATE_SESSION4args:
        opts = self.session_options(**kw)
        seq = client.sequenceid if sequence is None else sequence
        args = create_session_args(opts, client.clientid, seq)
        args.csa_fore_chan_attrs = fore_channel_attrs(opts)
        args.csa_back_chan_attrs = back_channel_attrs(opts)
        return args

    async def session(
        self,
        conn: Conn | None = None,
        client: Client | None = None,
        *,
        reclaim_complete: bool = True,
        **kw: Any,
    ) -> Session:
        """A new client ID (unless given) and a session on ``conn`` (a new connection unless
        given). ``kw`` are SessionOptions fields (slots, rsize, max_response_size_cached...).
        Like any client, it then sends RECLAIM_COMPLETE (RFC 8881 §18.51: until then a
        server may refuse OPEN with NFS4ERR_GRACE), on the session's highest slot so that
        slot 0 is still unused."""
        conn = conn or await self.connect()
        if client is None:
            client, _ = await self.exchange_id(conn)
        args = self.create_session_args(client, **kw)
        r = await conn.compound([op(nfs4.OP_CREATE_SESSION, args)])
        res = r.resok(0)
        client.sequenceid += 1
        s = Session(
            self, conn, client, res.csr_sessionid, res.csr_fore_chan_attrs,
            res.csr_back_chan_attrs, res.csr_flags,
        )  # fmt: skip
        self._sessions.append(s)
        if reclaim_complete:
            await s.reclaim_complete()
        return s

    # -- the export ---------------------------------------------------------------------------
    def export_lookups(self) -> list[Op]:
        """PUTROOTFH and a LOOKUP per component of the URL's path."""
        comps = [c for c in self.url.path.split("/") if c]
        return [ops.putrootfh(), *(ops.lookup(c.encode()) for c in comps)]

    async def _service_session(self) -> Session:
        """The harness's own session (scratch directory upkeep), kept across checks."""
        if self._service is None or self._service.conn.rpc.conn.closed:
            conn = await self.connect()
            self._conns.remove(conn)
            client, _ = await self.exchange_id(conn)
            self._clients.remove(client)
            s = await self.session(conn, client)
            self._sessions.remove(s)
            self._service = s
        return self._service

    async def scratch(self) -> bytes:
        """The file handle of this run's scratch directory (created under the export once)."""
        if self._scratch is None:
            s = await self._service_session()
            name = f"conform-{self._run_id}".encode()
            r = await s.call(
                [*self.export_lookups(), ops.create(nfs4.NF4DIR, name, {nfs4.FATTR4_MODE: 0o777}),
                 ops.getfh()],
                note="make the scratch directory",
            )  # fmt: skip
            if r.status != OK:
                raise Skipped(
                    f"cannot create a scratch directory under {self.url.path}: {_names(r.statuses)}"
                )
            self._scratch = (name.decode(), r.resok(len(r.statuses) - 1).object)
        return self._scratch[1]

    async def aclose(self) -> None:
        """Remove the scratch directory (and what checks left in it), end the service
        session. A fresh session does it: the first may have outlived its lease."""
        old, self._service = self._service, None
        if old is None:
            return
        await self._end_service(old)
        if self._scratch is None:
            return
        with contextlib.suppress(Exception):
            s = await self._service_session()
            with contextlib.suppress(Exception):
                await self._remove_tree(s, self._scratch[1])
                await s.call([*self.export_lookups(), ops.remove(self._scratch[0].encode())])
            await self._end_service(s)
        self._service = None

    async def _end_service(self, s: Session) -> None:
        with contextlib.suppress(Exception):
            await s.destroy()
            await s.conn.compound(
                [op(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(s.client.clientid))]
            )
        s.conn.close()

    async def _remove_tree(self, s: Session, fh: bytes) -> None:
        r = await s.call(
            [ops.putfh(fh), ops.readdir(0, bytes(8), 8192, 32768, (nfs4.FATTR4_TYPE,))]
        )
        if r.status != OK:
            return
        for entry in r.resok(2).reply.entries:
            sub = await s.call([ops.putfh(fh), ops.lookup(entry.name), ops.getfh()])
            if sub.status == OK and _is_dir(entry.attrs):
                await self._remove_tree(s, sub.resok(3).object)
            await s.call([ops.putfh(fh), ops.remove(entry.name)])


def _url_rdma_connector(url: NfsUrl) -> RdmaConnector:
    async def connect(options: Any) -> Connection:
        from nfsrdma.client.transports import connect_rdma
        from nfsrdma.transport.rdma.connection_base import RdmaOptions

        return await connect_rdma(url.host, url.port, options=options or RdmaOptions(rtrext=False))

    return connect


def _is_dir(attrs: nfs4.fattr4) -> bool:
    from nfsrdma.client.attrs import decode_attrs

    try:
        return bool(decode_attrs(attrs).get(nfs4.FATTR4_TYPE) == nfs4.NF4DIR)
    except (XdrError, ValueError):
        return False
