"""GETATTR, SETATTR, VERIFY, NVERIFY, ACCESS (RFC 8881 sections 18.7, 18.30, 18.31, 18.15,
18.1)."""

from __future__ import annotations

from collections.abc import Awaitable

from nfsrdma.nfs4 import grace
from nfsrdma.nfs4.attrs import (
    check_minor_version,
    check_verifiable,
    decode_settable,
    fattr_for_minor_version,
    getattr_plan,
    object_attrs,
)
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import (
    check_conflicts,
    getattr_from_holder,
    write_delegation_elsewhere,
)
from nfsrdma.nfs4.state import is_special
from nfsrdma.vfs.base import (
    ACCESS4_ALL,
    ACCESS4_DELETE,
    ACCESS4_EXECUTE,
    ACCESS4_EXTEND,
    ACCESS4_LOOKUP,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    FileType,
)
from nfsrdma.xdr.gen import nfs4

_OK = nfs4.NFS4_OK
_GETATTR4res = nfs4.GETATTR4res
_GETATTR4resok = nfs4.GETATTR4resok
# The ACCESS4 bits that mean something for each kind of object (as knfsd answers).
DIRECTORY_ACCESS = ACCESS4_READ | ACCESS4_LOOKUP | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE
OTHER_ACCESS = ACCESS4_READ | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_EXECUTE
XATTR_ACCESS = nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XAWRITE | nfs4.ACCESS4_XALIST


def getattr_(
    ctx: CompoundContext, args: nfs4.GETATTR4args
) -> nfs4.GETATTR4res | Awaitable[nfs4.GETATTR4res]:
    got = getattr_values(ctx, args.attr_request)
    if isinstance(got, tuple):
        mask, vals = got
        return _GETATTR4res(_OK, _GETATTR4resok(nfs4.fattr4(mask.copy(), vals)))
    return got


def getattr_values(
    ctx: CompoundContext, bitmap: list[int]
) -> tuple[list[int], bytes] | nfs4.GETATTR4res | Awaitable[nfs4.GETATTR4res]:
    """GETATTR's work: the usual success as the result's attribute mask (the plan's own:
    not to be changed) and encoded values, which the COMPOUND fast path packs without
    building the result; the result itself (or an awaitable of it) otherwise."""
    fh = ctx.current_fh
    if fh is None:
        raise Nfs4Error(nfs4.NFS4ERR_NOFILEHANDLE)
    minor = ctx.minorversion
    plan, for_minor = getattr_plan(bitmap, minor)  # (check_readable's errors)
    server = ctx.server
    # CB_GETATTR first (10.4.3); no delegation at all (the usual case) asked without a call
    if server.state_manager.delegations and write_delegation_elsewhere(ctx, fh, bitmap):
        return getattr_from_holder(ctx, fh, bitmap)
    vfs = server.vfs
    attributes = vfs.getattr(fh)
    if plan.needs_fs:
        fattr = plan.encode(attributes, vfs.statfs(fh), fh, server.config)
    elif not for_minor:
        return plan.mask, plan.fn(attributes, None, fh, server.config, 0)
    else:
        fattr = plan.encode(attributes, None, fh, server.config)
    if for_minor:
        fattr = fattr_for_minor_version(fattr, minor)
    return _GETATTR4res(_OK, _GETATTR4resok(fattr))


def setattr_(ctx: CompoundContext, args: nfs4.SETATTR4args) -> nfs4.SETATTR4res:
    fh = ctx.fh()
    check_minor_version(args.obj_attributes.attrmask, ctx.minorversion)
    s = decode_settable(args.obj_attributes)
    if s.size is not None or s.mode is not None:  # recalls other clients' delegations
        check_conflicts(ctx, fh, write=True, local_write=s.size is not None)
    if s.size is not None:
        # A size change is a write: the open state decides (RFC 8881 section 18.30.3).
        ctx.server.state_manager.check_setattr_size(ctx, args.stateid, fh)
        if is_special(ctx.resolve_stateid(args.stateid)):
            grace.check_special_stateid(ctx)
    if s:
        ctx.server.vfs.setattr(
            ctx.cred,
            fh,
            mode=s.mode,
            uid=s.uid,
            gid=s.gid,
            size=s.size,
            atime=s.atime,
            mtime=s.mtime,
        )
    return nfs4.SETATTR4res(_OK, s.attrset)


def _same(ctx: CompoundContext, fattr: nfs4.fattr4) -> bool:
    """Whether the object's attributes encode exactly as the client's (knfsd compares the
    same way: attribute values have one canonical XDR form, owners are numeric)."""
    fh = ctx.fh()
    check_minor_version(fattr.attrmask, ctx.minorversion)
    check_verifiable(fattr.attrmask)
    ours = object_attrs(ctx.server.vfs, fh, fattr.attrmask, ctx.server.config)
    return ours.attr_vals == bytes(fattr.attr_vals)


def verify(ctx: CompoundContext, args: nfs4.VERIFY4args) -> nfs4.VERIFY4res:
    if not _same(ctx, args.obj_attributes):
        raise Nfs4Error(nfs4.NFS4ERR_NOT_SAME)
    return nfs4.VERIFY4res(_OK)


def nverify(ctx: CompoundContext, args: nfs4.NVERIFY4args) -> nfs4.NVERIFY4res:
    if _same(ctx, args.obj_attributes):
        raise Nfs4Error(nfs4.NFS4ERR_SAME)
    return nfs4.NVERIFY4res(_OK)


def access(ctx: CompoundContext, args: nfs4.ACCESS4args) -> nfs4.ACCESS4res:
    """In minor version 2 the extended-attribute bits (RFC 8276 section 8.4.1.1) are answered
    for regular files and directories: reading or listing user attributes needs read
    permission, changing them write permission (what the file system checks)."""
    fh = ctx.fh()
    xattr_bits = XATTR_ACCESS if ctx.minorversion >= 2 else 0
    if args.access & ~(ACCESS4_ALL | xattr_bits):
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)  # NFSv4.2 xattr bits in 4.1, or garbage
    vfs = ctx.server.vfs
    ftype = vfs.file_type(fh)
    kind = DIRECTORY_ACCESS if ftype == FileType.NF4DIR else OTHER_ACCESS
    supported = args.access & kind
    xattr_wanted = args.access & xattr_bits if ftype in (FileType.NF4DIR, FileType.NF4REG) else 0
    ask = supported
    if xattr_wanted & (nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XALIST):
        ask |= ACCESS4_READ
    if xattr_wanted & nfs4.ACCESS4_XAWRITE:
        ask |= ACCESS4_MODIFY
    granted = vfs.access(ctx.cred, fh, ask) if ask else 0
    allowed = granted & supported
    if granted & ACCESS4_READ:
        allowed |= xattr_wanted & (nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XALIST)
    if granted & ACCESS4_MODIFY:
        allowed |= xattr_wanted & nfs4.ACCESS4_XAWRITE
    return nfs4.ACCESS4res(_OK, nfs4.ACCESS4resok(supported | xattr_wanted, allowed))
