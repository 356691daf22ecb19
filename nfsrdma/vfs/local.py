"""The local-directory backend: serves one directory of the host's file system.

Handle resolution, the descriptor cache and mount confinement live in ``resolver.py``.

Identity
--------
See ``identity.py``. Handle resolution runs with the server's identity; each operation runs with
the caller's (squashed) identity, so the kernel checks permissions, ACLs included. Three knfsd
exceptions are kept: the owner may truncate its file whatever the mode (NFSD_MAY_OWNER_OVERRIDE);
the retry of an exclusive create gets a writable open, as the first attempt did; a regular file
the caller may execute may be opened for reading (NFSD_MAY_READ_IF_EXEC: clients READ to exec).
A file created by OPEN is returned writable whatever its mode, because open(2) with O_CREAT does.

Removal and rename
------------------
REMOVE of the last name of a file that is open (a ``LocalOpenFile`` of it is not closed yet), or
RENAME over it, leaves the file usable through its handle until its last open file is closed, as
POSIX keeps an unlinked file for its openers (see "Open files removed through this server" in
``resolver.py``). RENAME of a name onto itself, or onto another hard link of the same file, does
nothing (rename(2) does nothing either): the change attributes of the directories do not move.

Other file systems mounted under the export are not crossed (see ``resolver.py``).
Only regular files are ever opened for I/O (opening a FIFO or a device would block or act on the
server); symlinks are objects of their own and are never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable
from typing import Final, TypeVar

from nfsrdma.vfs import attrs, confine, syscalls
from nfsrdma.vfs.base import (
    ACCESS4_DELETE,
    ACCESS4_EXECUTE,
    ACCESS4_EXTEND,
    ACCESS4_LOOKUP,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    NFS4_VERIFIER_SIZE,
    SET_TO_SERVER_TIME,
    XATTR_NAME_MAX,
    XATTR_SIZE_MAX,
    Attributes,
    BadCookie,
    CreateMode,
    Cred,
    DirEntry,
    DirListing,
    Export,
    FileType,
    FsStats,
    StaleHandle,
    TimeSet,
    Vfs,
    XattrHow,
)
from nfsrdma.vfs.changes import ChangeCounter
from nfsrdma.vfs.confine import check_name, open_component, proc_path
from nfsrdma.vfs.dircookies import CookieJar
from nfsrdma.vfs.fdcache import Pin
from nfsrdma.vfs.handles import HandleCodec
from nfsrdma.vfs.identity import FsIdentity, off_protected_threads, squash
from nfsrdma.vfs.openfile import LocalOpenFile
from nfsrdma.vfs.resolver import RESOURCE_ERRNOS, HandleMode, Resolver
from nfsrdma.vfs.secret import export_secret

_MODIFYING: Final = ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE
# ACCESS's bits and the access(2) modes that answer them, for a directory and for the others
_DIRECTORY_ACCESS: Final = (
    (ACCESS4_READ, os.R_OK),
    (ACCESS4_LOOKUP, os.X_OK),
    (ACCESS4_MODIFY, os.W_OK | os.X_OK),
    (ACCESS4_EXTEND, os.W_OK | os.X_OK),
    (ACCESS4_DELETE, os.W_OK | os.X_OK),
)
_OTHER_ACCESS: Final = (
    (ACCESS4_READ, os.R_OK),
    (ACCESS4_MODIFY, os.W_OK),
    (ACCESS4_EXTEND, os.W_OK),
    (ACCESS4_EXECUTE, os.X_OK),
)
_AccessPlan = tuple[frozenset[int], tuple[tuple[int, int], ...]]
# (directory?, mask) → the modes to ask and the (bit, mode) pairs asked: at most 2 x 64 plans
_ACCESS_PLANS: dict[tuple[bool, int], _AccessPlan] = {}


def _access_plan(directory: bool, mask: int) -> _AccessPlan:
    """The access(2) modes that answer ACCESS's ``mask`` and which bit each answers."""
    plan = _ACCESS_PLANS.get((directory, mask))
    if plan is None:
        pairs = tuple(
            (bit, want)
            for bit, want in (_DIRECTORY_ACCESS if directory else _OTHER_ACCESS)
            if mask & bit
        )
        plan = (frozenset(want for _, want in pairs), pairs)
        if len(_ACCESS_PLANS) < 256:
            _ACCESS_PLANS[(directory, mask)] = plan
    return plan


def _process_umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


T = TypeVar("T")


