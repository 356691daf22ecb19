"""RPCSEC_GSS cost: sys / krb5 / krb5i / krb5p, our server against knfsd in one test-bed boot.

Default (run on the host; it boots the test bed with ``nfsrdma testbed run --knfsd`` and runs
itself inside): a realm and KDC in the guest (tests/testbed/kerberos_realm.py: rpc.gssd,
rpc.svcgssd, knfsd exporting with ``sec=sys:krb5:krb5i:krb5p``), our server
(``nfsrdma serve --sec krb5p,krb5i,krb5,sys``) beside it, and the **Linux client** mounting each
server with each flavour, over RDMA and over TCP (``--protos``): knfsd first, then our server
on TCP 2049 and RDMA 20050 with knfsd stopped (rpc.gssd makes the contexts of an RDMA mount
over TCP to port 2049). For each: a sequential write
of ``--size-mib`` MiB (then fsync) and its read after dropping caches (MB/s), and the rate of
small operations: create + stat + remove of ``--files`` files (operations/s). The workload
runs as root, which the Linux client sends under the machine credential
(``nfs/<host>``): both servers map it to the anonymous user, and every call carries the
flavour's protection as a user's would.

knfsd's krb5p is broken in Debian's 6.1 kernel (every krb5p COMPOUND gets GARBAGE_ARGS after a
successful unwrap; fixed by 6.12): on kernels before 6.12 knfsd's krb5p is not measured and
printed as n/a (``--knfsd-krb5p yes`` tries anyway; a boot of another kernel: ``--kernel``).

MB/s is 10**6 bytes per second; under qemu TCG only ratios within one boot mean something.
The last line is ``<proto>_<flavour>_<write|read|ops>=…`` for every measured pair, each ours /
knfsd (``n/a`` when knfsd was not measured).

``--local`` measures on the host instead, without the test bed: a KDC on 127.0.0.1, our server
in its own process and our client in this one, each flavour's figure / sys's (last line
``write_krb5=… … ops_krb5p=…``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsbench import MOUNT_ROOT, metadata, sequential, step

import nfsrdma.client as nc
from nfsrdma.client.bench import timed_ops, transfer_read, transfer_write
from nfsrdma.testbed.helpers import (
    Knfsd,
    NfsServer,
    export_dir,
    in_testbed,
    mount_nfs,
    out_dir,
    testbed_addr,
)
from tests.kdc import SERVER_HOST, remove, start_kdc

FLAVOURS = ("sys", "krb5", "krb5i", "krb5p")
KRB5P_FIXED = (6, 12)  # the first kernel whose knfsd serves krb5p (Debian's 6.12 does)


# ---------------------------------------------------------------------------------------------
# In the test bed: the Linux client against knfsd and our server


@dataclass
class Row:
    proto: str
    sec: str
    server: str  # "knfsd" or "ours"
    write: float  # MB/s
    read: float  # MB/s
    ops: float  # create/stat/remove operations/s


def kernel_version() -> tuple[int, int]:
    major, minor = platform.release().split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def knfsd_serves_krb5p(choice: str) -> bool:
    return choice == "yes" or (choice == "auto" and kernel_version() >= KRB5P_FIXED)


def measure_mount(server: NfsServer, name: str, sec: str, args: argparse.Namespace) -> Row:
    with mount_nfs(server, MOUNT_ROOT / f"gss-{name}", options=(f"sec={sec}",)) as m:
        step(f"{name} {server.proto} sec={sec}: sequential {args.size_mib} MiB")
        write, read = sequential(m.mountpoint, args.size_mib)
        (m.mountpoint / "seq.bin").unlink()
        step(f"{name} {server.proto} sec={sec}: create+stat+remove of {args.files} files")
        ops = metadata(m.mountpoint, args.files)
        (m.mountpoint / "meta").rmdir()
    return Row(server.proto, sec, name, write, read, ops)


def in_guest(args: argparse.Namespace) -> int:
    # Imported here: the realm helpers live with the test-bed tests and need the guest.
    from nfsrdma.testbed.constants import KNFSD_TCP_PORT
    from nfsrdma.testbed.ours import our_server
    from tests.testbed.kerberos_realm import guest_realm, knfsd_stopped

    knfsd = Knfsd(addr=testbed_addr(), export=export_dir())
    krb5p_knfsd = knfsd_serves_krb5p(args.knfsd_krb5p)
    protos = args.protos.split(",")
    extra = ("--sec", "krb5p,krb5i,krb5,sys", "--keytab", "/etc/krb5.keytab")
    rows: list[Row] = []
    with guest_realm(knfsd, Path("/run/krb5-realm-bench")):
        for proto in protos:
            for sec in FLAVOURS:
                if sec != "krb5p" or krb5p_knfsd:
                    rows.append(measure_mount(knfsd.server(proto), "knfsd", sec, args))
        # rpc.gssd makes an RDMA mount's contexts over TCP to port 2049 (nfs-utils has no
        # RPC-over-RDMA): our server takes knfsd's place there, knfsd is stopped meanwhile.
        with (
            knfsd_stopped(),
            our_server(
                "bench-gss", extra=(*extra, "--gss-host", SERVER_HOST), tcp_port=KNFSD_TCP_PORT
            ) as ours,
        ):
            os.chmod(ours.export, 0o777)
            for proto in protos:
                for sec in FLAVOURS:
                    rows.append(measure_mount(ours.server(proto), "ours", sec, args))
    report_guest(rows, args, krb5p_knfsd)
    return 0


def report_guest(rows: list[Row], args: argparse.Namespace, krb5p_knfsd: bool) -> None:
    print(
        f"RPCSEC_GSS, Linux client, kernel {platform.release()}, {args.size_mib} MiB sequential, "
        f"{args.files} files create+stat+remove; qemu TCG, MB/s = 10^6 B/s"
    )
    if not krb5p_knfsd:
        print("knfsd krb5p: n/a (GARBAGE_ARGS on kernels before 6.12)")
    print(f"{'proto':6}{'flavour':8}{'server':7}{'write MB/s':>11}{'read MB/s':>10}{'ops/s':>8}")
    for r in rows:
        print(f"{r.proto:6}{r.sec:8}{r.server:7}{r.write:11.1f}{r.read:10.1f}{r.ops:8.0f}")
    by = {(r.proto, r.sec, r.server): r for r in rows}
    ratios: dict[str, str] = {}
    for proto in args.protos.split(","):
        for sec in FLAVOURS:
            mine, theirs = by[(proto, sec, "ours")], by.get((proto, sec, "knfsd"))
            for what in ("write", "read", "ops"):
                key = f"{proto}_{sec}_{what}"
                ratios[key] = (
                    f"{getattr(mine, what) / getattr(theirs, what):.2f}" if theirs else "n/a"
                )
    (out_dir() / "gss.json").write_text(
        json.dumps(
            {"kernel": platform.release(), "rows": [r.__dict__ for r in rows], "ratios": ratios},
            indent=1,
        )
        + "\n"
    )
    print("ours / knfsd:")
    print(" ".join(f"{k}={v}" for k, v in ratios.items()), flush=True)


def on_host(args: argparse.Namespace) -> int:
    """Boot the test bed once (with knfsd) and run this file inside it."""
    here = Path(__file__).resolve()
    out = args.out or Path("testbed-out") / "gss"
    argv = [
        sys.executable, "-m", "nfsrdma.testbed", "run", "--knfsd", "--out", str(out),
        "--timeout", str(args.timeout),
        *(["--kernel", args.kernel] if args.kernel else []),
        "--", sys.executable, str(here), "--size-mib", str(args.size_mib), "--files",
        str(args.files), "--protos", args.protos, "--knfsd-krb5p", args.knfsd_krb5p,
    ]  # fmt: skip
    return subprocess.call(argv, cwd=here.parent.parent)


# ---------------------------------------------------------------------------------------------
# --local: our client and our server on the host, a KDC on 127.0.0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the server does not listen") from None
            time.sleep(0.05)


async def measure(url: str, sec: str, ccache: str, size: int, ops: int) -> dict[str, float]:
    data = memoryview(os.urandom(size))
    async with nc.connect(url, sec=sec, gss_host=SERVER_HOST, ccache=ccache, uid=0, gid=0) as fs:
        name = f"bench-{sec}"
        write = await transfer_write(fs, name, data, 1 << 20)
        read = await transfer_read(fs, name, size, 1 << 20)
        small = await timed_ops("stat", [lambda: fs.stat(name) for _ in range(ops)], 32)
        await fs.remove(name)
    return {"write": write, "read": read, "ops": small.count / small.seconds}


async def run_local(args: argparse.Namespace, url: str, ccache: str) -> dict[str, dict[str, float]]:
    out = {}
    for sec in FLAVOURS:
        await measure(url, sec, ccache, 1 << 20, 50)  # warm-up: contexts, caches
        out[sec] = await measure(url, sec, ccache, args.size_mib << 20, args.ops)
    return out


def local(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-gss-"))
    kdc = start_kdc(work / "kdc")
    for k in ("KRB5_CONFIG", "KRB5_KDC_PROFILE", "KRB5CCNAME"):
        os.environ[k] = kdc.env[k]
    ccache = work / "ccache"
    kdc.kinit(ccache, kdc.numeric_principal, kdc.numeric_keytab)
    export = work / "export"
    export.mkdir()
    export.chmod(0o777)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "nfsrdma", "serve", str(export), "--bind", "127.0.0.1",
         "--tcp-port", str(port), "--no-rdma", "--no-root-squash", "--state-dir",
         str(work / "state"), "--sec", "krb5p,krb5i,krb5,sys", "--keytab",
         str(kdc.server_keytab), "--gss-host", SERVER_HOST],
        stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    try:
        wait_listening(server, port)
        figures = asyncio.run(run_local(args, f"nfs://127.0.0.1:{port}/", f"FILE:{ccache}"))
    finally:
        server.terminate()
        server.wait(10)
        remove(kdc)
    print(f"{'flavour':8} {'write MB/s':>11} {'read MB/s':>10} {'stat/s':>8}")
    for sec, f in figures.items():
        print(f"{sec:8} {f['write']:11.1f} {f['read']:10.1f} {f['ops']:8.0f}")
    base = figures["sys"]
    line = [
        f"{what}_{sec}={figures[sec][what] / base[what]:.2f}"
        for what in ("write", "read", "ops")
        for sec in FLAVOURS[1:]
    ]
    print(" ".join(line))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--local", action="store_true", help="on the host: our client, our server")
    p.add_argument(
        "--size-mib", type=int, default=None, help="MiB per sequential run (16; --local 64)"
    )
    p.add_argument("--files", type=int, default=200, help="files created, stat'ed, removed (200)")
    p.add_argument("--ops", type=int, default=3000, help="--local: GETATTRs per flavour (3000)")
    p.add_argument("--protos", default="rdma,tcp", help="transports of the mounts (rdma,tcp)")
    p.add_argument(
        "--knfsd-krb5p", choices=("auto", "yes", "no"), default="auto",
        help="measure knfsd's krb5p (auto: on kernels from 6.12)",
    )  # fmt: skip
    p.add_argument("--kernel", default=None, help="host only: boot this kernel (testbed --kernel)")
    p.add_argument("--out", type=Path, default=None, help="host only: results directory")
    p.add_argument("--timeout", type=float, default=1800.0, help="host only: VM time limit")
    args = p.parse_args()
    if args.size_mib is None:
        args.size_mib = 64 if args.local else 16
    if args.local:
        return local(args)
    return in_guest(args) if in_testbed() else on_host(args)


if __name__ == "__main__":
    sys.exit(main())
