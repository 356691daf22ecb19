"""Serving a CephFS directory through libcephfs (the second :class:`~nfsrdma.vfs.base.Vfs`).

The server is one CephFS client (one ``ceph_mount`` at ``--ceph-path``); every NFS call is a
``ceph_ll_*`` call on inodes, with the caller's (squashed) AUTH_SYS identity as that call's
``UserPerm``. libcephfs checks permissions itself against that identity, so no per-thread
identity switching is needed and the server need not run as root.

File handles
------------
``version | fscid (8) | inode number (8) | MAC (16)``. The inode number finds the object from a
cold client (``ceph_ll_lookup_inode``), so handles survive a restart of the server and are
valid on every nfsrdma server in front of the same file system. The MAC is keyed with a secret
derived from the server's cephx key, which every server using the same Ceph identity shares,
and which NFS clients never see: a client cannot forge a handle to an inode it was never given
(for instance one outside ``--ceph-path``). Without a cephx key the secret of ``--state-dir``
is used instead, and handles are then valid on this server only. An object moved out of the
exported subtree keeps working through handles already given out (knfsd's no_subtree_check).

Change attribute and times come from ``ceph_statx``: ``stx_version`` (the MDS bumps it on every
change, seen by all servers) and nanosecond timestamps. READDIR cookies are the same keyed name
hashes as the local backend's (``dircookies.py``), so a listing may be continued on another
server with the same secret.
"""

from __future__ import annotations

import base64
import configparser
import errno
import fcntl
import hashlib
import hmac
import os
import stat
import struct
import threading
import time
from collections import OrderedDict
from ctypes import byref, c_char, c_void_p, create_string_buffer
from typing import Final

from nfsrdma.vfs.attrs import FTYPE, S_IFMT_OF, erofs, verifier_times
from nfsrdma.vfs.base import (
    ACCESS4_DELETE,
    ACCESS4_EXECUTE,
    ACCESS4_EXTEND,
    ACCESS4_LOOKUP,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    NFS4_VERIFIER_SIZE,
    SET_TO_SERVER_TIME,
    Attributes,
    BadCookie,
    BadHandle,
    CreateMode,
    Cred,
    DirEntry,
    DirListing,
    Export,
    FileType,
    FsStats,
    OpenFile,
    StaleHandle,
    TimeSet,
    Vfs,
)
from nfsrdma.vfs.ceph import libcephfs as lc
from nfsrdma.vfs.ceph.grace import ClusterGrace
from nfsrdma.vfs.ceph.guard import Guard, guarded
from nfsrdma.vfs.confine import check_name
from nfsrdma.vfs.dircookies import CookieJar
from nfsrdma.vfs.identity import squash
from nfsrdma.vfs.secret import export_secret

_HEAD: Final = struct.Struct(">BQQ")
_VERSION: Final = 0xC1
_MAC: Final = 16
_FH_SIZE: Final = _HEAD.size + _MAC
_MODIFYING: Final = ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE
_INODE_CACHE: Final = 1 << 16
_PERM_CACHE: Final = 256
_OFF_MAX: Final = (1 << 63) - 1
_TO_EOF: Final = 1 << 64


def cephx_secret(mount: lc.Mount, client_id: str | None) -> bytes | None:
    """The cephx key of ``client.<id>`` from the keyring libcephfs uses, if readable."""
    try:
        paths = mount.conf_get("keyring")
    except OSError:
        return None
    name = f"client.{client_id or 'admin'}"
    for path in paths.split(","):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        try:
            with open(path.strip()) as f:
                parser.read_file(f)
        except (OSError, configparser.Error):
            continue
        if parser.has_option(name, "key"):
            try:
                return base64.b64decode(parser.get(name, "key").strip())
            except ValueError:
                return None
    return None


class CephOpenFile(OpenFile):
    """An open CephFS file (``Fh *``)."""

    def __init__(self, vfs: CephVfs, fh: bytes, inode: c_void_p, handle: c_void_p) -> None:
        self._vfs = vfs
        self._handle: c_void_p | None = handle
        self._inode = inode
        self._lock = threading.Lock()
        self.fh = fh
        self.fileid = vfs._ino_of(fh)
        self.readable = True
        self.writable = True
        vfs._opened(self.fileid, 1)

    def _fh(self) -> c_void_p:
        h = self._handle
        if h is None:
            raise OSError(errno.EBADF, "file closed")
        return h

    def read(self, offset: int, count: int) -> tuple[bytes, bool]:
        buf = bytearray(count)
        n, eof = self.readinto(offset, buf)
        return bytes(buf[:n]), eof

    def readinto(self, offset: int, buf: memoryview | bytearray) -> tuple[int, bool]:
        mv = memoryview(buf).cast("B")
        if mv.readonly:
            raise OSError(errno.EINVAL, "read into a read-only buffer")
        carr = (c_char * len(mv)).from_buffer(mv)
        n = lc.check(
            lc.lib().ceph_ll_read(self._vfs._cm, self._fh(), offset, len(mv), carr), "read"
        )
        eof = n < len(mv) or offset + n >= self._vfs._attrs_of_inode(self._inode).size
        return n, eof

    def write(self, offset: int, data: bytes | memoryview | bytearray, stable: bool = False) -> int:
        mv = memoryview(data).cast("B")
        if mv.readonly:
            src: object = bytes(mv)
        else:
            src = (c_char * len(mv)).from_buffer(mv)
        n = lc.check(
            lc.lib().ceph_ll_write(self._vfs._cm, self._fh(), offset, len(mv), src), "write"
        )
        if stable:
            self.commit()
        return n

    def commit(self) -> None:
        lc.check(lc.lib().ceph_ll_fsync(self._vfs._cm, self._fh(), 0), "fsync")

    def getattr(self) -> Attributes:
        return self._vfs._guard.run(self._vfs._attrs_of_inode, self._inode)

    def close(self) -> None:
        self._vfs._guard.run(self._close)

    def _close(self) -> None:
        with self._lock:
            h, self._handle = self._handle, None
        if h is not None:
            lc.lib().ceph_ll_close(self._vfs._cm, h)
            self._vfs._opened(self.fileid, -1)


