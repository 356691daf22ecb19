"""The whole client API against NFS-Ganesha (a third-party NFSv4.1 server) and our own server,
over TCP."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import nfsrdma.client as nc
from nfsrdma.xdr.gen import nfs4
from tests.unit.client.ourserver import OurServer

from .conftest import Server


async def test_metadata_operations(
    nfs_server: Server, testdir: str, server_path: Path | None
) -> None:
    async with nc.connect(nfs_server.url(), uid=0, gid=0) as fs:
        await fs.mkdir(testdir)
        assert await fs.isdir(testdir)
        await fs.makedirs(f"{testdir}/a/b/c")
        await fs.makedirs(f"{testdir}/a/b/c", exist_ok=True)
        with pytest.raises(FileExistsError):
            await fs.makedirs(f"{testdir}/a/b/c")
        with pytest.raises(FileExistsError) as ei:
            await fs.mkdir(f"{testdir}/a")
        assert ei.value.status == nfs4.NFS4ERR_EXIST and ei.value.errno == errno.EEXIST

        await fs.write_bytes(f"{testdir}/a/f.txt", b"hello")
        st = await fs.stat(f"{testdir}/a/f.txt")
        assert stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1
        assert await fs.exists(f"{testdir}/a/f.txt")
        assert not await fs.exists(f"{testdir}/a/nope")
        with pytest.raises(FileNotFoundError) as nf:
            await fs.stat(f"{testdir}/a/nope")
        assert nf.value.status == nfs4.NFS4ERR_NOENT
        with pytest.raises(NotADirectoryError):
            await fs.stat(f"{testdir}/a/f.txt/x")

        # scandir: attributes come with READDIR
        entries = {e.name: e async for e in fs.scandir(f"{testdir}/a")}
        assert set(entries) == {"b", "f.txt"}
        assert entries["b"].is_dir() and entries["f.txt"].is_file()
        assert entries["f.txt"].stat is not None and entries["f.txt"].stat.st_size == 5
        assert sorted(await fs.listdir(f"{testdir}/a")) == ["b", "f.txt"]

        # rename, link, symlink, readlink
        await fs.rename(f"{testdir}/a/f.txt", f"{testdir}/a/b/g.txt")
        assert not await fs.exists(f"{testdir}/a/f.txt")
        await fs.link(f"{testdir}/a/b/g.txt", f"{testdir}/hard")
        assert (await fs.stat(f"{testdir}/hard")).st_nlink == 2
        await fs.symlink("a/b/g.txt", f"{testdir}/sym")
        assert await fs.readlink(f"{testdir}/sym") == "a/b/g.txt"
        assert (await fs.lstat(f"{testdir}/sym")).is_symlink()
        assert (await fs.stat(f"{testdir}/sym")).st_size == 5  # followed
        assert await fs.read_bytes(f"{testdir}/sym") == b"hello"
        await fs.symlink("a", f"{testdir}/dirlink")
        assert await fs.read_bytes(f"{testdir}/dirlink/b/g.txt") == b"hello"  # mid-path link

        # chmod, chown, utime
        await fs.chmod(f"{testdir}/hard", 0o640)
        assert stat.S_IMODE((await fs.stat(f"{testdir}/hard")).st_mode) == 0o640
        await fs.chown(f"{testdir}/hard", 1234, 5678)
        st = await fs.stat(f"{testdir}/hard")
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        await fs.utime(f"{testdir}/hard", ns=(1_000_000_000, 2_000_000_123))
        st = await fs.stat(f"{testdir}/hard")
        assert st.st_mtime_ns == 2_000_000_123 and st.st_atime_ns == 1_000_000_000
        if server_path is not None:
            local = os.stat(server_path / "hard")
            assert (local.st_uid, local.st_gid, local.st_mtime_ns) == (1234, 5678, 2_000_000_123)

        # remove / rmdir and their errors
        with pytest.raises(IsADirectoryError):
            await fs.remove(f"{testdir}/a")
        with pytest.raises(NotADirectoryError):
            await fs.rmdir(f"{testdir}/hard")
        with pytest.raises(OSError) as ne:
            await fs.rmdir(f"{testdir}/a")
        assert ne.value.errno == errno.ENOTEMPTY
        for p in ("hard", "sym", "dirlink", "a/b/g.txt"):
            await fs.remove(f"{testdir}/{p}")
        for p in ("a/b/c", "a/b", "a", ""):
            await fs.rmdir(f"{testdir}/{p}")
        assert not await fs.exists(testdir)


async def test_file_object(nfs_server: Server, testdir: str, server_path: Path | None) -> None:
    async with nc.connect(nfs_server.url(), uid=0, gid=0) as fs:
        await fs.mkdir(testdir)
        p = f"{testdir}/f"
        async with fs.open(p, "wb") as f:
            assert await f.write(b"0123456789") == 10
            assert f.tell() == 10
            await f.seek(2)
            await f.write(b"ab")
            await f.fsync()
        async with fs.open(p, "r+b") as f:
            assert await f.read(4) == b"01ab"
            assert await f.seek(-2, os.SEEK_END) == 8
            assert await f.read() == b"89"
            assert await f.read() == b""
            await f.truncate(5)
            await f.seek(0)
            buf = bytearray(10)
            assert await f.readinto(buf) == 5 and bytes(buf[:5]) == b"01ab4"
        async with fs.open(p, "ab") as f:
            await f.write(b"Z")
        assert await fs.read_bytes(p) == b"01ab4Z"
        async with fs.open(p, "wb") as f:  # truncates
            await f.write(b"new")
        assert await fs.read_bytes(p) == b"new"
        with pytest.raises(FileExistsError):
            await fs.open(p, "xb")
        f2 = await fs.open(f"{testdir}/x", "xb")
        await f2.close()
        await f2.close()  # idempotent
        with pytest.raises(ValueError):
            await f2.read()
        with pytest.raises(FileNotFoundError):
            await fs.open(f"{testdir}/missing", "rb")
        with pytest.raises(IsADirectoryError):
            await fs.open(testdir, "rb")
        async with fs.open(p, "rb") as f:
            with pytest.raises(Exception, match="not open for writing"):
                await f.write(b"x")
        if server_path is not None:
            assert (server_path / "f").read_bytes() == b"new"


async def test_large_io_checksums_and_32_in_flight(
    nfs_server: Server, testdir: str, server_path: Path | None
) -> None:
    """32 MiB (2 MiB on the MEM FSAL) written and read back with 32 calls in flight
    (rsize/wsize 64 KiB on the MEM FSAL, 1 MiB otherwise); checksums compared with the file as
    the server sees it."""
    size = min(32 << 20, nfs_server.max_file)
    io = 1 << 20 if size >= 32 << 20 else 64 << 10
    data = os.urandom(size)
    digest = hashlib.sha256(data).hexdigest()
    async with nc.connect(nfs_server.url(), uid=0, gid=0, slots=32, rsize=io, wsize=io) as fs:
        assert fs.session.negotiated.slots == 32
        await fs.mkdir(testdir)
        async with fs.open(f"{testdir}/blob", "wb") as f:
            assert await f.write(data) == size
        assert fs.session.slots.stats.max_in_flight == 32
        if server_path is not None:
            assert hashlib.sha256((server_path / "blob").read_bytes()).hexdigest() == digest
        fs.session.slots.stats.max_in_flight = 0
        buf = bytearray(size)
        async with fs.open(f"{testdir}/blob", "rb") as f:
            assert await f.readinto(buf) == size
        assert fs.session.slots.stats.max_in_flight == 32
        assert hashlib.sha256(buf).hexdigest() == digest
        assert (await fs.stat(f"{testdir}/blob")).st_size == size


async def test_many_small_calls_in_flight(nfs_server: Server, testdir: str) -> None:
    async with nc.connect(nfs_server.url(), uid=0, gid=0, slots=32) as fs:
        await fs.mkdir(testdir)
        await asyncio.gather(*(fs.write_bytes(f"{testdir}/{i}", b"%d" % i) for i in range(40)))
        sts = await asyncio.gather(*(fs.stat(f"{testdir}/{i}") for i in range(40)))
        assert [s.st_size for s in sts] == [len(b"%d" % i) for i in range(40)]
        assert fs.session.slots.stats.max_in_flight >= 16


async def test_stat_many(nfs_server: Server, testdir: str) -> None:
    """Many stats, several per COMPOUND; failures stay with their own path."""
    async with nc.connect(nfs_server.url(), uid=0, gid=0) as fs:
        await fs.makedirs(f"{testdir}/sub")
        names = [f"{testdir}/f{i}" for i in range(25)] + [f"{testdir}/sub/g{i}" for i in range(5)]
        await asyncio.gather(*(fs.write_bytes(n, b"x" * (i % 7)) for i, n in enumerate(names)))
        await fs.symlink("f3", f"{testdir}/link")
        calls = fs.session.stats.calls
        paths = [*names, f"{testdir}/missing", f"{testdir}/link", f"{testdir}/f1/x", "", testdir]
        got = await fs.stat_many(paths)
        for i, n in enumerate(names):
            st = got[i]
            assert isinstance(st, nc.FileStat) and st.st_size == i % 7, n
        assert isinstance(got[30], FileNotFoundError)
        link = got[31]
        assert isinstance(link, nc.FileStat) and link.is_file() and link.st_size == 3
        assert isinstance(got[32], NotADirectoryError)
        assert isinstance(got[33], nc.FileStat) and got[33].is_dir()
        assert isinstance(got[34], nc.FileStat) and got[34].is_dir()
        assert fs.session.stats.calls - calls < len(paths) // 2  # batched
        nofollow = await fs.stat_many([f"{testdir}/link"], follow_symlinks=False)
        assert isinstance(nofollow[0], nc.FileStat) and nofollow[0].is_symlink()


def _watch_denied_locks(fs: nc.NfsClient) -> asyncio.Event:
    """An event set when a LOCK through ``fs`` is answered NFS4ERR_DENIED (a spy on the public
    ``session.compound``; the call itself is unchanged)."""
    denied = asyncio.Event()
    compound = fs.session.compound

    async def spy(ops: list[nfs4.nfs_argop4], **kw: Any) -> nfs4.COMPOUND4res:
        res = await compound(ops, **kw)
        if res.status == nfs4.NFS4ERR_DENIED and any(o.argop == nfs4.OP_LOCK for o in ops):
            denied.set()
        return res

    fs.session.compound = spy  # type: ignore[method-assign]
    return denied


async def test_locks(nfs_server: Server, testdir: str) -> None:
    async with (
        nc.connect(nfs_server.url(), uid=0, gid=0) as fs1,
        nc.connect(nfs_server.url(), uid=0, gid=0) as fs2,
    ):
        await fs1.mkdir(testdir)
        await fs1.write_bytes(f"{testdir}/l", b"x" * 100)
        async with fs1.open(f"{testdir}/l", "r+b") as a, fs2.open(f"{testdir}/l", "r+b") as b:
            await a.lock(0, 10)
            with pytest.raises(BlockingIOError) as ei:
                await b.lock(5, 10)
            assert ei.value.status == nfs4.NFS4ERR_DENIED
            await b.lock(20, 10)  # no overlap
            denied = _watch_denied_locks(fs2)
            waiter = asyncio.create_task(b.lock(0, 10, blocking=True, timeout=10))
            await asyncio.wait_for(denied.wait(), 10)  # the server refused it: a's lock holds
            assert not waiter.done()
            await a.unlock(0, 10)
            await asyncio.wait_for(waiter, 10)
            if isinstance(nfs_server, OurServer):  # it wakes the waiter with CB_NOTIFY_LOCK
                assert fs2.session.stats.lock_notices == 1
            await b.unlock(0, 10)
            await a.lock(0, 10, exclusive=False)
            await b.lock(0, 10, exclusive=False)  # shared locks coexist


async def test_bad_url_and_refused_connection() -> None:
    with pytest.raises(ValueError):
        await nc.connect("http://x/")
    with pytest.raises(OSError):
        await nc.connect("nfs://127.0.0.1:1/")
    with pytest.raises(NotImplementedError):
        await nc.connect("rdma://127.0.0.1/")
