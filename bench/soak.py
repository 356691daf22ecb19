"""Soak: 8 clients x 64 slots of mixed operations against our server over TCP for
``--minutes`` (issue 9, "Reliability figures").

The server is ``python -m nfsrdma serve`` in its own process on 127.0.0.1 (its RSS and open
descriptors are read from /proc). Each client (``nfsrdma.connect``, ``--slots`` session slots)
runs as many workers as it has slots; each worker loops over create, write, read, stat,
rename, remove and lock/unlock in its own directory, and checks what it reads back. Any
exception or wrong content is an error (target 0). RSS and descriptors are sampled once the
clients are connected and warmed up (start), every ``--sample`` seconds, and at the end
with the same clients still connected (target: flat); descriptors again after they closed.

Last line: ``ops_per_s=… errors=… rss_start_mib=… rss_end_mib=… fds_start=… fds_end=…``. With
``--check`` the exit status is 1 when a target is missed."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from reliability import ServerProcess, open_fds, rss_kib, step

import nfsrdma
from nfsrdma.client import NfsClient

KINDS = ("create", "write", "read", "stat", "rename", "remove", "lock")


class Worker:
    def __init__(self, fs: NfsClient, home: str, rng: random.Random) -> None:
        self.fs = fs
        self.home = home
        self.rng = rng
        self.files: dict[str, bytes] = {}  # name -> content (the model)
        self.n = 0

    def _new_name(self) -> str:
        self.n += 1
        return f"{self.home}/f{self.n}"

    async def step(self, kind: str) -> None:
        fs, rng = self.fs, self.rng
        if not self.files or kind == "create" or (kind == "remove" and len(self.files) < 2):
            name = self._new_name()
            data = rng.randbytes(rng.choice([0, 100, 4096, 20000]))
            await fs.write_bytes(name, data)
            self.files[name] = data
            return
        name = rng.choice(list(self.files))
        if kind == "write":
            data = rng.randbytes(rng.choice([1, 512, 8192, 65536]))
            async with fs.open(name, "wb") as f:
                await f.write(data)
            self.files[name] = data
        elif kind == "read":
            got = await fs.read_bytes(name)
            if got != self.files[name]:
                raise AssertionError(f"{name}: read {len(got)} bytes, not what was written")
        elif kind == "stat":
            st = await fs.stat(name)
            if st.st_size != len(self.files[name]):
                raise AssertionError(f"{name}: size {st.st_size}, wrote {len(self.files[name])}")
        elif kind == "rename":
            new = self._new_name()
            await fs.rename(name, new)
            self.files[new] = self.files.pop(name)
        elif kind == "remove":
            await fs.remove(name)
            del self.files[name]
        else:  # lock
            async with fs.open(name, "r+b") as f:
                await f.lock(0, 16)
                await f.unlock(0, 16)


async def soak(args: argparse.Namespace) -> int:
    scratch = Path(tempfile.mkdtemp(prefix="soak-", dir=args.dir))
    export = scratch / "export"
    export.mkdir()
    server = ServerProcess(export, scratch, ["--no-root-squash", "--slots", str(args.slots)])
    server.nofile = args.server_nofile
    server.start()
    pid = server.pid
    counts: Counter[str] = Counter()
    errors: list[str] = []
    samples: list[tuple[float, int, int]] = []
    try:
        fds_idle = open_fds(pid)
        clients = [
            await nfsrdma.connect(server.url, uid=0, gid=0, slots=args.slots)
            for _ in range(args.clients)
        ]
        workers: list[Worker] = []
        for c, fs in enumerate(clients):
            await fs.mkdir(f"c{c}")
            for w in range(args.slots):
                home = f"c{c}/w{w}"
                await fs.mkdir(home)
                workers.append(Worker(fs, home, random.Random(args.seed * 100_000 + c * 1000 + w)))
        stop = asyncio.Event()

        async def run(w: Worker) -> None:
            while not stop.is_set():
                kind = w.rng.choice(KINDS)
                try:
                    await w.step(kind)
                    counts[kind] += 1
                except Exception as e:
                    errors.append(f"{w.home} {kind}: {type(e).__name__}: {e}")
                    counts["error"] += 1
                    if len(errors) > 1000:
                        stop.set()

        # Warm up: caches, thread pool, reply caches; then the measured soak.
        tasks = [asyncio.ensure_future(run(w)) for w in workers]
        await asyncio.sleep(args.warmup)
        warm = sum(counts.values())
        t0 = time.perf_counter()
        start = (rss_kib(pid), open_fds(pid))
        samples.append((0.0, *start))
        step(f"warm ({warm} operations): server RSS {start[0] // 1024} MiB, {start[1]} fds")
        end_at = t0 + args.minutes * 60
        while time.perf_counter() < end_at and not stop.is_set():
            await asyncio.sleep(min(args.sample, max(0.0, end_at - time.perf_counter())))
            el = time.perf_counter() - t0
            samples.append((el, rss_kib(pid), open_fds(pid)))
            done = sum(counts.values()) - warm
            step(f"{el:.0f} s: {done / el:.0f} ops/s, errors {len(errors)}, "
                 f"RSS {samples[-1][1] // 1024} MiB, fds {samples[-1][2]}")  # fmt: skip
        measured = sum(counts.values()) - warm
        elapsed = time.perf_counter() - t0
        end = (rss_kib(pid), open_fds(pid))
        stop.set()
        await asyncio.gather(*tasks)
        for fs in clients:
            await fs.aclose()
        deadline = time.monotonic() + 10
        fds_after = open_fds(pid)
        while fds_after > fds_idle and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            fds_after = open_fds(pid)
        alive = server.alive()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    for e in errors[:10]:
        print(f"ERROR {e}")
    print(f"{args.clients} clients x {args.slots} slots, {elapsed:.0f} s measured: {measured} "
          f"operations {dict(counts)}")  # fmt: skip
    print("server RSS MiB / fds over time: "
          + ", ".join(f"{t:.0f}s {r // 1024}/{f}" for t, r, f in samples))  # fmt: skip
    print(f"server descriptor limit {args.server_nofile} (O_PATH cache bound "
          f"{max(64, min(4096, args.server_nofile // 4))})")  # fmt: skip
    print(f"server fds: {fds_idle} before the clients, {start[1]} at start, {end[1]} at end, "
          f"{fds_after} after they closed; server alive at the end: {alive}")  # fmt: skip
    print(
        f"ops_per_s={measured / elapsed:.0f} errors={len(errors)} "
        f"rss_start_mib={start[0] / 1024:.1f} rss_end_mib={end[0] / 1024:.1f} "
        f"fds_start={start[1]} fds_end={end[1]}"
    )
    missed = bool(errors) or not alive
    return 1 if missed and args.check else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample", type=float, default=15.0, help="seconds between samples")
    ap.add_argument(
        "--dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where the export lives (tmpfs by default, as in the test bed: the disk's fsync "
        "is not what is measured)",
    )
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring")
    ap.add_argument(
        "--server-nofile",
        type=int,
        default=4096,
        help="the server's descriptor limit; its descriptor cache holds a quarter of it, so the "
        "cache is full early and descriptors beyond it would be a leak",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
