"""The requester's slot table (client fore channel, server back channel; RFC 8881 2.10.6;
SS-6, SS-9, UL-24, UL-25), sans-IO."""

from __future__ import annotations

import asyncio

import pytest

from nfsrdma.session.requester_slots import RequesterSlots as SlotTable
from nfsrdma.session.slot_wait import slot_signal


def test_lowest_free_slot_first_and_seqids_start_at_1() -> None:
    t = SlotTable(4)
    a, b = t.acquire(), t.acquire()
    assert a is not None and b is not None
    assert (a.slotid, a.seqid, b.slotid) == (0, 1, 1)
    t.completed(a)
    t.release(a)
    c = t.acquire()
    assert c is a and c.seqid == 2
    assert t.highest_slotid() == 1
    assert t.stats.max_in_flight == 2


def test_full_table_hands_out_nothing() -> None:
    t = SlotTable(2)
    assert t.acquire() and t.acquire()
    assert t.acquire() is None
    assert t.in_flight == 2


def test_seqid_wraps_past_2_to_the_32() -> None:
    t = SlotTable(1)
    s = t.acquire()
    assert s is not None
    s.seqid = 0xFFFFFFFF
    t.completed(s)
    assert s.seqid == 0  # modulo 2^32, as the responder expects (RFC 8881 2.10.6.1)


def test_target_highest_slotid_limits_and_grows_back() -> None:
    """SS-9: the client honours sr_target_highest_slotid."""
    t = SlotTable(8)
    t.server_limits(highest_slotid=7, target_highest_slotid=1)
    assert t.limit == 2
    got = [t.acquire(), t.acquire(), t.acquire()]
    assert got[2] is None and {s.slotid for s in got if s} == {0, 1}
    t.server_limits(7, 7)
    assert t.limit == 8 and t.acquire() is not None


def test_server_highest_slotid_drop_resets_slots_above() -> None:
    t = SlotTable(4)
    slots = [t.acquire() for _ in range(4)]
    for s in slots:
        assert s is not None
        t.completed(s)
        t.release(s)
    t.server_limits(highest_slotid=1, target_highest_slotid=1)
    assert [s.seqid for s in t.slots] == [2, 2, 1, 1]


def test_recall_slot_lowers_the_limit() -> None:
    t = SlotTable(16)
    t.recall(3)
    assert t.limit == 4
    t.recall(100)
    assert t.limit == 16


def test_abandoned_slot_keeps_its_seqid_and_needs_a_probe() -> None:
    """UL-25: outcome unknown, so the seqid is not advanced; a probe must resync it."""
    t = SlotTable(2)
    s = t.acquire()
    assert s is not None
    t.abandon(s)
    assert not s.in_use and s.needs_probe and s.seqid == 1
    again = t.acquire()
    assert again is s
    t.completed(s)  # the probe's SEQUENCE result
    assert not s.needs_probe and s.seqid == 2


def test_misordered_retries_from_1_once_then_gives_the_slot_up() -> None:
    t = SlotTable(2)
    s = t.acquire()
    assert s is not None
    s.seqid = 7
    assert t.misordered(s) is True and s.seqid == 1
    assert t.misordered(s) is False and s.broken
    t.release(s)
    other = t.acquire()
    assert other is not None and other.slotid == 1
    assert t.usable == 1


def test_reset_detaches_held_slots() -> None:
    t = SlotTable(4)
    s = t.acquire()
    assert s is not None
    t.reset(2)
    assert not t.owns(s) and t.size == 2 and t.in_flight == 0
    t.release(s)  # harmless
    assert all(x.seqid == 1 for x in t.slots)


def test_a_table_without_slots_hands_out_none_and_a_new_session_needs_one() -> None:
    t = SlotTable(0)  # a back channel the client did not offer
    assert t.acquire() is None and t.usable == 0
    with pytest.raises(ValueError):
        t.reset(0)


# -- the free-slot signal (sans-IO: the table decides whom to wake) ---------------------------
def test_release_wakes_the_longest_waiting_requester_only() -> None:
    t = SlotTable(1)
    s = t.acquire()
    assert s is not None
    woken: list[str] = []
    t.add_waiter(lambda: woken.append("first"))
    t.add_waiter(lambda: woken.append("second"))
    t.release(s)
    assert woken == ["first"] and t.waiting == 1


def test_more_usable_slots_wake_every_waiter() -> None:
    t = SlotTable(4)
    t.recall(0)
    s = t.acquire()
    assert s is not None and t.acquire() is None
    woken: list[int] = []
    t.add_waiter(lambda: woken.append(1))
    t.add_waiter(lambda: woken.append(2))
    t.server_limits(highest_slotid=3, target_highest_slotid=3)  # the limit grows
    assert woken == [1, 2] and t.waiting == 0
    t.add_waiter(lambda: woken.append(3))
    t.reset(2)  # a new session
    assert woken == [1, 2, 3]


def test_a_waiter_that_left_is_not_woken() -> None:
    t = SlotTable(1)
    s = t.acquire()
    assert s is not None
    woken: list[str] = []

    def gone() -> None:
        woken.append("gone")

    t.add_waiter(gone)
    assert t.remove_waiter(gone) is True
    t.release(s)
    assert woken == [] and t.remove_waiter(gone) is False


async def test_slot_signal_returns_when_a_slot_is_released() -> None:
    """No polling: the waiter runs on the release itself."""
    t = SlotTable(1)
    s = t.acquire()
    assert s is not None
    waiter = asyncio.ensure_future(slot_signal(t))
    while t.waiting == 0:
        await asyncio.sleep(0)  # let the task register (a yield, no timer)
    assert not waiter.done()
    t.release(s)
    await waiter
    assert t.acquire() is s


async def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    t = SlotTable(1)
    s = t.acquire()
    assert s is not None
    first = asyncio.ensure_future(slot_signal(t))
    second = asyncio.ensure_future(slot_signal(t))
    while t.waiting < 2:
        await asyncio.sleep(0)
    t.release(s)  # wakes ``first`` ...
    first.cancel()  # ... which gives up before it runs: ``second`` must get the turn
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert t.waiting == 0
