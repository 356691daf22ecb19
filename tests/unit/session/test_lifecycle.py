"""Leases and reaping (8.3, SS-33), BIND_CONN_TO_SESSION (18.34, SS-5, SS-11, UL-39),
DESTROY_SESSION (18.37), DESTROY_CLIENTID (18.50), RECLAIM_COMPLETE (18.51),
BACKCHANNEL_CTL (18.33), connection loss (SS-2)."""

from __future__ import annotations

import pytest

from nfsrdma.session.errors import SessionError
from nfsrdma.session.server import ServerSessions
from nfsrdma.xdr.gen import nfs4

from .helpers import PRINCIPAL, Conn, Reply, cs, eid, make_sessions, new_session, seq

A = Conn("a")
B = Conn("b")


def raises(fn: object, *args: object, **kw: object) -> int:
    with pytest.raises(SessionError) as e:
        fn(*args, **kw)  # type: ignore[operator]
    return e.value.status


def bind(
    s: ServerSessions,
    sessionid: bytes,
    conn: Conn,
    d: nfs4.channel_dir_from_client4,
    rdma: bool = False,
) -> nfs4.BIND_CONN_TO_SESSION4resok:
    return s.bind_conn_to_session(
        nfs4.BIND_CONN_TO_SESSION4args(sessionid, d, rdma), conn=conn, now=1
    )


# -- leases ------------------------------------------------------------------------------
def test_lease_expiry_reaps_the_client_and_drops_its_state() -> None:
    expired: list[int] = []
    s = make_sessions(lease_time=10, lease_slack=2, on_client_expired=expired.append)
    session = new_session(s, A, now=0)
    assert s.reap(11.9) == [] and expired == []
    assert s.reap(12.1) == [session.clientid]
    assert expired == [session.clientid]
    assert s.session(session.sessionid) is None and s.client(session.clientid) is None
    assert session.destroyed
    with pytest.raises(SessionError) as e:
        s.sequence(seq(session.sessionid, 1), conn=A, now=13, op_count=1, request_size=100)
    assert e.value.status == nfs4.NFS4ERR_BADSESSION
    assert s.drc_reserved == 0


def test_a_client_with_a_request_executing_is_not_reaped() -> None:
    s = make_sessions(lease_time=10, lease_slack=0)
    session = new_session(s, A, now=0)
    r = s.sequence(seq(session.sessionid, 1), conn=A, now=1, op_count=1, request_size=100)
    assert s.reap(100) == []
    s.finish(r, None, now=100)
    assert s.reap(105) == []
    assert s.reap(111) == [session.clientid]


def test_a_client_holding_state_is_courteous_instead_of_reaped() -> None:
    """Courteous expiry in the session layer alone (issue 11 section 3): with state, a lapsed
    client is kept; it is courteous from the end of its lease by the latest clock seen; a
    SEQUENCE makes it active again; ``expire_courteous`` refuses an active client and expires
    a courteous one (its state through ``on_client_expired``)."""
    expired: list[int] = []
    holding: set[int] = set()
    s = make_sessions(
        lease_time=10,
        lease_slack=2,
        on_client_expired=expired.append,
        has_state=holding.__contains__,
    )
    a = new_session(s, A, owner=b"a", now=0)
    b = new_session(s, B, owner=b"b", now=0)
    holding.add(a.clientid)
    assert not s.courteous(a.clientid)
    r = s.sequence(seq(b.sessionid, 1), conn=B, now=10.5, op_count=1, request_size=100)
    assert s.courteous(a.clientid)  # by B's clock: A's lease ran out, nothing reaped yet
    assert not s.courteous(b.clientid)  # B holds nothing
    s.finish(r, None, now=10.5)
    assert s.reap(100) == [b.clientid]  # B without state goes; A stays, courteous
    assert s.courteous(a.clientid) and expired == [b.clientid]
    r = s.sequence(seq(a.sessionid, 1), conn=A, now=101, op_count=1, request_size=100)
    s.finish(r, None, now=101)
    assert not s.courteous(a.clientid)
    assert not s.expire_courteous(a.clientid) and s.client(a.clientid) is not None
    assert s.reap(112) == [] and s.courteous(a.clientid)
    assert s.expire_courteous(a.clientid)
    assert expired == [b.clientid, a.clientid] and s.client(a.clientid) is None
    assert (
        raises(s.sequence, seq(a.sessionid, 2), conn=A, now=113, op_count=1, request_size=100)
        == nfs4.NFS4ERR_BADSESSION
    )


def test_unconfirmed_records_reaped_after_a_lease_without_callbacks() -> None:
    expired: list[int] = []
    s = make_sessions(lease_time=10, on_client_expired=expired.append)
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    s.reap(9)
    assert s.client(r.eir_clientid) is not None
    s.reap(10.5)
    assert s.client(r.eir_clientid) is None and expired == []


def test_exchange_id_case2_renews_the_lease() -> None:
    s = make_sessions(lease_time=10, lease_slack=0)
    new_session(s, A, now=0)
    s.exchange_id(eid(), principal=PRINCIPAL, now=8)
    assert s.reap(15) == []


