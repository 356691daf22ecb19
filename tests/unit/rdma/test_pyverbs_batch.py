"""The pyverbs queue pair's send path on the host, with its verbs objects replaced at the
boundary: a recording ``QP.post_send`` that walks the C work request list pyverbs would hand
to the provider (read through verbs_direct's ctypes mirror, layout checked against the header
there), and a CQ poller returning chosen completions. Checks: one reply per post without
batching; with ``NFSRDMA_VERBS_BATCH``, the replies that one CQ event's completions produce
leave in one post, in order, each chain intact; a failing batched post turns into error
completions for its work requests and a broken connection. pyverbs is needed (no device)."""

from __future__ import annotations

import asyncio
import collections
import ctypes
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import pyverbs.enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.wr import SGE, SendWR

from nfsrdma.transport.rdma.provider import (
    Completion,
    ConnectionEvent,
    Disconnected,
    RdmaWriteRequest,
    Sge,
    WcOpcode,
    WcStatus,
)
from nfsrdma.transport.rdma.pyverbs_qp import PyverbsQueuePair
from nfsrdma.transport.rdma.pyverbs_wr import ReusedWrs
from nfsrdma.transport.rdma.verbs_direct import IbvSendWr

MARKER = 0x5A5A123456789ABC
Posted = tuple[int, int, int, list[tuple[int, int, int]], tuple[int, int]]


def _embedded_offset() -> int:
    wr = SendWR(wr_id=MARKER, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(0, 0, 0)], send_flags=0)
    raw = ctypes.string_at(id(wr), type(wr).__basicsize__)
    offset = raw.find(MARKER.to_bytes(8, "little"))
    assert offset > 0
    return offset


class FakeQp:
    """Records each ``post_send`` as the list of work requests the C list holds."""

    def __init__(self) -> None:
        self.offset = _embedded_offset()
        self.posts: list[list[Posted]] = []
        self.fail = False

    def post_send(self, first: SendWR) -> None:
        if self.fail:
            raise PyverbsRDMAError("post_send", 12)
        posted: list[Posted] = []
        node: IbvSendWr | None = IbvSendWr.from_address(id(first) + self.offset)
        while node is not None:
            sges = [
                (node.sg_list[i].addr, node.sg_list[i].length, node.sg_list[i].lkey)
                for i in range(node.num_sge)
            ]
            rdma = (node.wr.rdma.remote_addr, node.wr.rdma.rkey)
            posted.append((node.wr_id, node.opcode, node.send_flags, sges, rdma))
            node = node.next.contents if node.next else None
        self.posts.append(posted)

    def modify(self, attr: object, mask: int) -> None:
        pass


class FakePoller:
    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []

    def poll(self) -> list[tuple[int, ...]]:
        rows, self.rows = self.rows, []
        return rows


def _recv_row(wr_id: int) -> tuple[int, ...]:
    return (wr_id, 0, 128, 0, 100, 0, 1, 0, 0, 0, 0, 0, 0)


def _bare(batch: bool, loop: asyncio.AbstractEventLoop) -> tuple[PyverbsQueuePair, Any]:
    """A queue pair without a device: the fields the send and completion paths use."""
    qp = PyverbsQueuePair.__new__(PyverbsQueuePair)
    events: list[ConnectionEvent] = []
    handler: list[Callable[[Completion], None]] = []

    def on_event(ev: ConnectionEvent) -> None:
        events.append(ev)
        if isinstance(ev, Completion) and ev.opcode is WcOpcode.RECV and handler:
            handler[0](ev)

    caps = SimpleNamespace(remote_invalidate=True)
    fields = {
        "_device": SimpleNamespace(caps=caps, with_inv_mask=0),
        "_config": SimpleNamespace(max_inline_data=0),
        "_loop": loop,
        "_on_event": on_event,
        "_outstanding": {},
        "_sq_order": collections.deque(),
        "counts": collections.Counter(),
        "_state": "rts",
        "_disconnected": False,
        "_closed": False,
        "_wrs": ReusedWrs(),
        "_batch": batch,
        "_held": None,
        "_signal_last": False,
        "_poster": None,
        "_post_thread": None,
        "_qp": FakeQp(),
        "_cq": SimpleNamespace(ack_events=lambda n: None, req_notify=lambda: None),
        "_comp": SimpleNamespace(get_cq_event=lambda cq: None),
        "_cq_poller": FakePoller(),
        "_disconnect_peer": lambda: None,
    }
    for k, v in fields.items():
        object.__setattr__(qp, k, v)
    return qp, SimpleNamespace(events=events, handler=handler)


