"""COMPOUND processing (RFC 8881 sections 2.6.3, 15.2, 16.2).

Operations are decoded one at a time and run in order; processing stops at the first
failure, whose status becomes the COMPOUND's. Results are encoded as they are produced, so the
reply's size is known at every step (NFS4ERR_REP_TOO_BIG / REP_TOO_BIG_TO_CACHE).

Session rules enforced here: SEQUENCE only first (NFS4ERR_SEQUENCE_POS); without SEQUENCE,
only EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION, DESTROY_CLIENTID and BIND_CONN_TO_SESSION,
each alone (NFS4ERR_NOT_ONLY_OP); anything else NFS4ERR_OP_NOT_IN_SESSION. A SEQUENCE that
finds a retry sends the cached reply, re-framed for the current transport.
"""

from __future__ import annotations

import inspect
import logging
import struct
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.errors import error_result, status_of
from nfsrdma.nfs4.ops import HANDLERS
from nfsrdma.vfs.base import Cred
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, DdpItem, Reader, Writer, XdrError

if TYPE_CHECKING:
    from nfsrdma.nfs4.server_state import ServerState
    from nfsrdma.rpc.server import RpcCall

log = logging.getLogger(__name__)

MINOR_VERSION = 1
SESSIONLESS_OPS = frozenset(
    {
        nfs4.OP_EXCHANGE_ID,
        nfs4.OP_CREATE_SESSION,
        nfs4.OP_DESTROY_SESSION,
        nfs4.OP_DESTROY_CLIENTID,
        nfs4.OP_BIND_CONN_TO_SESSION,
    }
)
READ_CLASS_OPS = frozenset({nfs4.OP_READ, nfs4.OP_READLINK})  # RFC 8267 section 6.4.1
_ARG_DECODERS = nfs4._nfs_argop4_DEC
_OPS = nfs4._nfs_opnum4_MAP  # operation number -> nfs_opnum4 member (no enum call per op)
_NO_ARGS = frozenset(op for op, dec in _ARG_DECODERS.items() if dec.__name__ == "_void_decode")
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


def cred_of(server: ServerState, call: RpcCall) -> Cred:
    c = call.cred
    if c.uid is None or c.gid is None:
        return server.vfs.export.anonymous_cred()
    return Cred(c.uid, c.gid, c.gids)


def compound(server: ServerState, call: RpcCall, w: Writer) -> Awaitable[None] | None:
    """NFSPROC4_COMPOUND: decode, run and encode; the RPC reply header is already in ``w``.

    Operations run synchronously as far as they can; only when one has to wait (file I/O in
    the thread pool) does the rest continue as a coroutine, which is then returned for the
    RPC layer to await. Raises XdrError when not even the COMPOUND header decodes (the
    caller answers GARBAGE_ARGS)."""
    r = call.reader
    tag, off = nfs4.dec_utf8str_cs(r, call.offset)
    if off + 8 > len(r.buf):
        raise XdrError("truncated COMPOUND header", off)
    minor, count = struct.unpack_from(">II", r.buf, off)
    off += 8
    head = len(w)
    w += U32.pack(0)
    nfs4.enc_utf8str_cs(w, tag)
    count_at = len(w)
    w += U32.pack(0)
    if minor != MINOR_VERSION:
        _patch(w, head, count_at, nfs4.NFS4ERR_MINOR_VERS_MISMATCH, 0)
        return None
    try:
        tag.decode("utf-8")
    except UnicodeDecodeError:
        _patch(w, head, count_at, nfs4.NFS4ERR_INVAL, 0)
        return None
    if count * 4 > len(r.buf) - off:
        raise XdrError(f"{count} operations cannot fit in the request", off - 4)
    ctx = CompoundContext(
        server=server,
        cred=cred_of(server, call),
        principal=call.cred,
        conn=call.conn,
        now=time.monotonic(),
        op_count=count,
        request_size=len(r.buf) - call.offset,
    )
    return _Run(ctx, r, off, w, head, count_at).run()


