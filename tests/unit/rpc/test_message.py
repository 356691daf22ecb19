"""The RPC header templates agree with the generated codec, byte for byte and value for value."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.rpc import message
from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import Reader, Writer, pack


@settings(max_examples=300, deadline=None)
@given(
    xid=st.integers(0, 2**32 - 1),
    prog=st.integers(0, 2**32 - 1),
    proc=st.integers(0, 2**32 - 1),
    flavor=st.integers(0, 2**32 - 1),
    body=st.binary(max_size=400),
    verf=st.sampled_from([b"", b"v" * 8]),
    args=st.binary(max_size=16),
)
def test_decode_call_matches_the_codec(
    xid: int, prog: int, proc: int, flavor: int, body: bytes, verf: bytes, args: bytes
) -> None:
    cred = rpc.opaque_auth(flavor, body)
    verifier = rpc.opaque_auth(rpc.AUTH_NONE if not verf else rpc.AUTH_SYS, verf)
    call = rpc.call_body(2, prog, 4, proc, cred, verifier)
    data = pack(rpc.enc_rpc_msg, rpc.rpc_msg(xid, rpc.rpc_msg_body(rpc.CALL, call))) + args
    w = Writer()
    message.encode_call(w, xid, prog, 4, proc, cred, verifier)
    assert bytes(w) + args == data
    got_xid, got, off = message.decode_call(Reader(data))
    assert (got_xid, got, off) == (xid, call, len(data) - len(args))


@given(xid=st.integers(0, 2**32 - 1), results=st.binary(max_size=16))
def test_reply_template_matches_the_codec(xid: int, results: bytes) -> None:
    w = Writer()
    message.encode_accepted(w, xid)
    body = rpc.reply_body(
        rpc.MSG_ACCEPTED,
        rpc.accepted_reply(message.AUTH_NONE_VERF, rpc.accepted_reply_data(rpc.SUCCESS)),
    )
    expected = pack(rpc.enc_rpc_msg, rpc.rpc_msg(xid, rpc.rpc_msg_body(rpc.REPLY, body)))
    assert bytes(w) == expected
    header, off = message.decode_reply(Reader(expected + results))
    assert (header.xid, header.body, off) == (xid, body, len(expected))
    # Any other shape goes through the codec.
    w = Writer()
    message.encode_accepted(w, xid, rpc.PROC_UNAVAIL)
    header, off = message.decode_reply(Reader(bytes(w)))
    assert header.accepted is not None and header.accepted.reply_data.stat == rpc.PROC_UNAVAIL


@settings(max_examples=100, deadline=None)
@given(
    flavor=st.integers(0, 2**32 - 1),
    body=st.binary(max_size=400),
    new_flavor=st.integers(0, 2**32 - 1),
    new_body=st.binary(max_size=400),
)
def test_a_credential_changed_between_calls_is_encoded_as_it_is_now(
    flavor: int, body: bytes, new_flavor: int, new_body: bytes
) -> None:
    """encode_call remembers the last credential it encoded: a credential object changed
    since (its flavor, its body, a body changed in place) is encoded anew."""

    def encoded(cred: rpc.opaque_auth) -> bytes:
        w = Writer()
        message.encode_call(w, 1, 100003, 4, 1, cred)
        return bytes(w)

    def reference(cred: rpc.opaque_auth) -> bytes:
        call = rpc.call_body(2, 100003, 4, 1, cred, message.AUTH_NONE_VERF)
        return pack(rpc.enc_rpc_msg, rpc.rpc_msg(1, rpc.rpc_msg_body(rpc.CALL, call)))

    cred = rpc.opaque_auth(flavor, body)
    assert encoded(cred) == encoded(cred) == reference(cred)
    cred.flavor = new_flavor
    assert encoded(cred) == reference(cred)
    cred.body = new_body
    assert encoded(cred) == reference(cred)
    mutable = rpc.opaque_auth(flavor, bytearray(body))
    assert encoded(mutable) == reference(rpc.opaque_auth(flavor, body))
    mutable.body[:] = new_body
    assert encoded(mutable) == reference(rpc.opaque_auth(flavor, new_body))
