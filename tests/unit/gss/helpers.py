"""Our server with Kerberos flavours, in this process, for the RPCSEC_GSS tests."""

from __future__ import annotations

import gc
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from nfsrdma.client import connect
from nfsrdma.client.fs import NfsClient
from nfsrdma.server import NFSServer
from tests.kdc import SERVER_HOST, Kdc

ALL_SEC = ("krb5p", "krb5i", "krb5", "sys")


def owner(path: Path) -> int:
    """The owner uid as root sees it: in a new process, since the in-process server leaves
    its last client's fs identity on this thread."""
    return int(
        subprocess.run(["stat", "-c", "%u", str(path)], capture_output=True, check=True).stdout
    )


def content(path: Path) -> bytes:
    """The file's bytes as root reads them (in a new process, as ``owner``)."""
    return subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout


@asynccontextmanager
async def gss_server(
    kdc: Kdc, export: Path, sec: tuple[str, ...] = ALL_SEC, **kw: Any
) -> AsyncIterator[NFSServer]:
    export.mkdir(parents=True, exist_ok=True)
    export.chmod(0o777)
    kw.setdefault("rdma_port", None)
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        root_squash=False,
        lease_time=10,
        sec=sec,
        keytab=str(kdc.server_keytab),
        gss_host=SERVER_HOST,
        **kw,
    )
    await server.start()
    try:
        yield server
    finally:
        release(server)
        await server.close()


@asynccontextmanager
async def gss_client(
    server: NFSServer, ccache: Path | None, sec: str, **kw: Any
) -> AsyncIterator[NfsClient]:
    opts: dict[str, Any] = {"sec": sec, "gss_host": SERVER_HOST, "uid": 0, "gid": 0}
    if ccache is not None:
        opts["ccache"] = f"FILE:{ccache}"
    opts.update(kw)
    try:
        async with connect(f"nfs://127.0.0.1:{server.tcp_port}/", **opts) as fs:
            yield fs
    finally:
        release(server)


def release(server: NFSServer) -> None:
    """Give this thread (the in-process server's loop thread, and the client's) root's file
    system identity back, so the client's credential cache stays readable."""
    if server.state is not None:
        server.state.vfs.release_identity()
    gc.collect()  # credentials of clients gone release their cache now, as root
