"""The pyverbs path's reusable work requests (pyverbs_wr), checked in the C structures pyverbs
posts: the ``struct ibv_send_wr`` inside each ``SendWR`` is found by a marker ``wr_id`` and read
with verbs_direct's ctypes mirror (its layout is checked against the header there), so these
tests see what ``ibv_post_send`` would be given. No RDMA device is needed; pyverbs is (a
missing pyverbs FAILS at import, scripts/setup.sh installs it)."""

from __future__ import annotations

import ctypes

import pytest
import pyverbs.enums as e
from pyverbs.wr import SendWR

from nfsrdma.transport.rdma.provider import Sge
from nfsrdma.transport.rdma.pyverbs_wr import ReusedWrs, SendChain
from nfsrdma.transport.rdma.verbs_direct import IbvSendWr

MARKER = 0x1122334455667788


def _c_wr(wr: SendWR) -> IbvSendWr:
    """The ``struct ibv_send_wr`` inside a pyverbs ``SendWR`` (found by its ``wr_id``)."""
    saved = wr.wr_id
    wr.wr_id = MARKER
    raw = ctypes.string_at(id(wr), type(wr).__basicsize__)
    offset = raw.find(MARKER.to_bytes(8, "little"))
    assert offset > 0 and offset % 8 == 0
    wr.wr_id = saved
    return IbvSendWr.from_address(id(wr) + offset)


def _sges(c: IbvSendWr) -> list[tuple[int, int, int]]:
    return [(c.sg_list[i].addr, c.sg_list[i].length, c.sg_list[i].lkey) for i in range(c.num_sge)]


def test_one_send_work_request_describes_whichever_buffer_is_posted() -> None:
    wrs = ReusedWrs()
    first = wrs.send(1, [Sge(0x10000, 100, 7)], e.IBV_SEND_SIGNALED, None)
    c = _c_wr(first)
    assert (c.wr_id, c.opcode, c.send_flags) == (1, e.IBV_WR_SEND, e.IBV_SEND_SIGNALED)
    assert _sges(c) == [(0x10000, 100, 7)]
    assert not c.next
    unsignaled = wrs.send(2, [Sge(0x10000, 100, 7)], 0, None)
    assert _c_wr(unsignaled).send_flags == 0 and c.send_flags == e.IBV_SEND_SIGNALED
    made = wrs.made
    # Rotating buffers (selective signalling) and lengths: the same objects, rewritten.
    for i in range(1000):
        signaled = i % 8 == 7
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        wr = wrs.send(3 + i, [Sge(0x20000 + 4096 * (i % 40), 60 + i, 9)], flags, None)
        assert wr is (first if signaled else unsignaled)
    assert (c.wr_id, c.send_flags) == (1002, e.IBV_SEND_SIGNALED)
    assert _sges(c) == [(0x20000 + 4096 * (999 % 40), 60 + 999, 9)]
    assert _c_wr(unsignaled).wr_id == 1001
    assert wrs.made == made  # no pyverbs object per post


def test_send_with_invalidate_carries_the_rkey() -> None:
    wrs = ReusedWrs()
    c = _c_wr(wrs.send(5, [Sge(0x3000, 40, 1)], 0, 0xABCD))
    assert (c.opcode, c.invalidate_rkey) == (e.IBV_WR_SEND_WITH_INV, 0xABCD)
    c = _c_wr(wrs.send(6, [Sge(0x3000, 40, 1)], 0, None))
    assert c.opcode == e.IBV_WR_SEND


