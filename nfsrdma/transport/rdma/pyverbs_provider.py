"""The product verbs provider: rdma-core's pyverbs (Debian python3-pyverbs 44) and rdma_cm.

Everything is driven by the asyncio loop through file descriptors, because pyverbs never
releases the GIL and a blocking verbs call would freeze the interpreter:

- each rdma_cm event channel (``/dev/infiniband/rdma_cm``) and each completion channel
  (``anon_inode:[infinibandevent]``) is made non-blocking and watched with ``loop.add_reader``;
  pyverbs 44 does not expose these descriptors, so they are found in ``/proc/self/fd`` as the
  one new descriptor of the right kind after creating the channel;
- on a readable CM channel: read events until ``EAGAIN``, acknowledge each at once (so
  ``rdma_destroy_id`` never waits); on a readable completion channel: ``get_cq_event``,
  ``ack_events``, ``req_notify``, then drain ``poll()``;
- address and route resolution and connection setup use asynchronous rdma_cm (``connect``,
  ``accept`` and ``establish`` only queue a CM message).

Queue pairs are created by us (not by rdma_cm) on the device's protection domain, with one CQ
and completion channel per connection, and moved through INIT/RTR/RTS with attributes from
``rdma_init_qp_attr``; hence the active side sees ``CONNECT_RESPONSE`` and calls ``establish``.
Memory is our own anonymous ``mmap`` registered with ``MR(..., address=...)``, so
``MemoryRegion.buffer`` is a zero-copy view that stays valid after deregistration.

Quirks of pyverbs 44 handled here: ``CMEvent`` exposes neither the event's ``rdma_cm_id`` nor its
status or read resources, so those are read from the ``struct rdma_cm_event`` it wraps
(validated against the event type); closing a child ``CMID`` clears the listener's PD and
context wrappers, so only the device's own wrappers are ever used; a ``MemoryWindow`` can be
bound once only (pyverbs always binds with ``ibv_inc_rkey`` of the allocation rkey); rxe
reports a remote invalidation with the kernel's flag bit (``IB_WC_WITH_INVALIDATE``, which is
``IBV_WC_IP_CSUM_OK`` in user space) rather than ``IBV_WC_WITH_INV``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import itertools
import logging
import mmap
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
from pyverbs.cq import CQ, CompChannel
from pyverbs.mr import MR, MW, MWBindInfo
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from nfsrdma.transport.rdma.provider import (
    Access,
    Completion,
    ConnectError,
    ConnectionEvent,
    ConnectionRejected,
    DeviceCaps,
    Disconnected,
    EventHandler,
    MemoryRegion,
    MemoryWindow,
    ProviderError,
    QueuePairConfig,
    RdmaWriteRequest,
    Sge,
    WcOpcode,
    WcStatus,
    check_config,
    check_rd_atomic,
)

__all__ = [
    "PyverbsConnectRequest",
    "PyverbsConnection",
    "PyverbsDevice",
    "PyverbsListener",
    "PyverbsPD",
    "PyverbsRegion",
    "PyverbsWindow",
    "open_device",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_RXE_VENDOR_ID = 0xFFFFFF
_POLL_BATCH = 32
_RESOLVE_TIMEOUT_MS = 2000
_TRANSPORT_RETRY = 6
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)


# File descriptors pyverbs 44 does not expose.


def _fd_targets() -> dict[int, str]:
    targets: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return targets


def _create_with_fd(factory: Callable[[], _T], kind: str) -> tuple[_T, int]:
    """Create a verbs channel and find the one new descriptor of ``kind``; make it
    non-blocking so a spurious read fails with EAGAIN instead of freezing the loop."""
    before = {fd for fd, target in _fd_targets().items() if kind in target}
    obj = factory()
    new = [fd for fd, target in _fd_targets().items() if kind in target and fd not in before]
    if len(new) != 1:
        raise ProviderError(f"cannot identify the descriptor of a new {kind} channel: {new}")
    fd = new[0]
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return obj, fd


def _is_again(exc: PyverbsError) -> bool:
    return getattr(exc, "error_code", None) in _AGAIN


# struct rdma_cm_event, which pyverbs 44 wraps without exposing.


class _CmConnParam(ctypes.Structure):
    _fields_ = (
        ("private_data", ctypes.c_void_p),
        ("private_data_len", ctypes.c_uint8),
        ("responder_resources", ctypes.c_uint8),
        ("initiator_depth", ctypes.c_uint8),
        ("flow_control", ctypes.c_uint8),
        ("retry_count", ctypes.c_uint8),
        ("rnr_retry_count", ctypes.c_uint8),
        ("srq", ctypes.c_uint8),
        ("qp_num", ctypes.c_uint32),
    )


class _CmEventStruct(ctypes.Structure):
    _fields_ = (
        ("id", ctypes.c_void_p),
        ("listen_id", ctypes.c_void_p),
        ("event", ctypes.c_int),
        ("status", ctypes.c_int),
        ("conn", _CmConnParam),  # first member of the param union
    )


_event_slot: int | None = None


def _event_struct(event: Any, event_type: int) -> _CmEventStruct | None:
    """The C event behind a pyverbs ``CMEvent``: the pointer field of the Python object whose
    target carries the same event type and a non-NULL id (slot remembered once found)."""
    global _event_slot
    base = id(event)
    slots = type(event).__basicsize__ // 8
    order = [s for s in (_event_slot, 5, *range(2, slots)) if s is not None and s < slots]
    for slot in order:
        pointer = ctypes.c_uint64.from_address(base + 8 * slot).value
        if pointer < 0x10000:
            continue
        candidate = _CmEventStruct.from_address(pointer)
        # Type 0 (ADDR_RESOLVED) matches too much memory: trust only the remembered slot.
        if candidate.event == event_type and candidate.id and (event_type or slot == _event_slot):
            _event_slot = slot
            return candidate
    return None


@dataclass(frozen=True, slots=True)
class _CmInfo:
    type: int
    name: str
    status: int
    id: int | None
    private_data: bytes
    responder_resources: int
    initiator_depth: int


def _cm_info(event: Any) -> _CmInfo:
    event_type = int(event.event_type)
    raw = _event_struct(event, event_type)
    return _CmInfo(
        type=event_type,
        name=str(event.event_str()),
        status=int(raw.status) if raw is not None else 0,
        id=int(raw.id) if raw is not None and raw.id else None,
        private_data=bytes(event.private_data or b""),
        responder_resources=int(raw.conn.responder_resources) if raw is not None else 0,
        initiator_depth=int(raw.conn.initiator_depth) if raw is not None else 0,
    )


_CmHandler = Callable[[_CmInfo, Any], None]


class _CmChannel:
    """A non-blocking rdma_cm event channel read by the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: _CmHandler) -> None:
        self._loop = loop
        self.on_event = on_event
        self.channel, self.fd = _create_with_fd(CMEventChannel, "/dev/infiniband/rdma_cm")
        self._closed = False
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        while not self._closed:
            try:
                event = CMEvent(self.channel)
            except PyverbsRDMAError as exc:
                if not _is_again(exc):
                    log.error("rdma_get_cm_event failed: %s", exc)
                return
            try:
                self.on_event(_cm_info(event), event)
            except Exception:
                log.exception("error handling an rdma_cm event")
            finally:
                event.close()  # acknowledges it unless the handler already did

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self.fd)
            self.channel.close()