class _Run:
    """One COMPOUND in progress: the operations left, and the reply so far."""

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

    def run(self) -> Awaitable[None] | None:
        """Run operations until the end, or until one must wait: then a coroutine goes on."""
        try:
            while self.i < self.ctx.op_count:
                op, res = self._start()
                if inspect.isawaitable(res):
                    return self._wait(op, res)
                if self._record(op, res):
                    break
        except BaseException:
            self._finish()
            raise
        self._finish()
        return None

    async def _wait(self, op: int, pending: Awaitable[Any]) -> None:
        try:
            try:
                res = await pending
            except Exception as e:
                res = self._failed(op, e)
            if not self._record(op, res):
                while self.i < self.ctx.op_count:
                    op, res = self._start()
                    if inspect.isawaitable(res):
                        try:
                            res = await res
                        except Exception as e:
                            res = self._failed(op, e)
                    if self._record(op, res):
                        break
        finally:
            self._finish()

    def _start(self) -> tuple[int, Any]:
        """Decode operation ``i`` and call its handler: its result, or an awaitable."""
        ctx, r, off = self.ctx, self.r, self.off
        ctx.op_index = i = self.i
        self.i += 1
        (opnum,) = _STATUS_COUNT.unpack_from(r.buf, off) if off + 4 <= len(r.buf) else (None,)
        if opnum is None:
            return nfs4.OP_ILLEGAL, error_result(nfs4.OP_ILLEGAL, nfs4.NFS4ERR_BADXDR)
        dec = _ARG_DECODERS.get(opnum)
        if dec is None or opnum == nfs4.OP_ILLEGAL:
            return nfs4.OP_ILLEGAL, error_result(nfs4.OP_ILLEGAL, nfs4.NFS4ERR_OP_ILLEGAL)
        op = _OPS[opnum]
        try:
            args, self.off = dec(r, off + 4)
        except XdrError as e:
            log.info("%s: %s arguments do not decode: %s", ctx.conn.peer, op.name, e)
            return op, error_result(op, nfs4.NFS4ERR_BADXDR)
        position_error = _position_error(ctx, op, i, ctx.op_count)
        if position_error:
            return op, error_result(op, position_error)
        handler = HANDLERS.get(op)
        if handler is None:
            return op, error_result(op, nfs4.NFS4ERR_NOTSUPP)
        try:
            return op, handler(ctx, args)
        except Exception as e:
            return op, self._failed(op, e)

    def _failed(self, op: int, e: Exception) -> Any:
        status = status_of(e)
        if status == nfs4.NFS4ERR_SERVERFAULT:
            log.error("%s: %s failed", self.ctx.conn.peer, _OPS[op].name, exc_info=e)
        if isinstance(e, Nfs4Error) and e.result is not None:
            return e.result
        return error_result(op, status)

    def _record(self, op: int, res: Any) -> bool:
        """Encode an operation's result; True when the COMPOUND stops here."""
        ctx, w, head = self.ctx, self.w, self.head
        seq = ctx.sequence
        if op == nfs4.OP_SEQUENCE and seq is not None and seq.replay is not None:
            # A retry: the cached reply, as it was, whatever this request says now.
            del w[head:]
            w.ddp.clear()
            replay = seq.replay
            assert isinstance(replay, EncodedReply)
            replay.append_to(w)
            self.replayed = True
            return True
        mark, ddp_mark = len(w), len(w.ddp)
        if op in READ_CLASS_OPS:
            w.ddp_tag = self.read_class
            self.read_class += 1
        nfs4.enc_nfs_resop4(w, nfs4.nfs_resop4(_OPS[op], res))
        status = _status_of_result(res)
        too_big = _over_limit(ctx, w, head)
        if too_big:
            del w[mark:]
            del w.ddp[ddp_mark:]
            status = too_big
            nfs4.enc_nfs_resop4(w, nfs4.nfs_resop4(_OPS[op], error_result(op, status)))
        self.status = status
        self.done += 1
        if status != nfs4.NFS4_OK:
            return True
        if op == nfs4.OP_SEQUENCE and seq is not None and seq.uncached_retry:
            # A retry of a request whose reply was not cached (sa_cachethis was false).
            if self.i < ctx.op_count:
                nxt = _peek_op(self.r, self.off)
                err = error_result(nxt, nfs4.NFS4ERR_RETRY_UNCACHED_REP)
                nfs4.enc_nfs_resop4(w, nfs4.nfs_resop4(_OPS[nxt], err))
                self.done += 1
                self.status = nfs4.NFS4ERR_RETRY_UNCACHED_REP
            return True
        return False

    def _finish(self) -> None:
        """Complete the reply header and hand the reply to the slot (exactly once)."""
        ctx, w, head = self.ctx, self.w, self.head
        seq, ctx.sequence = ctx.sequence, None
        if not self.replayed:
            _patch(w, head, self.count_at, self.status, self.done)
        if seq is not None and seq.session is not None and seq.replay is None:
            cached = None
            if ctx.cachethis and self.status != nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE:
                cached = EncodedReply(bytes(w[head:]), [_rebase(i, head) for i in w.ddp])
            ctx.server.sessions.finish(seq, cached, time.monotonic())


def _position_error(ctx: CompoundContext, op: int, i: int, count: int) -> int:
    if op == nfs4.OP_SEQUENCE:
        return nfs4.NFS4ERR_SEQUENCE_POS if i != 0 else 0
    if i == 0 and op in SESSIONLESS_OPS:
        return nfs4.NFS4ERR_NOT_ONLY_OP if count > 1 else 0
    if ctx.session is None and op not in SESSIONLESS_OPS:
        return nfs4.NFS4ERR_OP_NOT_IN_SESSION
    return 0


def _peek_op(r: Any, off: int) -> int:
    if off + 4 <= len(r.buf):
        (opnum,) = _STATUS_COUNT.unpack_from(r.buf, off)
        if opnum in _ARG_DECODERS and opnum != nfs4.OP_ILLEGAL:
            return int(opnum)
    return int(nfs4.OP_ILLEGAL)


def _status_of_result(res: Any) -> int:
    # Every XXX4res has the status as its first field (union discriminant or struct field).
    return int(getattr(res, res.__slots__[0]))


def _over_limit(ctx: CompoundContext, w: Writer, head: int) -> int:
    session = ctx.session
    if session is None:
        return 0
    size = len(w) - head
    if w.ddp:
        size += sum(i.padded_length for i in w.ddp)
    if size > session.fore.ca_maxresponsesize:
        return nfs4.NFS4ERR_REP_TOO_BIG
    if ctx.cachethis and size > session.fore.ca_maxresponsesize_cached:
        return nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE
    return 0


def _patch(w: Writer, head: int, count_at: int, status: int, count: int) -> None:
    _STATUS_COUNT.pack_into(w, head, status)
    _STATUS_COUNT.pack_into(w, count_at, count)


def _rebase(item: DdpItem, head: int) -> DdpItem:
    return DdpItem(item.offset - head, item.data, item.tag)
