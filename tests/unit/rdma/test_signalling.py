"""Selective signalling on the send queue: what a reply costs at the verbs boundary, buffers
reused only once a completion covers them, a send queue that never overflows, and teardown
after an error completion. Our RPC-over-RDMA client and server on the in-process provider
(which, like hardware, completes an unsignalled work request only when it fails and frees its
send queue slot only when a later completion covers it)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

import pytest

from nfsrdma.transport.rdma.calls import Scratch
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions
from nfsrdma.transport.rdma.inproc import call_read
from nfsrdma.transport.rdma.inproc_qp import InprocConnection
from nfsrdma.transport.rdma.provider import (
    Completion,
    ConnectionEvent,
    QueuePairConfig,
    RdmaWriteRequest,
)
from nfsrdma.transport.rdma.sendqueue import SendQueue
from tests.unit.rdma.helpers import Patchable
from tests.unit.rdma.test_rpc_rdma import P_READ, PROG, VERS, Rig, call_write, closed, rig

N = 32
SELECTIVE = RdmaOptions(signal_every=8)
READ_SIZE = 8000  # beyond the 4 KiB inline threshold: a Write chunk
WRITE_SIZE = 8000  # beyond the inline threshold: a Read chunk the server pulls


def _server(r: Rig) -> tuple[RdmaConnection, InprocConnection]:
    conn = r.server[0]
    assert isinstance(conn.qp, InprocConnection)
    return conn, conn.qp


async def _read(r: Rig, size: int = READ_SIZE) -> None:
    assert r.rpc is not None
    out, _ = await call_read(r.rpc, PROG, VERS, P_READ, size)
    assert bytes(out.data) == bytes(i % 251 for i in range(size))


async def _null(r: Rig) -> None:
    assert r.rpc is not None
    await r.rpc.call(PROG, VERS, 0, lambda w: None)


async def _write(r: Rig) -> None:
    n, _ = await call_write(r, bytes(WRITE_SIZE))
    assert n == WRITE_SIZE


OPS = {"getattr_like": _null, "read": _read, "write": _write}


async def _per_reply(op: str, options: RdmaOptions) -> dict[str, float]:
    """The server's verbs-boundary counts per reply over ``N`` calls, one at a time."""
    async with rig(server_opts=options) as r:
        await OPS[op](r)  # warm: the connection is up and has answered once
        conn, qp = _server(r)
        before = Counter(qp.counts)
        sends = conn.stats["sends"]
        for _ in range(N):
            await OPS[op](r)
        assert conn.stats["sends"] - sends == N
        delta = Counter(qp.counts)
        delta.subtract(before)
        return {k: v / N for k, v in delta.items()}


@pytest.mark.parametrize("op", sorted(OPS))
async def test_a_reply_costs_one_post_and_rarely_a_completion(op: str) -> None:
    every = RdmaOptions(signal_every=1)  # the default: every Send signalled
    old = await _per_reply(op, every)
    new = await _per_reply(op, SELECTIVE)
    rdma = 1 if op in ("read", "write") else 0  # the reply's RDMA Write, or the call's Read
    # One post per reply (the Writes chained ahead of the Send), plus the call's RDMA Read.
    assert old["doorbells"] == new["doorbells"] == 1 + (op == "write")
    assert old["send_wrs"] == new["send_wrs"] == 1 + rdma
    assert old["recv_wrs"] == new["recv_wrs"] == 1  # the call's receive, reposted
    # Every Send signalled, an RDMA Read too (its data is awaited), never an RDMA Write: the
    # Send after it in the same chain completes for both (RC completes in order).
    assert old["signaled"] == 1 + (op == "write")
    # Now: the RDMA Read is signalled (its data is awaited) and its completion covers the
    # Sends before it; the Write is never signalled; the Send one in eight (none when Reads
    # cover them). Completions: the receive's, the Read's, and the signalled Sends'.
    sends = 0 if op == "write" else 1 / 8
    assert new["signaled"] == (op == "write") + sends
    assert new["completions"] == 1 + (op == "write") + sends
    assert old["completions"] == 2 + (op == "write")


