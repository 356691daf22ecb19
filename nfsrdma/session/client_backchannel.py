"""The client's side of the back channel: CB_COMPOUND processing, sans-IO (RFC 8881 sections
2.10.6, 20.9, 20.2, 20.8).

The server's callbacks arrive on the client's own connection. CB_SEQUENCE comes first and is
checked against the back-channel slot table (a replay gets the cached reply, a misordered seqid
NFS4ERR_SEQ_MISORDERED); then CB_RECALL (a delegation to give back: the result is OK at once and
DELEGRETURN follows from the client, as RFC 8881 section 20.2.3 describes), CB_RECALL_SLOT (a
lower target for the fore channel's slot table) and CB_RECALL_ANY are turned into
``CallbackEvents`` for the driver; other callbacks get NFS4ERR_NOTSUPP.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Any

from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, XdrError

_HEAD = struct.Struct(">III")  # minorversion, callback_ident, count


@dataclass(slots=True)
class Recall:
    stateid: nfs4.stateid4
    fh: bytes
    truncate: bool


@dataclass(slots=True)
class CallbackEvents:
    """What the driver must do after answering a CB_COMPOUND."""

    recalls: list[Recall] = field(default_factory=list)
    recall_slot: int | None = None  # new target highest slot id for the fore channel
    recall_any: bool = False
    lock_notices: list[tuple[bytes, bytes]] = field(default_factory=list)  # (fh, lock owner)

    def __bool__(self) -> bool:
        return (
            bool(self.recalls)
            or self.recall_slot is not None
            or self.recall_any
            or bool(self.lock_notices)
        )


@dataclass(slots=True)
class _CbSlot:
    seqid: int = 0  # the last seqid seen; a new request carries seqid + 1
    reply: nfs4.CB_COMPOUND4res | None = None


def _error_result(op: int, status: int) -> Any:
    dec = nfs4._nfs_cb_resop4_DEC.get(op, nfs4.dec_CB_ILLEGAL4res)
    cls = getattr(nfs4, dec.__name__.removeprefix("dec_"))
    if len(dataclasses.fields(cls)) == 1:
        return cls(status)
    return cls(status, None)


class Backchannel:
    """Back-channel slots of one session and the processing of its CB_COMPOUNDs."""

    def __init__(self, sessionid: bytes = b"", slots: int = 1) -> None:
        self.sessionid = sessionid
        self.slots = [_CbSlot() for _ in range(max(1, slots))]
        self.calls = 0

    def reset(self, sessionid: bytes, slots: int) -> None:
        """A new session: fresh slots."""
        self.sessionid = sessionid
        self.slots = [_CbSlot() for _ in range(max(1, slots))]

    def handle(self, r: Reader, off: int) -> tuple[nfs4.CB_COMPOUND4res, CallbackEvents]:
        """Process CB_COMPOUND4args from ``r`` at ``off``. Raises XdrError when not even the
        header decodes (the RPC layer answers GARBAGE_ARGS)."""
        self.calls += 1
        tag, off = nfs4.dec_utf8str_cs(r, off)
        if off + _HEAD.size > len(r.buf):
            raise XdrError("truncated CB_COMPOUND header", off)
        minor, _ident, count = _HEAD.unpack_from(r.buf, off)
        off += _HEAD.size
        events = CallbackEvents()
        res = nfs4.CB_COMPOUND4res(nfs4.NFS4_OK, tag, [])
        if minor != 1:
            res.status = nfs4.NFS4ERR_MINOR_VERS_MISMATCH
            return res, events
        slot: _CbSlot | None = None
        cachethis = False
        for i in range(count):
            try:
                argop, off = nfs4.dec_nfs_cb_argop4(r, off)
            except XdrError:
                self._append(res, nfs4.OP_CB_ILLEGAL, nfs4.CB_ILLEGAL4res(nfs4.NFS4ERR_OP_ILLEGAL))
                break
            op = argop.argop
            if op == nfs4.OP_CB_SEQUENCE:
                if i != 0:
                    self._append(res, op, _error_result(op, nfs4.NFS4ERR_SEQUENCE_POS))
                    break
                assert isinstance(argop.value, nfs4.CB_SEQUENCE4args)
                seq_res, slot, retry_of = self._sequence(argop.value)
                if retry_of is not None:
                    if retry_of.reply is not None:
                        return retry_of.reply, CallbackEvents()
                    # A retry of a request whose reply was not kept (RFC 8881 2.10.6.1.3).
                    self._append(res, op, seq_res)
                    if i + 1 < count:
                        nxt = self._peek_op(r, off)
                        self._append(res, nxt, _error_result(nxt, nfs4.NFS4ERR_RETRY_UNCACHED_REP))
                    return res, CallbackEvents()
                self._append(res, op, seq_res)
                if seq_res.csr_status != nfs4.NFS4_OK:
                    break
                cachethis = argop.value.csa_cachethis
                continue
            if i == 0:
                self._append(res, op, _error_result(op, nfs4.NFS4ERR_OP_NOT_IN_SESSION))
                break
            result = self._operation(op, argop.value, events)
            self._append(res, op, result)
            if res.status != nfs4.NFS4_OK:
                break
        if slot is not None:
            slot.reply = res if cachethis else None
        return res, events

    @staticmethod
    def _peek_op(r: Reader, off: int) -> int:
        if off + 4 > len(r.buf):
            return int(nfs4.OP_CB_ILLEGAL)
        (op,) = struct.unpack_from(">I", r.buf, off)
        return op if op in nfs4._nfs_cb_resop4_DEC else int(nfs4.OP_CB_ILLEGAL)

    # -- pieces --------------------------------------------------------------------------------
    @staticmethod
    def _append(res: nfs4.CB_COMPOUND4res, op: int, result: Any) -> None:
        res.resarray.append(nfs4.nfs_cb_resop4(op, result))
        # Every callback result starts with its nfsstat4, whatever the field is called.
        res.status = getattr(result, dataclasses.fields(result)[0].name)

    def _sequence(
        self, a: nfs4.CB_SEQUENCE4args
    ) -> tuple[nfs4.CB_SEQUENCE4res, _CbSlot | None, _CbSlot | None]:
        """(result, the slot of a new request, the slot of a retry)."""

        def fail(status: nfs4.nfsstat4) -> tuple[nfs4.CB_SEQUENCE4res, None, None]:
            return nfs4.CB_SEQUENCE4res(status), None, None

        if a.csa_sessionid != self.sessionid:
            return fail(nfs4.NFS4ERR_BADSESSION)
        if a.csa_slotid >= len(self.slots):
            return fail(nfs4.NFS4ERR_BADSLOT)
        slot = self.slots[a.csa_slotid]
        ok = nfs4.CB_SEQUENCE4res(
            nfs4.NFS4_OK,
            nfs4.CB_SEQUENCE4resok(
                self.sessionid,
                a.csa_sequenceid,
                a.csa_slotid,
                len(self.slots) - 1,
                len(self.slots) - 1,
            ),
        )
        if a.csa_sequenceid == slot.seqid and slot.seqid != 0:
            return ok, None, slot
        if a.csa_sequenceid != (slot.seqid + 1) & 0xFFFFFFFF:
            return fail(nfs4.NFS4ERR_SEQ_MISORDERED)
        slot.seqid = a.csa_sequenceid
        slot.reply = None
        return ok, slot, None

    @staticmethod
    def _operation(op: int, args: Any, events: CallbackEvents) -> Any:
        if op == nfs4.OP_CB_RECALL:
            assert isinstance(args, nfs4.CB_RECALL4args)
            events.recalls.append(Recall(args.stateid, args.fh, args.truncate))
            return nfs4.CB_RECALL4res(nfs4.NFS4_OK)
        if op == nfs4.OP_CB_RECALL_SLOT:
            assert isinstance(args, nfs4.CB_RECALL_SLOT4args)
            events.recall_slot = args.rsa_target_highest_slotid
            return nfs4.CB_RECALL_SLOT4res(nfs4.NFS4_OK)
        if op == nfs4.OP_CB_RECALL_ANY:
            events.recall_any = True
            return nfs4.CB_RECALL_ANY4res(nfs4.NFS4_OK)
        if op == nfs4.OP_CB_NOTIFY_LOCK:
            # A lock we were refused may be free now (RFC 8881 20.11): retry at once.
            assert isinstance(args, nfs4.CB_NOTIFY_LOCK4args)
            events.lock_notices.append((args.cnla_fh, args.cnla_lock_owner.owner))
            return nfs4.CB_NOTIFY_LOCK4res(nfs4.NFS4_OK)
        if op == nfs4.OP_CB_ILLEGAL:
            return nfs4.CB_ILLEGAL4res(nfs4.NFS4ERR_OP_ILLEGAL)
        return _error_result(op, nfs4.NFS4ERR_NOTSUPP)
