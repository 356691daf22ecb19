"""RPCSEC_GSS version 1 (RFC 2203), the server's side, sans-IO.

``GssServer.accept`` looks at a call whose credential flavour is RPCSEC_GSS and says what to do:

- context creation (RPCSEC_GSS_INIT / CONTINUE_INIT, section 5.2): the NULL procedure's
  arguments carry the initiator's token; the reply (``Reply``) carries ours, the context handle
  and the sequence window, with a verifier that is the MIC of the window once complete;
- data (RPCSEC_GSS_DATA, section 5.3): the header's MIC is verified (the call's verifier), the
  sequence number checked against the window, the arguments taken out of their integrity or
  privacy body; ``Admitted`` gives the handler its credential, arguments and reply verifier
  (the MIC of the sequence number), and a ``ReplyProtection`` that seals the results;
- destruction (RPCSEC_GSS_DESTROY, section 5.4): verified as data, then the context goes.

Bad input, with RFC 2203's answers:
- a credential that does not decode, another version, an unknown service: AUTH_BADCRED;
- an unknown, destroyed or unfinished handle, or a header MIC that does not verify:
  RPCSEC_GSS_CREDPROBLEM (sections 5.3.3.3, 5.3.3.4.2);
- a sequence number of MAXSEQ or more, an expired context, a failing GSS_GetMIC for the reply
  verifier: RPCSEC_GSS_CTXPROBLEM (5.3.3.1, 5.3.3.3, 5.3.3.4.1);
- a sequence number below the window or already seen: discarded without a reply (5.3.3.1);
- arguments whose checksum does not verify, that do not unwrap, or whose inner sequence number
  differs: GARBAGE_ARGS (5.3.3.4.2, 5.3.3.4.3), with the verifier;
- a context creation token that GSS refuses, or over ``max_token`` bytes: a context creation
  reply with the GSS major and minor status and no handle (5.2.3.2).
Nothing of a refused call reaches a handler.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

from nfsrdma.rpc.auth import Credential
from nfsrdma.rpc.gss_context import DEFAULT_MAX_CONTEXTS, DEFAULT_WINDOW, ContextTable
from nfsrdma.rpc.gss_identity import IdentityMap
from nfsrdma.rpc.gss_mech import (
    GSS_S_COMPLETE,
    GSS_S_CONTINUE_NEEDED,
    GSS_S_DEFECTIVE_TOKEN,
    GssAcceptor,
    GssFailure,
    GssSecurityContext,
)
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.gen import rpcsec_gss as g
from nfsrdma.xdr.runtime import U32, Reader, Writer, XdrError, pack, unpack

log = logging.getLogger(__name__)

SVC_NONE = g.rpc_gss_svc_none
SVC_INTEGRITY = g.rpc_gss_svc_integrity
SVC_PRIVACY = g.rpc_gss_svc_privacy
SERVICE_NAMES = {SVC_NONE: "krb5", SVC_INTEGRITY: "krb5i", SVC_PRIVACY: "krb5p"}
SERVICES = {name: svc for svc, name in SERVICE_NAMES.items()}
DEFAULT_MAX_TOKEN = 64 * 1024  # a Kerberos AP-REQ with a large PAC is well under this
_NONE_VERF = rpc.opaque_auth(rpc.AUTH_NONE, b"")
_SEQ = struct.Struct(">I")


# -- outcomes -------------------------------------------------------------------------------
@dataclass(slots=True)
class Drop:
    """Send nothing (RFC 2203 5.3.3.1: a sequence number outside the window or replayed)."""

    reason: str


@dataclass(slots=True)
class Denied:
    """MSG_DENIED / AUTH_ERROR with ``stat``."""

    stat: rpc.auth_stat
    reason: str


@dataclass(slots=True)
class Reply:
    """An accepted reply the RPCSEC_GSS layer gives itself: context creation results, a
    destroyed context's empty results, or GARBAGE_ARGS. ``protection`` seals ``results``."""

    stat: rpc.accept_stat
    verf: rpc.opaque_auth
    results: bytes = b""
    protection: ReplyProtection | None = None
    reason: str = ""


@dataclass(slots=True)
class Admitted:
    """A data call to hand to its procedure."""

    credential: Credential
    reader: Reader
    offset: int
    verf: rpc.opaque_auth
    protection: ReplyProtection


Outcome = Drop | Denied | Reply | Admitted


