"""One RPC endpoint on one transport connection, in both roles.

Outbound calls get an XID, wait for the reply with that XID, and are released at the
transport whatever happens (reply, error, timeout, cancellation, disconnect). Inbound calls go to
a ``Dispatcher``. NFSv4.1 needs both on the same connection: the server sends callbacks on
the client's connection, and the client answers them there (RFC 8881 section 2.10.3.1)."""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nfsrdma.rpc import message
from nfsrdma.rpc.errors import RpcAcceptError, RpcConnectionLost, RpcDenied, RpcTimeout
from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import Reader, Writer

if TYPE_CHECKING:
    from nfsrdma.rpc.server import Dispatcher

_XID_TYPE = struct.Struct(">II")  # an RPC message's xid and msg_type (RFC 5531)
log = logging.getLogger(__name__)


@dataclass(slots=True)
class RpcResult:
    """A successful reply: decode the results from ``reader`` at ``offset``."""

    xid: int
    reader: Reader
    offset: int
    inbound: Inbound
    verf: rpc.opaque_auth | None = None  # the reply's verifier (None: AUTH_NONE)


class CallAuth(Protocol):
    """A security flavour that protects whole calls (RPCSEC_GSS, ``gss_client.py``): it writes
    the call header, credential, verifier and arguments, and checks and opens the results."""

    async def prepare(self, conn: RpcConnection, prog: int, vers: int) -> None: ...

    def encode_call(
        self,
        w: Writer,
        xid: int,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None,
    ) -> Any: ...

    def expectation(self, expect: ReplyExpectation | None) -> ReplyExpectation | None: ...

    def decode_result(self, state: Any, result: RpcResult) -> RpcResult: ...

    def refresh(self, state: Any, denied: RpcDenied) -> bool: ...


