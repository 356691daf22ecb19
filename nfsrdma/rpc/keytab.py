"""Which principals a keytab file holds keys for (MIT keytab format, version 0x502).

Used only to tell an operator, at server start, that the keytab has no key for the service
principal: MIT's GSS library acquires acceptor credentials lazily, so the first sign would
otherwise be a failed context creation with a client."""

from __future__ import annotations

import struct


class KeytabError(ValueError):
    pass


def principals(path: str) -> list[str]:
    """ "primary/instance@REALM" for each key entry, in file order (repeats for each key)."""
    with open(path.removeprefix("FILE:"), "rb") as f:
        data = f.read()
    if len(data) < 2 or data[0] != 5 or data[1] not in (1, 2):
        raise KeytabError("not a Kerberos keytab (version 0x501 or 0x502)")
    order = ">" if data[1] == 2 else "="
    out: list[str] = []
    off = 2
    while off + 4 <= len(data):
        (size,) = struct.unpack_from(order + "i", data, off)
        off += 4
        if size < 0:  # a hole left by a deleted entry
            off += -size
            continue
        if size == 0 or off + size > len(data):
            break
        out.append(_entry(data[off : off + size], order, data[1]))
        off += size
    return out


def _entry(e: bytes, order: str, minor: int) -> str:
    try:
        (count,) = struct.unpack_from(order + "H", e, 0)
        off = 2
        if minor == 1:
            count -= 1  # version 0x501 counted the realm
        realm, off = _counted(e, off, order)
        parts = []
        for _ in range(count):
            part, off = _counted(e, off, order)
            parts.append(part)
    except struct.error:
        raise KeytabError("truncated keytab entry") from None
    return "/".join(parts) + "@" + realm


def _counted(e: bytes, off: int, order: str) -> tuple[str, int]:
    (n,) = struct.unpack_from(order + "H", e, off)
    off += 2
    if off + n > len(e):
        raise struct.error("short")
    return e[off : off + n].decode("utf-8", "replace"), off + n
