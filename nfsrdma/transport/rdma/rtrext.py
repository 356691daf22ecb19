"""The rtrext negotiation: a project block after the RFC 8797 block in CM private data (RT-X1).

draft-dnoveck-nfsv4-rpcrdma-rtrext-03 exchanges its properties through the unfinished
RPC-over-RDMA version 2; version 1 has no such exchange, so two nfsrdma peers announce the
properties in the connection manager's private data instead. The RFC 8797 block stays at offset 0,
unchanged (PD-12, PD-20), and our block follows it at exactly offset 8 (20 octets, big-endian)::

    8   identifier 0x4e465852 ("NFXR", unregistered: not in the IANA RDMA-CM Private Data
        Identifiers registry, PD-22)
    12  version (1)              13  length of this block (20)
    14  RTR support bits (RT-2: 1 XMTREQ, 2 XMTRESP, 4 XMTCONT)   15  reserved (0)
    16  request transmission receive limit (u16, RT-4)
    18  response transmission send limit (u16, RT-5)
    20  receive buffer segment size in octets (u32, RT-3 summary)
    24  receive buffer alignment (u16)   26  placement-capable (PLT) segments per buffer (u16)

The receive buffer this summarises (RT-3) is one segment of the given size, then the PLT
segments, each of the same size: ``(1 + PLT) * size`` octets in all (phase 2, TBSN).

28 octets in all fit the 56 of an InfiniBand/RoCE connect request and the 196 of its reply
(PD-11). Linux reads only the first 8 octets, so it sees plain v1 (RT-1). The extension is on for
a connection only when both sides sent a valid block (RT-X1); a block anywhere but offset 8, or
after anything but a valid v1 block at offset 0, does not count (SEC-4: foreign data that happens
to hold the identifier elsewhere is never taken for it).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from nfsrdma.transport.rdma import privdata

IDENTIFIER = 0x4E465852  # "NFXR": unregistered, project-private
VERSION = 1
OFFSET = privdata.BLOCK_LENGTH  # right after the RFC 8797 block
_BLOCK = struct.Struct(">IBBBBHHIHH")
LENGTH = _BLOCK.size  # 20


class Rtrs(enum.IntFlag):
    """RTR Support bits (XPROP_RTRSUPP, RT-2)."""

    XREQ = 1  # we accept XMTREQ
    XRESP = 2  # we accept XMTRESP
    XCONT = 4  # we accept XMTCONT


ALL = Rtrs.XREQ | Rtrs.XRESP | Rtrs.XCONT


@dataclass(frozen=True, slots=True)
class RtrBlock:
    """One side's advertisement."""

    support: Rtrs = ALL
    request_limit: int = 8  # transmissions per request we accept as responder (RT-4)
    response_limit: int = 8  # transmissions per reply we produce as responder (RT-5)
    segment_size: int = 4096  # each receive buffer: one segment of this size
    alignment: int = 0
    # Placement-capable segments after the first one in each receive, each ``segment_size``
    # octets (send-based placement, TBSN: RT-X4, RT-17); 0: we accept no TBSN items.
    plt_segments: int = 0
    version: int = VERSION

    def encode(self) -> bytes:
        for v in (self.request_limit, self.response_limit, self.alignment, self.plt_segments):
            if not 0 <= v <= 0xFFFF:
                raise privdata.PrivateDataError(f"rtrext value {v} does not fit 16 bits")
        return _BLOCK.pack(
            IDENTIFIER,
            self.version,
            LENGTH,
            int(self.support) & 0xFF,
            0,
            self.request_limit,
            self.response_limit,
            self.segment_size,
            self.alignment,
            self.plt_segments,
        )


def decode(buffer: bytes | bytearray | memoryview | None) -> RtrBlock | None:
    """Our block in received private data, or None: it counts only at offset 8, right after a
    valid RFC 8797 v1 block at offset 0, with our identifier, version and length."""
    if not buffer or len(buffer) < OFFSET + LENGTH:
        return None
    raw = bytes(buffer)
    v1 = privdata.decode(raw[:OFFSET])
    if v1 is None:
        return None
    ident, version, length, support, _, req, resp, seg, align, plt = _BLOCK.unpack_from(raw, OFFSET)
    if ident != IDENTIFIER or version != VERSION or length != LENGTH:
        return None
    if req < 1 or resp < 1 or seg < privdata.MIN_INLINE_SIZE:
        return None  # limits of 0 or a tiny buffer are nonsense: treat as absent
    return RtrBlock(Rtrs(support & int(ALL)), req, resp, seg, align, plt)


@dataclass(frozen=True, slots=True)
class RtrState:
    """What one connection may do (RT-X1). ``call_limit``: transmissions our requester may use
    for a call; ``reply_limit``: transmissions a reply to our call may take (so receives our
    requester may reserve, RT-5, RT-8); ``accept_limit``: transmissions we accept in a call."""

    enabled: bool = False
    call_limit: int = 1
    reply_limit: int = 1
    accept_limit: int = 1
    # Send-based placement toward the peer (TBSN, RT-X4, RT-17): its segment size and the PLT
    # segments per transmission we place into (0: we send no TBSN items).
    tbsn_segment: int = 0
    tbsn_plt: int = 0

    @property
    def continued_calls(self) -> bool:
        return self.enabled and self.call_limit > 1

    @property
    def continued_replies(self) -> bool:
        return self.enabled and self.reply_limit > 1

    @property
    def tbsn(self) -> bool:
        return self.enabled and self.tbsn_plt > 0


OFF = RtrState()


def negotiate(
    local: RtrBlock | None, peer: RtrBlock | None, *, tbsn_send_room: int = 0
) -> RtrState:
    """On only when both sides sent the block and both handle the three headers (RT-2, RT-X1).
    Limits of 1 leave continuation unused in that direction (RT-4, RT-5). Send-based
    placement is directional (RT-17): we place TBSN items toward the peer only when its
    receives have PLT segments and we want to (``tbsn_send_room``: the octets one of our
    Sends may carry, 0 when we send no TBSN), into as many of them as one Send can fill."""
    if local is None or peer is None:
        return OFF
    if ALL & ~local.support or ALL & ~peer.support:
        return OFF
    plt = 0
    if tbsn_send_room and peer.plt_segments:
        plt = max(0, min(peer.plt_segments, tbsn_send_room // peer.segment_size - 1))
    return RtrState(
        enabled=True,
        call_limit=peer.request_limit,
        reply_limit=peer.response_limit,
        accept_limit=local.request_limit,
        tbsn_segment=peer.segment_size if plt else 0,
        tbsn_plt=plt,
    )


def private_data(
    v1: privdata.PrivateData, block: RtrBlock | None, *, limit: int | None = None
) -> bytes:
    """What we send: the RFC 8797 block at offset 0, then ours when the extension is enabled."""
    return privdata.encode(v1, extension=block.encode() if block else b"", limit=limit)
