"""EXCHANGE_ID: the case table of RFC 8881 section 18.35.5, flags, state protection, server
identity, and the caps on client records (SEC-12, SS-33)."""

from __future__ import annotations

import pytest

from nfsrdma.session.errors import SessionError
from nfsrdma.session.server import ServerSessions, SessionCaps
from nfsrdma.xdr.gen import nfs4

from .helpers import OTHER_PRINCIPAL, PRINCIPAL, Conn, cs, eid, make_sessions

CONFIRMED_R = nfs4.EXCHGID4_FLAG_CONFIRMED_R
UPDATE = nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A


CONN = Conn("c")


def fails(fn: object, *args: object, **kw: object) -> int:
    with pytest.raises(SessionError) as e:
        fn(*args, **kw)  # type: ignore[operator]
    return e.value.status


def confirm(s: ServerSessions, r: nfs4.EXCHANGE_ID4resok, principal: object = PRINCIPAL) -> None:
    s.create_session(cs(r.eir_clientid, r.eir_sequenceid), conn=CONN, principal=principal, now=0)


def test_result_fields() -> None:
    s = make_sessions(server_owner=b"owner-major", server_scope=b"scope")
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    assert r.eir_flags == nfs4.EXCHGID4_FLAG_USE_NON_PNFS  # not confirmed yet
    assert r.eir_sequenceid == 1
    assert r.eir_state_protect.spr_how == nfs4.SP4_NONE
    assert r.eir_server_owner == nfs4.server_owner4(0, b"owner-major")
    assert r.eir_server_scope == b"scope"
    (impl,) = r.eir_server_impl_id
    assert impl.nii_name.startswith(b"nfsrdma ") and impl.nii_domain
    rec = s.client(r.eir_clientid)
    assert rec is not None and rec.impl_id[0].nii_name == b"Linux"


def test_default_owner_and_scope_come_from_the_host_name() -> None:
    s = make_sessions()
    assert s.server_owner.startswith(b"nfsrdma:") and s.server_scope


def test_case1_new_owner_gets_unconfirmed_record() -> None:
    s = make_sessions()
    a = s.exchange_id(eid(b"a"), principal=PRINCIPAL, now=0)
    b = s.exchange_id(eid(b"b"), principal=PRINCIPAL, now=0)
    assert a.eir_clientid != b.eir_clientid
    assert not a.eir_flags & CONFIRMED_R
    rec = s.client(a.eir_clientid)
    assert rec is not None and not rec.confirmed


def test_case2_same_owner_verifier_principal_returns_the_confirmed_record() -> None:
    s = make_sessions()
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    confirm(s, r)
    again = s.exchange_id(eid(), principal=PRINCIPAL, now=5)
    assert again.eir_clientid == r.eir_clientid
    assert again.eir_flags & CONFIRMED_R
    assert again.eir_sequenceid == 2  # the next CREATE_SESSION's csa_sequence
    rec = s.client(r.eir_clientid)
    assert rec is not None and rec.last_renewed == 5


def test_case3_other_principal_while_state_exists_is_clid_inuse() -> None:
    s = make_sessions()
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    confirm(s, r)  # it now has a session: state
    assert fails(s.exchange_id, eid(), principal=OTHER_PRINCIPAL, now=1) == nfs4.NFS4ERR_CLID_INUSE
    assert s.client(r.eir_clientid) is not None


def test_case3_other_principal_without_state_replaces_the_record() -> None:
    expired: list[int] = []
    s = make_sessions(on_client_expired=expired.append)
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    confirm(s, r)
    (sessionid,) = s.sessions
    s.destroy_session(sessionid, conn=CONN, current=None, last_op=True)
    new = s.exchange_id(eid(), principal=OTHER_PRINCIPAL, now=1)
    assert new.eir_clientid != r.eir_clientid and not new.eir_flags & CONFIRMED_R
    assert s.client(r.eir_clientid) is None
    assert expired == [r.eir_clientid]


def test_case3_state_under_an_expired_lease_does_not_block() -> None:
    s = make_sessions(lease_time=10, has_state=lambda clientid: True)
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    confirm(s, r)
    assert fails(s.exchange_id, eid(), principal=OTHER_PRINCIPAL, now=5) == nfs4.NFS4ERR_CLID_INUSE
    new = s.exchange_id(eid(), principal=OTHER_PRINCIPAL, now=11)
    assert new.eir_clientid != r.eir_clientid


def test_case3_has_state_hook_counts_as_state() -> None:
    holding: set[int] = set()
    s = make_sessions(has_state=holding.__contains__)
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    confirm(s, r)
    for sessionid in list(s.sessions):
        s.destroy_session(sessionid, conn=CONN, current=None, last_op=True)
    holding.add(r.eir_clientid)
    assert fails(s.exchange_id, eid(), principal=OTHER_PRINCIPAL, now=1) == nfs4.NFS4ERR_CLID_INUSE


