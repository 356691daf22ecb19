"""The sans-IO delegation table (nfs4/delegations.py): grant decisions, conflicts, recall
deadlines with ``now`` passed in, revocation and freeing (RFC 8881 sections 10.2, 10.4.6,
18.16.3, 18.38, 18.48)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.nfs4.delegations import (
    WANT_ANY,
    WANT_CANCEL,
    WANT_NO_PREFERENCE,
    WANT_NONE,
    WANT_READ,
    WANT_WRITE,
    Decision,
    Delegation,
    DelegationTable,
    OtherOpen,
)
from nfsrdma.xdr.gen import nfs4

R, W = nfs4.OPEN4_SHARE_ACCESS_READ, nfs4.OPEN4_SHARE_ACCESS_WRITE
FH = b"file"


def table() -> DelegationTable:
    counter = itertools.count(1)
    return DelegationTable(lambda: b"INST" + next(counter).to_bytes(8, "big"))


def decide(t: DelegationTable, access: int, want: int, others: list[OtherOpen] | None = None,
           *, clientid: int = 1, callbacks: bool = True, enabled: bool = True) -> Decision:  # fmt: skip
    return t.decide(clientid, FH, access, want, others or [], enabled=enabled, callbacks=callbacks)


def test_decisions() -> None:
    t = table()
    assert decide(t, R, WANT_NO_PREFERENCE) == Decision(False)
    assert decide(t, R, WANT_READ) == Decision(False)
    assert decide(t, R | W, WANT_ANY) == Decision(True)
    assert decide(t, R, WANT_WRITE) == Decision(True)
    assert decide(t, R, WANT_NONE) == Decision(None, nfs4.WND4_NOT_WANTED)
    assert decide(t, R, WANT_CANCEL) == Decision(None, nfs4.WND4_CANCELLED)
    assert decide(t, R, WANT_READ, callbacks=False) == Decision(None, nfs4.WND4_RESOURCE)
    assert decide(t, R, WANT_READ, enabled=False) == Decision(None, nfs4.WND4_RESOURCE)
    writer = [OtherOpen(2, W, 0)]
    reader = [OtherOpen(2, R, 0)]
    assert decide(t, R, WANT_READ, writer) == Decision(None, nfs4.WND4_CONTENTION)
    assert decide(t, R, WANT_READ, reader) == Decision(False)
    assert decide(t, W, WANT_ANY, reader) == Decision(None, nfs4.WND4_CONTENTION)
    assert decide(t, W, WANT_READ) == Decision(None, nfs4.WND4_CONTENTION)
    t.limit = 0
    assert decide(t, R, WANT_READ) == Decision(None, nfs4.WND4_RESOURCE)


def test_read_delegations_share_a_write_delegation_does_not() -> None:
    t = table()
    a = t.grant(1, FH, False, 0.0)
    assert t.grant(1, FH, False, 1.0) is a  # one per client and file
    assert decide(t, R, WANT_READ, clientid=2) == Decision(False)
    assert decide(t, W, WANT_WRITE, clientid=2) == Decision(None, nfs4.WND4_CONTENTION)
    assert decide(t, W, WANT_WRITE) == Decision(None, nfs4.WND4_NOT_SUPP_UPGRADE)
    assert t.conflicts(FH, 2, write=False) == []
    assert t.conflicts(FH, 2, write=True) == [a]
    assert t.conflicts(FH, 1, write=True) == []  # the holder's own operations
    assert t.conflicts(FH, None, write=True) == [a]  # the server's own file system
    t2 = table()
    w = t2.grant(1, FH, True, 0.0)
    assert t2.conflicts(FH, 2, write=False) == [w]


def test_recall_once_then_revoke_after_the_lease() -> None:
    t = table()
    sent: list[Delegation] = []
    flags: list[tuple[int, bool]] = []
    t.recall = sent.append
    t.on_revoked = lambda c, on: flags.append((c, on))
    d = t.grant(1, FH, False, 0.0)
    for now in (10.0, 11.0):
        with pytest.raises(Nfs4Error) as e:
            t.break_conflicts(FH, 2, write=True, now=now)
        assert e.value.status == nfs4.NFS4ERR_DELAY
    assert sent == [d] and d.recalled == 10.0
    assert decide(t, R, WANT_READ) == Decision(None, nfs4.WND4_CONTENTION)  # being recalled
    assert t.next_deadline(90) == 100.0
    assert t.expire(100.0, 90) == []
    assert t.expire(100.5, 90) == [d]
    assert flags == [(1, True)] and t.next_deadline(90) is None
    t.break_conflicts(FH, 2, write=True, now=101.0)  # the file is free
    with pytest.raises(Nfs4Error) as e:
        t.find(1, d.stateid, FH)
    assert e.value.status == nfs4.NFS4ERR_DELEG_REVOKED
    assert t.test(1, d.stateid) == nfs4.NFS4ERR_DELEG_REVOKED
    assert t.test(2, d.stateid) == nfs4.NFS4ERR_BAD_STATEID
    assert t.free(1, d.stateid) is True
    assert flags == [(1, True), (1, False)]
    assert t.test(1, d.stateid) is None and t.get(d.other) is None


def test_return_free_and_purge() -> None:
    t = table()
    released: list[Delegation] = []
    t.release = released.append
    d = t.grant(1, FH, False, 0.0)
    d.lease = object()
    with pytest.raises(Nfs4Error) as e:
        t.free(1, d.stateid)
    assert e.value.status == nfs4.NFS4ERR_LOCKS_HELD  # live: DELEGRETURN it
    with pytest.raises(Nfs4Error) as e:
        t.delegreturn(2, d.stateid, FH)
    assert e.value.status == nfs4.NFS4ERR_BAD_STATEID
    with pytest.raises(Nfs4Error) as e:
        t.find(1, nfs4.stateid4(2, d.other), FH)
    assert e.value.status == nfs4.NFS4ERR_BAD_STATEID
    t.delegreturn(1, d.stateid, FH)
    assert released == [d] and len(t) == 0
    e1 = t.grant(1, FH, False, 0.0)
    e2 = t.grant(1, b"other", True, 0.0)
    t.revoke(e2)
    assert t.client_has(1)
    t.purge(1)
    assert not t.client_has(1) and t.get(e1.other) is None and t.get(e2.other) is None


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["grant", "return", "revoke", "free", "purge", "expire"]),
        st.integers(1, 3),  # client
        st.sampled_from([b"f1", b"f2", b"f3"]),
        st.booleans(),  # write
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_STEPS)
def test_the_count_is_the_delegations_on_files(steps: list[tuple[str, int, bytes, bool]]) -> None:
    """``len`` (kept as a count, asked by every OPEN and REMOVE) is the number of delegations
    standing on files through any sequence of grants, returns, revocations, frees, purges and
    expiries; ``bool`` agrees with it, and ``held_by_others`` (kept as counts by client) with
    the clients of the delegations on files."""
    t = table()
    for what, clientid, fh, write in steps:
        held = t.held(clientid, fh)
        if what == "grant":
            t.grant(clientid, fh, write, 0.0)
        elif what == "return" and held is not None:
            t.delegreturn(clientid, held.stateid, fh)
        elif what == "revoke" and held is not None:
            t.revoke(held)
            if write:
                t.free(clientid, held.stateid)
        elif what == "purge":
            t.purge(clientid)
        elif what == "expire" and held is not None:
            t.start_recall(held, 0.0)
            t.expire(100.0, 10.0)
        on_files = [d for f in (b"f1", b"f2", b"f3") for d in t.on_file(f)]
        assert len(t) == len(on_files)
        assert bool(t) == bool(on_files)
        for client in (1, 2, 3):
            others = any(d.clientid != client for d in on_files)
            assert t.held_by_others(client) == others
