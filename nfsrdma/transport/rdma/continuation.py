"""Message continuation (RT-X3, RT-6, RT-8), sans-IO: cutting a message into transmissions,
and putting received transmissions back together under the grouping rules.

A group is one XMTREQ or XMTRESP (transmission 0, carrying the count) followed by XMTCONTs
numbered 1..count-1 with the same xid, back to back on the connection: the sender posts them
in one go and nothing else goes in between (RT-6). The receiver therefore has at most one group
open. Anything else arriving while one is open ends that group with an error report and
nothing of it is delivered; a group is delivered only whole and in order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.header import RDMA_MSG, RDMA_NOMSG, Header
from nfsrdma.transport.rdma.marshal import CallPlan, ReadExposure
from nfsrdma.transport.rdma.rtrheader import RtrMessage
from nfsrdma.xdr.gen import rpcrdma as x
from nfsrdma.xdr.runtime import Buffer, Writer

PLAIN_HEADER = 28  # an RDMA_MSG header with three empty chunk lists

E = x.optr_err

# -- sending -----------------------------------------------------------------------------


def transmissions_needed(length: int, first: int, rest: int) -> int:
    """How many transmissions carry ``length`` payload octets when the first has room for
    ``first`` and each later one for ``rest`` (each room > 0)."""
    if length <= first:
        return 1
    return 1 + -(-(length - first) // rest)


def split(pieces: list[Buffer], first: int, rest: int) -> list[list[Buffer]]:
    """Cut a message (in pieces) into the payload sections of its transmissions, without
    copying: the first holds at most ``first`` octets, the others at most ``rest``."""
    out: list[list[Buffer]] = [[]]
    room = first
    for piece in pieces:
        view = memoryview(piece).cast("B") if not isinstance(piece, memoryview) else piece
        while len(view):
            if room == 0:
                out.append([])
                room = rest
            take = view[:room]
            out[-1].append(take)
            room -= len(take)
            view = view[len(take) :]
    return out


# -- receiving ---------------------------------------------------------------------------


@dataclass(slots=True)
class Fault:
    """A grouping error to report (REPTERR, RT-18): the transmission where it was found, the
    group's lead transmission when one is known, the code and its details."""

    code: int
    bad: x.xms_id
    lead: x.xms_id | None = None
    expected: tuple[int, int] | None = None  # BADHMT, BADOMT, BADSEQ, BADXID: (expect, current)
    value_range: tuple[int, int, int] | None = None  # BADOFF, BADTBSN, BADPL: (value, min, max)

    @property
    def message(self) -> x.xms_id:
        """The message the fault breaks: the group's lead when one was open."""
        return self.lead if self.lead is not None else self.bad

    @property
    def xid(self) -> int:
        return self.message.xmsi_xid


@dataclass(slots=True)
class Group:
    """A message whose transmissions all arrived, in order."""

    xid: int
    direction: int  # rh.CALL or rh.REPLY
    lead: RtrMessage
    count: int
    sections: list[Buffer] = field(default_factory=list)
    # Each transmission's placement-capable segments as received (send-based placement,
    # TBSN): what followed its first segment, empty when nothing did.
    placed: list[Buffer] = field(default_factory=list)

    @property
    def payload(self) -> bytes:
        """The message, its sections joined once (RT-7: decoding from the sections directly
        would save this one copy, under 1% of decoding these messages; see
        ``bench/rtrext_sections.py``)."""
        return b"".join(self.sections)


Event = Group | Fault


def _id(xid: int, direction: int, seq: int) -> x.xms_id:
    return x.xms_id(xid, x.xms_dir(direction), seq)


