"""RFC 8881 operations: the error each operation must answer to a wrong use, and a few more
behaviours (links, VERIFY, locks, stateids) a server developer needs checked. Written once,
run over TCP and RPC-over-RDMA."""

from __future__ import annotations

import os

from nfsrdma.client import ops
from nfsrdma.client.attrs import encode_attrs
from nfsrdma.conform.checks_rfc8881_ops import BOTH, _create
from nfsrdma.conform.harness import OK, Harness, Reply, Session, _names, op, status_name
from nfsrdma.conform.registry import Failed, check
from nfsrdma.xdr.gen import nfs4

G = "rfc8881-ops"
ANON = nfs4.stateid4(0, bytes(12))


def _either(r: Reply, *last: int) -> None:
    """Every operation but the last must succeed; the last must fail with one of ``last``."""
    st = r.statuses
    if st and all(x == OK for x in st[:-1]) and st[-1] in last:
        return
    want = " or ".join(status_name(x) for x in last)
    raise Failed(f"NFS4_OK for all but the last, then {want}", _names(st))


def _bogus_stateid() -> nfs4.stateid4:
    return nfs4.stateid4(1, os.urandom(12))


async def _subdir(h: Harness, s: Session) -> tuple[bytes, bytes]:
    d = await h.scratch()
    name = h.name("dir")
    r = await s.ok([ops.putfh(d), ops.create(nfs4.NF4DIR, name, {nfs4.FATTR4_MODE: 0o755}),
                    ops.getfh()])  # fmt: skip
    return name, r.resok(3).object


@check("CONF-OPS-19", "LOOKUP of an empty name: INVAL", "RFC 8881 §18.15.3", group=G)
async def lookup_empty(h: Harness) -> None:
    """LOOKUP of a zero-length component fails with NFS4ERR_INVAL."""
    s = await h.session()
    d = await h.scratch()
    (await s.call([ops.putfh(d), ops.lookup(b"")])).expect(OK, OK, nfs4.NFS4ERR_INVAL)


@check("CONF-OPS-20", "LOOKUPP of the root: NOENT", "RFC 8881 §18.14.3", group=G)
async def lookupp_root(h: Harness) -> None:
    """LOOKUPP with the root of the server's namespace as the current file handle fails with
    NFS4ERR_NOENT (the root has no parent)."""
    s = await h.session()
    (await s.call([ops.putrootfh(), op(nfs4.OP_LOOKUPP)])).expect(OK, OK, nfs4.NFS4ERR_NOENT)


@check("CONF-OPS-21", "CREATE of a regular file: BADTYPE", "RFC 8881 §18.4.3", group=G)
async def create_regular(h: Harness) -> None:
    """CREATE with type NF4REG (regular files are made by OPEN) fails with NFS4ERR_BADTYPE."""
    s = await h.session()
    d = await h.scratch()
    r = await s.call([ops.putfh(d), ops.create(nfs4.NF4REG, h.name("reg"), {})])
    r.expect(OK, OK, nfs4.NFS4ERR_BADTYPE)


@check("CONF-OPS-22", "REMOVE of a non-empty directory: NOTEMPTY", "RFC 8881 §18.25.3", group=G)
async def remove_notempty(h: Harness) -> None:
    """REMOVE of a directory that holds a file fails with NFS4ERR_NOTEMPTY, and the directory
    is still there."""
    s = await h.session()
    name, dfh = await _subdir(h, s)
    await s.ok([ops.putfh(dfh), ops.create(nfs4.NF4DIR, b"inner", {nfs4.FATTR4_MODE: 0o755})])
    d = await h.scratch()
    (await s.call([ops.putfh(d), ops.remove(name)])).expect(OK, OK, nfs4.NFS4ERR_NOTEMPTY)
    await s.ok([ops.putfh(d), ops.lookup(name)])


@check("CONF-OPS-23", "CREATE of an existing name: EXIST", "RFC 8881 §18.4.3", group=G)
async def create_exists(h: Harness) -> None:
    """CREATE of a directory under a name that already exists fails with NFS4ERR_EXIST."""
    s = await h.session()
    name, _ = await _subdir(h, s)
    d = await h.scratch()
    r = await s.call([ops.putfh(d), ops.create(nfs4.NF4DIR, name, {nfs4.FATTR4_MODE: 0o755})])
    r.expect(OK, OK, nfs4.NFS4ERR_EXIST)


