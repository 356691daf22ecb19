"""The high-level async NFSv4.1 client: paths in, Python objects and exceptions out.

Paths are relative to the directory named in the URL (a leading ``/`` makes no difference).
Each call is one COMPOUND where it can be (PUTFH of the base directory, LOOKUP per component,
then the operation), so a ``stat`` costs one round trip; symbolic links on the way are followed
(absolute link targets from the server's root), NFS4ERR_SYMLINK telling where they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from nfsrdma.client import nfs42, ops
from nfsrdma.client.attrs import (
    STAT_ATTRS,
    FileStat,
    decode_attrs,
    file_stat,
    id_to_owner,
    settime,
)
from nfsrdma.client.deleg_cache import DelegatedCache
from nfsrdma.client.errors import NfsError, nfs_error
from nfsrdma.client.file import STATE_LOST, NfsFile, OpenMode, new_owner, parse_mode
from nfsrdma.client.url import NfsUrl, normalise
from nfsrdma.session.client import ClientSession, constant_op
from nfsrdma.session.client_backchannel import Recall
from nfsrdma.xdr.gen import nfs4

MAX_SYMLINKS = 40
READDIR_MAXCOUNT = 64 << 10
# Operations that never change, built once.
GETFH = constant_op(ops.getfh())
GETATTR_STAT = constant_op(ops.getattr_(STAT_ATTRS))
T = TypeVar("T")


def encode_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def decode_name(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def split_path(path: str) -> list[bytes]:
    """The components of ``path`` under the base directory, as ``normalise`` makes them
    (``.``, empty components and ``..`` resolved); a path that is already plain (most are)
    is split without it."""
    parts = path.strip("/").split("/")
    for p in parts:
        if not p or p == "." or p == "..":
            break
    else:
        return [p.encode("utf-8", "surrogateescape") for p in parts]
    norm = normalise(path)
    return [encode_name(p) for p in norm.split("/") if p and p != "."]


def _shown(comps: list[bytes]) -> str:
    """A path for an error message."""
    return "/" + b"/".join(comps).decode("utf-8", "replace")


@dataclass(slots=True)
class IoStats:
    placed_reads: int = 0  # READ data that arrived in the caller's buffer (RDMA Write chunk)
    copied_reads: int = 0  # READ data copied from the reply into the caller's buffer (TCP)
    cached_reads: int = 0  # reads served under a read delegation without a READ


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One READDIR entry, with the attributes the server sent along."""

    name: str
    path: str
    stat: FileStat | None

    def is_dir(self) -> bool:
        return self.stat is not None and self.stat.is_dir()

    def is_file(self) -> bool:
        return self.stat is not None and self.stat.is_file()

    def is_symlink(self) -> bool:
        return self.stat is not None and self.stat.is_symlink()

    def inode(self) -> int:
        return self.stat.st_ino if self.stat is not None else 0


class Pending(Generic[T]):
    """An operation that is both awaitable and an async context manager:
    ``f = await fs.open(...)`` or ``async with fs.open(...) as f``."""

    def __init__(self, make: Callable[[], Awaitable[T]], close: Callable[[T], Awaitable[None]]):
        self._make = make
        self._close = close
        self._value: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._make()
        return self._value

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._value is not None:
            await self._close(self._value)


