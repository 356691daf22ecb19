"""The GIL-free post path (verbs_direct) on the host: struct layouts against rdma-core's header,
finding the raw verbs objects, the call through the provider's function pointer, the thread.

The layouts are checked by compiling a probe against the installed <infiniband/verbs.h>
(libibverbs-dev, installed by scripts/setup.sh): missing compiler or header fails the test.
The host has no RDMA device, so a fake ``struct ibv_context`` (ctypes) carries a ctypes
callback as its ``ops.post_send``: the call path is the one used with rxe (tests/testbed/
test_verbs_post.py moves data through it).
"""

from __future__ import annotations

import ctypes
import errno
import threading

import pytest

from nfsrdma.transport.rdma import verbs_direct as vd
from tests.unit.rdma.helpers import FakeContext, verbs_header_layout

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#define F(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))
#define S(t) printf(#t " %zu\n", sizeof(struct t))
int main(void) {
    S(ibv_sge); F(ibv_sge, addr); F(ibv_sge, length); F(ibv_sge, lkey);
    S(ibv_send_wr); F(ibv_send_wr, wr_id); F(ibv_send_wr, next); F(ibv_send_wr, sg_list);
    F(ibv_send_wr, num_sge); F(ibv_send_wr, opcode); F(ibv_send_wr, send_flags);
    F(ibv_send_wr, invalidate_rkey); F(ibv_send_wr, imm_data);
    F(ibv_send_wr, wr.rdma.remote_addr); F(ibv_send_wr, wr.rdma.rkey);
    F(ibv_send_wr, wr.atomic.rkey); F(ibv_send_wr, wr.ud.remote_qkey);
    F(ibv_send_wr, qp_type.xrc.remote_srqn);
    F(ibv_send_wr, bind_mw.mw); F(ibv_send_wr, bind_mw.rkey);
    F(ibv_send_wr, bind_mw.bind_info.mw_access_flags); F(ibv_send_wr, tso.mss);
    S(ibv_mw_bind_info);
    F(ibv_context, ops.post_send); F(ibv_context, cmd_fd);
    F(ibv_qp, context); F(ibv_qp, qp_num); F(ibv_qp, qp_type);
    printf("IBV_QPT_RC %d\n", (int)IBV_QPT_RC);
    return 0;
}
"""


@pytest.fixture(scope="module")
def header_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    return verbs_header_layout(tmp_path_factory.mktemp("probe"), PROBE)


def _offset(cls: type[ctypes.Structure], path: str) -> int:
    total = 0
    for name in path.split("."):
        field = getattr(cls, name)
        total += field.offset
        cls = dict(cls._fields_)[name]
    return total


def test_sge_and_send_wr_match_the_header(header_layout: dict[str, int]) -> None:
    h = header_layout
    assert ctypes.sizeof(vd.IbvSge) == h["ibv_sge"]
    for name in ("addr", "length", "lkey"):
        assert _offset(vd.IbvSge, name) == h[f"ibv_sge.{name}"], name
    assert ctypes.sizeof(vd.IbvSendWr) == h["ibv_send_wr"]
    assert ctypes.sizeof(vd.IbvMwBindInfo) == h["ibv_mw_bind_info"]
    ours = {
        "wr_id": "wr_id",
        "next": "next",
        "sg_list": "sg_list",
        "num_sge": "num_sge",
        "opcode": "opcode",
        "send_flags": "send_flags",
        "invalidate_rkey": "invalidate_rkey",
        "imm_data": "invalidate_rkey",  # one union
        "wr.rdma.remote_addr": "wr.rdma.remote_addr",
        "wr.rdma.rkey": "wr.rdma.rkey",
        "wr.atomic.rkey": "wr.atomic.rkey",
        "wr.ud.remote_qkey": "wr.ud.remote_qkey",
        "qp_type.xrc.remote_srqn": "xrc_remote_srqn",
        "bind_mw.mw": "tail.bind_mw.mw",
        "bind_mw.rkey": "tail.bind_mw.rkey",
        "bind_mw.bind_info.mw_access_flags": "tail.bind_mw.bind_info.mw_access_flags",
        "tso.mss": "tail.tso.mss",
    }
    for theirs, mine in ours.items():
        assert _offset(vd.IbvSendWr, mine) == h[f"ibv_send_wr.{theirs}"], theirs


def test_context_and_qp_offsets_match_the_header(header_layout: dict[str, int]) -> None:
    h = header_layout
    assert h["ibv_context.ops.post_send"] == vd.CONTEXT_POST_SEND_OFFSET
    assert h["ibv_context.cmd_fd"] == vd.CONTEXT_CMD_FD_OFFSET
    assert h["ibv_qp.context"] == 0
    assert h["ibv_qp.qp_num"] == vd.QP_NUM_OFFSET
    assert h["ibv_qp.qp_type"] == vd.QP_NUM_OFFSET + 8
    assert h["IBV_QPT_RC"] == 2


# A fake provider: struct ibv_context / ibv_qp as ctypes structures (a ctypes object's own
# memory holds the pointer to its buffer, as a pyverbs object holds its ibv_* pointer).


class FakeQp(ctypes.Structure):
    _fields_ = (
        ("context", ctypes.c_void_p),
        ("others", ctypes.c_void_p * 5),
        ("handle", ctypes.c_uint32),
        ("qp_num", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("qp_type", ctypes.c_uint32),
    )


class Provider:
    """Records each posted chain as (wr_id, opcode, flags, [(addr, length, lkey)], rdma)."""

    def __init__(self, fail_at: int | None = None, rc: int = errno.ENOMEM) -> None:
        self.chains: list[list[tuple[int, int, int, list[tuple[int, int, int]], tuple[int, int]]]]
        self.chains = []
        self.threads: list[str] = []
        self.fail_at, self.rc = fail_at, rc
        self.gate = threading.Event()
        self.gate.set()
        self.callback = vd._PostSend(self._post_send)
        self.context = FakeContext(cmd_fd=77)
        self.context.ops[25] = ctypes.cast(self.callback, ctypes.c_void_p)
        self.qp = FakeQp(context=ctypes.addressof(self.context), qp_num=0x1234, qp_type=2)

    def _post_send(self, qp: int, wr: ctypes._Pointer[vd.IbvSendWr], bad: object) -> int:
        assert qp == ctypes.addressof(self.qp)
        self.gate.wait(10)
        self.threads.append(threading.current_thread().name)
        chain = []
        node = wr
        while node:
            w = node.contents
            if w.wr_id == self.fail_at:
                bad[0] = node  # type: ignore[index]
                self.chains.append(chain)
                return self.rc
            sges = [
                (w.sg_list[i].addr, w.sg_list[i].length, w.sg_list[i].lkey)
                for i in range(w.num_sge)
            ]
            rdma = (w.wr.rdma.remote_addr, w.wr.rdma.rkey)
            chain.append((w.wr_id, w.opcode, w.send_flags, sges, rdma))
            node = w.next
        self.chains.append(chain)
        return 0


def _wr(wr_id: int, sges: list[tuple[int, int, int]], keep: list[object]) -> vd.IbvSendWr:
    array = (vd.IbvSge * len(sges))(*[vd.IbvSge(*s) for s in sges])
    wr = vd.IbvSendWr(wr_id=wr_id, num_sge=len(sges), opcode=4, send_flags=2)
    wr.sg_list = ctypes.cast(array, ctypes.POINTER(vd.IbvSge))
    wr.wr.rdma.remote_addr = 0xABC000 + wr_id
    wr.wr.rdma.rkey = 0x55 + wr_id
    keep += [array, wr]
    return wr


def test_locate_finds_the_raw_objects() -> None:
    p = Provider()
    assert vd.locate(p.context, p.qp) == (ctypes.addressof(p.context), ctypes.addressof(p.qp))


def test_locate_refuses_objects_it_does_not_recognise() -> None:
    p = Provider()
    elsewhere = FakeContext(cmd_fd=78)
    other = FakeQp(context=ctypes.addressof(elsewhere), qp_num=0x1234, qp_type=2)
    with pytest.raises(vd.DirectUnavailable, match="ibv_qp"):
        vd.locate(p.context, other)  # a queue pair of another context: not recognised
    uc = FakeQp(context=ctypes.addressof(p.context), qp_num=0x1234, qp_type=3)
    with pytest.raises(vd.DirectUnavailable, match="ibv_qp"):
        vd.locate(p.context, uc)  # not an RC queue pair

    class Opaque:  # a pyverbs whose objects hold no recognisable pointer: the fallback
        cmd_fd = 77
        qp_num = 0x1234

    with pytest.raises(vd.DirectUnavailable, match="ibv_context"):
        vd.locate(Opaque(), p.qp)
    with pytest.raises(vd.DirectUnavailable, match="ibv_qp"):
        vd.locate(p.context, Opaque())
    with pytest.raises(vd.DirectUnavailable):
        vd.locate(object(), object())


def test_a_chain_reaches_the_provider_byte_exact() -> None:
    p = Provider()
    poster = vd.SendPoster(p.context, p.qp)
    keep: list[object] = []
    wrs = [_wr(1, [(0x1000, 10, 7), (0x2000, 20, 8)], keep), _wr(2, [(0x3000, 30, 9)], keep)]
    assert poster.post(vd.chain(wrs)) == (0, 0)
    assert p.chains == [
        [
            (1, 4, 2, [(0x1000, 10, 7), (0x2000, 20, 8)], (0xABC001, 0x56)),
            (2, 4, 2, [(0x3000, 30, 9)], (0xABC002, 0x57)),
        ]
    ]


def test_a_failed_post_names_the_first_work_request_not_posted() -> None:
    p = Provider(fail_at=2)
    poster = vd.SendPoster(p.context, p.qp)
    keep: list[object] = []
    wrs = [
        _wr(1, [(0x1000, 1, 1)], keep),
        _wr(2, [(0x2000, 1, 1)], keep),
        _wr(3, [(0, 1, 1)], keep),
    ]
    assert poster.post(vd.chain(wrs)) == (errno.ENOMEM, ctypes.addressof(wrs[1]))


def test_the_call_releases_the_gil() -> None:
    """While the provider's post_send waits, another Python thread runs (ctypes released the
    GIL); with the GIL held it could not, and the wait would time out."""
    p = Provider()
    poster = vd.SendPoster(p.context, p.qp)
    keep: list[object] = []
    wr = _wr(1, [(0x1000, 1, 1)], keep)
    ran = threading.Event()

    def other() -> None:
        ran.set()

    p.gate.clear()
    t = threading.Thread(target=lambda: (ran.wait(10), p.gate.set()))
    t.start()
    threading.Thread(target=other).start()
    assert poster.post(wr) == (0, 0)
    t.join()
    assert ran.is_set()


def test_post_thread_posts_in_order_and_reports_failures() -> None:
    p = Provider(fail_at=5)
    poster = vd.SendPoster(p.context, p.qp)
    thread = vd.PostThread("verbs-post-test")
    failures: list[tuple[int, int]] = []
    done = threading.Event()
    keep: list[object] = []
    wrs = [_wr(i, [(0x1000 * i, i, i)], keep) for i in range(1, 7)]
    p.gate.clear()  # the first post waits: the rest queue up behind it
    for w in wrs:
        thread.submit(
            (lambda w=w: poster.post(w), lambda rc, bad: (failures.append((rc, bad)), done.set()))
        )
    assert not thread.idle
    p.gate.set()
    assert done.wait(10)
    thread.stop()
    assert [c[0][0] for c in p.chains if c] == [1, 2, 3, 4, 6]
    assert failures == [(errno.ENOMEM, ctypes.addressof(wrs[4]))]
    assert set(p.threads) == {"verbs-post-test"}
    with pytest.raises(vd.DirectUnavailable):
        thread.submit((lambda: (0, 0), lambda rc, bad: None))


def test_post_thread_stop_drops_what_was_not_posted() -> None:
    p = Provider()
    poster = vd.SendPoster(p.context, p.qp)
    thread = vd.PostThread("verbs-post-stop")
    keep: list[object] = []
    entered = threading.Event()
    p.gate.clear()

    def first() -> tuple[int, int]:
        entered.set()
        return poster.post(_wr(1, [(1, 1, 1)], keep))

    thread.submit((first, lambda rc, bad: None))
    thread.submit((lambda: poster.post(_wr(2, [(1, 1, 1)], keep)), lambda rc, bad: None))
    assert entered.wait(10)
    threading.Timer(0.05, p.gate.set).start()  # stop() must wait for this post to end
    thread.stop()
    assert [c[0][0] for c in p.chains] == [1]
    assert thread.idle
