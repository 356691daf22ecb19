"""Our client's plain ``stat`` over RPC-over-RDMA with the reply bound computed from each
COMPOUND (``session/client_replysize.py``) against a fixed 8 KiB bound (the client before it:
every call then offered a Reply chunk and registered memory for it), in one run on the host.

Our server and our client in this process on the in-process verbs provider, plain RPC-over-RDMA
v1 (rtrext off, as against knfsd) and with rtrext; ``--stats`` stat calls, 32 in flight, best of
``--rounds``. The in-process provider registers memory cheaply, so the CPU figures understate
what a registration and its invalidation cost on a real device (the test bed: ``client.py``).
The last line is ``cpu_ratio=<fixed CPU per stat / bounded CPU per stat, v1>
reply_chunks_per_stat=<bounded> fixed_reply_chunks_per_stat=<fixed>``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stat_rig import FILES, stat_rig  # bench/, this script's directory

from nfsrdma.client.fs import gather_limited
from nfsrdma.session.client import ClientSession


async def run(n: int, *, rtrext: bool, fixed: bool) -> tuple[float, float]:
    """(CPU µs per stat, client and server together; Reply chunks offered per stat)."""

    def prepare(session: ClientSession) -> None:
        if fixed:
            session.reply_bound = lambda ops, tag, sinks: 8192  # type: ignore[method-assign]

    async with stat_rig(rtrext, prepare) as (fs, conns):
        names = [f"f{i % FILES:04d}" for i in range(n)]
        chunks = sum(c.stats["reply_chunks"] for c in conns)
        cpu = time.process_time()
        await gather_limited([fs.stat(x) for x in names], 32)
        cpu = time.process_time() - cpu
        chunks = sum(c.stats["reply_chunks"] for c in conns) - chunks
    return cpu / n * 1e6, chunks / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", type=int, default=3000, help="stat calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    best: dict[tuple[bool, bool], tuple[float, float]] = {}
    for _ in range(args.rounds):
        for rtrext in (False, True):
            for fixed in (True, False):
                us, chunks = asyncio.run(run(args.stats, rtrext=rtrext, fixed=fixed))
                key = (rtrext, fixed)
                if key not in best or us < best[key][0]:
                    best[key] = (us, chunks)
    print(f"plain stat, 32 in flight, {args.stats} calls, best of {args.rounds} (host, in-process)")
    print(f"{'':8} {'bound':>8} {'CPU us/stat':>12} {'Reply chunks/stat':>18}")
    for (rtrext, fixed), (us, chunks) in sorted(best.items()):
        name = "rtrext" if rtrext else "v1"
        print(f"{name:8} {'8 KiB' if fixed else 'ops':>8} {us:12.0f} {chunks:18.2f}")
    fixed_us, fixed_chunks = best[(False, True)]
    us, chunks = best[(False, False)]
    print(
        f"cpu_ratio={fixed_us / us:.2f} reply_chunks_per_stat={chunks:.2f} "
        f"fixed_reply_chunks_per_stat={fixed_chunks:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
