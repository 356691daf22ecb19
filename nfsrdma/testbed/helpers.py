"""Reusable pieces for code running inside the test-bed guest: commands, NFS mounts,
page-cache dropping, listener readiness, background servers, artefacts.

The parsers (``parse_mountstats``, ``tcp_listening_ports``, ``rdma_listening_ports``) are
pure and testable anywhere; everything else needs the guest (root, real kernel).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from nfsrdma.testbed.constants import (
    ENV_ADDR,
    ENV_EXPORT,
    ENV_OUT,
    GUEST_ADDR,
    KNFSD_RDMA_PORT,
    KNFSD_TCP_PORT,
    RXE_DEVICE,
)

Proto = Literal["rdma", "tcp"]


class CommandError(RuntimeError):
    """A command exited non-zero (or timed out); the message carries its output."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str):
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        status = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(
            f"{' '.join(self.argv)} {status}\n--- stdout\n{_tail(stdout)}\n--- stderr\n{_tail(stderr)}"
        )


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True, slots=True)
class GuestEnv:
    """What the test bed tells the command it runs (``TESTBED_*``)."""

    addr: str
    out: Path
    rxe: str = RXE_DEVICE


def in_testbed() -> bool:
    """True inside the guest started by ``nfsrdma testbed run``."""
    return ENV_ADDR in os.environ


def testbed_addr() -> str:
    return os.environ.get(ENV_ADDR, GUEST_ADDR)


def out_dir() -> Path:
    """The results directory the host keeps (``TESTBED_OUT``)."""
    try:
        return Path(os.environ[ENV_OUT])
    except KeyError:
        raise RuntimeError(f"{ENV_OUT} is not set: not inside the test bed") from None


def export_dir() -> Path:
    """The directory knfsd exports (``TESTBED_EXPORT``); set only with ``--knfsd``."""
    try:
        return Path(os.environ[ENV_EXPORT])
    except KeyError:
        raise RuntimeError(
            f"{ENV_EXPORT} is not set: the test bed was started without --knfsd"
        ) from None


def artefact_dir(name: str) -> Path:
    """A directory under ``TESTBED_OUT`` for one test's or one run's artefacts."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "artefact"
    path = out_dir() / "artefacts" / safe
    path.mkdir(parents=True, exist_ok=True)
    return path


def run(
    argv: Sequence[str],
    *,
    timeout: float = 120.0,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output as text; raise :class:`CommandError` on failure."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            input=input,
            env=None if env is None else dict(env),
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CommandError(argv, None, _text(exc.stdout), _text(exc.stderr)) from None
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stdout, proc.stderr)
    return proc


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def drop_caches() -> None:
    """Write back dirty pages, then drop the page cache, dentries and inodes."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# NFS mounts


@dataclass(frozen=True, slots=True)
class NfsServer:
    """Where an NFS server listens inside the guest, and the path clients mount."""

    addr: str
    port: int
    proto: Proto
    path: str = "/"

    @property
    def source(self) -> str:
        return f"{self.addr}:{self.path}"

    @classmethod
    def knfsd(cls, proto: Proto = "rdma", addr: str | None = None) -> NfsServer:
        port = KNFSD_RDMA_PORT if proto == "rdma" else KNFSD_TCP_PORT
        return cls(addr or testbed_addr(), port, proto)


@dataclass(frozen=True, slots=True)
class Knfsd:
    """knfsd as the test bed starts it (``--knfsd``)."""

    addr: str
    export: Path
    rdma_port: int = KNFSD_RDMA_PORT
    tcp_port: int = KNFSD_TCP_PORT

    def server(self, proto: Proto) -> NfsServer:
        return NfsServer(self.addr, self.rdma_port if proto == "rdma" else self.tcp_port, proto)

    @staticmethod
    def listeners() -> set[str]:
        """knfsd's listeners as ``{"rdma 20049", "tcp 2049", ...}`` (empty if not running)."""
        try:
            text = Path("/proc/fs/nfsd/portlist").read_text()
        except OSError:
            return set()
        return {line.strip() for line in text.splitlines() if line.strip()}


@dataclass(frozen=True, slots=True)
class MountStats:
    """The parts of one ``/proc/self/mountstats`` entry the tests look at."""

    device: str
    mountpoint: str
    fstype: str
    opts: dict[str, str] = field(default_factory=dict)
    xprt: str | None = None  # "rdma", "tcp", ...
    xprt_fields: tuple[int, ...] = ()
    # bytes: normalread normalwrite directread directwrite serverread serverwrite readpages writepages
    byte_counts: tuple[int, ...] = ()

    @property
    def server_read_bytes(self) -> int:
        return self.byte_counts[4] if len(self.byte_counts) > 4 else 0

    @property
    def server_write_bytes(self) -> int:
        return self.byte_counts[5] if len(self.byte_counts) > 5 else 0


_DEVICE_RE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)")


def parse_mountstats(text: str) -> list[MountStats]:
    """Parse ``/proc/self/mountstats`` into one :class:`MountStats` per mount."""
    result: list[MountStats] = []
    for block in re.split(r"(?m)^(?=device )", text):
        head, _, body = block.partition("\n")
        m = _DEVICE_RE.match(head)
        if m is None:
            continue
        opts: dict[str, str] = {}
        xprt: str | None = None
        xprt_fields: tuple[int, ...] = ()
        counts: tuple[int, ...] = ()
        for line in body.splitlines():
            key, _, rest = line.strip().partition(":")
            values = rest.split()
            if key == "opts" and values:
                for item in values[0].split(","):
                    name, _, val = item.partition("=")
                    opts[name] = val
            elif key == "xprt" and values:
                xprt = values[0]
                xprt_fields = tuple(int(v) for v in values[1:] if v.isdigit())
            elif key == "bytes":
                counts = tuple(int(v) for v in values if v.isdigit())
        result.append(
            MountStats(
                device=_unescape(m.group(1)),
                mountpoint=_unescape(m.group(2)),
                fstype=m.group(3),
                opts=opts,
                xprt=xprt,
                xprt_fields=xprt_fields,
                byte_counts=counts,
            )
        )
    return result


