"""Byte-range lock arithmetic (RFC 8881 sections 9.2-9.5): pure functions over lists of ranges.

A range is ``[start, end)``; ``end == TO_EOF`` (2**64) stands for a lock whose length was
NFS4_UINT64_MAX ("to the end of the file", whatever its size becomes). The ranges of one lock
owner on one file are kept sorted, non-overlapping, and with adjacent ranges of the same type
merged, exactly like POSIX record locks: a new lock replaces the owner's own locks where they
overlap (upgrade, downgrade, split), and an unlock may cut a hole in the middle of a range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.xdr.gen import nfs4

NFS4_UINT64_MAX: Final = 0xFFFFFFFFFFFFFFFF
TO_EOF: Final = 1 << 64

READ: Final = int(nfs4.nfs_lock_type4.READ_LT)
WRITE: Final = int(nfs4.nfs_lock_type4.WRITE_LT)


def lock_kind(locktype: int) -> int:
    """READ_LT or WRITE_LT for any nfs_lock_type4 (the blocking variants are polled: our
    answer to a blocking request is the same as to a non-blocking one)."""
    if locktype in (nfs4.READ_LT, nfs4.READW_LT):
        return READ
    if locktype in (nfs4.WRITE_LT, nfs4.WRITEW_LT):
        return WRITE
    raise Nfs4Error(nfs4.NFS4ERR_INVAL)


def byte_range(offset: int, length: int) -> tuple[int, int]:
    """``(start, end)`` of LOCK/LOCKT/LOCKU arguments; NFS4ERR_INVAL for a zero length or a
    range that runs past 2**64 - 1 (RFC 8881 sections 18.10.3, 18.11.3, 18.12.3)."""
    if length == 0:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    if length == NFS4_UINT64_MAX:
        return offset, TO_EOF
    end = offset + length
    if end > TO_EOF:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    return offset, end


def wire_length(start: int, end: int) -> int:
    """The length4 describing ``[start, end)`` (NFS4_UINT64_MAX for a lock to the end)."""
    return NFS4_UINT64_MAX if end >= TO_EOF else end - start


@dataclass(frozen=True, slots=True)
class LockRange:
    start: int
    end: int
    kind: int  # READ or WRITE

    def overlaps(self, start: int, end: int) -> bool:
        return self.start < end and start < self.end

    def conflicts(self, start: int, end: int, kind: int) -> bool:
        """Whether a lock of ``kind`` on ``[start, end)`` by another owner is refused."""
        return self.overlaps(start, end) and (kind == WRITE or self.kind == WRITE)


def unlock(ranges: list[LockRange], start: int, end: int) -> list[LockRange]:
    """The owner's ranges with ``[start, end)`` removed (splitting where needed)."""
    out: list[LockRange] = []
    for r in ranges:
        if not r.overlaps(start, end):
            out.append(r)
            continue
        if r.start < start:
            out.append(LockRange(r.start, start, r.kind))
        if end < r.end:
            out.append(LockRange(end, r.end, r.kind))
    return out


def lock(ranges: list[LockRange], start: int, end: int, kind: int) -> list[LockRange]:
    """The owner's ranges after locking ``[start, end)`` as ``kind`` (POSIX replacement)."""
    out = unlock(ranges, start, end)
    out.append(LockRange(start, end, kind))
    return merge(out)


def merge(ranges: list[LockRange]) -> list[LockRange]:
    """Sorted, with touching ranges of the same kind joined."""
    out: list[LockRange] = []
    for r in sorted(ranges, key=lambda r: r.start):
        if out and out[-1].kind == r.kind and out[-1].end >= r.start:
            last = out[-1]
            out[-1] = LockRange(last.start, max(last.end, r.end), r.kind)
        else:
            out.append(r)
    return out
