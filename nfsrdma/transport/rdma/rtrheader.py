"""The rtrext optional headers on the wire (RT-X2), sans-IO, over the codecs generated from
``nfsrdma/xdr/specs/rpcrdma.x``.

A transmission keeps the four RPC-over-RDMA v1 words (xid, vers = 1, credits, proc) so tools
still show XIDs and credits; ``rdma_proc`` is the project-private ``RDMA_RTREXT`` and the optional
header (``rtr_body``: XMTREQ, XMTRESP, XMTCONT or REPTERR) follows, then ``pslen`` octets of
payload. Never ``rdma_vers = 2``. Sent only on a connection that negotiated rtrext (RT-X1).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nfsrdma.transport.rdma.header import ERR_CHUNK, ERR_VERS, VERSION, HeaderError, Segment
from nfsrdma.transport.rdma.placement import valid_in_loc
from nfsrdma.xdr.gen import rpcrdma as x
from nfsrdma.xdr.runtime import Reader, Writer, XdrError

RDMA_RTREXT = x.RDMA_RTREXT
XMTREQ, XMTRESP, XMTCONT, REPTERR = (
    x.ROPT_XMTREQ,
    x.ROPT_XMTRESP,
    x.ROPT_XMTCONT,
    x.ROPT_REPTERR,
)
CALL, REPLY = x.XMS_CALL, x.XMS_REPLY
_PROC = struct.Struct(">I")


def is_rtrext(buf: bytes | memoryview) -> bool:
    """Whether a received message carries an optional header (proc word = RDMA_RTREXT)."""
    return len(buf) >= 16 and _PROC.unpack_from(buf, 12)[0] == RDMA_RTREXT


@dataclass(slots=True)
class RtrMessage:
    """A decoded transmission: its v1 words, the optional header, where the payload starts."""

    xid: int
    credit: int
    ropt: int
    body: x.optxmt_req | x.optxmt_resp | x.optxmt_cont | x.optrept_err
    size: int  # header octets; the payload follows

    @property
    def pslen(self) -> int:
        b = self.body
        if isinstance(b, x.optxmt_req):
            return b.optxrq_pslen
        if isinstance(b, x.optxmt_resp):
            return b.optxrs_pslen
        if isinstance(b, x.optxmt_cont):
            return b.optxc_pslen
        return 0


def parse(buf: bytes | memoryview) -> RtrMessage:
    """Decode a transmission with an optional header. An XDR error in it is a base-protocol
    error (RT-18): HeaderError with ERR_CHUNK (ERR_VERS for a version other than 1)."""
    xid = struct.unpack_from(">I", buf)[0] if len(buf) >= 4 else None
    try:
        msg, end = x.dec_rtr_msg(Reader(buf), 0)
    except XdrError as e:
        raise HeaderError(f"malformed rtrext header: {e}", xid, ERR_CHUNK) from None
    if msg.rtr_vers != VERSION:
        raise HeaderError(f"RPC-over-RDMA version {msg.rtr_vers}", xid, ERR_VERS)
    body = msg.rtr_body.value
    assert body is not None
    return RtrMessage(msg.rtr_xid, msg.rtr_credit, int(msg.rtr_body.ropt), body, end)


def _seg(s: Segment) -> x.xdr_rdma_segment:
    return x.xdr_rdma_segment(s.handle, s.length, s.offset)


def segments(chunk: x.xdr_write_chunk) -> list[Segment]:
    return [Segment(s.handle, s.length, s.offset) for s in chunk.target]


def exrw(position: int, segs: list[Segment]) -> x.xmdp_mitem:
    """An excised item placed by explicit RDMA (EXRW): a v1 Read chunk in a request, the
    Write chunk it went to in a reply (RT-13)."""
    length = sum(s.length for s in segs)
    return x.xmdp_mitem(
        position, length, x.xmdp_loc(x.xmdp_type.XMPTYPE_EXRW, [_seg(s) for s in segs])
    )


def encode_body(
    xid: int,
    credit: int,
    ropt: int,
    body: x.optxmt_req | x.optxmt_resp | x.optxmt_cont | x.optrept_err,
) -> bytes:
    w = Writer()
    x.enc_rtr_msg(
        w,
        x.rtr_msg(xid, VERSION, credit, RDMA_RTREXT, x.rtr_body(x.ropt_type(ropt), body)),
    )
    return bytes(w)


def encode_xmtreq(
    xid: int,
    credit: int,
    *,
    count: int,
    rsbuf: int,
    pslen: int,
    dp: list[x.xmdp_mitem] | None = None,
    writes: list[list[Segment]] | None = None,
    reply: list[Segment] | None = None,
) -> bytes:
    body = x.optxmt_req(
        dp or [],
        [x.xdr_write_chunk([_seg(s) for s in c]) for c in writes or ()],
        None if reply is None else x.xdr_write_chunk([_seg(s) for s in reply]),
        count,
        rsbuf,
        pslen,
    )
    return encode_body(xid, credit, XMTREQ, body)


def encode_xmtresp(
    xid: int, credit: int, *, count: int, pslen: int, dp: list[x.xmdp_mitem] | None = None
) -> bytes:
    return encode_body(xid, credit, XMTRESP, x.optxmt_resp(dp or [], count, pslen))


def encode_xmtcont(xid: int, credit: int, *, xnum: int, pslen: int) -> bytes:
    return encode_body(xid, credit, XMTCONT, x.optxmt_cont(xnum, 0, pslen))


XMTRESP_SIZE = len(encode_xmtresp(0, 0, count=0, pslen=0))  # 32 octets
XMTCONT_SIZE = len(encode_xmtcont(0, 0, xnum=0, pslen=0))  # 32 octets


def xmtreq_size(writes: list[int], reply: int | None, dp: list[int] | None = None) -> int:
    """Octets of an XMTREQ header with Write chunks of ``writes`` segments, a Reply chunk of
    ``reply`` segments (None: none) and EXRW items of ``dp`` segments."""
    size = 16 + 4  # v1 words, ropt
    size += 4 + sum(4 * 3 + 4 + 16 * n for n in dp or ())
    size += 4 + sum(4 + 16 * n for n in writes)
    size += 4 + (0 if reply is None else 4 + 16 * reply)
    return size + 12  # count, rsbuf, pslen


# -- placement types (RTR section 6.2, Table 1; RT-12) ----------------------------------

# What this implementation places (phase 1: EXRW only; TBSN is phase 2, RT-X4).
SUPPORTED = frozenset({x.xmdp_type.XMPTYPE_EXRW})


def placement_valid(ptype: int, *, request: bool) -> bool:
    """Table 1: whether a placement type is valid in an xmdp_loc of a request or response
    (the table itself is in ``placement``)."""
    return valid_in_loc(ptype, request=request)


def encode_repterr(fault: object, credit: int) -> bytes:
    """REPTERR for a grouping fault (``continuation.Fault``; RT-18)."""
    from nfsrdma.transport.rdma.continuation import Fault

    assert isinstance(fault, Fault)
    code = x.optr_err(fault.code)
    value: x.optr_expect | x.optr_range | None = None
    if fault.expected is not None:
        value = x.optr_expect(*fault.expected)
    elif fault.value_range is not None:
        value = x.optr_range(*fault.value_range)
    elif code is not x.optr_err.OPTRERR_BADCONT:
        value = (
            x.optr_range(0, 0, 0)
            if code
            in (x.optr_err.OPTRERR_BADOFF, x.optr_err.OPTRERR_BADTBSN, x.optr_err.OPTRERR_BADPL)
            else x.optr_expect(0, 0)
        )
    body = x.optrept_err(fault.bad, fault.lead, x.optr_info(code, value))
    return encode_body(fault.xid, credit, REPTERR, body)
