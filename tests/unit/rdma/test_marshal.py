"""Chunk planning for calls and replies (RFC 8166 section 3, RFC 8267 section 6.4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.transport.rdma import header as H
from nfsrdma.transport.rdma.credits import CreditWindow
from nfsrdma.transport.rdma.header import HeaderError, Segment
from nfsrdma.transport.rdma.marshal import (
    CallPlan,
    plan_call,
    plan_reply,
    plan_reply_generic,
)
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, Writer
from tests.unit.rdma.helpers import SEGMENTS

STATEID = nfs4.stateid4(1, b"s" * 12)


def write_call(data: bytes, prefix: int = 0) -> Writer:
    """A COMPOUND with PUTFH and WRITE; ``prefix`` adds bulk before the WRITE."""
    w = Writer()
    w += b"\0" * 40  # stands for the RPC header
    ops = [nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(b"f" * 40))]
    ops += [nfs4.nfs_argop4(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"n" * 200))] * (prefix // 204)
    ops.append(nfs4.nfs_argop4(nfs4.OP_WRITE, nfs4.WRITE4args(STATEID, 0, nfs4.UNSTABLE4, data)))
    nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(b"", 1, ops))
    return w


def decode_call(inline: bytes, chunks: dict[int, bytes]) -> nfs4.COMPOUND4args:
    args, off = nfs4.dec_COMPOUND4args(Reader(inline, dict(chunks)), 40)
    assert off == len(inline)
    return args


def test_tr13_short_call_boundaries() -> None:
    base = len(write_call(b"").flatten())
    hdr = H.header_size(0, [], None)
    for extra, proc in ((-4, H.RDMA_MSG), (0, H.RDMA_MSG), (4, H.RDMA_MSG)):
        limit = hdr + base + 8 + extra
        plan = plan_call(write_call(b"12345678"), send_limit=limit, recv_limit=1024)
        if extra < 0:
            assert plan.reads, "over the threshold by 4 bytes: the data moves to a chunk"
        else:
            assert plan.proc == proc and not plan.reads and plan.inline_size == base + 8


@pytest.mark.parametrize("size", [4096, 4097, 4099])
def test_tr7_tr8_write_data_moves_to_a_read_chunk_without_padding(size: int) -> None:
    data = bytes(range(256)) * 16 + b"x" * (size - 4096)
    msg = write_call(data)
    plan = plan_call(msg, send_limit=1024, recv_limit=1024)
    assert plan.proc == H.RDMA_MSG and len(plan.reads) == 1
    (exposure,) = plan.reads
    assert b"".join(bytes(p) for p in exposure.data) == data  # no round-up padding (TR-8)
    inline = b"".join(bytes(p) for p in plan.inline)
    assert len(inline) == len(msg)  # neither data nor its padding inline
    # The responder's reassembly: the chunk at its position restores the WRITE exactly.
    args = decode_call(inline, {exposure.position: data})
    assert bytes(args.argarray[-1].value.data) == data
    # A peer that includes the padding in the chunk is tolerated (TR-8).
    args = decode_call(inline, {exposure.position: data + b"\0" * (-size & 3)})
    assert bytes(args.argarray[-1].value.data) == data


def test_tr9_long_call_uses_a_position_zero_chunk() -> None:
    msg = write_call(b"d" * 8000, prefix=3000)
    plan = plan_call(msg, send_limit=1024, recv_limit=1024)
    assert plan.proc == H.RDMA_NOMSG and plan.inline == []
    pz, data = plan.reads
    assert pz.position == 0 and data.position > 0
    message = b"".join(bytes(p) for p in pz.data)
    args = decode_call(message, {data.position: b"d" * 8000})
    assert len(args.argarray) == 1 + 3000 // 204 + 1


def test_tr10_ul3_reply_chunk_when_the_reply_may_be_long() -> None:
    small = plan_call(write_call(b""), send_limit=4096, recv_limit=4096, max_reply=512)
    assert small.reply_chunk is None
    big = plan_call(write_call(b""), send_limit=4096, recv_limit=4096, max_reply=65536)
    assert big.reply_chunk == 65536
    read = plan_call(write_call(b""), send_limit=4096, recv_limit=4096, sinks=[1 << 20, 4096])
    assert read.write_chunks == [1 << 20]  # the baseline: one Write chunk (UL-18)


def read_reply(results: list[tuple[int, object]]) -> Writer:
    """A COMPOUND4res encoded as the server does: DDP items tagged by READ-class ordinal."""
    w = Writer()
    w += b"\0" * 24  # stands for the RPC reply header
    w += b"\0" * 4  # COMPOUND status
    nfs4.enc_utf8str_cs(w, b"")
    w += len(results).to_bytes(4, "big")
    ordinal = 0
    for op, res in results:
        if op in (nfs4.OP_READ, nfs4.OP_READLINK):
            w.ddp_tag = ordinal
            ordinal += 1
        nfs4.enc_nfs_resop4(w, nfs4.nfs_resop4(op, res))
    return w


def ok_read(data: bytes) -> tuple[int, object]:
    return nfs4.OP_READ, nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(False, data))


def ok_readlink(text: bytes) -> tuple[int, object]:
    return nfs4.OP_READLINK, nfs4.READLINK4res(nfs4.NFS4_OK, nfs4.READLINK4resok(text))


def call_header(writes: list[list[Segment]], reply: list[Segment] | None = None) -> H.Header:
    return H.parse(H.encode(3, 8, H.RDMA_MSG, [], writes, reply))


def seg(handle: int, length: int) -> Segment:
    return Segment(handle, length, handle << 20)


def test_ul13_ul14_ul15_pairing_of_the_rfc_example() -> None:
    """RFC 8267 6.4.3: READ / READLINK / READ with chunks A, B (empty), C."""
    msg = read_reply([ok_read(b"a" * 3000), ok_readlink(b"/target"), ok_read(b"c" * 5000)])
    call = call_header([[seg(0xA, 4096)], [], [seg(0xC, 8192)]])
    plan = plan_reply(msg, call, send_limit=1024)
    assert plan.proc == H.RDMA_MSG
    assert [(w.segment.handle, len(w.data)) for w in plan.writes] == [(0xA, 3000), (0xC, 5000)]
    assert plan.write_list == [[seg(0xA, 3000)], [], [seg(0xC, 5000)]]
    inline = b"".join(bytes(p) for p in plan.inline)
    assert b"/target" in inline and b"a" * 8 not in inline and b"c" * 8 not in inline
    # The requester decodes it with the written chunks, in order (B unused → inline).
    r = Reader(inline, ordered=[b"a" * 3000, None, b"c" * 5000])
    res, _ = nfs4.dec_COMPOUND4res(r, 24)
    assert bytes(res.resarray[0].value.value.data) == b"a" * 3000
    assert bytes(res.resarray[1].value.value.link) == b"/target"
    assert bytes(res.resarray[2].value.value.data) == b"c" * 5000


def test_ul16_error_arm_returns_an_unused_chunk() -> None:
    err = (nfs4.OP_READ, nfs4.READ4res(nfs4.NFS4ERR_ISDIR))
    plan = plan_reply(read_reply([err]), call_header([[seg(0xA, 4096)]]), send_limit=1024)
    assert plan.writes == [] and plan.write_list == [[seg(0xA, 0)]]


def test_ul17_reads_beyond_the_write_chunks_come_inline() -> None:
    msg = read_reply([ok_read(b"1" * 100), ok_read(b"2" * 100), ok_read(b"3" * 100)])
    plan = plan_reply(msg, call_header([[seg(0xA, 4096)]]), send_limit=1024)
    inline = b"".join(bytes(p) for p in plan.inline)
    assert b"2" * 100 in inline and b"3" * 100 in inline and b"1" * 100 not in inline


def test_ul12_empty_write_list_means_inline() -> None:
    plan = plan_reply(read_reply([ok_read(b"z" * 500)]), call_header([]), send_limit=1024)
    assert plan.writes == [] and b"z" * 500 in b"".join(bytes(p) for p in plan.inline)


def test_tr10_long_reply_goes_to_the_reply_chunk() -> None:
    msg = read_reply([ok_readlink(b"L" * 3000)])
    call = call_header([], [seg(0xD, 2048), seg(0xE, 2048)])
    plan = plan_reply(msg, call, send_limit=1024)
    assert plan.proc == H.RDMA_NOMSG and plan.inline == []
    total = len(msg.flatten())
    assert plan.reply == [seg(0xD, 2048), seg(0xE, total - 2048)]
    assert b"".join(bytes(w.data) for w in plan.writes) == msg.flatten()


def test_tr21_reply_resource_overrun_is_err_chunk() -> None:
    with pytest.raises(HeaderError) as e:  # a 4 KiB Write chunk for 64 KiB of READ data
        plan_reply(read_reply([ok_read(b"q" * 65536)]), call_header([[seg(1, 4096)]]), 1024)
    assert e.value.err == H.ERR_CHUNK and e.value.xid == 3
    with pytest.raises(HeaderError):  # too long for inline, no Reply chunk
        plan_reply(read_reply([ok_readlink(b"L" * 3000)]), call_header([]), 1024)
    with pytest.raises(HeaderError):  # a Reply chunk that is too small
        plan_reply(read_reply([ok_readlink(b"L" * 3000)]), call_header([], [seg(1, 100)]), 1024)


def test_tr14_ul26_credit_window() -> None:
    c = CreditWindow(local_max=64)
    assert c.granted == 1 and c.may_send()  # one credit before the first reply
    c.sent()
    assert not c.may_send() and not c.may_send(probe=True)
    for grant, expect in ((0, 1), (5, 5), (500, 64)):
        c.update(grant)
        assert c.granted == expect
    c.in_flight = 4
    c.update(5)
    assert not c.may_send() and c.may_send(probe=True)  # the last credit is for the probe


def _planned(msg: Writer, call: H.Header, limit: int, plan: object) -> object:
    """A plan (or the error) as comparable values: the Send's bytes, not how they are cut."""
    try:
        p = plan(msg, call, limit)  # type: ignore[operator]
    except HeaderError as e:
        return ("error", e.err, e.xid, str(e))
    return (
        p.proc,
        [(bytes(w.data), w.segment, w.segment_offset) for w in p.writes],
        p.write_list,
        p.reply,
        b"".join(bytes(x) for x in p.inline),
    )


