"""The dispatcher's fast path (``Dispatcher.dispatch``: the usual call header read by one
``struct`` call, the reply header a constant) answers exactly as the full path
(``Dispatcher._dispatch``, the reference) does: random call headers, valid or not, truncated or
not, go to both, and every reply must be the same byte for byte, the handler seeing the same
call (credential, procedure, where the arguments start)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.server import Dispatcher, RpcCall, null_procedure
from nfsrdma.transport.base import Inbound
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import U32, Reader, Writer, XdrError, pack

PROG, VERS = 400100, 3


@dataclass
class _Conn:
    """What the dispatcher needs of an RpcConnection: replies are kept."""

    peer: str = "test:1"
    replies: list[bytes] = field(default_factory=list)
    calls_in_progress: int = 0

    def send_reply(self, inbound: Inbound, w: Writer) -> None:
        self.replies.append(b"".join(bytes(p) for p in w.pieces()))


def _who(call: RpcCall, w: Writer) -> None:
    """Results saying what the handler was given."""
    c = call.cred
    w += U32.pack(call.offset)
    w += U32.pack(len(call.reader.buf) - call.offset)
    w += pack(rpc.enc_opaque_auth, rpc.opaque_auth(c.flavor, repr(c).encode()[:400]))
    w += struct.pack(">III", call.prog, call.vers, call.proc)


def _garbage(call: RpcCall, w: Writer) -> None:
    w += b"some"
    raise XdrError("bad arguments", call.offset)


def _dispatcher() -> Dispatcher:
    d = Dispatcher()
    d.add(PROG, 2, {0: null_procedure})
    d.add(PROG, VERS, {0: null_procedure, 1: _who, 2: _garbage})
    d.add(PROG + 1, 1, {5: _who})
    return d


_SYS = [
    auth_sys(0, 0, (), "host"),
    auth_sys(1000, 100, (4, 24, 27), "client.example"),
    auth_sys(7, 7, tuple(range(16)), "x" * 255),
]


def _cred(rng: random.Random) -> bytes:
    kind = rng.randrange(7)
    if kind == 0:
        return pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_NONE, b""))
    if kind == 1:  # AUTH_NONE with a body
        return pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_NONE, b"abcd"))
    if kind == 2:  # AUTH_SYS that does not decode
        return pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_SYS, rng.randbytes(12)))
    if kind == 3:  # an unknown flavour, or RPCSEC_GSS without a GSS server
        flavor = rng.choice([rpc.RPCSEC_GSS, 9, 0x7FFFFFFF])
        return pack(rpc.enc_opaque_auth, rpc.opaque_auth(flavor, rng.randbytes(8)))
    if kind == 4:  # a length beyond the message
        return struct.pack(">II", rpc.AUTH_SYS, rng.choice([401, 1 << 20, 0xFFFFFFFF]))
    return pack(rpc.enc_opaque_auth, rng.choice(_SYS))


def _verf(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 1:
        return pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_NONE, b"abcd"))
    if kind == 2:
        return pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_SYS, b""))
    return pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_NONE, b""))


def _call(rng: random.Random) -> bytes:
    mtype = rng.choice([rpc.CALL] * 8 + [rpc.REPLY, 2])
    rpcvers = rng.choice([2] * 8 + [1, 3])
    prog, vers, proc = rng.choice(
        [(PROG, VERS, 1)] * 6
        + [(PROG, VERS, 0), (PROG, VERS, 2), (PROG, VERS, 9), (PROG, 2, 0), (PROG, 4, 1)]
        + [(PROG + 1, 1, 5), (PROG + 2, 1, 0)]
    )
    head = struct.pack(">IIIIII", rng.getrandbits(32), mtype, rpcvers, prog, vers, proc)
    msg = head + _cred(rng) + _verf(rng) + rng.randbytes(rng.choice([0, 0, 4, 13]))
    if rng.randrange(8) == 0:
        msg = msg[: rng.randrange(len(msg) + 1)]
    return msg


def _answers(d: Dispatcher, msg: bytes, fast: bool) -> list[bytes]:
    conn = _Conn()
    inbound = Inbound(Reader(msg))
    if fast:
        d.dispatch(conn, inbound)  # type: ignore[arg-type]
    else:
        d._dispatch(conn, inbound)  # type: ignore[arg-type]
    return conn.replies


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fast_and_full_dispatch_answer_alike(seed: int) -> None:
    rng = random.Random(seed)
    fast, full = _dispatcher(), _dispatcher()
    for _ in range(20):
        msg = _call(rng)
        # The full path first: it is what makes an AUTH_SYS credential known.
        assert _answers(fast, msg, True) == _answers(full, msg, False), msg.hex()


@pytest.mark.parametrize("flavor", [rpc.AUTH_SYS, rpc.AUTH_NONE])
def test_usual_calls_take_the_fast_path(flavor: int) -> None:
    """After its first call (AUTH_SYS: which parses the credential), a call with a known
    credential never reaches the full path."""
    cred = rpc.opaque_auth(rpc.AUTH_NONE, b"")
    if flavor == rpc.AUTH_SYS:  # one no other test has sent (credentials are remembered)
        cred = auth_sys(1000, 100, (4,), f"fast-path-{random.getrandbits(64):x}")
    d = _dispatcher()
    full = d._dispatch
    taken: list[bytes] = []

    def counting(conn: _Conn, inbound: Inbound) -> None:
        taken.append(bytes(inbound.reader.buf))
        full(conn, inbound)  # type: ignore[arg-type]

    d._dispatch = counting  # type: ignore[method-assign]
    verf = pack(rpc.enc_opaque_auth, rpc.opaque_auth(rpc.AUTH_NONE, b""))
    for xid in range(5):
        msg = struct.pack(">IIIIII", xid, rpc.CALL, 2, PROG, VERS, 1)
        msg += pack(rpc.enc_opaque_auth, cred) + verf + b"args"
        replies = _answers(d, msg, True)
        assert len(replies) == 1 and replies[0][:4] == struct.pack(">I", xid)
    assert len(taken) == (1 if cred.flavor == rpc.AUTH_SYS else 0)
