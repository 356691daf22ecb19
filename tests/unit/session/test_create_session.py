"""CREATE_SESSION: csa_sequence replay (SS-10), confirmation, channel negotiation (UL-33..UL-38),
flags (UL-36, SS-8), back channel, resource limits (SEC-11, SEC-12)."""

from __future__ import annotations

import pytest

from nfsrdma.session.errors import SessionError
from nfsrdma.session.server import SLOT_OVERHEAD, ServerSessions, SessionCaps
from nfsrdma.xdr.gen import nfs4

from .helpers import OTHER_PRINCIPAL, PRINCIPAL, Conn, attrs, back_attrs, cs, eid, make_sessions

BACK_CHAN = nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
PERSIST = nfs4.CREATE_SESSION4_FLAG_PERSIST
CONN_RDMA = nfs4.CREATE_SESSION4_FLAG_CONN_RDMA
CONN = Conn("c")


def new_client(s: ServerSessions, owner: bytes = b"client-a") -> tuple[int, int]:
    r = s.exchange_id(eid(owner), principal=PRINCIPAL, now=0)
    return r.eir_clientid, r.eir_sequenceid


def create(
    s: ServerSessions, args: nfs4.CREATE_SESSION4args, **kw: object
) -> nfs4.CREATE_SESSION4resok:
    kw.setdefault("conn", CONN)
    kw.setdefault("principal", PRINCIPAL)
    kw.setdefault("now", 0)
    return s.create_session(args, **kw)  # type: ignore[arg-type]


def fails(s: ServerSessions, args: nfs4.CREATE_SESSION4args, **kw: object) -> int:
    with pytest.raises(SessionError) as e:
        create(s, args, **kw)
    return e.value.status


def test_confirms_the_client_and_creates_a_session() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    ok = create(s, cs(clientid, seq))
    assert ok.csr_sequence == seq
    rec = s.client(clientid)
    assert rec is not None and rec.confirmed
    session = s.session(ok.csr_sessionid)
    assert session is not None and session.clientid == clientid
    assert session.fore == ok.csr_fore_chan_attrs and session.back == ok.csr_back_chan_attrs
    assert session.cb_program == 0x40000000
    assert session.fore_connections == [CONN]  # the creating connection: fore channel


def test_ss10_replay_returns_the_same_session_and_creates_no_second() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    ok = create(s, cs(clientid, seq))
    again = create(s, cs(clientid, seq), conn=Conn("reconnected"), now=5)
    assert again == ok
    assert len(s.sessions) == 1
    # The next new one is seq + 1; anything else is misordered.
    assert fails(s, cs(clientid, seq + 2)) == nfs4.NFS4ERR_SEQ_MISORDERED
    assert fails(s, cs(clientid, seq - 1)) == nfs4.NFS4ERR_SEQ_MISORDERED
    second = create(s, cs(clientid, seq + 1))
    assert second.csr_sessionid != ok.csr_sessionid and len(s.sessions) == 2
    # Only the last one is cached now.
    assert fails(s, cs(clientid, seq)) == nfs4.NFS4ERR_SEQ_MISORDERED
    assert create(s, cs(clientid, seq + 1)) == second


def test_unconfirmed_record_expects_eir_sequenceid_exactly() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    assert fails(s, cs(clientid, seq - 1)) == nfs4.NFS4ERR_SEQ_MISORDERED  # the contrived reply
    assert fails(s, cs(clientid, seq + 1)) == nfs4.NFS4ERR_SEQ_MISORDERED
    rec = s.client(clientid)
    assert rec is not None and not rec.confirmed


def test_csa_sequence_wraps() -> None:
    s = make_sessions()
    clientid, _ = new_client(s)
    rec = s.client(clientid)
    assert rec is not None
    rec.cs_seqid = 0xFFFFFFFF
    ok = create(s, cs(clientid, 0))
    assert ok.csr_sequence == 0


