"""RFC 8881 sessions: EXCHANGE_ID, CREATE_SESSION, SEQUENCE (slots, seqids, the reply cache),
the rules on what may stand where in a COMPOUND, BIND_CONN_TO_SESSION, DESTROY_SESSION and
DESTROY_CLIENTID. They run over TCP and RPC-over-RDMA alike."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

from nfsrdma.client import ops
from nfsrdma.client.attrs import decode_attrs
from nfsrdma.conform.harness import (
    OK,
    Harness,
    Reply,
    Session,
    op,
    op_name,
    result_status,
    status_name,
)
from nfsrdma.conform.registry import Failed, Skipped, Unsupported, check
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

G = "rfc8881-sessions"


def _expect(what: str, expected: object, got: object) -> None:
    if expected != got:
        raise Failed(f"{what} {expected!r}", repr(got))


def _alone(opnum: int, args: Any) -> list[nfs4.nfs_argop4]:
    return [op(opnum, args)]


# -- EXCHANGE_ID ------------------------------------------------------------------------------
@check("CONF-EID-1", "EXCHANGE_ID gives a client ID and a pNFS role", "RFC 8881 §18.35.3", group=G)
async def eid_basic(h: Harness) -> None:
    """EXCHANGE_ID alone in a COMPOUND succeeds, and the server sets exactly one or more of
    the EXCHGID4_FLAG_USE_* role bits in eir_flags (a server that is not pNFS sets
    USE_NON_PNFS); a new client ID is not yet confirmed (no CONFIRMED_R)."""
    c, _ = await h.exchange_id()
    if not c.flags & nfs4.EXCHGID4_FLAG_MASK_PNFS:
        raise Failed("one of the EXCHGID4_FLAG_USE_* bits in eir_flags", f"{c.flags:#x}")
    if c.flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R:
        raise Failed("no CONFIRMED_R for a new client", f"eir_flags {c.flags:#x}")


@check(
    "CONF-EID-2",
    "EXCHANGE_ID again: the unconfirmed record is replaced",
    "RFC 8881 §18.35.4",
    group=G,
)
async def eid_replace_unconfirmed(h: Harness) -> None:
    """The same owner sent twice with no CREATE_SESSION between: the second EXCHANGE_ID
    replaces the unconfirmed record (case 4, processed as case 1). CREATE_SESSION with the
    second client ID works; if the first client ID differs, it is gone
    (NFS4ERR_STALE_CLIENTID)."""
    conn = await h.connect()
    a, _ = await h.exchange_id(conn)
    b, _ = await h.exchange_id(conn, owner=a.owner, verifier=a.verifier)
    if a.clientid != b.clientid:
        r = await conn.compound(_alone(nfs4.OP_CREATE_SESSION, h.create_session_args(a)))
        r.expect(nfs4.NFS4ERR_STALE_CLIENTID, what="CREATE_SESSION with the replaced client ID")
    await h.session(conn, b)


@check("CONF-EID-3", "EXCHANGE_ID of a confirmed client: CONFIRMED_R", "RFC 8881 §18.35.4", group=G)
async def eid_confirmed(h: Harness) -> None:
    """After CREATE_SESSION confirmed the client ID, EXCHANGE_ID with the same owner and
    verifier returns the same client ID with EXCHGID4_FLAG_CONFIRMED_R set."""
    s = await h.session()
    c, _ = await h.exchange_id(s.conn, owner=s.client.owner, verifier=s.client.verifier)
    _expect("the same eir_clientid", s.client.clientid, c.clientid)
    if not c.flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R:
        raise Failed("EXCHGID4_FLAG_CONFIRMED_R in eir_flags", f"{c.flags:#x}")


@check(
    "CONF-EID-4", "EXCHANGE_ID with a new verifier: a new client ID", "RFC 8881 §18.35.4", group=G
)
async def eid_reboot(h: Harness) -> None:
    """A confirmed client that comes back with the same owner and a new verifier (it
    rebooted) gets a new, unconfirmed client ID."""
    s = await h.session()
    c, _ = await h.exchange_id(s.conn, owner=s.client.owner, verifier=os.urandom(8))
    if c.clientid == s.client.clientid:
        raise Failed("a new eir_clientid", f"the old one {c.clientid:#x}")
    if c.flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R:
        raise Failed("no CONFIRMED_R", f"eir_flags {c.flags:#x}")


@check("CONF-EID-5", "EXCHANGE_ID with an undefined flag: INVAL", "RFC 8881 §18.35.3", group=G)
async def eid_bad_flag(h: Harness) -> None:
    """eia_flags with a bit the protocol does not define (0x10) or with CONFIRMED_R (which only
    the server sets) is refused with NFS4ERR_INVAL."""
    conn = await h.connect()
    for flags in (0x10, nfs4.EXCHGID4_FLAG_CONFIRMED_R):
        args = h_exchange_args(h, flags)
        r = await conn.compound(_alone(nfs4.OP_EXCHANGE_ID, args))
        r.expect(nfs4.NFS4ERR_INVAL, what=f"eia_flags {flags:#x}")


def h_exchange_args(h: Harness, flags: int) -> nfs4.EXCHANGE_ID4args:
    from nfsrdma.session.client_setup import exchange_id_args

    args = exchange_id_args(h.owner(), os.urandom(8))
    args.eia_flags = flags
    return args


# -- COMPOUND ---------------------------------------------------------------------------------
@check(
    "CONF-COMP-1", "COMPOUND of minor version 99: MINOR_VERS_MISMATCH", "RFC 8881 §16.2.3", group=G
)
async def comp_minor(h: Harness) -> None:
    """A COMPOUND with a minor version the server does not support gets
    NFS4ERR_MINOR_VERS_MISMATCH and an empty result array."""
    conn = await h.connect()
    r = await conn.compound([ops.putrootfh()], minor=99)
    if r.status != nfs4.NFS4ERR_MINOR_VERS_MISMATCH or r.res.resarray:
        raise Failed(
            "NFS4ERR_MINOR_VERS_MISMATCH with no results",
            f"{status_name(r.status)} with {len(r.res.resarray)} results",
        )


@check("CONF-COMP-2", "COMPOUND tag echoed", "RFC 8881 §16.2.3", group=G)
async def comp_tag(h: Harness) -> None:
    """The tag of a COMPOUND comes back unchanged in its reply (here with a failing first
    operation, OP_NOT_IN_SESSION, so no session is needed)."""
    conn = await h.connect()
    tag = b"nfsrdma-conform tag \xc3\xa9"
    r = await conn.compound([ops.putrootfh()], tag=tag)
    _expect("the tag", tag, r.res.tag)


@check("CONF-COMP-3", "Unknown operation: OP_ILLEGAL", "RFC 8881 §15.2, §18.52", group=G)
async def comp_illegal(h: Harness) -> None:
    """An operation number the protocol does not define (20000) ends the COMPOUND with a
    result of OP_ILLEGAL and status NFS4ERR_OP_ILLEGAL."""
    s = await h.session()

    def encode(w: Writer) -> None:
        nfs4.enc_utf8str_cs(w, b"")
        nfs4.enc_uint32_t(w, 1)
        nfs4.enc_uint32_t(w, 2)
        nfs4.enc_nfs_argop4(w, s.sequence())
        nfs4.enc_uint32_t(w, 20000)

    r = await s.conn.compound_raw(encode, "SEQUENCE then operation number 20000")
    s.seqids[0] = s.next_seqid()
    got = [f"{op_name(x.resop)} {status_name(result_status(x.value))}" for x in r.res.resarray]
    _expect("results", ["SEQUENCE NFS4_OK", "ILLEGAL NFS4ERR_OP_ILLEGAL"], got)


@check(
    "SS-3.1",
    "First operation not SEQUENCE: OP_NOT_IN_SESSION",
    "RFC 8881 §16.2.3, §18.46.3",
    group=G,
)
async def not_in_session(h: Harness) -> None:
    """A COMPOUND whose first operation is neither SEQUENCE nor one of the operations allowed
    alone (PUTROOTFH, GETFH here) fails on it with NFS4ERR_OP_NOT_IN_SESSION."""
    conn = await h.connect()
    r = await conn.compound([ops.putrootfh(), ops.getfh()])
    r.expect(nfs4.NFS4ERR_OP_NOT_IN_SESSION)


@check("SS-3.2", "SEQUENCE not first: SEQUENCE_POS", "RFC 8881 §18.46.3", group=G)
async def sequence_pos(h: Harness) -> None:
    """A second SEQUENCE later in the COMPOUND fails with NFS4ERR_SEQUENCE_POS."""
    s = await h.session()
    r = await s.call([ops.putrootfh(), s.sequence(1, 1)])
    r.expect(OK, OK, nfs4.NFS4ERR_SEQUENCE_POS)


@check("SS-3.3", "BIND_CONN_TO_SESSION not alone: NOT_ONLY_OP", "RFC 8881 §18.34.3", group=G)
async def bind_not_only(h: Harness) -> None:
    """BIND_CONN_TO_SESSION followed by another operation fails with NFS4ERR_NOT_ONLY_OP."""
    s = await h.session()
    conn = await h.connect()
    args = nfs4.BIND_CONN_TO_SESSION4args(s.sessionid, nfs4.CDFC4_FORE, False)
    r = await conn.compound([op(nfs4.OP_BIND_CONN_TO_SESSION, args), ops.putrootfh()])
    r.expect(nfs4.NFS4ERR_NOT_ONLY_OP)


@check("SS-3.4", "EXCHANGE_ID not alone: NOT_ONLY_OP", "RFC 8881 §18.35.3", group=G)
async def eid_not_only(h: Harness) -> None:
    """EXCHANGE_ID followed by another operation in a COMPOUND without SEQUENCE fails with
    NFS4ERR_NOT_ONLY_OP."""
    conn = await h.connect()
    args = h_exchange_args(h, 0)
    r = await conn.compound([op(nfs4.OP_EXCHANGE_ID, args), ops.putrootfh()])
    r.expect(nfs4.NFS4ERR_NOT_ONLY_OP)


@check("SS-3.5", "CREATE_SESSION not alone: NOT_ONLY_OP", "RFC 8881 §18.36.3", group=G)
async def cs_not_only(h: Harness) -> None:
    """CREATE_SESSION followed by another operation in a COMPOUND without SEQUENCE fails with
    NFS4ERR_NOT_ONLY_OP."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    args = h.create_session_args(c)
    r = await conn.compound([op(nfs4.OP_CREATE_SESSION, args), ops.putrootfh()])
    r.expect(nfs4.NFS4ERR_NOT_ONLY_OP)


