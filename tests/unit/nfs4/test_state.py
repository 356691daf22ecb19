"""The open/lock state machine (nfsrdma.nfs4.state, state_locks): stateid rules, share
reservations, byte-range lock arithmetic, CLOSE/FREE_STATEID rules and client expiry
(RFC 8881 sections 8, 9, 18.2, 18.18, 18.38, 18.48). Opens hold real files of a LocalVfs."""

from __future__ import annotations

import errno
import itertools
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.nfs4 import state_locks
from nfsrdma.nfs4.context import (
    ANONYMOUS_STATEID,
    BYPASS_STATEID,
    CURRENT_STATEID,
    CompoundContext,
    Nfs4Error,
)
from nfsrdma.nfs4.state import (
    ACCESS_READ,
    ACCESS_WRITE,
    DENY_READ,
    DENY_WRITE,
    StateManager,
    check_seqid_of,
    next_seqid,
)
from nfsrdma.nfs4.state_locks import READ, TO_EOF, WRITE, LockRange
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.transport.tcp import TcpConnection
from nfsrdma.vfs import Cred, Export, LocalVfs
from nfsrdma.vfs.base import OpenFile
from nfsrdma.xdr.gen import nfs4

ROOT = Cred(0, 0)
BOTH = ACCESS_READ | ACCESS_WRITE
A, B = 0x1111, 0x2222  # client ids


@pytest.fixture
def vfs(tmp_path: Path) -> Iterator[LocalVfs]:
    export = tmp_path / "export"
    export.mkdir()
    v = LocalVfs(Export(str(export), root_squash=False, state_dir=str(tmp_path / "state")))
    yield v
    v.release_identity()
    v.close()


@pytest.fixture
def sm(vfs: LocalVfs) -> Iterator[StateManager]:
    m = StateManager(vfs, instance=b"INST")
    yield m
    m.close()


def make_file(vfs: LocalVfs, name: str, data: bytes = b"") -> bytes:
    fh, of, _ = vfs.create_file(ROOT, vfs.root_handle(), name, 0o644)
    if data:
        of.write(0, data)
    of.close()
    return fh


def opened(vfs: LocalVfs, fh: bytes, access: int = BOTH) -> OpenFile:
    return vfs.open(ROOT, fh, read=bool(access & ACCESS_READ), write=bool(access & ACCESS_WRITE))


def status(exc: pytest.ExceptionInfo[Nfs4Error]) -> str:
    return nfs4.nfsstat4(exc.value.status).name


# ---------------------------------------------------------------- stateids


def test_stateid_layout_names_the_instance(sm: StateManager, vfs: LocalVfs) -> None:
    fh = make_file(vfs, "f")
    o1 = sm.add_open(A, b"own1", fh, ACCESS_READ, 0, opened(vfs, fh, ACCESS_READ))
    o2 = sm.add_open(A, b"own2", fh, ACCESS_READ, 0, opened(vfs, fh, ACCESS_READ))
    for o in (o1, o2):
        assert len(o.other) == 12 and o.other[:4] == b"INST" and o.seqid == 1
    assert o1.other != o2.other
    assert sm.find(A, o1.stateid, fh) is o1


def test_seqid_rules() -> None:
    """RFC 8881 8.2.2: 0 = current, older = OLD_STATEID, newer = BAD_STATEID."""
    check_seqid_of(0, 5)
    check_seqid_of(5, 5)
    with pytest.raises(Nfs4Error) as e:
        check_seqid_of(4, 5)
    assert status(e) == "NFS4ERR_OLD_STATEID"
    with pytest.raises(Nfs4Error) as e:
        check_seqid_of(6, 5)
    assert status(e) == "NFS4ERR_BAD_STATEID"
    # across the wrap: 0xFFFFFFFF is older than 1
    assert next_seqid(0xFFFFFFFF) == 1
    with pytest.raises(Nfs4Error) as e:
        check_seqid_of(0xFFFFFFFF, 1)
    assert status(e) == "NFS4ERR_OLD_STATEID"