_RESULT = st.one_of(
    st.binary(max_size=5000).map(ok_read),
    st.binary(max_size=300).map(ok_readlink),
    st.just((nfs4.OP_READ, nfs4.READ4res(nfs4.NFS4ERR_ISDIR))),
    st.just((nfs4.OP_GETATTR, nfs4.GETATTR4res(nfs4.NFS4ERR_STALE))),
)


@settings(max_examples=400, deadline=None)
@given(
    results=st.lists(_RESULT, max_size=3),
    writes=st.lists(SEGMENTS, max_size=2),
    reply=st.none() | SEGMENTS,
    limit=st.sampled_from([1024, 2048, 4096, 8192]),
)
def test_plan_reply_fast_shapes_match_the_generic_plan(
    results: list[tuple[int, object]],
    writes: list[list[Segment]],
    reply: list[Segment] | None,
    limit: int,
) -> None:
    """``plan_reply``'s direct plans for the common shapes (a plain reply to a call without
    chunks; a READ's data into one single-segment Write chunk) are the generic plan's, down to
    the byte, and so are its errors (TR-21)."""
    msg = read_reply(results)
    call = call_header(writes, reply)
    assert _planned(msg, call, limit, plan_reply) == _planned(msg, call, limit, plan_reply_generic)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097])