def test_stale_clientid() -> None:
    s = make_sessions()
    assert fails(s, cs(0x1234, 1)) == nfs4.NFS4ERR_STALE_CLIENTID


def test_confirmation_by_another_principal_is_clid_inuse() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    assert fails(s, cs(clientid, seq), principal=OTHER_PRINCIPAL) == nfs4.NFS4ERR_CLID_INUSE
    create(s, cs(clientid, seq))  # nothing changed: the right principal still can
    # Once confirmed, SP4_NONE lets any principal create further sessions.
    create(s, cs(clientid, seq + 1), principal=OTHER_PRINCIPAL)


def test_ul33_ul35_fore_channel_negotiated_down_to_our_limits() -> None:
    s = make_sessions(
        slots=16,
        max_request_size=8192,
        max_response_size=16384,
        max_response_size_cached=2048,
        max_operations=32,
    )
    clientid, seq = new_client(s)
    offer = attrs(req=1 << 20, resp=1 << 20, cached=1 << 20, ops=100, reqs=1000, pad=256)
    fore = create(s, cs(clientid, seq, fore=offer)).csr_fore_chan_attrs
    assert fore == nfs4.channel_attrs4(0, 8192, 16384, 2048, 32, 16, [])


def test_fore_channel_offers_below_our_limits_are_kept() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    offer = attrs(req=4000, resp=5000, cached=300, ops=8, reqs=3)
    fore = create(s, cs(clientid, seq, fore=offer)).csr_fore_chan_attrs
    assert fore == nfs4.channel_attrs4(0, 4000, 5000, 300, 8, 3, [])
    session = s.session(create(s, cs(clientid, seq)).csr_sessionid)
    assert session is not None and session.slots.count == 3


@pytest.mark.parametrize("ird", [[], [16]])
def test_ul34_rdma_ird_zero_or_one_element_accepted_and_returned_empty(ird: list[int]) -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    back = nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, list(ird))
    ok = create(s, cs(clientid, seq, fore=attrs(ird=ird), back=back))
    assert ok.csr_fore_chan_attrs.ca_rdma_ird == []
    assert ok.csr_back_chan_attrs.ca_rdma_ird == []


def test_ul34_rdma_ird_of_two_elements_does_not_decode() -> None:
    from nfsrdma.xdr.runtime import XdrError, pack, unpack

    data = pack(nfs4.enc_channel_attrs4, attrs(ird=[1]))
    data = data[:-8] + b"\0\0\0\2" + b"\0\0\0\1" + b"\0\0\0\1"
    with pytest.raises(XdrError):
        unpack(nfs4.dec_channel_attrs4, data)


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (0, 0),
        (PERSIST, 0),
        (CONN_RDMA, 0),
        (BACK_CHAN, BACK_CHAN),
        (PERSIST | BACK_CHAN | CONN_RDMA, BACK_CHAN),
    ],
)
def test_ul36_ss8_persist_and_conn_rdma_cleared_back_chan_honoured(flags: int, expect: int) -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    ok = create(s, cs(clientid, seq, flags=flags))
    assert ok.csr_flags == expect
    session = s.session(ok.csr_sessionid)
    assert session is not None
    assert session.back_connections == ([CONN] if flags & BACK_CHAN else [])
    assert session.wants_back_channel == bool(flags & BACK_CHAN)


@pytest.mark.parametrize("flags", [0x8, 0x80000000])
def test_unknown_csa_flags_are_inval(flags: int) -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    assert fails(s, cs(clientid, seq, flags=flags)) == nfs4.NFS4ERR_INVAL
    # Nothing consumed: the same sequence still creates the session.
    create(s, cs(clientid, seq))