@dataclass(slots=True)
class ReplyProtection:
    """How a data call's results go back (RFC 2203 section 5.3.3.2): as they are (service
    none), as rpc_gss_integ_data (integrity) or rpc_gss_priv_data (privacy), each holding the
    call's sequence number followed by the results."""

    mech: GssSecurityContext
    seq: int
    service: int

    @property
    def touches_data(self) -> bool:
        """The results go inside a protected body: no DDP-eligible item may leave the stream
        (RFC 8166 section 9.2: under integrity and privacy the checksum or the encryption
        covers the data, so the whole message moves inline or as a Long message)."""
        return self.service != SVC_NONE

    def seal(self, w: Writer, results_at: int) -> Writer | None:
        """The reply with the results from ``results_at`` on replaced by their protected body;
        None if GSS cannot protect them (GSS_Wrap / GSS_GetMIC failure: the reply is dropped,
        RFC 2203 5.3.3.4.4)."""
        if self.service == SVC_NONE:
            return w
        body = _SEQ.pack(self.seq) + w.flatten()[results_at:]
        out = Writer(memoryview(w)[:results_at])
        try:
            if self.service == SVC_INTEGRITY:
                g.enc_rpc_gss_integ_data(out, g.rpc_gss_integ_data(body, self.mech.get_mic(body)))
            else:
                g.enc_rpc_gss_priv_data(out, g.rpc_gss_priv_data(self.mech.wrap(body)))
        except GssFailure as e:
            log.warning("RPCSEC_GSS: cannot protect a reply (%s); dropped", e)
            return None
        return out


def unprotect(
    mech: GssSecurityContext, seq: int, service: int, r: Reader, off: int
) -> tuple[Reader, int]:
    """Arguments (server) or results (client) out of their integrity or privacy body: a Reader
    over the procedure's bytes and the offset where they start. Raises GssFailure (checksum,
    unwrap) or XdrError (malformed body, another sequence number)."""
    if service == SVC_NONE:
        return r, off
    if r.chunks or r.ordered:
        raise XdrError("a protected body cannot have RDMA chunks (RFC 8166 section 9.2)", off)
    if service == SVC_INTEGRITY:
        integ = unpack(g.dec_rpc_gss_integ_data, r.buf, offset=off)
        body = bytes(integ.databody_integ)
        mech.verify_mic(body, bytes(integ.checksum))
    elif service == SVC_PRIVACY:
        priv = unpack(g.dec_rpc_gss_priv_data, r.buf, offset=off)
        body = mech.unwrap(bytes(priv.databody_priv))
    else:
        raise XdrError(f"unknown RPCSEC_GSS service {service}", off)
    if len(body) < 4 or _SEQ.unpack_from(body, 0)[0] != seq:
        raise XdrError("the protected body's sequence number is not the credential's", off)
    return Reader(body), 4


def seq_bytes(seq: int) -> bytes:
    return _SEQ.pack(seq)


