"""The NFSv4.1 client session: the asyncio driver around the sans-IO pieces.

- ``client_core``: the decisions: one call's way (slot, probe, send, resend, back-off, repair
  request), what a failed repair step calls for, what the lease keeper does.
- ``client_setup``: EXCHANGE_ID / CREATE_SESSION / BIND_CONN_TO_SESSION arguments and results.
- ``requester_slots``: the slot table (seqids, target_highest_slotid, probes, waiting).
- ``client_recovery``: what each outcome calls for (retry, back-off, new session, reclaim).
- ``client_backchannel``: CB_COMPOUND processing on the client's own connection, and
  ``client_callbacks`` acting on it (lock notices, slot recalls, DELEGRETURN).

``ClientSession.compound(ops)`` puts SEQUENCE in front of ``ops`` on a free slot and returns the
COMPOUND4res without it. Underneath it keeps many calls in flight (one per slot), resends a call
whose connection died on the same slot with the same seqid over a new connection bound with
BIND_CONN_TO_SESSION (the server answers from its reply cache: exactly once, SS-13), rebuilds
the session (and the client id, with reclaim) when the server lost it, renews the lease when idle,
and notices a server that stopped answering (a NULL probe that times out; UL-26) and reconnects.
This module only does what the core decides: it sends, waits and runs the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from nfsrdma.rpc.gss import SVC_NONE
from nfsrdma.rpc.gss_client import GSS_REPLY_OVERHEAD, GssClientAuth
from nfsrdma.rpc.server import Dispatcher, null_procedure
from nfsrdma.session.client_backchannel import Backchannel, Recall
from nfsrdma.session.client_callbacks import ClientCallbacks
from nfsrdma.session.client_core import (
    AfterBind,
    AfterCreateSession,
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
    Step,
    WaitForSlot,
    after_bind_error,
    after_create_session_error,
    is_new_client,
    status_name,
)
from nfsrdma.session.client_recovery import Backoff
from nfsrdma.session.client_replysize import RPC_REPLY_OVERHEAD, compound_reply_bound
from nfsrdma.session.client_setup import (
    Negotiated,
    SessionOptions,
    bind_conn_args,
    create_session_args,
    exchange_id_args,
    negotiated,
)
from nfsrdma.session.requester_slots import RequesterSlot, RequesterSlots
from nfsrdma.session.slot_wait import slot_signal
from nfsrdma.stats.core import OpTable
from nfsrdma.transport.base import Connection, ReplyExpectation, TransportCallError
from nfsrdma.transport.rdma.header import ERR_CHUNK
from nfsrdma.transport.rdma.requester import RdmaErrorReply
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer, XdrError

__all__ = ["ClientSession", "NfsStatusError", "SessionError", "SessionStats"]

log = logging.getLogger(__name__)

# SEQUENCE's result, which ``compound`` puts in front of the caller's operations.
SEQUENCE_REPLY = 4 + 4 + 16 + 4 * 5
ConnectFn = Callable[[], Awaitable[Connection]]
# The largest reply provided for before a session says what the server may send.
DEFAULT_REPLY_SIZE = 8192


# Operations that never change (GETFH, the GETATTR of ``stat``...), encoded once by
# ``constant_op``: by the object's identity, with the object kept so the identity stays its own.
_ENCODED: dict[int, tuple[nfs4.nfs_argop4, bytes]] = {}


def constant_op(op: nfs4.nfs_argop4) -> nfs4.nfs_argop4:
    """``op``, encoded now (by the generated codec) and for good: a COMPOUND that carries this
    very object copies those bytes instead of encoding it again. Only for an operation that
    nothing changes afterwards and that has no DDP-eligible item (RFC 8267)."""
    w = Writer()
    nfs4.enc_nfs_argop4(w, op)
    if w.ddp:
        raise ValueError("an operation with a DDP-eligible item is encoded with each call")
    _ENCODED[id(op)] = (op, bytes(w))
    return op


class SessionError(OSError):
    """The session cannot carry calls (closed, or it could not be re-established)."""


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
    reply_overruns: int = 0  # ERR_CHUNK to a call sized by estimate: resent with a full Reply chunk


ReclaimHook = Callable[[], Coroutine[Any, Any, None]]
# EXCHANGE_ID answers that mean "not SP4_MACH_CRED here" (the client then asks for SP4_NONE).
_NO_MACH_CRED = frozenset(
    {nfs4.NFS4ERR_SERVERFAULT, nfs4.NFS4ERR_INVAL, nfs4.NFS4ERR_ENCR_ALG_UNSUPP}
)


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
        self.gss: GssClientAuth | None = None  # RPCSEC_GSS (use_security)
        self.state_protection = int(nfs4.SP4_NONE)  # what the server granted at EXCHANGE_ID
        self._no_mach_cred = False  # the server refused SP4_MACH_CRED once: do not ask again
        if self.opts.sec not in ("sys", "auto"):
            self.use_security(self.opts.sec)
        self.verifier = os.urandom(8)
        self.minorversion = self.opts.minor_versions[0]  # settled by the first EXCHANGE_ID
        self._minor_settled = False
        self.stats = SessionStats()
        self.op_stats = OpTable()  # per operation: count, errors, latency (NfsClient.stats)
        self.rpc: RpcConnection | None = None
        self.clientid: int | None = None
        self.create_sequence = 0
        self.session: Negotiated | None = None
        self.core = SessionCore(
            RequesterSlots(self.opts.slots),
            delay_deadline=self.opts.delay_deadline,
            reconnect_deadline=self.opts.reconnect_deadline,
        )
        self.backchannel = Backchannel(b"", self.opts.back_slots)
        self.callbacks = ClientCallbacks(
            self.backchannel, self.stats, self.compound, self.spawn, lambda: self.slots
        )
        self.dispatcher = Dispatcher()
        self.dispatcher.add(
            self.opts.cb_program, 1, {0: null_procedure, 1: self.callbacks.cb_compound}
        )
        # After a new client id: ``reclaim_hook`` runs before RECLAIM_COMPLETE (its calls pass
        # ``reclaim=True``: CLAIM_PREVIOUS opens, reclaim locks); ``reopen_hook`` runs after it,
        # as an ordinary task (opens that could not be reclaimed).
        self.reclaim_hook: ReclaimHook | None = None
        self.reopen_hook: ReclaimHook | None = None

        self._ready = asyncio.Event()
        self._failure: BaseException | None = None
        self._closing = False
        self._repair_task: asyncio.Task[None] | None = None
        self._keeper_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._next_token = 0

    def use_security(self, sec: str) -> None:
        """Send every later call with ``sec``: "sys", "krb5", "krb5i" or "krb5p"."""
        if sec == "sys":
            self.gss = None
            return
        from nfsrdma.rpc.gss import SERVICES
        from nfsrdma.rpc.gss_krb5 import Krb5Initiator

        if sec not in SERVICES:
            raise ValueError(f"unknown security flavour {sec!r}")
        if not self.opts.gss_host:
            raise ValueError("Kerberos needs the server's host name (gss_host)")
        initiator = Krb5Initiator(
            self.opts.gss_host,
            principal=self.opts.principal,
            ccache=self.opts.ccache,
            keytab=self.opts.keytab,
        )
        self.gss = GssClientAuth(initiator, SERVICES[sec])

    def _mach_cred(self) -> bool:
        """SP4_MACH_CRED: with Kerberos integrity or privacy (RFC 8881 section 18.35.3)."""
        return self.gss is not None and self.gss.service != SVC_NONE

    @property
    def slots(self) -> RequesterSlots:
        """The fore channel's slot table."""
        return self.core.slots

    @property
    def lease_time(self) -> float:
        return self.core.lease_time

    # ------------------------------------------------------------------------------------------
    # Life cycle

    async def start(self) -> None:
        """Connect, EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE; then keep the lease."""
        self.core.need = Repair.CLIENT
        await self._repair_once(first=True)
        self._ready.set()
        self._keeper_task = asyncio.create_task(self._keeper(), name="nfs4 session keeper")
        await self._fetch_lease_time()

    async def close(self) -> None:
        """DESTROY_SESSION, DESTROY_CLIENTID, close the connection. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self.core.closing = True
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
        the session is gone for good, TimeoutError when NFS4ERR_DELAY outlasts the deadline.

        ``reply_size`` bounds the reply for RPC-over-RDMA (whether a Reply chunk is offered);
        without it the bound is computed from ``ops`` (``client_replysize``)."""
        self.stats.calls += 1
        expect = ReplyExpectation(
            list(sinks or ()), reply_size or self.reply_bound(ops, tag, bool(sinks))
        )
        call = CallMachine(self.core, cachethis=cachethis, idempotent=idempotent, reclaim=reclaim)
        self._next_token += 1
        token = self._next_token
        started = self.clock()
        try:
            while True:
                if self._failure is not None or self._closing or not self._ready.is_set():
                    await self._wait_ready(reclaim)
                step: Step = call.next_step()
                conn_gen = self.core.conn_gen
                if isinstance(step, Send):
                    step = await self._transmit(call, step, ops, expect, tag, token)
                if isinstance(step, Finish):
                    self._count(step.res, self.clock() - started)
                    return step.res
                if isinstance(step, Fail):
                    raise step.error
                if isinstance(step, WaitForSlot):
                    await slot_signal(self.slots)
                elif isinstance(step, BackOff):
                    self.stats.delays += 1
                    await asyncio.sleep(step.delay)
                elif isinstance(step, RequestRepair):
                    self._do_repair_request(step, conn_gen)
        finally:
            call.close()

    def reply_bound(self, ops: list[nfs4.nfs_argop4], tag: bytes, sinks: bool) -> int:
        """The largest reply SEQUENCE + ``ops`` can get (``client_replysize``), within the
        largest the session allows; that largest when it has no bound. READ data with a sink
        goes in the one Write chunk offered (RFC 8267's baseline) and is not counted."""
        full = self.full_reply_size()
        bound = compound_reply_bound(ops, tag, write_chunks=1 if sinks else 0)
        if bound is None:
            return full
        bound += SEQUENCE_REPLY
        if self.gss is not None:
            bound += GSS_REPLY_OVERHEAD  # krb5i checksum, krb5p wrap token, GSS verifier
        return min(bound, full)

    def full_reply_size(self) -> int:
        """The largest reply the server may send on this session: ca_maxresponsesize, plus the
        RPC reply header (and RPCSEC_GSS's overhead)."""
        session = self.session
        if session is None:
            return DEFAULT_REPLY_SIZE
        size = session.fore.ca_maxresponsesize + RPC_REPLY_OVERHEAD
        if self.gss is not None:
            size += GSS_REPLY_OVERHEAD
        return size

    def _count(self, res: nfs4.COMPOUND4res, seconds: float) -> None:
        results: list[tuple[int, int]] = []
        for r in res.resarray:
            op = nfs4.OPERATIONS.get(r.resop)
            if op is not None:
                results.append((r.resop, op.status_of(r.value)))
        self.op_stats.record_compound(results, seconds)

    async def _transmit(
        self,
        call: CallMachine,
        send: Send,
        ops: list[nfs4.nfs_argop4],
        expect: ReplyExpectation,
        tag: bytes,
        token: int,
    ) -> Step:
        """Do a Send; the core's answer to its outcome."""
        rpc = self.rpc
        assert rpc is not None
        reply: ReplyExpectation | None = expect
        if send.probe:
            if not send.resend:
                self.stats.slot_probes += 1
            ops, tag, reply = [], b"", None
        else:
            if send.resend:
                self.stats.resends += 1
            if call.full_reply:
                # After a lost connection or a reply that did not fit, the call provides for
                # the largest reply: the estimate may be why the first attempt failed.
                full = self.full_reply_size()
                if expect.max_size < full:
                    reply = ReplyExpectation(expect.sinks, full)
            self.core.on_wire[token] = self.clock()
        try:
            all_ops = self._sequenced(send.slot, ops, send.cachethis)
            res = await self._call(rpc, all_ops, reply, tag)
        except TransportCallError as e:
            overrun = (
                isinstance(e, RdmaErrorReply)
                and e.header.error == ERR_CHUNK
                and reply is not None
                and reply.max_size < self.full_reply_size()
            )
            if overrun and not call.full_reply and not send.probe:
                self.stats.reply_overruns += 1
                log.info("%s; resending with a full Reply chunk", e)
            return call.on_transport_refused(str(e), reply_overrun=overrun)
        except (RpcConnectionLost, ConnectionError) as e:
            if not send.probe:
                log.info("connection lost during a call (%s); resending after reconnect", e)
            return call.on_connection_lost()
        except XdrError as e:
            if not send.probe:
                self.stats.malformed += 1
                log.warning("malformed reply (%s); reconnecting to get it again", e)
            return call.on_malformed(str(e))
        except RpcError as e:
            return call.on_rpc_error(str(e))
        finally:
            self.core.on_wire.pop(token, None)
        step = call.on_reply(res, self.clock())
        self._apply_effects()
        return step

    def _do_repair_request(self, step: RequestRepair, conn_gen: int) -> None:
        if step.abort and self.rpc is not None and self.core.conn_gen == conn_gen:
            self._abort(self.rpc)
        seen = conn_gen if step.level is Repair.RECONNECT else self.core.session_gen
        self._request_repair(step.level, seen)
        if step.give_up:
            raise _RepairNeeded()

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

    def _sequenced(
        self, slot: RequesterSlot, ops: list[nfs4.nfs_argop4], cachethis: bool
    ) -> list[nfs4.nfs_argop4]:
        """SEQUENCE on ``slot`` (its current seqid) + ``ops``."""
        seq = nfs4.SEQUENCE4args(
            self.negotiated.sessionid,
            slot.seqid,
            slot.slotid,
            self.slots.highest_slotid(),
            cachethis,
        )
        return [nfs4.nfs_argop4(nfs4.OP_SEQUENCE, seq), *ops]

    async def _call(
        self,
        rpc: RpcConnection,
        ops: list[nfs4.nfs_argop4],
        expect: ReplyExpectation | None,
        tag: bytes = b"",
    ) -> nfs4.COMPOUND4res:
        def encode(w: Writer) -> None:
            # COMPOUND4args piece by piece: each operation's DDP-eligible items are tagged
            # with its position (RFC 8267: which READ-class result goes to which sink).
            nfs4.enc_utf8str_cs(w, tag)
            nfs4.enc_uint32_t(w, self.minorversion)
            nfs4.enc_uint32_t(w, len(ops))
            for i, op in enumerate(ops):
                w.ddp_tag = i
                done = _ENCODED.get(id(op))
                if done is not None:
                    w += done[1]
                else:
                    nfs4.enc_nfs_argop4(w, op)

        result = await rpc.call(
            nfs4.NFS4_PROGRAM,
            nfs4.NFS_V4,
            nfs4.NFSPROC4_COMPOUND,
            encode,
            cred=self.cred,
            expect=expect,
            auth=self.gss,
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
        status = nfs4.OPERATIONS[op].status_of(value)
        if status != nfs4.NFS4_OK:
            raise NfsStatusError(status, nfs4.nfs_opnum4(op).name)
        return getattr(value, "value", value)

    def _apply_effects(self) -> None:
        """Do what the last SEQUENCE results' status flags asked for."""
        for effect, flags in self.core.take_effects():
            if effect is Effect.REBIND_BACKCHANNEL and self.rpc is not None:
                self.spawn(self._rebind_backchannel(self.rpc))
            elif effect is Effect.RECLAIM:
                self._request_repair(Repair.CLIENT, self.core.session_gen)
            elif effect is Effect.STATE_LOST:
                log.warning("the server revoked some of our state (flags %#x)", flags)
                if flags & nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED:
                    self.spawn(self.callbacks.free_revoked())

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

    def _request_repair(self, level: Repair, seen_gen: int) -> None:
        """Ask for a repair of at least ``level`` (see ``SessionCore.want_repair``)."""
        if self._failure is not None or not self.core.want_repair(level, seen_gen):
            return
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
        self.slots.wake_all()
        self._ready.set()

    async def _repair_once(self, first: bool) -> None:
        backoff = self.core.repair_backoff()
        while self.core.need is not Repair.NONE:
            need = self.core.take_need()
            try:
                await self._repair_step(need, first)
            except (OSError, RpcError, XdrError, _RepairNeeded) as e:
                status = e.status if isinstance(e, NfsStatusError) else None
                delay = self.core.after_repair_failure(
                    need, status, backoff, self.clock(), never_connected=first and self.rpc is None
                )
                if delay is None:
                    raise
                if delay:
                    log.info("session repair failed (%s); again in %.2f s", e, delay)
                    await asyncio.sleep(delay)

    async def _repair_step(self, need: Repair, first: bool) -> None:
        rpc = self.rpc
        fresh_conn = False
        if rpc is None or rpc.conn.closed or rpc.context.get("aborted"):
            rpc = await self._new_connection()
            fresh_conn = True
        if need is Repair.RECONNECT:
            if not fresh_conn:
                return  # the connection is fine after all
            assert self.session is not None
            try:
                await self._bind(rpc)
                return
            except NfsStatusError as e:
                after = after_bind_error(e.status)
                if after is AfterBind.BOUND:
                    return
                if after is AfterBind.FAIL:
                    raise
                need = Repair.SESSION
        new_client = False
        if need is Repair.CLIENT or self.clientid is None:
            new_client = await self._exchange_id(rpc)
        try:
            await self._create_session(rpc)
        except NfsStatusError as e:
            if after_create_session_error(e.status) is not AfterCreateSession.NEW_CLIENT:
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
        gen = self.core.connected()
        conn.on_closed(lambda c, exc: self._connection_closed(gen, exc))
        if old is not None and not old.conn.closed:
            old.close()
        return rpc

    def _connection_closed(self, gen: int, exc: BaseException | None) -> None:
        if self._closing or gen != self.core.conn_gen:
            return
        log.info("connection %d to the server closed (%s)", gen, exc)
        self._request_repair(Repair.RECONNECT, gen)

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
        mach_cred = self._mach_cred() and not self._no_mach_cred
        while True:
            args = exchange_id_args(self.opts.owner, self.verifier, mach_cred=mach_cred)
            try:
                res = await self._sessionless(rpc, nfs4.OP_EXCHANGE_ID, args)
                break
            except NfsStatusError as e:
                if e.status == nfs4.NFS4ERR_MINOR_VERS_MISMATCH and not self._minor_settled:
                    offered = self.opts.minor_versions
                    later = offered[offered.index(self.minorversion) + 1 :]
                    if not later:
                        raise
                    self.minorversion = later[0]  # the server does not serve this one
                    continue
                if mach_cred and e.status in _NO_MACH_CRED:
                    # knfsd answers SERVERFAULT when its GSS daemon gave it no principal name
                    # (rpc.svcgssd): carry on without state protection.
                    log.warning("the server refused SP4_MACH_CRED (%s); using SP4_NONE", e)
                    self._no_mach_cred = True
                    mach_cred = False
                    continue
                raise
        self._minor_settled = True
        assert isinstance(res, nfs4.EXCHANGE_ID4resok)
        self.state_protection = int(res.eir_state_protect.spr_how)
        new = is_new_client(res, self.clientid)
        if new:
            self.create_sequence = res.eir_sequenceid
        self.clientid = res.eir_clientid
        self.stats.clients += 1
        return new

    async def _create_session(self, rpc: RpcConnection) -> None:
        assert self.clientid is not None
        args = create_session_args(self.opts, self.clientid, self.create_sequence)
        backoff: Backoff | None = None
        while True:
            try:
                res = await self._sessionless(rpc, nfs4.OP_CREATE_SESSION, args)
                break
            except NfsStatusError as e:
                if after_create_session_error(e.status) is not AfterCreateSession.BACK_OFF:
                    raise
                backoff = backoff or Backoff(deadline=self.opts.delay_deadline)
                delay = backoff.next_delay(self.clock())
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        assert isinstance(res, nfs4.CREATE_SESSION4resok)
        self.create_sequence = (res.csr_sequence + 1) & 0xFFFFFFFF
        self.session = negotiated(self.opts, res)
        self.core.want_backchannel = self.session.backchannel
        self.core.new_session(self.session.slots, self.clock())
        self.backchannel.reset(self.session.sessionid, self.session.back.ca_maxrequests)
        self.stats.sessions += 1
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
        self.core.failed = True
        self._ready.set()  # wake every waiter: they see the failure
        self.slots.wake_all()

    @staticmethod
    def _abort(rpc: RpcConnection) -> None:
        """Drop the connection now, without waiting to flush (the peer may not be reading)."""
        rpc.context["aborted"] = True
        rpc.conn.abort()

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
                self.core.lease_time = float(max(1, int.from_bytes(vals[:4], "big")))

    async def _keeper(self) -> None:
        while True:
            await asyncio.sleep(self.core.keeper_interval(self.opts.probe_interval))
            if not self._ready.is_set() or self._failure is not None:
                continue
            try:
                await self._keep()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep keeping
                log.info("session keeper: %s", e)

    async def _keep(self) -> None:
        """One look: do what the core's keeper says."""
        rpc = self.rpc
        if rpc is None:
            return
        action = self.core.keep(
            self.clock(),
            probe_interval=self.opts.probe_interval,
            call_timeout=self.opts.call_timeout,
        )
        if action is KeepAction.RECONNECT:
            log.warning(
                "a call has waited over %.1f s for its reply; reconnecting", self.opts.call_timeout
            )
            self._reconnect_now(rpc)
        elif action is KeepAction.PING:
            try:
                await self.null(self.opts.probe_timeout)
            except (TimeoutError, RpcError, OSError) as e:
                log.warning("the server does not answer (%s); reconnecting", e)
                self._reconnect_now(rpc)
                return
            self.core.last_ping = self.clock()
        elif action is KeepAction.RENEW:
            self.stats.renewals += 1
            conn_gen = self.core.conn_gen
            try:
                await asyncio.wait_for(self.compound([]), self.opts.probe_timeout)
            except TimeoutError:
                log.warning("lease renewal not answered; reconnecting")
                if conn_gen == self.core.conn_gen:
                    self._reconnect_now(rpc)

    def _reconnect_now(self, rpc: RpcConnection) -> None:
        if rpc is not self.rpc:
            return
        gen = self.core.conn_gen
        self._abort(rpc)
        self._request_repair(Repair.RECONNECT, gen)

    # ------------------------------------------------------------------------------------------
    # Callbacks (``client_callbacks``)

    @property
    def delegations(self) -> dict[bytes, tuple[nfs4.stateid4, bytes]]:
        """Delegations the client holds: stateid.other -> (stateid, filehandle)."""
        return self.callbacks.delegations

    @property
    def recall_hook(self) -> Callable[[Recall], None] | None:
        return self.callbacks.recall_hook

    @recall_hook.setter
    def recall_hook(self, hook: Callable[[Recall], None] | None) -> None:
        self.callbacks.recall_hook = hook

    async def wait_lock_notice(self, fh: bytes, owner: bytes, timeout: float) -> bool:
        """Wait up to ``timeout`` for CB_NOTIFY_LOCK about (fh, lock owner); True if it came."""
        return await self.callbacks.wait_lock_notice(fh, owner, timeout)

    async def return_delegation(self, stateid: nfs4.stateid4, fh: bytes) -> None:
        """DELEGRETURN (errors other than a lost session are ignored: the delegation is gone)."""
        await self.callbacks.return_delegation(stateid, fh)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self._closing:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
