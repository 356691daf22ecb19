"""Our client against knfsd in the test bed, over TCP and over RDMA: the whole API, 32 MiB
written and read back with 32 calls in flight and checksums compared with the file on the
server's export, exactly-once resends after a connection killed mid-WRITE and mid-RENAME
(knfsd's reply cache), and a delegation recalled by the server (CB_RECALL on our connection,
DELEGRETURN; UL-22).

The RDMA cases run over rxe0 through ``nfsrdma.client.transports.connect_rdma``; the test bed
has RDMA, so an RDMA case that cannot connect FAILS (it is never skipped)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.client.transports import RdmaUnavailable
from nfsrdma.testbed.constants import KNFSD_RDMA_PORT, KNFSD_TCP_PORT
from nfsrdma.testbed.helpers import Knfsd
from tests.unit.client import test_api, test_faults

pytestmark = pytest.mark.testbed

PROTOS = ["tcp", "rdma"]


@dataclass
class KnfsdTarget:
    """knfsd in the shape the host client tests expect of a server."""

    addr: str
    proto: str
    export_dir: Path
    max_file: int = 1 << 40

    @property
    def port(self) -> int:
        return KNFSD_RDMA_PORT if self.proto == "rdma" else KNFSD_TCP_PORT

    def url(self, port: int | None = None) -> str:
        """The export's URL; with ``port``, that of a fault proxy on 127.0.0.1 in front."""
        scheme = "rdma" if self.proto == "rdma" else "nfs"
        host = self.addr if port is None else "127.0.0.1"
        return f"{scheme}://{host}:{port or self.port}/"


async def _require(target: KnfsdTarget) -> None:
    """Connect once, failing with a clear message when the transport is not there."""
    try:
        async with nc.connect(target.url(), uid=0, gid=0) as fs:
            rpc = fs.session.rpc
            assert rpc is not None and rpc.conn.kind == target.proto
    except RdmaUnavailable as e:
        pytest.fail(f"RDMA must work in the test bed: {e}")


def _dirs(knfsd: Knfsd, name: str) -> tuple[str, Path]:
    return name, Path(knfsd.export) / name


@pytest.mark.parametrize("proto", PROTOS)
async def test_client_api_against_knfsd(knfsd: Knfsd, proto: str) -> None:
    target = KnfsdTarget(knfsd.addr, proto, Path(knfsd.export))
    await _require(target)
    name, where = _dirs(knfsd, f"api-{proto}")
    await test_api.test_metadata_operations(target, name, where)  # type: ignore[arg-type]
    name, where = _dirs(knfsd, f"file-{proto}")
    await test_api.test_file_object(target, name, where)  # type: ignore[arg-type]
    await test_api.test_locks(target, f"locks-{proto}")  # type: ignore[arg-type]


@pytest.mark.parametrize("proto", PROTOS)
async def test_client_32mib_checksums_32_in_flight(knfsd: Knfsd, proto: str) -> None:
    target = KnfsdTarget(knfsd.addr, proto, Path(knfsd.export))
    await _require(target)
    name, where = _dirs(knfsd, f"big-{proto}")
    await test_api.test_large_io_checksums_and_32_in_flight(target, name, where)  # type: ignore[arg-type]
    (where / "blob").unlink()


async def test_client_exactly_once_against_knfsd(knfsd: Knfsd) -> None:
    """SS-13 with knfsd's reply cache: connections killed after the server ran a WRITE and a
    RENAME; the resends on the same slot and seqid are answered from the cache."""
    target = KnfsdTarget(knfsd.addr, "tcp", Path(knfsd.export))
    await test_faults.test_connection_killed_mid_write(target, "once-write")  # type: ignore[arg-type]
    await test_faults.test_connection_killed_mid_rename_renames_once(target, "once-rename")  # type: ignore[arg-type]


@pytest.mark.parametrize("proto", PROTOS)
async def test_client_returns_a_recalled_delegation(knfsd: Knfsd, proto: str) -> None:
    """UL-22: knfsd grants a read delegation to our open (the back channel shares our
    connection, TCP or RDMA, RFC 8167); a local writer on the server breaks it; knfsd sends
    CB_RECALL; we answer and DELEGRETURN, and the writer gets in well before the lease-break
    timeout."""
    target = KnfsdTarget(knfsd.addr, proto, Path(knfsd.export))
    async with nc.connect(target.url(), uid=0, gid=0) as fs:
        await fs.mkdir(f"deleg-{proto}")
        await fs.write_bytes(f"deleg-{proto}/f", b"data")
        delegated = None
        for _ in range(5):  # knfsd grants delegations once the callback path is checked
            f = await fs.open(f"deleg-{proto}/f", "rb")
            if f.delegation is not None:
                delegated = f
                break
            await f.close()
            await asyncio.sleep(1)
        assert delegated is not None, "knfsd granted no read delegation"
        assert fs.session.negotiated.backchannel
        path = Path(knfsd.export) / f"deleg-{proto}" / "f"
        t0 = time.monotonic()
        # A blocking open for writing returns the moment the lease is given up: knfsd recalls
        # the delegation (CB_RECALL), we DELEGRETURN. Had we not, the kernel would break the
        # lease only after lease-break-time (45 s), so the elapsed time tells which happened.
        fd = await asyncio.wait_for(asyncio.to_thread(os.open, path, os.O_WRONLY), 60)
        os.close(fd)
        assert time.monotonic() - t0 < 20, "the delegation was not returned (lease broken)"
        s = fs.session.stats
        assert s.callbacks >= 1 and s.recalls == 1
        assert not fs.session.delegations
        assert await delegated.read() == b"data"  # the open itself still works
        await delegated.close()
        await fs.remove(f"deleg-{proto}/f")
        await fs.rmdir(f"deleg-{proto}")


async def test_client_cli_against_knfsd(knfsd: Knfsd, tmp_path: Path) -> None:
    """``nfsrdma put``/``get``/``ls --json`` against knfsd (the CLI runs its own event loop, so
    it runs in a thread here)."""
    from nfsrdma.client.cli import main

    data = os.urandom(3 << 20)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    url = f"nfs://{knfsd.addr}:{KNFSD_TCP_PORT}/cli.bin"
    ids = ["--uid", "0", "--gid", "0"]
    assert await asyncio.to_thread(main, ["put", *ids, str(src), url]) == 0
    assert (Path(knfsd.export) / "cli.bin").read_bytes() == data
    dst = tmp_path / "dst.bin"
    assert await asyncio.to_thread(main, ["get", *ids, url, str(dst)]) == 0
    assert dst.read_bytes() == data
    assert await asyncio.to_thread(main, ["rm", *ids, url]) == 0
    assert not (Path(knfsd.export) / "cli.bin").exists()
