"""Posting send-queue work requests without the GIL: ``ibv_post_send`` through ctypes.

pyverbs (Cython) holds the GIL inside ``QP.post_send``. With soft-RoCE (rxe) that call is a
``write()`` into the verbs device on which the kernel runs the requester inline (segmenting
and, on loopback, often the peer's responder too), so for an RDMA Read or Write of a large
chunk the whole interpreter stops for the copy. ``ibv_post_send`` is a static inline of
``<infiniband/verbs.h>``: ``qp->context->ops.post_send(qp, wr, &bad_wr)``. This module calls
that function pointer through a ctypes prototype (ctypes releases the GIL for the call), with
ctypes mirrors of ``struct ibv_sge`` and ``struct ibv_send_wr`` (rdma-core 44; a host test
compares every offset and size with the installed header through a compiled probe).

pyverbs does not expose its ``struct ibv_qp *`` or ``struct ibv_context *``; they are fields
of its Cython objects. ``locate`` finds them by content: each pointer-sized word of the Python
object is read as a candidate and accepted only if the structure it points to says so (the
context's ``cmd_fd`` is the one pyverbs reports, the queue pair's ``context``, ``qp_num`` and
type match). Candidate memory is read through ``/proc/self/mem`` (an unmapped address is an
``EIO`` there, never a fault), so a pyverbs whose layout differs yields ``DirectUnavailable``
and the caller keeps posting through pyverbs.

``PostThread`` moves the post off the event loop: one thread per queue pair takes chains in
order and posts them, so per-queue-pair ordering holds; a failed post is reported back to the
loop by a callback (the provider turns it into error completions and a broken connection).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import itertools
import os
import struct
import threading
from collections.abc import Callable, Sequence

__all__ = [
    "CONTEXT_CMD_FD_OFFSET",
    "CONTEXT_POLL_CQ_OFFSET",
    "CONTEXT_POST_SEND_OFFSET",
    "CQ_CQE_OFFSET",
    "QP_NUM_OFFSET",
    "DirectUnavailable",
    "IbvMwBindInfo",
    "IbvSendWr",
    "IbvSge",
    "PostThread",
    "SendPoster",
    "chain",
    "locate",
    "locate_cq",
]

_u16, _u32, _u64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
_ptr = ctypes.c_void_p
_PTR_SIZE = ctypes.sizeof(_ptr)

# struct ibv_context: ``device`` then ``struct ibv_context_ops`` (32 function pointers, of
# which post_send is the 26th), then ``cmd_fd``. struct ibv_qp: six pointers, ``handle``,
# ``qp_num``, ``state``, ``qp_type``.
CONTEXT_POST_SEND_OFFSET = _PTR_SIZE * (1 + 25)
CONTEXT_CMD_FD_OFFSET = _PTR_SIZE * (1 + 32)
QP_NUM_OFFSET = _PTR_SIZE * 6 + 4
# struct ibv_cq: ``context``, ``channel``, ``cq_context``, ``handle``, then ``cqe``; the ops'
# poll_cq is the 12th pointer.
CQ_CQE_OFFSET = _PTR_SIZE * 3 + 4
CONTEXT_POLL_CQ_OFFSET = _PTR_SIZE * (1 + 11)
_QP_TYPE_OFFSET = QP_NUM_OFFSET + 8
_IBV_QPT_RC = 2
_USER_TOP = 1 << 47  # x86-64 user addresses are below this


class DirectUnavailable(Exception):
    """The GIL-free post path cannot be used here (layout not recognised, no ctypes, ...)."""


class IbvSge(ctypes.Structure):
    _fields_ = (("addr", _u64), ("length", _u32), ("lkey", _u32))


class _Rdma(ctypes.Structure):
    _fields_ = (("remote_addr", _u64), ("rkey", _u32))


class _Atomic(ctypes.Structure):
    _fields_ = (("remote_addr", _u64), ("compare_add", _u64), ("swap", _u64), ("rkey", _u32))


class _Ud(ctypes.Structure):
    _fields_ = (("ah", _ptr), ("remote_qpn", _u32), ("remote_qkey", _u32))


class _Wr(ctypes.Union):
    _fields_ = (("rdma", _Rdma), ("atomic", _Atomic), ("ud", _Ud))


class IbvMwBindInfo(ctypes.Structure):
    _fields_ = (("mr", _ptr), ("addr", _u64), ("length", _u64), ("mw_access_flags", ctypes.c_uint))


class _BindMw(ctypes.Structure):
    _fields_ = (("mw", _ptr), ("rkey", _u32), ("bind_info", IbvMwBindInfo))


class _Tso(ctypes.Structure):
    _fields_ = (("hdr", _ptr), ("hdr_sz", _u16), ("mss", _u16))


class _Tail(ctypes.Union):
    _fields_ = (("bind_mw", _BindMw), ("tso", _Tso))


class IbvSendWr(ctypes.Structure):
    pass


IbvSendWr._fields_ = (
    ("wr_id", _u64),
    ("next", ctypes.POINTER(IbvSendWr)),
    ("sg_list", ctypes.POINTER(IbvSge)),
    ("num_sge", ctypes.c_int),
    ("opcode", ctypes.c_int),
    ("send_flags", ctypes.c_uint),
    ("invalidate_rkey", _u32),  # the union with imm_data
    ("wr", _Wr),
    ("xrc_remote_srqn", _u32),  # union qp_type
    ("tail", _Tail),
)

_PostSend = ctypes.CFUNCTYPE(
    ctypes.c_int, _ptr, ctypes.POINTER(IbvSendWr), ctypes.POINTER(ctypes.POINTER(IbvSendWr))
)


class _Memory:
    """Reads of this process's memory that fail (``None``) instead of faulting."""

    def __init__(self) -> None:
        try:
            self._fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise DirectUnavailable(f"cannot read /proc/self/mem: {exc}") from exc

    def read(self, addr: int, size: int) -> bytes | None:
        if addr <= 4096 or addr + size > _USER_TOP or addr % 8:
            return None
        try:
            data = os.pread(self._fd, size, addr)
        except OSError:
            return None
        return data if len(data) == size else None

    def close(self) -> None:
        os.close(self._fd)


