"""One client's READDIRs of a large directory against another client's small COMPOUNDs, on
the host: does a long listing keep the server's event loop from everyone else?

Our server runs in a process of its own (TCP on 127.0.0.1, a temporary export holding a
directory of ``--entries`` files). Client A, in a second process, lists that directory over and
over, as ``ls -l`` through the Linux client does: READDIR pages of ``--maxcount`` (1 MiB, what
the Linux client asks for) with the Linux client's readdirplus attributes. Client B, in this
process, sends PUTROOTFH+GETATTR one at a time and times each round trip, first with A idle,
then for ``--seconds`` while A lists. This is done for each ``--inline`` setting of the
server's ``readdir_inline`` (entries a READDIR lists on the event loop before the rest goes to
the thread pool): ``1000000000`` lists everything on the loop, as before issue 12's
``readdirpool`` change; ``64`` is the default.

A's listing rate is measured alone (for ``--seconds``, B quiet) and while B probes. Last line:
``getattr_p99_ms_idle=…``, then for every setting ``getattr_p99_ms_<inline>=…
getattr_max_ms_<inline>=… entries_per_s_<inline>=… alone_entries_per_s_<inline>=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.tcp import connect_tcp
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.nfs4_fattr import MASKS

READDIR_ATTRS = bitmap_of(
    [getattr(nfs4, f"FATTR4_{n.upper()}") for n in MASKS["linux_readdir_plus"]]
)
GETATTR_ATTRS = bitmap_of([nfs4.FATTR4_SIZE, nfs4.FATTR4_CHANGE])


def _op(num: int, args: Any = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


def serve(export: str, state: str, inline: int, pipe: Connection) -> None:
    """The server process: report the port, serve until told to stop."""

    async def main() -> None:
        server = NFSServer(
            export,
            bind="127.0.0.1",
            tcp_port=0,
            root_squash=False,
            state_dir=state,
            config=ServerConfig(readdir_inline=inline),
        )
        await server.start()
        pipe.send(server.tcp_port)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
        await server.close()

    asyncio.run(main())


async def _session(port: int, owner: bytes) -> ClientSession:
    s = ClientSession(
        lambda: connect_tcp("127.0.0.1", port), SessionOptions(backchannel=False, owner=owner)
    )
    await s.start()
    return s


def lister(port: int, maxcount: int, pipe: Connection) -> None:
    """Client A: whole listings until told to stop; reports the entries listed and the time."""

    async def main() -> None:
        s = await _session(port, b"lister")
        pipe.send("ready")
        while pipe.recv() == "go":
            pipe.send(await listings(s, maxcount, pipe))
        await s.close()

    asyncio.run(main())


async def listings(s: ClientSession, maxcount: int, pipe: Connection) -> tuple[int, float]:
    """Whole listings until ``pipe`` has a message: (entries listed, seconds)."""
    entries, t0 = 0, time.perf_counter()
    while not pipe.poll():
        cookie, verf = 0, bytes(8)
        while True:
            args = nfs4.READDIR4args(cookie, verf, maxcount, maxcount, READDIR_ATTRS)
            res = await s.compound([_op(nfs4.OP_PUTROOTFH), _op(nfs4.OP_READDIR, args)])
            assert res.status == nfs4.NFS4_OK, res.status
            resok = res.resarray[-1].value.value
            entries += len(resok.reply.entries)
            if resok.reply.eof:
                break
            cookie, verf = resok.reply.entries[-1].cookie, resok.cookieverf
    pipe.recv()  # stop
    return entries, time.perf_counter() - t0


async def getattr_times(s: ClientSession, seconds: float) -> list[float]:
    ops = [_op(nfs4.OP_PUTROOTFH), _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(GETATTR_ATTRS))]
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        res = await s.compound(ops)
        times.append(time.perf_counter() - t0)
        assert res.status == nfs4.NFS4_OK, res.status
    return times


def p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98] * 1e3


async def one_setting(
    ctx: Any, export: str, state: str, inline: int, args: argparse.Namespace
) -> dict[str, float]:
    ours, theirs = ctx.Pipe()
    server = ctx.Process(target=serve, args=(export, state, inline, theirs))
    server.start()
    port = ours.recv()
    a_pipe, a_end = ctx.Pipe()
    a = ctx.Process(target=lister, args=(port, args.maxcount, a_end))
    a.start()
    try:
        assert a_pipe.recv() == "ready"
        b = await _session(port, b"prober")
        idle = await getattr_times(b, 1.0)
        a_pipe.send("go")  # A alone
        await asyncio.sleep(args.seconds)
        a_pipe.send("stop")
        alone, alone_took = a_pipe.recv()
        a_pipe.send("go")  # A while B probes
        busy = await getattr_times(b, args.seconds)
        a_pipe.send("stop")
        entries, took = a_pipe.recv()
        a_pipe.send("done")
        await b.close()
    finally:
        a.join(30)
        ours.send("stop")
        server.join(30)
    return {
        "idle_p99": p99(idle),
        "p50": statistics.median(busy) * 1e3,
        "p99": p99(busy),
        "max": max(busy) * 1e3,
        "calls": len(busy),
        "entries_per_s": entries / took,
        "alone_per_s": alone / alone_took,
    }


async def measure(args: argparse.Namespace) -> int:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        export = os.path.join(tmp, "export")
        os.mkdir(export)
        for i in range(args.entries):
            with open(os.path.join(export, f"file-{i:06d}"), "wb"):
                pass
        results: dict[int, dict[str, float]] = {}
        for inline in args.inline:
            state = os.path.join(tmp, f"state-{inline}")
            results[inline] = r = await one_setting(ctx, export, state, inline, args)
            print(
                f"readdir_inline={inline}: GETATTR round trip while A lists: median "
                f"{r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, max {r['max']:.1f} ms "
                f"({r['calls']:.0f} calls; p99 with A idle {r['idle_p99']:.2f} ms); "
                f"A listed {r['entries_per_s']:.0f} entries/s ({r['alone_per_s']:.0f} alone)"
            )
    last = [f"getattr_p99_ms_idle={statistics.median(r['idle_p99'] for r in results.values()):.2f}"]
    for inline, r in results.items():
        last += [
            f"getattr_p99_ms_{inline}={r['p99']:.2f}",
            f"getattr_max_ms_{inline}={r['max']:.1f}",
            f"entries_per_s_{inline}={r['entries_per_s']:.0f}",
            f"alone_entries_per_s_{inline}={r['alone_per_s']:.0f}",
        ]
    print(" ".join(last))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=5000, help="files in the directory")
    ap.add_argument("--maxcount", type=int, default=1 << 20, help="READDIR maxcount (1 MiB)")
    ap.add_argument("--seconds", type=float, default=3.0, help="time B probes while A lists")
    ap.add_argument(
        "--inline",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1_000_000_000, 64],
        help="readdir_inline settings, comma-separated (default: 1000000000,64)",
    )
    return asyncio.run(measure(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