# Memory.


def _address_of(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class PyverbsRegion:
    def __init__(self, mr: Any, view: memoryview, addr: int, access: Access) -> None:
        self._mr = mr
        self._view = view
        self._addr = addr
        self._access = access
        self._lkey = int(mr.lkey)
        self._rkey = int(mr.rkey)
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
        if length is None:
            length = len(self._view) - offset
        if offset < 0 or length < 0 or offset + length > len(self._view):
            raise ProviderError(f"slice {offset}+{length} outside a {len(self._view)}-byte region")
        return Sge(self._addr + offset, length, self._lkey)

    def deregister(self) -> None:
        if self._registered:
            self._registered = False
            self._mr.close()  # ibv_dereg_mr; the memory is ours (an mmap) and stays valid


class PyverbsWindow:
    def __init__(self, mw: Any) -> None:
        self._mw = mw
        self._rkey: int | None = None

    @property
    def rkey(self) -> int | None:
        return self._rkey

    def close(self) -> None:
        self._mw.close()


class PyverbsPD:
    def __init__(self, device: PyverbsDevice, pd: Any) -> None:
        self._device = device
        self._pd = pd
        self._regions: weakref.WeakSet[PyverbsRegion] = weakref.WeakSet()

    def register(self, length: int, access: Access) -> PyverbsRegion:
        if length <= 0:
            raise ProviderError("cannot register an empty region")
        return self._register(memoryview(mmap.mmap(-1, length)), access)

    def register_buffer(self, buffer: memoryview, access: Access) -> PyverbsRegion:
        view = memoryview(buffer)
        if view.readonly or not view.contiguous:
            raise ProviderError("registered memory must be writable and contiguous")
        view = view.cast("B")
        if len(view) == 0:
            raise ProviderError("cannot register an empty region")
        return self._register(view, access)

    def _register(self, view: memoryview, access: Access) -> PyverbsRegion:
        addr = _address_of(view)
        try:
            mr = MR(self._pd, len(view), int(access), address=addr)
        except PyverbsError as exc:
            raise ProviderError(f"memory registration failed: {exc}") from exc
        region = PyverbsRegion(mr, view, addr, access)
        self._regions.add(region)
        return region

    def alloc_window(self) -> PyverbsWindow:
        if not self._device.caps.memory_windows:
            raise ProviderError("memory windows not supported")
        try:
            return PyverbsWindow(MW(self._pd, e.IBV_MW_TYPE_2))
        except PyverbsError as exc:
            raise ProviderError(f"cannot allocate a memory window: {exc}") from exc

    def _close(self) -> None:
        for region in list(self._regions):
            region.deregister()


# Device.


def _probe_inline(context: Any, pd: Any, limit: int) -> int:
    cq = CQ(context, 2, None, None, 0)
    try:
        for want in (512, 256, 128, 64, 0):
            if want > limit:
                continue
            cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1,
                        max_inline_data=want)  # fmt: skip
            try:
                qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
            except PyverbsError:
                continue
            qp.close()
            return want
        return 0
    finally:
        cq.close()