# -- the server -----------------------------------------------------------------------------
class GssServer:
    def __init__(
        self,
        acceptor: GssAcceptor,
        identities: IdentityMap | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        max_contexts: int = DEFAULT_MAX_CONTEXTS,
        max_token: int = DEFAULT_MAX_TOKEN,
    ) -> None:
        self.acceptor = acceptor
        self.identities = identities or IdentityMap()
        self.window = window
        self.max_token = max_token
        self.contexts = ContextTable(max_contexts)
        # Called before GSS reads the keytab (context creation): the server gives the thread
        # its own file-system identity back (a VFS call may have left a client's on it).
        self.before_accept: Callable[[], None] | None = None

    def accept(
        self,
        header: bytes,
        cred: rpc.opaque_auth,
        verf: rpc.opaque_auth,
        proc: int,
        r: Reader,
        off: int,
        now: float,
    ) -> Outcome:
        """Decide about a call with an RPCSEC_GSS credential. ``header`` is the call's bytes
        from the XID to the end of the credential (what the verifier's MIC covers)."""
        try:
            gc = unpack(g.dec_rpc_gss_cred_t, cred.body)
        except XdrError as e:
            return Denied(rpc.AUTH_BADCRED, f"RPCSEC_GSS credential does not decode: {e}")
        c = gc.value
        assert c is not None
        if c.gss_proc in (g.RPCSEC_GSS_INIT, g.RPCSEC_GSS_CONTINUE_INIT):
            return self._create(c, verf, proc, r, off, now)
        return self._data(header, c, verf, proc, r, off, now)

    # -- context creation (5.2) ----------------------------------------------------------------
    def _create(
        self,
        c: g.rpc_gss_cred_vers_1_t,
        verf: rpc.opaque_auth,
        proc: int,
        r: Reader,
        off: int,
        now: float,
    ) -> Outcome:
        if proc != 0:
            return Denied(rpc.AUTH_BADCRED, "context creation on a procedure other than NULL")
        if verf.flavor != rpc.AUTH_NONE:
            return Denied(rpc.AUTH_BADVERF, "context creation with a verifier")
        if self.before_accept is not None:
            self.before_accept()
        if c.gss_proc == g.RPCSEC_GSS_INIT:
            ctx = self.contexts.create(self.acceptor.new_context(), self.window)
        else:
            found = self.contexts.get(bytes(c.handle))
            if found is None or found.established:
                return Denied(rpc.RPCSEC_GSS_CREDPROBLEM, "CONTINUE_INIT of an unknown context")
            ctx = found
        try:
            arg = unpack(g.dec_rpc_gss_init_arg, r.buf, offset=off)
        except XdrError as e:
            self.contexts.remove(ctx.handle)
            return Reply(rpc.GARBAGE_ARGS, _NONE_VERF, reason=f"init token: {e}")
        token = bytes(arg.gss_token)
        if len(token) > self.max_token:
            self.contexts.remove(ctx.handle)
            return self._creation_failed(GssFailure(GSS_S_DEFECTIVE_TOKEN, 0, "oversized token"))
        try:
            out = ctx.mech.step(token) or b""
        except GssFailure as e:
            self.contexts.remove(ctx.handle)
            return self._creation_failed(e)
        if not ctx.mech.complete:
            res = g.rpc_gss_init_res(ctx.handle, GSS_S_CONTINUE_NEEDED, 0, self.window, out)
            return Reply(rpc.SUCCESS, _NONE_VERF, pack(g.enc_rpc_gss_init_res, res))
        ctx.established = True
        ctx.principal = ctx.mech.peer_name
        lifetime = ctx.mech.lifetime
        ctx.expires = None if lifetime is None else now + lifetime
        try:
            mic = ctx.mech.get_mic(_SEQ.pack(self.window))
        except GssFailure as e:
            self.contexts.remove(ctx.handle)
            return self._creation_failed(e)
        log.info("RPCSEC_GSS context for %s", ctx.principal)
        res = g.rpc_gss_init_res(ctx.handle, GSS_S_COMPLETE, 0, self.window, out)
        verf = rpc.opaque_auth(rpc.RPCSEC_GSS, mic)
        return Reply(rpc.SUCCESS, verf, pack(g.enc_rpc_gss_init_res, res))

    @staticmethod
    def _creation_failed(e: GssFailure) -> Reply:
        res = g.rpc_gss_init_res(b"", e.major, e.minor, 0, b"")
        return Reply(rpc.SUCCESS, _NONE_VERF, pack(g.enc_rpc_gss_init_res, res), reason=str(e))

    # -- data and destruction (5.3, 5.4) ------------------------------------------------------
    def _data(
        self,
        header: bytes,
        c: g.rpc_gss_cred_vers_1_t,
        verf: rpc.opaque_auth,
        proc: int,
        r: Reader,
        off: int,
        now: float,
    ) -> Outcome:
        ctx = self.contexts.get(bytes(c.handle))
        if ctx is None or not ctx.established:
            return Denied(rpc.RPCSEC_GSS_CREDPROBLEM, "unknown RPCSEC_GSS context handle")
        if ctx.expired(now):
            self.contexts.remove(ctx.handle)
            return Denied(rpc.RPCSEC_GSS_CTXPROBLEM, f"context of {ctx.principal} expired")
        seq = c.seq_num
        if seq >= g.MAXSEQ:
            return Denied(rpc.RPCSEC_GSS_CTXPROBLEM, f"sequence number {seq} >= MAXSEQ")
        if not ctx.window.fresh(seq):
            return Drop(f"sequence number {seq} replayed or below the window")
        if verf.flavor != rpc.RPCSEC_GSS:
            return Denied(rpc.RPCSEC_GSS_CREDPROBLEM, "RPCSEC_GSS call without its verifier")
        try:
            ctx.mech.verify_mic(header, bytes(verf.body))
        except GssFailure as e:
            return Denied(rpc.RPCSEC_GSS_CREDPROBLEM, f"header checksum: {e}")
        if not ctx.window.accept(seq):
            return Drop(f"sequence number {seq} replayed")
        try:
            reply_verf = rpc.opaque_auth(rpc.RPCSEC_GSS, ctx.mech.get_mic(_SEQ.pack(seq)))
        except GssFailure as e:
            return Denied(rpc.RPCSEC_GSS_CTXPROBLEM, f"reply verifier: {e}")
        protection = ReplyProtection(ctx.mech, seq, c.service)
        if c.gss_proc == g.RPCSEC_GSS_DESTROY:
            self.contexts.remove(ctx.handle)
            log.info("RPCSEC_GSS context of %s destroyed", ctx.principal)
            return Reply(rpc.SUCCESS, reply_verf, b"", protection)
        if c.gss_proc != g.RPCSEC_GSS_DATA:
            return Denied(rpc.AUTH_BADCRED, f"RPCSEC_GSS procedure {c.gss_proc}")
        try:
            args, args_at = unprotect(ctx.mech, seq, c.service, r, off)
        except (GssFailure, XdrError) as e:
            return Reply(rpc.GARBAGE_ARGS, reply_verf, reason=f"protected arguments: {e}")
        credential = ctx.credentials.get(c.service)
        if credential is None:
            credential = ctx.credentials[c.service] = self._credential(ctx.principal, c.service)
        return Admitted(credential, args, args_at, reply_verf, protection)

    def _credential(self, principal: str, service: int) -> Credential:
        ident = self.identities.identity(principal)
        if ident is None:
            return Credential(rpc.RPCSEC_GSS, principal=principal, gss_service=service)
        uid, gid, gids = ident
        return Credential(rpc.RPCSEC_GSS, uid, gid, gids, principal=principal, gss_service=service)


def header_length(cred: rpc.opaque_auth) -> int:
    """Bytes from the XID to the end of the credential: what an RPCSEC_GSS verifier covers."""
    n = len(cred.body)
    return 32 + n + (-n & 3)


def u32(v: int) -> bytes:
    return U32.pack(v)
