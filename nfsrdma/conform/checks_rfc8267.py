"""RFC 8267 (the NFS upper-layer binding to RPC-over-RDMA version 1): the DDP-eligible items
(READ and READLINK results into Write chunks, WRITE and SYMLINK data from Read chunks), short
reads and EOF, and replies that do not fit what the requester offered. RPC-over-RDMA only."""

from __future__ import annotations

import os

from nfsrdma.client import ops
from nfsrdma.conform.harness import OK, Harness, Reply, status_name
from nfsrdma.conform.rdma_checks_util import (
    compound_or_error,
    file_with,
    last_call,
    last_reply,
    rdma_session,
    write_list_total,
)
from nfsrdma.conform.rdma_raw import rdma_connection
from nfsrdma.conform.registry import Failed, Skipped, check
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.xdr.gen import nfs4

G = "rfc8267"
RDMA = ("rdma",)


def _sink(n: int) -> list[memoryview]:
    return [memoryview(bytearray(n))]


def _read_ok(r: Reply) -> nfs4.READ4resok:
    ok = r.resok(2)
    assert isinstance(ok, nfs4.READ4resok)
    return ok


@check(
    "UL-13.1",
    "READ result into the Write chunk",
    "RFC 8267 §6.1; RFC 8166 §3.4.6",
    group=G,
    transports=RDMA,
)
async def read_write_chunk(h: Harness) -> None:
    """A 16 KiB READ offered a 16 KiB Write chunk: the data arrives through the chunk (the
    reply's Write list reports 16384 bytes written) and matches what was written."""
    s = await rdma_session(h)
    data = os.urandom(16 << 10)
    fh, stateid = await file_with(h, s, data)
    r = await s.conn.compound([s.sequence(), ops.putfh(fh), ops.read(stateid, 0, len(data))],
                              sinks=_sink(len(data)))  # fmt: skip
    s.seqids[0] = s.next_seqid()
    ok = _read_ok(r)
    if bytes(ok.data) != data:
        raise Failed(f"the {len(data)} bytes written", f"{len(ok.data)} bytes, different")
    written = write_list_total(last_reply(s.conn))
    if written != len(data):
        raise Failed(f"a Write list reporting {len(data)} bytes", f"{written} bytes")


@check(
    "UL-14.1",
    "Short READ: the Write chunk reports what was written",
    "RFC 8267 §6.1; RFC 8166 §3.4.6",
    group=G,
    transports=RDMA,
)
async def short_read(h: Harness) -> None:
    """A READ of 8192 bytes of a 3000-byte file, offered an 8 KiB Write chunk: 3000 bytes
    with eof TRUE, and the returned Write list's segment lengths add up to 3000."""
    s = await rdma_session(h)
    data = os.urandom(3000)
    fh, stateid = await file_with(h, s, data)
    r = await s.conn.compound([s.sequence(), ops.putfh(fh), ops.read(stateid, 0, 8192)],
                              sinks=_sink(8192))  # fmt: skip
    s.seqids[0] = s.next_seqid()
    ok = _read_ok(r)
    if bytes(ok.data) != data or not ok.eof:
        raise Failed("3000 bytes and eof", f"{len(ok.data)} bytes, eof {ok.eof}")
    written = write_list_total(last_reply(s.conn))
    if written != len(data):
        raise Failed("a Write list reporting 3000 bytes", f"{written} bytes")


@check(
    "UL-14.2",
    "READ at EOF: the Write chunk comes back empty",
    "RFC 8267 §6.1; RFC 8166 §3.4.6",
    group=G,
    transports=RDMA,
)
async def read_eof_chunk(h: Harness) -> None:
    """A READ at the end of a file, offered a Write chunk: no data, eof TRUE, and the Write
    chunk comes back with nothing written (no segments, or segments of length 0)."""
    s = await rdma_session(h)
    fh, stateid = await file_with(h, s, b"x" * 100)
    r = await s.conn.compound([s.sequence(), ops.putfh(fh), ops.read(stateid, 100, 4096)],
                              sinks=_sink(4096))  # fmt: skip
    s.seqids[0] = s.next_seqid()
    ok = _read_ok(r)
    if len(ok.data) or not ok.eof:
        raise Failed("0 bytes and eof", f"{len(ok.data)} bytes, eof {ok.eof}")
    written = write_list_total(last_reply(s.conn))
    if written:
        raise Failed("an unused Write chunk", f"{written} bytes reported written")


@check(
    "UL-15.1",
    "WRITE data from a Read chunk",
    "RFC 8267 §6.1; RFC 8166 §3.4.5",
    group=G,
    transports=RDMA,
)
async def write_read_chunk(h: Harness) -> None:
    """A 16 KiB WRITE whose data goes in a Read chunk (the harness checks its own call's
    header): the server pulls it and READ returns the same bytes."""
    s = await rdma_session(h)
    fh, stateid = await file_with(h, s, b"")
    data = os.urandom(16 << 10)
    w = await s.ok([ops.putfh(fh), ops.write(stateid, 0, data, nfs4.FILE_SYNC4)])
    call = last_call(s.conn)
    if not [c for c in call.reads if c.position != 0]:
        raise Skipped("the WRITE data did not go in a Read chunk (inline threshold too large)")
    if w.resok(2).count != len(data):
        raise Failed(f"WRITE count {len(data)}", str(w.resok(2).count))
    got = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, len(data))])).resok(2)
    if bytes(got.data) != data:
        raise Failed("the data written by Read chunk", f"{len(got.data)} bytes, different")