@check(
    "SS-27.1",
    "More operations than ca_maxoperations: TOO_MANY_OPS",
    "RFC 8881 §18.36.3, §18.46.3",
    group=G,
)
async def too_many_ops(h: Harness) -> None:
    """A COMPOUND with more operations than the session's ca_maxoperations fails with
    NFS4ERR_TOO_MANY_OPS (from SEQUENCE or from the first operation past the limit)."""
    s = await h.session(max_operations=8)
    n = int(s.fore.ca_maxoperations)
    if n > 200:
        raise Skipped(f"ca_maxoperations is {n}: too large to exceed")
    r = await s.call([ops.putrootfh()] * n)  # n + 1 operations with SEQUENCE
    r.expect_status(nfs4.NFS4ERR_TOO_MANY_OPS, what=f"{n + 1} operations, limit {n}")


# -- CREATE_SESSION ---------------------------------------------------------------------------
@check("SS-10.1", "CREATE_SESSION uses eir_sequenceid", "RFC 8881 §18.36.4", group=G)
async def cs_first(h: Harness) -> None:
    """The first CREATE_SESSION of a client ID carries csa_sequence = eir_sequenceid and
    succeeds; csr_sequence echoes it; the session ID is 16 octets and the first SEQUENCE on
    slot 0 with seqid 1 works."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    args = h.create_session_args(c)
    r = await conn.compound(_alone(nfs4.OP_CREATE_SESSION, args))
    res = r.resok(0)
    _expect("csr_sequence", c.sequenceid, res.csr_sequence)
    s = Session(
        h,
        conn,
        c,
        res.csr_sessionid,
        res.csr_fore_chan_attrs,
        res.csr_back_chan_attrs,
        res.csr_flags,
    )
    h.track(s)
    (await s.call([])).expect(OK)


@check("SS-10.2", "CREATE_SESSION replay: the same session", "RFC 8881 §18.36.4", group=G)
async def cs_replay(h: Harness) -> None:
    """CREATE_SESSION sent again with the same csa_sequence is a replay: the reply is the
    cached one (same session ID), and no second session is made."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    args = h.create_session_args(c)
    first = await conn.compound(_alone(nfs4.OP_CREATE_SESSION, args))
    a = first.resok(0)
    h.track(Session(h, conn, c, a.csr_sessionid, a.csr_fore_chan_attrs, a.csr_back_chan_attrs, 0))
    again = await conn.compound(_alone(nfs4.OP_CREATE_SESSION, args))
    b = again.resok(0)
    _expect("the same csr_sessionid", a.csr_sessionid, b.csr_sessionid)