# -- BIND_CONN_TO_SESSION ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("d", "expect", "fore", "back"),
    [
        (nfs4.CDFC4_FORE, nfs4.CDFS4_FORE, True, False),
        (nfs4.CDFC4_BACK, nfs4.CDFS4_BACK, False, True),
        (nfs4.CDFC4_FORE_OR_BOTH, nfs4.CDFS4_BOTH, True, True),
        (nfs4.CDFC4_BACK_OR_BOTH, nfs4.CDFS4_BOTH, True, True),
    ],
)
def test_ss5_bind_each_direction(
    d: nfs4.channel_dir_from_client4, expect: nfs4.channel_dir_from_server4, fore: bool, back: bool
) -> None:
    s = make_sessions()
    session = new_session(s, A, flags=0)
    ok = bind(s, session.sessionid, B, d)
    assert ok == nfs4.BIND_CONN_TO_SESSION4resok(session.sessionid, expect, False)
    assert (B in session.fore_connections) == fore
    assert (B in session.back_connections) == back
    assert session.wants_back_channel == back


def test_ul39_use_conn_in_rdma_mode_answered_false() -> None:
    s = make_sessions()
    session = new_session(s, A)
    ok = bind(s, session.sessionid, B, nfs4.CDFC4_BACK_OR_BOTH, rdma=True)
    assert ok.bctsr_use_conn_in_rdma_mode is False


def test_rebinding_same_channels_is_ok_and_narrowing_is_inval() -> None:
    s = make_sessions()
    session = new_session(s, A)  # A: fore and back
    assert bind(s, session.sessionid, A, nfs4.CDFC4_FORE_OR_BOTH).bctsr_dir == nfs4.CDFS4_BOTH
    assert raises(bind, s, session.sessionid, A, nfs4.CDFC4_FORE) == nfs4.NFS4ERR_INVAL
    assert raises(bind, s, session.sessionid, A, nfs4.CDFC4_BACK) == nfs4.NFS4ERR_INVAL
    assert session.connections[A] == 3


def test_linux_reconnect_path_back_or_both_on_a_fore_connection() -> None:
    """UL-39 / SS-13: after a reconnect the Linux client binds the new connection with
    CDFC4_BACK_OR_BOTH (possibly after a SEQUENCE already bound it to the fore channel)."""
    s = make_sessions()
    session = new_session(s, A)
    s.connection_closed(A)
    assert s.callback_path(session.clientid) is None
    r = s.sequence(seq(session.sessionid, 1), conn=B, now=1, op_count=1, request_size=100)
    s.finish(r, None, 1)
    ok = bind(s, session.sessionid, B, nfs4.CDFC4_BACK_OR_BOTH)
    assert ok.bctsr_dir == nfs4.CDFS4_BOTH
    assert s.callback_path(session.clientid) == (session, B)


def test_bind_unknown_session() -> None:
    s = make_sessions()
    assert raises(bind, s, b"z" * 16, A, nfs4.CDFC4_FORE) == nfs4.NFS4ERR_BADSESSION


def test_ss2_session_survives_its_connections() -> None:
    s = make_sessions()
    session = new_session(s, A)
    r = s.sequence(seq(session.sessionid, 1), conn=A, now=1, op_count=1, request_size=100)
    s.connection_closed(A)
    assert session.connections == {}
    s.finish(r, Reply(42), now=2)  # the reply is cached though the connection went away
    again = s.sequence(seq(session.sessionid, 1), conn=B, now=3, op_count=1, request_size=100)
    assert again.replay == Reply(42)


def test_callback_path_prefers_the_newest_back_connection() -> None:
    s = make_sessions()
    session = new_session(s, A)
    bind(s, session.sessionid, B, nfs4.CDFC4_BACK)
    assert s.callback_path(session.clientid) == (session, B)
    s.connection_closed(B)
    assert s.callback_path(session.clientid) == (session, A)


# -- DESTROY_SESSION ---------------------------------------------------------------------
def test_destroy_session_sessionless() -> None:
    s = make_sessions()
    session = new_session(s, A)
    assert (
        raises(s.destroy_session, session.sessionid, conn=B, current=None, last_op=True)
        == nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION
    )
    s.destroy_session(session.sessionid, conn=A, current=None, last_op=True)
    assert s.session(session.sessionid) is None and session.destroyed
    assert session.client.sessions == {}
    assert (
        raises(s.destroy_session, session.sessionid, conn=A, current=None, last_op=True)
        == nfs4.NFS4ERR_BADSESSION
    )


def test_destroy_own_session_must_be_last_and_finish_is_harmless() -> None:
    s = make_sessions()
    session = new_session(s, A)
    r = s.sequence(seq(session.sessionid, 1), conn=A, now=1, op_count=3, request_size=100)
    assert (
        raises(s.destroy_session, session.sessionid, conn=A, current=session, last_op=False)
        == nfs4.NFS4ERR_NOT_ONLY_OP
    )
    s.destroy_session(session.sessionid, conn=A, current=session, last_op=True)
    s.finish(r, Reply(10), now=2)
    assert s.cached_bytes == 0


