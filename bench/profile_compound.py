"""Profile the server's COMPOUND path with cProfile: the same in-process path as
``bench/server_cpu.py`` (record parser, RPC dispatch, COMPOUND, local VFS, reply framing).

Usage: ``python bench/profile_compound.py [read|getattr|openclose|meta] [--count N] [--top N]
[--out FILE]``. ``openclose`` profiles the pair of ``bench/server_cpu.py``: SEQUENCE+PUTFH+OPEN
(no create, a second owner)+GETFH, then SEQUENCE+PUTFH+CLOSE of that open (``--count`` pairs;
the figure is per COMPOUND, and the client side's encoding and decoding of the pair is profiled
out). ``meta`` profiles ``server_cpu.py``'s meta shape (the Linux client's create, close, stat
and remove of a file: four COMPOUNDs; ``--count`` files, the figure per COMPOUND).
Prints the functions by own time (tottime) and by cumulative time; ``--out`` also saves the
raw profile (for ``python -m pstats`` or snakeviz). Note that a compiled (mypyc) module's
functions do not appear as Python frames: profile the pure build (``NFSRDMA_PURE=1``) to see
them. Last line: ``profiled=<shape> count=<N> us_per_compound=<N.NN>`` (profiler overhead
included).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from server_compound import Bench, _op, open_op
from server_cpu import LINUX_BITMAP, NO_CREATE, MetaFiles, Served, marked

from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader


async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        try:
            root_fh = await bench.mount()
            served = Served(bench.server)
            fh, stateid = await bench.create_file(root_fh)
            if args.shape == "meta":
                us, prof = await _meta(MetaFiles(bench, served, root_fh), args.count)
                args.count *= 4
                return _report(prof, us, args)
            if args.shape == "openclose":
                us, prof = await _openclose(bench, served, root_fh, fh, args.count)
                args.count *= 2
                return _report(prof, us, args)
            if args.shape == "read":
                third = _op(nfs4.OP_READ, nfs4.READ4args(stateid, 0, 4096))
            else:
                third = _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP))
            requests = [
                marked(
                    bench.request(
                        [bench.sequence(), _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)), third]
                    )
                )
                for _ in range(args.count)
            ]
            prof = cProfile.Profile()
            t0 = time.process_time_ns()
            prof.enable()
            for rec in requests:
                await served.send(rec)
            prof.disable()
            us = (time.process_time_ns() - t0) / args.count / 1000
        finally:
            bench.server.close()
    return _report(prof, us, args)


async def _openclose(
    bench: Bench, served: Served, root_fh: bytes, fh: bytes, count: int
) -> tuple[float, cProfile.Profile]:
    owner = nfs4.open_owner4(1, b"pair")

    def open_req() -> bytes:
        return marked(
            bench.request(
                [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(root_fh)),
                    open_op(b"file", owner, nfs4.OPEN4_SHARE_ACCESS_READ, NO_CREATE),
                    _op(nfs4.OP_GETFH),
                ]
            )
        )

    def close_req(sid: nfs4.stateid4) -> bytes:
        return marked(
            bench.request(
                [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sid)),
                ]
            )
        )

    prof = cProfile.Profile()
    total = 0
    for _ in range(count):
        o = open_req()
        t0 = time.process_time_ns()
        prof.enable()
        await served.send(o)
        prof.disable()
        total += time.process_time_ns() - t0
        if served.last_status() != nfs4.NFS4_OK:
            raise RuntimeError("OPEN failed")
        reply = b"".join(bytes(p) for p in served.transport.last)[4:]
        res, _ = nfs4.dec_COMPOUND4res(Reader(reply), 24)
        c = close_req(res.resarray[2].value.value.stateid)
        t0 = time.process_time_ns()
        prof.enable()
        await served.send(c)
        prof.disable()
        total += time.process_time_ns() - t0
        if served.last_status() != nfs4.NFS4_OK:
            raise RuntimeError("CLOSE failed")
    return total / count / 2 / 1000, prof


async def _meta(meta: MetaFiles, count: int) -> tuple[float, cProfile.Profile]:
    prof = cProfile.Profile()

    async def send(request: bytes, what: str) -> int:
        t0 = time.process_time_ns()
        prof.enable()
        await meta.served.send(request)
        prof.disable()
        return time.process_time_ns() - t0

    total = 0
    for i in range(count):
        total += await meta.one_file(b"p%d" % i, send)
    return total / count / 4 / 1000, prof


def _report(prof: cProfile.Profile, us: float, args: argparse.Namespace) -> int:
    stats = pstats.Stats(prof)
    if args.out:
        stats.dump_stats(args.out)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    print(f"profiled={args.shape} count={args.count} us_per_compound={us:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "shape", nargs="?", choices=("read", "getattr", "openclose", "meta"), default="read"
    )
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default="")
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
