"""fattr4: the attributes this server supports, their encoding and the settable ones' decoding.

RFC 8881 section 5. What is advertised in ``supported_attrs`` is exactly what GETATTR can
return correctly: the REQUIRED attributes, the RECOMMENDED ones the Linux client asks for, and
nothing about ACLs, named attributes, fs_locations or pNFS. A request for an attribute outside
that set is answered without it (GETATTR, READDIR); an attempt to set or verify one gets
NFS4ERR_ATTRNOTSUPP.

* ``encode_attrs(bitmap, attributes, fsstats, fh, config)`` → ``fattr4`` (GETATTR, READDIR,
  OPEN's and CREATE's callers). The encoder for each request bitmap is compiled once and cached
  (see ``attr_encode.py``).
* ``decode_settable(fattr)`` → :class:`Settable` (SETATTR, CREATE and OPEN createattrs).
* ``bitmap_of(numbers)`` / ``attr_numbers(bitmap)``: bitmap4 ↔ attribute numbers.

Owners are numeric strings ("1000"), as knfsd sends them to AUTH_SYS clients and as the Linux
client expects by default (nfs4_disable_idmapping); names ("alice", "alice@domain") are
accepted on input and resolved with the host's user and group databases.
"""

from __future__ import annotations

import grp
import pwd
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from nfsrdma.nfs4.attr_encode import MAX_FILESIZE, WRITE_ONLY, EncoderCache, FattrConfig, Plan
from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.vfs.base import SET_TO_SERVER_TIME, Attributes, FsStats, TimeSet, Vfs
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import XdrError

__all__ = [
    "NOT_VERIFIABLE",
    "READ_ONLY",
    "SETTABLE",
    "SUPPATTR_EXCLCREAT",
    "SUPPORTED",
    "SUPPORTED_BITMAP",
    "WRITE_ONLY",
    "FattrConfig",
    "Plan",
    "Settable",
    "attr_numbers",
    "bitmap_of",
    "check_readable",
    "check_verifiable",
    "decode_settable",
    "encode_attrs",
    "encode_rdattr_error",
    "needs_fsstats",
    "object_attrs",
    "plan_for",
    "supported_subset",
]


def bitmap_of(numbers: Iterable[int]) -> list[int]:
    """The bitmap4 with these attribute numbers set (no trailing zero words)."""
    words: list[int] = []
    for n in numbers:
        if n < 0:
            raise ValueError(f"attribute number {n}")
        i = n >> 5
        if i >= len(words):
            words.extend([0] * (i + 1 - len(words)))
        words[i] |= 1 << (n & 31)
    return words


def attr_numbers(bitmap: Sequence[int]) -> list[int]:
    """The attribute numbers set in a bitmap4, ascending."""
    out: list[int] = []
    for i, word in enumerate(bitmap):
        base = i << 5
        while word:
            low = word & -word
            out.append(base + low.bit_length() - 1)
            word ^= low
    return out


# What this server returns (RFC 8881 section 5.6 REQUIRED, 5.7 RECOMMENDED).
SUPPORTED: Final = frozenset(
    {
        nfs4.FATTR4_SUPPORTED_ATTRS,
        nfs4.FATTR4_TYPE,
        nfs4.FATTR4_FH_EXPIRE_TYPE,
        nfs4.FATTR4_CHANGE,
        nfs4.FATTR4_SIZE,
        nfs4.FATTR4_LINK_SUPPORT,
        nfs4.FATTR4_SYMLINK_SUPPORT,
        nfs4.FATTR4_NAMED_ATTR,
        nfs4.FATTR4_FSID,
        nfs4.FATTR4_UNIQUE_HANDLES,
        nfs4.FATTR4_LEASE_TIME,
        nfs4.FATTR4_RDATTR_ERROR,
        nfs4.FATTR4_FILEHANDLE,
        nfs4.FATTR4_SUPPATTR_EXCLCREAT,
        nfs4.FATTR4_ACLSUPPORT,
        nfs4.FATTR4_CANSETTIME,
        nfs4.FATTR4_CASE_INSENSITIVE,
        nfs4.FATTR4_CASE_PRESERVING,
        nfs4.FATTR4_CHOWN_RESTRICTED,
        nfs4.FATTR4_FILEID,
        nfs4.FATTR4_FILES_AVAIL,
        nfs4.FATTR4_FILES_FREE,
        nfs4.FATTR4_FILES_TOTAL,
        nfs4.FATTR4_HOMOGENEOUS,
        nfs4.FATTR4_MAXFILESIZE,
        nfs4.FATTR4_MAXLINK,
        nfs4.FATTR4_MAXNAME,
        nfs4.FATTR4_MAXREAD,
        nfs4.FATTR4_MAXWRITE,
        nfs4.FATTR4_MODE,
        nfs4.FATTR4_NO_TRUNC,
        nfs4.FATTR4_NUMLINKS,
        nfs4.FATTR4_OWNER,
        nfs4.FATTR4_OWNER_GROUP,
        nfs4.FATTR4_RAWDEV,
        nfs4.FATTR4_SPACE_AVAIL,
        nfs4.FATTR4_SPACE_FREE,
        nfs4.FATTR4_SPACE_TOTAL,
        nfs4.FATTR4_SPACE_USED,
        nfs4.FATTR4_TIME_ACCESS,
        nfs4.FATTR4_TIME_ACCESS_SET,
        nfs4.FATTR4_TIME_DELTA,
        nfs4.FATTR4_TIME_METADATA,
        nfs4.FATTR4_TIME_MODIFY,
        nfs4.FATTR4_TIME_MODIFY_SET,
        nfs4.FATTR4_MOUNTED_ON_FILEID,
    }
)
SUPPORTED_BITMAP: Final = bitmap_of(SUPPORTED)

