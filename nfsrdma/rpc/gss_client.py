"""RPCSEC_GSS version 1 (RFC 2203), the client's side: one context with one server.

The context is created on first use with the program's NULL procedure (RPCSEC_GSS_INIT, then
CONTINUE_INIT while GSS asks for more), and then every call carries a credential with the next
sequence number, a verifier that is the MIC of its header, and its arguments as they are
(krb5), with a checksum (krb5i) or encrypted (krb5p). A reply's verifier must be the MIC of
the call's sequence number, and protected results are verified or unwrapped before anyone sees
them.

When the server says the context is gone or expired (RPCSEC_GSS_CREDPROBLEM or
RPCSEC_GSS_CTXPROBLEM; the call did not run), ``refresh`` forgets it and the RPC layer resends
on a new one; NFSv4.1's reply cache keeps a resent COMPOUND exactly-once.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nfsrdma.rpc.errors import RpcDenied, RpcError
from nfsrdma.rpc.gss import SVC_NONE, unprotect
from nfsrdma.rpc.gss_mech import (
    GSS_S_COMPLETE,
    GSS_S_CONTINUE_NEEDED,
    GssFailure,
    GssInitiator,
    GssSecurityContext,
)
from nfsrdma.transport.base import ReplyExpectation
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.gen import rpcsec_gss as g
from nfsrdma.xdr.runtime import Writer, XdrError, pack

if TYPE_CHECKING:
    from nfsrdma.rpc.connection import RpcConnection, RpcResult

log = logging.getLogger(__name__)
_CALL_HEAD = struct.Struct(">IIIIII")
_SEQ = struct.Struct(">I")
# Leave room below MAXSEQ: a new context is made before the numbers run out.
_SEQ_LIMIT = g.MAXSEQ - 1024
# What protection adds to results: the sequence number, the body's length, a checksum or the
# wrap token's header, padding and trailer (Kerberos: well under 100 octets).
GSS_REPLY_OVERHEAD = 1024


class GssContextError(RpcError):
    """A context could not be made, or a reply failed its checks (wrong verifier, a checksum
    or encryption that does not verify): the reply is not to be believed."""


@dataclass(slots=True)
class _Context:
    mech: GssSecurityContext
    handle: bytes
    window: int
    next_seq: int = 1


@dataclass(slots=True)
class CallState:
    """What a call's reply is checked against."""

    context: _Context
    seq: int
    service: int


