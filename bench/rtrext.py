"""rtrext on vs off: explicit RDMA operations per RPC and median latency, ours <-> ours.

Two workloads, each run with the extension off (plain RPC-over-RDMA v1) and on, against the same
export in one process:

- ``readdir``: READDIR of a 2,000-entry directory asking for full attributes (type, mode, size,
  owner, group, times...), 16 KiB per reply, until the end of the directory;
- ``getattr20``: one COMPOUND of PUTROOTFH and 20 GETATTRs of the same attributes.

Explicit RDMA operations are the RDMA Reads and Writes our server posted (for Read chunks,
Write chunks and Reply chunks). By default this runs on the in-process verbs provider
(``--provider inproc``), where an RDMA operation costs about as much as a Send, so the latency
ratio says little; on the test bed (``--provider rxe``, inside the guest) both sides use rxe0.

On rxe the order of setting up matters. The Linux kernel refuses a ``write()`` on a verbs
device file from a thread whose credentials changed after the file was opened (EACCES, "changed
security contexts after opening file descriptor"), and rxe posts every Send with such a write.
The server never changes its event-loop thread's credentials (file-system calls as a client's
identity run in an identity worker, ``vfs/identity.py``), and the client here calls as the
server's own identity; the server still opens its device itself, before the client's.

Last line: ``rdma_ops_v1=… rdma_ops_rtrext=… latency_ratio=…`` (operations per RPC over both
workloads; latency ratio = rtrext median / v1 median, both workloads pooled). Target: 0 and
<= 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from rtrext_rig import Rig

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.transport.rdma.endpoint import RdmaOptions
from nfsrdma.xdr.gen import nfs4

PORT = 20051
ATTRS = bitmap_of(
    [
        nfs4.FATTR4_TYPE,
        nfs4.FATTR4_MODE,
        nfs4.FATTR4_SIZE,
        nfs4.FATTR4_OWNER,
        nfs4.FATTR4_OWNER_GROUP,
        nfs4.FATTR4_NUMLINKS,
        nfs4.FATTR4_FILEID,
        nfs4.FATTR4_TIME_MODIFY,
        nfs4.FATTR4_TIME_ACCESS,
        nfs4.FATTR4_TIME_METADATA,
    ]
)


async def run_one(
    export: Path, provider: str, rtrext: bool, rounds: int
) -> tuple[int, int, list[float]]:
    """(explicit RDMA operations, RPCs, latencies) for both workloads."""
    async with Rig(export, provider, PORT, RdmaOptions(rtrext=rtrext)) as rig:
        session = rig.session
        big = await rig.lookup(b"big")
        latencies: list[float] = []
        rpcs = 0
        before = rig.server_rdma()
        for _ in range(rounds):
            cookie, verf, eof = 0, bytes(8), False
            while not eof:
                t = time.perf_counter()
                res = await session.compound(
                    [
                        nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(big)),
                        nfs4.nfs_argop4(
                            nfs4.OP_READDIR,
                            nfs4.READDIR4args(cookie, verf, 4096, 16384, ATTRS),
                        ),
                    ],
                    reply_size=16384 + 512,
                )
                latencies.append(time.perf_counter() - t)
                rpcs += 1
                ok = res.resarray[1].value.value
                verf = ok.cookieverf
                entries = ok.reply.entries
                if entries:
                    cookie = entries[-1].cookie
                eof = ok.reply.eof
            ops = [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)]
            ops += [nfs4.nfs_argop4(nfs4.OP_GETATTR, nfs4.GETATTR4args(ATTRS))] * 20
            t = time.perf_counter()
            await session.compound(ops, reply_size=8192)
            latencies.append(time.perf_counter() - t)
            rpcs += 1
        return rig.server_rdma() - before, rpcs, latencies


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--provider", choices=("inproc", "rxe"), default="inproc")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp)
        big = export / "big"
        big.mkdir()
        for i in range(2000):
            (big / f"entry-with-a-longish-name-{i:05d}").touch()
        results = {}
        for rtrext in (False, True):
            results[rtrext] = await run_one(export, args.provider, rtrext, args.rounds)
    print(f"{'mode':8} {'RPCs':>6} {'RDMA ops':>9} {'ops/RPC':>8} {'median ms':>10}")
    for rtrext, (ops, rpcs, lat) in results.items():
        name = "rtrext" if rtrext else "v1"
        median = statistics.median(lat) * 1e3
        print(f"{name:8} {rpcs:6d} {ops:9d} {ops / rpcs:8.2f} {median:10.3f}")
    v1_ops, v1_rpcs, v1_lat = results[False]
    on_ops, on_rpcs, on_lat = results[True]
    ratio = statistics.median(on_lat) / statistics.median(v1_lat)
    print(
        f"rdma_ops_v1={v1_ops / v1_rpcs:.2f} rdma_ops_rtrext={on_ops / on_rpcs:.2f} "
        f"latency_ratio={ratio:.2f} provider={args.provider}"
    )


if __name__ == "__main__":
    asyncio.run(main())
