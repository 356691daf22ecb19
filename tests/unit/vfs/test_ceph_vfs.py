"""CephVfs, the libcephfs backend, called directly against a real single-node Ceph cluster."""

from __future__ import annotations

import errno
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nfsrdma.testbed.ceph_cluster import CephCluster
from nfsrdma.vfs.base import (
    ACCESS4_ALL,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    SET_TO_SERVER_TIME,
    BadCookie,
    BadHandle,
    CreateMode,
    Cred,
    Export,
    FileType,
    StaleHandle,
)
from nfsrdma.vfs.ceph.vfs import CephVfs

ROOT = Cred(0, 0)
USER = Cred(1000, 1000)


@pytest.fixture(scope="module")
def ceph_root(ceph_cluster: CephCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh directory of the CephFS for this module, served as the export."""
    state = tmp_path_factory.mktemp("state")
    top = CephVfs(
        Export("cephfs:/", root_squash=False, state_dir=str(state)), conf=str(ceph_cluster.conf)
    )
    name = f"vfs-{uuid.uuid4().hex[:8]}"
    top.create(ROOT, top.root_handle(), name, FileType.NF4DIR, 0o777)
    top.close()
    return "/" + name


@pytest.fixture
def vfs(ceph_cluster: CephCluster, ceph_root: str, tmp_path: Path) -> Iterator[CephVfs]:
    v = CephVfs(
        Export("cephfs:" + ceph_root, root_squash=False, state_dir=str(tmp_path)),
        conf=str(ceph_cluster.conf),
        ceph_path=ceph_root,
    )
    yield v
    v.close()


def fresh(vfs: CephVfs, name: str) -> bytes:
    """A new empty directory under the export root."""
    return vfs.create(
        ROOT, vfs.root_handle(), f"{name}-{uuid.uuid4().hex[:6]}", FileType.NF4DIR, 0o777
    )


def test_files_data_and_attributes(vfs: CephVfs) -> None:
    d = fresh(vfs, "data")
    fh, f, created = vfs.create_file(ROOT, d, "f", 0o640)
    assert created
    assert f.write(0, b"hello world", stable=True) == 11
    buf = bytearray(32)
    n, eof = f.readinto(0, buf)
    assert (bytes(buf[:n]), eof) == (b"hello world", True)
    before = vfs.getattr(fh)
    f.write(11, b"!")
    f.close()
    after = vfs.getattr(fh)
    assert after.size == 12 and after.type == FileType.NF4REG and after.mode == 0o640
    assert after.change > before.change  # stx_version moves on every change
    assert vfs.lookup(ROOT, d, "f") == fh
    assert vfs.anonymous_read(ROOT, fh, 6, 100) == (b"world!", True)
    # Nanosecond times are kept (the path API of python3-cephfs has whole seconds only).
    t = 1_700_000_000_123_456_789
    got = vfs.setattr(ROOT, fh, mtime=t, atime=t)
    assert got.mtime_ns == t and got.atime_ns == t
    now = vfs.setattr(ROOT, fh, mtime=SET_TO_SERVER_TIME)
    assert abs(now.mtime_ns - time.time_ns()) < 60 * 10**9
    assert vfs.setattr(ROOT, fh, size=3, mode=0o600).size == 3
    assert vfs.getattr(fh).mode == 0o600


def test_handles_survive_a_new_mount_and_refuse_forgeries(
    vfs: CephVfs, ceph_cluster: CephCluster, ceph_root: str, tmp_path: Path
) -> None:
    d = fresh(vfs, "handles")
    fh, f, _ = vfs.create_file(ROOT, d, "kept", 0o644)
    f.close()
    other = CephVfs(
        Export("cephfs:" + ceph_root, root_squash=False, state_dir=str(tmp_path / "elsewhere")),
        conf=str(ceph_cluster.conf),
        ceph_path=ceph_root,
    )
    try:  # a restarted server (another mount, another state dir) takes the same handle
        assert other.getattr(fh).fileid == vfs.getattr(fh).fileid
        assert other.root_handle() == vfs.root_handle()
    finally:
        other.close()
    with pytest.raises(BadHandle):
        vfs.getattr(fh[:-1] + bytes([fh[-1] ^ 0x80]))
    with pytest.raises(BadHandle):
        vfs.getattr(b"\x00" * 10)
    vfs.remove(ROOT, d, "kept")
    with pytest.raises(StaleHandle):
        vfs.check(fh)


def test_namespace_operations(vfs: CephVfs) -> None:
    d = fresh(vfs, "ns")
    sub = vfs.create(ROOT, d, "sub", FileType.NF4DIR, 0o755)
    assert vfs.lookupp(ROOT, sub) == d
    link = vfs.create(ROOT, d, "ln", FileType.NF4LNK, 0o777, linkdata=b"../target")
    assert vfs.readlink(ROOT, link) == b"../target"
    fifo = vfs.create(ROOT, d, "fifo", FileType.NF4FIFO, 0o644)
    assert vfs.getattr(fifo).type == FileType.NF4FIFO
    fh, f, _ = vfs.create_file(ROOT, d, "a", 0o644)
    f.close()
    vfs.link(ROOT, fh, sub, "hard")
    assert vfs.getattr(fh).nlink == 2
    vfs.rename(ROOT, d, "a", sub, "b")
    assert vfs.lookup(ROOT, sub, "b") == fh
    with pytest.raises(FileNotFoundError):
        vfs.lookup(ROOT, d, "a")
    with pytest.raises(OSError) as ei:
        vfs.remove(ROOT, d, "sub")
    assert ei.value.errno == errno.ENOTEMPTY
    for bad in ("", ".", "..", "a/b", "x" * 256):
        with pytest.raises(OSError) as ei:
            vfs.lookup(ROOT, d, bad)
        assert ei.value.errno in (errno.EINVAL, errno.ENAMETOOLONG)
    with pytest.raises(OSError) as ei:
        vfs.lookupp(ROOT, vfs.root_handle())
    assert ei.value.errno == errno.ENOENT
    st = vfs.statfs(d)
    assert st.bytes_total > 0 and st.max_name == 255


def test_readdir_pages_with_stable_cookies(vfs: CephVfs) -> None:
    d = fresh(vfs, "rd")
    names = {f"e{i:03}".encode() for i in range(40)}
    for n in names:
        vfs.create(ROOT, d, n, FileType.NF4DIR, 0o755)
    seen: list[bytes] = []
    cookie = 0
    while True:
        page = vfs.readdir(ROOT, d, cookie, b"", max_entries=7)
        seen += [e.name for e in page.entries]
        assert all(e.fh is not None and e.attrs is not None for e in page.entries)
        if page.eof:
            break
        cookie = page.entries[-1].cookie
        vfs.create(ROOT, d, f"late-{cookie}", FileType.NF4DIR, 0o755)  # changes move nothing
    assert names <= set(seen) and len(seen) == len(set(seen))
    with pytest.raises(BadCookie):
        vfs.readdir(ROOT, d, 1)


def test_exclusive_create_is_idempotent_with_its_verifier(vfs: CephVfs) -> None:
    d = fresh(vfs, "excl")
    fh, f, created = vfs.create_file(ROOT, d, "x", 0o644, CreateMode.EXCLUSIVE, b"verifier")
    f.close()
    assert created
    again, f2, created2 = vfs.create_file(ROOT, d, "x", 0o644, CreateMode.EXCLUSIVE, b"verifier")
    f2.close()
    assert again == fh and created2  # a retransmitted create
    with pytest.raises(FileExistsError):
        vfs.create_file(ROOT, d, "x", 0o644, CreateMode.EXCLUSIVE, b"other-vf")
    with pytest.raises(FileExistsError):
        vfs.create_file(ROOT, d, "x", 0o644, CreateMode.GUARDED)
    _, f3, created3 = vfs.create_file(ROOT, d, "x", 0o644, CreateMode.UNCHECKED)
    f3.close()
    assert not created3


def test_identities_and_squashing_apply(
    ceph_cluster: CephCluster, ceph_root: str, tmp_path: Path
) -> None:
    squashed = CephVfs(
        Export("cephfs:" + ceph_root, state_dir=str(tmp_path)),  # root_squash on
        conf=str(ceph_cluster.conf),
        ceph_path=ceph_root,
    )
    try:
        d = squashed.create(USER, squashed.root_handle(), f"own-{uuid.uuid4().hex[:6]}",
                            FileType.NF4DIR, 0o755)  # fmt: skip
        assert squashed.getattr(d).uid == 1000
        # Root is squashed to 65534: it may not write in user 1000's 0755 directory.
        with pytest.raises(PermissionError):
            squashed.create(ROOT, d, "no", FileType.NF4DIR, 0o755)
        fh, f, _ = squashed.create_file(USER, d, "mine", 0o600)
        f.close()
        assert squashed.access(USER, fh, ACCESS4_ALL) & ACCESS4_MODIFY
        assert squashed.access(ROOT, fh, ACCESS4_READ) == 0
        with pytest.raises(PermissionError):
            squashed.open(Cred(1001, 1001), fh, True, False)
        assert stat.S_IMODE(squashed.getattr(fh).mode) == 0o600
    finally:
        squashed.close()
    ro = CephVfs(
        Export("cephfs:" + ceph_root, read_only=True, root_squash=False, state_dir=str(tmp_path)),
        conf=str(ceph_cluster.conf),
        ceph_path=ceph_root,
    )
    try:
        with pytest.raises(OSError) as ei:
            ro.create(ROOT, ro.root_handle(), "ro", FileType.NF4DIR, 0o755)
        assert ei.value.errno == errno.EROFS
        assert ro.access(ROOT, ro.root_handle(), ACCESS4_ALL) & ACCESS4_MODIFY == 0
    finally:
        ro.close()


def test_locks_in_ceph_conflict_between_two_mounts(
    vfs: CephVfs, ceph_cluster: CephCluster, ceph_root: str, tmp_path: Path
) -> None:
    d = fresh(vfs, "locks")
    fh, f, _ = vfs.create_file(ROOT, d, "l", 0o644)
    other = CephVfs(
        Export("cephfs:" + ceph_root, root_squash=False, state_dir=str(tmp_path)),
        conf=str(ceph_cluster.conf),
        ceph_path=ceph_root,
    )
    g = other.open(ROOT, fh, True, True)
    try:
        assert vfs.lock(f, 1, 0, 100, True) is None
        assert other.lock(g, 2, 50, 60, False) == (0, 100, True)
        assert other.test_lock(fh, 2, 0, 1 << 64, False) == (0, 100, True)
        vfs.unlock(f, 1, 0, 100)
        assert other.lock(g, 2, 50, 1 << 64, True) is None  # to the end of the file
        assert vfs.test_lock(fh, 1, 0, 10, True) is None
        assert vfs.lock(f, 1, 60, 70, False) == (50, 1 << 64, True)
    finally:
        g.close()
        f.close()
        other.close()
