"""fattr4 for the client: bitmaps, attribute values through the generated codecs, and the
``FileStat`` that ``stat`` returns (RFC 8881 section 5).

Each attribute's value is encoded and decoded by the generated ``enc_fattr4_<name>`` /
``dec_fattr4_<name>`` of its XDR typedef, so nothing here is encoded by hand.
"""

from __future__ import annotations

import stat as stat_mod
from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple

from nfsrdma.nfs4.attr_decode import NAMES, decode_values
from nfsrdma.nfs4.attrs import ID_DIGITS, ID_MAX, parse_owner
from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.nfs4_fattr import MASKS
from nfsrdma.xdr.runtime import Writer, XdrError

# The generated encoder of every attribute that has one, by attribute number (decoding goes
# through nfs4.attr_decode, which knows the same names).
ENCODERS: dict[int, Callable[[Writer, Any], None]] = {
    bit: enc
    for bit, name in NAMES.items()
    if (enc := getattr(nfs4, f"enc_fattr4_{name}", None)) is not None
}

# What ``stat`` and ``scandir`` ask for (the Linux client's GETATTR set less mounted_on_fileid:
# one list, in ``nfs4_fattr.MASKS``, from which the server's specialised encoders are generated).
STAT_ATTRS: tuple[int, ...] = tuple(
    getattr(nfs4, f"FATTR4_{name.upper()}") for name in MASKS["client_stat"]
)


def encode_bitmap(bits: Iterable[int]) -> list[int]:
    words: list[int] = []
    for bit in bits:
        i = bit // 32
        while len(words) <= i:
            words.append(0)
        words[i] |= 1 << (bit % 32)
    return words


def decode_bitmap(words: list[int]) -> list[int]:
    return [i * 32 + b for i, w in enumerate(words) for b in range(32) if w >> b & 1]


# The values of a fattr4, by attribute number (compiled per attribute mask, shared with the
# server side: ``nfsrdma.nfs4.attr_decode``). Raises XdrError on malformed values. The same
# function, not a wrapper: a call less per GETATTR reply.
decode_attrs: Final = decode_values


def encode_attrs(values: dict[int, Any]) -> nfs4.fattr4:
    """A fattr4 from values by attribute number (encoded in attribute order)."""
    w = Writer()
    for bit in sorted(values):
        encode = ENCODERS.get(bit)
        if encode is None:
            raise XdrError(f"attribute {bit} has no codec", len(w))
        encode(w, values[bit])
    return nfs4.fattr4(encode_bitmap(values), bytes(w))


# -- owners ------------------------------------------------------------------------------------
NOBODY = 65534


def owner_to_id(owner: bytes, group: bool = False) -> int:
    """An owner string as a number: "1000", or "name@domain" looked up locally (the server's
    parser, ``nfs4.attrs.parse_owner``); nobody when it names no local user or group."""
    try:
        return parse_owner(owner, group=group)
    except Nfs4Error:
        return NOBODY


def id_to_owner(n: int) -> bytes:
    """Numeric owner strings (RFC 8881 section 5.9: servers accept them with AUTH_SYS)."""
    return str(n).encode()


# -- stat ----------------------------------------------------------------------------------------
_IFMT: dict[int, int] = {  # by nfs_ftype4 (an IntEnum: plain ints find them)
    nfs4.NF4REG: stat_mod.S_IFREG,
    nfs4.NF4DIR: stat_mod.S_IFDIR,
    nfs4.NF4BLK: stat_mod.S_IFBLK,
    nfs4.NF4CHR: stat_mod.S_IFCHR,
    nfs4.NF4LNK: stat_mod.S_IFLNK,
    nfs4.NF4SOCK: stat_mod.S_IFSOCK,
    nfs4.NF4FIFO: stat_mod.S_IFIFO,
}


