"""Hole 1 of issue 9: a directory moved out of the export by a local process is unreachable.

Driven through the real server path: our ClientSession sends COMPOUNDs over TCP on 127.0.0.1
to an NFSServer serving a LocalVfs. The descriptors of the directory and of a file inside it are
hot in the server's descriptor cache (the client has just used them) when a local process moves
the directory beside the export; every use of their handles must then answer NFS4ERR_STALE,
nothing may be created outside, and the handles work again once the directory is back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import nfsrdma.server
from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.context import ANONYMOUS_STATEID
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.tcp import connect_tcp
from nfsrdma.vfs import FileType, LocalVfs, StaleHandle
from nfsrdma.xdr.gen import nfs4

from .conftest import ROOT, MakeVfs, needs_root

pytestmark = needs_root
OK = nfs4.NFS4_OK
STALE = nfs4.NFS4ERR_STALE
MODES = [
    pytest.param({}, id="kernel-clone"),  # what `nfsrdma serve` does as root
    pytest.param({"clone_mount": False}, id="kernel-noclone"),
    pytest.param({"handle_mode": "cache"}, id="cache-clone"),
    pytest.param({"handle_mode": "cache", "clone_mount": False}, id="cache-noclone"),
]


def op(num: int, args: Any = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


def putfh(fh: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh))


def lookup(name: str) -> nfs4.nfs_argop4:
    return op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name.encode()))


def getfh() -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETFH)


def read(sid: nfs4.stateid4 = ANONYMOUS_STATEID) -> nfs4.nfs_argop4:
    return op(nfs4.OP_READ, nfs4.READ4args(sid, 0, 1024))


def getattr_type() -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETATTR, nfs4.GETATTR4args(bitmap_of([nfs4.FATTR4_TYPE])))


def mode_attrs() -> nfs4.fattr4:
    return nfs4.fattr4(bitmap_of([nfs4.FATTR4_MODE]), (0o644).to_bytes(4, "big"))


def mkdir(name: str) -> nfs4.nfs_argop4:
    return op(
        nfs4.OP_CREATE,
        nfs4.CREATE4args(nfs4.createtype4(nfs4.NF4DIR), name.encode(), mode_attrs()),
    )


def open_create(name: str) -> nfs4.nfs_argop4:
    how = nfs4.openflag4(nfs4.OPEN4_CREATE, nfs4.createhow4(nfs4.UNCHECKED4, mode_attrs()))
    return op(
        nfs4.OP_OPEN,
        nfs4.OPEN4args(
            0,
            nfs4.OPEN4_SHARE_ACCESS_BOTH,
            nfs4.OPEN4_SHARE_DENY_NONE,
            nfs4.state_owner4(0, b"owner"),
            how,
            nfs4.open_claim4(nfs4.CLAIM_NULL, name.encode()),
        ),
    )


def open_read(name: str) -> nfs4.nfs_argop4:
    return op(
        nfs4.OP_OPEN,
        nfs4.OPEN4args(
            0,
            nfs4.OPEN4_SHARE_ACCESS_READ,
            nfs4.OPEN4_SHARE_DENY_NONE,
            nfs4.state_owner4(0, b"owner"),
            nfs4.openflag4(nfs4.OPEN4_NOCREATE),
            nfs4.open_claim4(nfs4.CLAIM_NULL, name.encode()),
        ),
    )


class Client:
    def __init__(self, session: ClientSession) -> None:
        self.s = session

    async def call(self, status: int, *ops: nfs4.nfs_argop4) -> list[Any]:
        res = await self.s.compound(list(ops))
        got = [
            (
                r.resop.name,
                nfs4.nfsstat4(getattr(r.value, dataclasses.fields(r.value)[0].name)).name,
            )
            for r in res.resarray
        ]
        assert nfs4.nfsstat4(res.status).name == nfs4.nfsstat4(status).name, got
        return [getattr(r.value, "value", None) for r in res.resarray]

    async def fh(self, base: bytes | None, *names: str) -> bytes:
        first = op(nfs4.OP_PUTROOTFH) if base is None else putfh(base)
        out = await self.call(OK, first, *[lookup(n) for n in names], getfh())
        fh: bytes = out[-1].object
        return fh

    async def data(self, fh: bytes, sid: nfs4.stateid4 = ANONYMOUS_STATEID) -> bytes:
        out = await self.call(OK, putfh(fh), read(sid))
        return bytes(out[1].data)


@contextlib.asynccontextmanager
async def served(tmp_path: Path, vfs_options: dict[str, Any]) -> AsyncIterator[Client]:
    export = tmp_path / "export"
    export.mkdir(exist_ok=True)
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
    )
    # The real LocalVfs, with the handle mode / mount clone under test.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nfsrdma.server, "LocalVfs", functools.partial(LocalVfs, **vfs_options))
        await server.start()
    port = server.tcp_port
    session = ClientSession(
        lambda: connect_tcp("127.0.0.1", port),
        SessionOptions(backchannel=False, owner=b"moved-out-test"),
    )
    try:
        await session.start()
        yield Client(session)
    finally:
        await session.close()
        await server.close()


@pytest.mark.parametrize("vfs_options", MODES)
async def test_directory_moved_out_while_its_handles_are_hot(
    tmp_path: Path, vfs_options: dict[str, Any]
) -> None:
    export, outside = tmp_path / "export", tmp_path / "outside"
    (export / "dir").mkdir(parents=True)
    (export / "dir" / "file").write_bytes(b"data")
    outside.mkdir()
    async with served(tmp_path, vfs_options) as c:
        root = await c.fh(None)
        d = await c.fh(root, "dir")
        f = await c.fh(d, "file")
        opened = await c.call(OK, putfh(d), open_read("file"))
        sid = opened[1].stateid
        assert await c.data(f) == b"data"
        assert await c.data(f, sid) == b"data"

        os.rename(export / "dir", outside / "dir")  # a local process moves it out
        (outside / "dir" / "file").write_bytes(b"outside data")
        (outside / "dir" / "other").write_bytes(b"never served")

        await c.call(STALE, putfh(d))
        await c.call(STALE, putfh(d), getattr_type())
        await c.call(STALE, putfh(d), lookup("other"))
        await c.call(STALE, putfh(d), lookup("file"), read())
        await c.call(STALE, putfh(f), read())
        await c.call(STALE, putfh(f), read(sid))
        await c.call(STALE, putfh(d), mkdir("planted-dir"))
        await c.call(STALE, putfh(d), open_create("planted-file"))
        assert sorted(os.listdir(outside / "dir")) == ["file", "other"]
        assert sorted(os.listdir(export)) == []

        # Back inside: the same handles work again.
        os.rename(outside / "dir", export / "dir")
        assert await c.fh(d, "file") == f
        assert await c.data(f) == b"outside data"
        await c.call(OK, putfh(d), mkdir("made-inside"))
        assert (export / "dir" / "made-inside").is_dir()


@pytest.mark.parametrize("vfs_options", MODES)
async def test_directory_moved_within_the_export_keeps_working(
    tmp_path: Path, vfs_options: dict[str, Any]
) -> None:
    export = tmp_path / "export"
    (export / "a" / "dir").mkdir(parents=True)
    (export / "b").mkdir()
    (export / "a" / "dir" / "file").write_bytes(b"data")
    async with served(tmp_path, vfs_options) as c:
        root = await c.fh(None)
        d = await c.fh(root, "a", "dir")
        f = await c.fh(d, "file")
        os.rename(export / "a" / "dir", export / "b" / "moved")
        await c.call(OK, putfh(d), getattr_type())
        assert await c.fh(d, "file") == f
        assert await c.data(f) == b"data"
        await c.call(OK, putfh(d), mkdir("new"))
        assert (export / "b" / "moved" / "new").is_dir()
        assert await c.fh(root, "b", "moved") == d


@pytest.mark.parametrize("vfs_options", MODES)
async def test_file_whose_parent_moved_out(tmp_path: Path, vfs_options: dict[str, Any]) -> None:
    """Only the file's handle is used after the move (its directory's handle never is)."""
    export, outside = tmp_path / "export", tmp_path / "outside"
    (export / "dir" / "sub").mkdir(parents=True)
    (export / "dir" / "sub" / "file").write_bytes(b"data")
    outside.mkdir()
    async with served(tmp_path, vfs_options) as c:
        f = await c.fh(None, "dir", "sub", "file")
        sub = await c.fh(None, "dir", "sub")
        os.rename(export / "dir", outside / "dir")
        await c.call(STALE, putfh(f), read())
        await c.call(STALE, putfh(f), getattr_type())
        await c.call(STALE, putfh(sub), open_create("planted"))
        assert not (outside / "dir" / "sub" / "planted").exists()


def test_hard_link_rule(make_vfs: MakeVfs, export_dir: Path, tmp_path: Path) -> None:
    """A file is served while it has a name inside the export that the server knows: when the
    name it was looked up under is removed and only an outside link remains, it is stale; a
    LOOKUP of another inside link makes the same handle usable again."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (export_dir / "a").write_bytes(b"data")
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    fh = vfs.lookup(ROOT, root, b"a")
    os.link(export_dir / "a", outside / "a")
    (export_dir / "a").unlink()
    with pytest.raises(StaleHandle):
        vfs.getattr(fh)
    os.link(outside / "a", export_dir / "b")
    assert vfs.lookup(ROOT, root, b"b") == fh
    assert vfs.getattr(fh).type == FileType.NF4REG
    (export_dir / "b").unlink()
    with pytest.raises(StaleHandle):
        vfs.getattr(fh)


