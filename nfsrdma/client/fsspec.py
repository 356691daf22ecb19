"""An fsspec file system over the async client: ``nfs://`` (TCP) and ``rdma://`` (RPC-over-RDMA).

::

    import pandas
    df = pandas.read_csv("rdma://server/data/table.csv")
    fs = fsspec.filesystem("nfs", host="server", uid=1000, gid=1000)
    fs.ls("/data")

An instance is bound to one server (``host``, ``port``), like fsspec's sftp: its paths are
absolute paths from the server's root (the NFSv4 pseudo-root), and full URLs name the server
themselves. Installed with ``pip install nfsrdma[fsspec]``, fsspec finds the two schemes through
the ``fsspec.specs`` entry points.

It is an ``AsyncFileSystem``: fsspec runs the coroutines on its own event loop thread (or on
the caller's loop with ``asynchronous=True``). One NFS client (one session) is shared by every
instance that names the same (scheme, host, port, uid, gid, groups) on the same loop; ``close()``
(or the end of the program) closes it. Errors are the client's: ``NfsError``, an ``OSError``
subclass matching the NFS status (``FileNotFoundError``, ``PermissionError`` ...).

``open()`` gives buffered files: reads go through fsspec's read-ahead cache (``block_size``
bytes at a time, each fetched with as many READs in flight as the session allows); writes are
buffered and sent when ``block_size`` bytes are pending, on ``flush()`` and on ``close()``
(which also COMMITs). ``cp_file`` copies through the client; ``mv`` of one path is a RENAME.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime
import errno
import os
import posixpath
from collections.abc import Callable
from glob import has_magic
from typing import Any

import fsspec.asyn
from fsspec.asyn import AsyncFileSystem, sync
from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.spec import AbstractBufferedFile

from nfsrdma.client import Connecting, connect
from nfsrdma.client.attrs import FileStat
from nfsrdma.client.file import NfsFile
from nfsrdma.client.fs import NfsClient, gather_limited
from nfsrdma.client.url import DEFAULT_PORTS, is_url, normalise, parse_url
from nfsrdma.session.client import ClientSession

COPY_CHUNK = 8 << 20  # client-side copies and get/put move this much per READ/WRITE batch
IN_FLIGHT = 32  # files removed at once by rm

Connector = Callable[[], Any]  # returns an awaitable Connection (a transport of one's own)
PoolKey = tuple[Any, ...]

# One client per (loop, scheme, host, port, uid, gid, groups, connector): the connecting task,
# so that concurrent first uses share one connection.
_clients: dict[PoolKey, asyncio.Task[NfsClient]] = {}
_closing: set[asyncio.Task[None]] = set()  # files closed from the loop's own thread


def _ftype(st: FileStat) -> str:
    if st.is_dir():
        return "directory"
    if st.is_file():
        return "file"
    return "other"


def _range(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """fsspec's byte range (negative values from the end, None for the ends) in [0, size]."""
    s = 0 if start is None else start + size if start < 0 else start
    e = size if end is None else end + size if end < 0 else end
    return max(0, min(s, size)), max(0, min(e, size))


class NfsFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """``nfs://host[:port]/path``: NFSv4.1 over TCP (port 2049)."""

    protocol: tuple[str, ...] = ("nfs",)
    scheme = "nfs"
    root_marker = "/"
    blocksize = 4 << 20

    def __init__(
        self,
        host: str,
        port: int | None = None,
        *,
        uid: int | None = None,
        gid: int | None = None,
        gids: tuple[int, ...] | list[int] = (),
        block_size: int | None = None,
        connector: Connector | None = None,
        connect_options: dict[str, Any] | None = None,
        auto_mkdir: bool = True,
        **kwargs: Any,
    ) -> None:
        """``uid``/``gid``/``gids``: the AUTH_SYS identity (this process's by default);
        ``block_size``: the read-ahead and write buffer of ``open()``; ``connect_options``: more
        keywords for :func:`nfsrdma.connect` (``slots``, ``rsize``, ``timeout`` ...);
        ``connector``: a coroutine function making the transport connection instead of the
        URL's (an RDMA device of one's own, for example); ``auto_mkdir``: writing a file makes
        its missing parent directories (as object stores and fsspec's memory file system do)."""
        super().__init__(**kwargs)
        self.host = host
        self.port = DEFAULT_PORTS[self.scheme] if port is None else int(port)
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.gids = tuple(gids)
        if block_size is not None:
            self.blocksize = block_size
        self.connector = connector
        self.connect_options = dict(connect_options or {})
        self.auto_mkdir = auto_mkdir

    # -- names ---------------------------------------------------------------------------------
    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """A URL or a path as an absolute, normalised path on the server."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        return parse_url(path).path if is_url(path) else normalise(path)

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        if not is_url(path):
            return {}
        url = parse_url(path)
        return {"host": url.host, "port": url.port}

    def unstrip_protocol(self, name: str) -> str:
        if is_url(name):
            return name
        return f"{self.scheme}://{self.netloc}{normalise(name)}"

    def _url(self, path: str = "/") -> str:
        return f"{self.scheme}://{self.netloc}{normalise(path)}"

    # -- the shared client ---------------------------------------------------------------------
    def _key(self, loop: asyncio.AbstractEventLoop) -> PoolKey:
        return (
            loop,
            self.scheme,
            self.host,
            self.port,
            self.uid,
            self.gid,
            self.gids,
            self.connector,
        )

    async def _client(self) -> NfsClient:
        loop = asyncio.get_running_loop()
        key = self._key(loop)
        task = _clients.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = _clients[key] = loop.create_task(self._connect())
        return await asyncio.shield(task)

    async def _connect(self) -> NfsClient:
        pending: Connecting = connect(
            self._url(), uid=self.uid, gid=self.gid, gids=self.gids, **self.connect_options
        )
        if self.connector is None:
            return await pending
        session = ClientSession(self.connector, pending.options)
        await session.start()
        client = NfsClient(session, parse_url(self._url()))
        try:
            await client.mount()
        except BaseException:
            await session.close()
            raise
        return client

    async def _close(self) -> None:
        """Close the client this instance uses (the next operation connects again)."""
        task = _clients.pop(self._key(asyncio.get_running_loop()), None)
        if task is not None:
            await _close_task(task)

    def close(self) -> None:
        """Close the client this instance uses (shared with instances naming the same server
        and identity); the next operation connects again."""
        if self.asynchronous:
            raise RuntimeError("with asynchronous=True, await fs._close()")
        sync(self.loop, self._close)

    # -- metadata ------------------------------------------------------------------------------
    def _details(self, path: str, st: FileStat, islink: bool = False) -> dict[str, Any]:
        return {
            "name": path,
            "size": st.st_size,
            "type": _ftype(st),
            "mtime": st.st_mtime,
            "mode": st.st_mode,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "nlink": st.st_nlink,
            "ino": st.st_ino,
            "islink": islink,
        }

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        c = await self._client()
        st = await c.lstat(path)
        if not st.is_symlink():
            return self._details(path, st)
        try:
            return self._details(path, await c.stat(path), islink=True)
        except FileNotFoundError:  # a dangling link: the link itself
            return self._details(path, st, islink=True)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        c = await self._client()
        out: list[dict[str, Any]] = []
        try:
            async for entry in c.scandir(path):
                full = posixpath.join(path, entry.name)
                if entry.stat is None or entry.stat.is_symlink():
                    out.append(await self._info(full))
                else:
                    out.append(self._details(full, entry.stat))
        except NotADirectoryError:
            out = [await self._info(path)]
        out.sort(key=lambda d: d["name"])
        return out if detail else [d["name"] for d in out]

    async def _modified(self, path: str) -> datetime.datetime:
        info = await self._info(path)
        return datetime.datetime.fromtimestamp(info["mtime"], tz=datetime.UTC)

    def modified(self, path: str) -> datetime.datetime:
        return sync(self.loop, self._modified, path)  # type: ignore[no-any-return]

    # -- whole files ----------------------------------------------------------------------------
    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        c = await self._client()
        async with c.open(path, "rb") as f:
            if start is None and end is None:
                return await f.read()
            lo, hi = _range(start, end, f.size)
            if hi <= lo:
                return b""
            buf = bytearray(hi - lo)
            n = await f.pread_into(memoryview(buf), lo)
            return bytes(buf[:n])

    async def _pipe_file(
        self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        path = self._strip_protocol(path)
        async with await self._open_nfs(path, "xb" if mode == "create" else "wb") as f:
            await f.write(value)

    async def _put_file(
        self,
        lpath: str,
        rpath: str,
        callback: Callback = DEFAULT_CALLBACK,
        mode: str = "overwrite",
        **kwargs: Any,
    ) -> None:
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            await self._makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as src:
            callback.set_size(os.fstat(src.fileno()).st_size)
            async with await self._open_nfs(rpath, "xb" if mode == "create" else "wb") as f:
                while chunk := src.read(COPY_CHUNK):
                    await f.write(chunk)
                    callback.relative_update(len(chunk))

    async def _get_file(
        self, rpath: str, lpath: str, callback: Callback = DEFAULT_CALLBACK, **kwargs: Any
    ) -> None:
        rpath = self._strip_protocol(rpath)
        c = await self._client()
        try:
            f = await c.open(rpath, "rb")
        except IsADirectoryError:
            os.makedirs(lpath, exist_ok=True)
            return
        try:
            callback.set_size(f.size)
            with open(lpath, "wb") as dst:
                while chunk := await f.read(COPY_CHUNK):
                    dst.write(chunk)
                    callback.relative_update(len(chunk))
        finally:
            await f.close()

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy through the client (READs, then WRITEs); a directory is made, not copied."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        c = await self._client()
        try:
            src = await c.open(path1, "rb")
        except IsADirectoryError:
            await self._makedirs(path2, exist_ok=True)
            return
        try:
            async with await self._open_nfs(path2, "wb") as dst:
                while chunk := await src.read(COPY_CHUNK):
                    await dst.write(chunk)
        finally:
            await src.close()

    # -- names ----------------------------------------------------------------------------------
    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        c = await self._client()
        if not create_parents:
            await c.mkdir(path)
            return
        if await self._exists(path):
            raise FileExistsError(errno.EEXIST, "file exists", path)
        await self._makedirs(path, exist_ok=True)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        c = await self._client()
        if path == "/":
            if not exist_ok:
                raise FileExistsError(errno.EEXIST, "file exists", path)
            return
        await c.makedirs(path, exist_ok=exist_ok)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        c = await self._client()
        await c.remove(self._strip_protocol(path))

    async def _rmdir(self, path: str) -> None:
        c = await self._client()
        await c.rmdir(self._strip_protocol(path))

    def rmdir(self, path: str) -> None:
        sync(self.loop, self._rmdir, path)

    async def _rm(
        self,
        path: str | list[str],
        recursive: bool = False,
        batch_size: int | None = None,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Remove files (IN_FLIGHT at a time), then the directories, deepest first."""
        paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        c = await self._client()
        dirs: list[str] = []

        async def one(p: str) -> None:
            try:
                await c.remove(p)
            except IsADirectoryError:
                dirs.append(p)

        await gather_limited([one(p) for p in paths], batch_size or IN_FLIGHT)
        for d in sorted(dirs, key=lambda p: p.count("/"), reverse=True):
            await c.rmdir(d)

    async def _mv_file(self, path1: str, path2: str) -> None:
        c = await self._client()
        await c.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """One path (file or directory) moves with a RENAME on the server (into ``path2`` when
        that is a directory or ends with ``/``); lists and patterns copy, then remove."""
        if (
            isinstance(path1, str)
            and isinstance(path2, str)
            and not has_magic(path1)
            and maxdepth is None
        ):
            src = self._strip_protocol(path1)
            dst = self._strip_protocol(path2)
            if path2.endswith("/") or self.isdir(dst):
                dst = posixpath.join(dst, posixpath.basename(src))
            if src != dst:
                sync(self.loop, self._mv_file, src, dst)
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        sync(self.loop, self._touch, path, truncate)

    async def _touch(self, path: str, truncate: bool = True) -> None:
        path = self._strip_protocol(path)
        c = await self._client()
        if truncate or not await self._exists(path):
            await self._pipe_file(path, b"")
        else:
            await c.utime(path)

    # -- open() ---------------------------------------------------------------------------------
    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> NfsBufferedFile:
        return NfsBufferedFile(
            self,
            path,
            mode,
            block_size=block_size or self.blocksize,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )

    async def _open_nfs(self, path: str, mode: str) -> NfsFile:
        """Open for ``mode``; for writing, the missing parent directories are made first
        (unless ``auto_mkdir=False``)."""
        c = await self._client()
        try:
            return await c.open(path, mode)
        except FileNotFoundError:
            parent = posixpath.dirname(normalise(path))
            if mode.startswith("r") or not self.auto_mkdir or parent == "/":
                raise
        await self._makedirs(parent, exist_ok=True)
        return await c.open(path, mode)