@check("SS-10.3", "CREATE_SESSION misordered: SEQ_MISORDERED", "RFC 8881 §18.36.4", group=G)
async def cs_misordered(h: Harness) -> None:
    """A csa_sequence that is neither the expected one nor the last one used (eir_sequenceid +
    2 on a new client ID) gets NFS4ERR_SEQ_MISORDERED."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    args = h.create_session_args(c, sequence=(c.sequenceid + 2) & 0xFFFFFFFF)
    r = await conn.compound(_alone(nfs4.OP_CREATE_SESSION, args))
    r.expect(nfs4.NFS4ERR_SEQ_MISORDERED)


@check(
    "SS-10.4",
    "CREATE_SESSION for an unknown client ID: STALE_CLIENTID",
    "RFC 8881 §18.36.3",
    group=G,
)
async def cs_stale(h: Harness) -> None:
    """CREATE_SESSION naming a client ID the server never gave out gets
    NFS4ERR_STALE_CLIENTID."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    c2 = type(c)(c.owner, c.verifier, c.clientid ^ 0x5A5A5A5A00000000, c.sequenceid, 0)
    r = await conn.compound(_alone(nfs4.OP_CREATE_SESSION, h.create_session_args(c2)))
    r.expect(nfs4.NFS4ERR_STALE_CLIENTID)


