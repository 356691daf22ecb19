"""The client's fore-channel slot table (RFC 8881 section 2.10.6), sans-IO.

Each slot carries the sequence id its next request will use: 1 on first use, one more after
every request the server has seen through to a SEQUENCE result. A request whose outcome is
unknown (no reply: the connection dropped, the caller gave up) leaves the slot's seqid where it
was, so that the same request can be resent on the same slot with the same seqid and the server
answers from its reply cache (exactly once, SS-13), or a SEQUENCE-only probe with that seqid
brings the slot back in step (UL-25).

The server steers the table's size: ``sr_highest_slotid`` is what it accepts now and
``sr_target_highest_slotid`` what it wants the client to use (SS-9); CB_RECALL_SLOT lowers the
target. The table never hands out a slot above ``limit``, which follows both and never exceeds the
negotiated ``ca_maxrequests``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEQID_MASK = 0xFFFFFFFF


@dataclass(slots=True)
class Slot:
    slotid: int
    seqid: int = 1  # what the next request on this slot carries
    in_use: bool = False
    needs_probe: bool = False  # the last request's outcome is unknown (cancelled / timed out)
    broken: bool = False  # the server refused our seqid for good; do not use again


@dataclass(slots=True)
class SlotStats:
    acquired: int = 0
    max_in_flight: int = 0
    probes: int = 0
    resets: int = 0


@dataclass(slots=True)
class SlotTable:
    """Slots 0..size-1; hands out the lowest free usable slot below ``limit``."""

    size: int
    limit: int = 0  # usable slots are 0..limit-1 (0 means: all of ``size``)
    slots: list[Slot] = field(default_factory=list)
    stats: SlotStats = field(default_factory=SlotStats)
    _busy: set[int] = field(default_factory=set)  # ids of this table's slots in use

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a slot table needs at least one slot")
        if not self.slots:
            self.slots = [Slot(i) for i in range(self.size)]
        if self.limit <= 0 or self.limit > self.size:
            self.limit = self.size

    # -- handing out -----------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._busy)

    def acquire(self) -> Slot | None:
        """The lowest free slot the server lets us use now, or None (wait for a release)."""
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

    # -- outcomes --------------------------------------------------------------------------
    def completed(self, slot: Slot) -> None:
        """The server processed the request (SEQUENCE succeeded): the seqid is used up."""
        slot.seqid = (slot.seqid + 1) & SEQID_MASK or 1
        slot.needs_probe = False

    def release(self, slot: Slot) -> None:
        slot.in_use = False
        if self.owns(slot):
            self._busy.discard(slot.slotid)

    def abandon(self, slot: Slot) -> None:
        """The request's outcome is unknown and it will not be resent: before this slot carries
        another request, a SEQUENCE-only probe with the same seqid must bring it in step."""
        slot.needs_probe = True
        self.release(slot)

    def misordered(self, slot: Slot) -> bool:
        """NFS4ERR_SEQ_MISORDERED: the server's idea of the seqid differs. Try once from 1
        (the server may have dropped the slot's state); after that the slot is given up.
        Returns True when the request should be retried on the same slot."""
        if slot.seqid != 1:
            slot.seqid = 1
            self.stats.resets += 1
            return True
        slot.broken = True
        return False

    # -- steering by the server --------------------------------------------------------------
    def server_limits(self, highest_slotid: int, target_highest_slotid: int) -> None:
        """From a SEQUENCE result. Slots above the server's highest slotid lose their state
        on the server, so they start again from seqid 1 when they come back."""
        new_limit = max(1, min(self.size, highest_slotid + 1, target_highest_slotid + 1))
        if highest_slotid + 1 < self.size:
            for slot in self.slots[highest_slotid + 1 :]:
                if not slot.in_use:
                    slot.seqid = 1
                    slot.needs_probe = False
                    slot.broken = False
        self.limit = new_limit

    def recall(self, target_highest_slotid: int) -> None:
        """CB_RECALL_SLOT: use no slot above the target from now on."""
        self.limit = max(1, min(self.size, target_highest_slotid + 1))

    def reset(self, size: int | None = None) -> None:
        """A new session: a fresh table, every slot at seqid 1. Slot objects handed out before
        are detached (their holders must acquire again; releasing them is harmless)."""
        if size is not None:
            if size < 1:
                raise ValueError("a slot table needs at least one slot")
            self.size = size
        self.slots = [Slot(i) for i in range(self.size)]
        self._busy = set()
        self.limit = self.size

    def owns(self, slot: Slot) -> bool:
        """Whether ``slot`` belongs to the current table (not detached by a reset)."""
        return slot.slotid < len(self.slots) and self.slots[slot.slotid] is slot
