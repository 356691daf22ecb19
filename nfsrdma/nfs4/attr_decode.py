"""Compiled fattr4 decoders, one per attribute mask: the mirror of ``attr_encode``.

A client decodes the same few masks over and over (every GETATTR, every READDIR entry). For
each mask seen, a small function is generated that unpacks every run of fixed-size attribute
values with one precompiled ``struct.Struct`` and calls the generated codec only for the
variable-size ones (owner, filehandle, ACLs...). The values are exactly those the generated
``dec_fattr4_*`` functions give (a test checks it); the functions are cached by mask.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import BOOL, Reader, XdrError

# Fixed-size attributes: struct format and the expression building the value from t[i:...].
# "{0}", "{1}" stand for the tuple items of this attribute.
_FIXED: Final[dict[int, tuple[str, str]]] = {
    nfs4.FATTR4_TYPE: ("I", "_FTYPE[{0}]"),
    nfs4.FATTR4_FH_EXPIRE_TYPE: ("I", "{0}"),
    nfs4.FATTR4_CHANGE: ("Q", "{0}"),
    nfs4.FATTR4_SIZE: ("Q", "{0}"),
    nfs4.FATTR4_LINK_SUPPORT: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_SYMLINK_SUPPORT: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_NAMED_ATTR: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_FSID: ("QQ", "_fsid4({0}, {1})"),
    nfs4.FATTR4_UNIQUE_HANDLES: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_LEASE_TIME: ("I", "{0}"),
    nfs4.FATTR4_RDATTR_ERROR: ("i", "_STATUS[{0}]"),
    nfs4.FATTR4_ACLSUPPORT: ("I", "{0}"),
    nfs4.FATTR4_ARCHIVE: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_CANSETTIME: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_CASE_INSENSITIVE: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_CASE_PRESERVING: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_CHOWN_RESTRICTED: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_FILEID: ("Q", "{0}"),
    nfs4.FATTR4_FILES_AVAIL: ("Q", "{0}"),
    nfs4.FATTR4_FILES_FREE: ("Q", "{0}"),
    nfs4.FATTR4_FILES_TOTAL: ("Q", "{0}"),
    nfs4.FATTR4_HIDDEN: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_HOMOGENEOUS: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_MAXFILESIZE: ("Q", "{0}"),
    nfs4.FATTR4_MAXLINK: ("I", "{0}"),
    nfs4.FATTR4_MAXNAME: ("I", "{0}"),
    nfs4.FATTR4_MAXREAD: ("Q", "{0}"),
    nfs4.FATTR4_MAXWRITE: ("Q", "{0}"),
    nfs4.FATTR4_MODE: ("I", "{0}"),
    nfs4.FATTR4_NO_TRUNC: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_NUMLINKS: ("I", "{0}"),
    nfs4.FATTR4_QUOTA_AVAIL_HARD: ("Q", "{0}"),
    nfs4.FATTR4_QUOTA_AVAIL_SOFT: ("Q", "{0}"),
    nfs4.FATTR4_QUOTA_USED: ("Q", "{0}"),
    nfs4.FATTR4_RAWDEV: ("II", "_specdata4({0}, {1})"),
    nfs4.FATTR4_SPACE_AVAIL: ("Q", "{0}"),
    nfs4.FATTR4_SPACE_FREE: ("Q", "{0}"),
    nfs4.FATTR4_SPACE_TOTAL: ("Q", "{0}"),
    nfs4.FATTR4_SPACE_USED: ("Q", "{0}"),
    nfs4.FATTR4_SYSTEM: ("I", "_BOOL[{0}]"),
    nfs4.FATTR4_TIME_ACCESS: ("qI", "_nfstime4({0}, {1})"),
    nfs4.FATTR4_TIME_BACKUP: ("qI", "_nfstime4({0}, {1})"),
    nfs4.FATTR4_TIME_CREATE: ("qI", "_nfstime4({0}, {1})"),
    nfs4.FATTR4_TIME_DELTA: ("qI", "_nfstime4({0}, {1})"),
    nfs4.FATTR4_TIME_METADATA: ("qI", "_nfstime4({0}, {1})"),
    nfs4.FATTR4_TIME_MODIFY: ("qI", "_nfstime4({0}, {1})"),
    nfs4.FATTR4_MOUNTED_ON_FILEID: ("Q", "{0}"),
}
_ENV_BASE: Final[dict[str, Any]] = {
    "_BOOL": BOOL,
    "_FTYPE": nfs4._nfs_ftype4_MAP,
    "_STATUS": nfs4._nfsstat4_MAP,
    "_fsid4": nfs4.fsid4,
    "_specdata4": nfs4.specdata4,
    "_nfstime4": nfs4.nfstime4,
    "_XdrError": XdrError,
    "_Reader": Reader,
    "_struct_error": struct.error,
}


def _attribute_names() -> dict[int, str]:
    prefix = "FATTR4_"
    return {
        int(value): name[len(prefix) :].lower()
        for name, value in vars(nfs4).items()
        if name.startswith(prefix) and isinstance(value, int)
    }


NAMES: Final = _attribute_names()
Decoder = Callable[[bytes | memoryview], dict[int, Any]]


def mask_numbers(mask: Sequence[int]) -> list[int]:
    return [(i << 5) + b for i, word in enumerate(mask) for b in range(32) if word >> b & 1]


def _compile(key: tuple[int, ...]) -> Decoder:
    env = dict(_ENV_BASE)
    lines = [
        "def _decode(data):",
        "    r = _Reader(data)",
        "    off = 0",
        "    out = {}",
        "    try:",
    ]
    lines.append("        pass")
    fmt: list[str] = []
    builds: list[tuple[int, str, int]] = []  # (attr, template, tuple items)

    def flush() -> None:
        if not fmt:
            return
        s = struct.Struct(">" + "".join(fmt))
        name = f"_s{len(env)}"
        env[name] = s.unpack_from
        lines.append(f"        t = {name}(data, off)")
        lines.append(f"        off += {s.size}")
        i = 0
        for attr, template, items in builds:
            value = template.format(*[f"t[{i + k}]" for k in range(items)])
            lines.append(f"        out[{attr}] = {value}")
            i += items
        fmt.clear()
        builds.clear()

    for n in mask_numbers(key):
        if n in _FIXED:
            f, template = _FIXED[n]
            fmt.append(f)
            builds.append((n, template, len(f)))
            continue
        codec = getattr(nfs4, f"dec_fattr4_{NAMES.get(n, '?')}", None)
        if codec is None:
            # An attribute without a codec: its length is unknown, so nothing after it can be
            # found. Keep what came before (a server should not send what was not asked).
            flush()
            lines.append("        return out")
            break
        flush()
        env[f"_d{n}"] = codec
        lines.append(f"        out[{n}], off = _d{n}(r, off)")
    flush()
    lines += [
        "    except (_struct_error, KeyError, IndexError):",
        "        raise _XdrError('malformed attribute values', off) from None",
        "    if off != len(data):",
        "        raise _XdrError('%d bytes after the attribute values' % (len(data) - off), off)",
        "    return out",
    ]
    exec(compile("\n".join(lines) + "\n", f"<fattr4 decoder {key}>", "exec"), env)
    fn: Decoder = env["_decode"]
    return fn


_cache: dict[tuple[int, ...], Decoder] = {}


def decode_values(fattr: nfs4.fattr4) -> dict[int, Any]:
    """The attribute values of ``fattr`` by attribute number, up to the first attribute no
    codec knows. Raises XdrError when the values do not match the mask."""
    key = tuple(fattr.attrmask)
    fn = _cache.get(key)
    if fn is None:
        if len(_cache) >= 1024:
            _cache.clear()
        fn = _cache[key] = _compile(key)
    return fn(fattr.attr_vals)
