"""A small typed binding of libcephfs's low-level (``ceph_ll_*``) API, through ctypes.

Debian's ``python3-cephfs`` is path based and gives whole-second timestamps; an NFS server needs
look-ups by inode number (file handles), nanosecond times and the change attribute
(``stx_version``), readdirplus, and a credential per call (``UserPerm``). Those calls are in
``libcephfs.so.2`` (package ``libcephfs2``); their prototypes and ``struct ceph_statx`` follow
``<cephfs/libcephfs.h>`` (Ceph 16). Every call releases the GIL (ctypes does), so file I/O in the
thread pool runs beside the event loop.

Errors: the library returns ``-errno``; :func:`check` turns that into ``OSError``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    byref,
    c_char,
    c_char_p,
    c_int,
    c_int64,
    c_long,
    c_size_t,
    c_uint,
    c_uint16,
    c_uint32,
    c_uint64,
    c_ulong,
    c_void_p,
)
from typing import Any, Final

# CEPH_STATX_* (what ceph_ll_getattr is asked for) and CEPH_SETATTR_* (what ll_setattr sets).
STATX_BASIC_STATS: Final = 0x7FF
STATX_VERSION: Final = 0x1000
STATX_WANT: Final = STATX_BASIC_STATS | STATX_VERSION
SETATTR_MODE: Final = 1 << 0
SETATTR_UID: Final = 1 << 1
SETATTR_GID: Final = 1 << 2
SETATTR_MTIME: Final = 1 << 3
SETATTR_ATIME: Final = 1 << 4
SETATTR_SIZE: Final = 1 << 5
AT_SYMLINK_NOFOLLOW: Final = 0x100


class Timespec(Structure):
    _fields_ = (("tv_sec", c_long), ("tv_nsec", c_long))

    def ns(self) -> int:
        return int(self.tv_sec) * 1_000_000_000 + int(self.tv_nsec)


class Statx(Structure):
    """``struct ceph_statx``."""

    _fields_ = (
        ("stx_mask", c_uint32),
        ("stx_blksize", c_uint32),
        ("stx_nlink", c_uint32),
        ("stx_uid", c_uint32),
        ("stx_gid", c_uint32),
        ("stx_mode", c_uint16),
        ("stx_ino", c_uint64),
        ("stx_size", c_uint64),
        ("stx_blocks", c_uint64),
        ("stx_dev", c_ulong),
        ("stx_rdev", c_ulong),
        ("stx_atime", Timespec),
        ("stx_ctime", Timespec),
        ("stx_mtime", Timespec),
        ("stx_btime", Timespec),
        ("stx_version", c_uint64),
    )


class StatVfs(Structure):
    """``struct statvfs`` (glibc, 64-bit)."""

    _fields_ = (
        ("f_bsize", c_ulong),
        ("f_frsize", c_ulong),
        ("f_blocks", c_uint64),
        ("f_bfree", c_uint64),
        ("f_bavail", c_uint64),
        ("f_files", c_uint64),
        ("f_ffree", c_uint64),
        ("f_favail", c_uint64),
        ("f_fsid", c_ulong),
        ("f_flag", c_ulong),
        ("f_namemax", c_ulong),
        ("f_spare", c_int * 6),
    )


class Dirent(Structure):
    """``struct dirent`` (glibc, 64-bit)."""

    _fields_ = (
        ("d_ino", c_uint64),
        ("d_off", c_int64),
        ("d_reclen", ctypes.c_ushort),
        ("d_type", ctypes.c_ubyte),
        ("d_name", c_char * 256),
    )


class Flock(Structure):
    """``struct flock`` (x86_64 and aarch64)."""

    _fields_ = (
        ("l_type", ctypes.c_short),
        ("l_whence", ctypes.c_short),
        ("l_start", c_int64),
        ("l_len", c_int64),
        ("l_pid", c_int),
    )


class InodeNo(Structure):
    _fields_ = (("val", c_uint64),)


Ptr = c_void_p  # struct ceph_mount_info *, Inode *, Fh *, UserPerm *, ceph_dir_result *


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("cephfs") or "libcephfs.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    P, PP = c_void_p, POINTER(c_void_p)
    sx, u, i = POINTER(Statx), c_uint, c_int
    protos: dict[str, tuple[Any, list[Any]]] = {
        "ceph_create": (i, [PP, c_char_p]),
        "ceph_conf_read_file": (i, [P, c_char_p]),
        "ceph_conf_set": (i, [P, c_char_p, c_char_p]),
        "ceph_conf_get": (i, [P, c_char_p, c_char_p, c_size_t]),
        "ceph_mount": (i, [P, c_char_p]),
        "ceph_unmount": (i, [P]),
        "ceph_release": (i, [P]),
        "ceph_get_fs_cid": (c_int64, [P]),
        "ceph_userperm_new": (P, [u, u, i, POINTER(c_uint)]),
        "ceph_userperm_destroy": (None, [P]),
        "ceph_ll_lookup_root": (i, [P, PP]),
        "ceph_ll_lookup_inode": (i, [P, InodeNo, PP]),
        "ceph_ll_lookup": (i, [P, P, c_char_p, PP, sx, u, u, P]),
        "ceph_ll_put": (i, [P, P]),
        "ceph_ll_getattr": (i, [P, P, sx, u, u, P]),
        "ceph_ll_setattr": (i, [P, P, sx, i, P]),
        "ceph_ll_open": (i, [P, P, i, PP, P]),
        "ceph_ll_read": (i, [P, P, c_int64, c_uint64, P]),
        "ceph_ll_write": (i, [P, P, c_int64, c_uint64, P]),
        "ceph_ll_fsync": (i, [P, P, i]),
        "ceph_ll_close": (i, [P, P]),
        "ceph_ll_create": (i, [P, P, c_char_p, u, i, PP, PP, sx, u, u, P]),
        "ceph_ll_mknod": (i, [P, P, c_char_p, u, c_ulong, PP, sx, u, u, P]),
        "ceph_ll_mkdir": (i, [P, P, c_char_p, u, PP, sx, u, u, P]),
        "ceph_ll_symlink": (i, [P, P, c_char_p, c_char_p, PP, sx, u, u, P]),
        "ceph_ll_readlink": (i, [P, P, c_char_p, c_size_t, P]),
        "ceph_ll_link": (i, [P, P, P, c_char_p, P]),
        "ceph_ll_unlink": (i, [P, P, c_char_p, P]),
        "ceph_ll_rmdir": (i, [P, P, c_char_p, P]),
        "ceph_ll_rename": (i, [P, P, c_char_p, P, c_char_p, P]),
        "ceph_ll_opendir": (i, [P, P, PP, P]),
        "ceph_ll_releasedir": (i, [P, P]),
        "ceph_readdirplus_r": (i, [P, P, POINTER(Dirent), sx, u, u, PP]),
        "ceph_ll_statfs": (i, [P, P, POINTER(StatVfs)]),
        "ceph_ll_getlk": (i, [P, P, POINTER(Flock), c_uint64]),
        "ceph_ll_setlk": (i, [P, P, POINTER(Flock), c_uint64, i]),
    }
    for fname, (restype, argtypes) in protos.items():
        fn = getattr(lib, fname)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """The loaded library (OSError when libcephfs2 is not installed)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def check(ret: int, what: str) -> int:
    if ret < 0:
        raise OSError(-ret, f"{what}: {os.strerror(-ret)}")
    return ret


