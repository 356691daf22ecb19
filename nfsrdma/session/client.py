"""The NFSv4.1 client session: the asyncio driver around the sans-IO pieces.

- ``client_setup``: EXCHANGE_ID / CREATE_SESSION / BIND_CONN_TO_SESSION arguments and results.
- ``client_slots``: the slot table (seqids, target_highest_slotid, probes).
- ``client_recovery``: what each outcome calls for (retry, back-off, new session, reclaim).
- ``client_backchannel``: CB_COMPOUND processing on the client's own connection.

``ClientSession.compound(ops)`` puts SEQUENCE in front of ``ops`` on a free slot and returns the
COMPOUND4res without it. Underneath it keeps many calls in flight (one per slot), resends a call
whose connection died on the same slot with the same seqid over a new connection bound with
BIND_CONN_TO_SESSION (the server answers from its reply cache: exactly once, SS-13), rebuilds
the session (and the client id, with reclaim) when the server lost it, renews the lease when idle,
and notices a server that stopped answering (a NULL probe that times out; UL-26) and reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.errors import RpcConnectionLost, RpcError
from nfsrdma.rpc.server import Dispatcher, RpcCall, null_procedure
from nfsrdma.session.client_backchannel import Backchannel, CallbackEvents, Recall
from nfsrdma.session.client_recovery import (
    Action,
    Backoff,
    FlagAction,
    after_compound,
    after_sequence_error,
    after_status_flags,
)
from nfsrdma.session.client_setup import (
    Negotiated,
    SessionOptions,
    bind_conn_args,
    create_session_args,
    exchange_id_args,
    negotiated,
)
from nfsrdma.session.client_slots import Slot, SlotTable
from nfsrdma.transport.base import Connection, ReplyExpectation, TransportCallError
from nfsrdma.transport.tcp import TcpConnection
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, Writer, XdrError

log = logging.getLogger(__name__)

ConnectFn = Callable[[], Awaitable[Connection]]
DEFAULT_REPLY_SIZE = 8192
MAX_MALFORMED = 3


def result_status(result: Any) -> int:
    """The nfsstat4 of an operation's result (the first field, whatever its name)."""
    return int(getattr(result, dataclasses.fields(result)[0].name))


def status_name(status: int) -> str:
    try:
        return nfs4.nfsstat4(status).name
    except ValueError:
        return str(status)


class SessionError(OSError):
    """The session cannot carry calls (closed, or it could not be re-established)."""


