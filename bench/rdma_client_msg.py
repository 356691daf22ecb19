"""Our client's RPC-over-RDMA Python per call, outside the RPC and NFS layers (issue 12).

The requester's counterpart of ``rdma_server_msg.py``: one client-side ``RdmaConnection`` over
a queue pair that only records what is posted (``rdma_server_msg.RecordingQp``). Each turn
sends ``--batch`` calls (a GETATTR-sized RDMA_MSG call each, a stat's), then feeds the
completions a device would report: a receive completion carrying each reply (about 200
bytes, inline), which the receiver takes and retires (``call_done``, as the RPC layer does),
and one send queue completion per signalled Send. With ``NFSRDMA_CALL_BATCH=1`` the calls of a
turn are held (``hold_sends``) and the queue pair signals the held list's last work request,
as both providers do. So the figure is the transport's own CPU per call: call plan, header,
send buffer copy, work request bookkeeping, credits, the reply's receive completion, header
parse, reply match, hand-off, receive re-posting and the Send completions.

``--trees A B`` runs this script once per tree and round, alternating (A, B, A, B, ...), with
each tree's code on ``PYTHONPATH``, and prints µs of CPU per call per tree (median and range)::

    NFSRDMA_CALL_BATCH=1 .venv/bin/python bench/rdma_client_msg.py --trees ../base . --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rdma_server_msg import RecordingQp  # this directory


class HoldingQp(RecordingQp):
    """``RecordingQp`` that holds a turn's Sends as the providers do (``hold_sends``)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.held = False
        self.turn_start = 0

    def hold_sends(self) -> bool:
        if not self.held:
            self.held = True
            self.turn_start = len(self.sends)
        return True

    def ring(self) -> None:
        """The end of the turn: the held list goes out, its last work request signalled."""
        if self.held and len(self.sends) > self.turn_start:
            wr, writes, _ = self.sends[-1]
            self.sends[-1] = (wr, writes, True)
        self.held = False


def run(calls: int, batch: int) -> float:
    """µs of CPU per call, after a warm-up."""
    from nfsrdma.transport.rdma import header as hdr
    from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions
    from nfsrdma.transport.rdma.inproc import InprocFabric
    from nfsrdma.transport.rdma.provider import Completion, WcOpcode, WcStatus
    from nfsrdma.xdr.runtime import Writer

    fabric = InprocFabric()
    # The Linux server (knfsd) offers no rtrext: plain RPC-over-RDMA v1, as in the test bed.
    knfsd = RdmaOptions(rtrext=False)
    server = RdmaConnection(fabric.device("10.0.0.1"), knfsd, server=True)
    conn = RdmaConnection(fabric.device("10.0.0.2"), RdmaOptions(), server=False, peer="bench")
    qp = HoldingQp(conn.qp_config())
    conn.attach(qp)  # type: ignore[arg-type]
    conn.negotiated(server.private_data(accept=True))
    conn.established()
    body = bytes(140)  # SEQUENCE, PUTFH, GETATTR's arguments: about a stat's call
    attrs = bytes(180)

    def reply(xid: int) -> bytes:
        rpc = struct.pack(">IIIIIII", xid, 1, 0, 0, 0, 0, 0) + attrs
        return hdr.encode(xid, 32, hdr.RDMA_MSG) + rpc

    def retire(c: Any, inbound: Any) -> None:
        conn.call_done(struct.unpack_from(">I", inbound.reader.buf, 0)[0])

    conn.set_receiver(retire)
    ok = WcStatus.SUCCESS
    xid = 0x1000

    def turn() -> None:
        nonlocal xid
        xids = []
        for _ in range(batch):
            xid += 1
            w = Writer()
            w += struct.pack(">IIIIII", xid, 0, 2, 100003, 4, 1)
            w += body
            conn.send_call(xid, w, None)
            xids.append(xid)
        qp.ring()
        for x in xids:
            wr, sge = qp.recvs.pop(0)
            msg = reply(x)
            buf = conn.recv_pool.by_addr(sge.addr)
            buf.view[: len(msg)] = msg
            conn.on_event(Completion(wr, ok, WcOpcode.RECV, len(msg)))
        for sent, _, signaled in qp.sends:
            if signaled:
                conn.on_event(Completion(sent, ok, WcOpcode.SEND))
        qp.sends.clear()

    for _ in range(2000 // batch):
        turn()
    assert not conn.closed and not conn._out, conn.stats
    turns = max(1, calls // batch)
    t0 = time.process_time()
    for _ in range(turns):
        turn()
    spent = time.process_time() - t0
    assert not conn.closed and conn.send_pool.in_use == 0, conn.stats
    return spent / (turns * batch) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=32, help="calls per loop turn")
    ap.add_argument("--trees", nargs="+", help="run each tree in turn, alternating")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if not args.trees:
        print(f"call {run(args.calls, args.batch):.2f}")
        return
    got: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            cmd = [sys.executable, os.path.abspath(__file__), "--calls", str(args.calls)]
            cmd += ["--batch", str(args.batch)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            got.setdefault(tree, []).append(float(out.split()[-1]))
    for tree, values in got.items():
        print(
            f"call {tree:20} median {statistics.median(values):6.2f} µs/call "
            f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} rounds)"
        )


if __name__ == "__main__":
    main()
