"""READDIR (RFC 8881 section 18.23).

Cookies and the cookie verifier come from the VFS (a cookie names a position in the directory,
see ``nfsrdma.vfs.base``). The reply honours both limits of the request:

* ``maxcount`` bounds the whole READDIR4resok (cookieverf, the entry list with its XDR
  framing, eof). When not even the first entry fits: NFS4ERR_TOOSMALL.
* ``dircount`` (when not zero) bounds the XDR size of the entries' cookies and names; at least
  one entry is always returned.

An entry whose attributes cannot be read gets ``rdattr_error`` alone when the client asked for
it; otherwise the READDIR fails with that error.

Every entry costs the VFS a few system calls (open, stat, file handle) and us its attributes'
encoding: a READDIR of a large directory with a large ``maxcount`` (the Linux client asks for up
to 1 MiB) would keep the event loop from every other client for thousands of entries. So the
first ``config.readdir_inline`` entries are listed at once, and when the reply has room for
more and the directory has more, the rest is listed and encoded in the server's thread pool,
and the handler returns an awaitable (the VFS is thread-safe; system calls there let the loop
run). Small directories, most of them, never leave the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable

from nfsrdma.nfs4.attrs import (
    check_readable,
    encode_rdattr_error,
    fattr_for_minor_version,
    for_minor_version,
    plan_for,
)
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.errors import ERRNO_STATUS
from nfsrdma.vfs.base import DirEntry, DirListing, FsStats
from nfsrdma.vfs.confine import close_window, open_window
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


class _Reply:
    """The entries of one READDIR reply as they are listed, within the request's limits."""

    def __init__(self, ctx: CompoundContext, args: nfs4.READDIR4args, request: list[int]) -> None:
        self.plan = plan_for(request)
        self.want_rdattr_error = bool(request and request[0] & _RDATTR_WORD)
        self.config = ctx.server.config
        self.minorversion = ctx.minorversion
        self.fsstats: FsStats | None = None
        budget = args.maxcount
        if ctx.session is not None:
            budget = min(budget, max(ctx.session.fore.ca_maxresponsesize - REPLY_MARGIN, 0))
        self.budget = budget - RESOK_OVERHEAD
        self.dir_left = args.dircount if args.dircount else -1
        self.cookie = args.cookie
        self.entries: list[nfs4.entry4] = []
        self.used = 0
        self.full = False

    def first_batch(self) -> int:
        return max(1, min(MAX_BATCH, self.budget // GUESSED_ENTRY_SIZE + 1))

    def next_batch(self) -> int:
        """About as many more entries as should still fit."""
        average = max(self.used // len(self.entries), 1)
        return max(1, min(MAX_BATCH, (self.budget - self.used) // average + 1))

    def take(self, listing: DirListing) -> bool:
        """Add what fits of ``listing``'s entries; True when the reply is complete."""
        plan, config, minorversion = self.plan, self.config, self.minorversion
        entries = self.entries
        for e in listing.entries:
            if e.error or e.attrs is None or e.fh is None:
                fattr = _entry_error(e, self.want_rdattr_error)
            else:
                fattr = plan.encode(e.attrs, self.fsstats, e.fh, config)
                fattr = fattr_for_minor_version(fattr, minorversion)
            names = 8 + 4 + _pad(len(e.name))
            size = ENTRY_OVERHEAD + _pad(len(e.name)) + 4 * len(fattr.attrmask)
            size += _pad(len(fattr.attr_vals))
            if size > self.budget - self.used:
                if not entries:
                    raise Nfs4Error(nfs4.NFS4ERR_TOOSMALL)
                self.full = True
                return True
            if entries and 0 <= self.dir_left < names:
                self.full = True
                return True
            entries.append(nfs4.entry4(e.cookie, e.name, fattr))
            self.used += size
            if self.dir_left >= 0:
                self.dir_left = max(self.dir_left - names, 0)
            self.cookie = e.cookie
        return not listing.entries or listing.eof

    def result(self, listing: DirListing) -> nfs4.READDIR4res:
        eof = listing.eof and not self.full
        resok = nfs4.READDIR4resok(listing.verifier, nfs4.dirlist4(self.entries, eof))
        return nfs4.READDIR4res(_OK, resok)


def readdir(
    ctx: CompoundContext, args: nfs4.READDIR4args
) -> nfs4.READDIR4res | Awaitable[nfs4.READDIR4res]:
    """Up to ``config.readdir_inline`` entries at once; a reply that can take more of a
    directory that has more continues in the thread pool (an awaitable)."""
    fh = ctx.fh()
    request = for_minor_version(args.attr_request, ctx.minorversion)
    check_readable(request)
    vfs = ctx.server.vfs
    reply = _Reply(ctx, args, request)
    inline = max(ctx.server.config.readdir_inline, 1)
    cred = ctx.cred
    listing = vfs.readdir(
        cred, fh, args.cookie, bytes(args.cookieverf), min(reply.first_batch(), inline)
    )
    if (
        args.cookie != 0
        and args.cookieverf != _ZERO_VERF
        and bytes(args.cookieverf) != listing.verifier
    ):
        raise Nfs4Error(nfs4.NFS4ERR_NOT_SAME)
    if args.maxcount < RESOK_OVERHEAD:
        raise Nfs4Error(nfs4.NFS4ERR_TOOSMALL)
    if reply.plan.needs_fs:
        reply.fsstats = vfs.statfs(fh)
    done = reply.take(listing)
    while not done and len(reply.entries) < inline:
        batch = min(reply.next_batch(), inline - len(reply.entries))
        listing = vfs.readdir(cred, fh, reply.cookie, listing.verifier, batch)
        done = reply.take(listing)
    if done:
        return reply.result(listing)

    def rest(listing: DirListing) -> nfs4.READDIR4res:
        # One uninterrupted run on the pool's thread, as the part above was on the loop's: a
        # check window of its own (vfs/confine.py), so that it checks what it uses as often.
        open_window()
        try:
            while True:
                batch = reply.next_batch()
                listing = vfs.readdir(cred, fh, reply.cookie, listing.verifier, batch)
                if reply.take(listing):
                    return reply.result(listing)
        finally:
            close_window()

    return ctx.in_pool(lambda: rest(listing))
