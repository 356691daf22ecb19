"""The client session's sans-IO core (RFC 8881 2.10.6, 15.1; SS-13, UL-25, UL-26): events in,
actions out. No event loop, no sleeps, no connection: the clock is a number."""

from __future__ import annotations

import pytest

from nfsrdma.session.client_core import (
    AfterBind,
    AfterCreateSession,
    Again,
    BackOff,
    CallMachine,
    Effect,
    Fail,
    Finish,
    KeepAction,
    NfsStatusError,
    Repair,
    RequestRepair,
    Send,
    SessionCore,
    WaitForSlot,
    after_bind_error,
    after_create_session_error,
    is_new_client,
)
from nfsrdma.session.requester_slots import RequesterSlots
from nfsrdma.xdr.gen import nfs4

NOOP = [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)]


def core(slots: int = 4, **kw: float) -> SessionCore:
    return SessionCore(RequesterSlots(slots), **kw)  # type: ignore[arg-type]


def reply(
    seq_status: nfs4.nfsstat4 = nfs4.NFS4_OK,
    status: nfs4.nfsstat4 = nfs4.NFS4_OK,
    *,
    highest: int = 3,
    target: int = 3,
    flags: int = 0,
) -> nfs4.COMPOUND4res:
    if seq_status != nfs4.NFS4_OK:
        seq = nfs4.SEQUENCE4res(seq_status)
        return nfs4.COMPOUND4res(seq_status, b"", [nfs4.nfs_resop4(nfs4.OP_SEQUENCE, seq)])
    ok = nfs4.SEQUENCE4resok(b"S" * 16, 1, 0, highest, target, flags)
    res = [
        nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4_OK, ok)),
        nfs4.nfs_resop4(nfs4.OP_PUTROOTFH, nfs4.PUTROOTFH4res(status)),
    ]
    return nfs4.COMPOUND4res(status, b"", res)


def send(call: CallMachine) -> Send:
    step = call.next_step()
    assert isinstance(step, Send)
    return step


def test_a_call_takes_the_lowest_slot_and_finishes_without_the_sequence_result() -> None:
    c = core()
    call = CallMachine(c)
    s = send(call)
    assert (s.slot.slotid, s.slot.seqid, s.resend, s.probe) == (0, 1, False, False)
    step = call.on_reply(reply(), now=5.0)
    assert isinstance(step, Finish) and [r.resop for r in step.res.resarray] == [nfs4.OP_PUTROOTFH]
    assert s.slot.seqid == 2 and c.last_renewal == 5.0
    call.close()
    assert c.slots.in_flight == 0


def test_a_lost_connection_resends_on_the_same_slot_and_seqid() -> None:
    """SS-13: the outcome is unknown, so the same slot and seqid go out again."""
    call = CallMachine(core())
    first = send(call)
    step = call.on_connection_lost()
    assert step == RequestRepair(Repair.RECONNECT)
    again = send(call)
    assert again.slot is first.slot and again.slot.seqid == 1 and again.resend


def test_a_reclaim_call_gives_up_to_let_the_repair_start_over() -> None:
    call = CallMachine(core(), reclaim=True)
    send(call)
    assert call.on_connection_lost() == RequestRepair(Repair.RECONNECT, give_up=True)


def test_delay_on_sequence_backs_off_longer_each_time_with_the_same_seqid() -> None:
    c = core(delay_deadline=1.0)
    call = CallMachine(c)
    delays = []
    now = 0.0
    for _ in range(4):
        s = send(call)
        assert s.slot.seqid == 1
        step = call.on_reply(reply(nfs4.NFS4ERR_DELAY), now)
        assert isinstance(step, BackOff)
        delays.append(step.delay)
        now += step.delay
    assert delays == sorted(delays) and delays[0] < delays[-1]
    send(call)
    step = call.on_reply(reply(nfs4.NFS4ERR_DELAY), now=10.0)  # past the deadline
    assert isinstance(step, Fail) and isinstance(step.error, TimeoutError)


def test_delay_from_an_operation_retries_on_a_fresh_seqid() -> None:
    c = core()
    call = CallMachine(c)
    first = send(call)
    step = call.on_reply(reply(status=nfs4.NFS4ERR_DELAY), now=0.0)
    assert isinstance(step, BackOff)
    assert c.slots.in_flight == 0  # the slot went back while we wait
    again = send(call)
    assert again.slot.seqid == 2 and not again.resend and again.slot is first.slot