def test_ul38_back_channel_attributes_kept_as_the_client_offered() -> None:
    """18.36.3: ca_maxoperations and ca_maxrequests of the back channel MUST NOT change;
    the Linux client also refuses a smaller ca_maxresponsesize."""
    s = make_sessions(back_slots=4)
    clientid, seq = new_client(s)
    back = nfs4.channel_attrs4(64, 8192, 6000, 100, 5, 10, [])
    ok = create(s, cs(clientid, seq, flags=BACK_CHAN, back=back))
    assert ok.csr_back_chan_attrs == nfs4.channel_attrs4(0, 8192, 6000, 0, 5, 10, [])
    session = s.session(ok.csr_sessionid)
    assert session is not None and session.backchannel.count == 4  # we use 4 of its 10


def test_linux_back_channel_offer_one_slot() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    ok = create(s, cs(clientid, seq, flags=BACK_CHAN, back=back_attrs()))
    assert ok.csr_back_chan_attrs.ca_maxrequests == 1
    session = s.session(ok.csr_sessionid)
    assert session is not None and session.backchannel.count == 1


@pytest.mark.parametrize(
    ("fore", "back", "flags"),
    [
        (attrs(req=100), back_attrs(), 0),
        (attrs(resp=100), back_attrs(), 0),
        (attrs(ops=0), back_attrs(), 0),
        (attrs(reqs=0), back_attrs(), 0),
        (attrs(), nfs4.channel_attrs4(0, 100, 4096, 0, 2, 1, []), 0),
        (attrs(), nfs4.channel_attrs4(0, 4096, 50, 0, 2, 1, []), 0),
        (attrs(), nfs4.channel_attrs4(0, 4096, 4096, 0, 1, 1, []), 0),
        (attrs(), nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 0, []), BACK_CHAN),
    ],
)
def test_too_small_channels_are_toosmall(
    fore: nfs4.channel_attrs4, back: nfs4.channel_attrs4, flags: int
) -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    assert fails(s, cs(clientid, seq, flags=flags, fore=fore, back=back)) == nfs4.NFS4ERR_TOOSMALL


def test_no_back_slots_is_fine_without_a_back_channel() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    back = nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 0, [])
    ok = create(s, cs(clientid, seq, back=back))
    assert ok.csr_back_chan_attrs.ca_maxrequests == 0


def test_callback_security() -> None:
    s = make_sessions()
    clientid, seq = new_client(s)
    gss = nfs4.callback_sec_parms4(6, nfs4.gss_cb_handles4(nfs4.rpc_gss_svc_t(1), b"s", b"c"))
    sys_ = nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "host", 0, 0, []))
    assert fails(s, cs(clientid, seq, sec=[gss])) == nfs4.NFS4ERR_ENCR_ALG_UNSUPP
    ok = create(s, cs(clientid, seq, sec=[gss, sys_]))
    session = s.session(ok.csr_sessionid)
    assert session is not None and session.cb_security == sys_
    ok = create(s, cs(clientid, seq + 1, sec=[]))
    session = s.session(ok.csr_sessionid)
    assert session is not None and session.cb_security.cb_secflavor == 0


def test_sec11_sessionids_are_16_random_bytes() -> None:
    import os

    s = make_sessions(
        random_bytes=os.urandom,
        caps=SessionCaps(
            max_sessions_per_client=10_000,
            max_sessions=10_000,
            max_sessions_per_source=10_000,
            owner_burst=1e9,
            source_burst=1e9,
            drc_budget=1 << 40,
        ),
    )
    clientid, seq = new_client(s)
    ids = [create(s, cs(clientid, seq + i)).csr_sessionid for i in range(2000)]
    assert all(len(i) == 16 for i in ids) and len(set(ids)) == len(ids)
    # Every bit position varies (a crude randomness check).
    ones = [sum((int.from_bytes(i, "big") >> b) & 1 for i in ids) for b in range(128)]
    assert all(700 < n < 1300 for n in ones)


def test_sessionid_collision_is_retried() -> None:
    draws = iter([b"\1" * 4, b"A" * 16, b"A" * 16, b"B" * 16])
    s = make_sessions(random_bytes=lambda n: next(draws))
    clientid, seq = new_client(s)
    assert create(s, cs(clientid, seq)).csr_sessionid == b"A" * 16
    assert create(s, cs(clientid, seq + 1)).csr_sessionid == b"B" * 16


