"""The requester's slot table (RFC 8881 section 2.10.6), sans-IO: the client's fore channel and
the server's back channel use this one table.

Each slot carries the sequence id its next request will use: 1 on first use, one more (modulo
2^32) after every request the responder has seen through to a SEQUENCE (CB_SEQUENCE) result. A
request whose outcome is unknown (no reply: the connection dropped, the caller gave up) leaves the
slot's seqid where it was, so that the same request can be resent on the same slot with the same
seqid and the responder answers from its reply cache (exactly once, SS-13), or a SEQUENCE-only
probe with that seqid brings the slot back in step (UL-25).

The responder steers the table's size: its highest slot id is what it accepts now and its target
highest slot id what it wants the requester to use (SS-9); CB_RECALL_SLOT lowers the target. The
table never hands out a slot above ``limit``, which follows both and never exceeds ``size``.

Waiting for a slot is event-driven: a requester that found no free slot registers a wake-up
callback with ``add_waiter``; ``release`` calls the longest-waiting one, and anything that makes
more slots usable at once (a higher limit, a new session) calls them all. The callbacks are the
driver's (an asyncio future's ``set_result``, say); the table only decides whom to wake.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nfsrdma.session.seqid import next_seqid

Wake = Callable[[], None]


@dataclass(slots=True, eq=False)
class RequesterSlot:
    slotid: int
    seqid: int = 1  # what the next request on this slot carries
    in_use: bool = False
    needs_probe: bool = False  # the last request's outcome is unknown (cancelled / timed out)
    broken: bool = False  # the responder refused our seqid for good; do not use again


@dataclass(slots=True)
class SlotStats:
    acquired: int = 0
    max_in_flight: int = 0
    probes: int = 0
    resets: int = 0


@dataclass(slots=True)
class RequesterSlots:
    """Slots 0..size-1; hands out the lowest free usable slot below ``limit``. A table of size
    0 (a back channel the client did not offer) never hands out a slot."""

    size: int
    limit: int = 0  # usable slots are 0..limit-1 (0 means: all of ``size``)
    slots: list[RequesterSlot] = field(default_factory=list)
    stats: SlotStats = field(default_factory=SlotStats)
    _busy: set[int] = field(default_factory=set)  # ids of this table's slots in use
    _waiters: deque[Wake] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError("a negative slot count")
        if not self.slots:
            self.slots = [RequesterSlot(i) for i in range(self.size)]
        if self.limit <= 0 or self.limit > self.size:
            self.limit = self.size

    # -- handing out -----------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._busy)

    def acquire(self) -> RequesterSlot | None:
        """The lowest free slot the responder lets us use now, or None (wait for a release:
        ``add_waiter``)."""
        if len(self._busy) >= self.limit:
            return None
        for slot in self.slots[: self.limit]:
            if not slot.in_use and not slot.broken:
                slot.in_use = True
                self._busy.add(slot.slotid)
                self.stats.acquired += 1
                if len(self._busy) > self.stats.max_in_flight:
                    self.stats.max_in_flight = len(self._busy)
                return slot
        return None

    def highest_slotid(self) -> int:
        """sa_highest_slotid: the highest slot id with a request outstanding (or 0)."""
        return max(self._busy, default=0)

    @property
    def usable(self) -> int:
        return sum(1 for s in self.slots[: self.limit] if not s.broken)

    # -- waiting -------------------------------------------------------------------------------
    def add_waiter(self, wake: Wake) -> None:
        """Call ``wake`` (once) when a slot may have become free."""
        self._waiters.append(wake)

    def remove_waiter(self, wake: Wake) -> bool:
        """Forget a waiter that stopped waiting; False when it had already been woken."""
        try:
            self._waiters.remove(wake)
        except ValueError:
            return False
        return True

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def wake_one(self) -> None:
        """Wake the longest-waiting requester (a slot came free, or a woken waiter that gave
        up passes its turn on)."""
        if self._waiters:
            self._waiters.popleft()()

    def wake_all(self) -> None:
        """Wake every waiter: more than one slot may be usable (or the table is gone)."""
        waiters, self._waiters = self._waiters, deque()
        for wake in waiters:
            wake()

    # -- outcomes --------------------------------------------------------------------------
    def completed(self, slot: RequesterSlot) -> None:
        """The responder processed the request (SEQUENCE succeeded): the seqid is used up."""
        slot.seqid = next_seqid(slot.seqid)
        slot.needs_probe = False

    def release(self, slot: RequesterSlot) -> None:
        slot.in_use = False
        if self.owns(slot):
            self._busy.discard(slot.slotid)
        self.wake_one()

    def abandon(self, slot: RequesterSlot) -> None:
        """The request's outcome is unknown and it will not be resent: before this slot carries
        another request, a SEQUENCE-only probe with the same seqid must bring it in step."""
        slot.needs_probe = True
        self.release(slot)

    def misordered(self, slot: RequesterSlot) -> bool:
        """NFS4ERR_SEQ_MISORDERED: the responder's idea of the seqid differs. Try once from 1
        (it may have dropped the slot's state); after that the slot is given up.
        Returns True when the request should be retried on the same slot."""
        if slot.seqid != 1:
            slot.seqid = 1
            self.stats.resets += 1
            return True
        slot.broken = True
        return False

    # -- steering by the responder -----------------------------------------------------------
    def server_limits(self, highest_slotid: int, target_highest_slotid: int) -> None:
        """From a SEQUENCE result. Slots above the responder's highest slotid lose their state
        there, so they start again from seqid 1 when they come back."""
        new_limit = max(1, min(self.size, highest_slotid + 1, target_highest_slotid + 1))
        if highest_slotid + 1 < self.size:
            for slot in self.slots[highest_slotid + 1 :]:
                if not slot.in_use:
                    slot.seqid = 1
                    slot.needs_probe = False
                    slot.broken = False
        self._set_limit(new_limit)

    def recall(self, target_highest_slotid: int) -> None:
        """CB_RECALL_SLOT (or the responder's target): use no slot above the target."""
        self._set_limit(max(1, min(self.size, target_highest_slotid + 1)))

    def reset(self, size: int | None = None) -> None:
        """A new session: a fresh table, every slot at seqid 1. Slot objects handed out before
        are detached (their holders must acquire again; releasing them is harmless). Every
        waiter is woken to look again."""
        if size is not None:
            if size < 1:
                raise ValueError("a slot table needs at least one slot")
            self.size = size
        self.slots = [RequesterSlot(i) for i in range(self.size)]
        self._busy = set()
        self.limit = self.size
        self.wake_all()

    def owns(self, slot: RequesterSlot) -> bool:
        """Whether ``slot`` belongs to the current table (not detached by a reset)."""
        return slot.slotid < len(self.slots) and self.slots[slot.slotid] is slot

    def _set_limit(self, limit: int) -> None:
        limit = min(limit, self.size)
        grew = limit > self.limit
        self.limit = limit
        if grew:
            self.wake_all()