def test_a_cancelled_call_abandons_its_slot_and_the_next_call_probes_it() -> None:
    """UL-25: a slot whose request's outcome is unknown is probed before reuse."""
    c = core(slots=1)
    call = CallMachine(c)
    s = send(call)
    call.close()  # cancelled with the request on the wire
    assert s.slot.needs_probe and c.slots.in_flight == 0
    nxt = CallMachine(c)
    probe = send(nxt)
    assert probe.probe and probe.slot is s.slot and probe.slot.seqid == 1
    assert c.slots.stats.probes == 1
    assert isinstance(nxt.on_reply(reply(), now=1.0), Again)
    real = send(nxt)
    assert not real.probe and real.slot.seqid == 2


def test_a_probe_delayed_is_sent_again_and_counted_once() -> None:
    c = core(slots=1)
    call = CallMachine(c)
    send(call)
    call.close()
    nxt = CallMachine(c)
    send(nxt)
    assert isinstance(nxt.on_reply(reply(nfs4.NFS4ERR_DELAY), now=0.0), BackOff)
    again = send(nxt)
    assert again.probe and again.resend and c.slots.stats.probes == 1


def test_a_probe_misordered_twice_gives_the_slot_up() -> None:
    c = core(slots=2)
    call = CallMachine(c)
    s = send(call)
    s.slot.seqid = 9
    call.close()
    nxt = CallMachine(c)
    send(nxt)
    assert isinstance(nxt.on_reply(reply(nfs4.NFS4ERR_SEQ_MISORDERED), 0.0), Again)
    probe = send(nxt)
    assert probe.probe and probe.slot.seqid == 1
    assert isinstance(nxt.on_reply(reply(nfs4.NFS4ERR_SEQ_MISORDERED), 0.0), Again)
    other = send(nxt)
    assert other.slot.slotid == 1 and s.slot.broken


def test_no_usable_slot_asks_for_a_new_session() -> None:
    c = core(slots=1)
    c.slots.slots[0].broken = True
    assert CallMachine(c).next_step() == RequestRepair(Repair.SESSION)


def test_a_full_table_waits_for_the_signal() -> None:
    c = core(slots=1)
    holder = CallMachine(c)
    send(holder)
    waiter = CallMachine(c)
    assert isinstance(waiter.next_step(), WaitForSlot)
    woken: list[bool] = []
    c.slots.add_waiter(lambda: woken.append(True))
    holder.on_reply(reply(), 0.0)
    holder.close()
    assert woken == [True]
    assert send(waiter).slot.seqid == 2


def test_sequence_errors_lead_to_repairs_or_failures() -> None:
    c = core()
    call = CallMachine(c)
    send(call)
    assert call.on_reply(reply(nfs4.NFS4ERR_BADSESSION), 0.0) == RequestRepair(Repair.SESSION)
    assert c.slots.in_flight == 0
    send(call)
    assert call.on_reply(reply(nfs4.NFS4ERR_STALE_CLIENTID), 0.0) == RequestRepair(Repair.CLIENT)
    send(call)
    step = call.on_reply(reply(nfs4.NFS4ERR_SERVERFAULT), 0.0)
    assert isinstance(step, Fail) and isinstance(step.error, NfsStatusError)
    assert step.error.status == nfs4.NFS4ERR_SERVERFAULT


def test_badslot_lowers_the_limit_and_takes_another_slot() -> None:
    c = core()
    a, b = CallMachine(c), CallMachine(c)
    send(a)
    sb = send(b)
    assert sb.slot.slotid == 1
    assert isinstance(b.on_reply(reply(nfs4.NFS4ERR_BADSLOT), 0.0), Again)
    assert c.slots.limit == 1


def test_a_reply_too_big_to_cache_is_asked_again_without_the_cache() -> None:
    call = CallMachine(core(), cachethis=True)
    assert send(call).cachethis
    assert isinstance(call.on_reply(reply(status=nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE), 0.0), Again)
    assert not send(call).cachethis


def test_malformed_replies_reconnect_then_fail() -> None:
    call = CallMachine(core())
    for _ in range(3):
        send(call)
        assert call.on_malformed("bad") == RequestRepair(Repair.RECONNECT, abort=True)
    send(call)
    step = call.on_malformed("bad")
    assert isinstance(step, Fail) and "malformed" in str(step.error)


def test_an_rdma_error_fails_the_call_and_leaves_the_slot_in_doubt() -> None:
    c = core(slots=1)
    call = CallMachine(c)
    s = send(call)
    step = call.on_transport_refused("RDMA_ERROR")
    assert isinstance(step, Fail)
    call.close()
    assert s.slot.needs_probe  # UL-25


def test_an_rpc_error_means_the_seqid_was_not_used() -> None:
    c = core(slots=1)
    call = CallMachine(c)
    s = send(call)
    assert isinstance(call.on_rpc_error("denied"), Fail)
    call.close()
    assert not s.slot.needs_probe and s.slot.seqid == 1


