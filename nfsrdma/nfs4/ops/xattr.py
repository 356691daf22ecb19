"""Extended attributes: GETXATTR, SETXATTR, LISTXATTRS, REMOVEXATTR (RFC 8276 section 8.4).

Only the ``user.`` namespace is served: names travel without the prefix and the VFS adds it
(``Vfs.getxattr`` and friends), so a client can neither name nor see ``trusted.``,
``security.`` or ``system.`` attributes. Permission is the file system's own, checked with the
caller's identity (reading a user attribute needs read permission, changing one write
permission, as for local processes).

LISTXATTRS cookies are positions in the sorted list of names (0: the start): a list that
changes between two calls may skip or repeat a name, as with knfsd.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Final

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import check_conflicts
from nfsrdma.vfs.base import XATTR_SIZE_MAX, XattrHow
from nfsrdma.xdr.gen import nfs4

_ERRNO: Final = {
    errno.ENODATA: nfs4.NFS4ERR_NOXATTR,
    errno.E2BIG: nfs4.NFS4ERR_XATTR2BIG,
    errno.ERANGE: nfs4.NFS4ERR_XATTR2BIG,
    errno.ENOSPC: nfs4.NFS4ERR_NOSPC,
    errno.EEXIST: nfs4.NFS4ERR_EXIST,
    errno.ENAMETOOLONG: nfs4.NFS4ERR_NAMETOOLONG,
}
# LISTXATTRS4resok without names: cookie, array count, eof.
_RESOK_OVERHEAD: Final = 8 + 4 + 4


@contextlib.contextmanager
def _xattr_errors() -> Iterator[None]:
    try:
        yield
    except OSError as e:
        status = _ERRNO.get(e.errno or 0)
        if status is None:
            raise
        raise Nfs4Error(status) from None


def _name(key: bytes) -> bytes:
    """A wire name: UTF-8 (RFC 8276 section 8.4: a component4)."""
    try:
        bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL) from None
    return bytes(key)


def op_getxattr(ctx: CompoundContext, args: nfs4.GETXATTR4args) -> nfs4.GETXATTR4res:
    fh = ctx.fh()
    with _xattr_errors():
        value = ctx.server.vfs.getxattr(ctx.cred, fh, _name(args.gxa_name))
    return nfs4.GETXATTR4res(nfs4.NFS4_OK, value)


def _changed(
    ctx: CompoundContext, fh: bytes, name: bytes, value: bytes | None, how: XattrHow
) -> nfs4.change_info4:
    vfs = ctx.server.vfs
    check_conflicts(ctx, fh, write=True)  # a change of the file: other delegations recalled
    before = vfs.getattr(fh).change
    with _xattr_errors():
        if value is None:
            vfs.removexattr(ctx.cred, fh, name)
        else:
            vfs.setxattr(ctx.cred, fh, name, value, how)
    return nfs4.change_info4(False, before, vfs.getattr(fh).change)


def op_setxattr(ctx: CompoundContext, args: nfs4.SETXATTR4args) -> nfs4.SETXATTR4res:
    fh = ctx.fh()
    try:
        how = XattrHow(args.sxa_option)
    except ValueError:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL) from None
    value = bytes(args.sxa_value)
    if len(value) > XATTR_SIZE_MAX:
        raise Nfs4Error(nfs4.NFS4ERR_XATTR2BIG)
    info = _changed(ctx, fh, _name(args.sxa_key), value, how)
    return nfs4.SETXATTR4res(nfs4.NFS4_OK, info)


def op_removexattr(ctx: CompoundContext, args: nfs4.REMOVEXATTR4args) -> nfs4.REMOVEXATTR4res:
    fh = ctx.fh()
    info = _changed(ctx, fh, _name(args.rxa_name), None, XattrHow.EITHER)
    return nfs4.REMOVEXATTR4res(nfs4.NFS4_OK, info)


def op_listxattrs(ctx: CompoundContext, args: nfs4.LISTXATTRS4args) -> nfs4.LISTXATTRS4res:
    """Names from position ``lxa_cookie`` while the result fits ``lxa_maxcount`` octets
    (NFS4ERR_TOOSMALL when not even one does)."""
    fh = ctx.fh()
    with _xattr_errors():
        names = ctx.server.vfs.listxattr(ctx.cred, fh)
    start = args.lxa_cookie
    if start > len(names):
        raise Nfs4Error(nfs4.NFS4ERR_BAD_COOKIE)
    budget = args.lxa_maxcount - _RESOK_OVERHEAD
    out: list[bytes] = []
    for name in names[start:]:
        size = 4 + (len(name) + 3) // 4 * 4
        if size > budget:
            break
        budget -= size
        out.append(name)
    end = start + len(out)
    if not out and end < len(names):
        raise Nfs4Error(nfs4.NFS4ERR_TOOSMALL)
    resok = nfs4.LISTXATTRS4resok(end, out, end == len(names))
    return nfs4.LISTXATTRS4res(nfs4.NFS4_OK, resok)
