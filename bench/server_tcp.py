"""Our server against knfsd, both over TCP, with the Linux client (issue 4), in one boot.

Sequential 64 MiB write and read, 4 KiB random reads for 10 s, create+stat+remove of 500
files. Prints a table; last line ``seq_write=… seq_read=… rand_read=… meta=…`` (ours / knfsd;
target at this stage: every ratio >= 0.5). Run on the host: it boots the test bed itself."""

from __future__ import annotations

import argparse
import sys

from nfsbench import (
    arguments,
    forwarded,
    measure_ours,
    ratio_line,
    run_in_testbed,
    table,
)

from nfsrdma.testbed.helpers import Knfsd, export_dir, in_testbed, testbed_addr
from nfsrdma.testbed.ours import our_server


def in_guest(args: argparse.Namespace) -> int:
    knfsd = Knfsd(addr=testbed_addr(), export=export_dir())
    with our_server(
        "bench-tcp", rdma=False, extra=tuple(args.serve_arg), root_squash=args.root_squash
    ) as ours:
        theirs, mine, probe = measure_ours(knfsd.server("tcp"), ours, "tcp", args)
    table([("knfsd (TCP 2049)", theirs), ("nfsrdma serve (TCP 2050)", mine)])
    print(probe.line())
    print(ratio_line(mine, theirs), flush=True)
    return 0


def main() -> int:
    args = arguments(__doc__ or "").parse_args()
    return in_guest(args) if in_testbed() else run_in_testbed(__file__, args, forwarded(args))


if __name__ == "__main__":
    sys.exit(main())