def test_find_refuses_every_kind_of_bad_stateid(sm: StateManager, vfs: LocalVfs) -> None:
    fh, other_fh = make_file(vfs, "f"), make_file(vfs, "g")
    o = sm.add_open(A, b"own", fh, BOTH, 0, opened(vfs, fh))
    sm.upgrade_open(o, ACCESS_READ, 0, None)  # seqid 2
    cases = {
        "stale (earlier instance)": (A, nfs4.stateid4(1, b"OLDI" + o.other[4:]), fh),
        "never issued": (A, nfs4.stateid4(1, b"INST" + bytes(7) + b"\x99"), fh),
        "another client's": (B, o.stateid, fh),
        "another file's": (A, o.stateid, other_fh),
        "anonymous": (A, ANONYMOUS_STATEID, fh),
        "bypass": (A, BYPASS_STATEID, fh),
        "current (unresolved)": (A, CURRENT_STATEID, fh),
        "older seqid": (A, nfs4.stateid4(1, o.other), fh),
        "newer seqid": (A, nfs4.stateid4(3, o.other), fh),
    }
    expected = {
        "stale (earlier instance)": "NFS4ERR_STALE_STATEID",
        "older seqid": "NFS4ERR_OLD_STATEID",
    }
    for name, (client, sid, f) in cases.items():
        with pytest.raises(Nfs4Error) as e:
            sm.find(client, sid, f)
        assert status(e) == expected.get(name, "NFS4ERR_BAD_STATEID"), name
    assert sm.find(A, nfs4.stateid4(0, o.other), fh) is o
    assert sm.find(A, nfs4.stateid4(2, o.other), None) is o


def test_test_stateid_statuses(sm: StateManager, vfs: LocalVfs) -> None:
    """RFC 8881 18.48: per-stateid OK / OLD / BAD (stale and special ones are BAD too)."""
    fh = make_file(vfs, "f")
    o = sm.add_open(A, b"own", fh, BOTH, 0, opened(vfs, fh))
    sm.upgrade_open(o, BOTH, 0, None)
    got = [
        sm.test_stateid(A, sid)
        for sid in (
            o.stateid,
            nfs4.stateid4(1, o.other),
            nfs4.stateid4(1, b"OLDI" + o.other[4:]),
            ANONYMOUS_STATEID,
        )
    ]
    assert got == [
        nfs4.NFS4_OK,
        nfs4.NFS4ERR_OLD_STATEID,
        nfs4.NFS4ERR_BAD_STATEID,
        nfs4.NFS4ERR_BAD_STATEID,
    ]
    assert sm.test_stateid(B, o.stateid) == nfs4.NFS4ERR_BAD_STATEID


def test_find_delegation_never_succeeds(sm: StateManager, vfs: LocalVfs) -> None:
    fh = make_file(vfs, "f")
    o = sm.add_open(A, b"own", fh, BOTH, 0, opened(vfs, fh))
    for sid, want in (
        (o.stateid, "NFS4ERR_BAD_STATEID"),
        (nfs4.stateid4(1, b"OLDI" + bytes(8)), "NFS4ERR_STALE_STATEID"),
        (nfs4.stateid4(1, b"INST" + bytes(8)), "NFS4ERR_BAD_STATEID"),
    ):
        with pytest.raises(Nfs4Error) as e:
            sm.find_delegation(A, sid)
        assert status(e) == want


# ---------------------------------------------------------------- share reservations


