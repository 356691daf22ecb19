"""The VFS interface: the only layer of nfsrdma that touches the file system.

The NFS operation layer (``nfsrdma.nfs4``) calls a :class:`Vfs`; it never calls ``os.*`` itself.
Path confinement, file-handle validation and permission checks live behind this interface, once.
Everything here uses plain Python types; nothing imports the XDR or RPC layers.

Conventions
-----------
* **File handles** are opaque ``bytes`` of at most :data:`NFS4_FHSIZE` (128) octets. A backend
  authenticates them: a forged, truncated or foreign handle raises :class:`BadHandle`; a handle of
  an object that no longer exists (or is no longer reachable inside the export) raises
  :class:`StaleHandle`. A handle of another type (``bytearray``, ``memoryview``, ``str``) is the
  caller's error (the local VFS raises ``TypeError``); the XDR decoder makes ``bytes`` of every
  opaque.
* **Names** are single path components, ``bytes`` (a ``str`` is accepted and encoded with
  :func:`os.fsencode`). ``b""``, ``b"."``, ``b".."`` and names containing ``b"/"`` or NUL raise
  ``OSError(EINVAL)``; names longer than 255 octets raise ``OSError(ENAMETOOLONG)``.
* **Errors** are ``OSError`` with the errno the NFS layer maps to an nfsstat4 (``EACCES`` →
  NFS4ERR_ACCESS, ``EROFS`` → NFS4ERR_ROFS, ``ENOTEMPTY`` → NFS4ERR_NOTEMPTY, ...), plus
  :class:`BadHandle`, :class:`StaleHandle` and :class:`BadCookie`, which are *not* ``OSError``
  subclasses (catch them first).
* **Identity.** Every identity-dependent call takes a :class:`Cred` (the AUTH_SYS credential as
  sent). The backend applies the export's squashing and lets the file system check permissions
  with that identity (see ``identity.py``). Calls that need no permission (GETATTR, STATFS) take
  no ``cred``.
* **Threads.** Every method is synchronous and thread-safe. The NFS layer calls metadata
  operations directly from the event loop and runs large READ/WRITE/COMMIT in a thread pool.
  Identity switching is per *thread* and cached; a thread that has called the VFS keeps the last
  caller's file-system identity until its next VFS call. Code that opens files itself in such a
  thread should call :meth:`Vfs.release_identity` first.
* **Read-only exports** refuse every modification with ``OSError(EROFS)``.

Operation summary (RFC 8881 operation in brackets)::

    root_handle()                                   -> fh                  [PUTROOTFH]
    lookup(cred, dir_fh, name)                      -> fh                  [LOOKUP]
    lookupp(cred, fh)                               -> fh  (ENOENT at root)[LOOKUPP]
    getattr(fh)                                     -> Attributes          [GETATTR]
    setattr(cred, fh, mode=, uid=, gid=, size=, atime=, mtime=) -> Attributes [SETATTR]
    access(cred, fh, mask)                          -> allowed mask        [ACCESS]
    open(cred, fh, read, write, truncate)           -> OpenFile            [OPEN, no create]
    create_file(cred, dir_fh, name, mode, how, verifier) -> (fh, OpenFile, created) [OPEN create]
    anonymous_read / anonymous_write                (special stateids)     [READ, WRITE]
    create(cred, dir_fh, name, type, mode, linkdata=, rdev=) -> fh         [CREATE]
    remove(cred, dir_fh, name)                                             [REMOVE]
    rename(cred, src_dir, src_name, dst_dir, dst_name)                     [RENAME]
    link(cred, fh, dir_fh, name)                                           [LINK]
    readlink(cred, fh)                              -> bytes               [READLINK]
    readdir(cred, dir_fh, cookie, verifier, max_entries) -> DirListing     [READDIR]
    statfs(fh)                                      -> FsStats             [GETATTR space_*/files_*]
    getxattr(cred, fh, name)                        -> bytes               [GETXATTR]
    setxattr(cred, fh, name, value, how)                                   [SETXATTR]
    listxattr(cred, fh)                             -> [name, ...]         [LISTXATTRS]
    removexattr(cred, fh, name)                                            [REMOVEXATTR]
    OpenFile: seek, allocate, deallocate, read_segments, copy_to, clone_to [NFSv4.2, RFC 7862]
    write_verifier                                  8 octets, random per server instance

Exclusive create
----------------
``CreateMode.EXCLUSIVE`` covers EXCLUSIVE4 and EXCLUSIVE4_1 (RFC 8881 §18.16.3). The 8-octet
verifier is stored in the new file's atime and mtime; a retried create with the same verifier
succeeds (``created`` is ``True`` again, as knfsd does) and a different verifier gets ``EEXIST``.
Consequently the NFS layer must not list ``time_access_set``/``time_modify_set`` in
``suppattr_exclcreat``. A file created by the caller is always returned writable, whatever its
mode (§18.16: the owner may write through the open that created it).

Change attribute
----------------
``Attributes.change`` is ``ctime_ns`` plus a per-file counter the backend bumps after every
modification it makes itself. ctime alone has jiffy granularity on tmpfs and older ext4, so two
writes in the same tick would otherwise look like one. The value never decreases while the
server runs. The counters live in memory (a bounded table): after a restart, or when an entry is
dropped, the value falls back to ctime. So if a file was modified twice within one timestamp tick
just before a restart, a client may see again the value it saw between those two modifications.

READDIR cookies
---------------
A cookie is a keyed 63-bit hash of the entry name (key derived from the export secret), moved
past the reserved values 0, 1 and 2, and a directory is listed in cookie order. A cookie names a
position, not an index, so it stays valid while the directory changes and across server
restarts: entries created or removed elsewhere in the directory shift nothing. Two names in one
directory share a cookie with probability about n²/2⁶⁴. The cookie verifier is a constant of the
export and is not checked (cookies never expire); cookies 1 and 2 raise :class:`BadCookie`.
"""