def test_destroy_session_with_other_requests_executing_is_delay() -> None:
    s = make_sessions()
    session = new_session(s, A)
    other = new_session(s, A, owner=b"client-b")
    busy = s.sequence(seq(session.sessionid, 1, slot=1), conn=A, now=1, op_count=1, request_size=9)
    mine = s.sequence(seq(other.sessionid, 1), conn=A, now=1, op_count=2, request_size=9)
    assert (
        raises(s.destroy_session, session.sessionid, conn=A, current=other, last_op=True)
        == nfs4.NFS4ERR_DELAY
    )
    s.finish(busy, None, 2)
    s.destroy_session(session.sessionid, conn=A, current=other, last_op=False)
    s.finish(mine, None, 2)


def test_destroy_session_with_callbacks_outstanding() -> None:
    s = make_sessions()
    session = new_session(s, A)
    args = session.backchannel.acquire()
    assert args is not None
    assert (
        raises(s.destroy_session, session.sessionid, conn=A, current=None, last_op=True)
        == nfs4.NFS4ERR_BACK_CHAN_BUSY
    )
    bind(s, session.sessionid, B, nfs4.CDFC4_FORE)
    s.connection_closed(A)
    assert (
        raises(s.destroy_session, session.sessionid, conn=B, current=None, last_op=True)
        == nfs4.NFS4ERR_CB_PATH_DOWN
    )
    session.backchannel.release(args.csa_slotid, None)
    s.destroy_session(session.sessionid, conn=B, current=None, last_op=True)


# -- DESTROY_CLIENTID --------------------------------------------------------------------
def test_destroy_clientid() -> None:
    expired: list[int] = []
    s = make_sessions(on_client_expired=expired.append)
    session = new_session(s, A)
    clientid = session.clientid
    assert raises(s.destroy_clientid, clientid, current=None, now=1) == nfs4.NFS4ERR_CLIENTID_BUSY
    s.destroy_session(session.sessionid, conn=A, current=None, last_op=True)
    s.destroy_clientid(clientid, current=None, now=1)
    assert s.client(clientid) is None and expired == [clientid]
    assert raises(s.destroy_clientid, clientid, current=None, now=1) == nfs4.NFS4ERR_STALE_CLIENTID


def test_destroy_clientid_from_its_own_session_is_busy() -> None:
    s = make_sessions()
    session = new_session(s, A)
    status = raises(s.destroy_clientid, session.clientid, current=session, now=1)
    assert status == nfs4.NFS4ERR_CLIENTID_BUSY


def test_destroy_clientid_while_state_is_held() -> None:
    holding = {0}
    s = make_sessions(lease_time=10, has_state=lambda c: c in holding)
    session = new_session(s, A)
    holding.add(session.clientid)
    s.destroy_session(session.sessionid, conn=A, current=None, last_op=True)
    status = raises(s.destroy_clientid, session.clientid, current=None, now=1)
    assert status == nfs4.NFS4ERR_CLIENTID_BUSY
    s.destroy_clientid(session.clientid, current=None, now=11)  # lease expired: allowed


def test_destroy_unconfirmed_clientid() -> None:
    expired: list[int] = []
    s = make_sessions(on_client_expired=expired.append)
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    s.destroy_clientid(r.eir_clientid, current=None, now=0)
    assert s.client(r.eir_clientid) is None and expired == []


# -- RECLAIM_COMPLETE, BACKCHANNEL_CTL ----------------------------------------------------
def test_reclaim_complete_once_per_client() -> None:
    s = make_sessions()
    session = new_session(s, A)
    assert not s.reclaim_done(session.clientid)
    s.reclaim_complete(session.clientid)
    assert s.reclaim_done(session.clientid)
    assert raises(s.reclaim_complete, session.clientid) == nfs4.NFS4ERR_COMPLETE_ALREADY
    # A new incarnation starts over.
    r = s.exchange_id(eid(verifier=b"rebooted"), principal=PRINCIPAL, now=1)
    s.create_session(cs(r.eir_clientid, 1), conn=B, principal=PRINCIPAL, now=1)
    s.reclaim_complete(r.eir_clientid)


def test_backchannel_ctl() -> None:
    s = make_sessions()
    session = new_session(s, A)
    sys_ = nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "h", 0, 0, []))
    s.backchannel_ctl(session, 0x40000123, [sys_])
    assert session.cb_program == 0x40000123 and session.cb_security == sys_
    gss = nfs4.callback_sec_parms4(6, nfs4.gss_cb_handles4(nfs4.rpc_gss_svc_t(1), b"s", b"c"))
    assert raises(s.backchannel_ctl, session, 1, [gss]) == nfs4.NFS4ERR_ENCR_ALG_UNSUPP
    assert session.cb_program == 0x40000123