async def test_buffers_are_reused_only_after_a_completion_covers_them() -> None:
    """A send buffer or RDMA Write source goes out again only once a completion of its work
    request, or of a later one, has been delivered (send queue completions come in posting
    order). Watched at the queue pair, which both builds call: what each posted work request
    reads, and which completions the connection has been given."""
    async with rig(SELECTIVE) as r:
        await _null(r)
        conn, qp = _server(r)
        order: list[int] = []  # server send queue work requests, in posting order
        where: dict[int, set[int]] = {}  # wr_id -> the addresses it reads
        done = -1  # posting index of the latest send queue completion delivered
        early: list[tuple[int, int, int]] = []  # (use, reuse, done then): reused uncovered
        reused = 0  # posts reading an address that an earlier, covered one read
        post_send, on_event = qp.post_send, qp._on_event

        def spy_post(wr_id: int, sges: Any, **kw: Any) -> None:
            nonlocal reused
            posted = [(w.wr_id, w.sges) for w in kw.get("writes", ())] + [(wr_id, sges)]
            for wr, elements in posted:
                addrs = {s.addr for s in elements}
                uses = [i for i, old in enumerate(order) if where[old] & addrs]
                early.extend((use, len(order), done) for use in uses if use > done)
                reused += bool(uses)
                order.append(wr)
                where[wr] = addrs
            post_send(wr_id, sges, **kw)

        def spy_event(ev: ConnectionEvent) -> None:
            nonlocal done
            if isinstance(ev, Completion) and ev.wr_id in order:
                done = max(done, order.index(ev.wr_id))
            on_event(ev)

        qp.post_send = spy_post  # type: ignore[method-assign]
        qp._on_event = spy_event
        assert conn.data_pool is not None
        for i in range(40):
            await (_read(r) if i % 2 else _null(r))
        assert conn.stats["sends_unsignaled"] > 0
        assert reused, "no buffer went out again"
        assert not early, early  # each reuse came after a completion covering the last use
        # Nothing posted unsignalled is lost: what is still held is what no completion covered.
        held = [wr for wr in order if wr in conn._wr_ctx]
        assert len(held) == conn.sq.used
        assert conn.send_pool.in_use + conn.data_pool.in_use == len(held)


@pytest.mark.parametrize("depth", [3, 8, 17])
async def test_the_send_queue_never_overflows_under_a_burst_at_full_credits(depth: int) -> None:
    """Queue pairs with ``depth`` send queue slots (both sides); the client fills every credit
    with READs (an RDMA Write and a Send each) and WRITEs (an RDMA Read) at once, several
    times: the in-process provider refuses a post beyond the depth (ENOMEM), which would
    break the connection."""

    class Small(RdmaConnection):
        def qp_config(self) -> QueuePairConfig:
            return dataclasses.replace(super().qp_config(), max_send_wr=depth)

    async with rig(SELECTIVE, SELECTIVE, connection=Small) as r:
        conn, qp = _server(r)
        assert qp.config.max_send_wr == depth
        credits = conn.policy.grant
        for _ in range(4):
            calls = [_read(r) if i % 3 else _write(r) for i in range(credits)]
            await asyncio.gather(*calls)
        assert not conn.closed
        assert conn.stats["sends"] == 4 * credits
        assert conn.sq.used <= depth


async def test_an_error_completion_behind_unsignalled_work_tears_down_cleanly() -> None:
    async with rig(SELECTIVE) as r:
        conn, _ = _server(r)
        for _ in range(3):
            await _read(r)
        assert conn.sq.used > 0  # unsignalled work requests no completion has covered
        assert conn.data_pool is not None
        # An RDMA Write to an rkey the client never exposed: it fails (REM_ACCESS_ERR), the
        # queue pair goes to the error state and flushes the Send behind it.
        local = Scratch(conn.data_pool.get(), None)
        bad = RdmaWriteRequest(
            conn._wr_id("write", local), [local.sge(0, 64)], 0x1000, 0xDEAD, signaled=False
        )
        conn._send([b"\0" * 28], None, [bad])
        await closed(conn)
        assert conn.closed
        assert conn.sq.used == 0
        assert not [k for k, _ in conn._wr_ctx.values() if k in ("send", "write")]
        assert conn.send_pool.in_use == 0
        assert conn.data_pool.in_use == 0