def test_plan_reply_fast_shape_for_a_read(size: int) -> None:
    """The READ shape: one segment of 4096 bytes, ``size`` bytes of data (more is ERR_CHUNK)."""
    msg = read_reply([ok_read(b"r" * size)])
    call = call_header([[seg(0xA, 4096)]])
    assert _planned(msg, call, 1024, plan_reply) == _planned(msg, call, 1024, plan_reply_generic)
    if size <= 4096:
        plan = plan_reply(msg, call, 1024)
        assert plan.write_list == [[seg(0xA, size)]] and len(plan.writes) == (1 if size else 0)


def _call_planned(plan: CallPlan) -> tuple[object, ...]:
    return (
        plan.proc,
        b"".join(bytes(x) for x in plan.inline),
        [(r.position, b"".join(bytes(x) for x in r.data)) for r in plan.reads],
        plan.write_chunks,
        plan.reply_chunk,
    )


@settings(max_examples=400, deadline=None)
@given(
    data=st.none() | st.binary(max_size=6000),
    sinks=st.lists(st.integers(0, 1 << 20), max_size=2),
    send_limit=st.sampled_from([1024, 1100, 4096, 8192]),
    recv_limit=st.sampled_from([1024, 4096, 8192]),
    draw=st.data(),
)
def test_plan_call_direct_shape_matches_the_generic_plan(
    data: bytes | None,
    sinks: list[int],
    send_limit: int,
    recv_limit: int,
    draw: st.DataObject,
) -> None:
    """``plan_call``'s direct plan (no DDP item, no result buffer, inline) is the generic
    plan (``direct=False``), with or without a Reply chunk (TR-10, TR-13), at the thresholds too; other calls
    take the generic one."""
    near = st.integers(-24, 24)  # around a threshold, where a header's size decides
    size = draw.draw(st.integers(0, 9000) | near.map(lambda d: max(0, send_limit - 28 + d)))
    max_reply = draw.draw(st.integers(0, 1 << 16) | near.map(lambda d: max(0, recv_limit - 28 + d)))
    msg = write_call(data, size) if data is not None else Writer(b"c" * size)
    kw = {"send_limit": send_limit, "recv_limit": recv_limit, "sinks": sinks}
    fast = plan_call(msg, max_reply=max_reply, **kw)  # type: ignore[arg-type]
    generic = plan_call(msg, max_reply=max_reply, direct=False, **kw)  # type: ignore[arg-type]
    assert _call_planned(fast) == _call_planned(generic)


@pytest.mark.parametrize("limit", [1024, 4096])
def test_plan_call_direct_shape_at_the_thresholds(limit: int) -> None:
    """Every call and reply size around the inline thresholds, with and without a Reply
    chunk: the direct plan is the generic one, and sizes beyond take the generic path."""
    for size in range(limit - 60, limit - 16, 4):
        for max_reply in range(limit - 40, limit - 16, 4):
            msg = Writer(b"c" * size)
            kw = {"send_limit": limit, "recv_limit": limit, "max_reply": max_reply}
            fast = plan_call(msg, **kw)  # type: ignore[arg-type]
            assert _call_planned(fast) == _call_planned(plan_call(msg, direct=False, **kw))  # type: ignore[arg-type]
