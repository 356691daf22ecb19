"""RFC 8881 basic operations, so the harness is useful on its own: LOOKUP, OPEN/CLOSE,
READ/WRITE, READDIR, locks, file handles. Written once, run over TCP and RPC-over-RDMA."""

from __future__ import annotations

import os

from nfsrdma.client import ops
from nfsrdma.client.attrs import decode_attrs
from nfsrdma.conform.harness import OK, Harness, Session, op
from nfsrdma.conform.registry import Failed, check
from nfsrdma.xdr.gen import nfs4

G = "rfc8881-ops"
BOTH = nfs4.OPEN4_SHARE_ACCESS_BOTH


async def _create(
    h: Harness, s: Session, data: bytes = b"", owner: bytes = b"conform-owner"
) -> tuple[bytes, bytes, nfs4.stateid4]:
    """A new file in the scratch directory with ``data``, left open: (name, fh, stateid)."""
    d = await h.scratch()
    name = h.name("file")
    so = nfs4.state_owner4(s.client.clientid, owner)
    r = await s.ok([ops.putfh(d), ops.open_(so, BOTH, name, create=nfs4.UNCHECKED4), ops.getfh()])
    fh = r.resok(3).object
    stateid = r.resok(2).stateid
    if data:
        w = (await s.ok([ops.putfh(fh), ops.write(stateid, 0, data, nfs4.FILE_SYNC4)])).resok(2)
        if w.count != len(data):
            raise Failed(f"WRITE count {len(data)}", str(w.count))
    return name, fh, stateid


@check("CONF-OPS-1", "LOOKUP of a missing name: NOENT", "RFC 8881 §18.15.3", group=G)
async def lookup_noent(h: Harness) -> None:
    """LOOKUP of a name that does not exist in the scratch directory fails with NFS4ERR_NOENT."""
    s = await h.session()
    d = await h.scratch()
    r = await s.call([ops.putfh(d), ops.lookup(b"no-such-name-" + os.urandom(4).hex().encode())])
    r.expect(OK, OK, nfs4.NFS4ERR_NOENT)


@check("CONF-OPS-2", "OPEN creates, LOOKUP finds the same file", "RFC 8881 §18.16, §18.15", group=G)
async def open_then_lookup(h: Harness) -> None:
    """OPEN with OPEN4_CREATE makes a file; LOOKUP of its name then returns the same file handle
    as the OPEN's GETFH; CLOSE of the open stateid succeeds."""
    s = await h.session()
    name, fh, stateid = await _create(h, s)
    d = await h.scratch()
    r = await s.ok([ops.putfh(d), ops.lookup(name), ops.getfh()])
    if r.resok(3).object != fh:
        raise Failed("the same file handle from LOOKUP", "a different one")
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-3", "WRITE then READ: the same data, EOF", "RFC 8881 §18.22, §18.32", group=G)
async def write_read(h: Harness) -> None:
    """Data written with WRITE (FILE_SYNC4) reads back the same with READ, which reports eof
    when the read reaches the end of the file."""
    s = await h.session()
    data = os.urandom(3000)
    _, fh, stateid = await _create(h, s, data)
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, 8192)])).resok(2)
    if bytes(res.data) != data:
        raise Failed(f"{len(data)} bytes written", f"{len(res.data)} bytes, different")
    if not res.eof:
        raise Failed("eof TRUE at the end of the file", "eof FALSE")
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-4", "READ past the end: no data, EOF", "RFC 8881 §18.22.3", group=G)
async def read_past_eof(h: Harness) -> None:
    """READ at an offset beyond the end of the file returns zero bytes and eof TRUE."""
    s = await h.session()
    _, fh, stateid = await _create(h, s, b"abc")
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 100, 10)])).resok(2)
    if len(res.data) != 0 or not res.eof:
        raise Failed("0 bytes with eof TRUE", f"{len(res.data)} bytes, eof {res.eof}")


