"""RPC-over-RDMA version 1 on one RC connection: the asyncio adapter over a verbs provider.

One ``RdmaConnection`` carries RPC messages in both directions (RFC 8167: the server's
callbacks share the client's connection), playing requester for its own calls and responder
for the peer's. The protocol decisions are made by the sans-IO modules (``header``,
``marshal``, ``credits``, ``privdata``); this module registers memory, posts work requests and
turns completions into RPC messages.

- Receives are posted before the connection is established (PD-24) and reposted as soon as a
  message has been copied out of its buffer; the responder keeps at least its grant plus the
  backchannel's receives posted (TR-15).
- A requester registers per-RPC memory with the least access (remote read for Read chunks,
  remote write for Write and Reply chunks) and deregisters it on every path: reply, RDMA_ERROR,
  timeout, cancellation, disconnect (TR-20). Memory registered on one connection is never
  offered on another (TR-24).
- A responder checks chunk lists before any RDMA operation (TR-17, TR-21), answers ERR_VERS /
  ERR_CHUNK with the call's XID (TR-3, TR-16), posts its RDMA Writes before the Send that
  completes the RPC (TR-19), and grants credits in every reply (TR-14).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation, TransportCallError
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma import privdata
from nfsrdma.transport.rdma.credits import CreditPolicy, CreditWindow
from nfsrdma.transport.rdma.header import ChunkLimits, Header, HeaderError, Segment
from nfsrdma.transport.rdma.marshal import plan_call, plan_reply
from nfsrdma.transport.rdma.pool import PooledBuffer, data_pool, receive_pool, send_pool
from nfsrdma.transport.rdma.provider import (
    Access,
    Completion,
    ConnectionEvent,
    ConnectRequest,
    Device,
    Disconnected,
    Listener,
    MemoryRegion,
    QueuePairConfig,
    RdmaWriteRequest,
    Sge,
    WcStatus,
)
from nfsrdma.transport.rdma.provider import Connection as QueuePair
from nfsrdma.xdr.runtime import Buffer, Reader, Writer

log = logging.getLogger(__name__)

_MSG_TYPE = struct.Struct(">I")
CALL, REPLY = 0, 1


@dataclass(frozen=True, slots=True)
class RdmaOptions:
    """Per-connection provisioning. ``inline_size`` is the size of our Send and Receive
    buffers, advertised in the private data (PD-6)."""

    inline_size: int = 4096
    credits: int = 32  # what a responder grants (TR-14)
    max_requests: int = 32  # calls a requester may have outstanding (its reply receives)
    backchannel: int = 2  # receives for the other direction's calls (RFC 8167)
    limits: ChunkLimits = field(default_factory=ChunkLimits)
    remote_invalidate: bool = True  # offer/use Send with Invalidate when the device can
    max_reads: int = 16  # RDMA Reads outstanding as initiator (ORD, TR-26)
    data_buffers: int = 32  # pre-registered buffers for RDMA Read sinks / RDMA Write sources
    # What our requester offers (UL-18/UL-19): RFC 8267's baseline by default.
    max_read_chunks: int = 1  # non-zero-position Read chunks per call
    max_write_chunks: int = 1  # Write chunks per call
    data_buffer_size: int = 1 << 20
    probe_reserve: bool = True  # keep one credit for a keepalive probe (UL-26)


@dataclass(slots=True)
class _OutCall:
    """What a requester holds for one outstanding call."""

    xid: int
    regions: list[MemoryRegion] = field(default_factory=list)
    sinks: list[tuple[MemoryRegion, memoryview, bool]] = field(default_factory=list)
    reply_region: MemoryRegion | None = None
    counted: bool = True  # holds a credit


class _Scratch:
    """Local memory a responder reads chunk data into or writes it from: a buffer of the
    connection's pre-registered data pool, or (when none is free or it is too small) a region
    registered for this one use. Never exposed to the peer (local access only)."""

    __slots__ = ("buf", "region")

    def __init__(self, buf: PooledBuffer | None, region: MemoryRegion | None) -> None:
        self.buf = buf
        self.region = region

    @property
    def view(self) -> memoryview:
        if self.buf is not None:
            return self.buf.view
        assert self.region is not None
        return self.region.buffer

    def sge(self, offset: int, length: int) -> Sge:
        if self.buf is not None:
            return self.buf.sge(length, offset)
        assert self.region is not None
        return self.region.sge(offset, length)

    def release(self) -> None:
        if self.buf is not None:
            self.buf.release()
            self.buf = None
        elif self.region is not None:
            self.region.deregister()
            self.region = None


@dataclass(slots=True)
class _InCall:
    """A call being assembled (RDMA Reads of its chunks) or being answered."""

    header: Header
    message: Buffer
    chunks: dict[int, Buffer] = field(default_factory=dict)
    pending_reads: int = 0
    scratch: list[_Scratch] = field(default_factory=list)


@dataclass(slots=True)
class CallContext:
    """Transport state of an inbound call, handed back with its reply."""

    header: Header
    scratch: list[_Scratch]


class RdmaConnection(Connection):
    kind = "rdma"

    def __init__(
        self, device: Device, options: RdmaOptions, *, server: bool, peer: str = ""
    ) -> None:
        super().__init__(peer)
        self.device = device
        self.options = options
        self.server = server
        self.qp: QueuePair | None = None
        pd = device.pd
        n_recv = (options.credits if server else options.max_requests) + options.backchannel
        self.recv_pool = receive_pool(pd, n_recv, options.inline_size)
        self.send_pool = send_pool(pd, n_recv + options.backchannel + 8, options.inline_size)
        self.data_pool = (
            data_pool(pd, options.data_buffers, options.data_buffer_size)
            if server and options.data_buffers
            else None
        )
        self.local_pd = privdata.PrivateData.for_buffers(
            options.inline_size,
            options.inline_size,
            remote_invalidate=(
                privdata.responder_advertises_r(
                    device.caps.remote_invalidate, enabled=options.remote_invalidate
                )
                if server
                else False  # our requester exposes plain regions, never windows (PD-17)
            ),
        )
        self.peer_pd: privdata.PrivateData | None = None
        self.thresholds = privdata.inline_thresholds(None, None)
        self.credits = CreditWindow(options.max_requests)
        self.policy = CreditPolicy(options.credits, options.backchannel)
        self._wr = itertools.count(1)
        self._wr_ctx: dict[int, tuple[str, Any]] = {}
        self._out: dict[int, _OutCall] = {}
        self._assembling: dict[int, _InCall] = {}
        self._credit_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._send_backlog: collections.deque[
            tuple[list[Buffer], int | None, list[RdmaWriteRequest]]
        ] = collections.deque()
        self._read_backlog: collections.deque[tuple[int, Sge, int, int]] = collections.deque()
        self._reads_in_flight = 0
        self._inbound_calls = 0
        self.closing = False  # close() was called: take no more messages
        # Until our side of the handshake is complete, sends wait (a client may send as soon
        # as its side is established, before ours is).
        self.ready = False
        self.stats: collections.Counter[str] = collections.Counter()

    # -- set-up ----------------------------------------------------------------------------
    def qp_config(self) -> QueuePairConfig:
        caps = self.device.caps
        depth = self.recv_pool.count + self.send_pool.count + 64
        return QueuePairConfig(
            max_send_wr=min(depth, caps.max_qp_wr),
            max_recv_wr=min(self.recv_pool.count, caps.max_qp_wr),
            max_send_sge=min(2, caps.max_send_sge),
            max_recv_sge=1,
        )

    def attach(self, qp: QueuePair) -> None:
        """Take the queue pair and post every receive before it is established (PD-24)."""
        self.qp = qp
        privdata.check_receive_provisioning(self.local_pd, self.recv_pool.buffer_size)
        while (buf := self.recv_pool.try_get()) is not None:
            self._post_recv(buf)

    def established(self) -> None:
        """Our side of the handshake is complete: send and read what waited for it."""
        self.ready = True
        self._pump_reads()
        self._flush()

    def _flush(self) -> None:
        while self._send_backlog and self.ready and not self.closed:
            if self.send_pool.available == 0:
                return
            pieces, inv, writes = self._send_backlog.popleft()
            self._send(pieces, inv, writes)

    def negotiated(self, peer: bytes) -> None:
        """Thresholds from both blocks, afresh for this connection (PD-7, PD-9, PD-14)."""
        self.peer_pd = privdata.decode(peer)
        if self.server:
            self.thresholds = privdata.inline_thresholds(self.peer_pd, self.local_pd)
        else:
            self.thresholds = privdata.inline_thresholds(self.local_pd, self.peer_pd)
        log.info(
            "rdma %s: inline c->s %d s->c %d, peer R=%s",
            self.peer,
            self.thresholds.client_to_server,
            self.thresholds.server_to_client,
            self.peer_pd.remote_invalidate if self.peer_pd else "none",
        )

    @property
    def send_limit(self) -> int:
        t = self.thresholds
        return t.server_to_client if self.server else t.client_to_server

    @property
    def recv_limit(self) -> int:
        t = self.thresholds
        return t.client_to_server if self.server else t.server_to_client

    # -- work requests -------------------------------------------------------------------
    def _wr_id(self, kind: str, ctx: Any) -> int:
        wr = next(self._wr)
        self._wr_ctx[wr] = (kind, ctx)
        return wr

    def _post_recv(self, buf: PooledBuffer) -> None:
        assert self.qp is not None
        self.qp.post_recv(self._wr_id("recv", buf), buf.sge())

    def _send(
        self,
        pieces: list[Buffer],
        invalidate: int | None = None,
        writes: list[RdmaWriteRequest] | None = None,
    ) -> None:
        """Copy a transport message into a send buffer and post it (or queue it until the
        connection is established and a send buffer is free)."""
        if self.closed or self.qp is None:
            raise ConnectionError(f"rdma connection to {self.peer} is closed")
        buf = self.send_pool.try_get() if self.ready else None
        if buf is None:
            self._send_backlog.append((pieces, invalidate, writes or []))
            return
        n = 0
        for p in pieces:
            m = len(p)
            buf.view[n : n + m] = p
            n += m
        self.qp.post_send(
            self._wr_id("send", buf), [buf.sge(n)], invalidate_rkey=invalidate, writes=writes or ()
        )
        self.stats["sends"] += 1

    def _scratch(self, length: int) -> _Scratch:
        pool = self.data_pool
        if pool is not None and length <= pool.buffer_size:
            buf = pool.try_get()
            if buf is not None:
                return _Scratch(buf, None)
        return _Scratch(None, self._register(length, Access.LOCAL_WRITE))

    def _register(self, length: int, access: Access) -> MemoryRegion:
        region = self.device.pd.register(max(length, 1), access | Access.LOCAL_WRITE)
        self.stats["registrations"] += 1
        return region

    # -- events ------------------------------------------------------------------------------
    def on_event(self, ev: ConnectionEvent) -> None:
        try:
            self._on_event(ev)
        except Exception as e:  # a bug or a dead queue pair: this connection ends, not the loop
            log.exception("rdma %s: event handling failed", self.peer)
            self._teardown(e)
            if self.qp is not None:
                self.qp.disconnect()

    def _on_event(self, ev: ConnectionEvent) -> None:
        if isinstance(ev, Disconnected):
            self._teardown(ConnectionError(f"rdma connection lost: {ev.reason}"))
            return
        kind, ctx = self._wr_ctx.pop(ev.wr_id, ("?", None))
        if kind == "recv":
            self._on_recv(ev, ctx)
        elif kind == "send":
            ctx.release()
            self._flush()
        elif kind == "read":
            self._on_read_done(ev, ctx)
        elif kind == "write":
            ctx.release()  # the local source of one RDMA Write
        if not ev.ok and not self.closed and ev.status is not WcStatus.WR_FLUSH_ERR:
            log.warning("rdma %s: %s completion failed: %s", self.peer, kind, ev.status.name)

    def _on_recv(self, ev: Completion, buf: PooledBuffer) -> None:
        if not ev.ok:
            buf.release()
            return
        data = bytes(buf.view[: ev.byte_len])
        if self.closed or self.closing:
            buf.release()
            return
        self._post_recv(buf)  # the message is out of the buffer: give it back at once
        if ev.invalidated_rkey is not None:
            self.stats["remote_invalidations"] += 1
            self._forget_rkey(ev.invalidated_rkey)
        try:
            h = hdr.parse(data)
        except HeaderError as e:
            self._bad_header(e)
            return
        if h.proc == hdr.RDMA_ERROR:
            self._on_reply_error(h)
            return
        if h.proc == hdr.RDMA_NOMSG:
            if any(c.position == 0 for c in h.reads):
                self._on_call(h, memoryview(data)[h.size :])
            elif h.xid in self._out:
                self._on_reply(h, memoryview(data)[h.size :])
            elif self.server:
                # Neither a Long call nor a reply to one of our callbacks: malformed.
                why = "RDMA_NOMSG without a position-zero chunk"
                self._bad_header(HeaderError(why, h.xid, hdr.ERR_CHUNK))
            else:
                log.info("rdma %s: RDMA_NOMSG for unknown xid %#x dropped", self.peer, h.xid)
            return
        if len(data) < h.size + 8:
            self._bad_header(
                HeaderError("message too short for an RPC header", h.xid, hdr.ERR_CHUNK)
            )
            return
        (mtype,) = _MSG_TYPE.unpack_from(data, h.size + 4)
        if mtype == CALL:
            self._on_call(h, memoryview(data)[h.size :])
        else:
            self._on_reply(h, memoryview(data)[h.size :])

    def _bad_header(self, e: HeaderError) -> None:
        self.stats["bad_headers"] += 1
        log.info("rdma %s: %s", self.peer, e)
        if e.xid is None or e.err is None:
            return  # nothing to answer to
        if e.xid in self._out:
            # A reply we cannot parse: the call fails; the connection lives on.
            self._fail_call(e.xid, TransportCallError(f"unparsable reply: {e}"))
            return
        self._send([hdr.encode_error(e.xid, self.policy.grant, e.err)])

    # -- responder ---------------------------------------------------------------------
    def _on_call(self, h: Header, inline: memoryview) -> None:
        self._inbound_calls += 1
        if self._inbound_calls > self.policy.grant + self.options.backchannel:
            log.warning(
                "rdma %s: calls beyond the %d credits granted", self.peer, self.policy.grant
            )
            self.stats["credit_overruns"] += 1
            self.close()
            return
        zero = [c for c in h.reads if c.position == 0]
        msg_len = zero[0].length if zero else len(inline)
        try:
            hdr.check_call(h, msg_len, self.options.limits)
        except HeaderError as e:
            self._inbound_calls -= 1
            self._bad_header(e)
            return
        call = _InCall(h, inline)
        if not h.reads:
            self._deliver_call(call)
            return
        for chunk in h.reads:
            local = self._scratch(chunk.length)
            call.scratch.append(local)
            off = 0
            for s in chunk.segments:
                call.pending_reads += 1
                self._read(call, local.sge(off, s.length), s)
                off += s.length
            data = local.view[: chunk.length]
            if chunk.position == 0:
                call.message = data
            else:
                call.chunks[chunk.position] = data
        self._assembling[id(call)] = call

    @property
    def max_reads(self) -> int:
        """RDMA Reads outstanding at once: our option, within the negotiated ORD (TR-26)."""
        ord_ = self.qp.initiator_depth if self.qp is not None else 0
        return max(1, min(self.options.max_reads, ord_ or self.options.max_reads))

    def _read(self, call: _InCall, sge: Sge, seg: Segment) -> None:
        self._read_backlog.append((self._wr_id("read", call), sge, seg.offset, seg.handle))
        self._pump_reads()

    def _pump_reads(self) -> None:
        """Post queued RDMA Reads within the ORD, once the connection is established."""
        while self._read_backlog and self.ready and self._reads_in_flight < self.max_reads:
            wr, sge, addr, rkey = self._read_backlog.popleft()
            self._reads_in_flight += 1
            assert self.qp is not None
            self.qp.post_rdma_read(wr, [sge], addr, rkey)

    def _on_read_done(self, ev: Completion, call: _InCall) -> None:
        self._reads_in_flight -= 1
        self._pump_reads()
        if not ev.ok:
            return  # the connection breaks; teardown releases the call
        call.pending_reads -= 1
        if call.pending_reads == 0:
            self._assembling.pop(id(call), None)
            self._deliver_call(call)

    def _deliver_call(self, call: _InCall) -> None:
        reader = Reader(call.message, call.chunks or None)
        self._deliver(Inbound(reader, CallContext(call.header, call.scratch)))

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        ctx = request.context
        assert isinstance(ctx, CallContext)
        self._inbound_calls = max(0, self._inbound_calls - 1)
        for local in ctx.scratch:
            local.release()  # the call's chunk data has been consumed by now
        h = ctx.header
        try:
            plan = plan_reply(msg, h, self.send_limit)
        except HeaderError as e:
            log.info("rdma %s: %s", self.peer, e)
            self.stats["reply_overruns"] += 1
            self._send([hdr.encode_error(h.xid, self.policy.grant, hdr.ERR_CHUNK)])
            return
        writes = []
        for write in plan.writes:
            local = self._scratch(len(write.data))
            local.view[: len(write.data)] = write.data
            seg = write.segment
            writes.append(
                RdmaWriteRequest(
                    self._wr_id("write", local),
                    [local.sge(0, len(write.data))],
                    seg.offset + write.segment_offset,
                    seg.handle,
                )
            )
            self.stats["rdma_writes"] += 1
        head = hdr.encode(h.xid, self.policy.grant, plan.proc, [], plan.write_list, plan.reply)
        # The RDMA Writes go ahead of the Send in one post (TR-19: RC ordering).
        self._send([head, *plan.inline], self._invalidate_for(h), writes)

    def _invalidate_for(self, h: Header) -> int | None:
        """Send with Invalidate of one STag of this XID's chunks, when both peers set R and
        the device can (PD-15, PD-16, SEC-5)."""
        if not privdata.responder_may_send_with_invalidate(
            self.local_pd.remote_invalidate, self.peer_pd, self.device.caps.remote_invalidate
        ):
            return None
        keys = sorted(h.rkeys())
        return keys[0] if keys else None

    # -- requester ---------------------------------------------------------------------
    async def reserve(self, probe: bool = False) -> None:
        while not self.credits.may_send(probe) and not self.closed:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._credit_waiters.append(fut)
            await fut

    def _wake_credit_waiter(self) -> None:
        while self._credit_waiters and self.credits.may_send():
            fut = self._credit_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    @property
    def max_inline_call(self) -> int:
        return self.send_limit

    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        if self.closed or self.qp is None:
            raise ConnectionError(f"rdma connection to {self.peer} is closed")
        expect = expect or ReplyExpectation()
        plan = plan_call(
            msg,
            send_limit=self.send_limit,
            recv_limit=self.recv_limit,
            sinks=[len(s) for s in expect.sinks],
            max_reply=expect.max_size,
            max_write_chunks=self.options.max_write_chunks,
            max_read_chunks=self.options.max_read_chunks,
        )
        out = _OutCall(xid)
        reads = []
        for exposure in plan.reads:
            size = sum(len(p) for p in exposure.data)
            region = self._register(size, Access.REMOTE_READ)
            pos = 0
            for p in exposure.data:
                region.buffer[pos : pos + len(p)] = p
                pos += len(p)
            out.regions.append(region)
            reads.append(
                hdr.ReadChunk(exposure.position, [Segment(region.rkey, size, region.addr)])
            )
            self.stats["read_chunks"] += 1
        writes = []
        for capacity, sink in zip(plan.write_chunks, expect.sinks, strict=False):
            region, direct = self._sink_region(sink, capacity)
            out.regions.append(region)
            out.sinks.append((region, sink, direct))
            writes.append([Segment(region.rkey, capacity, region.addr)])
            self.stats["write_chunks"] += 1
        reply = None
        if plan.reply_chunk is not None:
            out.reply_region = self._register(plan.reply_chunk, Access.REMOTE_WRITE)
            out.regions.append(out.reply_region)
            reply = [Segment(out.reply_region.rkey, plan.reply_chunk, out.reply_region.addr)]
            self.stats["reply_chunks"] += 1
        head = hdr.encode(xid, self.options.max_requests, plan.proc, reads, writes, reply)
        self._out[xid] = out
        self.credits.sent()
        try:
            self._send([head, *plan.inline])
        except Exception:
            self.call_done(xid)
            raise

    def _sink_region(self, sink: memoryview, capacity: int) -> tuple[MemoryRegion, bool]:
        """Register the caller's buffer itself when the provider can (zero copy), else a
        region the data is copied out of after the reply."""
        access = Access.REMOTE_WRITE | Access.LOCAL_WRITE
        try:
            region = self.device.pd.register_buffer(sink[:capacity], access)
            self.stats["registrations"] += 1
            return region, True
        except (NotImplementedError, TypeError, ValueError, BufferError):
            return self._register(capacity, Access.REMOTE_WRITE), False

    def _on_reply(self, h: Header, inline: memoryview) -> None:
        out = self._out.get(h.xid)
        if out is None:
            log.info("rdma %s: reply to unknown xid %#x dropped", self.peer, h.xid)
            return
        self.credits.update(h.credit)
        if h.reads:
            # Replies never carry Read chunks (TR-12): this reply is malformed.
            self._fail_call(h.xid, TransportCallError("reply with a Read list"))
            return
        if h.proc == hdr.RDMA_NOMSG:
            if out.reply_region is None or h.reply is None:
                self._fail_call(h.xid, TransportCallError("RDMA_NOMSG reply without a Reply chunk"))
                return
            n = sum(s.length for s in h.reply)
            if n > out.reply_region.length:
                self._fail_call(h.xid, TransportCallError("Reply chunk overrun"))
                return
            message: Buffer = bytes(out.reply_region.buffer[:n])
        else:
            message = inline
        ordered: list[Buffer | None] = []
        for i, chunk in enumerate(h.writes):
            if i >= len(out.sinks):
                self._fail_call(h.xid, TransportCallError("more Write chunks than offered"))
                return
            region, sink, direct = out.sinks[i]
            n = sum(s.length for s in chunk)
            if n > len(sink):
                self._fail_call(h.xid, TransportCallError("Write chunk overrun"))
                return
            if not direct:
                sink[:n] = region.buffer[:n]
            ordered.append(sink[:n])
        self._deliver(Inbound(Reader(message, ordered=ordered or None)))
        self._wake_credit_waiter()

    def _on_reply_error(self, h: Header) -> None:
        self.stats["rdma_errors"] += 1
        self.credits.update(h.credit)
        what = "ERR_VERS" if h.error == hdr.ERR_VERS else "ERR_CHUNK"
        self._fail_call(h.xid, TransportCallError(f"RDMA_ERROR {what} for xid {h.xid:#x}"))

    def _fail_call(self, xid: int, exc: BaseException) -> None:
        if self.call_failed is not None:
            self.call_failed(xid, exc)
        self.call_done(xid)

    def call_done(self, xid: int) -> None:
        out = self._out.pop(xid, None)
        if out is None:
            return
        for region in out.regions:
            region.deregister()  # TR-20: on every path
        if out.counted:
            self.credits.done()
        self._wake_credit_waiter()

    def _forget_rkey(self, rkey: int) -> None:
        """The peer invalidated ``rkey`` (Send with Invalidate); nothing more to do for it."""
        for out in self._out.values():
            for region in out.regions:
                if region.rkey == rkey:
                    region.deregister()

    # -- teardown ----------------------------------------------------------------------
    def close(self) -> None:
        self.closing = True
        if self.qp is not None and not self.closed:
            self.qp.disconnect()
        else:
            self._teardown(None)

    def _teardown(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        for xid in list(self._out):
            self.call_done(xid)
        for call in self._assembling.values():
            for local in call.scratch:
                local.release()
        self._assembling.clear()
        for fut in self._credit_waiters:
            if not fut.done():
                fut.set_result(None)
        self._closed(exc)
        if self.qp is not None:
            self.qp.close()
        self.recv_pool.close()
        self.send_pool.close()
        if self.data_pool is not None:
            self.data_pool.close()


# -- connection set-up ------------------------------------------------------------------


async def connect_rdma(
    device: Device, host: str, port: int, options: RdmaOptions | None = None
) -> RdmaConnection:
    """Connect as a requester (client): private data out, the server's back (PD-1)."""
    opts = options or RdmaOptions()
    conn = RdmaConnection(device, opts, server=False, peer=f"{host}:{port}")
    qp = await device.resolve(host, port, conn.qp_config(), conn.on_event)
    conn.attach(qp)
    caps = device.caps
    peer = await qp.establish(
        privdata.encode(conn.local_pd),
        responder_resources=min(caps.max_qp_rd_atom, 16),  # the server reads our chunks
        initiator_depth=0,  # we never read (TR-26)
    )
    conn.negotiated(peer)
    conn.established()
    return conn