from __future__ import annotations

import abc
import enum
import errno
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

NFS4_FHSIZE: Final = 128
NAME_MAX: Final = 255
NFS4_VERIFIER_SIZE: Final = 8

# ACCESS4 bits (RFC 8881 §18.1).
ACCESS4_READ: Final = 0x01
ACCESS4_LOOKUP: Final = 0x02
ACCESS4_MODIFY: Final = 0x04
ACCESS4_EXTEND: Final = 0x08
ACCESS4_DELETE: Final = 0x10
ACCESS4_EXECUTE: Final = 0x20
ACCESS4_ALL: Final = 0x3F


class HandleError(Exception):
    """A file handle the backend cannot use (base class; not an ``OSError``)."""


class BadHandle(HandleError):
    """Forged, truncated, corrupted or foreign handle (NFS4ERR_BADHANDLE)."""


class StaleHandle(HandleError):
    """The handle was valid but its object is gone or outside the export (NFS4ERR_STALE)."""


class WrongSecurity(Exception):
    """The caller's security flavour is not one the export allows (NFS4ERR_WRONGSEC)."""


class BadCookie(Exception):
    """A READDIR cookie the server never hands out (1 or 2) (NFS4ERR_BAD_COOKIE)."""


class FileType(enum.IntEnum):
    """nfs_ftype4 values (RFC 8881 §3.3.11)."""

    NF4REG = 1
    NF4DIR = 2
    NF4BLK = 3
    NF4CHR = 4
    NF4LNK = 5
    NF4SOCK = 6
    NF4FIFO = 7
    NF4ATTRDIR = 8
    NF4NAMEDATTR = 9


class CreateMode(enum.IntEnum):
    """How OPEN creates a regular file (createmode4; EXCLUSIVE covers EXCLUSIVE4 and _4_1)."""

    UNCHECKED = 0
    GUARDED = 1
    EXCLUSIVE = 2


class _ServerTime(enum.Enum):
    SET_TO_SERVER_TIME = "SET_TO_SERVER_TIME"


SET_TO_SERVER_TIME: Final = _ServerTime.SET_TO_SERVER_TIME
"""Pass as ``atime``/``mtime`` to :meth:`Vfs.setattr` for time_how4 SET_TO_SERVER_TIME4."""

