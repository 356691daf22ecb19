"""rtrext wire format (RT-X2, RT-9, RT-10, RT-11, RT-12) and the sans-IO grouping rules of
message continuation (RT-6, RT-X3): round trips, fuzzed input, reordering and interleaving."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.transport.rdma import continuation as cont
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.header import HeaderError, Segment
from nfsrdma.xdr.gen import rpcrdma as x

E = x.optr_err


def test_rtx2_the_four_v1_words_stay_and_proc_is_private() -> None:
    wire = rh.encode_xmtreq(0x1234, 32, count=3, rsbuf=2, pslen=100)
    xid, vers, credit, proc = struct.unpack_from(">IIII", wire)
    assert (xid, vers, credit) == (0x1234, 1, 32)  # never rdma_vers=2
    assert proc == rh.RDMA_RTREXT and proc > hdr.RDMA_ERROR
    assert wire[12:16] == b"NFXR"  # 0x4e465852, as docs/rtrext.md says
    assert rh.is_rtrext(wire) and not rh.is_rtrext(hdr.encode(1, 1, hdr.RDMA_MSG))
    with pytest.raises(HeaderError) as e:
        hdr.parse(wire)  # a v1-only parser refuses it: never sent unless negotiated
    assert e.value.err == hdr.ERR_CHUNK


def test_rt9_xmtreq_round_trip() -> None:
    dp = [rh.exrw(64, [Segment(7, 100, 0x1000), Segment(8, 28, 0x2000)])]
    writes = [[Segment(9, 4096, 0x3000)]]
    reply = [Segment(10, 8192, 0x4000)]
    wire = rh.encode_xmtreq(5, 4, count=3, rsbuf=2, pslen=17, dp=dp, writes=writes, reply=reply)
    assert len(wire) == rh.xmtreq_size([1], 1, [2])
    m = rh.parse(wire + b"p" * 17)
    assert (m.xid, m.credit, m.ropt, m.size, m.pslen) == (5, 4, rh.XMTREQ, len(wire), 17)
    b = m.body
    assert isinstance(b, x.optxmt_req)
    assert (b.optxrq_count, b.optxrq_rsbuf) == (3, 2)
    assert b.optxrq_dp == dp
    assert [rh.segments(c) for c in b.optxrq_writes] == writes
    assert b.optxrq_repch is not None and rh.segments(b.optxrq_repch) == reply


def test_rt10_rt11_xmtresp_and_xmtcont_round_trip() -> None:
    m = rh.parse(rh.encode_xmtresp(6, 8, count=4, pslen=0))
    assert isinstance(m.body, x.optxmt_resp) and m.body.optxrs_count == 4
    assert m.size == rh.XMTRESP_SIZE
    m = rh.parse(rh.encode_xmtcont(6, 8, xnum=3, pslen=0))  # an empty section is allowed
    assert isinstance(m.body, x.optxmt_cont)
    assert (m.body.optxc_xnum, m.body.optxc_itype, m.body.optxc_pslen) == (3, 0, 0)
    assert m.size == rh.XMTCONT_SIZE


def test_rt18_repterr_codec_all_codes() -> None:
    bad = x.xms_id(1, x.xms_dir.XMS_REPLY, 2)
    for code in E:
        if code in (E.OPTRERR_BADCONT,):
            info = x.optr_info(code, None)
        elif code in (E.OPTRERR_BADOFF, E.OPTRERR_BADTBSN, E.OPTRERR_BADPL):
            info = x.optr_info(code, x.optr_range(9, 1, 5))
        else:
            info = x.optr_info(code, x.optr_expect(3, 1))
        w = rh.encode_body(1, 2, rh.REPTERR, x.optrept_err(bad, bad, info))
        m = rh.parse(w)
        assert isinstance(m.body, x.optrept_err) and m.body.optre_info == info


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_rtx2_fuzz_parse_raises_only_header_error(tail: bytes) -> None:
    wire = struct.pack(">IIII", 1, 1, 2, rh.RDMA_RTREXT) + tail
    try:
        rh.parse(wire)
    except HeaderError as e:
        assert e.xid == 1 and e.err == hdr.ERR_CHUNK


def test_rtx2_another_version_gets_err_vers() -> None:
    wire = bytearray(rh.encode_xmtcont(1, 1, xnum=1, pslen=0))
    wire[4:8] = struct.pack(">I", 2)
    with pytest.raises(HeaderError) as e:
        rh.parse(bytes(wire))
    assert e.value.err == hdr.ERR_VERS


def test_rt12_placement_table_1() -> None:
    T = x.xmdp_type
    table = {
        T.XMPTYPE_EXRW: (True, True),
        T.XMPTYPE_TBSN: (True, True),
        T.XMPTYPE_CHOICE: (False, False),
        T.XMPTYPE_BYSIZE: (False, False),
        T.XMPTYPE_TOOSHORT: (False, True),
        T.XMPTYPE_NOITEM: (False, True),
    }
    for t, (req, resp) in table.items():
        assert rh.placement_valid(t, request=True) is req
        assert rh.placement_valid(t, request=False) is resp
    # CHOICE / BYSIZE in an xmdp_loc are XDR-invalid: the decoder refuses them.
    good = bytearray(rh.encode_xmtresp(1, 1, count=1, pslen=0, dp=[rh.exrw(0, [])]))
    at = 16 + 4 + 4 + 8  # v1 words, ropt, dp count, disp + length
    assert struct.unpack_from(">I", good, at)[0] == T.XMPTYPE_EXRW
    for t in (T.XMPTYPE_CHOICE, T.XMPTYPE_BYSIZE):
        struct.pack_into(">I", good, at, t)
        with pytest.raises(HeaderError):
            rh.parse(bytes(good))


# -- splitting ----------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=6), st.integers(1, 200), st.integers(1, 200))
def test_rtx3_split_keeps_every_octet_in_order(pieces: list[bytes], first: int, rest: int) -> None:
    parts = cont.split(list(pieces), first, rest)
    total = b"".join(pieces)
    assert b"".join(b"".join(bytes(p) for p in s) for s in parts) == total
    sizes = [sum(len(p) for p in s) for s in parts]
    assert sizes[0] <= first and all(n <= rest for n in sizes[1:])
    assert len(parts) == cont.transmissions_needed(len(total), first, rest)


# -- grouping rules -------------------------------------------------------------------------


def transmissions(xid: int, payload: bytes, size: int, *, call: bool) -> list[tuple[bytes, bytes]]:
    sections = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
    n = len(sections)
    first = (
        rh.encode_xmtreq(xid, 1, count=n, rsbuf=0, pslen=len(sections[0]))
        if call
        else rh.encode_xmtresp(xid, 1, count=n, pslen=len(sections[0]))
    )
    out = [(first, sections[0])]
    out += [
        (rh.encode_xmtcont(xid, 1, xnum=i, pslen=len(s)), s) for i, s in enumerate(sections[1:], 1)
    ]
    return out


def feed_all(r: cont.Reassembler, wire: list[tuple[bytes, bytes]]) -> list[cont.Event]:
    events: list[cont.Event] = []
    for head, payload in wire:
        events += r.feed(rh.parse(head), payload, limit=64)
    return events


def test_rt6_a_group_back_to_back_is_delivered_whole() -> None:
    payload = bytes(range(256)) * 40
    ev = feed_all(cont.Reassembler(), transmissions(9, payload, 1000, call=True))
    assert len(ev) == 1 and isinstance(ev[0], cont.Group)
    assert ev[0].payload == payload and ev[0].count == 11 and ev[0].direction == rh.CALL


def test_rt6_wrong_order_is_badseq_and_nothing_is_delivered() -> None:
    wire = transmissions(9, b"a" * 3000, 1000, call=False)
    wire[1], wire[2] = wire[2], wire[1]
    ev = feed_all(cont.Reassembler(), wire)
    assert [type(e) for e in ev] == [cont.Fault]  # the stray rest is dropped, not reported
    f = ev[0]
    assert isinstance(f, cont.Fault) and f.code == E.OPTRERR_BADSEQ and f.expected == (1, 2)
    assert f.lead is not None and f.lead.xmsi_xid == 9


def test_rt6_interleaved_groups_are_badomt_badxid_or_badhmt() -> None:
    a = transmissions(1, b"a" * 3000, 1000, call=True)
    b = transmissions(2, b"b" * 3000, 1000, call=True)
    ev = feed_all(cont.Reassembler(), [a[0], b[0], a[1]])
    codes = [e.code for e in ev if isinstance(e, cont.Fault)]
    assert codes == [E.OPTRERR_BADOMT, E.OPTRERR_BADXID]
    assert not any(isinstance(e, cont.Group) for e in ev)
    r = cont.Reassembler()
    feed_all(r, a[:2])
    (f,) = r.plain(77, rh.CALL)  # a v1 message in the middle of a group
    assert f.code == E.OPTRERR_BADHMT and f.expected == (rh.RDMA_RTREXT, 0)


def test_rt4_rt8_a_count_over_the_limit_is_badcont() -> None:
    r = cont.Reassembler()
    head, payload = transmissions(3, b"x" * 5000, 1000, call=True)[0]
    (f,) = r.feed(rh.parse(head), payload, limit=4)
    assert f.code == E.OPTRERR_BADCONT and r.open is None


def test_rt6_pslen_disagreeing_with_the_payload_is_badpl() -> None:
    r = cont.Reassembler()
    wire = transmissions(3, b"x" * 1500, 1000, call=True)
    r.feed(rh.parse(wire[0][0]), wire[0][1], limit=8)
    (f,) = r.feed(rh.parse(wire[1][0]), wire[1][1][:-1], limit=8)
    assert f.code == E.OPTRERR_BADPL and f.value_range == (500, 499, 499)


@pytest.mark.parametrize("seed", range(30))
def test_rt6_fuzzed_reordering_and_interleaving_never_delivers_a_wrong_message(seed: int) -> None:
    """Random groups, then random swaps, drops, duplicates and v1 messages slipped in: every
    delivered message is exactly one that was sent, in sending order; a faithful stream
    delivers everything without a fault."""
    rnd = random.Random(seed)
    messages = {
        xid: bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 5000)))
        for xid in range(1, 12)
    }
    wire: list[tuple[bytes, bytes] | None] = []  # None: a plain v1 message
    for xid, payload in messages.items():
        wire += transmissions(xid, payload, rnd.randrange(200, 1500), call=rnd.random() < 0.5)
        if rnd.random() < 0.3:
            wire.append(None)
    faithful = list(wire)
    for _ in range(rnd.randrange(0, 4) if seed % 3 else 0):
        i, j = rnd.randrange(len(wire)), rnd.randrange(len(wire))
        op = rnd.choice(["swap", "drop", "dup"])
        if op == "swap":
            wire[i], wire[j] = wire[j], wire[i]
        elif op == "drop":
            del wire[i]
        else:
            wire.insert(j, wire[i])
    r = cont.Reassembler()
    delivered: list[cont.Group] = []
    faults: list[cont.Fault] = []
    for item in wire:
        events = (
            r.plain(0, rh.CALL) if item is None else r.feed(rh.parse(item[0]), item[1], limit=64)
        )
        delivered += [e for e in events if isinstance(e, cont.Group)]
        faults += [e for e in events if isinstance(e, cont.Fault)]
    for g in delivered:
        assert g.payload == messages[g.xid]
    xids = [g.xid for g in delivered]
    assert len(set(xids)) == len(xids) or wire != faithful
    if wire == faithful:
        assert not faults and xids == sorted(messages)
    elif [g.xid for g in delivered] != sorted(messages):
        assert faults  # something was lost: it was reported
