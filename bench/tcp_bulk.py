"""CPU per MiB of large READs and WRITEs over loopback TCP: our client against our server.

The server (``NFSServer``, TCP on 127.0.0.1, a temporary export) runs in a process of its own
and its CPU time is read from ``/proc/PID/task/*/schedstat`` (every thread: large WRITEs are written from the thread
pool); the client runs in this process (``time.process_time``). A file of ``--size-mib`` MiB is
written with one ``write`` call (1 MiB WRITEs, pipelined over the session's slots; the close
COMMITs) and read back with one ``readinto`` call (1 MiB READs), ``--repeat`` times; the medians
are kept. Both sides use uvloop when installed (``--loop asyncio``: the standard loop).

Figures, in µs of CPU per MiB moved (so per 1 MiB COMPOUND): ``write_server`` (the server
receiving the WRITEs: record receive, decode, ``pwrite``), ``read_client`` (our client receiving
the READ replies), and the other two sides for reference; then ``null_server_us`` and
``null_client_us``: µs of CPU per NFS NULL call, ``--nulls`` of them with 64 in flight on one
connection of their own (small records, several per receive: the path that must not get
slower). Last line: ``write_server_us=… read_client_us=… read_server_us=… write_client_us=…
null_server_us=… null_client_us=… loop=…``.

A/B: ``--trees A,B --rounds N`` runs this script for each tree in turn (``PYTHONPATH`` set to
the tree), N rounds alternated, and prints each tree's medians and B/A; last line
``write_server_ratio=… read_client_ratio=… … null_client_ratio=…`` (B/A:
below 1 means B spends less CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

KEYS = (
    "write_server_us",
    "read_client_us",
    "read_server_us",
    "write_client_us",
    "null_server_us",
    "null_client_us",
)
NFS_PROGRAM, NFS_V4 = 100003, 4


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of ``pid`` (schedstat: nanoseconds, unlike the ticks
    of /proc/PID/stat); the server's threads (loop, thread pool) outlive the measures."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _run(main: object, loop: str) -> object:
    if loop == "asyncio":
        return asyncio.run(main)  # type: ignore[arg-type]
    from nfsrdma.aio import run

    return run(main)  # type: ignore[arg-type]


# -- the server process ----------------------------------------------------------------------
def serve(export: str, state: str, loop: str) -> None:
    from nfsrdma.server import NFSServer

    async def main() -> None:
        server = NFSServer(export, bind="127.0.0.1", tcp_port=0, root_squash=False, state_dir=state)
        await server.start()
        print(server.tcp_port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
        await server.close()

    _run(main(), loop)


# -- the client (this process) ---------------------------------------------------------------
async def transfer(
    port: int, server_pid: int, size: int, repeat: int, nulls: int
) -> dict[str, float]:
    import nfsrdma.client as nc

    data = memoryview(os.urandom(size))
    sink = memoryview(bytearray(size))
    runs: dict[str, list[float]] = {k: [] for k in KEYS}
    mib = size / (1 << 20)
    async with nc.connect(f"nfs://127.0.0.1:{port}/", uid=0, gid=0) as fs:
        if fs.wsize != 1 << 20 or fs.rsize != 1 << 20:
            raise RuntimeError(f"rsize {fs.rsize} wsize {fs.wsize}: 1 MiB expected")
        for i in range(repeat + 1):  # the first round warms up
            s0, c0 = _proc_cpu_s(server_pid), time.process_time()
            async with fs.open("bulk", "wb") as f:
                await f.write(data)
            s1, c1 = _proc_cpu_s(server_pid), time.process_time()
            async with fs.open("bulk", "rb") as f:
                n = await f.readinto(sink)
            s2, c2 = _proc_cpu_s(server_pid), time.process_time()
            if n != size or sink[:64] != data[:64] or sink[-64:] != data[-64:]:
                raise RuntimeError("the file read back differs")
            if i:
                runs["write_server_us"].append((s1 - s0) / mib * 1e6)
                runs["write_client_us"].append((c1 - c0) / mib * 1e6)
                runs["read_server_us"].append((s2 - s1) / mib * 1e6)
                runs["read_client_us"].append((c2 - c1) / mib * 1e6)
        await fs.remove("bulk")
    for _ in range(repeat):
        server_us, client_us = await null_calls(port, server_pid, nulls)
        runs["null_server_us"].append(server_us)
        runs["null_client_us"].append(client_us)
    return {k: statistics.median(v) for k, v in runs.items()}


async def null_calls(port: int, server_pid: int, count: int) -> tuple[float, float]:
    """(server, client) µs of CPU per NFS NULL call, 64 in flight on one connection: small
    records, several per receive."""
    from nfsrdma.rpc.connection import RpcConnection
    from nfsrdma.transport.tcp import connect_tcp

    conn = RpcConnection(await connect_tcp("127.0.0.1", port))
    try:
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await conn.call(NFS_PROGRAM, NFS_V4, 0)

        await asyncio.gather(*[worker() for _ in range(8)])  # warm-up
        left = count
        s0, c0 = _proc_cpu_s(server_pid), time.process_time()
        await asyncio.gather(*[worker() for _ in range(64)])
        s1, c1 = _proc_cpu_s(server_pid), time.process_time()
    finally:
        conn.close()
    return (s1 - s0) / count * 1e6, (c1 - c0) / count * 1e6


def one(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-tcp-bulk-") as tmp:
        export = Path(tmp) / "export"
        export.mkdir()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(export), f"{tmp}/state", "--loop", args.loop],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdin is not None
            port = int(server.stdout.readline())
            figures = _run(
                transfer(port, server.pid, args.size_mib << 20, args.repeat, args.nulls), args.loop
            )
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(30)
    assert isinstance(figures, dict)
    print(" ".join(f"{k}={v:.1f}" for k, v in figures.items()) + f" loop={args.loop}")
    return 0


def ab(args: argparse.Namespace) -> int:
    trees = args.trees.split(",")
    got: dict[str, dict[str, list[float]]] = {t: {k: [] for k in KEYS} for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            cmd = [sys.executable, os.path.abspath(__file__), "--size-mib", str(args.size_mib)]
            cmd += ["--repeat", str(args.repeat), "--loop", args.loop, "--nulls", str(args.nulls)]
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
            last = dict(kv.split("=", 1) for kv in out.stdout.split("\n")[-2].split())
            for k in KEYS:
                got[tree][k].append(float(last[k]))
            print(f"round {r} {tree}: {out.stdout.splitlines()[-1]}", flush=True)
    med = {t: {k: statistics.median(v) for k, v in got[t].items()} for t in trees}
    for t in trees:
        print(f"{t}: " + " ".join(f"{k}={med[t][k]:.1f}" for k in KEYS))
    a, b = trees[0], trees[-1]
    print(" ".join(f"{k[:-3]}_ratio={med[b][k] / med[a][k]:.2f}" for k in KEYS))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:
        loop = sys.argv[5] if len(sys.argv) > 5 else "uvloop"
        serve(sys.argv[2], sys.argv[3], loop)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=64, help="file size (default 64)")
    ap.add_argument("--repeat", type=int, default=3, help="measured rounds per run (median)")
    ap.add_argument("--nulls", type=int, default=20000, help="NULL calls per measure")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--trees", default=None, help="A,B: source trees to compare, alternated")
    ap.add_argument("--rounds", type=int, default=3, help="with --trees: runs per tree")
    args = ap.parse_args()
    return ab(args) if args.trees else one(args)


if __name__ == "__main__":
    sys.exit(main())
