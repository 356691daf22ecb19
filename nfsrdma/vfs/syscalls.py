"""Linux system calls the standard library lacks, through ctypes.

name_to_handle_at(2)/open_by_handle_at(2) for persistent file handles, open_tree(2) to serve an
export without its submounts, faccessat2(2) for permission checks with the thread's fs identity,
utimensat(2)/fchownat(2) on O_PATH descriptors, the raw per-thread credential calls, and
ioctl(FICLONERANGE) for CLONE.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import struct
import threading
from typing import Final, Literal

AT_FDCWD: Final = -100
AT_SYMLINK_NOFOLLOW: Final = 0x100
AT_EACCESS: Final = 0x200
AT_EMPTY_PATH: Final = 0x1000
MAX_HANDLE_SZ: Final = 128
OPEN_TREE_CLONE: Final = 1
UTIME_NOW: Final = (1 << 30) - 1
UTIME_OMIT: Final = (1 << 30) - 2

# Syscall numbers. open_tree and faccessat2 come from the unified table (same on every arch).
_NR_OPEN_TREE: Final = 428
_NR_FACCESSAT2: Final = 439
_CRED_NR: Final[dict[str, tuple[int, int, int]]] = {
    # machine: (setfsuid, setfsgid, setgroups)
    "x86_64": (122, 123, 116),
    "aarch64": (151, 152, 159),
}

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

_name_to_handle_at = _libc.name_to_handle_at
_name_to_handle_at.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_int,
]
_name_to_handle_at.restype = ctypes.c_int

_open_by_handle_at = _libc.open_by_handle_at
_open_by_handle_at.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
_open_by_handle_at.restype = ctypes.c_int


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_utimensat = _libc.utimensat
_utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Timespec), ctypes.c_int]
_utimensat.restype = ctypes.c_int

_fchownat = _libc.fchownat
_fchownat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_int]
_fchownat.restype = ctypes.c_int

_FH_HEADER = struct.Struct("=Ii")  # struct file_handle: handle_bytes, handle_type


def _raise_errno(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def name_to_handle_at(dirfd: int, path: bytes, flags: int) -> tuple[int, bytes, int]:
    """Return ``(handle_type, handle_bytes, mount_id)`` of ``path`` relative to ``dirfd``."""
    buf = ctypes.create_string_buffer(_FH_HEADER.size + MAX_HANDLE_SZ)
    _FH_HEADER.pack_into(buf, 0, MAX_HANDLE_SZ, 0)
    mount_id = ctypes.c_int()
    if _name_to_handle_at(dirfd, path, buf, ctypes.byref(mount_id), flags) != 0:
        _raise_errno("name_to_handle_at")
    nbytes, htype = _FH_HEADER.unpack_from(buf, 0)
    return htype, buf.raw[_FH_HEADER.size : _FH_HEADER.size + nbytes], mount_id.value


class _HandleBuffers(threading.local):
    """A thread's buffers for ``fd_handle`` (made once per thread, not per call)."""

    def __init__(self) -> None:
        self.buf = ctypes.create_string_buffer(_FH_HEADER.size + MAX_HANDLE_SZ)
        self.mount_id = ctypes.c_int()
        self.mount_id_ref = ctypes.byref(self.mount_id)


_handle_buffers = _HandleBuffers()


def fd_handle(fd: int) -> tuple[int, bytes, int]:
    """name_to_handle_at of the object an (O_PATH) descriptor refers to (every new handle:
    a create, a LOOKUP or READDIR entry not seen before), in the calling thread's buffers."""
    t = _handle_buffers
    buf = t.buf
    _FH_HEADER.pack_into(buf, 0, MAX_HANDLE_SZ, 0)
    if _name_to_handle_at(fd, b"", buf, t.mount_id_ref, AT_EMPTY_PATH) != 0:
        _raise_errno("name_to_handle_at")
    nbytes, htype = _FH_HEADER.unpack_from(buf, 0)
    return htype, buf.raw[_FH_HEADER.size : _FH_HEADER.size + nbytes], t.mount_id.value


