"""Delegation recall between the Linux client and our client, on our server (issue 11 §1):
the Linux client reads a file and gets a read delegation from our server (the server's log
says so), our client writes the file, our server recalls the delegation (CB_RECALL on the
Linux client's back channel: its own connection over RDMA, RFC 8167), the Linux client returns
it (DELEGRETURN counted in /proc/self/mountstats) and then reads the new content."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.testbed.helpers import Knfsd, MountFactory, Proto
from nfsrdma.testbed.ours import OURS_TCP_PORT, OurServer, our_server

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def ours(knfsd: Knfsd) -> Iterator[OurServer]:
    with our_server("deleg") as srv:
        yield srv


def op_count(mountpoint: Path, op: str) -> int:
    """Calls of ``op`` in the per-op statistics of the mount at ``mountpoint``."""
    text = Path("/proc/self/mountstats").read_text()
    found = False
    for line in text.splitlines():
        if line.startswith("device "):
            found = f" mounted on {mountpoint} " in line
        elif found:
            m = re.match(rf"\s+{op}:\s+(\d+)", line)
            if m:
                return int(m.group(1))
    return 0


@pytest.mark.parametrize("proto", ["tcp", "rdma"])
def test_linux_client_returns_its_read_delegation_when_our_client_writes(
    proto: Proto, ours: OurServer, nfs_mount: MountFactory
) -> None:
    name = f"deleg-{proto}.txt"
    (ours.export / name).write_bytes(b"old content\n")
    log = ours.proc.log
    granted_before = log.read_text().count("read delegation granted")
    with nfs_mount(ours.server(proto)) as m:
        assert m.stats().xprt == proto
        path = m.mountpoint / name
        assert path.read_bytes() == b"old content\n"
        assert path.read_bytes() == b"old content\n"  # (a delegation covers the second open)
        assert log.read_text().count("read delegation granted") > granted_before
        returned_before = op_count(m.mountpoint, "DELEGRETURN")

        async def write() -> None:
            url = f"nfs://{ours.server('tcp').addr}:{OURS_TCP_PORT}/"
            async with nc.connect(url, uid=0, gid=0) as fs, fs.open(name, "wb") as f:
                await f.write(b"new content from our client\n")

        asyncio.run(write())  # its OPEN waits (NFS4ERR_DELAY) until the delegation is back
        text = log.read_text()
        recalled = rf"callback OP_CB_SEQUENCE\+OP_CB_RECALL to client \S+ over {proto}: NFS4_OK"
        assert re.search(recalled, text), "no CB_RECALL reached the Linux client"
        assert op_count(m.mountpoint, "DELEGRETURN") > returned_before
        assert path.read_bytes() == b"new content from our client\n"
