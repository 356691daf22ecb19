"""fattr4: the attributes this server supports, their encoding and the settable ones' decoding.

RFC 8881 section 5. What is advertised in ``supported_attrs`` is exactly what GETATTR can
return correctly: the REQUIRED attributes, the RECOMMENDED ones the Linux client asks for, and
nothing about ACLs, named attributes, fs_locations or pNFS. A request for an attribute outside
that set is answered without it (GETATTR, READDIR); an attempt to set or verify one gets
NFS4ERR_ATTRNOTSUPP.

* ``encode_attrs(bitmap, attributes, fsstats, fh, config)`` → ``fattr4`` (GETATTR, READDIR,
  OPEN's and CREATE's callers), by the encoder of each request bitmap (``attr_encode.py``).
* ``decode_settable(fattr)`` → :class:`Settable` (SETATTR, CREATE and OPEN createattrs), the
  values decoded by the generated codecs (``attr_decode.py``).
* ``bitmap_of(numbers)`` / ``attr_numbers(bitmap)``: bitmap4 ↔ attribute numbers.

Owners are numeric strings ("1000"), as knfsd sends them to AUTH_SYS clients and as the Linux
client expects by default (nfs4_disable_idmapping); names ("alice", "alice@domain") are
accepted on input and resolved with the host's user and group databases.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from nfsrdma.nfs4 import owners
from nfsrdma.nfs4.attr_decode import decode_values
from nfsrdma.nfs4.attr_encode import WRITE_ONLY, EncoderCache, FattrConfig, Plan
from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.vfs.base import SET_TO_SERVER_TIME, Attributes, FsStats, TimeSet, Vfs
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.nfs4_fattr import MAX_FILESIZE
from nfsrdma.xdr.runtime import pack

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
    "check_minor_version",
    "check_readable",
    "check_verifiable",
    "decode_settable",
    "encode_attrs",
    "encode_rdattr_error",
    "for_minor_version",
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


# What this server returns (RFC 8881 section 5.6 REQUIRED, 5.7 RECOMMENDED): the attribute
# table compiled with the XDR codecs (nfsrdma/xdr/nfs4_fattr.py), where each has its source.
SUPPORTED: Final = nfs4.SERVER_SUPPORTED_ATTRS
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
SUPPATTR_EXCLCREAT: Final = nfs4.SERVER_SUPPATTR_EXCLCREAT

_SUPPORTED_WORDS: Final = tuple(SUPPORTED_BITMAP)

# NFSv4.2's attributes (RFC 7862 section 12.2, RFC 8276): a minor version 1 COMPOUND neither
# sees them in supported_attrs nor gets them.
MINOR2_ATTRS: Final = frozenset(
    {
        nfs4.FATTR4_CLONE_BLKSIZE,
        nfs4.FATTR4_SPACE_FREED,
        nfs4.FATTR4_CHANGE_ATTR_TYPE,
        nfs4.FATTR4_SEC_LABEL,
        nfs4.FATTR4_XATTR_SUPPORT,
    }
)
SUPPORTED_V41: Final = SUPPORTED - MINOR2_ATTRS
_V41_WORDS: Final = tuple(bitmap_of(SUPPORTED_V41))
_V41_SUPPORTED_XDR: Final = pack(nfs4.enc_bitmap4, list(_V41_WORDS))
_V42_SUPPORTED_XDR: Final = pack(nfs4.enc_bitmap4, list(_SUPPORTED_WORDS))


def for_minor_version(bitmap: Sequence[int], minor: int) -> list[int]:
    """A request bitmap as the COMPOUND's minor version may ask it: for minor version 1 the
    NFSv4.2 attributes are dropped (they do not exist there)."""
    if minor >= 2:
        return list(bitmap)
    return [w & s for w, s in zip(bitmap, _V41_WORDS, strict=False)]


def check_minor_version(bitmap: Sequence[int], minor: int) -> None:
    """SETATTR / VERIFY / NVERIFY naming an attribute the minor version lacks:
    NFS4ERR_ATTRNOTSUPP."""
    if minor < 2 and MINOR2_ATTRS.intersection(attr_numbers(bitmap)):
        raise Nfs4Error(nfs4.NFS4ERR_ATTRNOTSUPP)


def fattr_for_minor_version(fattr: nfs4.fattr4, minor: int) -> nfs4.fattr4:
    """supported_attrs as the minor version has it: attribute 0 always comes first in the
    values, and both sets are three words long, so the minor version 1 set replaces it in place."""
    if minor >= 2 or not fattr.attrmask or not fattr.attrmask[0] & 1:
        return fattr
    n = len(_V42_SUPPORTED_XDR)
    vals = fattr.attr_vals
    if bytes(vals[:n]) != _V42_SUPPORTED_XDR:  # pragma: no cover - an encoder bug
        raise AssertionError("supported_attrs is not the first attribute value")
    return nfs4.fattr4(fattr.attrmask, _V41_SUPPORTED_XDR + bytes(vals[n:]))


def supported_subset(bitmap: Sequence[int]) -> list[int]:
    """The request bitmap restricted to what this server supports (trailing zeros trimmed)."""
    words = [w & s for w, s in zip(bitmap, _SUPPORTED_WORDS, strict=False)]
    while words and not words[-1]:
        words.pop()
    return words


_ENCODERS = EncoderCache(SUPPORTED)


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


# GETATTR's plan by (request bitmap, minor version), once the bitmap was found readable; at
# most 256 (a client asks for a few bitmaps over and over).
_GETATTR_PLANS: dict[tuple[int, tuple[int, ...]], tuple[Plan, bool]] = {}


def getattr_plan(bitmap: Sequence[int], minor: int) -> tuple[Plan, bool]:
    """GETATTR's encoder for a request bitmap in a minor version (``check_readable``, then
    ``for_minor_version``), and whether its fattr4 goes through ``fattr_for_minor_version``
    (minor version 1 asking for supported_attrs). Raises Nfs4Error as ``check_readable``."""
    key = (minor, tuple(bitmap))
    known = _GETATTR_PLANS.get(key)
    if known is None:
        check_readable(bitmap)
        plan = _ENCODERS.plan(for_minor_version(bitmap, minor))
        known = (plan, minor < 2 and bool(plan.mask) and bool(plan.mask[0] & 1))
        if len(_GETATTR_PLANS) >= 256:
            _GETATTR_PLANS.clear()
        _GETATTR_PLANS[key] = known
    return known


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


_RDATTR_ERROR_MASK: Final = bitmap_of([nfs4.FATTR4_RDATTR_ERROR])


def encode_rdattr_error(status: int) -> nfs4.fattr4:
    """A READDIR entry's attributes when they could not be read: rdattr_error alone."""
    return nfs4.fattr4(
        list(_RDATTR_ERROR_MASK), pack(nfs4.enc_fattr4_rdattr_error, nfs4.nfsstat4(status))
    )


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


