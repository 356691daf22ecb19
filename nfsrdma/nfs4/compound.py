"""COMPOUND processing (RFC 8881 sections 2.6.3, 15.2, 16.2).

Operations are decoded one at a time and run in order; processing stops at the first
failure, whose status becomes the COMPOUND's. Results are encoded as they are produced, so the
reply's size is known at every step (NFS4ERR_REP_TOO_BIG / REP_TOO_BIG_TO_CACHE).

Session rules enforced here: SEQUENCE only first (NFS4ERR_SEQUENCE_POS); without SEQUENCE,
only EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION, DESTROY_CLIENTID and BIND_CONN_TO_SESSION,
each alone (NFS4ERR_NOT_ONLY_OP); anything else NFS4ERR_OP_NOT_IN_SESSION. A SEQUENCE that
finds a retry sends the cached reply, re-framed for the current transport.

Minor versions 1 and 2 are served (anything else: NFS4ERR_MINOR_VERS_MISMATCH); the COMPOUND's
decides which operations exist, so an NFSv4.2 operation in a minor version 1 COMPOUND is
NFS4ERR_OP_ILLEGAL.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable
from dataclasses import dataclass
from inspect import isawaitable
from time import monotonic  # (a module global, which tests replace, in both builds)
from typing import TYPE_CHECKING, Any

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error, Outcome
from nfsrdma.nfs4.errors import status_of
from nfsrdma.nfs4.ops import HANDLERS
from nfsrdma.nfs4.ops.attributes import getattr_values
from nfsrdma.nfs4.ops.filehandle import put_fh
from nfsrdma.nfs4.ops.io import read_data
from nfsrdma.nfs4.ops.lookup import PUT_FH_OPS, flavour_asked, wrong_security
from nfsrdma.rpc.auth import Credential, pseudoflavor_of
from nfsrdma.session.errors import SessionError
from nfsrdma.vfs.base import Cred, Origin
from nfsrdma.vfs.confine import close_window, open_window
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Buffer, DdpItem, Operation, Reader, Writer, XdrError, pack

if TYPE_CHECKING:
    from nfsrdma.nfs4.server_state import ServerState
    from nfsrdma.rpc.server import RpcCall

log = logging.getLogger(__name__)

MINOR_VERSIONS = frozenset({1, 2})  # NFSv4.1, and NFSv4.2 (RFC 7862) beside it
LAST_V41_OP = nfs4.nfs_opnum4.OP_RECLAIM_COMPLETE  # operations above it exist from NFSv4.2 on
SESSIONLESS_OPS = frozenset(
    {
        nfs4.nfs_opnum4.OP_EXCHANGE_ID,
        nfs4.nfs_opnum4.OP_CREATE_SESSION,
        nfs4.nfs_opnum4.OP_DESTROY_SESSION,
        nfs4.nfs_opnum4.OP_DESTROY_CLIENTID,
        nfs4.nfs_opnum4.OP_BIND_CONN_TO_SESSION,
    }
)
READ_CLASS_OPS = frozenset(
    {nfs4.nfs_opnum4.OP_READ, nfs4.nfs_opnum4.OP_READLINK}
)  # RFC 8267 section 6.4.1
# Every operation of the specification, by number (a table of different operations).
_OPERATIONS: dict[int, Operation[Any, Any]] = nfs4.OPERATIONS
_ILLEGAL = nfs4.OPERATION_ILLEGAL
_SEQUENCE = nfs4.OPERATION_SEQUENCE
_STATUS_COUNT = struct.Struct(">I")


@dataclass(slots=True)
class EncodedReply:
    """A COMPOUND4res as encoded: its bytes and its DDP-eligible items (for the reply cache,
    which must be able to re-frame a replay with the retried request's chunks)."""

    data: bytes
    ddp: list[DdpItem]

    @property
    def size(self) -> int:
        return len(self.data) + sum(i.padded_length for i in self.ddp)

    def append_to(self, w: Writer) -> None:
        base = len(w)
        w += self.data
        w.ddp.extend(DdpItem(base + i.offset, i.data, i.tag) for i in self.ddp)


# Whether a handler's outcome must be awaited, by its type: a result of the specification's
# types is not, a coroutine or future is (asked once per type; a dict lookup afterwards).
_AWAIT_BY_TYPE: dict[type, bool] = {}


def _must_wait(outcome: object) -> bool:
    kind = type(outcome)
    wait = _AWAIT_BY_TYPE.get(kind)
    if wait is None:
        wait = isawaitable(outcome)
        if len(_AWAIT_BY_TYPE) < 256 and kind.__name__ != "generator":
            _AWAIT_BY_TYPE[kind] = wait
    return wait


# Fast paths: the COMPOUNDs the Linux client sends most begin SEQUENCE, PUTFH, then one of
# these. Such a prefix is recognised from the operation numbers alone (SEQUENCE's arguments
# have a fixed size, PUTFH's are one opaque), and its operations run without the generic
# lookups and position checks, which cannot fail there; the rest of the COMPOUND, if any, and
# every other COMPOUND take the generic path, which is the reference (a property test compares
# the two byte for byte). Results of both are recorded by ``_Run._record``, the one place, and
# the flavour rules (NFS4ERR_WRONGSEC) of both are asked of ops/lookup.py ``wrong_security``
# (its table: ``FLAVOUR_RULES``) about each operation in ``_Run.flavour_asked``: before it
# runs, or for a put-filehandle operation (``PUT_FH_OPS``) once it has put its filehandle.
FAST_PATHS = True
# The third operation may be any NFSv4.1 operation this server has (OPEN, CLOSE, REMOVE,
# ... too: the Linux client's create, stat and remove), but SEQUENCE (out of place there):
# once SEQUENCE has succeeded, none of them can be out of place at position 2 either. Nor a
# put-filehandle operation: its flavour rule is asked after it has put its filehandle, which
# only the generic path does.
_FAST_THIRD = tuple(
    n
    for n in sorted(HANDLERS)
    if n <= LAST_V41_OP
    and n not in (nfs4.nfs_opnum4.OP_SEQUENCE, nfs4.nfs_opnum4.OP_ILLEGAL)
    and n not in PUT_FH_OPS
)
_SEQUENCE_ARGS_SIZE = 32  # sessionid (16), sequenceid, slotid, highest_slotid, cachethis
_Step = tuple[Operation[Any, Any], Any]  # an operation and its handler
_FAST_STEPS: dict[int, tuple[_Step, _Step, _Step]] = {
    third: tuple(  # type: ignore[misc]
        (HANDLERS[n].op, HANDLERS[n].handler)
        for n in (nfs4.nfs_opnum4.OP_SEQUENCE, nfs4.nfs_opnum4.OP_PUTFH, third)
    )
    for third in _FAST_THIRD
}
_OPNUM_LEN = struct.Struct(">II")
_PUTFH_RESULT = nfs4.PUTFH4res(nfs4.NFS4_OK)
_UNTAGGED_ARGS_HEAD = struct.Struct(">III")  # COMPOUND4args: tag length 0, minorversion, count
_UNTAGGED_HEAD = pack(nfs4.enc_COMPOUND4res_head, nfs4.COMPOUND4res_head(nfs4.NFS4_OK, b"", 0))
# conn.context key of the connection's last (RPC credential, file-system identity) pair
_CRED_MEMO = "nfs4.compound.cred"
# SEQUENCE's nfs_resop4 on success: operation, status, then SEQUENCE4resok (RFC 8881 18.46)
_SEQUENCE_OK = struct.Struct(">II16sIIIII")
# SEQUENCE4args (RFC 8881 18.46): sessionid, sequenceid, slotid, highest_slotid, cachethis
_SEQUENCE_ARGS = struct.Struct(">16sIIII")
_SEQUENCE4res = nfs4.SEQUENCE4res
_PUTFH = int(nfs4.nfs_opnum4.OP_PUTFH)  # (through the enum: mypyc, "The compiled build")
_PUTFH_OK = _OPNUM_LEN.pack(_PUTFH, nfs4.NFS4_OK)  # PUTFH's nfs_resop4 on success
# GETATTR's nfs_resop4 on success up to the attribute values: operation, status, the bitmap
# (count and words), the values' length; by the bitmap's word count (RFC 8881 18.7)
_GETATTR = int(nfs4.nfs_opnum4.OP_GETATTR)
_GETATTR4res = nfs4.GETATTR4res
_GETATTR_OK = tuple(struct.Struct(f">III{n}II") for n in range(5))
_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")  # XDR padding after n octets, by n % 4
_READ = int(nfs4.nfs_opnum4.OP_READ)
_READ_ARGS = struct.Struct(">I12sQI")  # READ4args: stateid (seqid, other), offset, count
# READ's nfs_resop4 on success up to its data: operation, status, eof, the data's length
# (RFC 8881 18.22); the data follows as a DDP item
_READ_OK = struct.Struct(">IiII")
_READ4res = nfs4.READ4res
_READ4resok = nfs4.READ4resok
_stateid4 = nfs4.stateid4
_BITMAPS = tuple(struct.Struct(f">{n}I") for n in range(5))  # bitmap4's words, by count


def _fast_steps(r: Reader, off: int, count: int) -> tuple[_Step, _Step, _Step] | None:
    """The steps of a fast-path prefix starting at ``off``, or None."""
    if count < 3:
        return None
    buf = r.buf
    putfh = off + 4 + _SEQUENCE_ARGS_SIZE
    if putfh + 8 > len(buf):
        return None
    (first,) = _STATUS_COUNT.unpack_from(buf, off)
    opnum, n = _OPNUM_LEN.unpack_from(buf, putfh)
    if first != nfs4.OP_SEQUENCE or opnum != nfs4.OP_PUTFH or n > nfs4.NFS4_FHSIZE:
        return None
    third = putfh + 8 + n + (-n & 3)
    if third + 4 > len(buf):
        return None
    return _FAST_STEPS.get(_STATUS_COUNT.unpack_from(buf, third)[0])


def cred_of(server: ServerState, call: RpcCall) -> Cred:
    c = call.cred
    context = call.conn.context
    memo: Any = context.get(_CRED_MEMO)  # the connection's last caller (shared credentials)
    if memo is not None:
        known: tuple[Credential, Cred] = memo  # (not typing.cast: a subscript at every call)
        last, cred = known
        if last is c:
            return cred
    origin = Origin(call.conn.peer, pseudoflavor_of(c), call.conn.conn.kind)  # export rules
    if c.uid is None or c.gid is None:
        anon = server.vfs.export.anonymous_cred()
        return Cred(anon.uid, anon.gid, anon.gids, origin)
    cred = Cred(c.uid, c.gid, c.gids, origin)
    context[_CRED_MEMO] = (c, cred)
    return cred


def compound(server: ServerState, call: RpcCall, w: Writer) -> Awaitable[None] | None:
    """NFSPROC4_COMPOUND: decode, run and encode; the RPC reply header is already in ``w``.

    Operations run synchronously as far as they can; only when one has to wait (file I/O in
    the thread pool) does the rest continue as a coroutine, which is then returned for the
    RPC layer to await. Raises XdrError when not even the COMPOUND header decodes (the
    caller answers GARBAGE_ARGS)."""
    r = call.reader
    buf, offset = r.buf, call.offset
    head = len(w)
    tag_length = -1
    if offset + 12 <= len(buf):
        tag_length, minorversion, count = _UNTAGGED_ARGS_HEAD.unpack_from(buf, offset)
    if tag_length == 0:  # untagged (the Linux client's): the reply's head is a constant
        off = offset + 12
        w += _UNTAGGED_HEAD
    else:
        head_args, off = nfs4.peek_COMPOUND4args(r, offset)
        tag, minorversion, count = head_args.tag, head_args.minorversion, head_args.argarray
        nfs4.enc_COMPOUND4res_head(w, nfs4.COMPOUND4res_head(nfs4.NFS4_OK, tag, 0))
        try:
            tag.decode("utf-8")
        except UnicodeDecodeError:
            if minorversion in MINOR_VERSIONS:
                _patch(w, head, len(w) - 4, nfs4.NFS4ERR_INVAL, 0)
                return None
    count_at = len(w) - 4  # status and count are set when the COMPOUND ends (_patch)
    if minorversion not in MINOR_VERSIONS:
        _patch(w, head, count_at, nfs4.NFS4ERR_MINOR_VERS_MISMATCH, 0)
        return None
    if count * 4 > len(buf) - off:
        raise XdrError(f"{count} operations cannot fit in the request", off - 4)
    ctx = CompoundContext(  # (positional: cheaper than keywords)
        server,
        cred_of(server, call),
        call.cred,
        call.conn,
        monotonic(),
        count,
        0,
        _request_size(r, offset) if r.chunks else len(buf) - offset,
        None,
        None,
        None,
        None,
        None,
        None,
        False,
        minorversion,
        call.inbound,
    )
    return _Run(ctx, r, off, w, head, count_at).run()


def _request_size(r: Reader, offset: int) -> int:
    """The COMPOUND's XDR-encoded size, as ca_maxrequestsize counts it (RFC 8881 section
    18.36.3): what came inline plus what came by Read chunks (their XDR padding included)."""
    size = len(r.buf) - offset
    if r.chunks:
        size += sum((len(c) + 3) & ~3 for c in r.chunks.values())
    return size


class _Run:
    """One COMPOUND in progress: the operations left, and the reply so far."""

    __slots__ = (
        "count_at",
        "ctx",
        "ddp_bytes",
        "ddp_items",
        "done",
        "flavour_asked",
        "head",
        "i",
        "off",
        "r",
        "read_class",
        "recorded",
        "replayed",
        "status",
        "w",
    )

    def __init__(
        self, ctx: CompoundContext, r: Reader, off: int, w: Writer, head: int, count_at: int
    ) -> None:
        self.ctx = ctx
        self.r = r
        self.off = off
        self.w = w
        self.head = head
        self.count_at = count_at
        self.i = 0
        self.status: int = nfs4.NFS4_OK
        self.done = 0
        self.read_class = 0
        self.replayed = False
        # Statistics (nfsrdma.stats): each operation's number, status and end time, recorded
        # in one step when the COMPOUND ends (each latency is from the previous end).
        self.recorded: list[tuple[int, int, float]] = []
        self.ddp_items = 0  # how many of w.ddp are counted in ddp_bytes
        self.ddp_bytes = 0  # their padded size (they count toward the reply's size)
        # The operations whose flavour is checked on this server (the others never are).
        self.flavour_asked = flavour_asked(ctx.server.security, ctx.server.vfs)

    def run(self) -> Awaitable[None] | None:
        """Run operations until the end, or until one must wait: then a coroutine goes on."""
        # Each descriptor is checked to be inside the export once while the COMPOUND runs
        # synchronously (vfs/confine.py); the window closes before anything waits.
        open_window()
        try:
            steps = None
            if FAST_PATHS:
                steps = _fast_steps(self.r, self.off, self.ctx.op_count)
            waiting = self._advance() if steps is None else self._advance_fast(steps)
        except BaseException:
            close_window()
            self._finish()
            raise
        close_window()
        if waiting is None:
            self._finish()
            return None
        return self._continue(*waiting)

    def _advance(self) -> tuple[Operation[Any, Any], Awaitable[Any]] | None:
        """Run and record operations while their handlers answer at once; the operation whose
        handler must wait, and what to wait for, or None at the end of the COMPOUND. The only
        place where a handler's outcome is told apart from an awaitable."""
        while self.i < self.ctx.op_count:
            op, outcome = self._start()
            if _must_wait(outcome):
                return op, outcome
            if FAST_PATHS and op.number == _GETATTR and self._getattr_ok(outcome):
                continue  # (GETATTR after GETFH, OPEN, CLOSE, WRITE: the Linux client's)
            if self._record(op, outcome):
                break
        return None

    def _advance_fast(
        self, steps: tuple[_Step, _Step, _Step]
    ) -> tuple[Operation[Any, Any], Awaitable[Any]] | None:
        """``_advance`` for a fast-path prefix: its operations are known to be these, at these
        positions, and none can be out of place once SEQUENCE has succeeded; then the rest.
        SEQUENCE and PUTFH never wait, and PUTFH's success is a constant piece of reply. The
        flavour rules are asked as the generic path asks them."""
        ctx, r, w = self.ctx, self.r, self.w
        (seq_op, _), (putfh_op, _), (op, handler) = steps
        # SEQUENCE's arguments read by one struct call (their size is fixed), the session
        # table asked with them (``sequence_of``, what ops/session_ops.py ``sequence`` asks),
        # and a new request's success packed from its values: no argument, result or resok
        # objects. Its other outcomes are recorded by ``_record``, the reference.
        off = self.off + 4
        sessionid, seqid, slotid, highest, cachethis = _SEQUENCE_ARGS.unpack_from(r.buf, off)
        if cachethis > 1:  # not an XDR bool (NFS4ERR_BADXDR): the reference path says so
            return self._advance()
        ctx.op_index = 0
        self.i = 1
        self.off = off + _SEQUENCE_ARGS_SIZE
        try:
            seq = ctx.server.sessions.sequence_of(
                sessionid,
                seqid,
                slotid,
                highest,
                cachethis == 1,
                ctx.conn,
                ctx.now,
                ctx.op_count,
                ctx.request_size,
            )
        except SessionError as e:  # (as ops/session_ops.py ``sequence`` raises it)
            self._record(seq_op, self._failed(seq_op, Nfs4Error(e.status)))
            return None
        except Exception as e:
            self._record(seq_op, self._failed(seq_op, e))
            return None
        ctx.session = session = seq.session
        ctx.sequence = seq
        ctx.cachethis = seq.cachethis
        size, fore = len(w) - self.head + _SEQUENCE_OK.size, session.fore
        if (
            seq.replay is not None
            or seq.uncached_retry
            or w.ddp
            or size > fore.ca_maxresponsesize_cached
            or size > fore.ca_maxresponsesize
        ):  # a retry, or the limits (as the generic path checks them): ``_record``
            if self._record(seq_op, _SEQUENCE4res(nfs4.NFS4_OK, seq.resok)):
                return None
        else:
            w += _SEQUENCE_OK.pack(
                nfs4.OP_SEQUENCE,
                nfs4.NFS4_OK,
                session.sessionid,
                seqid,
                slotid,
                seq.highest_slotid,
                seq.target_highest_slotid,
                seq.status_flags,
            )
            self.done += 1
            self.recorded.append((nfs4.OP_SEQUENCE, nfs4.NFS4_OK, monotonic()))
        ctx.op_index = 1
        self.i = 2
        # PUTFH4args read in place: _fast_steps found its opaque whole, within NFS4_FHSIZE.
        buf, off = r.buf, self.off + 8
        (n,) = _STATUS_COUNT.unpack_from(buf, off - 4)
        fh = bytes(buf[off : off + n])
        self.off = off + n + (-n & 3)
        try:
            put_fh(ctx, fh)
            if _PUTFH in self.flavour_asked and wrong_security(ctx, _PUTFH, self._following):
                raise Nfs4Error(nfs4.NFS4ERR_WRONGSEC)
        except Exception as e:
            if self._record(putfh_op, self._failed(putfh_op, e)):
                return None
        else:
            w += _PUTFH_OK
            size, fore = len(w) - self.head, session.fore
            if (
                w.ddp
                or self.ddp_items
                or size > fore.ca_maxresponsesize_cached
                or size > fore.ca_maxresponsesize
            ):  # the limits: as the generic path checks them
                del w[-len(_PUTFH_OK) :]
                if self._record(putfh_op, _PUTFH_RESULT):
                    return None
            else:
                self.done += 1
                self.recorded.append((nfs4.OP_PUTFH, nfs4.NFS4_OK, monotonic()))
        ctx.op_index = 2
        self.i = 3
        number = op.number
        if number == _GETATTR:
            return self._getattr_fast(op)
        off = self.off + 4
        buf = r.buf
        read = number == _READ and off + _READ_ARGS.size <= len(buf)
        if read:  # READ4args read by one struct call: ops/io.py ``read`` takes its fields
            seqid, other, offset, count = _READ_ARGS.unpack_from(buf, off)
            self.off = off + _READ_ARGS.size
        else:
            try:
                args, self.off = op.dec_args(r, off)
            except XdrError as e:
                self._undecodable(op, e)
                return None
        try:
            if number in self.flavour_asked and wrong_security(ctx, number, self._following):
                outcome = op.error(nfs4.NFS4ERR_WRONGSEC)
            elif read:
                outcome = read_data(ctx, _stateid4(seqid, other), offset, count)
                if type(outcome) is tuple:  # the usual success: data and EOF flag
                    data, eof = outcome
                    if self._read_pack(data, eof):
                        if self.i >= ctx.op_count:
                            return None
                        return self._advance()
                    outcome = _READ4res(nfs4.NFS4_OK, _READ4resok(eof, data))
            else:
                outcome = handler(ctx, args)
        except Exception as e:
            outcome = self._failed(op, e)
        if _must_wait(outcome):
            return op, outcome
        if self._record(op, outcome) or self.i >= ctx.op_count:
            return None
        return self._advance()

    def _getattr_fast(
        self, op: Operation[Any, Any]
    ) -> tuple[Operation[Any, Any], Awaitable[Any]] | None:
        """GETATTR third on a fast path: its bitmap read by one struct call (no GETATTR4args),
        ops/attributes.py ``getattr_values`` asked (what GETATTR's handler asks), and a result
        of mask and values packed with no fattr4 or result objects; any other outcome, as
        the handler's, is recorded by ``_record``."""
        ctx, r = self.ctx, self.r
        buf, off = r.buf, self.off + 4
        n = -1
        if off + 4 <= len(buf):
            (n,) = _STATUS_COUNT.unpack_from(buf, off)
        if 0 <= n < len(_BITMAPS) and off + 4 + 4 * n <= len(buf):
            bitmap = list(_BITMAPS[n].unpack_from(buf, off + 4))
            self.off = off + 4 + 4 * n
        else:  # a longer bitmap, or a truncated one: the codec decodes (or refuses) it
            try:
                args, self.off = op.dec_args(r, off)
            except XdrError as e:
                self._undecodable(op, e)
                return None
            bitmap = args.attr_request
        try:
            if _GETATTR in self.flavour_asked and wrong_security(ctx, _GETATTR, self._following):
                outcome: Any = op.error(nfs4.NFS4ERR_WRONGSEC)
            else:
                outcome = getattr_values(ctx, bitmap)
        except Exception as e:
            outcome = self._failed(op, e)
        if type(outcome) is tuple:
            mask, vals = outcome
            if self._getattr_pack(mask, vals):
                if self.i >= ctx.op_count:
                    return None
                return self._advance()
            outcome = _GETATTR4res(nfs4.NFS4_OK, nfs4.GETATTR4resok(nfs4.fattr4(mask.copy(), vals)))
        elif _must_wait(outcome):
            return op, outcome
        if self._record(op, outcome) or self.i >= ctx.op_count:
            return None
        return self._advance()

    def _getattr_ok(self, outcome: object) -> bool:
        """Record a successful GETATTR as ``_record`` would, its result's head packed in one
        step; False (nothing written) for any other outcome, left to ``_record``."""
        if type(outcome) is not _GETATTR4res or outcome.status != nfs4.NFS4_OK:
            return False
        ok = outcome.value
        if ok is None:
            return False
        fattr = ok.obj_attributes
        return self._getattr_pack(fattr.attrmask, fattr.attr_vals)

    def _getattr_pack(self, mask: list[int], vals: bytes) -> bool:
        """``_getattr_ok`` for a GETATTR4resok of ``mask`` and ``vals``."""
        n, size = len(mask), len(vals)
        if n >= len(_GETATTR_OK) or type(vals) is not bytes:
            return False
        w, session = self.w, self.ctx.session
        total = len(w) - self.head + 16 + 4 * n + size + (-size & 3)
        if session is None or w.ddp or self.ddp_items:
            return False
        fore = session.fore
        if total > fore.ca_maxresponsesize or (
            self.ctx.cachethis and total > fore.ca_maxresponsesize_cached
        ):  # (the limits, as ``_over_limit`` applies them)
            return False
        try:
            w += _GETATTR_OK[n].pack(nfs4.OP_GETATTR, nfs4.NFS4_OK, n, *mask, size)
        except struct.error:
            return False  # (not a valid result: the generic encoder says how)
        w += vals
        w += _PAD[size & 3]
        self.status = nfs4.NFS4_OK
        self.done += 1
        self.recorded.append((nfs4.OP_GETATTR, nfs4.NFS4_OK, monotonic()))
        return True

    def _read_pack(self, data: Buffer, eof: bool) -> bool:
        """Record a successful READ as ``_record`` would (its head packed in one step, its
        data the reply's next DDP item); False (nothing written) when the reply's limits or
        DDP items not yet counted leave it to ``_record``."""
        w, session = self.w, self.ctx.session
        ddp, counted = w.ddp, self.ddp_items
        if session is None or len(ddp) != counted:
            return False
        n = len(data)
        padded = n + (-n & 3)
        total = len(w) - self.head + _READ_OK.size + self.ddp_bytes + padded
        fore = session.fore
        if total > fore.ca_maxresponsesize or (
            self.ctx.cachethis and total > fore.ca_maxresponsesize_cached
        ):  # (the limits, as ``_over_limit`` applies them: the cached one only when caching)
            return False
        tag = self.read_class
        w.ddp_tag = tag
        self.read_class = tag + 1
        w += _READ_OK.pack(_READ, nfs4.NFS4_OK, eof, n)
        ddp.append(DdpItem(len(w), data, tag))
        self.ddp_items = counted + 1
        self.ddp_bytes += padded
        self.status = nfs4.NFS4_OK
        self.done += 1
        self.recorded.append((_READ, nfs4.NFS4_OK, monotonic()))
        return True

    def _undecodable(self, op: Operation[Any, Any], e: XdrError) -> None:
        log.info("%s: %s arguments do not decode: %s", self.ctx.conn.peer, op.name, e)
        self._record(op, op.error(nfs4.NFS4ERR_BADXDR))

    async def _continue(self, op: Operation[Any, Any], pending: Awaitable[Any]) -> None:
        try:
            waiting: tuple[Operation[Any, Any], Awaitable[Any]] | None = (op, pending)
            while waiting is not None:
                op, pending = waiting
                try:
                    res = await pending
                except Exception as e:
                    res = self._failed(op, e)
                waiting = None if self._record(op, res) else self._advance()
        finally:
            self._finish()

    def _start(self) -> tuple[Operation[Any, Any], Outcome[Any]]:
        """Decode operation ``i`` and call its handler: its result, or an awaitable."""
        ctx, r, off = self.ctx, self.r, self.off
        ctx.op_index = i = self.i
        self.i += 1
        if off + 4 > len(r.buf):
            return _ILLEGAL, _ILLEGAL.error(nfs4.NFS4ERR_BADXDR)
        (opnum,) = _STATUS_COUNT.unpack_from(r.buf, off)
        op = _OPERATIONS.get(opnum)
        if op is None or op is _ILLEGAL or (opnum > LAST_V41_OP and ctx.minorversion < 2):
            # Not an operation of this minor version (RFC 8881 section 15.2, RFC 7862 1.4).
            return _ILLEGAL, _ILLEGAL.error(nfs4.NFS4ERR_OP_ILLEGAL)
        try:
            args, self.off = op.dec_args(r, off + 4)
        except XdrError as e:
            log.info("%s: %s arguments do not decode: %s", ctx.conn.peer, op.name, e)
            return op, op.error(nfs4.NFS4ERR_BADXDR)
        position_error = _position_error(ctx, opnum, i, ctx.op_count)
        if position_error:
            return op, op.error(position_error)
        bound = HANDLERS.get(opnum)
        if bound is None:
            return op, op.error(nfs4.NFS4ERR_NOTSUPP)
        try:
            if opnum in self.flavour_asked:
                if opnum in PUT_FH_OPS:  # judged on the filehandle it puts
                    result = bound.handler(ctx, args)
                    if wrong_security(ctx, opnum, self._following):
                        return op, op.error(nfs4.NFS4ERR_WRONGSEC)
                    return op, result
                if wrong_security(ctx, opnum, self._following):
                    return op, op.error(nfs4.NFS4ERR_WRONGSEC)
            return op, bound.handler(ctx, args)
        except Exception as e:
            return op, self._failed(op, e)

    def _following(self) -> int | None:
        """The number of the operation after the current one, SAVEFH skipped (None: there is
        none), for the flavour rules (RFC 8881 section 2.6.3.1.1.1)."""
        i, off = self.i, self.off
        while i < self.ctx.op_count:
            number = _peek_op(self.r, off).number
            if number != nfs4.OP_SAVEFH:
                return number
            i, off = i + 1, off + 4  # (SAVEFH has no arguments)
        return None

    def _failed(self, op: Operation[Any, Any], e: Exception) -> Any:
        status = status_of(e)
        if status == nfs4.NFS4ERR_SERVERFAULT:
            log.error("%s: %s failed", self.ctx.conn.peer, op.name, exc_info=e)
        if isinstance(e, Nfs4Error) and e.result is not None:
            return e.result
        return op.error(status)

    def _record(self, op: Operation[Any, Any], res: Any) -> bool:
        """Encode an operation's result; True when the COMPOUND stops here."""
        ctx, w = self.ctx, self.w
        seq = ctx.sequence
        if op is _SEQUENCE and seq is not None and seq.replay is not None:
            # A retry: the cached reply, as it was, whatever this request says now.
            del w[self.head :]
            w.ddp.clear()
            replay = seq.replay
            assert isinstance(replay, EncodedReply)
            replay.append_to(w)
            self.replayed = True
            return True
        mark, ddp_mark = len(w), len(w.ddp)
        number = op.number
        if number in READ_CLASS_OPS:
            w.ddp_tag = self.read_class
            self.read_class += 1
        w += op.head
        op.enc_res(w, res)
        status = op.status_of(res)
        session = ctx.session
        if session is not None:
            # The reply's size limits (REP_TOO_BIG, REP_TOO_BIG_TO_CACHE), DDP data counted.
            ddp, counted = w.ddp, self.ddp_items
            if len(ddp) != counted:
                if len(ddp) == counted + 1:  # one more item (a READ's data): _count_ddp's sum
                    n = len(ddp[counted].data)
                    self.ddp_bytes += n + (-n & 3)
                    self.ddp_items = counted + 1
                else:
                    self._count_ddp()
            size, fore = len(w) - self.head + self.ddp_bytes, session.fore
            too_big = nfs4.NFS4_OK
            if size > fore.ca_maxresponsesize_cached or size > fore.ca_maxresponsesize:
                too_big = _over_limit(ctx, size)  # (within both: no error, the usual case)
            if too_big:
                del w[mark:]
                del w.ddp[ddp_mark:]
                status = too_big
                op.encode_result(w, op.error(too_big))
        self.status = status
        self.done += 1
        self.recorded.append((number, status, monotonic()))
        if status != nfs4.NFS4_OK:
            return True
        if op is _SEQUENCE and seq is not None and seq.uncached_retry:
            # A retry of a request whose reply was not cached (sa_cachethis was false).
            if self.i < ctx.op_count:
                nxt = _peek_op(self.r, self.off)
                nxt.encode_result(w, nxt.error(nfs4.NFS4ERR_RETRY_UNCACHED_REP))
                self.done += 1
                self.status = nfs4.NFS4ERR_RETRY_UNCACHED_REP
            return True
        return False

    def _count_ddp(self) -> None:
        """Bring ``ddp_bytes`` up to date with the reply's DDP items (counted incrementally)."""
        ddp = self.w.ddp
        if len(ddp) < self.ddp_items:  # items were taken back: count afresh
            self.ddp_items = self.ddp_bytes = 0
        total = self.ddp_bytes
        for k in range(self.ddp_items, len(ddp)):
            n = len(ddp[k].data)
            total += n + (-n & 3)  # (DdpItem.padded_length)
        self.ddp_bytes = total
        self.ddp_items = len(ddp)

    def _finish(self) -> None:
        """Complete the reply header and hand the reply to the slot (exactly once)."""
        ctx, w, head = self.ctx, self.w, self.head
        seq, ctx.sequence = ctx.sequence, None
        stats, kind = ctx.server.stats, ctx.conn.conn.kind
        table = stats.tables.get(kind) or stats.table(kind)  # (ServerStats.table, inlined)
        table.record_run(ctx.now, self.recorded, self.replayed)
        if not self.replayed:  # (_patch, inlined)
            _STATUS_COUNT.pack_into(w, head, self.status)
            _STATUS_COUNT.pack_into(w, self.count_at, self.done)
        if seq is not None and seq.session is not None and seq.replay is None:
            cached = None
            if ctx.cachethis and self.status != nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE:
                # DDP data is copied: it may be memory the transport lent only until the reply.
                cached = EncodedReply(bytes(w[head:]), [_rebase(i, head) for i in w.ddp])
            ctx.server.sessions.finish(seq, cached, monotonic())


def _position_error(ctx: CompoundContext, op: int, i: int, count: int) -> nfs4.nfsstat4:
    """The error for operation ``op`` at position ``i`` of ``count``, NFS4_OK (0) if none.
    (An nfsstat4, not an int: the error results' status field takes only its members.)"""
    if op == nfs4.OP_SEQUENCE:
        return nfs4.NFS4ERR_SEQUENCE_POS if i != 0 else nfs4.NFS4_OK
    if i == 0 and op in SESSIONLESS_OPS:
        return nfs4.NFS4ERR_NOT_ONLY_OP if count > 1 else nfs4.NFS4_OK
    if ctx.session is None and op not in SESSIONLESS_OPS:
        return nfs4.NFS4ERR_OP_NOT_IN_SESSION
    return nfs4.NFS4_OK


def _peek_op(r: Reader, off: int) -> Operation[Any, Any]:
    """The operation whose number is at ``off`` (ILLEGAL if none is)."""
    if off + 4 <= len(r.buf):
        (opnum,) = _STATUS_COUNT.unpack_from(r.buf, off)
        return _OPERATIONS.get(opnum, _ILLEGAL)
    return _ILLEGAL


def _over_limit(ctx: CompoundContext, size: int) -> nfs4.nfsstat4:
    """The error for a reply of ``size`` bytes so far, NFS4_OK (0) when it is within the
    limits."""
    session = ctx.session
    if session is None:
        return nfs4.NFS4_OK
    if size > session.fore.ca_maxresponsesize:
        return nfs4.NFS4ERR_REP_TOO_BIG
    if ctx.cachethis and size > session.fore.ca_maxresponsesize_cached:
        return nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE
    return nfs4.NFS4_OK


def _patch(w: Writer, head: int, count_at: int, status: int, count: int) -> None:
    """COMPOUND4res's status (its first word) and result count (the word before the results),
    as enc_COMPOUND4res_head laid them out."""
    _STATUS_COUNT.pack_into(w, head, status)
    _STATUS_COUNT.pack_into(w, count_at, count)


def _rebase(item: DdpItem, head: int) -> DdpItem:
    data = item.data
    return DdpItem(item.offset - head, data if isinstance(data, bytes) else bytes(data), item.tag)