def test_share_conflicts_between_owners_only(sm: StateManager, vfs: LocalVfs) -> None:
    """RFC 8881 9.7: access vs others' deny, deny vs others' access; one owner never
    conflicts with itself."""
    fh = make_file(vfs, "f")
    a = sm.add_open(A, b"a", fh, ACCESS_READ, DENY_WRITE, opened(vfs, fh, ACCESS_READ))
    sm.check_share(fh, ACCESS_READ, 0, None)  # B may read
    for access, deny in ((ACCESS_WRITE, 0), (BOTH, 0), (ACCESS_READ, DENY_READ)):
        with pytest.raises(Nfs4Error) as e:
            sm.check_share(fh, access, deny, None)
        assert status(e) == "NFS4ERR_SHARE_DENIED"
    sm.check_share(fh, BOTH, DENY_WRITE, a)  # the owner itself upgrading
    sm.check_share(make_file(vfs, "g"), BOTH, DENY_READ | DENY_WRITE, None)


def test_upgrade_then_downgrade(sm: StateManager, vfs: LocalVfs) -> None:
    """RFC 8881 18.18.3: the new bits must be the union of a subset of the OPENs' bits."""
    fh = make_file(vfs, "f")
    o = sm.add_open(A, b"a", fh, ACCESS_READ, 0, opened(vfs, fh, ACCESS_READ))
    sm.upgrade_open(o, ACCESS_WRITE, DENY_WRITE, opened(vfs, fh))
    assert (o.access, o.deny, o.seqid) == (BOTH, DENY_WRITE, 2)
    assert o.openfile.writable and o.openfile.readable
    sm.downgrade_open(o, ACCESS_READ, 0)
    assert (o.access, o.deny, o.seqid) == (ACCESS_READ, 0, 3)
    with pytest.raises(Nfs4Error) as e:  # WRITE is no longer among the opens in effect
        sm.downgrade_open(o, ACCESS_WRITE, 0)
    assert status(e) == "NFS4ERR_INVAL"

    both = sm.add_open(A, b"b", fh, BOTH, 0, opened(vfs, fh))
    with pytest.raises(Nfs4Error) as e:  # READ alone was never opened by this owner
        sm.downgrade_open(both, ACCESS_READ, 0)
    assert status(e) == "NFS4ERR_INVAL"


def test_special_stateid_io_respects_share_deny(sm: StateManager, vfs: LocalVfs) -> None:
    fh = make_file(vfs, "f")
    assert sm.io_file(A, ANONYMOUS_STATEID, fh, write=True) is None  # no opens: anonymous I/O
    sm.add_open(A, b"a", fh, ACCESS_READ, DENY_READ | DENY_WRITE, opened(vfs, fh, ACCESS_READ))
    for sid, write in (
        (ANONYMOUS_STATEID, False),
        (ANONYMOUS_STATEID, True),
        (BYPASS_STATEID, True),
    ):
        with pytest.raises(Nfs4Error) as e:
            sm.io_file(B, sid, fh, write=write)
        assert status(e) == "NFS4ERR_LOCKED"
    assert sm.io_file(B, BYPASS_STATEID, fh, write=False) is None  # READ bypass


def test_io_file_checks_the_open_mode(sm: StateManager, vfs: LocalVfs) -> None:
    fh = make_file(vfs, "f")
    ro = sm.add_open(A, b"r", fh, ACCESS_READ, 0, opened(vfs, fh, ACCESS_READ))
    assert sm.io_file(A, ro.stateid, fh, write=False) is ro.openfile
    with pytest.raises(Nfs4Error) as e:
        sm.io_file(A, ro.stateid, fh, write=True)
    assert status(e) == "NFS4ERR_OPENMODE"
    wo = sm.add_open(A, b"w", fh, ACCESS_WRITE, 0, opened(vfs, fh, ACCESS_WRITE))
    with pytest.raises(Nfs4Error) as e:
        sm.io_file(A, wo.stateid, fh, write=False)
    assert status(e) == "NFS4ERR_OPENMODE"
    # a lock stateid uses its open's mode
    ls = sm.new_lock_state(ro, b"lk")
    sm.set_lock(ls, 0, 10, READ)
    assert sm.io_file(A, ls.stateid, fh, write=False) is ro.openfile
    with pytest.raises(Nfs4Error):
        sm.io_file(A, ls.stateid, fh, write=True)


# ---------------------------------------------------------------- byte-range arithmetic


