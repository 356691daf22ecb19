"""RPC-over-RDMA v1 transport header: parsing, checks and errors (RFC 8166, RFC 8267)."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.transport.rdma import header as H
from nfsrdma.transport.rdma.header import ChunkLimits, HeaderError, ReadChunk, Segment


def words(*ws: int) -> bytes:
    return b"".join(struct.pack(">I", w) for w in ws)


def seg(i: int, length: int = 4096) -> Segment:
    return Segment(0x100 + i, length, 0x10000 * (i + 1))


def test_tr1_tr5_round_trip_and_read_chunk_grouping() -> None:
    reads = [ReadChunk(0, [seg(0)]), ReadChunk(148, [seg(1), seg(2, 100)])]
    data = H.encode(7, 32, H.RDMA_NOMSG, reads, [[seg(3)]], [seg(4), seg(5)])
    h = H.parse(data)
    assert (h.xid, h.vers, h.credit, h.proc) == (7, 1, 32, H.RDMA_NOMSG)
    assert h.reads == reads and h.writes == [[seg(3)]] and h.reply == [seg(4), seg(5)]
    assert h.size == len(data) == H.header_size(3, [1], 2)
    assert h.rkeys() == {0x100, 0x101, 0x102, 0x103, 0x104, 0x105}


def test_tr3_other_version_gets_err_vers_with_our_range() -> None:
    bad = words(0xA1, 2, 1, 0, 0, 0, 0)
    with pytest.raises(HeaderError) as e:
        H.parse(bad)
    assert (e.value.xid, e.value.err) == (0xA1, H.ERR_VERS)
    assert H.encode_error(0xA1, 5, H.ERR_VERS) == words(0xA1, 1, 5, 4, 1, 1, 1)
    err = H.parse(H.encode_error(0xA1, 5, H.ERR_VERS))
    assert (err.proc, err.error, err.vers_range) == (H.RDMA_ERROR, H.ERR_VERS, (1, 1))


@pytest.mark.parametrize("proc", [2, 3, 5, 0xFFFF])
def test_tr4_obsolete_and_unknown_procedures_get_err_chunk(proc: int) -> None:
    body = words(0, 0) if proc == 2 else b""
    with pytest.raises(HeaderError) as e:
        H.parse(words(9, 1, 1, proc) + body + words(0, 0, 0))
    assert e.value.err == H.ERR_CHUNK and e.value.xid == 9


def test_tr17_truncated_and_malformed_headers() -> None:
    with pytest.raises(HeaderError) as e:
        H.parse(words(0x55, 1))
    assert (e.value.xid, e.value.err) == (0x55, H.ERR_CHUNK)
    with pytest.raises(HeaderError) as e:
        H.parse(b"\x01\x02")
    assert e.value.xid is None and e.value.err is None  # nothing to answer to: dropped
    with pytest.raises(HeaderError) as e:
        H.parse(words(0x56, 1, 1, 0, 5))  # a list link that is not a bool
    assert e.value.err == H.ERR_CHUNK
    with pytest.raises(HeaderError):
        H.parse(words(0x57, 1, 1, 0, 1, 0, 1))  # a read list cut short


def _checked(
    reads: list[ReadChunk],
    writes: list[list[Segment]],
    proc: int = H.RDMA_MSG,
    inline_len: int = 512,
    limits: ChunkLimits | None = None,
) -> None:
    h = H.parse(H.encode(1, 1, proc, reads, writes, None))
    H.check_call(h, inline_len, limits or ChunkLimits())


def test_ul18_baseline_is_accepted() -> None:
    segs16 = [seg(i, 256) for i in range(16)]
    _checked([ReadChunk(0, segs16), ReadChunk(100, segs16)], [segs16], H.RDMA_NOMSG)


@pytest.mark.parametrize(
    ("reads", "writes", "proc", "why"),
    [
        ([], [[seg(i) for i in range(17)]], H.RDMA_MSG, "17 segments"),
        ([], [[seg(0)], [seg(1)]], H.RDMA_MSG, "2 Write chunks"),
        ([ReadChunk(102, [seg(0)])], [], H.RDMA_MSG, "position not a multiple of 4"),
        ([ReadChunk(4096, [seg(0)])], [], H.RDMA_MSG, "position beyond the message"),
        ([], [[Segment(1, 1 << 30, 0)]], H.RDMA_MSG, "segment over the limit"),
        ([ReadChunk(0, [seg(0)])], [], H.RDMA_MSG, "position zero in RDMA_MSG"),
        ([ReadChunk(8, [seg(0)])], [], H.RDMA_NOMSG, "RDMA_NOMSG without position zero"),
        (
            [ReadChunk(8, [seg(0)]), ReadChunk(16, [seg(1)]), ReadChunk(24, [seg(2)])],
            [],
            H.RDMA_MSG,
            "three Read chunks",
        ),
    ],
)
def test_tr17_sec8_over_the_limits_is_err_chunk(
    reads: list[ReadChunk], writes: list[list[Segment]], proc: int, why: str
) -> None:
    with pytest.raises(HeaderError) as e:
        _checked(reads, writes, proc)
    assert e.value.err == H.ERR_CHUNK, why


def test_ul19_limits_are_configurable_beyond_the_baseline() -> None:
    two = [[seg(0)], [seg(1)]]
    _checked([], two, limits=ChunkLimits(max_write_chunks=2))


def test_plain_header_shortcut_matches_the_codec() -> None:
    """The header without chunks is produced and read without the generated codec; its
    bytes and meaning are the codec's."""
    from nfsrdma.xdr.gen import rpcrdma
    from nfsrdma.xdr.runtime import pack

    body = rpcrdma.rdma_body(rpcrdma.RDMA_MSG, rpcrdma.rpc_rdma_header([], [], None))
    codec = pack(rpcrdma.enc_rdma_msg, rpcrdma.rdma_msg(0xABCD, 1, 17, body))
    assert H.encode(0xABCD, 17, H.RDMA_MSG) == codec
    h = H.parse(codec + b"rpc message")
    assert (h.xid, h.credit, h.proc, h.reads, h.writes, h.reply, h.size) == (
        0xABCD, 17, H.RDMA_MSG, [], [], None, len(codec)
    )  # fmt: skip


