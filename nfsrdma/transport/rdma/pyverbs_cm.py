"""Connection management for the pyverbs provider: rdma_cm event channels on the loop,
listeners, incoming connection requests, and each connection's handshake.

Everything is asynchronous rdma_cm through ``rdmacm`` (librdmacm via ctypes): a readable event
channel is drained until ``EAGAIN``, each event copied and acknowledged at once. Address and
route resolution, ``connect``, ``accept`` and ``establish`` only queue CM messages; results come
back as events. Our queue pairs are not librdmacm's, so the active side sees
``CONNECT_RESPONSE``, moves its queue pair to RTR/RTS and calls ``establish``.

A listener's channel also carries the events of the identifiers librdmacm makes for incoming
connections; they are told apart by the event's ``rdma_cm_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyverbs.enums as e
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QPAttr

from nfsrdma.transport.rdma.provider import (
    ConnectError,
    ConnectionRejected,
    ConnectRequestBase,
    EventHandler,
    ProviderError,
    QueuePairConfig,
    check_accept,
    check_config,
    check_rd_atomic,
)
from nfsrdma.transport.rdma.pyverbs_qp import PyverbsQueuePair, qp_attributes
from nfsrdma.transport.rdma.rdmacm import (
    CmError,
    CmEvent,
    CmId,
    ConnParams,
    EventChannel,
    EventType,
)

if TYPE_CHECKING:
    from nfsrdma.transport.rdma.pyverbs_provider import PyverbsDevice

__all__ = ["CmChannel", "PyverbsConnectRequest", "PyverbsConnection", "PyverbsListener"]

log = logging.getLogger(__name__)

_TRANSPORT_RETRY = 6
CmHandler = Callable[[CmEvent], None]


class CmChannel:
    """A non-blocking rdma_cm event channel read by the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: CmHandler) -> None:
        self._loop = loop
        self.on_event = on_event
        self.channel = EventChannel()
        self.fd = self.channel.fd
        self._closed = False
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        while not self._closed:
            try:
                event = self.channel.get_event()
            except ProviderError as exc:
                log.error("%s", exc)
                return
            if event is None:
                return
            try:
                self.on_event(event)
            except Exception:
                log.exception("error handling an rdma_cm event")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self.fd)
            self.channel.close()


class PyverbsConnection(PyverbsQueuePair):
    """A queue pair and its rdma_cm identifier: the handshake and the disconnect."""

    def __init__(
        self,
        device: PyverbsDevice,
        cmid: CmId,
        config: QueuePairConfig,
        on_event: EventHandler,
        *,
        channel: CmChannel | None = None,
        request: PyverbsConnectRequest | None = None,
    ) -> None:
        self._cmid = cmid  # before the queue pair: its INIT attributes come from it
        self._channel = channel  # active side: ours alone
        self._request = request  # passive side
        self._establishing: asyncio.Future[bytes] | None = None
        self._responder_resources = 0
        self._initiator_depth = 0
        self._peer = cmid.peer
        self._pyverbs_device = device
        super().__init__(device, config, on_event)

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def responder_resources(self) -> int:
        return self._responder_resources

    @property
    def initiator_depth(self) -> int:
        return self._initiator_depth

    def _transition(self, state: int) -> tuple[QPAttr, int]:
        return qp_attributes(self._cmid.init_qp_attr(state))

    def _disconnect_peer(self) -> None:
        with contextlib.suppress(CmError):  # not (or no longer) connected
            self._cmid.disconnect()

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
        caps = self._device.caps
        check_rd_atomic(caps, responder_resources, initiator_depth)
        if not 0 <= rnr_retry <= 7:
            raise ProviderError("rnr_retry must be 0..7")
        limit = (
            caps.max_connect_private_data if self._request is None else caps.max_accept_private_data
        )
        if len(private_data) > limit:
            raise ProviderError(f"private data longer than {limit} octets")
        params = ConnParams(
            qp_num=self.qp_num,
            responder_resources=responder_resources,
            initiator_depth=initiator_depth,
            retry_count=_TRANSPORT_RETRY,
            rnr_retry_count=rnr_retry,
            private_data=bytes(private_data),
        )
        self._establishing = self._loop.create_future()
        self._responder_resources = responder_resources
        self._initiator_depth = initiator_depth
        self._state = "connecting"
        try:
            if self._request is None:
                self._cmid.connect(params)
            else:
                check_accept(self._request, initiator_depth)
                self._modify(e.IBV_QPS_RTR, responder_resources=responder_resources)
                self._modify(e.IBV_QPS_RTS, initiator_depth=initiator_depth)
                self._cmid.accept(params)
            return await self._establishing
        except (PyverbsError, CmError) as exc:
            self._state = "error"
            raise ConnectError(f"connection setup failed: {exc}") from exc
        except BaseException:
            if self._state == "connecting":
                self._state = "error"
            raise

    def on_cm_event(self, event: CmEvent) -> None:
        fut = self._establishing
        pending = fut is not None and not fut.done()
        kind = event.type
        if kind == EventType.CONNECT_RESPONSE and pending:
            assert fut is not None
            try:
                ord_ = min(self._initiator_depth, event.initiator_depth)
                self._modify(e.IBV_QPS_RTR, responder_resources=self._responder_resources)
                self._modify(e.IBV_QPS_RTS, initiator_depth=ord_)
                self._cmid.establish()
            except (PyverbsError, CmError) as exc:
                self._state = "error"
                fut.set_exception(ConnectError(f"cannot complete the connection: {exc}"))
                return
            self._initiator_depth = ord_
            self._state = "rts"
            fut.set_result(event.private_data)
        elif kind == EventType.ESTABLISHED and pending:
            assert fut is not None
            self._state = "rts"
            request = self._request
            fut.set_result(request.private_data if request is not None else event.private_data)
        elif kind == EventType.REJECTED and pending:
            assert fut is not None
            self._state = "error"
            fut.set_exception(ConnectionRejected(event.private_data, event.status))
        elif kind in (EventType.UNREACHABLE, EventType.CONNECT_ERROR) and pending:
            assert fut is not None
            self._state = "error"
            fut.set_exception(ConnectError(event.name, event.status))
        elif kind == EventType.DISCONNECTED:
            self._break("peer disconnected", None)
        elif kind == EventType.DEVICE_REMOVAL:
            self._break("device removed", None)
        else:
            log.debug("ignoring rdma_cm event %s", event.name)

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
        self._release_verbs()
        try:
            self._cmid.destroy()
        except CmError as exc:
            log.warning("%s", exc)
        if self._channel is not None:
            self._channel.close()
        if self._request is not None:
            self._request.forget()
        self._pyverbs_device.forget_connection(self)


