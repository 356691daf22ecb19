"""The client's side of the back channel: CB_COMPOUND processing, sans-IO (RFC 8881 sections
2.10.6, 20.9, 20.2, 20.8).

The server's callbacks arrive on the client's own connection. CB_SEQUENCE comes first and is
checked against the back-channel slot table (the responder's table, ``slots.ResponderSlots``,
the same the server uses for its fore channel) (a replay gets the cached reply, a misordered seqid
NFS4ERR_SEQ_MISORDERED); then CB_RECALL (a delegation to give back: the result is OK at once and
DELEGRETURN follows from the client, as RFC 8881 section 20.2.3 describes), CB_RECALL_SLOT (a
lower target for the fore channel's slot table) and CB_RECALL_ANY are turned into
``CallbackEvents`` for the driver; CB_GETATTR is answered from ``delegated_attrs`` when the
driver set it; other callbacks get NFS4ERR_NOTSUPP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nfsrdma.session.errors import SessionError
from nfsrdma.session.slots import Disposition, ResponderSlot, ResponderSlots
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, Writer, XdrError

# A reply is cached whenever the server asks (csa_cachethis), whatever its size.
_CACHE_ANY = 1 << 62


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
    offloads: list[nfs4.CB_OFFLOAD4args] = field(default_factory=list)  # asynchronous COPYs

    def __bool__(self) -> bool:
        return (
            bool(self.recalls)
            or bool(self.offloads)
            or self.recall_slot is not None
            or self.recall_any
            or bool(self.lock_notices)
        )


@dataclass(slots=True)
class CachedCallbackReply:
    """A CB_COMPOUND4res kept in the back channel's reply cache, with its encoded size."""

    res: nfs4.CB_COMPOUND4res
    size: int

    @classmethod
    def of(cls, res: nfs4.CB_COMPOUND4res) -> CachedCallbackReply:
        w = Writer()
        nfs4.enc_CB_COMPOUND4res(w, res)
        return cls(res, len(w))


_CbSlot = ResponderSlot[CachedCallbackReply]


def _error_result(op: int, status: int) -> Any:
    """The result of callback operation ``op`` (CB_ILLEGAL when unknown) for an error status."""
    return nfs4.CB_OPERATIONS.get(op, nfs4.CB_OPERATION_ILLEGAL).error(status)


