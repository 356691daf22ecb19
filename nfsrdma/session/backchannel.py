"""The server's back-channel slots (RFC 8881 sections 2.10.6 and 20.9), sans-IO.

The server is the requester on the back channel: each CB_COMPOUND it sends starts with
CB_SEQUENCE on a slot of a ``RequesterSlots`` table (the one the client uses for its fore
channel). ``acquire`` hands out the lowest free slot (within the client's target) with the
CB_SEQUENCE4args to send, or None when every slot is busy (the caller waits for the table's
signal, ``slot_wait.slot_signal``). ``release`` records the outcome:

- CB_SEQUENCE succeeded (or failed after the client accepted the sequence id, e.g.
  NFS4ERR_RETRY_UNCACHED_REP or NFS4ERR_SEQ_FALSE_RETRY): the slot's sequence id advances;
- NFS4ERR_SEQ_MISORDERED: the client and we disagree; start the slot over at 1 (once);
- NFS4ERR_DELAY, NFS4ERR_BADSLOT, NFS4ERR_BADSESSION and the like, or no reply at all: the
  sequence id stays, so the next call on the slot is a retry as far as the client can tell
  (we never set csa_cachethis, so the client then answers NFS4ERR_RETRY_UNCACHED_REP, which
  advances the slot and the caller sends again).

Every slot starts at sequence id 1 (section 18.36.3: the first CB_SEQUENCE on a slot carries 1).
"""

from __future__ import annotations

from collections.abc import Sequence

from nfsrdma.session.requester_slots import RequesterSlots
from nfsrdma.xdr.gen import nfs4

# Statuses with which the client did not process the CB_SEQUENCE: the seqid is not consumed.
_NOT_CONSUMED = frozenset(
    {
        nfs4.nfsstat4.NFS4ERR_DELAY,
        nfs4.nfsstat4.NFS4ERR_BADSLOT,
        nfs4.nfsstat4.NFS4ERR_BADSESSION,
        nfs4.nfsstat4.NFS4ERR_BADXDR,
        nfs4.nfsstat4.NFS4ERR_REQ_TOO_BIG,
        nfs4.nfsstat4.NFS4ERR_TOO_MANY_OPS,
        nfs4.nfsstat4.NFS4ERR_SEQUENCE_POS,
        nfs4.nfsstat4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION,
        nfs4.nfsstat4.NFS4ERR_SERVERFAULT,
        nfs4.nfsstat4.NFS4ERR_RESOURCE,
    }
)


class BackchannelSlots:
    """The back-channel slots of one session, as CB_SEQUENCE arguments and results."""

    def __init__(self, sessionid: bytes, count: int) -> None:
        self.sessionid = sessionid
        # slots we use: min(client's back ca_maxrequests, our back_slots)
        self.table = RequesterSlots(max(0, count))

    @property
    def count(self) -> int:
        return self.table.size

    @property
    def outstanding(self) -> int:
        """CB_COMPOUNDs sent and not yet released."""
        return self.table.in_flight

    @property
    def target_highest_slotid(self) -> int:
        return self.table.limit - 1

    def acquire(
        self,
        *,
        referring: Sequence[nfs4.referring_call_list4] = (),
    ) -> nfs4.CB_SEQUENCE4args | None:
        """Take a free slot: the CB_SEQUENCE4args to send, or None when none is free."""
        slot = self.table.acquire()
        if slot is None:
            return None
        return nfs4.CB_SEQUENCE4args(
            csa_sessionid=self.sessionid,
            csa_sequenceid=slot.seqid,
            csa_slotid=slot.slotid,
            csa_highest_slotid=self.table.highest_slotid(),
            csa_cachethis=False,
            csa_referring_call_lists=list(referring),
        )

    def release(
        self,
        slotid: int,
        status: int | None,
        resok: nfs4.CB_SEQUENCE4resok | None = None,
    ) -> None:
        """The call on ``slotid`` is over: ``status`` is the CB_SEQUENCE result's status (or
        the first failing operation's, when CB_SEQUENCE itself succeeded use NFS4_OK), None when
        no reply came. ``resok`` (when CB_SEQUENCE succeeded) updates the client's target."""
        if not 0 <= slotid < self.table.size:
            return
        slot = self.table.slots[slotid]
        if not slot.in_use:
            return
        try:
            if status is None or status in _NOT_CONSUMED:
                return
            if status == nfs4.NFS4ERR_SEQ_MISORDERED:
                if slot.seqid != 1:
                    self.table.misordered(slot)
                return
            self.table.completed(slot)
            if resok is not None:
                self.table.recall(min(resok.csr_target_highest_slotid, resok.csr_highest_slotid))
        finally:
            self.table.release(slot)