@check("CONF-OPS-5", "READDIR lists the directory's entries", "RFC 8881 §18.23", group=G)
async def readdir_lists(h: Harness) -> None:
    """READDIR of a new directory holding three files returns exactly their names (no "." or
    ".."), and eof."""
    s = await h.session()
    d = await h.scratch()
    sub = h.name("dir")
    r = await s.ok(
        [ops.putfh(d), ops.create(nfs4.NF4DIR, sub, {nfs4.FATTR4_MODE: 0o755}), ops.getfh()]
    )
    dfh = r.resok(3).object
    names = {b"a", b"b", b"c"}
    so = nfs4.state_owner4(s.client.clientid, b"conform-readdir")
    for n in sorted(names):
        r = await s.ok(
            [ops.putfh(dfh), ops.open_(so, BOTH, n, create=nfs4.UNCHECKED4), ops.getfh()]
        )
        await s.ok([ops.putfh(r.resok(3).object), ops.close(r.resok(2).stateid)])
    res = (
        await s.ok([ops.putfh(dfh), ops.readdir(0, bytes(8), 8192, 32768, (nfs4.FATTR4_TYPE,))])
    ).resok(2)
    got = {e.name for e in res.reply.entries}
    if got != names or not res.reply.eof:
        raise Failed(f"entries {sorted(names)} and eof", f"{sorted(got)}, eof {res.reply.eof}")


@check(
    "CONF-OPS-6",
    "Conflicting locks: DENIED, then released",
    "RFC 8881 §18.10, §18.11, §18.12",
    group=G,
)
async def locks(h: Harness) -> None:
    """A WRITE_LT lock on bytes 0-99 by one lock owner: LOCKT by another owner of an
    overlapping range is NFS4ERR_DENIED; after LOCKU the same LOCKT succeeds."""
    s = await h.session()
    _, fh, stateid = await _create(h, s, b"x" * 200)
    mine = nfs4.state_owner4(s.client.clientid, b"conform-lock-a")
    r = await s.ok([
        ops.putfh(fh),
        ops.lock(nfs4.WRITE_LT, 0, 100, open_stateid=stateid, lock_owner=mine),
    ])  # fmt: skip
    lock_stateid = r.resok(2).lock_stateid
    other = nfs4.state_owner4(s.client.clientid, b"conform-lock-b")
    lockt = op(nfs4.OP_LOCKT, nfs4.LOCKT4args(nfs4.WRITE_LT, 50, 100, other))
    (await s.call([ops.putfh(fh), lockt])).expect(
        OK, OK, nfs4.NFS4ERR_DENIED, what="LOCKT while locked"
    )
    await s.ok([ops.putfh(fh), ops.locku(nfs4.WRITE_LT, lock_stateid, 0, 100)])
    (await s.call([ops.putfh(fh), lockt])).expect(OK, OK, OK, what="LOCKT after LOCKU")


