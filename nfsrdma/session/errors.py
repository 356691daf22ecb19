"""The one exception of the server session layer: a failure and the nfsstat4 it stands for.

The session layer sits below the NFSv4.1 operation layer, so it does not raise that layer's
``Nfs4Error``; the operation handlers (``nfsrdma.nfs4.ops.session_ops``) turn a
``SessionError`` into one."""

from __future__ import annotations

from nfsrdma.xdr.gen import nfs4


class SessionError(Exception):
    def __init__(self, status: nfs4.nfsstat4, detail: str = "") -> None:
        try:
            name = nfs4.nfsstat4(status).name
        except ValueError:
            name = f"nfsstat4 {status}"
        super().__init__(f"{name}: {detail}" if detail else name)
        self.status = status
        self.detail = detail