class Reassembler:
    """One connection's receive side. ``feed`` takes each transmission with an optional header
    (``plain`` each plain v1 message) and returns what it completes or breaks.

    A broken message is reported once: after a fault, the later XMTCONTs of the same xid (the
    rest of the group the sender had already posted) are dropped without another report, until
    a new lead transmission arrives."""

    def __init__(self) -> None:
        self.open: Group | None = None
        self.broken: int | None = None  # xid of the message whose rest is dropped silently
        self.dropped = 0  # transmissions dropped that way

    def _abandon(
        self,
        bad: x.xms_id,
        code: int,
        expected: tuple[int, int] | None = None,
        value_range: tuple[int, int, int] | None = None,
    ) -> Fault:
        g = self.open
        assert g is not None
        self.open = None
        self.broken = g.xid
        return Fault(code, bad, _id(g.xid, g.direction, 0), expected, value_range)

    def plain(self, xid: int, direction: int, proc: int = RDMA_MSG) -> list[Fault]:
        """A v1 message (``proc``) arrived. If a group is open it was broken: the header message
        type (rdma_proc) should have been RDMA_RTREXT (RT-6: BADHMT)."""
        self.broken = None
        if self.open is None:
            return []
        here = _id(xid, direction, 0)
        return [self._abandon(here, E.OPTRERR_BADHMT, expected=(rh.RDMA_RTREXT, proc))]

    def feed(
        self, msg: RtrMessage, payload: Buffer, *, limit: int, placed: Buffer = b""
    ) -> list[Event]:
        """A transmission with an optional header and its payload. ``limit``: the most
        transmissions accepted for a lead of this kind (RT-4, RT-8). ``placed``: what arrived
        in the receive's placement-capable segments (TBSN); then ``payload`` is the rest of
        the first segment, of which ``pslen`` octets are payload and the rest zero padding."""
        if len(placed) and msg.pslen <= len(payload):
            payload = memoryview(payload)[: msg.pslen]  # else: BADPL below
        events: list[Event] = []
        body = msg.body
        if isinstance(body, x.optxmt_cont):
            return self._cont(msg, body, payload, placed)
        if isinstance(body, x.optrept_err):
            return events  # reports are handled by the connection, outside any group
        direction = rh.CALL if isinstance(body, x.optxmt_req) else rh.REPLY
        count = body.optxrq_count if isinstance(body, x.optxmt_req) else body.optxrs_count
        here = _id(msg.xid, direction, 0)
        self.broken = None
        if self.open is not None:
            # The optional message type (ropt) should have been XMTCONT (BADOMT).
            events.append(self._abandon(here, E.OPTRERR_BADOMT, expected=(rh.XMTCONT, msg.ropt)))
        if msg.pslen != len(payload):
            n = len(payload)
            self.broken = msg.xid
            events.append(Fault(E.OPTRERR_BADPL, here, None, value_range=(msg.pslen, n, n)))
            return events
        if not 1 <= count <= limit:
            self.broken = msg.xid
            events.append(Fault(E.OPTRERR_BADCONT, here, None))
            return events
        group = Group(msg.xid, direction, msg, count, [payload], [placed])
        if count == 1:
            events.append(group)
        else:
            self.open = group
        return events

    def _cont(
        self, msg: RtrMessage, body: x.optxmt_cont, payload: Buffer, placed: Buffer
    ) -> list[Event]:
        g = self.open
        if g is None:
            if msg.xid == self.broken:
                self.dropped += 1
                return []
            return [Fault(E.OPTRERR_BADCONT, _id(msg.xid, rh.CALL, body.optxc_xnum), None)]
        here = _id(msg.xid, g.direction, body.optxc_xnum)
        if msg.xid != g.xid:
            return [self._abandon(here, E.OPTRERR_BADXID, expected=(g.xid, msg.xid))]
        expect = len(g.sections)
        if body.optxc_xnum != expect:
            return [self._abandon(here, E.OPTRERR_BADSEQ, expected=(expect, body.optxc_xnum))]
        if body.optxc_pslen != len(payload):
            n = len(payload)
            return [self._abandon(here, E.OPTRERR_BADPL, value_range=(body.optxc_pslen, n, n))]
        g.sections.append(payload)
        g.placed.append(placed)
        if len(g.sections) == g.count:
            self.open = None
            return [g]
        return []

    def reset(self) -> None:
        self.open = None
        self.broken = None


# -- deciding when to continue (RT-4, RT-5, RT-8) ------------------------------------------


@dataclass(slots=True)
class ContinuedCall:
    """A call to send as an XMTREQ group instead of plain v1."""

    sections: list[list[Buffer]]  # payload of each transmission
    reads: list[ReadExposure]  # DDP items still moved to Read chunks (EXRW items)
    rsbuf: int  # extra receives reserved for the reply
    offer_reply_chunk: bool  # the reply may still exceed what continuation can carry
    credits: int  # credits the call holds until its reply: max(count, 1 + rsbuf)
    # Send-based placement (TBSN, ``rtrext_tbsn``): the items placed, and what each
    # transmission carries after its payload (zero padding to the end of the first segment,
    # then the data of its PLT segments); empty without TBSN.
    tbsn_items: list[x.xmdp_mitem] = field(default_factory=list)
    placed: list[list[Buffer]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.sections)


