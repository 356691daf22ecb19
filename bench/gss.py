"""RPCSEC_GSS cost on our server and client: sys / krb5 / krb5i / krb5p over TCP loopback.

A real MIT KDC on 127.0.0.1 (tests/kdc.py: its own realm in a temporary directory), our
server in its own process (``nfsrdma serve --sec krb5p,krb5i,krb5,sys`` with the realm's
keytab), and our client in this one with a ticket for a user principal. For each flavour:
sequential write and read of ``--size`` MiB (1 MiB calls, the session's slots in flight) and
the rate of small operations (GETATTR by ``stat`` of one file, 32 in flight).

MB/s is 10**6 bytes per second. The last line is
``write_krb5=… write_krb5i=… write_krb5p=… read_… ops_…``, each the flavour's figure / sys's.
(ours vs knfsd under Kerberos needs the test bed's realm: not measured here.)"""

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
from nfsrdma.client.bench import timed_ops, transfer_read, transfer_write
from tests.kdc import SERVER_HOST, remove, start_kdc

FLAVOURS = ("sys", "krb5", "krb5i", "krb5p")


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


async def run(args: argparse.Namespace, url: str, ccache: str) -> dict[str, dict[str, float]]:
    out = {}
    for sec in FLAVOURS:
        await measure(url, sec, ccache, 1 << 20, 50)  # warm-up: contexts, caches
        out[sec] = await measure(url, sec, ccache, args.size << 20, args.ops)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", type=int, default=64, help="MiB written and read per flavour")
    p.add_argument("--ops", type=int, default=3000, help="small operations per flavour")
    args = p.parse_args()
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
        figures = asyncio.run(run(args, f"nfs://127.0.0.1:{port}/", f"FILE:{ccache}"))
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


if __name__ == "__main__":
    sys.exit(main())