@check("CONF-OPS-24", "OPEN without create of a missing name: NOENT", "RFC 8881 §18.16.3", group=G)
async def open_nocreate_missing(h: Harness) -> None:
    """OPEN with OPEN4_NOCREATE of a name that does not exist fails with NFS4ERR_NOENT."""
    s = await h.session()
    d = await h.scratch()
    so = nfs4.state_owner4(s.client.clientid, b"conform-nocreate")
    r = await s.call([ops.putfh(d), ops.open_(so, BOTH, h.name("missing"))])
    r.expect(OK, OK, nfs4.NFS4ERR_NOENT)


@check("CONF-OPS-25", "READ of a directory: ISDIR", "RFC 8881 §18.22.3", group=G)
async def read_dir(h: Harness) -> None:
    """READ with a directory as the current file handle fails with NFS4ERR_ISDIR."""
    s = await h.session()
    _, dfh = await _subdir(h, s)
    (await s.call([ops.putfh(dfh), ops.read(ANON, 0, 10)])).expect(OK, OK, nfs4.NFS4ERR_ISDIR)


@check("CONF-OPS-26", "WRITE to a directory: ISDIR", "RFC 8881 §18.32.3", group=G)
async def write_dir(h: Harness) -> None:
    """WRITE with a directory as the current file handle fails with NFS4ERR_ISDIR."""
    s = await h.session()
    _, dfh = await _subdir(h, s)
    r = await s.call([ops.putfh(dfh), ops.write(ANON, 0, b"x", nfs4.FILE_SYNC4)])
    r.expect(OK, OK, nfs4.NFS4ERR_ISDIR)


@check(
    "CONF-OPS-27", "READLINK of a regular file: INVAL or WRONG_TYPE", "RFC 8881 §18.24.3", group=G
)
async def readlink_file(h: Harness) -> None:
    """READLINK with a regular file as the current file handle fails (NFS4ERR_INVAL, or the
    NFS4ERR_WRONG_TYPE that RFC 8881 allows for an object of the wrong type)."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    r = await s.call([ops.putfh(fh), ops.readlink()])
    _either(r, nfs4.NFS4ERR_INVAL, nfs4.NFS4ERR_WRONG_TYPE)
    await s.ok([ops.putfh(fh), ops.close(stateid)])


async def _lock_open(h: Harness) -> tuple[Session, bytes, nfs4.stateid4, nfs4.state_owner4]:
    s = await h.session()
    _, fh, stateid = await _create(h, s, b"L" * 100)
    return s, fh, stateid, nfs4.state_owner4(s.client.clientid, b"conform-lock-" + h.name("o"))


@check("CONF-OPS-28", "LOCK of length zero: INVAL", "RFC 8881 §18.10.3", group=G)
async def lock_zero_length(h: Harness) -> None:
    """LOCK with a length of 0 fails with NFS4ERR_INVAL."""
    s, fh, stateid, owner = await _lock_open(h)
    r = await s.call([ops.putfh(fh),
                      ops.lock(nfs4.WRITE_LT, 0, 0, open_stateid=stateid, lock_owner=owner)])  # fmt: skip
    r.expect(OK, OK, nfs4.NFS4ERR_INVAL)


@check("CONF-OPS-29", "LOCK beyond 2^64: INVAL", "RFC 8881 §18.10.3", group=G)
async def lock_overflow(h: Harness) -> None:
    """LOCK whose offset plus length exceeds 2^64 (and whose length is not all ones) fails
    with NFS4ERR_INVAL."""
    s, fh, stateid, owner = await _lock_open(h)
    big = (1 << 64) - 10
    r = await s.call([ops.putfh(fh),
                      ops.lock(nfs4.WRITE_LT, big, 100, open_stateid=stateid, lock_owner=owner)])  # fmt: skip
    r.expect(OK, OK, nfs4.NFS4ERR_INVAL)


@check("CONF-OPS-30", "Conflicting LOCK: DENIED with the holder", "RFC 8881 §18.10.3", group=G)
async def lock_denied(h: Harness) -> None:
    """A WRITE_LT LOCK over a range another lock owner holds fails with NFS4ERR_DENIED and a
    LOCK4denied naming an overlapping range."""
    s, fh, stateid, owner = await _lock_open(h)
    await s.ok([ops.putfh(fh),
                ops.lock(nfs4.WRITE_LT, 0, 50, open_stateid=stateid, lock_owner=owner)])  # fmt: skip
    other = nfs4.state_owner4(s.client.clientid, b"conform-lock-other")
    r = await s.call([ops.putfh(fh),
                      ops.lock(nfs4.WRITE_LT, 10, 10, open_stateid=stateid, lock_owner=other)])  # fmt: skip
    r.expect(OK, OK, nfs4.NFS4ERR_DENIED)
    denied = r.res.resarray[-1].value.value  # type: ignore[union-attr]
    if not isinstance(denied, nfs4.LOCK4denied) or denied.offset >= 50:
        raise Failed("a LOCK4denied for a range overlapping 10-19", repr(denied))


@check("CONF-OPS-31", "LOCKU with an unknown stateid: BAD_STATEID", "RFC 8881 §18.12.3", group=G)
async def locku_bad_stateid(h: Harness) -> None:
    """LOCKU with a lock stateid the server never issued fails with NFS4ERR_BAD_STATEID (or
    NFS4ERR_STALE_STATEID, when the server takes it for one of an earlier instance)."""
    s, fh, _, _ = await _lock_open(h)
    r = await s.call([ops.putfh(fh), ops.locku(nfs4.WRITE_LT, _bogus_stateid(), 0, 10)])
    _either(r, nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_STALE_STATEID)


@check("CONF-OPS-32", "WRITE with an unknown stateid: BAD_STATEID", "RFC 8881 §8.2.4", group=G)
async def write_bad_stateid(h: Harness) -> None:
    """WRITE with a stateid the server never issued (not a special stateid) fails with
    NFS4ERR_BAD_STATEID (or NFS4ERR_STALE_STATEID, when the server takes it for one of an
    earlier instance) and writes nothing."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    r = await s.call([ops.putfh(fh), ops.write(_bogus_stateid(), 0, b"no", nfs4.FILE_SYNC4)])
    _either(r, nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_STALE_STATEID)
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, 10)])).resok(2)
    if len(res.data):
        raise Failed("an empty file", f"{len(res.data)} bytes")


