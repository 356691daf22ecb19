"""Courteous expiry (issue 11 section 3; RFC 8881 sections 8.3, 18.46.3; knfsd >= 5.19).

A client whose lease ran out keeps its opens and locks until another client's request conflicts
with them: then it is expired on the spot and the request succeeds at once. Coming back without
a conflict, it carries on with its state intact; coming back after one, its client ID is expired
(NFS4ERR_BADSESSION on its session, NFS4ERR_STALE_CLIENTID for its client ID). Courtesy ends after
``courtesy_time``, beyond ``max_courteous_clients``, and when room is needed for a new client.

Two clients are two client IDs with their own sessions on one server, through the real COMPOUND
path; the clock is stopped and moved by the tests (no sleeps).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nfsrdma.session.server import SessionCaps
from nfsrdma.xdr.gen import nfs4

from ..session.helpers import op, op_create_session, op_exchange_id, resok
from .test_io_ops import BOTH, DENY_NONE, DENY_WRITE, MAX, NOCREATE, READ, WRITE, open_op
from .wire import LEASE, Client, Clock, build, close, install_clock, name_of

OK = nfs4.NFS4_OK
ROOT = op(nfs4.OP_PUTROOTFH)
GETFH = op(nfs4.OP_GETFH)
SLACK = LEASE / 2  # ServerSessions' default lease_slack


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return install_clock(monkeypatch)


def putfh(fh: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh))


def lock_new(
    open_sid: nfs4.stateid4, owner: bytes, offset: int = 0, length: int = MAX
) -> nfs4.nfs_argop4:
    locker = nfs4.locker4(
        True, nfs4.open_to_lock_owner4(0, open_sid, 0, nfs4.state_owner4(0, owner))
    )
    return op(nfs4.OP_LOCK, nfs4.LOCK4args(nfs4.WRITE_LT, False, offset, length, locker))


def lockt(owner: bytes, offset: int = 0, length: int = MAX) -> nfs4.nfs_argop4:
    return op(
        nfs4.OP_LOCKT,
        nfs4.LOCKT4args(nfs4.WRITE_LT, offset, length, nfs4.state_owner4(0, owner)),
    )


def read(sid: nfs4.stateid4, count: int = 16) -> nfs4.nfs_argop4:
    return op(nfs4.OP_READ, nfs4.READ4args(sid, 0, count))


async def open_file(
    c: Client,
    name: bytes,
    access: int = BOTH,
    deny: int = DENY_NONE,
    how: nfs4.openflag4 | None = None,
) -> tuple[bytes, nfs4.stateid4]:
    """OPEN (creating by default) ``name`` in the root: its filehandle and open stateid."""
    res = await c.expect(OK, ROOT, open_op(name, access, deny, how), GETFH)
    return c.value(res, 3).object, c.value(res, 2).stateid


async def test_open_refused_only_by_a_courteous_client_succeeds_at_once(
    tmp_path: Path, clock: Clock
) -> None:
    """The issue's example: A opens with DENY_WRITE and its lease runs out; B's OPEN for
    writing succeeds (it used to get NFS4ERR_SHARE_DENIED), with no reaper run between."""
    srv = build(tmp_path)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        fh, sa = await open_file(a, b"f", BOTH, DENY_WRITE)
        await a.expect(OK, putfh(fh), lock_new(sa, b"pa"))
        # Still within A's lease: refused, and A keeps everything.
        clock.now += LEASE - 1
        await b.expect(nfs4.NFS4ERR_SHARE_DENIED, ROOT, open_op(b"f", WRITE, how=NOCREATE))
        clock.now += 2  # A's lease has run out: A is courteous
        res = await b.expect(OK, ROOT, open_op(b"f", WRITE, DENY_WRITE, how=NOCREATE))
        sb = b.value(res, 2).stateid
        # A's lock went with it: B may lock the whole file.
        await b.expect(OK, putfh(fh), lock_new(sb, b"pb"))
        assert not srv.state.state_manager.client_has_state(a.clientid)
        assert srv.sessions.client(a.clientid) is None
        # A comes back: its client ID is expired (RFC 8881 section 8.3).
        await a.expect(nfs4.NFS4ERR_BADSESSION, ROOT)
        res = await a.bare(op_create_session(a.clientid, 2))
        assert name_of(res.status) == "NFS4ERR_STALE_CLIENTID"
        res = await a.bare(op(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(a.clientid)))
        assert name_of(res.status) == "NFS4ERR_STALE_CLIENTID"
        # ... and recovers as after any lease loss: a new client ID for the same owner.
        res = await a.bare(op_exchange_id(b"client-a"))
        assert res.status == OK and resok(res, 0).eir_clientid != a.clientid
        assert not resok(res, 0).eir_flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R
    finally:
        close(srv)


async def test_a_courteous_client_that_comes_back_keeps_its_state(
    tmp_path: Path, clock: Clock
) -> None:
    """No conflict meanwhile: the reaper leaves A (holding state) courteous, however long
    past its lease; A's next SEQUENCE renews it and its open and lock are intact."""
    srv = build(tmp_path)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        fh, sa = await open_file(a, b"g", BOTH, DENY_WRITE)
        await a.expect(
            OK, putfh(fh), op(nfs4.OP_WRITE, nfs4.WRITE4args(sa, 0, nfs4.UNSTABLE4, b"kept"))
        )
        res = await a.expect(OK, putfh(fh), lock_new(sa, b"pa", 0, 10))
        la = a.value(res, 2).lock_stateid
        for _ in range(10):  # the reaper runs, B stays active, A does not renew
            clock.now += LEASE
            await b.expect(OK, ROOT)
            assert srv.sessions.reap(clock.now) == []
        assert srv.sessions.courteous(a.clientid)
        assert not srv.sessions.courteous(b.clientid)
        res = await a.expect(OK, putfh(fh), read(sa))
        assert bytes(a.value(res, 2).data) == b"kept"
        assert not srv.sessions.courteous(a.clientid)  # renewed: active again
        # Its state still refuses B: a lock through LOCKT, its deny through OPEN.
        res = await b.expect(nfs4.NFS4ERR_DENIED, putfh(fh), lockt(b"pb", 5, 1))
        assert b.value(res, 2).owner.clientid == a.clientid
        await b.expect(nfs4.NFS4ERR_SHARE_DENIED, ROOT, open_op(b"g", WRITE, how=NOCREATE))
        await a.expect(
            OK, putfh(fh), op(nfs4.OP_LOCKU, nfs4.LOCKU4args(nfs4.WRITE_LT, 0, la, 0, 10))
        )
        await a.expect(OK, putfh(fh), op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sa)))
    finally:
        close(srv)


