"""The client's side of callbacks under asyncio: answering CB_COMPOUND (the sans-IO
``client_backchannel.Backchannel`` decides the answer), waking a LOCK that waits for
CB_NOTIFY_LOCK, lowering the slot limit on CB_RECALL_SLOT and giving delegations back
(DELEGRETURN) when recalled (RFC 8881 sections 20.2, 20.6, 20.8, 20.11)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from nfsrdma.rpc.server import RpcCall
from nfsrdma.session.client_backchannel import Backchannel, CallbackEvents, Recall
from nfsrdma.session.requester_slots import RequesterSlots
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

log = logging.getLogger(__name__)


class CallbackStats(Protocol):
    callbacks: int
    recalls: int
    lock_notices: int


class Compound(Protocol):
    def __call__(self, ops: list[nfs4.nfs_argop4]) -> Coroutine[Any, Any, nfs4.COMPOUND4res]: ...


def recalls_of(
    events: CallbackEvents, held: dict[bytes, tuple[nfs4.stateid4, bytes]]
) -> list[Recall]:
    """The delegations to give back: those recalled, and every one held on CB_RECALL_ANY."""
    recalls = list(events.recalls)
    if events.recall_any:
        recalls += [Recall(sid, fh, False) for sid, fh in held.values()]
    return recalls


class ClientCallbacks:
    """The back channel of one client session and the delegations it holds."""

    def __init__(
        self,
        backchannel: Backchannel,
        stats: CallbackStats,
        compound: Compound,
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
        slots: Callable[[], RequesterSlots],
    ) -> None:
        self.backchannel = backchannel
        self.stats = stats
        self.compound = compound
        self.spawn = spawn
        self.slots = slots
        # Delegations the client holds: stateid.other -> (stateid, filehandle).
        self.delegations: dict[bytes, tuple[nfs4.stateid4, bytes]] = {}
        self.recall_hook: Callable[[Recall], None] | None = None
        # Called with rsa_target_highest_slotid once CB_RECALL_SLOT has lowered the limit.
        self.slot_recall_hook: Callable[[int], None] | None = None
        self.recall_listeners: list[Callable[[Recall], None]] = []  # e.g. drop cached data
        self._lock_notices: dict[tuple[bytes, bytes], asyncio.Event] = {}
        # CB_OFFLOAD by copy stateid: awaited, or arrived before the COPY's reply (kept).
        self._offloads: dict[bytes, asyncio.Future[nfs4.CB_OFFLOAD4args]] = {}
        self._freeing = False

    def cb_compound(self, call: RpcCall, w: Writer) -> None:
        """The RPC procedure CB_COMPOUND."""
        self.stats.callbacks += 1
        res, events = self.backchannel.handle(call.reader, call.offset)
        nfs4.enc_CB_COMPOUND4res(w, res)
        if events:
            self.spawn(self.act_on(events))

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

    def offload_future(self, stateid: nfs4.stateid4) -> asyncio.Future[nfs4.CB_OFFLOAD4args]:
        """What CB_OFFLOAD says about the asynchronous COPY ``stateid`` (it may have come
        already); ``forget_offload`` when done with it."""
        key = bytes(stateid.other)
        fut = self._offloads.get(key)
        if fut is None:
            fut = self._offloads[key] = asyncio.get_running_loop().create_future()
        return fut

    def forget_offload(self, stateid: nfs4.stateid4) -> None:
        self._offloads.pop(bytes(stateid.other), None)

    async def act_on(self, events: CallbackEvents) -> None:
        for offload in events.offloads:
            fut = self.offload_future(offload.coa_stateid)
            if not fut.done():
                fut.set_result(offload)
        for fh, owner in events.lock_notices:
            waiting = self._lock_notices.get((bytes(fh), bytes(owner)))
            if waiting is not None:
                self.stats.lock_notices += 1
                waiting.set()
        if events.recall_slot is not None:
            self.slots().recall(events.recall_slot)
            if self.slot_recall_hook is not None:
                self.slot_recall_hook(events.recall_slot)
        for recall in recalls_of(events, self.delegations):
            self.stats.recalls += 1
            if self.recall_hook is not None:
                self.recall_hook(recall)
            for listener in self.recall_listeners:
                listener(recall)
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

    async def free_revoked(self) -> None:
        """SEQ4_STATUS_RECALLABLE_STATE_REVOKED (RFC 8881 section 8.5.3 / 18.46.3): find our
        revoked delegations (TEST_STATEID), forget them (listeners drop what was cached under
        them) and FREE_STATEID them, which clears the flag."""
        if self._freeing:
            return
        self._freeing = True
        try:
            held = list(self.delegations.values())
            if not held:
                return
            res = await self.compound(
                [
                    nfs4.nfs_argop4(
                        nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([s for s, _ in held])
                    )
                ]
            )
            value = res.resarray[0].value if res.resarray else None
            if not isinstance(value, nfs4.TEST_STATEID4res) or value.value is None:
                return
            for (stateid, fh), status in zip(held, value.value.tsr_status_codes, strict=False):
                if status == nfs4.NFS4_OK:
                    continue
                self.delegations.pop(stateid.other, None)
                for listener in self.recall_listeners:
                    listener(Recall(stateid, fh, False))
                if status == nfs4.NFS4ERR_DELEG_REVOKED:
                    await self.compound(
                        [nfs4.nfs_argop4(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(stateid))]
                    )
        except OSError as e:
            log.info("freeing revoked delegations failed: %s", e)
        finally:
            self._freeing = False
