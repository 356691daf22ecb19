"""`nfsrdma serve` with a state directory it cannot use: one clear line, non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_unusable_state_dir_is_one_error_line_naming_the_option(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    state = not_a_dir / "state"  # cannot be created, even by root
    cmd = [sys.executable, "-m", "nfsrdma", "serve", str(export), "--bind", "127.0.0.1"]
    cmd += ["--tcp-port", "0", "--no-rdma", "--state-dir", str(state)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired as e:  # it started serving: the error was not detected
        raise AssertionError(f"the server started: {e.stderr!r}") from None
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert len(lines) == 1, lines
    assert "--state-dir" in lines[0] and str(state) in lines[0], lines[0]
    assert not state.exists()