def _words(memory: _Memory, obj: object) -> list[int]:
    size = type(obj).__basicsize__
    raw = memory.read(id(obj), size - size % _PTR_SIZE)
    if raw is None:
        return []
    return [w for (w,) in struct.iter_unpack("=Q", raw)]


def _pointee(
    memory: _Memory, obj: object, size: int, matches: Callable[[bytes], bool]
) -> int | None:
    """The first pointer among ``obj``'s fields to ``size`` readable octets that ``matches``."""
    for word in _words(memory, obj):
        raw = memory.read(word, size)
        if raw is not None and matches(raw):
            return word
    return None


def _find_context(memory: _Memory, context: object) -> int:
    cmd_fd = int(getattr(context, "cmd_fd", -1))
    if cmd_fd < 0:
        raise DirectUnavailable("a pyverbs Context without cmd_fd")

    def is_context(raw: bytes) -> bool:
        (fd,) = struct.unpack_from("=i", raw, CONTEXT_CMD_FD_OFFSET)
        return bool(fd == cmd_fd)

    found = _pointee(memory, context, CONTEXT_CMD_FD_OFFSET + 4, is_context)
    if found is None:
        raise DirectUnavailable("no struct ibv_context found in the pyverbs Context")
    return found


def locate_cq(context: object, cq: object) -> tuple[int, int]:
    """The ``struct ibv_context *`` and ``struct ibv_cq *`` inside pyverbs ``context``/``cq``
    (the CQ's ``context`` and ``cqe`` must match). Raises ``DirectUnavailable`` otherwise."""
    if _PTR_SIZE != 8:
        raise DirectUnavailable("only 64-bit layouts are known")
    cqe = int(getattr(cq, "cqe", -1))
    if cqe < 0:
        raise DirectUnavailable("a pyverbs CQ without cqe")
    memory = _Memory()
    try:
        ctx_ptr = _find_context(memory, context)

        def is_cq(raw: bytes) -> bool:
            (cq_ctx,) = struct.unpack_from("=Q", raw, 0)
            (size,) = struct.unpack_from("=i", raw, CQ_CQE_OFFSET)
            return bool(cq_ctx == ctx_ptr and size == cqe)

        found = _pointee(memory, cq, CQ_CQE_OFFSET + 4, is_cq)
        if found is None:
            raise DirectUnavailable("no struct ibv_cq found in the pyverbs CQ")
        return ctx_ptr, found
    finally:
        memory.close()