def test_byte_range_arguments() -> None:
    M = state_locks.NFS4_UINT64_MAX
    assert state_locks.byte_range(10, 5) == (10, 15)
    assert state_locks.byte_range(10, M) == (10, TO_EOF)
    assert state_locks.byte_range(2, M - 1) == (2, TO_EOF)  # ends exactly at 2**64
    for offset, length in ((0, 0), (3, M - 1), (M, 2)):
        with pytest.raises(Nfs4Error) as e:
            state_locks.byte_range(offset, length)
        assert status(e) == "NFS4ERR_INVAL"
    assert state_locks.wire_length(10, TO_EOF) == M
    assert state_locks.wire_length(10, 15) == 5
    assert state_locks.lock_kind(nfs4.WRITEW_LT) == WRITE
    assert state_locks.lock_kind(nfs4.READW_LT) == READ


def test_lock_split_merge_upgrade() -> None:
    r = state_locks.lock([], 0, 100, READ)
    r = state_locks.lock(r, 40, 60, WRITE)  # upgrade the middle: split in three
    assert r == [LockRange(0, 40, READ), LockRange(40, 60, WRITE), LockRange(60, 100, READ)]
    r = state_locks.lock(r, 40, 60, READ)  # downgrade back: merged into one
    assert r == [LockRange(0, 100, READ)]
    r = state_locks.unlock(r, 10, 20)  # hole
    assert r == [LockRange(0, 10, READ), LockRange(20, 100, READ)]
    r = state_locks.lock(r, 100, TO_EOF, READ)  # adjacent: joined, to the end
    assert r == [LockRange(0, 10, READ), LockRange(20, TO_EOF, READ)]
    assert state_locks.unlock(r, 0, TO_EOF) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),  # lock (True) or unlock
            st.integers(0, 40),
            st.integers(1, 24),
            st.sampled_from([READ, WRITE]),
        ),
        max_size=12,
    )
)
def test_lock_arithmetic_matches_a_per_byte_model(ops: list[tuple[bool, int, int, int]]) -> None:
    """Any sequence of LOCK/LOCKU by one owner gives the same byte ownership as a per-byte
    model, and the ranges stay sorted, disjoint and merged."""
    ranges: list[LockRange] = []
    model: dict[int, int] = {}
    for is_lock, start, length, kind in ops:
        end = start + length
        if is_lock:
            ranges = state_locks.lock(ranges, start, end, kind)
            model.update(dict.fromkeys(range(start, end), kind))
        else:
            ranges = state_locks.unlock(ranges, start, end)
            for b in range(start, end):
                model.pop(b, None)
    got = {b: r.kind for r in ranges for b in range(r.start, r.end)}
    assert got == model
    for x, y in itertools.pairwise(ranges):
        assert x.end <= y.start and not (x.end == y.start and x.kind == y.kind)


# ---------------------------------------------------------------- locks in the manager


def test_lock_conflicts_only_between_owners(sm: StateManager, vfs: LocalVfs) -> None:
    fh = make_file(vfs, "f")
    oa = sm.add_open(A, b"oa", fh, BOTH, 0, opened(vfs, fh))
    ob = sm.add_open(B, b"ob", fh, BOTH, 0, opened(vfs, fh))
    la = sm.new_lock_state(oa, b"la")
    sm.set_lock(la, 0, 100, WRITE)
    assert la.seqid == 1
    assert sm.find_conflict(fh, la.key, 50, 150, WRITE) is None  # own lock
    c = sm.find_conflict(fh, (B, b"lb"), 90, TO_EOF, READ)
    assert c is not None and (c.start, c.end, c.kind, c.clientid, c.owner) == (
        0,
        100,
        WRITE,
        A,
        b"la",
    )
    denied = c.denied()
    assert (denied.offset, denied.length, denied.locktype) == (0, 100, nfs4.WRITE_LT)
    assert denied.owner == nfs4.state_owner4(A, b"la")
    assert sm.find_conflict(fh, (B, b"lb"), 100, 200, WRITE) is None  # touching only
    sm.set_lock(la, 0, 100, READ)  # downgrade: readers may share
    assert sm.find_conflict(fh, (B, b"lb"), 0, 10, READ) is None
    assert sm.find_conflict(fh, (B, b"lb"), 0, 10, WRITE) is not None
    lb = sm.new_lock_state(ob, b"lb")
    assert sm.new_lock_state(ob, b"lb") is lb  # one lock stateid per (owner, file)
    sm.set_lock(lb, 5, 6, READ)
    assert sm.lock_state_of(B, b"lb", fh) is lb


