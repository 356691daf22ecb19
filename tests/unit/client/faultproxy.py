"""A TCP proxy between the client and an NFS server that sees every RPC record and can break
things on purpose: drop a connection after the server executed a call (its reply is lost),
stop forwarding replies, inject a reply with an unknown XID, corrupt a reply, or answer a call
itself (NFS4ERR_DELAY storms).

Rules are plain callables run for each call and each reply; they return a ``Verdict``. Tests wait
for what the proxy saw by event: ``await proxy.until(lambda: ...)`` is re-checked after every call
and reply that passes through."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from nfsrdma.rpc import message
from nfsrdma.transport.tcp import RecordParser, frame
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import Reader, Writer, XdrError
from tests.unit.conditions import Changes


class Verdict(enum.Enum):
    FORWARD = "forward"
    DROP_CONNECTION = "drop"  # close both sides now (the record is not passed on)
    SWALLOW = "swallow"  # do not pass the record on


@dataclass
class Call:
    conn: int
    xid: int
    proc: int
    ops: list[int]  # nfs_opnum4 of each operation
    slot: int | None = None
    seqid: int | None = None
    args: nfs4.COMPOUND4args | None = None

    def has(self, op: int) -> bool:
        return op in self.ops


@dataclass
class Reply:
    conn: int
    xid: int
    call: Call | None
    res: nfs4.COMPOUND4res | None
    raw: bytes


@dataclass
class Rule:
    """``on_call(call, link)`` and ``on_reply(reply, link)``; either may be None."""

    on_call: Callable[[Call, Link], Verdict] | None = None
    on_reply: Callable[[Reply, Link], Verdict] | None = None


def parse_call(conn: int, rec: bytes) -> Call | None:
    try:
        xid, body, off = message.decode_call(Reader(rec))
    except XdrError:
        return None
    call = Call(conn, xid, body.proc, [])
    if body.prog == nfs4.NFS4_PROGRAM and body.proc == nfs4.NFSPROC4_COMPOUND:
        try:
            args, _ = nfs4.dec_COMPOUND4args(Reader(rec), off)
        except XdrError:
            return call
        call.args = args
        call.ops = [int(a.argop) for a in args.argarray]
        first = args.argarray[0].value if args.argarray else None
        if isinstance(first, nfs4.SEQUENCE4args):
            call.slot, call.seqid = first.sa_slotid, first.sa_sequenceid
    return call


def compound_reply(xid: int, res: nfs4.COMPOUND4res) -> bytes:
    w = Writer()
    message.encode_accepted(w, xid)
    nfs4.enc_COMPOUND4res(w, res)
    return w.flatten()


def sequence_error_reply(xid: int, status: int) -> bytes:
    """A COMPOUND reply whose SEQUENCE failed with ``status``."""
    res = nfs4.COMPOUND4res(
        nfs4.nfsstat4(status),
        b"",
        [nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.nfsstat4(status)))],
    )
    return compound_reply(xid, res)


class Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, cid: int, down: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.cid = cid
        self.down = down
        self.up: asyncio.StreamWriter | None = None
        self.calls: dict[int, Call] = {}
        self.frozen = False
        self.closed = False

    def to_client(self, rec: bytes) -> None:
        if not self.closed:
            self.down.writelines(frame([rec]))

    def to_server(self, rec: bytes) -> None:
        if not self.closed and self.up is not None:
            self.up.writelines(frame([rec]))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in (self.down, self.up):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.transport.abort()


@dataclass
class FaultProxy:
    upstream_port: int
    host: str = "127.0.0.1"
    rules: list[Rule] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    changes: Changes = field(default_factory=Changes)

    async def until(
        self, predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
    ) -> None:
        """Wait until ``predicate()`` holds, re-checked after every call and reply seen."""
        await self.changes.until(predicate, timeout=timeout, what=what)

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self.links:
            link.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t

    def freeze(self) -> None:
        """Stop passing replies on every connection open now (the server seems to hang)."""
        for link in self.links:
            link.frozen = True

    def find(self, op: int) -> list[Call]:
        return [c for c in self.calls if c.has(op)]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(self, next(self._ids), writer)
        self.links.append(link)
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            link.close()
            return
        link.up = up_w
        task = asyncio.current_task()
        other = asyncio.create_task(self._pump_replies(link, up_r))
        self._tasks.add(other)
        other.add_done_callback(self._tasks.discard)
        if task is not None:
            self._tasks.add(task)
        try:
            await self._pump_calls(link, reader)
        finally:
            link.close()
            if task is not None:
                self._tasks.discard(task)

    async def _pump_calls(self, link: Link, reader: asyncio.StreamReader) -> None:
        parser = RecordParser(64 << 20)
        while not link.closed:
            data = await reader.read(1 << 16)
            if not data:
                return
            for rec in parser.feed(data):
                call = parse_call(link.cid, rec)
                verdict = Verdict.FORWARD
                if call is not None:
                    self.calls.append(call)
                    link.calls[call.xid] = call
                    for rule in list(self.rules):
                        if rule.on_call is not None:
                            verdict = rule.on_call(call, link)
                            if verdict is not Verdict.FORWARD:
                                break
                if verdict is Verdict.DROP_CONNECTION:
                    link.close()
                    self.changes.notify()
                    return
                if verdict is Verdict.FORWARD:
                    link.to_server(rec)
                self.changes.notify()

    async def _pump_replies(self, link: Link, reader: asyncio.StreamReader) -> None:
        parser = RecordParser(64 << 20)
        try:
            while not link.closed:
                data = await reader.read(1 << 16)
                if not data:
                    link.close()
                    return
                for rec in parser.feed(data):
                    reply = self._parse_reply(link, rec)
                    self.replies.append(reply)
                    if link.frozen:
                        self.changes.notify()
                        continue
                    verdict = Verdict.FORWARD
                    for rule in list(self.rules):
                        if rule.on_reply is not None:
                            verdict = rule.on_reply(reply, link)
                            if verdict is not Verdict.FORWARD:
                                break
                    if verdict is Verdict.DROP_CONNECTION:
                        link.close()
                        self.changes.notify()
                        return
                    if verdict is Verdict.FORWARD:
                        link.to_client(rec)
                    self.changes.notify()
        except (ConnectionError, asyncio.IncompleteReadError):
            link.close()

    @staticmethod
    def _parse_reply(link: Link, rec: bytes) -> Reply:
        xid = int.from_bytes(rec[:4], "big") if len(rec) >= 4 else 0
        call = link.calls.get(xid)
        res = None
        try:
            header, off = message.decode_reply(Reader(rec))
            acc = header.accepted
            if (
                acc is not None
                and acc.reply_data.stat == rpc.SUCCESS
                and call is not None
                and call.proc == nfs4.NFSPROC4_COMPOUND
            ):
                res, _ = nfs4.dec_COMPOUND4res(Reader(rec), off)
        except XdrError:
            pass
        return Reply(link.cid, xid, call, res, rec)
