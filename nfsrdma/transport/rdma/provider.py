"""The verbs provider interface: the only way the RPC-over-RDMA transport reaches RDMA.

Two providers implement it: ``pyverbs_provider`` (rdma-core's pyverbs and rdma_cm, the product
path) and ``inproc`` (an in-process emulation of RC queue pairs, memory regions and rkeys, for
fast unit tests). The transport above is written against these Protocols and plain dataclasses
only, so its protocol core stays sans-IO: provider events in (``Completion``, ``Disconnected``),
posts out (``post_recv``, ``post_send``, ``post_rdma_read``, ``post_rdma_write``...).

Model (as on hardware, RFC 8166 on an RC queue pair):

- A ``Device`` has one ``ProtectionDomain``; memory registered there is addressed by
  ``Sge(addr, length, lkey)`` locally and by ``(rkey, addr, length)`` remotely.
- A connection is made in two steps so receives can be posted before any message can arrive
  (PD-24): active side ``device.resolve()`` then ``conn.establish()``; passive side
  ``listener.get_request()``, ``request.create_connection()`` then ``conn.establish()`` (or
  ``request.reject()``). Private data goes out with ``establish`` and the peer's comes back.
- Every posted work request completes exactly once with a ``Completion``, except a send queue
  work request posted unsignalled (``signaled=False``): it reports a completion only when it
  fails (flushed ones included); when it succeeds, the completion of a later signalled work
  request of the same send queue covers it (send queue completions come in posting order),
  and only then are its queue slot and the memory it reads free again. Completions and ``Disconnected`` are delivered to the connection's event handler
  from the event loop, never from inside a ``post_*`` call (no re-entrancy).
- The first error completion breaks the connection, as on hardware: the queue pair goes to the
  error state, all outstanding work requests complete with ``WR_FLUSH_ERR``, the peer is
  disconnected, and ``Disconnected`` is delivered once to each side.
- Per-RPC registrations are made unusable by ``MemoryRegion.deregister()`` (always available)
  or, where ``DeviceCaps.memory_windows``, by binding a type-2 ``MemoryWindow`` per RPC and
  invalidating it locally (``post_local_invalidate``) or remotely (the peer's Send with
  Invalidate, reported in ``Completion.invalidated_rkey``). A window is bound once; allocate a
  new one per registration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeAlias

# rdma_cm private data limits on InfiniBand / RoCE (IB CM REQ, REP and REJ messages).
IB_CONNECT_PRIVATE_DATA_MAX = 56
IB_ACCEPT_PRIVATE_DATA_MAX = 196
IB_REJECT_PRIVATE_DATA_MAX = 148


class ProviderError(Exception):
    """A verbs or CM call failed synchronously (bad arguments, queue full, wrong state)."""


class ConnectError(ProviderError):
    """Address/route resolution or connection establishment failed."""

    def __init__(self, reason: str, status: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class ConnectionRejected(ConnectError):
    """The passive side rejected the connection (or nobody listens there)."""

    def __init__(self, private_data: bytes, status: int, reason: str = "rejected") -> None:
        super().__init__(reason, status)
        self.private_data = private_data


class Access(enum.IntFlag):
    """Memory access rights (values of ``enum ibv_access_flags``)."""

    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2
    REMOTE_READ = 0x4
    MW_BIND = 0x10


class WcStatus(enum.IntEnum):
    """Work completion status (values of ``enum ibv_wc_status``)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21

    @classmethod
    def of(cls, value: int) -> WcStatus:
        try:
            return cls(value)
        except ValueError:
            return cls.GENERAL_ERR