_statx = getattr(_libc, "statx", None)
if _statx is not None:
    _statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    _statx.restype = ctypes.c_int
STATX_MNT_ID: Final = 0x1000
_STATX_SIZE: Final = 256
_STATX_MNT_ID_OFFSET: Final = 144


def mount_id(fd: int) -> int | None:
    """The mount ID of ``fd``'s object (statx STATX_MNT_ID, Linux 5.8+), or None if unknown."""
    if _statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if _statx(fd, b"", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, buf) != 0:
        return None
    mask = struct.unpack_from("=I", buf, 0)[0]
    if not mask & STATX_MNT_ID:
        return None
    return int(struct.unpack_from("=Q", buf, _STATX_MNT_ID_OFFSET)[0])


def open_by_handle_at(mount_fd: int, htype: int, handle: bytes, flags: int) -> int:
    """Open a kernel file handle (needs CAP_DAC_READ_SEARCH). ``mount_fd`` must not be O_PATH."""
    buf = _FH_HEADER.pack(len(handle), htype) + handle
    fd = int(_open_by_handle_at(mount_fd, buf, flags))
    if fd < 0:
        _raise_errno("open_by_handle_at")
    return fd


def open_tree_clone(path: str) -> int:
    """A detached copy of the mount at ``path`` without its submounts (needs CAP_SYS_ADMIN).

    The result is an O_PATH descriptor whose tree shows what lies *under* any mount point, as
    knfsd does for an export without ``crossmnt``.
    """
    fd = raw_syscall(_NR_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | os.O_CLOEXEC)
    if fd < 0:
        _raise_errno("open_tree")
    return fd


def faccessat_empty(fd: int, mode: int) -> bool:
    """Whether the thread's fs identity has ``mode`` (R_OK/W_OK/X_OK) on ``fd``'s object.

    Uses the faccessat2 system call with AT_EACCESS, so the check uses the thread's fsuid,
    fsgid and groups (and capabilities), never glibc's user-space emulation. Raises
    ``OSError(ENOSYS)`` on kernels older than 5.8.
    """
    r = raw_syscall(_NR_FACCESSAT2, fd, b"", mode, AT_EACCESS | AT_EMPTY_PATH)
    if r == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EACCES, errno.EPERM, errno.EROFS):
        return False
    raise OSError(err, f"faccessat2: {os.strerror(err)}")


TimeSpec = int | Literal["now"] | None
"""Nanoseconds since the epoch, ``"now"`` (UTIME_NOW) or ``None`` (UTIME_OMIT)."""


def _timespec(value: TimeSpec) -> _Timespec:
    if value is None:
        return _Timespec(0, UTIME_OMIT)
    if value == "now":
        return _Timespec(0, UTIME_NOW)
    sec, nsec = divmod(value, 1_000_000_000)
    return _Timespec(sec, nsec)


