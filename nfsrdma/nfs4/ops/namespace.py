"""CREATE, REMOVE, RENAME, LINK, READLINK (RFC 8881 sections 18.4, 18.25, 18.26, 18.9, 18.24).

change_info4 reports the directory's change attribute read just before and just after the
operation. It is marked atomic: metadata operations run one at a time on the server's event
loop, so nothing this server does can come between the two reads (only a local process
modifying the exported tree behind the server's back could).
"""

from __future__ import annotations

import errno

from nfsrdma.nfs4.attrs import decode_settable
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import check_conflicts, check_name
from nfsrdma.nfs4.ops.lookup import check_component
from nfsrdma.vfs.base import FileType
from nfsrdma.xdr.gen import nfs4

_OK = nfs4.NFS4_OK
CREATABLE = frozenset(
    {
        nfs4.NF4DIR,
        nfs4.NF4LNK,
        nfs4.NF4FIFO,
        nfs4.NF4SOCK,
        nfs4.NF4CHR,
        nfs4.NF4BLK,
    }
)
# The mode of a new object when createattrs gives none (the Linux client always gives one).
DEFAULT_MODE = {nfs4.NF4DIR: 0o755}
DEFAULT_OTHER_MODE = 0o644


def _saved(ctx: CompoundContext) -> bytes:
    if ctx.saved_fh is None:
        raise Nfs4Error(nfs4.NFS4ERR_NOFILEHANDLE)
    return ctx.saved_fh


def _change(ctx: CompoundContext, fh: bytes) -> int:
    return ctx.server.vfs.change(fh)


def _linkdata(data: bytes | memoryview | None) -> bytes:
    """linktext4 (utf8str_cs): not empty, UTF-8, no NUL (NFS4ERR_INVAL otherwise)."""
    if data is None:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    text = bytes(data)
    if not text or b"\0" in text:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL) from None
    return text


def create(ctx: CompoundContext, args: nfs4.CREATE4args) -> nfs4.CREATE4res:
    dir_fh = ctx.fh()
    objtype = args.objtype
    ftype = objtype.type
    if ftype not in CREATABLE:
        raise Nfs4Error(nfs4.NFS4ERR_BADTYPE)  # NF4REG is OPEN's, named attributes unsupported
    name = check_component(args.objname)
    attrs = decode_settable(args.createattrs)
    if attrs.size is not None:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)  # no size for what CREATE makes (not checked after)
    linkdata = None
    rdev = None
    if ftype == nfs4.NF4LNK:
        value = objtype.value
        linkdata = _linkdata(value if isinstance(value, bytes | memoryview) else None)
    elif ftype in (nfs4.NF4CHR, nfs4.NF4BLK):
        spec = objtype.value
        assert isinstance(spec, nfs4.specdata4)
        rdev = (spec.specdata1, spec.specdata2)
    mode = attrs.mode
    if mode is None:
        mode = DEFAULT_MODE.get(ftype, DEFAULT_OTHER_MODE)

    vfs = ctx.server.vfs
    before = _change(ctx, dir_fh)
    fh = vfs.create(ctx.cred, dir_fh, name, FileType(ftype), mode, linkdata, rdev)
    after = _change(ctx, dir_fh)
    if any(v is not None for v in (attrs.uid, attrs.gid, attrs.atime, attrs.mtime)):
        owner_change = attrs.uid is not None or attrs.gid is not None
        vfs.setattr(
            ctx.cred,
            fh,
            # chown clears the set-id bits: give the mode again after it.
            mode=attrs.mode if owner_change else None,
            uid=attrs.uid,
            gid=attrs.gid,
            atime=attrs.atime,
            mtime=attrs.mtime,
        )
    ctx.set_fh(fh)
    return nfs4.CREATE4res(
        _OK, nfs4.CREATE4resok(nfs4.change_info4(True, before, after), attrs.attrset)
    )


def remove(ctx: CompoundContext, args: nfs4.REMOVE4args) -> nfs4.REMOVE4res:
    dir_fh = ctx.fh()
    name = check_component(args.target)
    check_name(ctx, dir_fh, name)
    before, after = ctx.server.vfs.remove_changed(ctx.cred, dir_fh, name)
    return nfs4.REMOVE4res(_OK, nfs4.REMOVE4resok(nfs4.change_info4(True, before, after)))


def rename(ctx: CompoundContext, args: nfs4.RENAME4args) -> nfs4.RENAME4res:
    """Source directory: the saved filehandle; target directory: the current one. Source and
    target naming one file (the same name, or two hard links) is a no-op (section 18.26.4): the
    VFS renames nothing, so each change_info has before == after. A file renamed over (or
    removed) while open stays usable by its openers until their CLOSE (``vfs/resolver.py``)."""
    src_dir = _saved(ctx)
    dst_dir = ctx.fh()
    oldname = check_component(args.oldname)
    newname = check_component(args.newname)
    vfs = ctx.server.vfs
    check_name(ctx, src_dir, oldname)
    check_name(ctx, dst_dir, newname)
    src_before = _change(ctx, src_dir)
    dst_before = _change(ctx, dst_dir)
    try:
        vfs.rename(ctx.cred, src_dir, oldname, dst_dir, newname)
    except OSError as e:
        if _incompatible_target(ctx, e, src_dir, dst_dir):
            raise Nfs4Error(nfs4.NFS4ERR_EXIST) from None
        raise
    src_after = _change(ctx, src_dir)
    dst_after = _change(ctx, dst_dir)
    return nfs4.RENAME4res(
        _OK,
        nfs4.RENAME4resok(
            nfs4.change_info4(True, src_before, src_after),
            nfs4.change_info4(True, dst_before, dst_after),
        ),
    )


def _incompatible_target(ctx: CompoundContext, e: OSError, src_dir: bytes, dst_dir: bytes) -> bool:
    """Whether rename(2) failed because the target exists and cannot be replaced: a non-empty
    directory, or a directory for a non-directory or the reverse. RFC 8881 section 18.26.3
    wants NFS4ERR_EXIST for all of these."""
    if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR):
        return True
    if e.errno == errno.ENOTDIR:  # or was it one of the two directories?
        vfs = ctx.server.vfs
        return all(vfs.getattr(fh).type == FileType.NF4DIR for fh in (src_dir, dst_dir))
    return False


def link(ctx: CompoundContext, args: nfs4.LINK4args) -> nfs4.LINK4res:
    """The object: the saved filehandle; the directory: the current one (which stays)."""
    obj = _saved(ctx)
    dir_fh = ctx.fh()
    name = check_component(args.newname)
    check_conflicts(ctx, obj, write=True)
    before = _change(ctx, dir_fh)
    ctx.server.vfs.link(ctx.cred, obj, dir_fh, name)
    after = _change(ctx, dir_fh)
    return nfs4.LINK4res(_OK, nfs4.LINK4resok(nfs4.change_info4(True, before, after)))


def readlink(ctx: CompoundContext, args: None) -> nfs4.READLINK4res:
    fh = ctx.fh()
    return nfs4.READLINK4res(_OK, nfs4.READLINK4resok(ctx.server.vfs.readlink(ctx.cred, fh)))