class Backchannel:
    """Back-channel slots of one session and the processing of its CB_COMPOUNDs."""

    def __init__(self, sessionid: bytes = b"", slots: int = 1) -> None:
        self.sessionid = sessionid
        self.slots: ResponderSlots[CachedCallbackReply] = ResponderSlots(max(1, slots), _CACHE_ANY)
        self.calls = 0
        # CB_GETATTR (RFC 8881 20.1): (change, size) of a file we hold a write delegation on,
        # as we see it (with our unwritten changes); None: no such delegation (BADHANDLE).
        self.delegated_attrs: Callable[[bytes], tuple[int, int] | None] | None = None

    def reset(self, sessionid: bytes, slots: int) -> None:
        """A new session: fresh slots."""
        self.sessionid = sessionid
        self.slots = ResponderSlots(max(1, slots), _CACHE_ANY)

    def handle(self, r: Reader, off: int) -> tuple[nfs4.CB_COMPOUND4res, CallbackEvents]:
        """Process CB_COMPOUND4args from ``r`` at ``off``. Raises XdrError when not even the
        header decodes (the RPC layer answers GARBAGE_ARGS)."""
        self.calls += 1
        tag, off = nfs4.dec_utf8str_cs(r, off)
        minor, off = nfs4.dec_uint32_t(r, off)
        _ident, off = nfs4.dec_uint32_t(r, off)
        count, off = nfs4.dec_uint32_t(r, off)
        events = CallbackEvents()
        res = nfs4.CB_COMPOUND4res(nfs4.NFS4_OK, tag, [])
        if minor not in (1, 2):
            res.status = nfs4.NFS4ERR_MINOR_VERS_MISMATCH
            return res, events
        slot: _CbSlot | None = None
        cachethis = False
        try:
            for i in range(count):
                try:
                    argop, off = nfs4.dec_nfs_cb_argop4(r, off)
                except XdrError:
                    self._append(
                        res, nfs4.OP_CB_ILLEGAL, nfs4.CB_ILLEGAL4res(nfs4.NFS4ERR_OP_ILLEGAL)
                    )
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
                            return retry_of.reply.res, CallbackEvents()
                        # A retry of a request whose reply was not kept (RFC 8881 2.10.6.1.3).
                        self._append(res, op, seq_res)
                        if i + 1 < count:
                            nxt = self._peek_op(r, off)
                            self._append(
                                res, nxt, _error_result(nxt, nfs4.NFS4ERR_RETRY_UNCACHED_REP)
                            )
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
        finally:
            if slot is not None:
                reply = CachedCallbackReply.of(res) if cachethis else None
                self.slots.complete(slot, slot.seqid, reply)
        return res, events

    @staticmethod
    def _peek_op(r: Reader, off: int) -> int:
        try:
            op, _ = nfs4.dec_nfs_cb_opnum4(r, off)
        except XdrError:
            return int(nfs4.OP_CB_ILLEGAL)
        return int(op)

    # -- pieces --------------------------------------------------------------------------------
    @staticmethod
    def _append(res: nfs4.CB_COMPOUND4res, op: int, result: Any) -> None:
        res.resarray.append(nfs4.nfs_cb_resop4(op, result))
        res.status = nfs4.nfsstat4(
            nfs4.CB_OPERATIONS.get(op, nfs4.CB_OPERATION_ILLEGAL).status_of(result)
        )

    def _sequence(
        self, a: nfs4.CB_SEQUENCE4args
    ) -> tuple[nfs4.CB_SEQUENCE4res, _CbSlot | None, _CbSlot | None]:
        """(result, the slot of a new request, the slot of a retry)."""

        def fail(status: nfs4.nfsstat4) -> tuple[nfs4.CB_SEQUENCE4res, None, None]:
            return nfs4.CB_SEQUENCE4res(status), None, None

        if a.csa_sessionid != self.sessionid:
            return fail(nfs4.NFS4ERR_BADSESSION)
        highest = self.slots.highest_slotid
        try:
            slot, disposition = self.slots.classify(a.csa_slotid, a.csa_sequenceid)
        except SessionError as e:
            return fail(nfs4.nfsstat4(e.status))
        ok = nfs4.CB_SEQUENCE4res(
            nfs4.NFS4_OK,
            nfs4.CB_SEQUENCE4resok(
                self.sessionid, a.csa_sequenceid, a.csa_slotid, highest, highest
            ),
        )
        if disposition is not Disposition.NEW:
            return ok, None, slot
        self.slots.begin(slot, a.csa_sequenceid)
        return ok, slot, None

    def _operation(self, op: int, args: Any, events: CallbackEvents) -> Any:
        if op == nfs4.OP_CB_GETATTR and self.delegated_attrs is not None:
            assert isinstance(args, nfs4.CB_GETATTR4args)
            return cb_getattr_result(args, self.delegated_attrs(bytes(args.fh)))
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
        if op == nfs4.OP_CB_OFFLOAD:
            # The end of an asynchronous COPY (RFC 7862 section 16.1).
            assert isinstance(args, nfs4.CB_OFFLOAD4args)
            events.offloads.append(args)
            return nfs4.CB_OFFLOAD4res(nfs4.NFS4_OK)
        if op == nfs4.OP_CB_ILLEGAL:
            return nfs4.CB_ILLEGAL4res(nfs4.NFS4ERR_OP_ILLEGAL)
        return _error_result(op, nfs4.NFS4ERR_NOTSUPP)


_CHANGE_SIZE_MASK = (1 << nfs4.FATTR4_CHANGE) | (1 << nfs4.FATTR4_SIZE)


def cb_getattr_result(
    args: nfs4.CB_GETATTR4args, attrs: tuple[int, int] | None
) -> nfs4.CB_GETATTR4res:
    """The answer to CB_GETATTR: change and size (those asked for, both in word 0) of a file
    under our write delegation; NFS4ERR_BADHANDLE when we hold none on it (section 20.1.3)."""
    if attrs is None:
        return nfs4.CB_GETATTR4res(nfs4.NFS4ERR_BADHANDLE)
    asked = args.attr_request[0] & _CHANGE_SIZE_MASK if args.attr_request else 0
    change, size = attrs
    values = b""
    if asked & (1 << nfs4.FATTR4_CHANGE):
        values += change.to_bytes(8, "big")
    if asked & (1 << nfs4.FATTR4_SIZE):
        values += size.to_bytes(8, "big")
    mask = [asked] if asked else []
    return nfs4.CB_GETATTR4res(nfs4.NFS4_OK, nfs4.CB_GETATTR4resok(nfs4.fattr4(mask, values)))
