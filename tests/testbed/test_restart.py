"""Our server killed and restarted under the Linux client (RFC 8881 sections 8.4.2, 18.51;
issue 11 section 2): the client reclaims its open and its POSIX lock in the grace period, the
writer carries on without an error, the lock is still held and no data is lost.

The writer and the lock probe are separate processes (separate lock owners); they report
through pipes, and every wait is bounded."""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nfsrdma.testbed.helpers import (
    Background,
    MountFactory,
    NfsMount,
    NfsServer,
    Proto,
    rdma_listening,
    tcp_listening,
)
from nfsrdma.testbed.helpers import (
    testbed_addr as guest_addr,
)
from nfsrdma.testbed.ours import OURS_RDMA_PORT, OURS_TCP_PORT

pytestmark = pytest.mark.testbed

LEASE = "10"
RECOVERY_TIMEOUT = 180.0  # the kernel client notices, reconnects, reclaims, resends
CHUNK1 = b"before the restart\n" * 512
CHUNK2 = b"after the restart\n" * 512

# The writer: open for writing, F_SETLK a write lock over the whole file, write and fsync,
# say "ready"; on "go" write and fsync more and say "written"; on "check" test that the lock is
# still ours, say "held"; on "close" close (dropping the lock), say "closed". Any error: "error
# <text>" and exit 1.
WRITER = r"""
import fcntl, os, sys
def say(s):
    sys.stdout.write(s + "\n"); sys.stdout.flush()
try:
    path, chunk1, chunk2 = sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, chunk1); os.fsync(fd)
    say("ready")
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "go":
            os.write(fd, chunk2); os.fsync(fd); say("written")
        elif cmd == "check":
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: succeeds
            say("held")
        elif cmd == "close":
            os.close(fd); say("closed"); break
except Exception as e:
    say("error " + repr(e)); sys.exit(1)
"""

# Another lock owner: F_SETLK a write lock; prints "conflict <errno>" or "acquired".
PROBE = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as e:
    print("conflict", e.errno)
else:
    print("acquired")
"""


def _argv(export: Path, state: Path, proto: Proto, delegations: bool) -> list[str]:
    argv = [
        sys.executable, "-m", "nfsrdma", "-v", "serve", str(export),
        "--tcp-port", str(OURS_TCP_PORT), "--no-root-squash",
        "--lease-time", LEASE, "--grace-time", LEASE, "--state-dir", str(state),
    ]  # fmt: skip
    if proto == "rdma":
        argv += ["--rdma-port", str(OURS_RDMA_PORT)]
    else:
        argv += ["--no-rdma"]
    if not delegations:
        argv += ["--no-delegations"]
    return argv


def _start(argv: list[str], log: Path, proto: Proto) -> Background:
    proc = Background(argv, log=log).start()
    proc.wait_ready(lambda: tcp_listening(OURS_TCP_PORT), timeout=120)
    if proto == "rdma":
        proc.wait_ready(lambda: rdma_listening(OURS_RDMA_PORT), timeout=60)
    return proc


def _kill9(proc: Background) -> None:
    assert proc.proc is not None
    os.killpg(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(30)


@contextmanager
def _tmpfs(path: Path) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class Writer:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), CHUNK1.hex(), CHUNK2.hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def expect(self, word: str, timeout: float) -> None:
        """Wait (bounded) for the writer's next line; it must be ``word``."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the writer said nothing within {timeout:.0f} s (waiting for {word})"
        line = self.proc.stdout.readline().decode(errors="replace").strip()
        assert line == word, f"writer: {line!r} (expected {word!r})"

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def _probe(path: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=RECOVERY_TIMEOUT,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.parametrize(("proto", "delegations"), [("tcp", False), ("rdma", False), ("tcp", True)])
def test_writer_survives_server_restart(
    proto: Proto, delegations: bool, rxe: str, nfs_mount: MountFactory, artefacts: Path
) -> None:
    """kill -9 of our server and a restart on the same export and state dir: the Linux
    client reclaims (OPEN CLAIM_PREVIOUS, LOCK reclaim, RECLAIM_COMPLETE); the writer's
    next write and fsync succeed, its lock still excludes another process, and the file holds
    exactly what was written. Without delegations the lock is the server's and is reclaimed;
    with them the writer (opening the existing file) holds a write delegation (the client keeps
    its lock locally, RFC 8881 section 10.4), which it reclaims with the open and gets again."""
    base = Path(f"/tmp/restart-{proto}-{'deleg' if delegations else 'nodeleg'}")
    state = base / "state"
    with _tmpfs(base / "export") as export:
        argv = _argv(export, state, proto, delegations)
        first = _start(argv, artefacts / "server-1.log", proto)
        second: Background | None = None
        writer: Writer | None = None
        m: NfsMount | None = None
        port = OURS_RDMA_PORT if proto == "rdma" else OURS_TCP_PORT
        try:
            m = nfs_mount(NfsServer(guest_addr(), port, proto))
            path = m.mountpoint / "locked-file"
            # The file exists before the writer opens it: an OPEN that creates the file gets
            # no delegation (the server's policy), one of an existing file a write delegation.
            (export / "locked-file").write_bytes(b"")
            writer = Writer(path)
            writer.expect("ready", 120)
            conflict = _probe(path)
            assert conflict.startswith("conflict"), f"before the restart: {conflict}"

            _kill9(first)
            second = _start(argv, artefacts / "server-2.log", proto)
            writer.send("go")  # the fsync needs the server: the client recovers first
            writer.expect("written", RECOVERY_TIMEOUT)
            writer.send("check")
            writer.expect("held", 60)
            after = _probe(path)
            code = int(after.split()[1]) if after.startswith("conflict ") else None
            assert code in (errno.EAGAIN, errno.EACCES), f"after the restart: {after}"
            assert (export / "locked-file").read_bytes() == CHUNK1 + CHUNK2
            assert path.read_bytes() == CHUNK1 + CHUNK2

            log = (artefacts / "server-2.log").read_text(errors="replace")
            assert "grace period of 10s: 1 clients may reclaim" in log
            locks = 0 if delegations else 1
            over = (
                f"grace period over (every client reclaimed): 1 opens and {locks} locks reclaimed"
            )
            assert over in log
            if delegations:  # the reclaimed open got its write delegation back
                assert "write delegation granted" in log

            writer.send("close")
            writer.expect("closed", 60)
            assert _probe(path) == "acquired"  # the lock was the writer's, and it is gone
        finally:
            if writer is not None:
                writer.stop()
            if m is not None:
                m.umount(timeout=120)  # while a server still answers
            for srv in (second, first):
                if srv is not None:
                    srv.stop()
