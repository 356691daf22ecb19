"""Our own NFSv4.1 server (nfsrdma.server) in a child process, for the client tests.

``python -m tests.unit.client.ourserver DIR PORT [FD]`` serves DIR (or ``ceph:CONF``: the root of
that Ceph cluster's CephFS, through the libcephfs backend) (as the pseudo-root, no root
squashing, 10 s leases) on 127.0.0.1:PORT until killed; once it listens it writes ``ready`` to the
pipe FD, which is how ``OurServer.start`` knows (no polling). A server that exits or does not
become ready within the deadline makes ``start`` raise, and the fixtures then FAIL."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
READY = b"ready\n"
START_TIMEOUT = 30.0  # a guard only: start() returns as soon as the server says it listens


@dataclass
class OurServer:
    workdir: Path
    port: int
    export_dir: Path | None
    pseudo: str = ""
    ceph_conf: Path | None = None  # serve CephFS (this cluster's root) instead of export_dir
    proc: subprocess.Popen[bytes] | None = None
    max_file: int = 1 << 40
    name: str = "ours"

    def url(self, port: int | None = None) -> str:
        return f"nfs://127.0.0.1:{port or self.port}/"

    def start(self) -> OurServer:
        if self.ceph_conf is not None:
            served = f"ceph:{self.ceph_conf}"
        else:
            assert self.export_dir is not None
            self.export_dir.mkdir(parents=True, exist_ok=True)
            served = str(self.export_dir)
        log = open(self.workdir / "server.log", "wb")  # noqa: SIM115 - the child keeps it
        ready_r, ready_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.unit.client.ourserver",
                    served,
                    str(self.port),
                    str(ready_w),
                ],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(ready_w,),
            )
            os.close(ready_w)
            ready_w = -1
            # Readable when the server wrote "ready", or at EOF when it exited first.
            readable, _, _ = select.select([ready_r], [], [], START_TIMEOUT)
            said = os.read(ready_r, 64) if readable else None
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)
        if said == READY:
            return self
        if said is None:
            self.stop()
            raise RuntimeError(f"our server not ready within {START_TIMEOUT} s: {self.log_tail()}")
        self.proc.wait(5)
        raise RuntimeError(f"our server exited ({self.proc.returncode}): {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.workdir / "server.log").read_text().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


async def _serve(directory: str, port: int, ready_fd: int | None) -> None:
    import functools

    from nfsrdma.server import NFSServer
    from nfsrdma.vfs.ceph.vfs import CephVfs

    backend = None
    if directory.startswith("ceph:"):  # CephFS through libcephfs, this ceph.conf's cluster
        backend = functools.partial(CephVfs, conf=directory.removeprefix("ceph:"))
        directory = "cephfs:/"
    server = NFSServer(
        directory,
        bind="127.0.0.1",
        tcp_port=port,
        root_squash=False,
        lease_time=10,
        state_dir=os.environ.get("NFSRDMA_TEST_STATE_DIR"),
        backend=backend,
    )
    await server.start()
    if ready_fd is not None:
        os.write(ready_fd, READY)
        os.close(ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.close()


if __name__ == "__main__":
    os.umask(0o022)
    asyncio.run(
        _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
    )
