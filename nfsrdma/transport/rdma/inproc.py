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
import itertools
from collections.abc import Awaitable, Callable
from typing import Protocol

from nfsrdma.transport.base import ReplyExpectation
from nfsrdma.transport.rdma.inproc_memory import InprocPD, InprocRegion, InprocWindow
from nfsrdma.transport.rdma.inproc_qp import InprocConnection, pad
from nfsrdma.transport.rdma.provider import (
    IB_CONNECT_PRIVATE_DATA_MAX,
    IB_REJECT_PRIVATE_DATA_MAX,
    ConnectError,
    ConnectRequestBase,
    DeviceCaps,
    EventHandler,
    ProviderError,
    QueuePairConfig,
    check_config,
)
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, Reader, Writer

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
    "call_read",
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

_CM_REJ_CONSUMER_DEFINED = 28  # IB CM reject reason rdma_cm reports for rdma_reject()


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

    def listener_at(self, target: tuple[str, int]) -> InprocListener | None:
        return self._listeners.get(target)


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

    def offer(
        self,
        active: InprocConnection,
        private_data: bytes,
        responder_resources: int,
        initiator_depth: int,
        rnr_retry: int,
    ) -> bool:
        """Queue a connection request from ``active``; False when closed or the backlog is
        full (the CM rejects)."""
        if self._closed or self._queue.qsize() >= self._backlog:
            return False
        self._queue.put_nowait(
            InprocConnectRequest(
                self, active, private_data, responder_resources, initiator_depth, rnr_retry
            )
        )
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._device._fabric._listeners.pop((self._device.address, self._port), None)
        self._device._listeners.discard(self)
        while not self._queue.empty():
            self._queue.get_nowait().reject()


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
            pad(private_data, IB_CONNECT_PRIVATE_DATA_MAX),
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
            pad(private_data, IB_REJECT_PRIVATE_DATA_MAX), _CM_REJ_CONSUMER_DEFINED
        )

    def _active_waiting(self) -> bool:
        return self._active._connect_future is not None and not self._active._connect_future.done()


class _Reply(Protocol):
    """What ``call_read`` needs of a reply (``nfsrdma.rpc.connection.RpcResult``)."""

    @property
    def reader(self) -> Reader: ...
    @property
    def offset(self) -> int: ...


class _Caller(Protocol):
    """What ``call_read`` needs of a caller (``nfsrdma.rpc.connection.RpcConnection``); typed
    by shape so that this module does not import the RPC layer above it."""

    def call(
        self,
        prog: int,
        vers: int,
        proc: int,
        encode_args: Callable[[Writer], None] | None = None,
        *,
        expect: ReplyExpectation | None = None,
    ) -> Awaitable[_Reply]: ...


async def call_read(
    rpc: _Caller, prog: int, vers: int, proc: int, size: int
) -> tuple[nfs4.READ4resok, memoryview]:
    """A READ-like call of the test rigs (unit tests and ``bench/``): procedure ``proc`` takes
    the byte count as one XDR unsigned int and answers a ``READ4res`` whose data may go by RDMA
    Write into a Write chunk. The caller lends a sink of ``size + 100`` bytes for the data and
    a 512-byte bound for the rest of the reply. Returns the decoded result (its data is a view
    of wherever the transport placed it) and the sink."""
    sink = memoryview(bytearray(size + 100))
    res = await rpc.call(
        prog,
        vers,
        proc,
        lambda w: w.extend(U32.pack(size)),
        expect=ReplyExpectation([sink], max_size=512),
    )
    out, _ = nfs4.dec_READ4res(res.reader, res.offset)
    if out.status != nfs4.NFS4_OK or out.value is None:
        raise AssertionError(f"READ-like call failed: {out.status}")
    return out.value, sink
