"""The responder half of an RPC-over-RDMA connection (a server's fore channel, a client's
back channel).

It checks chunk lists before any RDMA operation (TR-17, TR-21), pulls Read chunks with RDMA
Reads within the negotiated ORD (TR-26), answers ERR_VERS / ERR_CHUNK with the call's XID
(TR-3, TR-16), posts its RDMA Writes before the Send that completes the RPC (TR-19), and grants
credits in every reply (TR-14).

READ data need not be copied on its way out: ``lend`` gives the upper layer registered memory
for it (the READ reads the file straight into it), and an RDMA Write whose data lies in such
memory goes out from there. Data anywhere else is copied into registered memory first.
"""

from __future__ import annotations

import logging

from nfsrdma._mypyc import mypyc_attr
from nfsrdma.transport.base import Inbound
from nfsrdma.transport.rdma import continuation, placement, privdata, rtrext_tbsn
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.calls import CallContext, InCall, Scratch
from nfsrdma.transport.rdma.header import Header, HeaderError, Segment
from nfsrdma.transport.rdma.marshal import plan_reply
from nfsrdma.transport.rdma.pool import memory_address
from nfsrdma.transport.rdma.provider import Completion, RdmaWriteRequest, Sge, WcStatus
from nfsrdma.transport.rdma.requester import Requester
from nfsrdma.xdr.gen import rpcrdma
from nfsrdma.xdr.runtime import Buffer, Reader, Writer

__all__ = ["Responder"]

log = logging.getLogger(__name__)