_NS = 1_000_000_000
ID_MAX = 0xFFFFFFFE  # (uid_t)-1 means "unchanged" to chown(2): not a valid owner
ID_DIGITS = 10  # digits of the longest numeric owner (ID_MAX)
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
    values = decode_values(fattr)  # every settable attribute has its generated codec
    out = Settable(attrset=bitmap_of(numbers))
    for n in numbers:
        v = values[n]
        if n == nfs4.FATTR4_SIZE:
            if v > MAX_FILESIZE:  # beyond fattr4_maxfilesize (RFC 8881 18.30.3)
                raise Nfs4Error(nfs4.NFS4ERR_FBIG)
            out.size = v
        elif n == nfs4.FATTR4_MODE:
            if v & ~MODE_BITS:
                raise Nfs4Error(nfs4.NFS4ERR_INVAL)
            out.mode = v
        elif n == nfs4.FATTR4_OWNER:
            out.uid = parse_owner(v, group=False)
        elif n == nfs4.FATTR4_OWNER_GROUP:
            out.gid = parse_owner(v, group=True)
        elif n == nfs4.FATTR4_TIME_ACCESS_SET:
            out.atime = _time_set(v)
        else:
            out.mtime = _time_set(v)
    return out


def _time_set(v: nfs4.settime4) -> TimeSet:
    if v.set_it == nfs4.SET_TO_SERVER_TIME4:
        return SET_TO_SERVER_TIME
    t = v.value
    assert t is not None  # SET_TO_CLIENT_TIME4 carries the time
    if t.nseconds >= _NS:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    return t.seconds * _NS + t.nseconds


def parse_owner(text: bytes, *, group: bool) -> int:
    """An owner / owner_group string → uid / gid (NFS4ERR_INVAL, NFS4ERR_BADOWNER)."""
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL) from None
    if not s:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    if s.isascii() and s.isdigit():
        if len(s) > ID_DIGITS or int(s) > ID_MAX:
            raise Nfs4Error(nfs4.NFS4ERR_BADOWNER)
        return int(s)
    name = s.rpartition("@")[0] if "@" in s else s
    if not name or "\0" in name:
        raise Nfs4Error(nfs4.NFS4ERR_BADOWNER)
    found = owners.lookup(name, group=group)  # cached: NSS may block (nfs4/owners.py)
    if found is None:
        raise Nfs4Error(nfs4.NFS4ERR_BADOWNER)
    return found
