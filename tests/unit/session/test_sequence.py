"""SEQUENCE through ServerSessions: every rule of RFC 8881 2.10.6.1 and 18.46 (SS-6, SS-7,
SS-9, SS-12, SS-26, SS-27), and the reply cache as COMPOUND processing drives it."""

from __future__ import annotations

import pytest

from nfsrdma.session.errors import SessionError
from nfsrdma.session.server import SequenceResult, ServerSessions, SessionCaps
from nfsrdma.xdr.gen import nfs4

from .helpers import PRINCIPAL, Conn, Reply, attrs, cs, eid, make_sessions, new_session, seq

A = Conn("a")
B = Conn("b")


def start(
    s: ServerSessions,
    args: nfs4.SEQUENCE4args,
    conn: Conn = A,
    now: float = 1.0,
    op_count: int = 2,
    request_size: int = 200,
) -> SequenceResult:
    return s.sequence(args, conn=conn, now=now, op_count=op_count, request_size=request_size)


def fails(s: ServerSessions, args: nfs4.SEQUENCE4args, **kw: object) -> int:
    with pytest.raises(SessionError) as e:
        start(s, args, **kw)  # type: ignore[arg-type]
    return e.value.status


def test_new_request_result() -> None:
    s = make_sessions(slots=8)
    session = new_session(s, A)
    r = start(s, seq(session.sessionid, 1, slot=3, highest=5))
    assert r.session is session and r.replay is None and not r.uncached_retry
    assert r.cachethis
    assert r.resok == nfs4.SEQUENCE4resok(session.sessionid, 1, 3, 7, 7, 0)
    assert session.slots.slots[3].busy


def test_bad_session() -> None:
    s = make_sessions()
    new_session(s, A)
    assert fails(s, seq(b"x" * 16, 1)) == nfs4.NFS4ERR_BADSESSION


def test_badslot_and_misordered_hold_no_slot() -> None:
    s = make_sessions(slots=4)
    session = new_session(s, A)
    assert fails(s, seq(session.sessionid, 1, slot=4)) == nfs4.NFS4ERR_BADSLOT
    assert fails(s, seq(session.sessionid, 2)) == nfs4.NFS4ERR_SEQ_MISORDERED
    assert session.slots.busy == 0


def test_ss27_too_many_ops_and_request_too_big() -> None:
    s = make_sessions()
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    ok = s.create_session(
        cs(r.eir_clientid, r.eir_sequenceid, fore=attrs(req=4096, ops=4)),
        conn=A,
        principal=PRINCIPAL,
        now=0,
    )
    sid = ok.csr_sessionid
    assert fails(s, seq(sid, 1), op_count=5) == nfs4.NFS4ERR_TOO_MANY_OPS
    assert fails(s, seq(sid, 1), request_size=4097) == nfs4.NFS4ERR_REQ_TOO_BIG
    start(s, seq(sid, 1), op_count=4, request_size=4096)


def test_ss7_replay_of_a_cached_reply() -> None:
    s = make_sessions()
    session = new_session(s, A)
    r = start(s, seq(session.sessionid, 1))
    reply = Reply(300, "the original reply")
    s.finish(r, reply, now=2)
    retry = start(s, seq(session.sessionid, 1), conn=B, now=3)
    assert retry.replay is reply
    assert not retry.uncached_retry
    s.finish(retry, None, now=3)  # compound.py does not call it for replays; harmless
    assert session.slots.slots[0].reply is reply
    assert session.slots.cached_bytes == 300


def test_ss7_retry_of_uncached_reply() -> None:
    s = make_sessions()
    session = new_session(s, A)
    r = start(s, seq(session.sessionid, 1, cachethis=False))
    assert not r.cachethis
    s.finish(r, Reply(10), now=2)  # not asked to cache: not kept
    retry = start(s, seq(session.sessionid, 1))
    assert retry.uncached_retry and retry.replay is None and not retry.cachethis
    s.finish(retry, None, now=3)
    # The slot moves on normally afterwards.
    nxt = start(s, seq(session.sessionid, 2))
    assert nxt.replay is None and not nxt.uncached_retry


def test_ss6_delay_while_the_original_executes() -> None:
    s = make_sessions()
    session = new_session(s, A)
    r = start(s, seq(session.sessionid, 1))
    assert fails(s, seq(session.sessionid, 1)) == nfs4.NFS4ERR_DELAY
    assert fails(s, seq(session.sessionid, 2)) == nfs4.NFS4ERR_SEQ_MISORDERED
    s.finish(r, Reply(5), now=2)
    assert start(s, seq(session.sessionid, 1)).replay == Reply(5)


def test_reply_too_big_to_cache_is_not_stored() -> None:
    s = make_sessions(max_response_size_cached=1000)
    session = new_session(s, A)
    r = start(s, seq(session.sessionid, 1))
    s.finish(r, Reply(1001), now=2)
    assert start(s, seq(session.sessionid, 1)).uncached_retry
    assert session.slots.cached_bytes == 0


def test_ss7_cache_memory_bound_under_load() -> None:
    s = make_sessions(slots=8, max_response_size_cached=2048)
    session = new_session(s, A)
    bound = session.fore.ca_maxrequests * session.fore.ca_maxresponsesize_cached
    for i in range(1, 200):
        for slot in range(8):
            r = start(s, seq(session.sessionid, i, slot=slot, highest=7))
            s.finish(r, Reply(1500 + (i * 37 + slot) % 1000), now=2)
            assert s.cached_bytes <= bound


