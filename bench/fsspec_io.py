"""fsspec over nfs:// against the client it wraps: the cost of the fsspec layer.

Our server runs in a child process on TCP loopback serving a temporary directory; one file of
``--mib`` MiB is read and written (a) with the async client directly (``read_bytes`` /
``write_bytes``), (b) through fsspec's ``cat_file`` / ``pipe_file``, (c) through fsspec's
buffered ``open()`` (read-ahead cache, ``block_size`` reads; writes sent per block), and ``ls``
of a directory of ``--files`` files is timed both ways. Each figure is the best of
``--rounds``. Ratios are fsspec's time over the client's (1.0: no overhead). Last line:
``cat_ratio=R pipe_ratio=R open_read_ratio=R open_write_ratio=R ls_ratio=R``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fsspec.asyn import sync

import nfsrdma
from nfsrdma.client.fsspec import NfsFileSystem, close_all
from tests.unit.client.ganesha import free_port
from tests.unit.client.ourserver import OurServer


def best(rounds: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=4 << 20)
    args = ap.parse_args()
    data = os.urandom(args.mib << 20)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = OurServer(work, free_port(), work / "export").start()
        try:
            export = server.export_dir
            (export / "many").mkdir()
            for i in range(args.files):
                (export / "many" / f"f{i:05d}").write_bytes(b"x")
            fs = NfsFileSystem("127.0.0.1", server.port, block_size=args.block_size)
            loop = fs.loop

            async def connect() -> Any:
                return await nfsrdma.connect(f"nfs://127.0.0.1:{server.port}/")

            client = sync(loop, connect)  # the plain client, on the same loop and thread

            def run(coro_fn: Callable[[], Any]) -> Any:
                return sync(loop, coro_fn)

            def open_read() -> None:
                with fs.open("/big", "rb") as f:
                    while f.read(1 << 20):
                        pass

            def open_write() -> None:
                with fs.open("/big2", "wb") as f:
                    for off in range(0, len(data), 1 << 20):
                        f.write(data[off : off + (1 << 20)])

            figures = {
                "client_write": best(
                    args.rounds, lambda: run(lambda: client.write_bytes("big", data))
                ),
                "pipe": best(args.rounds, lambda: fs.pipe_file("/big", data)),
                "client_read": best(args.rounds, lambda: run(lambda: client.read_bytes("big"))),
                "cat": best(args.rounds, lambda: fs.cat_file("/big")),
                "open_read": best(args.rounds, open_read),
                "open_write": best(args.rounds, open_write),
                "client_ls": best(args.rounds, lambda: run(lambda: _scan(client))),
                "ls": best(args.rounds, lambda: fs.ls("/many", refresh=True)),
            }
            assert fs.cat_file("/big2") == data
            sync(loop, client.aclose)
            close_all()
        finally:
            server.stop()
    mib = args.mib
    print(f"{'what':<14}{'seconds':>10}{'MiB/s':>10}")
    for name, secs in figures.items():
        rate = f"{mib / secs:10.1f}" if not name.endswith("ls") else f"{'':>10}"
        print(f"{name:<14}{secs:10.4f}{rate}")
    print(f"file={mib}MiB block_size={args.block_size} ls_files={args.files} rounds={args.rounds}")
    ratios = {
        "cat_ratio": figures["cat"] / figures["client_read"],
        "pipe_ratio": figures["pipe"] / figures["client_write"],
        "open_read_ratio": figures["open_read"] / figures["client_read"],
        "open_write_ratio": figures["open_write"] / figures["client_write"],
        "ls_ratio": figures["ls"] / figures["client_ls"],
    }
    print(" ".join(f"{k}={v:.2f}" for k, v in ratios.items()))
    return 0


async def _scan(client: Any) -> int:
    return len([e async for e in client.scandir("many")])


if __name__ == "__main__":
    sys.exit(main())