def test_sec12_sessions_per_client_and_total_are_capped() -> None:
    s = make_sessions(caps=SessionCaps(max_sessions_per_client=2, max_sessions=3))
    clientid, seq = new_client(s)
    create(s, cs(clientid, seq))
    create(s, cs(clientid, seq + 1))
    assert fails(s, cs(clientid, seq + 2)) == nfs4.NFS4ERR_NOSPC
    other, oseq = new_client(s, b"client-b")
    create(s, cs(other, oseq))
    assert fails(s, cs(other, oseq + 1)) == nfs4.NFS4ERR_NOSPC


def test_sec12_session_creation_rate_limited() -> None:
    s = make_sessions(caps=SessionCaps(owner_rate=1, owner_burst=2))
    clientid, seq = new_client(s)  # one token
    create(s, cs(clientid, seq), now=0)  # confirms the record: paid for by EXCHANGE_ID
    create(s, cs(clientid, seq + 1), now=0)  # the second token
    assert fails(s, cs(clientid, seq + 2), now=0) == nfs4.NFS4ERR_DELAY
    create(s, cs(clientid, seq + 2), now=1.5)


def test_ss7_reply_cache_budget_limits_slots_and_sessions() -> None:
    per_slot = 4096 + SLOT_OVERHEAD
    minimal = 2 * (1024 + SLOT_OVERHEAD)  # min_slots x (min_cached + overhead)
    caps = SessionCaps(
        drc_budget=per_slot * 12 + 4 * minimal,  # a pool of 12 slots + a reserve of 3 + 1
        max_sessions=3,
        drc_source_share=1,
        drc_owner_share=1,
        min_slots=2,
        min_cached=1024,
    )
    s = make_sessions(slots=8, caps=caps)
    assert s.drc.pool == 12 * per_slot
    clientid, seq = new_client(s)
    a = create(s, cs(clientid, seq, fore=attrs(reqs=8, cached=4096)))
    assert a.csr_fore_chan_attrs.ca_maxrequests == 8
    b = create(s, cs(clientid, seq + 1, fore=attrs(reqs=8, cached=4096)))
    assert b.csr_fore_chan_attrs.ca_maxrequests == 4  # what is left of the pool
    # The pool is spent: a minimal session out of the reserve, not NFS4ERR_NOSPC.
    c = create(s, cs(clientid, seq + 2, fore=attrs(reqs=8, cached=4096)))
    assert c.csr_fore_chan_attrs.ca_maxrequests == 2
    assert c.csr_fore_chan_attrs.ca_maxresponsesize_cached == 1024
    assert s.drc_reserved == 12 * per_slot + minimal
    assert fails(s, cs(clientid, seq + 3, fore=attrs(cached=4096))) == nfs4.NFS4ERR_NOSPC
    s.destroy_session(a.csr_sessionid, conn=CONN, current=None, last_op=True)
    assert s.drc_reserved == 4 * per_slot + minimal
    d = create(s, cs(clientid, seq + 3, fore=attrs(reqs=8, cached=4096)))
    assert d.csr_fore_chan_attrs.ca_maxrequests == 8


def test_ss18_server_request_ceiling_fits_a_rename_of_two_long_names() -> None:
    with pytest.raises(ValueError):
        ServerSessions(max_request_size=1024)
    # RPC header (24) + AUTH_SYS cred and verifier (2 x (8 + 400)) + COMPOUND header (12) +
    # SEQUENCE (36) + PUTFH (136) + SAVEFH (4) + PUTFH (136) + RENAME (4 + 2 x (4 + 256)).
    need = 24 + 2 * 408 + 12 + 36 + 136 + 4 + 136 + 4 + 2 * 260
    from nfsrdma.session.channels import MIN_SERVER_REQUEST_SIZE

    assert need <= MIN_SERVER_REQUEST_SIZE