_LINK = (b"/" + b"/".join(b"d%03d-" % i + b"x" * 30 for i in range(120)))[:4000]


async def _symlink(h: Harness) -> tuple[object, bytes]:
    s = await rdma_session(h)
    d = await h.scratch()
    text = _LINK
    r = await s.ok(
        [ops.putfh(d), ops.create(nfs4.NF4LNK, h.name("longlink"), {}, text), ops.getfh()]
    )
    return s, r.resok(3).object


@check(
    "UL-16.1",
    "SYMLINK text from a Read chunk",
    "RFC 8267 §6.1",
    group=G,
    transports=RDMA,
)
async def symlink_read_chunk(h: Harness) -> None:
    """CREATE of a symbolic link with 4000 bytes of link text, which goes in a Read chunk (the
    harness checks its own call): READLINK returns the text unchanged."""
    s, fh = await _symlink(h)
    from nfsrdma.conform.harness import Session

    assert isinstance(s, Session)
    if not any(c.position != 0 for c in last_call(s.conn).reads):
        raise Skipped("the link text did not go in a Read chunk (inline threshold too large)")
    got = (await s.ok([ops.putfh(fh), ops.readlink()], note="READLINK")).resok(2).link
    if bytes(got) != _LINK:
        raise Failed("the 4000-byte link text", f"{len(got)} bytes, different")


@check(
    "UL-16.2",
    "READLINK result into the Write chunk",
    "RFC 8267 §6.1",
    group=G,
    transports=RDMA,
)
async def readlink_write_chunk(h: Harness) -> None:
    """READLINK of a 4000-byte link offered a 4 KiB Write chunk: the text comes through the
    chunk (the Write list reports 4000 bytes) unchanged."""
    s, fh = await _symlink(h)
    from nfsrdma.conform.harness import Session

    assert isinstance(s, Session)
    r = await s.conn.compound([s.sequence(), ops.putfh(fh), ops.readlink()], sinks=_sink(4096))
    s.seqids[0] = s.next_seqid()
    got = r.resok(2).link
    if bytes(got) != _LINK:
        raise Failed("the 4000-byte link text", f"{len(got)} bytes, different")
    written = write_list_total(last_reply(s.conn))
    if written != 4000:
        raise Failed("a Write list reporting 4000 bytes", f"{written} bytes")


async def _big_directory(h: Harness, s: object, n: int = 60) -> bytes:
    """A directory of ``n`` entries with 100-byte names; its file handle."""
    from nfsrdma.conform.harness import Session

    assert isinstance(s, Session)
    d = await h.scratch()
    r = await s.ok([ops.putfh(d), ops.create(nfs4.NF4DIR, h.name("big"), {nfs4.FATTR4_MODE: 0o755}),
                    ops.getfh()])  # fmt: skip
    dfh = r.resok(3).object
    for i in range(0, n, 7):  # 1 + 14 operations: within the harness's ca_maxoperations
        batch = [ops.create(nfs4.NF4DIR, b"e%03d-" % j + b"n" * 95, {nfs4.FATTR4_MODE: 0o755})
                 for j in range(i, min(n, i + 7))]  # fmt: skip
        mixed = []
        for c in batch:
            mixed += [ops.putfh(dfh), c]
        await s.ok(mixed)
    return bytes(dfh)


def _names(r: Reply) -> set[bytes]:
    ok = r.resok(2)
    return {bytes(e.name) for e in ok.reply.entries}


@check(
    "UL-7.1",
    "Reply larger than the room offered: ERR_CHUNK or an RPC error",
    "RFC 8267 §3.1; RFC 8166 §3.5.4",
    group=G,
    transports=RDMA,
)
async def reply_without_room(h: Harness) -> None:
    """A READDIR whose reply (about 8 KB) cannot go inline, sent with no Reply chunk: the
    server answers RDMA_ERROR ERR_CHUNK, an RPC-level error, or a reply that fits inline
    (fewer entries); it never sends more than the inline threshold, hangs, or drops the
    connection."""
    s = await rdma_session(h)
    dfh = await _big_directory(h, s)
    limit = rdma_connection(s.conn).recv_limit
    got = await compound_or_error(
        s.conn,
        [s.sequence(), ops.putfh(dfh), ops.readdir(0, bytes(8), 32768, 32768, ())],
        reply_size=1024,
        note="READDIR without a Reply chunk",
    )
    s.seqids[0] = s.next_seqid()
    if isinstance(got, Reply):
        big = [len(d) for d in s.conn.received() if len(d) > limit]
        if big:
            raise Failed(f"Sends of at most {limit} bytes", f"a Send of {big[0]} bytes")
    elif got.header.error != hdr.ERR_CHUNK:
        raise Failed("RDMA_ERROR ERR_CHUNK", f"RDMA_ERROR {got.header.error}")


