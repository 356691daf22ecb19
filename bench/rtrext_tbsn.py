"""rtrext send-based placement (TBSN) on vs off: WRITEs of 8, 32 and 128 KiB, ours <-> ours.

Each WRITE is a COMPOUND of PUTFH and WRITE (UNSTABLE, the anonymous stateid) of fresh random
data to one file. Four modes, each with its own server, export and client in one process (one
boot on the test bed), taking turns WRITE by WRITE (the order rotating each round), so that a
slower or busier moment of the machine falls on all alike:

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
rxe0; the set-up is ``bench/rtrext_rig.py``'s).

Last line: ``rdma_ops_v1=… rdma_ops_exrw=… rdma_ops_tbsn=… ratio_8k=… ratio_32k=…
ratio_128k=… ratio_vs_v1=… tbsn32_ratio_128k=… tbsn32_latency_ratio=… latency_ratio=…
provider=…``: ratios are TBSN median / EXRW median per size, ``latency_ratio`` the geometric
mean of the three (``tbsn32_…`` the same for 32 PLT segments, ``ratio_vs_v1`` the median of
TBSN / v1 per size); below 1 means TBSN is faster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from rtrext_rig import Rig

from nfsrdma.transport.rdma.endpoint import RdmaOptions
from nfsrdma.xdr.gen import nfs4

PORT = 20052  # the modes' servers listen on PORT, PORT + 1, ...
SIZES = (8 * 1024, 32 * 1024, 128 * 1024)
MODES = {
    "v1": RdmaOptions(rtrext=False),
    "exrw": RdmaOptions(),
    "tbsn": RdmaOptions(rtrext_tbsn=True),
    # 32 PLT segments per receive: a 128 KiB WRITE in one Send (132 KiB receive buffers).
    "tbsn32": RdmaOptions(rtrext_tbsn=True, rtr_plt_segments=32),
}
ANONYMOUS = nfs4.stateid4(0, bytes(12))
Results = dict[str, dict[int, tuple[int, list[float]]]]


async def write(rig: Rig, fh: bytes, offset: int, data: bytes) -> tuple[int, float]:
    """(explicit RDMA operations, latency) of one WRITE."""
    ops = [
        nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
        nfs4.nfs_argop4(nfs4.OP_WRITE, nfs4.WRITE4args(ANONYMOUS, offset, nfs4.UNSTABLE4, data)),
    ]
    before = rig.explicit()
    t = time.perf_counter()
    res = await rig.session.compound(ops, idempotent=False)
    latency = time.perf_counter() - t
    if res.status != nfs4.NFS4_OK or res.resarray[1].value.value.count != len(data):
        raise SystemExit(f"WRITE of {len(data)} failed: {res.status}")
    return rig.explicit() - before, latency


async def run(export: Path, provider: str, rounds: int, rnd: random.Random) -> Results:
    """Per mode and size: (explicit RDMA operations, latencies)."""
    results: Results = {name: {size: (0, []) for size in SIZES} for name in MODES}
    async with contextlib.AsyncExitStack() as stack:
        rigs: dict[str, tuple[Rig, bytes]] = {}
        for port, (name, opts) in enumerate(MODES.items(), PORT):
            # one export per server: servers of one directory would share its grace period
            (export / name).mkdir()
            (export / name / "target").write_bytes(b"")
            rig = await stack.enter_async_context(Rig(export / name, provider, port, opts))
            rigs[name] = (rig, await rig.lookup(b"target"))
        names = list(MODES)
        for size in SIZES:
            for i in range(rounds):
                turn = names[i % len(names) :] + names[: i % len(names)]
                for name in turn:
                    rig, fh = rigs[name]
                    ops, latency = await write(rig, fh, i * size, rnd.randbytes(size))
                    total, latencies = results[name][size]
                    latencies.append(latency)
                    results[name][size] = (total + ops, latencies)
        for name, (rig, _) in rigs.items():
            placed = sum(c.stats["rtr_tbsn_items"] for c in rig.served)
            print(f"# {name}: items placed by TBSN {placed}", flush=True)
    return results


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--provider", choices=("inproc", "rxe"), default="inproc")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    rnd = random.Random(13)
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp)
        results = await run(export, args.provider, args.rounds, rnd)
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
