"""Attributes from one ``fstat``, and what backends share about them."""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

from nfsrdma.vfs.base import Attributes, FileType
from nfsrdma.vfs.changes import ChangeCounter

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


def from_stat(st: os.stat_result, count: int) -> Attributes:
    """``count`` is the file's change counter, read before the ``fstat`` that produced ``st``."""
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
        change=ChangeCounter.value(st.st_ctime_ns, count),
    )


def verifier_times(verifier: bytes) -> tuple[int, int]:
    """The exclusive-create verifier as (atime, mtime) in ns: 31 bits in seconds and 1 in
    nanoseconds each (``base.py``: Exclusive create)."""
    a = int.from_bytes(verifier[:4], "big")
    m = int.from_bytes(verifier[4:8], "big")
    return (a >> 1) * 1_000_000_000 + (a & 1), (m >> 1) * 1_000_000_000 + (m & 1)


def erofs() -> OSError:
    return OSError(errno.EROFS, "read-only export")