async def test_lock_and_lockt_refused_only_by_a_courteous_client(
    tmp_path: Path, clock: Clock
) -> None:
    """A byte-range lock of a courteous client gives way to LOCKT and LOCK of another."""
    srv = build(tmp_path)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        fh, sa = await open_file(a, b"h")
        await a.expect(OK, putfh(fh), lock_new(sa, b"pa", 0, 100))
        _, sb = await open_file(b, b"h", how=NOCREATE)
        await b.expect(nfs4.NFS4ERR_DENIED, putfh(fh), lock_new(sb, b"pb", 50, 10))
        clock.now += LEASE + 1
        await b.expect(OK, putfh(fh), lockt(b"pb", 50, 10))
        assert srv.sessions.client(a.clientid) is None
        await b.expect(OK, putfh(fh), lock_new(sb, b"pb", 50, 10))
    finally:
        close(srv)


async def test_an_active_client_in_the_way_protects_the_courteous_one(
    tmp_path: Path, clock: Clock
) -> None:
    """A (courteous) and C (active) both deny writers: B is refused and A loses nothing;
    once C has closed, A alone is in the way and gives way."""
    srv = build(tmp_path)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        c = await Client(srv, b"client-c").mount()
        fh, _ = await open_file(a, b"k", READ, DENY_WRITE)
        _, sc = await open_file(c, b"k", READ, DENY_WRITE, how=NOCREATE)
        clock.now += LEASE + 1
        await c.expect(OK, ROOT)  # C renews
        await b.expect(nfs4.NFS4ERR_SHARE_DENIED, ROOT, open_op(b"k", WRITE, how=NOCREATE))
        assert srv.sessions.courteous(a.clientid)
        assert srv.state.state_manager.client_has_state(a.clientid)
        await c.expect(OK, putfh(fh), op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sc)))
        await b.expect(OK, ROOT, open_op(b"k", WRITE, how=NOCREATE))
        assert srv.sessions.client(a.clientid) is None
    finally:
        close(srv)


