"""REPTERR end to end on the in-process provider (RT-12, RT-18, RT-19, RT-20): each of the eight
error codes produced by a fault injected into a real continued call, decoded by the requester,
and the RPC completed by a resend over plain v1; broken replies are reported to the responder,
which resends them with plain v1; Table 1 enforced by a table-driven check; padding zeroed."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from nfsrdma.transport.base import ReplyExpectation, TransportCallError
from nfsrdma.transport.rdma import continuation as cont
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma import placement
from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.endpoint import RdmaConnection
from nfsrdma.transport.rdma.requester import RdmaErrorReply
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.gen import rpcrdma as x
from nfsrdma.xdr.runtime import U32, Buffer
from tests.unit.rdma.helpers import Patchable
from tests.unit.rdma.test_rpc_rdma import P_BLOB, P_READLINK, PROG, VERS, rig
from tests.unit.rdma.test_rtrext_continuation import blob_call, granted, long_reply

E = x.optr_err
T = x.xmdp_type
Group = list[list[Buffer]]


def _null_call(xid: int) -> bytes:
    """An RPC NULL call of our test program (AUTH_NONE)."""
    return struct.pack(">10I", xid, 0, 2, PROG, VERS, 0, 0, 0, 0, 0)


def _head(t: list[Buffer]) -> rh.RtrMessage:
    return rh.parse(bytes(t[0]))


def _rebuild(
    t: list[Buffer], change: Callable[[rh.RtrMessage], None], xid: int | None = None
) -> list[Buffer]:
    """The transmission ``t`` with its optional header changed by ``change``."""
    m = _head(t)
    change(m)
    return [rh.encode_body(m.xid if xid is None else xid, m.credit, m.ropt, m.body), *t[1:]]


def _req(m: rh.RtrMessage) -> x.optxmt_req:
    assert isinstance(m.body, x.optxmt_req)
    return m.body


def _inject_plain(g: Group) -> Group:  # BADHMT: a v1 message in the middle of the group
    xid = _head(g[0]).xid ^ 0x5A5A
    return [g[0], [hdr.encode(xid, 8, hdr.RDMA_MSG, [], [], None), _null_call(xid)], *g[1:]]


def _inject_xmtreq(g: Group) -> Group:  # BADOMT: another call's XMTREQ where XMTCONT belongs
    xid = _head(g[0]).xid ^ 0x5A5A
    body = _null_call(xid)
    other = [rh.encode_xmtreq(xid, 8, count=1, rsbuf=0, pslen=len(body)), body]
    return [g[0], other, *g[1:]]


def _count(g: Group) -> Group:  # BADCONT: more transmissions than the responder accepts
    return [_rebuild(g[0], lambda m: setattr(_req(m), "optxrq_count", 99)), *g[1:]]


def _swap(g: Group) -> Group:  # BADSEQ
    return [g[0], g[2], g[1], *g[3:]]


def _xid(g: Group) -> Group:  # BADXID: a continuation of another message
    wrong = _rebuild(g[1], lambda m: None, xid=_head(g[0]).xid + 1)
    return [g[0], wrong, *g[2:]]


def _item(loc: x.xmdp_loc, disp: int = 0) -> Callable[[Group], Group]:
    """An extra placement item in the XMTREQ. Its payload gives up the room the item takes
    (the transmission keeps its size and a consistent pslen): the group stays well formed and
    only the item is wrong."""

    def inject(g: Group) -> Group:
        item = x.xmdp_mitem(disp, 8, loc)
        payload = b"".join(bytes(p) for p in g[0][1:])
        m = _head(g[0])
        _req(m).optxrq_dp.append(item)
        grown = len(rh.encode_body(m.xid, m.credit, m.ropt, m.body)) - len(bytes(g[0][0]))
        _req(m).optxrq_pslen -= grown
        head = rh.encode_body(m.xid, m.credit, m.ropt, m.body)
        return [[head, payload[: len(payload) - grown]], *g[1:]]

    return inject


def _pslen(g: Group) -> Group:  # BADPL: the payload length disagrees with the transmission
    return [
        _rebuild(g[0], lambda m: setattr(_req(m), "optxrq_pslen", _req(m).optxrq_pslen + 4)),
        *g[1:],
    ]


_SEG = x.xdr_rdma_segment(0x1234, 8, 0x10000)
FAULTS: list[tuple[str, Callable[[Group], Group], int, object]] = [
    ("plain v1 inside", _inject_plain, E.OPTRERR_BADHMT, (rh.RDMA_RTREXT, hdr.RDMA_MSG)),
    ("XMTREQ inside", _inject_xmtreq, E.OPTRERR_BADOMT, (rh.XMTCONT, rh.XMTREQ)),
    ("count 99", _count, E.OPTRERR_BADCONT, None),
    ("swapped", _swap, E.OPTRERR_BADSEQ, (1, 2)),
    ("other xid", _xid, E.OPTRERR_BADXID, None),
    ("unaligned item", _item(x.xmdp_loc(T.XMPTYPE_EXRW, [_SEG]), disp=2), E.OPTRERR_BADOFF, None),
    ("TBSN target", _item(x.xmdp_loc(T.XMPTYPE_TBSN, x.xmdp_tbsnloc(0, [3]))), E.OPTRERR_BADTBSN, (3, 1, 0)),
    ("pslen", _pslen, E.OPTRERR_BADPL, None),
]  # fmt: skip


def _corrupt_next(conn: RdmaConnection, how: Callable[[Group], Group]) -> None:
    """Fault injection: ``conn``'s next continued message goes out changed by ``how``."""
    original = conn._send_group

    def broken(transmissions: Group) -> None:
        conn._send_group = original  # type: ignore[method-assign]
        original(how(list(transmissions)))

    conn._send_group = broken  # type: ignore[method-assign]


