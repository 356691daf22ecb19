"""The RPC-over-RDMA version 1 transport header (RFC 8166 section 4), checked.

``parse`` turns received bytes into a ``Header`` whose chunk lists are grouped the way the
protocol means them (Read segments with one position form one Read chunk), or raises
``HeaderError`` saying which RDMA_ERROR answers it (TR-3 ERR_VERS, TR-17 ERR_CHUNK).
``check_call`` applies a responder's limits to a call's chunks (UL-18 baseline and beyond).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NamedTuple

from nfsrdma.xdr.gen import rpcrdma
from nfsrdma.xdr.runtime import Reader, Writer, XdrError

VERSION: Final = 1
MIN_INLINE: Final = 1024  # the default and minimum inline threshold (RFC 8166 section 3.3.3)
_FIXED: Final = struct.Struct(">IIII")  # xid, vers, credit, proc
# RDMA_MSG with three empty chunk lists: the header of nearly every inline message.
_PLAIN: Final = struct.Struct(">IIIIIII")
_PLAIN_SIZE: Final = 28  # _PLAIN.size
_NO_CHUNKS: Final = bytes(12)
# RDMA_MSG with an empty Read list, one Write chunk of n segments (the next word), then the
# ends of the Write list and an absent Reply chunk: a READ call of the Linux client, and the
# reply to it.
_ONE_WRITE: Final = struct.Struct(">III")  # read list end, write chunk present, segment count
_ONE_WRITE_REPLY: Final = struct.Struct(">IIIIIII")  # the fixed words, then _ONE_WRITE's
_SEGMENT: Final = struct.Struct(">IIQ")  # handle, length, offset
_NO_MORE: Final = bytes(8)  # write list end, no reply chunk
_ERR_VERS_BODY: Final = struct.Struct(">III")  # ERR_VERS, rdma_vers_low, rdma_vers_high

# Plain ints (the generated enums' values): compared natively when compiled, and faster
# than enum members in the pure build too.
RDMA_MSG: Final = int(rpcrdma.rdma_proc.RDMA_MSG)
RDMA_NOMSG: Final = int(rpcrdma.rdma_proc.RDMA_NOMSG)
RDMA_ERROR: Final = int(rpcrdma.rdma_proc.RDMA_ERROR)
ERR_VERS: Final = int(rpcrdma.rpc_rdma_errcode.ERR_VERS)
ERR_CHUNK: Final = int(rpcrdma.rpc_rdma_errcode.ERR_CHUNK)


class Segment(NamedTuple):
    """A plain RDMA segment: ``length`` bytes at ``offset`` in the peer's memory ``handle``."""

    handle: int
    length: int
    offset: int


@dataclass(slots=True)
class ReadChunk:
    """One Read chunk: the segments that carry the XDR data item at ``position``."""

    position: int
    segments: list[Segment]

    @property
    def length(self) -> int:
        return sum(s.length for s in self.segments)


class Header:
    """A parsed transport header. A plain class, not a dataclass: compiled, a dataclass's
    ``__init__`` stays interpreted, and one is made for every message."""

    __slots__ = (
        "credit",
        "error",
        "proc",
        "reads",
        "reply",
        "reply_transmissions",
        "size",
        "vers",
        "vers_range",
        "writes",
        "xid",
    )

    def __init__(
        self,
        xid: int,
        vers: int,
        credit: int,
        proc: int,
        reads: list[ReadChunk] | None = None,
        writes: list[list[Segment]] | None = None,
        reply: list[Segment] | None = None,
        error: int | None = None,  # RDMA_ERROR: ERR_VERS or ERR_CHUNK
        vers_range: tuple[int, int] | None = None,  # RDMA_ERROR / ERR_VERS
        size: int = 0,  # bytes of header; for RDMA_MSG the RPC message starts here
        # rtrext: transmissions the reply may use (1 + the receives the requester reserved)
        reply_transmissions: int = 1,
    ) -> None:
        self.xid = xid
        self.vers = vers
        self.credit = credit
        self.proc = proc
        self.reads: list[ReadChunk] = [] if reads is None else reads
        self.writes: list[list[Segment]] = [] if writes is None else writes
        self.reply = reply
        self.error = error
        self.vers_range = vers_range
        self.size = size
        self.reply_transmissions = reply_transmissions

    def replace(self, *, reply_transmissions: int) -> Header:
        """This header with another ``reply_transmissions``."""
        h = Header(self.xid, self.vers, self.credit, self.proc, self.reads, self.writes)
        h.reply, h.error, h.vers_range, h.size = self.reply, self.error, self.vers_range, self.size
        h.reply_transmissions = reply_transmissions
        return h

    def __repr__(self) -> str:
        return (
            f"Header(xid={self.xid:#x}, vers={self.vers}, credit={self.credit}, "
            f"proc={self.proc}, reads={self.reads!r}, writes={self.writes!r}, "
            f"reply={self.reply!r}, error={self.error}, size={self.size})"
        )

    def rkeys(self) -> set[int]:
        keys = {s.handle for c in self.reads for s in c.segments}
        keys |= {s.handle for c in self.writes for s in c}
        if self.reply:
            keys |= {s.handle for s in self.reply}
        return keys