@check("SS-4", "Session IDs differ", "RFC 8881 §18.36.4", group=G)
async def sessionids_differ(h: Harness) -> None:
    """Two sessions of one client ID have different session IDs."""
    s = await h.session()
    t = await h.session(s.conn, s.client)
    if s.sessionid == t.sessionid:
        raise Failed("two different session IDs", f"{s.sessionid.hex()} twice")


# -- SEQUENCE ---------------------------------------------------------------------------------
@check("SS-6.1", "SEQUENCE echoes session, slot and seqid", "RFC 8881 §18.46.4", group=G)
async def seq_echo(h: Harness) -> None:
    """SEQUENCE on slot 0 with seqid 1 succeeds; sr_sessionid, sr_sequenceid and sr_slotid
    echo the arguments; sr_highest_slotid covers the slot used."""
    s = await h.session()
    r = await s.call([])
    ok = r.resok(0)
    _expect("sr_sessionid", s.sessionid, ok.sr_sessionid)
    _expect("sr_sequenceid", 1, ok.sr_sequenceid)
    _expect("sr_slotid", 0, ok.sr_slotid)
    if ok.sr_highest_slotid < 0 or ok.sr_highest_slotid >= 2**32:
        raise Failed("a valid sr_highest_slotid", str(ok.sr_highest_slotid))


@check("SS-6.2", "Slot beyond the table: BADSLOT", "RFC 8881 §2.10.6.1, §18.46.3", group=G)
async def seq_badslot(h: Harness) -> None:
    """SEQUENCE on a slot ID at or beyond ca_maxrequests fails with NFS4ERR_BADSLOT."""
    s = await h.session(slots=4)
    r = await s.call([], slot=s.slots, seqid=1)
    r.expect(nfs4.NFS4ERR_BADSLOT, what=f"slot {s.slots} of {s.slots}")


@check("SS-6.3", "Seqid ahead of the slot: SEQ_MISORDERED", "RFC 8881 §2.10.6.1", group=G)
async def seq_ahead(h: Harness) -> None:
    """On a slot whose last seqid is 1, seqid 3 fails with NFS4ERR_SEQ_MISORDERED."""
    s = await h.session()
    (await s.call([])).expect(OK)
    r = await s.call([], seqid=3)
    r.expect(nfs4.NFS4ERR_SEQ_MISORDERED)


@check("SS-6.4", "Seqid behind the slot: SEQ_MISORDERED", "RFC 8881 §2.10.6.1", group=G)
async def seq_behind(h: Harness) -> None:
    """On a slot whose last seqid is 3, seqid 1 (neither the retry 3 nor the next 4) fails with
    NFS4ERR_SEQ_MISORDERED."""
    s = await h.session()
    for _ in range(3):
        (await s.call([])).expect(OK)
    r = await s.call([], seqid=1)
    r.expect(nfs4.NFS4ERR_SEQ_MISORDERED)


@check("SS-6.5", "Slots are independent", "RFC 8881 §2.10.6.1", group=G)
async def seq_slots_independent(h: Harness) -> None:
    """Each slot has its own seqid: seqid 1 on slot 1 works after slot 0 reached seqid 2."""
    s = await h.session(slots=4)
    if s.slots < 2:
        raise Unsupported("the server granted one slot")
    (await s.call([])).expect(OK)
    (await s.call([])).expect(OK)
    (await s.call([], slot=1)).expect(OK)


@check("SS-6.6", "Unknown session: BADSESSION", "RFC 8881 §18.46.3", group=G)
async def seq_badsession(h: Harness) -> None:
    """SEQUENCE naming a session ID the server does not know fails with NFS4ERR_BADSESSION."""
    s = await h.session()
    bogus = bytes(b ^ 0xFF for b in s.sessionid)
    r = await s.conn.compound([s.sequence(sessionid=bogus)])
    r.expect(nfs4.NFS4ERR_BADSESSION)


