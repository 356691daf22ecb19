"""Dispatch of inbound calls by (program, version, procedure), as RFC 5531 section 9 says.

- RPC version other than 2: MSG_DENIED / RPC_MISMATCH (2, 2).
- Refused credential: MSG_DENIED / AUTH_ERROR.
- Unknown program: PROG_UNAVAIL; unknown version: PROG_MISMATCH (lowest, highest);
  unknown procedure: PROC_UNAVAIL.
- Arguments that do not decode (the handler raises XdrError): GARBAGE_ARGS.
- Anything else going wrong in a handler: SYSTEM_ERR (logged); the server carries on.
- RPCSEC_GSS credentials (RFC 2203) go to the ``GssServer`` (``gss.py``) when one is
  configured: it answers context creation and destruction itself, refuses or silently drops
  bad calls, and for admitted calls gives the handler the authenticated credential and the
  unprotected arguments; the results are sealed (integrity or privacy) after the handler ran,
  so a reply replayed from the session's reply cache goes out under the retransmission's own
  sequence number and verifier.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nfsrdma.rpc import message
from nfsrdma.rpc.auth import ANONYMOUS, KNOWN_SYS, AuthError, Credential, credential_of
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.errors import RpcAcceptError
from nfsrdma.transport.base import Inbound
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import Reader, Writer, XdrError

if TYPE_CHECKING:
    from nfsrdma.rpc.gss import GssServer, ReplyProtection

log = logging.getLogger(__name__)

_CALL_FAST = message.CALL_FAST
_AUTH_NONE_BYTES = message.AUTH_NONE_BYTES
_REPLY_OK_TAIL = message.REPLY_OK_TAIL
_REPLY_HEAD = struct.Struct(f">I{len(_REPLY_OK_TAIL)}s")  # XID, then the constant tail
_KNOWN_SYS = KNOWN_SYS
_CALL = int(rpc.CALL)
_AUTH_SYS = int(rpc.AUTH_SYS)
_AUTH_NONE = int(rpc.AUTH_NONE)


@dataclass(slots=True)
class RpcCall:
    """An inbound call, for its handler: arguments are in ``reader`` from ``offset``."""

    xid: int
    prog: int
    vers: int
    proc: int
    cred: Credential
    reader: Reader
    offset: int
    conn: RpcConnection
    inbound: Inbound
    verf: rpc.opaque_auth | None = None  # the reply's verifier (None: AUTH_NONE)
    protection: ReplyProtection | None = None  # RPCSEC_GSS: how the results are sealed
    results_at: int = -1  # where the results start in the reply (-1: an error reply)


# A handler appends the results to the Writer (after the reply header written for it).
# It may be a plain function (for quick procedures) or a coroutine function.
Handler = Callable[[RpcCall, Writer], Awaitable[None] | None]


class Dispatcher:
    def __init__(
        self, gss: GssServer | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.programs: dict[int, dict[int, dict[int, Handler]]] = {}
        # Every procedure by (program, version, procedure), for the fast path.
        self._procedures: dict[tuple[int, int, int], Handler] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.gss = gss
        self.clock = clock

    def add(self, prog: int, vers: int, procedures: dict[int, Handler]) -> None:
        self.programs.setdefault(prog, {})[vers] = dict(procedures)
        self._procedures = {
            (p, v, n): h
            for p, versions in self.programs.items()
            for v, procs in versions.items()
            for n, h in procs.items()
        }

    def dispatch(self, conn: RpcConnection, inbound: Inbound) -> None:
        """Handle one inbound call; the reply goes back on ``conn``.

        The usual call (RPC version 2, an AUTH_SYS credential seen before or AUTH_NONE, an
        AUTH_NONE verifier, a known procedure) is read by one ``struct`` call and its reply
        header is a constant after the XID; anything else takes the full path below."""
        r = inbound.reader
        buf = r.buf
        if len(buf) >= 40:
            xid, mtype, rpcvers, prog, vers, proc, flavor, n = _CALL_FAST.unpack_from(buf, 0)
            end = 32 + n + (-n & 3)
            if mtype == _CALL and rpcvers == 2 and buf[end : end + 8] == _AUTH_NONE_BYTES:
                cred: Credential | None = None
                if flavor == _AUTH_SYS:
                    if n <= 400:
                        cred = _KNOWN_SYS.get(bytes(buf[32 : 32 + n]))
                elif flavor == _AUTH_NONE and n == 0:
                    cred = ANONYMOUS
                handler = self._procedures.get((prog, vers, proc))
                if cred is not None and handler is not None:
                    w = Writer(_REPLY_HEAD.pack(xid, _REPLY_OK_TAIL))
                    call = RpcCall(  # (positional, the results after the reply head)
                        xid, prog, vers, proc, cred, r, end + 8, conn, inbound, None, None, len(w)
                    )
                    # ``_call`` and ``_send`` inlined (no verifier, no protection here)
                    try:
                        result = handler(call, w)
                    except Exception as e:
                        self._failed(call, w, 0, e)
                        self._send(call, w)
                        return
                    if result is None:
                        conn.send_reply(inbound, w)
                    else:
                        self._wait(call, w, 0, result)
                    return
        self._dispatch(conn, inbound)

    def _dispatch(self, conn: RpcConnection, inbound: Inbound) -> None:
        """``dispatch`` for every call: the reference, header decoded in full."""
        r = inbound.reader
        try:
            xid, _mtype = message.peek(r.buf)
        except XdrError:
            return  # nothing to answer to
        w = Writer()
        try:
            xid, body, off = message.decode_call(r)
        except XdrError as e:
            log.info("%s: undecodable call header xid %#x: %s", conn.peer, xid, e)
            message.encode_accepted(w, xid, rpc.GARBAGE_ARGS)
            conn.send_reply(inbound, w)
            return
        if body.rpcvers != message.RPC_VERSION:
            message.encode_denied(w, xid, mismatch=(message.RPC_VERSION, message.RPC_VERSION))
            conn.send_reply(inbound, w)
            return
        if body.cred.flavor == rpc.RPCSEC_GSS and self.gss is not None:
            self._dispatch_gss(conn, inbound, xid, body, off)
            return
        try:
            cred = credential_of(body.cred, body.verf)
        except AuthError as e:
            log.info("%s: xid %#x denied: %s", conn.peer, xid, e)
            message.encode_denied(w, xid, auth=e.stat)
            conn.send_reply(inbound, w)
            return
        handler = self._lookup(body, w, xid)
        if handler is None:
            conn.send_reply(inbound, w)
            return
        self._run(
            handler, RpcCall(xid, body.prog, body.vers, body.proc, cred, r, off, conn, inbound), w
        )

    def _dispatch_gss(
        self, conn: RpcConnection, inbound: Inbound, xid: int, body: rpc.call_body, off: int
    ) -> None:
        from nfsrdma.rpc import gss

        assert self.gss is not None
        w = Writer()
        handler = self._lookup(body, w, xid)
        if handler is None:
            conn.send_reply(inbound, w)
            return
        r = inbound.reader
        header = bytes(r.buf[: gss.header_length(body.cred)])
        outcome = self.gss.accept(header, body.cred, body.verf, body.proc, r, off, self.clock())
        if isinstance(outcome, gss.Drop):
            log.info("%s: xid %#x dropped: %s", conn.peer, xid, outcome.reason)
            return
        if isinstance(outcome, gss.Denied):
            log.info("%s: xid %#x denied: %s", conn.peer, xid, outcome.reason)
            message.encode_denied(w, xid, auth=outcome.stat)
            conn.send_reply(inbound, w)
            return
        if isinstance(outcome, gss.Reply):
            if outcome.reason:
                log.info("%s: xid %#x: %s", conn.peer, xid, outcome.reason)
            message.encode_accepted(w, xid, outcome.stat, verf=outcome.verf)
            if outcome.stat == rpc.SUCCESS:
                at = len(w)
                w += outcome.results
                if outcome.protection is not None:
                    sealed = outcome.protection.seal(w, at)
                    if sealed is None:
                        return
                    w = sealed
            conn.send_reply(inbound, w)
            return
        call = RpcCall(
            xid,
            body.prog,
            body.vers,
            body.proc,
            outcome.credential,
            outcome.reader,
            outcome.offset,
            conn,
            inbound,
            outcome.verf,
            outcome.protection,
        )
        self._run(handler, call, w)

    def _run(self, handler: Handler, call: RpcCall, w: Writer) -> None:
        mark = len(w)
        message.encode_accepted(w, call.xid, verf=call.verf or message.AUTH_NONE_VERF)
        call.results_at = len(w)
        self._call(handler, call, w, mark)

    def _call(self, handler: Handler, call: RpcCall, w: Writer, mark: int) -> None:
        """Run a call's handler after its reply header (in ``w`` from ``mark``); send."""
        try:
            result = handler(call, w)
        except Exception as e:
            self._failed(call, w, mark, e)
            self._send(call, w)
            return
        if result is None:
            self._send(call, w)
            return
        self._wait(call, w, mark, result)

    def _wait(self, call: RpcCall, w: Writer, mark: int, result: Awaitable[None]) -> None:
        """The handler has to wait: the reply is sent when ``result`` is done."""
        conn = call.conn
        task = asyncio.ensure_future(self._finish(call, w, mark, result))
        self._tasks.add(task)
        conn.calls_in_progress += 1

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            conn.calls_in_progress -= 1

        task.add_done_callback(done)

    async def _finish(self, call: RpcCall, w: Writer, mark: int, pending: Awaitable[None]) -> None:
        try:
            await pending
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._failed(call, w, mark, e)
        self._send(call, w)

    @staticmethod
    def _send(call: RpcCall, w: Writer) -> None:
        if call.protection is not None and call.results_at >= 0:
            sealed = call.protection.seal(w, call.results_at)
            if sealed is None:
                return
            w = sealed
        call.conn.send_reply(call.inbound, w)

    def _lookup(self, body: rpc.call_body, w: Writer, xid: int) -> Handler | None:
        versions = self.programs.get(body.prog)
        if versions is None:
            message.encode_accepted(w, xid, rpc.PROG_UNAVAIL)
            return None
        procs = versions.get(body.vers)
        if procs is None:
            message.encode_accepted(w, xid, rpc.PROG_MISMATCH, (min(versions), max(versions)))
            return None
        handler = procs.get(body.proc)
        if handler is None:
            message.encode_accepted(w, xid, rpc.PROC_UNAVAIL)
        return handler

    def _failed(self, call: RpcCall, w: Writer, mark: int, e: Exception) -> None:
        """Replace whatever the handler wrote with the error reply its failure calls for."""
        del w[mark:]
        w.ddp.clear()
        call.results_at = -1
        verf = call.verf or message.AUTH_NONE_VERF
        if isinstance(e, XdrError):
            log.info("%s: xid %#x: garbage arguments: %s", call.conn.peer, call.xid, e)
            message.encode_accepted(w, call.xid, rpc.GARBAGE_ARGS, verf=verf)
        elif isinstance(e, RpcAcceptError):
            message.encode_accepted(w, call.xid, e.stat, e.mismatch, verf=verf)
        elif isinstance(e, AuthError):
            message.encode_denied(w, call.xid, auth=e.stat)
        else:
            log.exception(
                "%s: xid %#x prog %d proc %d failed", call.conn.peer, call.xid, call.prog, call.proc
            )
            message.encode_accepted(w, call.xid, rpc.SYSTEM_ERR, verf=verf)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the calls in progress (and those they let in meanwhile), for at most
        ``timeout`` seconds when given (the calls go on after that; none is cancelled)."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while self._tasks:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return
            await asyncio.wait(list(self._tasks), timeout=left)


def null_procedure(call: RpcCall, w: Writer) -> None:
    """Procedure 0 of every program: no arguments, no results."""
    if call.offset != len(call.reader.buf):
        raise XdrError("NULL takes no arguments", call.offset)