class RpcConnection:
    def __init__(self, conn: Connection, dispatcher: Dispatcher | None = None) -> None:
        self.conn = conn
        self.dispatcher = dispatcher
        self.pending: dict[int, asyncio.Future[Inbound]] = {}
        self._xid = random.getrandbits(32)
        self.closed = asyncio.Event()
        self.context: dict[str, object] = {}  # upper layers keep per-connection state here
        self.calls_in_progress = 0  # inbound calls the dispatcher has not answered yet
        conn.set_receiver(self._on_message)
        conn.call_failed = self._on_call_failed
        conn.on_closed(self._on_closed)

    @property
    def peer(self) -> str:
        return self.conn.peer

    @property
    def busy(self) -> bool:
        """Calls outstanding in either direction."""
        return self.calls_in_progress > 0 or bool(self.pending)

    # -- requester ---------------------------------------------------------------------
    def next_xid(self) -> int:
        xid = self._xid = (self._xid + 1) & 0xFFFFFFFF
        while xid in self.pending:
            xid = self._xid = (self._xid + 1) & 0xFFFFFFFF
        return xid

    def call(
        self,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None = None,
        *,
        cred: rpc.opaque_auth = message.AUTH_NONE_VERF,
        timeout: float | None = None,
        expect: ReplyExpectation | None = None,
        probe: bool = False,
        auth: CallAuth | None = None,
    ) -> Coroutine[Any, Any, RpcResult]:
        """Send a call and wait for its reply (a coroutine). Raises RpcAcceptError, RpcDenied,
        RpcTimeout, RpcConnectionLost; XdrError if the reply header is malformed. A ``probe``
        (keepalive) may use the transport credit kept back for it (UL-26). With ``auth``
        (RPCSEC_GSS) the call is protected by it, and resent once on a new context when the
        server refuses the one used (the call did not run). Without ``auth`` the coroutine is
        the call itself (one coroutine frame less on a client's every call)."""
        if auth is None:
            return self._call(prog, vers, proc, encode_args, cred, timeout, expect, probe)
        return self._call_with(auth, prog, vers, proc, encode_args, cred, timeout, expect, probe)

    async def _call_with(
        self,
        auth: CallAuth,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None,
        cred: rpc.opaque_auth,
        timeout: float | None,
        expect: ReplyExpectation | None,
        probe: bool,
    ) -> RpcResult:
        for attempt in range(3):
            await auth.prepare(self, prog, vers)
            state: list[Any] = []
            try:
                return await self._call(
                    prog, vers, proc, encode_args, cred, timeout, expect, probe, auth, state
                )
            except RpcDenied as e:
                if attempt == 2 or not auth.refresh(state[0] if state else None, e):
                    raise
        raise AssertionError("unreachable")

    async def _call(
        self,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None,
        cred: rpc.opaque_auth,
        timeout: float | None,
        expect: ReplyExpectation | None,
        probe: bool,
        auth: CallAuth | None = None,
        state: list[Any] | None = None,
    ) -> RpcResult:
        if self.conn.closed:
            raise RpcConnectionLost(f"connection to {self.peer} is closed")
        await self.conn.reserve(probe)
        xid = self.next_xid()
        w = Writer()
        if auth is None:
            message.encode_call(w, xid, prog, vers, proc, cred)
            if encode_args is not None:
                encode_args(w)
        else:
            assert state is not None
            state.append(auth.encode_call(w, xid, prog, vers, proc, encode_args))
            expect = auth.expectation(expect)
        fut: asyncio.Future[Inbound] = asyncio.get_running_loop().create_future()
        self.pending[xid] = fut
        try:
            self.conn.send_call(xid, w, expect)
            if timeout is None:
                inbound = await fut
            else:
                try:
                    inbound = await asyncio.wait_for(fut, timeout)
                except TimeoutError:
                    raise RpcTimeout(f"no reply to xid {xid:#x} in {timeout} s") from None
        finally:
            self.pending.pop(xid, None)
            self.conn.call_done(xid)
        if auth is None:
            return _result(xid, inbound)
        assert state
        return auth.decode_result(state[0], _result(xid, inbound))

    # -- inbound -------------------------------------------------------------------------
    def _on_message(self, conn: Connection, inbound: Inbound) -> None:
        buf = inbound.reader.buf
        if len(buf) < 8:  # (message.peek's check, inlined: every message comes here)
            log.warning("%s %s: runt message dropped", conn.kind, conn.peer)
            return
        xid, mtype = _XID_TYPE.unpack_from(buf, 0)
        if mtype == rpc.REPLY:
            fut = self.pending.pop(xid, None)
            if fut is None or fut.done():
                log.info("%s %s: reply with unknown xid %#x dropped", conn.kind, conn.peer, xid)
                return
            fut.set_result(inbound)
        elif mtype == rpc.CALL and self.dispatcher is not None:
            self.dispatcher.dispatch(self, inbound)
        else:
            log.info("%s %s: message type %d dropped", conn.kind, conn.peer, mtype)

    def _on_call_failed(self, xid: int, exc: BaseException) -> None:
        fut = self.pending.pop(xid, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    def _on_closed(self, conn: Connection, exc: BaseException | None) -> None:
        # Nothing more arrives: let go of the connection's hooks (no reference cycle remains).
        conn.receiver = None
        conn.call_failed = None
        pending, self.pending = self.pending, {}
        for xid, fut in pending.items():
            if not fut.done():
                fut.set_exception(RpcConnectionLost(f"connection lost before reply to {xid:#x}"))
        self.closed.set()

    def send_reply(self, inbound: Inbound, w: Writer) -> None:
        try:
            self.conn.send_reply(inbound, w)
        except ConnectionError as e:
            log.info("%s %s: reply not sent: %s", self.conn.kind, self.peer, e)

    def close(self) -> None:
        self.conn.close()


def _result(xid: int, inbound: Inbound) -> RpcResult:
    header, off = message.decode_reply(inbound.reader)
    body = header.body
    if body.stat == rpc.MSG_DENIED:
        rej = body.value
        assert isinstance(rej, rpc.rejected_reply)
        if rej.stat == rpc.AUTH_ERROR:
            assert isinstance(rej.value, int)
            raise RpcDenied(rej.stat, rpc.auth_stat(rej.value), None)
        assert isinstance(rej.value, rpc.mismatch_info)
        raise RpcDenied(rej.stat, None, (rej.value.low, rej.value.high))
    acc = body.value
    assert isinstance(acc, rpc.accepted_reply)
    data = acc.reply_data
    if data.stat != rpc.SUCCESS:
        mm = data.value
        raise RpcAcceptError(
            data.stat, (mm.low, mm.high) if isinstance(mm, rpc.mismatch_info) else None
        )
    return RpcResult(xid, inbound.reader, off, inbound, acc.verf)
