"""The async NFSv4.1 client library.

::

    async with nfsrdma.connect("nfs://server/export", uid=1000, gid=1000) as fs:
        await fs.write_bytes("hello.txt", b"hi")
        async with fs.open("big.bin", "rb") as f:
            n = await f.readinto(buffer)
        async for entry in fs.scandir("/"):
            print(entry.name, entry.stat.st_size)

``rdma://host[:port]/path`` uses RPC-over-RDMA (port 20049), ``nfs://`` TCP (port 2049).
Failures raise ``NfsError`` (an OSError: FileNotFoundError, PermissionError, ... with the
NFS status in ``.status``).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from dataclasses import replace
from types import TracebackType
from typing import Any

from nfsrdma.client.attrs import FileStat
from nfsrdma.client.errors import NfsError, nfs_error
from nfsrdma.client.file import NfsFile
from nfsrdma.client.fs import DirEntry, NfsClient
from nfsrdma.client.transports import RdmaUnavailable, open_connection
from nfsrdma.client.url import NfsUrl, parse_url
from nfsrdma.session.client import ClientSession, SessionError
from nfsrdma.session.client_setup import SessionOptions

__all__ = [
    "ClientSession",
    "DirEntry",
    "FileStat",
    "NfsClient",
    "NfsError",
    "NfsFile",
    "NfsUrl",
    "RdmaUnavailable",
    "SessionError",
    "SessionOptions",
    "connect",
    "nfs_error",
    "parse_url",
]


async def open_client(
    url: str | NfsUrl, options: SessionOptions, *, rtrext: bool = True, rtrext_tbsn: bool = False
) -> NfsClient:
    """Connect, create the session and find the URL's directory."""
    target = parse_url(url) if isinstance(url, str) else url
    if options.sec != "sys" and not options.gss_host:
        options = replace(options, gss_host=target.host)
    session = ClientSession(
        lambda: open_connection(target, rtrext=rtrext, rtrext_tbsn=rtrext_tbsn), options
    )
    await session.start()
    if options.sec == "auto":
        from nfsrdma.client.security import choose_security

        try:
            await choose_security(session)
        except BaseException:
            await session.close()
            raise
    client = NfsClient(session, target)
    try:
        await client.mount()
    except BaseException:
        await session.close()
        raise
    return client


class Connecting:
    """What :func:`connect` returns: ``await`` it, or use it with ``async with``."""

    def __init__(
        self,
        url: str | NfsUrl,
        options: SessionOptions,
        *,
        rtrext: bool = True,
        rtrext_tbsn: bool = False,
    ) -> None:
        self.url = url
        self.options = options
        self.rtrext = rtrext
        self.rtrext_tbsn = rtrext_tbsn
        self.client: NfsClient | None = None

    def __await__(self) -> Generator[Any, None, NfsClient]:
        return open_client(
            self.url, self.options, rtrext=self.rtrext, rtrext_tbsn=self.rtrext_tbsn
        ).__await__()

    async def __aenter__(self) -> NfsClient:
        self.client = await open_client(
            self.url, self.options, rtrext=self.rtrext, rtrext_tbsn=self.rtrext_tbsn
        )
        return self.client

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.client is not None:
            await self.client.aclose()


def connect(
    url: str | NfsUrl,
    *,
    uid: int | None = None,
    gid: int | None = None,
    gids: tuple[int, ...] = (),
    slots: int = 64,
    rsize: int = 1 << 20,
    wsize: int = 1 << 20,
    timeout: float = 10.0,
    backchannel: bool = True,
    rtrext: bool = True,
    rtrext_tbsn: bool = False,
    **options: Any,
) -> Connecting:
    """Connect to ``nfs://host[:port]/path`` or ``rdma://host[:port]/path``.

    ``uid``/``gid``/``gids`` are the AUTH_SYS identity (this process's by default);
    ``slots`` the session slots asked for (calls in flight); ``rsize``/``wsize`` the largest
    READ/WRITE (the server may grant less); ``timeout`` how long a silent server is given before
    the connection is replaced; ``rtrext`` offers the rtrext extension (message continuation
    between nfsrdma peers, RT-X1) on ``rdma://``; ``rtrext_tbsn`` sends WRITE data by
    send-based placement when the server accepts it too (off by default). Other keywords go to :class:`SessionOptions`."""
    opts = SessionOptions(
        slots=slots,
        rsize=rsize,
        wsize=wsize,
        uid=os.getuid() if uid is None else uid,
        gid=os.getgid() if gid is None else gid,
        gids=tuple(gids),
        backchannel=backchannel,
        probe_interval=timeout,
        probe_timeout=timeout,
        **options,
    )
    return Connecting(url, opts, rtrext=rtrext, rtrext_tbsn=rtrext_tbsn)
