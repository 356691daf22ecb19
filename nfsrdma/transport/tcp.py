"""ONC RPC over TCP with record marking (RFC 5531 section 11).

A record is a sequence of fragments, each behind a 4-byte mark: the high bit says "last
fragment", the other 31 bits give the fragment's length. Records larger than ``max_record``
close the connection that sent them (the listener keeps serving everyone else). The marks count
against that limit too (every fragment after the first costs its 4 bytes), and a record may have
at most ``max_fragments`` fragments (``MAX_FRAGMENTS``, 1024, by default: Linux sends one
fragment per record, libtirpc fragments of 9000 bytes and glibc's sunrpc of 4000, so 1024
fragments carry 4 MB, more than the largest request an NFS server accepts). A stream of empty
or tiny fragments is therefore cut off after a few KiB, and what the parser holds never exceeds
the record limit: fragments are gathered into one buffer, with no bookkeeping per fragment.
Reading pauses while the peer is not draining our replies, so a client cannot make us buffer
without bound.

``RecordParser`` is the reference decoder (bytes fed in, records out). ``TcpConnection``
receives through ``RecordReceiver`` (``tcp_receive.py``, the same rules, property-tested
against the parser): bytes land in its buffers (``asyncio.BufferedProtocol``), and a large
fragment straight in a buffer of its own that becomes the record, so a 1 MiB WRITE's data is
written to the file, and a 1 MiB READ reply decoded, where the socket put it.

Replies made while the records of one receive are delivered (answered without waiting) are
held and written together when the last of those records has been handled: one system call
and as few segments as the data needs, instead of one of each per reply. The order on the wire
is unchanged, and a reply made later (after a wait) is written at once.

Calls (the requester's side) are gathered the same way: a call is written when the event loop
has run what is ready now, with the other calls made meanwhile (a client with many calls in
flight sends the calls its tasks make after one receive of replies in one system call).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation
from nfsrdma.transport.tcp_receive import (
    LAST_FRAGMENT,
    MARK_SIZE,
    MAX_FRAGMENT,
    LargeBuffers,
    Record,
    RecordReceiver,
    RecordTooLarge,
    check_mark,
)
from nfsrdma.xdr.runtime import PAD, Reader, Writer

DEFAULT_MAX_RECORD = 4 << 20
MAX_FRAGMENTS = 1024
_MARK = struct.Struct(">I")


class RecordParser:
    """Sans-IO record-marking decoder: feed bytes, get whole records."""

    def __init__(
        self, max_record: int = DEFAULT_MAX_RECORD, max_fragments: int = MAX_FRAGMENTS
    ) -> None:
        if max_fragments < 1:
            raise ValueError("a record needs at least one fragment")
        self.max_record = max_record
        self.max_fragments = max_fragments
        self._buf = bytearray()  # received bytes not yet consumed: a mark, or a partial fragment
        self._record = bytearray()  # the finished fragments of the record in progress
        self._cost = 0  # the record so far: payload, plus a mark for every fragment but the first
        self._fragments = 0  # finished fragments of the record in progress

    @property
    def buffered(self) -> int:
        """Bytes the parser holds for an incomplete record."""
        return len(self._buf) + len(self._record)

    @property
    def in_record(self) -> bool:
        """Part of a record has arrived (at least one byte of it)."""
        return bool(self._buf) or self._fragments > 0

    def reset(self) -> None:
        """Drop whatever is buffered (the connection is gone)."""
        self._buf = bytearray()
        self._record = bytearray()
        self._cost = 0
        self._fragments = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Take received bytes; return the records they complete. Raises RecordTooLarge.

        With nothing pending, whole single-fragment records are sliced straight out of ``data``
        (one copy); only an incomplete tail waits in the parser's buffer."""
        buf = self._buf
        if not buf and isinstance(data, bytes):
            if not self._fragments and len(data) >= MARK_SIZE:
                # The usual receive: exactly one whole single-fragment record.
                (mark,) = _MARK.unpack_from(data)
                n = mark & MAX_FRAGMENT
                if mark & LAST_FRAGMENT and n == len(data) - MARK_SIZE and n <= self.max_record:
                    return [data[MARK_SIZE:]]
            src: bytes | bytearray = data
        else:
            buf += data
            src = buf
        records: list[bytes] = []
        pos = 0
        end = len(src)
        while end - pos >= MARK_SIZE:
            (mark,) = _MARK.unpack_from(src, pos)
            n, cost = check_mark(
                mark, self._cost, self._fragments, self.max_record, self.max_fragments
            )
            if end - pos - MARK_SIZE < n:
                break
            start = pos + MARK_SIZE
            pos = start + n
            if mark & LAST_FRAGMENT:
                if self._fragments:
                    self._record += memoryview(src)[start:pos]
                    records.append(bytes(self._record))
                    self._record = bytearray()
                    self._cost = 0
                    self._fragments = 0
                elif isinstance(src, bytes):
                    records.append(src[start:pos])  # a slice of bytes is its one copy
                else:
                    records.append(bytes(memoryview(src)[start:pos]))  # one copy
            else:
                self._record += memoryview(src)[start:pos]
                self._cost = cost
                self._fragments += 1
        if src is buf:
            del buf[:pos]
        else:
            buf += src[pos:]
        return records


