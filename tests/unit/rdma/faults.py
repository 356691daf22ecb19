"""Malformed RPC-over-RDMA messages a responder must answer with RDMA_ERROR (TR-3, TR-4,
TR-17, SEC-8), and how to send one raw on a requester's connection and see the verdict.
Shared by the in-process tests and the test-bed tests against our server on rxe."""

from __future__ import annotations

import asyncio
import struct

import pytest

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.transport.base import TransportCallError
from nfsrdma.transport.rdma.calls import OutCall
from nfsrdma.transport.rdma.endpoint import RdmaConnection

XID = 0x77


def words(*ws: int) -> bytes:
    return b"".join(struct.pack(">I", w) for w in ws)


def _seg(handle: int, length: int = 8) -> tuple[int, ...]:
    return (handle, length, 0, 0x1000)


# (message, RDMA_ERROR expected, why)
BAD_HEADERS = [
    (words(XID, 2, 1, 0, 0, 0, 0) + words(XID, 0, 2), "ERR_VERS", "version 2 (TR-3)"),
    (words(XID, 1, 1, 2, 0, 0, 0, 0, 0), "ERR_CHUNK", "RDMA_MSGP (TR-4)"),
    (words(XID, 1, 1, 3), "ERR_CHUNK", "RDMA_DONE (TR-4)"),
    (words(XID, 1, 1), "ERR_CHUNK", "truncated header (TR-17)"),
    (words(XID, 1, 1, 0, 5), "ERR_CHUNK", "a list link that is not a bool"),
    (
        words(XID, 1, 1, 0, 0, 1, 17) + words(*_seg(1)) * 17 + words(0, 0),
        "ERR_CHUNK",
        "17 segments in a chunk (UL-18)",
    ),
    (
        words(XID, 1, 1, 0, 0, 1, 1, *_seg(1), 1, 1, *_seg(2), 0, 0),
        "ERR_CHUNK",
        "two Write chunks, limit one",
    ),
    (words(XID, 1, 1, 0, 1, 6, *_seg(1), 0, 0, 0), "ERR_CHUNK", "position not a multiple of 4"),
    (words(XID, 1, 1, 0, 1, 4000, *_seg(1), 0, 0, 0), "ERR_CHUNK", "position beyond the message"),
    (
        words(XID, 1, 1, 0, 0, 1, 1, *_seg(1, 1 << 30), 0, 0),
        "ERR_CHUNK",
        "segment length over the limit (SEC-8)",
    ),
    (words(XID, 1, 1, 1, 0, 0, 0), "ERR_CHUNK", "RDMA_NOMSG without any chunk"),
]


async def expect_rdma_error(rpc: RpcConnection, conn: RdmaConnection, message: bytes) -> str:
    """Send ``message`` (which claims XID) raw and return the RDMA_ERROR it draws."""
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    rpc.pending[XID] = fut  # type: ignore[assignment]
    conn._out[XID] = OutCall(XID, counted=False)
    conn._send([message])
    with pytest.raises(TransportCallError) as e:
        await asyncio.wait_for(fut, 30)
    return str(e.value)
