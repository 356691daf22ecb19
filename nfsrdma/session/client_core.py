"""The NFSv4.1 client session's decisions, sans-IO (RFC 8881 sections 2.10.6, 2.10.13, 8.4,
15.1; UL-25, UL-26, SS-13).

The asyncio driver (``session/client.py``) owns the connections, the tasks and the clock. It
tells this core what happened (a reply, a lost connection, a failed repair step, the time) and
does what the core answers. Nothing here awaits, sleeps or touches a socket, so every decision
can be tested by feeding events and looking at the actions.

- ``SessionCore``: one client id and session's state: the fore channel's slot table, the
  connection and session generations, which repair is needed, the lease and the calls on the
  wire. ``want_repair`` says whether a repair must start, ``after_repair_failure`` what to do
  when a repair step failed, ``keep`` what the lease keeper does now, and ``sequence_done``
  applies a SEQUENCE result (its status flags become ``effects`` for the driver).
- ``CallMachine``: one COMPOUND's way through slot acquisition, probing an abandoned slot,
  sending and resending, back-off on NFS4ERR_DELAY and GRACE, and repair requests.
"""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass, field

from nfsrdma.session.client_recovery import (
    Action,
    Backoff,
    FlagAction,
    after_compound,
    after_sequence_error,
    after_status_flags,
)
from nfsrdma.session.requester_slots import RequesterSlot, RequesterSlots
from nfsrdma.xdr.gen import nfs4

MAX_MALFORMED = 3  # malformed replies to one call before it fails


def status_name(status: int) -> str:
    try:
        return nfs4.nfsstat4(status).name
    except ValueError:
        return str(status)


class NfsStatusError(OSError):
    """A session-level operation failed with an NFS status (EXCHANGE_ID, CREATE_SESSION...)."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(errno.EIO, f"{what}: {status_name(status)}")
        self.status = status


class Repair(enum.IntEnum):
    NONE = 0
    RECONNECT = 1  # a new connection, bound to the same session
    SESSION = 2  # a new session for the same client id
    CLIENT = 3  # a new client id (EXCHANGE_ID), a new session, reclaim


def repair_for(action: Action) -> Repair:
    """The repair a NEW_SESSION / NEW_CLIENT action calls for."""
    return Repair.CLIENT if action is Action.NEW_CLIENT else Repair.SESSION


# -- establishing and repairing ------------------------------------------------------------------


class AfterBind(enum.Enum):
    BOUND = "bound"  # the new connection carries the session
    NEW_SESSION = "new session"  # the session is gone: CREATE_SESSION
    FAIL = "fail"


def after_bind_error(status: int) -> AfterBind:
    """BIND_CONN_TO_SESSION on a new connection failed with ``status``."""
    if status in (nfs4.NFS4ERR_NOTSUPP, nfs4.NFS4ERR_OP_ILLEGAL):
        return AfterBind.BOUND  # SP4_NONE: the first SEQUENCE binds the connection (SS-12)
    if status in (nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION):
        return AfterBind.NEW_SESSION
    return AfterBind.FAIL


class AfterCreateSession(enum.Enum):
    NEW_CLIENT = "new client"  # the client id is gone: EXCHANGE_ID, then again
    BACK_OFF = "back off"  # NFS4ERR_DELAY: again after a delay
    FAIL = "fail"


def after_create_session_error(status: int) -> AfterCreateSession:
    if status in (nfs4.NFS4ERR_STALE_CLIENTID, nfs4.NFS4ERR_EXPIRED):
        return AfterCreateSession.NEW_CLIENT
    if status == nfs4.NFS4ERR_DELAY:
        return AfterCreateSession.BACK_OFF
    return AfterCreateSession.FAIL


def is_new_client(res: nfs4.EXCHANGE_ID4resok, clientid: int | None) -> bool:
    """Whether EXCHANGE_ID made us a client the server did not know as confirmed: an
    unconfirmed record is a new client as far as the server is concerned (whatever it held for
    us before, opens and locks, is gone, even if the id happens to be the same): reclaim."""
    return res.eir_clientid != clientid or not (res.eir_flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R)


# -- what one call does next ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send SEQUENCE (on ``slot``, with its current seqid) + the call's operations; or SEQUENCE
    alone when ``probe``. ``resend``: the same slot and seqid went out before (SS-13), or (for
    a probe) this probe did."""

    slot: RequesterSlot
    cachethis: bool
    resend: bool = False
    probe: bool = False