def test_a_chain_of_writes_links_to_the_send_which_ends_it() -> None:
    wrs = ReusedWrs()
    send = wrs.send(30, [Sge(0x9000, 200, 3)], 0, None)
    second = wrs.link(1, 21, [Sge(0x5000, 8000, 4)], 0xF000, 0x77, 0, send)
    first = wrs.link(0, 20, [Sge(0x4000, 4096, 4)], 0xE000, 0x66, 0, second)
    made = wrs.made
    c0, c1, cs = _c_wr(first), _c_wr(second), _c_wr(send)
    assert ctypes.addressof(c0.next.contents) == ctypes.addressof(c1)
    assert ctypes.addressof(c1.next.contents) == ctypes.addressof(cs)
    assert not cs.next
    assert (c0.wr_id, c0.opcode, c0.wr.rdma.remote_addr, c0.wr.rdma.rkey) == (
        20,
        e.IBV_WR_RDMA_WRITE,
        0xE000,
        0x66,
    )
    assert _sges(c0) == [(0x4000, 4096, 4)]
    assert (c1.wr_id, c1.wr.rdma.remote_addr, c1.wr.rdma.rkey) == (21, 0xF000, 0x77)
    assert _sges(c1) == [(0x5000, 8000, 4)]
    # The next reply's chain, one Write long: the same objects again, nothing made.
    send2 = wrs.send(31, [Sge(0xA000, 90, 3)], 0, None)
    again = wrs.link(0, 22, [Sge(0x6000, 512, 4)], 0xD000, 0x55, 0, send2)
    assert again is first and send2 is send
    assert ctypes.addressof(_c_wr(again).next.contents) == ctypes.addressof(cs)
    assert _sges(_c_wr(again)) == [(0x6000, 512, 4)]
    assert wrs.made == made


def test_a_lone_rdma_read_ends_its_list() -> None:
    wrs = ReusedWrs()
    c = _c_wr(wrs.lone(40, e.IBV_WR_RDMA_READ, [Sge(0x7000, 1 << 16, 5)], 0xC000, 0x44, 2))
    assert (c.wr_id, c.opcode, c.send_flags) == (40, e.IBV_WR_RDMA_READ, 2)
    assert (c.wr.rdma.remote_addr, c.wr.rdma.rkey) == (0xC000, 0x44)
    assert _sges(c) == [(0x7000, 1 << 16, 5)]
    assert not c.next


def test_several_scatter_elements_get_their_own_objects() -> None:
    wrs = ReusedWrs()
    wr = wrs.send(50, [Sge(0x1000, 10, 1), Sge(0x2000, 20, 2)], 0, None)
    assert _sges(_c_wr(wr)) == [(0x1000, 10, 1), (0x2000, 20, 2)]
    assert wrs.send(51, [Sge(0x1000, 10, 1)], 0, None) is not wr
    with pytest.raises(ValueError):
        wrs.send(52, [], 0, None)


def test_a_batch_of_sends_reuses_its_linked_sends() -> None:
    """Held calls (or replies) in one list: every Send but the last is a linked Send, made
    once per position and rewritten for the next batch, its ``next`` the following Send."""
    wrs = ReusedWrs()
    SIG = e.IBV_SEND_SIGNALED

    def batch(base: int, n: int) -> list[IbvSendWr]:
        chains = [
            SendChain(
                base + i,
                [Sge(0x8000 + 256 * i, 60 + i, 3)],
                SIG * (i % 2),
                0x99 if i == 1 else None,
                (),
            )
            for i in range(n)
        ]
        node: IbvSendWr | None = _c_wr(wrs.batch(chains))
        got = []
        while node is not None:
            got.append(node)
            node = node.next.contents if node.next else None
        return got

    first = batch(100, 4)
    assert [(c.wr_id, c.send_flags) for c in first] == [(100, 0), (101, SIG), (102, 0), (103, SIG)]
    assert [_sges(c) for c in first] == [[(0x8000 + 256 * i, 60 + i, 3)] for i in range(4)]
    assert (first[1].opcode, first[1].invalidate_rkey) == (e.IBV_WR_SEND_WITH_INV, 0x99)
    assert [c.opcode for c in (first[0], first[2], first[3])] == [e.IBV_WR_SEND] * 3
    made = wrs.made
    again = batch(200, 4)
    assert [c.wr_id for c in again] == [200, 201, 202, 203]
    assert [ctypes.addressof(c) for c in again] == [ctypes.addressof(c) for c in first]
    assert wrs.made == made  # no pyverbs object per batch once the longest one was seen
    shorter = batch(300, 2)
    assert [c.wr_id for c in shorter] == [300, 301] and not shorter[-1].next
