"""Slot sequence ids (RFC 8881 section 2.10.6.1): unsigned 32-bit, advancing by one modulo 2^32
for each new request on a slot. Both slot tables (``slots`` and ``requester_slots``) use these."""

from __future__ import annotations

SEQID_MASK = 0xFFFFFFFF


def next_seqid(seqid: int) -> int:
    """The sequence id that follows ``seqid`` on the same slot (wrapping past 2^32 - 1 to 0)."""
    return (seqid + 1) & SEQID_MASK
