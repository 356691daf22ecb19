"""Our server on CephFS vs on a local directory, and two CephFS servers vs one.

Starts a throwaway single-node Ceph cluster (``nfsrdma.testbed.ceph_cluster``; or uses
``--ceph-conf``), then three ``nfsrdma serve`` processes on loopback TCP: one on a local
directory, two with ``--cephfs``. Our client measures, against each: sequential write and read
of one file (MiB/s), and small operations (create+write 1 KiB, stat, remove; 16 in flight,
operations/s). Then the small-operation load runs on both CephFS servers at once (separate
directories) and its aggregate rate is compared with one server's.

Last line: ``seq_write=… seq_read=… meta=…`` (CephFS / local, same machine, same run) and
``two_servers=…`` (aggregate of two CephFS servers / one). On a 2-core machine the cluster, the
servers and the client share the CPU, so the two-server figure says more about CPU than about
scaling."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import nfsrdma.client as nc
from nfsrdma.testbed.ceph_cluster import CephCluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: list[str], port: int, work: Path, name: str) -> subprocess.Popen[bytes]:
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [sys.executable, "-m", "nfsrdma", "serve", *args, "--bind", "127.0.0.1",
         "--tcp-port", str(port), "--no-rdma", "--no-root-squash",
         "--state-dir", str(work / f"state-{name}")],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} server exited: see {work / (name + '.log')}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{name} server did not listen")


async def sequential(url: str, size: int, top: str) -> tuple[float, float]:
    data = os.urandom(size)
    async with nc.connect(url, uid=0, gid=0) as fs:
        await fs.makedirs(top, exist_ok=True)
        t0 = time.perf_counter()
        await fs.write_bytes(f"{top}/seq", data)
        t1 = time.perf_counter()
        back = await fs.read_bytes(f"{top}/seq")
        t2 = time.perf_counter()
        assert back == data
        await fs.remove(f"{top}/seq")
    mib = size / (1 << 20)
    return mib / (t1 - t0), mib / (t2 - t1)


async def small_ops(url: str, n: int, top: str, inflight: int = 16) -> float:
    async with nc.connect(url, uid=0, gid=0) as fs:
        await fs.makedirs(top, exist_ok=True)
        sem = asyncio.Semaphore(inflight)
        payload = b"x" * 1024

        async def one(i: int) -> None:
            async with sem:
                path = f"{top}/f{i}"
                await fs.write_bytes(path, payload)
                await fs.stat(path)
                await fs.remove(path)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - t0
    return 3 * n / elapsed


async def measure(urls: dict[str, str], size: int, n: int, runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("local", "ceph_a"):
        w, r, m = [], [], []
        for k in range(runs):
            sw, sr = await sequential(urls[name], size, f"bench-{name}-{k}")
            w.append(sw)
            r.append(sr)
            m.append(await small_ops(urls[name], n, f"bench-{name}-m{k}"))
        out[f"{name}_write"] = sorted(w)[len(w) // 2]
        out[f"{name}_read"] = sorted(r)[len(r) // 2]
        out[f"{name}_meta"] = sorted(m)[len(m) // 2]
    t0 = time.perf_counter()
    await asyncio.gather(
        small_ops(urls["ceph_a"], n, "bench-two-a"), small_ops(urls["ceph_b"], n, "bench-two-b")
    )
    out["two_meta"] = 2 * 3 * n / (time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ceph-conf", help="an existing cluster (default: start a throwaway one)")
    p.add_argument("--size-mib", type=int, default=32)
    p.add_argument("--files", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nfsrdma-bench-cephfs-"))
    cluster = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        conf = a.ceph_conf
        if conf is None:
            cluster = CephCluster(work / "ceph")
            cluster.start()
            conf = str(cluster.conf)
        (work / "export").mkdir()
        ports = {"local": free_port(), "ceph_a": free_port(), "ceph_b": free_port()}
        procs.append(start_server([str(work / "export")], ports["local"], work, "local"))
        for name in ("ceph_a", "ceph_b"):
            args = ["--cephfs", "--ceph-conf", conf, "--node-name", name]
            procs.append(start_server(args, ports[name], work, name))
        urls = {k: f"nfs://127.0.0.1:{v}/" for k, v in ports.items()}
        f = asyncio.run(measure(urls, a.size_mib << 20, a.files, a.runs))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)
        if cluster is not None:
            cluster.stop()
    print(f"{'':8} {'write MiB/s':>12} {'read MiB/s':>12} {'small ops/s':>12}")
    for name in ("local", "ceph_a"):
        row = (f[f"{name}_write"], f[f"{name}_read"], f[f"{name}_meta"])
        print(f"{name:8} {row[0]:12.1f} {row[1]:12.1f} {row[2]:12.0f}")
    print(f"two CephFS servers at once: {f['two_meta']:.0f} small ops/s")
    print(
        f"seq_write={f['ceph_a_write'] / f['local_write']:.2f} "
        f"seq_read={f['ceph_a_read'] / f['local_read']:.2f} "
        f"meta={f['ceph_a_meta'] / f['local_meta']:.2f} "
        f"two_servers={f['two_meta'] / f['ceph_a_meta']:.2f}"
    )


if __name__ == "__main__":
    main()