@dataclass(frozen=True, slots=True)
class WaitForSlot:
    """No slot is free: wait for the table's signal, then ask again."""


@dataclass(frozen=True, slots=True)
class Again:
    """Ask ``next_step`` again (after waiting until the session is ready)."""


@dataclass(frozen=True, slots=True)
class BackOff:
    """Wait ``delay`` seconds (a timer: NFS4ERR_DELAY or GRACE), then ask again."""

    delay: float


@dataclass(frozen=True, slots=True)
class RequestRepair:
    """Ask for a repair of at least ``level`` (of the connection the call went out on, for
    RECONNECT). ``abort``: drop that connection first. ``give_up``: the call is the repair's
    own (a reclaim): end it so the repair can start over."""

    level: Repair
    abort: bool = False
    give_up: bool = False


@dataclass(frozen=True, slots=True)
class Finish:
    res: nfs4.COMPOUND4res


@dataclass(frozen=True, slots=True)
class Fail:
    error: BaseException


Step = Send | WaitForSlot | Again | BackOff | RequestRepair | Finish | Fail
NextStep = Send | WaitForSlot | RequestRepair


class Effect(enum.Enum):
    """What a SEQUENCE result's status flags ask of the driver."""

    REBIND_BACKCHANNEL = "rebind back channel"
    RECLAIM = "reclaim"
    STATE_LOST = "state lost"