class RdmaFileSystem(NfsFileSystem):
    """``rdma://host[:port]/path``: NFSv4.1 over RPC-over-RDMA (port 20049)."""

    protocol = ("rdma",)
    scheme = "rdma"


class NfsBufferedFile(AbstractBufferedFile):  # type: ignore[misc]
    """What ``NfsFileSystem.open`` returns. The NFS file is opened at once (so a missing file,
    a refused permission or ``x`` mode on an existing file raise there) and stays open until
    ``close()``. Reads fill fsspec's cache (read-ahead by default) with pipelined READs;
    writes are buffered and sent at ``block_size``, ``flush()`` and ``close()``."""

    fs: NfsFileSystem

    def __init__(
        self,
        fs: NfsFileSystem,
        path: str,
        mode: str = "rb",
        block_size: int | str = "default",
        autocommit: bool = True,
        cache_type: str = "readahead",
        cache_options: dict[str, Any] | None = None,
        size: int | None = None,
        **kwargs: Any,
    ) -> None:
        if mode not in ("rb", "wb", "ab", "xb"):
            raise ValueError(f"invalid mode: {mode!r}")
        if not autocommit:
            raise NotImplementedError("transactions (autocommit=False) are not supported")
        if fs.asynchronous:
            raise NotImplementedError("open() needs a file system with asynchronous=False")
        self._nfs: NfsFile | None = None
        self._nfs = sync(fs.loop, fs._open_nfs, path, mode)
        base = self._nfs.size if mode == "ab" else 0
        self._base = base  # where the first written byte goes
        super().__init__(
            fs,
            path,
            mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_type=cache_type,
            cache_options=cache_options,
            size=self._nfs.size if mode == "rb" else size,
            **kwargs,
        )

    def _fetch_range(self, start: int, end: int) -> bytes:
        return sync(self.fs.loop, self._pread, start, end)  # type: ignore[no-any-return]

    async def _pread(self, start: int, end: int) -> bytes:
        assert self._nfs is not None
        if end <= start:
            return b""
        buf = bytearray(end - start)
        n = await self._nfs.pread_into(memoryview(buf), start)
        return bytes(buf[:n])

    def _initiate_upload(self) -> None:
        """Nothing: the file was opened (created, truncated) in ``__init__``."""

    def _upload_chunk(self, final: bool = False) -> bool:
        sync(self.fs.loop, self._write, self.buffer.getvalue(), self._base + self.offset)
        return True

    async def _write(self, data: bytes, offset: int) -> None:
        assert self._nfs is not None
        await self._nfs.pwrite(memoryview(data), offset)

    def close(self) -> None:
        if getattr(self, "_nfs", None) is None:
            return
        try:
            super().close()
        finally:
            nfs, self._nfs = self._nfs, None
            assert nfs is not None
            loop = self.fs.loop
            if loop is not None and loop.is_running():
                running = _running_loop()
                if running is not None and running is loop:  # collected on the loop's thread
                    task = running.create_task(nfs.close())
                    _closing.add(task)
                    task.add_done_callback(_closing.discard)
                else:
                    sync(loop, nfs.close)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _close_task(task: asyncio.Task[NfsClient]) -> None:
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):
        client = await task
        await client.aclose()


def close_all() -> None:
    """Close every client that runs on fsspec's own loop (their sessions end cleanly); done at
    exit, and by whoever stops the servers they talk to first."""
    loop = fsspec.asyn.loop[0]  # None: fsspec never started its loop
    mine = [k for k in _clients if k[0] is loop]
    if loop is None or not mine or not loop.is_running():
        return

    async def close_them() -> None:
        await asyncio.gather(*(_close_task(_clients.pop(k)) for k in mine))

    with contextlib.suppress(Exception):
        sync(loop, close_them, timeout=10)


atexit.register(close_all)