@check(
    "CONF-OPS-33",
    "RESTOREFH with nothing saved: NOFILEHANDLE or RESTOREFH",
    "RFC 8881 §18.27.3",
    group=G,
)
async def restorefh_nothing(h: Harness) -> None:
    """RESTOREFH when no file handle was saved fails (NFS4ERR_NOFILEHANDLE; NFS4ERR_RESTOREFH
    in NFSv4.0's wording)."""
    s = await h.session()
    r = await s.call([ops.putrootfh(), ops.restorefh()])
    _either(r, nfs4.NFS4ERR_NOFILEHANDLE, nfs4.NFS4ERR_RESTOREFH)


@check("CONF-OPS-34", "SAVEFH and RESTOREFH", "RFC 8881 §18.27, §18.28", group=G)
async def save_restore(h: Harness) -> None:
    """SAVEFH then PUTROOTFH then RESTOREFH makes the saved file handle current again: GETFH
    returns the scratch directory's file handle."""
    s = await h.session()
    d = await h.scratch()
    r = await s.ok([ops.putfh(d), ops.savefh(), ops.putrootfh(), ops.restorefh(), ops.getfh()])
    if bytes(r.resok(5).object) != bytes(d):
        raise Failed("the saved file handle", "another one")


def _type_attr(ftype: int) -> nfs4.fattr4:
    return encode_attrs({nfs4.FATTR4_TYPE: ftype})


@check("CONF-OPS-35", "VERIFY: match and mismatch", "RFC 8881 §18.31.3", group=G)
async def verify(h: Harness) -> None:
    """VERIFY of type NF4DIR on a directory succeeds; VERIFY of type NF4REG on it fails with
    NFS4ERR_NOT_SAME."""
    s = await h.session()
    d = await h.scratch()
    same = op(nfs4.OP_VERIFY, nfs4.VERIFY4args(_type_attr(nfs4.NF4DIR)))
    (await s.call([ops.putfh(d), same])).expect(OK, OK, OK, what="VERIFY type NF4DIR")
    other = op(nfs4.OP_VERIFY, nfs4.VERIFY4args(_type_attr(nfs4.NF4REG)))
    (await s.call([ops.putfh(d), other])).expect(OK, OK, nfs4.NFS4ERR_NOT_SAME)


