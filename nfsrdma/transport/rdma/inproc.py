"""An in-process verbs provider: emulated RC queue pairs between endpoints in one process.

It exists so the whole RPC-over-RDMA path runs in fast unit tests, and it fails the way the
hardware does so protocol bugs show up there:

- memory regions and type-2 memory windows with keys, access rights and bounds; RDMA Read and
  Write go through the peer's protection domain and check them;
- a remote access error (bad rkey, out of bounds, missing right, invalidated window) completes
  the requester's work request with ``REM_ACCESS_ERR`` and breaks the connection on both sides
  (both queue pairs flush, as rxe does);
- a Send that finds no receive posted is retried per the peer's ``rnr_retry`` (7: until a
  receive is posted) and then fails with ``RNR_RETRY_EXC_ERR``;
- a Send longer than the posted receive: ``LOC_LEN_ERR`` at the receiver, ``REM_INV_REQ_ERR``
  at the sender, connection broken;
- Send with Invalidate invalidates the named window at the receiver and reports the rkey in the
  receive completion; naming an rkey that cannot be invalidated there fails the receive with
  ``REM_INV_REQ_ERR`` and breaks the connection (rxe on Linux 6.1 does the same);
- RDMA Read needs a non-zero ORD at the requester and IRD at the responder (TR-26);
- invalidating a window twice fails with ``MW_BIND_ERR`` (PD-17 b).

Work requests on a queue pair execute in order on the event loop; completions are delivered
with ``loop.call_soon``, never from inside a ``post_*`` call. After the first error completion
every outstanding work request completes with ``WR_FLUSH_ERR``, then ``Disconnected`` is
delivered; the peer is disconnected likewise.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from nfsrdma.transport.rdma.provider import (
    IB_ACCEPT_PRIVATE_DATA_MAX,
    IB_CONNECT_PRIVATE_DATA_MAX,
    IB_REJECT_PRIVATE_DATA_MAX,
    Access,
    Completion,
    ConnectError,
    ConnectionEvent,
    ConnectionRejected,
    ConnectRequestBase,
    DeviceCaps,
    Disconnected,
    EventHandler,
    MemoryRegion,
    MemoryWindow,
    ProviderError,
    QueuePairConfig,
    RdmaWriteRequest,
    RegionBase,
    Sge,
    WcOpcode,
    WcStatus,
    check_accept,
    check_config,
    check_length,
    check_rd_atomic,
    registrable,
)

__all__ = [
    "DEFAULT_CAPS",
    "InprocConnectRequest",
    "InprocConnection",
    "InprocDevice",
    "InprocFabric",
    "InprocListener",
    "InprocPD",
    "InprocRegion",
    "InprocWindow",
]

DEFAULT_CAPS = DeviceCaps(
    name="inproc0",
    max_send_sge=32,
    max_recv_sge=32,
    max_inline_data=256,
    max_qp_wr=4096,
    max_qp_rd_atom=128,
    max_qp_init_rd_atom=128,
    remote_invalidate=True,
    memory_windows=True,
)

RNR_FOREVER = 7
_PAGE = 4096
_CM_REJ_CONSUMER_DEFINED = 28  # IB CM reject reason rdma_cm reports for rdma_reject()
_CM_REJ_INVALID_SERVICE_ID = 8  # nobody listens on that port


class _WcError(Exception):
    """A work request failed. ``peer_*`` describe what the failure does at the responder: the
    status of the receive it consumed, and whether its queue pair breaks too."""

    def __init__(
        self,
        status: WcStatus,
        reason: str,
        *,
        peer_breaks: bool = False,
        peer_status: WcStatus | None = None,
        peer_recv: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.peer_breaks = peer_breaks
        self.peer_status = peer_status
        self.peer_recv = peer_recv


class InprocFabric:
    """The emulated network: devices by address, listeners by (address, port)."""

    def __init__(self, *, rnr_timer: float = 0.0005) -> None:
        self.rnr_timer = rnr_timer
        self._devices: dict[str, InprocDevice] = {}
        self._listeners: dict[tuple[str, int], InprocListener] = {}
        self._device_index = itertools.count()
        self._ephemeral = itertools.count(40000)

    def device(self, address: str, caps: DeviceCaps | None = None) -> InprocDevice:
        if address in self._devices:
            raise ProviderError(f"address {address} already has a device")
        dev = InprocDevice(self, address, caps or DEFAULT_CAPS, next(self._device_index))
        self._devices[address] = dev
        return dev


class InprocRegion(RegionBase):
    """A registered region; ``buffer`` is the backing memory itself (no copies)."""

    def __init__(
        self, pd: InprocPD, memory: memoryview, addr: int, key: int, access: Access
    ) -> None:
        super().__init__(memory, addr, key, key, access)
        self._pd = pd

    def _release(self) -> None:
        self._pd._forget(self._lkey)

    def _slice(self, addr: int, length: int) -> memoryview | None:
        start = addr - self._addr
        if start < 0 or length < 0 or start + length > len(self._view):
            return None
        return self._view[start : start + length]


class InprocWindow:
    """A type-2 memory window: bound once, then invalidated and closed."""

    def __init__(self, pd: InprocPD) -> None:
        self._pd = pd
        self._rkey: int | None = None
        self._region: InprocRegion | None = None
        self._addr = 0
        self._length = 0
        self._access = Access(0)
        self._qp: InprocConnection | None = None
        self._valid = False
        self._closed = False

    @property
    def rkey(self) -> int | None:
        return self._rkey

    @property
    def valid(self) -> bool:
        return self._valid

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._valid = False
            if self._rkey is not None:
                self._pd._forget(self._rkey)

    def _slice(self, addr: int, length: int) -> memoryview | None:
        if self._region is None or not self._region.registered:
            return None
        if addr < self._addr or addr + length > self._addr + self._length or length < 0:
            return None
        return self._region._slice(addr, length)


class InprocPD:
    """Protection domain: key tables and a private virtual address space."""

    def __init__(self, device: InprocDevice, index: int) -> None:
        self._device = device
        self._objects: dict[int, InprocRegion | InprocWindow] = {}
        # Key ranges and addresses differ per device so one side's keys never work on the other.
        self._key_index = itertools.count((index + 1) << 12)
        self._next_addr = 0x7F00_0000_0000 + index * 0x10_0000_0000

    def _new_key(self) -> int:
        return (next(self._key_index) << 8) | 0x5A

    def _forget(self, key: int) -> None:
        self._objects.pop(key, None)

    def _place(self, length: int) -> int:
        addr = self._next_addr
        pages = (length + _PAGE - 1) // _PAGE + 1  # one unmapped guard page after each
        self._next_addr += pages * _PAGE
        return addr

    def register(self, length: int, access: Access) -> InprocRegion:
        check_length(length)
        return self.register_buffer(memoryview(bytearray(length)), access)

    def register_buffer(self, buffer: memoryview, access: Access) -> InprocRegion:
        view = registrable(buffer)
        if access & (Access.REMOTE_WRITE) and not access & Access.LOCAL_WRITE:
            raise ProviderError("REMOTE_WRITE requires LOCAL_WRITE (EINVAL)")
        region = InprocRegion(self, view, self._place(len(view)), self._new_key(), access)
        self._objects[region.lkey] = region
        return region

    def alloc_window(self) -> InprocWindow:
        if not self._device.caps.memory_windows:
            raise ProviderError("memory windows not supported (EOPNOTSUPP)")
        return InprocWindow(self)

    # Address translation, as the HCA does it.

    def local(self, sge: Sge, write: bool) -> memoryview:
        obj = self._objects.get(sge.lkey)
        if not isinstance(obj, InprocRegion):
            raise _WcError(WcStatus.LOC_PROT_ERR, f"lkey {sge.lkey:#x} unknown")
        if write and not obj.access & Access.LOCAL_WRITE:
            raise _WcError(WcStatus.LOC_PROT_ERR, f"lkey {sge.lkey:#x} lacks LOCAL_WRITE")
        view = obj._slice(sge.addr, sge.length)
        if view is None:
            raise _WcError(WcStatus.LOC_PROT_ERR, f"SGE {sge.addr:#x}+{sge.length} out of bounds")
        return view

    def remote(
        self, rkey: int, addr: int, length: int, need: Access, via: InprocConnection
    ) -> memoryview:
        obj = self._objects.get(rkey)
        bad = WcStatus.REM_ACCESS_ERR
        if obj is None:
            raise _WcError(bad, f"rkey {rkey:#x} unknown or invalidated")
        if isinstance(obj, InprocWindow):
            if not obj.valid:
                raise _WcError(bad, f"window rkey {rkey:#x} invalidated")
            if obj._qp is not via:
                raise _WcError(bad, f"window rkey {rkey:#x} bound to another queue pair")
            rights = obj._access
        else:
            rights = obj.access
        if not rights & need:
            raise _WcError(bad, f"rkey {rkey:#x} lacks {need!r}")
        view = obj._slice(addr, length)
        if view is None:
            raise _WcError(bad, f"rkey {rkey:#x}: {addr:#x}+{length} out of bounds")
        return view

    def bind(
        self,
        window: InprocWindow,
        region: InprocRegion,
        addr: int,
        length: int,
        access: Access,
        qp: InprocConnection,
    ) -> None:
        if window._closed or window._pd is not self or region._pd is not self:
            raise _WcError(WcStatus.MW_BIND_ERR, "window or region from another PD")
        if not region.registered or not region.access & Access.MW_BIND:
            raise _WcError(WcStatus.MW_BIND_ERR, "region not registered with MW_BIND")
        if region._slice(addr, length) is None:
            raise _WcError(WcStatus.MW_BIND_ERR, "window outside its region")
        if access & Access.REMOTE_WRITE and not region.access & Access.LOCAL_WRITE:
            raise _WcError(WcStatus.MW_BIND_ERR, "REMOTE_WRITE window on read-only region")
        window._region = region
        window._addr = addr
        window._length = length
        window._access = access
        window._qp = qp
        window._valid = True

    def invalidate(self, rkey: int, qp: InprocConnection) -> bool:
        obj = self._objects.get(rkey)
        if not isinstance(obj, InprocWindow) or not obj.valid or obj._qp is not qp:
            return False
        obj._valid = False
        return True


class InprocDevice:
    def __init__(self, fabric: InprocFabric, address: str, caps: DeviceCaps, index: int) -> None:
        self._fabric = fabric
        self._address = address
        self._caps = caps
        self._pd = InprocPD(self, index)
        self._connections: set[InprocConnection] = set()
        self._listeners: set[InprocListener] = set()
        self._closed = False

    @property
    def caps(self) -> DeviceCaps:
        return self._caps

    @property
    def pd(self) -> InprocPD:
        return self._pd

    @property
    def address(self) -> str:
        return self._address

    @property
    def fabric(self) -> InprocFabric:
        return self._fabric

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderError("device closed")

    async def listen(self, port: int, backlog: int = 16) -> InprocListener:
        self._check_open()
        if port == 0:
            port = next(self._fabric._ephemeral)
        key = (self._address, port)
        if key in self._fabric._listeners:
            raise ProviderError(f"{self._address}:{port} already in use (EADDRINUSE)")
        listener = InprocListener(self, port, backlog)
        self._fabric._listeners[key] = listener
        self._listeners.add(listener)
        return listener

    async def resolve(
        self, address: str, port: int, config: QueuePairConfig, on_event: EventHandler
    ) -> InprocConnection:
        self._check_open()
        check_config(self._caps, config)
        await asyncio.sleep(0)
        if address not in self._fabric._devices:
            raise ConnectError(f"cannot resolve {address} (RDMA_CM_EVENT_ADDR_ERROR)")
        local = (self._address, next(self._fabric._ephemeral))
        conn = InprocConnection(self, config, on_event, target=(address, port), local=local)
        self._connections.add(conn)
        return conn

    def close(self) -> None:
        if self._closed:
            return
        for listener in list(self._listeners):
            listener.close()
        for conn in list(self._connections):
            conn.close()
        self._closed = True
        self._fabric._devices.pop(self._address, None)


class InprocListener:
    def __init__(self, device: InprocDevice, port: int, backlog: int) -> None:
        self._device = device
        self._port = port
        self._backlog = backlog
        self._queue: asyncio.Queue[InprocConnectRequest] = asyncio.Queue()
        self._closed = False

    @property
    def port(self) -> int:
        return self._port

    async def get_request(self) -> InprocConnectRequest:
        if self._closed:
            raise ProviderError("listener closed")
        return await self._queue.get()

    def _offer(self, request: InprocConnectRequest) -> bool:
        if self._closed or self._queue.qsize() >= self._backlog:
            return False
        self._queue.put_nowait(request)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._device._fabric._listeners.pop((self._device.address, self._port), None)
        self._device._listeners.discard(self)
        while not self._queue.empty():
            self._queue.get_nowait().reject()


def _pad(data: bytes, size: int) -> bytes:
    return data + bytes(size - len(data))


class InprocConnectRequest(ConnectRequestBase):
    def __init__(
        self,
        listener: InprocListener,
        active: InprocConnection,
        private_data: bytes,
        responder_resources: int,
        initiator_depth: int,
        rnr_retry: int,
    ) -> None:
        # The peer's offer as seen from this side (rdma_cm swaps them the same way).
        super().__init__(
            _pad(private_data, IB_CONNECT_PRIVATE_DATA_MAX),
            initiator_depth,
            responder_resources,
            active.local,
        )
        self._listener = listener
        self._active = active
        self._rnr_retry = rnr_retry
        self._used = False

    def create_connection(
        self, config: QueuePairConfig, on_event: EventHandler
    ) -> InprocConnection:
        if self._used:
            raise ProviderError("connect request already handled")
        device = self._listener._device
        device._check_open()
        check_config(device.caps, config)
        self._used = True
        conn = InprocConnection(device, config, on_event, request=self)
        device._connections.add(conn)
        return conn

    def reject(self, private_data: bytes = b"") -> None:
        if len(private_data) > IB_REJECT_PRIVATE_DATA_MAX:
            raise ProviderError("reject private data too long")
        self._used = True
        if not self._active_waiting():
            return
        self._active._rejected(
            _pad(private_data, IB_REJECT_PRIVATE_DATA_MAX), _CM_REJ_CONSUMER_DEFINED
        )

    def _active_waiting(self) -> bool:
        return self._active._connect_future is not None and not self._active._connect_future.done()


class _State(enum.Enum):
    INIT = "init"  # created: receives may be posted
    CONNECTING = "connecting"
    RTS = "rts"
    ERROR = "error"
    CLOSED = "closed"


@dataclass(slots=True)
class _WorkRequest:
    wr_id: int
    opcode: WcOpcode
    sges: tuple[Sge, ...] = ()
    remote_addr: int = 0
    rkey: int = 0
    invalidate_rkey: int | None = None
    inline_data: bytes | None = None
    window: InprocWindow | None = None
    region: InprocRegion | None = None
    bind_addr: int = 0
    bind_length: int = 0
    bind_access: Access = Access.LOCAL_WRITE & 0
    rnr_left: int | None = None


class InprocConnection:
    """One emulated RC queue pair plus its CM identity."""

    def __init__(
        self,
        device: InprocDevice,
        config: QueuePairConfig,
        on_event: EventHandler,
        *,
        target: tuple[str, int] | None = None,
        local: tuple[str, int] | None = None,
        request: InprocConnectRequest | None = None,
    ) -> None:
        self._device = device
        self._pd = device.pd
        self._config = config
        self._on_event = on_event
        self._target = target
        self._local = local
        self._request = request
        self._loop = asyncio.get_running_loop()
        self._state = _State.INIT
        self._peer: InprocConnection | None = None
        self._sq: deque[_WorkRequest] = deque()
        self._rq: deque[tuple[int, Sge]] = deque()
        self._outstanding: set[int] = set()
        self._scheduled = False
        self._rnr_waiting = False
        self._rnr_handle: asyncio.TimerHandle | None = None
        self._peer_rnr_retry = RNR_FOREVER  # how often our Sends retry when the peer is RNR
        self._responder_resources = 0
        self._initiator_depth = 0
        self._connect_future: asyncio.Future[bytes] | None = None
        self._disconnected = False

    # Properties.

    @property
    def config(self) -> QueuePairConfig:
        return self._config

    @property
    def local(self) -> str:
        """``host:port`` of this end (the active side's is an ephemeral port)."""
        if self._local is not None:
            return f"{self._local[0]}:{self._local[1]}"
        assert self._request is not None
        return f"{self._device.address}:{self._request._listener.port}"

    @property
    def peer(self) -> str:
        if self._target is not None:
            return f"{self._target[0]}:{self._target[1]}"
        assert self._request is not None
        return self._request.peer

    @property
    def responder_resources(self) -> int:
        return self._responder_resources

    @property
    def initiator_depth(self) -> int:
        return self._initiator_depth

    @property
    def established(self) -> bool:
        return self._state is _State.RTS

    @property
    def broken(self) -> bool:
        return self._state in (_State.ERROR, _State.CLOSED)

    # Connection management.

    async def establish(
        self,
        private_data: bytes = b"",
        *,
        responder_resources: int = 0,
        initiator_depth: int = 0,
        rnr_retry: int = RNR_FOREVER,
    ) -> bytes:
        if self._state is not _State.INIT:
            raise ProviderError(f"cannot establish in state {self._state.value}")
        check_rd_atomic(self._device.caps, responder_resources, initiator_depth)
        if not 0 <= rnr_retry <= RNR_FOREVER:
            raise ProviderError("rnr_retry must be 0..7")
        if self._request is None:
            return await self._connect(
                private_data, responder_resources, initiator_depth, rnr_retry
            )
        return await self._accept(private_data, responder_resources, initiator_depth, rnr_retry)

    async def _connect(
        self, private_data: bytes, responder_resources: int, initiator_depth: int, rnr_retry: int
    ) -> bytes:
        if len(private_data) > self._device.caps.max_connect_private_data:
            raise ProviderError("connect private data too long")
        assert self._target is not None
        self._state = _State.CONNECTING
        self._responder_resources = responder_resources
        self._initiator_depth = initiator_depth
        self._connect_future = self._loop.create_future()
        listener = self._device._fabric._listeners.get(self._target)
        offered = listener is not None and listener._offer(
            InprocConnectRequest(
                listener, self, private_data, responder_resources, initiator_depth, rnr_retry
            )
        )
        if not offered:  # nobody listens there (or the backlog is full): the CM rejects
            self._loop.call_soon(
                self._rejected, bytes(IB_REJECT_PRIVATE_DATA_MAX), _CM_REJ_INVALID_SERVICE_ID
            )
        try:
            return await self._connect_future
        except BaseException:
            if self._state is _State.CONNECTING:
                self._state = _State.INIT
            raise

    def _rejected(self, private_data: bytes, status: int) -> None:
        fut = self._connect_future
        if fut is not None and not fut.done():
            self._state = _State.INIT
            fut.set_exception(ConnectionRejected(private_data, status))

    async def _accept(
        self, private_data: bytes, responder_resources: int, initiator_depth: int, rnr_retry: int
    ) -> bytes:
        request = self._request
        assert request is not None
        if len(private_data) > self._device.caps.max_accept_private_data:
            raise ProviderError("accept private data too long")
        check_accept(request, initiator_depth)
        active = request._active
        if not request._active_waiting() or active._state is not _State.CONNECTING:
            raise ConnectError("the connecting peer went away (RDMA_CM_EVENT_CONNECT_ERROR)")
        # Negotiated read resources: IRD as offered, ORD bounded by the peer's IRD.
        self._responder_resources = responder_resources
        self._initiator_depth = initiator_depth
        active._initiator_depth = min(active._initiator_depth, responder_resources)
        self._peer_rnr_retry = request._rnr_retry
        active._peer_rnr_retry = rnr_retry
        self._peer = active
        active._peer = self
        self._state = _State.RTS
        active._state = _State.RTS
        assert active._connect_future is not None
        active._connect_future.set_result(_pad(private_data, IB_ACCEPT_PRIVATE_DATA_MAX))
        await asyncio.sleep(0)
        return request.private_data

    def disconnect(self) -> None:
        if self._state is _State.RTS:
            self._break("local disconnect", None)
        elif self._state in (_State.INIT, _State.CONNECTING):
            fut = self._connect_future
            if fut is not None and not fut.done():
                fut.set_exception(ConnectError("disconnected while connecting"))
            self._state = _State.ERROR
            self._flush()

    def close(self) -> None:
        if self._state is _State.CLOSED:
            return
        self.disconnect()
        self._state = _State.CLOSED
        self._cancel_rnr()
        self._device._connections.discard(self)

    # Posting.

    def _check_post(self, wr_id: int) -> None:
        if self._state is _State.CLOSED:
            raise ProviderError("connection closed")
        if wr_id in self._outstanding:
            raise ProviderError(f"wr_id {wr_id} is still outstanding")

    def post_recv(self, wr_id: int, sge: Sge) -> None:
        self._check_post(wr_id)
        if len(self._rq) >= self._config.max_recv_wr:
            raise ProviderError("receive queue full (ENOMEM)")
        self._outstanding.add(wr_id)
        if self._state is _State.ERROR:
            self._emit(Completion(wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV))
            self._outstanding.discard(wr_id)
            return
        self._rq.append((wr_id, sge))
        peer = self._peer
        if peer is not None and peer._rnr_waiting:
            peer._cancel_rnr()
            peer._schedule()

    def _post(self, wr: _WorkRequest) -> None:
        self._check_post(wr.wr_id)
        if self._state in (_State.INIT, _State.CONNECTING):
            raise ProviderError("queue pair not connected (EINVAL)")
        if len(wr.sges) > self._config.max_send_sge:
            raise ProviderError(f"{len(wr.sges)} SGEs exceed max_send_sge")
        if len(self._sq) >= self._config.max_send_wr:
            raise ProviderError("send queue full (ENOMEM)")
        self._outstanding.add(wr.wr_id)
        if self._state is _State.ERROR:
            self._emit(Completion(wr.wr_id, WcStatus.WR_FLUSH_ERR, wr.opcode))
            self._outstanding.discard(wr.wr_id)
            return
        self._sq.append(wr)
        self._schedule()

    def post_send(
        self,
        wr_id: int,
        sges: Sequence[Sge],
        *,
        invalidate_rkey: int | None = None,
        inline: bool = False,
        writes: Sequence[RdmaWriteRequest] = (),
    ) -> None:
        inline_data = None
        for w in writes:  # posted in order ahead of the Send, as a linked list would be
            self.post_rdma_write(w.wr_id, w.sges, w.remote_addr, w.rkey)
        if invalidate_rkey is not None and not self._device.caps.remote_invalidate:
            raise ProviderError("Send with Invalidate not supported by the device")
        if inline:
            total = sum(s.length for s in sges)
            if total > self._config.max_inline_data:
                raise ProviderError(f"inline send of {total} bytes exceeds max_inline_data")
            try:
                inline_data = b"".join(bytes(self._pd.local(s, write=False)) for s in sges)
            except _WcError as err:
                raise ProviderError(f"inline data not readable: {err.reason}") from None
        self._post(
            _WorkRequest(
                wr_id,
                WcOpcode.SEND,
                tuple(sges),
                invalidate_rkey=invalidate_rkey,
                inline_data=inline_data,
            )
        )

    def post_rdma_write(self, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int) -> None:
        self._post(_WorkRequest(wr_id, WcOpcode.RDMA_WRITE, tuple(sges), remote_addr, rkey))

    def post_rdma_read(self, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int) -> None:
        self._post(_WorkRequest(wr_id, WcOpcode.RDMA_READ, tuple(sges), remote_addr, rkey))

    def post_bind_window(
        self,
        wr_id: int,
        window: MemoryWindow,
        region: MemoryRegion,
        offset: int,
        length: int,
        access: Access,
    ) -> int:
        if not isinstance(window, InprocWindow) or not isinstance(region, InprocRegion):
            raise ProviderError("window and region must come from this provider")
        if window._rkey is not None:
            raise ProviderError("a memory window is bound once; allocate a new one")
        if access & ~(Access.REMOTE_READ | Access.REMOTE_WRITE):
            raise ProviderError("window access must be REMOTE_READ and/or REMOTE_WRITE")
        rkey = self._pd._new_key()
        wr = _WorkRequest(
            wr_id,
            WcOpcode.BIND_MW,
            window=window,
            region=region,
            bind_addr=region.addr + offset,
            bind_length=length,
            bind_access=access,
        )
        self._post(wr)
        window._rkey = rkey
        self._pd._objects[rkey] = window
        return rkey

    def post_local_invalidate(self, wr_id: int, rkey: int) -> None:
        self._post(_WorkRequest(wr_id, WcOpcode.LOCAL_INV, rkey=rkey))

    # Execution.

    def _schedule(self) -> None:
        if not self._scheduled and self._state is _State.RTS:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _cancel_rnr(self) -> None:
        self._rnr_waiting = False
        if self._rnr_handle is not None:
            self._rnr_handle.cancel()
            self._rnr_handle = None

    def _run(self) -> None:
        self._scheduled = False
        self._rnr_waiting = False
        self._rnr_handle = None
        while self._sq and self._state is _State.RTS:
            wr = self._sq[0]
            try:
                byte_len = self._execute(wr)
            except _WcError as err:
                self._sq.popleft()
                self._fail(wr, err)
                return
            if byte_len is None:  # receiver not ready: wait for a receive or the RNR timer
                return
            self._sq.popleft()
            self._complete(wr.wr_id, wr.opcode, WcStatus.SUCCESS, byte_len)

    def _gather(self, sges: tuple[Sge, ...]) -> bytes:
        return b"".join(bytes(self._pd.local(s, write=False)) for s in sges)

    def _execute(self, wr: _WorkRequest) -> int | None:
        peer = self._peer
        if wr.opcode is WcOpcode.BIND_MW:
            assert wr.window is not None and wr.region is not None
            self._pd.bind(wr.window, wr.region, wr.bind_addr, wr.bind_length, wr.bind_access, self)
            return 0
        if wr.opcode is WcOpcode.LOCAL_INV:
            if not self._pd.invalidate(wr.rkey, self):
                raise _WcError(WcStatus.MW_BIND_ERR, f"rkey {wr.rkey:#x} cannot be invalidated")
            return 0
        assert peer is not None
        if wr.opcode is WcOpcode.RDMA_WRITE:
            data = self._gather(wr.sges)
            target = self._remote(peer, wr.rkey, wr.remote_addr, len(data), Access.REMOTE_WRITE)
            target[:] = data
            return len(data)
        if wr.opcode is WcOpcode.RDMA_READ:
            sinks = [self._pd.local(s, write=True) for s in wr.sges]
            total = sum(len(s) for s in sinks)
            if self._initiator_depth == 0:
                raise _WcError(WcStatus.LOC_QP_OP_ERR, "RDMA Read with an ORD of 0")
            if peer._responder_resources == 0:
                raise _WcError(
                    WcStatus.REM_INV_REQ_ERR,
                    "RDMA Read toward a peer whose IRD is 0",
                    peer_breaks=True,
                    peer_status=WcStatus.REM_INV_REQ_ERR,
                )
            source = self._remote(peer, wr.rkey, wr.remote_addr, total, Access.REMOTE_READ)
            pos = 0
            for sink in sinks:
                sink[:] = source[pos : pos + len(sink)]
                pos += len(sink)
            return total
        return self._send(peer, wr)

    def _remote(
        self, peer: InprocConnection, rkey: int, addr: int, length: int, need: Access
    ) -> memoryview:
        try:
            return peer._pd.remote(rkey, addr, length, need, via=peer)
        except _WcError as err:
            # The responder's queue pair goes to the error state too (class C error).
            err.peer_breaks = True
            err.peer_status = WcStatus.REM_ACCESS_ERR
            raise

    def _send(self, peer: InprocConnection, wr: _WorkRequest) -> int | None:
        data = wr.inline_data if wr.inline_data is not None else self._gather(wr.sges)
        if not peer._rq:
            if wr.rnr_left is None:
                wr.rnr_left = self._peer_rnr_retry
            if wr.rnr_left == RNR_FOREVER:
                self._rnr_waiting = True
                return None
            if wr.rnr_left == 0:
                raise _WcError(WcStatus.RNR_RETRY_EXC_ERR, "receiver not ready, retries exhausted")
            wr.rnr_left -= 1
            self._rnr_waiting = True
            self._rnr_handle = self._loop.call_later(self._device._fabric.rnr_timer, self._run)
            return None
        recv_id, recv_sge = peer._rq.popleft()
        try:
            sink = peer._pd.local(recv_sge, write=True)
        except _WcError as err:
            raise _WcError(
                WcStatus.REM_OP_ERR,
                f"peer could not place the Send: {err.reason}",
                peer_breaks=True,
                peer_status=err.status,
                peer_recv=recv_id,
            ) from None
        if len(data) > len(sink):
            raise _WcError(
                WcStatus.REM_INV_REQ_ERR,
                f"Send of {len(data)} bytes into a {len(sink)}-byte receive",
                peer_breaks=True,
                peer_status=WcStatus.LOC_LEN_ERR,
                peer_recv=recv_id,
            )
        sink[: len(data)] = data
        invalidated = None
        if wr.invalidate_rkey is not None:
            if not peer._pd.invalidate(wr.invalidate_rkey, peer):
                raise _WcError(
                    WcStatus.REM_INV_REQ_ERR,
                    f"Send with Invalidate of rkey {wr.invalidate_rkey:#x}, which the peer "
                    "cannot invalidate",
                    peer_breaks=True,
                    peer_status=WcStatus.REM_INV_REQ_ERR,
                    peer_recv=recv_id,
                )
            invalidated = wr.invalidate_rkey
        peer._complete(recv_id, WcOpcode.RECV, WcStatus.SUCCESS, len(data), invalidated)
        return len(data)

    # Completions and failure.

    def _complete(
        self,
        wr_id: int,
        opcode: WcOpcode,
        status: WcStatus,
        byte_len: int = 0,
        invalidated_rkey: int | None = None,
    ) -> None:
        self._outstanding.discard(wr_id)
        self._emit(Completion(wr_id, status, opcode, byte_len, invalidated_rkey))

    def _emit(self, event: ConnectionEvent) -> None:
        self._loop.call_soon(self._deliver, event)

    def _deliver(self, event: ConnectionEvent) -> None:
        if self._state is not _State.CLOSED:
            self._on_event(event)

    def _fail(self, wr: _WorkRequest, err: _WcError) -> None:
        """Complete ``wr`` with its error and break this side; then the peer: the receive it
        consumed fails, and it breaks with its own status (or by the CM disconnect)."""
        self._complete(wr.wr_id, wr.opcode, err.status)
        self._break(f"{wr.opcode.name} failed: {err.reason}", err.status, notify_peer=False)
        peer = self._peer
        if peer is None or peer._state is not _State.RTS:
            return
        if err.peer_recv is not None:
            peer._complete(err.peer_recv, WcOpcode.RECV, err.peer_status or err.status)
        if err.peer_breaks:
            peer._break(f"responder error: {err.reason}", err.peer_status, notify_peer=False)
        else:
            peer._break("peer disconnected", None, notify_peer=False)

    def _flush(self) -> None:
        self._cancel_rnr()
        while self._sq:
            wr = self._sq.popleft()
            self._complete(wr.wr_id, wr.opcode, WcStatus.WR_FLUSH_ERR)
        while self._rq:
            wr_id, _ = self._rq.popleft()
            self._complete(wr_id, WcOpcode.RECV, WcStatus.WR_FLUSH_ERR)

    def _break(self, reason: str, status: WcStatus | None, *, notify_peer: bool = True) -> None:
        """Error state: flush, report ``Disconnected`` once, disconnect the peer."""
        if self._state is not _State.RTS:
            return
        self._state = _State.ERROR
        self._flush()
        if not self._disconnected:
            self._disconnected = True
            self._emit(Disconnected(reason, status))
        peer = self._peer
        if notify_peer and peer is not None:
            peer._break("peer disconnected", None)
