"""Verbs resources of one pyverbs connection: its RC queue pair, completion queue and
completion channel; posting work requests and turning completions into provider events.

The queue pair is created by us (not by rdma_cm) on the device's protection domain, with one
CQ and completion channel per connection, and moved through INIT/RTR/RTS with the attributes
librdmacm's ``rdma_init_qp_attr`` returns (``qp_attributes``). The completion channel's
descriptor is watched by the loop: on readable, ``get_cq_event``, ``ack_events``,
``req_notify``, then drain ``poll()``. rxe reports a remote invalidation with the kernel's
flag bit (``IB_WC_WITH_INVALIDATE``, which is ``IBV_WC_IP_CSUM_OK`` in user space) rather than
``IBV_WC_WITH_INV``; the device's ``with_inv_mask`` covers both.

Work requests are reused: every pyverbs object costs an allocation and a ``logging.getLogger``
(under the logging lock) when made, which a profile of the server in the test bed shows on the
loop thread for every receive and send. A posted work request is copied by the provider, so
the same ``RecvWR`` goes out again for a receive buffer (a bounded cache, ``_WR_CACHE``
entries), and one ``SendWR`` per queue pair for every Send, whatever its buffer, with one more
per RDMA Write of a chain (``pyverbs_wr``: their scatter element is rewritten in place).
Completions are polled through ctypes into one preallocated batch (``verbs_poll``; no pyverbs
``WC`` per completion) unless ``NFSRDMA_VERBS_POLL=pyverbs`` or the CQ is not found.

How the send queue is posted is chosen per queue pair by ``NFSRDMA_VERBS_POST`` (``post_mode``):
``pyverbs`` (``QP.post_send``, GIL held for the call), ``direct`` (``verbs_direct``: the
provider's ``post_send`` through ctypes, GIL released, on the loop thread) or ``thread`` (the
same, from one thread per queue pair, in submission order, for chains moving at least
``NFSRDMA_VERBS_OFFLOAD_BYTES`` of RDMA data, and for everything behind them; smaller ones are
posted directly from the loop while the thread is idle). A post that fails on the thread is
reported as error completions of the work requests not posted, and the connection breaks, as
a failed work request would do. When the raw verbs objects cannot be found in pyverbs's, the
queue pair posts through pyverbs and says so once in the log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import dataclasses
import errno
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ, CompChannel
from pyverbs.device import Context
from pyverbs.mr import MWBindInfo
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from nfsrdma.transport.rdma.descriptors import create_with_descriptor
from nfsrdma.transport.rdma.provider import (
    Access,
    Completion,
    ConnectionEvent,
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
)
from nfsrdma.transport.rdma.pyverbs_memory import PyverbsPD, PyverbsRegion, PyverbsWindow
from nfsrdma.transport.rdma.pyverbs_wr import Chain, RdmaChain, ReusedWrs, SendChain
from nfsrdma.transport.rdma.rdmacm import QpAttr
from nfsrdma.transport.rdma.verbs_direct import (
    DirectUnavailable,
    IbvSendWr,
    IbvSge,
    PostThread,
    SendPoster,
    chain,
)
from nfsrdma.transport.rdma.verbs_poll import CqPoller

__all__ = [
    "POST_MODES",
    "PyverbsQueuePair",
    "VerbsDevice",
    "offload_bytes",
    "poll_mode",
    "post_mode",
    "qp_attributes",
    "verbs_batch",
    "wc_opcode",
]

log = logging.getLogger(__name__)

_POLL_BATCH = 32
_WR_CACHE = 512  # reusable work requests / scatter-gather elements kept per queue pair
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)
# Linux refuses a write() on a verbs device file from a thread whose credentials changed since
# the file was opened (ib_safe_file_access), and rxe posts each Send with such a write.
_CRED_HINT = (
    " (EACCES: this thread's credentials changed after the RDMA device was opened, e.g. a"
    " setfsuid/setgroups on it; open the device after such a change, or keep it off the"
    " thread that posts)"
)


def _post_failure(exc: PyverbsError) -> ProviderError:
    hint = _CRED_HINT if getattr(exc, "error_code", None) == errno.EACCES else ""
    return ProviderError(f"post_send failed: {exc}{hint}")


def _errno_text(rc: int) -> str:
    return f"post_send failed: {os.strerror(rc)}{_CRED_HINT if rc == errno.EACCES else ''}"


POST_MODES = ("pyverbs", "direct", "thread")
DEFAULT_POST_MODE = "pyverbs"
DEFAULT_OFFLOAD_BYTES = 0
_unavailable_logged = False
_paths_logged: set[str] = set()
_PATH_TEXT = {
    "pyverbs": "pyverbs (GIL held)",
    "direct": "direct (GIL released, loop thread)",
    "thread": "thread (GIL released, one thread per queue pair)",
}


def post_mode() -> str:
    """How send queues are posted (``NFSRDMA_VERBS_POST``; unknown values: the default)."""
    mode = os.environ.get("NFSRDMA_VERBS_POST", "") or DEFAULT_POST_MODE
    if mode not in POST_MODES:
        log.warning("NFSRDMA_VERBS_POST=%s is not one of %s", mode, ", ".join(POST_MODES))
        return DEFAULT_POST_MODE
    return mode


POLL_MODES = ("direct", "pyverbs")
DEFAULT_POLL_MODE = "direct"
_poll_unavailable_logged = False


def poll_mode() -> str:
    """How completion queues are polled (``NFSRDMA_VERBS_POLL``: ``direct``, ctypes into one
    preallocated batch, or ``pyverbs``, one ``WC`` object per completion)."""
    mode = os.environ.get("NFSRDMA_VERBS_POLL", "") or DEFAULT_POLL_MODE
    if mode not in POLL_MODES:
        log.warning("NFSRDMA_VERBS_POLL=%s is not one of %s", mode, ", ".join(POLL_MODES))
        return DEFAULT_POLL_MODE
    return mode


def verbs_batch() -> bool:
    """Whether the pyverbs path posts the replies that one CQ event's completions produced
    with one ``ibv_post_send`` (``NFSRDMA_VERBS_BATCH=1``; default off)."""
    return os.environ.get("NFSRDMA_VERBS_BATCH", "0") not in ("", "0")


def _chain_ids(chain: Chain) -> list[int]:
    if isinstance(chain, SendChain):
        return [*(w.wr_id for w in chain.writes), chain.wr_id]
    return [chain.wr_id]


def offload_bytes() -> int:
    """RDMA bytes from which a chain is posted by the queue pair's thread (``thread`` mode)."""
    try:
        return max(0, int(os.environ.get("NFSRDMA_VERBS_OFFLOAD_BYTES", DEFAULT_OFFLOAD_BYTES)))
    except ValueError:
        return DEFAULT_OFFLOAD_BYTES


