"""An open NFS file: ``read``/``readinto``/``write`` split by rsize/wsize and pipelined across
slots, ``seek``/``tell``, ``truncate``, ``fsync`` (COMMIT), byte-range ``lock``/``unlock`` and
``close`` (also as an async context manager).

Over RPC-over-RDMA each READ names a slice of the caller's buffer as its sink, so the data
lands there through a Write chunk and ``readinto`` copies nothing; over TCP the data is copied
once, from the received record into the caller's buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import io
import itertools
import os
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from nfsrdma.client import nfs42, ops
from nfsrdma.client.attrs import FileStat, decode_attrs
from nfsrdma.client.deleg_cache import DelegatedCache
from nfsrdma.client.errors import NfsBlockingIOError, NfsError, nfs_error
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Buffer

if TYPE_CHECKING:
    from nfsrdma.client.fs import NfsClient

_owner_ids = itertools.count(1)
# Statuses that mean our open state is gone (server restart, lease expiry, revocation).
STATE_LOST = frozenset(
    {
        nfs4.NFS4ERR_BAD_STATEID,
        nfs4.NFS4ERR_STALE_STATEID,
        nfs4.NFS4ERR_EXPIRED,
        nfs4.NFS4ERR_ADMIN_REVOKED,
        nfs4.NFS4ERR_DELEG_REVOKED,
    }
)
WHOLE_FILE = 0xFFFFFFFFFFFFFFFF  # a lock length of all ones: to the end of the file


@dataclass(frozen=True, slots=True)
class OpenMode:
    access: int  # OPEN4_SHARE_ACCESS_*
    create: int | None  # createmode4 or None
    truncate: bool
    append: bool

    @property
    def readable(self) -> bool:
        return bool(self.access & nfs4.OPEN4_SHARE_ACCESS_READ)

    @property
    def writable(self) -> bool:
        return bool(self.access & nfs4.OPEN4_SHARE_ACCESS_WRITE)


def parse_mode(mode: str) -> OpenMode:
    """Python's binary modes: r, w, a, x, each with an optional + (b is implied)."""
    letters = set(mode.replace("b", ""))
    if "t" in letters:
        raise ValueError("NFS files are binary: text mode is not supported")
    kinds = letters & set("rwax")
    if len(kinds) != 1 or not letters <= set("rwax+") or len(mode) != len(set(mode)):
        raise ValueError(f"invalid mode: {mode!r}")
    kind = kinds.pop()
    plus = "+" in letters
    read = kind == "r" or plus
    write = kind != "r" or plus
    access = (nfs4.OPEN4_SHARE_ACCESS_READ if read else 0) | (
        nfs4.OPEN4_SHARE_ACCESS_WRITE if write else 0
    )
    create = {"r": None, "w": nfs4.UNCHECKED4, "a": nfs4.UNCHECKED4, "x": nfs4.GUARDED4}[kind]
    return OpenMode(access, create, kind == "w", kind == "a")


def new_owner(prefix: bytes) -> bytes:
    return prefix + b"-%d-%d" % (os.getpid(), next(_owner_ids))


def _address(view: memoryview) -> int | None:
    if view.readonly or not view.contiguous or view.nbytes == 0:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def same_memory(data: Buffer, sink: memoryview) -> bool:
    """Whether ``data`` already is the start of ``sink`` (RDMA placed it there)."""
    if not isinstance(data, memoryview):
        return False
    a = _address(data)
    return a is not None and a == _address(sink)


@dataclass(slots=True)
class HeldLock:
    offset: int
    length: int
    exclusive: bool


