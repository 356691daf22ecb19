"""What the RPC-over-RDMA checks share: the transport headers a connection received (from the
harness's wire record), calls whose RDMA_ERROR answer is a result rather than a failure, and a
file of known contents to read."""

from __future__ import annotations

import os
from typing import Any

from nfsrdma.client import ops
from nfsrdma.conform.harness import Conn, Harness, Op, Reply, Session
from nfsrdma.conform.rdma_raw import rdma_connection
from nfsrdma.conform.registry import Failed
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.transport.rdma.header import Header, HeaderError
from nfsrdma.transport.rdma.requester import RdmaErrorReply
from nfsrdma.xdr.gen import nfs4

BOTH = nfs4.OPEN4_SHARE_ACCESS_BOTH


def headers(conn: Conn, outbound: bool = False) -> list[Header]:
    """The transport headers of the messages ``conn`` received (or sent), in order; messages
    whose header does not parse are left out."""
    out = []
    for r in conn.h.wire:
        if r.conn != conn.number or r.outbound != outbound:
            continue
        try:
            out.append(hdr.parse(r.data))
        except HeaderError:
            continue
    return out


def last_reply(conn: Conn) -> Header:
    got = [x for x in headers(conn) if x.proc in (hdr.RDMA_MSG, hdr.RDMA_NOMSG, hdr.RDMA_ERROR)]
    if not got:
        raise Failed("a reply's transport header", "none received")
    return got[-1]


def last_call(conn: Conn) -> Header:
    sent = headers(conn, outbound=True)
    if not sent:
        raise Failed("a call's transport header", "none sent")
    return sent[-1]


async def compound_or_error(
    conn: Conn,
    ops_: list[Op],
    *,
    sinks: list[memoryview] | None = None,
    reply_size: int | None = None,
    note: str = "",
) -> Reply | RdmaErrorReply:
    """A COMPOUND; an RDMA_ERROR answer is returned instead of failing the check."""
    rdma_connection(conn)
    try:
        return await conn.compound(ops_, sinks=sinks, reply_size=reply_size, note=note)
    except Failed:
        err = conn.h.log[-1].transport_error
        if isinstance(err, RdmaErrorReply):
            return err
        raise


async def rdma_session(h: Harness, conn: Conn | None = None, **kw: Any) -> Session:
    """A session on an RPC-over-RDMA connection (Skipped over TCP)."""
    conn = conn or await h.connect()
    rdma_connection(conn)
    return await h.session(conn, **kw)


async def file_with(h: Harness, s: Session, data: bytes) -> tuple[bytes, nfs4.stateid4]:
    """A new file holding ``data`` (written by a session on its own TCP-or-whatever
    connection), left open: (fh, open stateid)."""
    d = await h.scratch()
    so = nfs4.state_owner4(s.client.clientid, b"conform-rdma-" + os.urandom(4).hex().encode())
    r = await s.ok([ops.putfh(d), ops.open_(so, BOTH, h.name("data"), create=nfs4.UNCHECKED4),
                    ops.getfh()])  # fmt: skip
    fh, stateid = r.resok(3).object, r.resok(2).stateid
    if data:
        await s.ok([ops.putfh(fh), ops.write(stateid, 0, data, nfs4.FILE_SYNC4)])
    return fh, stateid


def write_list_total(h: Header) -> int:
    """Bytes the responder says it wrote into the first Write chunk (0 when none)."""
    return sum(seg.length for seg in h.writes[0]) if h.writes else 0