class FileStat(NamedTuple):
    """A file's attributes, named as ``os.stat_result`` names them (plus NFS extras); like
    ``os.stat_result``, an immutable tuple (made several times cheaper than a frozen
    dataclass: one per ``stat``)."""

    st_mode: int
    st_ino: int
    st_dev: int
    st_nlink: int
    st_uid: int
    st_gid: int
    st_size: int
    st_atime_ns: int
    st_mtime_ns: int
    st_ctime_ns: int
    st_blocks: int
    st_rdev: int
    type: int  # nfs_ftype4
    change: int
    owner: str
    group: str

    @property
    def st_atime(self) -> float:
        return self.st_atime_ns / 1e9

    @property
    def st_mtime(self) -> float:
        return self.st_mtime_ns / 1e9

    @property
    def st_ctime(self) -> float:
        return self.st_ctime_ns / 1e9

    def is_dir(self) -> bool:
        return self.type == nfs4.NF4DIR

    def is_file(self) -> bool:
        return self.type == nfs4.NF4REG

    def is_symlink(self) -> bool:
        return self.type == nfs4.NF4LNK

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": oct(self.st_mode),
            "type": nfs4.nfs_ftype4(self.type).name if self.type in _IFMT else self.type,
            "size": self.st_size,
            "ino": self.st_ino,
            "dev": self.st_dev,
            "nlink": self.st_nlink,
            "uid": self.st_uid,
            "gid": self.st_gid,
            "owner": self.owner,
            "group": self.group,
            "atime_ns": self.st_atime_ns,
            "mtime_ns": self.st_mtime_ns,
            "ctime_ns": self.st_ctime_ns,
            "blocks": self.st_blocks,
            "change": self.change,
        }


_TYPE: Final = int(nfs4.FATTR4_TYPE)
_MODE: Final = int(nfs4.FATTR4_MODE)
_FSID: Final = int(nfs4.FATTR4_FSID)
_RAWDEV: Final = int(nfs4.FATTR4_RAWDEV)
_OWNER: Final = int(nfs4.FATTR4_OWNER)
_OWNER_GROUP: Final = int(nfs4.FATTR4_OWNER_GROUP)
_FILEID: Final = int(nfs4.FATTR4_FILEID)
_NUMLINKS: Final = int(nfs4.FATTR4_NUMLINKS)
_SIZE: Final = int(nfs4.FATTR4_SIZE)
_TIME_ACCESS: Final = int(nfs4.FATTR4_TIME_ACCESS)
_TIME_MODIFY: Final = int(nfs4.FATTR4_TIME_MODIFY)
_TIME_METADATA: Final = int(nfs4.FATTR4_TIME_METADATA)
_SPACE_USED: Final = int(nfs4.FATTR4_SPACE_USED)
_CHANGE: Final = int(nfs4.FATTR4_CHANGE)
_NF4REG: Final = int(nfs4.NF4REG)
_new_stat = tuple.__new__  # FileStat's own __new__ checks nothing more for 16 values


def _owner_id(owner: bytes, group: bool) -> int:
    """``owner_to_id``, with numeric owners (what AUTH_SYS servers send) parsed here as
    ``parse_owner`` parses them, without decoding; nobody for an empty owner."""
    if owner.isdigit() and len(owner) <= ID_DIGITS:  # bytes.isdigit: ASCII digits only
        n = int(owner)
        return n if n <= ID_MAX else NOBODY
    return owner_to_id(owner, group) if owner else NOBODY


def file_stat(values: dict[int, Any]) -> FileStat:
    get = values.get
    ftype = int(get(_TYPE, _NF4REG))
    fsid = get(_FSID)
    rawdev = get(_RAWDEV)
    owner = bytes(get(_OWNER, b""))
    group = bytes(get(_OWNER_GROUP, b""))
    atime = get(_TIME_ACCESS)
    mtime = get(_TIME_MODIFY)
    ctime = get(_TIME_METADATA)
    return _new_stat(
        FileStat,
        (
            _IFMT.get(ftype, 0) | int(get(_MODE, 0)) & 0o7777,
            int(get(_FILEID, 0)),
            ((fsid.major & 0xFFFFFFFF) << 32 | (fsid.minor & 0xFFFFFFFF)) if fsid else 0,
            int(get(_NUMLINKS, 1)),
            _owner_id(owner, False),
            _owner_id(group, True),
            int(get(_SIZE, 0)),
            0 if atime is None else atime.seconds * 1_000_000_000 + atime.nseconds,
            0 if mtime is None else mtime.seconds * 1_000_000_000 + mtime.nseconds,
            0 if ctime is None else ctime.seconds * 1_000_000_000 + ctime.nseconds,
            (int(get(_SPACE_USED, 0)) + 511) // 512,
            (rawdev.specdata1 << 8 | rawdev.specdata2) if rawdev else 0,
            ftype,
            int(get(_CHANGE, 0)),
            owner.decode("utf-8", "replace"),
            group.decode("utf-8", "replace"),
        ),
    )


def settime(ns: int | None) -> nfs4.settime4:
    """A time to set: ``None`` means the server's clock."""
    if ns is None:
        return nfs4.settime4(nfs4.SET_TO_SERVER_TIME4)
    sec, nsec = divmod(ns, 1_000_000_000)
    return nfs4.settime4(nfs4.SET_TO_CLIENT_TIME4, nfs4.nfstime4(sec, nsec))
