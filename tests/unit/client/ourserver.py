"""Our own NFSv4.1 server (nfsrdma.server) in a child process, for the client tests.

``python -m tests.unit.client.ourserver DIR PORT`` serves DIR (as the pseudo-root, no root
squashing, 10 s leases) on 127.0.0.1:PORT until killed."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


@dataclass
class OurServer:
    workdir: Path
    port: int
    export_dir: Path
    pseudo: str = ""
    proc: subprocess.Popen[bytes] | None = None
    max_file: int = 1 << 40
    name: str = "ours"

    def url(self, port: int | None = None) -> str:
        return f"nfs://127.0.0.1:{port or self.port}/"

    def start(self) -> OurServer:
        self.export_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "server.log", "wb")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.unit.client.ourserver",
                str(self.export_dir),
                str(self.port),
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"our server exited: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"our server did not listen: {self.log_tail()}")

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


async def _serve(directory: str, port: int) -> None:
    from nfsrdma.server import NFSServer

    server = NFSServer(directory, bind="127.0.0.1", tcp_port=port, root_squash=False, lease_time=10)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.close()


if __name__ == "__main__":
    os.umask(0o022)
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))
