"""NFSv4.2 sparse files and space reservation: SEEK, READ_PLUS, ALLOCATE and DEALLOCATE (RFC
7862 sections 15.11, 15.10, 15.1, 15.4).

The stateid picks the open file as for READ and WRITE (an open, lock or delegation stateid of
the client, or a special stateid: then the file is opened for the operation with the caller's
credential, after the same delegation checks as anonymous READ/WRITE). The file-system work is
the VFS's (``OpenFile.seek``, ``read_segments``, ``allocate``, ``deallocate``) and runs in the
server's thread pool.

READ_PLUS returns holes as hole segments. Its data is not DDP-eligible (RFC 8267 section 6.1
names READ's data only), so over RPC-over-RDMA a READ_PLUS reply larger than the inline
threshold goes whole in the client's Reply chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nfsrdma.nfs4 import grace
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import check_conflicts
from nfsrdma.nfs4.ops.io import MAX_FILE_OFFSET
from nfsrdma.nfs4.state import is_special
from nfsrdma.vfs.base import OpenFile
from nfsrdma.xdr.gen import nfs4


@contextlib.contextmanager
def open_for(
    ctx: CompoundContext, stateid: nfs4.stateid4, fh: bytes, *, write: bool
) -> Iterator[OpenFile]:
    """The open file ``stateid`` names for this access (as READ / WRITE find it); for a
    special stateid, the file opened for the operation with the caller's credential."""
    sid = ctx.resolve_stateid(stateid)
    server = ctx.server
    if is_special(sid):
        grace.check_special_stateid(ctx)
    of = server.state_manager.io_file(ctx.clientid, sid, fh, write=write)
    if of is not None:
        yield of
        return
    if write:
        check_conflicts(ctx, fh, write=True, local_write=True)
    else:
        check_conflicts(ctx, fh, write=False, local_open=True)
    own = server.vfs.open(ctx.cred, fh, read=True, write=write)
    try:
        yield own
    finally:
        own.close()


def _range_check(offset: int, length: int) -> None:
    if length == 0:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    if offset > MAX_FILE_OFFSET or offset + length > MAX_FILE_OFFSET + 1:
        raise Nfs4Error(nfs4.NFS4ERR_FBIG)


async def op_seek(ctx: CompoundContext, args: nfs4.SEEK4args) -> nfs4.SEEK4res:
    """RFC 7862 section 15.11: an offset at or past the end of file is NFS4ERR_NXIO (as
    lseek(2) says ENXIO); no data after the offset is NFS4_OK with sr_eof."""
    fh = ctx.fh()
    data = args.sa_what == nfs4.NFS4_CONTENT_DATA
    offset = args.sa_offset
    with open_for(ctx, args.sa_stateid, fh, write=False) as of:

        def seek() -> tuple[int | None, int]:
            size = of.getattr().size
            if offset >= size:
                return None, size
            return of.seek(offset, data), size

        found, size = await ctx.in_pool(seek)
    if offset >= size:
        raise Nfs4Error(nfs4.NFS4ERR_NXIO)
    if found is None:
        return nfs4.SEEK4res(nfs4.NFS4_OK, nfs4.seek_res4(True, size))
    return nfs4.SEEK4res(nfs4.NFS4_OK, nfs4.seek_res4(found >= size, found))


async def op_read_plus(ctx: CompoundContext, args: nfs4.READ_PLUS4args) -> nfs4.READ_PLUS4res:
    fh = ctx.fh()
    count = min(args.rpa_count, ctx.server.config.max_io)
    offset = args.rpa_offset
    if offset > MAX_FILE_OFFSET:
        return nfs4.READ_PLUS4res(nfs4.NFS4_OK, nfs4.read_plus_res4(True, []))
    with open_for(ctx, args.rpa_stateid, fh, write=False) as of:
        segments, eof = await ctx.in_pool(lambda: of.read_segments(offset, count))
    contents = [
        nfs4.read_plus_content(nfs4.NFS4_CONTENT_DATA, nfs4.data4(s.offset, s.data))
        if s.data is not None
        else nfs4.read_plus_content(nfs4.NFS4_CONTENT_HOLE, nfs4.data_info4(s.offset, s.length))
        for s in segments
    ]
    return nfs4.READ_PLUS4res(nfs4.NFS4_OK, nfs4.read_plus_res4(eof, contents))


async def op_allocate(ctx: CompoundContext, args: nfs4.ALLOCATE4args) -> nfs4.ALLOCATE4res:
    fh = ctx.fh()
    _range_check(args.aa_offset, args.aa_length)
    check_conflicts(ctx, fh, write=True)  # another client's delegation is recalled (a write)
    with open_for(ctx, args.aa_stateid, fh, write=True) as of:
        await ctx.in_pool(lambda: of.allocate(args.aa_offset, args.aa_length))
    return nfs4.ALLOCATE4res(nfs4.NFS4_OK)


async def op_deallocate(ctx: CompoundContext, args: nfs4.DEALLOCATE4args) -> nfs4.DEALLOCATE4res:
    fh = ctx.fh()
    _range_check(args.da_offset, args.da_length)
    check_conflicts(ctx, fh, write=True)
    with open_for(ctx, args.da_stateid, fh, write=True) as of:
        await ctx.in_pool(lambda: of.deallocate(args.da_offset, args.da_length))
    return nfs4.DEALLOCATE4res(nfs4.NFS4_OK)