TimeSet = int | Literal[_ServerTime.SET_TO_SERVER_TIME]
"""A time to set: nanoseconds since the epoch, or :data:`SET_TO_SERVER_TIME`."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request comes from: the connection's peer (``host:port`` text, as the transport
    reports it), its transport (``"tcp"`` or ``"rdma"``) and the RPC credential's
    pseudo-flavour (RFC 2623: 0 AUTH_NONE, 1 AUTH_SYS, 390003-390005 krb5, krb5i, krb5p). A
    backend with per-client export rules (``namespace.py``) decides by it; others ignore it."""

    peer: str
    flavor: int
    transport: str = "tcp"


@dataclass(frozen=True, slots=True)
class Cred:
    """An AUTH_SYS identity as the client sent it (squashing is the backend's job), and where
    the request came from (``None``: the server itself, which every export admits)."""

    uid: int
    gid: int
    gids: tuple[int, ...] = ()
    origin: Origin | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Export:
    """One exported directory and its options.

    ``root``: the directory (resolved with ``realpath`` by the backend).
    ``root_squash``: map uid 0 to ``anon_uid`` and gid 0 (also in ``gids``) to ``anon_gid``.
    ``state_dir``: where the per-export handle secret lives; must be outside the export.
    ``None`` means ``/var/lib/nfsrdma`` for root, else ``$XDG_STATE_HOME/nfsrdma`` or
    ``~/.local/state/nfsrdma``. An unusable one raises ``secret.StateDirError`` (an OSError).
    """

    root: str
    read_only: bool = False
    root_squash: bool = True
    anon_uid: int = 65534
    anon_gid: int = 65534
    state_dir: str | None = None

    def anonymous_cred(self) -> Cred:
        """The identity for AUTH_NONE callers."""
        return Cred(self.anon_uid, self.anon_gid, ())


@dataclass(slots=True, unsafe_hash=True)  # (not frozen: its __init__ is 6x cheaper; never changed)
class Attributes:
    """What one ``fstat`` says about an object, in NFS terms (a value: never changed once made).

    ``mode`` holds the permission bits (0o7777) only; ``rdev`` and ``fsid`` are
    ``(major, minor)``; times are nanoseconds since the epoch; ``space_used`` is in octets.
    ``mounted_on_fileid`` equals ``fileid``: the backend never crosses into other file systems,
    and the export root is the root of what it serves.
    """

    type: FileType
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    space_used: int
    rdev: tuple[int, int]
    fsid: tuple[int, int]
    fileid: int
    mounted_on_fileid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    change: int


