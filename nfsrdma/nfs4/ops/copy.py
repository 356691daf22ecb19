"""Server-side copy and clone: COPY, OFFLOAD_STATUS, OFFLOAD_CANCEL, CLONE (RFC 7862 sections
15.2, 15.9, 15.8, 15.13). COPY_NOTIFY is not bound: inter-server copy is not offered, so it
gets NFS4ERR_NOTSUPP, and so does a COPY naming a source server.

The saved filehandle is the source, the current one the destination. Everything is checked
before a byte moves: both regular files of one file system (NFS4ERR_XDEV otherwise), the source
range inside the source file (NFS4ERR_INVAL), no overlap when source and destination are one
file (NFS4ERR_INVAL), the destination range below the largest file (NFS4ERR_FBIG), each stateid
valid for its file and access (as for READ and WRITE). Another client's delegation of the
destination is recalled (NFS4ERR_DELAY meanwhile), as a WRITE would recall it; a write
delegation of the source likewise.

A COPY of at most ``SYNC_COPY_MAX`` octets, or one the client wants synchronous, is done before
the reply. A larger one runs asynchronously when the client's back channel works: the reply
carries the copy's stateid, and CB_OFFLOAD tells the client the outcome (OFFLOAD_STATUS answers
meanwhile). The data moves with ``OpenFile.copy_to`` (copy_file_range: the file system may share
blocks or copy in the kernel), ``COPY_CHUNK`` octets per call in the thread pool; copied data is
UNSTABLE4 until a COMMIT, like WRITE's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from functools import partial
from typing import Final

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import check_conflicts
from nfsrdma.nfs4.errors import status_of
from nfsrdma.nfs4.offload import Offload
from nfsrdma.nfs4.ops.io import MAX_FILE_OFFSET
from nfsrdma.nfs4.ops.sparse import open_for
from nfsrdma.nfs4.state import is_special
from nfsrdma.vfs.base import Attributes, FileType, OpenFile
from nfsrdma.xdr.gen import nfs4

log = logging.getLogger(__name__)

SYNC_COPY_MAX: Final = 4 << 20  # larger copies go asynchronous (when the client allows)
COPY_CHUNK: Final = 8 << 20  # one copy_file_range call in the thread pool


def _regular(a: Attributes) -> None:
    if a.type == FileType.NF4DIR:
        raise Nfs4Error(nfs4.NFS4ERR_ISDIR)
    if a.type == FileType.NF4LNK:
        raise Nfs4Error(nfs4.NFS4ERR_SYMLINK)
    if a.type != FileType.NF4REG:
        raise Nfs4Error(nfs4.NFS4ERR_WRONG_TYPE)


def _ranges(
    ctx: CompoundContext, src_offset: int, dst_offset: int, count: int
) -> tuple[bytes, bytes, int]:
    """Source and destination handles and the octet count (``count`` 0: to the source's end),
    after every check of the module docstring that needs no open file."""
    dst_fh = ctx.fh()
    src_fh = ctx.saved_fh
    if src_fh is None:
        raise Nfs4Error(nfs4.NFS4ERR_NOFILEHANDLE)
    vfs = ctx.server.vfs
    src, dst = vfs.getattr(src_fh), vfs.getattr(dst_fh)
    _regular(src)
    _regular(dst)
    if src.fsid != dst.fsid:
        raise Nfs4Error(nfs4.NFS4ERR_XDEV)
    if src_offset > src.size or (count and src_offset + count > src.size):
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    if count == 0:
        count = src.size - src_offset
    if dst_offset > MAX_FILE_OFFSET or dst_offset + count > MAX_FILE_OFFSET + 1:
        raise Nfs4Error(nfs4.NFS4ERR_FBIG)
    same = src.fileid == dst.fileid
    if same and src_offset < dst_offset + count and dst_offset < src_offset + count:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    check_conflicts(ctx, dst_fh, write=True)
    check_conflicts(ctx, src_fh, write=False)
    return src_fh, dst_fh, count


@contextlib.contextmanager
def _pair(
    ctx: CompoundContext, src_sid: nfs4.stateid4, dst_sid: nfs4.stateid4
) -> Iterator[tuple[OpenFile, OpenFile]]:
    assert ctx.saved_fh is not None and ctx.current_fh is not None
    with (
        open_for(ctx, src_sid, ctx.saved_fh, write=False) as src,
        open_for(ctx, dst_sid, ctx.current_fh, write=True) as dst,
    ):
        yield src, dst


def _copy_some(src: OpenFile, dst: OpenFile, src_off: int, dst_off: int, count: int) -> int:
    """Up to ``count`` octets, looping over short copies; fewer only at the source's end."""
    done = 0
    while done < count:
        n = src.copy_to(dst, src_off + done, dst_off + done, count - done)
        if n == 0:
            break
        done += n
    return done


def _response(ctx: CompoundContext, count: int, ids: list[nfs4.stateid4]) -> nfs4.write_response4:
    return nfs4.write_response4(ids, count, nfs4.UNSTABLE4, ctx.server.vfs.write_verifier)


def _async_possible(ctx: CompoundContext, args: nfs4.COPY4args) -> bool:
    service = ctx.server.delegation_service
    if service is None or not service.callbacks_ok(ctx.clientid):
        return False
    src_sid = ctx.resolve_stateid(args.ca_src_stateid)
    dst_sid = ctx.resolve_stateid(args.ca_dst_stateid)
    return not (is_special(src_sid) or is_special(dst_sid))  # their open files outlive the reply


async def op_copy(ctx: CompoundContext, args: nfs4.COPY4args) -> nfs4.COPY4res:
    if args.ca_source_server:
        raise Nfs4Error(nfs4.NFS4ERR_NOTSUPP)  # inter-server copy (section 4.9) not offered
    src_fh, dst_fh, count = _ranges(ctx, args.ca_src_offset, args.ca_dst_offset, args.ca_count)
    asynchronous = count > SYNC_COPY_MAX and not args.ca_synchronous and _async_possible(ctx, args)
    soff, doff = args.ca_src_offset, args.ca_dst_offset
    if not asynchronous:
        with _pair(ctx, args.ca_src_stateid, args.ca_dst_stateid) as (src, dst):
            done = await ctx.in_pool(lambda: _copy_some(src, dst, soff, doff, count))
        resok = nfs4.COPY4resok(_response(ctx, done, []), nfs4.copy_requirements4(True, True))
        return nfs4.COPY4res(nfs4.NFS4_OK, resok)
    server = ctx.server
    src_sid = ctx.resolve_stateid(args.ca_src_stateid)
    dst_sid = ctx.resolve_stateid(args.ca_dst_stateid)
    src_of = server.state_manager.io_file(ctx.clientid, src_sid, src_fh, write=False)
    dst_of = server.state_manager.io_file(ctx.clientid, dst_sid, dst_fh, write=True)
    if src_of is None or dst_of is None:  # a delegation without an open of this client
        with _pair(ctx, args.ca_src_stateid, args.ca_dst_stateid) as (s, d):
            done = await ctx.in_pool(lambda: _copy_some(s, d, soff, doff, count))
        resok = nfs4.COPY4resok(_response(ctx, done, []), nfs4.copy_requirements4(True, True))
        return nfs4.COPY4res(nfs4.NFS4_OK, resok)
    o = server.offloads.start(ctx.clientid, dst_fh, count)
    o.task = asyncio.get_running_loop().create_task(_run(ctx, o, src_of, dst_of, soff, doff))
    log.info("asynchronous COPY of %d octets for client %#x", count, ctx.clientid)
    resok = nfs4.COPY4resok(_response(ctx, 0, [o.stateid]), nfs4.copy_requirements4(True, False))
    return nfs4.COPY4res(nfs4.NFS4_OK, resok)


async def _run(
    ctx: CompoundContext, o: Offload, src: OpenFile, dst: OpenFile, soff: int, doff: int
) -> None:
    """An asynchronous COPY: chunk by chunk in the thread pool, then CB_OFFLOAD."""
    server = ctx.server
    status: int = nfs4.NFS4_OK
    try:
        while o.copied < o.total and not o.cancelled:
            at, want = o.copied, min(COPY_CHUNK, o.total - o.copied)
            n = await ctx.in_pool(partial(_copy_some, src, dst, soff + at, doff + at, want))
            o.copied += n
            if n < want:
                break
    except asyncio.CancelledError:
        server.offloads.finish(o, nfs4.NFS4ERR_SERVERFAULT if not o.cancelled else nfs4.NFS4_OK)
        raise
    except Exception as e:  # the outcome goes to the client in CB_OFFLOAD
        status = status_of(e)
        log.info("asynchronous COPY for client %#x failed: %s", o.clientid, e)
    server.offloads.finish(o, status)
    if o.cancelled:
        return  # OFFLOAD_CANCEL: no CB_OFFLOAD (section 15.8.3)
    service = server.delegation_service
    if service is None:
        return
    if status == nfs4.NFS4_OK:
        info = nfs4.offload_info4(nfs4.NFS4_OK, _response(ctx, o.copied, []))
    else:
        info = nfs4.offload_info4(nfs4.nfsstat4(status), o.copied)
    await service.callbacks.offload(o.clientid, o.dst_fh, o.stateid, info)


def op_offload_status(
    ctx: CompoundContext, args: nfs4.OFFLOAD_STATUS4args
) -> nfs4.OFFLOAD_STATUS4res:
    o = ctx.server.offloads.find(ctx.clientid, args.osa_stateid)
    complete = [] if o.status is None else [nfs4.nfsstat4(o.status)]
    return nfs4.OFFLOAD_STATUS4res(nfs4.NFS4_OK, nfs4.OFFLOAD_STATUS4resok(o.copied, complete))


def op_offload_cancel(
    ctx: CompoundContext, args: nfs4.OFFLOAD_CANCEL4args
) -> nfs4.OFFLOAD_CANCEL4res:
    offloads = ctx.server.offloads
    offloads.cancel(offloads.find(ctx.clientid, args.oca_stateid))
    return nfs4.OFFLOAD_CANCEL4res(nfs4.NFS4_OK)


async def op_clone(ctx: CompoundContext, args: nfs4.CLONE4args) -> nfs4.CLONE4res:
    """FICLONERANGE through the VFS: NFS4ERR_NOTSUPP where the file system cannot share
    blocks, NFS4ERR_INVAL for ranges it cannot clone (misaligned to clone_blksize)."""
    soff, doff = args.cl_src_offset, args.cl_dst_offset
    _, _, count = _ranges(ctx, soff, doff, args.cl_count)
    with _pair(ctx, args.cl_src_stateid, args.cl_dst_stateid) as (src, dst):
        await ctx.in_pool(lambda: src.clone_to(dst, soff, doff, count))
    return nfs4.CLONE4res(nfs4.NFS4_OK)