class WcOpcode(enum.IntEnum):
    """What a completed work request was (values of ``enum ibv_wc_opcode``).

    Providers report the opcode of the posted work request even for error completions, where
    hardware leaves the field undefined."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    BIND_MW = 5
    LOCAL_INV = 6
    RECV = 128


@dataclass(frozen=True, slots=True)
class DeviceCaps:
    """What the device (and the queue pairs it can make) supports."""

    name: str
    max_send_sge: int
    max_recv_sge: int
    max_inline_data: int  # largest inline Send a queue pair accepts
    max_qp_wr: int
    max_qp_rd_atom: int  # IRD: RDMA Reads the device serves per QP as responder
    max_qp_init_rd_atom: int  # ORD: RDMA Reads it may have outstanding as initiator
    remote_invalidate: bool  # memory management extensions: Send with Invalidate (PD-16)
    memory_windows: bool  # type-2 memory windows usable for per-RPC registrations
    max_connect_private_data: int = IB_CONNECT_PRIVATE_DATA_MAX
    max_accept_private_data: int = IB_ACCEPT_PRIVATE_DATA_MAX


@dataclass(frozen=True, slots=True)
class QueuePairConfig:
    """Sizes of one RC queue pair (checked against ``DeviceCaps`` on creation)."""

    max_send_wr: int = 64
    max_recv_wr: int = 64
    max_send_sge: int = 4
    max_recv_sge: int = 1
    max_inline_data: int = 0


# The values made for every message (scatter elements, chained RDMA Writes, completions) are
# named tuples: immutable like frozen dataclasses, about half the cost to make.


class Sge(NamedTuple):
    """A local scatter/gather element: ``length`` bytes at ``addr`` in the region ``lkey``."""

    addr: int
    length: int
    lkey: int


class RdmaWriteRequest(NamedTuple):
    """An RDMA Write to post ahead of a Send in the same ``post_send`` call."""

    wr_id: int
    sges: Sequence[Sge]
    remote_addr: int
    rkey: int
    signaled: bool = True  # False: no completion unless it fails (covered by a later one)


class Completion(NamedTuple):
    """One work completion. ``invalidated_rkey`` is set on a receive completed by the peer's
    Send with Invalidate (``IBV_WC_WITH_INV``); that rkey is no longer usable (PD-17 b)."""

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int = 0
    invalidated_rkey: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is WcStatus.SUCCESS


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection is gone: peer or local disconnect, error completion, device removal.
    Delivered once per connection."""

    reason: str
    status: WcStatus | None = None  # the error completion's status when that caused it


ConnectionEvent: TypeAlias = Completion | Disconnected
EventHandler: TypeAlias = Callable[[ConnectionEvent], None]


class MemoryRegion(Protocol):
    """Registered memory. ``buffer`` is a writable, zero-copy view of the registered bytes."""

    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def lkey(self) -> int: ...
    @property
    def rkey(self) -> int: ...
    @property
    def access(self) -> Access: ...
    @property
    def buffer(self) -> memoryview: ...
    @property
    def registered(self) -> bool: ...

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        """The element for ``length`` bytes from ``offset`` (bounds-checked)."""
        ...

    def deregister(self) -> None:
        """Make lkey and rkey unusable everywhere. Idempotent. ``buffer`` stays readable."""
        ...


class MemoryWindow(Protocol):
    """A type-2 memory window: bound once by ``Connection.post_bind_window`` to a slice of a
    region registered with ``Access.MW_BIND``; usable remotely through that connection only,
    until invalidated. ``close()`` frees it."""

    @property
    def rkey(self) -> int | None: ...

    def close(self) -> None: ...


class ProtectionDomain(Protocol):
    def register(self, length: int, access: Access) -> MemoryRegion:
        """Allocate ``length`` zeroed, page-aligned bytes and register them."""
        ...

    def register_buffer(self, buffer: memoryview, access: Access) -> MemoryRegion:
        """Register caller memory (a writable contiguous view, e.g. of a bytearray or mmap);
        the view is held until deregistration, so a bytearray cannot be resized meanwhile."""
        ...

    def alloc_window(self) -> MemoryWindow:
        """A fresh type-2 memory window (``DeviceCaps.memory_windows`` must be true)."""
        ...