class LocalVfs(Vfs):
    """Serves ``export.root``. See the module docstring and ``base.py`` for the contract."""

    def __init__(
        self,
        export: Export,
        *,
        handle_mode: HandleMode = "auto",
        clone_mount: bool = True,
        identity: FsIdentity | None = None,
        fd_cache_size: int | None = None,
        location_cache_size: int = 1 << 18,
        watch_moves: bool = True,
    ) -> None:
        """``handle_mode``/``clone_mount`` force the unprivileged fallbacks (for tests);
        ``fd_cache_size`` bounds the O_PATH descriptor cache (default: a quarter of
        RLIMIT_NOFILE, at most 4096); ``watch_moves=False`` checks every descriptor in every
        COMPOUND (no move watch: vfs/resolver.py)."""
        self.export = export
        self.write_verifier = os.urandom(NFS4_VERIFIER_SIZE)
        self._ident = identity if identity is not None else FsIdentity()
        self._ident.apply_server()
        self.root_path = os.path.realpath(export.root)
        st = os.stat(self.root_path)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "export root is not a directory", export.root)
        secret = export_secret(self.root_path, st, export.state_dir)
        self._cookies = CookieJar(secret)
        self._changes = ChangeCounter()
        self._open_lock = threading.Lock()
        self._open_counts: dict[bytes, int] = {}  # fh -> LocalOpenFiles not closed yet
        self._umask = _process_umask()
        self._xattr_fs: dict[int, bool] = {}  # f_fsid -> keeps user extended attributes
        self._res = Resolver(
            self.root_path,
            HandleCodec(secret),
            self._ident,
            handle_mode=handle_mode,
            clone_mount=clone_mount,
            fd_cache_size=fd_cache_size,
            location_cache_size=location_cache_size,
            watch_moves=watch_moves,
        )
        self.kernel_handles = self._res.kernel_handles
        self.cloned = self._res.cloned

    # ----------------------------------------------------------------- plumbing

    def root_handle(self) -> bytes:
        return self._res.root_fh

    def release_identity(self) -> None:
        self._ident.apply_server()

    def close(self) -> None:
        self._res.close()

    def lease_descriptor(self, fh: bytes) -> int | None:
        """A read-only descriptor of the regular file ``fh``, opened with the server's own
        identity, for a kernel lease (``vfs/leases.py``); None for other objects."""
        self._ident.apply_server()
        pin = self._res.pin(fh)
        try:
            st = self._res.stat(pin)
            if not stat.S_ISREG(st.st_mode):
                return None
            return os.open(proc_path(pin.fd), os.O_RDONLY | os.O_CLOEXEC)
        finally:
            pin.release()

    def _cred(self, cred: Cred) -> Cred:
        return squash(self.export, cred)

    def _check_dir_alive(self, pin: Pin) -> None:
        """After ENOENT inside a directory: a removed directory means a stale handle."""
        self._res.stat(pin)

    def _after_unlink(
        self, fd: int, parent_fh: bytes, name: bytes, fh: bytes | None = None, gone: int = -1
    ) -> bytes | None:
        """Bookkeeping for an object that just lost the name ``name`` (``fd`` still open; its
        handle ``fh`` if known; ``gone``: its fileid if it had no other name, so no fstat is
        needed to know it has none left). Its handle, None if it could not be told."""
        if fh is not None and gone >= 0:
            nlink, fileid = 0, gone
        else:
            try:
                if fh is None:
                    fh, st = self._res.make_handle(fd)
                else:
                    st = os.fstat(fd)
            except OSError:
                return None
            nlink, fileid = st.st_nlink, st.st_ino
        if nlink == 0:
            with self._open_lock:
                still_open = fh in self._open_counts
                if still_open:  # under the lock: the last close cannot slip in between
                    self._res.keep_orphan(fh, fd, fileid)
            if not still_open:
                self._res.forget(fh)
            return fh
        self._changes.bump(fileid)
        self._res.unname(fh, parent_fh, name)
        return fh

    def _open_file(
        self, fd: int, fh: bytes, fileid: int, *, readable: bool, writable: bool
    ) -> LocalOpenFile:
        """A LocalOpenFile owning ``fd``, counted among the open files of ``fh``."""
        with self._open_lock:
            self._open_counts[fh] = self._open_counts.get(fh, 0) + 1
        return LocalOpenFile(
            fd,
            fh,
            fileid,
            readable=readable,
            writable=writable,
            changes=self._changes,
            on_close=self._file_closed,
        )

    def _file_closed(self, fh: bytes) -> None:
        with self._open_lock:
            left = self._open_counts.get(fh, 0) - 1
            if left > 0:
                self._open_counts[fh] = left
                return
            self._open_counts.pop(fh, None)
            if self._res.has_orphans():  # (only kept under this lock: see _after_unlink)
                self._res.drop_orphan(fh)

    def _fix_mode(self, fd: int, st: os.stat_result, mode: int) -> bool:
        """Give a new object the bits the process umask stripped (knfsd creates with umask 0);
        whether its mode had to be changed."""
        extra = mode & 0o7777 & self._umask
        have = stat.S_IMODE(st.st_mode)
        if extra and have & extra != extra:
            os.chmod(proc_path(fd), have | extra)
            return True
        return False

    def _access_ok(self, fd: int, st: os.stat_result, cred: Cred, mode: int) -> bool:
        try:
            return syscalls.faccessat_empty(fd, mode)
        except OSError as e:
            if e.errno != errno.ENOSYS:
                raise
        return _posix_access(st, cred if self._ident.enabled else self._ident.server, mode)

    def _access_results(
        self, fd: int, st: os.stat_result, cred: Cred, wants: frozenset[int]
    ) -> dict[int, bool]:
        """Whether the caller has each access mode (R_OK/W_OK/X_OK combinations) in ``wants``,
        in as few checks as the answers allow: execute of a regular file with no execute bit is
        refused without asking (the kernel refuses it to everyone: no capability overrides it,
        no ACL entry can grant it past the mask the group bits show); the others are asked
        together first, and one by one only if not all are granted."""
        results: dict[int, bool] = {}
        if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o111:
            for want in wants:
                if want & os.X_OK:
                    results[want] = False
        ask = [want for want in wants if want not in results]
        if len(ask) > 1:
            union = 0
            for want in ask:
                union |= want
            if self._access_ok(fd, st, cred, union):
                return dict.fromkeys(ask, True) | results
        for want in ask:
            results[want] = self._access_ok(fd, st, cred, want)
        return results

    # ----------------------------------------------------------------- queries

    def getattr(self, fh: bytes) -> Attributes:
        memo = self._res.stat_memo  # (read before the pin, which drops it)
        pin = self._res.pin(fh)
        try:
            changes = self._changes
            count = changes.get(pin.fileid)
            # ACCESS, LOOKUP or a create just before, in this COMPOUND, made the fstat
            st = None if memo is None else self._res.kept_stat(memo, pin, changes.generation)
            if st is None:
                st = self._res.stat(pin)
            return attrs.from_stat(st, count)
        finally:
            pin.release()

    def change(self, fh: bytes) -> int:
        memo = self._res.stat_memo  # (a read-only query: what was kept stays kept)
        pin = self._res.pin(fh)
        self._res.stat_memo = memo
        try:
            return self._change_of(pin)
        finally:
            pin.release()

    def _change_of(self, pin: Pin) -> int:
        count = self._changes.get(pin.fileid)  # (before the fstat: see ChangeCounter)
        return ChangeCounter.value(self._res.stat(pin).st_ctime_ns, count)

    def file_type(self, fh: bytes) -> FileType:
        memo = self._res.stat_memo  # (a read-only query: what was kept stays kept)
        pin = self._res.pin(fh)  # (inside the export, as getattr)
        self._res.stat_memo = memo
        try:
            mode = self._res.known_type(fh)
            if mode is None:
                mode = self._res.stat(pin).st_mode & 0o170000
            return attrs.FTYPE[mode]
        finally:
            pin.release()

    def check(self, fh: bytes) -> None:
        # No fstat for the link count: a pinned descriptor is the root, an open file removed
        # through this server (served until closed), or was found linked inside the export
        # (resolver.py: by name, or by a kernel path without " (deleted)" or confirmed so).
        self._res.check(fh)

    @off_protected_threads
    def lookup(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> bytes:
        bname = check_name(name)
        return self._lookup(cred, self._res.pin(dir_fh), bname)[0]

    @off_protected_threads
    def open_lookup(self, cred: Cred, dir_fh: bytes, name: bytes) -> tuple[int, bytes, FileType]:
        # One resolution of the directory for its change attribute, its type and the lookup
        # (the base class's four calls pin it twice and the object twice).
        bname = check_name(name)
        pin = self._res.pin(dir_fh)
        try:
            change = self._directory_change(pin)
        except BaseException:
            pin.release()
            raise
        fh, fst = self._lookup(cred, pin, bname)
        return change, fh, attrs.FTYPE[fst.st_mode & 0o170000]

    def _directory_change(self, pin: Pin) -> int:
        """The change attribute of ``pin``'s object; NotADirectoryError unless a directory."""
        count = self._changes.get(pin.fileid)  # (before the fstat: see ChangeCounter)
        st = self._res.stat(pin)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        return ChangeCounter.value(st.st_ctime_ns, count)

    def _lookup(self, cred: Cred, pin: Pin, bname: bytes) -> tuple[bytes, os.stat_result]:
        """LOOKUP of ``bname`` in the directory ``pin`` (released here): the handle, and the
        stat of its object made on the way (kept for a GETATTR right after)."""
        try:
            self._ident.apply(self._cred(cred))
            generation = self._changes.generation
            known = self._res.object_at_name(pin, bname)
            if known is not None:  # the name's object is cached: no open, no handle to make
                known[0].release()
                self._res.found_inside(known[0].key)
                # the name's fstatat is the object's: for a GETATTR right after
                self._res.keep_stat(known[0].key, generation, known[1])
                return known[0].key, known[1]
            try:
                fd = open_component(pin.fd, bname)
            except FileNotFoundError:
                self._check_dir_alive(pin)
                raise
            try:
                fh, st = self._res.make_handle(fd)
            except BaseException:
                os.close(fd)
                raise
        finally:
            pin.release()
        self._res.remember(fh, pin.key, bname)
        self._res.fds.put(fh, fd, st.st_ino)
        self._res.found_inside(fh)
        self._res.keep_stat(fh, generation, st)  # (make_handle's fstat of it)
        return fh, st

    @off_protected_threads
    def lookupp(self, cred: Cred, fh: bytes) -> bytes:
        pin = self._res.pin(fh)
        try:
            st = self._res.stat(pin)
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, "not a directory")
            if pin.key == self._res.root_fh:
                raise OSError(errno.ENOENT, "the export root has no parent")
            self._ident.apply(self._cred(cred))
            try:
                fd = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pin.fd)
            except FileNotFoundError as e:
                # Removed, or moved out of the (cloned) export mount: the kernel refuses "..".
                self._res.forget(pin.key)
                raise StaleHandle("directory is no longer inside the export") from e
            try:
                self._ident.apply_server()
                if not confine.within_root(fd, self._res.root_key):
                    self._res.forget(pin.key)
                    raise StaleHandle("directory is no longer inside the export")
                pfh, pst = self._res.make_handle(fd)
            except BaseException:
                os.close(fd)
                raise
        finally:
            pin.release()
        self._res.fds.put(pfh, fd, pst.st_ino)
        return pfh

    @off_protected_threads
    def access(self, cred: Cred, fh: bytes, mask: int) -> int:
        memo = self._res.stat_memo  # (read before the pin, which drops it)
        pin = self._res.pin(fh)
        try:
            generation = self._changes.generation
            # OPEN's create just before, in this COMPOUND, made the fstat: no second one
            st = self._res.kept_stat(memo, pin, generation) or self._res.stat(pin)
            ecred = self._cred(cred)
            self._ident.apply(ecred)
            self._res.keep_stat(pin.key, generation, st)  # for a GETATTR right after
            if self.export.read_only:
                mask &= ~_MODIFYING
            wants, pairs = _access_plan(stat.S_ISDIR(st.st_mode), mask)
            results = self._access_results(pin.fd, st, ecred, wants)
            allowed = 0
            for bit, want in pairs:
                if results[want]:
                    allowed |= bit
            return allowed
        finally:
            pin.release()

    @off_protected_threads
    def readlink(self, cred: Cred, fh: bytes) -> bytes:
        pin = self._res.pin(fh)
        try:
            st = self._res.stat(pin)
            if not stat.S_ISLNK(st.st_mode):
                raise OSError(errno.EINVAL, "not a symbolic link")
            self._ident.apply(self._cred(cred))
            return os.readlink(b"", dir_fd=pin.fd)
        finally:
            pin.release()

    def statfs(self, fh: bytes) -> FsStats:
        pin = self._res.pin(fh)
        try:
            sv = os.fstatvfs(pin.fd)
            try:
                link_max = os.fpathconf(pin.fd, "PC_LINK_MAX")
            except OSError:
                link_max = 1
        finally:
            pin.release()
        return FsStats(
            files_total=sv.f_files,
            files_free=sv.f_ffree,
            files_avail=sv.f_favail,
            bytes_total=sv.f_blocks * sv.f_frsize,
            bytes_free=sv.f_bfree * sv.f_frsize,
            bytes_avail=sv.f_bavail * sv.f_frsize,
            max_name=sv.f_namemax,
            max_link=link_max,
            user_xattrs=self._user_xattrs(fh, sv.f_fsid),
        )

    def _user_xattrs(self, fh: bytes, fsid: int) -> bool:
        """Whether the file system of ``fh`` keeps user extended attributes (asked once per
        file system: reading a name nobody sets is ENODATA there, ENOTSUP elsewhere)."""
        known = self._xattr_fs.get(fsid)
        if known is not None:
            return known
        pin = self._res.pin(fh)
        try:
            self._ident.apply_server()
            os.getxattr(proc_path(pin.fd), "user.nfsrdma.probe")
            known = True
        except OSError as e:
            known = e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP)
        finally:
            pin.release()
        self._xattr_fs[fsid] = known
        return known

    # ----------------------------------------------------------------- extended attributes

    def _xattr(self, cred: Cred, fh: bytes, fn: Callable[[str], T], modifies: bool = False) -> T:
        """``fn(path)`` on the object, as the caller (the file system checks permission)."""
        if modifies and self.export.read_only:
            raise attrs.erofs()
        pin = self._res.pin(fh)
        try:
            self._ident.apply(self._cred(cred))
            out = fn(proc_path(pin.fd))
            if modifies:
                self._changes.bump(pin.fileid)
            return out
        finally:
            pin.release()

    @off_protected_threads
    def getxattr(self, cred: Cred, fh: bytes, name: bytes) -> bytes:
        key = _user_xattr(name)
        return self._xattr(cred, fh, lambda path: os.getxattr(path, key))

    @off_protected_threads
    def setxattr(
        self, cred: Cred, fh: bytes, name: bytes, value: bytes, how: XattrHow = XattrHow.EITHER
    ) -> None:
        key = _user_xattr(name)
        if len(value) > XATTR_SIZE_MAX:
            raise OSError(errno.E2BIG, "extended attribute value too large")
        flags = {XattrHow.EITHER: 0, XattrHow.CREATE: os.XATTR_CREATE}.get(how, os.XATTR_REPLACE)
        self._xattr(cred, fh, lambda path: os.setxattr(path, key, value, flags), modifies=True)

    @off_protected_threads
    def listxattr(self, cred: Cred, fh: bytes) -> list[bytes]:
        names = self._xattr(cred, fh, os.listxattr)
        prefix = "user."
        return sorted(os.fsencode(n[len(prefix) :]) for n in names if n.startswith(prefix))

    @off_protected_threads
    def removexattr(self, cred: Cred, fh: bytes, name: bytes) -> None:
        key = _user_xattr(name)
        self._xattr(cred, fh, lambda path: os.removexattr(path, key), modifies=True)

    @off_protected_threads
    def readdir(
        self,
        cred: Cred,
        dir_fh: bytes,
        cookie: int = 0,
        verifier: bytes = b"",
        max_entries: int = 1024,
    ) -> DirListing:
        if cookie in (1, 2) or cookie < 0:
            raise BadCookie(f"cookie {cookie} is never handed out")
        pin = self._res.pin(dir_fh)
        try:
            count = self._changes.get(pin.fileid)
            st = self._res.stat(pin)
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, "not a directory")
            ecred = self._cred(cred)
            self._ident.apply(ecred)
            key = (st.st_ino, st.st_mtime_ns, count)
            listing = self._cookies.cached(key)
            if listing is None:
                dfd = os.open(proc_path(pin.fd), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    names = [os.fsencode(n) for n in os.listdir(dfd)]
                finally:
                    os.close(dfd)
                listing = self._cookies.sort(names)
                self._cookies.store(key, st.st_mtime_ns, listing)
            elif not self._access_ok(pin.fd, st, ecred, os.R_OK):
                raise OSError(errno.EACCES, "no read permission on the directory")
            cookies, names = listing
            entries: list[DirEntry] = []
            i = self._cookies.start(cookies, cookie)
            while i < len(names) and len(entries) < max_entries:
                entry = self._dir_entry(pin, cookies[i], names[i])
                if entry is not None:
                    entries.append(entry)
                i += 1
            return DirListing(entries, self._cookies.verifier, i >= len(names))
        finally:
            pin.release()

    def _dir_entry(self, pin: Pin, cookie: int, name: bytes) -> DirEntry | None:
        try:
            fd = open_component(pin.fd, name)
        except FileNotFoundError:
            return None  # removed since the listing
        except OSError as e:
            if e.errno in RESOURCE_ERRNOS:
                raise
            return DirEntry(cookie, name, None, None, e.errno or errno.EIO)
        try:
            st = os.fstat(fd)
            count = self._changes.get(st.st_ino)
            try:
                fh, _ = self._res.make_handle(fd, st)
            except OSError as e:
                if e.errno in RESOURCE_ERRNOS:
                    raise
                return DirEntry(cookie, name, None, None, e.errno or errno.EIO)
        finally:
            os.close(fd)
        self._res.remember(fh, pin.key, name)
        return DirEntry(cookie, name, fh, attrs.from_stat(st, count))

    # ----------------------------------------------------------------- data

    def _open_regular(
        self,
        pin_fd: int,
        fmt: int,
        st: os.stat_result | None,
        ecred: Cred,
        *,
        read: bool,
        write: bool,
        truncate: bool = False,
        owner_override: bool = False,
    ) -> int:
        """Reopen an O_PATH descriptor of a regular file (``fmt``: its S_IFMT bits) for I/O,
        permission-checked; ``st`` (None: not made yet) is only needed when refused."""
        if fmt != stat.S_IFREG:
            if fmt == stat.S_IFDIR:
                raise OSError(errno.EISDIR, "is a directory")
            if fmt == stat.S_IFLNK:
                raise OSError(errno.ELOOP, "is a symbolic link")
            raise OSError(errno.EINVAL, "not a regular file")
        flags = (os.O_RDWR if read else os.O_WRONLY) if write else os.O_RDONLY
        flags |= os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
        try:
            return self._res.reopen(pin_fd, flags)
        except PermissionError:
            if not self._ident.enabled:
                raise
            if st is None:
                st = os.fstat(pin_fd)
            is_owner = owner_override and st.st_uid == ecred.uid
            # knfsd NFSD_MAY_READ_IF_EXEC: clients must READ a file to execute it.
            read_if_exec = read and not write and self._access_ok(pin_fd, st, ecred, os.X_OK)
            if not (is_owner or read_if_exec):
                raise
        self._ident.apply_server()
        try:
            return self._res.reopen(pin_fd, flags)
        finally:
            self._ident.apply(ecred)

    @off_protected_threads
    def open(
        self, cred: Cred, fh: bytes, read: bool, write: bool, truncate: bool = False
    ) -> LocalOpenFile:
        if (write or truncate) and self.export.read_only:
            raise attrs.erofs()
        if not (read or write) or (truncate and not write):
            raise OSError(errno.EINVAL, "bad open mode")
        memo = self._res.stat_memo  # (read before the pin, which drops it)
        pin = self._res.pin(fh)
        if not truncate:  # an open that truncates nothing changes no attribute: what was
            self._res.stat_memo = memo  # kept stays kept (OPEN's lookup, for ACCESS, GETATTR)
        try:
            # The type alone decides, and an inode's never changes: known for every handle
            # made with a kernel handle, no fstat then. (No link count either: a pinned
            # descriptor is linked inside the export or an open file removed through this
            # server, as for ``check``.)
            st: os.stat_result | None = None
            fmt = self._res.known_type(pin.key)
            if fmt is None:
                st = self._res.stat(pin)
                fmt = stat.S_IFMT(st.st_mode)
            ecred = self._cred(cred)
            self._ident.apply(ecred)
            fd = self._open_regular(
                pin.fd, fmt, st, ecred, read=read, write=write, truncate=truncate
            )
        finally:
            pin.release()
        if truncate:
            self._changes.bump(pin.fileid)
        return self._open_file(fd, pin.key, pin.fileid, readable=read, writable=write)

    @off_protected_threads
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
    ) -> tuple[bytes, LocalOpenFile, bool]:
        bname = self._create_checks(name, how, verifier, read, write)
        ecred = self._cred(cred)
        pin = self._res.pin(dir_fh)
        try:
            return self._create_in(ecred, pin, bname, mode, how, verifier, read, write)
        finally:
            pin.release()

    @off_protected_threads
    def create_changed(
        self,
        cred: Cred,
        dir_fh: bytes,
        name: bytes,
        mode: int,
        how: CreateMode = CreateMode.UNCHECKED,
        verifier: bytes | None = None,
        *,
        read: bool = True,
        write: bool = True,
    ) -> tuple[int, bytes, LocalOpenFile, bool, int]:
        # One resolution of the directory for its change attribute before (and its type, from
        # the same fstat), the create and the change attribute after (the base class's four
        # calls resolve it four times).
        pin = self._res.pin(dir_fh)
        try:
            before = self._directory_change(pin)
            bname = self._create_checks(name, how, verifier, read, write)
            ecred = self._cred(cred)
            fh, of, created = self._create_in(ecred, pin, bname, mode, how, verifier, read, write)
            if not created:
                return before, fh, of, False, before
            try:
                after = self._change_of(pin)
            except BaseException:
                of.close()
                raise
            return before, fh, of, True, after
        finally:
            pin.release()

    def _create_checks(
        self, name: bytes | str, how: CreateMode, verifier: bytes | None, read: bool, write: bool
    ) -> bytes:
        """``create_file``'s checks of its arguments; the name as bytes."""
        if self.export.read_only:
            raise attrs.erofs()
        bname = check_name(name)
        if how == CreateMode.EXCLUSIVE and (
            not isinstance(verifier, bytes) or len(verifier) != NFS4_VERIFIER_SIZE
        ):
            raise OSError(errno.EINVAL, "exclusive create needs an 8-octet verifier")
        if not (read or write):
            raise OSError(errno.EINVAL, "bad open mode")
        return bname

    def _create_in(
        self,
        ecred: Cred,
        pin: Pin,
        bname: bytes,
        mode: int,
        how: CreateMode,
        verifier: bytes | None,
        read: bool,
        write: bool,
    ) -> tuple[bytes, LocalOpenFile, bool]:
        """``create_file`` of ``bname`` (checked) in the directory ``pin`` (the caller
        releases it) for the effective identity ``ecred``."""
        self._ident.apply(ecred)
        for _ in range(16):
            try:
                fd = os.open(
                    bname,
                    os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode & 0o7777,
                    dir_fd=pin.fd,
                )
            except FileExistsError:
                if how == CreateMode.GUARDED:
                    raise
                try:
                    path_fd = open_component(pin.fd, bname)
                except FileNotFoundError:
                    continue  # removed meanwhile: try to create again
                return self._open_existing(pin, bname, path_fd, ecred, how, verifier, read, write)
            except FileNotFoundError:
                self._check_dir_alive(pin)
                raise
            return self._created(pin, bname, fd, mode, how, verifier)
        raise OSError(errno.EAGAIN, "name keeps appearing and disappearing")

    def _created(
        self,
        pin: Pin,
        name: bytes,
        fd: int,
        mode: int,
        how: CreateMode,
        verifier: bytes | None,
    ) -> tuple[bytes, LocalOpenFile, bool]:
        self._changes.bump(pin.fileid)  # (the directory changed: whatever fails below)
        generation = self._changes.generation
        path_fd = -1
        try:
            # The verifier first: the fstat after it has the object's attributes as they are
            # now, for the ACCESS and GETATTR that follow in the Linux client's COMPOUND.
            if how == CreateMode.EXCLUSIVE and verifier is not None:
                os.utime(fd, ns=attrs.verifier_times(verifier))
            st = os.fstat(fd)
            fixed = self._fix_mode(fd, st, mode)
            path_fd = self._res.reopen(fd, os.O_PATH | os.O_CLOEXEC)
            # (the same object as fd: its fstat gives the inode and device make_handle needs)
            fh, st = self._res.make_handle(path_fd, st)
        except BaseException:
            os.close(fd)
            if path_fd >= 0:
                os.close(path_fd)
            raise
        self._res.remember(fh, pin.key, name)
        self._res.fds.put(fh, path_fd, st.st_ino)
        self._res.found_inside(fh)  # (made by name in a directory inside: as LOOKUP's)
        of = self._open_file(fd, fh, st.st_ino, readable=True, writable=True)
        if not fixed:  # (a chmod made the fstat's mode and ctime old)
            self._res.keep_stat(fh, generation, st)
        return fh, of, True

    def _open_existing(
        self,
        pin: Pin,
        name: bytes,
        path_fd: int,
        ecred: Cred,
        how: CreateMode,
        verifier: bytes | None,
        read: bool,
        write: bool,
    ) -> tuple[bytes, LocalOpenFile, bool]:
        try:
            fh, st = self._res.make_handle(path_fd)
            if how == CreateMode.EXCLUSIVE:
                assert verifier is not None
                times = (st.st_atime_ns, st.st_mtime_ns)
                if not stat.S_ISREG(st.st_mode) or times != attrs.verifier_times(verifier):
                    raise OSError(errno.EEXIST, "exists (exclusive create, other verifier)")
                # The retry of our own create: answer as the first attempt did.
                fd = self._open_regular(
                    path_fd,
                    stat.S_IFMT(st.st_mode),
                    st,
                    ecred,
                    read=True,
                    write=True,
                    owner_override=True,
                )
                created, read, write = True, True, True
            else:
                fd = self._open_regular(
                    path_fd, stat.S_IFMT(st.st_mode), st, ecred, read=read, write=write
                )
                created = False
        except BaseException:
            os.close(path_fd)
            raise
        self._res.remember(fh, pin.key, name)
        self._res.fds.put(fh, path_fd, st.st_ino)
        self._res.found_inside(fh)  # (opened by name in a directory inside: as LOOKUP's)
        of = self._open_file(fd, fh, st.st_ino, readable=read, writable=write)
        return fh, of, created

    @off_protected_threads
    def anonymous_read(self, cred: Cred, fh: bytes, offset: int, count: int) -> tuple[bytes, bool]:
        of = self.open(cred, fh, read=True, write=False)
        try:
            return of.read(offset, count)
        finally:
            of.close()

    @off_protected_threads
    def anonymous_write(
        self,
        cred: Cred,
        fh: bytes,
        offset: int,
        data: bytes | memoryview | bytearray,
        stable: bool = False,
    ) -> int:
        of = self.open(cred, fh, read=False, write=True)
        try:
            return of.write(offset, data, stable)
        finally:
            of.close()

    # ----------------------------------------------------------------- modifications

    @off_protected_threads
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
        if all(v is None for v in (mode, uid, gid, size, atime, mtime)):
            return self.getattr(fh)
        if self.export.read_only:
            raise attrs.erofs()
        pin = self._res.pin(fh)
        try:
            st = self._res.stat(pin)
            ecred = self._cred(cred)
            self._ident.apply(ecred)
            try:
                # Size first and times last: truncation moves mtime, chown clears set-id bits.
                if size is not None:
                    self._truncate(pin.fd, st, ecred, size)
                if uid is not None or gid is not None:
                    syscalls.fchown_empty(pin.fd, uid, gid)
                if mode is not None and not stat.S_ISLNK(st.st_mode):
                    os.chmod(proc_path(pin.fd), mode & 0o7777)
                if atime is not None or mtime is not None:
                    syscalls.utimens_empty(pin.fd, _timespec(atime), _timespec(mtime))
            finally:
                self._changes.bump(pin.fileid)
            count = self._changes.get(pin.fileid)
            return attrs.from_stat(self._res.stat(pin), count)
        finally:
            pin.release()

    def _truncate(self, fd: int, st: os.stat_result, ecred: Cred, size: int) -> None:
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "size of a non-regular file")
        try:
            os.truncate(proc_path(fd), size)
            return
        except PermissionError:
            # knfsd NFSD_MAY_OWNER_OVERRIDE: the owner may always truncate (e.g. after fchmod).
            if not (self._ident.enabled and st.st_uid == ecred.uid):
                raise
        self._ident.apply_server()
        try:
            os.truncate(proc_path(fd), size)
        finally:
            self._ident.apply(ecred)

    @off_protected_threads
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
            raise attrs.erofs()
        bname = check_name(name)
        perm = mode & 0o7777
        pin = self._res.pin(dir_fh)
        try:
            self._ident.apply(self._cred(cred))
            try:
                self._make_node(pin.fd, bname, ftype, perm, linkdata, rdev)
            except FileNotFoundError:
                self._check_dir_alive(pin)
                raise
            self._changes.bump(pin.fileid)
            fd = open_component(pin.fd, bname)
            try:
                fh, st = self._res.make_handle(fd)
                if attrs.FTYPE.get(stat.S_IFMT(st.st_mode)) != ftype:
                    raise OSError(errno.EEXIST, "replaced while being created")
                if ftype != FileType.NF4LNK:
                    self._fix_mode(fd, st, perm)
            except BaseException:
                os.close(fd)
                raise
        finally:
            pin.release()
        self._res.remember(fh, pin.key, bname)
        self._res.fds.put(fh, fd, st.st_ino)
        return fh

    @staticmethod
    def _make_node(
        dirfd: int,
        name: bytes,
        ftype: FileType,
        perm: int,
        linkdata: bytes | None,
        rdev: tuple[int, int] | None,
    ) -> None:
        if ftype == FileType.NF4DIR:
            os.mkdir(name, perm, dir_fd=dirfd)
        elif ftype == FileType.NF4LNK:
            if not isinstance(linkdata, bytes) or b"\0" in linkdata:
                raise OSError(errno.EINVAL, "symlink needs link data without NUL")
            os.symlink(linkdata, name, dir_fd=dirfd)
        elif ftype in (FileType.NF4FIFO, FileType.NF4SOCK):
            os.mknod(name, attrs.S_IFMT_OF[ftype] | perm, 0, dir_fd=dirfd)
        elif ftype in (FileType.NF4CHR, FileType.NF4BLK):
            if rdev is None:
                raise OSError(errno.EINVAL, "device needs rdev")
            os.mknod(name, attrs.S_IFMT_OF[ftype] | perm, os.makedev(*rdev), dir_fd=dirfd)
        else:
            raise OSError(errno.EINVAL, f"CREATE cannot make {ftype!r}")

    @off_protected_threads
    def remove(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> None:
        if self.export.read_only:
            raise attrs.erofs()
        bname = check_name(name)
        pin = self._res.pin(dir_fh)
        try:
            self._remove(cred, pin, bname)
        finally:
            pin.release()

    @off_protected_threads
    def remove_changed(self, cred: Cred, dir_fh: bytes, name: bytes) -> tuple[int, int]:
        # One resolution of the directory for the change attribute before, the removal and
        # the change attribute after (the base class's three calls resolve it three times).
        pin = self._res.pin(dir_fh)
        try:
            before = self._change_of(pin)
            if self.export.read_only:
                raise attrs.erofs()
            self._remove(cred, pin, check_name(name))
            return before, self._change_of(pin)
        finally:
            pin.release()

    def _remove(self, cred: Cred, pin: Pin, bname: bytes) -> None:
        """REMOVE of ``bname`` in the directory ``pin`` (the caller releases it)."""
        self._ident.apply(self._cred(cred))
        for _ in range(4):
            known = self._res.object_at_name(pin, bname)
            if known is not None:  # the name's object is cached: no open, no handle to make
                kpin, kst = known
                try:
                    token = self._unlink(pin, bname, stat.S_ISDIR(kst.st_mode))
                    if token is not None:  # (None: replaced by another type meanwhile)
                        self._changes.bump(pin.fileid)
                        # A directory has one name; a file with one link had one (a link
                        # made meanwhile: its handle is resolved again, by the kernel's)
                        one = stat.S_ISDIR(kst.st_mode) or kst.st_nlink == 1
                        gone = kst.st_ino if one else -1
                        fh = self._after_unlink(kpin.fd, pin.key, bname, kpin.key, gone)
                        self._res.removed(token, fh, True)
                        return
                finally:
                    kpin.release()
                continue
            try:
                vfd = open_component(pin.fd, bname)
            except FileNotFoundError:
                self._check_dir_alive(pin)
                raise
            try:
                token = self._unlink(pin, bname, stat.S_ISDIR(os.fstat(vfd).st_mode))
                if token is not None:  # (None: replaced by another type meanwhile)
                    self._changes.bump(pin.fileid)
                    self._res.removed(token, self._after_unlink(vfd, pin.key, bname), True)
                    return
            finally:
                os.close(vfd)
        raise OSError(errno.EAGAIN, "name keeps changing type")

    def _unlink(self, pin: Pin, name: bytes, is_dir: bool) -> int | None:
        """rmdir or unlink ``name`` in ``pin``, announced to the move watch (the caller calls
        ``Resolver.removed`` once it knows what it removed); None if the name is not of that
        type (any more)."""
        token = self._res.removing()
        try:
            if is_dir:
                os.rmdir(name, dir_fd=pin.fd)
            else:
                os.unlink(name, dir_fd=pin.fd)
        except (IsADirectoryError, NotADirectoryError):
            self._res.removed(token, None, False)
            return None
        except BaseException:
            self._res.removed(token, None, False)
            raise
        return token

    @off_protected_threads
    def rename(
        self,
        cred: Cred,
        src_dir_fh: bytes,
        src_name: bytes | str,
        dst_dir_fh: bytes,
        dst_name: bytes | str,
    ) -> None:
        if self.export.read_only:
            raise attrs.erofs()
        sname, dname = check_name(src_name), check_name(dst_name)
        spin = self._res.pin(src_dir_fh)
        try:
            dpin = self._res.pin(dst_dir_fh)
            try:
                self._ident.apply(self._cred(cred))
                self._rename(spin, sname, dpin, dname)
            finally:
                dpin.release()
        finally:
            spin.release()

    def _rename(self, spin: Pin, sname: bytes, dpin: Pin, dname: bytes) -> None:
        try:
            src_fd = open_component(spin.fd, sname)
        except FileNotFoundError:
            self._check_dir_alive(spin)
            raise
        dst_fd = -1
        try:
            with contextlib.suppress(FileNotFoundError):
                dst_fd = open_component(dpin.fd, dname)
            if dst_fd >= 0 and _same_object(os.fstat(src_fd), os.fstat(dst_fd)):
                return  # one name, or two links of one file: rename(2) would do nothing
            os.rename(sname, dname, src_dir_fd=spin.fd, dst_dir_fd=dpin.fd)
            self._changes.bump(spin.fileid)
            self._changes.bump(dpin.fileid)
            src_ino = os.fstat(src_fd).st_ino
            with contextlib.suppress(OSError):
                fh, _ = self._res.make_handle(src_fd)
                self._res.remember(fh, dpin.key, dname)
            self._changes.bump(src_ino)
            if dst_fd >= 0 and os.fstat(dst_fd).st_ino != src_ino:
                self._after_unlink(dst_fd, dpin.key, dname)
        finally:
            os.close(src_fd)
            if dst_fd >= 0:
                os.close(dst_fd)

    @off_protected_threads
    def link(self, cred: Cred, fh: bytes, dir_fh: bytes, name: bytes | str) -> None:
        if self.export.read_only:
            raise attrs.erofs()
        bname = check_name(name)
        opin = self._res.pin(fh)
        try:
            st = self._res.stat(opin)
            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, "cannot link a directory")
            dpin = self._res.pin(dir_fh)
            try:
                self._ident.apply(self._cred(cred))
                os.link(proc_path(opin.fd), bname, dst_dir_fd=dpin.fd, follow_symlinks=True)
                self._changes.bump(dpin.fileid)
                self._changes.bump(opin.fileid)
            finally:
                dpin.release()
        finally:
            opin.release()
        self._res.remember(opin.key, dpin.key, bname, replace=False)


def _user_xattr(name: bytes) -> bytes:
    """A wire name (RFC 8276: no namespace prefix) as the ``user.`` attribute it stands for."""
    if not name or b"\0" in name:
        raise OSError(errno.EINVAL, "bad extended attribute name")
    if len(name) > XATTR_NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, "extended attribute name too long")
    return b"user." + name


def _same_object(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _timespec(t: TimeSet | None) -> syscalls.TimeSpec:
    if t is None:
        return None
    if t is SET_TO_SERVER_TIME:
        return "now"
    assert isinstance(t, int)
    return t


def _posix_access(st: os.stat_result, cred: Cred, want: int) -> bool:
    """Mode-bit permission check, for kernels without faccessat2 (no ACLs, no capabilities
    except root's read/write override)."""
    mode = st.st_mode
    if cred.uid == 0:
        if want & os.X_OK:
            return bool(mode & 0o111) or stat.S_ISDIR(mode)
        return True
    if st.st_uid == cred.uid:
        bits = (mode >> 6) & 7
    elif st.st_gid == cred.gid or st.st_gid in cred.gids:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want