class HeaderError(Exception):
    """A header that cannot be processed. ``err`` is the RDMA_ERROR to answer with (when the
    XID is known), or None when the message must be dropped."""

    def __init__(self, reason: str, xid: int | None, err: int | None, vers: int = VERSION) -> None:
        super().__init__(reason)
        self.xid = xid
        self.err = err
        self.vers = vers  # the failing message's rdma_vers, which an RDMA_ERROR echoes


@dataclass(frozen=True, slots=True)
class ChunkLimits:
    """What a responder accepts. The defaults are above RFC 8267's baseline (UL-18): a
    position-zero Read chunk plus one other, one Write chunk, 16 segments per chunk."""

    max_segments: int = 16  # per chunk
    max_read_chunks: int = 2  # distinct non-zero positions
    max_write_chunks: int = 1
    max_segment_length: int = 1 << 24
    max_chunk_bytes: int = 4 << 20  # per chunk, and all Read chunks together


def _segment(s: rpcrdma.xdr_rdma_segment) -> Segment:
    return Segment(s.handle, s.length, s.offset)


def parse(buf: memoryview | bytes) -> Header:
    """Decode a transport header. Raises HeaderError (TR-3, TR-4, TR-17)."""
    if len(buf) < 4:
        raise HeaderError("message shorter than an XID", None, None)
    if len(buf) < 16:
        xid = struct.unpack_from(">I", buf)[0]
        raise HeaderError("truncated transport header", xid, ERR_CHUNK)
    xid, vers, credit, proc = _FIXED.unpack_from(buf)
    if vers != VERSION:
        if proc == RDMA_ERROR and len(buf) >= 28 and _ERR_VERS_BODY.unpack_from(buf, 16)[0] == 1:
            # ERR_VERS answering a call of another version carries that call's rdma_vers
            # (RFC 8166 section 4.5): a requester reads the responder's range from it.
            _, low, high = _ERR_VERS_BODY.unpack_from(buf, 16)
            return Header(xid, vers, credit, proc, error=ERR_VERS, vers_range=(low, high), size=28)
        raise HeaderError(f"RPC-over-RDMA version {vers}", xid, ERR_VERS, vers)
    if proc == RDMA_MSG:
        if buf[16:_PLAIN_SIZE] == _NO_CHUNKS:
            return Header(xid, vers, credit, proc, size=_PLAIN_SIZE)
        if len(buf) >= 36:
            no_reads, one_write, n = _ONE_WRITE.unpack_from(buf, 16)
            end = 28 + 16 * n
            if no_reads == 0 and one_write == 1 and buf[end : end + 8] == _NO_MORE:
                segments = [Segment(*_SEGMENT.unpack_from(buf, at)) for at in range(28, end, 16)]
                return Header(xid, vers, credit, proc, writes=[segments], size=end + 8)
    return _parse_lists(buf, xid, vers, credit, proc)


