"""``constant_op``: an operation that never changes (the GETFH and GETATTR of every ``stat``) is
encoded once; a COMPOUND carrying it goes out byte for byte as if it were encoded each time."""

from __future__ import annotations

import pytest

from nfsrdma.client import ops
from nfsrdma.client.attrs import STAT_ATTRS
from nfsrdma.session import client as session_client
from nfsrdma.session.client import constant_op
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer


def _encoded(arg_ops: list[nfs4.nfs_argop4]) -> bytes:
    w = Writer()
    for op in arg_ops:
        nfs4.enc_nfs_argop4(w, op)
    return w.flatten()


def test_constant_op_is_encoded_once_with_the_generated_codec() -> None:
    getattr_ = constant_op(ops.getattr_(STAT_ATTRS))
    getfh = constant_op(ops.getfh())
    body = [ops.putfh(b"\1" * 16), ops.lookup(b"name"), getfh, getattr_]
    # The bytes kept are what the codec gives for the object: a COMPOUND copies them.
    kept = session_client._ENCODED
    assert kept[id(getattr_)] == (getattr_, _encoded([getattr_]))
    assert kept[id(getfh)] == (getfh, _encoded([getfh]))
    assert id(body[0]) not in kept  # a per-call operation is encoded with each call


def test_constant_op_refuses_a_ddp_eligible_item() -> None:
    """RFC 8267 section 4: WRITE data is DDP-eligible (a Read chunk's position is per call)."""
    write = ops.write(ops.ANONYMOUS_STATEID, 0, b"x" * 8192, nfs4.UNSTABLE4)
    with pytest.raises(ValueError, match="DDP"):
        constant_op(write)