class CephVfs(Vfs):
    """Serves ``ceph_path`` of the CephFS that ``conf`` names. See the module docstring."""

    def __init__(
        self,
        export: Export,
        *,
        conf: str | None = None,
        client_id: str | None = None,
        ceph_path: str = "/",
        grace_pool: str | None = "nfsrdma",
        call_wait: float = 2.0,
    ) -> None:
        """``grace_pool``: the RADOS pool of the grace period shared with the other servers
        of this file system (``grace.py``); None: this server's own grace period only."""
        self.export = export
        self._conf, self._client_id, self._grace_pool = conf, client_id, grace_pool
        self._grace: ClusterGrace | None = None
        self._guard = Guard(call_wait)
        self.write_verifier = os.urandom(NFS4_VERIFIER_SIZE)
        self._mount = lc.Mount(conf, client_id, ceph_path)
        self._ceph_path = ceph_path
        self._cm = self._mount.cmount
        self._lib = lc.lib()
        secret = cephx_secret(self._mount, client_id)
        if secret is None:
            state = export.state_dir or None
            secret = export_secret(f"ceph:{self._mount.fscid}:{ceph_path}", os.stat("/"), state)
        key = hmac.digest(secret, b"nfsrdma cephfs handle v1", "sha256")
        self._key = hmac.digest(key, ceph_path.encode(), "sha256")
        self._cookies = CookieJar(self._key)
        self._lock = threading.Lock()
        self._inodes: OrderedDict[int, c_void_p] = OrderedDict()
        self._perms: OrderedDict[Cred, c_void_p] = OrderedDict()
        self._open_counts: dict[int, int] = {}  # inode -> CephOpenFiles not closed yet
        root = c_void_p()
        lc.check(self._lib.ceph_ll_lookup_root(self._cm, byref(root)), "look up the root")
        stx = lc.Statx()
        lc.check(
            self._lib.ceph_ll_getattr(
                self._cm, root, byref(stx), lc.STATX_WANT, 0, self._perm_of(Cred(0, 0))
            ),
            "root attributes",
        )
        self._root_ino = int(stx.stx_ino)
        self._root = root  # referenced for the life of the mount, never evicted
        self._root_fh = self._pack(self._root_ino)

    # ------------------------------------------------------------------ handles, inodes
    def _pack(self, ino: int) -> bytes:
        body = _HEAD.pack(_VERSION, self._mount.fscid & (2**64 - 1), ino)
        return body + hmac.new(self._key, body, hashlib.sha256).digest()[:_MAC]

    def _ino_of(self, fh: bytes) -> int:
        if not isinstance(fh, bytes) or len(fh) != _FH_SIZE:
            raise BadHandle("bad handle length")
        version, fscid, ino = _HEAD.unpack_from(fh)
        body = fh[: _HEAD.size]
        if version != _VERSION or fscid != self._mount.fscid & (2**64 - 1):
            raise BadHandle("not a handle of this file system")
        if not hmac.compare_digest(
            hmac.new(self._key, body, hashlib.sha256).digest()[:_MAC], fh[-_MAC:]
        ):
            raise BadHandle("handle authentication failed")
        return int(ino)

    def _keep(self, ino: int, inode: c_void_p) -> c_void_p:
        """Cache a referenced ``Inode *`` (dropping the new reference if one is cached)."""
        with self._lock:
            old = self._inodes.get(ino)
            if old is not None:
                self._inodes.move_to_end(ino)
                self._lib.ceph_ll_put(self._cm, inode)
                return old
            self._inodes[ino] = inode
            while len(self._inodes) > _INODE_CACHE:
                _, evicted = self._inodes.popitem(last=False)
                self._lib.ceph_ll_put(self._cm, evicted)
            return inode

    def _inode(self, fh: bytes) -> c_void_p:
        ino = self._ino_of(fh)
        if ino == self._root_ino:
            return self._root
        with self._lock:
            hit = self._inodes.get(ino)
            if hit is not None:
                self._inodes.move_to_end(ino)
                return hit
        inode = c_void_p()
        ret = self._lib.ceph_ll_lookup_inode(self._cm, lc.InodeNo(ino), byref(inode))
        if ret in (-errno.ESTALE, -errno.ENOENT):
            raise StaleHandle("no such inode")
        lc.check(ret, "look up inode")
        return self._keep(ino, inode)

    def _forget(self, ino: int) -> None:
        with self._lock:
            inode = self._inodes.pop(ino, None)
        if inode is not None:
            self._lib.ceph_ll_put(self._cm, inode)

    def _opened(self, ino: int, delta: int) -> None:
        with self._lock:
            n = self._open_counts.get(ino, 0) + delta
            if n > 0:
                self._open_counts[ino] = n
            else:
                self._open_counts.pop(ino, None)

    def _perm_of(self, cred: Cred) -> c_void_p:
        with self._lock:
            p = self._perms.get(cred)
            if p is not None:
                self._perms.move_to_end(cred)
                return p
            p = lc.userperm(cred.uid, cred.gid, cred.gids)
            self._perms[cred] = p
            while len(self._perms) > _PERM_CACHE:
                _, old = self._perms.popitem(last=False)
                self._lib.ceph_userperm_destroy(old)
            return p

    def _perm(self, cred: Cred) -> c_void_p:
        return self._perm_of(squash(self.export, cred))

    def _server_perm(self) -> c_void_p:
        return self._perm_of(Cred(0, 0))

    # ------------------------------------------------------------------ attributes
    def _attrs(self, stx: lc.Statx) -> Attributes:
        ino = int(stx.stx_ino)
        rdev = int(stx.stx_rdev)
        return Attributes(
            type=FTYPE[stat.S_IFMT(stx.stx_mode)],
            mode=stat.S_IMODE(stx.stx_mode),
            nlink=int(stx.stx_nlink),
            uid=int(stx.stx_uid),
            gid=int(stx.stx_gid),
            size=int(stx.stx_size),
            space_used=int(stx.stx_blocks) * 512,
            rdev=(os.major(rdev), os.minor(rdev)),
            fsid=(0xCE9F, self._mount.fscid & 0xFFFFFFFF),
            fileid=ino,
            mounted_on_fileid=ino,
            atime_ns=stx.stx_atime.ns(),
            mtime_ns=stx.stx_mtime.ns(),
            ctime_ns=stx.stx_ctime.ns(),
            change=int(stx.stx_version),
        )

    def _attrs_of_inode(self, inode: c_void_p) -> Attributes:
        stx = lc.Statx()
        lc.check(
            self._lib.ceph_ll_getattr(
                self._cm, inode, byref(stx), lc.STATX_WANT, 0, self._server_perm()
            ),
            "getattr",
        )
        return self._attrs(stx)

    def _stx(self, fh: bytes) -> lc.Statx:
        stx = lc.Statx()
        lc.check(
            self._lib.ceph_ll_getattr(
                self._cm, self._inode(fh), byref(stx), lc.STATX_WANT, 0, self._server_perm()
            ),
            "getattr",
        )
        return stx

    # ------------------------------------------------------------------ Vfs
    def root_handle(self) -> bytes:
        return self._root_fh

    @guarded
    def check(self, fh: bytes) -> None:
        """Live: linked somewhere, or removed while this server still has it open (its
        openers keep using it, as on a local file system)."""
        stx = self._stx(fh)
        if stx.stx_nlink == 0 and not self._open_counts.get(int(stx.stx_ino)):
            raise StaleHandle("removed")

    @guarded
    def getattr(self, fh: bytes) -> Attributes:
        return self._attrs(self._stx(fh))

    def _lookup(self, perm: c_void_p, parent: c_void_p, name: bytes) -> tuple[bytes, lc.Statx]:
        out = c_void_p()
        stx = lc.Statx()
        lc.check(
            self._lib.ceph_ll_lookup(
                self._cm, parent, name, byref(out), byref(stx), lc.STATX_WANT,
                lc.AT_SYMLINK_NOFOLLOW, perm,
            ),
            "lookup",
        )  # fmt: skip
        ino = int(stx.stx_ino)
        self._keep(ino, out)
        return self._pack(ino), stx

    @guarded
    def lookup(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> bytes:
        bname = check_name(name)
        parent = self._inode(dir_fh)
        if not stat.S_ISDIR(self._stx(dir_fh).stx_mode):
            raise OSError(errno.ENOTDIR, "not a directory")
        return self._lookup(self._perm(cred), parent, bname)[0]

    @guarded
    def lookupp(self, cred: Cred, fh: bytes) -> bytes:
        if self._ino_of(fh) == self._root_ino:
            raise OSError(errno.ENOENT, "the export root has no parent here")
        return self._lookup(self._perm(cred), self._inode(fh), b"..")[0]

    @guarded
    def setattr(
        self,
        cred: Cred,
        fh: bytes,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime: TimeSet | None = None,
        mtime: TimeSet | None = None,
    ) -> Attributes:
        if self.export.read_only:
            raise erofs()
        stx = lc.Statx()
        mask = 0
        if mode is not None:
            stx.stx_mode, mask = mode & 0o7777, mask | lc.SETATTR_MODE
        if uid is not None:
            stx.stx_uid, mask = uid, mask | lc.SETATTR_UID
        if gid is not None:
            stx.stx_gid, mask = gid, mask | lc.SETATTR_GID
        if size is not None:
            stx.stx_size, mask = size, mask | lc.SETATTR_SIZE
        for value, field, flag in (
            (atime, "stx_atime", lc.SETATTR_ATIME),
            (mtime, "stx_mtime", lc.SETATTR_MTIME),
        ):
            if value is SET_TO_SERVER_TIME:  # ll_setattr ignores the _NOW flags: our clock
                value = time.time_ns()
            if isinstance(value, int):
                ts = getattr(stx, field)
                ts.tv_sec, ts.tv_nsec = divmod(value, 1_000_000_000)
                mask |= flag
        inode = self._inode(fh)
        if mask:
            lc.check(
                self._lib.ceph_ll_setattr(self._cm, inode, byref(stx), mask, self._perm(cred)),
                "setattr",
            )
        return self._attrs_of_inode(inode)

    @guarded
    def access(self, cred: Cred, fh: bytes, mask: int) -> int:
        stx = self._stx(fh)
        c = squash(self.export, cred)
        m = int(stx.stx_mode)
        if c.uid == 0:
            rwx = 0o7 if (m & 0o111 or stat.S_ISDIR(m)) else 0o6
        elif c.uid == stx.stx_uid:
            rwx = (m >> 6) & 7
        elif c.gid == stx.stx_gid or stx.stx_gid in c.gids:
            rwx = (m >> 3) & 7
        else:
            rwx = m & 7
        r, w, x = bool(rwx & 4), bool(rwx & 2), bool(rwx & 1)
        if stat.S_ISDIR(m):
            table = {
                ACCESS4_READ: r, ACCESS4_LOOKUP: x, ACCESS4_MODIFY: w and x,
                ACCESS4_EXTEND: w and x, ACCESS4_DELETE: w and x,
            }  # fmt: skip
        else:
            table = {ACCESS4_READ: r, ACCESS4_MODIFY: w, ACCESS4_EXTEND: w, ACCESS4_EXECUTE: x}
        if self.export.read_only:
            mask &= ~_MODIFYING
        return sum(bit for bit, ok in table.items() if ok and mask & bit)

    def _open_inode(self, perm: c_void_p, fh: bytes, inode: c_void_p, flags: int) -> CephOpenFile:
        handle = c_void_p()
        lc.check(self._lib.ceph_ll_open(self._cm, inode, flags, byref(handle), perm), "open")
        f = CephOpenFile(self, fh, inode, handle)
        f.readable = flags & os.O_ACCMODE in (os.O_RDONLY, os.O_RDWR)
        f.writable = flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
        return f

    @guarded
    def open(
        self, cred: Cred, fh: bytes, read: bool, write: bool, truncate: bool = False
    ) -> CephOpenFile:
        if (write or truncate) and self.export.read_only:
            raise erofs()
        stx = self._stx(fh)
        if stat.S_ISDIR(stx.stx_mode):
            raise OSError(errno.EISDIR, "is a directory")
        if not stat.S_ISREG(stx.stx_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        flags = os.O_RDWR if read and write else os.O_WRONLY if write else os.O_RDONLY
        if truncate:
            flags |= os.O_TRUNC
        return self._open_inode(self._perm(cred), fh, self._inode(fh), flags)

    @guarded
    def create_file(
        self,
        cred: Cred,
        dir_fh: bytes,
        name: bytes | str,
        mode: int,
        how: CreateMode = CreateMode.UNCHECKED,
        verifier: bytes | None = None,
        *,
        read: bool = True,
        write: bool = True,
    ) -> tuple[bytes, CephOpenFile, bool]:
        if self.export.read_only:
            raise erofs()
        bname = check_name(name)
        if how == CreateMode.EXCLUSIVE and (
            not isinstance(verifier, bytes) or len(verifier) != NFS4_VERIFIER_SIZE
        ):
            raise OSError(errno.EINVAL, "exclusive create needs an 8-octet verifier")
        perm = self._perm(cred)
        parent = self._inode(dir_fh)
        flags = os.O_RDWR | os.O_CREAT | (0 if how == CreateMode.UNCHECKED else os.O_EXCL)
        out, handle, stx = c_void_p(), c_void_p(), lc.Statx()
        if how == CreateMode.UNCHECKED:  # O_EXCL first, to tell the caller whether it created
            flags |= os.O_EXCL
        ret = self._lib.ceph_ll_create(
            self._cm, parent, bname, stat.S_IFREG | (mode & 0o7777), flags, byref(out),
            byref(handle), byref(stx), lc.STATX_WANT, 0, perm,
        )  # fmt: skip
        if ret == -errno.EEXIST and how == CreateMode.EXCLUSIVE:
            assert verifier is not None
            fh, old = self._lookup(perm, parent, bname)
            times = (old.stx_atime.ns(), old.stx_mtime.ns())
            if not stat.S_ISREG(old.stx_mode) or times != verifier_times(verifier):
                raise OSError(errno.EEXIST, "exists (exclusive create, other verifier)")
            f = self._open_inode(self._server_perm(), fh, self._inode(fh), os.O_RDWR)
            return fh, f, True
        if ret == -errno.EEXIST and how == CreateMode.UNCHECKED:
            fh, _ = self._lookup(perm, parent, bname)
            return fh, self.open(cred, fh, read, write), False
        lc.check(ret, "create")
        ino = int(stx.stx_ino)
        inode = self._keep(ino, out)
        fh = self._pack(ino)
        if how == CreateMode.EXCLUSIVE and verifier is not None:
            at, mt = verifier_times(verifier)
            self.setattr(Cred(0, 0), fh, atime=at, mtime=mt)
        f = CephOpenFile(self, fh, inode, handle)
        return fh, f, True

    @guarded
    def anonymous_read(self, cred: Cred, fh: bytes, offset: int, count: int) -> tuple[bytes, bool]:
        f = self.open(cred, fh, True, False)
        try:
            return f.read(offset, count)
        finally:
            f.close()

    @guarded
    def anonymous_write(
        self,
        cred: Cred,
        fh: bytes,
        offset: int,
        data: bytes | memoryview | bytearray,
        stable: bool = False,
    ) -> int:
        f = self.open(cred, fh, False, True)
        try:
            return f.write(offset, data, stable)
        finally:
            f.close()

    @guarded
    def create(
        self,
        cred: Cred,
        dir_fh: bytes,
        name: bytes | str,
        ftype: FileType,
        mode: int,
        linkdata: bytes | None = None,
        rdev: tuple[int, int] | None = None,
    ) -> bytes:
        if self.export.read_only:
            raise erofs()
        bname = check_name(name)
        perm = self._perm(cred)
        parent = self._inode(dir_fh)
        out, stx = c_void_p(), lc.Statx()
        want, perm_bits = lc.STATX_WANT, mode & 0o7777
        if ftype == FileType.NF4DIR:
            ret = self._lib.ceph_ll_mkdir(
                self._cm, parent, bname, perm_bits, byref(out), byref(stx), want, 0, perm
            )
        elif ftype == FileType.NF4LNK:
            if linkdata is None:
                raise OSError(errno.EINVAL, "symbolic link without data")
            ret = self._lib.ceph_ll_symlink(
                self._cm, parent, bname, linkdata, byref(out), byref(stx), want, 0, perm
            )
        elif ftype in (FileType.NF4BLK, FileType.NF4CHR, FileType.NF4SOCK, FileType.NF4FIFO):
            dev = os.makedev(*rdev) if rdev is not None else 0
            ret = self._lib.ceph_ll_mknod(
                self._cm, parent, bname, S_IFMT_OF[ftype] | perm_bits, dev, byref(out),
                byref(stx), want, 0, perm,
            )  # fmt: skip
        else:
            raise OSError(errno.EINVAL, f"cannot CREATE a {ftype.name}")
        lc.check(ret, "create")
        ino = int(stx.stx_ino)
        self._keep(ino, out)
        return self._pack(ino)

    @guarded
    def remove(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> None:
        if self.export.read_only:
            raise erofs()
        bname = check_name(name)
        perm = self._perm(cred)
        parent = self._inode(dir_fh)
        _, stx = self._lookup(perm, parent, bname)
        if stat.S_ISDIR(stx.stx_mode):
            lc.check(self._lib.ceph_ll_rmdir(self._cm, parent, bname, perm), "rmdir")
        else:
            lc.check(self._lib.ceph_ll_unlink(self._cm, parent, bname, perm), "unlink")
        if int(stx.stx_nlink) <= 1:
            self._forget(int(stx.stx_ino))

    @guarded
    def rename(
        self,
        cred: Cred,
        src_dir_fh: bytes,
        src_name: bytes | str,
        dst_dir_fh: bytes,
        dst_name: bytes | str,
    ) -> None:
        if self.export.read_only:
            raise erofs()
        src, dst = check_name(src_name), check_name(dst_name)
        perm = self._perm(cred)
        lc.check(
            self._lib.ceph_ll_rename(
                self._cm, self._inode(src_dir_fh), src, self._inode(dst_dir_fh), dst, perm
            ),
            "rename",
        )

    @guarded
    def link(self, cred: Cred, fh: bytes, dir_fh: bytes, name: bytes | str) -> None:
        if self.export.read_only:
            raise erofs()
        bname = check_name(name)
        if stat.S_ISDIR(self._stx(fh).stx_mode):
            raise OSError(errno.EISDIR, "cannot link a directory")
        lc.check(
            self._lib.ceph_ll_link(
                self._cm, self._inode(fh), self._inode(dir_fh), bname, self._perm(cred)
            ),
            "link",
        )

    @guarded
    def readlink(self, cred: Cred, fh: bytes) -> bytes:
        stx = self._stx(fh)
        if not stat.S_ISLNK(stx.stx_mode):
            raise OSError(errno.EINVAL, "not a symbolic link")
        buf = create_string_buffer(max(1, int(stx.stx_size)) + 1)
        n = lc.check(
            self._lib.ceph_ll_readlink(self._cm, self._inode(fh), buf, len(buf), self._perm(cred)),
            "readlink",
        )
        return buf.raw[:n]

    @guarded
    def readdir(
        self,
        cred: Cred,
        dir_fh: bytes,
        cookie: int = 0,
        verifier: bytes = b"",
        max_entries: int = 1024,
    ) -> DirListing:
        if cookie in (1, 2):
            raise BadCookie("reserved cookie")
        stx_dir = self._stx(dir_fh)
        if not stat.S_ISDIR(stx_dir.stx_mode):
            raise OSError(errno.ENOTDIR, "not a directory")
        perm = self._perm(cred)
        dirp = c_void_p()
        lc.check(
            self._lib.ceph_ll_opendir(self._cm, self._inode(dir_fh), byref(dirp), perm), "opendir"
        )
        found: dict[bytes, lc.Statx] = {}
        try:
            while True:
                de, stx = lc.Dirent(), lc.Statx()
                ret = self._lib.ceph_readdirplus_r(
                    self._cm,
                    dirp,
                    byref(de),
                    byref(stx),
                    lc.STATX_WANT,
                    lc.AT_SYMLINK_NOFOLLOW,
                    None,
                )
                if lc.check(ret, "readdir") == 0:
                    break
                name = de.d_name
                if name not in (b".", b".."):
                    found[bytes(name)] = stx
        finally:
            self._lib.ceph_ll_releasedir(self._cm, dirp)
        cookies, names = self._cookies.sort(list(found))
        i = self._cookies.start(cookies, cookie)
        entries: list[DirEntry] = []
        while i < len(names) and len(entries) < max_entries:
            stx = found[names[i]]
            ino = int(stx.stx_ino)
            entries.append(DirEntry(cookies[i], names[i], self._pack(ino), self._attrs(stx)))
            i += 1
        return DirListing(entries, self._cookies.verifier, i >= len(names))

    @guarded
    def statfs(self, fh: bytes) -> FsStats:
        sv = lc.StatVfs()
        lc.check(self._lib.ceph_ll_statfs(self._cm, self._inode(fh), byref(sv)), "statfs")
        frsize = int(sv.f_frsize) or int(sv.f_bsize)
        return FsStats(
            files_total=int(sv.f_files),
            files_free=int(sv.f_ffree),
            files_avail=int(sv.f_favail),
            bytes_total=int(sv.f_blocks) * frsize,
            bytes_free=int(sv.f_bfree) * frsize,
            bytes_avail=int(sv.f_bavail) * frsize,
            max_name=int(sv.f_namemax) or 255,
            max_link=0xFFFFFFFF,
        )

    # ------------------------------------------------------------------ locks in CephFS
    def _flock(self, start: int, end: int, ltype: int) -> lc.Flock | None:
        """The POSIX lock for [start, end); None for ranges Ceph cannot express (past 2**63)."""
        if start > _OFF_MAX:
            return None
        length = 0 if end > _OFF_MAX else end - start  # 0: to the end of the file
        return lc.Flock(ltype, os.SEEK_SET, start, length, 0)

    def _held(self, fl: lc.Flock) -> tuple[int, int, bool] | None:
        if fl.l_type == fcntl.F_UNLCK:
            return None
        start = int(fl.l_start)
        end = _TO_EOF if fl.l_len == 0 else start + int(fl.l_len)
        return start, end, fl.l_type == fcntl.F_WRLCK

    @guarded
    def lock(
        self, of: OpenFile, owner: int, start: int, end: int, write: bool
    ) -> tuple[int, int, bool] | None:
        assert isinstance(of, CephOpenFile)
        fl = self._flock(start, end, fcntl.F_WRLCK if write else fcntl.F_RDLCK)
        if fl is None:
            return None
        ret = self._lib.ceph_ll_setlk(self._cm, of._fh(), byref(fl), owner, 0)
        if ret in (-errno.EAGAIN, -errno.EACCES):
            probe = self._flock(start, end, fcntl.F_WRLCK if write else fcntl.F_RDLCK)
            assert probe is not None
            lc.check(self._lib.ceph_ll_getlk(self._cm, of._fh(), byref(probe), owner), "getlk")
            return self._held(probe) or (start, end, True)
        lc.check(ret, "setlk")
        return None

    @guarded
    def unlock(self, of: OpenFile, owner: int, start: int, end: int) -> None:
        assert isinstance(of, CephOpenFile)
        fl = self._flock(start, end, fcntl.F_UNLCK)
        if fl is not None and of._handle is not None:
            lc.check(self._lib.ceph_ll_setlk(self._cm, of._handle, byref(fl), owner, 0), "unlock")

    @guarded
    def test_lock(
        self, fh: bytes, owner: int, start: int, end: int, write: bool
    ) -> tuple[int, int, bool] | None:
        fl = self._flock(start, end, fcntl.F_WRLCK if write else fcntl.F_RDLCK)
        if fl is None:
            return None
        of = self._open_inode(self._server_perm(), fh, self._inode(fh), os.O_RDONLY)
        try:
            lc.check(self._lib.ceph_ll_getlk(self._cm, of._fh(), byref(fl), owner), "getlk")
        finally:
            of.close()
        return self._held(fl)

    def shared_grace(self, node: str) -> ClusterGrace | None:
        if self._grace_pool is None:
            return None
        if self._grace is None:
            self._grace = ClusterGrace(
                self._conf, self._client_id, self._grace_pool, self._mount.fscid, node
            )
        return self._grace

    def state_key(self) -> str:
        """Client records are kept per cluster, file system and exported path."""
        try:
            cluster = self._mount.conf_get("fsid")
        except OSError:
            cluster = ""
        ident = f"ceph\0{cluster}\0{self._mount.fscid}\0{self._ceph_path}"
        return hashlib.sha256(ident.encode()).hexdigest()[:32]

    def release_identity(self) -> None:
        """Nothing to do: identities travel with each call (``UserPerm``)."""

    def close(self) -> None:
        if self._grace is not None:
            self._grace.close()
            self._grace = None
        with self._lock:
            inodes = list(self._inodes.values())
            self._inodes.clear()
            perms = list(self._perms.values())
            self._perms.clear()
        for inode in [*inodes, self._root]:
            self._lib.ceph_ll_put(self._cm, inode)
        self._mount.close()
        self._guard.close()
        for p in perms:
            self._lib.ceph_userperm_destroy(p)
