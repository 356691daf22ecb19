"""Issue 9: running out of descriptors (or memory, space, quota) is never NFS4ERR_IO.

EMFILE/ENFILE/ENOMEM are transient resource shortages: the client is told NFS4ERR_DELAY and
retries. The descriptor table is really filled (under a lowered RLIMIT_NOFILE, restored after)
while LOOKUP and READDIR run through the operation handlers on a real LocalVfs.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from nfsrdma.nfs4.context import CompoundContext
from nfsrdma.nfs4.errors import status_of
from nfsrdma.nfs4.ops import HANDLERS
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.auth import Credential
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.transport.tcp import TcpConnection
from nfsrdma.vfs import LocalVfs
from nfsrdma.xdr.gen import nfs4, rpc

from .conftest import ROOT, needs_root

pytestmark = needs_root


@contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """Every descriptor number below a lowered soft RLIMIT_NOFILE in use; all restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(n) for n in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 32, hard))
    filler: list[int] = []
    try:
        while True:
            try:
                filler.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
            except OSError as e:
                assert e.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def run(vfs: LocalVfs, *ops: tuple[int, Any]) -> list[int]:
    """Operations through their handlers in one context; the statuses until the first error."""
    server = ServerState(ServerConfig(), vfs, cast(Any, None), StateManager(vfs))
    ctx = CompoundContext(
        server=server,
        cred=ROOT,
        principal=Credential(rpc.AUTH_SYS, 0, 0, ()),
        conn=RpcConnection(TcpConnection("test:0")),
        now=0.0,
    )
    out: list[int] = []
    try:
        for op, args in ops:
            try:
                HANDLERS[op].handler(ctx, args)
                out.append(nfs4.NFS4_OK)
            except Exception as e:
                out.append(status_of(e))
                break
    finally:
        server.executor.shutdown()
    return out


def test_out_of_descriptors_is_delay(vfs: LocalVfs, export_dir: Path) -> None:
    (export_dir / "d").mkdir()
    (export_dir / "f").write_bytes(b"x")
    lookup = (nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"f"))
    readdir = (nfs4.OP_READDIR, nfs4.READDIR4args(0, bytes(8), 4096, 8192, []))
    root = (nfs4.OP_PUTROOTFH, None)
    d = (nfs4.OP_PUTFH, nfs4.PUTFH4args(vfs.lookup(ROOT, vfs.root_handle(), b"d")))
    vfs.release_identity()
    with descriptors_exhausted():
        statuses = [run(vfs, root, lookup), run(vfs, d, readdir)]
    vfs.release_identity()
    delay = nfs4.NFS4ERR_DELAY
    assert [[nfs4.nfsstat4(s).name for s in r] for r in statuses] == [
        ["NFS4_OK", nfs4.nfsstat4(delay).name],
        ["NFS4_OK", nfs4.nfsstat4(delay).name],
    ]
    assert run(vfs, root, lookup) == [nfs4.NFS4_OK, nfs4.NFS4_OK]  # and fine once freed


@pytest.mark.parametrize(
    ("err", "status"),
    [
        (errno.EMFILE, nfs4.NFS4ERR_DELAY),
        (errno.ENFILE, nfs4.NFS4ERR_DELAY),
        (errno.ENOMEM, nfs4.NFS4ERR_DELAY),
        (errno.ENOBUFS, nfs4.NFS4ERR_DELAY),
        (errno.ENOSPC, nfs4.NFS4ERR_NOSPC),
        (errno.EDQUOT, nfs4.NFS4ERR_DQUOT),
    ],
)
def test_resource_errnos(err: int, status: int) -> None:
    assert status_of(OSError(err, os.strerror(err))) == status