class NfsClient:
    """An NFSv4.1 file system at ``url``; made by :func:`nfsrdma.connect`."""

    def __init__(self, session: ClientSession, url: NfsUrl) -> None:
        self.session = session
        self.url = url
        self.root_fh = b""  # the server's root (PUTROOTFH)
        self.base_fh = b""  # the URL's directory
        self.files: set[NfsFile] = set()
        self.io_stats = IoStats()
        session.reclaim_hook = self._reclaim
        session.reopen_hook = self._reopen_all
        session.callbacks.recall_listeners.append(self._recalled)
        # CB_GETATTR (RFC 8881 20.1) is about write delegations, and we keep none: writes go
        # to the server at once, so its attributes are ours. NFS4ERR_BADHANDLE says so.
        session.backchannel.delegated_attrs = lambda fh: None

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per NFSv4.1 operation sent (SEQUENCE aside): ``count``, ``errors`` by status name,
        ``p50_ms``/``p99_ms``/``mean_ms`` of the round trips of the COMPOUNDs that carried it
        (retries and waits for a slot included), as ``nfsrdma stats`` shows a server's."""
        ops: dict[str, dict[str, Any]] = self.session.op_stats.snapshot()["ops"]
        return ops

    # -- set-up ---------------------------------------------------------------------------------
    async def mount(self) -> None:
        """Find the root and the URL's directory."""
        res = await self.session.compound([ops.putrootfh(), ops.getfh()])
        self.root_fh = ops.results(res, "PUTROOTFH", "/")[-1].object
        self.base_fh = self.root_fh
        if self.url.path != "/":
            fh, st = await self._lookup(split_path(self.url.path), start=self.root_fh)
            if not st.is_dir():
                raise nfs_error(nfs4.NFS4ERR_NOTDIR, "LOOKUP", self.url.path)
            self.base_fh = fh

    async def aclose(self) -> None:
        """Close every open file, then the session."""
        for f in list(self.files):
            with contextlib.suppress(OSError, ValueError):
                await f.close()
        await self.session.close()

    async def __aenter__(self) -> NfsClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def rsize(self) -> int:
        return self.session.negotiated.rsize

    @property
    def wsize(self) -> int:
        return self.session.negotiated.wsize

    @property
    def window(self) -> int:
        """How many READs/WRITEs one transfer keeps in flight."""
        return max(1, self.session.slots.size)

    @property
    def max_ops(self) -> int:
        return self.session.negotiated.max_operations

    # -- path resolution ------------------------------------------------------------------------
    async def _lookup(
        self, comps: list[bytes], *, follow: bool = True, start: bytes | None = None
    ) -> tuple[bytes, FileStat]:
        """The file handle and attributes of ``comps`` under ``start`` (the base directory),
        following symbolic links on the way (and at the end when ``follow``)."""
        here = self.base_fh if start is None else start
        comps = list(comps)
        first = comps
        for _ in range(MAX_SYMLINKS):
            room = max(1, self.max_ops - 4)
            if len(comps) > room:
                # Too long for one COMPOUND: walk a prefix first.
                here, _st = await self._lookup(comps[:room], start=here)
                comps = comps[room:]
                continue
            res = await self.session.compound(
                [ops.putfh(here), *map(ops.lookup, comps), GETFH, GETATTR_STAT]
            )
            if res.status == nfs4.NFS4_OK:
                got = ops.results(res)
                fh = got[-2].object
                st = file_stat(decode_attrs(got[-1].obj_attributes))
                if follow and st.is_symlink():
                    here, comps = await self._expand(here, comps, len(comps), fh)
                    continue
                return fh, st
            failed = ops.failed_index(res)  # 0: PUTFH, i: LOOKUP of comps[i-1]
            if res.status == nfs4.NFS4ERR_SYMLINK and 2 <= failed <= len(comps):
                # comps[failed-2] is a link: the LOOKUP after it failed.
                fh, _st = await self._lookup(comps[: failed - 1], follow=False, start=here)
                here, comps = await self._expand(here, comps, failed - 1, fh)
                continue
            raise nfs_error(res.status, ops._failed_op(res), _shown(first))
        raise OSError(errno.ELOOP, "too many levels of symbolic links", _shown(first))

    async def _expand(
        self, here: bytes, comps: list[bytes], n: int, link_fh: bytes
    ) -> tuple[bytes, list[bytes]]:
        """Replace the link at ``comps[n-1]`` by its target; returns the new start and path."""
        target = await self._readlink_fh(link_fh)
        rest = comps[n:]
        if target.startswith(b"/"):
            start = self.root_fh
            new = [p for p in target.split(b"/") if p]
        else:
            start = here
            new = comps[: n - 1] + [p for p in target.split(b"/") if p]
        out: list[bytes] = []
        for p in [*new, *rest]:
            if p == b".":
                continue
            if p == b"..":
                if out:
                    out.pop()
                continue
            out.append(p)
        return start, out

    async def _readlink_fh(self, fh: bytes) -> bytes:
        res = await self.session.compound([ops.putfh(fh), ops.readlink()])
        ok = ops.results(res, "READLINK")[-1]
        return bytes(ok.link)

    async def _dir_ops(self, comps: list[bytes], spare: int) -> list[nfs4.nfs_argop4]:
        """Operations that make ``comps`` (a directory) the current filehandle, leaving room
        for ``spare`` more operations in the COMPOUND."""
        if 1 + len(comps) + spare + 1 <= self.max_ops:
            return [ops.putfh(self.base_fh), *map(ops.lookup, comps)]
        fh, _ = await self._lookup(comps)
        return [ops.putfh(fh)]

    async def _at(
        self,
        path: str,
        tail: Callable[[bytes], list[nfs4.nfs_argop4]],
        *,
        op: str,
        cachethis: bool = False,
        idempotent: bool = True,
    ) -> list[Any]:
        """Run ``tail(name)`` in the parent directory of ``path``; the results of ``tail``."""
        comps = split_path(path)
        if not comps:
            raise OSError(errno.EINVAL, f"{op}: the base directory itself", path)
        parent, name = comps[:-1], comps[-1]
        body = tail(name)
        walk = await self._dir_ops(parent, len(body))
        res = await self.session.compound(walk + body, cachethis=cachethis, idempotent=idempotent)
        if res.status == nfs4.NFS4ERR_SYMLINK and ops.failed_index(res) < len(walk):
            fh, _ = await self._lookup(parent)
            walk = [ops.putfh(fh)]
            res = await self.session.compound(
                walk + body, cachethis=cachethis, idempotent=idempotent
            )
        if res.status != nfs4.NFS4_OK:
            failed = ops.failed_index(res)
            shown = path if failed >= len(walk) else posixpath.dirname("/" + path)
            raise nfs_error(res.status, op if failed >= len(walk) else "LOOKUP", shown)
        return ops.results(res)[len(walk) :]

    # -- metadata -------------------------------------------------------------------------------
    async def stat(self, path: str, *, follow_symlinks: bool = True) -> FileStat:
        _fh, st = await self._lookup(split_path(path), follow=follow_symlinks)
        return st

    async def lstat(self, path: str) -> FileStat:
        return await self.stat(path, follow_symlinks=False)

    async def stat_fh(self, fh: bytes, path: str = "") -> FileStat:
        res = await self.session.compound([ops.putfh(fh), ops.getattr_(STAT_ATTRS)])
        ok = ops.results(res, "GETATTR", path)[-1]
        return file_stat(decode_attrs(ok.obj_attributes))

    async def stat_many(
        self, paths: Sequence[str], *, follow_symlinks: bool = True, in_flight: int = 8
    ) -> list[FileStat | OSError]:
        """``stat`` of many paths, several per COMPOUND (PUTFH, LOOKUP, GETATTR for each, as
        many as ``ca_maxoperations`` allows) with ``in_flight`` COMPOUNDs at a time. Each result
        is a FileStat or the OSError that ``stat`` would have raised for that path."""
        out: list[FileStat | OSError | None] = [None] * len(paths)
        split = [split_path(p) for p in paths]
        parents: dict[tuple[bytes, ...], bytes | OSError] = {}
        for comps in split:
            if comps:
                parents.setdefault(tuple(comps[:-1]), b"")
        for parent in parents:
            if not parent:
                parents[parent] = self.base_fh
                continue
            try:
                fh, st = await self._lookup(list(parent))
                parents[parent] = fh if st.is_dir() else nfs_error(nfs4.NFS4ERR_NOTDIR, "LOOKUP")
            except OSError as e:
                parents[parent] = e
        todo: list[int] = []
        for i, comps in enumerate(split):
            dir_fh = parents.get(tuple(comps[:-1]), b"")
            if not comps:
                out[i] = await self._stat_or_error(paths[i], follow_symlinks)  # the base
            elif isinstance(dir_fh, OSError):
                out[i] = dir_fh
            else:
                todo.append(i)
        per = max(1, (self.max_ops - 1) // 3)
        batches = [todo[k : k + per] for k in range(0, len(todo), per)]

        async def run(batch: list[int]) -> None:
            while batch:
                body: list[nfs4.nfs_argop4] = []
                for i in batch:
                    dir_fh = parents[tuple(split[i][:-1])]
                    assert isinstance(dir_fh, bytes)
                    body += [ops.putfh(dir_fh), ops.lookup(split[i][-1]), GETATTR_STAT]
                res = await self.session.compound(body)
                got = res.resarray
                # On failure the last result is the failing operation's: item (len - 1) // 3.
                done = (len(got) - 1) // 3 if res.status != nfs4.NFS4_OK else len(batch)
                for k in range(done):
                    ga = got[3 * k + 2].value
                    assert isinstance(ga, nfs4.GETATTR4res) and ga.value is not None
                    st = file_stat(decode_attrs(ga.value.obj_attributes))
                    i = batch[k]
                    if follow_symlinks and st.is_symlink():
                        out[i] = await self._stat_or_error(paths[i], True)
                    else:
                        out[i] = st
                if res.status == nfs4.NFS4_OK:
                    return
                # The item at ``done`` failed; the rest go in the next COMPOUND.
                i = batch[done]
                if res.status == nfs4.NFS4ERR_SYMLINK:
                    out[i] = await self._stat_or_error(paths[i], follow_symlinks)
                else:
                    out[i] = nfs_error(res.status, ops._failed_op(res), paths[i])
                batch = batch[done + 1 :]

        await gather_limited([run(b) for b in batches], in_flight)
        return [
            r if r is not None else OSError(errno.EIO, "no result", p)
            for r, p in zip(out, paths, strict=True)
        ]

    async def _stat_or_error(self, path: str, follow: bool) -> FileStat | OSError:
        try:
            return await self.stat(path, follow_symlinks=follow)
        except OSError as e:
            return e

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except FileNotFoundError:
            return False
        return True

    async def isdir(self, path: str) -> bool:
        try:
            return (await self.stat(path)).is_dir()
        except FileNotFoundError:
            return False

    async def scandir(self, path: str = "") -> AsyncIterator[DirEntry]:
        """The directory's entries with their attributes (READDIR), as they arrive."""
        fh, st = await self._lookup(split_path(path))
        if not st.is_dir():
            raise nfs_error(nfs4.NFS4ERR_NOTDIR, "READDIR", path)
        cookie, verf = 0, bytes(8)
        maxcount = min(READDIR_MAXCOUNT, self.rsize)
        base = normalise(path)
        while True:
            res = await self.session.compound(
                [ops.putfh(fh), ops.readdir(cookie, verf, maxcount, maxcount, STAT_ATTRS)],
                reply_size=maxcount + 1024,
            )
            ok = ops.results(res, "READDIR", path)[-1]
            assert isinstance(ok, nfs4.READDIR4resok)
            verf = ok.cookieverf
            for entry in ok.reply.entries:
                cookie = entry.cookie
                name = decode_name(entry.name)
                try:
                    est: FileStat | None = file_stat(decode_attrs(entry.attrs))
                except ValueError:
                    est = None
                yield DirEntry(name, posixpath.join(base, name), est)
            if ok.reply.eof or not ok.reply.entries:
                return

    async def listdir(self, path: str = "") -> list[str]:
        return [e.name async for e in self.scandir(path)]

    async def readlink(self, path: str) -> str:
        fh, st = await self._lookup(split_path(path), follow=False)
        if not st.is_symlink():
            raise OSError(errno.EINVAL, "not a symbolic link", path)
        return decode_name(await self._readlink_fh(fh))

    async def _setattr(self, path: str, values: dict[int, Any], op: str) -> None:
        fh, _ = await self._lookup(split_path(path))
        res = await self.session.compound([ops.putfh(fh), ops.setattr_(values)], cachethis=True)
        ops.results(res, op, path)

    async def chmod(self, path: str, mode: int) -> None:
        await self._setattr(path, {nfs4.FATTR4_MODE: mode & 0o7777}, "SETATTR")

    async def chown(self, path: str, uid: int = -1, gid: int = -1) -> None:
        values: dict[int, Any] = {}
        if uid != -1:
            values[nfs4.FATTR4_OWNER] = id_to_owner(uid)
        if gid != -1:
            values[nfs4.FATTR4_OWNER_GROUP] = id_to_owner(gid)
        if values:
            await self._setattr(path, values, "SETATTR")

    async def utime(
        self,
        path: str,
        times: tuple[float, float] | None = None,
        *,
        ns: tuple[int, int] | None = None,
    ) -> None:
        """Set access and modification times (seconds or ``ns``); the server's clock when
        neither is given."""
        if ns is None and times is not None:
            ns = (int(times[0] * 1e9), int(times[1] * 1e9))
        atime, mtime = (None, None) if ns is None else ns
        await self._setattr(
            path,
            {
                nfs4.FATTR4_TIME_ACCESS_SET: settime(atime),
                nfs4.FATTR4_TIME_MODIFY_SET: settime(mtime),
            },
            "SETATTR",
        )

    async def truncate(self, path: str, length: int) -> None:
        async with self.open(path, "r+b") as f:
            await f.truncate(length)

    # -- names ----------------------------------------------------------------------------------
    async def mkdir(self, path: str, mode: int = 0o755) -> None:
        await self._at(
            path,
            lambda name: [ops.create(nfs4.NF4DIR, name, {nfs4.FATTR4_MODE: mode & 0o7777})],
            op="CREATE",
            cachethis=True,
            idempotent=False,
        )

    async def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = False) -> None:
        """Make ``path`` and any missing parents (as ``os.makedirs``)."""
        try:
            await self.mkdir(path, mode)
        except FileNotFoundError:
            parent = posixpath.dirname(normalise(path))
            if parent == "/":
                raise
            await self.makedirs(parent, mode, exist_ok=True)
            try:
                await self.mkdir(path, mode)
            except FileExistsError:  # made meanwhile by someone else
                if not exist_ok or not await self.isdir(path):
                    raise
        except OSError:
            # EEXIST, or EROFS/EACCES from a directory that is there (a pseudo-fs node).
            if not exist_ok or not await self.isdir(path):
                raise

    async def remove(self, path: str) -> None:
        """Remove a file (not a directory: IsADirectoryError)."""
        await self._remove(path, want_dir=False)

    unlink = remove

    async def rmdir(self, path: str) -> None:
        """Remove an empty directory (NotADirectoryError for anything else)."""
        await self._remove(path, want_dir=True)

    async def _remove(self, path: str, *, want_dir: bool) -> None:
        is_dir = nfs4.fattr4([1 << nfs4.FATTR4_TYPE], nfs4.NF4DIR.to_bytes(4, "big"))
        check = (
            nfs4.nfs_argop4(nfs4.OP_VERIFY, nfs4.VERIFY4args(is_dir))
            if want_dir
            else nfs4.nfs_argop4(nfs4.OP_NVERIFY, nfs4.NVERIFY4args(is_dir))
        )
        op = "RMDIR" if want_dir else "REMOVE"
        try:
            await self._at(
                path,
                lambda name: [
                    ops.savefh(),
                    ops.lookup(name),
                    check,
                    ops.restorefh(),
                    ops.remove(name),
                ],
                op=op,
                cachethis=True,
                idempotent=False,
            )
        except NfsError as e:
            if e.status == nfs4.NFS4ERR_SAME:
                raise nfs_error(nfs4.NFS4ERR_ISDIR, op, path) from None
            if e.status == nfs4.NFS4ERR_NOT_SAME:
                raise nfs_error(nfs4.NFS4ERR_NOTDIR, op, path) from None
            if e.status not in (nfs4.NFS4ERR_NOTSUPP, nfs4.NFS4ERR_OP_ILLEGAL):
                raise
            # No (N)VERIFY on this server: look first, then remove.
            st = await self.lstat(path)
            if st.is_dir() != want_dir:
                raise nfs_error(
                    nfs4.NFS4ERR_ISDIR if st.is_dir() else nfs4.NFS4ERR_NOTDIR, op, path
                ) from None
            await self._at(
                path, lambda name: [ops.remove(name)], op=op, cachethis=True, idempotent=False
            )

    async def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (replacing ``dst`` as POSIX rename does)."""
        s, d = split_path(src), split_path(dst)
        if not s or not d:
            raise OSError(errno.EINVAL, "cannot rename the base directory", src)
        src_dir = await self._dir_ops(s[:-1], 2 + len(d))
        dst_dir = await self._dir_ops(d[:-1], 1 + len(src_dir))
        body = [*src_dir, ops.savefh(), *dst_dir, ops.rename(s[-1], d[-1])]
        res = await self.session.compound(body, cachethis=True, idempotent=False)
        if res.status == nfs4.NFS4ERR_SYMLINK and ops.failed_index(res) < len(body) - 1:
            sfh, _ = await self._lookup(s[:-1])
            dfh, _ = await self._lookup(d[:-1])
            body = [ops.putfh(sfh), ops.savefh(), ops.putfh(dfh), ops.rename(s[-1], d[-1])]
            res = await self.session.compound(body, cachethis=True, idempotent=False)
        if res.status != nfs4.NFS4_OK:
            last = ops.failed_index(res) == len(body) - 1
            raise nfs_error(res.status, "RENAME" if last else "LOOKUP", src)

    async def link(self, src: str, dst: str) -> None:
        """A hard link ``dst`` to the file ``src``."""
        fh, _ = await self._lookup(split_path(src), follow=False)
        await self._link(fh, dst)

    async def _link(self, fh: bytes, dst: str) -> None:
        d = split_path(dst)
        if not d:
            raise OSError(errno.EINVAL, "cannot link to the base directory", dst)
        dst_dir = await self._dir_ops(d[:-1], 3)
        body = [ops.putfh(fh), ops.savefh(), *dst_dir, ops.link(d[-1])]
        res = await self.session.compound(body, cachethis=True, idempotent=False)
        if res.status != nfs4.NFS4_OK:
            raise nfs_error(res.status, "LINK", dst)

    async def symlink(self, target: str, path: str) -> None:
        """A symbolic link at ``path`` whose text is ``target``."""
        await self._at(
            path,
            lambda name: [
                ops.create(nfs4.NF4LNK, name, {nfs4.FATTR4_MODE: 0o777}, encode_name(target))
            ],
            op="CREATE",
            cachethis=True,
            idempotent=False,
        )

    # -- files ----------------------------------------------------------------------------------
    def open(self, path: str, mode: str = "rb", perms: int = 0o644) -> Pending[NfsFile]:
        """Open a file: ``f = await fs.open(p, "wb")`` or ``async with fs.open(p) as f``.
        Modes are Python's binary ones (r, w, a, x with an optional +)."""
        return Pending(lambda: self._open(path, mode, perms), lambda f: f.close())

    async def _open(self, path: str, mode: str, perms: int) -> NfsFile:
        om = parse_mode(mode)
        owner = new_owner(b"nfsrdma-open")
        owner4 = nfs4.state_owner4(self.session.clientid or 0, owner)
        attrs = {nfs4.FATTR4_MODE: perms & 0o7777} if om.create is not None else None
        try:
            got = await self._at(
                path,
                lambda name: [
                    ops.open_(owner4, om.access | _want(om), name, create=om.create, attrs=attrs),
                    ops.getfh(),
                    ops.getattr_((nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE)),
                ],
                op="OPEN",
                cachethis=True,
                idempotent=False,
            )
        except NfsError as e:
            if e.status != nfs4.NFS4ERR_SYMLINK:
                raise
            # The name is a symbolic link: open what it points to.
            fh, st = await self._lookup(split_path(path))
            if st.is_dir():
                raise nfs_error(nfs4.NFS4ERR_ISDIR, "OPEN", path) from None
            res = await self.session.compound(
                [
                    ops.putfh(fh),
                    ops.open_(owner4, om.access, None),
                    ops.getfh(),
                    ops.getattr_((nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE)),
                ],
                cachethis=True,
                idempotent=False,
            )
            got = ops.results(res, "OPEN", path)[1:]
        opened, fh_ok, attrs_ok = got[0], got[1], got[2]
        assert isinstance(opened, nfs4.OPEN4resok)
        values = decode_attrs(attrs_ok.obj_attributes)
        f = NfsFile(
            self,
            path,
            fh_ok.object,
            om,
            opened.stateid,
            owner,
            int(values.get(nfs4.FATTR4_SIZE, 0)),
        )
        self.files.add(f)
        self.note_delegation(f, opened.delegation)
        if om.truncate and f.size:
            await f.truncate(0)
        return f

    def _recalled(self, recall: Recall) -> None:
        for f in self.files:
            if f.delegation is not None and f.delegation.other == recall.stateid.other:
                f.delegation_recalled()

    def note_delegation(self, f: NfsFile, deleg: nfs4.open_delegation4) -> None:
        """Keep a read delegation until the file is closed or it is recalled, and (for a
        read-only open) cache attributes and data under it (``deleg_cache``); a write
        delegation (we cache no writes) goes back at once."""
        value = deleg.value
        if not isinstance(value, nfs4.open_read_delegation4 | nfs4.open_write_delegation4):
            return
        self.session.delegations[value.stateid.other] = (value.stateid, f.fh)
        if isinstance(value, nfs4.open_write_delegation4):
            self.session.spawn(self.session.return_delegation(value.stateid, f.fh))
            return
        f.delegation = value.stateid
        if not f.mode.writable:
            f.cache = DelegatedCache(f.size)

    def forget(self, f: NfsFile) -> None:
        self.files.discard(f)

    async def read_bytes(self, path: str) -> bytes:
        async with self.open(path, "rb") as f:
            buf = bytearray(f.size)
            n = await f.readinto(buf)
            if n < len(buf):
                del buf[n:]
            else:
                buf += await f.read()
            return bytes(buf)

    async def write_bytes(self, path: str, data: bytes | bytearray | memoryview) -> int:
        async with self.open(path, "wb") as f:
            return await f.write(data)

    # -- NFSv4.2 (client/nfs42.py) ---------------------------------------------------------------
    @property
    def minor_version(self) -> int:
        """The session's NFSv4 minor version: 2 when the server offers it, else 1."""
        return self.session.minorversion

    async def copy_file(self, src: str, dst: str, *, progress: nfs42.Progress | None = None) -> int:
        """Copy ``src`` to ``dst`` on the server (COPY; the data never crosses the network);
        ``progress(copied, total)`` is called as an asynchronous copy advances."""
        return await nfs42.copy_file(self, src, dst, progress=progress)

    async def clone(self, src: str, dst: str) -> None:
        """Share ``src``'s blocks with ``dst`` (CLONE; EOPNOTSUPP where the server's file
        system cannot)."""
        await nfs42.clone(self, src, dst)

    async def getxattr(self, path: str, name: str) -> bytes:
        """An extended attribute in the ``user.`` namespace (``name`` without the prefix)."""
        fh, _ = await self._lookup(split_path(path))
        return await nfs42.getxattr(self, fh, path, name)

    async def setxattr(
        self, path: str, name: str, value: bytes, *, create: bool = False, replace: bool = False
    ) -> None:
        fh, _ = await self._lookup(split_path(path))
        await nfs42.setxattr(self, fh, path, name, value, create=create, replace=replace)

    async def listxattr(self, path: str) -> list[str]:
        fh, _ = await self._lookup(split_path(path))
        return await nfs42.listxattr(self, fh, path)

    async def removexattr(self, path: str, name: str) -> None:
        fh, _ = await self._lookup(split_path(path))
        await nfs42.removexattr(self, fh, path, name)

    # -- state recovery (called by the session) --------------------------------------------------
    async def _reclaim(self) -> None:
        """In the grace period after the server lost our state: reclaim every open file."""
        for f in self.files:
            f.delegation_recalled()  # the delegations went with the state: so does the cache
        for f in list(self.files):
            if f.closed:
                continue
            try:
                await f.reclaim()
            except NfsError:
                f.needs_reopen = True

    async def _reopen_all(self) -> None:
        """After RECLAIM_COMPLETE: open again what could not be reclaimed."""
        for f in list(self.files):
            if f.closed or not f.needs_reopen:
                continue
            try:
                await f.reopen()
            except NfsError as e:
                if e.status not in STATE_LOST:
                    raise


async def gather_limited(coros: list[Awaitable[T]], limit: int) -> list[T]:
    """Run awaitables with at most ``limit`` at a time; results in order. ``limit`` workers
    take the awaitables in turn (no task, no semaphore wait per awaitable). The first
    exception is raised at once; the other workers go on with the rest, as ``gather`` would.
    Cancelled, it closes the coroutines it had not started."""
    out: list[Any] = [None] * len(coros)
    todo = iter(enumerate(coros))

    async def worker() -> None:
        for i, c in todo:
            out[i] = await c

    try:
        await asyncio.gather(*(worker() for _ in range(min(max(1, limit), len(coros)))))
    except asyncio.CancelledError:
        for _, c in todo:
            if inspect.iscoroutine(c):
                c.close()
        raise
    return out


def _want(om: OpenMode) -> int:
    """A read delegation for read-only opens (we cache under it); none for the others (we
    would only give a write delegation back at once)."""
    if om.writable:
        return nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG
    return nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG
