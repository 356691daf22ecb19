"""The session operations: EXCHANGE_ID, CREATE_SESSION, SEQUENCE, BIND_CONN_TO_SESSION,
DESTROY_SESSION, DESTROY_CLIENTID, RECLAIM_COMPLETE, BACKCHANNEL_CTL (RFC 8881 sections 18.33-18.37,
18.46, 18.50, 18.51).

Thin glue from the COMPOUND context to ``nfsrdma.session.server.ServerSessions``; the rules live
there. COMPOUND processing (compound.py) enforces the positions: SEQUENCE first, the sessionless
operations alone."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager

from nfsrdma.nfs4 import grace
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.rpc.auth import Credential
from nfsrdma.session.errors import SessionError
from nfsrdma.session.server import ServerSessions
from nfsrdma.session.shares import source_of
from nfsrdma.xdr.gen import nfs4, rpc

OK = nfs4.NFS4_OK


def principal_of(cred: Credential) -> Hashable:
    """The principal of 18.35.4: for RPCSEC_GSS the authenticated principal (whatever the
    service); for AUTH_NONE / AUTH_SYS the identity claimed (the machine name is left out: it
    is not part of who the caller is)."""
    if cred.flavor == rpc.RPCSEC_GSS:
        return ("gss", cred.principal)
    return (cred.flavor != 0, cred.uid, cred.gid, tuple(sorted(cred.gids)))


@contextmanager
def _nfs4_errors() -> Iterator[None]:
    try:
        yield
    except SessionError as e:
        raise Nfs4Error(e.status) from None


def _sessions(ctx: CompoundContext) -> ServerSessions:
    return ctx.server.sessions


def exchange_id(ctx: CompoundContext, args: nfs4.EXCHANGE_ID4args) -> nfs4.EXCHANGE_ID4res:
    with _nfs4_errors():
        resok = _sessions(ctx).exchange_id(
            args,
            principal=principal_of(ctx.principal),
            now=ctx.now,
            source=source_of(ctx.conn.peer),
            # SP4_MACH_CRED needs RPCSEC_GSS with integrity or privacy (18.35.3)
            gss=ctx.principal.flavor == rpc.RPCSEC_GSS and ctx.principal.gss_service >= 2,
        )
    record = _sessions(ctx).client(resok.eir_clientid)
    if record is not None:
        record.minorversion = ctx.minorversion
    return nfs4.EXCHANGE_ID4res(OK, resok)


def create_session(ctx: CompoundContext, args: nfs4.CREATE_SESSION4args) -> nfs4.CREATE_SESSION4res:
    with _nfs4_errors():
        resok = _sessions(ctx).create_session(
            args,
            conn=ctx.conn,
            principal=principal_of(ctx.principal),
            now=ctx.now,
            source=source_of(ctx.conn.peer),
        )
    _back_channel_changed(ctx, args.csa_clientid)
    return nfs4.CREATE_SESSION4res(OK, resok)


def sequence(ctx: CompoundContext, args: nfs4.SEQUENCE4args) -> nfs4.SEQUENCE4res:
    try:  # (no _nfs4_errors: a context manager costs more than SEQUENCE's own checks)
        seq = ctx.server.sessions.sequence(
            args,
            conn=ctx.conn,
            now=ctx.now,
            op_count=ctx.op_count,
            request_size=ctx.request_size,
        )
    except SessionError as e:
        raise Nfs4Error(e.status) from None
    ctx.session = seq.session
    ctx.sequence = seq
    ctx.cachethis = seq.cachethis
    return nfs4.SEQUENCE4res(OK, seq.resok)


def bind_conn_to_session(
    ctx: CompoundContext, args: nfs4.BIND_CONN_TO_SESSION4args
) -> nfs4.BIND_CONN_TO_SESSION4res:
    with _nfs4_errors():
        resok = _sessions(ctx).bind_conn_to_session(
            args, conn=ctx.conn, now=ctx.now, principal=principal_of(ctx.principal)
        )
    session = _sessions(ctx).session(args.bctsa_sessid)
    if session is not None:
        _back_channel_changed(ctx, session.clientid)
    return nfs4.BIND_CONN_TO_SESSION4res(OK, resok)


def destroy_session(
    ctx: CompoundContext, args: nfs4.DESTROY_SESSION4args
) -> nfs4.DESTROY_SESSION4res:
    with _nfs4_errors():
        _sessions(ctx).destroy_session(
            args.dsa_sessionid,
            conn=ctx.conn,
            current=ctx.session,
            last_op=ctx.op_index == ctx.op_count - 1,
            principal=principal_of(ctx.principal),
        )
    return nfs4.DESTROY_SESSION4res(OK)


def destroy_clientid(
    ctx: CompoundContext, args: nfs4.DESTROY_CLIENTID4args
) -> nfs4.DESTROY_CLIENTID4res:
    with _nfs4_errors():
        _sessions(ctx).destroy_clientid(
            args.dca_clientid,
            current=ctx.session,
            now=ctx.now,
            principal=principal_of(ctx.principal),
        )
    return nfs4.DESTROY_CLIENTID4res(OK)


def reclaim_complete(
    ctx: CompoundContext, args: nfs4.RECLAIM_COMPLETE4args
) -> nfs4.RECLAIM_COMPLETE4res:
    if args.rca_one_fs:
        # Per file system completion is optional to act on; the current filehandle must exist.
        ctx.fh()
        return nfs4.RECLAIM_COMPLETE4res(OK)
    with _nfs4_errors():
        _sessions(ctx).reclaim_complete(ctx.clientid)
    grace.reclaim_completed(ctx)
    return nfs4.RECLAIM_COMPLETE4res(OK)


def backchannel_ctl(
    ctx: CompoundContext, args: nfs4.BACKCHANNEL_CTL4args
) -> nfs4.BACKCHANNEL_CTL4res:
    session = ctx.session
    if session is None:
        raise Nfs4Error(nfs4.NFS4ERR_OP_NOT_IN_SESSION)
    with _nfs4_errors():
        _sessions(ctx).backchannel_ctl(session, args.bca_cb_program, args.bca_sec_parms)
    _back_channel_changed(ctx, session.clientid)
    return nfs4.BACKCHANNEL_CTL4res(OK)


def _back_channel_changed(ctx: CompoundContext, clientid: int) -> None:
    """Probe the client's back channel (CB_NULL) now, so its first OPEN can get a delegation."""
    service = ctx.server.delegation_service
    if service is not None:
        service.back_channel_changed(clientid)