def frame(
    pieces: list[bytes | bytearray | memoryview], max_fragment: int = MAX_FRAGMENT
) -> list[bytes | bytearray | memoryview]:
    """Record-mark a message given as pieces, in fragments of at most ``max_fragment`` bytes."""
    total = sum(map(len, pieces))
    if total <= max_fragment:
        return [_MARK.pack(LAST_FRAGMENT | total), *pieces]
    flat = memoryview(b"".join(pieces))
    out: list[bytes | bytearray | memoryview] = []
    for start in range(0, total, max_fragment):
        part = flat[start : start + max_fragment]
        last = LAST_FRAGMENT if start + max_fragment >= total else 0
        out += [_MARK.pack(last | len(part)), part]
    return out


class TcpConnection(Connection, asyncio.BufferedProtocol):
    """Both roles' TCP connection. Bytes are received into the buffers of a
    ``RecordReceiver`` (``tcp_receive.py``): a large record straight into a buffer of its own
    size, which is the record handed on (no copy in Python)."""

    kind = "tcp"

    def __init__(
        self,
        peer: str = "",
        *,
        max_record: int = DEFAULT_MAX_RECORD,
        max_fragment: int = MAX_FRAGMENT,
        max_fragments: int = MAX_FRAGMENTS,
        on_made: Callable[[TcpConnection], None] | None = None,
        large: LargeBuffers | None = None,
    ) -> None:
        Connection.__init__(self, peer)
        self.rx = RecordReceiver(max_record, max_fragments, large=large)
        # The event loop asks for a buffer before every receive: the receiver's own method.
        self.get_buffer = self.rx.get_buffer  # type: ignore[method-assign]
        self.max_fragment = max_fragment
        self.transport: asyncio.Transport | None = None
        self._on_made = on_made
        self._writable = asyncio.Event()
        self._writable.set()
        self._abort_reason: BaseException | None = None
        # Pieces of replies held while one receive's records are delivered (None: not now).
        self._held: list[bytes | bytearray | memoryview] | None = None
        # Calls waiting for the loop's next turn (None: none queued, no flush scheduled).
        self._calls_out: list[bytes | bytearray | memoryview] | None = None

    # -- asyncio.BufferedProtocol --------------------------------------------------------
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

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.rx.get_buffer(sizehint)  # (bound to the instance in __init__: no frame)

    def buffer_updated(self, nbytes: int) -> None:
        rx = self.rx
        if self.tap is not None:
            self.tap(False, rx.last_received(nbytes))
        try:
            records = rx.received(nbytes)
        except RecordTooLarge as e:
            self._too_large(e)
            return
        if len(records) == 1:
            self._deliver(Inbound(Reader(records[0])))
        elif records:
            self._deliver_all(records)

    def data_received(self, data: bytes) -> None:
        """Bytes received elsewhere (the in-process benches and tests): copied into the
        receiver's buffers, with the same records and rules as a receive from the socket."""
        if self.tap is not None:
            self.tap(False, bytes(data))
        try:
            records = self.rx.feed(data)
        except RecordTooLarge as e:
            self._too_large(e)
            return
        self._deliver_all(records)

    def _too_large(self, e: RecordTooLarge) -> None:
        # Logged once, by whoever watches the connection close (with this reason). Without
        # its traceback, the reason does not keep this connection's frames alive.
        self._abort(e.with_traceback(None))

    def _deliver_all(self, records: list[Record]) -> None:
        if len(records) == 1:
            self._deliver(Inbound(Reader(records[0])))
            return
        if not records:
            return
        held: list[bytes | bytearray | memoryview] = []
        self._held = held
        try:
            for rec in records:
                self._deliver(Inbound(Reader(rec)))
        finally:
            self._held = None
            t = self.transport
            if held and t is not None and not t.is_closing():
                t.writelines(held)

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        self.rx.reset()
        self.transport = None
        self._closed(exc or self._abort_reason)

    @property
    def receiving(self) -> bool:
        return self.rx.in_record

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
    def _framed(
        self, msg: Writer
    ) -> tuple[asyncio.Transport, list[bytes | bytearray | memoryview]]:
        """The open transport and ``msg`` record-marked (shown to the tap); ConnectionError if
        the connection is closed."""
        t = self.transport
        if t is None or t.is_closing():
            raise ConnectionError(f"tcp connection to {self.peer} is closed")
        pieces = frame(msg.pieces(), self.max_fragment)
        if self.tap is not None:
            self.tap(True, b"".join(bytes(p) for p in pieces))
        return t, pieces

    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        _, pieces = self._framed(msg)
        out = self._calls_out
        if out is None:
            self._calls_out = out = []
            asyncio.get_running_loop().call_soon(self._flush_calls)
        out += pieces

    def _flush_calls(self) -> None:
        out, self._calls_out = self._calls_out, None
        t = self.transport
        if out and t is not None and not t.is_closing():
            t.writelines(out)

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        t = self.transport
        ddp = msg.ddp
        if len(ddp) > 1 or self.tap is not None or t is None or t.is_closing():
            t, pieces = self._framed(msg)
        elif not ddp:
            if len(msg) <= self.max_fragment:  # (_framed's usual outcome, without its calls)
                pieces = [_MARK.pack(LAST_FRAGMENT | len(msg)), msg]
            else:
                pieces = frame([msg], self.max_fragment)
        else:  # one DDP item (a READ's data): what Writer.pieces and frame would give
            data = ddp[0].data
            at, n = ddp[0].offset, len(data)
            pad = PAD[n & 3]
            total = len(msg) + n + len(pad)
            if total > self.max_fragment:
                pieces = frame(msg.pieces(), self.max_fragment)
            else:
                view = memoryview(msg)
                mark = _MARK.pack(LAST_FRAGMENT | total)
                if pad:
                    pieces = [mark, view[:at], data, pad, view[at:]]
                else:
                    pieces = [mark, view[:at], data, view[at:]]
        held = self._held
        if held is not None:
            held += pieces  # written with the other replies of this receive
            return
        t.writelines(pieces)

    async def reserve(self, probe: bool = False) -> None:
        await self._writable.wait()

    def close(self) -> None:
        if self.transport is not None:
            held, self._held = self._held, None
            if held and not self.transport.is_closing():
                self.transport.writelines(held)  # replies made before the close go first
            self._flush_calls()
            self.transport.close()
        else:
            self._closed(None)

    def abort(self, exc: BaseException | None = None) -> None:
        self._abort_reason = exc
        if self.transport is not None:
            self.transport.abort()
        else:
            self._closed(exc)

    def _abort(self, exc: BaseException) -> None:
        self.rx.reset()
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
    max_fragments: int = MAX_FRAGMENTS,
    reuse_port: bool = False,
) -> asyncio.Server:
    """Accept connections; ``on_connection`` runs for each (set its receiver there, or close
    the connection to refuse it)."""
    loop = asyncio.get_running_loop()
    large = LargeBuffers()  # large records' buffers, reused across the listener's connections
    return await loop.create_server(
        lambda: TcpConnection(
            max_record=max_record, max_fragments=max_fragments, on_made=on_connection, large=large
        ),
        host,
        port,
        reuse_address=True,
        reuse_port=reuse_port or None,
    )
