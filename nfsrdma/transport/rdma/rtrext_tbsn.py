"""Send-based data placement (TBSN: RT-X4, RT-14, RT-17, RT-20), sans-IO.

A responder that accepts it posts receives made of segments (RT-3): a first segment of
``segment`` octets that holds the transport header and the payload, then ``plt``
placement-capable (PLT) segments of the same size. The requester of a call with DDP-eligible
items (WRITE data, RFC 8267; RT-16) sends each item inside Sends, in PLT segments, instead of
exposing it for an RDMA Read: no registration, no RDMA Read, no extra round trip. Each
transmission of the group is laid out as::

    header + payload (pslen octets) | zeros to the end of the first segment | PLT segments

and a TBSN item names its target segments by number, counted from 0 across the PLT segments
of every transmission of the group, transmission ``t`` holding ``t * plt ... t * plt + plt -
1`` (RT-14), with the offset of the data in the first of them (always 0 here: every item starts
a segment). The padding that keeps the items on segment boundaries is zeros (RT-20): it comes
from a zero-filled constant, never from the send buffer's earlier contents.

The responder checks each item (``placement.check_items``: the offset, the numbers against the
PLT segments of the group) and then takes its data from the segments it names; an item
longer than its segments hold is BADPL. A problem is reported with REPTERR and the requester
resends the call with plain v1 (RT-19).
"""

from __future__ import annotations

from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.continuation import (
    ContinuedCall,
    reply_reservation,
    split,
    transmissions_needed,
)
from nfsrdma.transport.rdma.header import RDMA_NOMSG, Segment
from nfsrdma.transport.rdma.marshal import CallPlan
from nfsrdma.transport.rdma.placement import Violation
from nfsrdma.xdr.gen import rpcrdma as x
from nfsrdma.xdr.runtime import Buffer

E = x.optr_err
_ZEROS = bytes(1 << 16)
_ANY = Segment(0, 0, 0)  # a segment of a chunk whose header size is being computed


def zeros(n: int) -> Buffer:
    """``n`` zero octets, from a constant (RT-20)."""
    return memoryview(_ZEROS)[:n] if n <= len(_ZEROS) else bytes(n)


def tbsn_item(position: int, length: int, first: int, count: int, offset: int = 0) -> x.xmdp_mitem:
    """An item at ``position`` in the virtual XDR stream, placed in ``count`` PLT segments
    from number ``first`` on (RT-13)."""
    loc = x.xmdp_loc(
        x.xmdp_type.XMPTYPE_TBSN, x.xmdp_tbsnloc(offset, list(range(first, first + count)))
    )
    return x.xmdp_mitem(position, length, loc)


def plan_tbsn_call(
    plan: CallPlan,
    *,
    segment: int,
    plt: int,
    send_limit: int,
    recv_limit: int,
    max_reply: int,
    call_limit: int,
    reply_limit: int,
    credits_free: int,
) -> ContinuedCall | None:
    """A call whose DDP-eligible items (the Read chunks plain v1 would expose) go in the PLT
    segments of the peer's receives (``segment`` octets each, ``plt`` per transmission), or
    None (then message continuation with EXRW items, or plain v1). The group never has more
    transmissions than the peer accepts (RT-4) or than the credits we hold (RT-8)."""
    long_call = plan.proc == RDMA_NOMSG
    body = list(plan.reads[0].data) if long_call else list(plan.inline)
    exposed = plan.reads[1:] if long_call else list(plan.reads)
    if not exposed or plt < 1 or segment < 64:
        return None
    rsbuf, offer_reply = reply_reservation(
        plan, recv_limit=recv_limit, max_reply=max_reply, reply_limit=reply_limit,
        credits_free=credits_free,
    )  # fmt: skip
    items: list[x.xmdp_mitem] = []
    by_segment: list[memoryview] = []  # the data of each target segment, in number order
    for e in exposed:
        data = e.data[0] if len(e.data) == 1 else b"".join(e.data)
        view = memoryview(data).cast("B")
        n = -(-len(view) // segment)
        items.append(tbsn_item(e.position, len(view), len(by_segment), n))
        by_segment += [view[j * segment : (j + 1) * segment] for j in range(n)]
    head = len(
        rh.encode_xmtreq(
            0, 0, count=0, rsbuf=0, pslen=0, dp=items,
            writes=[[_ANY]] * len(plan.write_chunks), reply=[_ANY] if offer_reply else None,
        )
    )  # fmt: skip
    room = min(send_limit, segment)
    if head >= room:
        return None
    first, rest = room - head, room - rh.XMTCONT_SIZE
    length = sum(len(p) for p in body)
    count = max(transmissions_needed(length, first, rest), -(-len(by_segment) // plt))
    if count > call_limit or count > credits_free:
        return None
    sections = split(body, first, rest)
    sections += [[] for _ in range(count - len(sections))]
    placed: list[list[Buffer]] = []
    for t in range(count):
        segs = by_segment[t * plt : (t + 1) * plt]
        if not segs:
            placed.append([])
            continue
        used = (head if t == 0 else rh.XMTCONT_SIZE) + sum(len(p) for p in sections[t])
        out: list[Buffer] = [zeros(segment - used)]
        for k, piece in enumerate(segs):
            out.append(piece)
            if len(piece) < segment and k < len(segs) - 1:
                out.append(zeros(segment - len(piece)))
        placed.append(out)
    return ContinuedCall(sections, [], rsbuf, offer_reply, max(count, 1 + rsbuf), items, placed)


def resolve(
    item: x.xmdp_mitem, placed: list[Buffer], *, segment: int, plt: int
) -> Buffer | Violation:
    """The data of a TBSN item that passed ``placement.check_items``, from the PLT segments
    of the group's transmissions (``placed``: each one's octets after its first segment). A
    view into the received data when its segments follow each other in one transmission, a
    joined copy otherwise. An item longer than what its segments received: BADPL."""
    loc = item.xmdmi_where.value
    assert isinstance(loc, x.xmdp_tbsnloc)
    want = loc.xmdl_offset + item.xmdmi_length
    numbers = loc.xmdl_bsnum
    t0, i0 = divmod(numbers[0], plt)
    run = numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    if run and i0 + len(numbers) <= plt:  # one stretch of one transmission: no copy
        area = memoryview(placed[t0]).cast("B")[i0 * segment : (i0 + len(numbers)) * segment]
        if len(area) >= want:
            return area[loc.xmdl_offset : want]
        return _too_long(item, len(area) - loc.xmdl_offset)
    pieces = []
    for n in numbers:
        t, i = divmod(n, plt)
        pieces.append(memoryview(placed[t]).cast("B")[i * segment : (i + 1) * segment])
    data = b"".join(pieces)
    if len(data) < want:
        return _too_long(item, len(data) - loc.xmdl_offset)
    return memoryview(data)[loc.xmdl_offset : want]


def _too_long(item: x.xmdp_mitem, available: int) -> Violation:
    return Violation(
        E.OPTRERR_BADPL,
        "TBSN item longer than its target segments",
        (item.xmdmi_length, 0, max(0, available)),
    )