def _unescape(field_: str) -> str:
    # The kernel escapes space, tab, newline and backslash in octal (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def mountstats(mountpoint: str | Path) -> MountStats:
    """The mountstats entry of one mount point (the last one, if mounted over)."""
    want = os.path.realpath(mountpoint)
    entries = [
        e
        for e in parse_mountstats(Path("/proc/self/mountstats").read_text())
        if e.mountpoint == want
    ]
    if not entries:
        raise LookupError(f"{want} is not in /proc/self/mountstats")
    return entries[-1]


def is_mounted(mountpoint: str | Path) -> bool:
    return os.path.ismount(mountpoint)


class TransportMismatch(RuntimeError):
    """The kernel mounted over another transport than asked (see :func:`mount_nfs`)."""


@dataclass(slots=True)
class NfsMount:
    """A Linux-client NFS mount made by :func:`mount_nfs`; a context manager that unmounts."""

    server: NfsServer
    mountpoint: Path
    options: tuple[str, ...]

    def stats(self) -> MountStats:
        return mountstats(self.mountpoint)

    @property
    def xprt(self) -> str | None:
        return self.stats().xprt

    def umount(self, *, timeout: float = 120.0) -> None:
        if is_mounted(self.mountpoint):
            umount(self.mountpoint, timeout=timeout)

    def __enter__(self) -> NfsMount:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.umount()


def mount_nfs(
    server: NfsServer,
    mountpoint: str | Path,
    *,
    vers: str = "4.1",
    options: Sequence[str] = (),
    timeout: float = 120.0,
    check_xprt: bool = True,
) -> NfsMount:
    """Mount ``server`` with the Linux NFS client at ``mountpoint`` (created if missing).

    With ``check_xprt`` the mount is verified to use ``server.proto``: while a mount of the
    same server over another transport exists, NFSv4.1 trunking makes the kernel silently
    reuse that transport; this raises :class:`TransportMismatch` (after unmounting) instead.
    """
    mnt = Path(mountpoint)
    mnt.mkdir(parents=True, exist_ok=True)
    opts = [f"vers={vers}", f"proto={server.proto}", f"port={server.port}", *options]
    run(
        ["mount", "-t", "nfs", "-o", ",".join(opts), server.source, str(mnt)],
        timeout=timeout,
    )
    mount = NfsMount(server, mnt, tuple(opts))
    if check_xprt:
        got = mount.xprt
        if got != server.proto:
            mount.umount()
            raise TransportMismatch(
                f"asked for proto={server.proto} but the mount uses xprt {got!r}: "
                "unmount other mounts of this server first"
            )
    return mount


def umount(mountpoint: str | Path, *, timeout: float = 120.0, lazy: bool = False) -> None:
    argv = ["umount", *(["-l"] if lazy else []), str(mountpoint)]
    run(argv, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# Listener readiness


_TCP_LISTEN = "0A"


def tcp_listening_ports(proc_net_text: str) -> set[int]:
    """Local ports in LISTEN state from the text of ``/proc/net/tcp`` or ``tcp6``."""
    ports: set[int] = set()
    for line in proc_net_text.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 3 and cols[3] == _TCP_LISTEN and ":" in cols[1]:
            ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


_CM_LISTEN_RE = re.compile(r"state LISTEN\b.*?\bsrc-addr (\S+)")


def rdma_listening_ports(rdma_res_text: str) -> set[int]:
    """Ports of listening RDMA-CM ids from the output of ``rdma res show cm_id``."""
    ports: set[int] = set()
    for m in _CM_LISTEN_RE.finditer(rdma_res_text):
        addr = m.group(1)
        tail = addr.rsplit(":", 1)[-1]
        if tail.isdigit():
            ports.add(int(tail))
    return ports


def tcp_listening(port: int) -> bool:
    ports: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            ports |= tcp_listening_ports(Path(name).read_text())
    return port in ports


def rdma_listening(port: int) -> bool:
    out = run(["rdma", "res", "show", "cm_id"], check=False, timeout=30).stdout
    return port in rdma_listening_ports(out)


# ---------------------------------------------------------------------------------------------
# Background processes (servers run next to the test)


class Background:
    """A process in its own process group, output to a log file, stopped on exit.

    ``with Background([...], log=path) as srv: srv.wait_ready(lambda: tcp_listening(2050))``
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.argv = tuple(argv)
        self.log = log
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Background:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return _tail(self.log.read_text(errors="replace"), lines)
        except OSError:
            return ""

    def wait_ready(self, predicate: Callable[[], bool], *, timeout: float = 60.0) -> None:
        """Poll ``predicate`` until true; fail early if the process exits."""
        proc = self._started()
        deadline = time.monotonic() + timeout
        while not predicate():
            rc = proc.poll()
            if rc is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited {rc} before it was ready\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.argv[0]} not ready within {timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL after ``timeout``; return the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def _started(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError("Background process not started")
        return self.proc

    def __enter__(self) -> Background:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# Signatures of the factories the test-bed fixtures hand out (tests/testbed/conftest.py).
MountFactory = Callable[..., NfsMount]
BackgroundFactory = Callable[..., Background]
