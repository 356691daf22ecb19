"""RFC 8166 (RPC-over-RDMA version 1): how the responder answers transport headers it cannot
process. These checks need an rdma:// URL; over TCP they are skipped."""

from __future__ import annotations

from nfsrdma.conform.harness import Harness
from nfsrdma.conform.rdma_raw import (
    ERR_CHUNK,
    ERR_VERS,
    RDMA_DONE,
    RDMA_MSG,
    RDMA_MSGP,
    RDMA_NOMSG,
    Verdict,
    send_header,
    words,
)
from nfsrdma.conform.registry import Failed, check
from nfsrdma.xdr.gen import nfs4

G = "rfc8166"
RDMA = ("rdma",)


def null_call(xid: int) -> bytes:
    """An NFSv4 NULL call body (RPC v2, AUTH_NONE) for ``xid``."""
    return words(xid, 0, 2, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, 0, 0, 0, 0)


def _expect(v: Verdict, error: int, what: str) -> None:
    if v.error != error:
        want = "RDMA_ERROR ERR_VERS" if error == ERR_VERS else "RDMA_ERROR ERR_CHUNK"
        raise Failed(f"{want} for {what}", v.describe())


async def _answer(h: Harness, build: object) -> Verdict:
    conn = await h.connect()
    return await send_header(conn, build, h.timeout)


@check(
    "TR-3.1",
    "Header version 2: ERR_VERS with the range",
    "RFC 8166 §4",
    group=G,
    transports=RDMA,
)
async def err_vers(h: Harness) -> None:
    """A call whose rdma_vers is 2 draws RDMA_ERROR ERR_VERS with the call's XID and the
    range of versions the responder supports (rdma_vers_low, rdma_vers_high), which includes
    version 1."""
    v = await _answer(h, lambda xid: words(xid, 2, 1, RDMA_MSG, 0, 0, 0) + null_call(xid))
    _expect(v, ERR_VERS, "rdma_vers 2")
    if v.vers_range is None or not v.vers_range[0] <= 1 <= v.vers_range[1]:
        raise Failed("a version range including 1", repr(v.vers_range))


@check("TR-3.2", "Version 1 still works after ERR_VERS", "RFC 8166 §4", group=G, transports=RDMA)
async def after_err_vers(h: Harness) -> None:
    """After an ERR_VERS, a version 1 NULL call on the same connection is answered."""
    conn = await h.connect()
    v = await send_header(
        conn, lambda xid: words(xid, 2, 1, RDMA_MSG, 0, 0, 0) + null_call(xid), h.timeout
    )
    _expect(v, ERR_VERS, "rdma_vers 2")
    try:
        await conn.null()
    except Exception as e:  # any failure of the NULL call is the finding
        raise Failed("a reply to NULL", f"{type(e).__name__}: {e}") from None


@check(
    "TR-4.1",
    "RDMA_MSGP call: ERR_CHUNK",
    "RFC 8166 §4; RFC 8267 App. A",
    group=G,
    transports=RDMA,
)
async def msgp(h: Harness) -> None:
    """A call using the obsolete RDMA_MSGP procedure draws RDMA_ERROR ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_MSGP, 0, 0, 0, 0, 0) + null_call(xid))
    _expect(v, ERR_CHUNK, "RDMA_MSGP")


@check("TR-4.2", "RDMA_DONE call: ERR_CHUNK", "RFC 8166 §4", group=G, transports=RDMA)
async def done(h: Harness) -> None:
    """A call using the obsolete RDMA_DONE procedure draws RDMA_ERROR ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_DONE))
    _expect(v, ERR_CHUNK, "RDMA_DONE")


@check("TR-4.3", "Unknown procedure: ERR_CHUNK", "RFC 8166 §4", group=G, transports=RDMA)
async def unknown_proc(h: Harness) -> None:
    """A header with an rdma_proc the protocol does not define (7) draws RDMA_ERROR
    ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, 7, 0, 0, 0) + null_call(xid))
    _expect(v, ERR_CHUNK, "rdma_proc 7")


@check("TR-17.1", "Truncated header: ERR_CHUNK", "RFC 8166 §4", group=G, transports=RDMA)
async def truncated(h: Harness) -> None:
    """A header that ends after rdma_credit (no procedure, no chunk lists) draws RDMA_ERROR
    ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1))
    _expect(v, ERR_CHUNK, "a 12-byte header")


