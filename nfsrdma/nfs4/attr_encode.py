"""Compiled fattr4 encoders, one per request bitmap.

GETATTR is the hottest operation, and a client asks for the same few bitmaps over and over. For
each bitmap seen, a small function is generated that packs every run of fixed-size attribute
values with one precompiled ``struct.Struct`` and splices the variable ones (filehandle, owner,
owner_group) in between; constants (supported_attrs, booleans, fh_expire_type...) are baked
into the format. The functions are cached by the request bitmap (bounded).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Protocol

from nfsrdma.vfs.base import Attributes, FsStats
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import PAD, U32


class FattrConfig(Protocol):
    """The server limits some attributes report (``ServerConfig`` has them)."""

    @property
    def lease_time(self) -> int: ...

    @property
    def max_io(self) -> int: ...


MAX_FILESIZE: Final = (1 << 63) - 1
_U32_MAX: Final = 0xFFFFFFFF
_NS: Final = 1_000_000_000

# Fixed-size attributes: struct format and the Python expression(s) giving the values, in
# terms of a (Attributes), fs (FsStats), cfg (FattrConfig) and err (rdattr_error).
_FIXED: Final[dict[int, tuple[str, str]]] = {
    nfs4.FATTR4_TYPE: ("I", "a.type"),
    nfs4.FATTR4_FH_EXPIRE_TYPE: ("I", str(nfs4.FH4_PERSISTENT)),
    nfs4.FATTR4_CHANGE: ("Q", "a.change"),
    nfs4.FATTR4_SIZE: ("Q", "a.size"),
    nfs4.FATTR4_LINK_SUPPORT: ("I", "1"),
    nfs4.FATTR4_SYMLINK_SUPPORT: ("I", "1"),
    nfs4.FATTR4_NAMED_ATTR: ("I", "0"),
    nfs4.FATTR4_FSID: ("QQ", "*a.fsid"),
    nfs4.FATTR4_UNIQUE_HANDLES: ("I", "1"),
    nfs4.FATTR4_LEASE_TIME: ("I", "cfg.lease_time"),
    nfs4.FATTR4_RDATTR_ERROR: ("I", "err"),
    nfs4.FATTR4_ACLSUPPORT: ("I", "0"),
    nfs4.FATTR4_CANSETTIME: ("I", "1"),
    nfs4.FATTR4_CASE_INSENSITIVE: ("I", "0"),
    nfs4.FATTR4_CASE_PRESERVING: ("I", "1"),
    nfs4.FATTR4_CHOWN_RESTRICTED: ("I", "1"),
    nfs4.FATTR4_FILEID: ("Q", "a.fileid"),
    nfs4.FATTR4_FILES_AVAIL: ("Q", "fs.files_avail"),
    nfs4.FATTR4_FILES_FREE: ("Q", "fs.files_free"),
    nfs4.FATTR4_FILES_TOTAL: ("Q", "fs.files_total"),
    nfs4.FATTR4_HOMOGENEOUS: ("I", "1"),
    nfs4.FATTR4_MAXFILESIZE: ("Q", str(MAX_FILESIZE)),
    nfs4.FATTR4_MAXLINK: ("I", f"min(fs.max_link, {_U32_MAX})"),
    nfs4.FATTR4_MAXNAME: ("I", f"min(fs.max_name, {_U32_MAX})"),
    nfs4.FATTR4_MAXREAD: ("Q", "cfg.max_io"),
    nfs4.FATTR4_MAXWRITE: ("Q", "cfg.max_io"),
    nfs4.FATTR4_MODE: ("I", "a.mode"),
    nfs4.FATTR4_NO_TRUNC: ("I", "1"),
    nfs4.FATTR4_NUMLINKS: ("I", "a.nlink"),  # i_nlink is 32 bits in Linux
    nfs4.FATTR4_RAWDEV: ("II", "*a.rdev"),
    nfs4.FATTR4_SPACE_AVAIL: ("Q", "fs.bytes_avail"),
    nfs4.FATTR4_SPACE_FREE: ("Q", "fs.bytes_free"),
    nfs4.FATTR4_SPACE_TOTAL: ("Q", "fs.bytes_total"),
    nfs4.FATTR4_SPACE_USED: ("Q", "a.space_used"),
    nfs4.FATTR4_TIME_ACCESS: ("qI", f"*divmod(a.atime_ns, {_NS})"),
    nfs4.FATTR4_TIME_DELTA: ("qI", "0, 1"),
    nfs4.FATTR4_TIME_METADATA: ("qI", f"*divmod(a.ctime_ns, {_NS})"),
    nfs4.FATTR4_TIME_MODIFY: ("qI", f"*divmod(a.mtime_ns, {_NS})"),
    nfs4.FATTR4_MOUNTED_ON_FILEID: ("Q", "a.mounted_on_fileid"),
}
# Variable-size attributes: an expression giving their encoded bytes.
_VARIABLE: Final[dict[int, str]] = {
    nfs4.FATTR4_FILEHANDLE: "_opaque(fh)",
    nfs4.FATTR4_OWNER: "_owner(a.uid)",
    nfs4.FATTR4_OWNER_GROUP: "_owner(a.gid)",
}
# Constant bitmaps (supported_attrs, suppattr_exclcreat): given to the cache.
_CONSTANT_BITMAPS: Final = (nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_SUPPATTR_EXCLCREAT)
_USES_FS: Final = frozenset(n for n, (_, expr) in _FIXED.items() if "fs." in expr)
# Attributes with no value to read (write-only).
WRITE_ONLY: Final = frozenset({nfs4.FATTR4_TIME_ACCESS_SET, nfs4.FATTR4_TIME_MODIFY_SET})


def _opaque(data: bytes) -> bytes:
    n = len(data)
    return U32.pack(n) + data + PAD[n & 3]


@lru_cache(maxsize=4096)
def _owner(ident: int) -> bytes:
    return _opaque(str(ident).encode("ascii"))


def _bitmap_bytes(bitmap: Sequence[int]) -> bytes:
    return U32.pack(len(bitmap)) + b"".join(U32.pack(w) for w in bitmap)


Encoder = Callable[[Attributes, FsStats | None, bytes, FattrConfig, int], bytes]


@dataclass(frozen=True, slots=True)
class Plan:
    mask: list[int]  # the bitmap of what is returned (never mutated; callers get copies)
    fn: Encoder
    needs_fs: bool
    source: str  # the generated code, for debugging

    def encode(
        self,
        attributes: Attributes,
        fsstats: FsStats | None,
        fh: bytes,
        config: FattrConfig,
        rdattr_error: int = 0,
    ) -> nfs4.fattr4:
        if self.needs_fs and fsstats is None:
            raise ValueError("these attributes need file-system statistics")
        return nfs4.fattr4(self.mask.copy(), self.fn(attributes, fsstats, fh, config, rdattr_error))


class EncoderCache:
    """Compiles and caches one encoder per request bitmap."""

    def __init__(
        self,
        supported: frozenset[int],
        *,
        supported_attrs: Sequence[int],
        suppattr_exclcreat: Sequence[int],
        capacity: int = 1024,
    ) -> None:
        unknown = supported - set(_FIXED) - set(_VARIABLE) - set(_CONSTANT_BITMAPS) - WRITE_ONLY
        if unknown:
            raise ValueError(f"no encoder for attributes {sorted(unknown)}")
        self.supported = supported
        self._constants = {
            nfs4.FATTR4_SUPPORTED_ATTRS: _bitmap_bytes(supported_attrs),
            nfs4.FATTR4_SUPPATTR_EXCLCREAT: _bitmap_bytes(suppattr_exclcreat),
        }
        self._plans: dict[tuple[int, ...], Plan] = {}
        self._capacity = capacity
        self._words = max(supported) // 32 + 1  # words beyond these never matter

    def plan(self, bitmap: Sequence[int]) -> Plan:
        key = tuple(bitmap[: self._words])
        plan = self._plans.get(key)
        if plan is None:
            plan = self._compile(key)
            if len(self._plans) >= self._capacity:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def encode(
        self,
        bitmap: Sequence[int],
        attributes: Attributes,
        fsstats: FsStats | None,
        fh: bytes,
        config: FattrConfig,
        rdattr_error: int,
    ) -> nfs4.fattr4:
        plan = self._plans.get(tuple(bitmap))
        if plan is None:
            plan = self.plan(bitmap)
        return plan.encode(attributes, fsstats, fh, config, rdattr_error)

    def _compile(self, key: tuple[int, ...]) -> Plan:
        numbers = [
            (i << 5) + b
            for i, word in enumerate(key)
            for b in range(32)
            if word >> b & 1 and (i << 5) + b in self.supported and (i << 5) + b not in WRITE_ONLY
        ]
        env: dict[str, Any] = {"_opaque": _opaque, "_owner": _owner}
        pieces: list[str] = []
        fmt: list[str] = []
        args: list[str] = []

        def flush() -> None:
            if fmt:
                name = f"_p{len(pieces)}"
                env[name] = struct.Struct(">" + "".join(fmt)).pack
                pieces.append(f"{name}({', '.join(args)})")
                fmt.clear()
                args.clear()

        for n in numbers:
            if n in self._constants:
                const = self._constants[n]
                fmt.append(f"{len(const)}s")
                args.append(f"_c{n}")
                env[f"_c{n}"] = const
            elif n in _FIXED:
                f, expr = _FIXED[n]
                fmt.append(f)
                args.append(expr)
            else:
                flush()
                pieces.append(_VARIABLE[n])
        flush()
        body = " + ".join(pieces) if pieces else "b''"
        source = f"def _encode(a, fs, fh, cfg, err):\n    return {body}\n"
        exec(compile(source, f"<fattr4 encoder {key}>", "exec"), env)
        mask: list[int] = []
        for n in numbers:
            i = n >> 5
            if i >= len(mask):
                mask.extend([0] * (i + 1 - len(mask)))
            mask[i] |= 1 << (n & 31)
        return Plan(mask, env["_encode"], any(n in _USES_FS for n in numbers), source)
