"""READDIR (RFC 8881 section 18.23).

Cookies and the cookie verifier come from the VFS (a cookie names a position in the directory,
see ``nfsrdma.vfs.base``). The reply honours both limits of the request:

* ``maxcount`` bounds the whole READDIR4resok (cookieverf, the entry list with its XDR
  framing, eof). When not even the first entry fits: NFS4ERR_TOOSMALL.
* ``dircount`` (when not zero) bounds the XDR size of the entries' cookies and names; at least
  one entry is always returned.

An entry whose attributes cannot be read gets ``rdattr_error`` alone when the client asked for
it; otherwise the READDIR fails with that error.
"""

from __future__ import annotations

from nfsrdma.nfs4.attrs import (
    check_readable,
    encode_rdattr_error,
    fattr_for_minor_version,
    for_minor_version,
    plan_for,
)
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.errors import ERRNO_STATUS
from nfsrdma.vfs.base import DirEntry
from nfsrdma.xdr.gen import nfs4

_OK = nfs4.NFS4_OK
RESOK_OVERHEAD = 8 + 4 + 4  # cookieverf, end of the entry list, eof
ENTRY_OVERHEAD = 4 + 8 + 4 + 4 + 4  # "an entry follows", cookie, name length, mask count, vals
REPLY_MARGIN = 1024  # room for the RPC and COMPOUND headers and the operations before READDIR
MAX_BATCH = 1024
GUESSED_ENTRY_SIZE = 128  # for sizing the first batch asked of the VFS
_ZERO_VERF = bytes(8)
_RDATTR_WORD = 1 << nfs4.FATTR4_RDATTR_ERROR  # word 0


def _pad(n: int) -> int:
    return n + (-n & 3)


def _entry_error(entry: DirEntry, want_rdattr_error: bool) -> nfs4.fattr4:
    status = ERRNO_STATUS.get(entry.error, nfs4.NFS4ERR_IO)
    if not want_rdattr_error:
        raise Nfs4Error(status)
    return encode_rdattr_error(status)


def readdir(ctx: CompoundContext, args: nfs4.READDIR4args) -> nfs4.READDIR4res:
    fh = ctx.fh()
    request = for_minor_version(args.attr_request, ctx.minorversion)
    check_readable(request)
    vfs = ctx.server.vfs
    config = ctx.server.config
    plan = plan_for(request)
    want_rdattr_error = bool(request and request[0] & _RDATTR_WORD)

    budget = args.maxcount
    if ctx.session is not None:
        budget = min(budget, max(ctx.session.fore.ca_maxresponsesize - REPLY_MARGIN, 0))
    budget -= RESOK_OVERHEAD
    dir_left = args.dircount if args.dircount else -1
    cookie = args.cookie
    batch = max(1, min(MAX_BATCH, budget // GUESSED_ENTRY_SIZE + 1))

    listing = vfs.readdir(ctx.cred, fh, cookie, bytes(args.cookieverf), batch)
    if (
        args.cookie != 0
        and args.cookieverf != _ZERO_VERF
        and bytes(args.cookieverf) != listing.verifier
    ):
        raise Nfs4Error(nfs4.NFS4ERR_NOT_SAME)
    if args.maxcount < RESOK_OVERHEAD:
        raise Nfs4Error(nfs4.NFS4ERR_TOOSMALL)
    fsstats = vfs.statfs(fh) if plan.needs_fs else None

    entries: list[nfs4.entry4] = []
    used = 0
    eof = False
    full = False
    while True:
        for e in listing.entries:
            if e.error or e.attrs is None or e.fh is None:
                fattr = _entry_error(e, want_rdattr_error)
            else:
                fattr = plan.encode(e.attrs, fsstats, e.fh, config)
                fattr = fattr_for_minor_version(fattr, ctx.minorversion)
            names = 8 + 4 + _pad(len(e.name))
            size = ENTRY_OVERHEAD + _pad(len(e.name)) + 4 * len(fattr.attrmask)
            size += _pad(len(fattr.attr_vals))
            if size > budget - used:
                if not entries:
                    raise Nfs4Error(nfs4.NFS4ERR_TOOSMALL)
                full = True
                break
            if entries and 0 <= dir_left < names:
                full = True
                break
            entries.append(nfs4.entry4(e.cookie, e.name, fattr))
            used += size
            if dir_left >= 0:
                dir_left = max(dir_left - names, 0)
            cookie = e.cookie
        if full or not listing.entries:
            eof = listing.eof and not full
            break
        if listing.eof:
            eof = True
            break
        # Ask for about as many more entries as should still fit.
        average = max(used // len(entries), 1)
        batch = max(1, min(MAX_BATCH, (budget - used) // average + 1))
        listing = vfs.readdir(ctx.cred, fh, cookie, listing.verifier, batch)

    return nfs4.READDIR4res(_OK, nfs4.READDIR4resok(listing.verifier, nfs4.dirlist4(entries, eof)))