@check(
    "TR-17.2",
    "Chunk list discriminator not a bool: ERR_CHUNK",
    "RFC 8166 §4",
    group=G,
    transports=RDMA,
)
async def bad_bool(h: Harness) -> None:
    """A Read list whose XDR optional-data discriminator is 5 (neither 0 nor 1) draws
    RDMA_ERROR ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_MSG, 5) + null_call(xid))
    _expect(v, ERR_CHUNK, "a list discriminator of 5")


@check(
    "TR-17.3",
    "Read chunk position not XDR-aligned: ERR_CHUNK",
    "RFC 8166 §3.4, §4",
    group=G,
    transports=RDMA,
)
async def bad_position(h: Harness) -> None:
    """A Read chunk at XDR position 6 (positions are multiples of 4) draws RDMA_ERROR
    ERR_CHUNK."""
    seg = (1, 8, 0, 0x1000)
    v = await _answer(
        h, lambda xid: words(xid, 1, 1, RDMA_MSG, 1, 6, *seg, 0, 0, 0) + null_call(xid)
    )
    _expect(v, ERR_CHUNK, "a Read chunk at position 6")


@check(
    "TR-17.4",
    "Read chunk position beyond the message: ERR_CHUNK",
    "RFC 8166 §3.4, §4",
    group=G,
    transports=RDMA,
)
async def position_beyond(h: Harness) -> None:
    """A Read chunk whose position lies beyond the end of the RPC message draws RDMA_ERROR
    ERR_CHUNK."""
    seg = (1, 8, 0, 0x1000)
    v = await _answer(
        h, lambda xid: words(xid, 1, 1, RDMA_MSG, 1, 4000, *seg, 0, 0, 0) + null_call(xid)
    )
    _expect(v, ERR_CHUNK, "a Read chunk at position 4000 of a 40-byte message")


@check(
    "TR-17.5",
    "RDMA_NOMSG without chunks: ERR_CHUNK",
    "RFC 8166 §4",
    group=G,
    transports=RDMA,
)
async def nomsg_empty(h: Harness) -> None:
    """An RDMA_NOMSG call with no Read chunk at position zero (so no RPC message at all) draws
    RDMA_ERROR ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_NOMSG, 0, 0, 0))
    _expect(v, ERR_CHUNK, "RDMA_NOMSG with empty chunk lists")


@check(
    "TR-3.3",
    "ERR_VERS echoes the call's rdma_vers",
    "RFC 8166 §4.5",
    group=G,
    transports=RDMA,
)
async def err_vers_header(h: Harness) -> None:
    """The RDMA_ERROR answering a version 2 call carries the call's XID and its rdma_vers (2):
    RFC 8166 section 4.5 has an RDMA_ERROR's rdma_xid and rdma_vers repeat the failing
    request's."""
    v = await _answer(h, lambda xid: words(xid, 2, 1, RDMA_MSG, 0, 0, 0) + null_call(xid))
    _expect(v, ERR_VERS, "rdma_vers 2")
    if v.vers != 2:
        raise Failed("rdma_vers 2 in the RDMA_ERROR", f"rdma_vers {v.vers}")