class GssClientAuth:
    """RPCSEC_GSS for the calls of one client to one server, with one service."""

    def __init__(self, initiator: GssInitiator, service: int) -> None:
        self.initiator = initiator
        self.service = service
        self._ctx: _Context | None = None
        self._lock = asyncio.Lock()
        self.contexts_made = 0

    @property
    def established(self) -> bool:
        return self._ctx is not None

    # -- context creation (5.2) ------------------------------------------------------------
    async def prepare(self, conn: RpcConnection, prog: int, vers: int) -> None:
        """Make the context if there is none (one creation at a time)."""
        if self._ctx is not None:
            return
        async with self._lock:
            if self._ctx is None:
                self._ctx = await self._create(conn, prog, vers)
                self.contexts_made += 1

    async def _create(self, conn: RpcConnection, prog: int, vers: int) -> _Context:
        mech = self.initiator.new_context()
        try:
            token = mech.step(None) or b""
        except GssFailure as e:
            raise GssContextError(f"Kerberos: {e}") from None
        handle = b""
        proc = g.RPCSEC_GSS_INIT
        while True:
            cred = _cred(proc, 0, self.service, handle)
            arg = g.rpc_gss_init_arg(token)

            def encode(w: Writer, a: g.rpc_gss_init_arg = arg) -> None:
                g.enc_rpc_gss_init_arg(w, a)

            result = await conn.call(prog, vers, 0, encode, cred=cred)
            try:
                res, _ = g.dec_rpc_gss_init_res(result.reader, result.offset)
            except XdrError as e:
                raise GssContextError(f"context creation results do not decode: {e}") from None
            if res.gss_major not in (GSS_S_COMPLETE, GSS_S_CONTINUE_NEEDED):
                raise GssContextError(
                    f"the server refused the context: GSS major {res.gss_major:#x}"
                    f" minor {res.gss_minor:#x}"
                )
            handle = bytes(res.handle)
            if res.gss_token:
                try:
                    token = mech.step(bytes(res.gss_token)) or b""
                except GssFailure as e:
                    raise GssContextError(f"server's token: {e}") from None
            if res.gss_major == GSS_S_COMPLETE:
                break
            proc = g.RPCSEC_GSS_CONTINUE_INIT
        if not mech.complete:
            raise GssContextError("the server completed a context that GSS did not")
        verf = result.verf
        if verf is None or verf.flavor != rpc.RPCSEC_GSS:
            raise GssContextError("context creation reply without its verifier")
        try:
            mech.verify_mic(_SEQ.pack(res.seq_window), bytes(verf.body))
        except GssFailure as e:
            raise GssContextError(f"context creation verifier: {e}") from None
        log.info("RPCSEC_GSS context made with %s (window %d)", conn.peer, res.seq_window)
        return _Context(mech, handle, res.seq_window)

    async def destroy(self, conn: RpcConnection, prog: int, vers: int) -> None:
        """RPCSEC_GSS_DESTROY (5.4) of the current context, if any."""
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            await conn.call(prog, vers, 0, None, auth=_Destroy(self, ctx))

    # -- data (5.3) ------------------------------------------------------------------------
    def encode_call(
        self,
        w: Writer,
        xid: int,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None,
    ) -> CallState:
        ctx = self._ctx
        if ctx is None:
            raise GssContextError("no RPCSEC_GSS context")
        if ctx.next_seq + 1 >= _SEQ_LIMIT:
            self._ctx = None  # the next call makes a new context
        return self.encode(w, xid, prog, vers, proc, encode_args, ctx, g.RPCSEC_GSS_DATA)

    def encode(
        self,
        w: Writer,
        xid: int,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None,
        ctx: _Context,
        gss_proc: int,
    ) -> CallState:
        seq = ctx.next_seq
        ctx.next_seq += 1
        start = len(w)
        w += _CALL_HEAD.pack(xid, rpc.CALL, 2, prog, vers, proc)
        rpc.enc_opaque_auth(w, _cred(gss_proc, seq, self.service, ctx.handle))
        mic = ctx.mech.get_mic(bytes(w[start:]))
        rpc.enc_opaque_auth(w, rpc.opaque_auth(rpc.RPCSEC_GSS, mic))
        if self.service == SVC_NONE:
            if encode_args is not None:
                encode_args(w)
        else:
            body = Writer(_SEQ.pack(seq))
            if encode_args is not None:
                encode_args(body)
            data = body.flatten()
            if self.service == g.rpc_gss_svc_integrity:
                g.enc_rpc_gss_integ_data(w, g.rpc_gss_integ_data(data, ctx.mech.get_mic(data)))
            else:
                g.enc_rpc_gss_priv_data(w, g.rpc_gss_priv_data(ctx.mech.wrap(data)))
        return CallState(ctx, seq, self.service)

    def expectation(self, expect: ReplyExpectation | None) -> ReplyExpectation | None:
        """Under integrity and privacy the results are inside the protected body: no Write
        chunk for READ data (RFC 8166 section 9.2), only room for the whole reply."""
        if expect is None or self.service == SVC_NONE or not expect.sinks:
            return expect
        inline = sum(len(s) + 3 for s in expect.sinks)
        return ReplyExpectation([], expect.max_size + inline + GSS_REPLY_OVERHEAD)

    def decode_result(self, state: CallState, result: RpcResult) -> RpcResult:
        from nfsrdma.rpc.connection import RpcResult

        verf = result.verf
        ctx = state.context
        if verf is None or verf.flavor != rpc.RPCSEC_GSS:
            raise GssContextError(f"reply to xid {result.xid:#x} without an RPCSEC_GSS verifier")
        try:
            ctx.mech.verify_mic(_SEQ.pack(state.seq), bytes(verf.body))
            reader, off = unprotect(
                ctx.mech, state.seq, state.service, result.reader, result.offset
            )
        except GssFailure as e:
            raise GssContextError(f"reply to xid {result.xid:#x}: {e}") from None
        return RpcResult(result.xid, reader, off, result.inbound, verf)

    def refresh(self, state: CallState | None, denied: RpcDenied) -> bool:
        """The server refused the context: forget it (if still the one used) and resend."""
        if denied.auth not in (rpc.RPCSEC_GSS_CREDPROBLEM, rpc.RPCSEC_GSS_CTXPROBLEM):
            return False
        if state is None or self._ctx is state.context:
            self._ctx = None
        log.info("RPCSEC_GSS context refused (%s); making a new one", denied.auth)
        return True


class _Destroy:
    """The one call that destroys a context (its own CallAuth)."""

    def __init__(self, auth: GssClientAuth, ctx: _Context) -> None:
        self.auth = auth
        self.ctx = ctx

    async def prepare(self, conn: RpcConnection, prog: int, vers: int) -> None:
        return None

    def encode_call(
        self,
        w: Writer,
        xid: int,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None,
    ) -> CallState:
        return self.auth.encode(w, xid, prog, vers, proc, None, self.ctx, g.RPCSEC_GSS_DESTROY)

    def expectation(self, expect: ReplyExpectation | None) -> ReplyExpectation | None:
        return expect

    def decode_result(self, state: CallState, result: RpcResult) -> RpcResult:
        return self.auth.decode_result(state, result)

    def refresh(self, state: CallState | None, denied: RpcDenied) -> bool:
        return False


def _cred(proc: int, seq: int, service: int, handle: bytes) -> rpc.opaque_auth:
    c = g.rpc_gss_cred_t(
        g.RPCSEC_GSS_VERS_1,
        g.rpc_gss_cred_vers_1_t(g.rpc_gss_proc_t(proc), seq, g.rpc_gss_service_t(service), handle),
    )
    return rpc.opaque_auth(rpc.RPCSEC_GSS, pack(g.enc_rpc_gss_cred_t, c))
