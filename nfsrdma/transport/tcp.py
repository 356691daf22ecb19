"""ONC RPC over TCP with record marking (RFC 5531 section 11).

A record is a sequence of fragments, each behind a 4-byte mark: the high bit says "last
fragment", the other 31 bits give the fragment's length. Records larger than ``max_record``
close the connection that sent them (the listener keeps serving everyone else). Reading pauses
while the peer is not draining our replies, so a client cannot make us buffer without bound.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable

from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation
from nfsrdma.xdr.runtime import Reader, Writer

log = logging.getLogger(__name__)

LAST_FRAGMENT = 0x80000000
MAX_FRAGMENT = 0x7FFFFFFF
DEFAULT_MAX_RECORD = 4 << 20
_MARK = struct.Struct(">I")


class RecordTooLarge(ConnectionError):
    pass


class RecordParser:
    """Sans-IO record-marking decoder: feed bytes, get whole records."""

    def __init__(self, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.max_record = max_record
        self._buf = bytearray()
        self._parts: list[bytes] = []
        self._size = 0  # bytes of the record so far, in finished fragments

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Take received bytes; return the records they complete. Raises RecordTooLarge.

        With nothing pending, whole fragments are sliced straight out of ``data`` (one copy);
        only an incomplete tail waits in the parser's buffer."""
        buf = self._buf
        if not buf and isinstance(data, bytes):
            src: bytes | bytearray = data
        else:
            buf += data
            src = buf
        records: list[bytes] = []
        pos = 0
        end = len(src)
        while end - pos >= 4:
            (mark,) = _MARK.unpack_from(src, pos)
            n = mark & MAX_FRAGMENT
            if self._size + n > self.max_record:
                raise RecordTooLarge(
                    f"record of at least {self._size + n} bytes exceeds {self.max_record}"
                )
            if end - pos - 4 < n:
                break
            frag = bytes(src[pos + 4 : pos + 4 + n])
            pos += 4 + n
            if mark & LAST_FRAGMENT:
                if self._parts:
                    self._parts.append(frag)
                    frag = b"".join(self._parts)
                    self._parts = []
                    self._size = 0
                records.append(frag)
            else:
                self._parts.append(frag)
                self._size += n
        if src is buf:
            del buf[:pos]
        else:
            buf += src[pos:]
        return records


def frame(
    pieces: list[bytes | bytearray | memoryview], max_fragment: int = MAX_FRAGMENT
) -> list[bytes | bytearray | memoryview]:
    """Record-mark a message given as pieces, in fragments of at most ``max_fragment`` bytes."""
    total = sum(len(p) for p in pieces)
    if total <= max_fragment:
        return [_MARK.pack(LAST_FRAGMENT | total), *pieces]
    flat = memoryview(b"".join(pieces))
    out: list[bytes | bytearray | memoryview] = []
    for start in range(0, total, max_fragment):
        part = flat[start : start + max_fragment]
        last = LAST_FRAGMENT if start + max_fragment >= total else 0
        out += [_MARK.pack(last | len(part)), part]
    return out


class TcpConnection(Connection, asyncio.Protocol):
    kind = "tcp"

    def __init__(
        self,
        peer: str = "",
        *,
        max_record: int = DEFAULT_MAX_RECORD,
        max_fragment: int = MAX_FRAGMENT,
        on_made: Callable[[TcpConnection], None] | None = None,
    ) -> None:
        Connection.__init__(self, peer)
        self.parser = RecordParser(max_record)
        self.max_fragment = max_fragment
        self.transport: asyncio.Transport | None = None
        self._on_made = on_made
        self._writable = asyncio.Event()
        self._writable.set()

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.peer:
            peer = transport.get_extra_info("peername")
            self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        try:
            records = self.parser.feed(data)
        except RecordTooLarge as e:
            log.warning("tcp %s: %s; closing the connection", self.peer, e)
            self._abort(e)
            return
        for rec in records:
            self._deliver(Inbound(Reader(rec)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        self._closed(exc)

    def pause_writing(self) -> None:
        # The peer is not reading what we send: stop reading its requests until it does.
        self._writable.clear()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writable.set()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- Connection ----------------------------------------------------------------------
    def _send(self, msg: Writer) -> None:
        t = self.transport
        if t is None or t.is_closing():
            raise ConnectionError(f"tcp connection to {self.peer} is closed")
        t.writelines(frame(msg.pieces(), self.max_fragment))

    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        self._send(msg)

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        self._send(msg)

    async def reserve(self, probe: bool = False) -> None:
        await self._writable.wait()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        else:
            self._closed(None)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows and closes
        else:
            self._closed(None)

    def _abort(self, exc: BaseException) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._closed(exc)


async def connect_tcp(
    host: str, port: int, *, max_record: int = DEFAULT_MAX_RECORD, max_fragment: int = MAX_FRAGMENT
) -> TcpConnection:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(
        lambda: TcpConnection(f"{host}:{port}", max_record=max_record, max_fragment=max_fragment),
        host,
        port,
    )
    return proto


async def listen_tcp(
    host: str | None,
    port: int,
    on_connection: Callable[[TcpConnection], None],
    *,
    max_record: int = DEFAULT_MAX_RECORD,
    reuse_port: bool = False,
) -> asyncio.Server:
    """Accept connections; ``on_connection`` runs for each (set its receiver there)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: TcpConnection(max_record=max_record, on_made=on_connection),
        host,
        port,
        reuse_address=True,
        reuse_port=reuse_port or None,
    )
