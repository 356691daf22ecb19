"""Attributes from one ``fstat``, and what backends share about them."""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

from nfsrdma.vfs.base import Attributes, FileType
from nfsrdma.vfs.changes import CHANGE_MASK

FTYPE: Final[dict[int, FileType]] = {
    stat.S_IFREG: FileType.NF4REG,
    stat.S_IFDIR: FileType.NF4DIR,
    stat.S_IFBLK: FileType.NF4BLK,
    stat.S_IFCHR: FileType.NF4CHR,
    stat.S_IFLNK: FileType.NF4LNK,
    stat.S_IFSOCK: FileType.NF4SOCK,
    stat.S_IFIFO: FileType.NF4FIFO,
}

S_IFMT_OF: Final[dict[FileType, int]] = {v: k for k, v in FTYPE.items()}


_DEVICES: dict[int, tuple[int, int]] = {}  # device number -> (major, minor), a few entries


def _device(number: int) -> tuple[int, int]:
    pair = _DEVICES.get(number)
    if pair is None:
        if len(_DEVICES) >= 1024:
            _DEVICES.clear()
        pair = _DEVICES[number] = (os.major(number), os.minor(number))
    return pair


def from_stat(st: os.stat_result, count: int) -> Attributes:
    """``count`` is the file's change counter, read before the ``fstat`` that produced ``st``.
    (Fields in order, device numbers split once per device: this runs for every GETATTR.)"""
    mode = st.st_mode
    ino = st.st_ino
    ctime = st.st_ctime_ns
    rdev = st.st_rdev
    dev = st.st_dev
    return Attributes(
        FTYPE[mode & 0o170000],  # stat.S_IFMT
        mode & 0o7777,  # stat.S_IMODE
        st.st_nlink,
        st.st_uid,
        st.st_gid,
        st.st_size,
        st.st_blocks * 512,
        _device(rdev) if rdev else (0, 0),
        _DEVICES.get(dev) or _device(dev),
        ino,
        ino,
        st.st_atime_ns,
        st.st_mtime_ns,
        ctime,
        (ctime + count) & CHANGE_MASK,  # (ChangeCounter.value, inlined)
    )


def verifier_times(verifier: bytes) -> tuple[int, int]:
    """The exclusive-create verifier as (atime, mtime) in ns: 31 bits in seconds and 1 in
    nanoseconds each (``base.py``: Exclusive create)."""
    a = int.from_bytes(verifier[:4], "big")
    m = int.from_bytes(verifier[4:8], "big")
    return (a >> 1) * 1_000_000_000 + (a & 1), (m >> 1) * 1_000_000_000 + (m & 1)


def erofs() -> OSError:
    return OSError(errno.EROFS, "read-only export")
