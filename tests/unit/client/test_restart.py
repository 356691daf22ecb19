"""Recovery when the server restarts under open files (SS-13; RFC 8881 8.4.2): the connection
drops, BIND_CONN_TO_SESSION finds no session, CREATE_SESSION finds no client id; a new
EXCHANGE_ID, reclaim attempts (CLAIM_PREVIOUS), RECLAIM_COMPLETE, then the open is made again
(CLAIM_FH) and I/O on the same file object carries on."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

import nfsrdma.client as nc

from . import ganesha as g


@pytest.fixture
def own_ganesha(tmp_path: Path) -> g.Ganesha:
    """Ganesha with the VFS FSAL (files must survive the restart). ``scripts/setup.sh`` installs
    it, so a missing Ganesha, a missing VFS FSAL or a Ganesha that does not start FAILS; only a
    non-root run skips (the VFS FSAL opens files by handle, which needs root; CI runs as root)."""
    why = g.available()
    if why is not None:
        pytest.fail(f"{why}; scripts/setup.sh installs it")
    if not (g.PLUGINS / "libfsalvfs.so").exists():
        pytest.fail("the VFS FSAL is missing (nfs-ganesha-vfs; scripts/setup.sh installs it)")
    server = g.Ganesha(tmp_path / "work", g.free_port(), "/export", tmp_path / "export")
    server.workdir.mkdir()
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(f"ganesha did not start: {e}")
    yield server  # type: ignore[misc]
    server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="the VFS FSAL needs root (CI runs as root)")
async def test_server_restart_under_an_open_file(own_ganesha: g.Ganesha) -> None:
    first = os.urandom(1 << 20)
    second = os.urandom(1 << 20)
    async with nc.connect(own_ganesha.url(), uid=0, gid=0, timeout=2.0) as fs:
        f = await fs.open("f", "wb")
        await f.write(first)
        await f.fsync()
        own_ganesha.stop()
        t0 = time.monotonic()
        own_ganesha.start()
        await f.write(second)  # the same file object, after the restart
        await f.close()
        s = fs.session.stats
        assert s.clients == 2 and s.sessions == 2 and s.connects >= 2
        assert time.monotonic() - t0 < 30
        back = await fs.read_bytes("f")
        assert hashlib.sha256(back).digest() == hashlib.sha256(first + second).digest()
        # CLAIM_PREVIOUS offered and refused (Graceless: no grace period), then CLAIM_FH.
        assert (s.reclaim_attempts, s.reclaimed, s.reopens) == (1, 0, 1)
    assert own_ganesha.export_dir is not None
    assert (own_ganesha.export_dir / "f").read_bytes() == first + second
