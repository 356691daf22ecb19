"""One emulated RC queue pair of the in-process provider: posting, in-order execution on the
event loop, remote access through the peer's protection domain, receiver-not-ready retries,
error completions that break both sides, and the connect/accept handshake with the peer's
queue pair (see ``inproc`` for the failure model)."""

from __future__ import annotations

import asyncio
import collections
import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nfsrdma.transport.rdma.inproc_memory import InprocRegion, InprocWindow, WcError
from nfsrdma.transport.rdma.provider import (
    IB_ACCEPT_PRIVATE_DATA_MAX,
    IB_REJECT_PRIVATE_DATA_MAX,
    Access,
    Completion,
    ConnectError,
    ConnectionEvent,
    ConnectionRejected,
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
    check_accept,
    check_rd_atomic,
)

if TYPE_CHECKING:
    from nfsrdma.transport.rdma.inproc import InprocConnectRequest, InprocDevice

__all__ = ["RNR_FOREVER", "InprocConnection", "pad"]

RNR_FOREVER = 7
CM_REJ_INVALID_SERVICE_ID = 8  # nobody listens on that port


def pad(data: bytes, size: int) -> bytes:
    return data + bytes(size - len(data))


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
    signaled: bool = True


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
        # Work requests posted while held (``hold_sends``): rung together, one doorbell, at
        # the end of the loop turn; they hold their send queue slots already.
        self._held: list[_WorkRequest] | None = None
        # Send queue slots in use: work requests posted and not yet covered by a completion
        # (an unsignalled one is covered by the next signalled one's, as on hardware).
        self._unretired: deque[int] = deque()
        # What crossed the verbs boundary: post calls (doorbells), work requests, signalled
        # ones, receives posted, completions delivered.
        self.counts: collections.Counter[str] = collections.Counter()
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
        listener = self._device.fabric.listener_at(self._target)
        offered = listener is not None and listener.offer(
            self, private_data, responder_resources, initiator_depth, rnr_retry
        )
        if not offered:  # nobody listens there (or the backlog is full): the CM rejects
            self._loop.call_soon(
                self._rejected, bytes(IB_REJECT_PRIVATE_DATA_MAX), CM_REJ_INVALID_SERVICE_ID
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
        active._connect_future.set_result(pad(private_data, IB_ACCEPT_PRIVATE_DATA_MAX))
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
        self.counts["recv_wrs"] += 1
        if self._state is _State.ERROR:
            self._emit(Completion(wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV))
            self._outstanding.discard(wr_id)
            return
        self._rq.append((wr_id, sge))
        peer = self._peer
        if peer is not None and peer._rnr_waiting:
            peer._cancel_rnr()
            peer._schedule()

    def _post(self, wr: _WorkRequest, *, doorbell: bool = True) -> None:
        self._check_post(wr.wr_id)
        if self._state in (_State.INIT, _State.CONNECTING):
            raise ProviderError("queue pair not connected (EINVAL)")
        if len(wr.sges) > self._config.max_send_sge:
            raise ProviderError(f"{len(wr.sges)} SGEs exceed max_send_sge")
        if self._sq_used() >= self._config.max_send_wr:
            raise ProviderError("send queue full (ENOMEM)")
        counts = self.counts
        counts["send_wrs"] += 1
        counts["signaled"] += wr.signaled
        self._outstanding.add(wr.wr_id)
        held = self._held
        if held is not None:
            held.append(wr)
            return
        counts["doorbells"] += doorbell
        if self._state is _State.ERROR:
            self._emit(Completion(wr.wr_id, WcStatus.WR_FLUSH_ERR, wr.opcode))
            self._outstanding.discard(wr.wr_id)
            return
        self._sq.append(wr)
        self._unretired.append(wr.wr_id)
        self._schedule()

    def _sq_used(self) -> int:
        held = self._held
        return len(self._unretired) + (len(held) if held is not None else 0)

    def hold_sends(self) -> bool:
        """Send queue work requests posted from now until the end of this loop turn go to the
        queue pair together, in posting order, with one doorbell (one ``ibv_post_send`` of a
        linked list on a device)."""
        if self._held is None and self._state is _State.RTS:
            self._held = []
            self._loop.call_soon(self._ring_held)
        return self._held is not None

    def _ring_held(self) -> None:
        held, self._held = self._held, None
        if not held:
            return
        self.counts["doorbells"] += 1
        if not held[-1].signaled:  # the list completes: its last work request says so
            held[-1].signaled = True
            self.counts["signaled"] += 1
        for wr in held:
            if self._state is _State.RTS:
                self._sq.append(wr)
                self._unretired.append(wr.wr_id)
            else:  # broken (or closed) since: what a post to an errored queue pair gets
                self._outstanding.discard(wr.wr_id)
                self._emit(Completion(wr.wr_id, WcStatus.WR_FLUSH_ERR, wr.opcode))
        self._schedule()

    def _retire(self, wr_id: int) -> None:
        """A send queue completion of ``wr_id``: its slot and those of the unsignalled work
        requests before it are free."""
        unretired = self._unretired
        while unretired:
            first = unretired.popleft()
            self._outstanding.discard(first)
            if first == wr_id:
                return

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
        inline_data = None
        if self._sq_used() + len(writes) + 1 > self._config.max_send_wr:
            raise ProviderError("send queue full (ENOMEM)")  # nothing of the chain posted
        for n, w in enumerate(writes):  # in order ahead of the Send, as a linked list would be
            wr = _WorkRequest(w.wr_id, WcOpcode.RDMA_WRITE, tuple(w.sges), w.remote_addr, w.rkey)
            wr.signaled = w.signaled
            self._post(wr, doorbell=n == 0)
        if invalidate_rkey is not None and not self._device.caps.remote_invalidate:
            raise ProviderError("Send with Invalidate not supported by the device")
        if inline:
            total = sum(s.length for s in sges)
            if total > self._config.max_inline_data:
                raise ProviderError(f"inline send of {total} bytes exceeds max_inline_data")
            try:
                inline_data = b"".join(bytes(self._pd.local(s, write=False)) for s in sges)
            except WcError as err:
                raise ProviderError(f"inline data not readable: {err.reason}") from None
        self._post(
            _WorkRequest(
                wr_id,
                WcOpcode.SEND,
                tuple(sges),
                invalidate_rkey=invalidate_rkey,
                inline_data=inline_data,
                signaled=signaled,
            ),
            doorbell=not writes,
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
            except WcError as err:
                self._sq.popleft()
                self._fail(wr, err)
                return
            if byte_len is None:  # receiver not ready: wait for a receive or the RNR timer
                return
            self._sq.popleft()
            if wr.signaled:
                self._retire(wr.wr_id)
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
                raise WcError(WcStatus.MW_BIND_ERR, f"rkey {wr.rkey:#x} cannot be invalidated")
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
                raise WcError(WcStatus.LOC_QP_OP_ERR, "RDMA Read with an ORD of 0")
            if peer._responder_resources == 0:
                raise WcError(
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
        except WcError as err:
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
                raise WcError(WcStatus.RNR_RETRY_EXC_ERR, "receiver not ready, retries exhausted")
            wr.rnr_left -= 1
            self._rnr_waiting = True
            self._rnr_handle = self._loop.call_later(self._device._fabric.rnr_timer, self._run)
            return None
        recv_id, recv_sge = peer._rq.popleft()
        try:
            sink = peer._pd.local(recv_sge, write=True)
        except WcError as err:
            raise WcError(
                WcStatus.REM_OP_ERR,
                f"peer could not place the Send: {err.reason}",
                peer_breaks=True,
                peer_status=err.status,
                peer_recv=recv_id,
            ) from None
        if len(data) > len(sink):
            raise WcError(
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
                raise WcError(
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
        self.counts["completions"] += 1
        self._emit(Completion(wr_id, status, opcode, byte_len, invalidated_rkey))

    def _emit(self, event: ConnectionEvent) -> None:
        self._loop.call_soon(self._deliver, event)

    def _deliver(self, event: ConnectionEvent) -> None:
        if self._state is not _State.CLOSED:
            self._on_event(event)

    def _fail(self, wr: _WorkRequest, err: WcError) -> None:
        """Complete ``wr`` with its error and break this side; then the peer: the receive it
        consumed fails, and it breaks with its own status (or by the CM disconnect)."""
        self._retire(wr.wr_id)
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
        # Unsignalled work requests that had executed complete silently; the rest are flushed,
        # each with a completion, signalled or not.
        while self._unretired:
            self._outstanding.discard(self._unretired.popleft())
        while self._sq:
            wr = self._sq.popleft()
            self._complete(wr.wr_id, wr.opcode, WcStatus.WR_FLUSH_ERR)
        held, self._held = self._held, None
        for wr in held or ():  # held back, not yet rung: flushed after those posted before
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