class Connection(Protocol):
    """One RC queue pair and its rdma_cm identifier."""

    @property
    def config(self) -> QueuePairConfig: ...
    @property
    def peer(self) -> str:
        """``host:port`` of the remote end (known once the route is resolved)."""
        ...

    @property
    def responder_resources(self) -> int:
        """IRD: RDMA Reads the peer may have outstanding against us (known once established)."""
        ...

    @property
    def initiator_depth(self) -> int:
        """ORD: RDMA Reads we may have outstanding toward the peer (known once established)."""
        ...

    @property
    def established(self) -> bool: ...
    @property
    def broken(self) -> bool: ...

    async def establish(
        self,
        private_data: bytes = b"",
        *,
        responder_resources: int = 0,
        initiator_depth: int = 0,
        rnr_retry: int = 7,
    ) -> bytes:
        """Connect (active side) or accept (passive side) and wait until the connection is up.

        Returns the peer's private data: the accept's on the active side (raises
        ``ConnectionRejected`` with the reject's), the connect request's on the passive side.
        ``rnr_retry`` (0..7, 7 = forever) is how often the peer retries a Send that finds our
        receive queue empty before failing with ``RNR_RETRY_EXC_ERR``."""
        ...

    def post_recv(self, wr_id: int, sge: Sge) -> None: ...

    def post_send(
        self,
        wr_id: int,
        sges: Sequence[Sge],
        *,
        invalidate_rkey: int | None = None,
        inline: bool = False,
        writes: Sequence[RdmaWriteRequest] = (),
        signaled: bool = True,
    ) -> None:
        """Send (or Send with Invalidate of the peer's ``invalidate_rkey``), preceded by
        ``writes`` posted in the same call (one doorbell for the lot; RC ordering delivers
        the written data before the Send, TR-19). Each signalled work request completes on
        its own; unsignalled ones (``signaled=False``, ``RdmaWriteRequest.signaled``) only
        in error."""
        ...

    def hold_sends(self) -> bool:
        """Hold the send queue posts made from now until the end of this loop turn and post
        them then as one list (one doorbell), in posting order; the list's last work request
        goes out signalled whatever was asked for it, so a list posted unsignalled still
        completes (and covers the rest). A post that fails then is error completions of its
        work requests and a broken connection. May post at once instead (a provider or post
        path without holding): returns whether posts are held now."""
        ...

    def post_rdma_write(
        self, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int
    ) -> None: ...

    def post_rdma_read(
        self, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int
    ) -> None: ...

    def post_bind_window(
        self,
        wr_id: int,
        window: MemoryWindow,
        region: MemoryRegion,
        offset: int,
        length: int,
        access: Access,
    ) -> int:
        """Bind ``window`` to ``length`` bytes of ``region`` at ``offset``; returns the new rkey
        (usable by the peer once the bind completes; Sends posted after it are ordered after
        it)."""
        ...

    def post_local_invalidate(self, wr_id: int, rkey: int) -> None: ...

    def disconnect(self) -> None:
        """Start an orderly disconnect; ``Disconnected`` follows. Idempotent."""
        ...

    def close(self) -> None:
        """Release the queue pair and CM identifier. Idempotent."""
        ...


class ConnectRequest(Protocol):
    """An incoming connection, before it is accepted. ``responder_resources`` and
    ``initiator_depth`` are the peer's offer seen from this side: accept with an
    ``initiator_depth`` no larger than this ``initiator_depth`` (TR-26)."""

    @property
    def private_data(self) -> bytes: ...
    @property
    def responder_resources(self) -> int: ...
    @property
    def initiator_depth(self) -> int: ...
    @property
    def peer(self) -> str:
        """``host:port`` of the connecting end."""
        ...

    def create_connection(self, config: QueuePairConfig, on_event: EventHandler) -> Connection:
        """The queue pair for this request, ready for ``post_recv`` and then ``establish``."""
        ...

    def reject(self, private_data: bytes = b"") -> None: ...


class Listener(Protocol):
    @property
    def port(self) -> int: ...

    async def get_request(self) -> ConnectRequest: ...

    def close(self) -> None: ...


class Device(Protocol):
    @property
    def caps(self) -> DeviceCaps: ...
    @property
    def pd(self) -> ProtectionDomain: ...
    @property
    def address(self) -> str: ...

    async def listen(self, port: int, backlog: int = 16) -> Listener: ...

    async def resolve(
        self, address: str, port: int, config: QueuePairConfig, on_event: EventHandler
    ) -> Connection:
        """Resolve address and route to the peer and create the queue pair (active side)."""
        ...

    def close(self) -> None: ...


