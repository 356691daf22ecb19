"""PUTROOTFH, PUTPUBFH, PUTFH, GETFH, SAVEFH, RESTOREFH (RFC 8881 sections 18.19-18.22, 18.8,
18.27, 18.28).

The current and saved stateids travel with the filehandles (section 16.2.3.1.2): an operation
that sets a new current filehandle clears the current stateid; SAVEFH saves both, RESTOREFH
restores both.
"""

from __future__ import annotations

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.vfs.base import NFS4_FHSIZE, BadHandle
from nfsrdma.xdr.gen import nfs4

_OK = nfs4.NFS4_OK


def putrootfh(ctx: CompoundContext, args: None) -> nfs4.PUTROOTFH4res:
    ctx.set_fh(ctx.server.vfs.root_handle())
    return nfs4.PUTROOTFH4res(_OK)


def putpubfh(ctx: CompoundContext, args: None) -> nfs4.PUTPUBFH4res:
    # The public filehandle is the root of the export (RFC 8881 section 18.20.3 allows it).
    ctx.set_fh(ctx.server.vfs.root_handle())
    return nfs4.PUTPUBFH4res(_OK)


def putfh(ctx: CompoundContext, args: nfs4.PUTFH4args) -> nfs4.PUTFH4res:
    put_fh(ctx, args.object)
    return nfs4.PUTFH4res(_OK)


def put_fh(ctx: CompoundContext, fh: bytes) -> None:
    """PUTFH's work (the COMPOUND fast path calls it directly: its result is a constant)."""
    if type(fh) is not bytes:
        fh = bytes(fh)
    if not fh or len(fh) > NFS4_FHSIZE:
        raise BadHandle(f"filehandle of {len(fh)} octets")
    # Validated now, so that a forged or stale handle fails on PUTFH itself, as with knfsd.
    ctx.server.vfs.check(fh)
    # The client's export rule: NFS4ERR_ACCESS now; a wrong flavour is for the flavour rules
    # to refuse (ops/lookup.py FLAVOUR_RULES, asked by the COMPOUND before each operation).
    vfs = ctx.server.vfs
    vfs.admit(ctx.cred, fh)
    ctx.current_fh = fh  # (ctx.set_fh, inlined: a new current filehandle, no current stateid)
    ctx.current_stateid = None


def getfh(ctx: CompoundContext, args: None) -> nfs4.GETFH4res:
    return nfs4.GETFH4res(_OK, nfs4.GETFH4resok(ctx.fh()))


def savefh(ctx: CompoundContext, args: None) -> nfs4.SAVEFH4res:
    ctx.saved_fh = ctx.fh()
    ctx.saved_stateid = ctx.current_stateid
    return nfs4.SAVEFH4res(_OK)


def restorefh(ctx: CompoundContext, args: None) -> nfs4.RESTOREFH4res:
    if ctx.saved_fh is None:
        raise Nfs4Error(nfs4.NFS4ERR_RESTOREFH)
    ctx.current_fh = ctx.saved_fh
    ctx.current_stateid = ctx.saved_stateid
    return nfs4.RESTOREFH4res(_OK)