def utimens_empty(fd: int, atime: TimeSpec, mtime: TimeSpec) -> None:
    """utimensat on the object ``fd`` refers to (works on O_PATH descriptors and symlinks)."""
    times = (_Timespec * 2)(_timespec(atime), _timespec(mtime))
    if _utimensat(fd, b"", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0:
        _raise_errno("utimensat")


def fchown_empty(fd: int, uid: int | None, gid: int | None) -> None:
    """fchownat on the object ``fd`` refers to; ``None`` leaves an id unchanged."""
    u = 0xFFFFFFFF if uid is None else uid
    g = 0xFFFFFFFF if gid is None else gid
    if _fchownat(fd, b"", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0:
        _raise_errno("fchownat")


def cred_syscalls() -> tuple[int, int, int] | None:
    """(setfsuid, setfsgid, setgroups) numbers for this machine, or None if unknown."""
    return _CRED_NR.get(platform.machine())


_SyscallArg = int | bytes | ctypes.Array[ctypes.c_uint]


def raw_syscall(nr: int, *args: _SyscallArg) -> int:
    """A raw system call; returns the kernel's result (``-1`` with errno on failure).

    Integers are passed as C ``long`` so negative values (AT_FDCWD, -1) reach the kernel intact.
    """
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return int(_syscall(ctypes.c_long(nr), *conv))


def last_errno() -> int:
    return ctypes.get_errno()


# FICLONERANGE: _IOW(0x94, 13, struct file_clone_range), the same on every architecture.
FICLONERANGE: Final = 0x4020940D
_CLONE_RANGE = struct.Struct("=qQQQ")  # src_fd, src_offset, src_length, dest_offset


def clone_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> None:
    """ioctl(FICLONERANGE): ``dst_fd`` shares ``src_fd``'s blocks of ``[src_offset, +length)``
    at ``dst_offset`` (``length`` 0: to the end of the source). EOPNOTSUPP (or EXDEV, EINVAL)
    where the file system cannot."""
    arg = _CLONE_RANGE.pack(src_fd, src_offset, length, dst_offset)
    fcntl.ioctl(dst_fd, FICLONERANGE, arg)


FALLOC_FL_KEEP_SIZE: Final = 0x01
FALLOC_FL_PUNCH_HOLE: Final = 0x02
_fallocate = _libc.fallocate64
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def punch_hole(fd: int, offset: int, length: int) -> None:
    """fallocate(PUNCH_HOLE | KEEP_SIZE): deallocate a range, reading back as zeros."""
    if _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        _raise_errno("fallocate")


def allocate(fd: int, offset: int, length: int) -> None:
    """fallocate(mode 0): reserve blocks, extending the size if the range ends past it (no
    emulation by writing zeros, unlike posix_fallocate: EOPNOTSUPP where unsupported)."""
    if _fallocate(fd, 0, offset, length) != 0:
        _raise_errno("fallocate")


# fanotify(7), for the watch of names moved or removed (confine.MoveWatch).
FAN_CLOEXEC: Final = 0x01
FAN_NONBLOCK: Final = 0x02
FAN_REPORT_DIR_FID: Final = 0x400  # directory-entry events need a FID report (no descriptors)
FAN_REPORT_TID: Final = 0x100  # events carry the thread ID of their cause, not the process ID
FAN_Q_OVERFLOW: Final = 0x4000
FAN_MARK_ADD: Final = 0x01
FAN_MARK_FILESYSTEM: Final = 0x100  # the whole file system (superblock) of the path given
FAN_MOVED_FROM: Final = 0x40
FAN_MOVED_TO: Final = 0x80
FAN_DELETE: Final = 0x200
FAN_ONDIR: Final = 0x40000000
_fanotify_init = getattr(_libc, "fanotify_init", None)
_fanotify_mark = getattr(_libc, "fanotify_mark", None)
if _fanotify_init is not None and _fanotify_mark is not None:
    _fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    _fanotify_init.restype = ctypes.c_int
    _fanotify_mark.argtypes = [
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    _fanotify_mark.restype = ctypes.c_int


def fanotify_init(flags: int) -> int:
    """A fanotify group (needs CAP_SYS_ADMIN for the marks used here); its descriptor."""
    if _fanotify_init is None:
        raise OSError(errno.ENOSYS, "fanotify_init: not in this C library")
    fd = int(_fanotify_init(flags, os.O_RDONLY | os.O_CLOEXEC))
    if fd < 0:
        _raise_errno("fanotify_init")
    return fd


def fanotify_mark_filesystem(group: int, mask: int, dirfd: int) -> None:
    """Add ``mask`` for the whole file system of the directory ``dirfd`` (may be O_PATH)."""
    assert _fanotify_mark is not None
    if _fanotify_mark(group, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, mask, dirfd, b".") != 0:
        _raise_errno("fanotify_mark")


_fstatfs = _libc.fstatfs
_fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
_fstatfs.restype = ctypes.c_int
_STATFS_SIZE: Final = 256  # struct statfs is 120 octets on 64-bit Linux; f_type comes first


def fs_type(fd: int) -> int:
    """The file system's magic number (statfs ``f_type``) of ``fd``'s object."""
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _fstatfs(fd, buf) != 0:
        _raise_errno("fstatfs")
    return int(ctypes.c_long.from_buffer(buf).value) & 0xFFFFFFFF