def test_case4_unconfirmed_record_is_replaced() -> None:
    s = make_sessions()
    first = s.exchange_id(eid(verifier=b"verifie1"), principal=PRINCIPAL, now=0)
    second = s.exchange_id(eid(verifier=b"verifie2"), principal=OTHER_PRINCIPAL, now=1)
    assert second.eir_clientid != first.eir_clientid
    assert s.client(first.eir_clientid) is None
    # The old client id cannot be confirmed any more.
    status = fails(
        s.create_session, cs(first.eir_clientid, 1), conn=CONN, principal=PRINCIPAL, now=1
    )
    assert status == nfs4.NFS4ERR_STALE_CLIENTID


def test_case5_client_restart_replaces_old_record_on_confirmation() -> None:
    expired: list[int] = []
    s = make_sessions(on_client_expired=expired.append)
    old = s.exchange_id(eid(verifier=b"boot-one"), principal=PRINCIPAL, now=0)
    confirm(s, old)
    (old_session,) = s.sessions
    new = s.exchange_id(eid(verifier=b"boot-two"), principal=PRINCIPAL, now=1)
    assert new.eir_clientid != old.eir_clientid and not new.eir_flags & CONFIRMED_R
    # Until the new incarnation is confirmed, the old record and its session live on.
    assert s.client(old.eir_clientid) is not None and old_session in s.sessions
    assert expired == []
    confirm(s, new)
    assert s.client(old.eir_clientid) is None
    assert old_session not in s.sessions
    assert expired == [old.eir_clientid]
    again = s.exchange_id(eid(verifier=b"boot-two"), principal=PRINCIPAL, now=2)
    assert again.eir_clientid == new.eir_clientid and again.eir_flags & CONFIRMED_R


def test_case5_then_another_exchange_id_replaces_the_unconfirmed_record() -> None:
    s = make_sessions()
    old = s.exchange_id(eid(verifier=b"boot-one"), principal=PRINCIPAL, now=0)
    confirm(s, old)
    n1 = s.exchange_id(eid(verifier=b"boot-two"), principal=PRINCIPAL, now=1)
    n2 = s.exchange_id(eid(verifier=b"boot-two"), principal=PRINCIPAL, now=2)
    assert n2.eir_clientid not in (n1.eir_clientid, old.eir_clientid)
    assert s.client(n1.eir_clientid) is None
    assert s.client(old.eir_clientid) is not None


def test_case6_update_of_confirmed_record() -> None:
    s = make_sessions()
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    confirm(s, r)
    up = s.exchange_id(
        eid(flags=UPDATE | nfs4.EXCHGID4_FLAG_BIND_PRINC_STATEID), principal=PRINCIPAL, now=1
    )
    assert up.eir_clientid == r.eir_clientid
    assert up.eir_flags & CONFIRMED_R and not up.eir_flags & UPDATE
    rec = s.client(r.eir_clientid)
    assert rec is not None and rec.eia_flags == nfs4.EXCHGID4_FLAG_BIND_PRINC_STATEID


def test_case7_update_without_confirmed_record_is_noent() -> None:
    s = make_sessions()
    r = s.exchange_id(eid(), principal=PRINCIPAL, now=0)
    assert fails(s.exchange_id, eid(flags=UPDATE), principal=PRINCIPAL, now=1) == nfs4.NFS4ERR_NOENT
    assert s.client(r.eir_clientid) is not None  # the unconfirmed record is left intact


def test_case8_update_with_other_verifier_is_not_same() -> None:
    s = make_sessions()
    confirm(s, s.exchange_id(eid(), principal=PRINCIPAL, now=0))
    status = fails(
        s.exchange_id, eid(verifier=b"xxxxxxxx", flags=UPDATE), principal=PRINCIPAL, now=1
    )
    assert status == nfs4.NFS4ERR_NOT_SAME


def test_case9_update_by_other_principal_is_perm() -> None:
    s = make_sessions()
    confirm(s, s.exchange_id(eid(), principal=PRINCIPAL, now=0))
    status = fails(s.exchange_id, eid(flags=UPDATE), principal=OTHER_PRINCIPAL, now=1)
    assert status == nfs4.NFS4ERR_PERM


@pytest.mark.parametrize("flags", [CONFIRMED_R, 0x4, 0x200, 0x00080000, 0x20000000])
def test_undefined_or_reply_only_flags_are_inval(flags: int) -> None:
    s = make_sessions()
    assert fails(s.exchange_id, eid(flags=flags), principal=PRINCIPAL, now=0) == nfs4.NFS4ERR_INVAL
    assert len(s.clients) == 0


