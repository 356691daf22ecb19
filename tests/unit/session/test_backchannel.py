"""The server's back-channel slot table: CB_SEQUENCE arguments and sequence ids (20.9)."""

from __future__ import annotations

import asyncio

from nfsrdma.nfs4.callback import Callbacks
from nfsrdma.session.backchannel import BackchannelSlots
from nfsrdma.xdr.gen import nfs4

from .helpers import make_sessions

SID = bytes(range(16))


def test_first_cb_sequence_on_each_slot_carries_1() -> None:
    b = BackchannelSlots(SID, 2)
    a0 = b.acquire()
    a1 = b.acquire()
    assert a0 is not None and a1 is not None
    assert (a0.csa_slotid, a0.csa_sequenceid) == (0, 1)
    assert (a1.csa_slotid, a1.csa_sequenceid) == (1, 1)
    assert a1.csa_highest_slotid == 1 and a0.csa_sessionid == SID
    assert a0.csa_cachethis is False
    assert b.acquire() is None  # all busy: the caller waits
    assert b.outstanding == 2


def test_success_advances_and_failure_without_processing_does_not() -> None:
    b = BackchannelSlots(SID, 1)
    a = b.acquire()
    assert a is not None
    b.release(0, nfs4.NFS4_OK)
    a = b.acquire()
    assert a is not None and a.csa_sequenceid == 2
    b.release(0, None)  # no reply: same seqid again (a retry for the client)
    a = b.acquire()
    assert a is not None and a.csa_sequenceid == 2
    b.release(0, nfs4.NFS4ERR_DELAY)
    a = b.acquire()
    assert a is not None and a.csa_sequenceid == 2
    b.release(0, nfs4.NFS4ERR_RETRY_UNCACHED_REP)  # the client had seen it: consumed
    a = b.acquire()
    assert a is not None and a.csa_sequenceid == 3
    b.release(0, nfs4.NFS4ERR_SEQ_MISORDERED)  # out of step: start over at 1
    a = b.acquire()
    assert a is not None and a.csa_sequenceid == 1


def test_referring_calls_and_client_target() -> None:
    b = BackchannelSlots(SID, 4)
    ref = [nfs4.referring_call_list4(SID, [nfs4.referring_call4(7, 3)])]
    a = b.acquire(referring=ref)
    assert a is not None and a.csa_referring_call_lists == ref
    resok = nfs4.CB_SEQUENCE4resok(SID, 1, 0, 3, 0)
    b.release(0, nfs4.NFS4_OK, resok)  # the client wants slot 0 only
    assert b.acquire() is not None
    assert b.acquire() is None


def test_no_back_slots() -> None:
    b = BackchannelSlots(SID, 0)
    assert b.acquire() is None
    b.release(0, nfs4.NFS4_OK)  # ignored


async def test_a_callback_waiting_for_a_slot_goes_on_the_release() -> None:
    """The server's callback sender waits for the table's signal (no polling timer)."""
    b = BackchannelSlots(SID, 1)
    held = b.acquire()
    assert held is not None
    callbacks = Callbacks(make_sessions(), slot_wait=3600.0)
    waiting = asyncio.ensure_future(callbacks._slot(b))
    while b.table.waiting == 0:
        await asyncio.sleep(0)  # let it register (a yield, no timer)
    b.release(held.csa_slotid, nfs4.NFS4_OK)
    got = await waiting
    assert got is not None and (got.csa_slotid, got.csa_sequenceid) == (0, 2)


async def test_a_callback_gives_up_when_no_slot_frees_in_time() -> None:
    b = BackchannelSlots(SID, 1)
    assert b.acquire() is not None
    callbacks = Callbacks(make_sessions(), slot_wait=0.0)
    assert await callbacks._slot(b) is None
    assert b.table.waiting == 0
