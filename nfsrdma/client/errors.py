"""NFS4ERR_* as Python exceptions.

Every failure of an operation raises an ``NfsError``: an ``OSError`` with the matching ``errno``
and the NFS status in ``.status``. Where Python has a specific subclass the error is also an
instance of it, so ``except FileNotFoundError`` works as it does for local files.
"""

from __future__ import annotations

import errno

from nfsrdma.xdr.gen import nfs4

STATUS_ERRNO: dict[int, int] = {
    nfs4.NFS4ERR_PERM: errno.EPERM,
    nfs4.NFS4ERR_NOENT: errno.ENOENT,
    nfs4.NFS4ERR_IO: errno.EIO,
    nfs4.NFS4ERR_NXIO: errno.ENXIO,
    nfs4.NFS4ERR_ACCESS: errno.EACCES,
    nfs4.NFS4ERR_EXIST: errno.EEXIST,
    nfs4.NFS4ERR_XDEV: errno.EXDEV,
    nfs4.NFS4ERR_NOTDIR: errno.ENOTDIR,
    nfs4.NFS4ERR_ISDIR: errno.EISDIR,
    nfs4.NFS4ERR_INVAL: errno.EINVAL,
    nfs4.NFS4ERR_FBIG: errno.EFBIG,
    nfs4.NFS4ERR_NOSPC: errno.ENOSPC,
    nfs4.NFS4ERR_ROFS: errno.EROFS,
    nfs4.NFS4ERR_MLINK: errno.EMLINK,
    nfs4.NFS4ERR_NAMETOOLONG: errno.ENAMETOOLONG,
    nfs4.NFS4ERR_NOTEMPTY: errno.ENOTEMPTY,
    nfs4.NFS4ERR_DQUOT: errno.EDQUOT,
    nfs4.NFS4ERR_STALE: errno.ESTALE,
    nfs4.NFS4ERR_BADHANDLE: errno.EBADF,
    nfs4.NFS4ERR_NOTSUPP: errno.EOPNOTSUPP,
    nfs4.NFS4ERR_ATTRNOTSUPP: errno.EOPNOTSUPP,
    nfs4.NFS4ERR_LOCK_NOTSUPP: errno.EOPNOTSUPP,
    nfs4.NFS4ERR_DELAY: errno.EAGAIN,
    nfs4.NFS4ERR_GRACE: errno.EAGAIN,
    nfs4.NFS4ERR_DENIED: errno.EAGAIN,
    nfs4.NFS4ERR_LOCKED: errno.EAGAIN,
    nfs4.NFS4ERR_DEADLOCK: errno.EDEADLK,
    nfs4.NFS4ERR_SHARE_DENIED: errno.EACCES,
    nfs4.NFS4ERR_WRONGSEC: errno.EACCES,
    nfs4.NFS4ERR_SYMLINK: errno.ELOOP,
    nfs4.NFS4ERR_FILE_OPEN: errno.EBUSY,
    nfs4.NFS4ERR_BADNAME: errno.EINVAL,
    nfs4.NFS4ERR_BADCHAR: errno.EINVAL,
    nfs4.NFS4ERR_BADTYPE: errno.EINVAL,
    nfs4.NFS4ERR_WRONG_TYPE: errno.EINVAL,
    nfs4.NFS4ERR_BAD_RANGE: errno.EINVAL,
    nfs4.NFS4ERR_LOCK_RANGE: errno.EINVAL,
    nfs4.NFS4ERR_OPENMODE: errno.EBADF,
    nfs4.NFS4ERR_BAD_STATEID: errno.EBADF,
    nfs4.NFS4ERR_OLD_STATEID: errno.EBADF,
    nfs4.NFS4ERR_STALE_STATEID: errno.EBADF,
    nfs4.NFS4ERR_EXPIRED: errno.EBADF,
    nfs4.NFS4ERR_ADMIN_REVOKED: errno.EBADF,
    nfs4.NFS4ERR_DELEG_REVOKED: errno.EBADF,
    nfs4.NFS4ERR_BADOWNER: errno.EINVAL,
    nfs4.NFS4ERR_TOOSMALL: errno.EINVAL,
    nfs4.NFS4ERR_NOFILEHANDLE: errno.EBADF,
    nfs4.NFS4ERR_MOVED: errno.EREMOTE,
    nfs4.NFS4ERR_REP_TOO_BIG: errno.EMSGSIZE,
    nfs4.NFS4ERR_NOXATTR: errno.ENODATA,  # NFSv4.2 (RFC 8276)
    nfs4.NFS4ERR_XATTR2BIG: errno.E2BIG,
    nfs4.NFS4ERR_OFFLOAD_DENIED: errno.EOPNOTSUPP,
    nfs4.NFS4ERR_REQ_TOO_BIG: errno.EMSGSIZE,
    nfs4.NFS4ERR_TOO_MANY_OPS: errno.E2BIG,
}


def status_name(status: int) -> str:
    try:
        return nfs4.nfsstat4(status).name
    except ValueError:
        return f"NFS status {status}"


class NfsError(OSError):
    """An NFS operation failed: ``errno`` as for a local file, ``status`` the nfsstat4."""

    status: int
    op: str

    def __init__(self, status: int, op: str = "", filename: str | None = None) -> None:
        code = STATUS_ERRNO.get(status, errno.EIO)
        what = f"{op}: {status_name(status)}" if op else status_name(status)
        if filename is None:
            super().__init__(code, what)
        else:
            super().__init__(code, what, filename)
        self.status = status
        self.op = op


class NfsFileNotFoundError(NfsError, FileNotFoundError):
    pass


class NfsPermissionError(NfsError, PermissionError):
    pass


class NfsFileExistsError(NfsError, FileExistsError):
    pass


class NfsIsADirectoryError(NfsError, IsADirectoryError):
    pass


class NfsNotADirectoryError(NfsError, NotADirectoryError):
    pass


class NfsBlockingIOError(NfsError, BlockingIOError):
    """The lock is held by someone else (NFS4ERR_DENIED), or the server asks us to wait."""


_CLASSES: dict[int, type[NfsError]] = {
    errno.ENOENT: NfsFileNotFoundError,
    errno.EPERM: NfsPermissionError,
    errno.EACCES: NfsPermissionError,
    errno.EEXIST: NfsFileExistsError,
    errno.EISDIR: NfsIsADirectoryError,
    errno.ENOTDIR: NfsNotADirectoryError,
    errno.EAGAIN: NfsBlockingIOError,
}


def nfs_error(status: int, op: str = "", filename: str | None = None) -> NfsError:
    """The exception for ``status`` (an ``NfsError`` of the matching OSError subclass)."""
    cls = _CLASSES.get(STATUS_ERRNO.get(status, errno.EIO), NfsError)
    return cls(status, op, filename)
