"""Our server against NFS-Ganesha, a userspace NFSv4.1 server written in C, and Ganesha against
knfsd, all over TCP with the Linux client, in one boot of the test bed.

The same phases as ``server_tcp.py`` (sequential write and read, 4 KiB random reads, create +
stat + remove), each server on a tmpfs of its own. Ganesha (Debian's ``nfs-ganesha``, its VFS
back end, TCP only) runs in the guest beside knfsd and our server, with its worker threads free
to use both of the guest's CPUs, as knfsd's are. It is the peer to compare with under the test
bed's emulation: both it and our server run in user space and cross into the kernel for every
request, which knfsd does not. Prints two tables; last line ``seq_write=… seq_read=…
rand_read=… meta=…`` (ours / Ganesha), then ``ganesha_vs_knfsd_rand_read=…
ganesha_vs_knfsd_meta=…``. Run on the host: it boots the test bed itself."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nfsbench import (
    Figures,
    arguments,
    forwarded,
    measure_both,
    measure_ours,
    ratio_line,
    run_in_testbed,
    table,
)

from nfsrdma.testbed.helpers import Knfsd, NfsServer, export_dir, in_testbed, testbed_addr
from nfsrdma.testbed.ours import our_server
from tests.unit.client import ganesha as g

GANESHA_PORT = 2051  # knfsd has 2049, our server 2050
PSEUDO = "/ganesha"


@contextlib.contextmanager
def ganesha_server() -> Iterator[NfsServer]:
    """Ganesha serving a fresh tmpfs over TCP on the test bed's address."""
    why = g.available()
    if why is not None:
        raise SystemExit(f"server_peer: {why}")
    with tempfile.TemporaryDirectory(prefix="bench-ganesha-") as top:
        export = Path(top) / "export"
        export.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(export)], check=True
        )
        server = g.Ganesha(Path(top) / "work", GANESHA_PORT, PSEUDO, export, bind=testbed_addr())
        try:
            server.start()
            yield NfsServer(testbed_addr(), GANESHA_PORT, "tcp", PSEUDO)
        finally:
            server.stop()
            subprocess.run(["umount", "-l", str(export)], check=False)


def in_guest(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SystemExit("server_peer: run in the test bed (as root)")
    knfsd = Knfsd(addr=testbed_addr(), export=export_dir()).server("tcp")
    with (
        ganesha_server() as ganesha,
        our_server(
            "bench-peer", rdma=False, extra=tuple(args.serve_arg), root_squash=args.root_squash
        ) as ours,
    ):
        theirs, mine, probe = measure_ours(ganesha, ours, "tcp", args)
        kernel, peer = measure_both(knfsd, ganesha, args)
    table([("NFS-Ganesha (TCP 2051)", theirs), ("nfsrdma serve (TCP 2050)", mine)])
    table([("knfsd (TCP 2049)", kernel), ("NFS-Ganesha (TCP 2051)", peer)])
    print(probe.line())
    print(ratio_line(mine, theirs, **_peer_ratios(peer, kernel)), flush=True)
    return 0


def _peer_ratios(peer: Figures, kernel: Figures) -> dict[str, float]:
    return {
        "ganesha_vs_knfsd_rand_read": peer.rand_read / kernel.rand_read,
        "ganesha_vs_knfsd_meta": peer.meta / kernel.meta,
    }


def main() -> int:
    args = arguments(__doc__ or "").parse_args()
    return in_guest(args) if in_testbed() else run_in_testbed(__file__, args, forwarded(args))


if __name__ == "__main__":
    sys.exit(main())
