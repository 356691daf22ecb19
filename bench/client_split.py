"""Where the guest's CPU goes while our client and the Linux client stat files on knfsd.

Inside the test bed only (``nfsrdma testbed run --knfsd``): ``--files`` files are made on
knfsd's export, then, ``--rounds`` times, over RDMA and over TCP, our client's plain ``stat`` of
each (32 in flight, as ``bench/client.py``'s ``ours_stat``) and the Linux client's sequential
``os.stat`` on a fresh mount (``kernel_stat``), each phase inside ``nfsbench.CpuSplit``: the
``... cpu stat-<proto> ours|kernel:`` lines on stderr and ``artefacts/client-split/
cpu-split.jsonl`` (this process is our client in the ``ours`` phases and makes the Linux
client's system calls in the ``kernel`` ones). Prints one line a round and transport: the rates
and their ratio. To profile it, run it under ``py-spy record --nonblocking``, e.g.:

    flock /tmp/testbed.lock .venv/bin/python -m nfsrdma testbed run --knfsd --out OUT -- \\
        .venv/bin/python bench/client_split.py --files 2000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from client import _url, kernel_stat, stat_files
from nfsbench import CpuSplit

import nfsrdma.client as nc
from nfsrdma.client.fs import gather_limited
from nfsrdma.testbed.helpers import Knfsd, Proto, export_dir, in_testbed, testbed_addr


async def ours_stat(addr: str, proto: Proto, names: list[str], split: CpuSplit) -> float:
    """Our client's plain stat of ``names``, 32 in flight, inside the split; stats per second."""
    async with nc.connect(_url(addr, proto), uid=0, gid=0) as fs:
        await gather_limited([fs.stat(n) for n in names[:64]], 32)  # (connection warmed up)
        before = split.snapshot()
        t = time.perf_counter()
        await gather_limited([fs.stat(n) for n in names], 32)
        secs = time.perf_counter() - t
        split.record(f"stat-{proto}", "ours", before, split.snapshot(), len(names))
    return len(names) / secs


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000, help="files to stat")
    p.add_argument("--rounds", type=int, default=2, help="rounds of both transports")
    args = p.parse_args()
    if not in_testbed():
        print("run inside the test bed: nfsrdma testbed run --knfsd -- ...", file=sys.stderr)
        return 2
    addr = testbed_addr()
    knfsd = Knfsd(addr=addr, export=export_dir())
    top, names = stat_files(knfsd, "client-split", args.files)
    split = CpuSplit(None, "client-split")
    protos: tuple[Proto, ...] = ("rdma", "tcp")
    for r in range(args.rounds):
        for proto in protos:
            ours = asyncio.run(ours_stat(addr, proto, names, split))
            before = split.snapshot()
            kernel = kernel_stat(knfsd, proto, names)
            split.record(f"stat-{proto}", "kernel", before, split.snapshot(), len(names))
            print(
                f"round {r + 1} {proto}: ours {ours:.0f}/s kernel {kernel:.0f}/s "
                f"ratio {ours / kernel:.2f}",
                flush=True,
            )
    for f in top.iterdir():
        f.unlink()
    top.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
