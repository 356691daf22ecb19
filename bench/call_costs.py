"""What single calls the server makes per COMPOUND cost on this machine: an empty Python call,
a clock read, an uncontended lock, a trivial system call, a ctypes call, ``fstat``, a
non-waiting ``epoll_wait``, and a 4 KiB ``preadv``/``pread`` from a file in ``--dir`` (a tmpfs,
as the test bed's exports are), with and without one octet more (the end-of-file probe); then
what a 1 MiB WRITE's data costs: a zero-filled ``bytearray`` of 1 MiB (what a large TCP record's
buffer cost before it was reused), a 1 MiB copy in Python, and a 1 MiB ``pwritev`` over the
file's first MiB.

Run it on the host and inside the test bed to see which costs grow most there, e.g.:

    flock /tmp/testbed.lock .venv/bin/python -m nfsrdma testbed run --out /tmp/tb-costs -- \\
        sh -c 'mkdir -p /tmp/c && mount -t tmpfs tmpfs /tmp/c && \\
        .venv/bin/python bench/call_costs.py --dir /tmp/c'

Prints µs per call (wall and thread CPU), best of ``--rounds`` rounds of ``--count`` calls."""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import tempfile
import threading
import time
from collections.abc import Callable


def cases(path: str) -> dict[str, Callable[[], object]]:
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    buf = memoryview(bytearray(4096))
    octet = bytearray(1)
    ready = select.epoll(1)
    r, _ = os.pipe()
    ready.register(r, select.EPOLLIN)
    lock = threading.Lock()
    getpid = ctypes.CDLL(None).getpid
    wfd = os.open(path, os.O_WRONLY)
    mib = bytearray(os.urandom(1 << 20))
    sink = bytearray(1 << 20)

    def empty() -> None:
        pass

    def locked() -> None:
        with lock:
            pass

    return {
        "empty Python call": empty,
        "time.monotonic()": time.monotonic,
        "with lock (uncontended)": locked,
        "os.getpid() (a system call)": os.getpid,
        "ctypes getpid()": getpid,
        "os.fstat": lambda: os.fstat(fd),
        "epoll.poll(0)": lambda: ready.poll(0),
        "preadv 4 KiB": lambda: os.preadv(fd, [buf], 8192),
        "preadv 4 KiB + 1 octet (2 vectors)": lambda: os.preadv(fd, [buf, octet], 8192),
        "pread 4 KiB + 1 octet": lambda: os.pread(fd, 4097, 8192),
        "bytearray(1 MiB) (zero-filled)": lambda: bytearray(1 << 20),
        "copy of 1 MiB (slice assignment)": lambda: sink.__setitem__(slice(None), mib),
        "pwritev 1 MiB (overwrite)": lambda: os.pwritev(wfd, [mib], 0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dir", default=None, help="where the test file is made (a tmpfs)")
    p.add_argument("--count", type=int, default=2000, help="calls per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the best is kept")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as top:
        for name, fn in cases(os.path.join(top, "f")).items():
            wall = cpu = float("inf")
            for _ in range(args.rounds):
                t, c = time.perf_counter(), time.thread_time()
                for _ in range(args.count):
                    fn()
                wall = min(wall, (time.perf_counter() - t) / args.count * 1e6)
                cpu = min(cpu, (time.thread_time() - c) / args.count * 1e6)
            print(f"{name:36s} {wall:8.2f} µs wall {cpu:8.2f} µs CPU", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
