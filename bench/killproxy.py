"""A loopback TCP proxy that kills connections at chosen points of chosen NFSv4.1 operations.

Each connection through the proxy is parsed record by record (record marking, then the RPC
call header and the COMPOUND's operation codes). An armed ``Kill`` names the operations it
waits for and where to strike:

- ``before``: the call never reaches the server;
- ``partial``: part of the call's record reaches the server (the mark and some of its bytes);
- ``after``: the call reaches the server, which executes it; its reply is dropped;
- ``race``: the call reaches the server and the connection dies a moment later, racing the
  execution and the reply.

Both sides of the connection are then aborted. The proxy keeps accepting: the client
reconnects through it and resends."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from dataclasses import dataclass, field

from nfsrdma.rpc import message
from nfsrdma.transport.tcp import LAST_FRAGMENT, RecordParser
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, XdrError

MODES = ("before", "partial", "after", "race")
_U32 = struct.Struct(">I")


def compound_ops(rec: bytes) -> list[int]:
    """The operation codes of a COMPOUND call ([] for anything else)."""
    try:
        _xid, body, off = message.decode_call(Reader(rec))
        if body.prog != nfs4.NFS4_PROGRAM or body.proc != nfs4.NFSPROC4_COMPOUND:
            return []
        args, _ = nfs4.dec_COMPOUND4args(Reader(rec), off)
    except XdrError:
        return []
    return [int(a.argop) for a in args.argarray]


@dataclass
class Kill:
    ops: frozenset[int]
    mode: str
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False  # disarmed: a pending "race" strike is called off
    xid: int | None = None  # the call it struck
    op: int | None = None


class Pipe:
    def __init__(
        self, proxy: KillProxy, down: asyncio.StreamWriter, up: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.down = down
        self.up = up
        self.dead = False
        self.await_reply: int | None = None  # "after": kill when this XID's reply comes

    def kill(self) -> None:
        if self.dead:
            return
        self.dead = True
        for w in (self.down, self.up):
            with contextlib.suppress(Exception):
                w.transport.abort()


class KillProxy:
    def __init__(self, upstream_host: str, upstream_port: int, seed: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rng = random.Random(seed)
        self.armed: Kill | None = None
        self.kills = 0
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[Pipe] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> KillProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for p in list(self._pipes):
            p.kill()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t

    def arm(self, ops: set[int], mode: str) -> Kill:
        self.armed = Kill(frozenset(ops), mode)
        return self.armed

    def disarm(self) -> None:
        if self.armed is not None:
            self.armed.cancelled = True
        self.armed = None

    def _fire(self, pipe: Pipe, kill: Kill) -> None:
        if kill.cancelled:
            return
        if self.armed is kill:
            self.armed = None
        if not kill.fired.is_set():
            self.kills += 1
            kill.fired.set()
        pipe.kill()

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pipe = Pipe(self, writer, up_w)
        self._pipes.add(pipe)
        self._spawn(self._replies(pipe, up_r))
        try:
            await self._calls(pipe, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            pipe.kill()
            self._pipes.discard(pipe)

    async def _calls(self, pipe: Pipe, reader: asyncio.StreamReader) -> None:
        parser = RecordParser(64 << 20)
        while not pipe.dead:
            data = await reader.read(1 << 16)
            if not data:
                return
            for rec in parser.feed(data):
                if pipe.dead:
                    return
                framed = _U32.pack(LAST_FRAGMENT | len(rec)) + rec
                kill = self.armed
                hit = None
                if kill is not None and not kill.fired.is_set():
                    hit = next((o for o in compound_ops(rec) if o in kill.ops), None)
                if hit is None or kill is None:
                    pipe.up.write(framed)
                    continue
                kill.xid, kill.op = _U32.unpack_from(rec)[0], hit
                if kill.mode == "before":
                    self._fire(pipe, kill)
                elif kill.mode == "partial":
                    cut = self.rng.randrange(1, len(framed))
                    pipe.up.write(framed[:cut])
                    with contextlib.suppress(ConnectionError):
                        await pipe.up.drain()
                    self._fire(pipe, kill)
                elif kill.mode == "after":
                    pipe.await_reply = kill.xid
                    pipe.up.write(framed)
                else:  # race
                    pipe.up.write(framed)
                    with contextlib.suppress(ConnectionError):
                        await pipe.up.drain()
                    await asyncio.sleep(self.rng.random() * 0.004)
                    if not kill.cancelled:
                        self._fire(pipe, kill)

    async def _replies(self, pipe: Pipe, reader: asyncio.StreamReader) -> None:
        parser = RecordParser(64 << 20)
        try:
            while not pipe.dead:
                data = await reader.read(1 << 16)
                if not data:
                    pipe.kill()
                    return
                for rec in parser.feed(data):
                    if pipe.dead:
                        return
                    xid = _U32.unpack_from(rec)[0] if len(rec) >= 4 else None
                    kill = self.armed
                    if pipe.await_reply is not None and xid == pipe.await_reply:
                        pipe.await_reply = None
                        if kill is not None:
                            self._fire(pipe, kill)
                            return
                    pipe.down.write(_U32.pack(LAST_FRAGMENT | len(rec)) + rec)
        except (ConnectionError, asyncio.IncompleteReadError):
            pipe.kill()