@check("CONF-OPS-7", "CLOSE twice: BAD_STATEID or OLD_STATEID", "RFC 8881 §18.2.3, §8.2.4", group=G)
async def close_twice(h: Harness) -> None:
    """A second CLOSE with the stateid the first CLOSE ended fails (NFS4ERR_BAD_STATEID or
    NFS4ERR_OLD_STATEID)."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    await s.ok([ops.putfh(fh), ops.close(stateid)])
    r = await s.call([ops.putfh(fh), ops.close(stateid)])
    if r.statuses[-1] not in (nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_OLD_STATEID):
        r.expect(OK, OK, nfs4.NFS4ERR_BAD_STATEID)


@check(
    "CONF-OPS-8",
    "GETFH without a current file handle: NOFILEHANDLE",
    "RFC 8881 §18.8.3, §16.2.3.1.2",
    group=G,
)
async def getfh_nofh(h: Harness) -> None:
    """GETFH right after SEQUENCE (no current file handle) fails with NFS4ERR_NOFILEHANDLE."""
    s = await h.session()
    (await s.call([ops.getfh()])).expect(OK, nfs4.NFS4ERR_NOFILEHANDLE)


@check("CONF-OPS-9", "PUTFH of garbage: BADHANDLE", "RFC 8881 §18.19.3", group=G)
async def putfh_garbage(h: Harness) -> None:
    """PUTFH of a file handle the server never made (random bytes) fails with
    NFS4ERR_BADHANDLE or NFS4ERR_STALE, and no later operation runs."""
    s = await h.session()
    r = await s.call([ops.putfh(os.urandom(32)), ops.getfh()])
    if r.statuses not in ([OK, nfs4.NFS4ERR_BADHANDLE], [OK, nfs4.NFS4ERR_STALE]):
        r.expect(OK, nfs4.NFS4ERR_BADHANDLE)


@check("CONF-OPS-10", "LOOKUP through a file: NOTDIR", "RFC 8881 §18.15.3", group=G)
async def lookup_notdir(h: Harness) -> None:
    """LOOKUP with a regular file as the current file handle fails with NFS4ERR_NOTDIR."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    (await s.call([ops.putfh(fh), ops.lookup(b"x")])).expect(OK, OK, nfs4.NFS4ERR_NOTDIR)
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-11", "REMOVE, then LOOKUP: NOENT", "RFC 8881 §18.25", group=G)
async def remove_then_lookup(h: Harness) -> None:
    """After CLOSE and REMOVE of a file, LOOKUP of its name fails with NFS4ERR_NOENT."""
    s = await h.session()
    name, fh, stateid = await _create(h, s, b"gone")
    await s.ok([ops.putfh(fh), ops.close(stateid)])
    d = await h.scratch()
    await s.ok([ops.putfh(d), ops.remove(name)])
    (await s.call([ops.putfh(d), ops.lookup(name)])).expect(OK, OK, nfs4.NFS4ERR_NOENT)


@check("CONF-OPS-12", "OPEN GUARDED4 of an existing file: EXIST", "RFC 8881 §18.16.3", group=G)
async def open_guarded_exists(h: Harness) -> None:
    """OPEN with OPEN4_CREATE and GUARDED4 of a name that exists fails with NFS4ERR_EXIST."""
    s = await h.session()
    name, fh, stateid = await _create(h, s)
    await s.ok([ops.putfh(fh), ops.close(stateid)])
    d = await h.scratch()
    so = nfs4.state_owner4(s.client.clientid, b"conform-guarded")
    r = await s.call([ops.putfh(d), ops.open_(so, BOTH, name, create=nfs4.GUARDED4)])
    r.expect(OK, OK, nfs4.NFS4ERR_EXIST)


@check(
    "CONF-OPS-13", "SETATTR size truncates; GETATTR reports it", "RFC 8881 §18.30, §18.7", group=G
)
async def setattr_size(h: Harness) -> None:
    """SETATTR of size 10 with the open stateid truncates a 100-byte file; GETATTR then
    reports size 10 and READ returns 10 bytes with eof."""
    s = await h.session()
    _, fh, stateid = await _create(h, s, bytes(range(100)))
    await s.ok([ops.putfh(fh), ops.setattr_({nfs4.FATTR4_SIZE: 10}, stateid)])
    r = await s.ok([ops.putfh(fh), ops.getattr_((nfs4.FATTR4_SIZE,))])
    size = decode_attrs(r.resok(2).obj_attributes).get(nfs4.FATTR4_SIZE)
    if size != 10:
        raise Failed("size 10", repr(size))
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, 100)])).resok(2)
    if bytes(res.data) != bytes(range(10)) or not res.eof:
        raise Failed("the first 10 bytes with eof", f"{len(res.data)} bytes, eof {res.eof}")
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-14", "RENAME moves the name", "RFC 8881 §18.26", group=G)
async def rename(h: Harness) -> None:
    """RENAME (SAVEFH = source directory, current = target directory) makes the file
    reachable under the new name, with the same file handle, and not under the old one."""
    s = await h.session()
    name, fh, stateid = await _create(h, s)
    await s.ok([ops.putfh(fh), ops.close(stateid)])
    d = await h.scratch()
    new = h.name("renamed")
    await s.ok([ops.putfh(d), ops.savefh(), ops.putfh(d), ops.rename(name, new)])
    r = await s.ok([ops.putfh(d), ops.lookup(new), ops.getfh()])
    if r.resok(3).object != fh:
        raise Failed("the same file handle under the new name", "a different one")
    (await s.call([ops.putfh(d), ops.lookup(name)])).expect(OK, OK, nfs4.NFS4ERR_NOENT)


