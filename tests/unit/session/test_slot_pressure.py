"""Slots under reply-cache pressure (issue 11 section 6; RFC 8881 sections 2.10.6.1, 18.46.3,
20.8; SS-9, SS-33): the server lowers sr_target_highest_slotid of the sessions holding the most
above their fair share, sends them CB_RECALL_SLOT, takes the slots back once the client's
sa_highest_slotid shows it stopped using them, and lets them grow back when the pressure is gone.
The policy is in nfsrdma/session/shares.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import nfsrdma.client as nc
from nfsrdma.server import NFSServer
from nfsrdma.session.server import SLOT_OVERHEAD, ServerSessions, SessionCaps, SlotRecall
from nfsrdma.session.shares import DrcPressure, SlotHolding, shed
from nfsrdma.xdr.gen import nfs4

from .helpers import PRINCIPAL, eid, op_create_session

WAIT = 10.0  # seconds to wait for an event that must come (a failure, not a sleep)
PER_SLOT = 1024 + SLOT_OVERHEAD  # our client caches replies of up to 1 KiB
POOL_SLOTS = 100


def small_budget(max_sessions: int = 3) -> SessionCaps:
    """A reply cache whose general pool holds 100 of our client's slots, no per-address or
    per-owner share below the whole pool (every test client is 127.0.0.1)."""
    probe = SessionCaps(max_sessions=max_sessions)
    reserve = (max_sessions + 1) * probe.min_session_cost
    return SessionCaps(
        max_sessions=max_sessions,
        drc_budget=reserve + POOL_SLOTS * PER_SLOT,
        drc_source_share=1.0,
        drc_owner_share=1.0,
    )


# -- the decision alone ---------------------------------------------------------------------
def test_pressure_has_hysteresis() -> None:
    p = DrcPressure(0.9, 0.75)
    assert not p.assess(80, 100)  # between the marks, from below: no pressure
    assert p.assess(90, 100)  # the high-water mark
    assert p.assess(80, 100)  # between the marks, from above: still
    assert not p.assess(74, 100)  # below the low-water mark: over
    assert p.assess(76, 100, cut_down=True)  # a cut-down CREATE_SESSION above the low mark
    assert not p.assess(10, 100)
    assert not p.assess(10, 100, cut_down=True)  # ... but not with the pool mostly free


def test_shed_takes_from_the_largest_excess_down_to_the_fair_share() -> None:
    holdings = [
        SlotHolding("big", 60, 10, 600, 4),
        SlotHolding("bigger", 30, 30, 900, 4),
        SlotHolding("fair", 10, 10, 100, 4),
        SlotHolding("minimal", 4, 10, 0, 4),
    ]
    # 2000 octets of pool among four sessions: 500 each is fair.
    assert shed(holdings, pool=2000, need=100) == {"bigger": 16}  # 900 over 500: most first
    assert shed(holdings, pool=2000, need=1000) == {"bigger": 16, "big": 50}
    assert shed(holdings, pool=2000, need=0) == {}
    # Never below the floor, and sessions within their share are left alone.
    assert shed([SlotHolding("a", 8, 100, 800, 4)], pool=200, need=800) == {"a": 4}
    assert shed(holdings[2:], pool=2000, need=1000) == {}


# -- the session layer with a controlled clock ----------------------------------------------
def session_of(sessions: ServerSessions, owner: bytes, slots: int, now: float) -> bytes:
    eir = sessions.exchange_id(eid(owner), principal=PRINCIPAL, now=now, source="192.0.2.1")
    args = op_create_session(eir.eir_clientid, eir.eir_sequenceid).value
    assert isinstance(args, nfs4.CREATE_SESSION4args)
    args.csa_fore_chan_attrs.ca_maxrequests = slots
    args.csa_fore_chan_attrs.ca_maxresponsesize_cached = 1024
    args.csa_flags |= nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    csr = sessions.create_session(
        args, conn=("conn", owner), principal=PRINCIPAL, now=now, source="192.0.2.1"
    )
    return csr.csr_sessionid


def sequence(
    sessions: ServerSessions, sid: bytes, seqid: int, now: float, highest: int = 0
) -> nfs4.SEQUENCE4resok:
    result = sessions.sequence(
        nfs4.SEQUENCE4args(sid, seqid, 0, highest, False),
        conn=("conn", sessions.sessions[sid].client.owner),
        now=now,
        op_count=1,
        request_size=100,
    )
    sessions.finish(result, None, now)
    return result.resok


def test_a_minimal_newcomer_makes_the_largest_session_shrink_and_regrow() -> None:
    recalls: list[SlotRecall] = []
    sessions = ServerSessions(
        slots=128, caps=small_budget(), on_slot_recall=recalls.append, lease_time=90
    )
    big = session_of(sessions, b"big", 98, now=0.0)  # 98 of the pool's 100 slots
    assert sessions.pressure.on  # its own CREATE_SESSION put the pool under pressure ...
    assert recalls == []  # ... but a lone session holds no more than its fair share
    small = session_of(sessions, b"small", 64, now=1.0)
    assert sessions.sessions[small].slots.count == 4  # cut down to a minimal session
    assert sessions.sessions[small].drc_from_reserve > 0
    # Fair share: half the pool each. The big session is asked to use 50 slots.
    assert recalls == [SlotRecall(sessions.sessions[big].clientid, big, 49)]
    ok = sequence(sessions, big, 1, now=2.0, highest=60)  # still uses slot 60
    assert (ok.sr_highest_slotid, ok.sr_target_highest_slotid) == (97, 49)
    assert sessions.drc.pool_used == 98 * PER_SLOT
    ok = sequence(sessions, big, 2, now=3.0, highest=70)  # no table grows under pressure
    assert ok.sr_highest_slotid == 97
    ok = sequence(sessions, big, 3, now=4.0)  # slot 0 only: the slots above 49 are taken back
    assert (ok.sr_highest_slotid, ok.sr_target_highest_slotid) == (49, 49)
    assert sessions.drc.pool_used == 50 * PER_SLOT
    # The next reap finds the pool below the low-water mark: the pressure is over, and the big
    # session grows back as far as that mark (75 of 100 slots), not to the high-water mark.
    sessions.reap(now=60.0)
    assert not sessions.pressure.on and len(recalls) == 1
    ok = sequence(sessions, big, 4, now=61.0)
    assert (ok.sr_highest_slotid, ok.sr_target_highest_slotid) == (74, 74)
    assert sessions.drc.pool_used == 75 * PER_SLOT


def test_a_recall_not_obeyed_is_sent_again_a_lease_later() -> None:
    recalls: list[SlotRecall] = []
    sessions = ServerSessions(
        slots=128, caps=small_budget(), on_slot_recall=recalls.append, lease_time=90
    )
    big = session_of(sessions, b"big", 70, now=0.0)
    other = session_of(sessions, b"other", 30, now=1.0)  # the pool is full
    assert [r.target_highest_slotid for r in recalls] == [49]
    sequence(sessions, big, 1, now=50.0, highest=69)  # the client keeps using its slots
    sequence(sessions, other, 1, now=50.0, highest=29)  # (and the other is not idle)
    sessions.reap(now=60.0)
    assert len(recalls) == 1  # not yet a lease since the recall
    sessions.reap(now=91.0)
    assert [r.target_highest_slotid for r in recalls] == [49, 49]


# -- through the real path: our client library over TCP to our server ------------------------
@contextlib.asynccontextmanager
async def serving(tmp_path: Path, caps: SessionCaps) -> AsyncIterator[NFSServer]:
    export = tmp_path / "export"
    export.mkdir()
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        state_dir=str(tmp_path / "state"),
        session_caps=caps,
    )
    await server.start()  # a server that cannot start fails the test
    try:
        yield server
    finally:
        await server.close()


async def test_cb_recall_slot_shrinks_a_client_and_it_grows_back(tmp_path: Path) -> None:
    async with serving(tmp_path, small_budget()) as server:
        assert server.state is not None
        sessions = server.state.sessions
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        async with nc.connect(url, uid=0, gid=0, slots=64) as a:
            table = a.session.slots
            assert table.limit == 64
            assert sessions.drc.pool_used == 64 * PER_SLOT  # below the high-water mark
            recalled: asyncio.Future[int] = asyncio.get_running_loop().create_future()

            def on_recall(target: int) -> None:
                if not recalled.done():
                    recalled.set_result(target)

            a.session.callbacks.slot_recall_hook = on_recall
            b = await nc.connect(url, uid=0, gid=0, slots=64)
            try:
                # B gets the 36 slots left, the pool is full: A (64 of the pool's 100 slots,
                # fair share 50) is asked back to 50 slots by CB_RECALL_SLOT.
                assert b.session.slots.size == 36
                assert await asyncio.wait_for(recalled, WAIT) == 49
                assert table.limit == 50
                assert sessions.drc.pool_used == 100 * PER_SLOT  # not yet taken back
                await a.stat("/")  # A's next SEQUENCE: sa_highest_slotid 0
                assert sessions.drc.pool_used == 86 * PER_SLOT
                await a.stat("/")
                assert table.limit == 50  # sr_highest_slotid 49 now
            finally:
                await b.aclose()  # DESTROY_SESSION: the pressure is over
            await a.stat("/")
            assert table.limit == 64  # grown back to what was negotiated
            assert sessions.drc.pool_used == 64 * PER_SLOT


async def test_without_a_back_channel_the_target_alone_shrinks_the_client(tmp_path: Path) -> None:
    async with serving(tmp_path, small_budget()) as server:
        assert server.state is not None
        sessions = server.state.sessions
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        async with nc.connect(url, uid=0, gid=0, slots=64, backchannel=False) as a:
            table = a.session.slots
            b = await nc.connect(url, uid=0, gid=0, slots=64)
            try:
                assert sessions.slot_recalls == 0  # no back channel: no CB_RECALL_SLOT
                assert table.limit == 64 and sessions.drc.pool_used == 100 * PER_SLOT
                await a.stat("/")  # the reply's sr_target_highest_slotid is 49; slot 0 in use
                assert table.limit == 50 and sessions.drc.pool_used == 86 * PER_SLOT
            finally:
                await b.aclose()
            await a.stat("/")
            assert table.limit == 64 and sessions.drc.pool_used == 64 * PER_SLOT
