"""Running as a service: the readiness protocol (``Type=notify``: READY=1 once the ports listen,
STOPPING=1 on SIGTERM), a clean stop that answers the COMPOUND in progress, and the systemd unit
in contrib/ as ``systemd-analyze verify`` sees it."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

import nfsrdma
from nfsrdma import sdnotify
from nfsrdma.client import ops
from nfsrdma.xdr.gen import nfs4
from tests.unit.service.notifyserver import REPO, Served, port_of, serve

UNIT = REPO / "contrib" / "nfsrdma.service"
PROGRAM = "/usr/local/bin/nfsrdma"


# -- the protocol ---------------------------------------------------------------------------------
def test_notify_sends_one_datagram_to_a_path_and_to_an_abstract_socket(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as path_sock:
        path_sock.bind(str(tmp_path / "n.sock"))
        env = {"NOTIFY_SOCKET": str(tmp_path / "n.sock")}
        assert sdnotify.notify("READY=1", "STATUS=up", env=env)
        assert path_sock.recv(100) == b"READY=1\nSTATUS=up"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as abstract:
        abstract.bind(f"\0nfsrdma-sdnotify-{os.getpid()}")
        assert sdnotify.notify(
            "STOPPING=1", env={"NOTIFY_SOCKET": f"@nfsrdma-sdnotify-{os.getpid()}"}
        )
        assert abstract.recv(100) == b"STOPPING=1"


def test_notify_without_a_service_manager_sends_nothing(tmp_path: Path) -> None:
    assert not sdnotify.notify("READY=1", env={})
    assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"})
    # A socket that is gone: logged, not raised (the server serves all the same).
    assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with pytest.raises(ValueError):
        sdnotify.notify("STATUS=two\nlines", env={"NOTIFY_SOCKET": "/x"})


# -- nfsrdma serve under a fake service manager -----------------------------------------------
@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_serve_says_ready_once_listening_and_stopping_on_sigterm(
    tmp_path: Path, abstract: bool
) -> None:
    served = serve(tmp_path, tmp_path / "export", abstract=abstract)
    try:
        ready = served.wait_for("READY")
        assert ready["READY"] == "1"
        assert int(ready["MAINPID"]) == served.proc.pid
        # READY came after the port listens: a connection is accepted at once.
        with socket.create_connection(("127.0.0.1", port_of(ready["STATUS"])), timeout=5):
            pass
        served.proc.send_signal(signal.SIGTERM)
        assert served.wait_for("STOPPING")["STOPPING"] == "1"
        assert served.proc.wait(30) == 0, served.log_tail()
    finally:
        served.kill()


def test_sigterm_answers_the_compound_in_progress_then_exits_0(tmp_path: Path) -> None:
    """A client's WRITE is held inside the server (the open(2) it makes in the server's I/O
    thread waits for the read lease this test holds to be given up); SIGTERM arrives; the server
    says STOPPING=1, the lease goes, and the client still gets its WRITE reply (and the data is
    on disk) before the server exits 0."""
    export = tmp_path / "export"
    held = export / "held"
    served = serve(tmp_path, export)
    try:
        port = port_of(served.wait_for("READY")["STATUS"])
        held.write_bytes(b"before")
        asyncio.run(_write_while_stopping(served, port, held))
        assert served.proc.wait(30) == 0, served.log_tail()
        assert held.read_bytes() == b"after!"
    finally:
        served.kill()


async def _write_while_stopping(served: Served, port: int, held: Path) -> None:
    loop = asyncio.get_running_loop()
    lease_broken = asyncio.Event()
    loop.add_signal_handler(signal.SIGIO, lease_broken.set)  # the kernel's lease-break signal
    fs = await nfsrdma.connect(f"nfs://127.0.0.1:{port}/", uid=0, gid=0, timeout=60.0)
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        # PUTFH, LOOKUP, WRITE with the anonymous stateid: the server opens the file for
        # writing in its I/O thread pool, and that open waits for our lease.
        anonymous = nfs4.stateid4(0, bytes(12))
        writing = asyncio.ensure_future(
            fs.session.compound(
                [
                    ops.putfh(fs.base_fh),
                    ops.lookup(b"held"),
                    ops.write(anonymous, 0, b"after!", nfs4.FILE_SYNC4),
                ],
                idempotent=False,
            )
        )
        broken = asyncio.ensure_future(lease_broken.wait())
        await asyncio.wait([writing, broken], return_when=asyncio.FIRST_COMPLETED, timeout=30)
        assert lease_broken.is_set(), f"the WRITE never reached the file: {writing}"
        assert not writing.done()
        served.proc.send_signal(signal.SIGTERM)
        await loop.run_in_executor(None, served.wait_for, "STOPPING")
        assert not writing.done()
    finally:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        loop.remove_signal_handler(signal.SIGIO)
    res = await asyncio.wait_for(writing, 30)  # answered although the server is stopping
    assert res.status == nfs4.NFS4_OK, res
    assert ops.results(res)[-1].count == 6
    await loop.run_in_executor(None, served.proc.wait, 30)
    await fs.session.close()


def test_the_wait_for_calls_in_progress_is_bounded(tmp_path: Path) -> None:
    """With --stop-timeout 1 and the WRITE held past it, the server closes the connection
    without the reply (the client's call fails), and exits 0 once the I/O thread is free."""
    export = tmp_path / "export"
    held = export / "held"
    served = serve(tmp_path, export, "--stop-timeout", "1")
    try:
        port = port_of(served.wait_for("READY")["STATUS"])
        held.write_bytes(b"before")
        asyncio.run(_write_past_the_bound(served, port, held))
        assert served.proc.wait(30) == 0, served.log_tail()
    finally:
        served.kill()


async def _write_past_the_bound(served: Served, port: int, held: Path) -> None:
    loop = asyncio.get_running_loop()
    lease_broken = asyncio.Event()
    loop.add_signal_handler(signal.SIGIO, lease_broken.set)
    fs = await nfsrdma.connect(f"nfs://127.0.0.1:{port}/", uid=0, gid=0, timeout=60.0)
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        writing = asyncio.ensure_future(
            fs.session.compound(
                [
                    ops.putfh(fs.base_fh),
                    ops.lookup(b"held"),
                    ops.write(nfs4.stateid4(0, bytes(12)), 0, b"after!", nfs4.FILE_SYNC4),
                ],
                idempotent=False,
            )
        )
        broken = asyncio.ensure_future(lease_broken.wait())
        await asyncio.wait([writing, broken], return_when=asyncio.FIRST_COMPLETED, timeout=30)
        assert lease_broken.is_set(), f"the WRITE never reached the file: {writing}"
        rpc = fs.session.rpc
        assert rpc is not None
        dropped = asyncio.Event()
        rpc.conn.on_closed(lambda c, exc: dropped.set())
        served.proc.send_signal(signal.SIGTERM)
        await loop.run_in_executor(None, served.wait_for, "STOPPING")
        # The lease is still held (the kernel would break it only after lease-break-time,
        # 45 s): only the bound ends the server's wait and closes our connection, unanswered.
        await asyncio.wait_for(dropped.wait(), 30)
        assert not writing.done()
    finally:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        loop.remove_signal_handler(signal.SIGIO)
    writing.cancel()
    await loop.run_in_executor(None, served.proc.wait, 30)
    await fs.session.close()


# -- the unit -------------------------------------------------------------------------------------
def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    assert tool is not None, "systemd-analyze is missing: scripts/setup.sh installs systemd"
    return subprocess.run(
        [tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )


def _installed_copy(tmp_path: Path, text: str) -> Path:
    """The unit as shipped except for the program's path: ``verify`` checks that ExecStart is
    executable, and /usr/local/bin/nfsrdma is where an installation puts it, not this tree."""
    program = REPO / ".venv" / "bin" / "nfsrdma"
    assert os.access(program, os.X_OK), program
    exec_start = f"\nExecStart={PROGRAM} "
    assert text.count(exec_start) == 1
    unit = tmp_path / "nfsrdma.service"
    unit.write_text(text.replace(exec_start, f"\nExecStart={program} "))
    return unit


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        f"ExecStart={PROGRAM} serve --exports /etc/nfsrdma/exports",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=nfsrdma",
        "LimitMEMLOCK=infinity",
    ):
        assert line in text.splitlines(), line
    caps = next(x for x in text.splitlines() if x.startswith("CapabilityBoundingSet="))
    for cap in ("DAC_OVERRIDE", "SETUID", "SETGID", "NET_BIND_SERVICE", "LEASE", "IPC_LOCK"):
        assert f"CAP_{cap}" in caps.split("=", 1)[1].split()
    got = _verify(_installed_copy(tmp_path, text))
    assert got.returncode == 0 and not got.stderr.strip() and not got.stdout.strip(), got


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above is not vacuous: the same tool rejects a damaged copy."""
    broken = UNIT.read_text().replace("Type=notify", "Type=notifyy")
    got = _verify(_installed_copy(tmp_path, broken))
    assert "notifyy" in got.stderr, got
