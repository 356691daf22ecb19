"""What one RPC-over-RDMA reply costs the server at the verbs boundary, and how long a call
takes, with every Send signalled (``signal_every=1``, the default) and with selective
signalling (``signal_every=8``).

Our RPC client and server over RPC-over-RDMA in this process: the in-process provider on the
host (``--provider inproc``), or pyverbs on rxe0 inside the test bed (``--provider rxe``). Three
kinds of call, each ``--calls`` times, ``--inflight`` at once: ``getattr`` (reply by Send
only), ``read`` (``--size`` bytes of reply data by RDMA Write, then the Send) and ``write``
(``--size`` bytes of call data pulled by RDMA Read, then the Send). Printed per kind and
mode, per reply on the server's queue pair: post calls (doorbells, one system call each on
rxe), send work requests, signalled ones, receives posted, completions, CQ events and polls
(pyverbs only), and µs per call. E.g. in the test bed:

    flock /tmp/testbed.lock .venv/bin/python -m nfsrdma testbed run --out /tmp/tb-counts -- \\
        .venv/bin/python bench/rdma_reply_counts.py --provider rxe

Last line: ``<kind>_<field>_<mode>=…`` for the completions and signalled work requests per
reply, and ``<kind>_speedup=`` (µs per call with every Send signalled / selective).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import struct
import sys
import time
from collections import Counter
from typing import Any

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import Dispatcher, RpcCall, null_procedure
from nfsrdma.transport.rdma.endpoint import (
    RdmaConnection,
    RdmaListener,
    RdmaOptions,
    connect_rdma,
)
from nfsrdma.transport.rdma.inproc import call_read
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, Writer, unpack_from

PROG, VERS = 400300, 1
P_READ, P_WRITE = 1, 2
STATEID = nfs4.stateid4(0, bytes(12))
MODES = {"all": 1, "selective": 8}
KINDS = ("getattr", "read", "write")
FIELDS = ("doorbells", "send_wrs", "signaled", "recv_wrs", "completions", "cq_events", "polls")


def _read(call: RpcCall, w: Writer) -> None:
    (n,) = struct.unpack_from(">I", call.reader.buf, call.offset)
    w.ddp_tag = 0  # the data may go by RDMA Write (a Write chunk)
    data = bytes(n)
    nfs4.enc_READ4res(w, nfs4.READ4res(nfs4.NFS4_OK, nfs4.READ4resok(True, data)))


def _write(call: RpcCall, w: Writer) -> None:
    args, _ = unpack_from(nfs4.dec_WRITE4args, call.reader, call.offset)
    w += U32.pack(len(args.data))
    w += hashlib.sha256(args.data).digest()[:4]


def _write_args(w: Writer, data: bytes) -> None:
    part = Writer()
    nfs4.enc_WRITE4args(part, nfs4.WRITE4args(STATEID, 0, nfs4.UNSTABLE4, data))
    base = len(w)
    w += part
    for item in part.ddp:  # the data item may go by a Read chunk
        item.offset += base
        w.ddp.append(item)


async def _call(rpc: RpcConnection, kind: str, size: int) -> None:
    if kind == "getattr":
        await rpc.call(PROG, VERS, 0, lambda w: None)
    elif kind == "read":
        out, _ = await call_read(rpc, PROG, VERS, P_READ, size)
        assert len(out.data) == size
    else:
        data = bytes(size)
        res = await rpc.call(PROG, VERS, P_WRITE, lambda w: _write_args(w, data))
        assert struct.unpack_from(">I", res.reader.buf, res.offset)[0] == size


async def one(dev: Any, addr: str, port: int, kind: str, every: int, args: Any) -> dict[str, float]:
    disp = Dispatcher()
    disp.add(PROG, VERS, {0: null_procedure, P_READ: _read, P_WRITE: _write})
    accepted: asyncio.Future[RdmaConnection] = asyncio.get_running_loop().create_future()
    keep: list[RpcConnection] = []

    def on_connection(c: RdmaConnection) -> None:
        keep.append(RpcConnection(c, disp))
        if not accepted.done():
            accepted.set_result(c)

    listener = RdmaListener(dev, port, on_connection, RdmaOptions(signal_every=every))
    await listener.start()
    client = await connect_rdma(dev, addr, port, RdmaOptions(signal_every=every))
    rpc = RpcConnection(client, disp)
    server = await asyncio.wait_for(accepted, 30)
    try:
        for _ in range(args.inflight):  # warm up
            await _call(rpc, kind, args.size)
        qp: Any = server.qp
        before = Counter(qp.counts)
        t0 = time.perf_counter()
        done = 0
        while done < args.calls:
            batch = min(args.inflight, args.calls - done)
            await asyncio.gather(*(_call(rpc, kind, args.size) for _ in range(batch)))
            done += batch
        elapsed = time.perf_counter() - t0
        delta = Counter(qp.counts)
        delta.subtract(before)
        out = {f: delta[f] / args.calls for f in FIELDS}
        out["us"] = elapsed / args.calls * 1e6
        return out
    finally:
        client.close()
        await listener.close()
        server.close()


async def main(args: argparse.Namespace) -> int:
    if args.provider == "rxe":
        from nfsrdma.transport.rdma.pyverbs_provider import open_device

        addr = os.environ.get("TESTBED_ADDR")
        if not addr:
            print("--provider rxe runs inside the test bed (TESTBED_ADDR unset)", file=sys.stderr)
            return 2
        dev: Any = await open_device(addr)
    else:
        from nfsrdma.transport.rdma.inproc import InprocFabric

        addr = "10.9.9.1"
        dev = InprocFabric().device(addr)
    port = 20070
    line: list[str] = []
    try:
        print(f"{args.provider}: {args.calls} calls, {args.inflight} in flight, per reply:")
        print(f"{'kind':8} {'mode':10} " + " ".join(f"{f:>11}" for f in FIELDS) + "  us/call")
        for kind in KINDS:
            us: dict[str, list[float]] = {m: [] for m in MODES}
            last: dict[str, dict[str, float]] = {}
            for r in range(args.rounds):
                order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
                for mode in order:
                    port += 1
                    got = await one(dev, addr, port, kind, MODES[mode], args)
                    us[mode].append(got["us"])
                    last[mode] = got
                    print(
                        f"{kind:8} {mode:10} "
                        + " ".join(f"{got[f]:11.3f}" for f in FIELDS)
                        + f"  {got['us']:.0f}",
                        flush=True,
                    )
            for mode in MODES:
                line.append(f"{kind}_completions_{mode}={last[mode]['completions']:.3f}")
                line.append(f"{kind}_signaled_{mode}={last[mode]['signaled']:.3f}")
            speedup = statistics.median(us["all"]) / statistics.median(us["selective"])
            line.append(f"{kind}_speedup={speedup:.2f}")
    finally:
        dev.close()
    print(" ".join(line))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--provider", choices=("inproc", "rxe"), default="inproc")
    p.add_argument("--calls", type=int, default=400, help="calls per kind and mode (400)")
    p.add_argument("--inflight", type=int, default=1, help="calls at once (1)")
    p.add_argument("--size", type=int, default=8000, help="READ/WRITE data bytes (8000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, modes alternated (3)")
    sys.exit(asyncio.run(main(p.parse_args())))
