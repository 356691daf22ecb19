"""Our requester's calls of one loop turn in one post (``RdmaOptions.batch_calls``,
``NFSRDMA_CALL_BATCH``): on the in-process provider, which counts doorbells (post calls),
N calls started in one turn leave with one doorbell, in submission order, with their chunks
(Read and Write) as when posted alone; a call made alone goes out at the end of its turn; a
connection that breaks before the held posts are rung fails every one of their calls."""

from __future__ import annotations

import asyncio
import struct
from collections import Counter

import pytest

from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions
from nfsrdma.transport.rdma.inproc import call_read
from nfsrdma.transport.rdma.inproc_qp import InprocConnection
from tests.unit.rdma.test_rpc_rdma import P_READ, PROG, VERS, Rig, call_write, rig

BATCH = RdmaOptions(batch_calls=True)
N = 12


def _client(r: Rig) -> tuple[RdmaConnection, InprocConnection]:
    conn = r.client
    assert conn is not None and isinstance(conn.qp, InprocConnection)
    return conn, conn.qp


async def _mixed(r: Rig, i: int) -> None:
    """A NULL, a READ (a Write chunk back) or a WRITE (a Read chunk the server pulls)."""
    assert r.rpc is not None
    if i % 3 == 0:
        await r.rpc.call(PROG, VERS, 0, lambda w: None)
    elif i % 3 == 1:
        size = 6000 + i
        out, _ = await call_read(r.rpc, PROG, VERS, P_READ, size)
        assert bytes(out.data) == bytes(j % 251 for j in range(size))
    else:
        data = bytes([i]) * (5000 + i)
        n, _ = await call_write(r, data)
        assert n == len(data)


def _xids(log: list[bytes]) -> list[int]:
    return [struct.unpack_from(">I", m)[0] for m in log]


async def _one_turn(options: RdmaOptions) -> tuple[int, list[int], list[int]]:
    """Doorbells of the client's queue pair for ``N`` calls started in one turn; the xids in
    the order the client posted them and the order the server received them."""
    async with rig(client_opts=options) as r:
        await _mixed(r, 0)  # the connection is up and has answered once
        conn, qp = _client(r)
        sent: list[bytes] = []
        received: list[bytes] = []
        conn.tap = lambda out, data: sent.append(data) if out else None
        r.server[0].tap = lambda out, data: None if out else received.append(data)
        before = Counter(qp.counts)
        await asyncio.gather(*(_mixed(r, i) for i in range(N)))
        assert conn.stats["sends"] >= N + 1
        return qp.counts["doorbells"] - before["doorbells"], _xids(sent), _xids(received)


@pytest.mark.parametrize("batch", [False, True])
async def test_the_calls_of_one_turn_leave_in_one_post_in_order(batch: bool) -> None:
    doorbells, sent, received = await _one_turn(RdmaOptions(batch_calls=batch))
    assert doorbells == (1 if batch else N)
    assert len(sent) == N and received == sent  # submission order, on the wire too


async def test_a_call_alone_is_not_delayed_beyond_its_turn() -> None:
    async with rig(client_opts=BATCH) as r:
        await _mixed(r, 0)
        conn, qp = _client(r)
        before = qp.counts["doorbells"]
        task = asyncio.create_task(_mixed(r, 3))
        await asyncio.sleep(0)  # the task runs: its call is posted, held for this turn
        assert conn.stats["sends"] and qp.counts["doorbells"] == before
        await asyncio.sleep(0)  # the next turn began with the ring
        assert qp.counts["doorbells"] == before + 1
        await asyncio.wait_for(task, 5)


async def test_a_break_before_the_ring_fails_every_held_call() -> None:
    async with rig(client_opts=BATCH) as r:
        await _mixed(r, 0)
        conn, qp = _client(r)
        sends = conn.stats["sends"]
        tasks = [asyncio.create_task(_mixed(r, i)) for i in range(N)]
        await asyncio.sleep(0)  # every call is posted and held
        assert conn.stats["sends"] - sends == N and qp._held is not None
        assert len(qp._held) == N  # one Send per call (its chunks are in its header)
        qp.disconnect()  # the connection breaks in the same turn
        assert qp._held is None and qp.broken
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert all(isinstance(res, ConnectionError) for res in results), results
        assert not conn._out  # every call's registrations went (TR-20)


async def test_the_held_sends_of_one_turn_complete_once() -> None:
    """Batched, the Sends of one turn go out unsignalled but the list's last, whose completion
    covers them all: one send queue completion for the turn, and every send buffer back."""
    async with rig(client_opts=BATCH) as r:
        await _mixed(r, 0)
        conn, qp = _client(r)
        before = Counter(qp.counts)
        sends = conn.stats["sends"]
        await asyncio.gather(*(_mixed(r, 3 * i) for i in range(N)))  # NULLs: a Send each
        delta = Counter(qp.counts)
        delta.subtract(before)
        assert conn.stats["sends"] - sends == N and delta["send_wrs"] == N
        assert delta["doorbells"] == 1 and delta["signaled"] == 1
        assert delta["completions"] == N + 1  # the N replies' receives and the one Send
        assert conn.stats["sends_unsignaled"] >= N - 1
        assert conn.sq.used == 0 and conn.send_pool.in_use == 0
