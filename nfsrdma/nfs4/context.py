"""What every NFSv4.1 operation handler sees: the COMPOUND's context, and how it fails.

A handler is an ``OpHandler[XXX4args, XXX4res]``: ``handler(ctx, args) -> result`` where
``args`` is the operation's decoded ``XXX4args`` (``None`` for operations without arguments)
and ``result`` the operation's ``XXX4res`` for success. A handler that must wait (file I/O in
the thread pool) returns an awaitable of its result instead (``Outcome``); the COMPOUND goes
on synchronously otherwise, and only it tells the two apart (``compound.py``). ``bind`` ties a
handler to the generated ``Operation`` of its number, so mypy checks its argument and result
types against the specification.

A handler fails by raising:
- ``Nfs4Error(status)`` — the result becomes the operation's error arm with that status;
  ``Nfs4Error(status, result)`` when the error arm carries data (LOCK's NFS4ERR_DENIED);
- ``OSError`` from the VFS — mapped to a status by ``nfsrdma.nfs4.errors``;
- ``BadHandle`` / ``StaleHandle`` / ``BadCookie`` from the VFS — NFS4ERR_BADHANDLE / STALE /
  BAD_COOKIE;
- ``XdrError`` (e.g. a malformed attribute list) — NFS4ERR_BADXDR.
Anything else is a server bug: NFS4ERR_SERVERFAULT, logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeAlias, TypeVar

from nfsrdma.vfs.base import Cred
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Operation

if TYPE_CHECKING:
    from nfsrdma.nfs4.server_state import ServerState
    from nfsrdma.rpc.auth import Credential
    from nfsrdma.rpc.connection import RpcConnection
    from nfsrdma.session.server import SequenceResult, Session
    from nfsrdma.transport.base import Inbound


class Nfs4Error(Exception):
    def __init__(self, status: nfs4.nfsstat4, result: object | None = None) -> None:
        super().__init__(_status_name(status))
        self.status = status
        self.result = result


def _status_name(status: int) -> str:
    try:
        return nfs4.nfsstat4(status).name
    except ValueError:
        return f"nfsstat4 {status}"


# The special stateids of RFC 8881 section 8.2.3.
ANONYMOUS_STATEID = nfs4.stateid4(0, bytes(12))
BYPASS_STATEID = nfs4.stateid4(0xFFFFFFFF, b"\xff" * 12)
CURRENT_STATEID = nfs4.stateid4(1, bytes(12))
INVALID_STATEID = nfs4.stateid4(0xFFFFFFFF, bytes(12))


T = TypeVar("T")


class CompoundContext:
    """The state of one COMPOUND while its operations run (RFC 8881 section 16.2.3).

    A plain slotted class rather than a dataclass: its field types are known to the type
    checker only (imports under TYPE_CHECKING), which a compiled dataclass would evaluate."""

    __slots__ = (
        "cachethis",
        "conn",
        "cred",
        "current_fh",
        "current_stateid",
        "inbound",
        "minorversion",
        "now",
        "op_count",
        "op_index",
        "principal",
        "request_size",
        "saved_fh",
        "saved_stateid",
        "sequence",
        "server",
        "session",
    )

    def __init__(
        self,
        server: ServerState,
        cred: Cred,
        principal: Credential,
        conn: RpcConnection,
        now: float,
        op_count: int = 0,
        op_index: int = 0,
        request_size: int = 0,
        current_fh: bytes | None = None,
        saved_fh: bytes | None = None,
        current_stateid: nfs4.stateid4 | None = None,
        saved_stateid: nfs4.stateid4 | None = None,
        session: Session | None = None,
        sequence: SequenceResult | None = None,
        cachethis: bool = False,
        minorversion: int = 1,
        inbound: Inbound | None = None,
    ) -> None:
        self.server = server
        self.cred = cred  # the file-system identity (AUTH_SYS as sent; squashing: the VFS's)
        self.principal = principal  # the RPC credential, for client-id and session ownership
        self.conn = conn  # the connection the COMPOUND came on
        self.now = now  # monotonic seconds at the start of the COMPOUND
        self.op_count = op_count
        self.op_index = op_index
        self.request_size = request_size
        self.current_fh = current_fh
        self.saved_fh = saved_fh
        self.current_stateid = current_stateid
        self.saved_stateid = saved_stateid
        self.session = session  # set by SEQUENCE
        self.sequence = sequence  # set by SEQUENCE (the slot held by this COMPOUND)
        self.cachethis = cachethis
        self.minorversion = minorversion  # the COMPOUND's: which operations/attributes exist
        self.inbound = inbound  # the request as the transport gave it (for ``lend``)

    def fh(self) -> bytes:
        """The current filehandle, or NFS4ERR_NOFILEHANDLE."""
        if self.current_fh is None:
            raise Nfs4Error(nfs4.NFS4ERR_NOFILEHANDLE)
        return self.current_fh

    def set_fh(self, fh: bytes) -> None:
        """A new current filehandle; the current stateid no longer applies (16.2.3.1.2)."""
        self.current_fh = fh
        self.current_stateid = None

    def resolve_stateid(self, sid: nfs4.stateid4) -> nfs4.stateid4:
        """Replace the special 'current stateid' (seqid 1, other all zero) by the current one."""
        if sid.seqid == 1 and sid.other == CURRENT_STATEID.other:
            if self.current_stateid is None:
                raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
            return self.current_stateid
        return sid

    async def in_pool(self, job: Callable[[], T]) -> T:
        """``job()`` in the server's thread pool (file I/O, fsync, a long READDIR), so that the
        event loop goes on serving others meanwhile; it starts when this is awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.server.executor, job)

    @property
    def clientid(self) -> int:
        """The client id of the COMPOUND's session (NFS4ERR_OP_NOT_IN_SESSION without one)."""
        if self.session is None:
            raise Nfs4Error(nfs4.NFS4ERR_OP_NOT_IN_SESSION)
        return self.session.clientid


A = TypeVar("A")
R = TypeVar("R")
A_contra = TypeVar("A_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)

Outcome: TypeAlias = R | Awaitable[R]
"""A handler's result, or an awaitable of it when the handler must wait."""


class OpHandler(Protocol[A_contra, R_co]):
    """The handler of one operation: its decoded arguments in, its result out."""

    def __call__(self, ctx: CompoundContext, args: A_contra, /) -> R_co | Awaitable[R_co]: ...


class Bound(Generic[A, R]):
    """An operation and its handler, their types matched (a plain class: mypyc does not take
    a slotted generic dataclass)."""

    __slots__ = ("handler", "op")

    def __init__(self, op: Operation[A, R], handler: OpHandler[A, R]) -> None:
        self.op = op
        self.handler = handler


def bind(op: Operation[A, R], handler: OpHandler[A, R]) -> Bound[A, R]:
    return Bound(op, handler)
