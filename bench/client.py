"""Our NFSv4.1 client against the Linux kernel client, both talking to knfsd in one test-bed
boot: 64 MiB written and read over RDMA and over TCP, and stat of 500 files.

- Ours: ``nfsrdma.connect(...)``; the file is written with one ``write`` call and read back
  with one ``readinto`` call (each split by wsize/rsize and pipelined across the session's
  slots); the close COMMITs. The 500 stats use ``stat_many``: PUTFH, LOOKUP, GETATTR for
  each file, as many per COMPOUND as the session's ca_maxoperations allows, 8 COMPOUNDs in
  flight. For reference the table also shows plain ``stat`` calls (one COMPOUND each, 32 in
  flight, after 32 unmeasured ones, with the Reply chunks our client offered per stat over
  RDMA: each registers memory);
  ``meta`` uses ``stat_many``.
- Kernel: ``dd bs=1M`` through a mount (``conv=fsync`` when writing; caches dropped before
  reading); the 500 ``os.stat`` calls come from one process, in order, on a fresh mount
  (after 32 unmeasured ones and a drop of the caches).

MB/s is 10**6 bytes per second. Under qemu TCG only the ratios mean something. The last line is
``rdma_read=… rdma_write=… tcp_read=… tcp_write=… meta=…``, each ours / kernel (``n/a`` when
a transport is unavailable to our client). Target: every ratio >= 0.7.

On the host this takes the test-bed lock (/tmp/nfsrdma-vm.lock), boots the test bed with
knfsd and runs itself inside.

``python bench/client.py server_copy`` runs on the host instead, without the test bed: our server
(in this process, TCP on 127.0.0.1, a temporary export) and our client; a file of ``--size-mib``
(64) MiB copied with NFSv4.2 COPY (``copy_file``) and with READ + WRITE through the client (the
file's bytes go to the client and back), each timed, best of three. The last line is
``server_copy=<read+write seconds / COPY seconds> copy_s=… readwrite_s=…``."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import nfsrdma.client as nc
from nfsrdma.client.bench import transfer_read, transfer_write
from nfsrdma.client.fs import gather_limited
from nfsrdma.testbed.constants import KNFSD_RDMA_PORT, KNFSD_TCP_PORT
from nfsrdma.testbed.helpers import (
    Knfsd,
    Proto,
    drop_caches,
    export_dir,
    in_testbed,
    mount_nfs,
    out_dir,
    testbed_addr,
)

MOUNT_ROOT = Path("/tmp/bench-client-mnt")
VM_LOCK = "/tmp/nfsrdma-vm.lock"


def step(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


# -- ours ----------------------------------------------------------------------------------------
def _url(addr: str, proto: Proto) -> str:
    if proto == "rdma":
        return f"rdma://{addr}:{KNFSD_RDMA_PORT}/"
    return f"nfs://{addr}:{KNFSD_TCP_PORT}/"


async def ours_io(addr: str, proto: Proto, size: int) -> tuple[float, float] | None:
    data = memoryview(os.urandom(size))
    try:
        async with nc.connect(_url(addr, proto), uid=0, gid=0) as fs:
            name = f"bench-ours-{proto}.bin"
            write = await transfer_write(fs, name, data, size)
            drop_caches()
            read = await transfer_read(fs, name, size, size)
            await fs.remove(name)
            return write, read
    except nc.RdmaUnavailable as e:
        step(f"our client over {proto}: {e}")
        return None


# Plain stats made before the measured ones, by either client: the first calls of a code path
# pay once-only costs (in the test bed, the emulator translating that code), which are not the
# rate being compared.
WARM_UP = 32


async def ours_stat(addr: str, proto: Proto, names: list[str]) -> tuple[float, float, float]:
    """(stat_many rate, plain stat rate) in stats per second, and the Reply chunks offered per
    plain stat (RDMA; each one registers memory for the server to write)."""
    async with nc.connect(_url(addr, proto), uid=0, gid=0) as fs:
        t = time.perf_counter()
        many = await fs.stat_many(names)
        many_rate = len(names) / (time.perf_counter() - t)
        await gather_limited([fs.stat(n) for n in names[:WARM_UP]], 32)  # not measured
        chunks = _reply_chunks(fs)
        t = time.perf_counter()
        single = await gather_limited([fs.stat(n) for n in names], 32)
        single_rate = len(names) / (time.perf_counter() - t)
        chunks = (_reply_chunks(fs) - chunks) / len(names)
    assert all(isinstance(s, nc.FileStat) and s.is_file() for s in [*many, *single])
    return many_rate, single_rate, chunks


def _reply_chunks(fs: nc.NfsClient) -> int:
    rpc = fs.session.rpc
    stats = getattr(rpc.conn, "stats", None) if rpc is not None else None
    return int(stats["reply_chunks"]) if stats is not None else 0


# -- kernel --------------------------------------------------------------------------------------
def dd(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(["dd", *args, "status=none"], check=True)
    return time.perf_counter() - t


def kernel_io(knfsd: Knfsd, proto: Proto, size: int) -> tuple[float, float]:
    mib = size >> 20
    with mount_nfs(knfsd.server(proto), MOUNT_ROOT / proto) as mnt:
        path = mnt.mountpoint / f"bench-kernel-{proto}.bin"
        w = dd(["if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"])
        drop_caches()
        r = dd([f"if={path}", "of=/dev/null", "bs=1M"])
        path.unlink()
    return size / w / 1e6, size / r / 1e6


def kernel_stat(knfsd: Knfsd, proto: Proto, names: list[str]) -> float:
    with mount_nfs(knfsd.server(proto), MOUNT_ROOT / f"meta-{proto}") as mnt:
        for n in names[:WARM_UP]:  # not measured
            os.stat(mnt.mountpoint / n)
        drop_caches()
        t = time.perf_counter()
        for n in names:
            os.stat(mnt.mountpoint / n)
        secs = time.perf_counter() - t
    return len(names) / secs


def stat_files(knfsd: Knfsd, sub: str, count: int) -> tuple[Path, list[str]]:
    """``count`` one-octet files made in ``sub`` of knfsd's export: (the directory, their
    names relative to the export)."""
    top = Path(knfsd.export) / sub
    top.mkdir(exist_ok=True)
    names = []
    for i in range(count):
        (top / f"f{i:04d}").write_bytes(b"x")
        names.append(f"{sub}/f{i:04d}")
    return top, names


# -- the run -------------------------------------------------------------------------------------
def in_guest(args: argparse.Namespace) -> int:
    addr = testbed_addr()
    knfsd = Knfsd(addr=addr, export=export_dir())
    size = args.size_mib << 20
    figures: dict[str, dict[str, float]] = {}
    ratios: dict[str, str] = {}
    for proto in ("rdma", "tcp"):
        step(f"our client over {proto}")
        ours = asyncio.run(ours_io(addr, proto, size))
        step(f"kernel client over {proto}")
        kw, kr = kernel_io(knfsd, proto, size)
        figures[proto] = {"kernel_write": kw, "kernel_read": kr}
        if ours is None:
            ratios[f"{proto}_read"] = ratios[f"{proto}_write"] = "n/a"
            continue
        ow, orr = ours
        figures[proto].update(ours_write=ow, ours_read=orr)
        ratios[f"{proto}_read"] = f"{orr / kr:.2f}"
        ratios[f"{proto}_write"] = f"{ow / kw:.2f}"

    step(f"stat of {args.files} files")
    meta_dir, names = stat_files(knfsd, "bench-meta", args.files)
    protos: tuple[Proto, ...] = ("rdma", "tcp")
    for proto in protos:
        if ratios[f"{proto}_read"] == "n/a":
            continue
        many, single, chunks = asyncio.run(ours_stat(addr, proto, names))
        kernel_rate = kernel_stat(knfsd, proto, names)
        figures[f"meta_{proto}"] = {
            "ours_stat_many_per_s": many,
            "ours_stat_per_s": single,
            "kernel_stat_per_s": kernel_rate,
            "ours_reply_chunks_per_stat": chunks,
        }
    for p in meta_dir.iterdir():
        p.unlink()
    meta_dir.rmdir()
    meta_proto: Proto = "rdma" if "meta_rdma" in figures else "tcp"
    meta = figures[f"meta_{meta_proto}"]
    ratios["meta"] = f"{meta['ours_stat_many_per_s'] / meta['kernel_stat_per_s']:.2f}"

    (out_dir() / "client-bench.json").write_text(
        json.dumps({"figures": figures, "ratios": ratios, "size_mib": args.size_mib,
                    "files": args.files, "meta_transport": meta_proto}, indent=2) + "\n"
    )  # fmt: skip
    print(f"our client vs the Linux client against knfsd, {args.size_mib} MiB, qemu TCG")
    print(f"{'':8} {'ours write':>11} {'kernel write':>13} {'ours read':>10} {'kernel read':>12}")
    for proto in ("rdma", "tcp"):
        f = figures[proto]
        print(
            f"{proto:8} {f.get('ours_write', float('nan')):11.1f} {f['kernel_write']:13.1f} "
            f"{f.get('ours_read', float('nan')):10.1f} {f['kernel_read']:12.1f}"
        )
    for proto in ("rdma", "tcp"):
        if f"meta_{proto}" in figures:
            m = figures[f"meta_{proto}"]
            print(
                f"stat {args.files} files ({proto}): ours {m['ours_stat_many_per_s']:.0f}/s "
                f"(stat_many), {m['ours_stat_per_s']:.0f}/s (stat, 32 in flight, "
                f"{m['ours_reply_chunks_per_stat']:.2f} Reply chunks each); "
                f"kernel {m['kernel_stat_per_s']:.0f}/s (sequential, fresh mount)"
            )
    keys = ("rdma_read", "rdma_write", "tcp_read", "tcp_write", "meta")
    print(" ".join(f"{k}={ratios[k]}" for k in keys), flush=True)
    return 0


def on_host(args: argparse.Namespace) -> int:
    """Take the test-bed lock, boot it once with knfsd, run this file inside."""
    here = Path(__file__).resolve()
    argv = [
        sys.executable, "-m", "nfsrdma.testbed", "run", "--knfsd", "--out", str(args.out),
        "--timeout", str(args.timeout), "--",
        sys.executable, str(here), "--size-mib", str(args.size_mib), "--files", str(args.files),
    ]  # fmt: skip
    with open(VM_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.call(argv, cwd=here.parent.parent)


# -- server_copy (host, TCP loopback) ------------------------------------------------------------
async def server_copy(size: int, rounds: int = 3) -> tuple[float, float]:
    """(best COPY seconds, best READ+WRITE seconds) for ``size`` octets, our client and server."""
    import tempfile

    from nfsrdma.server import NFSServer

    with tempfile.TemporaryDirectory(prefix="bench-copy-") as tmp:
        export = Path(tmp) / "export"
        export.mkdir()
        (export / "src").write_bytes(os.urandom(size))
        server = NFSServer(
            str(export), bind="127.0.0.1", tcp_port=0, root_squash=False, state_dir=f"{tmp}/state"
        )
        await server.start()
        try:
            url = f"nfs://127.0.0.1:{server.tcp_port}/"
            async with nc.connect(url, uid=0, gid=0) as fs:
                service = server.state.delegation_service
                if service is not None:
                    await service.probe(fs.session.clientid or 0)  # asynchronous COPY allowed
                copy_times, rw_times = [], []
                for i in range(rounds):
                    t0 = time.perf_counter()
                    await fs.copy_file("src", f"copy{i}")
                    copy_times.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    async with fs.open("src", "rb") as fin, fs.open(f"rw{i}", "wb") as fout:
                        buf = bytearray(fs.rsize)
                        view = memoryview(buf)
                        while (n := await fin.readinto(view)) > 0:
                            await fout.write(view[:n])
                    rw_times.append(time.perf_counter() - t0)
                    assert (export / f"copy{i}").stat().st_size == size
                    assert (export / f"rw{i}").stat().st_size == size
        finally:
            await server.close()
    return min(copy_times), min(rw_times)


def main() -> int:
    if sys.argv[1:2] == ["server_copy"]:
        parser = argparse.ArgumentParser(description="server-side COPY vs READ+WRITE (host)")
        parser.add_argument("mode", choices=["server_copy"])
        parser.add_argument("--size-mib", type=int, default=64, help="file size (default 64)")
        args = parser.parse_args()
        copy_s, rw_s = asyncio.run(server_copy(args.size_mib << 20))
        print(f"{args.size_mib} MiB on one server: COPY {copy_s:.3f} s, READ+WRITE {rw_s:.3f} s")
        print(f"server_copy={rw_s / copy_s:.1f} copy_s={copy_s:.3f} readwrite_s={rw_s:.3f}")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64, help="transfer size (default 64)")
    parser.add_argument("--files", type=int, default=500, help="files to stat (default 500)")
    parser.add_argument("--out", type=Path, default=Path("testbed-out/client-bench"))
    parser.add_argument("--timeout", type=float, default=1500.0, help="host only: VM limit")
    args = parser.parse_args()
    return in_guest(args) if in_testbed() else on_host(args)


if __name__ == "__main__":
    sys.exit(main())
