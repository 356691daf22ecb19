"""Sending a hand-made RPC-over-RDMA transport header on a requester's connection and seeing
what the responder answers: the RDMA_ERROR it draws (with its header: error code, rdma_vers
and, for ERR_VERS, the version range), or a normal reply, or nothing.

It uses the requester's public raw-send hook (``Requester.send_raw``): the XID is outstanding,
holding no credit, and an RDMA_ERROR answer fails it with ``RdmaErrorReply``, which carries
the reply's header."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

from nfsrdma.conform.harness import Conn
from nfsrdma.conform.registry import Failed, Skipped
from nfsrdma.transport.base import TransportCallError
from nfsrdma.transport.rdma.requester import RdmaErrorReply, Requester

RDMA_MSG, RDMA_NOMSG, RDMA_MSGP, RDMA_DONE, RDMA_ERROR = 0, 1, 2, 3, 4
ERR_VERS, ERR_CHUNK = 1, 2


def words(*ws: int) -> bytes:
    return b"".join(struct.pack(">I", w & 0xFFFFFFFF) for w in ws)


@dataclass(slots=True)
class Verdict:
    error: int | None  # ERR_VERS / ERR_CHUNK, or None when a normal reply came back
    vers_range: tuple[int, int] | None
    credit: int | None
    detail: str
    vers: int | None = None  # the RDMA_ERROR's rdma_vers

    def describe(self) -> str:
        if self.error == ERR_VERS:
            return f"RDMA_ERROR ERR_VERS {self.vers_range}"
        if self.error == ERR_CHUNK:
            return "RDMA_ERROR ERR_CHUNK"
        return self.detail


def rdma_connection(conn: Conn) -> Requester:
    c = conn.rpc.conn
    if conn.h.transport != "rdma" or not isinstance(c, Requester):
        raise Skipped("an RPC-over-RDMA check (use an rdma:// URL)")
    return c


async def send_header(conn: Conn, build: Any, timeout: float = 10.0) -> Verdict:
    """``build(xid) -> bytes`` makes the message; it is sent raw and the answer classified."""
    rdma = rdma_connection(conn)
    xid = conn.rpc.next_xid()
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    conn.rpc.pending[xid] = fut
    try:
        rdma.send_raw(xid, build(xid))
        try:
            await asyncio.wait_for(fut, timeout)
        except RdmaErrorReply as e:
            h = e.header
            return Verdict(h.error, h.vers_range, h.credit, str(e), h.vers)
        except TransportCallError as e:
            if _answered(conn, xid):
                # A normal reply our requester would not take for a call it did not build
                # (e.g. the Write chunks it offered, returned unused): the responder answered.
                return Verdict(None, None, None, "a normal reply")
            return Verdict(None, None, None, f"the call failed: {e}")
        except TimeoutError:
            raise Failed("an RDMA_ERROR reply", f"nothing in {timeout} s") from None
        except ConnectionError as e:
            raise Failed("an RDMA_ERROR reply", f"the connection was lost ({e})") from None
        return Verdict(None, None, None, "a normal reply")
    finally:
        conn.rpc.pending.pop(xid, None)
        rdma.call_done(xid)


def _answered(conn: Conn, xid: int) -> bool:
    """Whether ``conn`` received an RDMA_MSG or RDMA_NOMSG reply with ``xid``."""
    for r in conn.h.wire:
        if r.conn != conn.number or r.outbound or len(r.data) < 16:
            continue
        rxid, _, _, proc = struct.unpack_from(">IIII", r.data)
        if rxid == xid and proc in (RDMA_MSG, RDMA_NOMSG):
            return True
    return False
