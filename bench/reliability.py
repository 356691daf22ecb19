"""What the reliability campaigns (fuzz_campaign, faults, soak, abuse) share: process figures
read from /proc (RSS, open descriptors), our server started as a subprocess on loopback,
progress lines on stderr, a catcher for errors the server logs, and percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size of ``pid`` in KiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class ServerProcess:
    """``python -m nfsrdma serve DIR --no-rdma`` on 127.0.0.1, its own process (so RSS and
    descriptors are the server's). ``extra`` are further ``serve`` options."""

    export: Path
    state_dir: Path
    extra: list[str] = field(default_factory=list)
    port: int = 0
    nofile: int | None = None  # the server's descriptor limit (RLIMIT_NOFILE), if set
    tree: Path = ROOT  # the source tree whose nfsrdma the server runs
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.port = self.port or free_port()
        self.log_path = self.state_dir / "server.log"
        argv = [
            sys.executable, "-m", "nfsrdma", "serve", str(self.export), "--no-rdma",
            "--bind", "127.0.0.1", "--tcp-port", str(self.port),
            "--state-dir", str(self.state_dir), *self.extra,
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(self.tree))
        nofile = self.nofile

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=log, cwd=self.tree, env=env, preexec_fn=limits
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not listen on 127.0.0.1:{self.port} in {timeout} s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"nfs://127.0.0.1:{self.port}/"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log_tail(self, n: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


@dataclass
class Crash:
    where: str
    what: str
    trace: str
    data: bytes = b""


class ErrorCatcher(logging.Handler):
    """Collects ERROR records (with their tracebacks) logged under ``nfsrdma``, and exceptions
    reaching the event loop's exception handler: each is a crash of the code under test."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.crashes: list[Crash] = []
        self.current: tuple[str, bytes] = ("", b"")

    def emit(self, record: logging.LogRecord) -> None:
        trace = ""
        if record.exc_info and record.exc_info[1] is not None:
            trace = "".join(traceback.format_exception(*record.exc_info))
        where, data = self.current
        self.crashes.append(Crash(where, record.getMessage(), trace, data))

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        trace = ""
        if isinstance(exc, BaseException):
            trace = "".join(traceback.format_exception(exc))
        where, data = self.current
        self.crashes.append(Crash(where, str(context.get("message")), trace, data))

    def exception(self, where: str, exc: BaseException, data: bytes) -> None:
        trace = "".join(traceback.format_exception(exc))
        self.crashes.append(Crash(where, repr(exc), trace, data))

    @contextlib.contextmanager
    def installed(self) -> Iterator[ErrorCatcher]:
        logger = logging.getLogger("nfsrdma")
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)


def report_crashes(crashes: Sequence[Crash], limit: int = 5) -> None:
    for c in crashes[:limit]:
        print(f"CRASH in {c.where}: {c.what}")
        if c.data:
            print(f"  input ({len(c.data)} bytes): {c.data[:512].hex()}")
        if c.trace:
            print("  " + c.trace.rstrip().replace("\n", "\n  "))
