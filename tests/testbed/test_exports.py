"""Exports with client rules against the Linux client (issue 15): our server started with
``--exports``; the Linux client mounts an export it has a rule for over TCP and over RDMA
(directly, and by crossing from the pseudo-root into it), and is refused one it has no rule
for: the mount fails with "access denied" (NFS4ERR_ACCESS on the LOOKUP into it)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nfsrdma.testbed.helpers import (
    Background,
    CommandError,
    Knfsd,
    MountFactory,
    NfsServer,
    Proto,
    out_dir,
    rdma_listening,
    tcp_listening,
)
from nfsrdma.testbed.helpers import (
    testbed_addr as guest_addr,
)
from nfsrdma.testbed.ours import OURS_RDMA_PORT, OURS_TCP_PORT

pytestmark = pytest.mark.testbed

BASE = Path("/tmp/exports-tb")
ALLOWED = BASE / "srv" / "allowed"
FORBIDDEN = BASE / "srv" / "forbidden"
READONLY = BASE / "pub"
SQUASHED = BASE / "srv" / "squashed"


@pytest.fixture(scope="module")
def exports_server(knfsd: Knfsd) -> Iterator[Path]:
    """``nfsrdma serve --exports`` on a tmpfs: one export for this guest's address (the
    Linux client's source address, TCP and RDMA alike), one only for an address that is not
    here, and a read-only one for everybody."""
    BASE.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(BASE)], check=True)
    for d in (ALLOWED, FORBIDDEN, READONLY, SQUASHED):
        d.mkdir(parents=True)
    SQUASHED.chmod(0o777)
    (READONLY / "hello").write_text("hello\n")
    addr = guest_addr()
    exports = out_dir() / "exports-test.exports"
    exports.write_text(
        "# the guest's own address is the Linux client's source address\n"
        f"{ALLOWED}   {addr}(rw,no_root_squash) 127.0.0.1(rw,no_root_squash)\n"
        f"{SQUASHED}  {addr}(rw) 127.0.0.1(rw)\n"
        f"{FORBIDDEN} 192.0.2.1(rw,no_root_squash)\n"
        f"{READONLY}  *(ro,insecure,no_root_squash)\n"
    )
    argv = [
        sys.executable, "-m", "nfsrdma", "-v", "serve", "--exports", str(exports),
        "--tcp-port", str(OURS_TCP_PORT), "--rdma-port", str(OURS_RDMA_PORT),
        "--lease-time", "20", "--state-dir", "/tmp/exports-tb-state",
    ]  # fmt: skip
    proc = Background(argv, log=out_dir() / "exports-server.log").start()
    try:
        proc.wait_ready(lambda: tcp_listening(OURS_TCP_PORT), timeout=120)
        proc.wait_ready(lambda: rdma_listening(OURS_RDMA_PORT), timeout=60)
        yield exports
    finally:
        proc.stop()
        subprocess.run(["umount", "-l", str(BASE)], check=False)


def server(proto: Proto, path: Path | str) -> NfsServer:
    port = OURS_RDMA_PORT if proto == "rdma" else OURS_TCP_PORT
    return NfsServer(guest_addr(), port, proto, str(path))


@pytest.mark.parametrize("proto", ["tcp", "rdma"])
def test_linux_client_mounts_allowed_and_is_refused_forbidden(
    proto: Proto, exports_server: Path, nfs_mount: MountFactory
) -> None:
    # An export the client has a rule for: mounted, written, read back; root is not squashed.
    with nfs_mount(server(proto, ALLOWED)) as m:
        assert m.stats().xprt == proto
        f = m.mountpoint / f"written-over-{proto}"
        f.write_bytes(b"x" * 10000)
        assert f.read_bytes() == b"x" * 10000
        on_server = ALLOWED / f.name
        assert on_server.read_bytes() == b"x" * 10000
        assert on_server.stat().st_uid == 0
    # One it has no rule for: the mount is refused.
    with pytest.raises(CommandError) as e:
        nfs_mount(server(proto, FORBIDDEN))
    assert "denied" in (e.value.stderr + e.value.stdout).lower(), e.value
    # The read-only one: readable; SETATTR answers NFS4ERR_ROFS (EROFS); a create is refused
    # (the client may already stop at ACCESS, which grants no modify bits, as knfsd's).
    with nfs_mount(server(proto, READONLY)) as m:
        hello = m.mountpoint / "hello"
        assert hello.read_text() == "hello\n"
        with pytest.raises(OSError) as err:
            os.chmod(hello, 0o600)
        assert err.value.errno == errno.EROFS
        with pytest.raises(OSError):
            (m.mountpoint / "new").write_text("no")
        assert not (READONLY / "new").exists()
        assert (READONLY / "hello").stat().st_mode & 0o777 != 0o600


def test_pseudo_root_shows_only_what_the_client_may_see(
    exports_server: Path, nfs_mount: MountFactory
) -> None:
    with nfs_mount(server("tcp", "/")) as m:
        srv = m.mountpoint / BASE.relative_to("/") / "srv"
        # The pseudo directory lists the exports the client may use, not the forbidden one.
        assert sorted(os.listdir(srv)) == ["allowed", "squashed"]
        assert sorted(os.listdir(srv.parent)) == ["pub", "srv"]
        # Crossing from the pseudo fs into the export: the kernel sees another fsid and
        # mounts it below (a submount), and the export's files are there.
        inside = srv / "allowed"
        (inside / "crossed").write_text("across\n")
        assert (ALLOWED / "crossed").read_text() == "across\n"
        assert os.stat(inside).st_dev != os.stat(srv).st_dev
        with pytest.raises(PermissionError):
            os.listdir(srv / "forbidden")


def test_squashed_requests_leave_rdma_working(
    exports_server: Path, nfs_mount: MountFactory
) -> None:
    """A squashed root acts as 65534 on the server, an identity switch; the thread that
    drives RDMA must not make it, or the kernel refuses its later RDMA-CM and verbs commands
    (EACCES on every Send over soft-RoCE, and on the next connection's CM events). Two RDMA
    mounts one after the other, each writing as the squashed root, both work."""
    for n in range(2):
        with nfs_mount(server("rdma", SQUASHED)) as m:
            assert m.stats().xprt == "rdma"
            f = m.mountpoint / f"squashed-{n}"
            f.write_bytes(b"y" * 20000)
            assert f.read_bytes() == b"y" * 20000
            assert (SQUASHED / f.name).stat().st_uid == 65534
