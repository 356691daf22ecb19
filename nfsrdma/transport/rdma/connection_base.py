"""One RPC-over-RDMA version 1 connection: what both directions share.

One connection carries RPC messages in both directions (RFC 8167: the server's callbacks share
the client's connection), playing requester for its own calls (``requester``) and responder
for the peer's (``responder``); ``endpoint.RdmaConnection`` is both. This part holds the
buffers and credits, the connection's set-up steps (receives posted before establishment,
PD-24; thresholds from both private data blocks), the work request bookkeeping, the receive
path that tells calls from replies, and teardown. The protocol decisions are made by the
sans-IO modules (``header``, ``marshal``, ``credits``, ``privdata``).

Receives are reposted as soon as a message has been copied out of its buffer; the responder
keeps at least its grant plus the backchannel's receives posted (TR-15).

Completions are selective (``sendqueue``): a reply's RDMA Writes go out unsignalled in one
post with its Send, and most Sends are unsignalled too; a send buffer or Write source is
reused only once a later signalled completion on the send queue covers it, and a chain is
posted only when the send queue has room for all of it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from nfsrdma._mypyc import mypyc_attr
from nfsrdma.transport.base import Connection, Inbound, TransportCallError
from nfsrdma.transport.rdma import continuation, privdata, rtrext
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.calls import InCall, OutCall, Scratch
from nfsrdma.transport.rdma.credits import CreditPolicy, CreditWindow
from nfsrdma.transport.rdma.header import ChunkLimits, Header, HeaderError
from nfsrdma.transport.rdma.pool import PooledBuffer, data_pool, receive_pool, send_pool
from nfsrdma.transport.rdma.provider import (
    Access,
    Completion,
    ConnectionEvent,
    Device,
    Disconnected,
    MemoryRegion,
    QueuePairConfig,
    RdmaWriteRequest,
    Sge,
    WcStatus,
)
from nfsrdma.transport.rdma.provider import Connection as QueuePair
from nfsrdma.transport.rdma.sendqueue import SendQueue
from nfsrdma.xdr.gen import rpcrdma
from nfsrdma.xdr.runtime import Buffer

__all__ = ["CALL", "REPLY", "RdmaConnectionBase", "RdmaOptions"]

# Every counter of rtrext traffic: all stay 0 on a connection without the extension.
RTR_COUNTERS = ("rtr_sends", "rtr_receives", "rtr_calls", "rtr_replies", "rtr_calls_received",
                "rtr_replies_sent", "rtr_faults", "rtr_repterr", "rtr_fallbacks",
                "rtr_replies_resent", "rtr_tbsn_calls", "rtr_tbsn_items")  # fmt: skip

log = logging.getLogger(__name__)

# What a posted work request was for: a receive or send buffer, a call whose chunk an RDMA
# Read fetches, or the local source of an RDMA Write.
WrContext: TypeAlias = PooledBuffer | InCall | Scratch | None

_MSG_TYPE: Final = struct.Struct(">I")
# The proc word of a message with an rtrext header.
_RTREXT_PROC: Final = _MSG_TYPE.pack(rh.RDMA_RTREXT)
CALL: Final = 0
REPLY: Final = 1
_SEND_QUEUE_KINDS: Final = frozenset(("send", "write", "read"))
# A completion's status, compared by identity (``Completion.ok`` is a Python property).
_SUCCESS: Final = WcStatus.SUCCESS
_FLUSHED: Final = WcStatus.WR_FLUSH_ERR


@dataclass(frozen=True, slots=True)
class RdmaOptions:
    """Per-connection provisioning. ``inline_size`` is the size of our Send and Receive
    buffers, advertised in the private data (PD-6)."""

    inline_size: int = 4096
    credits: int = 32  # what a responder grants (TR-14)
    max_requests: int = 32  # calls a requester may have outstanding (its reply receives)
    # Receives for the other direction's calls (RFC 8167): at least the back-channel slots the
    # session uses (4 on both sides of ours; the Linux client asks for 1).
    backchannel: int = 4
    limits: ChunkLimits = field(default_factory=ChunkLimits)
    remote_invalidate: bool = True  # offer/use Send with Invalidate when the device can
    max_reads: int = 16  # RDMA Reads outstanding as initiator (ORD, TR-26)
    data_buffers: int = 32  # pre-registered buffers for RDMA Read sinks / RDMA Write sources
    # What our requester offers (UL-18/UL-19): RFC 8267's baseline by default.
    max_read_chunks: int = 1  # non-zero-position Read chunks per call
    max_write_chunks: int = 1  # Write chunks per call
    data_buffer_size: int = 1 << 20
    probe_reserve: bool = True  # keep one credit for a keepalive probe (UL-26)
    # The rtrext extension (message continuation between nfsrdma peers, RT-X1): offered in the
    # private data, used only when the peer offers it too.
    rtrext: bool = True
    rtr_request_limit: int = 8  # transmissions per call we accept (RT-4)
    rtr_response_limit: int = 8  # transmissions per reply we produce (RT-5)
    # Send-based placement (TBSN, RT-X4): a server's receives get ``rtr_plt_segments``
    # placement-capable segments of ``inline_size`` after the first, a client's Sends room to
    # fill as many; WRITE data then crosses in Sends. Used only when both sides set it.
    rtrext_tbsn: bool = False
    rtr_plt_segments: int = 8
    # Selective signalling: at most this many Sends in a row without a completion, RDMA Writes
    # never signalled (``sendqueue``). 1, the default (``NFSRDMA_SIGNAL_EVERY``): every Send
    # signalled (but those our requester holds for a loop turn, whose list the queue pair ends
    # with a signalled one); selective signalling did not measure better with the Linux client.
    signal_every: int = field(default_factory=lambda: signal_every_default())
    # Our calls of one loop turn posted together, one doorbell (``Requester.send_call``);
    # on by default, ``NFSRDMA_CALL_BATCH=0`` posts each call alone.
    batch_calls: bool = field(default_factory=lambda: batch_calls_default())


def signal_every_default() -> int:
    """``NFSRDMA_SIGNAL_EVERY`` (a positive number; 1 when unset or not one)."""
    try:
        return max(1, int(os.environ.get("NFSRDMA_SIGNAL_EVERY", "1")))
    except ValueError:
        return 1


def batch_calls_default() -> bool:
    """``NFSRDMA_CALL_BATCH`` (unset, or anything but ``0``: our calls of one loop turn in one
    post; ``0``: each call posted alone)."""
    return os.environ.get("NFSRDMA_CALL_BATCH", "1") != "0"


# Compiled (``setup.py``'s ``RDMA_HOT``) as a native class whose instances call their methods
# directly; an interpreted subclass (tests' ``Patchable``) is called through Python attribute
# look-up, so a method replaced on its instance is what the compiled code calls.
@mypyc_attr(allow_interpreted_subclasses=True)
class RdmaConnectionBase(Connection):
    kind = "rdma"
    # ``Connection``'s attributes that the per-message code uses, declared again so that the
    # compiled class keeps them as its own (native) attributes.
    peer: str
    closed: bool
    receiver: Callable[[Connection, Inbound], None] | None
    call_failed: Callable[[int, BaseException], None] | None
    messages_received: int
    tap: Callable[[bool, bytes], None] | None

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
        tbsn = options.rtrext and options.rtrext_tbsn and options.rtr_plt_segments > 0
        plt_recv = options.rtr_plt_segments if tbsn and server else 0  # TBSN targets we accept
        plt_send = options.rtr_plt_segments if tbsn and not server else 0  # TBSN we send
        self.recv_pool = receive_pool(pd, n_recv, options.inline_size * (1 + plt_recv))
        self.send_pool = send_pool(
            pd, n_recv + options.backchannel + 8, options.inline_size * (1 + plt_send)
        )
        self._tbsn_send_room = self.send_pool.buffer_size if plt_send else 0
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
        self._may_invalidate: bool | None = None  # responder_may_send_with_invalidate, once
        self.peer_private_data = b""
        self.local_rtr = (
            rtrext.RtrBlock(
                request_limit=options.rtr_request_limit,
                response_limit=options.rtr_response_limit,
                segment_size=options.inline_size,
                plt_segments=plt_recv,
            )
            if options.rtrext
            else None
        )
        self.rtr = rtrext.OFF
        self.reassembler = continuation.Reassembler()
        self.kept_replies = continuation.ReplyKeeper(options.credits)  # to resend (RT-19)
        self.thresholds = privdata.inline_thresholds(None, None)
        self.credits = CreditWindow(options.max_requests)
        # A responder grants what it provisioned for that direction: the forward credits on a
        # server's connection, the backward receives on a client's (RFC 8167).
        grant = options.credits if server else options.backchannel
        self.policy = CreditPolicy(grant, options.backchannel)
        self._wr = itertools.count(1)
        self._wr_ctx: dict[int, tuple[str, WrContext]] = {}
        self._out: dict[int, OutCall] = {}
        self._assembling: dict[int, InCall] = {}
        self._credit_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._send_backlog: collections.deque[
            tuple[list[Buffer], int | None, list[RdmaWriteRequest]]
        ] = collections.deque()
        self._read_backlog: collections.deque[tuple[int, Sge, int, int]] = collections.deque()
        self._reads_in_flight = 0
        self._inbound_calls = 0
        self.sq = SendQueue(max(2, self.qp_config().max_send_wr), options.signal_every)
        self.closing = False  # close() was called: take no more messages
        # Until our side of the handshake is complete, sends wait (a client may send as soon
        # as its side is established, before ours is).
        self.ready = False
        # What this connection did, by name (0 for any other name, as a ``Counter``): a
        # ``defaultdict``, whose item assignment is a C slot (a ``Counter``'s is looked up
        # through its Python class on every update).
        self.stats: collections.defaultdict[str, int] = collections.defaultdict(int)

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
        self.sq = SendQueue(max(2, qp.config.max_send_wr), self.options.signal_every)
        privdata.check_receive_provisioning(self.local_pd, self.recv_pool.buffer_size)
        while (buf := self.recv_pool.try_get()) is not None:
            self._post_recv(buf)

    def established(self) -> None:
        """Our side of the handshake is complete: send and read what waited for it."""
        self.ready = True
        self._pump_reads()
        self._flush()

    def _flush(self) -> None:
        backlog = self._send_backlog
        while backlog and self.ready and not self.closed:
            if not self.sq.room(1 + len(backlog[0][2])):
                return
            buf = self.send_pool.try_get()
            if buf is None:
                return
            pieces, inv, writes = backlog.popleft()
            self._post_send(buf, pieces, inv, writes)

    def private_data(self, *, accept: bool) -> bytes:
        """What we send in our connect request or accept: the RFC 8797 block at offset 0,
        then the rtrext block when enabled (RT-X1), within the fabric's room (PD-11)."""
        caps = self.device.caps
        limit = caps.max_accept_private_data if accept else caps.max_connect_private_data
        return rtrext.private_data(self.local_pd, self.local_rtr, limit=limit)

    def negotiated(self, peer: bytes) -> None:
        """Thresholds from both blocks, afresh for this connection (PD-7, PD-9, PD-14); the
        rtrext extension only if both sides sent its block (RT-X1)."""
        self.peer_private_data = bytes(peer)  # as received (the conformance harness reads it)
        self.peer_pd = privdata.decode(peer)
        self._may_invalidate = None  # Send with Invalidate: decided again from these blocks
        self.rtr = rtrext.negotiate(
            self.local_rtr, rtrext.decode(peer), tbsn_send_room=self._tbsn_send_room
        )
        if self.server:
            self.thresholds = privdata.inline_thresholds(self.peer_pd, self.local_pd)
        else:
            self.thresholds = privdata.inline_thresholds(self.local_pd, self.peer_pd)
        log.info(
            "rdma %s: inline c->s %d s->c %d, peer R=%s, rtrext %s",
            self.peer,
            self.thresholds.client_to_server,
            self.thresholds.server_to_client,
            self.peer_pd.remote_invalidate if self.peer_pd else "none",
            self.rtr,
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
    def _wr_id(self, kind: str, ctx: WrContext) -> int:
        wr = next(self._wr)
        self._wr_ctx[wr] = (kind, ctx)
        return wr

    def _post_recv(self, buf: PooledBuffer) -> None:
        assert self.qp is not None
        wr = next(self._wr)
        self._wr_ctx[wr] = ("recv", buf)
        self.qp.post_recv(wr, buf.whole)

    def _send(
        self,
        pieces: list[Buffer],
        invalidate: int | None = None,
        writes: list[RdmaWriteRequest] | None = None,
        *,
        in_turn: bool = False,
    ) -> None:
        """Copy a transport message into a send buffer and post it (or queue it until the
        connection is established and a send buffer is free). ``in_turn``: the queue pair
        holds this loop turn's posts (``hold_sends``), so the Send need not be signalled."""
        if self.closed or self.qp is None:
            raise ConnectionError(f"rdma connection to {self.peer} is closed")
        # Messages leave in the order given: behind anything already waiting.
        buf = (
            self.send_pool.try_get()
            if self.ready and not self._send_backlog and self.sq.room(1 + len(writes or ()))
            else None
        )
        if buf is None:
            self._send_backlog.append((pieces, invalidate, writes or []))
            return
        self._post_send(buf, pieces, invalidate, writes, in_turn=in_turn)

    def _send_group(self, transmissions: list[list[Buffer]]) -> None:
        """The transmissions of one continued message, back to back (RT-6): posted here in
        one synchronous run, or queued together in order, so nothing comes between them."""
        for pieces in transmissions:
            self._send(pieces)
            self.stats["rtr_sends"] += 1

    def _post_send(
        self,
        buf: PooledBuffer,
        pieces: list[Buffer],
        invalidate: int | None,
        writes: list[RdmaWriteRequest] | None,
        *,
        in_turn: bool = False,
    ) -> None:
        qp = self.qp
        assert qp is not None
        view = buf.view
        n = 0
        for p in pieces:
            m = len(p)
            view[n : n + m] = p  # a piece beyond the buffer raises here
            n += m
        if self.tap is not None:
            self.tap(True, bytes(view[:n]))
        sq = self.sq
        # Every Send is signalled unless selective signalling is on (``signal_every`` > 1),
        # and only then is there a resource question to ask (``_pressure``); or unless it
        # goes out in a held list (``in_turn``), whose last work request the queue pair
        # signals at the end of the loop turn: that completion covers the list (an RC send
        # queue completes in order), and until then nothing it holds is needed again.
        if sq.signal_every <= 1:
            signaled = not in_turn
        else:
            signaled = sq.should_signal(1 + len(writes or ()), pressure=self._pressure(writes))
        wr = next(self._wr)
        self._wr_ctx[wr] = ("send", buf)
        sge = Sge(buf.addr, n, buf.lkey)  # within the buffer: the copy above checked
        if writes:
            qp.post_send(wr, [sge], invalidate_rkey=invalidate, writes=writes, signaled=signaled)
            sq.posted([*(w.wr_id for w in writes), wr], signaled)
        else:
            qp.post_send(wr, [sge], invalidate_rkey=invalidate, signaled=signaled)
            sq.posted([wr], signaled)
        st = self.stats
        st["sends"] += 1
        st["sends_signaled" if signaled else "sends_unsignaled"] += 1

    def _pressure(self, writes: list[RdmaWriteRequest] | None) -> bool:
        """Whether the Send about to be posted must be signalled for its resources' sake:
        few send buffers (or Write sources) left, messages waiting for one, or a Write out of
        memory registered for this one use (deregistered only once covered)."""
        reserve = self.sq.signal_every
        if self._send_backlog or self.send_pool.available < reserve:
            return True
        if not writes:
            return False
        pool = self.data_pool
        if pool is not None and pool.available < reserve:
            return True
        for w in writes:
            _, ctx = self._wr_ctx.get(w.wr_id, ("?", None))
            if isinstance(ctx, Scratch) and ctx.region is not None:
                return True
        return False

    def _scratch(self, length: int) -> Scratch:
        pool = self.data_pool
        if pool is not None and length <= pool.buffer_size:
            buf = pool.try_get()
            if buf is not None:
                return Scratch(buf, None)
        return Scratch(None, self._register(length, Access.LOCAL_WRITE))

    def _register(self, length: int, access: Access) -> MemoryRegion:
        region = self.device.pd.register(max(length, 1), access | Access.LOCAL_WRITE)
        self.stats["registrations"] += 1
        return region

    def _deliver(self, msg: Inbound) -> None:
        """``Connection._deliver``, again: a native method in the compiled build."""
        self.messages_received += 1
        receiver = self.receiver
        if receiver is not None:
            receiver(self, msg)

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
        if kind == "recv":  # the most frequent completion: not on the send queue
            if isinstance(ctx, PooledBuffer):
                self._on_recv(ev, ctx)
            if ev.status is not _SUCCESS and not self.closed and ev.status is not _FLUSHED:
                log.warning("rdma %s: recv completion failed: %s", self.peer, ev.status.name)
            return
        send_queue = kind in _SEND_QUEUE_KINDS
        if send_queue:  # unsignalled work requests before this one are done too
            for wr in self.sq.completed(ev.wr_id):
                self._release(wr)
        if kind == "send" and isinstance(ctx, PooledBuffer):
            ctx.release()
        elif kind == "read" and isinstance(ctx, InCall):
            self._on_read_done(ev, ctx)
        elif kind == "write" and isinstance(ctx, Scratch):
            ctx.release()  # the local source of one RDMA Write
        if ev.status is not _SUCCESS and not self.closed and ev.status is not _FLUSHED:
            log.warning("rdma %s: %s completion failed: %s", self.peer, kind, ev.status.name)
        if send_queue and not self.closed:  # room in the send queue: what waited for it
            if self._read_backlog:
                self._pump_reads()
            if self._send_backlog:
                self._flush()

    def _release(self, wr: int) -> None:
        """An unsignalled send or RDMA Write is covered: its buffer may be reused."""
        _, ctx = self._wr_ctx.pop(wr, ("?", None))
        if isinstance(ctx, (PooledBuffer, Scratch)):
            ctx.release()

    def _on_recv(self, ev: Completion, buf: PooledBuffer) -> None:
        if ev.status is not _SUCCESS:
            buf.release()
            return
        data = bytes(buf.view[: ev.byte_len])
        if self.closed or self.closing:
            buf.release()
            return
        self._post_recv(buf)  # the message is out of the buffer: give it back at once
        if self.tap is not None:
            self.tap(False, data)
        if ev.invalidated_rkey is not None:
            self.stats["remote_invalidations"] += 1
            self._forget_rkey(ev.invalidated_rkey)
        if data[12:16] == _RTREXT_PROC and self.rtr.enabled:  # rh.is_rtrext, inline
            self._on_rtr(data)
            return
        try:
            h = hdr.parse(data)
        except HeaderError as e:
            self._bad_header(e)
            return
        if self.reassembler.open is not None or self.reassembler.broken is not None:
            for fault in self.reassembler.plain(h.xid, rh.CALL, h.proc):
                self._on_fault(fault)
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

    def _on_rtr(self, data: bytes) -> None:
        """A transmission with an rtrext optional header (RT-X2, RT-6)."""
        self.stats["rtr_receives"] += 1
        try:
            m = rh.parse(data)
        except HeaderError as e:
            self._bad_header(e)
            return
        if m.ropt == rh.REPTERR:
            assert isinstance(m.body, rpcrdma.optrept_err)
            self._on_repterr(m.credit, m.body)
            return
        if m.ropt == rh.XMTREQ:
            limit = self.rtr.accept_limit
        elif m.ropt == rh.XMTRESP:
            limit = self._reply_lead(m)
        else:
            limit = 0  # XMTCONT: the open group's count governs
        view, placed = memoryview(data), memoryview(b"")
        local = self.local_rtr
        if local is not None and local.plt_segments and m.size < local.segment_size < len(data):
            view, placed = view[: local.segment_size], view[local.segment_size :]  # TBSN
        for ev in self.reassembler.feed(m, view[m.size :], limit=limit, placed=placed):
            if isinstance(ev, continuation.Fault):
                self._on_fault(ev)
            elif ev.direction == rh.CALL:
                self._on_continued_call(ev)
            else:
                self._on_continued_reply(ev)

    def _on_fault(self, fault: continuation.Fault) -> None:
        """A grouping or placement error (RT-6, RT-18), reported to the sender with REPTERR.
        A broken call: its requester resends it with plain v1 or fails it (RT-19). A broken
        reply to one of our calls: the call waits on; the responder resends the reply with
        plain v1 (RT-19, ``_resend_reply``), or the RPC times out."""
        self.stats["rtr_faults"] += 1
        log.info("rdma %s: rtrext error %s", self.peer, fault)
        self._send([rh.encode_repterr(fault, self.policy.grant)])

    def _bad_header(self, e: HeaderError) -> None:
        self.stats["bad_headers"] += 1
        log.info("rdma %s: %s", self.peer, e)
        if e.xid is None or e.err is None:
            return  # nothing to answer to
        if e.xid in self._out:
            # A reply we cannot parse: the call fails; the connection lives on.
            self._fail_call(e.xid, TransportCallError(f"unparsable reply: {e}"))
            return
        sent = "rdma_error_vers_sent" if e.err == hdr.ERR_VERS else "rdma_error_chunk_sent"
        self.stats[sent] += 1
        self._send([hdr.encode_error(e.xid, self.policy.grant, e.err, e.vers)])

    # -- what the requester and responder halves provide ----------------------------------
    def _on_call(
        self, h: Header, inline: memoryview, placed: dict[int, Buffer] | None = None
    ) -> None:
        raise NotImplementedError

    def _on_read_done(self, ev: Completion, call: InCall) -> None:
        raise NotImplementedError

    def _pump_reads(self) -> None:
        raise NotImplementedError

    def _on_reply(self, h: Header, inline: memoryview) -> None:
        raise NotImplementedError

    def _on_reply_error(self, h: Header) -> None:
        raise NotImplementedError

    def _reply_lead(self, m: rh.RtrMessage) -> int:
        raise NotImplementedError

    def _on_continued_call(self, group: continuation.Group) -> None:
        raise NotImplementedError

    def _on_continued_reply(self, group: continuation.Group) -> None:
        raise NotImplementedError

    def _on_repterr(self, credit: int, err: rpcrdma.optrept_err) -> None:
        raise NotImplementedError

    def _resend_reply(self, xid: int) -> None:
        raise NotImplementedError

    def _fail_call(self, xid: int, exc: BaseException) -> None:
        raise NotImplementedError

    def call_done(self, xid: int) -> None:
        raise NotImplementedError

    def _forget_rkey(self, rkey: int) -> None:
        raise NotImplementedError

    # -- teardown ----------------------------------------------------------------------
    def counters(self) -> str:
        """The connection's RDMA and rtrext counters, ``name=value`` (logged at close)."""
        names = ("sends", "sends_unsignaled", "rdma_reads", "rdma_writes", "read_chunks",
                 "write_chunks", "reply_chunks", *RTR_COUNTERS)  # fmt: skip
        line = " ".join(f"{n}={self.stats.get(n, 0)}" for n in names)  # none added
        # What crossed the verbs boundary, where the provider counts it (both of ours do);
        # still ``name=value`` only (tests and operators' scripts split the line on it).
        verbs = getattr(self.qp, "counts", None)
        if verbs:
            line += "".join(f" verbs_{k}={v}" for k, v in sorted(verbs.items()))
        return line

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
        for wr in self.sq.clear():  # no completion will come for these any more
            self._release(wr)
        self.reassembler.reset()
        self.kept_replies.clear()
        log.info("rdma %s: closed; %s", self.peer, self.counters())
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
