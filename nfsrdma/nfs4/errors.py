"""How failures become nfsstat4 values, and the error result of every operation."""

from __future__ import annotations

import errno
import logging

from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.vfs.base import BadCookie, BadHandle, StaleHandle, WrongSecurity
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import XdrError

log = logging.getLogger(__name__)

ERRNO_STATUS: dict[int, nfs4.nfsstat4] = {
    errno.EPERM: nfs4.NFS4ERR_PERM,
    errno.ENOENT: nfs4.NFS4ERR_NOENT,
    errno.EIO: nfs4.NFS4ERR_IO,
    errno.ENXIO: nfs4.NFS4ERR_NXIO,
    errno.EACCES: nfs4.NFS4ERR_ACCESS,
    errno.EEXIST: nfs4.NFS4ERR_EXIST,
    errno.EXDEV: nfs4.NFS4ERR_XDEV,
    errno.ENOTDIR: nfs4.NFS4ERR_NOTDIR,
    errno.EISDIR: nfs4.NFS4ERR_ISDIR,
    errno.EINVAL: nfs4.NFS4ERR_INVAL,
    errno.EFBIG: nfs4.NFS4ERR_FBIG,
    errno.ENOSPC: nfs4.NFS4ERR_NOSPC,
    errno.EDQUOT: nfs4.NFS4ERR_DQUOT,
    errno.EROFS: nfs4.NFS4ERR_ROFS,
    errno.EMLINK: nfs4.NFS4ERR_MLINK,
    errno.ENAMETOOLONG: nfs4.NFS4ERR_NAMETOOLONG,
    errno.ENOTEMPTY: nfs4.NFS4ERR_NOTEMPTY,
    errno.ESTALE: nfs4.NFS4ERR_STALE,
    errno.ELOOP: nfs4.NFS4ERR_SYMLINK,
    errno.EBADF: nfs4.NFS4ERR_BAD_STATEID,
    errno.EAGAIN: nfs4.NFS4ERR_DELAY,
    errno.EOPNOTSUPP: nfs4.NFS4ERR_NOTSUPP,
    errno.ENOTSUP: nfs4.NFS4ERR_NOTSUPP,
    errno.ETXTBSY: nfs4.NFS4ERR_FILE_OPEN,
    errno.EOVERFLOW: nfs4.NFS4ERR_INVAL,
    errno.ERANGE: nfs4.NFS4ERR_INVAL,
    errno.ENODEV: nfs4.NFS4ERR_NXIO,
    # Transient shortages of the server's own resources (descriptors, memory): the client
    # retries after NFS4ERR_DELAY; NFS4ERR_IO would be a hard error for the application.
    errno.EMFILE: nfs4.NFS4ERR_DELAY,
    errno.ENFILE: nfs4.NFS4ERR_DELAY,
    errno.ENOMEM: nfs4.NFS4ERR_DELAY,
    errno.ENOBUFS: nfs4.NFS4ERR_DELAY,
}


def status_of(exc: BaseException) -> nfs4.nfsstat4:
    """The nfsstat4 an exception raised by a handler stands for."""
    if isinstance(exc, Nfs4Error):
        return exc.status
    if isinstance(exc, BadHandle):
        return nfs4.NFS4ERR_BADHANDLE
    if isinstance(exc, StaleHandle):
        return nfs4.NFS4ERR_STALE
    if isinstance(exc, WrongSecurity):
        return nfs4.NFS4ERR_WRONGSEC
    if isinstance(exc, BadCookie):
        return nfs4.NFS4ERR_BAD_COOKIE
    if isinstance(exc, XdrError):
        return nfs4.NFS4ERR_BADXDR
    if isinstance(exc, OSError) and exc.errno is not None:
        return ERRNO_STATUS.get(exc.errno, nfs4.NFS4ERR_IO)
    return nfs4.NFS4ERR_SERVERFAULT