def _post_kept(poster: SendPoster, first: IbvSendWr, keep: list[object]) -> tuple[int, int]:
    return poster.post(first)


def _pyverbs_post(qp: QP, wr: SendWR) -> tuple[int, int]:
    try:
        qp.post_send(wr)
    except PyverbsError as exc:
        return int(getattr(exc, "error_code", 0) or errno.EIO), 0
    return 0, 0


COMPLETION_CHANNEL = "anon_inode:[infinibandevent]"

_SEND_OPCODES = {
    WcOpcode.SEND: e.IBV_WR_SEND,
    WcOpcode.RDMA_WRITE: e.IBV_WR_RDMA_WRITE,
    WcOpcode.RDMA_READ: e.IBV_WR_RDMA_READ,
}


class VerbsDevice(Protocol):
    """What a queue pair needs of its device."""

    @property
    def caps(self) -> DeviceCaps: ...
    @property
    def pd(self) -> PyverbsPD: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def context(self) -> Context: ...
    @property
    def with_inv_mask(self) -> int: ...


def is_again(exc: PyverbsError) -> bool:
    return getattr(exc, "error_code", None) in _AGAIN


def wc_opcode(value: int) -> WcOpcode:
    try:
        return WcOpcode(value)
    except ValueError:
        return WcOpcode.RECV if value & 0x80 else WcOpcode.SEND


