"""READ, WRITE and COMMIT (RFC 8881 sections 18.22, 18.32, 18.3).

The stateid picks the open file (``StateManager.io_file``); the special stateids do anonymous
I/O with the caller's credential. I/O of at least ``config.large_io`` octets, stable writes and
COMMIT (an fsync) run in the server's thread pool so the event loop stays responsive, and
their handlers return an awaitable; smaller I/O is done at once, and the COMPOUND goes on
without waiting. READ reads with ``readinto`` (preadv) into memory the transport lends when it
has some (RPC-over-RDMA: registered memory its RDMA Write sends the data out of, no copy), else
into a buffer of its own, and returns a view of it; WRITE hands the VFS the request's buffer as
is (over RPC-over-RDMA the registered buffer the RDMA Reads filled).
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable
from typing import Final

from nfsrdma.nfs4 import grace
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import check_conflicts
from nfsrdma.nfs4.state import is_anonymous, is_special
from nfsrdma.vfs.base import OpenFile
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Buffer

MAX_FILE_OFFSET: Final = (1 << 63) - 1  # no file on the server can extend past this
# ``other`` of the special stateids (RFC 8881 section 8.2.3): all zeros or all ones
_SPECIAL_OTHERS: Final = frozenset({bytes(12), b"\xff" * 12})
UINT64_MAX: Final = (1 << 64) - 1


def _read_into(
    of: OpenFile, offset: int, count: int, sink: memoryview | None
) -> tuple[memoryview, bool]:
    """Read into ``sink`` (memory the transport lent) or a new buffer; a view of the data."""
    buf = memoryview(bytearray(count)) if sink is None else sink
    n, eof = of.readinto(offset, buf)
    return buf[:n], eof


def _sink(ctx: CompoundContext, count: int) -> memoryview | None:
    """Memory the transport lends for ``count`` bytes of READ data (None: use our own)."""
    if ctx.inbound is None or count <= 0:
        return None
    return ctx.conn.conn.lend(ctx.inbound, count)


def op_read(ctx: CompoundContext, args: nfs4.READ4args) -> nfs4.READ4res | Awaitable[nfs4.READ4res]:
    """Small reads are answered at once; large ones (and anonymous reads, which open the
    file) continue in the thread pool, and the result is an awaitable."""
    got = read_data(ctx, args.stateid, args.offset, args.count)
    if type(got) is tuple:
        data, eof = got
        return nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(eof, data))
    return got  # type: ignore[return-value]


def read_data(
    ctx: CompoundContext, stateid: nfs4.stateid4, offset: int, count: int
) -> tuple[Buffer, bool] | nfs4.READ4res | Awaitable[nfs4.READ4res]:
    """READ's work, from READ4args's fields (the COMPOUND fast path reads them without
    building the arguments): a small read done at once as its data and EOF flag (READ4resok's
    fields, which the fast path packs without building the result), else the result or an
    awaitable of it."""
    # (ctx.fh(), ctx.resolve_stateid and ctx.clientid inlined: the usual READ, with an open,
    # lock or delegation stateid, only reads them)
    fh = ctx.current_fh
    if fh is None:
        raise Nfs4Error(nfs4.NFS4ERR_NOFILEHANDLE)
    sid = stateid
    if sid.other in _SPECIAL_OTHERS:  # the current, anonymous or bypass stateid
        sid = ctx.resolve_stateid(sid)
        if is_anonymous(sid):
            grace.check_special_stateid(ctx)
    server, session = ctx.server, ctx.session
    if session is None:
        raise Nfs4Error(nfs4.NFS4ERR_OP_NOT_IN_SESSION)
    # (session.clientid, inlined)
    of = server.state_manager.io_file(session.client.clientid, sid, fh, write=False)
    if of is None:  # anonymous I/O: a write delegation of another client stands in the way
        check_conflicts(ctx, fh, write=False, local_open=True)
    config = server.config
    count = min(count, config.max_io)
    if offset > MAX_FILE_OFFSET:  # beyond any end of file
        return nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(True, b""))
    if of is None:
        cred, vfs = ctx.cred, server.vfs
        return _read_result(ctx.in_pool(lambda: vfs.anonymous_read(cred, fh, offset, count)))
    inbound, conn = ctx.inbound, ctx.conn.conn  # (_sink inlined)
    sink = None if inbound is None or count <= 0 or not conn.lends else conn.lend(inbound, count)
    if count >= config.large_io:
        return _read_result(ctx.in_pool(lambda: _read_into(of, offset, count, sink)))
    if sink is not None:
        return _read_into(of, offset, count, sink)
    return of.read(offset, count)


async def _read_result(pending: Awaitable[tuple[Buffer, bool]]) -> nfs4.READ4res:
    data, eof = await pending
    return nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(eof, data))


def op_write(
    ctx: CompoundContext, args: nfs4.WRITE4args
) -> nfs4.WRITE4res | Awaitable[nfs4.WRITE4res]:
    """Small unstable writes are done at once; large or stable ones (and anonymous ones)
    continue in the thread pool, and the result is an awaitable."""
    fh = ctx.fh()
    sid = ctx.resolve_stateid(args.stateid)
    server = ctx.server
    if is_special(sid):
        grace.check_special_stateid(ctx)
    of = server.state_manager.io_file(ctx.clientid, sid, fh, write=True)
    if of is None:  # anonymous I/O: any other client's delegation stands in the way
        check_conflicts(ctx, fh, write=True, local_write=True)
    data = args.data
    size = memoryview(data).nbytes
    offset = args.offset
    if offset + size > MAX_FILE_OFFSET + 1:
        raise Nfs4Error(nfs4.NFS4ERR_FBIG)
    stable = args.stable != nfs4.UNSTABLE4
    committed = nfs4.FILE_SYNC4 if stable else nfs4.UNSTABLE4
    verifier = server.vfs.write_verifier
    if of is None:
        cred, vfs = ctx.cred, server.vfs
        pending = ctx.in_pool(lambda: vfs.anonymous_write(cred, fh, offset, data, stable))
        return _write_result(pending, committed, verifier)
    open_file = of
    if stable or size >= server.config.large_io:
        pending = ctx.in_pool(lambda: open_file.write(offset, data, stable))
        return _write_result(pending, committed, verifier)
    count = open_file.write(offset, data, stable)
    return nfs4.WRITE4res(nfs4.NFS4_OK, nfs4.WRITE4resok(count, committed, verifier))


async def _write_result(
    pending: Awaitable[int], committed: nfs4.stable_how4, verifier: bytes
) -> nfs4.WRITE4res:
    count = await pending
    return nfs4.WRITE4res(nfs4.NFS4_OK, nfs4.WRITE4resok(count, committed, verifier))


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
    candidates = server.state_manager.open_files(fh)
    await ctx.in_pool(lambda: _commit_any(ctx, fh, candidates))
    return nfs4.COMMIT4res(nfs4.NFS4_OK, nfs4.COMMIT4resok(server.vfs.write_verifier))