def test_names_that_end_like_deleted_ones(make_vfs: MakeVfs, export_dir: Path) -> None:
    """The kernel marks an unlinked name with " (deleted)"; a real name may end so too."""
    (export_dir / "x (deleted)").mkdir()
    (export_dir / "x (deleted)" / "f (deleted)").write_bytes(b"data")
    for options in MODES:
        vfs = make_vfs(root_squash=False, **options.values[0])  # type: ignore[arg-type]
        d = vfs.lookup(ROOT, vfs.root_handle(), b"x (deleted)")
        f = vfs.lookup(ROOT, d, b"f (deleted)")
        assert vfs.getattr(f).size == 4
        assert vfs.getattr(d).type == FileType.NF4DIR


@pytest.mark.parametrize("vfs_options", MODES)
def test_cold_file_handle_after_its_parent_moved_out(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, vfs_options: dict[str, Any]
) -> None:
    """The file's descriptor was evicted (a 1-entry cache): resolving its handle afresh finds
    it outside and answers stale; moved back, it resolves again."""
    (export_dir / "dir").mkdir()
    (export_dir / "dir" / "f").write_bytes(b"data")
    (export_dir / "other").mkdir()
    vfs = make_vfs(root_squash=False, fd_cache_size=1, **vfs_options)
    root = vfs.root_handle()
    f = vfs.lookup(ROOT, vfs.lookup(ROOT, root, b"dir"), b"f")
    vfs.lookup(ROOT, root, b"other")  # evicts f
    vfs.release_identity()
    os.rename(export_dir / "dir", tmp_path / "outside")
    with pytest.raises(StaleHandle):
        vfs.getattr(f)
    with pytest.raises(StaleHandle):
        vfs.open(ROOT, f, read=True, write=False)
    vfs.release_identity()
    os.rename(tmp_path / "outside", export_dir / "dir")
    assert vfs.anonymous_read(ROOT, f, 0, 10) == (b"data", True)