async def _cached_pair(h: Harness, s: Session) -> tuple[Reply, bytes]:
    """A cached request (sa_cachethis) that changes state: CREATE of a directory."""
    d = await h.scratch()
    name = h.name("replay")
    r = await s.call(
        [ops.putfh(d), ops.create(nfs4.NF4DIR, name, {nfs4.FATTR4_MODE: 0o755}), ops.getfh()],
        cachethis=True,
    )
    r.expect(OK, OK, OK, OK)
    return r, name


@check("SS-7.1", "Replay: the cached reply, byte for byte", "RFC 8881 §2.10.6.1.1", group=G)
async def replay_same_bytes(h: Harness) -> None:
    """A request sent again on the same slot with the same seqid (sa_cachethis TRUE) is answered
    from the reply cache: the same bytes (SEQUENCE's highest slot, target highest slot and
    status flags aside, which describe the present), and CREATE is not run again."""
    s = await h.session()
    first, _ = await _cached_pair(h, s)
    again = await _resend(s, first)
    _same_replay(first, again)


def _replay_view(body: bytes) -> bytes:
    """A COMPOUND4res without SEQUENCE's sr_highest_slotid, sr_target_highest_slotid and
    sr_status_flags: those report the slot table and the client's state as they are when the
    reply goes out, so a server refreshes them in a replayed reply; every other byte of the
    replay must be the original's."""
    (taglen,) = struct.unpack_from(">I", body, 4)
    at = 8 + taglen + (-taglen & 3) + 4  # status, tag, result count
    if len(body) < at + 8 + 36:
        return body
    resop, status = struct.unpack_from(">II", body, at)
    if resop != nfs4.OP_SEQUENCE or status != OK:
        return body
    live = at + 8 + 24  # sessionid, sequenceid and slotid stay
    return body[:live] + body[live + 12 :]


def _same_replay(first: Reply, again: Reply) -> None:
    if _replay_view(again.body) != _replay_view(first.body):
        raise Failed(
            "the first reply again (but for SEQUENCE's slot and status fields)",
            f"a different reply: statuses {[status_name(x) for x in again.statuses]}",
        )


async def _resend(s: Session, first: Reply, conn: Any = None) -> Reply:
    """Send exactly the COMPOUND of ``first`` again (found in the harness log)."""
    sent = next(x for x in reversed(s.h.log) if x.res is first.res)
    assert sent.ops is not None
    return await (conn or s.conn).compound(list(sent.ops), note="the same request again")


@check("SS-7.2", "Replay on a new connection", "RFC 8881 §2.10.6.1.1, §2.10.5", group=G)
async def replay_new_connection(h: Harness) -> None:
    """After the connection is lost, the same request sent on a new connection is answered from
    the reply cache byte for byte (the session survives its connection, SS-2)."""
    s = await h.session()
    first, _ = await _cached_pair(h, s)
    await s.conn.closed()
    conn = await h.connect()
    again = await _resend(s, first, conn)
    _same_replay(first, again)
    s.conn = conn


@check("SS-7.3", "Retry of an uncached request: not run twice", "RFC 8881 §2.10.6.1.3", group=G)
async def retry_uncached(h: Harness) -> None:
    """A request sent with sa_cachethis FALSE and retried with the same slot and seqid is
    either answered from the cache (same bytes) or refused with NFS4ERR_RETRY_UNCACHED_REP;
    it is never executed again (a second CREATE would fail with NFS4ERR_EXIST)."""
    s = await h.session()
    d = await h.scratch()
    name = h.name("uncached")
    first = await s.call(
        [ops.putfh(d), ops.create(nfs4.NF4DIR, name, {nfs4.FATTR4_MODE: 0o755})], cachethis=False
    )
    first.expect(OK, OK, OK)
    again = await _resend(s, first)
    if _replay_view(again.body) == _replay_view(first.body):
        return
    if again.statuses[:1] == [nfs4.NFS4ERR_RETRY_UNCACHED_REP] or (
        again.status == nfs4.NFS4ERR_RETRY_UNCACHED_REP
    ):
        return
    raise Failed(
        "the cached reply or NFS4ERR_RETRY_UNCACHED_REP",
        f"{[status_name(x) for x in again.statuses]}",
    )


