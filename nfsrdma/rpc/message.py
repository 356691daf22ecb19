"""Call and reply headers (RFC 5531 section 9) on top of the generated codec.

Arguments and results follow the header in the same XDR stream; these functions encode or
decode the header and say where the body starts."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import Reader, Writer, XdrError

RPC_VERSION = 2
_XID_TYPE = struct.Struct(">II")
_CALL_HEAD = struct.Struct(">IIIIII")  # xid, CALL, rpcvers, prog, vers, proc

AUTH_NONE_VERF = rpc.opaque_auth(rpc.AUTH_NONE, b"")


@dataclass(slots=True)
class ReplyHeader:
    xid: int
    body: rpc.reply_body

    @property
    def accepted(self) -> rpc.accepted_reply | None:
        v = self.body.value
        return v if isinstance(v, rpc.accepted_reply) else None


def peek(buf: memoryview) -> tuple[int, int]:
    """(xid, msg_type) of a message; raises XdrError when even those are missing."""
    if len(buf) < 8:
        raise XdrError("message shorter than an RPC header", 0)
    xid, mtype = _XID_TYPE.unpack_from(buf, 0)
    return xid, mtype


def encode_call(
    w: Writer,
    xid: int,
    prog: int,
    vers: int,
    proc: int,
    cred: rpc.opaque_auth,
    verf: rpc.opaque_auth = AUTH_NONE_VERF,
) -> None:
    w += _CALL_HEAD.pack(xid, rpc.CALL, RPC_VERSION, prog, vers, proc)
    rpc.enc_opaque_auth(w, cred)
    rpc.enc_opaque_auth(w, verf)


def decode_call(r: Reader) -> tuple[int, rpc.call_body, int]:
    """(xid, call header, offset of the arguments)."""
    (xid,) = struct.unpack_from(">I", r.buf, 0)
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
    msg, off = rpc.dec_rpc_msg(r, 0)
    if msg.body.mtype != rpc.REPLY or not isinstance(msg.body.value, rpc.reply_body):
        raise XdrError("not a reply", 4)
    return ReplyHeader(msg.xid, msg.body.value), off
