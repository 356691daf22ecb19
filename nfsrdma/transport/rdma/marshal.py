"""Deciding how an RPC message crosses an RPC-over-RDMA connection (sans-IO).

Requester (``plan_call``): which DDP-eligible items of a call move to Read chunks, whether the
call is Short (RDMA_MSG) or Long (RDMA_NOMSG with a position-zero Read chunk, TR-9), which
Write chunks to offer for DDP-eligible results and whether a Reply chunk is needed (UL-3, TR-10).
It stays within RFC 8267's baseline by default (UL-18): one Write chunk, a position-zero chunk
and/or one other Read chunk.

Responder (``plan_reply``): the n-th Write chunk takes the n-th READ-class result (UL-13/14);
chunks without a matching item come back unused (UL-16); what is left goes inline (RDMA_MSG)
or, when larger than the threshold, into the Reply chunk (RDMA_NOMSG); otherwise ERR_CHUNK
(a reply resource overrun, TR-21). Segments are checked for room before any RDMA Write.

XDR round-up padding of a moved item is never transferred (TR-8): the chunk holds exactly the
item's bytes and the receiver restores the padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nfsrdma.transport.rdma.header import (
    ERR_CHUNK,
    RDMA_MSG,
    RDMA_NOMSG,
    Header,
    HeaderError,
    Segment,
    header_size,
)
from nfsrdma.xdr.runtime import Buffer, DdpItem, Writer

PLAIN_HEADER_SIZE: Final = header_size(0, [], None)  # RDMA_MSG with three empty chunk lists

# -- requester ---------------------------------------------------------------------------


@dataclass(slots=True)
class ReadExposure:
    """Data the requester exposes for the responder to RDMA Read."""

    position: int  # 0 for the position-zero chunk carrying the whole RPC call
    data: list[Buffer]  # its bytes, in pieces


class CallPlan:
    """How a call crosses. (``CallPlan`` and ``ReplyPlan`` are plain classes, not dataclasses:
    compiled, a dataclass's ``__init__`` stays interpreted, and one is made per message.)"""

    __slots__ = ("inline", "proc", "reads", "reply_chunk", "write_chunks")

    def __init__(
        self,
        proc: int,
        inline: list[Buffer],
        reads: list[ReadExposure] | None = None,
        write_chunks: list[int] | None = None,
        reply_chunk: int | None = None,
    ) -> None:
        self.proc = proc  # RDMA_MSG or RDMA_NOMSG
        self.inline = inline  # the RPC message after the header (RDMA_MSG); empty for NOMSG
        self.reads: list[ReadExposure] = [] if reads is None else reads
        # The capacity of each Write chunk, and of the Reply chunk if one is offered.
        self.write_chunks: list[int] = [] if write_chunks is None else write_chunks
        self.reply_chunk = reply_chunk

    @property
    def inline_size(self) -> int:
        return sum(len(p) for p in self.inline)


def _length(pieces: list[Buffer]) -> int:
    return sum(len(p) for p in pieces)


# The header of an RDMA_MSG call offering nothing but a Reply chunk of one segment.
_REPLY_CHUNK_HEADER_SIZE: Final = header_size(0, [], 1)


def plan_call(
    msg: Writer,
    *,
    send_limit: int,
    recv_limit: int,
    sinks: list[int] | None = None,
    max_reply: int = 0,
    max_write_chunks: int = 1,
    max_read_chunks: int = 1,
    direct: bool = True,
) -> CallPlan:
    """Plan a call. ``send_limit``/``recv_limit`` are the c→s and s→c inline thresholds
    (PD-7); ``sinks`` the sizes of the caller's buffers for DDP-eligible results in order;
    ``max_reply`` the largest the reply can be, DDP results excluded (UL-3).

    The common shape is decided directly: a call without DDP items or result buffers (a
    stat's, every small call) that fits inline, with a Reply chunk only when the reply could
    exceed the s→c threshold. Everything else, or everything with ``direct=False`` (the
    reference: tests compare the two), takes the general steps below."""
    if direct and not msg.ddp and not sinks:
        if max_reply + PLAIN_HEADER_SIZE > recv_limit:  # TR-10
            if _REPLY_CHUNK_HEADER_SIZE + len(msg) <= send_limit:
                return CallPlan(RDMA_MSG, [msg], [], [], max_reply)
        elif PLAIN_HEADER_SIZE + len(msg) <= send_limit:
            return CallPlan(RDMA_MSG, [msg], [], [], None)
    write_chunks = list((sinks or [])[:max_write_chunks])
    # A Reply chunk whenever the reply could exceed the s→c threshold (TR-10).
    reply_hdr = header_size(0, [1] * len(write_chunks), None)
    reply_chunk = max_reply if max_reply + reply_hdr > recv_limit else None
    reply_segs = None if reply_chunk is None else 1

    def hdr(reads: int) -> int:
        return header_size(reads, [1] * len(write_chunks), reply_segs)

    # Short call with everything inline (TR-13).
    if hdr(0) + len(msg) + sum(i.padded_length for i in msg.ddp) <= send_limit:
        return CallPlan(RDMA_MSG, msg.pieces(), [], write_chunks, reply_chunk)
    # Move DDP-eligible items (WRITE data, symlink text) to Read chunks (UL-1, TR-7).
    moved = [item for item in msg.ddp if item.data][:max_read_chunks]
    keep = {id(i) for i in moved}
    inline = msg.pieces(keep=lambda i: id(i) in keep)
    reads = [ReadExposure(msg.stream_position(i), [i.data]) for i in moved]
    if hdr(len(reads)) + _length(inline) <= send_limit:
        return CallPlan(RDMA_MSG, inline, reads, write_chunks, reply_chunk)
    # Long call: the rest of the message goes in a position-zero Read chunk (TR-9).
    return CallPlan(RDMA_NOMSG, [], [ReadExposure(0, inline), *reads], write_chunks, reply_chunk)


# -- responder ---------------------------------------------------------------------------


class RdmaWrite:
    """One RDMA Write to post: ``data`` into the peer's ``segment`` at ``segment_offset``."""

    __slots__ = ("data", "segment", "segment_offset")

    def __init__(self, data: memoryview, segment: Segment, segment_offset: int) -> None:
        self.data = data
        self.segment = segment
        self.segment_offset = segment_offset

    def __repr__(self) -> str:
        return f"RdmaWrite({bytes(self.data)!r}, {self.segment!r}, {self.segment_offset})"


class ReplyPlan:
    __slots__ = ("inline", "proc", "reply", "write_list", "writes")

    def __init__(
        self,
        proc: int,
        writes: list[RdmaWrite],
        write_list: list[list[Segment]],
        reply: list[Segment] | None,
        inline: list[Buffer],
    ) -> None:
        self.proc = proc  # RDMA_MSG or RDMA_NOMSG
        self.writes = writes  # post these before the Send (TR-19)
        self.write_list = write_list  # returned Write list, lengths cut to what was written
        self.reply = reply  # returned Reply chunk (lengths written), if one was offered
        self.inline = inline  # the RPC message after the header (RDMA_MSG)


def _scatter(data: memoryview, segments: list[Segment]) -> tuple[list[RdmaWrite], list[Segment]]:
    """Spread ``data`` over ``segments`` in order; returns the writes and the segments with
    their lengths cut to what they received. The caller checked the room."""
    writes: list[RdmaWrite] = []
    written: list[Segment] = []
    pos = 0
    for seg in segments:
        n = min(seg.length, len(data) - pos)
        if n > 0:
            writes.append(RdmaWrite(data[pos : pos + n], seg, 0))
        written.append(Segment(seg.handle, max(n, 0), seg.offset))
        pos += max(n, 0)
    return writes, written


def _capacity(segments: list[Segment]) -> int:
    return sum(s.length for s in segments)


# The header of an RDMA_MSG reply returning one Write chunk of one segment, no Reply chunk.
_ONE_SEGMENT_REPLY_HEADER: Final = header_size(0, [1], None)


def plan_reply(msg: Writer, call: Header, send_limit: int) -> ReplyPlan:
    """Plan a reply to ``call`` (whose Write list and Reply chunk are the resources offered).
    Raises HeaderError(ERR_CHUNK) for a reply resource overrun.

    The common shapes are decided directly: a reply with no DDP item to a call that offered
    no chunks, and a READ's reply (one DDP item, the first operation's) to a call that
    offered one Write chunk of one segment and no Reply chunk, when the rest fits inline.
    Everything else, and any of those that does not fit, takes ``plan_reply_generic``, the
    reference (tests compare the two)."""
    writes = call.writes
    if call.reply is None:
        ddp = msg.ddp
        if not writes and not ddp:
            if PLAIN_HEADER_SIZE + len(msg) <= send_limit:
                return ReplyPlan(RDMA_MSG, [], [], None, [msg])
        elif len(writes) == 1 and len(ddp) == 1 and ddp[0].tag == 0:
            chunk = writes[0]
            if len(chunk) == 1 and _ONE_SEGMENT_REPLY_HEADER + len(msg) <= send_limit:
                seg = chunk[0]
                data = memoryview(ddp[0].data).cast("B")
                n = len(data)
                if n <= seg.length:
                    returned = Segment(seg.handle, n, seg.offset)
                    return ReplyPlan(
                        RDMA_MSG, [RdmaWrite(data, seg, 0)] if n else [], [[returned]], None, [msg]
                    )
    return plan_reply_generic(msg, call, send_limit)


def plan_reply_generic(msg: Writer, call: Header, send_limit: int) -> ReplyPlan:
    """``plan_reply`` for any reply and any resources offered."""
    writes: list[RdmaWrite] = []
    write_list: list[list[Segment]] = []
    moved: set[int] = set()
    by_tag: dict[int, DdpItem] = {}
    for d in msg.ddp:
        by_tag.setdefault(d.tag, d)
    for n, chunk in enumerate(call.writes):
        item = by_tag.get(n)
        if item is None or not chunk:
            # No DDP-eligible result for this chunk (an error arm, or fewer READs): the chunk
            # comes back unused, keeping later chunks paired (UL-16).
            write_list.append([Segment(s.handle, 0, s.offset) for s in chunk])
            continue
        data = memoryview(item.data).cast("B")
        if len(data) > _capacity(chunk):
            raise HeaderError(
                f"Write chunk of {_capacity(chunk)} bytes for {len(data)} bytes",
                call.xid,
                ERR_CHUNK,
            )
        w, returned = _scatter(data, chunk)
        writes += w
        write_list.append(returned)
        moved.add(id(item))
    inline = msg.pieces(keep=lambda i: id(i) in moved)
    size = _length(inline)
    reply_segs = None if call.reply is None else len(call.reply)
    hdr = header_size(0, [len(c) for c in write_list], reply_segs)
    if hdr + size <= send_limit:
        reply = None if call.reply is None else [Segment(s.handle, 0, s.offset) for s in call.reply]
        return ReplyPlan(RDMA_MSG, writes, write_list, reply, inline)
    if call.reply is None or _capacity(call.reply) < size:
        offered = 0 if call.reply is None else _capacity(call.reply)
        raise HeaderError(
            f"reply of {size} bytes exceeds the threshold and the Reply chunk ({offered})",
            call.xid,
            ERR_CHUNK,
        )
    body = memoryview(b"".join(inline))
    w, returned = _scatter(body, call.reply)
    return ReplyPlan(RDMA_NOMSG, writes + w, write_list, returned, [])
