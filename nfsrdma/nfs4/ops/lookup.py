"""LOOKUP, LOOKUPP, SECINFO, SECINFO_NO_NAME (RFC 8881 sections 18.13, 18.14, 18.29, 18.45),
and the component-name checks every name-taking operation shares.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.rpc.auth import KRB5, pseudoflavor_of
from nfsrdma.rpc.gss_mech import KRB5_OID_DER
from nfsrdma.vfs.base import NAME_MAX, FileType
from nfsrdma.xdr.gen import nfs4

_OK = nfs4.NFS4_OK
# RFC 2623 pseudo-flavours of Kerberos v5 and the RPCSEC_GSS service each stands for.
_GSS_SERVICES = {
    KRB5: nfs4.RPC_GSS_SVC_NONE,
    KRB5 + 1: nfs4.RPC_GSS_SVC_INTEGRITY,
    KRB5 + 2: nfs4.RPC_GSS_SVC_PRIVACY,
}


def secinfo_entries(flavors: Sequence[int]) -> list[nfs4.secinfo4]:
    """SECINFO's answer for an export's pseudo-flavours, in their order: AUTH_SYS and
    AUTH_NONE as themselves, krb5/krb5i/krb5p as RPCSEC_GSS entries (the Kerberos v5 OID
    1.2.840.113554.1.2.2, qop 0, the service; 18.29.2)."""
    out: list[nfs4.secinfo4] = []
    for flavor in flavors:
        service = _GSS_SERVICES.get(flavor)
        if service is None:
            out.append(nfs4.secinfo4(flavor))
        else:
            info = nfs4.rpcsec_gss_info(KRB5_OID_DER, 0, service)
            out.append(nfs4.secinfo4(nfs4.RPCSEC_GSS, info))
    return out


def check_component(name: bytes | memoryview) -> bytes:
    """A component4 as RFC 8881 section 14 wants it, or the error it calls for.

    Empty → NFS4ERR_INVAL; longer than 255 octets → NFS4ERR_NAMETOOLONG; not UTF-8 →
    NFS4ERR_INVAL (section 14.5); "." and "..", or names holding "/" or NUL, which the file
    system does not allow as names → NFS4ERR_BADNAME.
    """
    b = bytes(name)
    if not b:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    if len(b) > NAME_MAX:
        raise Nfs4Error(nfs4.NFS4ERR_NAMETOOLONG)
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL) from None
    if b in (b".", b"..") or b"/" in b or b"\0" in b:
        raise Nfs4Error(nfs4.NFS4ERR_BADNAME)
    return b


def _not_a_directory(ctx: CompoundContext, fh: bytes) -> Nfs4Error:
    """NFS4ERR_SYMLINK for a symbolic link, NFS4ERR_NOTDIR for anything else (18.13.4)."""
    if ctx.server.vfs.getattr(fh).type == FileType.NF4LNK:
        return Nfs4Error(nfs4.NFS4ERR_SYMLINK)
    return Nfs4Error(nfs4.NFS4ERR_NOTDIR)


def lookup_fh(ctx: CompoundContext, dir_fh: bytes, name: bytes) -> bytes:
    """vfs.lookup with the RFC's error for a current filehandle that is not a directory."""
    try:
        return ctx.server.vfs.lookup(ctx.cred, dir_fh, name)
    except NotADirectoryError:
        raise _not_a_directory(ctx, dir_fh) from None


def lookup(ctx: CompoundContext, args: nfs4.LOOKUP4args) -> nfs4.LOOKUP4res:
    dir_fh = ctx.fh()
    name = check_component(args.objname)
    ctx.set_fh(lookup_fh(ctx, dir_fh, name))
    return nfs4.LOOKUP4res(_OK)


def lookupp(ctx: CompoundContext, args: None) -> nfs4.LOOKUPP4res:
    fh = ctx.fh()
    try:
        parent = ctx.server.vfs.lookupp(ctx.cred, fh)
    except NotADirectoryError:
        raise _not_a_directory(ctx, fh) from None
    ctx.set_fh(parent)
    return nfs4.LOOKUPP4res(_OK)


def _flavors(ctx: CompoundContext, flavors: Sequence[int]) -> nfs4.SECINFO4res:
    """The export's flavours (an exports file's ``sec=``), or the server's ``--sec`` list."""
    security = ctx.server.security
    return nfs4.SECINFO4res(_OK, secinfo_entries(flavors if security is None else security))


# Operations at which the flavour of the request is checked against the export's (RFC 8881
# section 2.6.3.1.1): those that set the current filehandle from nothing (the put-filehandle
# family) and those that cross to another object by name. Every other operation works on a
# filehandle one of these produced, in the same (single) export.
_PUT_FH = frozenset({nfs4.OP_PUTFH, nfs4.OP_PUTROOTFH, nfs4.OP_PUTPUBFH, nfs4.OP_RESTOREFH})
_BY_NAME = frozenset({nfs4.OP_LOOKUP, nfs4.OP_LOOKUPP, nfs4.OP_OPEN})
_SECINFO = frozenset({nfs4.OP_SECINFO, nfs4.OP_SECINFO_NO_NAME})
SECURITY_CHECKED = _PUT_FH | _BY_NAME


def wrong_security(ctx: CompoundContext, op: int, following: int | None) -> bool:
    """NFS4ERR_WRONGSEC for operation ``op`` (followed by ``following``, None at the end)?

    - a put-filehandle operation followed by SECINFO or SECINFO_NO_NAME, by LOOKUP, LOOKUPP or
      OPEN (which check the object they reach), or by nothing, is never refused (2.6.3.1.1.1
      to 2.6.3.1.1.4), so a client can always ask, from the root down, which flavours to use;
    - otherwise, and for LOOKUP, LOOKUPP and OPEN not followed by a SECINFO, the request's
      pseudo-flavour must be one of the export's (2.6.3.1.1.5 to 2.6.3.1.1.7)."""
    security = ctx.server.security
    if security is None or following in _SECINFO:
        return False
    if op in _PUT_FH and (following is None or following in _BY_NAME):
        return False
    return pseudoflavor_of(ctx.principal) not in security


def secinfo(ctx: CompoundContext, args: nfs4.SECINFO4args) -> nfs4.SECINFO4res:
    dir_fh = ctx.fh()
    name = check_component(args.name)
    try:  # the object must exist
        flavors = ctx.server.vfs.flavors(ctx.cred, dir_fh, name)
    except NotADirectoryError:
        raise _not_a_directory(ctx, dir_fh) from None
    # A successful SECINFO consumes the current filehandle (18.29.3).
    ctx.current_fh = None
    ctx.current_stateid = None
    return _flavors(ctx, flavors)


def secinfo_no_name(ctx: CompoundContext, args: nfs4.SECINFO_NO_NAME4args) -> nfs4.SECINFO4res:
    fh = ctx.fh()
    if args == nfs4.SECINFO_STYLE4_PARENT:
        # The current filehandle must be a directory (RFC 5661 erratum 2299); the root has no
        # parent (NFS4ERR_NOENT).
        try:
            fh = ctx.server.vfs.lookupp(ctx.cred, fh)
        except NotADirectoryError:
            raise _not_a_directory(ctx, fh) from None
    elif args != nfs4.SECINFO_STYLE4_CURRENT_FH:
        raise OSError(errno.EINVAL, "secinfo style")
    else:
        ctx.server.vfs.getattr(fh)
    flavors = ctx.server.vfs.flavors(ctx.cred, fh)
    ctx.current_fh = None
    ctx.current_stateid = None
    return _flavors(ctx, flavors)
