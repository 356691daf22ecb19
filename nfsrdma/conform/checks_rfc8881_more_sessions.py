"""RFC 8881 sessions, continued: operations that must be alone, NFSv4.0-only operations,
RECLAIM_COMPLETE, slot-table reporting, false retries, DESTROY_SESSION in a SEQUENCE and with
calls in flight."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from nfsrdma.client import ops
from nfsrdma.conform.checks_rfc8881_sessions import _alone, _cached_pair, _same_replay
from nfsrdma.conform.harness import OK, Harness, Reply, _names, op, status_name
from nfsrdma.conform.registry import Failed, check
from nfsrdma.xdr.gen import nfs4

G = "rfc8881-sessions"


@check("SS-3.6", "DESTROY_SESSION not alone: NOT_ONLY_OP", "RFC 8881 §18.37.3", group=G)
async def destroy_session_not_alone(h: Harness) -> None:
    """DESTROY_SESSION without SEQUENCE followed by another operation fails with
    NFS4ERR_NOT_ONLY_OP, and the session lives on."""
    s = await h.session()
    ds = op(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(s.sessionid))
    r = await s.conn.compound([ds, ops.putrootfh()])
    if r.status != nfs4.NFS4ERR_NOT_ONLY_OP:
        raise Failed("NFS4ERR_NOT_ONLY_OP", _names(r.statuses))
    await s.ok([])


@check("SS-3.7", "DESTROY_CLIENTID not alone: NOT_ONLY_OP", "RFC 8881 §18.50.3", group=G)
async def destroy_clientid_not_alone(h: Harness) -> None:
    """DESTROY_CLIENTID without SEQUENCE followed by another operation fails with
    NFS4ERR_NOT_ONLY_OP."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    dc = op(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(c.clientid))
    r = await conn.compound([dc, ops.putrootfh()])
    if r.status != nfs4.NFS4ERR_NOT_ONLY_OP:
        raise Failed("NFS4ERR_NOT_ONLY_OP", _names(r.statuses))


@check("CONF-RC-1", "RECLAIM_COMPLETE twice: COMPLETE_ALREADY", "RFC 8881 §18.51.3", group=G)
async def reclaim_complete_twice(h: Harness) -> None:
    """A client-wide RECLAIM_COMPLETE after the client already sent one fails with
    NFS4ERR_COMPLETE_ALREADY."""
    s = await h.session()  # sends the first one
    r = await s.call([op(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False))])
    r.expect(OK, nfs4.NFS4ERR_COMPLETE_ALREADY)


@check("SS-6.7", "SEQUENCE reports slots within the table", "RFC 8881 §18.46.3, §2.10.6.1", group=G)
async def highest_slot_reported(h: Harness) -> None:
    """SEQUENCE's sr_highest_slotid and sr_target_highest_slotid lie below ca_maxrequests,
    and sr_highest_slotid is at least the slot used."""
    s = await h.session()
    for slot in (0, max(0, s.slots - 1)):
        res = (await s.ok([], slot=slot)).resok(0)
        if not (slot <= res.sr_highest_slotid < s.slots and res.sr_target_highest_slotid < s.slots):
            raise Failed(
                f"slot IDs within 0..{s.slots - 1} (slot {slot} used)",
                f"highest {res.sr_highest_slotid}, target {res.sr_target_highest_slotid}",
            )


@check("SS-7.5", "False retry: not run", "RFC 8881 §2.10.6.1.3, §15.1.11.7", group=G)
async def false_retry(h: Harness) -> None:
    """A different request sent with the seqid of a cached one (a false retry) is either
    refused with NFS4ERR_SEQ_FALSE_RETRY or answered with the cached reply; it is never run:
    the directory it would create does not appear."""
    s = await h.session()
    first, _ = await _cached_pair(h, s)
    d = await h.scratch()
    other = h.name("false")
    seqid = s.seqids[0]
    again = await s.call(
        [ops.putfh(d), ops.create(nfs4.NF4DIR, other, {nfs4.FATTR4_MODE: 0o755}), ops.getfh()],
        seqid=seqid,
        cachethis=True,
        note="another request with the cached request's seqid",
    )
    if again.status != nfs4.NFS4ERR_SEQ_FALSE_RETRY:
        _same_replay(first, again)
    (await s.call([ops.putfh(d), ops.lookup(other)])).expect(OK, OK, nfs4.NFS4ERR_NOENT)


async def _refused(h: Harness, opnum: int, args: object) -> None:
    s = await h.session()
    r = await s.call([op(opnum, args)])
    r.expect(OK, nfs4.NFS4ERR_NOTSUPP)


@check("SS-30.3", "SETCLIENTID in a session: NOTSUPP", "RFC 8881 §17, §18.46.3", group=G)
async def setclientid_refused(h: Harness) -> None:
    """SETCLIENTID (NFSv4.0 only: MUST NOT be implemented in 4.1) after SEQUENCE fails with
    NFS4ERR_NOTSUPP."""
    cb = nfs4.cb_client4(0x40000000, nfs4.netaddr4("tcp", "127.0.0.1.8.1"))
    args = nfs4.SETCLIENTID4args(nfs4.nfs_client_id4(os.urandom(8), h.owner()), cb, 1)
    await _refused(h, nfs4.OP_SETCLIENTID, args)


