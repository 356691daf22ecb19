"""Call and reply headers (RFC 5531 section 9) on top of the generated codec.

Arguments and results follow the header in the same XDR stream; these functions encode or
decode the header and say where the body starts.

The header of nearly every message has one of a few shapes: a call with an AUTH_NONE or
AUTH_SYS credential and an AUTH_NONE verifier, an accepted SUCCESS reply with an AUTH_NONE
verifier. Their bytes are produced once, by the generated codec, and reused as templates; a
message that matches no template goes through the generated codec in full.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import U32, Buffer, Reader, Writer, XdrError, pack

RPC_VERSION = 2
_XID_TYPE = struct.Struct(">II")
_CALL_HEAD = struct.Struct(">IIIIII")  # xid, CALL, rpcvers, prog, vers, proc
_CALL_FAST = struct.Struct(">IIIIIIII")  # ... plus credential flavor and length

AUTH_NONE_VERF = rpc.opaque_auth(rpc.AUTH_NONE, b"")
_AUTH_NONE_BYTES = pack(rpc.enc_opaque_auth, AUTH_NONE_VERF)


def _reply_ok() -> rpc.reply_body:
    data = rpc.accepted_reply_data(rpc.SUCCESS, None)
    return rpc.reply_body(rpc.MSG_ACCEPTED, rpc.accepted_reply(AUTH_NONE_VERF, data))


# An accepted SUCCESS reply, AUTH_NONE verifier: everything after the XID.
_REPLY_OK = _reply_ok()
_REPLY_OK_TAIL = pack(rpc.enc_rpc_msg, rpc.rpc_msg(0, rpc.rpc_msg_body(rpc.REPLY, _REPLY_OK)))[4:]
_REPLY_OK_LEN = 4 + len(_REPLY_OK_TAIL)
# For the dispatcher's fast path (rpc/server.py): a call's head up to its credential's length,
# an AUTH_NONE verifier as encoded, and an accepted SUCCESS reply after its XID.
CALL_FAST = _CALL_FAST
AUTH_NONE_BYTES = _AUTH_NONE_BYTES
REPLY_OK_TAIL = _REPLY_OK_TAIL
_auth_bytes: dict[tuple[int, bytes], bytes] = {}
_CALL = rpc.CALL
_opaque_auth = rpc.opaque_auth
_call_body = rpc.call_body
_U32_unpack_from = U32.unpack_from


@dataclass(slots=True)
class ReplyHeader:
    xid: int
    body: rpc.reply_body

    @property
    def accepted(self) -> rpc.accepted_reply | None:
        v = self.body.value
        return v if isinstance(v, rpc.accepted_reply) else None


def peek(buf: Buffer) -> tuple[int, int]:
    """(xid, msg_type) of a message; raises XdrError when even those are missing."""
    if len(buf) < 8:
        raise XdrError("message shorter than an RPC header", 0)
    xid, mtype = _XID_TYPE.unpack_from(buf, 0)
    return xid, mtype


_UNKNOWN = object()
# The last credential encoded: the object, its body and flavor then, and its bytes. A client
# sends the same credential object with every call; the body and flavor are compared too, as
# the object could have been changed since.
_last_auth: tuple[rpc.opaque_auth, object, int, bytes] = (
    AUTH_NONE_VERF,
    AUTH_NONE_VERF.body,
    AUTH_NONE_VERF.flavor,
    _AUTH_NONE_BYTES,
)


def _auth(cred: rpc.opaque_auth) -> bytes:
    global _last_auth
    last = _last_auth
    if cred is last[0] and cred.body is last[1] and cred.flavor == last[2]:
        return last[3]
    key = (cred.flavor, bytes(cred.body))
    encoded = _auth_bytes.get(key)
    if encoded is None:
        encoded = pack(rpc.enc_opaque_auth, cred)
        if len(_auth_bytes) < 256:  # a client uses one or two credentials
            _auth_bytes[key] = encoded
    body = cred.body  # a body that can change in place (not bytes) is never taken as known
    _last_auth = (cred, body if body.__class__ is bytes else _UNKNOWN, cred.flavor, encoded)
    return encoded


def encode_call(
    w: Writer,
    xid: int,
    prog: int,
    vers: int,
    proc: int,
    cred: rpc.opaque_auth,
    verf: rpc.opaque_auth = AUTH_NONE_VERF,
) -> None:
    w += _CALL_HEAD.pack(xid, _CALL, RPC_VERSION, prog, vers, proc)
    w += _auth(cred)
    w += _AUTH_NONE_BYTES if verf is AUTH_NONE_VERF else _auth(verf)


def decode_call(r: Reader) -> tuple[int, rpc.call_body, int]:
    """(xid, call header, offset of the arguments)."""
    buf = r.buf
    if len(buf) >= 40:
        xid, mtype, rpcvers, prog, vers, proc, flavor, n = _CALL_FAST.unpack_from(buf, 0)
        end = 32 + n + (-n & 3)
        if mtype == _CALL and n <= 400 and buf[end : end + 8] == _AUTH_NONE_BYTES:
            cred = _opaque_auth(flavor, bytes(buf[32 : 32 + n]))
            return xid, _call_body(rpcvers, prog, vers, proc, cred, AUTH_NONE_VERF), end + 8
    (xid,) = struct.unpack_from(">I", buf, 0)
    msg, off = rpc.dec_rpc_msg(r, 0)
    if msg.body.mtype != rpc.CALL or not isinstance(msg.body.value, rpc.call_body):
        raise XdrError("not a call", 4)
    return xid, msg.body.value, off


def encode_accepted(
    w: Writer,
    xid: int,
    stat: rpc.accept_stat = rpc.SUCCESS,
    mismatch: tuple[int, int] | None = None,
    verf: rpc.opaque_auth = AUTH_NONE_VERF,
) -> None:
    """An accepted reply header; for SUCCESS the results are to be appended by the caller."""
    if stat == rpc.SUCCESS and verf is AUTH_NONE_VERF:
        w += U32.pack(xid)
        w += _REPLY_OK_TAIL
        return
    data = rpc.accepted_reply_data(stat, rpc.mismatch_info(*mismatch) if mismatch else None)
    body = rpc.reply_body(rpc.MSG_ACCEPTED, rpc.accepted_reply(verf, data))
    rpc.enc_rpc_msg(w, rpc.rpc_msg(xid, rpc.rpc_msg_body(rpc.REPLY, body)))


def encode_denied(
    w: Writer,
    xid: int,
    *,
    auth: rpc.auth_stat | None = None,
    mismatch: tuple[int, int] | None = None,
) -> None:
    """A MSG_DENIED reply: AUTH_ERROR with ``auth``, or RPC_MISMATCH with ``mismatch``."""
    if auth is not None:
        rej = rpc.rejected_reply(rpc.AUTH_ERROR, auth)
    else:
        assert mismatch is not None
        rej = rpc.rejected_reply(rpc.RPC_MISMATCH, rpc.mismatch_info(*mismatch))
    body = rpc.reply_body(rpc.MSG_DENIED, rej)
    rpc.enc_rpc_msg(w, rpc.rpc_msg(xid, rpc.rpc_msg_body(rpc.REPLY, body)))


def decode_reply(r: Reader) -> tuple[ReplyHeader, int]:
    """The reply header and the offset where the results start."""
    buf = r.buf
    if buf[4:_REPLY_OK_LEN] == _REPLY_OK_TAIL:
        (xid,) = _U32_unpack_from(buf, 0)
        return ReplyHeader(xid, _REPLY_OK), _REPLY_OK_LEN
    msg, off = rpc.dec_rpc_msg(r, 0)
    if msg.body.mtype != rpc.REPLY or not isinstance(msg.body.value, rpc.reply_body):
        raise XdrError("not a reply", 4)
    return ReplyHeader(msg.xid, msg.body.value), off
