"""LOOKUP, LOOKUPP, SECINFO, SECINFO_NO_NAME (RFC 8881 sections 18.13, 18.14, 18.29, 18.45),
and the component-name checks every name-taking operation shares.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.rpc.auth import KRB5, pseudoflavor_of
from nfsrdma.rpc.gss_mech import KRB5_OID_DER
from nfsrdma.vfs.base import NAME_MAX, FileType, Vfs, WrongSecurity
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


# The flavour rule table (RFC 8881 section 2.6.3.1.1): the roles operations play in deciding
# NFS4ERR_WRONGSEC. The COMPOUND asks ``wrong_security`` about each operation of the table
# (a put-filehandle operation once it has put its filehandle, any other before it runs), on its
# fast paths as on the generic path (compound.py), and nowhere else; an operation not in the
# table is never refused for its flavour by the COMPOUND. The rule is the same whether the
# flavours come from the server (``--sec``) or from an export's ``sec=`` rule (the VFS's
# ``admit``), or both; only LOOKUP/LOOKUPP/OPEN differ, see ``wrong_security``.
PUT_FH = 1  # sets the current filehandle from nothing (PUTFH and its family, RESTOREFH)
BY_NAME = 2  # crosses to another object by name
SECINFO = 3  # asks which flavours to use: answered whatever the flavour
FLAVOUR_RULES: dict[int, int] = {
    nfs4.nfs_opnum4.OP_PUTFH: PUT_FH,
    nfs4.nfs_opnum4.OP_PUTROOTFH: PUT_FH,
    nfs4.nfs_opnum4.OP_PUTPUBFH: PUT_FH,
    nfs4.nfs_opnum4.OP_RESTOREFH: PUT_FH,
    nfs4.nfs_opnum4.OP_LOOKUP: BY_NAME,
    nfs4.nfs_opnum4.OP_LOOKUPP: BY_NAME,
    nfs4.nfs_opnum4.OP_OPEN: BY_NAME,
    nfs4.nfs_opnum4.OP_SECINFO: SECINFO,
    nfs4.nfs_opnum4.OP_SECINFO_NO_NAME: SECINFO,
}
PUT_FH_OPS = frozenset(op for op, rule in FLAVOUR_RULES.items() if rule == PUT_FH)
# What may follow a put-filehandle operation (SAVEFH aside) for it never to be refused: nothing
# (2.6.3.1.1.6), SECINFO or SECINFO_NO_NAME (2.6.3.1.1.5), LOOKUP, LOOKUPP or OPEN, which
# check the object they reach (2.6.3.1.1.3, 2.6.3.1.1.4), another put-filehandle operation
# (2.6.3.1.1.2).
_NOTHING = -1  # the rule of what follows the last operation (0: an operation not in the table)
_PUT_FH_EXEMPT = frozenset((_NOTHING, SECINFO, BY_NAME, PUT_FH))


# The operations ``wrong_security`` is asked about, by (the server has flavours of its own,
# its VFS has client rules): all of the table but SECINFO's; with the exports' rules alone,
# the put-filehandle operations (LOOKUP, LOOKUPP and OPEN are judged by the VFS itself);
# without either, none.
_ASKED = {
    (True, True): frozenset(op for op, rule in FLAVOUR_RULES.items() if rule != SECINFO),
    (True, False): frozenset(op for op, rule in FLAVOUR_RULES.items() if rule != SECINFO),
    (False, True): PUT_FH_OPS,
    (False, False): frozenset[int](),
}


def flavour_asked(security: tuple[int, ...] | None, vfs: Vfs) -> frozenset[int]:
    """The operations at which the COMPOUND must ask ``wrong_security`` on a server with the
    flavours ``security`` (None: no list of its own) over ``vfs``; any other is never refused
    for its flavour. A VFS whose ``admit`` is the base class's has no client rules."""
    return _ASKED[security is not None, type(vfs).admit is not Vfs.admit]


def wrong_security(ctx: CompoundContext, op: int, following: Callable[[], int | None]) -> bool:
    """NFS4ERR_WRONGSEC for operation ``op`` of the table? ``following`` gives the operation
    after it, SAVEFH skipped (None at the end of the COMPOUND; 2.6.3.1.1.1: SAVEFH is never
    refused, and the server acts as if it were not there); it is asked only when the answer
    depends on it.

    A put-filehandle operation (PUTFH, PUTROOTFH, PUTPUBFH, RESTOREFH) is asked once it has
    put its filehandle. Followed by nothing, by SECINFO or SECINFO_NO_NAME, by LOOKUP, LOOKUPP
    or OPEN, or by another put-filehandle operation, it is never refused (2.6.3.1.1.2 to
    2.6.3.1.1.6), so a client can always ask, from the root down, which flavours to use;
    followed by anything else, it is refused unless the request's pseudo-flavour is allowed
    for the filehandle it put (2.6.3.1.1.7): one of the server's (``--sec``), if it has a list,
    and one its export's ``sec=`` rule lists, if the VFS has rules. No operation after it is
    refused for its flavour then (only put-filehandle operations, LOOKUP, LOOKUPP and OPEN
    may be).

    LOOKUP, LOOKUPP and OPEN are judged on the object they reach. With the server's flavours,
    here, unless a SECINFO or SECINFO_NO_NAME follows (a server-wide list is the same for
    every object, and the client is then asking which flavours to use). With an export's
    ``sec=`` rule, by the VFS, which refuses the call into an export whose rule does not list
    the flavour, SECINFO following or not: LOOKUP + SECINFO_NO_NAME is refused there, and
    PUTFH + SECINFO (with the name) is the way to ask, under either policy."""
    rule = FLAVOUR_RULES[op]
    if rule == SECINFO:
        return False
    after = following()
    after_rule = FLAVOUR_RULES.get(after, 0) if after is not None else _NOTHING
    if rule == PUT_FH:
        if after_rule in _PUT_FH_EXEMPT:
            return False
        return not _flavour_allowed(ctx, ctx.current_fh)
    if after_rule == SECINFO:
        return False
    security = ctx.server.security
    return security is not None and pseudoflavor_of(ctx.principal) not in security


def _flavour_allowed(ctx: CompoundContext, fh: bytes | None) -> bool:
    """Is the request's pseudo-flavour one of the server's (if it has a list) and one the
    ``sec=`` rule of ``fh``'s export lists (if the VFS has rules)?"""
    security = ctx.server.security
    if security is not None and pseudoflavor_of(ctx.principal) not in security:
        return False
    if fh is not None:
        try:
            ctx.server.vfs.admit(ctx.cred, fh, flavor=True)
        except WrongSecurity:
            return False
    return True


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
