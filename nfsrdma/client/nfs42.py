"""The client's NFSv4.2 calls (RFC 7862, RFC 8276): server-side copy, clone, SEEK, ALLOCATE,
DEALLOCATE and extended attributes. ``NfsClient`` exposes them as methods; they need a session
of minor version 2 (``connect`` negotiates it when the server offers it) and raise
``OSError(EOPNOTSUPP)`` otherwise.

COPY: the server may answer at once (a synchronous copy) or start an asynchronous one and tell
its end by CB_OFFLOAD on the back channel; meanwhile the client asks OFFLOAD_STATUS every
``poll`` seconds and reports progress to the caller's callback. A copy is followed by COMMIT when
the server says the data is unstable.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nfsrdma.client import ops
from nfsrdma.client.errors import nfs_error
from nfsrdma.xdr.gen import nfs4

if TYPE_CHECKING:
    from nfsrdma.client.file import NfsFile
    from nfsrdma.client.fs import NfsClient

Progress = Callable[[int, int], None]  # (octets copied so far, octets asked for)
POLL: float = 1.0
REPLY_OVERHEAD = 1024  # SEQUENCE, PUTFH and the headers around a result
XATTR_VALUE_MAX = 65536  # Linux's largest value: room for it in the reply (a Reply chunk)


def _op(num: int, args: Any) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


def _need_42(fs: NfsClient, what: str) -> None:
    if fs.session.minorversion < 2:
        raise OSError(errno.EOPNOTSUPP, f"{what}: the server does not offer NFSv4.2")


async def copy_range(
    fs: NfsClient,
    src: NfsFile,
    dst: NfsFile,
    src_offset: int = 0,
    dst_offset: int = 0,
    count: int = 0,
    *,
    progress: Progress | None = None,
    poll: float = POLL,
) -> int:
    """COPY ``count`` octets (0: to the source's end) from ``src`` to ``dst`` on the server;
    the number copied."""
    _need_42(fs, "COPY")
    session = fs.session
    if count == 0:
        count = max(0, (await fs.stat_fh(src.fh, src.path)).st_size - src_offset)
    done = 0
    unstable = False
    while done < count:
        args = nfs4.COPY4args(
            src.stateid,
            dst.stateid,
            src_offset + done,
            dst_offset + done,
            count - done,
            True,  # consecutive
            False,  # asynchronous allowed
            [],
        )
        res = await session.compound(
            [ops.putfh(src.fh), ops.savefh(), ops.putfh(dst.fh), _op(nfs4.OP_COPY, args)],
            cachethis=True,
            idempotent=False,
        )
        resok = ops.results(res, "COPY", dst.path)[-1]
        assert isinstance(resok, nfs4.COPY4resok)
        response = resok.cr_response
        if response.wr_callback_id:
            n, committed = await _wait_offload(
                fs, dst, response.wr_callback_id[0], count - done, done, progress, poll
            )
        else:
            n, committed = response.wr_count, response.wr_committed
        unstable |= committed != nfs4.FILE_SYNC4
        done += n
        if progress is not None:
            progress(done, count)
        if n == 0:
            break
    if unstable:
        res = await session.compound([ops.putfh(dst.fh), ops.commit()])
        ops.results(res, "COMMIT", dst.path)
    dst.size = max(dst.size, dst_offset + done)
    return done


async def _wait_offload(
    fs: NfsClient,
    dst: NfsFile,
    stateid: nfs4.stateid4,
    total: int,
    base: int,
    progress: Progress | None,
    poll: float,
) -> tuple[int, int]:
    """Until CB_OFFLOAD (or OFFLOAD_STATUS) says the copy ended: (octets, how committed)."""
    callbacks = fs.session.callbacks
    fut = callbacks.offload_future(stateid)
    try:
        while True:
            finished, _ = await asyncio.wait({fut}, timeout=poll)
            if not finished:
                status_args = nfs4.OFFLOAD_STATUS4args(stateid)
                res = await fs.session.compound(
                    [ops.putfh(dst.fh), _op(nfs4.OP_OFFLOAD_STATUS, status_args)]
                )
                st = ops.results(res, "OFFLOAD_STATUS", dst.path)[-1]
                assert isinstance(st, nfs4.OFFLOAD_STATUS4resok)
                if progress is not None:
                    progress(base + st.osr_count, base + total)
                if st.osr_complete:
                    if st.osr_complete[0] != nfs4.NFS4_OK:
                        raise nfs_error(st.osr_complete[0], "COPY", dst.path)
                    return st.osr_count, nfs4.UNSTABLE4
                continue
            offload = fut.result()
            info = offload.coa_offload_info
            if info.coa_status != nfs4.NFS4_OK:
                raise nfs_error(info.coa_status, "COPY", dst.path)
            assert isinstance(info.value, nfs4.write_response4)
            return info.value.wr_count, info.value.wr_committed
    finally:
        callbacks.forget_offload(stateid)


async def copy_file(
    fs: NfsClient,
    src: str,
    dst: str,
    *,
    progress: Progress | None = None,
    poll: float = POLL,
) -> int:
    """Copy the file ``src`` to ``dst`` (created or truncated) with server-side COPY."""
    _need_42(fs, "COPY")
    async with fs.open(src, "rb") as fin, fs.open(dst, "wb") as fout:
        return await copy_range(fs, fin, fout, progress=progress, poll=poll)


async def clone(fs: NfsClient, src: str, dst: str) -> None:
    """CLONE the whole of ``src`` into ``dst`` (created or truncated): the blocks are shared
    where the server's file system can (OSError EOPNOTSUPP otherwise)."""
    _need_42(fs, "CLONE")
    async with fs.open(src, "rb") as fin, fs.open(dst, "wb") as fout:
        args = nfs4.CLONE4args(fin.stateid, fout.stateid, 0, 0, 0)
        res = await fs.session.compound(
            [ops.putfh(fin.fh), ops.savefh(), ops.putfh(fout.fh), _op(nfs4.OP_CLONE, args)],
            cachethis=True,
        )
        ops.results(res, "CLONE", dst)


async def seek(f: NfsFile, offset: int, data: bool) -> int:
    """SEEK_DATA / SEEK_HOLE from ``offset``, as lseek(2): OSError ENXIO when there is none."""
    _need_42(f.client, "SEEK")
    what = nfs4.NFS4_CONTENT_DATA if data else nfs4.NFS4_CONTENT_HOLE
    args = nfs4.SEEK4args(f.stateid, offset, what)
    res = await f.session.compound([ops.putfh(f.fh), _op(nfs4.OP_SEEK, args)])
    r = ops.results(res, "SEEK", f.path)[-1]
    assert isinstance(r, nfs4.seek_res4)
    if data and r.sr_eof and r.sr_offset >= f.size:
        raise OSError(errno.ENXIO, "SEEK: no data past the offset", f.path)
    return int(r.sr_offset)


async def space(f: NfsFile, offset: int, length: int, *, allocate: bool) -> None:
    """ALLOCATE (reserve, may grow the file) or DEALLOCATE (punch a hole)."""
    _need_42(f.client, "ALLOCATE" if allocate else "DEALLOCATE")
    if allocate:
        op = _op(nfs4.OP_ALLOCATE, nfs4.ALLOCATE4args(f.stateid, offset, length))
    else:
        op = _op(nfs4.OP_DEALLOCATE, nfs4.DEALLOCATE4args(f.stateid, offset, length))
    res = await f.session.compound([ops.putfh(f.fh), op], cachethis=True)
    ops.results(res, "ALLOCATE" if allocate else "DEALLOCATE", f.path)
    if allocate:
        f.size = max(f.size, offset + length)


# -- extended attributes (RFC 8276): names without the "user." prefix ----------------------------


async def getxattr(fs: NfsClient, fh: bytes, path: str, name: str) -> bytes:
    _need_42(fs, "GETXATTR")
    args = nfs4.GETXATTR4args(name.encode())
    res = await fs.session.compound(
        [ops.putfh(fh), _op(nfs4.OP_GETXATTR, args)], reply_size=XATTR_VALUE_MAX + REPLY_OVERHEAD
    )
    return bytes(ops.results(res, "GETXATTR", path)[-1])


async def setxattr(
    fs: NfsClient,
    fh: bytes,
    path: str,
    name: str,
    value: bytes,
    *,
    create: bool = False,
    replace: bool = False,
) -> None:
    """``create``: fail (FileExistsError) if it exists; ``replace``: fail if it does not."""
    _need_42(fs, "SETXATTR")
    if create and replace:
        raise ValueError("create and replace exclude each other")
    how = nfs4.SETXATTR4_CREATE if create else nfs4.SETXATTR4_REPLACE if replace else 0
    args = nfs4.SETXATTR4args(nfs4.setxattr_option4(how), name.encode(), value)
    res = await fs.session.compound([ops.putfh(fh), _op(nfs4.OP_SETXATTR, args)], cachethis=True)
    ops.results(res, "SETXATTR", path)


async def listxattr(fs: NfsClient, fh: bytes, path: str, *, maxcount: int = 65536) -> list[str]:
    _need_42(fs, "LISTXATTRS")
    names: list[str] = []
    cookie = 0
    while True:
        args = nfs4.LISTXATTRS4args(cookie, maxcount)
        res = await fs.session.compound(
            [ops.putfh(fh), _op(nfs4.OP_LISTXATTRS, args)], reply_size=maxcount + REPLY_OVERHEAD
        )
        r = ops.results(res, "LISTXATTRS", path)[-1]
        assert isinstance(r, nfs4.LISTXATTRS4resok)
        names += [bytes(n).decode("utf-8", "surrogateescape") for n in r.lxr_names]
        if r.lxr_eof or not r.lxr_names:
            return names
        cookie = r.lxr_cookie


async def removexattr(fs: NfsClient, fh: bytes, path: str, name: str) -> None:
    _need_42(fs, "REMOVEXATTR")
    args = nfs4.REMOVEXATTR4args(name.encode())
    res = await fs.session.compound([ops.putfh(fh), _op(nfs4.OP_REMOVEXATTR, args)], cachethis=True)
    ops.results(res, "REMOVEXATTR", path)
