"""RFC 8797 (RDMA-CM private data for RPC-over-RDMA version 1) and the inline thresholds it
sets, RFC 8166's credits and keepalive, RFC 8167's back channel. RPC-over-RDMA only."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

from nfsrdma.client import ops
from nfsrdma.client.attrs import encode_bitmap
from nfsrdma.conform.checks_rfc8166 import null_call
from nfsrdma.conform.checks_rfc8267 import _acl, _big_directory
from nfsrdma.conform.harness import OK, Harness, op, status_name
from nfsrdma.conform.rdma_checks_util import file_with, headers, last_call, rdma_session
from nfsrdma.conform.rdma_raw import RDMA_MSG, rdma_connection, send_header, words
from nfsrdma.conform.registry import Failed, Skipped, Unsupported, check
from nfsrdma.rpc.errors import RpcError
from nfsrdma.rpc.server import Dispatcher, RpcCall
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma.connection_base import RdmaOptions
from nfsrdma.transport.rdma.privdata import FORMAT_IDENTIFIER
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

G = "rfc8797"
RDMA = ("rdma",)


def _options(**kw: Any) -> RdmaOptions:
    kw.setdefault("rtrext", False)
    return RdmaOptions(**kw)


@check(
    "PD-2.1",
    "The server's private data: a well-formed version 1 block",
    "RFC 8797 §4, §5",
    group=G,
    transports=RDMA,
)
async def server_block(h: Harness) -> None:
    """The private data in the server's accept holds the RFC 8797 block (format identifier
    0xf6ab0e18) with version 1, the seven reserved bits of octet 5 zero, and within the
    buffer. A server that sends no block does not implement RFC 8797 (UNSUPPORTED)."""
    conn = await h.connect()
    raw = rdma_connection(conn).peer_private_data
    at = raw.find(struct.pack(">I", FORMAT_IDENTIFIER))
    if at < 0:
        raise Unsupported("the server sent no RFC 8797 private data")
    if at + 8 > len(raw):
        raise Failed("the 8-octet block inside the private data", f"it overruns at {at}")
    version, flags = raw[at + 4], raw[at + 5]
    if version != 1 or flags & 0xFE:
        raise Failed("version 1, reserved bits zero", f"version {version}, octet 5 {flags:#04x}")


async def _long_traffic(h: Harness, options: RdmaOptions | None = None) -> tuple[Any, int]:
    """A session (on a connection provisioned by ``options``) that reads a 32 KiB file and a
    60-entry directory; the connection and its s->c inline threshold."""
    conn = await h.connect(options)
    s = await rdma_session(h, conn)
    fh, stateid = await file_with(h, s, os.urandom(32 << 10))
    await s.ok([ops.putfh(fh), ops.read(stateid, 0, 32 << 10)])
    dfh = await _big_directory(h, s)
    r = await s.ok([ops.putfh(dfh), ops.readdir(0, bytes(8), 32768, 32768, ())])
    if len(r.resok(2).reply.entries) != 60:
        raise Failed("60 directory entries", str(len(r.resok(2).reply.entries)))
    # A reply of about 3 KB: over a 1024-byte threshold, under the usual 4096-byte one.
    r = await s.ok([ops.putfh(dfh), ops.readdir(0, bytes(8), 3000, 3000, ())])
    if not r.resok(2).reply.entries:
        raise Failed("some directory entries in 3000 bytes", "none")
    return conn, rdma_connection(conn).recv_limit


def _within(conn: Any, limit: int) -> None:
    big = [len(d) for d in conn.received() if len(d) > limit]
    if big:
        raise Failed(f"no Send longer than the {limit}-byte threshold", f"a {big[0]}-byte Send")


@check(
    "PD-7.1",
    "The server's Sends stay within the s->c threshold",
    "RFC 8797 §4.2, §3.1",
    group=G,
    transports=RDMA,
)
async def sends_within_threshold(h: Harness) -> None:
    """While the server answers a 32 KiB READ and READDIRs of about 8 and 3 KB, none of its Sends
    is longer than the server-to-client threshold (the smaller of its Send Size and our
    Receive Size); larger replies go by Write and Reply chunks."""
    conn, limit = await _long_traffic(h)
    _within(conn, limit)


@check(
    "PD-9.1",
    "A 1024-byte Receive Size is respected",
    "RFC 8797 §4.2; RFC 8166 §3.3.3",
    group=G,
    transports=RDMA,
)
async def small_receive_size(h: Harness) -> None:
    """A client that advertises 1024-byte Send and Receive Sizes (the minimum) gets no Send
    longer than 1024 bytes while the server answers a 32 KiB READ and READDIRs of about 8
    and 3 KB."""
    conn, limit = await _long_traffic(h, _options(inline_size=1024))
    if limit != 1024:
        raise Failed("an s->c threshold of 1024", str(limit))
    _within(conn, 1024)


@check(
    "PD-7.2",
    "A call as large as the c->s threshold is received",
    "RFC 8797 §4, §4.2 (Receive Size)",
    group=G,
    transports=RDMA,
)
async def full_size_call(h: Harness) -> None:
    """With 16 KiB buffers on our side, a call sent inline at exactly the client-to-server
    threshold (the server's advertised Receive Size, at most 16 KiB) is received and answered:
    the server's receive buffers hold what it advertised."""
    conn = await h.connect(_options(inline_size=16 << 10))
    s = await rdma_session(h, conn)
    limit = rdma_connection(conn).send_limit

    async def send(n: int, tag: int) -> tuple[Any, int]:
        attrs = nfs4.fattr4(encode_bitmap([nfs4.FATTR4_ACL]), _acl(n))
        verify = op(nfs4.OP_VERIFY, nfs4.VERIFY4args(attrs))
        r = await conn.compound([s.sequence(), ops.putrootfh(), verify], tag=b"t" * tag,
                                reply_size=2048, note=f"VERIFY of {n} ACEs, tag {tag}")  # fmt: skip
        s.seqids[0] = s.next_seqid()
        return r, len([x for x in h.wire if x.conn == conn.number and x.outbound][-1].data)

    _, base = await send(0, 0)
    n, tag = divmod(limit - base, 28)  # an ACE is 28 bytes, the tag grows by words
    if n < 0:
        raise Skipped(f"a {base}-byte call is over the {limit}-byte threshold already")
    r, size = await send(n, tag)
    if size != limit or last_call(conn).proc != hdr.RDMA_MSG:
        raise Skipped(f"could not build an inline call of exactly {limit} bytes ({size})")
    if r.statuses[:2] != [OK, OK]:
        raise Failed("SEQUENCE and PUTROOTFH NFS4_OK", str([status_name(x) for x in r.statuses]))


@check(
    "PD-15.1",
    "No Send with Invalidate when the client's R bit is clear",
    "RFC 8797 §4.1, §3.2",
    group=G,
    transports=RDMA,
)
async def no_remote_invalidation(h: Harness) -> None:
    """Our private data has R clear: no reply to a READ into a Write chunk, or to anything
    else, invalidates one of our STags remotely."""
    conn = await h.connect()
    s = await rdma_session(h, conn)
    data = os.urandom(16 << 10)
    fh, stateid = await file_with(h, s, data)
    await conn.compound([s.sequence(), ops.putfh(fh), ops.read(stateid, 0, len(data))],
                        sinks=[memoryview(bytearray(len(data)))])  # fmt: skip
    s.seqids[0] = s.next_seqid()
    n = rdma_connection(conn).stats["remote_invalidations"]
    if n:
        raise Failed("no remote invalidation", f"{n} Sends with Invalidate")


# -- credits (RFC 8166 §3.3.1) ----------------------------------------------------------------
@check(
    "TR-14.1",
    "Calls up to the credit grant are all answered",
    "RFC 8166 §3.3.1",
    group="rfc8166",
    transports=RDMA,
)
async def credits_used(h: Harness) -> None:
    """The grant in the reply to a NULL call is at least 1; as many NULL calls as granted (up
    to 16), sent at once, are all answered, and every reply grants at least 1 credit."""
    conn = await h.connect()
    try:
        await conn.null()
        grants = [x.credit for x in headers(conn) if x.proc in (hdr.RDMA_MSG, hdr.RDMA_NOMSG)]
        if not grants or grants[-1] < 1:
            raise Failed("a grant of at least 1", str(grants[-1:]))
        n = min(grants[-1], 16)
        await asyncio.wait_for(asyncio.gather(*(conn.null() for _ in range(n))), h.timeout)
    except (RpcError, ConnectionError, TimeoutError) as e:
        raise Failed("replies to NULL", f"{type(e).__name__}: {e}") from None
    grants = [x.credit for x in headers(conn) if x.proc in (hdr.RDMA_MSG, hdr.RDMA_NOMSG)]
    if len(grants) != n + 1 or min(grants) < 1:
        raise Failed(f"{n + 1} replies granting at least 1", f"grants {grants}")


@check(
    "TR-14.2",
    "A call asking for 0 credits is answered",
    "RFC 8166 §3.3.1, §4.2.1",
    group="rfc8166",
    transports=RDMA,
)
async def zero_credit_request(h: Harness) -> None:
    """A NULL call whose rdma_credit asks for 0 credits is answered normally, with a grant of
    at least 1 (a requester always holds at least one credit)."""
    conn = await h.connect()
    v = await send_header(
        conn, lambda xid: words(xid, 1, 0, RDMA_MSG, 0, 0, 0) + null_call(xid), h.timeout
    )
    if v.error is not None or v.detail != "a normal reply":
        raise Failed("a normal reply to NULL", v.describe())
    grant = [x.credit for x in headers(conn) if x.proc == hdr.RDMA_MSG][-1:]
    if not grant or grant[0] < 1:
        raise Failed("a grant of at least 1", str(grant))


@check(
    "TR-14.3",
    "A one-credit requester: calls in turn",
    "RFC 8166 §3.3.1",
    group="rfc8166",
    transports=RDMA,
)
async def one_credit(h: Harness) -> None:
    """A requester that asks for one credit (and so has one call outstanding at a time) gets
    a session set up and four COMPOUNDs answered, each reply granting at least 1."""
    conn = await h.connect(_options(max_requests=1, probe_reserve=False))
    s = await rdma_session(h, conn)
    await asyncio.gather(*(s.ok([ops.putrootfh()], slot=i) for i in range(4)))
    asked = {x.credit for x in headers(conn, outbound=True)}
    grants = [x.credit for x in headers(conn)]
    if asked != {1}:
        raise Skipped(f"the requester asked for {sorted(asked)} credits")
    if min(grants) < 1:
        raise Failed("grants of at least 1", str(grants))


@check(
    "TR-19.1",
    "NULL keepalive probe answered while calls are outstanding",
    "RFC 8267 §6.7.2; RFC 8166 §3.3.1",
    group="rfc8166",
    transports=RDMA,
)
async def keepalive(h: Harness) -> None:
    """A NULL call sent as a keepalive probe, together with as many COMPOUNDs as the grant
    allows, is answered (the responder answers NULL without an upper-layer session)."""
    s = await rdma_session(h)
    calls = [s.ok([ops.putrootfh()], slot=i) for i in range(min(4, s.slots))]
    probe = s.conn.rpc.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, timeout=h.timeout, probe=True)
    results = await asyncio.gather(*calls, probe, return_exceptions=True)
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise Failed("every call and the probe answered", f"{type(bad[0]).__name__}: {bad[0]}")


