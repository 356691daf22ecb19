"""How large the reply to a COMPOUND can be, from its operations and arguments (sans-IO;
RFC 8267 section 3, UL-3, UL-4, TR-10).

Over RPC-over-RDMA a requester offers a Reply chunk, and registers memory the responder may
write for it, only when the largest possible reply could exceed the s→c inline threshold
(``marshal.plan_call`` compares). The Linux client's xprtrdma keeps a maximum reply size per
procedure for this; an NFSv4 COMPOUND's reply depends on its operations, so it is bounded here
operation by operation:

- fixed-size results (SEQUENCE, PUTFH, LOOKUP, ACCESS, CLOSE, WRITE, ...) by their XDR size,
  error arms included (LOCK's NFS4ERR_DENIED carries a lock owner);
- GETATTR (and OPEN, CREATE, SETATTR bitmaps) by the requested attributes: each attribute's
  largest encoding, with NFS4_OPAQUE_LIMIT (1024 octets) for owner strings; attributes without
  a bound (ACLs, fs_locations, mimetype, layouts, labels...) make the reply unbounded;
- READ by its count, unless its data goes to a Write chunk (``sinks``); READDIR and LISTXATTRS
  by their maxcount; READLINK by PATH_MAX;
- anything else (SECINFO, GETXATTR, READ_PLUS, layouts, unknown operations) is unbounded.

``None`` means unbounded: the caller offers a Reply chunk as large as the session allows. On top
of the COMPOUND4res come the RPC reply header and its verifier (``RPC_REPLY_OVERHEAD``) and, for
RPCSEC_GSS integrity or privacy, the checksum or wrap token (the caller adds that). A bound that
proves wrong anyway (a server with longer owner names) costs one resend with a full Reply chunk
(``client_core.CallMachine.on_transport_refused``), never a wrong result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nfsrdma.xdr.gen import nfs4

__all__ = [
    "OPAQUE_LIMIT",
    "PATH_MAX",
    "RPC_REPLY_OVERHEAD",
    "attr_bound",
    "compound_reply_bound",
    "op_reply_bound",
]

OPAQUE_LIMIT = 1024  # NFS4_OPAQUE_LIMIT: the bound taken for owner strings and lock owners
PATH_MAX = 4096  # the longest symbolic link text taken for READLINK
MAX_AUTH_BYTES = 400  # RFC 5531: the largest verifier body
# xid, REPLY, MSG_ACCEPTED, verifier (flavor, length, body), SUCCESS.
RPC_REPLY_OVERHEAD = 4 * 5 + MAX_AUTH_BYTES + 4

_STATUS = 4
_RESOP = 4
_STATEID = 16
_CHANGE_INFO = 4 + 8 + 8
_BITMAP = 4 + 4 * 4  # a returned bitmap4: up to four words (NFSv4.2 uses three)
_FH = 4 + nfs4.NFS4_FHSIZE
_NFSTIME = 12
_LOCK_OWNER = 8 + 4 + OPAQUE_LIMIT
_LOCK4DENIED = 8 + 8 + 4 + _LOCK_OWNER
_NFSACE_WHO = 4 + 4 + 4 + 4 + OPAQUE_LIMIT  # nfsace4 with a who of at most OPAQUE_LIMIT

# The largest encoding of each attribute's value by name (RFC 8881 section 5, RFC 7862,
# RFC 8275, RFC 8276). Attributes not listed here have no bound (lists of ACEs, locations,
# layouts, strings the server chooses).
_ATTR_SIZES: dict[str, int] = {
    # REQUIRED
    "supported_attrs": _BITMAP,
    "type": 4,
    "fh_expire_type": 4,
    "change": 8,
    "size": 8,
    "link_support": 4,
    "symlink_support": 4,
    "named_attr": 4,
    "fsid": 16,
    "unique_handles": 4,
    "lease_time": 4,
    "rdattr_error": 4,
    "filehandle": _FH,
    "suppattr_exclcreat": _BITMAP,
    # RECOMMENDED, fixed size
    "aclsupport": 4,
    "archive": 4,
    "cansettime": 4,
    "case_insensitive": 4,
    "case_preserving": 4,
    "chown_restricted": 4,
    "fileid": 8,
    "files_avail": 8,
    "files_free": 8,
    "files_total": 8,
    "hidden": 4,
    "homogeneous": 4,
    "maxfilesize": 8,
    "maxlink": 4,
    "maxname": 4,
    "maxread": 8,
    "maxwrite": 8,
    "mode": 4,
    "no_trunc": 4,
    "numlinks": 4,
    "owner": 4 + OPAQUE_LIMIT,
    "owner_group": 4 + OPAQUE_LIMIT,
    "quota_avail_hard": 8,
    "quota_avail_soft": 8,
    "quota_used": 8,
    "rawdev": 8,
    "space_avail": 8,
    "space_free": 8,
    "space_total": 8,
    "space_used": 8,
    "system": 4,
    "time_access": _NFSTIME,
    "time_access_set": 4 + _NFSTIME,
    "time_backup": _NFSTIME,
    "time_create": _NFSTIME,
    "time_delta": _NFSTIME,
    "time_metadata": _NFSTIME,
    "time_modify": _NFSTIME,
    "time_modify_set": 4 + _NFSTIME,
    "mounted_on_fileid": 8,
    "dir_notif_delay": _NFSTIME,
    "dirent_notif_delay": _NFSTIME,
    "change_policy": 16,
    "layout_blksize": 4,
    "layout_alignment": 4,
    "retention_get": 8 + 4 + _NFSTIME,
    "retention_set": 4 + 4 + 8,
    "retentevt_get": 8 + 4 + _NFSTIME,
    "retentevt_set": 4 + 4 + 8,
    "retention_hold": 8,
    "mode_set_masked": 8,
    "fs_charset_cap": 4,
    "clone_blksize": 4,
    "space_freed": 8,
    "change_attr_type": 4,
    "mode_umask": 8,
    "xattr_support": 4,
}


def _attr_numbers() -> dict[int, int]:
    sizes: dict[int, int] = {}
    for name, size in _ATTR_SIZES.items():
        bit = getattr(nfs4, f"FATTR4_{name.upper()}", None)
        if isinstance(bit, int):
            sizes[bit] = size
    return sizes


_ATTR_BY_BIT = _attr_numbers()
_bitmap_bounds: dict[tuple[int, ...], int | None] = {}


def attr_bound(bitmap: Sequence[int]) -> int | None:
    """The largest fattr4 (its bitmap and attribute values) a server can return for the request
    ``bitmap``; None when one of the attributes has no bound."""
    key = tuple(bitmap)
    try:
        return _bitmap_bounds[key]
    except KeyError:
        pass
    total: int | None = 4 + 4 * max(len(key), 4) + 4  # bitmap4 and attrlist4's length
    for i, word in enumerate(key):
        bit = 0
        while word and total is not None:
            if word & 1:
                size = _ATTR_BY_BIT.get(i * 32 + bit)
                total = None if size is None else total + size
            word >>= 1
            bit += 1
    if len(_bitmap_bounds) < 256:
        _bitmap_bounds[key] = total
    return total


def _padded(n: int) -> int:
    return n + (-n & 3)


# Operations whose result has one fixed largest size (status included).
_FIXED: dict[int, int] = {
    nfs4.OP_SEQUENCE: _STATUS + 16 + 4 * 5,
    nfs4.OP_PUTFH: _STATUS,
    nfs4.OP_PUTROOTFH: _STATUS,
    nfs4.OP_PUTPUBFH: _STATUS,
    nfs4.OP_SAVEFH: _STATUS,
    nfs4.OP_RESTOREFH: _STATUS,
    nfs4.OP_GETFH: _STATUS + _FH,
    nfs4.OP_LOOKUP: _STATUS,
    nfs4.OP_LOOKUPP: _STATUS,
    nfs4.OP_ACCESS: _STATUS + 8,
    nfs4.OP_CLOSE: _STATUS + _STATEID,
    nfs4.OP_OPEN_DOWNGRADE: _STATUS + _STATEID,
    nfs4.OP_OPEN_CONFIRM: _STATUS + _STATEID,
    nfs4.OP_COMMIT: _STATUS + 8,
    nfs4.OP_WRITE: _STATUS + 4 + 4 + 8,
    nfs4.OP_CREATE: _STATUS + _CHANGE_INFO + _BITMAP,
    nfs4.OP_REMOVE: _STATUS + _CHANGE_INFO,
    nfs4.OP_RENAME: _STATUS + 2 * _CHANGE_INFO,
    nfs4.OP_LINK: _STATUS + _CHANGE_INFO,
    nfs4.OP_SETATTR: _STATUS + _BITMAP,
    nfs4.OP_LOCK: _STATUS + max(_STATEID, _LOCK4DENIED),
    nfs4.OP_LOCKT: _STATUS + _LOCK4DENIED,
    nfs4.OP_LOCKU: _STATUS + _STATEID,
    nfs4.OP_DELEGRETURN: _STATUS,
    nfs4.OP_DELEGPURGE: _STATUS,
    nfs4.OP_FREE_STATEID: _STATUS,
    nfs4.OP_RECLAIM_COMPLETE: _STATUS,
    nfs4.OP_DESTROY_SESSION: _STATUS,
    nfs4.OP_DESTROY_CLIENTID: _STATUS,
    nfs4.OP_VERIFY: _STATUS,
    nfs4.OP_NVERIFY: _STATUS,
    nfs4.OP_OPENATTR: _STATUS,
    nfs4.OP_RELEASE_LOCKOWNER: _STATUS,
    nfs4.OP_RENEW: _STATUS,
    nfs4.OP_ILLEGAL: _STATUS,
    nfs4.OP_SEEK: _STATUS + 4 + 8,
    nfs4.OP_ALLOCATE: _STATUS,
    nfs4.OP_DEALLOCATE: _STATUS,
    nfs4.OP_CLONE: _STATUS,
    # COPY: a write_response4 (optional callback stateid, count, committed, verifier) and the
    # copy requirements; NFS4ERR_OFFLOAD_NO_REQS carries the requirements alone.
    nfs4.OP_COPY: _STATUS + 4 + _STATEID + 8 + 4 + 8 + 4 + 4,
    nfs4.OP_OFFLOAD_CANCEL: _STATUS,
    nfs4.OP_SETXATTR: _STATUS + _CHANGE_INFO,
    nfs4.OP_REMOVEXATTR: _STATUS + _CHANGE_INFO,
}

# OPEN4resok: stateid, change_info, rflags, attrset and the largest open_delegation4 (a write
# delegation: stateid, recall, space limit, an nfsace4 with a who of OPAQUE_LIMIT).
_OPEN = _STATUS + _STATEID + _CHANGE_INFO + 4 + _BITMAP + 4 + _STATEID + 4 + 4 + 8 + _NFSACE_WHO


def op_reply_bound(op: nfs4.nfs_argop4, *, write_chunk: bool = False) -> int | None:
    """The largest encoded ``nfs_resop4`` for ``op`` (its opcode word included); None when it
    has no bound. ``write_chunk``: a READ-class result's data goes in a Write chunk, not in the
    reply."""
    number = int(op.argop)
    size = _FIXED.get(number)
    if size is not None:
        return _RESOP + size
    args: Any = op.value
    if number == nfs4.OP_GETATTR:
        fattr = attr_bound(args.attr_request)
        return None if fattr is None else _RESOP + _STATUS + fattr
    if number == nfs4.OP_READ:
        data = 0 if write_chunk else _padded(args.count)
        return _RESOP + _STATUS + 4 + 4 + data
    if number == nfs4.OP_READDIR:
        # maxcount bounds the whole READDIR4resok (RFC 8881 section 18.23.3).
        return _RESOP + _STATUS + 8 + 4 + _padded(args.maxcount)
    if number == nfs4.OP_READLINK:
        return _RESOP + _STATUS + 4 + (0 if write_chunk else PATH_MAX)
    if number == nfs4.OP_OPEN:
        return _RESOP + _OPEN
    if number == nfs4.OP_TEST_STATEID:
        return _RESOP + _STATUS + 4 + 4 * len(args.ts_stateids)
    if number == nfs4.OP_LISTXATTRS:
        # lxa_maxcount bounds the names and the cookie (RFC 8276 section 8.4.3.1).
        return _RESOP + _STATUS + 8 + 4 + 4 + _padded(args.lxa_maxcount)
    return None


def compound_reply_bound(
    ops: Sequence[nfs4.nfs_argop4], tag: bytes = b"", *, write_chunks: int = 0
) -> int | None:
    """The largest COMPOUND4res for ``ops`` (SEQUENCE included if it is among them), plus the RPC
    reply header and an AUTH_NONE/AUTH_SYS-sized verifier (``RPC_REPLY_OVERHEAD``); None when
    an operation's result has no bound. The first ``write_chunks`` READ-class results (READ,
    READLINK) have their data placed by Write chunks (RFC 8267 section 6.4.1)."""
    total = RPC_REPLY_OVERHEAD + _STATUS + 4 + _padded(len(tag)) + 4
    read_class = 0
    for op in ops:
        placed = False
        if op.argop in (nfs4.OP_READ, nfs4.OP_READLINK):
            placed = read_class < write_chunks
            read_class += 1
        size = op_reply_bound(op, write_chunk=placed)
        if size is None:
            return None
        total += size
    return total
