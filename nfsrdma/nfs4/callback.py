"""The server's callbacks: CB_COMPOUND on a client's back channel (RFC 8881 sections 2.10.3.1,
20). Each starts with CB_SEQUENCE on a slot of the session's back-channel table; the call goes
on the connection the client bound for the back channel — over RPC-over-RDMA that is the
client's own connection (RFC 8167, UL-22).

Callbacks are advisory here (CB_NOTIFY_LOCK): one that cannot be delivered marks the back
channel as down (reported to the client through SEQ4_STATUS_CB_PATH_DOWN) and is dropped."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.errors import RpcError
from nfsrdma.session.backchannel import BackchannelSlots
from nfsrdma.session.server import ServerSessions, SlotRecall
from nfsrdma.session.slot_wait import slot_signal
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import Writer, XdrError, pack

log = logging.getLogger(__name__)

CB_VERSION = 1


def _credential(parms: nfs4.callback_sec_parms4) -> rpc.opaque_auth:
    if parms.cb_secflavor == rpc.AUTH_SYS and isinstance(parms.value, nfs4.authsys_parms):
        p = parms.value
        body = rpc.authsys_parms(p.stamp, p.machinename, p.uid, p.gid, list(p.gids))
        return rpc.opaque_auth(rpc.AUTH_SYS, pack(rpc.enc_authsys_parms, body))
    return rpc.opaque_auth(rpc.AUTH_NONE, b"")


@dataclass
class Callbacks:
    sessions: ServerSessions
    timeout: float = 15.0
    slot_wait: float = 5.0
    tasks: set[asyncio.Task[nfs4.CB_COMPOUND4res | None]] = field(default_factory=set)
    sent: int = 0
    failed: int = 0

    async def compound(
        self,
        clientid: int,
        ops: list[nfs4.nfs_cb_argop4],
        sessionid: bytes | None = None,
    ) -> nfs4.CB_COMPOUND4res | None:
        """Send CB_SEQUENCE + ``ops`` to the client (on that session's back channel, when
        ``sessionid`` is given); None when it cannot be reached. The CB_COMPOUND's minor
        version is the client's (that of its EXCHANGE_ID)."""
        path = self.sessions.callback_path(clientid, sessionid)
        if path is None:
            return None
        session, conn = path
        if not isinstance(conn, RpcConnection):
            return None
        seq = await self._slot(session.backchannel)
        if seq is None:
            return None
        args = nfs4.CB_COMPOUND4args(
            tag=b"",
            minorversion=session.client.minorversion,
            callback_ident=0,
            argarray=[nfs4.nfs_cb_argop4(nfs4.OP_CB_SEQUENCE, seq), *ops],
        )

        def encode(w: Writer) -> None:
            nfs4.enc_CB_COMPOUND4args(w, args)

        status: int | None = None
        resok: nfs4.CB_SEQUENCE4resok | None = None
        try:
            result = await conn.call(
                session.cb_program,
                CB_VERSION,
                nfs4.CB_COMPOUND,
                encode,
                cred=_credential(session.cb_security),
                timeout=self.timeout,
            )
            res, _ = nfs4.dec_CB_COMPOUND4res(result.reader, result.offset)
        except (RpcError, XdrError, ConnectionError) as e:
            log.info("callback to client %#x failed: %s", clientid, e)
            self.failed += 1
            session.backchannel.release(seq.csa_slotid, None)
            self.sessions.backchannel_failed(session)
            return None
        first = res.resarray[0].value if res.resarray else None
        if isinstance(first, nfs4.CB_SEQUENCE4res):
            status = first.csr_status
            if isinstance(first.value, nfs4.CB_SEQUENCE4resok):
                resok = first.value
        session.backchannel.release(seq.csa_slotid, status, resok)
        self.sent += 1
        names = "+".join(nfs4.nfs_cb_opnum4(op.argop).name for op in args.argarray)
        log.info(
            "callback %s to client %#x over %s: %s",
            names,
            clientid,
            conn.conn.kind,
            nfs4.nfsstat4(res.status).name,
        )
        return res

    async def _slot(self, slots: BackchannelSlots) -> nfs4.CB_SEQUENCE4args | None:
        """A back-channel slot: at once, or when the table signals a release, for up to
        ``slot_wait`` seconds; None when none came free."""
        seq = slots.acquire()
        if seq is not None:
            return seq
        try:
            async with asyncio.timeout(self.slot_wait):
                while seq is None:
                    await slot_signal(slots.table)
                    seq = slots.acquire()
        except TimeoutError:
            return None
        return seq

    def notify_lock(self, clientid: int, fh: bytes, owner: nfs4.lock_owner4) -> None:
        """CB_NOTIFY_LOCK (RFC 8881 section 20.11): the lock the client was refused may now be
        available, so it can retry at once instead of polling. Fire and forget."""
        op = nfs4.nfs_cb_argop4(nfs4.OP_CB_NOTIFY_LOCK, nfs4.CB_NOTIFY_LOCK4args(fh, owner))
        task = asyncio.get_running_loop().create_task(self.compound(clientid, [op]))
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def recall_slot(self, recall: SlotRecall) -> None:
        """CB_RECALL_SLOT (RFC 8881 section 20.8) on the session whose fore channel is to
        shrink, as the session layer's pressure decision asks. Fire and forget: the server
        takes the slots back only once the client's SEQUENCEs show it stopped using them."""
        args = nfs4.CB_RECALL_SLOT4args(recall.target_highest_slotid)
        op = nfs4.nfs_cb_argop4(nfs4.OP_CB_RECALL_SLOT, args)
        coro = self.compound(recall.clientid, [op], recall.sessionid)
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def recall(self, clientid: int, stateid: nfs4.stateid4, fh: bytes) -> None:
        """CB_RECALL (RFC 8881 section 20.2): give the delegation back. Fire and forget: an
        undelivered recall is settled by revocation after a lease period."""
        args = nfs4.CB_RECALL4args(stateid, False, fh)
        op = nfs4.nfs_cb_argop4(nfs4.OP_CB_RECALL, args)
        task = asyncio.get_running_loop().create_task(self.compound(clientid, [op]))
        self.tasks.add(task)
        task.add_done_callback(self._done)

    async def offload(
        self, clientid: int, fh: bytes, stateid: nfs4.stateid4, info: nfs4.offload_info4
    ) -> bool:
        """CB_OFFLOAD (RFC 7862 section 16.1): an asynchronous COPY into ``fh`` ended; whether
        the client answered NFS4_OK."""
        args = nfs4.CB_OFFLOAD4args(fh, stateid, info)
        op = nfs4.nfs_cb_argop4(nfs4.OP_CB_OFFLOAD, args)
        res = await self.compound(clientid, [op])
        return res is not None and res.status == nfs4.NFS4_OK

    async def getattr(
        self, clientid: int, fh: bytes, attr_request: list[int]
    ) -> nfs4.fattr4 | None:
        """CB_GETATTR (RFC 8881 section 20.1): the holder of a write delegation's view of the
        file's attributes; None when it cannot say."""
        args = nfs4.CB_GETATTR4args(fh, attr_request)
        res = await self.compound(clientid, [nfs4.nfs_cb_argop4(nfs4.OP_CB_GETATTR, args)])
        if res is None or res.status != nfs4.NFS4_OK or len(res.resarray) < 2:
            return None
        value = res.resarray[1].value
        if isinstance(value, nfs4.CB_GETATTR4res) and value.value is not None:
            return value.value.obj_attributes
        return None

    async def probe(self, clientid: int) -> bool:
        """CB_NULL on the client's back channel (section 18.36.3: the server checks the path
        before relying on it); a failure marks the path down (SEQ4_STATUS_CB_PATH_DOWN)."""
        path = self.sessions.callback_path(clientid)
        if path is None:
            return False
        session, conn = path
        if not isinstance(conn, RpcConnection):
            return False
        try:
            await conn.call(
                session.cb_program,
                CB_VERSION,
                0,
                cred=_credential(session.cb_security),
                timeout=self.timeout,
            )
        except (RpcError, XdrError, ConnectionError) as e:
            log.info("CB_NULL to client %#x failed: %s", clientid, e)
            self.sessions.backchannel_failed(session)
            return False
        return True

    def _done(self, task: asyncio.Task[nfs4.CB_COMPOUND4res | None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("callback task failed: %r", task.exception())

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