def _reply(qp: PyverbsQueuePair, call: int) -> None:
    """A READ-like reply to receive ``call``: an unsignalled RDMA Write, then the Send."""
    write = RdmaWriteRequest(
        1000 + call, [Sge(0x100000 + call * 4096, 4096, 9)], 0xE0000 + call, 0x70 + call, False
    )
    qp.post_send(2000 + call, [Sge(0x9000 + call * 256, 120, 3)], writes=[write], signaled=False)


def _event(qp: PyverbsQueuePair, *calls: int) -> None:
    qp._cq_poller.poll = lambda: [_recv_row(c) for c in calls]  # type: ignore[union-attr]
    qp._on_cq_readable()


def _expected(call: int) -> list[Posted]:
    return [
        (1000 + call, e.IBV_WR_RDMA_WRITE, 0, [(0x100000 + call * 4096, 4096, 9)],
         (0xE0000 + call, 0x70 + call)),
        (2000 + call, e.IBV_WR_SEND, 0, [(0x9000 + call * 256, 120, 3)], (0, 0)),
    ]  # fmt: skip


def _track_recvs(qp: PyverbsQueuePair, *calls: int) -> None:
    for c in calls:
        qp._outstanding[c] = WcOpcode.RECV


@pytest.fixture
def loop() -> Any:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def test_without_batching_every_reply_is_its_own_post(loop: asyncio.AbstractEventLoop) -> None:
    qp, h = _bare(False, loop)
    h.handler.append(lambda ev: _reply(qp, ev.wr_id))
    _track_recvs(qp, 1, 2, 3)
    _event(qp, 1, 2, 3)
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    assert fake.posts == [_expected(1), _expected(2), _expected(3)]
    assert qp.counts["doorbells"] == 3


def test_replies_of_one_cq_event_leave_in_one_post(loop: asyncio.AbstractEventLoop) -> None:
    qp, h = _bare(True, loop)
    h.handler.append(lambda ev: _reply(qp, ev.wr_id))
    _track_recvs(qp, 1, 2, 3)
    _event(qp, 1, 2, 3)
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    assert fake.posts == [_expected(1) + _expected(2) + _expected(3)]
    assert qp.counts["doorbells"] == 1
    # The objects are reused for the next event's batch; a lone completion posts at once.
    _track_recvs(qp, 4, 5)
    _event(qp, 4, 5)
    _track_recvs(qp, 6)
    _event(qp, 6)
    assert fake.posts[1:] == [_expected(4) + _expected(5), _expected(6)]
    # A post outside a dispatch goes out at once.
    _reply(qp, 7)
    assert fake.posts[-1] == _expected(7)
    assert qp.counts["doorbells"] == 4


def test_a_failed_batch_completes_in_error_and_breaks(loop: asyncio.AbstractEventLoop) -> None:
    qp, h = _bare(True, loop)
    h.handler.append(lambda ev: _reply(qp, ev.wr_id))
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    fake.fail = True
    _track_recvs(qp, 1, 2)
    _event(qp, 1, 2)
    errors = [ev for ev in h.events if isinstance(ev, Completion) and not ev.ok]
    assert [(ev.wr_id, ev.opcode, ev.status) for ev in errors] == [
        (1001, WcOpcode.RDMA_WRITE, WcStatus.LOC_QP_OP_ERR),
        (2001, WcOpcode.SEND, WcStatus.LOC_QP_OP_ERR),
        (1002, WcOpcode.RDMA_WRITE, WcStatus.LOC_QP_OP_ERR),
        (2002, WcOpcode.SEND, WcStatus.LOC_QP_OP_ERR),
    ]
    assert qp.broken and not qp._outstanding
    after: asyncio.Future[None] = loop.create_future()
    loop.call_soon(after.set_result, None)  # runs after the delivery already scheduled
    loop.run_until_complete(after)
    assert isinstance(h.events[-1], Disconnected)


def test_polled_rows_become_completions(loop: asyncio.AbstractEventLoop) -> None:
    """The ctypes poll's rows: status, opcode, length, and a remote invalidation's rkey (the
    device's flag mask), as the pyverbs WC path reported them."""
    qp, h = _bare(False, loop)
    qp._device.with_inv_mask = 0x40  # type: ignore[misc]
    qp._outstanding.update({1: WcOpcode.RECV, 2: WcOpcode.RECV})
    qp._cq_poller.poll = lambda: [  # type: ignore[union-attr]
        (1, 0, 128, 0, 180, 0x1234ABCD, 1, 0, 0x40, 0, 0, 0, 0),
        (2, 0, 128, 0, 90, 0x99, 1, 0, 0, 0, 0, 0, 0),
        (77, 5, 0, 0x11, 0, 0, 1, 0, 0, 0, 0, 0, 0),  # unknown wr_id, flushed Send
    ]
    qp._on_cq_readable()
    got = [ev for ev in h.events if isinstance(ev, Completion)]
    assert got == [
        Completion(1, WcStatus.SUCCESS, WcOpcode.RECV, 180, 0x1234ABCD),
        Completion(2, WcStatus.SUCCESS, WcOpcode.RECV, 90, None),
        Completion(77, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND, 0, None),
    ]
    assert qp.broken  # an error completion breaks the connection