def test_close_and_free_stateid_rules(sm: StateManager, vfs: LocalVfs) -> None:
    """RFC 8881 18.2.4 / 18.38.3: LOCKS_HELD while locks are held; empty lock stateids go
    with the open; FREE_STATEID refuses open stateids."""
    fh = make_file(vfs, "f")
    o = sm.add_open(A, b"o", fh, BOTH, 0, opened(vfs, fh))
    ls = sm.new_lock_state(o, b"l")
    sm.set_lock(ls, 0, 10, WRITE)
    for action in (lambda: sm.close_open(o), lambda: sm.free_stateid(A, ls.stateid)):
        with pytest.raises(Nfs4Error) as e:
            action()
        assert status(e) == "NFS4ERR_LOCKS_HELD"
    with pytest.raises(Nfs4Error) as e:
        sm.free_stateid(A, o.stateid)
    assert status(e) == "NFS4ERR_LOCKS_HELD"
    sm.unlock(ls, 0, 10)
    assert ls.seqid == 2 and ls.ranges == []
    sm.free_stateid(A, nfs4.stateid4(1, ls.other))  # seqid not checked by FREE_STATEID
    assert sm.test_stateid(A, ls.stateid) == nfs4.NFS4ERR_BAD_STATEID
    ls2 = sm.new_lock_state(o, b"l2")
    sm.set_lock(ls2, 0, 1, READ)
    sm.unlock(ls2, 0, 1)
    of = o.openfile
    sm.close_open(o)
    assert sm.stateid_count == 0
    with pytest.raises(OSError) as oe:
        of.read(0, 1)
    assert oe.value.errno == errno.EBADF


def test_client_expiry_releases_everything(sm: StateManager, vfs: LocalVfs) -> None:
    fh = make_file(vfs, "f", b"data")
    oa = sm.add_open(A, b"oa", fh, BOTH, DENY_WRITE, opened(vfs, fh))
    la = sm.new_lock_state(oa, b"la")
    sm.set_lock(la, 0, TO_EOF, WRITE)
    ob = sm.add_open(B, b"ob", fh, ACCESS_READ, 0, opened(vfs, fh, ACCESS_READ))
    assert sm.client_has_state(A)
    with pytest.raises(Nfs4Error):
        sm.check_share(fh, ACCESS_WRITE, 0, ob)
    sm.client_expired(A)
    assert not sm.client_has_state(A)
    assert sm.find_conflict(fh, (B, b"lb"), 0, 10, WRITE) is None
    sm.check_share(fh, ACCESS_WRITE, 0, ob)
    with pytest.raises(OSError):
        oa.openfile.read(0, 1)
    for sid in (oa.stateid, la.stateid):
        assert sm.test_stateid(A, sid) == nfs4.NFS4ERR_BAD_STATEID
    assert ob.openfile.read(0, 4) == (b"data", True)  # B unaffected
    sm.client_expired(A)  # idempotent
    assert sm.stateid_count == 1


