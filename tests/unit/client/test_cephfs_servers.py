"""Two nfsrdma servers in front of one CephFS (the libcephfs backend), each with its own
clients: what one server's clients do, the other's see (close-to-open), locks conflict across
servers (they are taken in Ceph too), file handles are valid on both, and no delegation is
granted on the CephFS backend (a change through the other server could not recall it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.testbed.ceph_cluster import CephCluster
from nfsrdma.xdr.gen import nfs4

from .ganesha import free_port
from .ourserver import OurServer


@pytest.fixture(scope="module")
def two_servers(
    ceph_cluster: CephCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OurServer, OurServer]]:
    servers = []
    try:
        for name in ("a", "b"):
            work = tmp_path_factory.mktemp(f"cephfs-{name}")
            servers.append(OurServer(work, free_port(), None, ceph_conf=ceph_cluster.conf).start())
        yield servers[0], servers[1]
    finally:
        for s in servers:
            s.stop()


async def test_close_to_open_and_namespace_across_servers(
    two_servers: tuple[OurServer, OurServer],
) -> None:
    a, b = two_servers
    data = os.urandom(300_000)
    async with nc.connect(a.url(), uid=0, gid=0) as fa, nc.connect(b.url(), uid=0, gid=0) as fb:
        await fa.mkdir("coherence")
        await fa.write_bytes("coherence/f", data)  # written and closed through A
        assert await fb.read_bytes("coherence/f") == data  # ... read back through B
        await fb.mkdir("coherence/from-b")
        names = sorted(await fa.listdir("coherence"))
        assert names == ["f", "from-b"]
        sa, sb = await fa.stat("coherence/f"), await fb.stat("coherence/f")
        for field in ("st_ino", "st_size", "st_mode", "st_mtime_ns", "st_ctime_ns", "change"):
            assert getattr(sa, field) == getattr(sb, field), field
        # A change through B is seen through A, with a new change attribute.
        async with fb.open("coherence/f", "r+b") as f:
            await f.write(b"B")
        after = await fa.stat("coherence/f")
        assert after.change != sa.change
        assert (await fa.read_bytes("coherence/f"))[:1] == b"B"
        await fb.rename("coherence/f", "coherence/g")
        assert sorted(await fa.listdir("coherence")) == ["from-b", "g"]
        await fa.remove("coherence/g")
        with pytest.raises(FileNotFoundError):
            await fb.stat("coherence/g")


async def test_handles_are_valid_on_both_servers(two_servers: tuple[OurServer, OurServer]) -> None:
    """A handle made by A, given to B (PUTFH), names the same file: handles carry the inode
    number and a MAC keyed by the cephx secret both servers share."""
    a, b = two_servers
    async with nc.connect(a.url(), uid=0, gid=0) as fa, nc.connect(b.url(), uid=0, gid=0) as fb:
        await fa.write_bytes("handle-file", b"h")
        fh, st = await fa._lookup([b"handle-file"])
        assert (await fb.stat_fh(fh)).st_ino == st.st_ino
        forged = fh[:-1] + bytes([fh[-1] ^ 1])
        with pytest.raises(OSError) as ei:
            await fb.stat_fh(forged)
        assert getattr(ei.value, "status", None) == nfs4.NFS4ERR_BADHANDLE


async def test_locks_conflict_across_servers(two_servers: tuple[OurServer, OurServer]) -> None:
    a, b = two_servers
    async with nc.connect(a.url(), uid=0, gid=0) as fa, nc.connect(b.url(), uid=0, gid=0) as fb:
        await fa.write_bytes("locked", b"x" * 100)
        async with fa.open("locked", "r+b") as la, fb.open("locked", "r+b") as lb:
            await la.lock(0, 10)
            with pytest.raises(BlockingIOError) as ei:
                await lb.lock(5, 10)  # held through the other server
            assert ei.value.status == nfs4.NFS4ERR_DENIED
            await lb.lock(20, 10)  # no overlap
            await la.unlock(0, 10)
            await lb.lock(0, 10)  # free now
            with pytest.raises(BlockingIOError):
                await la.lock(0, 1)
            await lb.unlock(0, 10)
            await la.lock(0, 10, exclusive=False)
            await lb.lock(0, 10, exclusive=False)  # shared locks coexist


async def test_no_delegations_on_cephfs(
    two_servers: tuple[OurServer, OurServer], tmp_path: Path
) -> None:
    """The same opens that get a read delegation from a server on a local directory get none
    on CephFS: a write through another server could not recall it."""
    local = OurServer(tmp_path, free_port(), tmp_path / "export").start()
    try:
        got = {}
        for name, server in (("local", local), ("cephfs", two_servers[0])):
            async with nc.connect(server.url(), uid=0, gid=0) as fs:
                await fs.write_bytes("d", b"data")
                delegations = []
                for _ in range(3):  # the first opens may come before the back channel is probed
                    async with fs.open("d", "rb") as f:
                        await f.read(4)
                        delegations.append(f.delegation is not None)
                got[name] = delegations
        assert any(got["local"]), got
        assert not any(got["cephfs"]), got
    finally:
        local.stop()