async def open_device(address: str) -> PyverbsDevice:
    """Open the RDMA device that owns the local IP ``address`` (e.g. rxe0's)."""
    return PyverbsDevice(address, asyncio.get_running_loop())


class PyverbsDevice:
    def __init__(self, address: str, loop: asyncio.AbstractEventLoop) -> None:
        self._address = address
        self._loop = loop
        self._connections: set[PyverbsConnection] = set()
        self._listeners: set[PyverbsListener] = set()
        self._closed = False
        # An identifier bound to the address ties us to its device; its verbs context and
        # protection domain (rdma_cm's per-device ones) are the ones everything else uses.
        self._channel = _CmChannel(loop, lambda info, event: None)
        self._anchor = CMID(creator=self._channel.channel)
        try:
            self._anchor.bind_addr(_passive_addr(address, 0))
        except PyverbsError as exc:
            self._anchor.close()
            self._channel.close()
            raise ProviderError(f"no RDMA device has address {address}: {exc}") from exc
        self.context = self._anchor.context
        self._pd = PyverbsPD(self, self._anchor.pd)
        attr = self.context.query_device()
        self.vendor_id = int(attr.vendor_id)
        mgt = bool(attr.device_cap_flags & e.IBV_DEVICE_MEM_MGT_EXTENSIONS)
        self._caps = DeviceCaps(
            name=str(self.context.name),
            max_send_sge=int(attr.max_sge),
            max_recv_sge=int(attr.max_sge),
            max_inline_data=_probe_inline(self.context, self._anchor.pd, 512),
            max_qp_wr=int(attr.max_qp_wr),
            max_qp_rd_atom=int(attr.max_qp_rd_atom),
            max_qp_init_rd_atom=int(attr.max_qp_init_rd_atom),
            remote_invalidate=mgt,
            memory_windows=mgt and int(attr.max_mw) > 0,
        )
        self.with_inv_mask = int(e.IBV_WC_WITH_INV)
        if self.vendor_id == _RXE_VENDOR_ID:
            self.with_inv_mask |= int(e.IBV_WC_IP_CSUM_OK)

    @property
    def caps(self) -> DeviceCaps:
        return self._caps

    @property
    def pd(self) -> PyverbsPD:
        return self._pd

    @property
    def address(self) -> str:
        return self._address

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderError("device closed")

    async def listen(self, port: int, backlog: int = 16) -> PyverbsListener:
        self._check_open()
        if not 0 < port < 65536:
            raise ProviderError("listen needs an explicit port")
        listener = PyverbsListener(self, port, backlog)
        self._listeners.add(listener)
        return listener

    async def resolve(
        self, address: str, port: int, config: QueuePairConfig, on_event: EventHandler
    ) -> PyverbsConnection:
        self._check_open()
        check_config(self._caps, config)
        resolved: asyncio.Future[None] = self._loop.create_future()
        conn: PyverbsConnection | None = None

        def on_cm(info: _CmInfo, event: Any) -> None:
            if conn is not None:
                conn._on_cm_event(info)
            elif resolved.done():
                return
            elif info.type == ce.RDMA_CM_EVENT_ADDR_RESOLVED:
                try:
                    cmid.resolve_route(_RESOLVE_TIMEOUT_MS)
                except PyverbsError as exc:
                    resolved.set_exception(ConnectError(f"resolve_route: {exc}"))
            elif info.type == ce.RDMA_CM_EVENT_ROUTE_RESOLVED:
                resolved.set_result(None)
            else:
                resolved.set_exception(ConnectError(info.name, info.status))

        channel = _CmChannel(self._loop, on_cm)
        cmid = CMID(creator=channel.channel)
        try:
            cmid.resolve_addr(_active_addr(address, port), _RESOLVE_TIMEOUT_MS)
            await resolved
            used = str(cmid.context.name)
            if used != self._caps.name:
                raise ConnectError(f"the route to {address} uses {used}, not {self._caps.name}")
            conn = PyverbsConnection(self, cmid, config, on_event, channel=channel)
        except BaseException as exc:
            cmid.close()
            channel.close()
            if isinstance(exc, PyverbsError):
                raise ConnectError(f"cannot reach {address}:{port}: {exc}") from exc
            raise
        self._connections.add(conn)
        return conn

    def close(self) -> None:
        if self._closed:
            return
        for listener in list(self._listeners):
            listener.close()
        for conn in list(self._connections):
            conn.close()
        self._pd._close()
        self._closed = True
        self._anchor.close()
        self._channel.close()


