"""The responder's path for calls without Read chunks against its general path (issue 12).

``Responder._on_short_call`` takes nearly every call (no chunk to pull); ``_on_any_call`` takes
any call and is the reference: for the same header and message, both must deliver the same
call, send the same bytes (RDMA_ERROR / ERR_CHUNK for a header the limits refuse, TR-17) and
count the same statistics."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.transport.base import Inbound
from nfsrdma.transport.rdma import header as H
from nfsrdma.transport.rdma.calls import CallContext
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions
from nfsrdma.transport.rdma.header import ChunkLimits, Segment
from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.transport.rdma.provider import QueuePairConfig, Sge
from tests.unit.rdma.helpers import SEGMENTS


class _Qp:
    """Just enough of a queue pair: the bytes of every Send posted."""

    def __init__(self, conn: RdmaConnection, config: QueuePairConfig) -> None:
        self.conn = conn
        self.config = config
        self.initiator_depth = 16
        self.sent: list[bytes] = []

    def post_recv(self, wr_id: int, sge: Sge) -> None:
        pass

    def post_send(self, wr_id: int, sges: list[Sge], **kw: Any) -> None:
        (sge,) = sges
        buf = self.conn.send_pool.by_addr(sge.addr)
        start = sge.addr - buf.addr
        self.sent.append(bytes(buf.view[start : start + sge.length]))

    def disconnect(self) -> None:
        pass

    def close(self) -> None:
        pass


def _server(limits: ChunkLimits) -> tuple[RdmaConnection, _Qp, list[Inbound]]:
    fabric = InprocFabric()
    client = RdmaConnection(fabric.device("10.0.0.2"), RdmaOptions(), server=False)
    # No data pool: these calls pull nothing and lend nothing.
    options = RdmaOptions(limits=limits, data_buffers=0)
    conn = RdmaConnection(fabric.device("10.0.0.1"), options, server=True, peer="t")
    qp = _Qp(conn, conn.qp_config())
    conn.attach(qp)  # type: ignore[arg-type]
    conn.negotiated(client.private_data(accept=False))
    conn.established()
    got: list[Inbound] = []
    conn.set_receiver(lambda c, inbound: got.append(inbound))
    return conn, qp, got


def _outcome(path: str, h: H.Header, message: bytes, limits: ChunkLimits) -> object:
    conn, qp, got = _server(limits)
    conn._inbound_calls = 1  # as ``_on_call`` counts the call before either path
    if path == "short":
        conn._on_short_call(h, memoryview(message))
    else:
        conn._on_any_call(h, memoryview(message))
    delivered = []
    for inbound in got:
        ctx = inbound.context
        assert isinstance(ctx, CallContext)
        r = inbound.reader
        delivered.append((bytes(r.buf), r.chunks, r.ordered, ctx.header, ctx.scratch, ctx.lent))
    counted = {k: v for k, v in conn.stats.items() if v}  # what was counted, zeros aside
    return delivered, qp.sent, counted, conn._inbound_calls, conn.closed


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(SEGMENTS, max_size=3),
    reply=st.none() | SEGMENTS,
    proc=st.sampled_from([H.RDMA_MSG, H.RDMA_NOMSG]),
    message=st.binary(min_size=8, max_size=200),
    limits=st.builds(
        ChunkLimits,
        max_segments=st.integers(0, 4),
        max_write_chunks=st.integers(0, 3),
        max_segment_length=st.sampled_from([0, 100, 4096, 1 << 24]),
        max_chunk_bytes=st.sampled_from([0, 100, 8192, 4 << 20]),
    ),
)
def test_short_call_path_matches_the_general_path(
    writes: list[list[Segment]],
    reply: list[Segment] | None,
    proc: int,
    message: bytes,
    limits: ChunkLimits,
) -> None:
    h = H.Header(7, H.VERSION, 32, proc, writes=writes, reply=reply, size=28)
    short = _outcome("short", h, message, limits)
    assert short == _outcome("any", h, message, limits)


def test_a_refused_call_without_read_chunks_is_answered_err_chunk() -> None:
    """Two Write chunks where one is allowed: RDMA_ERROR / ERR_CHUNK with the call's XID, the
    call not delivered, and the next call served (TR-17)."""
    conn, qp, got = _server(ChunkLimits())
    segs = [Segment(1, 4096, 0)]
    conn._on_call(H.Header(9, H.VERSION, 32, H.RDMA_MSG, writes=[segs, segs]), memoryview(b"x" * 8))
    assert got == [] and qp.sent == [H.encode_error(9, conn.policy.grant, H.ERR_CHUNK)]
    conn._on_call(H.Header(10, H.VERSION, 32, H.RDMA_MSG, writes=[segs]), memoryview(b"y" * 8))
    assert len(got) == 1 and bytes(got[0].reader.buf) == b"y" * 8 and not conn.closed
    assert conn._inbound_calls == 1