class NfsFile:
    """Made by ``NfsClient.open``; use as ``async with`` or close it."""

    def __init__(
        self,
        client: NfsClient,
        path: str,
        fh: bytes,
        mode: OpenMode,
        stateid: nfs4.stateid4,
        owner: bytes,
        size: int,
    ) -> None:
        self.client = client
        self.session = client.session
        self.path = path
        self.fh = fh
        self.mode = mode
        self.stateid = stateid
        self.owner = owner
        self.size = size  # as last known
        self.pos = 0
        self.closed = False
        self.delegation: nfs4.stateid4 | None = None
        self.cache: DelegatedCache | None = None  # under a read delegation, read-only opens
        self.lock_owner = new_owner(b"nfsrdma-lock")
        self.lock_stateid: nfs4.stateid4 | None = None
        self.locks: list[HeldLock] = []
        self.needs_reopen = False
        self._unstable = False
        self._verifiers: set[bytes] = set()
        self._reopen_lock = asyncio.Lock()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pos={self.pos}"
        return f"<NfsFile {self.path!r} {state}>"

    # -- context manager -----------------------------------------------------------------------
    async def __aenter__(self) -> NfsFile:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check(self, want_read: bool = False, want_write: bool = False) -> None:
        if self.closed:
            raise ValueError("I/O operation on a closed NFS file")
        if want_read and not self.mode.readable:
            raise io.UnsupportedOperation("the file is not open for reading")
        if want_write and not self.mode.writable:
            raise io.UnsupportedOperation("the file is not open for writing")

    @property
    def owner4(self) -> nfs4.state_owner4:
        return nfs4.state_owner4(self.session.clientid or 0, self.owner)

    # -- reading ---------------------------------------------------------------------------------
    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all of the rest when negative)."""
        self._check(want_read=True)
        if size < 0:
            await self._refresh_size()
            size = max(0, self.size - self.pos)
            out = bytearray(size)
            n = await self.readinto(out)
            while n == len(out):  # the file grew meanwhile: read on
                more = await self.read(self.client.rsize)
                if not more:
                    break
                out += more
                n += len(more)
            return bytes(out[:n])
        buf = bytearray(size)
        n = await self.readinto(buf)
        return bytes(buf[:n]) if n < size else bytes(buf)

    async def readinto(self, buffer: Buffer) -> int:
        """Read into ``buffer`` (any writable buffer) from the current position; returns the
        number of bytes read (less than its length only at the end of the file)."""
        self._check(want_read=True)
        view = memoryview(buffer).cast("B")
        n = await self.pread_into(view, self.pos)
        self.pos += n
        return n

    async def pread_into(self, view: memoryview, offset: int) -> int:
        """Read ``len(view)`` bytes at ``offset`` into ``view``, rsize at a time, with as many
        READs in flight as the window allows. Returns the bytes read before the first gap."""
        if not len(view):
            return 0
        rsize = self.client.rsize
        spans = [(o, min(rsize, len(view) - o)) for o in range(0, len(view), rsize)]
        got = [0] * len(spans)
        window = asyncio.Semaphore(self.client.window)

        async def one(i: int, start: int, count: int) -> None:
            async with window:
                done = 0
                while done < count:
                    n, eof = await self._read_once(
                        view[start + done : start + count], offset + start + done
                    )
                    done += n
                    if eof or n == 0:
                        break
                got[i] = done

        if len(spans) == 1:
            await one(0, 0, spans[0][1])
        else:
            async with asyncio.TaskGroup() as tg:
                for i, (start, count) in enumerate(spans):
                    tg.create_task(one(i, start, count))
        total = 0
        for (_, count), n in zip(spans, got, strict=True):
            total += n
            if n < count:
                break
        return total

    async def _read_once(self, sink: memoryview, offset: int) -> tuple[int, bool]:
        cache = self.cache
        if cache is not None:
            hit = cache.read(offset, sink)
            if hit is not None:
                self.client.io_stats.cached_reads += 1
                return hit
        for attempt in range(2):
            sid = self.stateid
            res = await self.session.compound(
                [ops.putfh(self.fh), ops.read(sid, offset, len(sink))],
                sinks=[sink],
                reply_size=1024,
            )
            if res.status in STATE_LOST and attempt == 0:
                await self.reopen(sid)
                continue
            ok = ops.results(res, "READ", self.path)[-1]
            assert isinstance(ok, nfs4.READ4resok)
            data = ok.data
            n = len(data)
            if n > len(sink):
                raise OSError(errno.EIO, "READ returned more data than asked for")
            if n and same_memory(data, sink):
                self.client.io_stats.placed_reads += 1  # RDMA put it there: nothing to copy
            elif n:
                sink[:n] = data
                self.client.io_stats.copied_reads += 1
            if cache is not None and cache is self.cache:
                cache.store(offset, sink[:n], ok.eof)
            return n, ok.eof
        raise AssertionError("unreachable")

    # -- writing ---------------------------------------------------------------------------------
    async def write(self, data: Buffer) -> int:
        """Write all of ``data`` at the current position (at the end in append mode)."""
        self._check(want_write=True)
        view = memoryview(data).cast("B")
        if self.mode.append:
            await self._refresh_size()
            self.pos = self.size
        await self.pwrite(view, self.pos)
        self.pos += len(view)
        return len(view)

    async def pwrite(self, view: memoryview, offset: int) -> None:
        """Write ``view`` at ``offset``, wsize at a time, pipelined across slots."""
        if not len(view):
            return
        wsize = self.client.wsize
        spans = [(o, min(wsize, len(view) - o)) for o in range(0, len(view), wsize)]
        window = asyncio.Semaphore(self.client.window)

        async def one(start: int, count: int) -> None:
            async with window:
                done = 0
                while done < count:
                    done += await self._write_once(
                        view[start + done : start + count], offset + start + done
                    )

        if len(spans) == 1:
            await one(*spans[0])
        else:
            async with asyncio.TaskGroup() as tg:
                for start, count in spans:
                    tg.create_task(one(start, count))
        self.size = max(self.size, offset + len(view))

    async def _write_once(self, chunk: memoryview, offset: int) -> int:
        for attempt in range(2):
            sid = self.stateid
            res = await self.session.compound(
                [ops.putfh(self.fh), ops.write(sid, offset, chunk, nfs4.UNSTABLE4)],
                cachethis=True,
                idempotent=True,
                reply_size=1024,
            )
            if res.status in STATE_LOST and attempt == 0:
                await self.reopen(sid)
                continue
            ok = ops.results(res, "WRITE", self.path)[-1]
            assert isinstance(ok, nfs4.WRITE4resok)
            if ok.count == 0:
                raise OSError(errno.EIO, "the server wrote nothing")
            if ok.committed != nfs4.FILE_SYNC4:
                self._unstable = True
                self._verifiers.add(ok.writeverf)
            return min(ok.count, len(chunk))
        raise AssertionError("unreachable")

    async def fsync(self) -> None:
        """COMMIT unstable writes. Raises OSError(EIO) when the server restarted since they were
        written (its write verifier changed: they may be lost)."""
        self._check()
        if not self._unstable:
            return
        res = await self.session.compound([ops.putfh(self.fh), ops.commit()])
        ok = ops.results(res, "COMMIT", self.path)[-1]
        assert isinstance(ok, nfs4.COMMIT4resok)
        lost = self._verifiers - {ok.writeverf}
        self._unstable = False
        self._verifiers.clear()
        if lost:
            raise OSError(errno.EIO, "the server restarted: unstable writes may be lost", self.path)

    async def flush(self) -> None:
        """Nothing is buffered on the client side."""

    # -- NFSv4.2 (client/nfs42.py) ----------------------------------------------------------
    async def seek_data(self, offset: int) -> int:
        """The first data at or after ``offset`` (SEEK; ENXIO when none, as lseek)."""
        return await nfs42.seek(self, offset, data=True)

    async def seek_hole(self, offset: int) -> int:
        """The first hole at or after ``offset`` (the end of file counts as one)."""
        return await nfs42.seek(self, offset, data=False)

    async def allocate(self, offset: int, length: int) -> None:
        """Reserve space for the range (ALLOCATE; the file grows if it ends past the end)."""
        await nfs42.space(self, offset, length, allocate=True)

    async def deallocate(self, offset: int, length: int) -> None:
        """Punch a hole over the range (DEALLOCATE; the size does not change)."""
        await nfs42.space(self, offset, length, allocate=False)

    async def copy_from(
        self,
        src: NfsFile,
        src_offset: int = 0,
        dst_offset: int = 0,
        count: int = 0,
        *,
        progress: nfs42.Progress | None = None,
    ) -> int:
        """COPY from another file of the same server into this one, on the server."""
        return await nfs42.copy_range(
            self.client, src, self, src_offset, dst_offset, count, progress=progress
        )

    async def truncate(self, size: int | None = None) -> int:
        self._check(want_write=True)
        if size is None:
            size = self.pos
        res = await self.session.compound(
            [ops.putfh(self.fh), ops.setattr_({nfs4.FATTR4_SIZE: size}, self.stateid)],
            cachethis=True,
        )
        ops.results(res, "SETATTR", self.path)
        self.size = size
        return size

    # -- position --------------------------------------------------------------------------------
    def tell(self) -> int:
        return self.pos

    async def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self.pos + offset
        elif whence == os.SEEK_END:
            await self._refresh_size()
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence: {whence}")
        if pos < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self.pos = pos
        return pos

    async def _refresh_size(self) -> None:
        if self.cache is not None:  # nobody else can change it: the size we know stands
            self.size = self.cache.size
            return
        res = await self.session.compound([ops.putfh(self.fh), ops.getattr_((nfs4.FATTR4_SIZE,))])
        ok = ops.results(res, "GETATTR", self.path)[-1]
        self.size = int(decode_attrs(ok.obj_attributes).get(nfs4.FATTR4_SIZE, self.size))

    async def stat(self) -> FileStat:
        cache = self.cache
        if cache is not None and cache.stat is not None:
            cache.hits += 1
            return cache.stat
        st = await self.client.stat_fh(self.fh, self.path)
        if cache is not None and cache is self.cache:
            cache.stat = st
        return st

    def delegation_recalled(self) -> None:
        """The read delegation goes: what it let us keep goes with it."""
        self.cache = None
        self.delegation = None

    # -- locks -----------------------------------------------------------------------------------
    async def lock(
        self,
        offset: int = 0,
        length: int = 0,
        *,
        exclusive: bool = True,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> None:
        """A byte-range lock (``length`` 0: to the end of the file). Without ``blocking`` a
        conflicting lock raises BlockingIOError (NFS4ERR_DENIED); with it, the lock is retried
        (NFSv4 LOCK never waits on the server) until ``timeout``."""
        self._check()
        nlen = length or WHOLE_FILE
        if blocking:
            locktype = nfs4.WRITEW_LT if exclusive else nfs4.READW_LT
        else:
            locktype = nfs4.WRITE_LT if exclusive else nfs4.READ_LT
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 0.05
        while True:
            if self.lock_stateid is None:
                op = ops.lock(
                    locktype,
                    offset,
                    nlen,
                    open_stateid=self.stateid,
                    lock_owner=nfs4.state_owner4(self.session.clientid or 0, self.lock_owner),
                )
            else:
                op = ops.lock(locktype, offset, nlen, lock_stateid=self.lock_stateid)
            res = await self.session.compound(
                [ops.putfh(self.fh), op], cachethis=True, idempotent=False
            )
            if res.status == nfs4.NFS4ERR_DENIED and blocking:
                if deadline is not None and loop.time() + delay > deadline:
                    raise NfsBlockingIOError(nfs4.NFS4ERR_DENIED, "LOCK", self.path)
                # Retry when the server says the lock may be free (CB_NOTIFY_LOCK), or poll.
                await self.session.wait_lock_notice(self.fh, self.lock_owner, delay)
                delay = min(delay * 2, 1.0)
                continue
            ok = ops.results(res, "LOCK", self.path)[-1]
            assert isinstance(ok, nfs4.LOCK4resok)
            self.lock_stateid = ok.lock_stateid
            self.locks.append(HeldLock(offset, nlen, exclusive))
            return

    async def unlock(self, offset: int = 0, length: int = 0) -> None:
        self._check()
        if self.lock_stateid is None:
            raise OSError(errno.ENOLCK, "no lock held", self.path)
        nlen = length or WHOLE_FILE
        res = await self.session.compound(
            [ops.putfh(self.fh), ops.locku(nfs4.WRITE_LT, self.lock_stateid, offset, nlen)],
            cachethis=True,
            idempotent=False,
        )
        sid = ops.results(res, "LOCKU", self.path)[-1]
        assert isinstance(sid, nfs4.stateid4)
        self.lock_stateid = sid
        self.locks = [lk for lk in self.locks if not (lk.offset == offset and lk.length == nlen)]

    # -- state -----------------------------------------------------------------------------------
    async def reopen(self, stale: nfs4.stateid4 | None = None) -> None:
        """Open the file again (CLAIM_FH) after the server lost our open state: ``stale`` is
        the stateid the server refused (nothing to do when the file has moved on since), or
        None for a file marked ``needs_reopen``."""
        async with self._reopen_lock:
            if stale is not None and self.stateid != stale:
                return  # reopened meanwhile
            if stale is None and not self.needs_reopen:
                return
            self.owner = new_owner(b"nfsrdma-open")
            res = await self.session.compound(
                [ops.putfh(self.fh), ops.open_(self.owner4, self.mode.access, None)],
                cachethis=True,
                idempotent=False,
            )
            ok = ops.results(res, "OPEN", self.path)[-1]
            assert isinstance(ok, nfs4.OPEN4resok)
            self.stateid = ok.stateid
            self.lock_stateid = None
            self.locks.clear()
            self.needs_reopen = False
            self.session.stats.reopens += 1
            self.client.note_delegation(self, ok.delegation)

    async def reclaim(self) -> bool:
        """After a server restart, in its grace period: OPEN with CLAIM_PREVIOUS (and the
        locks with reclaim set). False when the server would not let us reclaim."""
        self.owner = new_owner(b"nfsrdma-open")
        self.session.stats.reclaim_attempts += 1
        res = await self.session.compound(
            [
                ops.putfh(self.fh),
                ops.open_(self.owner4, self.mode.access, None, claim_previous=True),
            ],
            cachethis=True,
            idempotent=False,
            reclaim=True,
        )
        if res.status != nfs4.NFS4_OK:
            self.needs_reopen = True
            return False
        ok = res.resarray[-1].value
        assert isinstance(ok, nfs4.OPEN4res) and ok.value is not None
        self.stateid = ok.value.stateid
        self.session.stats.reclaimed += 1
        held, self.locks, self.lock_stateid = self.locks, [], None
        self.lock_owner = new_owner(b"nfsrdma-lock")
        for lk in held:
            if self.lock_stateid is None:
                op = ops.lock(
                    nfs4.WRITE_LT if lk.exclusive else nfs4.READ_LT,
                    lk.offset,
                    lk.length,
                    open_stateid=self.stateid,
                    lock_owner=nfs4.state_owner4(self.session.clientid or 0, self.lock_owner),
                    reclaim=True,
                )
            else:
                op = ops.lock(
                    nfs4.WRITE_LT if lk.exclusive else nfs4.READ_LT,
                    lk.offset,
                    lk.length,
                    lock_stateid=self.lock_stateid,
                    reclaim=True,
                )
            lres = await self.session.compound(
                [ops.putfh(self.fh), op], cachethis=True, idempotent=False, reclaim=True
            )
            if lres.status == nfs4.NFS4_OK:
                lok = lres.resarray[-1].value
                assert isinstance(lok, nfs4.LOCK4res) and isinstance(lok.value, nfs4.LOCK4resok)
                self.lock_stateid = lok.value.lock_stateid
                self.locks.append(lk)
        return True

    async def close(self) -> None:
        """COMMIT what is unstable, release locks, CLOSE, give back a delegation. Idempotent."""
        if self.closed:
            return
        try:
            if self._unstable:
                await self.fsync()
            for lk in list(self.locks):
                with contextlib.suppress(NfsError):
                    await self.unlock(lk.offset, lk.length)
            res = await self.session.compound(
                [ops.putfh(self.fh), ops.close(self.stateid)], cachethis=True, idempotent=False
            )
            if res.status not in (nfs4.NFS4_OK, *STATE_LOST):
                raise nfs_error(res.status, "CLOSE", self.path)
        finally:
            self.closed = True
            self.client.forget(self)
        self.cache = None
        if self.delegation is not None:
            deleg, self.delegation = self.delegation, None
            if deleg.other in self.session.delegations:
                await self.session.return_delegation(deleg, self.fh)
