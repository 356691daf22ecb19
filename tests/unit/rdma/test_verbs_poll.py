"""Polling completions through ctypes (verbs_poll) on the host: the ``struct ibv_wc`` and
``struct ibv_cq`` layouts against rdma-core's header (a compiled probe; a missing compiler or
header FAILS), finding the raw CQ, and the call through the provider's ``ops.poll_cq`` of a
fake context (ctypes), as with rxe in the test bed (tests/testbed/test_pyverbs_asyncio.py and
the RDMA peers' tests poll through it)."""

from __future__ import annotations

import ctypes
import struct

import pytest

from nfsrdma.transport.rdma import verbs_direct as vd
from nfsrdma.transport.rdma import verbs_poll as vp
from tests.unit.rdma.helpers import FakeContext, verbs_header_layout

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#define F(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))
#define S(t) printf(#t " %zu\n", sizeof(struct t))
int main(void) {
    S(ibv_wc); F(ibv_wc, wr_id); F(ibv_wc, status); F(ibv_wc, opcode); F(ibv_wc, vendor_err);
    F(ibv_wc, byte_len); F(ibv_wc, imm_data); F(ibv_wc, invalidated_rkey); F(ibv_wc, qp_num);
    F(ibv_wc, src_qp); F(ibv_wc, wc_flags); F(ibv_wc, pkey_index); F(ibv_wc, slid);
    F(ibv_wc, sl); F(ibv_wc, dlid_path_bits);
    F(ibv_cq, context); F(ibv_cq, cqe); F(ibv_context, ops.poll_cq);
    return 0;
}
"""


@pytest.fixture(scope="module")
def header_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    return verbs_header_layout(tmp_path_factory.mktemp("probe"), PROBE)


def test_wc_and_cq_layouts_match_the_header(header_layout: dict[str, int]) -> None:
    h = header_layout
    assert h["ibv_wc"] == vp.WC_SIZE
    # The unpacked row's fields, in order, at the header's offsets.
    sizes = {"Q": 8, "I": 4, "H": 2, "B": 1}
    fmt = vp._WC.format.lstrip("=")
    fields = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num",
              "src_qp", "wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits")  # fmt: skip
    offset = 0
    for name, code in zip(fields, fmt, strict=False):
        assert h[f"ibv_wc.{name}"] == offset, name
        offset += sizes[code]
    assert h["ibv_wc.invalidated_rkey"] == h["ibv_wc.imm_data"]
    assert h["ibv_cq.context"] == 0
    assert h["ibv_cq.cqe"] == vd.CQ_CQE_OFFSET
    assert h["ibv_context.ops.poll_cq"] == vd.CONTEXT_POLL_CQ_OFFSET


class FakeCq(ctypes.Structure):
    _fields_ = (
        ("context", ctypes.c_void_p),
        ("channel", ctypes.c_void_p),
        ("cq_context", ctypes.c_void_p),
        ("handle", ctypes.c_uint32),
        ("cqe", ctypes.c_int),
    )


_Poll = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class Provider:
    """A CQ holding ``pending`` completions (as ``struct ibv_wc`` rows) that ``poll_cq`` hands
    out oldest first; ``fail`` makes the next poll return -1."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, ...]] = []
        self.fail = False
        self.asked: list[int] = []
        self.callback = _Poll(self._poll_cq)
        self.context = FakeContext(cmd_fd=91)
        self.context.ops[11] = ctypes.cast(self.callback, ctypes.c_void_p)
        self.cq = FakeCq(context=ctypes.addressof(self.context), cqe=65)

    def _poll_cq(self, cq: int, n: int, wc: int) -> int:
        assert cq == ctypes.addressof(self.cq)
        self.asked.append(n)
        if self.fail:
            return -1
        rows, self.pending = self.pending[:n], self.pending[n:]
        for i, row in enumerate(rows):
            raw = vp._WC.pack(*row)
            ctypes.memmove(wc + i * vp.WC_SIZE, raw, len(raw))
        return len(rows)


def _row(wr_id: int, status: int = 0, opcode: int = 128, byte_len: int = 100) -> tuple[int, ...]:
    return (wr_id, status, opcode, 0, byte_len, 0xBEEF, 0x11, 0x22, 4, 0, 0, 0, 0)


def test_locate_cq_finds_the_raw_cq_and_refuses_others() -> None:
    p = Provider()
    assert vd.locate_cq(p.context, p.cq) == (
        ctypes.addressof(p.context),
        ctypes.addressof(p.cq),
    )
    other = FakeCq(context=ctypes.addressof(p.context), cqe=64)  # our CQ has 65 entries
    with pytest.raises(vd.DirectUnavailable, match="ibv_cq"):
        vd.locate_cq(p.context, _Named(other, 65))
    elsewhere = FakeContext(cmd_fd=92)
    foreign = FakeCq(context=ctypes.addressof(elsewhere), cqe=65)
    with pytest.raises(vd.DirectUnavailable, match="ibv_cq"):
        vd.locate_cq(p.context, foreign)
    with pytest.raises(vd.DirectUnavailable):
        vd.locate_cq(p.context, object())  # no cqe: not a CQ


class _Named(ctypes.Structure):
    """A CQ-like object whose ``cqe`` says one thing and whose memory another."""

    _fields_ = (("cq", ctypes.c_void_p),)

    def __init__(self, cq: FakeCq, cqe: int) -> None:
        super().__init__(ctypes.addressof(cq))
        self._keep = cq
        self._cqe = cqe

    @property
    def cqe(self) -> int:
        return self._cqe


def test_poll_returns_completions_in_order_in_batches() -> None:
    p = Provider()
    poller = vp.CqPoller(p.context, _Named(p.cq, 65), batch=4)
    assert poller.poll() == []
    p.pending = [_row(i, byte_len=10 * i) for i in range(1, 7)]
    first = poller.poll()
    assert [r[0] for r in first] == [1, 2, 3, 4]
    assert first[0] == _row(1, byte_len=10)
    assert [r[0] for r in poller.poll()] == [5, 6]
    assert p.asked == [4, 4, 4]
    # Error status, send opcode, and the union field, as the provider wrote them.
    p.pending = [(2**64 - 1, 5, 0, 0x99, 0, 0x12345678, 1, 2, 0x40, 0, 0, 0, 0)]
    (row,) = poller.poll()
    assert row[:6] == (2**64 - 1, 5, 0, 0x99, 0, 0x12345678) and row[8] == 0x40


def test_a_failed_poll_raises() -> None:
    p = Provider()
    poller = vp.CqPoller(p.context, _Named(p.cq, 65), batch=4)
    p.fail = True
    with pytest.raises(OSError):
        poller.poll()


def test_rows_unpack_what_the_header_layout_packs(header_layout: dict[str, int]) -> None:
    """A ``struct ibv_wc`` built at the header's offsets reads back field by field."""
    h = header_layout
    raw = bytearray(h["ibv_wc"])
    struct.pack_into("=Q", raw, h["ibv_wc.wr_id"], 77)
    struct.pack_into("=I", raw, h["ibv_wc.status"], 12)
    struct.pack_into("=I", raw, h["ibv_wc.opcode"], 129)
    struct.pack_into("=I", raw, h["ibv_wc.byte_len"], 4000)
    struct.pack_into("=I", raw, h["ibv_wc.invalidated_rkey"], 0xCAFE)
    struct.pack_into("=I", raw, h["ibv_wc.wc_flags"], 0x10)
    row = vp._WC.unpack(bytes(raw))
    assert (row[0], row[1], row[2], row[4], row[5], row[8]) == (77, 12, 129, 4000, 0xCAFE, 0x10)