def test_check_setattr_size(sm: StateManager, vfs: LocalVfs) -> None:
    """SETATTR of size with a stateid (RFC 8881 18.30.3): an open allowing writes, a lock
    stateid of such an open, or a special stateid subject to share_deny."""
    fh = make_file(vfs, "f")
    ctx = CompoundContext(
        server=None,  # type: ignore[arg-type]
        cred=ROOT,
        principal=None,  # type: ignore[arg-type]
        conn=RpcConnection(TcpConnection("test:0")),
        now=0.0,
        session=SimpleNamespace(clientid=A),  # type: ignore[arg-type]
    )
    w = sm.add_open(A, b"w", fh, BOTH, 0, opened(vfs, fh))
    r = sm.add_open(A, b"r", fh, ACCESS_READ, 0, opened(vfs, fh, ACCESS_READ))
    sm.check_setattr_size(ctx, w.stateid, fh)
    sm.check_setattr_size(ctx, ANONYMOUS_STATEID, fh)
    ctx.current_stateid = w.stateid
    sm.check_setattr_size(ctx, CURRENT_STATEID, fh)
    ls = sm.new_lock_state(w, b"l")
    sm.set_lock(ls, 0, 1, WRITE)
    sm.check_setattr_size(ctx, ls.stateid, fh)
    with pytest.raises(Nfs4Error) as e:
        sm.check_setattr_size(ctx, r.stateid, fh)
    assert status(e) == "NFS4ERR_OPENMODE"
    with pytest.raises(Nfs4Error) as e:
        sm.check_setattr_size(ctx, w.stateid, make_file(vfs, "g"))
    assert status(e) == "NFS4ERR_BAD_STATEID"
    sm.add_open(B, b"d", fh, ACCESS_READ, DENY_WRITE, opened(vfs, fh, ACCESS_READ))
    for special in (ANONYMOUS_STATEID, BYPASS_STATEID):
        with pytest.raises(Nfs4Error) as e:
            sm.check_setattr_size(ctx, special, fh)
        assert status(e) == "NFS4ERR_LOCKED"


def _union_of_some(value: int, modes: set[int]) -> bool:
    """RFC 8881 §18.18.3, written out: ``value`` is the union of a subset of ``modes``."""
    return any(
        value == _union(subset)
        for n in range(len(modes) + 1)
        for subset in itertools.combinations(sorted(modes), n)
    )


def _union(values: tuple[int, ...]) -> int:
    out = 0
    for v in values:
        out |= v
    return out


@settings(max_examples=200, deadline=None)
@given(
    opens=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), min_size=1, max_size=4),
    downgrades=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), max_size=3),
)
def test_downgrade_follows_the_opens_in_effect(
    opens: list[tuple[int, int]], downgrades: list[tuple[int, int]]
) -> None:
    """OPEN_DOWNGRADE (RFC 8881 §18.18.3) against the rule written with sets: the share
    values of the OPENs in effect are kept as bit masks; every downgrade is accepted or
    refused (NFS4ERR_INVAL) as the rule says, and leaves the values the rule leaves."""
    sm = StateManager(None, instance=b"INST")
    of = SimpleNamespace(readable=True, writable=True, close=lambda: None)
    access, deny = opens[0]
    o = sm.add_open(A, b"a", b"f" * 16, access, deny, of)  # type: ignore[arg-type]
    acc_modes, deny_modes = {access}, {deny}
    for access, deny in opens[1:]:
        sm.upgrade_open(o, access, deny, None)
        acc_modes.add(access)
        deny_modes.add(deny)
    for access, deny in downgrades:
        if access & ~o.access or deny & ~o.deny:
            continue  # (op_open_downgrade refuses these before asking the state)
        if not (_union_of_some(access, acc_modes) and _union_of_some(deny, deny_modes)):
            with pytest.raises(Nfs4Error):
                sm.downgrade_open(o, access, deny)
            continue
        sm.downgrade_open(o, access, deny)
        acc_modes = {a for a in acc_modes if a & ~access == 0} | {access}
        deny_modes = {d for d in deny_modes if d & ~deny == 0} | {deny}
        assert (o.access, o.deny) == (access, deny)
        assert o.access_modes == sum(1 << a for a in acc_modes)
        assert o.deny_modes == sum(1 << d for d in deny_modes)
