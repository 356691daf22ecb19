"""The change attribute read alone (``Vfs.change``, for change_info) and the attributes of an
``fstat`` (``attrs.from_stat``, on every GETATTR) match what they stand for."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nfsrdma.vfs import Cred, FileType
from nfsrdma.vfs.attrs import FTYPE, from_stat
from nfsrdma.vfs.base import Attributes

from .conftest import MakeVfs

ROOT = Cred(0, 0, ())


def test_change_alone_is_the_change_attribute(make_vfs: MakeVfs) -> None:
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    seen = [vfs.change(root)]
    assert seen[0] == vfs.getattr(root).change
    _, of, _ = vfs.create_file(ROOT, root, b"f", 0o644)
    of.close()
    seen.append(vfs.change(root))
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    seen.append(vfs.change(root))
    vfs.remove(ROOT, root, b"f")
    seen.append(vfs.change(root))
    assert seen[-1] == vfs.getattr(root).change
    assert len(set(seen)) == 4  # every change of the directory's entries is seen
    assert vfs.change(d) == vfs.getattr(d).change


def _reference(st: os.stat_result, count: int) -> Attributes:
    return Attributes(
        type=FTYPE[stat.S_IFMT(st.st_mode)],
        mode=stat.S_IMODE(st.st_mode),
        nlink=st.st_nlink,
        uid=st.st_uid,
        gid=st.st_gid,
        size=st.st_size,
        space_used=st.st_blocks * 512,
        rdev=(os.major(st.st_rdev), os.minor(st.st_rdev)),
        fsid=(os.major(st.st_dev), os.minor(st.st_dev)),
        fileid=st.st_ino,
        mounted_on_fileid=st.st_ino,
        atime_ns=st.st_atime_ns,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
        change=(st.st_ctime_ns + count) & 0xFFFF_FFFF_FFFF_FFFF,
    )


def test_from_stat_of_every_kind_of_object(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 5000)
    f.chmod(0o4751)
    os.symlink("f", tmp_path / "l")
    os.mkfifo(tmp_path / "p")
    paths = [f, tmp_path, tmp_path / "l", tmp_path / "p", Path("/dev/null"), Path("/dev/zero")]
    for p in paths:
        st = os.lstat(p)
        for count in (0, 7, 2**64):
            assert from_stat(st, count) == _reference(st, count), p
    assert from_stat(os.lstat("/dev/zero"), 0).rdev == (1, 5)
