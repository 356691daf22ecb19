"""Bad RPCSEC_GSS input gets RFC 2203's answer and never reaches a procedure.

A test program is added to our server's dispatcher; its procedure records every call that
reaches it. Calls are made with a real Kerberos context (real KDC), then forged, replayed or
corrupted on the wire. A call the server must drop silently is followed by a good call on the
same connection: the server answers calls on a connection in order, so once the good call's
reply is in, the dropped call's reply would have been too."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.errors import RpcAcceptError, RpcDenied
from nfsrdma.rpc.gss import SVC_INTEGRITY, SVC_NONE, SVC_PRIVACY
from nfsrdma.rpc.gss_client import GssClientAuth, _cred
from nfsrdma.rpc.gss_krb5 import Krb5Initiator
from nfsrdma.rpc.gss_mech import GSS_S_DEFECTIVE_TOKEN
from nfsrdma.rpc.server import RpcCall, null_procedure
from nfsrdma.server import NFSServer
from nfsrdma.transport.base import Inbound
from nfsrdma.transport.tcp import connect_tcp
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.gen import rpcsec_gss as g
from nfsrdma.xdr.runtime import Writer
from tests.kdc import SERVER_HOST, Kdc
from tests.unit.gss.helpers import gss_server

PROG, VERS, ECHO = 0x20000999, 1, 1


@dataclass
class Bed:
    server: NFSServer
    rc: RpcConnection
    ccache: Path
    reached: list[bytes] = field(default_factory=list)

    def auth(self, service: int) -> GssClientAuth:
        return GssClientAuth(Krb5Initiator(SERVER_HOST, ccache=f"FILE:{self.ccache}"), service)

    async def echo(self, auth: GssClientAuth, payload: bytes) -> bytes:
        """A good call: the procedure gets ``payload`` and answers it back."""
        res = await self.rc.call(PROG, VERS, ECHO, lambda w: w.extend(_opaque(payload)), auth=auth)
        (n,) = struct.unpack_from(">I", res.reader.buf, res.offset)
        return bytes(res.reader.buf[res.offset + 4 : res.offset + 4 + n])

    def send_raw(self, xid: int, msg: bytes) -> asyncio.Future[Inbound]:
        fut: asyncio.Future[Inbound] = asyncio.get_running_loop().create_future()
        self.rc.pending[xid] = fut
        self.rc.conn.send_call(xid, Writer(msg), None)
        return fut

    async def barrier(self) -> None:
        """A good call on the same connection, answered after anything sent before it."""
        await self.rc.call(PROG, VERS, 0)


def _opaque(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b + b"\0" * (-len(b) & 3)


@asynccontextmanager
async def bed(kdc: Kdc, tmp_path: Path) -> AsyncIterator[Bed]:
    cc = tmp_path / "cc"
    kdc.kinit(cc, kdc.numeric_principal, kdc.numeric_keytab)
    async with gss_server(kdc, tmp_path / "export") as server:
        b = Bed(server, None, cc)  # type: ignore[arg-type]

        def echo(call: RpcCall, w: Writer) -> None:
            buf = call.reader.buf
            (n,) = struct.unpack_from(">I", buf, call.offset)
            payload = bytes(buf[call.offset + 4 : call.offset + 4 + n])
            b.reached.append(payload)
            w += _opaque(payload)

        server.dispatcher.add(PROG, VERS, {0: null_procedure, ECHO: echo})
        b.rc = RpcConnection(await connect_tcp("127.0.0.1", server.tcp_port))
        try:
            yield b
        finally:
            b.rc.close()


def _signed_call(
    auth: GssClientAuth,
    xid: int,
    payload: bytes,
    *,
    gss_proc: int = g.RPCSEC_GSS_DATA,
    tamper: Callable[[bytearray], None] | None = None,
) -> bytes:
    """A call made exactly as our client makes it (next sequence number), then ``tamper``ed."""
    w = Writer()
    ctx = auth._ctx
    assert ctx is not None
    auth.encode(w, xid, PROG, VERS, ECHO, lambda a: a.extend(_opaque(payload)), ctx, gss_proc)
    msg = bytearray(w.flatten())
    if tamper is not None:
        tamper(msg)
    return bytes(msg)


def _cred_len(msg: bytes) -> int:
    return 32 + struct.unpack_from(">I", msg, 28)[0]


@pytest.mark.parametrize("service", [SVC_NONE, SVC_INTEGRITY, SVC_PRIVACY])
async def test_good_calls_reach_the_procedure(kdc: Kdc, tmp_path: Path, service: int) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(service)
        assert await b.echo(auth, b"one") == b"one"
        assert await b.echo(auth, b"two" * 1000) == b"two" * 1000
        assert b.reached == [b"one", b"two" * 1000]


async def test_a_replayed_call_is_dropped(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_INTEGRITY)
        await b.echo(auth, b"warm-up")
        msg = _signed_call(auth, 0x1234, b"once")
        first = b.send_raw(0x1234, msg)
        await first  # answered
        again = b.send_raw(0x1234, msg)  # the very same bytes: same sequence number
        await b.barrier()
        assert not again.done()
        assert b.reached == [b"warm-up", b"once"]


async def test_a_sequence_number_below_the_window_is_dropped(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_NONE)
        await b.echo(auth, b"x")
        assert auth._ctx is not None
        auth._ctx.next_seq = 1000
        await b.echo(auth, b"at 1000")
        auth._ctx.next_seq = 1000 - 128  # the window is 128: 872 is just below it
        old = b.send_raw(0x77, _signed_call(auth, 0x77, b"old"))
        auth._ctx.next_seq = 1000 - 127  # inside the window, not seen: accepted
        assert await b.echo(auth, b"late but in") == b"late but in"
        await b.barrier()
        assert not old.done()
        assert b.reached == [b"x", b"at 1000", b"late but in"]


async def test_maxseq_is_a_context_problem(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_NONE)
        await b.echo(auth, b"x")
        assert auth._ctx is not None
        auth._ctx.next_seq = g.MAXSEQ
        fut = b.send_raw(0x55, _signed_call(auth, 0x55, b"too far"))
        await _denied(fut, rpc.RPCSEC_GSS_CTXPROBLEM)
        assert b.reached == [b"x"]


async def _denied(fut: asyncio.Future[Inbound], stat: rpc.auth_stat) -> None:
    from nfsrdma.rpc.connection import _result

    inbound = await fut
    with pytest.raises(RpcDenied) as e:
        _result(0, inbound)
    assert e.value.auth == stat


async def _garbage(fut: asyncio.Future[Inbound]) -> rpc.opaque_auth | None:
    from nfsrdma.rpc.connection import _result

    inbound = await fut
    with pytest.raises(RpcAcceptError) as e:
        _result(0, inbound)
    assert e.value.stat == rpc.GARBAGE_ARGS
    from nfsrdma.rpc import message

    header, _ = message.decode_reply(inbound.reader)
    acc = header.accepted
    return None if acc is None else acc.verf


async def test_a_header_checksum_that_does_not_verify(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_NONE)
        await b.echo(auth, b"x")

        def forge_proc(m: bytearray) -> None:
            m[20:24] = struct.pack(">I", 0)  # another procedure under the same MIC

        fut = b.send_raw(0x66, _signed_call(auth, 0x66, b"forged", tamper=forge_proc))
        await _denied(fut, rpc.RPCSEC_GSS_CREDPROBLEM)

        def flip_verifier(m: bytearray) -> None:
            m[_cred_len(m) + 8 + 10] ^= 0xFF

        fut = b.send_raw(0x67, _signed_call(auth, 0x67, b"bad mic", tamper=flip_verifier))
        await _denied(fut, rpc.RPCSEC_GSS_CREDPROBLEM)
        assert b.reached == [b"x"]


def _flip_body(m: bytearray) -> None:
    m[-8] ^= 0x01  # inside the protected body's checksum or ciphertext


@pytest.mark.parametrize("service", [SVC_INTEGRITY, SVC_PRIVACY])
async def test_protected_arguments_that_do_not_verify(
    kdc: Kdc, tmp_path: Path, service: int
) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(service)
        await b.echo(auth, b"x")
        fut = b.send_raw(0x68, _signed_call(auth, 0x68, b"y" * 64, tamper=_flip_body))
        verf = await _garbage(fut)
        # GARBAGE_ARGS still carries the verifier of the call's sequence number (5.3.3.2).
        assert verf is not None and verf.flavor == rpc.RPCSEC_GSS
        assert b.reached == [b"x"]
        assert await b.echo(auth, b"still served") == b"still served"


async def test_an_integrity_body_with_another_sequence_number(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_INTEGRITY)
        await b.echo(auth, b"x")
        ctx = auth._ctx
        assert ctx is not None
        # A valid header for sequence n whose body is another call's (sequence n - 1).
        body_of_earlier = _signed_call(auth, 0x70, b"earlier")
        fresh = _signed_call(auth, 0x71, b"later")
        spliced = (
            fresh[: _cred_len(fresh) + 8 + _verf_len(fresh)]
            + body_of_earlier[_cred_len(body_of_earlier) + 8 + _verf_len(body_of_earlier) :]
        )
        await _garbage(b.send_raw(0x71, spliced))
        assert b.reached == [b"x"]


def _verf_len(m: bytes) -> int:
    n = struct.unpack_from(">I", m, _cred_len(m) + 4)[0]
    return n + (-n & 3)


async def test_unknown_and_destroyed_handles(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_NONE)
        await b.echo(auth, b"x")
        ctx = auth._ctx
        assert ctx is not None
        real = ctx.handle
        ctx.handle = b"\x01" * 16
        await _denied(b.send_raw(0x80, _signed_call(auth, 0x80, b"?")), rpc.RPCSEC_GSS_CREDPROBLEM)
        ctx.handle = real
        await auth.destroy(b.rc, PROG, VERS)
        assert len(b.server.gss.contexts) == 0  # type: ignore[union-attr]
        auth._ctx = ctx  # keep using the destroyed one
        await _denied(b.send_raw(0x81, _signed_call(auth, 0x81, b"?")), rpc.RPCSEC_GSS_CREDPROBLEM)
        assert b.reached == [b"x"]


async def test_client_remakes_a_context_the_server_forgot(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_PRIVACY)
        assert await b.echo(auth, b"a") == b"a"
        assert b.server.gss is not None
        for handle in list(b.server.gss.contexts._by_handle):
            b.server.gss.contexts.remove(handle)  # as after a server restart or expiry
        assert await b.echo(auth, b"b") == b"b"  # CREDPROBLEM, new context, resent
        assert auth.contexts_made == 2
        assert b.reached == [b"a", b"b"]


async def test_an_expired_context_is_a_context_problem(kdc: Kdc, tmp_path: Path) -> None:
    async with bed(kdc, tmp_path) as b:
        auth = b.auth(SVC_INTEGRITY)
        await b.echo(auth, b"a")
        assert b.server.gss is not None
        (sctx,) = b.server.gss.contexts._by_handle.values()
        sctx.expires = 0.0  # the ticket's end is behind us
        fut = b.send_raw(0x90, _signed_call(auth, 0x90, b"late"))
        await _denied(fut, rpc.RPCSEC_GSS_CTXPROBLEM)
        assert await b.echo(auth, b"renewed") == b"renewed"  # a new context, resent
        assert auth.contexts_made == 2
        assert b.reached == [b"a", b"renewed"]


def _init_call(xid: int, cred_body: bytes, token: bytes) -> bytes:
    w = Writer()
    w += struct.pack(">IIIIII", xid, 0, 2, PROG, VERS, 0)
    rpc.enc_opaque_auth(w, rpc.opaque_auth(rpc.RPCSEC_GSS, cred_body))
    rpc.enc_opaque_auth(w, rpc.opaque_auth(rpc.AUTH_NONE, b""))
    w += _opaque(token)
    return bytes(w)


async def test_bad_credentials_and_oversized_tokens(kdc: Kdc, tmp_path: Path) -> None:
    from nfsrdma.rpc.connection import _result

    async with bed(kdc, tmp_path) as b:
        init = _cred(g.RPCSEC_GSS_INIT, 0, SVC_NONE, b"").body
        # An oversized context creation token: a creation failure with GSS's status, no handle.
        res = _result(0, await b.send_raw(0xA0, _init_call(0xA0, init, b"\0" * 70000)))
        out, _ = g.dec_rpc_gss_init_res(res.reader, res.offset)
        assert out.gss_major == GSS_S_DEFECTIVE_TOKEN and out.handle == b""
        # A token GSS does not accept: the same, with GSS's own status.
        res = _result(0, await b.send_raw(0xA1, _init_call(0xA1, init, b"not a token")))
        out, _ = g.dec_rpc_gss_init_res(res.reader, res.offset)
        assert out.gss_major != 0 and out.handle == b""
        assert len(b.server.gss.contexts) == 0  # type: ignore[union-attr]
        # A credential that does not decode, or of another RPCSEC_GSS version: AUTH_BADCRED.
        await _denied(b.send_raw(0xA2, _init_call(0xA2, b"\0\0\0\1", b"")), rpc.AUTH_BADCRED)
        v2 = struct.pack(">I", 2) + init[4:]
        await _denied(b.send_raw(0xA3, _init_call(0xA3, v2, b"")), rpc.AUTH_BADCRED)
        svc9 = init[:12] + struct.pack(">I", 9) + init[16:]
        await _denied(b.send_raw(0xA4, _init_call(0xA4, svc9, b"")), rpc.AUTH_BADCRED)
        assert b.reached == []
