"""What the pyverbs post and poll paths cost in Python per reply, before and after reusing the
work requests (``pyverbs_wr``) and polling through ctypes (``verbs_poll``), on the host.

No RDMA device is needed: the work is what happens on the loop thread around the verbs calls
(the calls themselves, ``ibv_post_send`` and ``ibv_poll_cq``, are the same C work both ways and
are left out). Per reply of the kinds the server sends most:

- ``send``: a Send-only reply out of a rotating buffer (selective signalling returns buffers in
  batches, so successive replies use different buffers): before, a cache keyed by buffer,
  length and flags, missing when the key is new (``SendWR`` + ``SGE``); now one ``SendWR``
  rewritten.
- ``chain``: a READ reply, one RDMA Write chained ahead of the Send: before, a fresh ``SendWR``
  for each and the ``SGE`` looked up in a cache; now the queue pair's two objects rewritten.
- ``poll``: two completions (the call's receive and the reply's Send): before, a pyverbs ``WC``
  per completion (as ``CQ.poll`` makes them) and six property reads each; now one
  ``struct.iter_unpack`` over the batch ``ibv_poll_cq`` filled.

Last line: ``send_us_old= send_us_new= chain_us_old= chain_us_new= poll_us_old= poll_us_new=
ratio=`` (old / new for the three together; best of ``--rounds``).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable

import pyverbs.enums as e
from pyverbs.cq import WC
from pyverbs.wr import SGE, SendWR

from nfsrdma.transport.rdma.provider import RdmaWriteRequest, Sge
from nfsrdma.transport.rdma.pyverbs_wr import ReusedWrs
from nfsrdma.transport.rdma.verbs_poll import _WC, WC_SIZE

BUFFERS = 40  # send buffers a connection rotates through
LENGTHS = (148, 212, 316, 92)  # reply sizes of the meta phase's COMPOUNDs, roughly


class OldSend:
    """The Send path of fa09963: a bounded cache of ``SendWR`` per (buffer, length, flags)."""

    def __init__(self) -> None:
        self.wrs: dict[tuple[int, int, int, bool, bool, bool], SendWR] = {}
        self.sges: dict[tuple[int, int, int], SGE] = {}

    def sge(self, s: Sge) -> SGE:
        key = (s.addr, s.length, s.lkey)
        element = self.sges.get(key)
        if element is None:
            if len(self.sges) >= 512:
                self.sges.clear()
            element = self.sges[key] = SGE(s.addr, s.length, s.lkey)
        return element

    def send(self, wr_id: int, s: Sge, signaled: bool) -> SendWR:
        key = (s.addr, s.length, s.lkey, False, False, signaled)
        wr = self.wrs.get(key)
        if wr is None:
            if len(self.wrs) >= 512:
                self.wrs.clear()
            flags = e.IBV_SEND_SIGNALED if signaled else 0
            wr = self.wrs[key] = SendWR(
                wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=1, sg=[self.sge(s)], send_flags=flags
            )
        else:
            wr.wr_id = wr_id
        return wr

    def chain(self, wr_id: int, s: Sge, w: Sge) -> SendWR:
        send = SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=1, sg=[self.sge(s)], send_flags=0)
        write = SendWR(
            wr_id=wr_id - 1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[self.sge(w)], send_flags=0
        )
        write.set_wr_rdma(0x55, 0xE000)
        write.next_wr = send
        return write


def _per_call(fn: Callable[[int], object], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    def buf(i: int) -> Sge:
        return Sge(0x100000 + 8192 * (i % BUFFERS), LENGTHS[i % len(LENGTHS)], 7)

    old, new = OldSend(), ReusedWrs()
    data = Sge(0x900000, 4096, 9)

    def old_send(i: int) -> object:
        return old.send(i, buf(i), i % 8 == 0)

    def new_send(i: int) -> object:
        flags = e.IBV_SEND_SIGNALED if i % 8 == 0 else 0
        return new.chain(i, [buf(i)], flags, None, ())

    def old_chain(i: int) -> object:
        return old.chain(2 * i + 1, buf(i), data)

    def new_chain(i: int) -> object:
        write = RdmaWriteRequest(2 * i, [data], 0xE000, 0x55, False)
        return new.chain(2 * i + 1, [buf(i)], 0, None, [write])

    raw = ctypes.create_string_buffer(WC_SIZE * 32)
    for k in range(2):
        row = _WC.pack(k + 1, 0, 128 if k == 0 else 0, 0, 200, 0, 17, 0, 0, 0, 0, 0, 0)
        ctypes.memmove(ctypes.addressof(raw) + k * WC_SIZE, row, WC_SIZE)
    view = memoryview(raw).cast("B")

    def old_poll(i: int) -> object:
        out = []
        for k in range(2):  # what CQ.poll makes, then what the provider reads
            wc = WC(wr_id=k + 1, status=0, opcode=128 if k == 0 else 0, vendor_err=0,
                    byte_len=200, qp_num=17, src_qp=0, imm_data=0, wc_flags=0, pkey_index=0,
                    slid=0, sl=0, dlid_path_bits=0)  # fmt: skip
            out.append((int(wc.wr_id), int(wc.status), int(wc.opcode), int(wc.byte_len),
                        int(wc.imm_data), int(wc.wc_flags)))  # fmt: skip
        return out

    def new_poll(i: int) -> object:
        return [(r[0], r[1], r[2], r[4], r[5], r[8]) for r in _WC.iter_unpack(view[: 2 * WC_SIZE])]

    pairs = {
        "send": (old_send, new_send),
        "chain": (old_chain, new_chain),
        "poll": (old_poll, new_poll),
    }
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (o, n) in pairs.items():  # old and new interleaved, best of the rounds
            for tag, fn in (("old", o), ("new", n)):
                us = _per_call(fn, args.calls)
                key = f"{name}_us_{tag}"
                best[key] = min(best.get(key, us), us)
    for name in pairs:
        o, n = best[f"{name}_us_old"], best[f"{name}_us_new"]
        print(f"{name:6} old {o:6.3f} µs  new {n:6.3f} µs  ({o / n:.2f}x)")
    total_old = sum(v for k, v in best.items() if k.endswith("old"))
    total_new = sum(v for k, v in best.items() if k.endswith("new"))
    print(" ".join(f"{k}={v:.3f}" for k, v in best.items()) + f" ratio={total_old / total_new:.2f}")


if __name__ == "__main__":
    main()
