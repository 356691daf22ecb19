"""The responder's slot table and reply cache (RFC 8881 section 2.10.6), sans-IO: the server's
fore channel and the client's back channel use this one table.

Each slot remembers the sequence id of the last request it accepted and, when the client asked
for it (sa_cachethis) and it fitted, that request's reply as encoded. A request is classified
against its slot (2.10.6.1, SS-6):

- seqid = cached + 1 (mod 2^32): a new request; the slot is busy until the COMPOUND finishes;
- seqid = cached: a retry, answered from the cache, or NFS4ERR_RETRY_UNCACHED_REP when the
  reply was not kept, or NFS4ERR_DELAY while the original is still executing;
- anything else, and a retry on a slot that never ran a request: NFS4ERR_SEQ_MISORDERED;
- a slot id beyond the table: NFS4ERR_BADSLOT.

The cache holds at most one reply per slot, each no larger than ca_maxresponsesize_cached, so it
is bounded by slots x ca_maxresponsesize_cached (SS-7). The table can be asked to shrink
(sr_target_highest_slotid, SS-9): the cached replies of slots above the target are dropped once
the client's sa_highest_slotid shows it no longer uses them; their sequence ids are kept, so a
late retry there is answered NFS4ERR_RETRY_UNCACHED_REP, never executed twice.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from nfsrdma.session.errors import SessionError
from nfsrdma.session.seqid import SEQID_MASK, next_seqid
from nfsrdma.xdr.gen import nfs4

__all__ = [
    "SEQID_MASK",
    "CachedReply",
    "Disposition",
    "ResponderSlot",
    "ResponderSlots",
    "Slot",
    "SlotTable",
]


class CachedReply(Protocol):
    """What the reply cache stores: an encoded COMPOUND4res (opaque here) and its size."""

    @property
    def size(self) -> int: ...


class Disposition(enum.Enum):
    NEW = "new"  # execute it
    REPLAY = "replay"  # send the cached reply
    UNCACHED_RETRY = "uncached retry"  # answer NFS4ERR_RETRY_UNCACHED_REP


ReplyT = TypeVar("ReplyT", bound=CachedReply)


@dataclass(slots=True, eq=False)
class ResponderSlot(Generic[ReplyT]):
    slotid: int
    seqid: int = 0  # the last request accepted on this slot (0: none yet)
    used: bool = False  # a request has been accepted on this slot
    busy: bool = False  # that request is still executing
    reply: ReplyT | None = None  # its reply, when cached


@dataclass(slots=True)
class ResponderSlots(Generic[ReplyT]):
    """Slots 0..count-1 of one session's channel as its responder sees them (count =
    ca_maxrequests of that channel)."""

    count: int
    max_cached: int  # ca_maxresponsesize_cached
    slots: list[ResponderSlot[ReplyT]] = field(default_factory=list)
    target_highest_slotid: int = -1  # -1: count - 1
    cached_bytes: int = 0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("a slot table needs at least one slot")
        self.slots = [ResponderSlot(i) for i in range(self.count)]
        if self.target_highest_slotid < 0:
            self.target_highest_slotid = self.count - 1

    @property
    def highest_slotid(self) -> int:
        """sr_highest_slotid: the highest slot id the server accepts."""
        return self.count - 1

    @property
    def busy(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    def classify(self, slotid: int, seqid: int) -> tuple[ResponderSlot[ReplyT], Disposition]:
        if not 0 <= slotid < self.count:
            raise SessionError(nfs4.NFS4ERR_BADSLOT, f"slot {slotid} of {self.count}")
        slot = self.slots[slotid]
        if seqid == slot.seqid:
            if slot.busy:
                raise SessionError(nfs4.NFS4ERR_DELAY, f"slot {slotid} seqid {seqid} executing")
            if not slot.used:
                raise SessionError(nfs4.NFS4ERR_SEQ_MISORDERED, f"slot {slotid} never used")
            return (
                slot,
                Disposition.REPLAY if slot.reply is not None else Disposition.UNCACHED_RETRY,
            )
        if seqid == next_seqid(slot.seqid) and not slot.busy:
            return slot, Disposition.NEW
        raise SessionError(
            nfs4.NFS4ERR_SEQ_MISORDERED, f"slot {slotid}: seqid {seqid} after {slot.seqid}"
        )

    def begin(self, slot: ResponderSlot[ReplyT], seqid: int) -> None:
        """A new request takes the slot: the previous reply is no longer needed."""
        self._drop(slot)
        slot.seqid = seqid
        slot.used = True
        slot.busy = True

    def complete(self, slot: ResponderSlot[ReplyT], seqid: int, reply: ReplyT | None) -> bool:
        """The request finished; keep its reply when given and small enough. Returns whether
        the reply is cached."""
        if not slot.busy or slot.seqid != seqid:
            return False
        slot.busy = False
        if reply is None or reply.size > self.max_cached:
            return False
        slot.reply = reply
        self.cached_bytes += reply.size
        return True

    def set_target(self, target_highest_slotid: int) -> None:
        """Ask the client to use slots 0..target only (sr_target_highest_slotid)."""
        self.target_highest_slotid = max(0, min(target_highest_slotid, self.count - 1))

    def client_highest(self, sa_highest_slotid: int) -> None:
        """The client's sa_highest_slotid: when it is at or below the target, the slots above
        the target are idle and their cached replies can go."""
        target = self.target_highest_slotid
        if target >= self.count - 1 or sa_highest_slotid > target:
            return
        for slot in self.slots[target + 1 :]:
            if not slot.busy:
                self._drop(slot)

    def resize(self, count: int) -> None:
        """Accept slots 0..count-1 from now on (sr_highest_slotid, RFC 8881 section 2.10.6.1).
        Slots given up lose their reply and sequence id, so one granted again starts afresh
        (seqid 1); a busy slot cannot be given up. The target follows the new highest slot."""
        if count < 1:
            raise ValueError("a slot table needs at least one slot")
        if any(slot.busy for slot in self.slots[count:]):
            raise ValueError("cannot give up a busy slot")
        for slot in self.slots[count:]:
            self._drop(slot)
        del self.slots[count:]
        self.slots.extend(ResponderSlot(i) for i in range(len(self.slots), count))
        self.count = count
        self.target_highest_slotid = count - 1

    def clear(self) -> None:
        for slot in self.slots:
            self._drop(slot)

    def _drop(self, slot: ResponderSlot[ReplyT]) -> None:
        if slot.reply is not None:
            self.cached_bytes -= slot.reply.size
            slot.reply = None


# The server's names for its fore channel (``session/server.py`` uses these).
Slot = ResponderSlot[CachedReply]
SlotTable = ResponderSlots[CachedReply]