def locate(context: object, qp: object) -> tuple[int, int]:
    """The ``struct ibv_context *`` and ``struct ibv_qp *`` inside pyverbs ``context``/``qp``.

    Raises ``DirectUnavailable`` when no field of either object is recognised."""
    if _PTR_SIZE != 8:
        raise DirectUnavailable("only 64-bit layouts are known")
    cmd_fd = int(getattr(context, "cmd_fd", -1))
    qp_num = int(getattr(qp, "qp_num", -1))
    if cmd_fd < 0 or qp_num < 0:
        raise DirectUnavailable("pyverbs objects without cmd_fd/qp_num")
    memory = _Memory()
    try:
        ctx_ptr = _find_context(memory, context)

        def is_qp(raw: bytes) -> bool:
            (qp_ctx,) = struct.unpack_from("=Q", raw, 0)
            (num,) = struct.unpack_from("=I", raw, QP_NUM_OFFSET)
            (kind,) = struct.unpack_from("=I", raw, _QP_TYPE_OFFSET)
            return bool(qp_ctx == ctx_ptr and num == qp_num and kind == _IBV_QPT_RC)

        found = _pointee(memory, qp, _QP_TYPE_OFFSET + 4, is_qp)
        if found is None:
            raise DirectUnavailable("no struct ibv_qp found in the pyverbs QP")
        return ctx_ptr, found
    finally:
        memory.close()


class SendPoster:
    """``ibv_post_send`` of one queue pair, called with the GIL released."""

    def __init__(self, context: object, qp: object) -> None:
        ctx_ptr, self._qp_ptr = locate(context, qp)
        fn = ctypes.c_void_p.from_address(ctx_ptr + CONTEXT_POST_SEND_OFFSET).value
        if not fn:
            raise DirectUnavailable("the provider has no post_send")
        self._post_send = _PostSend(fn)

    def post(self, first: IbvSendWr) -> tuple[int, int]:
        """Post the chain from ``first``: (0, 0), or (errno, address of the first WR not
        posted)."""
        bad = ctypes.POINTER(IbvSendWr)()
        rc = int(self._post_send(self._qp_ptr, ctypes.byref(first), ctypes.byref(bad)))
        if rc == 0:
            return 0, 0
        return rc, ctypes.addressof(bad.contents) if bad else ctypes.addressof(first)


def chain(wrs: Sequence[IbvSendWr]) -> IbvSendWr:
    """Link ``wrs`` in order (``next``) and return the first."""
    for prev, nxt in itertools.pairwise(wrs):
        prev.next = ctypes.pointer(nxt)
    return wrs[0]


# What the thread runs: a post (returning what ``SendPoster.post`` returns; it keeps alive what
# it posts) and the callback for its failure (errno, address of the first WR not posted).
PostItem = tuple[Callable[[], tuple[int, int]], Callable[[int, int], None]]


class PostThread:
    """One thread posting a queue pair's chains in the order they were submitted.

    ``submit`` is called on the loop thread; ``stop`` waits for the post in progress (so the
    queue pair can be destroyed after it) and drops what was not posted yet."""

    def __init__(self, name: str) -> None:
        self._queue: collections.deque[PostItem] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._stopped = False
        self._posting = threading.Lock()  # held while a chain is being posted
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being posted (a post from the loop keeps the order)."""
        return not self._queue and not self._posting.locked()

    def submit(self, item: PostItem) -> None:
        with self._cond:
            if self._stopped:
                raise DirectUnavailable("post thread stopped")
            self._queue.append(item)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify()
        with self._posting:  # the post in progress, if any, is over
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                # Taken under the posting lock so that ``idle`` never sees an item in between.
                self._posting.acquire()
                post, on_failure = self._queue.popleft()
            try:
                rc, bad = post()
            except Exception:  # a bug in a post must not end the thread: report it as a failure
                rc, bad = errno.EIO, 0
            finally:
                self._posting.release()
            if rc:
                on_failure(rc, bad)
