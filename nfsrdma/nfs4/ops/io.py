"""READ, WRITE and COMMIT (RFC 8881 sections 18.22, 18.32, 18.3).

The stateid picks the open file (``StateManager.io_file``); the special stateids do anonymous
I/O with the caller's credential. I/O of at least ``config.large_io`` octets (and every COMMIT,
an fsync) runs in the server's thread pool so the event loop stays responsive; smaller I/O
runs inline. READ fills a buffer of its own with ``readinto`` and returns a view of it (the
RPC-over-RDMA layer sends it from there); WRITE hands the VFS the request's buffer as is.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import Final, TypeVar

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error, OpHandler
from nfsrdma.vfs.base import OpenFile
from nfsrdma.xdr.gen import nfs4

MAX_FILE_OFFSET: Final = (1 << 63) - 1  # no file on the server can extend past this
UINT64_MAX: Final = (1 << 64) - 1

T = TypeVar("T")


async def _run(ctx: CompoundContext, size: int, fn: Callable[[], T]) -> T:
    if size < ctx.server.config.large_io:
        return fn()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(ctx.server.executor, fn)


def _read_into(of: OpenFile, offset: int, count: int) -> tuple[memoryview, bool]:
    buf = bytearray(count)
    n, eof = of.readinto(offset, memoryview(buf))
    return memoryview(buf)[:n], eof


async def op_read(ctx: CompoundContext, args: nfs4.READ4args) -> nfs4.READ4res:
    fh = ctx.fh()
    sid = ctx.resolve_stateid(args.stateid)
    server = ctx.server
    of = server.state.io_file(ctx.clientid, sid, fh, write=False)
    count = min(args.count, server.config.max_io)
    offset = args.offset
    if offset > MAX_FILE_OFFSET:  # beyond any end of file
        return nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(True, b""))
    data: bytes | memoryview
    if of is None:
        cred, vfs = ctx.cred, server.vfs
        data, eof = await _run(ctx, count, lambda: vfs.anonymous_read(cred, fh, offset, count))
    elif count >= server.config.large_io:
        data, eof = await _run(ctx, count, lambda: _read_into(of, offset, count))
    else:
        data, eof = of.read(offset, count)
    return nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(eof, data))


async def op_write(ctx: CompoundContext, args: nfs4.WRITE4args) -> nfs4.WRITE4res:
    fh = ctx.fh()
    sid = ctx.resolve_stateid(args.stateid)
    server = ctx.server
    of = server.state.io_file(ctx.clientid, sid, fh, write=True)
    data = args.data
    size = memoryview(data).nbytes
    offset = args.offset
    if offset + size > MAX_FILE_OFFSET + 1:
        raise Nfs4Error(nfs4.NFS4ERR_FBIG)
    stable = args.stable != nfs4.UNSTABLE4
    if of is None:
        cred, vfs = ctx.cred, server.vfs
        count = await _run(ctx, size, lambda: vfs.anonymous_write(cred, fh, offset, data, stable))
    else:
        open_file = of
        count = await _run(ctx, size, lambda: open_file.write(offset, data, stable))
    committed = nfs4.FILE_SYNC4 if stable else nfs4.UNSTABLE4
    return nfs4.WRITE4res(
        nfs4.NFS4_OK, nfs4.WRITE4resok(count, committed, server.vfs.write_verifier)
    )


def _commit_any(ctx: CompoundContext, fh: bytes, candidates: list[OpenFile]) -> None:
    """fsync through an open file of ``fh``; if none is open (or they were closed meanwhile),
    through a descriptor opened for the purpose (for writing, else for reading: fsync works
    on either). Runs in the thread pool."""
    for of in candidates:
        try:
            of.commit()
            return
        except OSError as e:
            if e.errno != errno.EBADF:  # EBADF: closed by a racing CLOSE
                raise
    vfs = ctx.server.vfs
    try:
        of = vfs.open(ctx.cred, fh, read=False, write=True)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        of = vfs.open(ctx.cred, fh, read=True, write=False)
    try:
        of.commit()
    finally:
        of.close()


async def op_commit(ctx: CompoundContext, args: nfs4.COMMIT4args) -> nfs4.COMMIT4res:
    fh = ctx.fh()
    if args.offset + args.count > UINT64_MAX:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    server = ctx.server
    candidates = server.state.open_files(fh)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(server.executor, _commit_any, ctx, fh, candidates)
    return nfs4.COMMIT4res(nfs4.NFS4_OK, nfs4.COMMIT4resok(server.vfs.write_verifier))


HANDLERS: dict[int, OpHandler] = {
    nfs4.OP_READ: op_read,
    nfs4.OP_WRITE: op_write,
    nfs4.OP_COMMIT: op_commit,
}