def reply_reservation(
    plan: CallPlan, *, recv_limit: int, max_reply: int, reply_limit: int, credits_free: int
) -> tuple[int, bool]:
    """Receives to reserve for a continued reply (``rsbuf``, RT-5, RT-8), and whether a
    Reply chunk must still be offered because the reply may need more."""
    rsbuf, offer_reply = 0, plan.reply_chunk is not None
    if plan.reply_chunk is not None and reply_limit > 1:
        need = transmissions_needed(
            max_reply, recv_limit - rh.XMTRESP_SIZE, recv_limit - rh.XMTCONT_SIZE
        )
        rsbuf = max(0, min(need, reply_limit, credits_free) - 1)
        offer_reply = need > rsbuf + 1
    return rsbuf, offer_reply


def plan_continued_call(
    plan: CallPlan,
    *,
    send_limit: int,
    recv_limit: int,
    max_reply: int,
    call_limit: int,
    reply_limit: int,
    credits_free: int,
) -> ContinuedCall | None:
    """Whether and how to continue a call that plain v1 would send as a Long call (position-zero
    Read chunk) or with a Reply chunk; None keeps plain v1 (the fallback for every RPC).
    ``call_limit``/``reply_limit`` are the negotiated transmission limits (RT-4, RT-5);
    ``credits_free`` the credits the requester holds for this call and more (RT-8)."""
    long_call = plan.proc == RDMA_NOMSG
    if not long_call and plan.reply_chunk is None:
        return None
    body = list(plan.reads[0].data) if long_call else list(plan.inline)
    reads = plan.reads[1:] if long_call else list(plan.reads)
    rsbuf, offer_reply = reply_reservation(
        plan, recv_limit=recv_limit, max_reply=max_reply, reply_limit=reply_limit,
        credits_free=credits_free,
    )  # fmt: skip
    head = rh.xmtreq_size(
        [1] * len(plan.write_chunks), 1 if offer_reply else None, [1] * len(reads)
    )
    length = sum(len(p) for p in body)
    if head >= send_limit:
        return None
    count = transmissions_needed(length, send_limit - head, send_limit - rh.XMTCONT_SIZE)
    if count > call_limit or count > credits_free:
        return None  # RT-4, RT-8: plain v1 (a position-zero Read chunk) instead
    if count == 1 and rsbuf == 0:
        return None  # nothing gained over plain v1
    sections = split(body, send_limit - head, send_limit - rh.XMTCONT_SIZE)
    return ContinuedCall(sections, reads, rsbuf, offer_reply, max(count, 1 + rsbuf))


def plan_continued_reply(
    msg: Writer, call_writes: int, send_limit: int, transmissions: int
) -> list[list[Buffer]] | None:
    """The payload sections of a reply sent as an XMTRESP group, or None for plain v1: only
    when the reply does not fit one plain Send, needs no RDMA Write (no DDP item meets a
    Write chunk) and fits the ``transmissions`` the requester reserved (RT-8)."""
    if transmissions <= 1 or (msg.ddp and call_writes):
        return None
    body = msg.pieces()
    length = sum(len(p) for p in body)
    if PLAIN_HEADER + length <= send_limit:
        return None
    first, rest = send_limit - rh.XMTRESP_SIZE, send_limit - rh.XMTCONT_SIZE
    if transmissions_needed(length, first, rest) > transmissions:
        return None
    return split(body, first, rest)


# -- resending a reply after a REPTERR about it (RT-19) ----------------------------------


class ReplyKeeper:
    """The continued replies a responder sent lately, kept to resend one with plain v1 when the
    requester reports it broken (REPTERR about a reply, RT-19: "the responder ... can proceed to
    resend the reply using existing (i.e. non-extended) facilities").

    A reply is kept as the call's header (the Write chunks and Reply chunk it offered) and the
    message's octets. At most ``capacity`` replies are kept, the oldest dropped first: a
    requester reports a broken reply as soon as its group ends, and it has at most its credits
    in calls outstanding, so the responder's grant is enough. A reply found no more is answered
    with RDMA_ERROR by the caller (the requester then fails that RPC instead of timing out)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._kept: OrderedDict[int, tuple[Header, bytes]] = OrderedDict()

    def keep(self, call: Header, sections: list[list[Buffer]]) -> None:
        self._kept[call.xid] = (call, b"".join(p for sec in sections for p in sec))
        self._kept.move_to_end(call.xid)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def take(self, xid: int) -> tuple[Header, bytes] | None:
        """The reply to ``xid`` (forgotten here: it is resent at most once)."""
        return self._kept.pop(xid, None)

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        self._kept.clear()
