"""The client session against an in-memory server and transport: slots in flight, the
target highest slot id, exactly-once resends after a lost connection (SS-13, UL-27), session and
client id recovery with reclaim (SS-13), bounded NFS4ERR_DELAY back-off, cancellation (TR-20,
UL-25), the silent-server probe (UL-26), malformed replies, and the back channel (UL-22)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from nfsrdma.session.client import ClientSession, SessionError
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.xdr.gen import nfs4

from .fakeserver import FakeConnection, FakeServer

RENAME = nfs4.nfs_argop4(nfs4.OP_RENAME, nfs4.RENAME4args(b"a", b"b"))
PUTROOT = nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)


@asynccontextmanager
async def session(server: FakeServer, **opts: object) -> AsyncIterator[ClientSession]:
    async def connect() -> Connection:
        return server.connect()

    opts.setdefault("probe_interval", 0.2)
    opts.setdefault("probe_timeout", 0.2)
    opts.setdefault("reconnect_deadline", 5.0)
    s = ClientSession(connect, SessionOptions(**opts))  # type: ignore[arg-type]
    await s.start()
    try:
        yield s
    finally:
        await s.close()


async def rename(s: ClientSession) -> nfs4.COMPOUND4res:
    return await s.compound([PUTROOT, RENAME], cachethis=True, idempotent=False)


async def test_start_exchanges_id_creates_session_and_completes_reclaim() -> None:
    server = FakeServer(lease=12)
    async with session(server, slots=16) as s:
        assert s.session is not None and s.session.slots == 16
        assert s.lease_time == 12.0
        sent = [e[1][0] for e in server.log]
        assert sent[:3] == [nfs4.OP_EXCHANGE_ID, nfs4.OP_CREATE_SESSION, nfs4.OP_SEQUENCE]
        assert server.ops_sent(nfs4.OP_RECLAIM_COMPLETE)
    assert server.ops_sent(nfs4.OP_DESTROY_SESSION) and server.ops_sent(nfs4.OP_DESTROY_CLIENTID)


async def test_32_calls_in_flight_on_32_slots() -> None:
    server = FakeServer()
    async with session(server, slots=32) as s:
        server.hold = []
        before = len(server.ops_sent(nfs4.OP_PUTROOTFH))
        calls = [asyncio.create_task(s.compound([PUTROOT])) for _ in range(40)]
        await server.until(lambda: len(server.hold or ()) == 32, what="32 calls held")
        assert s.slots.in_flight == 32  # 8 wait for a slot
        slots = {e[2] for e in server.log[-32:]}
        assert slots == set(range(32))
        assert not any(c.done() for c in calls)
        server.release_held()  # answers the 32; the other 8 then go out and are answered
        await asyncio.gather(*calls)
        assert len(server.ops_sent(nfs4.OP_PUTROOTFH)) - before == 40
        assert s.slots.stats.max_in_flight == 32 and s.slots.in_flight == 0


async def test_client_follows_target_highest_slotid() -> None:
    """SS-9: the server asks for slots 0..3 only; the client keeps to them."""
    server = FakeServer(target=3)
    async with session(server, slots=16) as s:
        await s.compound([PUTROOT])
        assert s.slots.limit == 4
        await asyncio.gather(*(s.compound([PUTROOT]) for _ in range(20)))
        used = {e[2] for e in server.log if e[2] is not None}
        assert max(used) <= 3


@pytest.mark.parametrize("when", ["drop_after", "drop_before"])
async def test_lost_connection_resends_on_same_slot_and_seqid(when: str) -> None:
    """SS-13 / UL-27: a new connection, BIND_CONN_TO_SESSION, the same slot and seqid; the
    RENAME runs exactly once (from the reply cache when it already ran)."""
    server = FakeServer()
    fired: list[int] = []

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        if nfs4.OP_RENAME in ops and not fired:
            fired.append(xid)
            return when
        return None

    server.fault = fault
    async with session(server) as s:
        res = await rename(s)
        assert res.status == nfs4.NFS4_OK
        assert server.renames == 1
        sent = server.ops_sent(nfs4.OP_RENAME)
        assert len(sent) == 2 and sent[0][0] != sent[1][0]
        assert (sent[0][2], sent[0][3]) == (sent[1][2], sent[1][3])
        assert server.ops_sent(nfs4.OP_BIND_CONN_TO_SESSION)
        assert s.stats.resends == 1 and s.stats.sessions == 1
        # The slot moved on: the next call on it is a new request.
        assert (await rename(s)).status == nfs4.NFS4_OK and server.renames == 2


async def test_badsession_makes_a_new_session_for_the_same_client() -> None:
    server = FakeServer()
    async with session(server) as s:
        old = s.negotiated.sessionid
        clientid = s.clientid
        server.forget_sessions()
        assert (await rename(s)).status == nfs4.NFS4_OK
        assert s.negotiated.sessionid != old and s.clientid == clientid
        assert s.stats.sessions == 2 and s.stats.clients == 1


async def test_expired_client_reclaims_then_reclaim_complete_then_reopens() -> None:
    server = FakeServer()
    order: list[str] = []
    async with session(server) as s:

        async def reclaim() -> None:
            order.append("reclaim")
            res = await s.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(b"f")),
                    nfs4.nfs_argop4(
                        nfs4.OP_OPEN,
                        nfs4.OPEN4args(
                            0,
                            nfs4.OPEN4_SHARE_ACCESS_READ,
                            0,
                            nfs4.state_owner4(s.clientid or 0, b"o"),
                            nfs4.openflag4(nfs4.OPEN4_NOCREATE),
                            nfs4.open_claim4(nfs4.CLAIM_PREVIOUS, nfs4.OPEN_DELEGATE_NONE),
                        ),
                    ),
                ],
                reclaim=True,
                cachethis=True,
                idempotent=False,
            )
            assert res.status == nfs4.NFS4_OK

        reopened = asyncio.Event()

        async def reopen() -> None:
            order.append("reopen")
            reopened.set()

        s.reclaim_hook = reclaim
        s.reopen_hook = reopen
        old_client = s.clientid
        reclaim_completes = len(server.ops_sent(nfs4.OP_RECLAIM_COMPLETE))
        server.forget_clients()
        assert (await rename(s)).status == nfs4.NFS4_OK
        await asyncio.wait_for(reopened.wait(), 10)  # the reopen runs after RECLAIM_COMPLETE
        assert s.clientid != old_client and s.stats.clients == 2
        assert order == ["reclaim", "reopen"]
        assert server.claims == [nfs4.CLAIM_PREVIOUS]
        assert len(server.ops_sent(nfs4.OP_RECLAIM_COMPLETE)) == reclaim_completes + 1
        # RECLAIM_COMPLETE came after the reclaim OPEN.
        opened = max(i for i, e in enumerate(server.log) if nfs4.OP_OPEN in e[1])
        completed = max(i for i, e in enumerate(server.log) if nfs4.OP_RECLAIM_COMPLETE in e[1])
        assert opened < completed


async def test_delay_is_retried_with_bounded_backoff_then_gives_up() -> None:
    server = FakeServer()
    count: list[int] = []

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        if nfs4.OP_RENAME in ops:
            count.append(xid)
            return "delay" if len(count) <= 5 or server.renames < 0 or storm else None
        return None

    storm = False
    server.fault = fault
    async with session(server, delay_deadline=0.6) as s:
        assert (await rename(s)).status == nfs4.NFS4_OK
        assert s.stats.delays == 5 and server.renames == 1
        storm = True
        with pytest.raises(TimeoutError):
            await rename(s)
        assert s.slots.in_flight == 0


async def test_cancellation_releases_slot_and_transport_and_probes_before_reuse() -> None:
    """TR-20 / UL-25: a cancelled call frees its slot and its transport resources; before the
    slot carries another request a SEQUENCE-only probe with the same seqid resyncs it."""
    server = FakeServer()

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        return "silent" if nfs4.OP_RENAME in ops else None

    async with session(server, slots=1, probe_interval=60) as s:
        server.fault = fault
        task = asyncio.create_task(rename(s))
        await server.until(lambda: bool(server.ops_sent(nfs4.OP_RENAME)), what="RENAME sent")
        assert not task.done()  # the server stays silent: the call is in flight
        conn = server.connections[-1]
        sent = server.ops_sent(nfs4.OP_RENAME)[-1]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.slots.in_flight == 0 and s.slots.slots[0].needs_probe
        rpc = s.rpc
        assert rpc is not None and not rpc.pending
        assert len(conn.done) == len(conn.expectations)  # every call released (call_done)
        server.fault = None
        assert (await s.compound([PUTROOT])).status == nfs4.NFS4_OK
        probe = [e for e in server.log if e[1] == [nfs4.OP_SEQUENCE] and e[3] == sent[3]]
        assert probe and s.stats.slot_probes == 1
        assert not s.slots.slots[0].needs_probe


async def test_silent_server_is_probed_and_the_connection_replaced() -> None:
    """UL-26: no reply, no disconnect: the NULL probe times out, the client reconnects and
    resends; the server answers on the new connection."""
    server = FakeServer()
    silenced: list[int] = []

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        if conn.cid == server.connections[0].cid and len(server.connections) == 1:
            silenced.append(xid)
            return "silent"
        return None

    async with session(server) as s:
        server.fault = fault
        res = await asyncio.wait_for(rename(s), 5)
        assert res.status == nfs4.NFS4_OK and server.renames == 1
        assert s.stats.connects == 2 and s.stats.probes >= 1 and silenced


async def test_call_without_reply_from_a_live_server_is_resent_after_call_timeout() -> None:
    """The server answers pings but dropped one request (knfsd may drop under pressure):
    after ``call_timeout`` the client reconnects and resends on the same slot and seqid."""
    server = FakeServer()
    dropped: list[int] = []

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        if nfs4.OP_RENAME in ops and not dropped:
            dropped.append(xid)
            return "silent"
        return None

    async with session(server, call_timeout=0.5) as s:
        server.fault = fault
        res = await asyncio.wait_for(rename(s), 5)
        assert res.status == nfs4.NFS4_OK and server.renames == 1
        assert s.stats.connects == 2 and s.stats.resends == 1


async def test_malformed_reply_leads_to_a_resend_answered_from_the_cache() -> None:
    server = FakeServer()
    sent: list[int] = []

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        if nfs4.OP_RENAME in ops and not sent:
            sent.append(xid)
            server.compound(conn, _last_args(server, conn))  # it runs ...
            return "garbage"  # ... but the reply is garbage
        return None

    server.fault = fault
    async with session(server) as s:
        res = await rename(s)
        assert res.status == nfs4.NFS4_OK and server.renames == 1
        assert s.stats.malformed == 1 and s.stats.connects == 2


def _last_args(server: FakeServer, conn: FakeConnection) -> nfs4.COMPOUND4args:
    """The RENAME COMPOUND as the client sent it (rebuilt from the log)."""
    _cid, _ops, slot, seqid = server.log[-1]
    sess = next(iter(server.sessions.values()))
    seq = nfs4.SEQUENCE4args(sess.sessionid, seqid or 0, slot or 0, 0, True)
    return nfs4.COMPOUND4args(b"", 1, [nfs4.nfs_argop4(nfs4.OP_SEQUENCE, seq), PUTROOT, RENAME])


async def test_callbacks_recall_and_recall_slot() -> None:
    """UL-22: CB_SEQUENCE + CB_RECALL on the client's connection: answered OK at once, then the
    client returns the delegation (DELEGRETURN); CB_RECALL_SLOT lowers the slot limit."""
    server = FakeServer()
    async with session(server, slots=8) as s:
        conn = server.connections[-1]
        deleg = nfs4.stateid4(1, b"d" * 12)
        s.delegations[deleg.other] = (deleg, b"fh")
        server.callback(
            conn, [nfs4.nfs_cb_argop4(nfs4.OP_CB_RECALL, nfs4.CB_RECALL4args(deleg, False, b"fh"))]
        )
        await server.until(lambda: bool(server.delegreturns), what="DELEGRETURN")
        assert server.callbacks and server.callbacks[0].status == nfs4.NFS4_OK
        assert server.delegreturns == [deleg] and not s.delegations
        server.callback(
            conn,
            [nfs4.nfs_cb_argop4(nfs4.OP_CB_RECALL_SLOT, nfs4.CB_RECALL_SLOT4args(1))],
            seqid=2,
        )
        # The client schedules the slot recall before it sends the CB reply we wait for.
        await server.until(lambda: len(server.callbacks) == 2, what="CB_RECALL_SLOT reply")
        assert server.callbacks[1].status == nfs4.NFS4_OK and s.slots.limit == 2
        assert s.stats.callbacks == 2 and s.stats.recalls == 1


async def test_closed_session_refuses_calls() -> None:
    server = FakeServer()
    async with session(server) as s:
        pass
    with pytest.raises(SessionError):
        await s.compound([PUTROOT])


async def test_transport_error_ends_the_call_without_resend_and_probes_the_slot() -> None:
    """UL-20 / UL-25: an RPC-over-RDMA RDMA_ERROR fails the call at once (no resend); the
    slot's outcome is unknown, so a SEQUENCE-only probe precedes its next use."""
    from nfsrdma.transport.base import TransportCallError

    server = FakeServer()

    def fault(conn: FakeConnection, xid: int, ops: list[int]) -> str | None:
        if nfs4.OP_RENAME in ops:
            assert conn.call_failed is not None
            conn.call_failed(xid, TransportCallError("ERR_CHUNK"))
            return "silent"
        return None

    async with session(server, slots=1) as s:
        server.fault = fault
        with pytest.raises(OSError, match="transport refused"):
            await rename(s)
        assert len(server.ops_sent(nfs4.OP_RENAME)) == 1
        assert s.slots.slots[0].needs_probe and s.stats.connects == 1
        server.fault = None
        assert (await s.compound([PUTROOT])).status == nfs4.NFS4_OK
        assert s.stats.slot_probes == 1


async def test_reply_too_big_to_cache_is_asked_again_without_cachethis() -> None:
    server = FakeServer(too_big_to_cache=True)
    async with session(server) as s:
        assert (await rename(s)).status == nfs4.NFS4_OK
        assert server.renames == 1 and len(server.ops_sent(nfs4.OP_RENAME)) == 2
