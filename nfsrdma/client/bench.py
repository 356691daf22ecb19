"""``nfsrdma bench URL``: read/write throughput and small-operation rates with latency
percentiles, measured with this client against any NFSv4.1 server.

The large transfer is one file of ``size`` bytes written and read back ``block`` bytes per call
(each call split by wsize/rsize and pipelined across slots). Small operations run with
``concurrency`` in flight: create (OPEN with create + CLOSE), stat (LOOKUP + GETATTR) and remove.
Everything happens in a scratch directory that is removed afterwards."""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from nfsrdma.client.fs import NfsClient


@dataclass(slots=True)
class OpStats:
    name: str
    count: int
    seconds: float
    latencies_ms: list[float] = field(repr=False)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies_ms:
            return 0.0
        data = sorted(self.latencies_ms)
        k = min(len(data) - 1, max(0, round(p / 100 * (len(data) - 1))))
        return data[k]

    def summary(self) -> dict[str, float]:
        return {
            "ops": self.count,
            "ops_per_s": round(self.rate, 1),
            "p50_ms": round(self.percentile(50), 3),
            "p90_ms": round(self.percentile(90), 3),
            "p99_ms": round(self.percentile(99), 3),
            "mean_ms": round(statistics.fmean(self.latencies_ms), 3) if self.latencies_ms else 0,
        }


@dataclass(slots=True)
class BenchResult:
    size: int
    write_mb_s: float
    read_mb_s: float
    ops: dict[str, dict[str, float]]
    session: dict[str, Any]
    # Per NFSv4.1 operation, as the client library counted them (NfsClient.stats).
    nfs_ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each small operation's latencies (ms), for the chart; not in as_dict.
    samples: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["samples"]
        return d

    def lines(self) -> list[str]:
        out = [
            f"write {self.size / 2**20:.0f} MiB: {self.write_mb_s:.1f} MB/s",
            f"read  {self.size / 2**20:.0f} MiB: {self.read_mb_s:.1f} MB/s",
        ]
        for name, s in self.ops.items():
            out.append(
                f"{name:7s} {s['ops']:5.0f} ops {s['ops_per_s']:9.1f}/s  "
                f"p50 {s['p50_ms']:.2f} ms  p90 {s['p90_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms"
            )
        if self.nfs_ops:
            out.append(f"{'NFS op':<18}{'calls':>8}{'errors':>8}{'p50 ms':>10}{'p99 ms':>10}")
            for name, op in sorted(self.nfs_ops.items(), key=lambda kv: -kv[1]["count"]):
                nerr = sum(op["errors"].values())
                out.append(
                    f"{name:<18}{op['count']:>8}{nerr:>8}{op['p50_ms']:>10.3f}{op['p99_ms']:>10.3f}"
                )
        return out


async def timed_ops(
    name: str, ops: list[Callable[[], Awaitable[Any]]], concurrency: int
) -> OpStats:
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(op: Callable[[], Awaitable[Any]]) -> None:
        async with sem:
            t = time.perf_counter()
            await op()
            lat.append((time.perf_counter() - t) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(op) for op in ops))
    return OpStats(name, len(ops), time.perf_counter() - t0, lat)


async def transfer_write(fs: NfsClient, path: str, data: memoryview, block: int) -> float:
    """Write ``data`` to ``path``; returns MB/s (including the final COMMIT and CLOSE)."""
    t0 = time.perf_counter()
    async with fs.open(path, "wb") as f:
        for off in range(0, len(data), block):
            await f.write(data[off : off + block])
    return len(data) / (time.perf_counter() - t0) / 1e6


async def transfer_read(fs: NfsClient, path: str, size: int, block: int) -> float:
    buf = bytearray(min(block, size) or 1)
    t0 = time.perf_counter()
    got = 0
    async with fs.open(path, "rb") as f:
        while got < size:
            n = await f.readinto(memoryview(buf)[: min(block, size - got)])
            if n == 0:
                break
            got += n
    if got != size:
        raise OSError(f"read {got} bytes of {size}")
    return size / (time.perf_counter() - t0) / 1e6


async def run_bench(
    fs: NfsClient,
    *,
    size: int = 64 << 20,
    block: int = 16 << 20,
    files: int = 200,
    concurrency: int = 16,
    directory: str = "",
) -> BenchResult:
    scratch = directory or f".nfsrdma-bench-{os.getpid()}-{time.time_ns()}"
    await fs.mkdir(scratch)
    try:
        data = memoryview(os.urandom(size))
        big = f"{scratch}/big"
        write = await transfer_write(fs, big, data, block)
        read = await transfer_read(fs, big, size, block)
        await fs.remove(big)
        names = [f"{scratch}/f{i}" for i in range(files)]

        def creator(p: str) -> Callable[[], Awaitable[Any]]:
            async def create() -> None:
                f = await fs.open(p, "wb")
                await f.close()

            return create

        create = await timed_ops("create", [creator(p) for p in names], concurrency)
        stat = await timed_ops("stat", [functools.partial(fs.stat, p) for p in names], concurrency)
        remove = await timed_ops(
            "remove", [functools.partial(fs.remove, p) for p in names], concurrency
        )
    finally:
        try:
            for name in await fs.listdir(scratch):
                await fs.remove(f"{scratch}/{name}")
            await fs.rmdir(scratch)
        except OSError:
            pass
    neg = fs.session.negotiated
    return BenchResult(
        size=size,
        write_mb_s=round(write, 1),
        read_mb_s=round(read, 1),
        ops={s.name: s.summary() for s in (create, stat, remove)},
        nfs_ops=fs.stats(),
        samples={s.name: s.latencies_ms for s in (create, stat, remove)},
        session={
            "transport": fs.url.transport,
            "slots": neg.slots,
            "rsize": neg.rsize,
            "wsize": neg.wsize,
            "max_in_flight": fs.session.slots.stats.max_in_flight,
        },
    )


def plot(result: BenchResult, path: str) -> None:
    """Write a PNG chart of ``result``: the small operations' latency distributions (CDF) and
    the p50/p99 of each NFSv4.1 operation. Needs matplotlib (``nfsrdma[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise OSError(f"--plot needs matplotlib (pip install 'nfsrdma[plot]'): {e}") from None
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 5))
    fig.suptitle(
        f"{result.session.get('transport', '')}: write {result.write_mb_s} MB/s, "
        f"read {result.read_mb_s} MB/s"
    )
    for name, lat in result.samples.items():
        if lat:
            data = sorted(lat)
            cdf.step(data, [(i + 1) / len(data) for i in range(len(data))], label=name)
    cdf.set_xscale("log")
    cdf.set_xlabel("latency (ms)")
    cdf.set_ylabel("fraction of operations")
    cdf.set_title("small operations")
    cdf.legend()
    names = sorted(result.nfs_ops, key=lambda n: -result.nfs_ops[n]["count"])[:12]
    xs = range(len(names))
    bars.bar([x - 0.2 for x in xs], [result.nfs_ops[n]["p50_ms"] for n in names], 0.4, label="p50")
    bars.bar([x + 0.2 for x in xs], [result.nfs_ops[n]["p99_ms"] for n in names], 0.4, label="p99")
    bars.set_xticks(list(xs), names, rotation=45, ha="right")
    bars.set_ylabel("ms (round trip of the COMPOUNDs carrying it)")
    bars.set_title("NFSv4.1 operations")
    bars.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
