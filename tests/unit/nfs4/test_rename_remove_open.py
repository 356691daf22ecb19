"""RENAME and REMOVE against open files and onto the same file (issue 11 section 4; RFC 8881
sections 18.25, 18.26.4).

* RENAME whose source and target are the same file (one name, or two hard links of one file)
  does nothing: NFS4_OK, change_info with before == after, the directories' change attributes
  unmoved, both names still there.
* REMOVE of, or RENAME over, a file a client holds open: the opener's stateid keeps working
  (READ, WRITE, LOCK, LOCKU, GETATTR, SETATTR of size, COMMIT, CLOSE) until its CLOSE, as local
  POSIX semantics keep an unlinked file for its openers; after the last CLOSE the handle is
  NFS4ERR_STALE.

Two clients are two client IDs with their own sessions on one server, through the real COMPOUND
path (``wire.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.vfs.resolver import HandleMode
from nfsrdma.xdr.gen import nfs4

from ..session.helpers import op
from .test_courtesy import lock_new, open_file, putfh
from .test_io_ops import BOTH, NOCREATE, READ
from .wire import Client, Clock, build, close, install_clock

OK = nfs4.NFS4_OK
ROOT = op(nfs4.OP_PUTROOTFH)
SAVE = op(nfs4.OP_SAVEFH)
GETFH = op(nfs4.OP_GETFH)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return install_clock(monkeypatch)


def rename(old: bytes, new: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_RENAME, nfs4.RENAME4args(old, new))


def lookup(name: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name))


def getattr_op(*numbers: int) -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETATTR, nfs4.GETATTR4args(bitmap_of(list(numbers))))


def write(sid: nfs4.stateid4, offset: int, data: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_WRITE, nfs4.WRITE4args(sid, offset, nfs4.FILE_SYNC4, data))


def read(sid: nfs4.stateid4, count: int = 64) -> nfs4.nfs_argop4:
    return op(nfs4.OP_READ, nfs4.READ4args(sid, 0, count))


def close_op(sid: nfs4.stateid4) -> nfs4.nfs_argop4:
    return op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sid))


async def change_of(c: Client, *path: bytes) -> int:
    """The change attribute of the directory at ``path`` below the root."""
    res = await c.expect(OK, ROOT, *(lookup(n) for n in path), getattr_op(nfs4.FATTR4_CHANGE))
    return int.from_bytes(c.value(res, 2 + len(path)).obj_attributes.attr_vals[:8], "big")


async def make_file(c: Client, name: bytes, data: bytes = b"") -> bytes:
    fh, sid = await open_file(c, name)
    if data:
        await c.expect(OK, putfh(fh), write(sid, 0, data))
    await c.expect(OK, putfh(fh), close_op(sid))
    return fh


def unchanged(cinfo: nfs4.change_info4) -> bool:
    return cinfo.before == cinfo.after


async def test_rename_onto_the_same_file_does_nothing(tmp_path: Path, clock: Clock) -> None:
    srv = build(tmp_path)
    try:
        c = await Client(srv, b"client-a").mount()
        await c.expect(
            OK,
            ROOT,
            op(nfs4.OP_CREATE, nfs4.CREATE4args(nfs4.createtype4(nfs4.NF4DIR), b"d", _attrs())),
        )
        fh = await make_file(c, b"a", b"content")
        # A second and a third name of the same file: b in the root, c in d.
        await c.expect(OK, putfh(fh), SAVE, ROOT, op(nfs4.OP_LINK, nfs4.LINK4args(b"b")))
        await c.expect(
            OK, putfh(fh), SAVE, ROOT, lookup(b"d"), op(nfs4.OP_LINK, nfs4.LINK4args(b"c"))
        )
        root_before = await change_of(c)
        d_before = await change_of(c, b"d")
        for old, new, into_d in ((b"a", b"a", False), (b"a", b"b", False), (b"b", b"c", True)):
            target = [lookup(b"d")] if into_d else []
            res = await c.expect(OK, ROOT, SAVE, ROOT, *target, rename(old, new))
            ok = c.value(res, len(res.resarray) - 1)
            assert unchanged(ok.source_cinfo), (old, new, ok.source_cinfo)
            assert unchanged(ok.target_cinfo), (old, new, ok.target_cinfo)
            assert ok.source_cinfo.before == root_before
        assert await change_of(c) == root_before
        assert await change_of(c, b"d") == d_before
        for path in ([b"a"], [b"b"], [b"d", b"c"]):  # every name is still there, same file
            res = await c.expect(OK, ROOT, *(lookup(n) for n in path), GETFH)
            assert c.value(res, len(res.resarray) - 1).object == fh
    finally:
        close(srv)


def _attrs() -> nfs4.fattr4:
    return nfs4.fattr4(bitmap_of([nfs4.FATTR4_MODE]), (0o755).to_bytes(4, "big"))


async def _still_usable(c: Client, fh: bytes, sid: nfs4.stateid4, content: bytes) -> None:
    """The opener's stateid works on the unlinked file: READ, WRITE, LOCK, LOCKU, GETATTR,
    SETATTR of size, COMMIT, FREE_STATEID, CLOSE; afterwards its handle is stale."""
    res = await c.expect(OK, putfh(fh), read(sid))
    assert bytes(c.value(res, 2).data) == content
    await c.expect(OK, putfh(fh), write(sid, len(content), b"+more"))
    res = await c.expect(OK, putfh(fh), read(sid))
    assert bytes(c.value(res, 2).data) == content + b"+more"
    res = await c.expect(OK, putfh(fh), lock_new(sid, b"pid", 0, 10))
    lsid = c.value(res, 2).lock_stateid
    await c.expect(OK, putfh(fh), op(nfs4.OP_LOCKU, nfs4.LOCKU4args(nfs4.WRITE_LT, 0, lsid, 0, 10)))
    res = await c.expect(OK, putfh(fh), getattr_op(nfs4.FATTR4_NUMLINKS))
    assert c.value(res, 2).obj_attributes.attr_vals == (0).to_bytes(4, "big")
    # ftruncate through the open (SETATTR of size with its stateid), then COMMIT.
    size = nfs4.fattr4(bitmap_of([nfs4.FATTR4_SIZE]), (3).to_bytes(8, "big"))
    await c.expect(OK, putfh(fh), op(nfs4.OP_SETATTR, nfs4.SETATTR4args(sid, size)))
    await c.expect(OK, putfh(fh), op(nfs4.OP_COMMIT, nfs4.COMMIT4args(0, 0)))
    res = await c.expect(OK, putfh(fh), read(sid))
    assert bytes(c.value(res, 2).data) == content[:3]
    await c.expect(OK, putfh(fh), op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(lsid)))
    await c.expect(OK, putfh(fh), close_op(sid))
    await c.expect(nfs4.NFS4ERR_STALE, putfh(fh))


async def test_an_open_file_renamed_over_stays_usable_until_close(
    tmp_path: Path, clock: Clock
) -> None:
    srv = build(tmp_path)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        fh, sa = await open_file(a, b"victim")
        await a.expect(OK, putfh(fh), write(sa, 0, b"old"))
        new_fh = await make_file(b, b"replacement", b"new")
        await b.expect(OK, ROOT, SAVE, ROOT, rename(b"replacement", b"victim"))
        res = await b.expect(OK, ROOT, lookup(b"victim"), GETFH)
        assert b.value(res, 3).object == new_fh != fh
        await _still_usable(a, fh, sa, b"old")
        # The file now called victim is the replacement, untouched by A's writes.
        _, sb = await open_file(b, b"victim", READ, how=NOCREATE)
        res = await b.expect(OK, putfh(new_fh), read(sb))
        assert bytes(b.value(res, 2).data) == b"new"
    finally:
        close(srv)


@pytest.mark.parametrize("handle_mode", ["auto", "cache"])
async def test_an_open_file_removed_stays_usable_for_every_opener(
    tmp_path: Path, clock: Clock, handle_mode: HandleMode
) -> None:
    """In both handle modes (kernel handles as root, and the name cache)."""
    srv = build(tmp_path, handle_mode=handle_mode)
    try:
        a = await Client(srv, b"client-a").mount()
        b = await Client(srv, b"client-b").mount()
        fh, sa = await open_file(a, b"doomed", BOTH)
        await a.expect(OK, putfh(fh), write(sa, 0, b"bytes"))
        _, sb = await open_file(b, b"doomed", READ, how=NOCREATE)
        await b.expect(OK, ROOT, op(nfs4.OP_REMOVE, nfs4.REMOVE4args(b"doomed")))
        await b.expect(nfs4.NFS4ERR_NOENT, ROOT, lookup(b"doomed"))
        # A is done with it first; B can still read it, then its CLOSE makes the handle stale.
        await a.expect(OK, putfh(fh), close_op(sa))
        res = await b.expect(OK, putfh(fh), read(sb))
        assert bytes(b.value(res, 2).data) == b"bytes"
        await b.expect(OK, putfh(fh), close_op(sb))
        await b.expect(nfs4.NFS4ERR_STALE, putfh(fh))
        # The remover itself holding it open: the same.
        fh2, sa2 = await open_file(a, b"own", BOTH)
        await a.expect(OK, putfh(fh2), write(sa2, 0, b"mine"))
        await a.expect(OK, ROOT, op(nfs4.OP_REMOVE, nfs4.REMOVE4args(b"own")))
        await _still_usable(a, fh2, sa2, b"mine")
    finally:
        close(srv)