class RdmaListener:
    """Accepts RPC-over-RDMA connections (port 20049 by default, UL-9)."""

    def __init__(
        self,
        device: Device,
        port: int,
        on_connection: Callable[[RdmaConnection], None],
        options: RdmaOptions | None = None,
    ) -> None:
        self.device = device
        self.requested_port = port
        self.on_connection = on_connection
        self.options = options or RdmaOptions()
        self.listener: Listener | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.listener = await self.device.listen(self.requested_port)
        self._task = asyncio.create_task(self._accept_loop())

    @property
    def port(self) -> int:
        return self.listener.port if self.listener is not None else self.requested_port

    async def _accept_loop(self) -> None:
        assert self.listener is not None
        while True:
            req = await self.listener.get_request()
            task = asyncio.create_task(self._accept(req))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _accept(self, req: ConnectRequest) -> None:
        conn = RdmaConnection(self.device, self.options, server=True, peer=req.peer)
        try:
            qp = req.create_connection(conn.qp_config(), conn.on_event)
            conn.attach(qp)
            conn.negotiated(req.private_data)
            # Receivers are in place before the first call can arrive (PD-24).
            self.on_connection(conn)
            caps = self.device.caps
            await qp.establish(
                privdata.encode(conn.local_pd),
                responder_resources=0,
                # RDMA Reads we may have outstanding: no more than the peer allows (TR-26).
                initiator_depth=min(req.initiator_depth, caps.max_qp_init_rd_atom, 16),
            )
            conn.established()
        except Exception as e:
            log.warning("rdma: accepting a connection failed: %s", e)
            conn._teardown(e)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in list(self._pending):
            t.cancel()
        if self.listener is not None:
            self.listener.close()
