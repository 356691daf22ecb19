"""``nfsrdma serve`` in a child process under a fake service manager: a datagram socket bound
by the test (a path or an abstract name) that the child finds in ``NOTIFY_SOCKET``, as systemd
hands it to a ``Type=notify`` service. ``Served.wait_for(KEY)`` returns the next notification
that carries KEY (a socket timeout guards a server that never says it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GUARD = 30.0  # seconds: only a guard against a server that never notifies


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    log: Path
    seen: list[dict[str, str]] = field(default_factory=list)

    def wait_for(self, key: str) -> dict[str, str]:
        """The next notification that sets ``key``; AssertionError if the child exits first."""
        self.sock.settimeout(GUARD)
        while True:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                raise AssertionError(f"no {key} within {GUARD} s: {self.log_tail()}") from None
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
            self.seen.append(fields)
            if key in fields:
                return fields

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


def bind_notify_socket(where: Path, abstract: bool) -> tuple[socket.socket, str]:
    """A datagram socket like systemd's; returns it and the NOTIFY_SOCKET value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    if abstract:
        name = f"nfsrdma-test-notify-{os.getpid()}-{where.name}"
        sock.bind("\0" + name)
        return sock, "@" + name
    path = str(where / "notify.sock")
    sock.bind(path)
    return sock, path


def serve(work: Path, export: Path, *args: str, abstract: bool = False) -> Served:
    """Start ``nfsrdma serve EXPORT`` (TCP only, on 127.0.0.1, an ephemeral port)."""
    export.mkdir(parents=True, exist_ok=True)
    sock, address = bind_notify_socket(work, abstract)
    log = work / "server.log"
    env = {**os.environ, "NOTIFY_SOCKET": address, "PYTHONPATH": str(REPO)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "nfsrdma", "serve", str(export),
                "--no-rdma", "--bind", "127.0.0.1", "--tcp-port", "0",
                "--state-dir", str(work / "state"), "--no-root-squash", *args,
            ],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return Served(proc, sock, log)


def port_of(status: str) -> int:
    """The TCP port in the READY notification's STATUS line."""
    words = status.replace(",", " ").split()
    return int(words[words.index("port") + 1])