def test_all_defined_argument_flags_are_accepted() -> None:
    s = make_sessions()
    flags = (
        nfs4.EXCHGID4_FLAG_SUPP_MOVED_REFER
        | nfs4.EXCHGID4_FLAG_SUPP_MOVED_MIGR
        | nfs4.EXCHGID4_FLAG_BIND_PRINC_STATEID
        | nfs4.EXCHGID4_FLAG_USE_NON_PNFS
        | nfs4.EXCHGID4_FLAG_USE_PNFS_MDS
        | nfs4.EXCHGID4_FLAG_USE_PNFS_DS
    )
    r = s.exchange_id(eid(flags=flags), principal=PRINCIPAL, now=0)
    assert r.eir_flags == nfs4.EXCHGID4_FLAG_USE_NON_PNFS


def test_state_protection_other_than_sp4_none_is_refused() -> None:
    s = make_sessions()
    mach = nfs4.state_protect_ops4([], [])
    ssv = nfs4.ssv_sp_parms4(mach, [b"\x06\x09"], [b"\x06\x09"], 1, 0)
    st = fails(s.exchange_id, eid(how=nfs4.SP4_MACH_CRED, value=mach), principal=PRINCIPAL, now=0)
    assert st == nfs4.NFS4ERR_INVAL
    st = fails(s.exchange_id, eid(how=nfs4.SP4_SSV, value=ssv), principal=PRINCIPAL, now=0)
    assert st == nfs4.NFS4ERR_ENCR_ALG_UNSUPP
    assert len(s.clients) == 0


def test_client_ids_are_unique_and_carry_a_boot_tag() -> None:
    s = make_sessions()
    ids = {
        s.exchange_id(eid(b"o%d" % i), principal=PRINCIPAL, now=0).eir_clientid for i in range(500)
    }
    assert len(ids) == 500
    assert len({i >> 32 for i in ids}) == 1
    other = make_sessions(random_bytes=lambda n: b"\x42" * n)
    assert (
        other.exchange_id(eid(), principal=PRINCIPAL, now=0).eir_clientid >> 32
        != next(iter(ids)) >> 32
    )


def test_sec12_client_records_are_capped_then_reaped() -> None:
    s = make_sessions(lease_time=10, caps=SessionCaps(max_clients=50))
    for i in range(50):
        s.exchange_id(eid(b"o%d" % i), principal=PRINCIPAL, now=0)
    st = fails(s.exchange_id, eid(b"one-more"), principal=PRINCIPAL, now=1)
    assert st == nfs4.NFS4ERR_DELAY
    # A known owner may still replace its own unconfirmed record.
    s.exchange_id(eid(b"o3", verifier=b"another"), principal=PRINCIPAL, now=1)
    # Once the unconfirmed records are older than a lease, room is made.
    r = s.exchange_id(eid(b"one-more"), principal=PRINCIPAL, now=10.5)
    assert s.client(r.eir_clientid) is not None
    assert len(s.clients) <= 50


def test_sec12_creation_is_rate_limited() -> None:
    s = make_sessions(caps=SessionCaps(source_rate=10, source_burst=5))
    for i in range(5):
        s.exchange_id(eid(b"o%d" % i), principal=PRINCIPAL, now=100)
    assert fails(s.exchange_id, eid(b"o5"), principal=PRINCIPAL, now=100) == nfs4.NFS4ERR_DELAY
    # Replacing an unconfirmed record creates one too.
    assert fails(s.exchange_id, eid(b"o0"), principal=PRINCIPAL, now=100) == nfs4.NFS4ERR_DELAY
    # Two tokens come back in 0.2 s.
    s.exchange_id(eid(b"o5"), principal=PRINCIPAL, now=100.2)
    s.exchange_id(eid(b"o6"), principal=PRINCIPAL, now=100.2)
    assert fails(s.exchange_id, eid(b"o7"), principal=PRINCIPAL, now=100.2) == nfs4.NFS4ERR_DELAY
    assert len(s.clients) == 7


def test_ss33_ten_thousand_exchange_ids_stay_bounded_and_are_reaped() -> None:
    """SS-33: 10^4 client ids created without sessions: memory stays bounded and they are
    reaped after the lease."""
    s = make_sessions(lease_time=30, caps=SessionCaps(max_clients=1000, source_rate=200))
    refused = 0
    now = 0.0
    for i in range(10_000):
        now += 0.001
        try:
            s.exchange_id(eid(b"flood-%d" % i), principal=PRINCIPAL, now=now)
        except SessionError as e:
            assert e.status == nfs4.NFS4ERR_DELAY
            refused += 1
    assert len(s.clients) <= 1000
    assert refused > 0
    assert s.reap(now + 31) == []  # unconfirmed: dropped without state callbacks
    assert len(s.clients) == 0