@check("SS-30.4", "SETCLIENTID_CONFIRM in a session: NOTSUPP", "RFC 8881 §17", group=G)
async def setclientid_confirm_refused(h: Harness) -> None:
    """SETCLIENTID_CONFIRM (NFSv4.0 only) after SEQUENCE fails with NFS4ERR_NOTSUPP."""
    await _refused(h, nfs4.OP_SETCLIENTID_CONFIRM, nfs4.SETCLIENTID_CONFIRM4args(1, bytes(8)))


@check("SS-30.5", "OPEN_CONFIRM in a session: NOTSUPP", "RFC 8881 §17", group=G)
async def open_confirm_refused(h: Harness) -> None:
    """OPEN_CONFIRM (NFSv4.0 only: 4.1 never asks for open confirmation) after SEQUENCE fails
    with NFS4ERR_NOTSUPP."""
    args = nfs4.OPEN_CONFIRM4args(nfs4.stateid4(1, os.urandom(12)), 1)
    await _refused(h, nfs4.OP_OPEN_CONFIRM, args)


@check("SS-30.6", "RELEASE_LOCKOWNER in a session: NOTSUPP", "RFC 8881 §17", group=G)
async def release_lockowner_refused(h: Harness) -> None:
    """RELEASE_LOCKOWNER (NFSv4.0 only; 4.1 frees lock state with FREE_STATEID) after
    SEQUENCE fails with NFS4ERR_NOTSUPP."""
    args = nfs4.RELEASE_LOCKOWNER4args(nfs4.state_owner4(1, b"conform-release"))
    await _refused(h, nfs4.OP_RELEASE_LOCKOWNER, args)


@check("CONF-DS-3", "DESTROY_SESSION last in its own SEQUENCE", "RFC 8881 §18.37.3", group=G)
async def destroy_in_sequence(h: Harness) -> None:
    """DESTROY_SESSION of the session SEQUENCE names, as the COMPOUND's final operation,
    succeeds; a later SEQUENCE on that session fails with NFS4ERR_BADSESSION."""
    s = await h.session()
    ds = op(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(s.sessionid))
    (await s.call([ds])).expect(OK, OK)
    s.destroyed = True
    (await s.call([])).expect(nfs4.NFS4ERR_BADSESSION, what="SEQUENCE after DESTROY_SESSION")


@check("CONF-DS-4", "DESTROY_SESSION with calls in flight", "RFC 8881 §18.37.3, §2.10.13", group=G)
async def destroy_in_flight(h: Harness) -> None:
    """Six SEQUENCE+PUTROOTFH+GETFH calls on six slots and then DESTROY_SESSION, all sent on
    the session's connection without waiting for replies: every call gets a reply (NFS4_OK, or NFS4ERR_BADSESSION if
    the session was gone first), DESTROY_SESSION succeeds (or says NFS4ERR_DELAY, and then
    succeeds when sent again), and afterwards the session is gone."""
    s = await h.session(slots=8)
    other = s.conn
    ds = _alone(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(s.sessionid))
    n = min(6, s.slots)
    calls = [s.call([ops.putrootfh(), ops.getfh()], slot=i) for i in range(n)]
    results = await asyncio.gather(*calls, other.compound(ds, note="DESTROY_SESSION"))
    replies: list[Reply] = list(results[:n])
    for r in replies:
        if r.status not in (OK, nfs4.NFS4ERR_BADSESSION):
            raise Failed("NFS4_OK or NFS4ERR_BADSESSION for calls in flight", _names(r.statuses))
    d = results[n]
    if d.status == nfs4.NFS4ERR_DELAY:
        d = await other.compound(ds, note="DESTROY_SESSION again")
    if d.status != OK:
        raise Failed("DESTROY_SESSION NFS4_OK", status_name(d.status))
    s.destroyed = True
    (await s.call([], slot=n)).expect(nfs4.NFS4ERR_BADSESSION, what="SEQUENCE afterwards")


@check(
    "SS-13.1",
    "Connection lost with calls outstanding: retried on a new one, done once",
    "RFC 8881 §2.10.6.1, §2.10.5; RFC 8166 §3.3.1",
    group=G,
)
async def connection_loss(h: Harness) -> None:
    """Three cached requests (each CREATE of a directory, on slots 0-2) are sent and the
    connection is closed at once, without waiting for replies. On a new connection the same
    three requests (same slots, same seqids) each succeed: answered from the reply cache if
    they ran, run now if they did not. Afterwards each directory exists."""
    s = await h.session()
    d = await h.scratch()
    names = [h.name("lost") for _ in range(3)]
    seqids = [s.next_seqid(i) for i in range(3)]

    def request(i: int) -> list[Any]:
        return [ops.putfh(d), ops.create(nfs4.NF4DIR, names[i], {nfs4.FATTR4_MODE: 0o755})]

    first = [
        asyncio.ensure_future(s.call(request(i), slot=i, seqid=seqids[i], cachethis=True))
        for i in range(3)
    ]
    await asyncio.sleep(0)  # the calls are on their way
    await s.conn.closed()
    await asyncio.gather(*first, return_exceptions=True)  # replies or connection errors
    s.conn = await h.connect()
    for i in range(3):
        r = await s.call(request(i), slot=i, seqid=seqids[i], cachethis=True, note="retry")
        r.expect(OK, OK, OK, what=f"the retry on slot {i}")
    for name in names:
        (await s.call([ops.putfh(d), ops.lookup(name)])).expect(OK, OK, OK, what="LOOKUP")
