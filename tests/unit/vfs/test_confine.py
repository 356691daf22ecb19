"""Confinement: symlinks are never followed, `..` stops at the root, other mounts aren't crossed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nfsrdma.vfs import CreateMode, FileType, LocalVfs, StaleHandle

from .conftest import ROOT, MakeVfs, needs_root

pytestmark = needs_root
REPO = Path(__file__).resolve().parents[3]


def test_symlink_to_etc_is_returned_but_never_followed(vfs: LocalVfs, export_dir: Path) -> None:
    (export_dir / "etc").symlink_to("/etc")
    (export_dir / "up").symlink_to("../../../../../../..")
    (export_dir / "passwd").symlink_to("/etc/passwd")
    root = vfs.root_handle()
    for name, target in ((b"etc", b"/etc"), (b"up", b"../../../../../../..")):
        fh = vfs.lookup(ROOT, root, name)
        assert vfs.getattr(fh).type == FileType.NF4LNK
        assert vfs.readlink(ROOT, fh) == target
        for call in (
            lambda fh=fh: vfs.lookup(ROOT, fh, b"passwd"),
            lambda fh=fh: vfs.readdir(ROOT, fh),
            lambda fh=fh: vfs.create_file(ROOT, fh, b"x", 0o644),
            lambda fh=fh: vfs.create(ROOT, fh, b"x", FileType.NF4DIR, 0o755),
            lambda fh=fh: vfs.lookupp(ROOT, fh),
        ):
            with pytest.raises(NotADirectoryError):
                call()
    pw = vfs.lookup(ROOT, root, b"passwd")
    with pytest.raises(OSError) as ei:
        vfs.open(ROOT, pw, read=True, write=False)
    assert ei.value.errno == errno.ELOOP
    with pytest.raises(OSError) as ei:
        vfs.anonymous_read(ROOT, pw, 0, 100)
    assert ei.value.errno == errno.ELOOP
    with pytest.raises(OSError) as ei:
        vfs.create_file(ROOT, root, b"passwd", 0o644, CreateMode.UNCHECKED)
    assert ei.value.errno == errno.ELOOP
    assert vfs.getattr(pw).size == len("/etc/passwd")  # the link's own attributes
    # Changing a symlink's attributes, removing or renaming it never touches /etc/passwd.
    before = os.stat("/etc/passwd")
    vfs.setattr(ROOT, pw, mode=0o600, mtime=0)
    vfs.rename(ROOT, root, b"passwd", root, b"pw2")
    vfs.remove(ROOT, root, b"pw2")
    after = os.stat("/etc/passwd")
    assert (before.st_mode, before.st_mtime_ns) == (after.st_mode, after.st_mtime_ns)


def test_dotdot_at_the_root(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    with pytest.raises(FileNotFoundError):
        vfs.lookupp(ROOT, root)
    for name in (b"..", b"../..", b"../etc"):
        with pytest.raises(OSError) as ei:
            vfs.lookup(ROOT, root, name)
        assert ei.value.errno == errno.EINVAL
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    assert vfs.lookupp(ROOT, d) == root
    with pytest.raises(FileNotFoundError):
        vfs.lookupp(ROOT, vfs.lookupp(ROOT, d))


@pytest.mark.parametrize("clone", [True, False])
@pytest.mark.parametrize("mode", ["kernel", "cache"])
def test_directory_moved_out_of_the_export_is_stale(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, mode: str, clone: bool
) -> None:
    """A local process moves a directory out of the export: its handles go stale."""
    (export_dir / "d" / "sub").mkdir(parents=True)
    (export_dir / "other").mkdir()
    vfs = make_vfs(root_squash=False, handle_mode=mode, fd_cache_size=1, clone_mount=clone)
    root = vfs.root_handle()
    d = vfs.lookup(ROOT, root, b"d")
    sub = vfs.lookup(ROOT, d, b"sub")
    vfs.lookup(ROOT, root, b"other")  # evicts d and sub from the descriptor cache
    vfs.release_identity()
    os.rename(export_dir / "d", tmp_path / "outside")
    with pytest.raises(StaleHandle):
        vfs.getattr(d)
    with pytest.raises(StaleHandle):
        vfs.lookup(ROOT, sub, b"x")
    # Still cached: LOOKUPP re-checks where it lands.
    (export_dir / "e").mkdir()
    e = vfs.lookup(ROOT, root, b"e")
    os.rename(export_dir / "e", tmp_path / "outside" / "e")
    with pytest.raises(StaleHandle):
        vfs.lookupp(ROOT, e)


def _run_as_root_in_own_mount_ns(script: str, *args: str) -> dict[str, object]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare not available")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot create a mount namespace here")
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script, *args]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    out: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


MOUNT_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from nfsrdma.vfs import Cred, Export, FileType, LocalVfs
    exp, state = sys.argv[1], sys.argv[2]
    ROOT = Cred(0, 0, ())
    os.makedirs(exp + "/mnt")
    open(exp + "/mnt/covered", "w").close()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", exp + "/mnt"], check=True)
    open(exp + "/mnt/on_tmpfs", "w").close()
    out = {}
    e = Export(exp, state_dir=state, root_squash=False)
    v = LocalVfs(e)
    out["cloned"] = v.cloned
    root = v.root_handle()
    m = v.lookup(ROOT, root, "mnt")
    out["clone_listing"] = sorted(x.name.decode() for x in v.readdir(ROOT, m).entries)
    out["clone_same_fsid"] = v.getattr(m).fsid == v.getattr(root).fsid
    try:
        v.lookup(ROOT, m, "on_tmpfs")
        out["clone_on_tmpfs"] = "found"
    except OSError as err:
        out["clone_on_tmpfs"] = err.errno
    v.create_file(ROOT, m, "written_below", 0o644)[1].close()
    out["tmpfs_after_write"] = sorted(os.listdir(exp + "/mnt"))
    v.release_identity()
    v.close()
    w = LocalVfs(e, clone_mount=False)
    root = w.root_handle()
    try:
        w.lookup(ROOT, root, "mnt")
        out["noclone_lookup"] = "crossed"
    except OSError as err:
        out["noclone_lookup"] = err.errno
    out["noclone_entries"] = [
        [x.name.decode(), x.fh is None, x.error] for x in w.readdir(ROOT, root).entries
    ]
    w.release_identity()
    w.close()
    subprocess.run(["umount", exp + "/mnt"], check=True)
    out["below_after_umount"] = sorted(os.listdir(exp + "/mnt"))
    print(json.dumps(out))
    """
)


def test_other_file_systems_under_the_export_are_not_crossed(
    export_dir: Path, state_dir: Path
) -> None:
    """As knfsd without crossmnt: the mount point shows the directory it covers (root, with
    open_tree); without the clone, objects on the other mount are refused with EACCES."""
    out = _run_as_root_in_own_mount_ns(MOUNT_SCRIPT, str(export_dir), str(state_dir))
    assert out["cloned"] is True
    assert out["clone_listing"] == ["covered"]
    assert out["clone_same_fsid"] is True
    assert out["clone_on_tmpfs"] == errno.ENOENT
    assert out["tmpfs_after_write"] == ["on_tmpfs"]
    assert out["below_after_umount"] == ["covered", "written_below"]
    assert out["noclone_lookup"] == errno.EACCES
    assert out["noclone_entries"] == [["mnt", True, errno.EACCES]]
