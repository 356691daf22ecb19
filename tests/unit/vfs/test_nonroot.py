"""The unprivileged paths, in a subprocess under `setpriv --reuid=65534`: no identity switching
(every client acts as the server's user), in-memory handles (stale after a restart), and mount
points refused without open_tree."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import needs_root

pytestmark = needs_root
REPO = Path(__file__).resolve().parents[3]
NOBODY = 65534

SCRIPT = textwrap.dedent(
    """
    import errno, io, json, logging, os, sys
    from nfsrdma.vfs import BadHandle, Cred, Export, FileType, LocalVfs, StaleHandle
    log = io.StringIO()
    logging.basicConfig(stream=log, level=logging.WARNING)
    exp, state = sys.argv[1], sys.argv[2]
    ROOT, U1000 = Cred(0, 0, ()), Cred(1000, 1000, ())
    out = {"uid": os.geteuid()}
    e = Export(exp, state_dir=state, root_squash=False)
    v = LocalVfs(e, fd_cache_size=2)
    out["kernel_handles"], out["cloned"] = v.kernel_handles, v.cloned
    root = v.root_handle()
    fh, of, created = v.create_file(ROOT, root, "f", 0o644)
    of.write(0, b"hello")
    of.close()
    out["created_by"] = v.getattr(fh).uid
    try:
        v.anonymous_read(ROOT, v.lookup(ROOT, root, "rootfile"), 0, 10)
        out["rootfile"] = "read"
    except OSError as err:
        out["rootfile"] = err.errno
    d = v.create(U1000, root, "d", FileType.NF4DIR, 0o755)
    inner = v.create(U1000, d, "inner", FileType.NF4DIR, 0o755)
    g, of, _ = v.create_file(U1000, inner, "g", 0o644)
    of.close()
    for i in range(5):  # push everything out of the 2-entry descriptor cache
        v.create(U1000, root, "x%d" % i, FileType.NF4FIFO, 0o644)
    out["deep_after_eviction"] = v.getattr(g).fileid == os.stat(exp + "/d/inner/g").st_ino
    v.rename(U1000, root, "d", root, "d2")
    for i in range(5):
        v.lookup(U1000, root, "x%d" % i)
    out["deep_after_rename"] = v.getattr(g).fileid == os.stat(exp + "/d2/inner/g").st_ino
    out["lookupp"] = v.lookupp(U1000, inner) == d
    try:
        v.getattr(fh[:-1] + bytes([fh[-1] ^ 1]))
        out["forged"] = "accepted"
    except BadHandle:
        out["forged"] = "BadHandle"
    try:
        v.lookup(ROOT, root, "mnt")
        out["mnt"] = "crossed"
    except OSError as err:
        out["mnt"] = err.errno
    v.close()
    w = LocalVfs(e)
    out["root_survives"] = w.root_handle() == root
    try:
        w.getattr(fh)
        out["after_restart"] = "valid"
    except StaleHandle:
        out["after_restart"] = "StaleHandle"
    out["relookup_same_handle"] = w.lookup(ROOT, root, "f") == fh
    out["log"] = log.getvalue()
    print(json.dumps(out))
    """
)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory 65534 can reach (pytest's tmp_path lives under a 0700 directory)."""
    base = Path(tempfile.mkdtemp(prefix="nfsrdma-vfs-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_unprivileged_server(world_dir: Path) -> None:
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("setpriv/unshare not available")
    exp, state = world_dir / "export", world_dir / "state"
    exp.mkdir()
    state.mkdir()
    (exp / "mnt").mkdir()
    (exp / "rootfile").write_bytes(b"root only")
    (exp / "rootfile").chmod(0o600)
    for p in (exp, state, exp / "mnt"):
        os.chown(p, NOBODY, NOBODY)
    shell = (
        'mount -t tmpfs tmpfs "$1/mnt" && exec setpriv --reuid=65534 --regid=65534 '
        '--clear-groups "$3" -c "$4" "$1" "$2"'
    )
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", shell, "sh"]
    cmd += [str(exp), str(state), sys.executable, SCRIPT]
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(world_dir))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["uid"] == NOBODY
    assert out["kernel_handles"] is False and out["cloned"] is False
    assert out["created_by"] == NOBODY  # every client acts as the server's user
    assert out["rootfile"] == errno.EACCES  # even "root" with no_root_squash
    assert out["deep_after_eviction"] and out["deep_after_rename"] and out["lookupp"]
    assert out["forged"] == "BadHandle"
    assert out["mnt"] == errno.EACCES  # another file system is not crossed
    assert out["root_survives"] and out["relookup_same_handle"]
    assert out["after_restart"] == "StaleHandle"
    assert "not running as root" in out["log"]
    assert "kept in memory only" in out["log"]