@check(
    "TR-17.6",
    "Write list discriminator not a bool: ERR_CHUNK",
    "RFC 8166 §4.2, §4.5; RFC 4506 §4.4",
    group=G,
    transports=RDMA,
)
async def bad_write_list_bool(h: Harness) -> None:
    """A Write list whose XDR optional-data discriminator is 5 draws RDMA_ERROR ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_MSG, 0, 5) + null_call(xid))
    _expect(v, ERR_CHUNK, "a Write list discriminator of 5")


@check(
    "TR-17.7",
    "Reply chunk discriminator not a bool: ERR_CHUNK",
    "RFC 8166 §4.2, §4.5; RFC 4506 §4.4",
    group=G,
    transports=RDMA,
)
async def bad_reply_bool(h: Harness) -> None:
    """A Reply chunk whose XDR optional-data discriminator is 7 draws RDMA_ERROR ERR_CHUNK."""
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_MSG, 0, 0, 7) + null_call(xid))
    _expect(v, ERR_CHUNK, "a Reply chunk discriminator of 7")


@check(
    "TR-17.8",
    "Write chunk segment count beyond the header: ERR_CHUNK",
    "RFC 8166 §4.2, §4.5",
    group=G,
    transports=RDMA,
)
async def truncated_write_chunk(h: Harness) -> None:
    """A Write chunk claiming 200 segments in a message that holds two draws RDMA_ERROR
    ERR_CHUNK (the header cannot be parsed)."""
    seg = (1, 8, 0, 0x1000)
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_MSG, 0, 1, 200, *seg, *seg))
    _expect(v, ERR_CHUNK, "a Write chunk of 200 segments with 2 present")


@check(
    "TR-17.9",
    "Overlapping Read chunks: ERR_CHUNK",
    "RFC 8166 §3.4.5, §4.5",
    group=G,
    transports=RDMA,
)
async def overlapping_reads(h: Harness) -> None:
    """Three Read chunks at positions 8, 12 and 8 again (the third places data where the
    first already did, and the list goes backwards) draw RDMA_ERROR ERR_CHUNK: the call's XDR
    stream cannot be reassembled."""
    seg = (1, 8, 0, 0x1000)

    def build(xid: int) -> bytes:
        reads = [1, 8, *seg, 1, 12, *seg, 1, 8, *seg, 0]
        return words(xid, 1, 1, RDMA_MSG, *reads, 0, 0) + null_call(xid)

    v = await _answer(h, build)
    _expect(v, ERR_CHUNK, "Read chunks at positions 8, 12, 8")


@check(
    "TR-17.10",
    "Position-zero Read chunk in RDMA_MSG: ERR_CHUNK",
    "RFC 8166 §3.5.3, §4.5",
    group=G,
    transports=RDMA,
)
async def msg_with_position_zero(h: Harness) -> None:
    """An RDMA_MSG call (whose RPC message follows the header inline) that also lists a Read
    chunk at position zero (where only an RDMA_NOMSG call's whole message may be) draws
    RDMA_ERROR ERR_CHUNK."""
    seg = (1, 40, 0, 0x1000)
    v = await _answer(
        h, lambda xid: words(xid, 1, 1, RDMA_MSG, 1, 0, *seg, 0, 0, 0) + null_call(xid)
    )
    _expect(v, ERR_CHUNK, "RDMA_MSG with a position-zero Read chunk")


@check(
    "TR-17.11",
    "RDMA_NOMSG with only a non-zero-position Read chunk: ERR_CHUNK",
    "RFC 8166 §3.5.3, §4.5",
    group=G,
    transports=RDMA,
)
async def nomsg_no_position_zero(h: Harness) -> None:
    """An RDMA_NOMSG call whose Read list has a chunk at position 8 but none at position zero
    (so no RPC message) draws RDMA_ERROR ERR_CHUNK."""
    seg = (1, 8, 0, 0x1000)
    v = await _answer(h, lambda xid: words(xid, 1, 1, RDMA_NOMSG, 1, 8, *seg, 0, 0, 0))
    _expect(v, ERR_CHUNK, "RDMA_NOMSG with only a Read chunk at position 8")


async def _processed_or_refused(h: Harness, build: object, what: str) -> None:
    v = await _answer(h, build)
    if v.error not in (None, ERR_CHUNK) or (v.error is None and v.detail != "a normal reply"):
        raise Failed(f"a NULL reply or RDMA_ERROR ERR_CHUNK for {what}", v.describe())


@check(
    "TR-17.12",
    "Two Write chunks: processed or ERR_CHUNK",
    "RFC 8267 §6.4.2",
    group=G,
    transports=RDMA,
)
async def two_write_chunks(h: Harness) -> None:
    """A NULL call offering two Write chunks (beyond RFC 8267's baseline of one) is either
    answered (the chunks unused) or refused with RDMA_ERROR ERR_CHUNK, never ignored."""
    seg = (1, 64, 0, 0x1000)
    await _processed_or_refused(
        h,
        lambda xid: words(xid, 1, 1, RDMA_MSG, 0, 1, 1, *seg, 1, 1, *seg, 0, 0) + null_call(xid),
        "two Write chunks",
    )


@check(
    "TR-17.13",
    "A 40-segment Write chunk: processed or ERR_CHUNK",
    "RFC 8267 §6.4.2",
    group=G,
    transports=RDMA,
)
async def many_segments(h: Harness) -> None:
    """A NULL call offering one Write chunk of 40 segments (beyond RFC 8267's baseline of 16)
    is either answered or refused with RDMA_ERROR ERR_CHUNK, never ignored."""
    seg = (1, 64, 0, 0x1000)
    await _processed_or_refused(
        h,
        lambda xid: words(xid, 1, 1, RDMA_MSG, 0, 1, 40, *(seg * 40), 0, 0) + null_call(xid),
        "40 segments",
    )