@check("SS-7.4", "Reply too big to cache: REP_TOO_BIG_TO_CACHE", "RFC 8881 §18.46.3", group=G)
async def rep_too_big_to_cache(h: Harness) -> None:
    """With sa_cachethis TRUE, a reply larger than ca_maxresponsesize_cached is not sent as is:
    the server answers NFS4ERR_REP_TOO_BIG_TO_CACHE, or a reply that fits the cache (a READ
    may return fewer bytes)."""
    s = await h.session(max_response_size_cached=1024)
    cached = int(s.fore.ca_maxresponsesize_cached)
    size = cached + 1024
    if size + 512 > s.fore.ca_maxresponsesize:
        raise Skipped(f"ca_maxresponsesize_cached {cached} leaves no room under ca_maxresponsesize")
    fh, stateid = await _file_with(h, s, os.urandom(size))
    r = await s.call([ops.putfh(fh), ops.read(stateid, 0, size)], cachethis=True)
    if r.status == nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE:
        return
    if r.status == OK and len(r.body) <= cached:
        return
    raise Failed(
        f"NFS4ERR_REP_TOO_BIG_TO_CACHE or a reply of at most {cached} bytes",
        f"{[status_name(x) for x in r.statuses]}, {len(r.body)} bytes",
    )


@check(
    "SS-21.1",
    "Reply larger than ca_maxresponsesize: REP_TOO_BIG",
    "RFC 8881 §18.36.3, §18.46.3",
    group=G,
)
async def rep_too_big(h: Harness) -> None:
    """A READ asking for more than ca_maxresponsesize allows gets NFS4ERR_REP_TOO_BIG, or a
    shorter READ whose reply fits within ca_maxresponsesize."""
    s = await h.session(rsize=8192)
    limit = int(s.fore.ca_maxresponsesize)
    if limit > 1 << 20:
        raise Skipped(f"ca_maxresponsesize {limit}: too large to exceed here")
    fh, stateid = await _file_with(h, s, os.urandom(limit + 4096))
    r = await s.call([ops.putfh(fh), ops.read(stateid, 0, limit + 4096)])
    if r.status == nfs4.NFS4ERR_REP_TOO_BIG:
        return
    if r.status == OK and len(r.body) <= limit:
        return
    raise Failed(
        f"NFS4ERR_REP_TOO_BIG or a reply of at most {limit} bytes",
        f"{[status_name(x) for x in r.statuses]}, {len(r.body)} bytes",
    )


async def _file_with(h: Harness, s: Session, data: bytes) -> tuple[bytes, nfs4.stateid4]:
    """A new file in the scratch directory holding ``data`` (written in small pieces on a
    separate roomy session), and an open stateid for it on session ``s``."""
    d = await h.scratch()
    big = await h.session(s.conn)
    name = h.name("data")
    owner = nfs4.state_owner4(big.client.clientid, b"conform-writer")
    r = await big.ok([
        ops.putfh(d),
        ops.open_(owner, nfs4.OPEN4_SHARE_ACCESS_BOTH, name, create=nfs4.UNCHECKED4),
        ops.getfh(),
    ])  # fmt: skip
    fh = r.resok(3).object
    wstate = r.resok(2).stateid
    for off in range(0, len(data), 4096):
        await big.ok(
            [ops.putfh(fh), ops.write(wstate, off, data[off : off + 4096], nfs4.FILE_SYNC4)]
        )
    await big.ok([ops.putfh(fh), ops.close(wstate)])
    owner2 = nfs4.state_owner4(s.client.clientid, b"conform-reader")
    r = await s.ok([ops.putfh(fh), ops.open_(owner2, nfs4.OPEN4_SHARE_ACCESS_READ, None)])
    return fh, r.resok(2).stateid


@check(
    "SS-21.2",
    "Request larger than ca_maxrequestsize: REQ_TOO_BIG",
    "RFC 8881 §18.36.3, §18.46.3",
    group=G,
)
async def req_too_big(h: Harness) -> None:
    """A WRITE whose request exceeds the session's ca_maxrequestsize fails with
    NFS4ERR_REQ_TOO_BIG. The size is that of the XDR-encoded request (RFC 8881 §18.36.3), so
    over RPC-over-RDMA the WRITE data moved by a Read chunk counts too."""
    s = await h.session(wsize=8192)
    limit = int(s.fore.ca_maxrequestsize)
    if limit > 1 << 20:
        raise Skipped(f"ca_maxrequestsize {limit}: too large to exceed here")
    d = await h.scratch()
    owner = nfs4.state_owner4(s.client.clientid, b"conform-req-too-big")
    opened = await s.ok([
        ops.putfh(d),
        ops.open_(owner, nfs4.OPEN4_SHARE_ACCESS_BOTH, h.name("big"), create=nfs4.UNCHECKED4),
        ops.getfh(),
    ])  # fmt: skip
    fh, stateid = opened.resok(3).object, opened.resok(2).stateid
    r = await s.call([ops.putfh(fh), ops.write(stateid, 0, bytes(limit + 1024), nfs4.UNSTABLE4)])
    r.expect_status(nfs4.NFS4ERR_REQ_TOO_BIG, what=f"a {limit + 1024}-byte WRITE, limit {limit}")