def _parse_lists(buf: memoryview | bytes, xid: int, vers: int, credit: int, proc: int) -> Header:
    """The chunk lists of any header, by the generated decoder (``parse``'s general case)."""
    try:
        body, end = rpcrdma.dec_rdma_body(Reader(buf), 12)
    except XdrError as e:
        raise HeaderError(f"malformed transport header: {e}", xid, ERR_CHUNK) from None
    h = Header(xid, vers, credit, proc, size=end)
    v = body.value
    if proc == RDMA_ERROR:
        assert isinstance(v, rpcrdma.rpc_rdma_error)
        h.error = int(v.err)
        if isinstance(v.value, rpcrdma.rpc_rdma_errvers):
            h.vers_range = (v.value.rdma_vers_low, v.value.rdma_vers_high)
        return h
    if proc not in (RDMA_MSG, RDMA_NOMSG):
        raise HeaderError(f"transport procedure {proc} is not to be used", xid, ERR_CHUNK)
    assert isinstance(v, rpcrdma.rpc_rdma_header | rpcrdma.rpc_rdma_header_nomsg)
    for rc in v.rdma_reads:
        if h.reads and h.reads[-1].position == rc.position:
            h.reads[-1].segments.append(_segment(rc.target))
        else:
            h.reads.append(ReadChunk(rc.position, [_segment(rc.target)]))
    h.writes = [[_segment(s) for s in wc.target] for wc in v.rdma_writes]
    if v.rdma_reply is not None:
        h.reply = [_segment(s) for s in v.rdma_reply.target]
    return h


def check_call(h: Header, inline_len: int, limits: ChunkLimits) -> None:
    """A responder's checks of a call's chunks before any RDMA operation (TR-17, TR-21,
    SEC-7, SEC-8). ``inline_len`` is the RPC message's length (inline, or for RDMA_NOMSG the
    position-zero chunk's). Raises HeaderError(ERR_CHUNK)."""
    if not h.reads and h.reply is None and len(h.writes) <= 1:
        # A call without Read or Reply chunks (every small call, a READ): its Write chunk
        # is all there is to check.
        for segs in h.writes:
            _check_chunk(h, segs, limits)
        if len(h.writes) > limits.max_write_chunks:
            raise HeaderError(
                f"{len(h.writes)} Write chunks (limit {limits.max_write_chunks})", h.xid, ERR_CHUNK
            )
        if h.proc == RDMA_NOMSG:
            raise HeaderError(
                "RDMA_NOMSG call without a position-zero Read chunk", h.xid, ERR_CHUNK
            )
        return
    _check_call_chunks(h, inline_len, limits)


def _check_chunk(h: Header, segs: list[Segment], limits: ChunkLimits) -> None:
    if len(segs) > limits.max_segments:
        raise HeaderError(
            f"a chunk of {len(segs)} segments (limit {limits.max_segments})", h.xid, ERR_CHUNK
        )
    if len(segs) == 1:  # a READ's Write chunk: the same checks without the generators
        n = segs[0].length
        if n > limits.max_segment_length:
            raise HeaderError("a segment longer than the limit", h.xid, ERR_CHUNK)
        if n > limits.max_chunk_bytes:
            raise HeaderError("a chunk larger than the limit", h.xid, ERR_CHUNK)
        return
    if any(s.length > limits.max_segment_length for s in segs):
        raise HeaderError("a segment longer than the limit", h.xid, ERR_CHUNK)
    if sum(s.length for s in segs) > limits.max_chunk_bytes:
        raise HeaderError("a chunk larger than the limit", h.xid, ERR_CHUNK)


def _check_call_chunks(h: Header, inline_len: int, limits: ChunkLimits) -> None:
    """``check_call`` for any call."""

    def fail(reason: str) -> HeaderError:
        return HeaderError(reason, h.xid, ERR_CHUNK)

    chunks = [c.segments for c in h.reads] + h.writes + ([h.reply] if h.reply else [])
    for segs in chunks:
        if len(segs) > limits.max_segments:
            raise fail(f"a chunk of {len(segs)} segments (limit {limits.max_segments})")
        if any(s.length > limits.max_segment_length for s in segs):
            raise fail("a segment longer than the limit")
        if sum(s.length for s in segs) > limits.max_chunk_bytes:
            raise fail("a chunk larger than the limit")
    if len(h.writes) > limits.max_write_chunks:
        raise fail(f"{len(h.writes)} Write chunks (limit {limits.max_write_chunks})")
    positions = [c.position for c in h.reads]
    if len(set(positions)) != len(positions) or positions != sorted(positions):
        raise fail("Read chunks out of order")
    zero = [c for c in h.reads if c.position == 0]
    others = [c for c in h.reads if c.position != 0]
    if h.proc == RDMA_NOMSG and not zero and h.reply is None:
        raise fail("RDMA_NOMSG call without a position-zero Read chunk")
    if h.proc == RDMA_MSG and zero:
        raise fail("RDMA_MSG with a position-zero Read chunk")
    if len(others) > limits.max_read_chunks:
        raise fail(f"{len(others)} Read chunks (limit {limits.max_read_chunks})")
    if sum(c.length for c in h.reads) > limits.max_chunk_bytes:
        raise fail("Read chunks larger than the limit")
    stream_len = inline_len  # the XDR stream so far, with earlier chunks' data in place
    for c in others:
        if c.position % 4:
            raise fail(f"Read chunk position {c.position} is not a multiple of 4")
        if c.position > stream_len:
            raise fail(f"Read chunk position {c.position} is beyond the message")
        stream_len += c.length + (-c.length & 3)