def test_a_failing_poll_breaks_the_connection(loop: asyncio.AbstractEventLoop) -> None:
    qp, h = _bare(False, loop)

    def fail() -> list[tuple[int, ...]]:
        raise OSError(5, "ibv_poll_cq failed")

    qp._cq_poller.poll = fail  # type: ignore[union-attr]
    qp._on_cq_readable()
    assert qp.broken
    after: asyncio.Future[None] = loop.create_future()
    loop.call_soon(after.set_result, None)
    loop.run_until_complete(after)
    assert isinstance(h.events[-1], Disconnected) and "poll_cq" in h.events[-1].reason


def _call(qp: PyverbsQueuePair, n: int) -> None:
    """A call's Send (a requester posts no RDMA work of its own)."""
    qp.post_send(3000 + n, [Sge(0xA000 + n * 256, 90 + n, 5)], signaled=n % 2 == 0)


def _call_expected(n: int) -> list[Posted]:
    flags = e.IBV_SEND_SIGNALED if n % 2 == 0 else 0
    return [(3000 + n, e.IBV_WR_SEND, flags, [(0xA000 + n * 256, 90 + n, 5)], (0, 0))]


def _next_turn(loop: asyncio.AbstractEventLoop) -> None:
    after: asyncio.Future[None] = loop.create_future()
    loop.call_soon(after.set_result, None)  # runs after what the turn scheduled before it
    loop.run_until_complete(after)


def test_sends_held_for_a_loop_turn_leave_in_one_post(loop: asyncio.AbstractEventLoop) -> None:
    qp, _ = _bare(False, loop)
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    qp.hold_sends()
    for n in range(3):
        qp.hold_sends()  # again within the turn: one list still
        _call(qp, n)
    assert fake.posts == [] and qp.counts["doorbells"] == 0
    _next_turn(loop)
    assert fake.posts == [_call_expected(0) + _call_expected(1) + _call_expected(2)]
    assert qp.counts["doorbells"] == 1 and qp.counts["send_wrs"] == 3
    _call(qp, 3)  # not held: at once
    assert fake.posts[-1] == _call_expected(3)


def test_a_held_list_ends_with_a_signalled_work_request(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Sends held unsignalled: the list's last goes out signalled, so the list completes."""
    qp, _ = _bare(False, loop)
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    assert qp.hold_sends()
    for n in (1, 3):  # odd: posted unsignalled
        _call(qp, n)
    _next_turn(loop)
    last = _call_expected(3)[0]
    assert fake.posts == [[*_call_expected(1), (*last[:2], e.IBV_SEND_SIGNALED, *last[3:])]]
    assert qp.counts["signaled"] == 1 and qp.counts["send_wrs"] == 2


def test_held_calls_and_a_dispatchs_replies_share_the_post(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A dispatch under NFSRDMA_VERBS_BATCH while calls are held keeps them (ahead of the
    replies, in one post), rather than starting a list of its own."""
    qp, h = _bare(True, loop)
    h.handler.append(lambda ev: _reply(qp, ev.wr_id))
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    qp.hold_sends()
    _call(qp, 0)
    _track_recvs(qp, 1, 2)
    _event(qp, 1, 2)
    *first, last = _call_expected(0) + _expected(1) + _expected(2)
    # The calls were held (``hold_sends``): the list ends with a signalled work request.
    assert fake.posts == [[*first, (*last[:2], e.IBV_SEND_SIGNALED, *last[3:])]]
    _next_turn(loop)  # the turn's ring finds nothing left
    assert len(fake.posts) == 1 and qp.counts["doorbells"] == 1


def test_a_failed_held_post_fails_every_send_in_it(loop: asyncio.AbstractEventLoop) -> None:
    qp, h = _bare(False, loop)
    fake: FakeQp = qp._qp  # type: ignore[assignment]
    fake.fail = True
    qp.hold_sends()
    for n in range(3):
        _call(qp, n)
    _next_turn(loop)
    errors = [ev for ev in h.events if isinstance(ev, Completion) and not ev.ok]
    assert [(ev.wr_id, ev.status) for ev in errors] == [
        (3000 + n, WcStatus.LOC_QP_OP_ERR) for n in range(3)
    ]
    assert qp.broken and not qp._outstanding
    _next_turn(loop)
    assert isinstance(h.events[-1], Disconnected)