# What SETATTR (and createattrs) may set.
SETTABLE: Final = frozenset(
    {
        nfs4.FATTR4_SIZE,
        nfs4.FATTR4_MODE,
        nfs4.FATTR4_OWNER,
        nfs4.FATTR4_OWNER_GROUP,
        nfs4.FATTR4_TIME_ACCESS_SET,
        nfs4.FATTR4_TIME_MODIFY_SET,
    }
)
READ_ONLY: Final = SUPPORTED - SETTABLE
# VERIFY/NVERIFY refuse these with NFS4ERR_INVAL (RFC 8881 sections 18.20.3, 18.31.3).
NOT_VERIFIABLE: Final = WRITE_ONLY | {nfs4.FATTR4_RDATTR_ERROR}
# Exclusive create stores its verifier in atime/mtime, so the time setters are left out
# (RFC 8881 section 18.16.3, and the VFS contract).
SUPPATTR_EXCLCREAT: Final = frozenset(
    {nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP}
)

_SUPPORTED_WORDS: Final = tuple(SUPPORTED_BITMAP)


def supported_subset(bitmap: Sequence[int]) -> list[int]:
    """The request bitmap restricted to what this server supports (trailing zeros trimmed)."""
    words = [w & s for w, s in zip(bitmap, _SUPPORTED_WORDS, strict=False)]
    while words and not words[-1]:
        words.pop()
    return words


_ENCODERS = EncoderCache(
    SUPPORTED,
    supported_attrs=SUPPORTED_BITMAP,
    suppattr_exclcreat=bitmap_of(SUPPATTR_EXCLCREAT),
)


def needs_fsstats(bitmap: Sequence[int]) -> bool:
    """Whether encoding ``bitmap`` needs file-system statistics (``Vfs.statfs``)."""
    return _ENCODERS.plan(bitmap).needs_fs


def plan_for(bitmap: Sequence[int]) -> Plan:
    """The compiled encoder for a request bitmap (cached): ``plan.encode(...)``."""
    return _ENCODERS.plan(bitmap)


_WRITE_ONLY_WORDS: Final = tuple(bitmap_of(WRITE_ONLY))


def check_readable(bitmap: Sequence[int]) -> None:
    """GETATTR / READDIR: asking for a write-only attribute is NFS4ERR_INVAL (18.7.3)."""
    for w, wo in zip(bitmap, _WRITE_ONLY_WORDS, strict=False):
        if w & wo:
            raise Nfs4Error(nfs4.NFS4ERR_INVAL)


def object_attrs(vfs: Vfs, fh: bytes, bitmap: Sequence[int], config: FattrConfig) -> nfs4.fattr4:
    """GETATTR of one object: ``vfs.getattr`` (and ``vfs.statfs`` only when needed), encoded."""
    plan = _ENCODERS.plan(bitmap)
    attributes = vfs.getattr(fh)
    return plan.encode(attributes, vfs.statfs(fh) if plan.needs_fs else None, fh, config)


def encode_attrs(
    bitmap: Sequence[int],
    attributes: Attributes,
    fsstats: FsStats | None,
    fh: bytes,
    config: FattrConfig,
    rdattr_error: int = nfs4.NFS4_OK,
) -> nfs4.fattr4:
    """The fattr4 answering a request for ``bitmap`` about one object.

    ``fsstats`` may be ``None`` unless :func:`needs_fsstats` says otherwise; ``config`` gives
    lease_time and max_io (a ``ServerConfig`` will do). Unsupported bits are left out.
    """
    return _ENCODERS.encode(bitmap, attributes, fsstats, fh, config, rdattr_error)


_U32 = struct.Struct(">I")
_RDATTR_ERROR_MASK: Final = bitmap_of([nfs4.FATTR4_RDATTR_ERROR])


def encode_rdattr_error(status: int) -> nfs4.fattr4:
    """A READDIR entry's attributes when they could not be read: rdattr_error alone."""
    return nfs4.fattr4(list(_RDATTR_ERROR_MASK), _U32.pack(status))


