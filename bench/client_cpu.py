"""Our client's CPU per plain ``stat`` (one COMPOUND per call: SEQUENCE, PUTFH, LOOKUP, GETFH,
GETATTR), 32 in flight, against our server running in ANOTHER process (``nfsrdma serve`` on a
temporary export, TCP over loopback), so the client's CPU (``time.process_time`` of this
process) is separable from the server's.

``--here`` runs the client in this process instead of a child (one round, the first tree being
this one), so that ``bench/tcg_cpu.py`` can run it under qemu's emulator while the server, a
child, runs natively.

``--tree DIR`` runs the client code of another checkout (e.g. the start point) with the same
server (this script's tree), so A and B are compared in one run: ``--tree A --tree B`` alternates
them ``--rounds`` times. ``--profile FILE`` writes a cProfile of one measured round of the first
tree instead (own and cumulative time, printed by layer).

The last line is ``us_per_stat=<first tree, median> [b_us_per_stat=<second> ratio=<b/first>]``."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(export: Path, state: Path, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    cmd = [sys.executable, "-m", "nfsrdma", "serve", str(export), "--bind", "127.0.0.1"]
    cmd += ["--tcp-port", str(port), "--no-rdma", "--no-root-squash", "--state-dir", str(state)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"nfsrdma serve exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("nfsrdma serve did not start listening")


CHILD = r"""
import asyncio, json, logging, sys, time
logging.disable(logging.INFO)
import nfsrdma.client as nc
from nfsrdma.client.fs import gather_limited

port, n, files, prof = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

async def main():
    async with nc.connect(f"nfs://127.0.0.1:{port}/", uid=0, gid=0) as fs:
        names = [f"f{i % files:04d}" for i in range(n)]
        await gather_limited([fs.stat(x) for x in names[:files]], 32)  # warm
        if prof:
            import cProfile
            p = cProfile.Profile(time.process_time)  # CPU, not wall (preemption)
            p.enable()
        cpu, wall = time.process_time(), time.perf_counter()
        res = await gather_limited([fs.stat(x) for x in names], 32)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if prof:
            p.disable()
            p.dump_stats(prof)
        assert all(s.is_file() for s in res)
    print(json.dumps({"us": cpu / n * 1e6, "rate": n / wall}))

asyncio.run(main())
"""


def child(tree: Path, port: int, n: int, files: int, prof: str = "") -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(port), str(n), str(files), prof],
        env=env,
        cwd=str(tree),
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def here(port: int, n: int, files: int) -> dict[str, float]:
    """The child's client, run in this process (its JSON line is the result)."""
    sys.path.insert(0, str(HERE))
    out = io.StringIO()
    argv, sys.argv = sys.argv, ["client", str(port), str(n), str(files), ""]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(CHILD, "<client>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = argv
    result: dict[str, float] = json.loads(out.getvalue().strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path, help="client checkout (repeat)")
    parser.add_argument("--stats", type=int, default=3000, help="stat calls per round")
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default="", help="cProfile output of one round")
    parser.add_argument("--here", action="store_true", help="the client in this process")
    args = parser.parse_args()
    trees: list[Path] = [t.resolve() for t in args.tree or [HERE]]
    with tempfile.TemporaryDirectory(prefix="bench-clientcpu-") as top:
        export, state = Path(top) / "export", Path(top) / "state"
        export.mkdir()
        for i in range(args.files):
            (export / f"f{i:04d}").write_bytes(b"x")
        port = _free_port()
        server = serve(export, state, port)
        try:
            if args.here:
                r = here(port, args.stats, args.files)
                print(f"us_per_stat={r['us']:.1f} stat_per_s={r['rate']:.0f}")
                return 0
            if args.profile:
                r = child(trees[0], port, args.stats, args.files, args.profile)
                print(f"profiled={args.profile} us_per_stat={r['us']:.1f}")
                return 0
            runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
            for rnd in range(args.rounds):
                for t in trees if rnd % 2 == 0 else trees[::-1]:
                    r = child(t, port, args.stats, args.files)
                    runs[t].append(r)
                    print(f"round {rnd} {t}: {r['us']:.1f} us/stat {r['rate']:.0f} stat/s")
        finally:
            server.terminate()
            server.wait(10)
    med = {t: statistics.median(r["us"] for r in runs[t]) for t in trees}
    rate = {t: statistics.median(r["rate"] for r in runs[t]) for t in trees}
    for t in trees:
        print(f"{t}: median {med[t]:.1f} us/stat, {rate[t]:.0f} stat/s")
    last = f"us_per_stat={med[trees[0]]:.1f}"
    if len(trees) > 1:
        b = med[trees[1]]
        last += f" b_us_per_stat={b:.1f} ratio={b / med[trees[0]]:.2f}"
    print(last, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
