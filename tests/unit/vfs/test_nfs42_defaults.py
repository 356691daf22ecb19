"""A VFS backend that implements none of NFSv4.2's methods still serves: READ_PLUS as plain
data, everything else EOPNOTSUPP (NFS4ERR_NOTSUPP), and no xattr_support."""

from __future__ import annotations

import errno

import pytest

from nfsrdma.vfs.base import Attributes, Cred, FsStats, OpenFile, Segment, Vfs


class PlainFile(OpenFile):
    def __init__(self, content: bytes) -> None:
        self.content = content

    def read(self, offset: int, count: int) -> tuple[bytes, bool]:
        data = self.content[offset : offset + count]
        return data, offset + len(data) >= len(self.content)

    def readinto(self, offset: int, buf: memoryview | bytearray) -> tuple[int, bool]:
        raise NotImplementedError

    def write(self, offset: int, data: bytes | memoryview | bytearray, stable: bool = False) -> int:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def getattr(self) -> Attributes:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_open_file_defaults() -> None:
    f = PlainFile(b"0123456789")
    assert f.read_segments(2, 5) == ([Segment(2, 5, b"23456")], False)
    assert f.read_segments(8, 5) == ([Segment(8, 2, b"89")], True)
    assert f.read_segments(20, 5) == ([], True)
    for call in (
        lambda: f.seek(0, True),
        lambda: f.allocate(0, 1),
        lambda: f.deallocate(0, 1),
        lambda: f.copy_to(f, 0, 5, 1),
        lambda: f.clone_to(f, 0, 5, 1),
    ):
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == errno.EOPNOTSUPP


def test_vfs_xattr_defaults() -> None:
    abstract = {name for name in Vfs.__abstractmethods__}
    assert not {"getxattr", "setxattr", "listxattr", "removexattr"} & abstract
    cred = Cred(0, 0)
    for name, args in (
        ("getxattr", (cred, b"fh", b"n")),
        ("setxattr", (cred, b"fh", b"n", b"v")),
        ("listxattr", (cred, b"fh")),
        ("removexattr", (cred, b"fh", b"n")),
    ):
        with pytest.raises(OSError) as ei:
            getattr(Vfs, name)(None, *args)
        assert ei.value.errno == errno.EOPNOTSUPP
    assert FsStats(1, 1, 1, 1, 1, 1, 255, 1).user_xattrs is False