@check(
    "UL-7.2",
    "Write chunk too small: ERR_CHUNK or a READ that fits",
    "RFC 8267 §3.1; RFC 8166 §3.4.6",
    group=G,
    transports=RDMA,
)
async def write_chunk_too_small(h: Harness) -> None:
    """A READ of 8192 bytes of an 8 KiB file offered a 4 KiB Write chunk: the server answers
    RDMA_ERROR ERR_CHUNK, or returns at most 4096 bytes (the right ones) through the chunk;
    it never writes past the chunk, hangs, or drops the connection."""
    s = await rdma_session(h)
    data = os.urandom(8192)
    fh, stateid = await file_with(h, s, data)
    got = await compound_or_error(
        s.conn,
        [s.sequence(), ops.putfh(fh), ops.read(stateid, 0, 8192)],
        sinks=_sink(4096),
        note="READ 8192 with a 4096-byte Write chunk",
    )
    s.seqids[0] = s.next_seqid()
    if isinstance(got, Reply):
        if got.status != OK:
            return  # an NFS-level error is an answer too
        ok = _read_ok(got)
        if len(ok.data) > 4096 or bytes(ok.data) != data[: len(ok.data)]:
            raise Failed("at most 4096 of the file's bytes", f"{len(ok.data)} bytes")
    elif got.header.error != hdr.ERR_CHUNK:
        raise Failed("RDMA_ERROR ERR_CHUNK", f"RDMA_ERROR {got.header.error}")


@check(
    "TR-10.1",
    "Long reply through the Reply chunk",
    "RFC 8166 §3.5.4; RFC 8267 §6.2",
    group=G,
    transports=RDMA,
)
async def long_reply(h: Harness) -> None:
    """A READDIR of 60 entries with 100-byte names (about 8 KB of reply) offered a Reply
    chunk: every entry is listed, and no Send the server makes exceeds the inline threshold
    (the reply came as RDMA_NOMSG through the Reply chunk)."""
    s = await rdma_session(h)
    dfh = await _big_directory(h, s)
    limit = rdma_connection(s.conn).recv_limit
    r = await s.ok([ops.putfh(dfh), ops.readdir(0, bytes(8), 32768, 32768, ())])
    names = _names(r)
    if len(names) != 60 or not r.resok(2).reply.eof:
        raise Failed("60 entries and eof", f"{len(names)} entries, eof {r.resok(2).reply.eof}")
    big = [len(d) for d in s.conn.received() if len(d) > limit]
    if big:
        raise Failed(f"Sends of at most {limit} bytes", f"a Send of {big[0]} bytes")
    if last_reply(s.conn).proc != hdr.RDMA_NOMSG:
        raise Failed("RDMA_NOMSG (the reply in the Reply chunk)", "RDMA_MSG")


def _acl(n: int) -> bytes:
    """An fattr4_acl of ``n`` ACEs (EVERYONE@ allowed to read), XDR-encoded."""
    from nfsrdma.xdr.runtime import Writer

    w = Writer()
    aces = [nfs4.nfsace4(nfs4.ACE4_ACCESS_ALLOWED_ACE_TYPE, 0, nfs4.ACE4_READ_DATA,
                         b"EVERYONE@") for _ in range(n)]  # fmt: skip
    nfs4.enc_fattr4_acl(w, aces)
    return bytes(w)


@check(
    "TR-9.1",
    "Long call through a position-zero Read chunk",
    "RFC 8166 §3.5.3; RFC 8267 §6.4",
    group=G,
    transports=RDMA,
)
async def long_call(h: Harness) -> None:
    """A COMPOUND of about 8 KB (SEQUENCE, PUTROOTFH, VERIFY of a 280-entry ACL) goes as
    RDMA_NOMSG with the whole call in a position-zero Read chunk (the harness checks its own
    header): the server pulls it and answers (SEQUENCE and PUTROOTFH succeed; VERIFY's own
    answer does not matter)."""
    from nfsrdma.client.attrs import encode_bitmap
    from nfsrdma.conform.harness import op

    s = await rdma_session(h)
    attrs = nfs4.fattr4(encode_bitmap([nfs4.FATTR4_ACL]), _acl(280))
    r = await s.call([ops.putrootfh(), op(nfs4.OP_VERIFY, nfs4.VERIFY4args(attrs))])
    call = last_call(s.conn)
    if call.proc != hdr.RDMA_NOMSG or not any(c.position == 0 for c in call.reads):
        raise Skipped("the call went inline (inline threshold too large)")
    if r.statuses[:2] != [OK, OK]:
        raise Failed("SEQUENCE and PUTROOTFH NFS4_OK", str([status_name(x) for x in r.statuses]))
