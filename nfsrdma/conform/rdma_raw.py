"""Sending a hand-made RPC-over-RDMA transport header on a requester's connection and seeing
what the responder answers: the RDMA_ERROR it draws (with its error code and, for ERR_VERS,
the version range), or a normal reply, or nothing.

This reaches into the requester (``nfsrdma.transport.rdma``): it registers the XID as an
outstanding call that holds no credit, posts the message as it is, and watches the headers of
RDMA_ERROR replies."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

from nfsrdma.conform.harness import Conn
from nfsrdma.conform.registry import Failed, Skipped
from nfsrdma.transport.base import TransportCallError

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

    def describe(self) -> str:
        if self.error == ERR_VERS:
            return f"RDMA_ERROR ERR_VERS {self.vers_range}"
        if self.error == ERR_CHUNK:
            return "RDMA_ERROR ERR_CHUNK"
        return self.detail


def rdma_connection(conn: Conn) -> Any:
    c = conn.rpc.conn
    if conn.h.transport != "rdma" or not hasattr(c, "_on_reply_error"):
        raise Skipped("an RPC-over-RDMA check (use an rdma:// URL)")
    return c


async def send_header(conn: Conn, build: Any, timeout: float = 10.0) -> Verdict:
    """``build(xid) -> bytes`` makes the message; it is sent raw and the answer classified."""
    from nfsrdma.transport.rdma.calls import OutCall

    rdma = rdma_connection(conn)
    xid = conn.rpc.next_xid()
    seen: list[Any] = []
    original = rdma._on_reply_error

    def spy(h: Any) -> None:
        if h.xid == xid:
            seen.append(h)
        original(h)

    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    conn.rpc.pending[xid] = fut
    rdma._out[xid] = OutCall(xid, counted=False)
    rdma._on_reply_error = spy
    try:
        rdma._send([build(xid)])
        try:
            await asyncio.wait_for(fut, timeout)
        except TransportCallError as e:
            if not seen:
                return Verdict(None, None, None, f"the call failed: {e}")
            h = seen[0]
            return Verdict(h.error, h.vers_range, h.credit, str(e))
        except TimeoutError:
            raise Failed("an RDMA_ERROR reply", f"nothing in {timeout} s") from None
        except ConnectionError as e:
            raise Failed("an RDMA_ERROR reply", f"the connection was lost ({e})") from None
        return Verdict(None, None, None, "a normal reply")
    finally:
        rdma._on_reply_error = original
        conn.rpc.pending.pop(xid, None)
        rdma._out.pop(xid, None)
