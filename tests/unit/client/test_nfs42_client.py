"""The client's NFSv4.2 API against our server (in this process, over TCP on 127.0.0.1):
minor version negotiation, server-side COPY (synchronous, and asynchronous with CB_OFFLOAD on
the back channel and progress reports), CLONE, SEEK, ALLOCATE/DEALLOCATE, extended attributes,
and ``nfsrdma cp`` between two paths of one server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.client import cli
from nfsrdma.client.url import parse_url
from nfsrdma.nfs4 import compound
from nfsrdma.nfs4.ops import copy as copy_ops
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[NFSServer]:
    export = tmp_path / "export"
    export.mkdir(exist_ok=True)
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
        config=ServerConfig(),
    )
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def url(server: NFSServer) -> str:
    return f"nfs://127.0.0.1:{server.tcp_port}/"


async def test_connect_negotiates_4_2_and_falls_back_to_4_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served(tmp_path) as server:
        async with (
            nc.connect(url(server), uid=0, gid=0) as fs,
            nc.connect(url(server), uid=0, gid=0, minor_versions=(1,)) as fs41,
        ):
            assert fs.minor_version == 2 and fs41.minor_version == 1
            # Each client record keeps its minor version: its callbacks' CB_COMPOUNDs carry it.
            sessions = server.state.sessions
            rec42 = sessions.client(fs.session.clientid or 0)
            rec41 = sessions.client(fs41.session.clientid or 0)
            assert rec42 is not None and rec42.minorversion == 2
            assert rec41 is not None and rec41.minorversion == 1
        monkeypatch.setattr(compound, "MINOR_VERSIONS", frozenset({1}))  # a 4.1-only server
        async with nc.connect(url(server), uid=0, gid=0) as fs:
            assert fs.minor_version == 1
            await fs.write_bytes("a", b"data")
            with pytest.raises(OSError) as ei:
                await fs.copy_file("a", "b")
            assert ei.value.errno == errno.EOPNOTSUPP


async def test_copy_file_synchronous_and_asynchronous(tmp_path: Path) -> None:
    async with served(tmp_path) as server, nc.connect(url(server), uid=0, gid=0) as fs:
        export = tmp_path / "export"
        small = os.urandom(100_000)
        await fs.write_bytes("small", small)
        reads_before = server.state.offloads
        assert await fs.copy_file("small", "small.copy") == len(small)
        assert (export / "small.copy").read_bytes() == small
        assert len(reads_before) == 0
        # Larger than SYNC_COPY_MAX: asynchronous once the back channel was probed.
        service = server.state.delegation_service
        assert service is not None
        assert await service.probe(fs.session.clientid or 0)
        big = os.urandom(copy_ops.SYNC_COPY_MAX + 3 * 65536 + 7)
        (export / "big").write_bytes(big)
        seen: list[tuple[int, int]] = []
        callbacks_before = fs.session.stats.callbacks
        n = await fs.copy_file("big", "big.copy", progress=lambda d, t: seen.append((d, t)))
        assert n == len(big)
        assert (export / "big.copy").read_bytes() == big
        assert seen and seen[-1] == (len(big), len(big))
        assert fs.session.stats.callbacks > callbacks_before  # CB_OFFLOAD came back
        done = list(server.state.offloads._done.values())
        assert len(done) == 1 and done[0].copied == len(big) and done[0].status == 0


async def test_clone_seek_space_and_xattrs(tmp_path: Path) -> None:
    async with served(tmp_path) as server, nc.connect(url(server), uid=0, gid=0) as fs:
        export = tmp_path / "export"
        await fs.write_bytes("src", b"x" * 8192)
        with pytest.raises(OSError) as ei:  # ext4 / tmpfs: no shared blocks
            await fs.clone("src", "dst")
        assert ei.value.errno == errno.EOPNOTSUPP
        async with fs.open("sparse", "w+b") as f:
            await f.allocate(0, 1 << 20)
            assert (export / "sparse").stat().st_size == 1 << 20
            await f.write(b"y" * (1 << 20))
            await f.deallocate(4096, 65536)
            assert await f.seek_data(0) == 0
            assert await f.seek_hole(0) == 4096
            assert await f.seek_data(4096) == 4096 + 65536
            with pytest.raises(OSError) as ei:
                await f.seek_hole(2 << 20)
            assert ei.value.errno == errno.ENXIO
        data = (export / "sparse").read_bytes()
        assert data[4096 : 4096 + 65536] == bytes(65536) and data[:4096] == b"y" * 4096
        await fs.setxattr("src", "k1", b"v1", create=True)
        with pytest.raises(FileExistsError):
            await fs.setxattr("src", "k1", b"v1", create=True)
        await fs.setxattr("src", "k2", b"v2")
        assert await fs.getxattr("src", "k1") == b"v1"
        assert await fs.listxattr("src") == ["k1", "k2"]
        await fs.removexattr("src", "k1")
        with pytest.raises(OSError) as ei:
            await fs.getxattr("src", "k1")
        assert ei.value.errno == errno.ENODATA
        assert os.getxattr(export / "src", "user.k2") == b"v2"


async def test_cli_cp_on_one_server_copies_server_side(tmp_path: Path) -> None:
    """``nfsrdma cp URL URL`` on one server: COPY, no READ through the client."""
    async with served(tmp_path) as server:
        export = tmp_path / "export"
        data = os.urandom(200_000)
        (export / "f").write_bytes(data)
        args = argparse.Namespace(
            uid=0, gid=0, slots=8, rsize=1 << 20, wsize=1 << 20, timeout=10.0, progress=False
        )
        async with cli.clients(args) as cs:
            src, dst = parse_url(url(server) + "f"), parse_url(url(server) + "g")
            result = await cli._remote_copy(cs, src, dst, args)
            (fs,) = cs.open.values()
            assert fs.io_stats.copied_reads == 0 and fs.io_stats.placed_reads == 0
        assert result["server_copy"] is True and result["bytes"] == len(data)
        assert (export / "g").read_bytes() == data


async def test_copy_into_a_file_delegated_to_another_client_recalls_it(tmp_path: Path) -> None:
    """A COPY with special stateids (no OPEN of its own) into a file another client holds a
    read delegation on: the delegation is recalled (NFS4ERR_DELAY until it is back), as an
    anonymous WRITE would; then the copy is done."""
    from nfsrdma.client import ops
    from nfsrdma.nfs4.context import ANONYMOUS_STATEID
    from nfsrdma.xdr.gen import nfs4

    async with served(tmp_path) as server:
        export = tmp_path / "export"
        (export / "src").write_bytes(b"new content")
        (export / "dst").write_bytes(b"old content")
        service = server.state.delegation_service
        assert service is not None
        async with nc.connect(url(server), uid=0, gid=0) as a, nc.connect(url(server)) as b:
            assert await service.probe(a.session.clientid or 0)
            async with a.open("dst", "rb") as held:
                assert held.delegation is not None  # A holds a read delegation
                src_fh = (await b._lookup([b"src"]))[0]
                dst_fh = (await b._lookup([b"dst"]))[0]
                copy = nfs4.COPY4args(
                    ANONYMOUS_STATEID, ANONYMOUS_STATEID, 0, 0, 11, True, True, []
                )
                res = await b.session.compound(
                    [
                        ops.putfh(src_fh),
                        ops.savefh(),
                        ops.putfh(dst_fh),
                        nfs4.nfs_argop4(nfs4.OP_COPY, copy),
                    ]
                )
                assert res.status == nfs4.NFS4_OK
                assert a.session.stats.recalls == 1 and held.delegation is None
                assert b.session.stats.delays >= 1  # NFS4ERR_DELAY while it was recalled
        assert (export / "dst").read_bytes() == b"new content"


async def test_offload_status_reports_progress_and_offload_cancel_stops_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An asynchronous COPY in 64 KiB steps: the client, polling at once, gets progress from
    OFFLOAD_STATUS before CB_OFFLOAD ends it; another one cancelled with OFFLOAD_CANCEL stops
    short, sends no CB_OFFLOAD, and OFFLOAD_STATUS then says it is complete."""
    from nfsrdma.client import nfs42, ops
    from nfsrdma.xdr.gen import nfs4

    monkeypatch.setattr(copy_ops, "COPY_CHUNK", 64 << 10)
    async with served(tmp_path) as server, nc.connect(url(server), uid=0, gid=0) as fs:
        export = tmp_path / "export"
        service = server.state.delegation_service
        assert service is not None and await service.probe(fs.session.clientid or 0)
        data = os.urandom(copy_ops.SYNC_COPY_MAX * 2)
        (export / "src").write_bytes(data)
        seen: list[int] = []
        async with fs.open("src", "rb") as src, fs.open("dst", "wb") as dst:
            n = await nfs42.copy_range(fs, src, dst, progress=lambda d, _t: seen.append(d), poll=0)
        assert n == len(data) and (export / "dst").read_bytes() == data
        assert len(seen) >= 2 and seen == sorted(seen) and seen[-1] == len(data)
        # OFFLOAD_CANCEL of a copy under way.
        callbacks_before = fs.session.stats.callbacks
        async with fs.open("src", "rb") as src, fs.open("dst2", "wb") as dst:
            args = nfs4.COPY4args(src.stateid, dst.stateid, 0, 0, len(data), True, False, [])
            res = await fs.session.compound(
                [
                    ops.putfh(src.fh),
                    ops.savefh(),
                    ops.putfh(dst.fh),
                    nfs4.nfs_argop4(nfs4.OP_COPY, args),
                ]
            )
            (copy_sid,) = ops.results(res)[-1].cr_response.wr_callback_id
            cancel = nfs4.OFFLOAD_CANCEL4args(copy_sid)
            res = await fs.session.compound(
                [ops.putfh(dst.fh), nfs4.nfs_argop4(nfs4.OP_OFFLOAD_CANCEL, cancel)]
            )
            assert res.status == nfs4.NFS4_OK
            record = server.state.offloads.find(fs.session.clientid or 0, copy_sid)
            assert record.task is not None
            await asyncio.gather(record.task, return_exceptions=True)
            status = nfs4.OFFLOAD_STATUS4args(copy_sid)
            res = await fs.session.compound(
                [ops.putfh(dst.fh), nfs4.nfs_argop4(nfs4.OP_OFFLOAD_STATUS, status)]
            )
            st = ops.results(res)[-1]
            assert st.osr_complete and st.osr_count < len(data)
        assert (export / "dst2").stat().st_size < len(data)
        assert fs.session.stats.callbacks == callbacks_before  # no CB_OFFLOAD after a cancel
