"""fattr4 decoders, one per attribute mask, over the codecs generated at build time: the mirror
of ``attr_encode``.

A client decodes the same few masks over and over (every GETATTR, every READDIR entry). The
masks clients see most have their own decoder, generated with the XDR codecs from the attribute
table (``nfsrdma/xdr/nfs4_fattr.py``): every run of fixed-size values unpacked with one
precompiled ``struct.Struct``, the generated codec called only for the variable-size ones
(owner, filehandle, ACLs...). A mask of the attributes the Linux client combines is decoded by
the generated decoders of its attribute groups (one call per group); any other mask gets a plan
over the per-attribute tables. The
values are exactly those the generated ``dec_fattr4_*`` functions give (a test checks it);
plans are cached by mask. Nothing is compiled at run time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Buffer, Reader, XdrError

NAMES: Final = nfs4.ATTRIBUTE_NAMES
Decoder = Callable[[Buffer], dict[int, Any]]

# One step of a generic plan: a run of fixed-size values (struct, then per attribute: number,
# first item, item count, builder or None for a plain integer); a variable-size value
# (number, generated decoder); or the end of what can be decoded.
_Fixed = tuple[struct.Struct, tuple[tuple[int, int, int, Callable[[Any], Any] | None], ...]]
_Variable = tuple[int, Callable[[Reader, int], tuple[Any, int]]]
_Step = tuple[_Fixed | None, _Variable | None]


def mask_numbers(mask: Sequence[int]) -> list[int]:
    return [(i << 5) + b for i, word in enumerate(mask) for b in range(32) if word >> b & 1]


def plan(key: Sequence[int], *, specialised: bool = True) -> Decoder:
    """The decoder of a mask: its generated one if it has one (and ``specialised``), else a
    plan over the per-attribute tables."""
    words = list(key)
    while words and not words[-1]:
        words.pop()
    generated = nfs4.ATTRIBUTE_MASK_DECODERS.get(tuple(words))
    if generated is not None and specialised:
        return generated
    numbers = mask_numbers(words)
    for group_of, groups in nfs4.ATTRIBUTE_DECODE_LAYERS if specialised else ():
        if all(n in group_of for n in numbers):
            subsets: dict[int, int] = {}
            for n in numbers:
                group, bit = group_of[n]
                subsets[group] = subsets.get(group, 0) | bit
            return partial(_decode_groups, tuple(groups[g][b] for g, b in sorted(subsets.items())))
    steps: list[_Step] = []
    fmt: list[str] = []
    builds: list[tuple[int, int, int, Callable[[Any], Any] | None]] = []
    items = 0

    def flush() -> None:
        nonlocal items
        if fmt:
            steps.append(((struct.Struct(">" + "".join(fmt)), tuple(builds)), None))
            fmt.clear()
            builds.clear()
            items = 0

    for n in numbers:
        fixed = nfs4.ATTRIBUTE_FIXED.get(n)
        if fixed is not None:
            f, builder = fixed
            count = len(struct.Struct(">" + f).unpack(bytes(struct.calcsize(">" + f))))
            fmt.append(f)
            builds.append((n, items, count, builder))
            items += count
            continue
        flush()
        dec = nfs4.ATTRIBUTE_DEC.get(n)
        if dec is None:
            # An attribute without a codec: its length is unknown, so nothing after it can be
            # found. Keep what came before (a server should not send what was not asked).
            steps.append((None, None))
            break
        steps.append((None, (n, dec)))
    flush()
    return partial(_decode, tuple(steps))


def _decode(steps: tuple[_Step, ...], data: Buffer) -> dict[int, Any]:
    r = Reader(data)
    buf = r.buf
    off = 0
    out: dict[int, Any] = {}
    try:
        for fixed, variable in steps:
            if fixed is not None:
                s, builds = fixed
                t = s.unpack_from(buf, off)
                off += s.size
                for n, i, count, builder in builds:
                    out[n] = t[i] if builder is None else builder(t[i : i + count])
            elif variable is not None:
                n, dec = variable
                out[n], off = dec(r, off)
            else:
                return out
    except (struct.error, KeyError, IndexError):
        raise XdrError("malformed attribute values", off) from None
    if off != len(buf):
        raise XdrError(f"{len(buf) - off} bytes after the attribute values", off)
    return out


_GroupDecoder = Callable[[Reader, Any, int, dict[int, Any]], int]


def _decode_groups(decoders: tuple[_GroupDecoder, ...], data: Buffer) -> dict[int, Any]:
    r = Reader(data)
    buf = r.buf
    off = 0
    out: dict[int, Any] = {}
    try:
        for decode in decoders:
            off = decode(r, buf, off, out)
    except (struct.error, KeyError, IndexError):
        raise XdrError("malformed attribute values", off) from None
    if off != len(buf):
        raise XdrError(f"{len(buf) - off} bytes after the attribute values", off)
    return out


_cache: dict[tuple[int, ...], Decoder] = {}


def decode_values(fattr: nfs4.fattr4) -> dict[int, Any]:
    """The attribute values of ``fattr`` by attribute number, up to the first attribute no
    codec knows. Raises XdrError when the values do not match the mask."""
    key = tuple(fattr.attrmask)
    fn = _cache.get(key)
    if fn is None:
        if len(_cache) >= 1024:
            _cache.clear()
        fn = _cache[key] = plan(key)
    return fn(fattr.attr_vals)
