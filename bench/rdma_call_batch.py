"""Our client's plain ``stat`` over RPC-over-RDMA on the host: posts (doorbells) of the
client's queue pair per stat and CPU per stat, with our calls of one loop turn in one post
(``NFSRDMA_CALL_BATCH=1``) and without, and against another checkout (``--base``, e.g. the
start point), interleaved: one child process per measurement, arms in turn, ``--rounds`` times.

Our server and our client in one process on the in-process verbs provider, plain RPC-over-RDMA
v1, ``--stats`` stat calls, 32 in flight (handles cached first). The in-process provider's
doorbell is a counter, not a system call: the CPU figures show what holding costs in Python,
not what it saves on a device (the test bed: ``client.py``). Per arm: the median and range of
CPU µs per stat (client and server together), doorbells and Sends per stat of the client's
queue pair. The last line is ``doorbells_per_stat=<batched> cpu_ratio=<batched / off>``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


async def measure(n: int) -> dict[str, float]:
    """One arm in this process: the nfsrdma first on ``sys.path``, the environment as given."""
    from stat_rig import FILES, stat_rig  # bench/, this script's directory

    from nfsrdma.client.fs import gather_limited

    async with stat_rig(False) as (fs, conns):

        def counts() -> tuple[int, int]:
            qps = [getattr(c.qp, "counts", {}) for c in conns]
            return sum(q.get("doorbells", 0) for q in qps), sum(c.stats["sends"] for c in conns)

        names = [f"f{i % FILES:04d}" for i in range(n)]
        doorbells, sends = counts()
        cpu = time.process_time()
        await gather_limited([fs.stat(x) for x in names], 32)
        cpu = time.process_time() - cpu
        doorbells2, sends2 = counts()
    return {
        "us": cpu / n * 1e6,
        "doorbells": (doorbells2 - doorbells) / n,
        "sends": (sends2 - sends) / n,
    }


def child(tree: str, n: int) -> None:
    import asyncio
    import logging

    sys.path.insert(0, tree)
    logging.disable(logging.INFO)
    print(json.dumps(asyncio.run(measure(n))), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", type=int, default=3000, help="stat calls per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", help="another checkout to measure as an arm (e.g. ../base)")
    parser.add_argument(
        "--base-batch", choices=("0", "1"), default="0", help="NFSRDMA_CALL_BATCH of --base"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # tree: measure once, print JSON
    args = parser.parse_args()
    if args.child:
        child(args.child, args.stats)
        return 0
    arms: dict[str, tuple[str, str]] = {}  # name: (tree, NFSRDMA_CALL_BATCH)
    if args.base:
        arms["base"] = (str(Path(args.base).resolve()), args.base_batch)
    arms["off"] = (str(HERE), "0")
    arms["batched"] = (str(HERE), "1")
    got: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, (tree, batch) in arms.items():
            env = {**os.environ, "NFSRDMA_CALL_BATCH": batch, "PYTHONPATH": tree}
            cmd = [sys.executable, __file__, "--child", tree, "--stats", str(args.stats)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"plain stat, v1, 32 in flight, {args.stats} calls, {args.rounds} rounds interleaved "
        "(host, in-process): median (min-max)"
    )
    print(f"{'':8} {'CPU us/stat':>22} {'doorbells/stat':>15} {'Sends/stat':>11}")
    medians: dict[str, dict[str, float]] = {}
    for name, runs in got.items():
        us = [r["us"] for r in runs]
        medians[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        m = medians[name]
        spread = f"{m['us']:.0f} ({min(us):.0f}-{max(us):.0f})"
        print(f"{name:8} {spread:>22} {m['doorbells']:15.3f} {m['sends']:11.3f}")
    on, off = medians["batched"], medians["off"]
    print(f"doorbells_per_stat={on['doorbells']:.3f} cpu_ratio={on['us'] / off['us']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
