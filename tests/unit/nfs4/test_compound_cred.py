"""The file-system identity of a COMPOUND (``compound.cred_of``): remembered per connection for
its last caller, it must follow the caller when another identity uses the same connection."""

from __future__ import annotations

from typing import Any, cast

from nfsrdma.nfs4.compound import cred_of
from nfsrdma.nfs4.inprocess import MemoryConnection, compound_call, rpc_call
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import RpcCall
from nfsrdma.vfs.base import Cred, Origin


def _call(conn: RpcConnection, uid: int, gid: int, gids: tuple[int, ...]) -> RpcCall:
    return rpc_call(conn, compound_call(1, [], auth_sys(uid, gid, gids, "host")))


def test_the_identity_follows_the_caller_on_one_connection() -> None:
    conn = RpcConnection(MemoryConnection("192.0.2.7:801"))
    other = RpcConnection(MemoryConnection("192.0.2.8:802"))
    server = cast(Any, None)  # AUTH_SYS callers need nothing of the server
    origin = Origin("192.0.2.7:801", 1, "mem")
    for _ in range(2):  # the second round comes from the connection's memory
        alice = cred_of(server, _call(conn, 1000, 1000, (10,)))
        assert (alice, alice.origin) == (Cred(1000, 1000, (10,)), origin)
        bob = cred_of(server, _call(conn, 1001, 1002, ()))
        assert (bob, bob.origin) == (Cred(1001, 1002, ()), origin)
        again = cred_of(server, _call(conn, 1001, 1002, ()))
        assert again == bob
    elsewhere = cred_of(server, _call(other, 1001, 1002, ()))
    assert elsewhere.origin == Origin("192.0.2.8:802", 1, "mem")
