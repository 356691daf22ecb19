"""Operations of the local backend against the real file system."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nfsrdma.vfs import (
    SET_TO_SERVER_TIME,
    CreateMode,
    FileType,
    LocalVfs,
    OpenFile,
    StaleHandle,
)

from .conftest import ROOT, U1000, U1001, needs_root

pytestmark = needs_root


def _mkfile(vfs: LocalVfs, name: bytes, data: bytes = b"", mode: int = 0o644) -> bytes:
    fh, of, _ = vfs.create_file(ROOT, vfs.root_handle(), name, mode)
    if data:
        of.write(0, data)
    of.close()
    return fh


# ------------------------------------------------------------------ data path


def test_read_write_eof_and_readinto(vfs: LocalVfs) -> None:
    """SS-29: readinto fills the caller's buffer in place (os.preadv, no extra copy)."""
    fh = _mkfile(vfs, b"f", b"0123456789")
    of = vfs.open(ROOT, fh, read=True, write=True)
    assert of.read(0, 4) == (b"0123", False)
    assert of.read(6, 4) == (b"6789", True)  # exactly to the end
    assert of.read(8, 100) == (b"89", True)
    assert of.read(50, 10) == (b"", True)
    assert of.read(0, 0) == (b"", False)
    buf = bytearray(8)
    view = memoryview(buf)
    assert of.readinto(2, view[2:6]) == (4, False)
    assert bytes(buf) == b"\0\0" + b"2345" + b"\0\0"
    assert of.readinto(8, bytearray(10)) == (2, True)
    assert of.write(20, memoryview(b"tail"), stable=True) == 4
    assert of.getattr().size == 24
    assert of.read(10, 10) == (b"\0" * 10, False)
    of.commit()
    of.close()
    of.close()  # idempotent
    with pytest.raises(OSError) as ei:
        of.read(0, 1)
    assert ei.value.errno == errno.EBADF