@dataclass(frozen=True, slots=True)
class FsStats:
    """File-system statistics for GETATTR files_*, space_*, maxname and maxlink."""

    files_total: int
    files_free: int
    files_avail: int
    bytes_total: int
    bytes_free: int
    bytes_avail: int
    max_name: int
    max_link: int
    user_xattrs: bool = False  # the backend serves ``user.`` extended attributes (xattr_support)


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One READDIR entry. ``error`` is an errno (0 if ``fh`` and ``attrs`` are present).

    An entry the caller may not look up (e.g. search permission missing on the directory) comes
    back with ``fh``/``attrs`` ``None`` and ``error`` set, for rdattr_error.
    """

    cookie: int
    name: bytes
    fh: bytes | None
    attrs: Attributes | None
    error: int = 0


@dataclass(frozen=True, slots=True)
class DirListing:
    """A page of READDIR results. ``eof`` is true when no entries follow the last one."""

    entries: list[DirEntry]
    verifier: bytes
    eof: bool


class OpenFile(abc.ABC):
    """An open regular file: the data path of READ, WRITE and COMMIT.

    Permission was checked when it was opened; I/O on it needs no identity and may run on any
    thread. ``close`` waits for nothing: I/O racing with ``close`` fails with ``EBADF``.
    """

    fh: bytes
    fileid: int
    readable: bool
    writable: bool

    @abc.abstractmethod
    def read(self, offset: int, count: int) -> tuple[bytes, bool]:
        """Read up to ``count`` octets at ``offset``; returns ``(data, eof)``."""

    @abc.abstractmethod
    def readinto(self, offset: int, buf: memoryview | bytearray) -> tuple[int, bool]:
        """Read into the caller's buffer (no extra copy); returns ``(n, eof)``."""

    @abc.abstractmethod
    def write(self, offset: int, data: bytes | memoryview | bytearray, stable: bool = False) -> int:
        """Write at ``offset``; ``stable`` means FILE_SYNC/DATA_SYNC (data on disk on return)."""

    @abc.abstractmethod
    def commit(self) -> None:
        """Flush everything written so far to stable storage (COMMIT)."""

    @abc.abstractmethod
    def getattr(self) -> Attributes:
        """Attributes of the open file."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close; idempotent."""

    # -- NFSv4.2 (RFC 7862): sparse files, space reservation, server-side copy and clone.
    # Backends without them keep these defaults: EOPNOTSUPP (NFS4ERR_NOTSUPP, so clients fall
    # back to what they do without NFSv4.2), and READ_PLUS as plain data.

    def seek(self, offset: int, data: bool) -> int | None:
        """SEEK_DATA (``data``) or SEEK_HOLE from ``offset``: the offset found, or None when
        there is none (no data past ``offset``, or ``offset`` at or past the end of file)."""
        raise OSError(errno.EOPNOTSUPP, "SEEK_DATA/SEEK_HOLE not supported")

    def allocate(self, offset: int, length: int) -> None:
        """Reserve space for ``[offset, offset+length)`` (fallocate; may grow the file)."""
        raise OSError(errno.EOPNOTSUPP, "allocate not supported")

    def deallocate(self, offset: int, length: int) -> None:
        """Punch a hole over ``[offset, offset+length)``; the size never changes."""
        raise OSError(errno.EOPNOTSUPP, "deallocate not supported")

    def read_segments(self, offset: int, count: int) -> tuple[list[Segment], bool]:
        """Up to ``count`` octets from ``offset`` as data and hole segments; ``(segments,
        eof)``. By default all data (no hole is reported)."""
        data, eof = self.read(offset, count)
        return ([Segment(offset, len(data), data)] if data else []), eof

    def copy_to(self, dst: OpenFile, src_offset: int, dst_offset: int, count: int) -> int:
        """Copy up to ``count`` octets into ``dst`` inside the file system (copy_file_range:
        it may share blocks); the number copied, 0 at the end of this file."""
        raise OSError(errno.EOPNOTSUPP, "server-side copy not supported")

    def clone_to(self, dst: OpenFile, src_offset: int, dst_offset: int, count: int) -> None:
        """Share the blocks of ``[src_offset, +count)`` with ``dst`` (FICLONERANGE; ``count``
        0 means to the end of this file). EOPNOTSUPP where the file system cannot."""
        raise OSError(errno.EOPNOTSUPP, "clone not supported")

    def hold_descriptor(self) -> int | None:
        """The descriptor of this open file, kept open (even past ``close``) until
        ``let_go_descriptor``: a write lease is taken on it (``vfs/leases.py``). None when
        the backend has none (or the file is closed)."""
        return None

    def let_go_descriptor(self) -> None:
        """End a ``hold_descriptor``; the descriptor is closed now if ``close`` came first."""
        return None


class SharedGrace(Protocol):
    """A grace period shared with the other servers of a shared file system (CephFS):
    ``begin`` when this server restarted with clients to reclaim, ``end`` when that is over,
    ``in_grace`` while another server is in its grace period. ``end`` and ``in_grace`` are
    called on the server's event loop and must not block (``begin`` runs once, at start)."""

    def begin(self, seconds: float) -> None: ...

    def end(self) -> None: ...

    def in_grace(self) -> bool: ...


class XattrHow(enum.IntEnum):
    """SETXATTR's option (setxattr_option4, RFC 8276 section 8.4.3.1)."""

    EITHER = 0
    CREATE = 1  # EEXIST if the attribute exists
    REPLACE = 2  # ENODATA if it does not


