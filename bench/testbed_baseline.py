"""Baseline peers in the test-bed VM, one boot: the RDMA ceiling on rxe0 (perftest
``ib_write_bw`` / ``ib_read_bw`` in loopback) and knfsd with the Linux client over RDMA and
over TCP (sequential 64 MiB write, then read after dropping caches).

Later benchmarks divide by these. Absolute numbers under qemu TCG mean little; ratios
within one boot do. MB/s here is 10**6 bytes per second (perftest's MiB/s converted).

On the host this boots the test bed (``nfsrdma testbed run --knfsd``) and runs itself inside.
Prints a table; the last line is
``ceiling_read_MBps=… knfsd_rdma_read_MBps=… ceiling_write_MBps=… knfsd_rdma_write_MBps=…
knfsd_tcp_read_MBps=… knfsd_tcp_write_MBps=…``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsbench import sequential

from nfsrdma.testbed.helpers import (
    Knfsd,
    Proto,
    artefact_dir,
    export_dir,
    in_testbed,
    mount_nfs,
    out_dir,
    testbed_addr,
)
from nfsrdma.testbed.perftest import loopback_bw

CHUNK = 1 << 20
MOUNT_ROOT = Path("/tmp/bench-mnt")


def best(samples: list[float]) -> float:
    return statistics.median(samples)


def perftest_mb_s(tool: str, size_mib: int, repeat: int) -> float:
    logs = artefact_dir(f"baseline-{tool}")
    iterations = size_mib * CHUNK // 65536
    return best(
        [
            loopback_bw(tool, log_dir=logs, size=65536, iterations=iterations).average_mb_s
            for _ in range(repeat)
        ]
    )


def nfs_write_read_mb_s(knfsd: Knfsd, proto: Proto, size_mib: int) -> tuple[float, float]:
    """Sequential write (with fsync) then read (after dropping caches) of one file."""
    with mount_nfs(knfsd.server(proto), MOUNT_ROOT / proto) as mnt:
        figures = sequential(mnt.mountpoint, size_mib)
        (mnt.mountpoint / "seq.bin").unlink()
    return figures


def nfs_mb_s(knfsd: Knfsd, proto: Proto, size_mib: int, repeat: int) -> tuple[float, float]:
    runs = [nfs_write_read_mb_s(knfsd, proto, size_mib) for _ in range(repeat)]
    return best([w for w, _ in runs]), best([r for _, r in runs])


def step(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def in_guest(args: argparse.Namespace) -> int:
    knfsd = Knfsd(addr=testbed_addr(), export=export_dir())
    rows: list[tuple[str, float, float]] = []
    step("ib_write_bw / ib_read_bw on rxe0")
    ceiling_w = perftest_mb_s("ib_write_bw", args.size_mib, args.repeat)
    ceiling_r = perftest_mb_s("ib_read_bw", args.size_mib, args.repeat)
    rows.append(("rxe0 perftest loopback (ceiling)", ceiling_w, ceiling_r))
    step("knfsd over RDMA")
    rdma_w, rdma_r = nfs_mb_s(knfsd, "rdma", args.size_mib, args.repeat)
    rows.append(("knfsd + Linux client, RDMA 20049", rdma_w, rdma_r))
    step("knfsd over TCP")
    tcp_w, tcp_r = nfs_mb_s(knfsd, "tcp", args.size_mib, args.repeat)
    rows.append(("knfsd + Linux client, TCP 2049", tcp_w, tcp_r))

    figures = {
        "ceiling_read_MBps": ceiling_r,
        "knfsd_rdma_read_MBps": rdma_r,
        "ceiling_write_MBps": ceiling_w,
        "knfsd_rdma_write_MBps": rdma_w,
        "knfsd_tcp_read_MBps": tcp_r,
        "knfsd_tcp_write_MBps": tcp_w,
    }
    (out_dir() / "baseline.json").write_text(
        json.dumps({**figures, "size_mib": args.size_mib, "repeat": args.repeat}, indent=2) + "\n"
    )
    width = max(len(r[0]) for r in rows)
    print(f"test-bed baseline: {args.size_mib} MiB sequential, qemu TCG, MB/s = 10^6 B/s")
    print(f"{'peer'.ljust(width)}  {'write MB/s':>10}  {'read MB/s':>10}")
    for name, w, r in rows:
        print(f"{name.ljust(width)}  {w:10.1f}  {r:10.1f}")
    print(" ".join(f"{k}={v:.1f}" for k, v in figures.items()), flush=True)
    return 0


def on_host(args: argparse.Namespace) -> int:
    """Boot the test bed once and run this file inside it."""
    here = Path(__file__).resolve()
    argv = [
        sys.executable, "-m", "nfsrdma.testbed", "run", "--knfsd", "--out", str(args.out),
        "--timeout", str(args.timeout),
        "--", sys.executable, str(here), "--size-mib", str(args.size_mib), "--repeat", str(args.repeat),
    ]  # fmt: skip
    return subprocess.call(argv, cwd=here.parent.parent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64, help="bytes per run (default: 64 MiB)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure, median (default 1)")
    parser.add_argument("--out", type=Path, default=Path("testbed-out/baseline"), help="host only")
    parser.add_argument("--timeout", type=float, default=1200.0, help="host only: VM time limit")
    args = parser.parse_args()
    return in_guest(args) if in_testbed() else on_host(args)


if __name__ == "__main__":
    sys.exit(main())
