"""`nfsrdma serve` whose client records (in the state directory) are damaged: one clear line
naming the file and the option, non-zero exit; it does not start with a grace period built on
records it cannot read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nfsrdma.vfs import Export
from nfsrdma.vfs.clientdb import ClientDb

REPO = Path(__file__).resolve().parents[3]


def test_damaged_client_records_are_one_error_line(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = ClientDb.for_export(Export(str(export), state_dir=str(state)))
    fd = os.open(db.path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'{"clients": "not a list"}')
    os.close(fd)
    cmd = [sys.executable, "-m", "nfsrdma", "serve", str(export), "--bind", "127.0.0.1"]
    cmd += ["--tcp-port", "0", "--no-rdma", "--state-dir", str(state), "--grace-time", "5"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired as e:  # it started serving: the damage was not seen
        raise AssertionError(f"the server started: {e.stderr!r}") from None
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert len(lines) == 1, lines
    assert "--state-dir" in lines[0] and "damaged" in lines[0] and db.path in lines[0], lines[0]
