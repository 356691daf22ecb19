"""The server's fore-channel slot table and reply cache (RFC 8881 2.10.6.1; SS-6, SS-7, SS-9)."""

from __future__ import annotations

import pytest

from nfsrdma.session.errors import SessionError
from nfsrdma.session.slots import Disposition, SlotTable
from nfsrdma.xdr.gen import nfs4

from .helpers import Reply


def status(table: SlotTable, slotid: int, seqid: int) -> int:
    with pytest.raises(SessionError) as e:
        table.classify(slotid, seqid)
    return e.value.status


def run(table: SlotTable, slotid: int, seqid: int, reply: Reply | None) -> None:
    slot, d = table.classify(slotid, seqid)
    assert d is Disposition.NEW
    table.begin(slot, seqid)
    table.complete(slot, seqid, reply)


def test_ss6_first_request_on_a_slot_is_seqid_1() -> None:
    t = SlotTable(4, 1000)
    slot, d = t.classify(0, 1)
    assert d is Disposition.NEW and slot.slotid == 0


def test_ss6_seqid_0_on_an_unused_slot_is_misordered() -> None:
    """18.36.4: the slot starts with a contrived reply of NFS4ERR_SEQ_MISORDERED for seqid 0."""
    t = SlotTable(4, 1000)
    assert status(t, 0, 0) == nfs4.NFS4ERR_SEQ_MISORDERED
    assert status(t, 0, 2) == nfs4.NFS4ERR_SEQ_MISORDERED


def test_ss6_badslot_beyond_the_table() -> None:
    t = SlotTable(4, 1000)
    assert status(t, 4, 1) == nfs4.NFS4ERR_BADSLOT
    assert status(t, 0xFFFFFFFF, 1) == nfs4.NFS4ERR_BADSLOT


def test_ss6_new_retry_and_misordered() -> None:
    t = SlotTable(2, 1000)
    run(t, 1, 1, Reply(100, "one"))
    slot, d = t.classify(1, 1)
    assert d is Disposition.REPLAY and slot.reply == Reply(100, "one")
    assert t.classify(1, 2)[1] is Disposition.NEW
    assert status(t, 1, 3) == nfs4.NFS4ERR_SEQ_MISORDERED
    assert status(t, 1, 0) == nfs4.NFS4ERR_SEQ_MISORDERED
    # Slots are independent.
    assert t.classify(0, 1)[1] is Disposition.NEW


def test_ss6_retry_while_executing_is_delay_and_new_is_misordered() -> None:
    t = SlotTable(1, 1000)
    slot, _ = t.classify(0, 1)
    t.begin(slot, 1)
    assert status(t, 0, 1) == nfs4.NFS4ERR_DELAY
    assert status(t, 0, 2) == nfs4.NFS4ERR_SEQ_MISORDERED
    t.complete(slot, 1, None)
    assert t.classify(0, 1)[1] is Disposition.UNCACHED_RETRY
    assert t.classify(0, 2)[1] is Disposition.NEW


def test_ss6_seqid_wraps_at_2_to_the_32() -> None:
    t = SlotTable(1, 1000)
    slot = t.slots[0]
    slot.seqid, slot.used = 0xFFFFFFFE, True
    run(t, 0, 0xFFFFFFFF, Reply(10))
    assert t.classify(0, 0xFFFFFFFF)[1] is Disposition.REPLAY
    run(t, 0, 0, Reply(20))  # wraps to 0
    assert t.classify(0, 0)[1] is Disposition.REPLAY
    assert t.classify(0, 1)[1] is Disposition.NEW
    assert status(t, 0, 0xFFFFFFFF) == nfs4.NFS4ERR_SEQ_MISORDERED


def test_ss7_reply_cache_bounded_by_slots_times_maxresponsesize_cached() -> None:
    t = SlotTable(3, 500)
    for slotid in range(3):
        run(t, slotid, 1, Reply(500))
    assert t.cached_bytes == 1500
    # A new request on a slot drops that slot's old reply before running.
    run(t, 0, 2, Reply(1))
    assert t.cached_bytes == 1001
    # A reply larger than ca_maxresponsesize_cached is not kept: the retry is uncached.
    run(t, 1, 2, Reply(501))
    assert t.cached_bytes == 501
    assert t.classify(1, 2)[1] is Disposition.UNCACHED_RETRY
    assert t.cached_bytes <= t.count * t.max_cached


def test_complete_of_a_stale_sequence_is_ignored() -> None:
    t = SlotTable(1, 100)
    slot, _ = t.classify(0, 1)
    t.begin(slot, 1)
    assert not t.complete(slot, 7, Reply(10))
    assert slot.busy
    assert t.complete(slot, 1, Reply(10))
    assert not t.complete(slot, 1, Reply(10))  # twice: nothing more
    assert t.cached_bytes == 10


def test_ss9_target_drops_replies_above_it_once_the_client_follows() -> None:
    t = SlotTable(8, 100)
    for slotid in range(8):
        run(t, slotid, 1, Reply(100))
    t.set_target(3)
    assert t.target_highest_slotid == 3 and t.highest_slotid == 7
    t.client_highest(7)  # the client still uses slot 7
    assert t.cached_bytes == 800
    t.client_highest(3)
    assert t.cached_bytes == 400
    # Sequence ids stay: a late retry above the target is answered uncached, not re-executed.
    assert t.classify(6, 1)[1] is Disposition.UNCACHED_RETRY
    assert t.classify(6, 2)[1] is Disposition.NEW
    t.set_target(100)
    assert t.target_highest_slotid == 7