def _gid_text(raw: bytes) -> str:
    hexed = raw.hex()
    return ":".join(hexed[i : i + 4] for i in range(0, 32, 4))


def qp_attributes(source: QpAttr) -> tuple[QPAttr, int]:
    """A pyverbs ``QPAttr`` carrying the fields ``rdma_init_qp_attr`` filled in (its mask)."""
    c, mask = source.attr, source.mask
    attr = QPAttr()
    attr.qp_state = c.qp_state
    if mask & e.IBV_QP_ACCESS_FLAGS:
        attr.qp_access_flags = c.qp_access_flags
    if mask & e.IBV_QP_PKEY_INDEX:
        attr.pkey_index = c.pkey_index
    if mask & e.IBV_QP_PORT:
        attr.port_num = c.port_num
    if mask & e.IBV_QP_QKEY:
        attr.qkey = c.qkey
    if mask & e.IBV_QP_AV:
        ah = c.ah_attr
        grh = GlobalRoute(
            dgid=GID(_gid_text(bytes(ah.grh.dgid))),
            flow_label=ah.grh.flow_label,
            sgid_index=ah.grh.sgid_index,
            hop_limit=ah.grh.hop_limit,
            traffic_class=ah.grh.traffic_class,
        )
        attr.ah_attr = AHAttr(
            dlid=ah.dlid,
            sl=ah.sl,
            src_path_bits=ah.src_path_bits,
            static_rate=ah.static_rate,
            is_global=ah.is_global,
            port_num=ah.port_num,
            gr=grh if ah.is_global else None,
        )
    if mask & e.IBV_QP_PATH_MTU:
        attr.path_mtu = c.path_mtu
    if mask & e.IBV_QP_DEST_QPN:
        attr.dest_qp_num = c.dest_qp_num
    if mask & e.IBV_QP_RQ_PSN:
        attr.rq_psn = c.rq_psn
    if mask & e.IBV_QP_SQ_PSN:
        attr.sq_psn = c.sq_psn
    if mask & e.IBV_QP_MAX_DEST_RD_ATOMIC:
        attr.max_dest_rd_atomic = c.max_dest_rd_atomic
    if mask & e.IBV_QP_MAX_QP_RD_ATOMIC:
        attr.max_rd_atomic = c.max_rd_atomic
    if mask & e.IBV_QP_MIN_RNR_TIMER:
        attr.min_rnr_timer = c.min_rnr_timer
    if mask & e.IBV_QP_TIMEOUT:
        attr.timeout = c.timeout
    if mask & e.IBV_QP_RETRY_CNT:
        attr.retry_cnt = c.retry_cnt
    if mask & e.IBV_QP_RNR_RETRY:
        attr.rnr_retry = c.rnr_retry
    return attr, mask