@dataclass(slots=True)
class SessionCore:
    """The session's state and the decisions that span calls."""

    slots: RequesterSlots
    delay_deadline: float = 60.0
    reconnect_deadline: float = 60.0
    lease_time: float = 90.0
    want_backchannel: bool = False
    need: Repair = Repair.NONE
    conn_gen: int = 0
    session_gen: int = 0
    closing: bool = False
    failed: bool = False
    last_renewal: float = 0.0
    last_ping: float = 0.0
    on_wire: dict[int, float] = field(default_factory=dict)  # call token -> when sent
    effects: list[tuple[Effect, int]] = field(default_factory=list)  # (effect, flags)

    # -- repair ------------------------------------------------------------------------------
    def want_repair(self, level: Repair, seen_gen: int) -> bool:
        """A repair of at least ``level`` is asked for; ``seen_gen`` is the connection
        (RECONNECT) or session (SESSION, CLIENT) generation the asker saw fail: when it has
        changed since, the repair has already happened. True when the driver must stop
        handing out calls and make sure a repair runs."""
        if self.closing or self.failed:
            return False
        current = self.conn_gen if level is Repair.RECONNECT else self.session_gen
        if seen_gen != current:
            return False
        self.need = max(self.need, level)
        return True

    def take_need(self) -> Repair:
        """The repair to do next (and none pending until a failure asks again)."""
        need, self.need = self.need, Repair.NONE
        return need

    def repair_backoff(self) -> Backoff:
        return Backoff(initial=0.05, cap=2.0, deadline=self.reconnect_deadline)

    def after_repair_failure(
        self,
        need: Repair,
        status: int | None,
        backoff: Backoff,
        now: float,
        *,
        never_connected: bool = False,
    ) -> float | None:
        """A repair step for ``need`` failed (``status``: its NFS status, if any). Returns how
        long to wait before trying again (0: at once), or None: give up."""
        self.need = max(self.need, need)
        if status in (nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION):
            self.need = max(self.need, Repair.SESSION)
            return 0.0
        if status in (
            nfs4.NFS4ERR_STALE_CLIENTID,
            nfs4.NFS4ERR_EXPIRED,
            nfs4.NFS4ERR_SEQ_MISORDERED,
        ):
            self.need = Repair.CLIENT
            return 0.0
        if status is not None and status not in (
            nfs4.NFS4ERR_DELAY,
            nfs4.NFS4ERR_GRACE,
            nfs4.NFS4ERR_RESOURCE,
        ):
            return None
        if never_connected:
            return None  # the very first connection failed: tell the caller now
        return backoff.next_delay(now)

    def connected(self) -> int:
        """A new connection replaced the old one: its generation."""
        self.conn_gen += 1
        return self.conn_gen

    def new_session(self, slots: int, now: float) -> None:
        """CREATE_SESSION succeeded: a fresh slot table (waiters look again)."""
        self.session_gen += 1
        self.slots.reset(slots)
        self.last_renewal = now

    # -- SEQUENCE results ------------------------------------------------------------------------
    def sequence_done(self, slot: RequesterSlot, ok: nfs4.SEQUENCE4resok, now: float) -> None:
        """A SEQUENCE succeeded on ``slot``: its seqid is used up, the server's slot limits
        apply, the lease is renewed; status flags become effects."""
        if self.slots.owns(slot):
            self.slots.completed(slot)
            self.slots.server_limits(ok.sr_highest_slotid, ok.sr_target_highest_slotid)
        self.last_renewal = now
        if ok.sr_status_flags:
            actions = after_status_flags(ok.sr_status_flags, want_backchannel=self.want_backchannel)
            for flag, effect in (
                (FlagAction.REBIND_BACKCHANNEL, Effect.REBIND_BACKCHANNEL),
                (FlagAction.RECLAIM, Effect.RECLAIM),
                (FlagAction.STATE_LOST, Effect.STATE_LOST),
            ):
                if flag in actions:
                    self.effects.append((effect, ok.sr_status_flags))

    def take_effects(self) -> list[tuple[Effect, int]]:
        effects, self.effects = self.effects, []
        return effects

    # -- the lease keeper --------------------------------------------------------------------------
    def keeper_interval(self, probe_interval: float) -> float:
        return max(0.05, min(self.lease_time / 4, probe_interval / 2))

    def keep(self, now: float, *, probe_interval: float, call_timeout: float) -> KeepAction:
        """One look by the lease keeper: a call unanswered for too long (ping; reconnect when
        it is older than ``call_timeout``), or an idle lease to renew (UL-26)."""
        oldest = min(self.on_wire.values(), default=None)
        if oldest is not None:
            age = now - oldest
            if age > call_timeout:
                return KeepAction.RECONNECT
            if age > probe_interval and now - self.last_ping > probe_interval:
                return KeepAction.PING
            return KeepAction.NOTHING
        if now - self.last_renewal >= self.lease_time / 2:
            return KeepAction.RENEW
        return KeepAction.NOTHING


class KeepAction(enum.Enum):
    NOTHING = "nothing"
    PING = "ping"  # NULL; reconnect when it is not answered in time
    RECONNECT = "reconnect"  # abort the connection and resend on a new one
    RENEW = "renew"  # SEQUENCE alone; reconnect when it is not answered in time


