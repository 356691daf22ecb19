"""Our server against knfsd over RDMA on rxe, with the Linux client (issue 5), in one boot,
and ib_read_bw / ib_write_bw as the ceiling.

Sequential 64 MiB write and read, 4 KiB random reads for 10 s (and the metadata figure for
information). Last line ``seq_write=… seq_read=… rand_read=… read_of_ceiling=…`` (ours /
knfsd, and ours / ib_read_bw; target at this stage: sequential ratios >= 0.8). Run on the
host: it boots the test bed itself."""

from __future__ import annotations

import argparse
import sys

from nfsbench import (
    arguments,
    forwarded,
    measure_ours,
    ratio_line,
    run_in_testbed,
    step,
    table,
)

from nfsrdma.testbed.helpers import Knfsd, artefact_dir, export_dir, in_testbed, testbed_addr
from nfsrdma.testbed.ours import our_server
from nfsrdma.testbed.perftest import loopback_bw


def ceiling(tool: str, size_mib: int) -> float:
    step(f"{tool} on rxe0")
    result = loopback_bw(
        tool, log_dir=artefact_dir(f"ceiling-{tool}"), size=65536, iterations=size_mib * 16
    )
    return result.average_mb_s


def in_guest(args: argparse.Namespace) -> int:
    knfsd = Knfsd(addr=testbed_addr(), export=export_dir())
    read_bw = ceiling("ib_read_bw", args.size_mib)
    write_bw = ceiling("ib_write_bw", args.size_mib)
    with our_server(
        "bench-rdma", extra=tuple(args.serve_arg), root_squash=args.root_squash
    ) as ours:
        theirs, mine, probe = measure_ours(knfsd.server("rdma"), ours, "rdma", args)
    print(f"rxe0 ceiling: ib_write_bw {write_bw:.1f} MB/s, ib_read_bw {read_bw:.1f} MB/s")
    table([("knfsd (RDMA 20049)", theirs), ("nfsrdma serve (RDMA 20050)", mine)])
    print(probe.line())
    print(ratio_line(mine, theirs, read_of_ceiling=mine.seq_read / read_bw), flush=True)
    return 0


def main() -> int:
    args = arguments(__doc__ or "").parse_args()
    return in_guest(args) if in_testbed() else run_in_testbed(__file__, args, forwarded(args))


if __name__ == "__main__":
    sys.exit(main())