def _decoded(conn: RdmaConnection) -> list[x.optrept_err]:
    """Every REPTERR ``conn`` receives, as it decoded it."""
    seen: list[x.optrept_err] = []
    original = conn._on_repterr

    def record(credit: int, err: x.optrept_err) -> None:
        seen.append(err)
        original(credit, err)

    conn._on_repterr = record  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize(("name", "how", "code", "detail"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_rt18_rt19_each_code_is_reported_decoded_and_the_rpc_completes_over_v1(
    name: str, how: Callable[[Group], Group], code: int, detail: object
) -> None:
    async with rig(connection=Patchable) as r:
        client = r.client
        assert client is not None and r.rpc is not None
        await granted(r)
        seen = _decoded(client)
        _corrupt_next(client, how)
        reads_before = client.stats["read_chunks"]
        await blob_call(r, 16 * 1024)  # completes: the same call again, as plain v1
        assert [e.optre_info.optre_which for e in seen] == [code]
        info = seen[0].optre_info.value
        if isinstance(detail, tuple) and len(detail) == 2:
            assert isinstance(info, x.optr_expect)
            assert (info.optre_expect, info.optre_current) == detail
        elif isinstance(detail, tuple):
            assert isinstance(info, x.optr_range)
            assert (info.optrr_value, info.optrr_min, info.optrr_max) == detail
        broken = seen[0].optre_lead or seen[0].optre_bad
        assert broken.xmsi_dir == x.xms_dir.XMS_CALL and broken.xmsi_seq == 0
        assert client.stats["rtr_fallbacks"] == 1
        assert client.stats["read_chunks"] == reads_before + 1  # the resend: a Long call
        assert r.server[0].stats["rtr_faults"] == 1  # one report per broken message
        await blob_call(r, 16 * 1024)  # continuation works on afterwards
        assert client.stats["rtr_fallbacks"] == 1 and len(seen) == 1
        await r.rpc.call(PROG, VERS, 0)
        assert client.credits.in_flight == 0


async def test_rt18_rt19_a_broken_reply_is_reported_and_resent_in_the_reply_chunk() -> None:
    """A continued reply whose transmissions arrive out of order: the requester reports it
    (REPTERR, BADSEQ about the reply) and waits; the responder decodes the report and resends
    the reply with plain v1, in the Reply chunk the call offered (RT-19); the RPC completes
    with the right result and both keep serving."""
    async with rig(connection=Patchable) as r:
        client = r.client
        assert client is not None and r.rpc is not None
        await granted(r)
        server = r.server[0]
        seen = _decoded(server)
        _corrupt_next(server, _swap)
        # A reply that may reach 64 KiB: more than the 8 transmissions the requester may
        # reserve, so the call offers a Reply chunk as well; 12,000 octets go as 3 Sends.
        await long_reply(r, 12_000, max_size=65_536)
        assert [e.optre_info.optre_which for e in seen] == [E.OPTRERR_BADSEQ]
        assert (seen[0].optre_lead or seen[0].optre_bad).xmsi_dir == x.xms_dir.XMS_REPLY
        assert server.stats["rtr_repterr_replies"] == 1
        assert server.stats["rtr_replies_resent"] == 1
        assert server.stats["replies_long"] == 1  # the resend: RDMA_NOMSG, Reply chunk
        assert client.stats["rtr_faults"] == 1 and client.stats["rtr_replies"] == 0
        await long_reply(r, 12_000, max_size=65_536)  # continuation works on afterwards
        assert client.stats["rtr_replies"] == 1
        await r.rpc.call(PROG, VERS, 0)
        assert client.credits.in_flight == 0 and len(server.kept_replies) == 1


async def test_rt19_a_broken_reply_without_a_reply_chunk_fails_its_rpc_with_err_chunk() -> None:
    """The same fault when the call offered no Reply chunk (the reply fits the receives it
    reserved): plain v1 cannot carry the reply, so the responder answers RDMA_ERROR /
    ERR_CHUNK and the RPC fails at once, cleanly, instead of timing out; both serve on."""
    async with rig(connection=Patchable) as r:
        client = r.client
        assert client is not None and r.rpc is not None
        await granted(r)
        server = r.server[0]
        _corrupt_next(server, _swap)
        with pytest.raises(RdmaErrorReply, match="ERR_CHUNK"):
            await r.rpc.call(
                PROG, VERS, P_READLINK, lambda w: w.extend(U32.pack(12_000)),
                expect=ReplyExpectation([], max_size=16_384), timeout=5,
            )  # fmt: skip
        assert client.stats["reply_chunks"] == 0
        assert server.stats["rtr_repterr_replies"] == 1
        assert server.stats["rtr_replies_resent"] == 1
        await long_reply(r, 12_000, max_size=16_384)
        await r.rpc.call(PROG, VERS, 0)
        assert client.stats["rtr_faults"] == 1 and client.credits.in_flight == 0


def test_rt19_the_reply_keeper_is_bounded_and_resends_once() -> None:
    keeper = cont.ReplyKeeper(2)
    for xid in (1, 2, 3):
        keeper.keep(hdr.Header(xid, 1, 1, hdr.RDMA_MSG), [[b"ab", b"c"], [b"d"]])
    assert len(keeper) == 2 and keeper.take(1) is None
    got = keeper.take(3)
    assert got is not None and got[1] == b"abcd" and got[0].xid == 3
    assert keeper.take(3) is None


async def test_rt12_a_table_1_violation_in_a_request_is_err_chunk() -> None:
    """TOOSHORT is an answer to a reply direction: in a request's items the responder refuses
    the header as a whole (RDMA_ERROR / ERR_CHUNK, not REPTERR), and serves on."""
    async with rig(connection=Patchable) as r:
        client = r.client
        assert client is not None and r.rpc is not None
        await granted(r)
        _corrupt_next(client, _item(x.xmdp_loc(T.XMPTYPE_TOOSHORT, None)))
        with pytest.raises(TransportCallError, match="ERR_CHUNK"):
            await blob_call(r, 16 * 1024)
        assert r.server[0].stats["rtr_faults"] == 0
        await blob_call(r, 16 * 1024)


# -- the table-driven check itself ---------------------------------------------------------


def _ctx(request: bool = True, payload: int = 100, plt: int = 0) -> placement.Context:
    return placement.Context(request=request, payload=payload, segment_size=4096, plt_segments=plt)


LOCS = {
    T.XMPTYPE_EXRW: x.xmdp_loc(T.XMPTYPE_EXRW, [_SEG]),
    T.XMPTYPE_TBSN: x.xmdp_loc(T.XMPTYPE_TBSN, x.xmdp_tbsnloc(0, [0])),
    T.XMPTYPE_TOOSHORT: x.xmdp_loc(T.XMPTYPE_TOOSHORT, None),
    T.XMPTYPE_NOITEM: x.xmdp_loc(T.XMPTYPE_NOITEM, None),
}


@pytest.mark.parametrize("ptype", sorted(LOCS))
@pytest.mark.parametrize("request_side", [True, False])
def test_rt12_table_1_rows(ptype: int, request_side: bool) -> None:
    rule = placement.TABLE1[ptype]
    allowed = rule.request_loc if request_side else rule.response_loc
    item = x.xmdp_mitem(0, 8, LOCS[ptype])
    got = placement.check_items([item], _ctx(request_side, plt=1))
    assert (got is None or got.repterr) is allowed, got


def test_rt12_table_1_as_written_in_the_draft() -> None:
    t = placement.TABLE1
    assert all(t[k].request_loc and t[k].response_loc for k in (T.XMPTYPE_EXRW, T.XMPTYPE_TBSN))
    for k in (T.XMPTYPE_CHOICE, T.XMPTYPE_BYSIZE):  # directions only
        assert t[k].direction and not t[k].request_loc and not t[k].response_loc
    for k in (T.XMPTYPE_TOOSHORT, T.XMPTYPE_NOITEM):  # answers, in responses only
        assert t[k].response_loc and not t[k].request_loc and not t[k].direction


@pytest.mark.parametrize(
    ("items", "code", "detail"),
    [
        ([x.xmdp_mitem(6, 8, LOCS[T.XMPTYPE_EXRW])], E.OPTRERR_BADOFF, (6, 0, 100)),
        ([x.xmdp_mitem(104, 8, LOCS[T.XMPTYPE_EXRW])], E.OPTRERR_BADOFF, (104, 0, 100)),
        (
            [x.xmdp_mitem(40, 8, LOCS[T.XMPTYPE_EXRW]), x.xmdp_mitem(20, 8, LOCS[T.XMPTYPE_EXRW])],
            E.OPTRERR_BADOFF,
            (20, 40, 108),
        ),
        (
            [x.xmdp_mitem(0, 8, x.xmdp_loc(T.XMPTYPE_TBSN, x.xmdp_tbsnloc(4096, [0])))],
            E.OPTRERR_BADOFF,
            (4096, 0, 4092),
        ),
        (
            [x.xmdp_mitem(0, 8, x.xmdp_loc(T.XMPTYPE_TBSN, x.xmdp_tbsnloc(0, [0])))],
            E.OPTRERR_BADTBSN,
            (0, 1, 0),
        ),
    ],
)
def test_rt13_rt14_semantic_checks(
    items: list[x.xmdp_mitem], code: int, detail: tuple[int, int, int]
) -> None:
    got = placement.check_items(items, _ctx())
    assert got is not None and got.code == code and got.value_range == detail


def test_rt14_tbsn_targets_are_checked_against_the_plt_segments() -> None:
    ok = x.xmdp_mitem(0, 8, x.xmdp_loc(T.XMPTYPE_TBSN, x.xmdp_tbsnloc(8, [0, 1, 2])))
    assert placement.check_items([ok], _ctx(plt=3)) is None
    bad = x.xmdp_mitem(0, 8, x.xmdp_loc(T.XMPTYPE_TBSN, x.xmdp_tbsnloc(8, [0, 3])))
    got = placement.check_items([bad], _ctx(plt=3))
    assert got is not None and got.code == E.OPTRERR_BADTBSN and got.value_range == (3, 0, 2)


def test_rt12_exrw_segments_must_add_up_to_the_item() -> None:
    item = x.xmdp_mitem(0, 9, LOCS[T.XMPTYPE_EXRW])
    got = placement.check_items([item], _ctx())
    assert got is not None and not got.repterr


# -- RT-20 -----------------------------------------------------------------------------------


async def test_rt20_padding_in_continued_transmissions_is_zero() -> None:
    """A call whose XDR has padding (an opaque of 10,001 octets) crosses as several Sends: the
    transmissions, captured as posted, carry exactly header plus payload, and the 3 octets of
    padding after the opaque are zero (the send buffers were used before for other data)."""
    async with rig(connection=Patchable) as r:
        client = r.client
        assert client is not None and r.rpc is not None
        await granted(r)
        await blob_call(r, 16 * 1024)  # dirty the send buffers
        sent: list[bytes] = []
        original = client._send_group

        def capture(transmissions: Group) -> None:
            sent.extend(b"".join(bytes(p) for p in t) for t in transmissions)
            original(transmissions)

        client._send_group = capture  # type: ignore[method-assign]
        blob = b"\xff" * 10_001
        await r.rpc.call(PROG, VERS, P_BLOB, lambda w: nfs4.enc_utf8str_cs(w, blob))
        assert len(sent) >= 3
        payload = b""
        for raw in sent:
            m = rh.parse(raw)
            assert len(raw) == m.size + m.pslen
            payload += raw[m.size :]
        at = payload.index(blob) + len(blob)
        assert payload[at : at + 3] == b"\0\0\0" and len(payload) == at + 3


def test_rt6_a_broken_message_is_reported_once() -> None:
    """After a fault, the rest of that group (already posted by its sender) is dropped without
    another report; the next message is handled normally."""
    r = cont.Reassembler()
    xid = 7
    heads = [rh.encode_xmtreq(xid, 1, count=4, rsbuf=0, pslen=10)]
    heads += [rh.encode_xmtcont(xid, 1, xnum=n, pslen=10) for n in (2, 1, 3)]
    events = [e for h in heads for e in r.feed(rh.parse(h), b"x" * 10, limit=8)]
    assert [e.code for e in events if isinstance(e, cont.Fault)] == [E.OPTRERR_BADSEQ]
    assert r.dropped == 2
    (g,) = r.feed(rh.parse(rh.encode_xmtreq(8, 1, count=1, rsbuf=0, pslen=3)), b"abc", limit=8)
    assert isinstance(g, cont.Group) and g.payload == b"abc"
    stray = rh.parse(rh.encode_xmtcont(9, 1, xnum=1, pslen=0))
    (f,) = r.feed(stray, b"", limit=8)
    assert isinstance(f, cont.Fault) and f.code == E.OPTRERR_BADCONT
