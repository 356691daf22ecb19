"""The requester half of an RPC-over-RDMA connection (a client's fore channel, a server's
back channel).

It registers per-RPC memory with the least access (remote read for Read chunks, remote write
for Write and Reply chunks) and deregisters it on every path: reply, RDMA_ERROR, timeout,
cancellation, disconnect (TR-20). Memory registered on one connection is never offered on
another (TR-24). It sends only within the credits the responder granted (TR-14, UL-24).

With ``RdmaOptions.batch_calls`` the Sends (and RDMA work) of the calls made in one loop turn
leave in one post of the queue pair (``hold_sends``), in submission order, as TCP writes them
together; each is within the credits and its memory registered as when posted alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from nfsrdma._mypyc import mypyc_attr
from nfsrdma.transport.base import Inbound, ReplyExpectation, TransportCallError
from nfsrdma.transport.rdma import continuation, rtrext_tbsn
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.calls import OutCall
from nfsrdma.transport.rdma.connection_base import RdmaConnectionBase
from nfsrdma.transport.rdma.header import Header, Segment
from nfsrdma.transport.rdma.marshal import plan_call
from nfsrdma.transport.rdma.provider import Access, MemoryRegion
from nfsrdma.xdr.gen import rpcrdma
from nfsrdma.xdr.runtime import Buffer, Reader, Writer

__all__ = ["RdmaErrorReply", "Requester"]

log = logging.getLogger(__name__)

_C = TypeVar("_C", bound=type)


def _python_class(cls: _C) -> _C:
    """Nothing, but a class decorator mypyc does not know keeps the class a Python class in
    the compiled build (a native class cannot derive from ``ConnectionError``)."""
    return cls


@_python_class
class RdmaErrorReply(TransportCallError):
    """The responder answered a call with RDMA_ERROR; ``header`` is that reply's header (its
    error code, and for ERR_VERS the version range)."""

    def __init__(self, message: str, header: Header) -> None:
        super().__init__(message)
        self.header = header


@mypyc_attr(allow_interpreted_subclasses=True)
class Requester(RdmaConnectionBase):
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

    def send_call(
        self, xid: int, msg: Writer, expect: ReplyExpectation | None, *, continued: bool = True
    ) -> None:
        """Send a call (``continued=False``: plain v1 even when rtrext is on)."""
        if self.closed or self.qp is None:
            raise ConnectionError(f"rdma connection to {self.peer} is closed")
        sinks = expect.sinks if expect is not None else []
        max_reply = expect.max_size if expect is not None else 0
        plan = plan_call(
            msg,
            send_limit=self.send_limit,
            recv_limit=self.recv_limit,
            sinks=[len(s) for s in sinks],
            max_reply=max_reply,
            max_write_chunks=self.options.max_write_chunks,
            max_read_chunks=self.options.max_read_chunks,
        )
        cont = None
        if self.rtr.tbsn and continued and plan.reads:
            cont = rtrext_tbsn.plan_tbsn_call(
                plan,
                segment=self.rtr.tbsn_segment,
                plt=self.rtr.tbsn_plt,
                send_limit=self.send_limit,
                recv_limit=self.recv_limit,
                max_reply=max_reply,
                call_limit=self.rtr.call_limit,
                reply_limit=self.rtr.reply_limit,
                credits_free=self.credits.free(),
            )
        if self.rtr.enabled and continued and cont is None:
            cont = continuation.plan_continued_call(
                plan,
                send_limit=self.send_limit,
                recv_limit=self.recv_limit,
                max_reply=max_reply,
                call_limit=self.rtr.call_limit,
                reply_limit=self.rtr.reply_limit,
                credits_free=self.credits.free(),
            )
        reads_needed = cont.reads if cont is not None else plan.reads
        reply_needed = plan.reply_chunk is not None and (cont is None or cont.offer_reply_chunk)
        if self.server and (reads_needed or plan.write_chunks or reply_needed):
            # A server's backward calls expose none of its memory (RFC 8267 section 6.5.2,
            # RFC 8166 section 9): a callback, or its reply, too large to go inline fails here.
            raise TransportCallError(
                f"backward call of {len(msg)} octets does not fit inline "
                f"({self.send_limit} to send, {self.recv_limit} to receive)"
            )
        out = OutCall(xid)
        reads = []
        for exposure in cont.reads if cont is not None else plan.reads:
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
        for capacity, sink in zip(plan.write_chunks, sinks, strict=False):
            region, direct = self._sink_region(sink, capacity)
            out.regions.append(region)
            out.sinks.append((region, sink, direct))
            writes.append([Segment(region.rkey, capacity, region.addr)])
            self.stats["write_chunks"] += 1
        reply = None
        if plan.reply_chunk is not None and (cont is None or cont.offer_reply_chunk):
            out.reply_region = self._register(plan.reply_chunk, Access.REMOTE_WRITE)
            out.regions.append(out.reply_region)
            reply = [Segment(out.reply_region.rkey, plan.reply_chunk, out.reply_region.addr)]
            self.stats["reply_chunks"] += 1
        self._out[xid] = out
        # With the other calls of this loop turn, one post; the Send unsignalled then (the
        # held list's last work request is signalled, and its completion covers the rest).
        held = self.options.batch_calls and self.qp.hold_sends()
        try:
            if cont is not None:
                out.plain_retry = (msg, expect)
                self._send_continued_call(xid, out, cont, reads, writes, reply)
            else:
                head = hdr.encode(xid, self.options.max_requests, plan.proc, reads, writes, reply)
                self.credits.sent()
                self._send([head, *plan.inline], in_turn=held)
        except Exception:
            self.call_done(xid)
            raise

    def send_raw(self, xid: int, message: bytes) -> None:
        """Send ``message`` (a transport header and what follows it, as given: invalid ones
        too) as a call with ``xid``, which stays outstanding until a reply or RDMA_ERROR for
        it arrives or ``call_done(xid)``. It holds no credit and exposes no memory. For
        conformance tests (``nfsrdma conform``); RPCs use ``send_call``."""
        if self.closed or self.qp is None:
            raise ConnectionError(f"rdma connection to {self.peer} is closed")
        self._out[xid] = OutCall(xid, counted=False)
        try:
            self._send([message])
        except Exception:
            self._out.pop(xid, None)
            raise

    def _send_continued_call(
        self,
        xid: int,
        out: OutCall,
        cont: continuation.ContinuedCall,
        reads: list[hdr.ReadChunk],
        writes: list[list[Segment]],
        reply: list[Segment] | None,
    ) -> None:
        """XMTREQ then XMTCONTs, back to back, holding a credit per transmission of the
        call or of the reply it reserved receives for (RT-6, RT-8, RT-9)."""
        out.held = cont.credits
        out.reply_transmissions = 1 + cont.rsbuf
        self.credits.sent(cont.credits)
        credit = self.options.max_requests
        sections = cont.sections
        first = rh.encode_xmtreq(
            xid,
            credit,
            count=len(sections),
            rsbuf=cont.rsbuf,
            pslen=sum(len(p) for p in sections[0]),
            dp=[*cont.tbsn_items, *(rh.exrw(c.position, c.segments) for c in reads)],
            writes=writes,
            reply=reply,
        )
        placed = cont.placed or [[] for _ in sections]  # TBSN: padding and PLT segments
        group = [[first, *sections[0], *placed[0]]]
        for n, sec in enumerate(sections[1:], 1):
            pslen = sum(len(p) for p in sec)
            group.append([rh.encode_xmtcont(xid, credit, xnum=n, pslen=pslen), *sec, *placed[n]])
        self.stats["rtr_calls"] += 1
        if cont.tbsn_items:
            self.stats["rtr_tbsn_calls"] += 1
        self._send_group(group)

    def _reply_lead(self, m: rh.RtrMessage) -> int:
        """The first transmission of a continued reply: the receives reserved beyond its count
        go back to the pool at once (RT-8). Returns the transmissions the reply may use."""
        out = self._out.get(m.xid)
        if out is None:
            return 0
        assert isinstance(m.body, rpcrdma.optxmt_resp)
        self.credits.update(m.credit)
        count = m.body.optxrs_count
        if out.counted and 1 <= count < out.held:
            self.credits.done(out.held - count)
            out.held = count
            self._wake_credit_waiter()
        return out.reply_transmissions

    def _on_continued_reply(self, group: continuation.Group) -> None:
        self.stats["rtr_replies"] += 1
        lead = group.lead.body
        if isinstance(lead, rpcrdma.optxmt_resp) and lead.optxrs_dp:
            # We offer no reply directions in phase 1, so nothing may have been excised.
            self._fail_call(group.xid, TransportCallError("continued reply with placed items"))
            return
        h = Header(group.xid, hdr.VERSION, group.lead.credit, hdr.RDMA_MSG)
        self._on_reply(h, memoryview(group.payload))

    def _on_repterr(self, credit: int, err: rpcrdma.optrept_err) -> None:
        """A peer reports a broken message of ours (RT-18). About a continued call: resend it
        once with plain v1 (position-zero Read chunk, Reply chunk), else fail it (RT-19).
        About a reply we sent: resend it with plain v1 (``_resend_reply``, RT-19)."""
        self.stats["rtr_repterr"] += 1
        self.credits.update(credit)
        msg = err.optre_lead or err.optre_bad  # the broken message
        xid = msg.xmsi_xid
        code = rpcrdma.optr_err(err.optre_info.optre_which).name
        log.info("rdma %s: REPTERR %s for xid %#x (%s)", self.peer, code, xid, msg.xmsi_dir.name)
        out = self._out.get(xid)
        if msg.xmsi_dir != rpcrdma.xms_dir.XMS_CALL:
            self.stats["rtr_repterr_replies"] += 1
            self._resend_reply(xid)
            return
        if out is None:
            return  # about a call no longer outstanding: counted only
        retry = out.plain_retry
        if retry is None:
            return  # already resent with plain v1: a late report about the first attempt
        self.call_done(xid)  # its registrations and credits go; the RPC waits on
        try:
            self.send_call(xid, *retry, continued=False)
        except Exception as e:
            self._fail_call(xid, TransportCallError(f"REPTERR {code}, then plain v1: {e}"))
            return
        self.stats["rtr_fallbacks"] += 1

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
        self._fail_call(h.xid, RdmaErrorReply(f"RDMA_ERROR {what} for xid {h.xid:#x}", h))

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
            self.credits.done(out.held)
        self._wake_credit_waiter()

    def _forget_rkey(self, rkey: int) -> None:
        """The peer invalidated ``rkey`` (Send with Invalidate); nothing more to do for it."""
        for out in self._out.values():
            for region in out.regions:
                if region.rkey == rkey:
                    region.deregister()
