"""What the server statistics cost on the COMPOUND path: one operation's recording (the clock
read and ``OpTable.record``) and one COMPOUND's set-up (the transport's table), in nanoseconds
of CPU, best of ``--repeat``. Compare with ``bench/server_compound.py`` (microseconds per
COMPOUND of three operations plus SEQUENCE). Last line: ``record_ns=… per_compound_ns=…``."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.stats.core import ServerStats
from nfsrdma.xdr.gen import nfs4


def per_op(n: int) -> float:
    table = ServerStats().table("tcp")
    monotonic = time.monotonic
    ops = [nfs4.OP_SEQUENCE, nfs4.OP_PUTFH, nfs4.OP_GETATTR, nfs4.OP_READ] * (n // 4)
    t0 = time.process_time_ns()
    last = monotonic()
    for op in ops:
        now = monotonic()
        table.record(op, 0, now - last)
        last = now
    return (time.process_time_ns() - t0) / len(ops)


def per_compound(n: int) -> float:
    stats = ServerStats()
    t0 = time.process_time_ns()
    for _ in range(n):
        table = stats.table("tcp")
        table.compounds += 1
    return (time.process_time_ns() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=400000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rec = min(per_op(args.count) for _ in range(args.repeat))
    comp = min(per_compound(args.count) for _ in range(args.repeat))
    print(f"per operation: {rec:.0f} ns (clock read + record); per COMPOUND: {comp:.0f} ns")
    four = comp + 4 * rec
    print(f"a SEQUENCE+PUTFH+GETATTR+READ COMPOUND: {four / 1000:.2f} us of statistics")
    print(f"record_ns={rec:.0f} per_compound_ns={comp:.0f} four_op_compound_us={four / 1000:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