class NfsStatusError(OSError):
    """A session-level operation failed with an NFS status (EXCHANGE_ID, CREATE_SESSION...)."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(errno.EIO, f"{what}: {status_name(status)}")
        self.status = status


class _Repair(enum.IntEnum):
    NONE = 0
    RECONNECT = 1  # a new connection, bound to the same session
    SESSION = 2  # a new session for the same client id
    CLIENT = 3  # a new client id (EXCHANGE_ID), a new session, reclaim


class _RepairNeeded(Exception):
    """Raised to the repair loop from a call made on its behalf (reclaim)."""


@dataclass(slots=True)
class SessionStats:
    calls: int = 0
    resends: int = 0  # same slot and seqid on a new connection
    connects: int = 0
    binds: int = 0
    sessions: int = 0
    clients: int = 0
    delays: int = 0  # NFS4ERR_DELAY / GRACE retries
    probes: int = 0  # NULL pings
    slot_probes: int = 0  # SEQUENCE-only probes of abandoned slots
    malformed: int = 0
    callbacks: int = 0
    recalls: int = 0
    lock_notices: int = 0  # CB_NOTIFY_LOCK that woke a waiting LOCK
    renewals: int = 0
    reclaim_attempts: int = 0  # opens offered back with CLAIM_PREVIOUS (by the client layer)
    reclaimed: int = 0  # ... that the server accepted
    reopens: int = 0  # opens made again with CLAIM_FH after our state was lost


ReclaimHook = Callable[[], Coroutine[Any, Any, None]]


class ClientSession:
    """One client id and one session with one server, over a connection made by ``connect``."""

    def __init__(
        self,
        connect: ConnectFn,
        options: SessionOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connect_fn = connect
        self.opts = options or SessionOptions()
        self.clock = clock
        self.cred = auth_sys(self.opts.uid, self.opts.gid, self.opts.gids, self.opts.machinename)
        self.verifier = os.urandom(8)
        self.stats = SessionStats()
        self.rpc: RpcConnection | None = None
        self.clientid: int | None = None
        self.create_sequence = 0
        self.session: Negotiated | None = None
        self.lease_time = 90.0
        self.slots = SlotTable(self.opts.slots)
        self.backchannel = Backchannel(b"", self.opts.back_slots)
        self.dispatcher = Dispatcher()
        self.dispatcher.add(self.opts.cb_program, 1, {0: null_procedure, 1: self._cb_compound})
        # Delegations the client holds: stateid.other -> (stateid, filehandle).
        self.delegations: dict[bytes, tuple[nfs4.stateid4, bytes]] = {}
        # After a new client id: ``reclaim_hook`` runs before RECLAIM_COMPLETE (its calls pass
        # ``reclaim=True``: CLAIM_PREVIOUS opens, reclaim locks); ``reopen_hook`` runs after it,
        # as an ordinary task (opens that could not be reclaimed).
        self.reclaim_hook: ReclaimHook | None = None
        self.reopen_hook: ReclaimHook | None = None
        self.recall_hook: Callable[[Recall], None] | None = None

        self._ready = asyncio.Event()
        self._slot_waiters: list[asyncio.Future[None]] = []
        self._failure: BaseException | None = None
        self._closing = False
        self._need = _Repair.NONE
        self._repair_task: asyncio.Task[None] | None = None
        self._keeper_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conn_gen = 0
        self._session_gen = 0
        self._on_wire: dict[int, float] = {}  # calls sent and not yet answered: when sent
        self._next_token = 0
        self._last_ping = 0.0
        self._last_renewal = 0.0
        self._lock_notices: dict[tuple[bytes, bytes], asyncio.Event] = {}

    # ------------------------------------------------------------------------------------------
    # Life cycle

    async def start(self) -> None:
        """Connect, EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE; then keep the lease."""
        self._need = _Repair.CLIENT
        await self._repair_once(first=True)
        self._ready.set()
        self._keeper_task = asyncio.create_task(self._keeper(), name="nfs4 session keeper")
        await self._fetch_lease_time()

    async def close(self) -> None:
        """DESTROY_SESSION, DESTROY_CLIENTID, close the connection. Idempotent."""
        if self._closing:
            return
        self._closing = True
        for task in [self._keeper_task, self._repair_task, *self._tasks]:
            if task is not None and not task.done():
                task.cancel()
        for task in [self._keeper_task, self._repair_task, *self._tasks]:
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task
        rpc = self.rpc
        if rpc is not None and not rpc.conn.closed and self.session is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._sessionless(
                        rpc,
                        nfs4.OP_DESTROY_SESSION,
                        nfs4.DESTROY_SESSION4args(self.session.sessionid),
                    ),
                    self.opts.probe_timeout,
                )
            if self.clientid is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self._sessionless(
                            rpc,
                            nfs4.OP_DESTROY_CLIENTID,
                            nfs4.DESTROY_CLIENTID4args(self.clientid),
                        ),
                        self.opts.probe_timeout,
                    )
        self._fail(SessionError(errno.ESHUTDOWN, "the NFS session is closed"))
        if rpc is not None:
            rpc.close()

    @property
    def negotiated(self) -> Negotiated:
        if self.session is None:
            raise SessionError(errno.ENOTCONN, "no NFS session")
        return self.session

    # ------------------------------------------------------------------------------------------
    # Calls

    async def compound(
        self,
        ops: list[nfs4.nfs_argop4],
        *,
        cachethis: bool = False,
        idempotent: bool = True,
        sinks: list[memoryview] | None = None,
        reply_size: int = 0,
        reclaim: bool = False,
        tag: bytes = b"",
    ) -> nfs4.COMPOUND4res:
        """Send SEQUENCE + ``ops``; returns the COMPOUND4res without the SEQUENCE result.

        Non-idempotent requests should set ``cachethis`` so that a resend after a lost
        connection is answered from the server's reply cache. ``sinks`` are buffers for the
        READ-class results (RPC-over-RDMA places READ data there). Raises SessionError when
        the session is gone for good, TimeoutError when NFS4ERR_DELAY outlasts the deadline."""
        self.stats.calls += 1
        expect = ReplyExpectation(list(sinks or ()), reply_size or DEFAULT_REPLY_SIZE)
        backoff: Backoff | None = None
        malformed = 0
        slot: Slot | None = None
        in_doubt = False  # the request went out on ``slot`` and its outcome is unknown
        token = self._next_token = self._next_token + 1
        try:
            while True:
                await self._wait_ready(reclaim)
                if slot is not None and not self.slots.owns(slot):
                    slot, in_doubt = None, False  # a new session: the old slot is gone
                if slot is None:
                    slot = await self._acquire_slot(reclaim)
                if slot.needs_probe:
                    try:
                        await self._probe_slot(slot, reclaim)
                    except _SlotGone:
                        self._release(slot)  # broken now: another slot, or a new session
                        slot = None
                    continue  # look again: the session may have changed meanwhile
                rpc = self.rpc
                assert rpc is not None
                conn_gen = self._conn_gen
                try:
                    if in_doubt:
                        self.stats.resends += 1
                    in_doubt = True
                    self._on_wire[token] = self.clock()
                    try:
                        res = await self._send(rpc, slot, ops, cachethis, expect, tag)
                    finally:
                        self._on_wire.pop(token, None)
                except TransportCallError as e:
                    # RDMA_ERROR: the transaction ends here and is not resent (UL-20); whether
                    # the server ran it is unknown, so the slot is probed before reuse (UL-25).
                    raise OSError(errno.EIO, f"the transport refused the call: {e}") from e
                except (RpcConnectionLost, ConnectionError) as e:
                    # The outcome is unknown: the same slot and seqid go out again on the next
                    # connection, and the server's reply cache answers if it ran (SS-13).
                    log.info("connection lost during a call (%s); resending after reconnect", e)
                    self._request_repair(_Repair.RECONNECT, conn_gen)
                    if reclaim:
                        raise _RepairNeeded() from e
                    continue
                except XdrError as e:
                    self.stats.malformed += 1
                    malformed += 1
                    log.warning("malformed reply (%s); reconnecting to get it again", e)
                    if malformed > MAX_MALFORMED:
                        raise OSError(errno.EIO, f"malformed replies from the server: {e}") from e
                    if rpc is self.rpc:
                        self._abort(rpc)
                    self._request_repair(_Repair.RECONNECT, conn_gen)
                    if reclaim:
                        raise _RepairNeeded() from e
                    continue
                except RpcError as e:
                    # Accepted-but-not-run or denied: the slot's seqid was not used.
                    in_doubt = False
                    raise OSError(errno.EIO, f"RPC call failed: {e}") from e
                in_doubt = False
                seq = res.resarray[0].value if res.resarray else None
                if not isinstance(seq, nfs4.SEQUENCE4res) or res.resarray[0].resop != (
                    nfs4.OP_SEQUENCE
                ):
                    raise OSError(errno.EIO, "reply without a SEQUENCE result")
                if seq.sr_status != nfs4.NFS4_OK:
                    action = after_sequence_error(seq.sr_status)
                    slot, again = await self._sequence_failed(action, seq.sr_status, slot, reclaim)
                    if again is not None:
                        backoff = backoff or Backoff(deadline=self.opts.delay_deadline)
                        await self._back_off(backoff, seq.sr_status)
                        if again:
                            in_doubt = True  # same seqid: the original may still be running
                    continue
                assert isinstance(seq.value, nfs4.SEQUENCE4resok)
                self._sequence_done(slot, seq.value)
                del res.resarray[0]
                action = after_compound(res.status, idempotent=idempotent, reclaim=reclaim)
                if action is Action.DONE:
                    return res
                if action is Action.RETRY_UNCACHED and cachethis:
                    # The server would not keep this reply: ask again without the cache (the
                    # operation that did not fit was not run, RFC 8881 section 15.1.10.3).
                    cachethis = False
                    continue
                if action is Action.RETRY:
                    self._release(slot)
                    slot = None
                    backoff = backoff or Backoff(deadline=self.opts.delay_deadline)
                    await self._back_off(backoff, res.status)
                    continue
                if action in (Action.NEW_SESSION, Action.NEW_CLIENT):
                    level = _Repair.CLIENT if action is Action.NEW_CLIENT else _Repair.SESSION
                    self._request_repair(level, self._session_gen)
                    if reclaim:
                        raise _RepairNeeded()
                    continue
                return res
        except BaseException:
            if slot is not None and in_doubt and self.slots.owns(slot):
                self.slots.abandon(slot)  # cancelled or failed mid-call (UL-25)
                self._wake_slot_waiter()
                slot = None
            raise
        finally:
            if slot is not None:
                self._release(slot)

    async def null(self, timeout: float | None = None) -> None:
        """NFSv4 NULL (a liveness probe outside the slot table)."""
        rpc = self.rpc
        if rpc is None:
            raise SessionError(errno.ENOTCONN, "no connection")
        self.stats.probes += 1
        await rpc.call(
            nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 0, cred=self.cred, timeout=timeout, probe=True
        )

    # ------------------------------------------------------------------------------------------
    # Sending

    async def _send(
        self,
        rpc: RpcConnection,
        slot: Slot,
        ops: list[nfs4.nfs_argop4],
        cachethis: bool,
        expect: ReplyExpectation | None,
        tag: bytes,
    ) -> nfs4.COMPOUND4res:
        session = self.negotiated
        seq = nfs4.SEQUENCE4args(
            session.sessionid, slot.seqid, slot.slotid, self.slots.highest_slotid(), cachethis
        )
        all_ops = [nfs4.nfs_argop4(nfs4.OP_SEQUENCE, seq), *ops]
        return await self._call(rpc, all_ops, expect, tag)

    async def _call(
        self,
        rpc: RpcConnection,
        ops: list[nfs4.nfs_argop4],
        expect: ReplyExpectation | None,
        tag: bytes = b"",
    ) -> nfs4.COMPOUND4res:
        def encode(w: Writer) -> None:
            nfs4.enc_utf8str_cs(w, tag)
            w += U32.pack(1)  # minorversion
            w += U32.pack(len(ops))
            for i, op in enumerate(ops):
                w.ddp_tag = i
                nfs4.enc_nfs_argop4(w, op)

        result = await rpc.call(
            nfs4.NFS4_PROGRAM,
            nfs4.NFS_V4,
            nfs4.NFSPROC4_COMPOUND,
            encode,
            cred=self.cred,
            expect=expect,
        )
        res, _ = nfs4.dec_COMPOUND4res(result.reader, result.offset)
        return res

    async def _sessionless(self, rpc: RpcConnection, op: int, args: Any) -> Any:
        """A session-management operation alone in its COMPOUND; returns its result value
        (raises NfsStatusError on failure)."""
        res = await self._call(rpc, [nfs4.nfs_argop4(nfs4.nfs_opnum4(op), args)], None)
        if not res.resarray:
            raise NfsStatusError(res.status, nfs4.nfs_opnum4(op).name)
        value = res.resarray[0].value
        status = result_status(value)
        if status != nfs4.NFS4_OK:
            raise NfsStatusError(status, nfs4.nfs_opnum4(op).name)
        return getattr(value, "value", value)

    # ------------------------------------------------------------------------------------------
    # Slots

    async def _acquire_slot(self, reclaim: bool) -> Slot:
        while True:
            slot = self.slots.acquire()
            if slot is not None:
                return slot
            if self.slots.usable == 0:
                self._request_repair(_Repair.SESSION, self._session_gen)
                if reclaim:
                    raise _RepairNeeded()
                await self._wait_ready(reclaim)
                continue
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut in self._slot_waiters:
                    self._slot_waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._wake_slot_waiter()  # pass the wake-up on
                raise

    def _release(self, slot: Slot) -> None:
        if self.slots.owns(slot):
            self.slots.release(slot)
        self._wake_slot_waiter()

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            fut = self._slot_waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                return

    def _wake_all_slot_waiters(self) -> None:
        waiters, self._slot_waiters = self._slot_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _probe_slot(self, slot: Slot, reclaim: bool) -> None:
        """Bring an abandoned slot in step: SEQUENCE alone with the slot's current seqid. A
        reply (cached or fresh) means the server has now used that seqid (UL-25)."""
        self.stats.slot_probes += 1
        self.slots.stats.probes += 1
        while slot.needs_probe and self.slots.owns(slot):
            await self._wait_ready(reclaim)
            rpc = self.rpc
            assert rpc is not None
            conn_gen = self._conn_gen
            try:
                res = await self._send(rpc, slot, [], False, None, b"")  # SEQUENCE alone
            except (RpcConnectionLost, ConnectionError, XdrError):
                self._request_repair(_Repair.RECONNECT, conn_gen)
                if reclaim:
                    raise _RepairNeeded() from None
                continue
            except RpcError as e:
                raise OSError(errno.EIO, f"slot probe failed: {e}") from e
            seq = res.resarray[0].value if res.resarray else None
            if isinstance(seq, nfs4.SEQUENCE4res) and seq.sr_status == nfs4.NFS4_OK:
                assert isinstance(seq.value, nfs4.SEQUENCE4resok)
                self._sequence_done(slot, seq.value)
                return
            status = seq.sr_status if isinstance(seq, nfs4.SEQUENCE4res) else res.status
            if status == nfs4.NFS4ERR_DELAY:
                await asyncio.sleep(0.05)
                continue
            if status == nfs4.NFS4ERR_SEQ_MISORDERED:
                # Nothing of ours is outstanding on the slot: start it again from 1, or give up.
                if not self.slots.misordered(slot):
                    raise _SlotGone()
                slot.needs_probe = True
                continue
            if after_sequence_error(status) in (Action.NEW_SESSION, Action.NEW_CLIENT):
                level = (
                    _Repair.CLIENT
                    if after_sequence_error(status) is Action.NEW_CLIENT
                    else _Repair.SESSION
                )
                self._request_repair(level, self._session_gen)
                if reclaim:
                    raise _RepairNeeded()
                return  # the slot is detached by the new session
            raise NfsStatusError(status, "SEQUENCE probe")

    def _sequence_done(self, slot: Slot, ok: nfs4.SEQUENCE4resok) -> None:
        if self.slots.owns(slot):
            self.slots.completed(slot)
            before = self.slots.limit
            self.slots.server_limits(ok.sr_highest_slotid, ok.sr_target_highest_slotid)
            if self.slots.limit > before:
                self._wake_all_slot_waiters()
        self._last_renewal = self.clock()
        if ok.sr_status_flags:
            self._status_flags(ok.sr_status_flags)

    async def _sequence_failed(
        self, action: Action, status: int, slot: Slot, reclaim: bool
    ) -> tuple[Slot | None, bool | None]:
        """Handle a failed SEQUENCE. Returns (slot to keep, retry mode): retry mode True means
        back off and resend with the same seqid, False back off and resend, None no back-off."""
        if action is Action.RETRY_SAME_SEQID:
            return slot, True
        if action is Action.RESET_SLOT:
            if self.slots.misordered(slot):
                return slot, None
            self._release(slot)
            return None, None
        if action is Action.PICK_OTHER_SLOT:
            if slot.slotid == 0:
                raise NfsStatusError(status, "SEQUENCE")
            self.slots.recall(slot.slotid - 1)
            self._release(slot)
            return None, None
        if action in (Action.NEW_SESSION, Action.NEW_CLIENT):
            level = _Repair.CLIENT if action is Action.NEW_CLIENT else _Repair.SESSION
            self._release(slot)
            self._request_repair(level, self._session_gen)
            if reclaim:
                raise _RepairNeeded()
            return None, None
        raise NfsStatusError(status, "SEQUENCE")

    async def _back_off(self, backoff: Backoff, status: int) -> None:
        delay = backoff.next_delay(self.clock())
        if delay is None:
            raise TimeoutError(
                errno.ETIMEDOUT,
                f"the server kept answering {status_name(status)} for {backoff.deadline} s",
            )
        self.stats.delays += 1
        await asyncio.sleep(delay)

    def _status_flags(self, flags: int) -> None:
        actions = after_status_flags(
            flags, want_backchannel=bool(self.session and self.session.backchannel)
        )
        if FlagAction.REBIND_BACKCHANNEL in actions and self.rpc is not None:
            self.spawn(self._rebind_backchannel(self.rpc))
        if FlagAction.RECLAIM in actions:
            self._request_repair(_Repair.CLIENT, self._session_gen)
        if FlagAction.STATE_LOST in actions:
            log.warning("the server revoked some of our state (flags %#x)", flags)

    async def _rebind_backchannel(self, rpc: RpcConnection) -> None:
        if self.session is None or rpc.conn.closed:
            return
        with contextlib.suppress(Exception):
            await self._sessionless(
                rpc,
                nfs4.OP_BIND_CONN_TO_SESSION,
                bind_conn_args(self.session.sessionid, True),
            )

    # ------------------------------------------------------------------------------------------
    # Readiness and repair

    async def _wait_ready(self, reclaim: bool) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise SessionError(errno.ESHUTDOWN, "the NFS session is closing")
        if reclaim:
            return  # calls made by the repair loop itself
        while not self._ready.is_set():
            await self._ready.wait()
            if self._failure is not None:
                raise self._failure

    def _request_repair(self, level: _Repair, seen_gen: int) -> None:
        """Ask for a repair of at least ``level``; ``seen_gen`` is the connection (RECONNECT)
        or session (SESSION, CLIENT) generation the caller saw fail: when it has changed since,
        the repair has already happened."""
        if self._closing or self._failure is not None:
            return
        current = self._conn_gen if level is _Repair.RECONNECT else self._session_gen
        if seen_gen != current:
            return
        self._need = max(self._need, level)
        self._ready.clear()
        if self._repair_task is None or self._repair_task.done():
            self._repair_task = asyncio.create_task(self._repair(), name="nfs4 session repair")

    async def _repair(self) -> None:
        try:
            await self._repair_once(first=False)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.error("the NFS session could not be re-established: %s", e)
            err = SessionError(errno.EIO, f"the NFS session could not be re-established: {e}")
            err.__cause__ = e
            self._fail(err)
            return
        self._wake_all_slot_waiters()
        self._ready.set()

    async def _repair_once(self, first: bool) -> None:
        backoff = Backoff(initial=0.05, cap=2.0, deadline=self.opts.reconnect_deadline)
        while self._need is not _Repair.NONE:
            need = self._need
            self._need = _Repair.NONE
            try:
                await self._repair_step(need, first)
            except (OSError, RpcError, XdrError, _RepairNeeded, _SlotGone) as e:
                self._need = max(self._need, need)
                status = e.status if isinstance(e, NfsStatusError) else None
                if status in (nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION):
                    self._need = max(self._need, _Repair.SESSION)
                    continue
                if status in (
                    nfs4.NFS4ERR_STALE_CLIENTID,
                    nfs4.NFS4ERR_EXPIRED,
                    nfs4.NFS4ERR_SEQ_MISORDERED,
                ):
                    self._need = _Repair.CLIENT
                    continue
                if isinstance(e, _SlotGone):
                    self._need = max(self._need, _Repair.SESSION)
                if status is not None and status not in (
                    nfs4.NFS4ERR_DELAY,
                    nfs4.NFS4ERR_GRACE,
                    nfs4.NFS4ERR_RESOURCE,
                ):
                    raise
                if first and self.rpc is None:
                    raise  # the very first connection failed: tell the caller now
                delay = backoff.next_delay(self.clock())
                if delay is None:
                    raise
                log.info("session repair failed (%s); again in %.2f s", e, delay)
                await asyncio.sleep(delay)

    async def _repair_step(self, need: _Repair, first: bool) -> None:
        rpc = self.rpc
        fresh_conn = False
        if rpc is None or rpc.conn.closed or rpc.context.get("aborted"):
            rpc = await self._new_connection()
            fresh_conn = True
        if need is _Repair.RECONNECT:
            if not fresh_conn:
                return  # the connection is fine after all
            assert self.session is not None
            try:
                await self._bind(rpc)
                return
            except NfsStatusError as e:
                if e.status == nfs4.NFS4ERR_NOTSUPP or e.status == nfs4.NFS4ERR_OP_ILLEGAL:
                    return  # SP4_NONE: the first SEQUENCE binds the connection (SS-12)
                if e.status not in (nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION):
                    raise
                need = _Repair.SESSION
        new_client = False
        if need is _Repair.CLIENT or self.clientid is None:
            new_client = await self._exchange_id(rpc)
        try:
            await self._create_session(rpc)
        except NfsStatusError as e:
            if e.status not in (nfs4.NFS4ERR_STALE_CLIENTID, nfs4.NFS4ERR_EXPIRED):
                raise
            new_client = await self._exchange_id(rpc)
            await self._create_session(rpc)
        if new_client:
            await self._after_new_client(first)

    async def _new_connection(self) -> RpcConnection:
        conn = await self.connect_fn()
        self.stats.connects += 1
        rpc = RpcConnection(conn, self.dispatcher)
        old = self.rpc
        self.rpc = rpc
        self._conn_gen += 1
        gen = self._conn_gen
        conn.on_closed(lambda c, exc: self._connection_closed(gen, exc))
        if old is not None and not old.conn.closed:
            old.close()
        return rpc

    def _connection_closed(self, gen: int, exc: BaseException | None) -> None:
        if self._closing or gen != self._conn_gen:
            return
        log.info("connection %d to the server closed (%s)", gen, exc)
        self._request_repair(_Repair.RECONNECT, gen)

    async def _bind(self, rpc: RpcConnection) -> None:
        assert self.session is not None
        await self._sessionless(
            rpc,
            nfs4.OP_BIND_CONN_TO_SESSION,
            bind_conn_args(self.session.sessionid, self.session.backchannel),
        )
        self.stats.binds += 1

    async def _exchange_id(self, rpc: RpcConnection) -> bool:
        """EXCHANGE_ID; True when the server does not know us as a confirmed client (a new or
        unconfirmed record: our state on the server is gone, reclaim it)."""
        res = await self._sessionless(
            rpc, nfs4.OP_EXCHANGE_ID, exchange_id_args(self.opts.owner, self.verifier)
        )
        assert isinstance(res, nfs4.EXCHANGE_ID4resok)
        # An unconfirmed record is a new client as far as the server is concerned: whatever it
        # held for us before (opens, locks) is gone, even if the id happens to be the same.
        new = res.eir_clientid != self.clientid or not (
            res.eir_flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R
        )
        if new:
            self.create_sequence = res.eir_sequenceid
        self.clientid = res.eir_clientid
        self.stats.clients += 1
        return new

    async def _create_session(self, rpc: RpcConnection) -> None:
        assert self.clientid is not None
        args = create_session_args(self.opts, self.clientid, self.create_sequence)
        while True:
            try:
                res = await self._sessionless(rpc, nfs4.OP_CREATE_SESSION, args)
                break
            except NfsStatusError as e:
                if e.status != nfs4.NFS4ERR_DELAY:
                    raise
                await asyncio.sleep(0.1)
        assert isinstance(res, nfs4.CREATE_SESSION4resok)
        self.create_sequence = (res.csr_sequence + 1) & 0xFFFFFFFF
        self.session = negotiated(self.opts, res)
        self._session_gen += 1
        self.slots.reset(self.session.slots)
        self.backchannel.reset(self.session.sessionid, self.session.back.ca_maxrequests)
        self.stats.sessions += 1
        self._last_renewal = self.clock()
        log.debug(
            "session %s: %d slots, rsize %d, wsize %d, back channel %s",
            self.session.sessionid.hex(),
            self.session.slots,
            self.session.rsize,
            self.session.wsize,
            self.session.backchannel,
        )

    async def _after_new_client(self, first: bool) -> None:
        """A new client id: our opens and locks on the server are gone. Reclaim them (the
        client layer's hook), then RECLAIM_COMPLETE (RFC 8881 section 8.4.2.1)."""
        self.delegations.clear()
        if not first and self.reclaim_hook is not None:
            await self.reclaim_hook()
        res = await self.compound(
            [nfs4.nfs_argop4(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False))],
            reclaim=True,
            idempotent=True,
        )
        if res.status not in (nfs4.NFS4_OK, nfs4.NFS4ERR_COMPLETE_ALREADY):
            log.info("RECLAIM_COMPLETE: %s", status_name(res.status))
        if not first and self.reopen_hook is not None:
            self.spawn(self.reopen_hook())

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._ready.set()  # wake every waiter: they see the failure
        waiters, self._slot_waiters = self._slot_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    @staticmethod
    def _abort(rpc: RpcConnection) -> None:
        """Drop the connection now, without waiting to flush (the peer may not be reading)."""
        conn = rpc.conn
        rpc.context["aborted"] = True
        abort = getattr(conn, "abort", None)
        if callable(abort):
            abort()
        elif isinstance(conn, TcpConnection) and conn.transport is not None:
            conn.transport.abort()
        else:
            conn.close()

    # ------------------------------------------------------------------------------------------
    # Keeping the lease and noticing a silent server

    async def _fetch_lease_time(self) -> None:
        try:
            res = await self.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTROOTFH),
                    nfs4.nfs_argop4(
                        nfs4.OP_GETATTR,
                        nfs4.GETATTR4args([1 << nfs4.FATTR4_LEASE_TIME]),
                    ),
                ]
            )
        except OSError as e:
            log.debug("lease time not available: %s", e)
            return
        if res.status == nfs4.NFS4_OK:
            ga = res.resarray[-1].value
            assert isinstance(ga, nfs4.GETATTR4res) and ga.value is not None
            vals = ga.value.obj_attributes.attr_vals
            if len(vals) >= 4:
                self.lease_time = float(max(1, int.from_bytes(vals[:4], "big")))

    async def _keeper(self) -> None:
        while True:
            tick = max(0.05, min(self.lease_time / 4, self.opts.probe_interval / 2))
            await asyncio.sleep(tick)
            if not self._ready.is_set() or self._failure is not None:
                continue
            try:
                await self._keep()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep keeping
                log.info("session keeper: %s", e)

    async def _keep(self) -> None:
        """One look: a call unanswered for too long (ping; reconnect if the ping is not
        answered either, or the call is older than ``call_timeout``), or an idle lease."""
        rpc = self.rpc
        if rpc is None:
            return
        now = self.clock()
        oldest = min(self._on_wire.values(), default=None)
        if oldest is not None:
            age = now - oldest
            if age > self.opts.call_timeout:
                log.warning("a call has waited %.1f s for its reply; reconnecting", age)
                self._reconnect_now(rpc)
                return
            if age > self.opts.probe_interval and now - self._last_ping > self.opts.probe_interval:
                try:
                    await self.null(self.opts.probe_timeout)
                except (TimeoutError, RpcError, OSError) as e:
                    log.warning("the server does not answer (%s); reconnecting", e)
                    self._reconnect_now(rpc)
                    return
                self._last_ping = self.clock()
            return
        if now - self._last_renewal >= self.lease_time / 2:
            self.stats.renewals += 1
            conn_gen = self._conn_gen
            try:
                await asyncio.wait_for(self.compound([]), self.opts.probe_timeout)
            except TimeoutError:
                log.warning("lease renewal not answered; reconnecting")
                if conn_gen == self._conn_gen:
                    self._reconnect_now(rpc)

    def _reconnect_now(self, rpc: RpcConnection) -> None:
        if rpc is not self.rpc:
            return
        gen = self._conn_gen
        self._abort(rpc)
        self._request_repair(_Repair.RECONNECT, gen)

    # ------------------------------------------------------------------------------------------
    # Back channel

    def _cb_compound(self, call: RpcCall, w: Writer) -> None:
        self.stats.callbacks += 1
        res, events = self.backchannel.handle(call.reader, call.offset)
        nfs4.enc_CB_COMPOUND4res(w, res)
        if events:
            self.spawn(self._callback_events(events))

    async def wait_lock_notice(self, fh: bytes, owner: bytes, timeout: float) -> bool:
        """Wait up to ``timeout`` for CB_NOTIFY_LOCK about (fh, lock owner); True if it came.
        Notifications are advisory: callers poll anyway, this only shortens the wait."""
        key = (bytes(fh), bytes(owner))
        event = self._lock_notices.setdefault(key, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            if self._lock_notices.get(key) is event:
                del self._lock_notices[key]

    async def _callback_events(self, events: CallbackEvents) -> None:
        for fh, owner in events.lock_notices:
            waiting = self._lock_notices.get((bytes(fh), bytes(owner)))
            if waiting is not None:
                self.stats.lock_notices += 1
                waiting.set()
        if events.recall_slot is not None:
            self.slots.recall(events.recall_slot)
        recalls = list(events.recalls)
        if events.recall_any:
            recalls += [Recall(sid, fh, False) for sid, fh in self.delegations.values()]
        for recall in recalls:
            self.stats.recalls += 1
            if self.recall_hook is not None:
                self.recall_hook(recall)
            await self.return_delegation(recall.stateid, recall.fh)

    async def return_delegation(self, stateid: nfs4.stateid4, fh: bytes) -> None:
        """DELEGRETURN (errors other than a lost session are ignored: the delegation is gone)."""
        self.delegations.pop(stateid.other, None)
        try:
            await self.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    nfs4.nfs_argop4(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(stateid)),
                ]
            )
        except OSError as e:
            log.info("DELEGRETURN failed: %s", e)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self._closing:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _SlotGone(Exception):
    """A probed slot cannot be brought in step; the session must be renewed."""