@check("CONF-OPS-15", "Symbolic link: CREATE and READLINK", "RFC 8881 §18.4, §18.24", group=G)
async def symlink(h: Harness) -> None:
    """CREATE of an NF4LNK stores the link text; READLINK returns it unchanged (its data is
    DDP-eligible over RPC-over-RDMA, RFC 8267)."""
    s = await h.session()
    d = await h.scratch()
    text = b"../some/where/" + b"x" * 200
    r = await s.ok([ops.putfh(d), ops.create(nfs4.NF4LNK, h.name("link"), {}, text), ops.getfh()])
    got = (await s.ok([ops.putfh(r.resok(3).object), ops.readlink()])).resok(2).link
    if bytes(got) != text:
        raise Failed(f"the link text ({len(text)} bytes)", repr(bytes(got)[:60]))


@check("CONF-OPS-16", "OPEN of a directory: ISDIR", "RFC 8881 §18.16.3", group=G)
async def open_dir(h: Harness) -> None:
    """OPEN (CLAIM_NULL, no create) of a name that is a directory fails with NFS4ERR_ISDIR."""
    s = await h.session()
    d = await h.scratch()
    sub = h.name("dir")
    await s.ok([ops.putfh(d), ops.create(nfs4.NF4DIR, sub, {nfs4.FATTR4_MODE: 0o755})])
    so = nfs4.state_owner4(s.client.clientid, b"conform-open-dir")
    r = await s.call([ops.putfh(d), ops.open_(so, nfs4.OPEN4_SHARE_ACCESS_READ, sub)])
    r.expect(OK, OK, nfs4.NFS4ERR_ISDIR)


@check(
    "CONF-OPS-17",
    "WRITE UNSTABLE4 then COMMIT: the same verifier",
    "RFC 8881 §18.32.3, §18.3.3",
    group=G,
)
async def write_commit(h: Harness) -> None:
    """An UNSTABLE4 WRITE and the COMMIT that follows it (no server restart between) return
    the same write verifier."""
    s = await h.session()
    _, fh, stateid = await _create(h, s)
    w = (await s.ok([ops.putfh(fh), ops.write(stateid, 0, b"u" * 1000, nfs4.UNSTABLE4)])).resok(2)
    c = (await s.ok([ops.putfh(fh), ops.commit(0, 0)])).resok(2)
    if w.writeverf != c.writeverf:
        raise Failed(f"COMMIT verifier {w.writeverf.hex()}", c.writeverf.hex())
    await s.ok([ops.putfh(fh), ops.close(stateid)])


@check("CONF-OPS-18", "32 KiB WRITE and READ round trip", "RFC 8881 §18.22, §18.32", group=G)
async def large_io(h: Harness) -> None:
    """A 32 KiB WRITE (FILE_SYNC4) and a 32 KiB READ of it return the same data (over
    RPC-over-RDMA these go beyond a 4 KiB inline threshold: Read chunks, Write chunks or
    Long messages)."""
    s = await h.session()
    data = os.urandom(32 << 10)
    _, fh, stateid = await _create(h, s, data)
    res = (await s.ok([ops.putfh(fh), ops.read(stateid, 0, len(data))])).resok(2)
    if bytes(res.data) != data:
        raise Failed(f"the {len(data)} bytes written", f"{len(res.data)} bytes, different")
    await s.ok([ops.putfh(fh), ops.close(stateid)])