def _passive_addr(address: str, port: int) -> Any:
    flags = ce.RAI_PASSIVE | ce.RAI_NUMERICHOST
    return AddrInfo(src=address, src_service=str(port), port_space=ce.RDMA_PS_TCP, flags=flags)


def _active_addr(address: str, port: int) -> Any:
    return AddrInfo(
        dst=address, dst_service=str(port), port_space=ce.RDMA_PS_TCP, flags=ce.RAI_NUMERICHOST
    )


# Listener and incoming requests.


class PyverbsListener:
    def __init__(self, device: PyverbsDevice, port: int, backlog: int) -> None:
        self._device = device
        self._port = port
        self._queue: asyncio.Queue[PyverbsConnectRequest] = asyncio.Queue()
        self._children: dict[int, PyverbsConnectRequest] = {}
        self._closed = False
        self._channel = _CmChannel(device.loop, self._on_cm_event)
        self._cmid = CMID(creator=self._channel.channel)
        try:
            self._cmid.bind_addr(_passive_addr(device.address, port))
            self._cmid.listen(backlog)
        except PyverbsError as exc:
            self._cmid.close()
            self._channel.close()
            raise ProviderError(f"cannot listen on {device.address}:{port}: {exc}") from exc

    @property
    def port(self) -> int:
        return self._port

    async def get_request(self) -> PyverbsConnectRequest:
        if self._closed:
            raise ProviderError("listener closed")
        return await self._queue.get()

    def _on_cm_event(self, info: _CmInfo, event: Any) -> None:
        if info.type == ce.RDMA_CM_EVENT_CONNECT_REQUEST:
            child = CMID(creator=event, listen_id=self._cmid)  # before the event is acked
            request = PyverbsConnectRequest(self, child, info)
            if info.id is not None:
                self._children[info.id] = request
            if self._closed:
                request.reject()
            else:
                self._queue.put_nowait(request)
            return
        request_for = self._children.get(info.id) if info.id is not None else None
        if request_for is not None:
            request_for._on_cm_event(info)
        else:
            log.debug("rdma_cm event %s for an unknown identifier", info.name)

    def _forget(self, request: PyverbsConnectRequest) -> None:
        if request.cm_id is not None:
            self._children.pop(request.cm_id, None)
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self._closed and not self._children:
            self._channel.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._device._listeners.discard(self)
        while not self._queue.empty():
            self._queue.get_nowait().reject()
        self._cmid.close()
        self._maybe_release()