@mypyc_attr(allow_interpreted_subclasses=True)
class Responder(Requester):
    """The responder half, over the requester half: one chain of classes, as mypyc's native
    classes have one base each (the two halves define disjoint methods, so the order is
    the old ``RdmaConnection(Requester, Responder)``'s method resolution order)."""

    def _on_call(
        self, h: Header, inline: memoryview, placed: dict[int, Buffer] | None = None
    ) -> None:
        self._inbound_calls += 1
        if self._inbound_calls > self.policy.grant + self.options.backchannel:
            log.warning(
                "rdma %s: calls beyond the %d credits granted", self.peer, self.policy.grant
            )
            self.stats["credit_overruns"] += 1
            self.close()
            return
        if not h.reads and not placed:
            self._on_short_call(h, inline)
        else:
            self._on_any_call(h, inline, placed)

    def _on_any_call(
        self, h: Header, inline: memoryview, placed: dict[int, Buffer] | None = None
    ) -> None:
        """A call within the credits: checked, its Read chunks pulled, then delivered (the
        reference for ``_on_short_call``)."""
        zero = [c for c in h.reads if c.position == 0]
        msg_len = zero[0].length if zero else len(inline)
        try:
            hdr.check_call(h, msg_len, self.options.limits)
        except HeaderError as e:
            self._inbound_calls -= 1
            self._bad_header(e)
            return
        st = self.stats  # what this call brought and offered (nfsrdma.stats.collect)
        st["calls_long" if zero else "calls_inline"] += 1
        st["read_chunks_received"] += len(h.reads) - len(zero)
        st["write_chunks_offered"] += len(h.writes)
        st["reply_chunks_offered"] += h.reply is not None
        call = InCall(h, inline)
        if placed:  # items that came in Sends (TBSN): already here, no RDMA Read
            call.chunks.update(placed)
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

    def _on_short_call(self, h: Header, inline: memoryview) -> None:
        """``_on_any_call`` for a call without Read chunks (nearly every call): nothing to
        pull, so it goes up at once, without the assembly state of one waiting for RDMA Reads."""
        try:
            hdr.check_call(h, len(inline), self.options.limits)
        except HeaderError as e:
            self._inbound_calls -= 1
            self._bad_header(e)
            return
        st = self.stats  # what this call brought and offered (nfsrdma.stats.collect)
        st["calls_inline"] += 1
        if h.writes:
            st["write_chunks_offered"] += len(h.writes)
        if h.reply is not None:
            st["reply_chunks_offered"] += 1
        self._deliver(Inbound(Reader(inline, None), CallContext(h, [])))

    def _on_continued_call(self, group: continuation.Group) -> None:
        """A call that came as an XMTREQ group: its EXRW items are Read chunks, its Write
        chunks and Reply chunk those of v1, then the usual path (RT-13, RT-16)."""
        body = group.lead.body
        assert isinstance(body, rpcrdma.optxmt_req)
        xid = group.xid
        local = self.local_rtr
        segment, plt = (local.segment_size, local.plt_segments) if local else (0, 0)
        problem = placement.check_items(
            body.optxrq_dp,
            placement.Context(
                request=True,
                payload=len(group.payload),
                segment_size=segment,
                plt_segments=group.count * plt,  # numbered across the group (RT-14, RT-17)
            ),
        )
        placed: dict[int, Buffer] = {}
        for item in body.optxrq_dp if problem is None else ():
            if item.xmdmi_where.xmdl_type == rpcrdma.xmdp_type.XMPTYPE_TBSN:
                got = rtrext_tbsn.resolve(item, group.placed, segment=segment, plt=plt)
                if isinstance(got, placement.Violation):
                    problem = got
                    break
                placed[item.xmdmi_disp] = got
        if problem is not None:
            if not problem.repterr:  # Table 1: the header as a whole is unusable
                self._bad_header(HeaderError(problem.why, xid, hdr.ERR_CHUNK))
                return
            bad = rpcrdma.xms_id(xid, rpcrdma.xms_dir.XMS_CALL, 0)
            self._on_fault(
                continuation.Fault(problem.code, bad, None, value_range=problem.value_range)
            )
            return
        reads = []
        for item in body.optxrq_dp:
            where = item.xmdmi_where
            if not isinstance(where.value, list):
                continue  # TBSN: placed above
            segs = [Segment(s.handle, s.length, s.offset) for s in where.value]
            reads.append(hdr.ReadChunk(item.xmdmi_disp, segs))
        h = Header(
            group.xid,
            hdr.VERSION,
            group.lead.credit,
            hdr.RDMA_MSG,
            reads=reads,
            writes=[rh.segments(c) for c in body.optxrq_writes],
            reply=None if body.optxrq_repch is None else rh.segments(body.optxrq_repch),
            reply_transmissions=1 + body.optxrq_rsbuf,
        )
        self.stats["rtr_calls_received"] += 1
        self.stats["rtr_tbsn_items"] += len(placed)
        self._on_call(h, memoryview(group.payload), placed)

    @property
    def max_reads(self) -> int:
        """RDMA Reads outstanding at once: our option, within the negotiated ORD (TR-26)."""
        ord_ = self.qp.initiator_depth if self.qp is not None else 0
        return max(1, min(self.options.max_reads, ord_ or self.options.max_reads))

    def _read(self, call: InCall, sge: Sge, seg: Segment) -> None:
        self.stats["rdma_reads"] += 1
        self._read_backlog.append((self._wr_id("read", call), sge, seg.offset, seg.handle))
        self._pump_reads()

    def _pump_reads(self) -> None:
        """Post queued RDMA Reads within the ORD, once the connection is established."""
        while (
            self._read_backlog
            and self.ready
            and self._reads_in_flight < self.max_reads
            and self.sq.room(1)
        ):
            wr, sge, addr, rkey = self._read_backlog.popleft()
            self._reads_in_flight += 1
            assert self.qp is not None
            self.qp.post_rdma_read(wr, [sge], addr, rkey)
            self.sq.posted([wr], True)

    def _on_read_done(self, ev: Completion, call: InCall) -> None:
        self._reads_in_flight -= 1
        self._pump_reads()
        if ev.status is not WcStatus.SUCCESS:
            return  # the connection breaks; teardown releases the call
        call.pending_reads -= 1
        if call.pending_reads == 0:
            self._assembling.pop(id(call), None)
            self._deliver_call(call)

    def _deliver_call(self, call: InCall) -> None:
        reader = Reader(call.message, call.chunks or None)
        self._deliver(Inbound(reader, CallContext(call.header, call.scratch)))

    def lend(self, request: Inbound, size: int) -> memoryview | None:
        """Registered memory for READ data of the reply to ``request``, when that reply can
        carry it by RDMA Write (the call offered a Write chunk); taken back in ``send_reply``."""
        ctx = request.context
        if not isinstance(ctx, CallContext) or not ctx.header.writes or self.closed:
            return None
        local = self._scratch(size)
        ctx.lent.append(local)
        return local.view[:size]

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        ctx = request.context
        assert isinstance(ctx, CallContext)
        self._inbound_calls = max(0, self._inbound_calls - 1)
        for local in ctx.scratch:
            local.release()  # the call's chunk data has been consumed by now
        lent, ctx.lent = ctx.lent, []
        try:
            self._send_reply(ctx, msg, lent)
        finally:
            for local in lent:  # lent memory no RDMA Write went out of
                local.release()

    def _send_reply(self, ctx: CallContext, msg: Writer, lent: list[Scratch]) -> None:
        h = ctx.header
        if self.rtr.enabled and h.reply_transmissions > 1:
            sections = continuation.plan_continued_reply(
                msg, len(h.writes), self.send_limit, h.reply_transmissions
            )
            if sections is not None:
                if lent:  # sent by Sends only: lent memory is taken back, its data copied
                    sections = [
                        [bytes(p) if _lent_for(p, lent) else p for p in sec] for sec in sections
                    ]
                self._send_continued_reply(h.xid, sections)
                self.kept_replies.keep(h, sections)  # until a REPTERR may ask for it (RT-19)
                return
        try:
            plan = plan_reply(msg, h, self.send_limit)
        except HeaderError as e:
            log.info("rdma %s: %s", self.peer, e)
            self.stats["reply_overruns"] += 1
            self.stats["rdma_error_chunk_sent"] += 1
            self._send([hdr.encode_error(h.xid, self.policy.grant, hdr.ERR_CHUNK)])
            return
        st = self.stats
        writes: list[RdmaWriteRequest] = []
        if plan.writes:
            # Never signalled: the Send posted after them in the same chain is, or a later
            # work request, and its completion covers them (an RC send queue completes in
            # order); one that fails still completes, in error, and breaks the connection.
            for write in plan.writes:
                n = len(write.data)
                found = _lent_for(write.data, lent) if lent else None
                if found is not None:
                    local, offset = found  # READ data already in registered memory: no copy
                    lent.remove(local)
                    st["rdma_writes_in_place"] += 1
                else:
                    local, offset = self._scratch(n), 0
                    local.view[:n] = write.data
                    st["rdma_write_bytes_copied"] += n
                seg = write.segment
                writes.append(
                    RdmaWriteRequest(
                        self._wr_id("write", local),  # released once a completion covers it
                        [local.sge(offset, n)],
                        seg.offset + write.segment_offset,
                        seg.handle,
                        False,
                    )
                )
            st["rdma_writes"] += len(writes)
        st["replies_long" if plan.proc == hdr.RDMA_NOMSG else "replies_inline"] += 1
        if plan.write_list:
            filled = 0
            for c in plan.write_list:
                if c and c[0].length:
                    filled += 1
            st["write_chunks_filled"] += filled
        inline = plan.inline
        if lent:  # lent memory is taken back now: what the Send still holds of it is copied
            inline = [bytes(p) if _lent_for(p, lent) else p for p in inline]
        head = hdr.encode(h.xid, self.policy.grant, plan.proc, [], plan.write_list, plan.reply)
        # The RDMA Writes go ahead of the Send in one post (TR-19: RC ordering).
        self._send([head, *inline], self._invalidate_for(h), writes)

    def _send_continued_reply(self, xid: int, sections: list[list[Buffer]]) -> None:
        """XMTRESP then XMTCONTs, back to back, within the receives reserved (RT-6, RT-8)."""
        grant = self.policy.grant
        pslen = sum(len(p) for p in sections[0])
        group = [[rh.encode_xmtresp(xid, grant, count=len(sections), pslen=pslen), *sections[0]]]
        for n, sec in enumerate(sections[1:], 1):
            pslen = sum(len(p) for p in sec)
            group.append([rh.encode_xmtcont(xid, grant, xnum=n, pslen=pslen), *sec])
        self.stats["rtr_replies_sent"] += 1
        self._send_group(group)

    def _resend_reply(self, xid: int) -> None:
        """The requester reported our continued reply to ``xid`` broken (REPTERR): resend it
        with plain v1 (RT-19), in the Reply chunk if the call offered one. A reply that does
        not fit inline without one, or that is no longer kept, is answered RDMA_ERROR /
        ERR_CHUNK, so the RPC fails at once instead of timing out."""
        kept = self.kept_replies.take(xid)
        if kept is None:
            log.info("rdma %s: REPTERR about a reply to %#x not kept", self.peer, xid)
            self.stats["rdma_error_chunk_sent"] += 1
            self._send([hdr.encode_error(xid, self.policy.grant, hdr.ERR_CHUNK)])
            return
        call, message = kept
        msg = Writer(message)
        self.stats["rtr_replies_resent"] += 1
        self._send_reply(CallContext(call.replace(reply_transmissions=1), []), msg, [])

    def _invalidate_for(self, h: Header) -> int | None:
        """Send with Invalidate of one STag of this XID's chunks, when both peers set R and
        the device can (PD-15, PD-16, SEC-5)."""
        writes = h.writes
        if not writes and h.reply is None and not h.reads:
            return None  # no STag to invalidate
        may = self._may_invalidate
        if may is None:  # decided once both private data blocks are known
            may = self._may_invalidate = privdata.responder_may_send_with_invalidate(
                self.local_pd.remote_invalidate, self.peer_pd, self.device.caps.remote_invalidate
            )
        if not may:
            return None
        if len(writes) == 1 and len(writes[0]) == 1 and h.reply is None and not h.reads:
            return writes[0][0].handle  # a READ's one segment: its only STag
        keys = sorted(h.rkeys())
        return keys[0] if keys else None


def _lent_for(data: Buffer, lent: list[Scratch]) -> tuple[Scratch, int] | None:
    """The lent buffer ``data`` lies in, and its offset there."""
    addr = memory_address(data)
    if addr is None:
        return None
    n = len(data)
    for local in lent:
        base = local.memory
        if base is not None and base <= addr and addr + n <= base + len(local.view):
            return local, addr - base
    return None