# -- connections, BIND_CONN_TO_SESSION, DESTROY -----------------------------------------------
@check("SS-2.1", "A session survives its connection", "RFC 8881 §2.10.5", group=G)
async def session_survives(h: Harness) -> None:
    """After the session's connection closes, SEQUENCE with the next seqid on a new connection
    works (under SP4_NONE it binds the new connection to the fore channel)."""
    s = await h.session()
    (await s.call([])).expect(OK)
    await s.conn.closed()
    s.conn = await h.connect()
    (await s.call([])).expect(OK)


@check("SS-11.1", "BIND_CONN_TO_SESSION, fore channel", "RFC 8881 §18.34.3", group=G)
async def bind_fore(h: Harness) -> None:
    """BIND_CONN_TO_SESSION alone on a new connection with CDFC4_FORE succeeds with
    bctsr_dir CDFS4_FORE and the session ID echoed; SEQUENCE then works on it."""
    s = await h.session()
    conn = await h.connect()
    args = nfs4.BIND_CONN_TO_SESSION4args(s.sessionid, nfs4.CDFC4_FORE, False)
    r = await conn.compound(_alone(nfs4.OP_BIND_CONN_TO_SESSION, args))
    ok = r.resok(0)
    _expect("bctsr_sessid", s.sessionid, ok.bctsr_sessid)
    _expect("bctsr_dir", nfs4.CDFS4_FORE, ok.bctsr_dir)
    (await s.call([], conn=conn)).expect(OK)


@check("SS-5.1", "BIND_CONN_TO_SESSION, fore or both", "RFC 8881 §18.34.3", group=G)
async def bind_fore_or_both(h: Harness) -> None:
    """BIND_CONN_TO_SESSION with CDFC4_FORE_OR_BOTH succeeds with bctsr_dir CDFS4_FORE or
    CDFS4_BOTH."""
    s = await h.session()
    conn = await h.connect()
    args = nfs4.BIND_CONN_TO_SESSION4args(s.sessionid, nfs4.CDFC4_FORE_OR_BOTH, False)
    r = await conn.compound(_alone(nfs4.OP_BIND_CONN_TO_SESSION, args))
    d = r.resok(0).bctsr_dir
    if d not in (nfs4.CDFS4_FORE, nfs4.CDFS4_BOTH):
        raise Failed("CDFS4_FORE or CDFS4_BOTH", repr(d))


@check("SS-11.2", "BIND_CONN_TO_SESSION, unknown session: BADSESSION", "RFC 8881 §18.34.3", group=G)
async def bind_badsession(h: Harness) -> None:
    """BIND_CONN_TO_SESSION naming a session the server does not know fails with
    NFS4ERR_BADSESSION."""
    conn = await h.connect()
    args = nfs4.BIND_CONN_TO_SESSION4args(os.urandom(16), nfs4.CDFC4_FORE, False)
    r = await conn.compound(_alone(nfs4.OP_BIND_CONN_TO_SESSION, args))
    r.expect(nfs4.NFS4ERR_BADSESSION)


@check("CONF-DS-1", "DESTROY_SESSION, then the session is gone", "RFC 8881 §18.37.3", group=G)
async def destroy_session(h: Harness) -> None:
    """DESTROY_SESSION alone succeeds; a later SEQUENCE on that session fails with
    NFS4ERR_BADSESSION."""
    s = await h.session()
    (await s.call([])).expect(OK)
    r = await s.conn.compound(
        _alone(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(s.sessionid))
    )
    r.expect(OK)
    s.destroyed = True
    (await s.call([])).expect(nfs4.NFS4ERR_BADSESSION)


@check(
    "CONF-DS-2", "DESTROY_SESSION of an unknown session: BADSESSION", "RFC 8881 §18.37.3", group=G
)
async def destroy_unknown(h: Harness) -> None:
    """DESTROY_SESSION naming a session the server does not know fails with
    NFS4ERR_BADSESSION."""
    conn = await h.connect()
    r = await conn.compound(
        _alone(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(os.urandom(16)))
    )
    r.expect(nfs4.NFS4ERR_BADSESSION)