class Mount:
    """One libcephfs client mount (``ceph_create`` + ``ceph_mount``); thread-safe."""

    def __init__(self, conf: str | None, client_id: str | None, root: str) -> None:
        L = lib()
        cm = c_void_p()
        check(L.ceph_create(byref(cm), client_id.encode() if client_id else None), "ceph_create")
        self.cmount = cm
        try:
            check(L.ceph_conf_read_file(cm, conf.encode() if conf else None), "read ceph.conf")
            check(L.ceph_mount(cm, root.encode()), f"mount CephFS at {root}")
        except OSError:
            L.ceph_release(cm)
            raise
        self.fscid = int(L.ceph_get_fs_cid(cm))

    def conf_get(self, option: str) -> str:
        buf = ctypes.create_string_buffer(4096)
        check(lib().ceph_conf_get(self.cmount, option.encode(), buf, len(buf)), option)
        return buf.value.decode()

    def close(self) -> None:
        if self.cmount:
            L = lib()
            L.ceph_unmount(self.cmount)
            L.ceph_release(self.cmount)
            self.cmount = c_void_p()


def userperm(uid: int, gid: int, gids: tuple[int, ...]) -> c_void_p:
    arr = (c_uint * max(1, len(gids)))(*gids)
    p = lib().ceph_userperm_new(uid, gid, len(gids), arr)
    if not p:
        raise MemoryError("ceph_userperm_new")
    return c_void_p(p)
