"""Loopback ONC RPC over TCP: NULL calls per second with 64 in flight, one server process.

The server runs in its own process (uvloop when installed); the load comes from a client
process keeping 64 calls in flight on one connection. Last line: ``calls_per_s=N``
(target >= 40000)."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.aio import run
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import Dispatcher, null_procedure
from nfsrdma.transport.tcp import TcpConnection, connect_tcp, listen_tcp

PROG, VERS = 400100, 1


def serve(port_q: mp.Queue[int], stop: mp.Event) -> None:  # type: ignore[type-arg]
    async def main() -> None:
        disp = Dispatcher()
        disp.add(PROG, VERS, {0: null_procedure})

        def on_conn(c: TcpConnection) -> None:
            RpcConnection(c, disp)

        srv = await listen_tcp("127.0.0.1", 0, on_conn)
        port_q.put(srv.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.1)
        srv.close()

    run(main())


async def load(port: int, inflight: int, seconds: float) -> tuple[int, float]:
    conn = RpcConnection(await connect_tcp("127.0.0.1", port))
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await conn.call(PROG, VERS, 0)
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(inflight)])
    elapsed = time.perf_counter() - t0
    conn.close()
    return done, elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--inflight", type=int, default=64)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    port_q: mp.Queue[int] = ctx.Queue()
    stop = ctx.Event()
    proc = ctx.Process(target=serve, args=(port_q, stop), daemon=True)
    proc.start()
    port = port_q.get(timeout=30)
    run(load(port, args.inflight, 0.5))  # warm up
    done, elapsed = run(load(port, args.inflight, args.seconds))
    stop.set()
    proc.join(5)
    rate = done / elapsed
    print(f"calls={done} seconds={elapsed:.2f} inflight={args.inflight}")
    print(f"calls_per_s={rate:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