class PyverbsQueuePair:
    """One RC queue pair with its own CQ and completion channel, driven by the loop.

    A subclass supplies the state transitions' attributes (``_transition``, usable from
    construction on) and what breaking the connection does to the peer (``_disconnect_peer``)."""

    def __init__(
        self, device: VerbsDevice, config: QueuePairConfig, on_event: EventHandler
    ) -> None:
        self._device = device
        self._loop = device.loop
        self._config = config
        self._on_event = on_event
        self._outstanding: dict[int, WcOpcode] = {}
        # Send queue work requests in posting order, until a completion covers them (an
        # unsignalled one has none of its own when it succeeds).
        self._sq_order: collections.deque[int] = collections.deque()
        # What crossed the verbs boundary: post calls (one system call each on rxe), work
        # requests, signalled ones, receives, CQ events, polls, completions.
        self.counts: collections.Counter[str] = collections.Counter()
        self._state = "init"
        self._disconnected = False
        self._closed = False
        self._recv_wrs: dict[tuple[int, int, int], RecvWR] = {}
        self._wrs = ReusedWrs()  # the pyverbs path's Send and RDMA work requests
        self._batch = verbs_batch()
        self._held: list[Chain] | None = None  # chains held back during a dispatch
        self._signal_last = False  # hold_sends: the held list's last work request signalled
        context = device.context
        self._comp, self._comp_fd = create_with_descriptor(
            lambda: CompChannel(context), COMPLETION_CHANNEL
        )
        created: list[CompChannel | CQ | QP] = [self._comp]
        try:
            cqe = config.max_send_wr + config.max_recv_wr + 1
            self._cq = CQ(context, cqe, None, self._comp, 0)
            created.insert(0, self._cq)
            self._cq.req_notify()
            cap = QPCap(
                max_send_wr=config.max_send_wr,
                max_recv_wr=config.max_recv_wr,
                max_send_sge=config.max_send_sge,
                max_recv_sge=config.max_recv_sge,
                max_inline_data=config.max_inline_data,
            )
            # sq_sig_all=0: only work requests posted with IBV_SEND_SIGNALED complete when
            # they succeed (pyverbs's default, 1, would signal every one).
            init = QPInitAttr(
                qp_type=e.IBV_QPT_RC, scq=self._cq, rcq=self._cq, cap=cap, sq_sig_all=0
            )
            self._qp = QP(device.pd.pd, init)
            created.insert(0, self._qp)
            self._modify(e.IBV_QPS_INIT)
        except (PyverbsError, ProviderError) as exc:
            for obj in created:  # the queue pair, then its CQ, then the channel
                with contextlib.suppress(PyverbsError):
                    obj.close()
            raise ProviderError(f"cannot create the queue pair: {exc}") from exc
        self._cq_poller: CqPoller | None = None
        if poll_mode() == "direct":
            try:
                self._cq_poller = CqPoller(context, self._cq, _POLL_BATCH)
            except DirectUnavailable as exc:
                global _poll_unavailable_logged
                if not _poll_unavailable_logged:
                    _poll_unavailable_logged = True
                    log.warning("polling completions through pyverbs: %s", exc)
        self._poster: SendPoster | None = None
        self._post_thread: PostThread | None = None
        self._offload_bytes = 0
        mode = post_mode()
        if mode != "pyverbs":
            try:
                self._poster = SendPoster(context, self._qp)
            except DirectUnavailable as exc:
                global _unavailable_logged
                if not _unavailable_logged:
                    _unavailable_logged = True
                    log.warning("posting through pyverbs (GIL held): %s", exc)
            else:
                if mode == "thread":
                    self._offload_bytes = offload_bytes()
                    self._post_thread = PostThread(f"verbs-post-{self.qp_num}")
        if self.post_path not in _paths_logged:
            _paths_logged.add(self.post_path)
            log.info("send queues posted by: %s", _PATH_TEXT[self.post_path])
        self._loop.add_reader(self._comp_fd, self._on_cq_readable)

    @property
    def post_path(self) -> str:
        """The post path in use: ``pyverbs``, ``direct`` or ``thread``."""
        if self._post_thread is not None:
            return "thread"
        return "pyverbs" if self._poster is None else "direct"

    @property
    def config(self) -> QueuePairConfig:
        return self._config

    @property
    def established(self) -> bool:
        return self._state == "rts"

    @property
    def broken(self) -> bool:
        return self._state in ("error", "closed")

    @property
    def qp_num(self) -> int:
        return int(self._qp.qp_num)

    def _transition(self, state: int) -> tuple[QPAttr, int]:
        raise NotImplementedError

    def _disconnect_peer(self) -> None:
        raise NotImplementedError

    def _modify(
        self, state: int, *, responder_resources: int = 0, initiator_depth: int = 0
    ) -> None:
        attr, mask = self._transition(state)
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

    def _release_verbs(self) -> None:
        self._loop.remove_reader(self._comp_fd)
        if self._post_thread is not None:
            self._post_thread.stop()  # no post runs on the queue pair once it is destroyed
        for obj in (self._qp, self._cq, self._comp):
            try:
                obj.close()
            except PyverbsError as exc:
                log.warning("closing %s: %s", type(obj).__name__, exc)

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
        self._disconnect_peer()
        self._loop.call_soon(self._deliver, Disconnected(reason, status))

    def _deliver(self, event: ConnectionEvent) -> None:
        if not self._closed:
            self._on_event(event)

    # Completions.

    def _on_cq_readable(self) -> None:
        try:
            self._comp.get_cq_event(self._cq)
        except PyverbsRDMAError as exc:
            if not is_again(exc):
                log.error("ibv_get_cq_event failed: %s", exc)
            return
        self._cq.ack_events(1)
        self._cq.req_notify()
        completions: list[Completion] = []
        counts = self.counts
        counts["cq_events"] += 1
        poller = self._cq_poller
        while True:
            counts["polls"] += 1
            if poller is not None:
                try:
                    rows = poller.poll()
                except OSError as exc:
                    log.error("ibv_poll_cq failed: %s", exc)
                    self._break(f"ibv_poll_cq failed: {exc}", None)
                    return
                completions.extend(
                    self._completion(row[0], row[1], row[2], row[4], row[5], row[8]) for row in rows
                )
                count = len(rows)
            else:
                count, wcs = self._cq.poll(_POLL_BATCH)
                completions.extend(
                    self._completion(
                        int(wc.wr_id),
                        int(wc.status),
                        int(wc.opcode),
                        int(wc.byte_len),
                        int(wc.imm_data),
                        int(wc.wc_flags),
                    )
                    for wc in wcs
                )
            if count < _POLL_BATCH:
                break
        counts["completions"] += len(completions)
        failure: Completion | None = None
        hold = self._batch and self._poster is None and len(completions) > 1
        if hold and self._held is None:  # (else: held for this loop turn already)
            self._held = []
        try:
            for completion in completions:
                if self._closed:
                    return
                self._on_event(completion)
                if failure is None and not completion.ok:
                    failure = completion
        finally:
            if hold:
                self._ring_held()
        if failure is not None:
            self._break(
                f"{failure.opcode.name} completed with {failure.status.name}", failure.status
            )

    def _completion(
        self, wr_id: int, status_code: int, opcode_code: int, byte_len: int, imm: int, flags: int
    ) -> Completion:
        opcode = self._outstanding.pop(wr_id, None)
        if opcode is None:
            opcode = wc_opcode(opcode_code)
        elif opcode is not WcOpcode.RECV:
            self._retire(wr_id)
        ok = status_code == 0  # IBV_WC_SUCCESS: no enum look-up for nearly every completion
        status = WcStatus.SUCCESS if ok else WcStatus.of(status_code)
        invalidated = None
        if ok and opcode is WcOpcode.RECV and flags & self._device.with_inv_mask:
            invalidated = imm
        return Completion(wr_id, status, opcode, byte_len if ok else 0, invalidated)

    def _retire(self, wr_id: int) -> None:
        """A send queue completion of ``wr_id`` covers the work requests posted before it."""
        order, outstanding = self._sq_order, self._outstanding
        while order:
            first = order.popleft()
            if first == wr_id:
                return
            outstanding.pop(first, None)

    # Posting.

    def _track(self, wr_id: int, opcode: WcOpcode, sending: bool, signaled: bool = True) -> None:
        if self._closed:
            raise ProviderError("connection closed")
        if sending and self._state in ("init", "connecting"):
            raise ProviderError("queue pair not connected (EINVAL)")
        if wr_id in self._outstanding:
            raise ProviderError(f"wr_id {wr_id} is still outstanding")
        self._outstanding[wr_id] = opcode
        counts = self.counts
        if sending:
            self._sq_order.append(wr_id)
            counts["send_wrs"] += 1
            counts["signaled"] += signaled
        else:
            counts["recv_wrs"] += 1

    def _post_send_wr(self, wr_id: int, wr: SendWR) -> None:
        if self._held:  # behind the chains held back, in order
            self._ring_held()
        self.counts["doorbells"] += 1
        thread = self._post_thread
        if thread is not None and not thread.idle:  # behind the thread's posts, in order
            self._queue_post(thread, [wr_id], [], functools.partial(_pyverbs_post, self._qp, wr))
            return
        try:
            self._qp.post_send(wr)
        except PyverbsError as exc:
            self._outstanding.pop(wr_id, None)
            raise _post_failure(exc) from exc

    # The GIL-free path (verbs_direct).

    def _direct_wr(
        self, wr_id: int, opcode: int, sges: Sequence[Sge], flags: int, keep: list[object]
    ) -> IbvSendWr:
        if not sges:
            raise ProviderError("a work request needs at least one SGE")
        elements = (IbvSge * len(sges))(*[IbvSge(s.addr, s.length, s.lkey) for s in sges])
        wr = IbvSendWr(wr_id=wr_id, num_sge=len(sges), opcode=opcode, send_flags=flags)
        wr.sg_list = ctypes.cast(elements, ctypes.POINTER(IbvSge))
        keep.append(elements)
        keep.append(wr)
        return wr

    def _direct_post(
        self,
        poster: SendPoster,
        ids: list[int],
        wrs: list[IbvSendWr],
        keep: list[object],
        size: int,
    ) -> None:
        """Post ``wrs`` (already tracked as ``ids``) as one chain, from the loop or the thread."""
        self.counts["doorbells"] += 1
        first = chain(wrs)
        thread = self._post_thread
        if thread is not None and (size >= self._offload_bytes or not thread.idle):
            addresses = [ctypes.addressof(w) for w in wrs]
            # The partial holds the chain's structures until the post is over.
            self._queue_post(
                thread, ids, addresses, functools.partial(_post_kept, poster, first, keep)
            )
            return
        rc, bad = poster.post(first)
        if rc:
            addresses = [ctypes.addressof(w) for w in wrs]
            start = addresses.index(bad) if bad in addresses else 0
            for i in ids[start:]:
                self._outstanding.pop(i, None)
            raise ProviderError(_errno_text(rc))

    def _queue_post(
        self,
        thread: PostThread,
        ids: list[int],
        addresses: list[int],
        post: Callable[[], tuple[int, int]],
    ) -> None:
        loop = self._loop

        def failed(rc: int, bad: int) -> None:  # on the post thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                loop.call_soon_threadsafe(self._post_failed, ids, addresses, rc, bad)

        try:
            thread.submit((post, failed))
        except DirectUnavailable as exc:
            for i in ids:
                self._outstanding.pop(i, None)
            raise ProviderError("connection closed") from exc

    def _post_failed(self, ids: list[int], addresses: list[int], rc: int, bad: int) -> None:
        """A chain the thread could not post: its work requests from ``bad`` on complete in
        error (those before it were posted and complete by themselves), the connection breaks."""
        if self._closed:
            return
        start = addresses.index(bad) if bad in addresses else 0
        log.error("%s", _errno_text(rc))
        for i in ids[start:]:
            opcode = self._outstanding.pop(i, None)
            if opcode is not None and not self._closed:
                self._on_event(Completion(i, WcStatus.LOC_QP_OP_ERR, opcode))
        self._break(_errno_text(rc), WcStatus.LOC_QP_OP_ERR)

    def post_recv(self, wr_id: int, sge: Sge) -> None:
        self._track(wr_id, WcOpcode.RECV, sending=False)
        key = sge  # a named tuple: (addr, length, lkey)
        try:
            wr = self._recv_wrs.get(key)
            if wr is None:
                if len(self._recv_wrs) >= _WR_CACHE:
                    self._recv_wrs.clear()
                element = SGE(sge.addr, sge.length, sge.lkey)  # copied into the RecvWR
                wr = self._recv_wrs[key] = RecvWR(wr_id=wr_id, num_sge=1, sg=[element])
            else:
                wr.wr_id = wr_id
            self._qp.post_recv(wr)
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
        signaled: bool = True,
    ) -> None:
        if inline and sum(s.length for s in sges) > self._config.max_inline_data:
            raise ProviderError("inline send exceeds max_inline_data")
        if invalidate_rkey is not None and not self._device.caps.remote_invalidate:
            raise ProviderError("Send with Invalidate not supported by the device")
        if self._poster is not None:
            self._direct_send(self._poster, wr_id, sges, invalidate_rkey, inline, writes, signaled)
            return
        if not sges or any(not w.sges for w in writes):
            raise ProviderError("a work request needs at least one SGE")
        flags = (e.IBV_SEND_SIGNALED if signaled else 0) | (e.IBV_SEND_INLINE if inline else 0)
        for w in writes:
            self._track(w.wr_id, WcOpcode.RDMA_WRITE, sending=True, signaled=w.signaled)
        self._track(wr_id, WcOpcode.SEND, sending=True, signaled=signaled)
        held = self._held
        if held is not None:
            held.append(SendChain(wr_id, sges, flags, invalidate_rkey, writes))
            return
        first = self._wrs.chain(wr_id, sges, flags, invalidate_rkey, writes)
        self.counts["doorbells"] += 1
        try:
            self._qp.post_send(first)
        except PyverbsError as exc:
            for w in writes:
                self._outstanding.pop(w.wr_id, None)
            self._outstanding.pop(wr_id, None)
            raise _post_failure(exc) from exc

    # The pyverbs path: chains posted at once, or held and posted together (one
    # ibv_post_send, one doorbell): while completions are dispatched, the replies that the
    # completions of one CQ event produced (``NFSRDMA_VERBS_BATCH``), and from ``hold_sends``
    # to the end of the loop turn, the calls the requester sends in that turn.

    def hold_sends(self) -> bool:
        """Send queue chains posted from now until the end of this loop turn (or of the
        dispatch under way) go out together, in posting order, as one list. The direct and
        thread post paths post at once (nothing to hold)."""
        if self._held is None and self._poster is None and not self._closed:
            self._held = []
            self._loop.call_soon(self._ring_held)
        if self._held is None:
            return False
        self._signal_last = True  # (a dispatch's own list ends as its replies were asked)
        return True

    def _chain(self, chain: Chain) -> None:
        held = self._held
        if held is not None:
            held.append(chain)
            return
        try:
            self._ring([chain])
        except PyverbsError as exc:
            for i in _chain_ids(chain):
                self._outstanding.pop(i, None)
            raise _post_failure(exc) from exc

    def _ring(self, chains: list[Chain]) -> None:
        first = self._wrs.batch(chains)
        self.counts["doorbells"] += 1
        self._qp.post_send(first)

    def _ring_held(self) -> None:
        """Post what was held back; a failure is the chains' error completions and a broken
        connection (their posts already returned to the callers)."""
        held, self._held = self._held, None
        if not held or self._closed:
            self._signal_last = False
            return
        last = held[-1]
        if self._signal_last and not last.flags & e.IBV_SEND_SIGNALED:
            # The list completes: its last work request says so (``hold_sends``).
            held[-1] = dataclasses.replace(last, flags=last.flags | e.IBV_SEND_SIGNALED)
            self.counts["signaled"] += 1
        self._signal_last = False
        try:
            self._ring(held)
        except PyverbsError as exc:
            reason = str(_post_failure(exc))
            log.error("%s", reason)
            for chain in held:
                for i in _chain_ids(chain):
                    opcode = self._outstanding.pop(i, None)
                    if opcode is not None and not self._closed:
                        self._on_event(Completion(i, WcStatus.LOC_QP_OP_ERR, opcode))
            self._break(reason, WcStatus.LOC_QP_OP_ERR)

    def _direct_send(
        self,
        poster: SendPoster,
        wr_id: int,
        sges: Sequence[Sge],
        invalidate_rkey: int | None,
        inline: bool,
        writes: Sequence[RdmaWriteRequest],
        signaled: bool,
    ) -> None:
        keep: list[object] = []
        wrs = [
            self._direct_rdma(
                e.IBV_WR_RDMA_WRITE, w.wr_id, w.sges, w.remote_addr, w.rkey, keep, w.signaled
            )
            for w in writes
        ]
        flags = (e.IBV_SEND_SIGNALED if signaled else 0) | (e.IBV_SEND_INLINE if inline else 0)
        opcode = e.IBV_WR_SEND if invalidate_rkey is None else e.IBV_WR_SEND_WITH_INV
        send = self._direct_wr(wr_id, opcode, sges, flags, keep)
        if invalidate_rkey is not None:
            send.invalidate_rkey = invalidate_rkey
        wrs.append(send)
        ids = [w.wr_id for w in writes]
        for w in writes:
            self._track(w.wr_id, WcOpcode.RDMA_WRITE, sending=True, signaled=w.signaled)
        self._track(wr_id, WcOpcode.SEND, sending=True, signaled=signaled)
        size = sum(s.length for w in writes for s in w.sges)
        self._direct_post(poster, [*ids, wr_id], wrs, keep, size)

    def _direct_rdma(
        self,
        opcode: int,
        wr_id: int,
        sges: Sequence[Sge],
        remote_addr: int,
        rkey: int,
        keep: list[object],
        signaled: bool = True,
    ) -> IbvSendWr:
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        wr = self._direct_wr(wr_id, opcode, sges, flags, keep)
        wr.wr.rdma.remote_addr = remote_addr
        wr.wr.rdma.rkey = rkey
        return wr

    def _post_rdma(
        self, opcode: WcOpcode, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int
    ) -> None:
        poster = self._poster
        if poster is not None:
            keep: list[object] = []
            wr = self._direct_rdma(_SEND_OPCODES[opcode], wr_id, sges, remote_addr, rkey, keep)
            self._track(wr_id, opcode, sending=True)
            self._direct_post(poster, [wr_id], [wr], keep, sum(s.length for s in sges))
            return
        if not sges:
            raise ProviderError("a work request needs at least one SGE")
        self._track(wr_id, opcode, sending=True)
        self._chain(
            RdmaChain(wr_id, _SEND_OPCODES[opcode], sges, remote_addr, rkey, e.IBV_SEND_SIGNALED)
        )

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
        info = MWBindInfo(region.mr, region.addr + offset, length, int(access))
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
        wr.set_bind_wr(window.mw, info)
        rkey = int(wr.rkey)
        self._track(wr_id, WcOpcode.BIND_MW, sending=True)
        self._post_send_wr(wr_id, wr)
        window.bound(rkey)
        return rkey

    def post_local_invalidate(self, wr_id: int, rkey: int) -> None:
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_LOCAL_INV, send_flags=e.IBV_SEND_SIGNALED)
        wr.imm_data = rkey  # shares the union with invalidate_rkey
        self._track(wr_id, WcOpcode.LOCAL_INV, sending=True)
        self._post_send_wr(wr_id, wr)