@check("CONF-OPS-36", "NVERIFY of matching attributes: SAME", "RFC 8881 §18.17.3", group=G)
async def nverify(h: Harness) -> None:
    """NVERIFY of type NF4DIR on a directory fails with NFS4ERR_SAME; of type NF4REG it
    succeeds."""
    s = await h.session()
    d = await h.scratch()
    same = op(nfs4.OP_NVERIFY, nfs4.NVERIFY4args(_type_attr(nfs4.NF4DIR)))
    (await s.call([ops.putfh(d), same])).expect(OK, OK, nfs4.NFS4ERR_SAME)
    other = op(nfs4.OP_NVERIFY, nfs4.NVERIFY4args(_type_attr(nfs4.NF4REG)))
    (await s.call([ops.putfh(d), other])).expect(OK, OK, OK, what="NVERIFY type NF4REG")


@check("CONF-OPS-37", "LINK: a second name for the same file", "RFC 8881 §18.9", group=G)
async def link(h: Harness) -> None:
    """LINK (saved file handle = the file, current = the directory) makes a second name;
    LOOKUP of it returns the file's file handle, and the data reads the same through it."""
    s = await h.session()
    _, fh, stateid = await _create(h, s, b"linked")
    d = await h.scratch()
    new = h.name("link")
    await s.ok([ops.putfh(fh), ops.savefh(), ops.putfh(d), ops.link(new)])
    r = await s.ok([ops.putfh(d), ops.lookup(new), ops.getfh()])
    if bytes(r.resok(3).object) != bytes(fh):
        raise Failed("the linked file's handle", "another one")
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-38", "LINK of a directory: ISDIR", "RFC 8881 §18.9.3", group=G)
async def link_dir(h: Harness) -> None:
    """LINK whose saved file handle is a directory fails with NFS4ERR_ISDIR."""
    s = await h.session()
    _, dfh = await _subdir(h, s)
    d = await h.scratch()
    r = await s.call([ops.putfh(dfh), ops.savefh(), ops.putfh(d), ops.link(h.name("dlink"))])
    r.expect(OK, OK, OK, OK, nfs4.NFS4ERR_ISDIR)


@check("CONF-OPS-39", "RENAME of a missing name: NOENT", "RFC 8881 §18.26.3", group=G)
async def rename_missing(h: Harness) -> None:
    """RENAME of a source name that does not exist fails with NFS4ERR_NOENT."""
    s = await h.session()
    d = await h.scratch()
    r = await s.call([ops.putfh(d), ops.savefh(), ops.putfh(d),
                      ops.rename(h.name("ghost"), h.name("other"))])  # fmt: skip
    r.expect(OK, OK, OK, OK, nfs4.NFS4ERR_NOENT)


