"""No client can take the descriptors every other client needs: opens (each holding a
descriptor) are budgeted server-wide, and the stateids of one client (opens, lock stateids)
per client; past either, a new OPEN or lock stateid gets NFS4ERR_DELAY, while the client's
other operations and every other client go on (``StateManager.check_room``).

The first test is the attack itself, against ``nfsrdma serve`` in its own process with a
small descriptor limit: before the budgets, one client's opens used up the descriptors and
the server could accept no other connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer
from nfsrdma.xdr.gen import nfs4

from .test_io_ops import NOCREATE, OK, Nfs, op, served

REPO = Path(__file__).resolve().parents[3]


def _wait_for_line(proc: subprocess.Popen[str], needle: str) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        if needle in line:
            return
    raise AssertionError(f"the server exited ({proc.wait()}) before saying {needle!r}")


async def test_one_client_opening_files_leaves_the_server_to_everyone(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    for i in range(400):
        (export / f"f{i}").write_bytes(b"x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "nfsrdma", "serve", str(export), "--bind", "127.0.0.1"]
    argv += ["--tcp-port", str(port), "--no-rdma", "--no-root-squash", "--no-admin-socket"]
    argv += ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen(
        ["prlimit", "--nofile=1024:1024", *argv],  # the hard limit too: serve cannot raise it
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    loop = asyncio.get_running_loop()
    url = f"nfs://127.0.0.1:{port}/"
    try:
        await loop.run_in_executor(None, _wait_for_line, proc, "serving")
        async with nc.connect(url, uid=0, gid=0, timeout=5, delay_deadline=1.0) as hog:
            held = []
            with pytest.raises(TimeoutError):  # NFS4ERR_DELAY, retried until the deadline
                for i in range(400):
                    held.append(await hog.open(f"f{i}", "rb"))
            assert 16 <= len(held) < 400 and hog.session.stats.delays > 0
            # Another client connects, opens and reads as many files as its share allows.
            async with nc.connect(url, uid=0, gid=0, timeout=5) as other:
                for i in range(len(held)):
                    assert await other.read_bytes(f"f{399 - i}") == b"x"
            await held[0].close()  # room again for the hog
            assert await (await hog.open("f399", "rb")).read() == b"x"
    finally:
        proc.terminate()
        await loop.run_in_executor(None, proc.wait)


def budgeted(
    tmp_path: Path, clients: int, **limits: int
) -> contextlib.AbstractAsyncContextManager[tuple[NFSServer, list[Nfs]]]:
    """Clients that give up NFS4ERR_DELAY after 0.3 s (TimeoutError), no delegations."""
    config = ServerConfig(delegations=False, **limits)
    return served(tmp_path, clients, config, delay_deadline=0.3)


async def test_budgets_of_one_client_and_of_the_server(tmp_path: Path) -> None:
    async with budgeted(tmp_path, 3, max_open_files=8, max_state_per_client=4) as (server, c):
        a, b, x = c
        assert server.state is not None
        sm = server.state.state_manager
        opened = [await a.open(f"a{i}".encode()) for i in range(4)]
        with pytest.raises(TimeoutError):  # A's share is used up: NFS4ERR_DELAY
            await a.open(b"a4")
        assert not (tmp_path / "export" / "a4").exists()  # refused before anything was made
        # A's existing state keeps working.
        fh, sid, _ = opened[0]
        assert await a.write(fh, sid, 0, b"data") is not None
        # B is not affected by A's use.
        for i in range(4):
            await b.open(f"b{i}".encode())
        assert sm.open_count == 8
        # The server's budget is used up: X gets NFS4ERR_DELAY although it holds nothing.
        with pytest.raises(TimeoutError):
            await x.open(b"x0")
        # A closes one: X may open (the server's budget), A still may not (its share is
        # free again, but the server's budget is taken by X now).
        await a.close(*opened[0][:2])
        await x.open(b"x0")
        with pytest.raises(TimeoutError):
            await a.open(b"a0", how=NOCREATE)
        assert sm.open_count == 8


async def test_lock_stateids_count_in_the_share_of_a_client(tmp_path: Path) -> None:
    async with budgeted(tmp_path, 1, max_open_files=100, max_state_per_client=3) as (_, c):
        (a,) = c
        fh, sid, _ = await a.open(b"l")
        await a.on(fh, OK, a.lock_new(sid, b"pid1", 0, 10))
        await a.on(fh, OK, a.lock_new(sid, b"pid2", 20, 10))
        # a third lock-owner would be a fourth stateid: refused before any lock is taken
        with pytest.raises(TimeoutError):  # NFS4ERR_DELAY, retried until the deadline
            await a.on(fh, OK, a.lock_new(sid, b"pid3", 40, 10))
        lockt = nfs4.LOCKT4args(nfs4.WRITE_LT, 40, 10, nfs4.state_owner4(0, b"pid9"))
        await a.on(fh, OK, op(nfs4.OP_LOCKT, lockt))  # nothing was locked at 40