def encode(
    xid: int,
    credit: int,
    proc: int,
    reads: list[ReadChunk] | None = None,
    writes: list[list[Segment]] | None = None,
    reply: list[Segment] | None = None,
) -> bytes:
    """An RDMA_MSG or RDMA_NOMSG header (TR-1, TR-5, TR-6); never RDMA_MSGP/DONE (TR-4)."""
    if proc == RDMA_MSG and not reads and reply is None:
        if not writes:
            return _PLAIN.pack(xid, VERSION, credit, RDMA_MSG, 0, 0, 0)
        if len(writes) == 1:  # the reply to a READ
            segments = writes[0]
            out = bytearray(
                _ONE_WRITE_REPLY.pack(xid, VERSION, credit, RDMA_MSG, 0, 1, len(segments))
            )
            for s in segments:
                out += _SEGMENT.pack(s.handle, s.length, s.offset)
            out += _NO_MORE
            return bytes(out)
    return _encode_lists(xid, credit, proc, reads, writes, reply)


def _encode_lists(
    xid: int,
    credit: int,
    proc: int,
    reads: list[ReadChunk] | None,
    writes: list[list[Segment]] | None,
    reply: list[Segment] | None,
) -> bytes:
    """Any header, by the generated encoder (``encode``'s general case)."""
    seg = rpcrdma.xdr_rdma_segment
    read_list = [
        rpcrdma.xdr_read_chunk(c.position, seg(s.handle, s.length, s.offset))
        for c in reads or ()
        for s in c.segments
    ]
    write_list = [
        rpcrdma.xdr_write_chunk([seg(s.handle, s.length, s.offset) for s in c])
        for c in writes or ()
    ]
    reply_chunk = (
        None
        if reply is None
        else rpcrdma.xdr_write_chunk([seg(s.handle, s.length, s.offset) for s in reply])
    )
    lists: rpcrdma.rpc_rdma_header | rpcrdma.rpc_rdma_header_nomsg
    if proc == RDMA_MSG:
        lists = rpcrdma.rpc_rdma_header(read_list, write_list, reply_chunk)
    elif proc == RDMA_NOMSG:
        lists = rpcrdma.rpc_rdma_header_nomsg(read_list, write_list, reply_chunk)
    else:
        raise ValueError(f"transport procedure {proc} is not to be sent")
    w = Writer()
    w += _FIXED.pack(xid, VERSION, credit, proc)[:12]
    rpcrdma.enc_rdma_body(w, rpcrdma.rdma_body(rpcrdma.rdma_proc(proc), lists))
    return bytes(w)


def encode_error(xid: int, credit: int, err: int, vers: int = VERSION) -> bytes:
    """RDMA_ERROR: ERR_VERS carries our range (1, 1) (TR-3, TR-16); ERR_CHUNK nothing. Its
    rdma_vers is the failing message's, ``vers`` (RFC 8166 section 4.5)."""
    w = Writer()
    w += _FIXED.pack(xid, vers, credit, RDMA_ERROR)[:12]
    rng = rpcrdma.rpc_rdma_errvers(VERSION, VERSION) if err == ERR_VERS else None
    error = rpcrdma.rpc_rdma_error(rpcrdma.rpc_rdma_errcode(err), rng)
    rpcrdma.enc_rdma_body(w, rpcrdma.rdma_body(rpcrdma.rdma_proc.RDMA_ERROR, error))
    return bytes(w)


def header_size(reads: int, write_segments: list[int], reply_segments: int | None) -> int:
    """The encoded size of a header with these lists (for inline budgeting, TR-6)."""
    size = 16 + 4  # fixed words, read list terminator
    size += 24 * reads  # each read segment: link, position, segment
    size += 4 + sum(8 + 16 * n for n in write_segments)  # write list
    size += 4 + (0 if reply_segments is None else 4 + 16 * reply_segments)
    return size