def check_config(caps: DeviceCaps, config: QueuePairConfig) -> None:
    """Refuse a queue pair configuration the device cannot provide."""
    if config.max_send_wr < 1 or config.max_recv_wr < 1:
        raise ProviderError("queue depths must be at least 1")
    if config.max_send_wr > caps.max_qp_wr or config.max_recv_wr > caps.max_qp_wr:
        raise ProviderError(f"queue depth above device limit {caps.max_qp_wr}")
    if not 1 <= config.max_send_sge <= caps.max_send_sge:
        raise ProviderError(f"max_send_sge must be 1..{caps.max_send_sge}")
    if not 1 <= config.max_recv_sge <= caps.max_recv_sge:
        raise ProviderError(f"max_recv_sge must be 1..{caps.max_recv_sge}")
    if not 0 <= config.max_inline_data <= caps.max_inline_data:
        raise ProviderError(f"max_inline_data must be 0..{caps.max_inline_data}")


def check_rd_atomic(caps: DeviceCaps, responder_resources: int, initiator_depth: int) -> None:
    if not 0 <= responder_resources <= min(caps.max_qp_rd_atom, 255):
        raise ProviderError(f"responder_resources must be 0..{caps.max_qp_rd_atom}")
    if not 0 <= initiator_depth <= min(caps.max_qp_init_rd_atom, 255):
        raise ProviderError(f"initiator_depth must be 0..{caps.max_qp_init_rd_atom}")


# What the providers share.


def registrable(buffer: memoryview) -> memoryview:
    """The byte view of caller memory to register: writable, contiguous and not empty."""
    view = memoryview(buffer)
    if view.readonly or not view.contiguous:
        raise ProviderError("registered memory must be writable and contiguous")
    view = view.cast("B")
    if len(view) == 0:
        raise ProviderError("cannot register an empty region")
    return view


def check_length(length: int) -> None:
    """Refuse to allocate and register an empty region."""
    if length <= 0:
        raise ProviderError("cannot register an empty region")


class RegionBase:
    """A registered region's keys, bounds and zero-copy view; a provider says how to release
    the registration (``_release``, called once by ``deregister``)."""

    def __init__(self, view: memoryview, addr: int, lkey: int, rkey: int, access: Access) -> None:
        self._view = view
        self._addr = addr
        self._lkey = lkey
        self._rkey = rkey
        self._access = access
        self._registered = True

    @property
    def addr(self) -> int:
        return self._addr

    @property
    def length(self) -> int:
        return len(self._view)

    @property
    def lkey(self) -> int:
        return self._lkey

    @property
    def rkey(self) -> int:
        return self._rkey

    @property
    def access(self) -> Access:
        return self._access

    @property
    def buffer(self) -> memoryview:
        return self._view

    @property
    def registered(self) -> bool:
        return self._registered

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        size = len(self._view)
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ProviderError(f"slice {offset}+{length} outside a {size}-byte region")
        return Sge(self._addr + offset, length, self._lkey)

    def deregister(self) -> None:
        if self._registered:
            self._registered = False
            self._release()

    def _release(self) -> None:
        raise NotImplementedError


class ConnectRequestBase:
    """What an incoming connection request offers, as seen from the passive side."""

    def __init__(
        self, private_data: bytes, responder_resources: int, initiator_depth: int, peer: str
    ) -> None:
        self._private_data = private_data
        self._responder_resources = responder_resources
        self._initiator_depth = initiator_depth
        self._peer = peer

    @property
    def private_data(self) -> bytes:
        return self._private_data

    @property
    def responder_resources(self) -> int:
        return self._responder_resources

    @property
    def initiator_depth(self) -> int:
        return self._initiator_depth

    @property
    def peer(self) -> str:
        return self._peer


def check_accept(request: ConnectRequest, initiator_depth: int) -> None:
    """Accept with no more RDMA Reads outstanding than the peer's responder resources (TR-26)."""
    if initiator_depth > request.initiator_depth:
        raise ProviderError(
            f"initiator_depth {initiator_depth} exceeds the peer's responder resources "
            f"{request.initiator_depth}"
        )
