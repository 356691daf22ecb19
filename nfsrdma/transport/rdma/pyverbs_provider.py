"""The product verbs provider: rdma-core's pyverbs (Debian python3-pyverbs 44) and librdmacm.

Everything is driven by the asyncio loop through file descriptors, because pyverbs never
releases the GIL and a blocking verbs call would freeze the interpreter. The provider is split
by job:

- ``rdmacm``: a typed ctypes binding of the librdmacm calls pyverbs 44 lacks or hides
  (event channels and their events, identifiers, ``rdma_init_qp_attr``, peer addresses);
- ``pyverbs_cm``: event channels on the loop, listeners, connect requests, the handshake;
- ``pyverbs_qp``: queue pair, completion queue and channel, posting, completions;
- ``pyverbs_memory``: regions, memory windows, the protection domain;
- this module: opening the device that owns an IP address, and its capabilities.

The device is found by binding an rdma_cm identifier to the address; its verbs context is then
opened by name through pyverbs, and every queue pair, CQ and registration lives there.
"""

from __future__ import annotations

import asyncio

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP, QPCap, QPInitAttr

from nfsrdma.transport.rdma.provider import (
    ConnectError,
    DeviceCaps,
    EventHandler,
    ProviderError,
    QueuePairConfig,
    check_config,
)
from nfsrdma.transport.rdma.pyverbs_cm import (
    CmChannel,
    PyverbsConnection,
    PyverbsConnectRequest,
    PyverbsListener,
)
from nfsrdma.transport.rdma.pyverbs_memory import PyverbsPD, PyverbsRegion, PyverbsWindow
from nfsrdma.transport.rdma.rdmacm import CmError, CmEvent, CmId, EventChannel, EventType

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

_RXE_VENDOR_ID = 0xFFFFFF
_RESOLVE_TIMEOUT_MS = 2000


def device_of(address: str) -> str:
    """The name of the RDMA device that owns the local IP ``address``."""
    channel = EventChannel()
    try:
        cmid = CmId.create(channel)
        try:
            cmid.bind(address, 0)
            return cmid.device_name
        finally:
            cmid.destroy()
    except ProviderError as exc:
        raise ProviderError(f"no RDMA device has address {address}: {exc}") from exc
    finally:
        channel.close()


def _probe_inline(context: Context, pd: PD, limit: int) -> int:
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
        name = device_of(address)
        try:
            self._context = Context(name=name)
            pd = PD(self._context)
            attr = self._context.query_device()
        except PyverbsError as exc:
            raise ProviderError(f"cannot open RDMA device {name}: {exc}") from exc
        self.vendor_id = int(attr.vendor_id)
        mgt = bool(attr.device_cap_flags & e.IBV_DEVICE_MEM_MGT_EXTENSIONS)
        self._caps = DeviceCaps(
            name=name,
            max_send_sge=int(attr.max_sge),
            max_recv_sge=int(attr.max_sge),
            max_inline_data=_probe_inline(self._context, pd, 512),
            max_qp_wr=int(attr.max_qp_wr),
            max_qp_rd_atom=int(attr.max_qp_rd_atom),
            max_qp_init_rd_atom=int(attr.max_qp_init_rd_atom),
            remote_invalidate=mgt,
            memory_windows=mgt and int(attr.max_mw) > 0,
        )
        self._pd = PyverbsPD(pd, self._caps)
        self._with_inv_mask = int(e.IBV_WC_WITH_INV)
        if self.vendor_id == _RXE_VENDOR_ID:
            self._with_inv_mask |= int(e.IBV_WC_IP_CSUM_OK)

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

    @property
    def context(self) -> Context:
        return self._context

    @property
    def with_inv_mask(self) -> int:
        return self._with_inv_mask

    def check_open(self) -> None:
        if self._closed:
            raise ProviderError("device closed")

    def add_connection(self, conn: PyverbsConnection) -> None:
        self._connections.add(conn)

    def forget_connection(self, conn: PyverbsConnection) -> None:
        self._connections.discard(conn)

    def forget_listener(self, listener: PyverbsListener) -> None:
        self._listeners.discard(listener)

    async def listen(self, port: int, backlog: int = 16) -> PyverbsListener:
        self.check_open()
        if not 0 < port < 65536:
            raise ProviderError("listen needs an explicit port")
        listener = PyverbsListener(self, port, backlog)
        self._listeners.add(listener)
        return listener

    async def resolve(
        self, address: str, port: int, config: QueuePairConfig, on_event: EventHandler
    ) -> PyverbsConnection:
        self.check_open()
        check_config(self._caps, config)
        resolved: asyncio.Future[None] = self._loop.create_future()
        conn: PyverbsConnection | None = None

        def on_cm(event: CmEvent) -> None:
            if conn is not None:
                conn.on_cm_event(event)
            elif resolved.done():
                return
            elif event.type == EventType.ADDR_RESOLVED:
                try:
                    cmid.resolve_route(_RESOLVE_TIMEOUT_MS)
                except ProviderError as exc:
                    resolved.set_exception(ConnectError(f"resolve_route: {exc}"))
            elif event.type == EventType.ROUTE_RESOLVED:
                resolved.set_result(None)
            else:
                resolved.set_exception(ConnectError(event.name, event.status))

        channel = CmChannel(self._loop, on_cm)
        try:
            cmid = CmId.create(channel.channel)
        except ProviderError:
            channel.close()
            raise
        try:
            cmid.resolve_addr(address, port, _RESOLVE_TIMEOUT_MS)
            await resolved
            used = cmid.device_name
            if used != self._caps.name:
                raise ConnectError(f"the route to {address} uses {used}, not {self._caps.name}")
            conn = PyverbsConnection(self, cmid, config, on_event, channel=channel)
        except BaseException as exc:
            cmid.destroy()
            channel.close()
            if isinstance(exc, CmError):
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
        self._closed = True
        self._pd.close()
        self._context.close()