class PyverbsConnectRequest:
    def __init__(self, listener: PyverbsListener, cmid: Any, info: _CmInfo) -> None:
        self._listener = listener
        self._cmid = cmid
        self.cm_id = info.id
        self._private_data = info.private_data
        self._responder_resources = info.responder_resources
        self._initiator_depth = info.initiator_depth
        self._connection: PyverbsConnection | None = None
        self._done = False
        self._pending_events: list[_CmInfo] = []

    @property
    def private_data(self) -> bytes:
        return self._private_data

    @property
    def responder_resources(self) -> int:
        return self._responder_resources

    @property
    def initiator_depth(self) -> int:
        return self._initiator_depth

    def create_connection(
        self, config: QueuePairConfig, on_event: EventHandler
    ) -> PyverbsConnection:
        if self._done or self._connection is not None:
            raise ProviderError("connect request already handled")
        device = self._listener._device
        device._check_open()
        check_config(device.caps, config)
        conn = PyverbsConnection(device, self._cmid, config, on_event, request=self)
        self._connection = conn
        device._connections.add(conn)
        for info in self._pending_events:
            conn._on_cm_event(info)
        self._pending_events.clear()
        return conn

    def reject(self, private_data: bytes = b"") -> None:
        if self._done:
            return
        self._done = True
        try:
            if private_data:
                self._cmid.reject(private_data)
            else:
                self._cmid.reject()
        except PyverbsError as exc:
            log.debug("rdma_reject failed: %s", exc)
        if self._connection is None:
            self._release()

    def _release(self) -> None:
        self._cmid.close()
        self._listener._forget(self)

    def _on_cm_event(self, info: _CmInfo) -> None:
        if self._connection is not None:
            self._connection._on_cm_event(info)
        else:
            self._pending_events.append(info)


# Connections.


_SEND_OPCODES = {
    WcOpcode.SEND: e.IBV_WR_SEND,
    WcOpcode.RDMA_WRITE: e.IBV_WR_RDMA_WRITE,
    WcOpcode.RDMA_READ: e.IBV_WR_RDMA_READ,
}


def _wc_opcode(value: int) -> WcOpcode:
    try:
        return WcOpcode(value)
    except ValueError:
        return WcOpcode.RECV if value & 0x80 else WcOpcode.SEND