async def test_a_failed_unsignalled_write_of_a_reply_breaks_the_connection() -> None:
    """With every Send signalled (the default) a READ reply's RDMA Write is not: when it fails
    (the client's Write chunk no longer registered), its error completion breaks the
    connection, the Send behind it is flushed, and every buffer comes back."""
    async with rig(connection=Patchable) as r:
        conn, qp = _server(r)
        await _read(r)
        client = r.client
        assert client is not None
        send_call = client.send_call

        def revoke_after_send(xid: int, *args: Any, **kw: Any) -> None:
            send_call(xid, *args, **kw)
            for region in client._out[xid].regions:  # the READ's Write chunk: unusable now
                region.deregister()

        client.send_call = revoke_after_send  # type: ignore[method-assign]
        writes = conn.stats["rdma_writes"]
        failed: list[Completion] = []
        on_event = qp._on_event

        def spy(ev: ConnectionEvent) -> None:
            if isinstance(ev, Completion) and not ev.ok:
                failed.append(ev)
            on_event(ev)

        qp._on_event = spy
        with pytest.raises(ConnectionError):
            await _read(r)
        await closed(conn)
        assert conn.stats["rdma_writes"] == writes + 1
        failed = [ev for ev in failed if ev.opcode.name != "RECV"]  # the receives flush too
        assert [ev.opcode.name for ev in failed] == ["RDMA_WRITE", "SEND"]
        assert failed[0].status.name == "REM_ACCESS_ERR"
        assert failed[1].status.name == "WR_FLUSH_ERR"
        assert qp.counts["signaled"] == qp.counts["send_wrs"] - conn.stats["rdma_writes"]
        assert conn.sq.used == 0
        assert conn.send_pool.in_use == 0
        assert conn.data_pool is not None and conn.data_pool.in_use == 0


def test_send_queue_accounting() -> None:
    sq = SendQueue(8, signal_every=3)
    assert sq.room(8) and not sq.room(9)
    assert not sq.should_signal(2)
    sq.posted([1, 2], signaled=False)
    assert not sq.should_signal(1)
    sq.posted([3], signaled=False)
    assert sq.should_signal(1)  # the third chain in a row
    assert sq.should_signal(1, pressure=True)
    sq.posted([4], signaled=True)
    assert sq.should_signal(4)  # more than half full after it
    assert not sq.room(5)
    with pytest.raises(OverflowError):
        sq.posted([5, 6, 7, 8, 9], signaled=True)
    assert sq.completed(4) == [1, 2, 3]  # covered by the signalled one after them
    assert sq.used == 0
    sq.posted([5, 6], signaled=False)
    assert sq.completed(5) == []  # an error completion of an unsignalled one
    assert sq.completed(99) == []  # unknown: covers nothing
    assert sq.clear() == [6]
    assert sq.used == 0
    with pytest.raises(ValueError):
        SendQueue(1)


def test_signalling_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NFSRDMA_SIGNAL_EVERY", raising=False)
    assert RdmaOptions().signal_every == 1  # the default: every Send signalled
    monkeypatch.setenv("NFSRDMA_SIGNAL_EVERY", "8")
    assert RdmaOptions().signal_every == 8
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("NFSRDMA_SIGNAL_EVERY", bad)
        assert RdmaOptions().signal_every == 1


async def test_the_close_line_is_name_value_pairs_with_the_verbs_counts() -> None:
    """The counters logged at close (``RdmaConnectionBase.counters``) stay ``name=value``
    tokens, the provider's counts among them: the test bed and scripts parse the line."""
    async with rig() as r:
        await _read(r)
        conn, _ = _server(r)
        tokens = conn.counters().split()
    pairs = dict(t.split("=") for t in tokens if "=" in t)
    assert len(pairs) == len(tokens), tokens
    assert int(pairs["verbs_send_wrs"]) >= 2 and int(pairs["verbs_doorbells"]) >= 1