def check_verifiable(bitmap: Sequence[int]) -> None:
    """VERIFY/NVERIFY: NFS4ERR_ATTRNOTSUPP for unsupported attributes, NFS4ERR_INVAL for
    rdattr_error and the write-only ones."""
    numbers = attr_numbers(bitmap)
    if any(n not in SUPPORTED for n in numbers):
        raise Nfs4Error(nfs4.NFS4ERR_ATTRNOTSUPP)
    if any(n in NOT_VERIFIABLE for n in numbers):
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)


# ---------------------------------------------------------------- settable attributes


@dataclass(slots=True)
class Settable:
    """Decoded settable attributes (``None`` = not given), and the bitmap of what was given."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime: TimeSet | None = None
    mtime: TimeSet | None = None
    attrset: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.attrset)


_U64 = struct.Struct(">Q")
_TIME = struct.Struct(">qI")
_NS = 1_000_000_000
_ID_MAX = 0xFFFFFFFE  # (uid_t)-1 means "unchanged" to chown(2): not a valid owner
MODE_BITS: Final = 0o7777


def decode_settable(fattr: nfs4.fattr4) -> Settable:
    """Decode SETATTR's / CREATE's / OPEN's attributes.

    Unsupported attributes → NFS4ERR_ATTRNOTSUPP; supported but read-only ones →
    NFS4ERR_INVAL (RFC 8881 sections 18.30.3, 18.4.3); values that do not decode exactly →
    NFS4ERR_BADXDR (XdrError); out-of-range values → NFS4ERR_INVAL, a size beyond the largest
    file NFS4ERR_FBIG; unknown owners → NFS4ERR_BADOWNER.
    """
    numbers = attr_numbers(fattr.attrmask)
    if any(n not in SUPPORTED for n in numbers):
        raise Nfs4Error(nfs4.NFS4ERR_ATTRNOTSUPP)
    if any(n not in SETTABLE for n in numbers):
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    buf = memoryview(fattr.attr_vals)
    out = Settable(attrset=bitmap_of(numbers))
    off = 0
    try:
        for n in numbers:
            if n == nfs4.FATTR4_SIZE:
                (out.size,) = _U64.unpack_from(buf, off)
                off += 8
                if out.size > MAX_FILESIZE:  # beyond fattr4_maxfilesize (RFC 8881 18.30.3)
                    raise Nfs4Error(nfs4.NFS4ERR_FBIG)
            elif n == nfs4.FATTR4_MODE:
                (mode,) = _U32.unpack_from(buf, off)
                off += 4
                if mode & ~MODE_BITS:
                    raise Nfs4Error(nfs4.NFS4ERR_INVAL)
                out.mode = mode
            elif n in (nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP):
                (length,) = _U32.unpack_from(buf, off)
                off += 4
                end = off + length
                if end + (-length & 3) > len(buf):
                    raise XdrError("owner string runs past the attribute list", off)
                text = bytes(buf[off:end])
                off = end + (-length & 3)
                if n == nfs4.FATTR4_OWNER:
                    out.uid = parse_owner(text, group=False)
                else:
                    out.gid = parse_owner(text, group=True)
            else:  # time_access_set, time_modify_set
                (how,) = _U32.unpack_from(buf, off)
                off += 4
                value: TimeSet
                if how == nfs4.SET_TO_SERVER_TIME4:
                    value = SET_TO_SERVER_TIME
                elif how == nfs4.SET_TO_CLIENT_TIME4:
                    seconds, nseconds = _TIME.unpack_from(buf, off)
                    off += 12
                    if nseconds >= _NS:
                        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
                    value = seconds * _NS + nseconds
                else:
                    raise XdrError(f"time_how4 {how}", off - 4)
                if n == nfs4.FATTR4_TIME_ACCESS_SET:
                    out.atime = value
                else:
                    out.mtime = value
    except struct.error:
        raise XdrError("truncated attribute list", off) from None
    if off != len(buf):
        raise XdrError(f"{len(buf) - off} octets after the last attribute", off)
    return out


def parse_owner(text: bytes, *, group: bool) -> int:
    """An owner / owner_group string → uid / gid (NFS4ERR_INVAL, NFS4ERR_BADOWNER)."""
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL) from None
    if not s:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    if s.isascii() and s.isdigit():
        if len(s) > 10 or int(s) > _ID_MAX:
            raise Nfs4Error(nfs4.NFS4ERR_BADOWNER)
        return int(s)
    name = s.rpartition("@")[0] if "@" in s else s
    if not name or "\0" in name:
        raise Nfs4Error(nfs4.NFS4ERR_BADOWNER)
    try:
        if group:
            return grp.getgrnam(name).gr_gid
        return pwd.getpwnam(name).pw_uid
    except (KeyError, UnicodeEncodeError):
        raise Nfs4Error(nfs4.NFS4ERR_BADOWNER) from None