class PyverbsConnection:
    def __init__(
        self,
        device: PyverbsDevice,
        cmid: Any,
        config: QueuePairConfig,
        on_event: EventHandler,
        *,
        channel: _CmChannel | None = None,
        request: PyverbsConnectRequest | None = None,
    ) -> None:
        self._device = device
        self._loop = device.loop
        self._cmid = cmid
        self._config = config
        self._on_event = on_event
        self._channel = channel  # active side: ours alone
        self._request = request  # passive side
        self._outstanding: dict[int, WcOpcode] = {}
        self._state = "init"
        self._disconnected = False
        self._closed = False
        self._establishing: asyncio.Future[bytes] | None = None
        self._responder_resources = 0
        self._initiator_depth = 0
        context = device.context
        self._comp, self._comp_fd = _create_with_fd(
            lambda: CompChannel(context), "anon_inode:[infinibandevent]"
        )
        try:
            cqe = config.max_send_wr + config.max_recv_wr + 1
            self._cq = CQ(context, cqe, None, self._comp, 0)
            self._cq.req_notify()
            cap = QPCap(
                max_send_wr=config.max_send_wr,
                max_recv_wr=config.max_recv_wr,
                max_send_sge=config.max_send_sge,
                max_recv_sge=config.max_recv_sge,
                max_inline_data=config.max_inline_data,
            )
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self._cq, rcq=self._cq, cap=cap)
            self._qp = QP(device.pd._pd, init)
            self._modify(e.IBV_QPS_INIT)
        except PyverbsError as exc:
            self._comp.close()
            raise ProviderError(f"cannot create the queue pair: {exc}") from exc
        self._loop.add_reader(self._comp_fd, self._on_cq_readable)

    @property
    def config(self) -> QueuePairConfig:
        return self._config

    @property
    def responder_resources(self) -> int:
        return self._responder_resources

    @property
    def initiator_depth(self) -> int:
        return self._initiator_depth

    @property
    def established(self) -> bool:
        return self._state == "rts"

    @property
    def broken(self) -> bool:
        return self._state in ("error", "closed")

    @property
    def qp_num(self) -> int:
        return int(self._qp.qp_num)

    @property
    def completion_fd(self) -> int:
        return self._comp_fd

    def _modify(
        self, state: int, *, responder_resources: int = 0, initiator_depth: int = 0
    ) -> None:
        attr, mask = self._cmid.init_qp_attr(state)
        if state == e.IBV_QPS_INIT:
            attr.qp_access_flags = (
                e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
            )
            mask |= e.IBV_QP_ACCESS_FLAGS
        elif state == e.IBV_QPS_RTR:
            attr.max_dest_rd_atomic = responder_resources
            mask |= e.IBV_QP_MAX_DEST_RD_ATOMIC
        elif state == e.IBV_QPS_RTS:
            attr.max_rd_atomic = initiator_depth
            mask |= e.IBV_QP_MAX_QP_RD_ATOMIC
        self._qp.modify(attr, mask)

    # Connection management.

    async def establish(
        self,
        private_data: bytes = b"",
        *,
        responder_resources: int = 0,
        initiator_depth: int = 0,
        rnr_retry: int = 7,
    ) -> bytes:
        if self._state != "init":
            raise ProviderError(f"cannot establish in state {self._state}")
        check_rd_atomic(self._device.caps, responder_resources, initiator_depth)
        if not 0 <= rnr_retry <= 7:
            raise ProviderError("rnr_retry must be 0..7")
        caps = self._device.caps
        limit = (
            caps.max_connect_private_data if self._request is None else caps.max_accept_private_data
        )
        if len(private_data) > limit:
            raise ProviderError(f"private data longer than {limit} octets")
        param = ConnParam(
            resources=responder_resources,
            depth=initiator_depth,
            retry=_TRANSPORT_RETRY,
            rnr_retry=rnr_retry,
            qp_num=self.qp_num,
            data_len=len(private_data),
        )
        if private_data:
            param.set_private_data(bytes(private_data))
        self._establishing = self._loop.create_future()
        self._responder_resources = responder_resources
        self._initiator_depth = initiator_depth
        self._state = "connecting"
        try:
            if self._request is None:
                self._cmid.connect(param)
            else:
                if initiator_depth > self._request.initiator_depth:
                    raise ProviderError(
                        f"initiator_depth {initiator_depth} exceeds the peer's responder "
                        f"resources {self._request.initiator_depth}"
                    )
                self._modify(e.IBV_QPS_RTR, responder_resources=responder_resources)
                self._modify(e.IBV_QPS_RTS, initiator_depth=initiator_depth)
                self._cmid.accept(param)
            return await self._establishing
        except PyverbsError as exc:
            self._state = "error"
            raise ConnectError(f"connection setup failed: {exc}") from exc
        except BaseException:
            if self._state == "connecting":
                self._state = "error"
            raise

    def _on_cm_event(self, info: _CmInfo) -> None:
        fut = self._establishing
        pending = fut is not None and not fut.done()
        kind = info.type
        if kind == ce.RDMA_CM_EVENT_CONNECT_RESPONSE and pending:
            assert fut is not None
            try:
                ord_ = min(self._initiator_depth, info.initiator_depth)
                self._modify(e.IBV_QPS_RTR, responder_resources=self._responder_resources)
                self._modify(e.IBV_QPS_RTS, initiator_depth=ord_)
                self._cmid.establish()
            except PyverbsError as exc:
                self._state = "error"
                fut.set_exception(ConnectError(f"cannot complete the connection: {exc}"))
                return
            self._initiator_depth = ord_
            self._state = "rts"
            fut.set_result(info.private_data)
        elif kind == ce.RDMA_CM_EVENT_ESTABLISHED and pending:
            assert fut is not None
            self._state = "rts"
            request = self._request
            fut.set_result(request.private_data if request is not None else info.private_data)
        elif kind == ce.RDMA_CM_EVENT_REJECTED and pending:
            assert fut is not None
            self._state = "error"
            fut.set_exception(ConnectionRejected(info.private_data, info.status))
        elif kind in (ce.RDMA_CM_EVENT_UNREACHABLE, ce.RDMA_CM_EVENT_CONNECT_ERROR) and pending:
            assert fut is not None
            self._state = "error"
            fut.set_exception(ConnectError(info.name, info.status))
        elif kind == ce.RDMA_CM_EVENT_DISCONNECTED:
            self._break("peer disconnected", None)
        elif kind == ce.RDMA_CM_EVENT_DEVICE_REMOVAL:
            self._break("device removed", None)
        else:
            log.debug("ignoring rdma_cm event %s", info.name)

    def disconnect(self) -> None:
        if self._state == "rts":
            self._break("local disconnect", None)
        elif self._state == "connecting":
            fut = self._establishing
            if fut is not None and not fut.done():
                fut.set_exception(ConnectError("disconnected while connecting"))
            self._break("local disconnect", None)

    def close(self) -> None:
        if self._closed:
            return
        self.disconnect()
        self._closed = True
        self._state = "closed"
        self._loop.remove_reader(self._comp_fd)
        for obj in (self._qp, self._cq, self._comp):
            try:
                obj.close()
            except PyverbsError as exc:
                log.warning("closing %s: %s", type(obj).__name__, exc)
        self._cmid.close()
        if self._channel is not None:
            self._channel.close()
        if self._request is not None:
            self._request._listener._forget(self._request)
        self._device._connections.discard(self)

    def _break(self, reason: str, status: WcStatus | None) -> None:
        """Error state (all outstanding work flushes), disconnect the peer, report once."""
        if self._disconnected or self._closed:
            return
        self._disconnected = True
        self._state = "error"
        try:
            attr = QPAttr()
            attr.qp_state = e.IBV_QPS_ERR
            self._qp.modify(attr, e.IBV_QP_STATE)
        except PyverbsError as exc:
            log.warning("cannot move the queue pair to the error state: %s", exc)
        with contextlib.suppress(PyverbsError):  # not (or no longer) connected
            self._cmid.disconnect()
        self._loop.call_soon(self._deliver, Disconnected(reason, status))

    def _deliver(self, event: ConnectionEvent) -> None:
        if not self._closed:
            self._on_event(event)

    # Completions.

    def _on_cq_readable(self) -> None:
        try:
            self._comp.get_cq_event(self._cq)
        except PyverbsRDMAError as exc:
            if not _is_again(exc):
                log.error("ibv_get_cq_event failed: %s", exc)
            return
        self._cq.ack_events(1)
        self._cq.req_notify()
        completions: list[Completion] = []
        while True:
            count, wcs = self._cq.poll(_POLL_BATCH)
            completions.extend(self._completion(wc) for wc in wcs)
            if count < _POLL_BATCH:
                break
        failure: Completion | None = None
        for completion in completions:
            if self._closed:
                return
            self._on_event(completion)
            if failure is None and not completion.ok:
                failure = completion
        if failure is not None:
            self._break(
                f"{failure.opcode.name} completed with {failure.status.name}", failure.status
            )

    def _completion(self, wc: Any) -> Completion:
        wr_id = int(wc.wr_id)
        opcode = self._outstanding.pop(wr_id, None)
        if opcode is None:
            opcode = _wc_opcode(int(wc.opcode))
        status = WcStatus.of(int(wc.status))
        invalidated = None
        ok = status is WcStatus.SUCCESS
        if ok and opcode is WcOpcode.RECV and int(wc.wc_flags) & self._device.with_inv_mask:
            invalidated = int(wc.imm_data)
        return Completion(wr_id, status, opcode, int(wc.byte_len) if ok else 0, invalidated)

    # Posting.

    def _track(self, wr_id: int, opcode: WcOpcode, sending: bool) -> None:
        if self._closed:
            raise ProviderError("connection closed")
        if sending and self._state in ("init", "connecting"):
            raise ProviderError("queue pair not connected (EINVAL)")
        if wr_id in self._outstanding:
            raise ProviderError(f"wr_id {wr_id} is still outstanding")
        self._outstanding[wr_id] = opcode

    def _post_send_wr(self, wr_id: int, wr: Any) -> None:
        try:
            self._qp.post_send(wr)
        except PyverbsError as exc:
            self._outstanding.pop(wr_id, None)
            raise ProviderError(f"post_send failed: {exc}") from exc

    @staticmethod
    def _sges(sges: Sequence[Sge]) -> list[Any]:
        if not sges:
            raise ProviderError("a work request needs at least one SGE")
        return [SGE(s.addr, s.length, s.lkey) for s in sges]

    def post_recv(self, wr_id: int, sge: Sge) -> None:
        self._track(wr_id, WcOpcode.RECV, sending=False)
        try:
            self._qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=self._sges([sge])))
        except PyverbsError as exc:
            self._outstanding.pop(wr_id, None)
            raise ProviderError(f"post_recv failed: {exc}") from exc

    def post_send(
        self,
        wr_id: int,
        sges: Sequence[Sge],
        *,
        invalidate_rkey: int | None = None,
        inline: bool = False,
        writes: Sequence[RdmaWriteRequest] = (),
    ) -> None:
        elements = self._sges(sges)
        flags = e.IBV_SEND_SIGNALED | (e.IBV_SEND_INLINE if inline else 0)
        if inline and sum(s.length for s in sges) > self._config.max_inline_data:
            raise ProviderError("inline send exceeds max_inline_data")
        opcode = e.IBV_WR_SEND if invalidate_rkey is None else e.IBV_WR_SEND_WITH_INV
        wr = SendWR(
            wr_id=wr_id, opcode=opcode, num_sge=len(elements), sg=elements, send_flags=flags
        )
        if invalidate_rkey is not None:
            if not self._device.caps.remote_invalidate:
                raise ProviderError("Send with Invalidate not supported by the device")
            wr.imm_data = invalidate_rkey  # shares the union with invalidate_rkey
        if not writes:
            self._track(wr_id, WcOpcode.SEND, sending=True)
            self._post_send_wr(wr_id, wr)
            return
        # The RDMA Writes, then the Send, linked into one list: one ibv_post_send.
        chain = [
            self._rdma_wr(WcOpcode.RDMA_WRITE, w.wr_id, w.sges, w.remote_addr, w.rkey)
            for w in writes
        ]
        chain.append(wr)
        for prev, nxt in itertools.pairwise(chain):
            prev.next_wr = nxt
        ids = [w.wr_id for w in writes]
        for i in ids:
            self._track(i, WcOpcode.RDMA_WRITE, sending=True)
        self._track(wr_id, WcOpcode.SEND, sending=True)
        try:
            self._qp.post_send(chain[0])
        except PyverbsError as exc:
            for i in [*ids, wr_id]:
                self._outstanding.pop(i, None)
            raise ProviderError(f"post_send failed: {exc}") from exc

    def _rdma_wr(
        self, opcode: WcOpcode, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int
    ) -> Any:
        elements = self._sges(sges)
        wr = SendWR(
            wr_id=wr_id,
            opcode=_SEND_OPCODES[opcode],
            num_sge=len(elements),
            sg=elements,
            send_flags=e.IBV_SEND_SIGNALED,
        )
        wr.set_wr_rdma(rkey, remote_addr)
        return wr

    def _post_rdma(
        self, opcode: WcOpcode, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int
    ) -> None:
        wr = self._rdma_wr(opcode, wr_id, sges, remote_addr, rkey)
        self._track(wr_id, opcode, sending=True)
        self._post_send_wr(wr_id, wr)

    def post_rdma_write(self, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int) -> None:
        self._post_rdma(WcOpcode.RDMA_WRITE, wr_id, sges, remote_addr, rkey)

    def post_rdma_read(self, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int) -> None:
        self._post_rdma(WcOpcode.RDMA_READ, wr_id, sges, remote_addr, rkey)

    def post_bind_window(
        self,
        wr_id: int,
        window: MemoryWindow,
        region: MemoryRegion,
        offset: int,
        length: int,
        access: Access,
    ) -> int:
        if not isinstance(window, PyverbsWindow) or not isinstance(region, PyverbsRegion):
            raise ProviderError("window and region must come from this provider")
        if window.rkey is not None:
            raise ProviderError("a memory window is bound once; allocate a new one")
        if offset < 0 or length < 0 or offset + length > region.length:
            raise ProviderError("window outside its region")
        info = MWBindInfo(region._mr, region.addr + offset, length, int(access))
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
        wr.set_bind_wr(window._mw, info)
        rkey = int(wr.rkey)
        self._track(wr_id, WcOpcode.BIND_MW, sending=True)
        self._post_send_wr(wr_id, wr)
        window._rkey = rkey
        return rkey

    def post_local_invalidate(self, wr_id: int, rkey: int) -> None:
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_LOCAL_INV, send_flags=e.IBV_SEND_SIGNALED)
        wr.imm_data = rkey  # shares the union with invalidate_rkey
        self._track(wr_id, WcOpcode.LOCAL_INV, sending=True)
        self._post_send_wr(wr_id, wr)