@pytest.mark.parametrize("vfs_options", MODES)
def test_the_export_root_renamed_keeps_serving_its_tree(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, vfs_options: dict[str, Any]
) -> None:
    """The root is the directory opened at start (it defines "inside"): renamed by a local
    process, it and everything below it stay served, and a directory moved out of it (now
    beside it under its new name) is still stale."""
    (export_dir / "d").mkdir()
    (export_dir / "d" / "f").write_bytes(b"data")
    (export_dir / "e").mkdir()
    vfs = make_vfs(root_squash=False, **vfs_options)
    root = vfs.root_handle()
    d = vfs.lookup(ROOT, root, b"d")
    f = vfs.lookup(ROOT, d, b"f")
    e = vfs.lookup(ROOT, root, b"e")
    vfs.release_identity()
    renamed = tmp_path / "renamed"
    os.rename(export_dir, renamed)
    os.rename(renamed / "e", tmp_path / "e")
    assert vfs.getattr(root).type == FileType.NF4DIR
    assert vfs.lookup(ROOT, d, b"f") == f
    assert vfs.anonymous_read(ROOT, f, 0, 10) == (b"data", True)
    with pytest.raises(StaleHandle):
        vfs.getattr(e)


@pytest.mark.parametrize("vfs_options", MODES)
async def test_file_moved_out_by_itself(tmp_path: Path, vfs_options: dict[str, Any]) -> None:
    export, outside = tmp_path / "export", tmp_path / "outside"
    (export / "dir").mkdir(parents=True)
    (export / "dir" / "file").write_bytes(b"data")
    outside.mkdir()
    async with served(tmp_path, vfs_options) as c:
        f = await c.fh(None, "dir", "file")
        assert await c.data(f) == b"data"
        os.rename(export / "dir" / "file", outside / "file")
        await c.call(STALE, putfh(f), read())
        os.rename(outside / "file", export / "dir" / "file")
        assert await c.data(f) == b"data"