XATTR_NAME_MAX: Final = 255 - len("user.")  # a wire name; the VFS adds the ``user.`` prefix
XATTR_SIZE_MAX: Final = 65536  # Linux's limit on one value


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a file as READ_PLUS returns it: ``data`` at ``offset``, or a hole of
    ``length`` octets there when ``data`` is None."""

    offset: int
    length: int
    data: bytes | None


class Vfs(abc.ABC):
    """A served directory tree. See the module docstring for the conventions."""

    export: Export
    write_verifier: bytes
    """8 octets for WRITE/COMMIT, random per server instance (changes on restart)."""

    @abc.abstractmethod
    def root_handle(self) -> bytes: ...

    @abc.abstractmethod
    def lookup(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> bytes: ...

    @abc.abstractmethod
    def lookupp(self, cred: Cred, fh: bytes) -> bytes: ...

    @abc.abstractmethod
    def getattr(self, fh: bytes) -> Attributes: ...

    def change(self, fh: bytes) -> int:
        """``getattr(fh).change`` alone (a directory's change_info before and after a change of
        its entries); backends may read it more cheaply."""
        return self.getattr(fh).change

    def file_type(self, fh: bytes) -> FileType:
        """``getattr(fh).type`` alone (ACCESS: which bits apply); an object's type never
        changes, so backends may know it without asking the file system."""
        return self.getattr(fh).type

    def open_lookup(self, cred: Cred, dir_fh: bytes, name: bytes) -> tuple[int, bytes, FileType]:
        """What OPEN by name without a create asks (CLAIM_NULL, RFC 8881 section 18.16): the
        directory's change attribute (read first: a removed directory is stale before
        anything else), then the handle ``name`` refers to in it and that object's type.
        NotADirectoryError, nothing looked up, when ``dir_fh`` is not a directory. Backends
        may answer it in one resolution of the directory."""
        change = self.change(dir_fh)
        if self.file_type(dir_fh) != FileType.NF4DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        fh = self.lookup(cred, dir_fh, name)
        return change, fh, self.file_type(fh)

    @abc.abstractmethod
    def check(self, fh: bytes) -> None:
        """Raise BadHandle or StaleHandle unless ``fh`` names a live object (PUTFH)."""

    @abc.abstractmethod
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
    ) -> Attributes: ...

    @abc.abstractmethod
    def access(self, cred: Cred, fh: bytes, mask: int) -> int: ...

    @abc.abstractmethod
    def open(
        self, cred: Cred, fh: bytes, read: bool, write: bool, truncate: bool = False
    ) -> OpenFile: ...

    @abc.abstractmethod
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
    ) -> tuple[bytes, OpenFile, bool]: ...

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
    ) -> tuple[int, bytes, OpenFile, bool, int]:
        """What OPEN with a create asks (RFC 8881 section 18.16): the directory's change
        attribute (read first: a removed directory is stale before anything else),
        NotADirectoryError (nothing created) when ``dir_fh`` is not a directory, then
        ``create_file`` and the change attribute after it (the one before when nothing was
        created): ``(before, fh, openfile, created, after)``. Backends may answer it in one
        resolution of the directory."""
        before = self.change(dir_fh)
        if self.file_type(dir_fh) != FileType.NF4DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        fh, of, created = self.create_file(
            cred, dir_fh, name, mode, how, verifier, read=read, write=write
        )
        if not created:
            return before, fh, of, False, before
        try:
            return before, fh, of, True, self.change(dir_fh)
        except BaseException:
            of.close()
            raise

    @abc.abstractmethod
    def anonymous_read(
        self, cred: Cred, fh: bytes, offset: int, count: int
    ) -> tuple[bytes, bool]: ...

    @abc.abstractmethod
    def anonymous_write(
        self,
        cred: Cred,
        fh: bytes,
        offset: int,
        data: bytes | memoryview | bytearray,
        stable: bool = False,
    ) -> int: ...

    @abc.abstractmethod
    def create(
        self,
        cred: Cred,
        dir_fh: bytes,
        name: bytes | str,
        ftype: FileType,
        mode: int,
        linkdata: bytes | None = None,
        rdev: tuple[int, int] | None = None,
    ) -> bytes: ...

    @abc.abstractmethod
    def remove(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> None: ...

    def remove_changed(self, cred: Cred, dir_fh: bytes, name: bytes) -> tuple[int, int]:
        """REMOVE with its change_info (RFC 8881 section 18.25): ``remove`` between the
        directory's change attribute before and after it (before first: a removed directory
        is stale before anything else). Backends may read both in one resolution."""
        before = self.change(dir_fh)
        self.remove(cred, dir_fh, name)
        return before, self.change(dir_fh)

    @abc.abstractmethod
    def rename(
        self,
        cred: Cred,
        src_dir_fh: bytes,
        src_name: bytes | str,
        dst_dir_fh: bytes,
        dst_name: bytes | str,
    ) -> None: ...

    @abc.abstractmethod
    def link(self, cred: Cred, fh: bytes, dir_fh: bytes, name: bytes | str) -> None: ...

    @abc.abstractmethod
    def readlink(self, cred: Cred, fh: bytes) -> bytes: ...

    @abc.abstractmethod
    def readdir(
        self,
        cred: Cred,
        dir_fh: bytes,
        cookie: int = 0,
        verifier: bytes = b"",
        max_entries: int = 1024,
    ) -> DirListing: ...

    @abc.abstractmethod
    def statfs(self, fh: bytes) -> FsStats: ...

    # -- extended attributes (RFC 8276), the ``user.`` namespace only: names come without
    # the prefix and the backend adds it. ENODATA: no such attribute; EEXIST / ENODATA for the
    # CREATE / REPLACE conflicts; E2BIG: value or list too large; ENAMETOOLONG, EINVAL: bad
    # name. Permission is the file system's, checked with the caller's identity. Backends
    # without them keep these defaults (EOPNOTSUPP: NFS4ERR_NOTSUPP).

    def getxattr(self, cred: Cred, fh: bytes, name: bytes) -> bytes:
        raise OSError(errno.EOPNOTSUPP, "extended attributes not supported")

    def setxattr(
        self, cred: Cred, fh: bytes, name: bytes, value: bytes, how: XattrHow = XattrHow.EITHER
    ) -> None:
        raise OSError(errno.EOPNOTSUPP, "extended attributes not supported")

    def listxattr(self, cred: Cred, fh: bytes) -> list[bytes]:
        """The names in the ``user.`` namespace, without the prefix, sorted."""
        raise OSError(errno.EOPNOTSUPP, "extended attributes not supported")

    def removexattr(self, cred: Cred, fh: bytes, name: bytes) -> None:
        raise OSError(errno.EOPNOTSUPP, "extended attributes not supported")

    @abc.abstractmethod
    def release_identity(self) -> None:
        """Give the calling thread back the server's own file-system identity."""

    # Byte-range locks. The server holds every lock itself (``nfs4/state.py``); a backend
    # shared with other servers (CephFS) also takes them in the file system, so that locks
    # conflict across servers. ``owner`` is a 64-bit lock-owner id, ranges are [start, end)
    # with end 2**64 for "to the end of the file", ``write`` an exclusive lock. A conflict
    # is returned as (start, end, write) of a lock held elsewhere.
    def lock(
        self, of: OpenFile, owner: int, start: int, end: int, write: bool
    ) -> tuple[int, int, bool] | None:
        """Take the lock in the file system (or return the conflicting one)."""
        return None

    def unlock(self, of: OpenFile, owner: int, start: int, end: int) -> None:
        """Release what ``lock`` took in [start, end)."""
        return None

    def test_lock(
        self, fh: bytes, owner: int, start: int, end: int, write: bool
    ) -> tuple[int, int, bool] | None:
        """A lock held elsewhere in the file system that would refuse this one (LOCKT)."""
        return None

    def shared_grace(self, node: str) -> SharedGrace | None:
        """The grace period this export shares with other servers (None: its own only);
        ``node`` names this server among them, the same across its restarts."""
        return None

    def state_key(self) -> str | None:
        """A stable name for the files the server keeps about this export (client records);
        None: derived from the export's local root directory."""
        return None

    def admit(self, cred: Cred, fh: bytes, *, flavor: bool = False) -> None:
        """Raise ``PermissionError`` (NFS4ERR_ACCESS) unless the caller may use the export
        ``fh`` is in (PUTFH), and with ``flavor`` :class:`WrongSecurity` unless the export
        accepts the request's flavour too (operations that take no credential: GETATTR,
        VERIFY). Backends without client rules admit everybody."""
        return None

    def flavors(self, cred: Cred, fh: bytes, name: bytes | None = None) -> tuple[int, ...]:
        """The pseudo-flavours (RFC 2623) the export of ``fh`` (or of the object ``name`` in
        the directory ``fh``, which must exist) accepts, in the order SECINFO offers them."""
        if name is not None:
            self.lookup(cred, fh, name)
        return (1, 0)  # AUTH_SYS, AUTH_NONE

    def lease_descriptor(self, fh: bytes) -> int | None:
        """A descriptor of the file for a kernel lease (``vfs/leases.py``); None when the
        backend has none to offer (then no delegation is protected against local changes)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release every descriptor the backend holds."""