# -- the back channel (RFC 8167) --------------------------------------------------------------
class _Callbacks:
    """Answers the server's CB_NULL calls on a connection and records them."""

    def __init__(self, program: int) -> None:
        self.calls: list[RpcCall] = []
        self.arrived = asyncio.Event()
        self.dispatcher = Dispatcher()
        self.dispatcher.add(program, 1, {0: self._null})

    def _null(self, call: RpcCall, w: Writer) -> None:
        self.calls.append(call)
        self.arrived.set()


@check(
    "CB-1",
    "Back channel over RDMA: the server's CB_NULL arrives inline",
    "RFC 8167 §4, §5; RFC 8267 §6.5.2; RFC 8881 §18.36.3",
    group="rfc8167",
    transports=RDMA,
)
async def backchannel_cb_null(h: Harness) -> None:
    """A session created with CREATE_SESSION4_FLAG_CONN_BACK_CHAN on an RPC-over-RDMA
    connection: the server's back-channel probe (CB_NULL of the session's callback program)
    arrives on that connection as an RDMA_MSG call with empty chunk lists (backward calls are
    Short messages), no larger than our inline threshold, and our reply is accepted. A server
    that never calls back within 10 s is UNSUPPORTED."""
    conn = await h.connect()
    rdma = rdma_connection(conn)
    program = 0x40000000 | int.from_bytes(os.urandom(2), "big")
    cb = _Callbacks(program)
    conn.rpc.dispatcher = cb.dispatcher
    s = await h.session(conn, backchannel=True, cb_program=program)
    if not s.flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN:
        raise Unsupported("the server did not take the connection as a back channel")
    try:
        await asyncio.wait_for(cb.arrived.wait(), 10)
    except TimeoutError:
        raise Unsupported("no callback in 10 s") from None
    inbound_calls = [
        r.data for r in h.wire if r.conn == conn.number and not r.outbound and _is_call(r.data)
    ]
    if not inbound_calls:
        raise Failed("the CB_NULL's RPC-over-RDMA message", "none seen")
    first = hdr.parse(inbound_calls[0])
    if first.proc != hdr.RDMA_MSG or first.reads or first.writes or first.reply is not None:
        raise Failed("RDMA_MSG with empty chunk lists", f"proc {first.proc}, chunks")
    if len(inbound_calls[0]) > rdma.recv_limit:
        raise Failed(f"at most {rdma.recv_limit} bytes", f"{len(inbound_calls[0])} bytes")
    await s.ok([])  # the fore channel still works after the callback


def _is_call(data: bytes) -> bool:
    """An RPC-over-RDMA RDMA_MSG message whose RPC message is a CALL."""
    if len(data) < 36:
        return False
    proc = struct.unpack_from(">I", data, 12)[0]
    if proc != hdr.RDMA_MSG:
        return False
    try:
        size = hdr.parse(data).size
    except hdr.HeaderError:
        return False
    return len(data) >= size + 8 and struct.unpack_from(">I", data, size + 4)[0] == 0