def test_ss12_sequence_binds_a_new_connection_to_the_fore_channel() -> None:
    s = make_sessions()
    session = new_session(s, A, flags=0)
    assert session.fore_connections == [A]
    r = start(s, seq(session.sessionid, 1), conn=B)
    s.finish(r, None, 2)
    assert set(session.fore_connections) == {A, B}
    assert session.back_connections == []


def test_connection_cap_gives_conn_not_bound() -> None:
    s = make_sessions(caps=SessionCaps(max_connections_per_session=2))
    session = new_session(s, A)
    s.finish(start(s, seq(session.sessionid, 1), conn=B), None, 2)
    status = fails(s, seq(session.sessionid, 2), conn=Conn("third"))
    assert status == nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION
    s.connection_closed(B)
    start(s, seq(session.sessionid, 2), conn=Conn("third"))


def test_ss26_cb_path_down_when_the_back_channel_connection_is_gone() -> None:
    s = make_sessions()
    session = new_session(s, A)  # CONN_BACK_CHAN on A
    r = start(s, seq(session.sessionid, 1))
    assert r.resok.sr_status_flags == 0
    s.finish(r, None, 2)
    s.connection_closed(A)
    r = start(s, seq(session.sessionid, 2), conn=B)  # B: fore only
    flags = r.resok.sr_status_flags
    assert flags & nfs4.SEQ4_STATUS_CB_PATH_DOWN
    assert flags & nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
    s.finish(r, None, 3)
    s.bind_conn_to_session(
        nfs4.BIND_CONN_TO_SESSION4args(session.sessionid, nfs4.CDFC4_BACK_OR_BOTH, False),
        conn=B,
        now=3,
    )
    assert start(s, seq(session.sessionid, 3), conn=B).resok.sr_status_flags == 0


def test_no_cb_path_down_when_no_back_channel_was_asked_for() -> None:
    s = make_sessions()
    session = new_session(s, A, flags=0)
    assert start(s, seq(session.sessionid, 1)).resok.sr_status_flags == 0


def test_backchannel_fault_reported_until_rebound() -> None:
    s = make_sessions()
    session = new_session(s, A)
    assert s.callback_path(session.clientid) == (session, A)
    s.backchannel_failed(session)
    assert s.callback_path(session.clientid) is None
    r = start(s, seq(session.sessionid, 1))
    assert r.resok.sr_status_flags & nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
    s.finish(r, None, 2)
    s.bind_conn_to_session(
        nfs4.BIND_CONN_TO_SESSION4args(session.sessionid, nfs4.CDFC4_FORE_OR_BOTH, False),
        conn=A,
        now=2,
    )
    assert start(s, seq(session.sessionid, 2)).resok.sr_status_flags == 0


def test_path_down_is_per_client_across_sessions() -> None:
    s = make_sessions()
    one = new_session(s, A)
    r = s.create_session(
        cs(one.clientid, 2), conn=B, principal=PRINCIPAL, now=0
    )  # no back channel asked for
    two = s.session(r.csr_sessionid)
    assert two is not None
    s.connection_closed(A)
    flags = start(s, seq(two.sessionid, 1), conn=B).resok.sr_status_flags
    assert flags == nfs4.SEQ4_STATUS_CB_PATH_DOWN  # the client has no back channel left


def test_state_layer_status_flags() -> None:
    s = make_sessions()
    session = new_session(s, A, flags=0)
    s.set_status_flags(session.clientid, nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED)
    r = start(s, seq(session.sessionid, 1))
    assert r.resok.sr_status_flags == nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED
    s.finish(r, None, 2)
    s.set_status_flags(session.clientid, nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED, on=False)
    assert start(s, seq(session.sessionid, 2)).resok.sr_status_flags == 0


def test_ss9_target_highest_slotid_reported() -> None:
    s = make_sessions(slots=64, max_response_size_cached=100)
    r0 = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    ok = s.create_session(
        cs(r0.eir_clientid, 1, fore=attrs(reqs=64, cached=100)), conn=A, principal=PRINCIPAL, now=0
    )
    session = s.session(ok.csr_sessionid)
    assert session is not None
    for slot in range(64):
        s.finish(start(s, seq(session.sessionid, 1, slot=slot, highest=63)), Reply(100), 2)
    session.slots.set_target(7)
    r = start(s, seq(session.sessionid, 2, slot=0, highest=63))
    assert (r.resok.sr_highest_slotid, r.resok.sr_target_highest_slotid) == (63, 7)
    s.finish(r, Reply(100), 2)
    assert session.slots.cached_bytes == 6400
    s.finish(start(s, seq(session.sessionid, 3, slot=0, highest=7)), Reply(100), 2)
    assert session.slots.cached_bytes == 800


def test_sequence_renews_the_lease() -> None:
    s = make_sessions(lease_time=10)
    session = new_session(s, A, now=0)
    s.finish(start(s, seq(session.sessionid, 1), now=9), None, now=9.5)
    assert session.client.last_renewed == 9.5
    assert s.reap(19) == []
    assert s.session(session.sessionid) is session