@check("CONF-OPS-40", "TEST_STATEID: valid and unknown stateids", "RFC 8881 §18.48.3", group=G)
async def test_stateid(h: Harness) -> None:
    """TEST_STATEID of an open stateid and of one the server never issued: the operation
    succeeds, with NFS4_OK for the first and NFS4ERR_BAD_STATEID for the second (or
    NFS4ERR_STALE_STATEID, as for WRITE and LOCKU: a server may take an unknown stateid for an
    earlier instance's, though RFC 8881 §15.1.16.6 calls that error moot in NFSv4.1)."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    r = await s.ok([op(nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([stateid, _bogus_stateid()]))])
    codes = [int(c) for c in r.resok(1).tsr_status_codes]
    if codes not in ([OK, nfs4.NFS4ERR_BAD_STATEID], [OK, nfs4.NFS4ERR_STALE_STATEID]):
        raise Failed("[NFS4_OK, NFS4ERR_BAD_STATEID]", str([status_name(c) for c in codes]))
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check(
    "CONF-OPS-41",
    "SECINFO_NO_NAME consumes the current file handle",
    "RFC 8881 §18.45.3",
    group=G,
)
async def secinfo_no_name(h: Harness) -> None:
    """SECINFO_NO_NAME (current file handle style) on the root returns at least one security
    flavor and leaves no current file handle: a GETFH after it fails with
    NFS4ERR_NOFILEHANDLE."""
    s = await h.session()
    sec = op(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH)
    r = await s.call([ops.putrootfh(), sec, ops.getfh()])
    r.expect(OK, OK, OK, nfs4.NFS4ERR_NOFILEHANDLE)
    if not r.resok(2):
        raise Failed("at least one security flavor", "none")


@check("CONF-OPS-42", "Share deny: SHARE_DENIED", "RFC 8881 §18.16.3, §9.7", group=G)
async def share_denied(h: Harness) -> None:
    """A file opened with OPEN4_SHARE_DENY_WRITE: an OPEN for write access by another open
    owner fails with NFS4ERR_SHARE_DENIED."""
    s = await h.session()
    name, fh, stateid = await _create(h, s)
    await s.ok([ops.putfh(fh), ops.close(stateid)])
    d = await h.scratch()
    first = ops.open_(nfs4.state_owner4(s.client.clientid, b"conform-deny-a"),
                      nfs4.OPEN4_SHARE_ACCESS_READ, name)  # fmt: skip
    assert isinstance(first.value, nfs4.OPEN4args)
    first.value.share_deny = nfs4.OPEN4_SHARE_DENY_WRITE
    r = await s.ok([ops.putfh(d), first])
    held = r.resok(2).stateid
    second = ops.open_(nfs4.state_owner4(s.client.clientid, b"conform-deny-b"),
                       nfs4.OPEN4_SHARE_ACCESS_WRITE, name)  # fmt: skip
    (await s.call([ops.putfh(d), second])).expect(OK, OK, nfs4.NFS4ERR_SHARE_DENIED)
    await s.ok([ops.putfh(fh), ops.close(held)])


@check("CONF-OPS-43", "WRITE past the end: the hole reads as zeros", "RFC 8881 §18.32.3", group=G)
async def write_hole(h: Harness) -> None:
    """A WRITE at offset 1000 of an empty file: READ from 0 returns 1000 zero bytes followed by
    the data, and eof."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    await s.ok([ops.putfh(fh), ops.write(stateid, 1000, b"tail", nfs4.FILE_SYNC4)])
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, 2000)])).resok(2)
    if bytes(res.data) != bytes(1000) + b"tail" or not res.eof:
        raise Failed("1000 zero bytes, 'tail', eof", f"{len(res.data)} bytes, eof {res.eof}")
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-44", "ACCESS: granted bits are supported bits", "RFC 8881 §18.1.3", group=G)
async def access(h: Harness) -> None:
    """ACCESS of READ, LOOKUP, MODIFY on the scratch directory (which the harness made): the
    server reports READ and LOOKUP as supported, and grants nothing it does not report as
    supported."""
    s = await h.session()
    d = await h.scratch()
    want = nfs4.ACCESS4_READ | nfs4.ACCESS4_LOOKUP | nfs4.ACCESS4_MODIFY
    res = (await s.ok([ops.putfh(d), op(nfs4.OP_ACCESS, nfs4.ACCESS4args(want))])).resok(2)
    if res.access & ~res.supported or not res.supported & nfs4.ACCESS4_LOOKUP:
        raise Failed(
            "access a subset of supported, LOOKUP supported",
            f"supported {res.supported:#x}, access {res.access:#x}",
        )


@check("CONF-OPS-45", "OPEN then READ with the anonymous stateid", "RFC 8881 §8.2.3", group=G)
async def anonymous_read(h: Harness) -> None:
    """READ with the anonymous special stateid (all zeros) of a file no one holds a deny
    reservation on returns its data."""
    s = await h.session()
    _, fh, stateid = await _create(h, s, b"anon")
    await s.ok([ops.putfh(fh), ops.close(stateid)])
    res = (await s.ok([ops.putfh(fh), ops.read(ANON, 0, 10)])).resok(2)
    if bytes(res.data) != b"anon":
        raise Failed("b'anon'", repr(bytes(res.data)))


@check("CONF-OPS-46", "PUTFH then GETFH: the same handle", "RFC 8881 §18.19, §18.8", group=G)
async def putfh_getfh(h: Harness) -> None:
    """GETFH right after PUTFH returns the file handle that PUTFH set."""
    s = await h.session()
    d = await h.scratch()
    r = await s.ok([ops.putfh(d), ops.getfh()])
    if bytes(r.resok(2).object) != bytes(d):
        raise Failed("the PUTFH file handle", "another one")
