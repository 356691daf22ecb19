"""The server's RPC-over-RDMA Python per message, outside the COMPOUND (issue 12).

One server-side ``RdmaConnection`` over a queue pair that only records what is posted: each
message is a receive completion carrying a call (the transport header and an RPC call header),
the hand-off to the receiver, which answers at once with a prepared reply (``send_reply``), the
reply's marshalling and post, and the completions of what was posted. So the figure is the
transport's own CPU per message: header parse, chunk checks, credits, reply plan and header,
send buffer copy, work request bookkeeping, receive re-posting, completion dispatch. Two kinds:

- ``getattr``: an RDMA_MSG call without chunks, answered inline (about 200 bytes);
- ``read``: an RDMA_MSG call with one Write chunk of one segment, answered with 4 KiB of READ
  data lent by the transport (``lend``, as the server's READ does over RDMA), which goes by
  RDMA Write, and a short inline reply.

``--trees A B`` runs this script once per tree and round, alternating (A, B, A, B, ...), with
each tree's code on ``PYTHONPATH``, and prints µs of CPU per message per tree (median and
range of the rounds)::

    .venv/bin/python bench/rdma_server_msg.py --trees ../base-85c1 . --rounds 5

``--profile`` prints a cProfile of one tree's run instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

KINDS = ("getattr", "read")
READ_SIZE = 4096


class RecordingQp:
    """A queue pair that keeps what is posted; completions are made by the bench."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.recvs: list[tuple[int, Any]] = []
        self.sends: list[tuple[int, list[Any], bool]] = []  # send wr, writes, signalled
        self.initiator_depth = 16
        self.responder_resources = 0
        self.established = True
        self.broken = False

    def post_recv(self, wr_id: int, sge: Any) -> None:
        self.recvs.append((wr_id, sge))

    def post_send(
        self,
        wr_id: int,
        sges: Any,
        *,
        invalidate_rkey: int | None = None,
        writes: Any = (),
        signaled: bool = True,
    ) -> None:
        self.sends.append((wr_id, list(writes or ()), signaled))

    def post_rdma_read(self, *args: Any, **kw: Any) -> None:
        raise AssertionError("no RDMA Read in this bench")

    def disconnect(self) -> None:
        pass

    def close(self) -> None:
        pass


def _call(kind: str, xid: int) -> bytes:
    from nfsrdma.transport.rdma import header as hdr

    rpc = struct.pack(">IIIIIIIIIII", xid, 0, 2, 100003, 4, 1, 0, 0, 0, 0, 0) + bytes(120)
    if kind == "getattr":
        return hdr.encode(xid, 32, hdr.RDMA_MSG) + rpc
    seg = hdr.Segment(0x1234, READ_SIZE, 0x7F0000001000)
    return hdr.encode(xid, 32, hdr.RDMA_MSG, [], [[seg]], None) + rpc


def run(kind: str, messages: int, profile: bool) -> float:
    """µs of CPU per message, after a warm-up."""
    from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions
    from nfsrdma.transport.rdma.inproc import InprocFabric
    from nfsrdma.transport.rdma.provider import Completion, WcOpcode, WcStatus
    from nfsrdma.xdr.gen import nfs4
    from nfsrdma.xdr.runtime import Writer

    fabric = InprocFabric()
    dev = fabric.device("10.0.0.1")
    client = RdmaConnection(fabric.device("10.0.0.2"), RdmaOptions(), server=False)
    conn = RdmaConnection(dev, RdmaOptions(), server=True, peer="bench")
    qp = RecordingQp(conn.qp_config())
    conn.attach(qp)  # type: ignore[arg-type]
    conn.negotiated(client.private_data(accept=False))
    conn.established()
    head = bytes(96)
    attrs = bytes(100)

    def answer(c: Any, inbound: Any) -> None:
        w = Writer(head)
        if kind == "read":
            data = conn.lend(inbound, READ_SIZE)
            assert data is not None
            w.ddp_tag = 0
            nfs4.enc_READ4res(w, nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(True, data)))
        else:
            w += attrs
        conn.send_reply(inbound, w)

    conn.set_receiver(answer)
    calls = [_call(kind, 0x1000 + i) for i in range(64)]
    ok = WcStatus.SUCCESS

    def one(i: int) -> None:
        wr, sge = qp.recvs.pop(0)
        msg = calls[i & 63]
        buf = conn.recv_pool.by_addr(sge.addr)
        buf.view[: len(msg)] = msg
        conn.on_event(Completion(wr, ok, WcOpcode.RECV, len(msg)))
        sent, writes, signaled = qp.sends.pop()
        for w in writes:
            if w.signaled:
                conn.on_event(Completion(w.wr_id, ok, WcOpcode.RDMA_WRITE))
        if signaled:
            conn.on_event(Completion(sent, ok, WcOpcode.SEND))

    for i in range(2000):
        one(i)
    assert not qp.sends and conn.stats["sends"] == 2000 and not conn.closed, conn.stats
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        prof.enable()
    t0 = time.process_time()
    for i in range(messages):
        one(i)
    spent = time.process_time() - t0
    if prof is not None:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(int(os.environ.get("TOP", "25")))
    return spent / messages * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--kind", choices=KINDS, action="append")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--trees", nargs="+", help="run each tree in turn, alternating")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    kinds = args.kind or list(KINDS)
    if not args.trees:
        for kind in kinds:
            print(f"{kind} {run(kind, args.messages, args.profile):.2f}")
        return
    got: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            cmd = [sys.executable, os.path.abspath(__file__), "--messages", str(args.messages)]
            for kind in kinds:
                cmd += ["--kind", kind]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                kind, us = line.split()
                got.setdefault((kind, tree), []).append(float(us))
    for (kind, tree), values in got.items():
        print(
            f"{kind:8} {tree:20} median {statistics.median(values):6.2f} µs/message "
            f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} rounds)"
        )


if __name__ == "__main__":
    main()