def test_status_flags_become_effects() -> None:
    c = core()
    c.want_backchannel = True
    call = CallMachine(c)
    send(call)
    flags = nfs4.SEQ4_STATUS_CB_PATH_DOWN | nfs4.SEQ4_STATUS_RESTART_RECLAIM_NEEDED
    call.on_reply(reply(flags=flags), 0.0)
    assert [e for e, _ in c.take_effects()] == [Effect.REBIND_BACKCHANNEL, Effect.RECLAIM]
    assert c.take_effects() == []


def test_repair_requests_are_ignored_once_the_generation_moved_on() -> None:
    c = core()
    assert c.want_repair(Repair.RECONNECT, seen_gen=0)
    gen = c.connected()
    assert not c.want_repair(Repair.RECONNECT, seen_gen=gen - 1)
    assert c.want_repair(Repair.SESSION, seen_gen=c.session_gen)
    assert c.take_need() is Repair.SESSION and c.need is Repair.NONE
    c.closing = True
    assert not c.want_repair(Repair.CLIENT, seen_gen=c.session_gen)


@pytest.mark.parametrize(
    ("status", "need", "delay"),
    [
        (nfs4.NFS4ERR_BADSESSION, Repair.SESSION, 0.0),
        (nfs4.NFS4ERR_STALE_CLIENTID, Repair.CLIENT, 0.0),
        (nfs4.NFS4ERR_SEQ_MISORDERED, Repair.CLIENT, 0.0),
        (nfs4.NFS4ERR_DELAY, Repair.RECONNECT, 0.05),
        (None, Repair.RECONNECT, 0.05),  # a connection that failed
        (nfs4.NFS4ERR_PERM, Repair.RECONNECT, None),
    ],
)
def test_after_a_failed_repair_step(status: int | None, need: Repair, delay: float | None) -> None:
    c = core()
    backoff = c.repair_backoff()
    assert c.after_repair_failure(Repair.RECONNECT, status, backoff, now=0.0) == delay
    assert c.need is need


def test_a_first_connection_that_fails_is_reported_at_once() -> None:
    c = core()
    got = c.after_repair_failure(Repair.CLIENT, None, c.repair_backoff(), 0.0, never_connected=True)
    assert got is None


def test_repairs_give_up_after_the_reconnect_deadline() -> None:
    c = core(reconnect_deadline=1.0)
    backoff = c.repair_backoff()
    assert c.after_repair_failure(Repair.RECONNECT, None, backoff, now=0.0) is not None
    assert c.after_repair_failure(Repair.RECONNECT, None, backoff, now=1.5) is None


def test_the_keeper() -> None:
    """UL-26: ping a call that waits long, reconnect one that waits too long, renew an idle
    lease at half its time."""
    c = core(lease_time=60.0)
    look = {"probe_interval": 10.0, "call_timeout": 120.0}
    assert c.keep(10.0, **look) is KeepAction.NOTHING
    assert c.keep(30.0, **look) is KeepAction.RENEW
    c.last_renewal = 30.0
    c.on_wire[1] = 31.0
    assert c.keep(35.0, **look) is KeepAction.NOTHING
    assert c.keep(45.0, **look) is KeepAction.PING
    c.last_ping = 45.0
    assert c.keep(50.0, **look) is KeepAction.NOTHING
    assert c.keep(152.0, **look) is KeepAction.RECONNECT
    assert c.keeper_interval(10.0) == 5.0


def test_establishing_decisions() -> None:
    assert after_bind_error(nfs4.NFS4ERR_NOTSUPP) is AfterBind.BOUND  # SP4_NONE (SS-12)
    assert after_bind_error(nfs4.NFS4ERR_BADSESSION) is AfterBind.NEW_SESSION
    assert after_bind_error(nfs4.NFS4ERR_PERM) is AfterBind.FAIL
    assert after_create_session_error(nfs4.NFS4ERR_STALE_CLIENTID) is AfterCreateSession.NEW_CLIENT
    assert after_create_session_error(nfs4.NFS4ERR_DELAY) is AfterCreateSession.BACK_OFF
    assert after_create_session_error(nfs4.NFS4ERR_INVAL) is AfterCreateSession.FAIL
    confirmed = nfs4.EXCHGID4_FLAG_CONFIRMED_R

    def eir(clientid: int, flags: int) -> nfs4.EXCHANGE_ID4resok:
        return nfs4.EXCHANGE_ID4resok(
            clientid,
            1,
            flags,
            nfs4.state_protect4_r(nfs4.SP4_NONE),
            nfs4.server_owner4(0, b"s"),
            b"scope",
            [],
        )

    assert is_new_client(eir(7, confirmed), None)
    assert not is_new_client(eir(7, confirmed), 7)
    assert is_new_client(eir(7, 0), 7)  # unconfirmed: our state there is gone