class PyverbsListener:
    def __init__(self, device: PyverbsDevice, port: int, backlog: int) -> None:
        self._device = device
        self._port = port
        self._queue: asyncio.Queue[PyverbsConnectRequest] = asyncio.Queue()
        self._children: dict[int, PyverbsConnectRequest] = {}
        self._closed = False
        self._channel = CmChannel(device.loop, self._on_cm_event)
        try:
            self._cmid = CmId.create(self._channel.channel)
        except ProviderError:
            self._channel.close()
            raise
        try:
            self._cmid.bind(device.address, port)
            self._cmid.listen(backlog)
        except ProviderError as exc:
            self._cmid.destroy()
            self._channel.close()
            raise ProviderError(f"cannot listen on {device.address}:{port}: {exc}") from exc

    @property
    def port(self) -> int:
        return self._port

    @property
    def device(self) -> PyverbsDevice:
        return self._device

    async def get_request(self) -> PyverbsConnectRequest:
        if self._closed:
            raise ProviderError("listener closed")
        return await self._queue.get()

    def _on_cm_event(self, event: CmEvent) -> None:
        if event.type == EventType.CONNECT_REQUEST:
            request = PyverbsConnectRequest(self, CmId.adopt(event.id), event)
            self._children[event.id] = request
            if self._closed:
                request.reject()
            else:
                self._queue.put_nowait(request)
            return
        request_for = self._children.get(event.id)
        if request_for is not None:
            request_for.on_cm_event(event)
        else:
            log.debug("rdma_cm event %s for an unknown identifier", event.name)

    def forget(self, request: PyverbsConnectRequest) -> None:
        self._children.pop(request.cm_id, None)
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self._closed and not self._children:
            self._channel.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._device.forget_listener(self)
        while not self._queue.empty():
            self._queue.get_nowait().reject()
        self._cmid.destroy()
        self._maybe_release()


class PyverbsConnectRequest(ConnectRequestBase):
    def __init__(self, listener: PyverbsListener, cmid: CmId, event: CmEvent) -> None:
        super().__init__(
            event.private_data, event.responder_resources, event.initiator_depth, cmid.peer
        )
        self._listener = listener
        self._cmid = cmid
        self.cm_id = event.id
        self._connection: PyverbsConnection | None = None
        self._done = False
        self._pending_events: list[CmEvent] = []

    def create_connection(
        self, config: QueuePairConfig, on_event: EventHandler
    ) -> PyverbsConnection:
        if self._done or self._connection is not None:
            raise ProviderError("connect request already handled")
        device = self._listener.device
        device.check_open()
        check_config(device.caps, config)
        conn = PyverbsConnection(device, self._cmid, config, on_event, request=self)
        self._connection = conn
        device.add_connection(conn)
        for event in self._pending_events:
            conn.on_cm_event(event)
        self._pending_events.clear()
        return conn

    def reject(self, private_data: bytes = b"") -> None:
        if self._done:
            return
        self._done = True
        try:
            self._cmid.reject(private_data)
        except ProviderError as exc:
            log.debug("%s", exc)
        if self._connection is None:
            self._cmid.destroy()
            self.forget()

    def forget(self) -> None:
        self._listener.forget(self)

    def on_cm_event(self, event: CmEvent) -> None:
        if self._connection is not None:
            self._connection.on_cm_event(event)
        else:
            self._pending_events.append(event)