_segments = st.lists(
    st.builds(
        Segment,
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**64 - 1),
    ),
    max_size=4,
)


def _outcome(fn: Callable[[], H.Header]) -> object:
    try:
        h = fn()
    except HeaderError as e:
        return ("error", str(e), e.xid, e.err, e.vers)
    return (h.xid, h.vers, h.credit, h.proc, h.reads, h.writes, h.reply, h.error, h.size)


@settings(max_examples=400, deadline=None)
@given(
    xid=st.integers(0, 2**32 - 1),
    credit=st.integers(0, 2**32 - 1),
    reads=st.lists(
        st.builds(ReadChunk, st.integers(0, 64).map(lambda p: 4 * p), _segments.filter(bool)),
        max_size=2,
    ),
    writes=st.lists(_segments, max_size=2),
    reply=st.none() | _segments,
    proc=st.sampled_from([H.RDMA_MSG, H.RDMA_NOMSG]),
    cut=st.integers(0, 200),
    flips=st.lists(st.tuples(st.integers(0, 199), st.integers(0, 255)), max_size=3),
    tail=st.binary(max_size=12),
)
def test_one_write_chunk_shortcuts_match_the_codec(
    xid: int,
    credit: int,
    reads: list[ReadChunk],
    writes: list[list[Segment]],
    reply: list[Segment] | None,
    proc: int,
    cut: int,
    flips: list[tuple[int, int]],
    tail: bytes,
) -> None:
    """A header with one Write chunk and nothing else (a READ call and its reply) is encoded
    and parsed without the generated codec; for any header, intact, truncated or altered, the
    bytes and the outcome (the header or the error) are the codec's."""
    encoded = H.encode(xid, credit, proc, reads, writes, reply)
    assert encoded == H._encode_lists(xid, credit, proc, reads, writes, reply)
    for buf in (encoded + tail, encoded[:cut]):
        data = bytearray(buf)
        assert _same(bytes(data))
        for at, value in flips:
            if at < len(data):
                data[at] = value
        assert _same(bytes(data))


def _same(buf: bytes) -> bool:
    return _outcome(lambda: H.parse(buf)) == _outcome(lambda: _generic_parse(buf))


def _generic_parse(buf: bytes) -> H.Header:
    """``parse`` with the chunk lists always decoded by the generated codec."""
    if len(buf) < 16 or struct.unpack_from(">I", buf, 4)[0] != H.VERSION:
        return H.parse(buf)  # the version checks come before any shortcut
    xid, vers, credit, proc = struct.unpack_from(">IIII", buf)
    return H._parse_lists(buf, xid, vers, credit, proc)


def test_one_write_chunk_shortcut_is_taken() -> None:
    """The READ call's header shape goes by the shortcut (the codec is not called)."""
    segs = [Segment(7, 4096, 0x1000), Segment(8, 100, 2**40)]
    buf = H.encode(9, 32, H.RDMA_MSG, [], [segs])
    assert buf == H._encode_lists(9, 32, H.RDMA_MSG, [], [segs], None)
    import nfsrdma.transport.rdma.header as module

    real = module._parse_lists
    module._parse_lists = None  # type: ignore[assignment]
    try:
        h = H.parse(buf + b"rpc")
    finally:
        module._parse_lists = real
    assert (h.writes, h.reads, h.reply, h.size) == ([segs], [], None, len(buf))


def _checked_outcome(fn: Callable[[], None]) -> object:
    try:
        fn()
    except HeaderError as e:
        return (str(e), e.xid, e.err)
    return None


@settings(max_examples=400, deadline=None)
@given(
    reads=st.lists(
        st.builds(ReadChunk, st.integers(0, 8).map(lambda p: 4 * p), _segments.filter(bool)),
        max_size=2,
    ),
    writes=st.lists(_segments, max_size=2),
    reply=st.none() | _segments,
    proc=st.sampled_from([H.RDMA_MSG, H.RDMA_NOMSG]),
    inline_len=st.integers(0, 64),
    limits=st.builds(
        ChunkLimits,
        max_segments=st.integers(0, 4),
        max_read_chunks=st.integers(0, 2),
        max_write_chunks=st.integers(0, 2),
        max_segment_length=st.integers(0, 2**32),
        max_chunk_bytes=st.integers(0, 2**33),
    ),
)
def test_check_call_shortcut_matches_the_general_checks(
    reads: list[ReadChunk],
    writes: list[list[Segment]],
    reply: list[Segment] | None,
    proc: int,
    inline_len: int,
    limits: ChunkLimits,
) -> None:
    """Calls without Read or Reply chunks are checked by a shortcut: same verdict, same error."""
    h = H.Header(1, H.VERSION, 32, proc, reads=reads, writes=writes, reply=reply)
    assert _checked_outcome(lambda: H.check_call(h, inline_len, limits)) == _checked_outcome(
        lambda: H._check_call_chunks(h, inline_len, limits)
    )
