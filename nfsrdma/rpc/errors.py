"""Errors of the RPC layer, raised to callers and by procedure handlers."""

from __future__ import annotations

from nfsrdma.xdr.gen import rpc


class RpcError(Exception):
    """A call that did not produce results."""


class RpcAcceptError(RpcError):
    """The server accepted the call but did not run it (accept_stat other than SUCCESS).

    Handlers raise it too: ``RpcAcceptError(rpc.SYSTEM_ERR)`` becomes that reply."""

    def __init__(self, stat: rpc.accept_stat, mismatch: tuple[int, int] | None = None) -> None:
        detail = f" (supported {mismatch[0]}..{mismatch[1]})" if mismatch else ""
        super().__init__(f"{rpc.accept_stat(stat).name}{detail}")
        self.stat = stat
        self.mismatch = mismatch


class RpcDenied(RpcError):
    """MSG_DENIED: an RPC version mismatch or an authentication error."""

    def __init__(
        self, stat: rpc.reject_stat, auth: rpc.auth_stat | None, mismatch: tuple[int, int] | None
    ) -> None:
        what = rpc.auth_stat(auth).name if auth is not None else f"RPC_MISMATCH {mismatch}"
        super().__init__(f"call denied: {what}")
        self.stat = stat
        self.auth = auth
        self.mismatch = mismatch


class RpcTimeout(RpcError, TimeoutError):
    """No reply came in time."""


class RpcConnectionLost(RpcError, ConnectionError):
    """The connection closed before the reply came."""