@check("CONF-DC-1", "DESTROY_CLIENTID with a session: CLIENTID_BUSY", "RFC 8881 §18.50.3", group=G)
async def destroy_clientid_busy(h: Harness) -> None:
    """DESTROY_CLIENTID of a client ID that still has a session fails with
    NFS4ERR_CLIENTID_BUSY; after DESTROY_SESSION it succeeds, and the client ID is then
    unknown to CREATE_SESSION (NFS4ERR_STALE_CLIENTID)."""
    s = await h.session()
    dc = _alone(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(s.client.clientid))
    (await s.conn.compound(dc)).expect(nfs4.NFS4ERR_CLIENTID_BUSY, what="with a session")
    await s.destroy()
    (await s.conn.compound(dc)).expect(OK, what="without sessions")
    args = h.create_session_args(s.client)
    (await s.conn.compound(_alone(nfs4.OP_CREATE_SESSION, args))).expect(
        nfs4.NFS4ERR_STALE_CLIENTID, what="CREATE_SESSION after DESTROY_CLIENTID"
    )


@check("SS-30.1", "NFSv4.0-only operations with sessions: NOTSUPP", "RFC 8881 §17", group=G)
async def v40_ops_refused(h: Harness) -> None:
    """In minor version 1, RENEW after SEQUENCE is refused with NFS4ERR_NOTSUPP (SEQUENCE
    renews the lease instead)."""
    s = await h.session()
    r = await s.call([op(nfs4.OP_RENEW, nfs4.RENEW4args(s.client.clientid))])
    r.expect(OK, nfs4.NFS4ERR_NOTSUPP)


@check(
    "CONF-DC-2",
    "DESTROY_CLIENTID of an unknown client ID: STALE_CLIENTID",
    "RFC 8881 §18.50.3",
    group=G,
)
async def destroy_clientid_unknown(h: Harness) -> None:
    """DESTROY_CLIENTID naming a client ID the server never gave out fails with
    NFS4ERR_STALE_CLIENTID."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    bogus = c.clientid ^ 0x5A5A5A5A00000000
    r = await conn.compound(_alone(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(bogus)))
    r.expect(nfs4.NFS4ERR_STALE_CLIENTID)


@check("SS-10.5", "CREATE_SESSION replay on a new connection", "RFC 8881 §18.36.4", group=G)
async def cs_replay_new_connection(h: Harness) -> None:
    """The CREATE_SESSION reply cache is per client ID, not per connection: the same
    CREATE_SESSION sent again on another connection returns the same session."""
    conn = await h.connect()
    c, _ = await h.exchange_id(conn)
    args = h.create_session_args(c)
    a = (await conn.compound(_alone(nfs4.OP_CREATE_SESSION, args))).resok(0)
    h.track(Session(h, conn, c, a.csr_sessionid, a.csr_fore_chan_attrs, a.csr_back_chan_attrs, 0))
    other = await h.connect()
    b = (await other.compound(_alone(nfs4.OP_CREATE_SESSION, args))).resok(0)
    _expect("the same csr_sessionid", a.csr_sessionid, b.csr_sessionid)


@check("SS-30.2", "SEQUENCE renews the lease", "RFC 8881 §8.3, §18.46.3", group=G)
async def lease_renewal(h: Harness) -> None:
    """A client that sends only SEQUENCE, every third of the lease, for one and a half lease
    periods keeps its state: its open stateid still reads the file, and SEQUENCE reports no
    expired or revoked state. Skipped when the lease (fattr4_lease_time) is over 20 s."""
    s = await h.session()
    r = await s.ok([ops.putrootfh(), ops.getattr_((nfs4.FATTR4_LEASE_TIME,))])
    lease = decode_attrs(r.resok(2).obj_attributes).get(nfs4.FATTR4_LEASE_TIME)
    if not isinstance(lease, int) or lease <= 0:
        raise Failed("a positive fattr4_lease_time", repr(lease))
    if lease > 20:
        raise Skipped(f"the lease is {lease} s; this check needs one of at most 20 s")
    from nfsrdma.conform.checks_rfc8881_ops import _create

    _, fh, stateid = await _create(h, s, b"kept")
    loop = asyncio.get_running_loop()
    end = loop.time() + lease * 1.5
    bad = nfs4.SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED | nfs4.SEQ4_STATUS_ADMIN_STATE_REVOKED
    bad |= nfs4.SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED
    while loop.time() < end:
        await asyncio.sleep(lease / 3)
        flags = (await s.ok([])).resok(0).sr_status_flags
        if flags & bad:
            raise Failed("no state revoked while SEQUENCE renews", f"sr_status_flags {flags:#x}")
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, 10)])).resok(2)
    if bytes(res.data) != b"kept":
        raise Failed("the file's data", repr(bytes(res.data)))