async def test_courtesy_ends_after_courtesy_time(tmp_path: Path, clock: Clock) -> None:
    srv = build(tmp_path, caps=SessionCaps(courtesy_time=3600))
    try:
        a = await Client(srv, b"client-a").mount()
        await open_file(a, b"t")
        clock.now += LEASE + SLACK + 1
        assert srv.sessions.reap(clock.now) == []  # courteous, not expired
        clock.now += 3600 - SLACK - 1
        assert srv.sessions.reap(clock.now) == []
        clock.now += 1
        assert srv.sessions.reap(clock.now) == [a.clientid]
        assert not srv.state.state_manager.client_has_state(a.clientid)
        await a.expect(nfs4.NFS4ERR_BADSESSION, ROOT)
    finally:
        close(srv)


async def test_courteous_clients_are_capped_longest_expired_first(
    tmp_path: Path, clock: Clock
) -> None:
    srv = build(tmp_path, caps=SessionCaps(max_courteous_clients=1))
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        await open_file(a, b"a")
        clock.now += 5
        await open_file(b, b"b")  # B renewed later than A
        clock.now += LEASE + SLACK + 1
        assert srv.sessions.reap(clock.now) == [a.clientid]
        assert srv.sessions.courteous(b.clientid)
        await b.expect(OK, ROOT)
        assert srv.state.state_manager.client_has_state(b.clientid)
    finally:
        close(srv)


async def test_a_courteous_client_makes_room_for_a_new_one(tmp_path: Path, clock: Clock) -> None:
    """At the client-record cap (per source and server-wide) a new client gets in by evicting
    a courteous one, not by waiting (it used to get NFS4ERR_DELAY); with only active clients
    it still waits."""
    srv = build(tmp_path, caps=SessionCaps(max_clients=2))
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        await open_file(a, b"x")
        new = Client(srv, b"client-new")
        res = await new.bare(op_exchange_id(b"client-new"))
        assert name_of(res.status) == "NFS4ERR_DELAY"
        clock.now += LEASE + 1
        await b.expect(OK, ROOT)
        await new.mount()
        assert srv.sessions.client(a.clientid) is None
        assert not srv.state.state_manager.client_has_state(a.clientid)
    finally:
        close(srv)
    srv = build(tmp_path / "per-source", caps=SessionCaps(max_clients_per_source=2))
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        await open_file(a, b"x")
        new = Client(srv, b"client-new")
        res = await new.bare(op_exchange_id(b"client-new"))
        assert name_of(res.status) == "NFS4ERR_DELAY"
        clock.now += LEASE + 1
        await new.mount()
        assert srv.sessions.client(a.clientid) is None
    finally:
        close(srv)


async def test_special_stateid_io_refused_only_by_a_courteous_deny(
    tmp_path: Path, clock: Clock
) -> None:
    """READ with the anonymous stateid, refused by another client's share deny
    (NFS4ERR_LOCKED), goes ahead once that client is courteous."""
    srv = build(tmp_path)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        fh, sa = await open_file(a, b"s", BOTH, nfs4.OPEN4_SHARE_DENY_BOTH)
        await a.expect(
            OK, putfh(fh), op(nfs4.OP_WRITE, nfs4.WRITE4args(sa, 0, nfs4.UNSTABLE4, b"secret"))
        )
        anonymous = nfs4.stateid4(0, bytes(12))
        await b.expect(nfs4.NFS4ERR_LOCKED, putfh(fh), read(anonymous))
        clock.now += LEASE + 1
        res = await b.expect(OK, putfh(fh), read(anonymous))
        assert bytes(b.value(res, 2).data) == b"secret"
        assert srv.sessions.client(a.clientid) is None
    finally:
        close(srv)
