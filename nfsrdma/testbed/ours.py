"""Running our own server inside the test bed, next to knfsd (on other ports), exporting a
fresh tmpfs as knfsd's export is (no root squash)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nfsrdma.testbed.helpers import (
    Background,
    NfsServer,
    out_dir,
    rdma_listening,
    tcp_listening,
    testbed_addr,
)

OURS_TCP_PORT = 2050
OURS_RDMA_PORT = 20050


@dataclass(frozen=True)
class OurServer:
    export: Path
    proc: Background
    rdma: bool
    tcp_port: int = OURS_TCP_PORT

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    @property
    def state_dir(self) -> str:
        return f"/tmp/{self.export.name.removesuffix('-export')}-state"

    def server(self, proto: str) -> NfsServer:
        port = OURS_RDMA_PORT if proto == "rdma" else self.tcp_port
        return NfsServer(testbed_addr(), port, proto)  # type: ignore[arg-type]


@contextmanager
def our_server(
    name: str = "ours",
    *,
    rdma: bool = True,
    extra: tuple[str, ...] = (),
    tcp_port: int = OURS_TCP_PORT,
    root_squash: bool = False,
) -> Iterator[OurServer]:
    """``nfsrdma serve`` on a fresh tmpfs, as knfsd's export is: no root squash (unless
    ``root_squash``: root then acts as 65534, every call an identity switch)."""
    export = Path(f"/tmp/{name}-export")
    export.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(export)], check=True)
    argv = [
        sys.executable, "-m", "nfsrdma", "-v", "serve", str(export),
        "--tcp-port", str(tcp_port), "--lease-time", "20",
        "--state-dir", f"/tmp/{name}-state", *extra,
    ]  # fmt: skip
    if not root_squash:
        argv.append("--no-root-squash")
    if rdma:
        argv += ["--rdma-port", str(OURS_RDMA_PORT)]
    else:
        argv += ["--no-rdma"]
    proc = Background(argv, log=out_dir() / f"{name}-server.log").start()
    try:
        proc.wait_ready(lambda: tcp_listening(tcp_port), timeout=120)
        if rdma:
            proc.wait_ready(lambda: rdma_listening(OURS_RDMA_PORT), timeout=60)
        yield OurServer(export, proc, rdma, tcp_port)
    finally:
        proc.stop()
        subprocess.run(["umount", "-l", str(export)], check=False)
