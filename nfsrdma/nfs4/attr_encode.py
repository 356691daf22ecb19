"""fattr4 encoders, one per request bitmap, over the codecs generated at build time.

GETATTR is the hottest operation, and a client asks for the same few bitmaps over and over.
Those the Linux client sends most have their own encoder, generated with the XDR codecs from
the attribute table (``nfsrdma/xdr/nfs4_fattr.py``): every run of fixed-size values packed with
one precompiled ``struct.Struct``, the variable ones (filehandle, owner, owner_group) spliced in
between, constants baked into the format. Any other bitmap is coded by the generated encoders
of the attribute groups it touches (a few attributes each, every subset generated; the groups
of the first layer are those the Linux client combines). Nothing is
compiled at run time; plans are cached by the request bitmap (bounded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from nfsrdma.vfs.base import Attributes, FsStats
from nfsrdma.xdr.gen import nfs4


class FattrConfig(Protocol):
    """The server limits some attributes report (``ServerConfig`` has them)."""

    @property
    def lease_time(self) -> int: ...

    @property
    def max_io(self) -> int: ...


# Attributes with no value to read (write-only).
WRITE_ONLY: Final = frozenset({nfs4.FATTR4_TIME_ACCESS_SET, nfs4.FATTR4_TIME_MODIFY_SET})
# What the server can encode: a value source in the attribute table.
ENCODABLE: Final = frozenset(nfs4.SERVER_ATTRIBUTE_LAYERS[-1][0])
_FS_ATTRS: Final = nfs4.SERVER_ATTRIBUTE_FS
_fattr4: Final = nfs4.fattr4

Encoder = Callable[[Attributes, FsStats | None, bytes, FattrConfig, int], bytes]


@dataclass(frozen=True, slots=True)
class Plan:
    mask: list[int]  # the bitmap of what is returned (never mutated; callers get copies)
    fn: Encoder
    needs_fs: bool

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
    """One plan per request bitmap: the generated encoder of its mask, or a generic one."""

    def __init__(self, supported: frozenset[int], *, capacity: int = 1024) -> None:
        unknown = supported - ENCODABLE - WRITE_ONLY
        if unknown:
            raise ValueError(f"no encoder for attributes {sorted(unknown)}")
        self.supported = supported
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
        # Plan.encode's work, inline: a call less per fattr4.
        if fsstats is None and plan.needs_fs:
            raise ValueError("these attributes need file-system statistics")
        return _fattr4(plan.mask.copy(), plan.fn(attributes, fsstats, fh, config, rdattr_error))

    def _compile(self, key: tuple[int, ...], specialised: bool = True) -> Plan:
        numbers = [
            (i << 5) + b
            for i, word in enumerate(key)
            for b in range(32)
            if word >> b & 1 and (i << 5) + b in self.supported and (i << 5) + b not in WRITE_ONLY
        ]
        mask: list[int] = []
        for n in numbers:
            i = n >> 5
            if i >= len(mask):
                mask.extend([0] * (i + 1 - len(mask)))
            mask[i] |= 1 << (n & 31)
        fn: Encoder | None = nfs4.ATTRIBUTE_MASK_ENCODERS.get(tuple(mask)) if specialised else None
        if fn is None:
            fn = _generic(numbers)
        return Plan(mask, fn, any(n in _FS_ATTRS for n in numbers))


_LAYERS: Final = nfs4.SERVER_ATTRIBUTE_LAYERS


def _generic(numbers: list[int]) -> Encoder:
    """The encoder of any mask: the generated encoder of each attribute group it touches, in
    the first layer of groups that holds all its attributes."""
    group_of, groups = next(layer for layer in _LAYERS if all(n in layer[0] for n in numbers))
    subsets: dict[int, int] = {}
    for n in numbers:
        group, bit = group_of[n]
        subsets[group] = subsets.get(group, 0) | bit
    encoders = [groups[g][bits] for g, bits in sorted(subsets.items())]
    if not encoders:
        return _nothing
    if len(encoders) == 1:
        return encoders[0]
    if len(encoders) == 2:
        first, second = encoders

        def encode2(
            a: Attributes, fs: FsStats | None, fh: bytes, cfg: FattrConfig, err: int
        ) -> bytes:
            return first(a, fs, fh, cfg, err) + second(a, fs, fh, cfg, err)

        return encode2
    if len(encoders) == 3:
        first, second, third = encoders

        def encode3(
            a: Attributes, fs: FsStats | None, fh: bytes, cfg: FattrConfig, err: int
        ) -> bytes:
            return (
                first(a, fs, fh, cfg, err)
                + second(a, fs, fh, cfg, err)
                + third(a, fs, fh, cfg, err)
            )

        return encode3

    def encode(a: Attributes, fs: FsStats | None, fh: bytes, cfg: FattrConfig, err: int) -> bytes:
        return b"".join([e(a, fs, fh, cfg, err) for e in encoders])

    return encode


def _nothing(a: Attributes, fs: FsStats | None, fh: bytes, cfg: FattrConfig, err: int) -> bytes:
    return b""