class CallMachine:
    """One COMPOUND from the first slot to its result. The driver loops: wait until the
    session is ready, ``next_step()``, do it, feed the outcome (``on_reply``,
    ``on_connection_lost``, ...), do what that answers; and ``close()`` at the end, however it
    ended (a cancelled call with its request on the wire abandons its slot: UL-25)."""

    def __init__(
        self,
        core: SessionCore,
        *,
        cachethis: bool = False,
        idempotent: bool = True,
        reclaim: bool = False,
    ) -> None:
        self.core = core
        self.slots = core.slots
        self.cachethis = cachethis
        self.idempotent = idempotent
        self.reclaim = reclaim
        self.slot: RequesterSlot | None = None
        self.in_doubt = False  # the request went out on ``slot`` and its outcome is unknown
        self.probing = False  # the last Send was a SEQUENCE-only probe
        self.malformed = 0
        self.backoff: Backoff | None = None
        # The reply did not fit what the estimate provided for (RDMA_ERROR ERR_CHUNK): every
        # later Send of this call offers a Reply chunk as large as the session allows (UL-7).
        self.full_reply = False

    # -- what next -----------------------------------------------------------------------------
    def next_step(self) -> NextStep:
        if self.slot is not None and not self.slots.owns(self.slot):
            self.slot, self.in_doubt = None, False  # a new session: the old slot is gone
        if self.slot is None:
            self.slot = self.slots.acquire()
            if self.slot is None:
                if self.slots.usable == 0:
                    return self._repair(Repair.SESSION)
                return WaitForSlot()
        if self.slot.needs_probe:
            # Bring an abandoned slot in step: SEQUENCE alone with its current seqid. A reply
            # (cached or fresh) means the server has now used that seqid (UL-25).
            again = self.probing
            if not again:
                self.slots.stats.probes += 1
            self.probing = True
            return Send(self.slot, False, resend=again, probe=True)
        self.probing = False
        resend = self.in_doubt
        self.in_doubt = True
        return Send(self.slot, self.cachethis, resend=resend)

    # -- outcomes --------------------------------------------------------------------------------
    def on_reply(self, res: nfs4.COMPOUND4res, now: float) -> Step:
        """A COMPOUND4res came back for the last Send."""
        slot = self.slot
        assert slot is not None
        self.in_doubt = False
        seq = res.resarray[0].value if res.resarray else None
        ok_shape = isinstance(seq, nfs4.SEQUENCE4res) and res.resarray[0].resop == (
            nfs4.OP_SEQUENCE
        )
        if self.probing:
            return self._probe_reply(slot, res, seq if ok_shape else None, now)
        if not ok_shape:
            return Fail(OSError(errno.EIO, "reply without a SEQUENCE result"))
        assert isinstance(seq, nfs4.SEQUENCE4res)
        if seq.sr_status != nfs4.NFS4_OK:
            return self._sequence_failed(slot, seq.sr_status, now)
        assert isinstance(seq.value, nfs4.SEQUENCE4resok)
        self.core.sequence_done(slot, seq.value, now)
        del res.resarray[0]
        action = after_compound(res.status, idempotent=self.idempotent, reclaim=self.reclaim)
        if action is Action.RETRY_UNCACHED and self.cachethis:
            # The server would not keep this reply: ask again without the cache (the
            # operation that did not fit was not run, RFC 8881 section 15.1.10.3).
            self.cachethis = False
            return Again()
        if action is Action.RETRY:
            self._release()
            return self._back_off(res.status, now)
        if action in (Action.NEW_SESSION, Action.NEW_CLIENT):
            return self._repair(repair_for(action))
        return Finish(res)

    def on_connection_lost(self) -> Step:
        """The connection died with the call on it. A call's outcome is unknown: the same slot
        and seqid go out again on the next connection (the server's reply cache answers if it
        ran, SS-13); a probe is simply sent again. From then on the call provides for the
        largest reply: a server may drop the connection when a reply does not fit what the
        call offered (knfsd does), where it should answer ERR_CHUNK (``on_transport_refused``)."""
        self.full_reply = True
        return self._repair(Repair.RECONNECT)

    def on_malformed(self, detail: str) -> Step:
        """The reply did not decode: reconnect (dropping this connection) to get it again."""
        if self.probing:
            return self._repair(Repair.RECONNECT)
        self.malformed += 1
        if self.malformed > MAX_MALFORMED:
            return Fail(OSError(errno.EIO, f"malformed replies from the server: {detail}"))
        return self._repair(Repair.RECONNECT, abort=True)

    def on_transport_refused(self, detail: str, *, reply_overrun: bool = False) -> Step:
        """RDMA_ERROR: the transaction ends here (UL-20); whether the server ran it is unknown,
        so the slot stays in doubt and is probed before reuse (UL-25). For a probe it is one
        more lost connection.

        ``reply_overrun``: an ERR_CHUNK to a call that offered less than the largest Reply
        chunk, so the reply may simply not have fitted (the size estimate was short). Once per
        call, the request goes again as a new transaction on the same slot and seqid with
        that largest Reply chunk (UL-7 with UL-25): a server that had not run it runs it now;
        one that had answers from its reply cache (sa_cachethis), or NFS4ERR_RETRY_UNCACHED_REP,
        after which an idempotent request is sent anew and any other fails (exactly once,
        RFC 8881 section 2.10.6.1)."""
        if self.probing:
            return self._repair(Repair.RECONNECT)
        if reply_overrun and not self.full_reply:
            self.full_reply = True  # in doubt: next_step resends the same slot and seqid
            return Again()
        return Fail(OSError(errno.EIO, f"the transport refused the call: {detail}"))

    def on_rpc_error(self, detail: str) -> Step:
        """Accepted-but-not-run or denied: the slot's seqid was not used."""
        self.in_doubt = False
        what = "slot probe failed" if self.probing else "RPC call failed"
        return Fail(OSError(errno.EIO, f"{what}: {detail}"))

    def close(self) -> None:
        """The call is over (result, error or cancellation): give the slot back; abandon it
        when its request's outcome is unknown."""
        slot, self.slot = self.slot, None
        if slot is None:
            return
        if self.in_doubt and self.slots.owns(slot):
            self.slots.abandon(slot)  # cancelled or failed mid-call (UL-25)
        else:
            self.slots.release(slot)

    # -- pieces ----------------------------------------------------------------------------------
    def _release(self) -> None:
        slot, self.slot = self.slot, None
        self.in_doubt = False
        if slot is not None:
            self.slots.release(slot)

    def _repair(self, level: Repair, *, abort: bool = False) -> RequestRepair:
        return RequestRepair(level, abort=abort, give_up=self.reclaim)

    def _back_off(self, status: int, now: float) -> BackOff | Fail:
        if self.backoff is None:
            self.backoff = Backoff(deadline=self.core.delay_deadline)
        delay = self.backoff.next_delay(now)
        if delay is None:
            return Fail(
                TimeoutError(
                    errno.ETIMEDOUT,
                    f"the server kept answering {status_name(status)} "
                    f"for {self.backoff.deadline} s",
                )
            )
        return BackOff(delay)

    def _sequence_failed(self, slot: RequesterSlot, status: int, now: float) -> Step:
        action = after_sequence_error(status)
        if action is Action.RETRY_SAME_SEQID:
            # The original may still be running on the slot: the same seqid after a delay.
            step = self._back_off(status, now)
            if isinstance(step, BackOff):
                self.in_doubt = True
            return step
        if action is Action.RESET_SLOT:
            if not self.slots.misordered(slot):
                self._release()
            return Again()
        if action is Action.PICK_OTHER_SLOT:
            if slot.slotid == 0:
                return Fail(NfsStatusError(status, "SEQUENCE"))
            self.slots.recall(slot.slotid - 1)
            self._release()
            return Again()
        if action in (Action.NEW_SESSION, Action.NEW_CLIENT):
            self._release()
            return self._repair(repair_for(action))
        return Fail(NfsStatusError(status, "SEQUENCE"))

    def _probe_reply(
        self, slot: RequesterSlot, res: nfs4.COMPOUND4res, seq: object, now: float
    ) -> Step:
        if isinstance(seq, nfs4.SEQUENCE4res) and seq.sr_status == nfs4.NFS4_OK:
            assert isinstance(seq.value, nfs4.SEQUENCE4resok)
            self.core.sequence_done(slot, seq.value, now)
            return Again()
        status = seq.sr_status if isinstance(seq, nfs4.SEQUENCE4res) else res.status
        if status == nfs4.NFS4ERR_DELAY:
            return self._back_off(status, now)
        if status == nfs4.NFS4ERR_SEQ_MISORDERED:
            # Nothing of ours is outstanding on the slot: start it again from 1, or give it up
            # (another slot, or a new session when none is left).
            if self.slots.misordered(slot):
                slot.needs_probe = True
            else:
                self._release()
            return Again()
        action = after_sequence_error(status)
        if action in (Action.NEW_SESSION, Action.NEW_CLIENT):
            return self._repair(repair_for(action))  # the slot is detached by the new session
        return Fail(NfsStatusError(status, "SEQUENCE probe"))
