"""rtrext send-based placement (TBSN) on vs off: WRITEs of 8, 32 and 128 KiB, ours <-> ours.

Each WRITE is a COMPOUND of PUTFH and WRITE (UNSTABLE, the anonymous stateid) of fresh random
data to one file of the export. Three modes against the same export, one after another in one
process (one boot on the test bed):

- ``v1``: rtrext off: the WRITE data goes in a Read chunk the server pulls with RDMA Read;
- ``exrw``: rtrext on, TBSN off (the default): message continuation, the data still in an
  EXRW item (a Read chunk);
- ``tbsn``: rtrext and TBSN on, both sides: the data crosses inside the Sends, in the
  server's placement-capable receive segments (no registration, no RDMA Read); 8 PLT
  segments of 4 KiB per receive (the default), so 32 KiB per Send;
- ``tbsn32``: the same with 32 PLT segments per receive (a 128 KiB WRITE in one Send).

For each mode and size: explicit RDMA operations per RPC (RDMA Reads and Writes our server
posted, plus the client's memory registrations) and the median latency. By default on the
in-process provider (``--provider inproc``); on the test bed ``--provider rxe`` (both sides on
rxe0; the set-up order is the one of ``bench/rtrext.py``, see its doc).

Last line: ``rdma_ops_v1=… rdma_ops_exrw=… rdma_ops_tbsn=… ratio_8k=… ratio_32k=…
ratio_128k=… ratio_vs_v1=… tbsn32_ratio_128k=… tbsn32_latency_ratio=… latency_ratio=…
provider=…``: ratios are TBSN median / EXRW median per size, ``latency_ratio`` the geometric
mean of the three (``tbsn32_…`` the same for 32 PLT segments, ``ratio_vs_v1`` the median of
TBSN / v1 per size); below 1 means TBSN is faster.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions, connect_rdma
from nfsrdma.transport.rdma.provider import Device
from nfsrdma.xdr.gen import nfs4

PORT = 20052
SIZES = (8 * 1024, 32 * 1024, 128 * 1024)
MODES = {
    "v1": RdmaOptions(rtrext=False),
    "exrw": RdmaOptions(),
    "tbsn": RdmaOptions(rtrext_tbsn=True),
    # 32 PLT segments per receive: a 128 KiB WRITE in one Send (132 KiB receive buffers).
    "tbsn32": RdmaOptions(rtrext_tbsn=True, rtr_plt_segments=32),
}
ANONYMOUS = nfs4.stateid4(0, bytes(12))


def server_for(
    export: Path, provider: str, opts: RdmaOptions
) -> tuple[NFSServer, str, Device | None]:
    if provider == "inproc":
        from nfsrdma.transport.rdma.inproc import InprocFabric

        fabric = InprocFabric()
        server = NFSServer(
            str(export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT,
            rdma_device=fabric.device("10.9.0.1"), root_squash=False, rdma_options=opts,
        )  # fmt: skip
        return server, "10.9.0.1", fabric.device("10.9.0.2")
    from nfsrdma.testbed.helpers import testbed_addr

    addr = testbed_addr()
    server = NFSServer(
        str(export), bind=addr, tcp_port=0, rdma_port=PORT, root_squash=False,
        rdma_options=opts,
    )  # fmt: skip
    return server, addr, None


async def client_device(inproc: Device | None, addr: str) -> Device:
    if inproc is not None:
        return inproc
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    return await open_device(addr)


def explicit(server: list[RdmaConnection], client: list[RdmaConnection]) -> int:
    return sum(c.stats["rdma_reads"] + c.stats["rdma_writes"] for c in server) + sum(
        c.stats["registrations"] for c in client
    )


async def run_mode(
    export: Path, provider: str, opts: RdmaOptions, rounds: int, rnd: random.Random
) -> dict[int, tuple[int, list[float]]]:
    """Per size: (explicit RDMA operations, latencies)."""
    server, addr, inproc = server_for(export, provider, opts)
    await server.start()
    cdev = await client_device(inproc, addr)
    served: list[RdmaConnection] = []
    clients: list[RdmaConnection] = []
    assert server.rdma is not None
    accept = server.rdma.on_connection

    def record(conn: RdmaConnection) -> None:
        served.append(conn)
        accept(conn)

    server.rdma.on_connection = record

    async def connect() -> Connection:
        conn = await connect_rdma(cdev, addr, PORT, opts)
        clients.append(conn)
        return conn

    me = SessionOptions(
        backchannel=False, uid=os.geteuid(), gid=os.getegid(), gids=tuple(os.getgroups())
    )
    session = ClientSession(connect, me)
    out: dict[int, tuple[int, list[float]]] = {}
    try:
        await session.start()
        res = await session.compound(
            [
                nfs4.nfs_argop4(nfs4.OP_PUTROOTFH),
                nfs4.nfs_argop4(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"target")),
                nfs4.nfs_argop4(nfs4.OP_GETFH),
            ]
        )
        fh = res.resarray[2].value.value.object
        for size in SIZES:
            latencies: list[float] = []
            before = explicit(served, clients)
            for i in range(rounds):
                data = rnd.randbytes(size)
                ops = [
                    nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    nfs4.nfs_argop4(
                        nfs4.OP_WRITE,
                        nfs4.WRITE4args(ANONYMOUS, i * size, nfs4.UNSTABLE4, data),
                    ),
                ]
                t = time.perf_counter()
                res = await session.compound(ops, idempotent=False)
                latencies.append(time.perf_counter() - t)
                if res.status != nfs4.NFS4_OK or res.resarray[1].value.value.count != size:
                    raise SystemExit(f"WRITE of {size} failed: {res.status}")
            out[size] = (explicit(served, clients) - before, latencies)
        placed = sum(c.stats["rtr_tbsn_items"] for c in served)
        print(f"# plt={opts.rtr_plt_segments if opts.rtrext_tbsn else 0}: "
              f"items placed by TBSN {placed}", flush=True)  # fmt: skip
        return out
    finally:
        await session.close()
        await server.close()
        cdev.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--provider", choices=("inproc", "rxe"), default="inproc")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    rnd = random.Random(13)
    results: dict[str, dict[int, tuple[int, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp)
        (export / "target").write_bytes(b"")
        for name, opts in MODES.items():
            results[name] = await run_mode(export, args.provider, opts, args.rounds, rnd)
    print(f"{'mode':6} {'size':>7} {'RPCs':>5} {'RDMA ops/RPC':>13} {'median ms':>10}")
    for name, per_size in results.items():
        for size, (ops, lat) in per_size.items():
            med = statistics.median(lat) * 1e3
            print(f"{name:6} {size // 1024:5d}Ki {len(lat):5d} {ops / len(lat):13.2f} {med:10.3f}")
    ratios = {
        size: statistics.median(results["tbsn"][size][1])
        / statistics.median(results["exrw"][size][1])
        for size in SIZES
    }
    pooled = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    r32 = [
        statistics.median(results["tbsn32"][s][1]) / statistics.median(results["exrw"][s][1])
        for s in SIZES
    ]
    pooled32 = math.exp(sum(math.log(r) for r in r32) / len(r32))

    def per_rpc(name: str) -> float:
        r = results[name]
        return sum(ops for ops, _ in r.values()) / sum(len(lat) for _, lat in r.values())

    v1_ratio = statistics.median(
        [statistics.median(results["tbsn"][s][1]) / statistics.median(results["v1"][s][1])
         for s in SIZES]
    )  # fmt: skip
    print(
        f"rdma_ops_v1={per_rpc('v1'):.2f} rdma_ops_exrw={per_rpc('exrw'):.2f} "
        f"rdma_ops_tbsn={per_rpc('tbsn'):.2f} "
        + " ".join(f"ratio_{s // 1024}k={ratios[s]:.2f}" for s in SIZES)
        + f" ratio_vs_v1={v1_ratio:.2f} tbsn32_ratio_128k={r32[-1]:.2f}"
        f" tbsn32_latency_ratio={pooled32:.2f} latency_ratio={pooled:.2f}"
        f" provider={args.provider}"
    )


if __name__ == "__main__":
    asyncio.run(main())