def test_stable_write_syncs_metadata_too(vfs: LocalVfs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stable write (answered FILE_SYNC4: data and all metadata on stable storage, RFC 8881
    section 18.32.3) is written with RWF_SYNC, not RWF_DSYNC (data only); an unstable one with
    no flag (COMMIT's fsync makes it durable)."""
    flags: list[int] = []
    real = os.pwritev

    def pwritev(fd: int, buffers: list[memoryview], offset: int, flag: int = 0) -> int:
        flags.append(flag)
        return real(fd, buffers, offset, flag)

    monkeypatch.setattr("nfsrdma.vfs.openfile.os.pwritev", pwritev)
    fh = _mkfile(vfs, b"f")
    of = vfs.open(ROOT, fh, read=True, write=True)
    assert of.write(0, b"stable", stable=True) == 6
    assert of.write(6, b"unstable") == 8
    assert vfs.anonymous_write(ROOT, fh, 14, b"anon", stable=True) == 4
    of.close()
    assert flags == [os.RWF_SYNC, 0, os.RWF_SYNC]


def test_readinto_learns_the_end_of_file_without_fstat(
    vfs: LocalVfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """readinto (every READ over RPC-over-RDMA) tells the end of file by one octet more read
    into a scratch vector, as ``read`` does, never by an fstat; the verdict is the size's."""
    data = bytes(range(256)) * 40  # 10240 octets
    fh = _mkfile(vfs, b"f", data)
    of = vfs.open(ROOT, fh, read=True, write=False)
    fstats = 0
    real = os.fstat

    def counting(fd: int) -> os.stat_result:
        nonlocal fstats
        fstats += 1
        return real(fd)

    monkeypatch.setattr(os, "fstat", counting)
    size = len(data)
    for offset in (0, 1, 4095, 6144, size - 4096, size - 4097, size - 1, size, size + 7):
        for count in (0, 1, 4096, 8192, 20000):
            buf = bytearray(count + 3)
            got = of.readinto(offset, memoryview(buf)[:count])
            want = data[offset : offset + count]
            assert got == (len(want), offset + len(want) >= size), (offset, count)
            assert bytes(buf[: len(want)]) == want
            assert bytes(buf[len(want) :]) == bytes(len(buf) - len(want))  # nothing past it
    assert fstats == 0
    of.close()


def test_open_modes_are_enforced(vfs: LocalVfs) -> None:
    fh = _mkfile(vfs, b"f", b"abc")
    ro = vfs.open(ROOT, fh, read=True, write=False)
    with pytest.raises(OSError):
        ro.write(0, b"x")
    wo = vfs.open(ROOT, fh, read=False, write=True)
    with pytest.raises(OSError):
        wo.read(0, 1)
    ro.close()
    wo.close()
    with pytest.raises(OSError) as ei:
        vfs.open(ROOT, fh, read=False, write=False)
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(OSError) as ei:
        vfs.open(ROOT, fh, read=True, write=False, truncate=True)
    assert ei.value.errno == errno.EINVAL
    tr = vfs.open(ROOT, fh, read=True, write=True, truncate=True)
    assert tr.getattr().size == 0
    tr.close()


def test_open_refuses_non_regular_objects(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    s = vfs.create(ROOT, root, b"s", FileType.NF4LNK, 0, linkdata=b"d")
    p = vfs.create(ROOT, root, b"p", FileType.NF4FIFO, 0o644)
    for fh, err in ((d, errno.EISDIR), (s, errno.ELOOP), (p, errno.EINVAL)):
        with pytest.raises(OSError) as ei:
            vfs.open(ROOT, fh, read=True, write=False)  # a FIFO must not block the server
        assert ei.value.errno == err


def test_anonymous_stateid_io(vfs: LocalVfs) -> None:
    fh = _mkfile(vfs, b"f")
    assert vfs.anonymous_write(ROOT, fh, 0, b"hello", stable=True) == 5
    assert vfs.anonymous_read(ROOT, fh, 1, 3) == (b"ell", False)


def test_io_racing_close_never_hits_a_reused_descriptor(vfs: LocalVfs) -> None:
    fh = _mkfile(vfs, b"f", b"x" * 4096)
    for _ in range(20):
        of = vfs.open(ROOT, fh, read=True, write=False)
        results: list[object] = []

        def reader(of: OpenFile, results: list[object]) -> None:
            for _ in range(200):
                try:
                    results.append(of.read(0, 4096)[0])
                except OSError as e:
                    results.append(e.errno)

        t = threading.Thread(target=reader, args=(of, results))
        t.start()
        of.close()
        t.join()
        assert all(r == b"x" * 4096 or r == errno.EBADF for r in results)


# ------------------------------------------------------------------ create


def test_create_modes(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    fh, of, created = vfs.create_file(ROOT, root, b"f", 0o600, CreateMode.GUARDED)
    assert created
    of.write(0, b"data")
    of.close()
    with pytest.raises(FileExistsError):
        vfs.create_file(ROOT, root, b"f", 0o600, CreateMode.GUARDED)
    fh2, of2, created2 = vfs.create_file(ROOT, root, b"f", 0o600, CreateMode.UNCHECKED)
    assert fh2 == fh and not created2
    assert of2.read(0, 10) == (b"data", True)
    of2.close()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    with pytest.raises(IsADirectoryError):
        vfs.create_file(ROOT, root, b"d", 0o600)
    vfs.create(ROOT, root, b"s", FileType.NF4LNK, 0, linkdata=b"/etc/passwd")
    with pytest.raises(OSError) as ei:
        vfs.create_file(ROOT, root, b"s", 0o600)  # never create through a symlink
    assert ei.value.errno == errno.ELOOP
    assert vfs.getattr(d).type == FileType.NF4DIR


def test_exclusive_create_replay(vfs: LocalVfs, export_dir: Path) -> None:
    """RFC 8881 §18.16.3: same verifier → success again; another verifier → EEXIST."""
    root = vfs.root_handle()
    verf = bytes.fromhex("fedcba9876543210")
    fh, of, created = vfs.create_file(ROOT, root, b"x", 0o444, CreateMode.EXCLUSIVE, verf)
    assert created
    of.close()
    fh2, of2, created2 = vfs.create_file(ROOT, root, b"x", 0o444, CreateMode.EXCLUSIVE, verf)
    assert (fh2, created2) == (fh, True)
    assert of2.writable
    of2.write(0, b"ok")
    of2.close()
    with pytest.raises(FileExistsError):
        vfs.create_file(ROOT, root, b"x", 0o444, CreateMode.EXCLUSIVE, b"\0" * 8)
    with pytest.raises(OSError) as ei:
        vfs.create_file(ROOT, root, b"z", 0o444, CreateMode.EXCLUSIVE, None)
    assert ei.value.errno == errno.EINVAL
    # Every verifier bit matters (the 64 bits survive in atime/mtime).
    for bit in range(64):
        other = (int.from_bytes(verf, "big") ^ (1 << bit)).to_bytes(8, "big")
        name = b"v%d" % bit
        _, o, _ = vfs.create_file(ROOT, root, name, 0o600, CreateMode.EXCLUSIVE, verf)
        o.close()
        with pytest.raises(FileExistsError):
            vfs.create_file(ROOT, root, name, 0o600, CreateMode.EXCLUSIVE, other)


def test_exclusive_replay_by_a_non_owner_is_an_ordinary_open(
    vfs: LocalVfs, export_dir: Path
) -> None:
    export_dir.chmod(0o777)
    root = vfs.root_handle()
    verf = b"12345678"
    _, of, _ = vfs.create_file(U1000, root, b"x", 0o400, CreateMode.EXCLUSIVE, verf)
    of.close()
    _, of, created = vfs.create_file(U1000, root, b"x", 0o400, CreateMode.EXCLUSIVE, verf)
    assert created and of.writable
    of.close()
    with pytest.raises(PermissionError):
        vfs.create_file(U1001, root, b"x", 0o400, CreateMode.EXCLUSIVE, verf)


def test_create_mode_ignores_the_process_umask(vfs: LocalVfs, export_dir: Path) -> None:
    old = os.umask(0o077)
    try:
        vfs._umask = 0o077  # as if the server had been started with this umask
        root = vfs.root_handle()
        _, of, _ = vfs.create_file(ROOT, root, b"f", 0o664)
        of.close()
        vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o775)
        vfs.create(ROOT, root, b"p", FileType.NF4FIFO, 0o666)
    finally:
        os.umask(old)
    vfs.release_identity()
    assert stat.S_IMODE((export_dir / "f").stat().st_mode) == 0o664
    assert stat.S_IMODE((export_dir / "d").stat().st_mode) == 0o775
    assert stat.S_IMODE((export_dir / "p").stat().st_mode) == 0o666


def test_create_every_type(vfs: LocalVfs, export_dir: Path) -> None:
    root = vfs.root_handle()
    kinds = {
        b"dir": (FileType.NF4DIR, {}),
        b"lnk": (FileType.NF4LNK, {"linkdata": b"../../etc/shadow"}),
        b"fifo": (FileType.NF4FIFO, {}),
        b"sock": (FileType.NF4SOCK, {}),
        b"chr": (FileType.NF4CHR, {"rdev": (1, 3)}),
        b"blk": (FileType.NF4BLK, {"rdev": (7, 0)}),
    }
    for name, (ftype, kw) in kinds.items():
        fh = vfs.create(ROOT, root, name, ftype, 0o640, **kw)  # type: ignore[arg-type]
        a = vfs.getattr(fh)
        assert a.type == ftype
        assert vfs.lookup(ROOT, root, name) == fh
    assert vfs.getattr(vfs.lookup(ROOT, root, b"chr")).rdev == (1, 3)
    assert vfs.getattr(vfs.lookup(ROOT, root, b"blk")).rdev == (7, 0)
    assert vfs.readlink(ROOT, vfs.lookup(ROOT, root, b"lnk")) == b"../../etc/shadow"
    with pytest.raises(FileExistsError):
        vfs.create(ROOT, root, b"dir", FileType.NF4DIR, 0o755)
    bad_calls: list[Callable[[], object]] = [
        lambda: vfs.create(ROOT, root, b"r", FileType.NF4REG, 0o644),
        lambda: vfs.create(ROOT, root, b"l", FileType.NF4LNK, 0o777),
        lambda: vfs.create(ROOT, root, b"l", FileType.NF4LNK, 0o777, linkdata=b"a\0b"),
        lambda: vfs.create(ROOT, root, b"c", FileType.NF4CHR, 0o600),
        lambda: vfs.create(ROOT, root, b"a", FileType.NF4ATTRDIR, 0o600),
    ]
    for bad in bad_calls:
        with pytest.raises(OSError) as ei:
            bad()
        assert ei.value.errno == errno.EINVAL


def test_objects_inside_a_file_are_refused(vfs: LocalVfs) -> None:
    fh = _mkfile(vfs, b"f")
    for call in (
        lambda: vfs.lookup(ROOT, fh, b"x"),
        lambda: vfs.create_file(ROOT, fh, b"x", 0o644),
        lambda: vfs.create(ROOT, fh, b"x", FileType.NF4DIR, 0o755),
        lambda: vfs.readdir(ROOT, fh),
        lambda: vfs.lookupp(ROOT, fh),
    ):
        with pytest.raises(NotADirectoryError):
            call()


# ------------------------------------------------------------------ namespace


def test_remove_files_and_directories(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    _mkfile(vfs, b"f")
    vfs.create_file(ROOT, d, b"inner", 0o644)[1].close()
    with pytest.raises(OSError) as ei:
        vfs.remove(ROOT, root, b"d")
    assert ei.value.errno == errno.ENOTEMPTY
    vfs.remove(ROOT, d, b"inner")
    vfs.remove(ROOT, root, b"d")
    vfs.remove(ROOT, root, b"f")
    with pytest.raises(FileNotFoundError):
        vfs.remove(ROOT, root, b"f")
    assert vfs.readdir(ROOT, root).entries == []


def test_rename(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    a = vfs.create(ROOT, root, b"a", FileType.NF4DIR, 0o755)
    b = vfs.create(ROOT, root, b"b", FileType.NF4DIR, 0o755)
    f = _mkfile(vfs, b"f", b"one")
    g = _mkfile(vfs, b"g", b"two")
    vfs.rename(ROOT, root, b"f", a, b"f2")
    assert vfs.lookup(ROOT, a, b"f2") == f  # handles follow the object
    vfs.rename(ROOT, root, b"g", a, b"f2")  # replaces
    assert vfs.lookup(ROOT, a, b"f2") == g
    with pytest.raises(StaleHandle):
        vfs.getattr(f)
    vfs.rename(ROOT, a, b"f2", a, b"f2")  # same name: no-op
    with pytest.raises(OSError) as ei:
        vfs.rename(ROOT, root, b"a", a, b"inside")  # a directory into itself
    assert ei.value.errno == errno.EINVAL
    vfs.rename(ROOT, root, b"a", b, b"a")
    assert vfs.lookupp(ROOT, a) == b
    with pytest.raises(FileNotFoundError):
        vfs.rename(ROOT, root, b"missing", root, b"x")


def test_link(vfs: LocalVfs, export_dir: Path) -> None:
    root = vfs.root_handle()
    f = _mkfile(vfs, b"f", b"x")
    vfs.link(ROOT, f, root, b"f2")
    assert vfs.lookup(ROOT, root, b"f2") == f
    assert vfs.getattr(f).nlink == 2
    s = vfs.create(ROOT, root, b"s", FileType.NF4LNK, 0, linkdata=b"/etc")
    vfs.link(ROOT, s, root, b"s2")  # links the symlink itself, not /etc
    assert vfs.lookup(ROOT, root, b"s2") == s
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    with pytest.raises(IsADirectoryError):
        vfs.link(ROOT, d, root, b"d2")
    with pytest.raises(FileExistsError):
        vfs.link(ROOT, f, root, b"s")
    vfs.remove(ROOT, root, b"f")
    assert vfs.getattr(f).nlink == 1  # still alive through f2


def test_setattr(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    f = _mkfile(vfs, b"f", b"0123456789")
    a = vfs.setattr(ROOT, f, mode=0o4750, uid=1000, gid=1001)
    assert (a.mode, a.uid, a.gid) == (0o4750, 1000, 1001)
    a = vfs.setattr(ROOT, f, size=4, atime=1_000_000_123, mtime=2_000_000_456)
    assert a.size == 4 and (a.atime_ns, a.mtime_ns) == (1_000_000_123, 2_000_000_456)
    a = vfs.setattr(ROOT, f, mtime=-5_000_000_000)  # before 1970 is a legal nfstime4
    assert a.mtime_ns == -5_000_000_000 and a.atime_ns == 1_000_000_123
    before = time.time_ns()
    a = vfs.setattr(ROOT, f, atime=SET_TO_SERVER_TIME, mtime=SET_TO_SERVER_TIME)
    assert a.mtime_ns >= before - 50_000_000 and a.atime_ns >= before - 50_000_000
    assert vfs.setattr(ROOT, f) == vfs.getattr(f)
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    with pytest.raises(IsADirectoryError):
        vfs.setattr(ROOT, d, size=0)
    s = vfs.create(ROOT, root, b"s", FileType.NF4LNK, 0, linkdata=b"f")
    a = vfs.setattr(ROOT, s, mode=0o600, uid=1234, mtime=3_000_000_000)
    assert a.type == FileType.NF4LNK and a.uid == 1234 and a.mtime_ns == 3_000_000_000
    target = vfs.getattr(f)  # the symlink's target is never touched through it
    assert (target.uid, target.mode) == (1000, 0o4750) and target.mtime_ns != 3_000_000_000
    p = vfs.create(ROOT, root, b"p", FileType.NF4FIFO, 0o644)
    with pytest.raises(OSError) as ei:
        vfs.setattr(ROOT, p, size=0)
    assert ei.value.errno == errno.EINVAL


def test_readlink_of_a_non_symlink(vfs: LocalVfs) -> None:
    with pytest.raises(OSError) as ei:
        vfs.readlink(ROOT, vfs.root_handle())
    assert ei.value.errno == errno.EINVAL


def test_statfs(vfs: LocalVfs, export_dir: Path) -> None:
    s = vfs.statfs(vfs.root_handle())
    sv = os.statvfs(export_dir)
    assert s.bytes_total == sv.f_blocks * sv.f_frsize
    assert s.max_name == 255 and s.max_link >= 1
    assert s.files_total == sv.f_files and s.bytes_avail <= s.bytes_free <= s.bytes_total


def test_getattr_fields(vfs: LocalVfs, export_dir: Path) -> None:
    f = _mkfile(vfs, b"f", b"x" * 5000, mode=0o640)
    a = vfs.getattr(f)
    vfs.release_identity()
    st = os.lstat(export_dir / "f")
    assert a.type == FileType.NF4REG and a.mode == 0o640 and a.size == 5000
    assert a.fileid == st.st_ino == a.mounted_on_fileid
    assert a.fsid == (os.major(st.st_dev), os.minor(st.st_dev))
    assert a.space_used == st.st_blocks * 512
    assert a.nlink == 1 and a.ctime_ns == st.st_ctime_ns


# ------------------------------------------------------------------ change attribute


def test_change_attribute_moves_on_every_modification(vfs: LocalVfs) -> None:
    """Many modifications within one timestamp tick still give distinct, increasing values."""
    root = vfs.root_handle()
    f = _mkfile(vfs, b"f")
    of = vfs.open(ROOT, f, read=True, write=True)
    seen = [vfs.getattr(f).change]
    for i in range(50):
        of.write(i, b"x")
        seen.append(vfs.getattr(f).change)
    vfs.setattr(ROOT, f, mode=0o600)
    seen.append(of.getattr().change)
    of.close()
    assert all(b > a for a, b in itertools.pairwise(seen))
    # Directory changes: create, remove, rename, link.
    dir_seen = [vfs.getattr(root).change]
    vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    dir_seen.append(vfs.getattr(root).change)
    vfs.link(ROOT, f, root, b"g")
    dir_seen.append(vfs.getattr(root).change)
    vfs.rename(ROOT, root, b"g", root, b"h")
    dir_seen.append(vfs.getattr(root).change)
    vfs.remove(ROOT, root, b"h")
    dir_seen.append(vfs.getattr(root).change)
    assert all(b > a for a, b in itertools.pairwise(dir_seen))
    # No modification, no change.
    assert vfs.getattr(root).change == dir_seen[-1]
