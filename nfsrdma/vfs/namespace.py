"""Several exports under one NFSv4 pseudo-root, each its own confined :class:`LocalVfs`.

The pseudo file system is made of the directories leading to each export path (``/`` and, for
``/srv/data``, ``/srv``), as knfsd builds it. It is read-only, has its own fsid (0, 0) and
fileids derived from the paths. READDIR of a pseudo directory lists only the names that lead to
an export the asking client has a rule for; LOOKUP of a name that leads only to exports the
client has no rule for fails with EACCES (NFS4ERR_ACCESS), of a name that leads nowhere with
ENOENT.

Handles (at most 128 octets)::

    | fsid (4, big-endian) | the export's own LocalVfs handle |      an object in an export
    | 0 (4)                | SHA-256 of the pseudo path (16)  |      a pseudo directory

An export handle is authenticated by the export's own secret (``handles.py``), so a handle of one
export with another export's fsid put in front fails (BadHandle); an fsid that is not exported
(any more) is a StaleHandle. The ``fsid`` attribute of objects in an export is (fsid, 0); the
export root's ``mounted_on_fileid`` is the fileid of the pseudo directory it covers, so the
Linux client sees the crossing and mounts the export below the pseudo-root.

Client rules (``exports.py``) apply on every call that carries a :class:`Cred` with an
``origin``: no rule for the address (or ``secure`` and a TCP source port from 1024 up) →
``PermissionError`` (NFS4ERR_ACCESS), a flavour the rule does not list → :class:`WrongSecurity`;
the rule's squashing gives the identity the export sees, and ``ro`` refuses modifications with
EROFS. A ``Cred`` without origin is the server's own and is admitted everywhere.

:meth:`reload` swaps in a new table atomically: exports that stay keep their LocalVfs (their
handles and open files), new ones are opened, removed ones stop resolving (StaleHandle) but are
closed only with the namespace, so files already open through them keep working.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

from nfsrdma.vfs.base import (
    ACCESS4_DELETE,
    ACCESS4_EXECUTE,
    ACCESS4_EXTEND,
    ACCESS4_LOOKUP,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    NFS4_FHSIZE,
    NFS4_VERIFIER_SIZE,
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
    Segment,
    StaleHandle,
    TimeSet,
    Vfs,
    WrongSecurity,
    XattrHow,
)
from nfsrdma.vfs.confine import check_name
from nfsrdma.vfs.exports import (
    PRIVILEGED_PORT_LIMIT,
    ExportEntry,
    ExportTable,
    Options,
    client_address,
)
from nfsrdma.vfs.local import LocalVfs

PSEUDO_FSID: Final = 0
_PREFIX = struct.Struct(">I")
_PSEUDO_HASH = 16
_MODIFYING: Final = ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE
_PSEUDO_ACCESS: Final = ACCESS4_READ | ACCESS4_LOOKUP | ACCESS4_EXECUTE

VfsFactory = Callable[[Export], Vfs]


def _erofs(why: str = "read-only export") -> OSError:
    return OSError(errno.EROFS, why)


def _hash63(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def pseudo_fileid(path: str) -> int:
    """The fileid of a pseudo directory (also the ``mounted_on_fileid`` of an export root)."""
    return _hash63(b"nfsrdma pseudo fileid " + os.fsencode(path)) or 1


def _cookie(name: bytes) -> int:
    return 3 + _hash63(b"nfsrdma pseudo cookie " + name) % ((1 << 63) - 3)


@dataclass(slots=True)
class _Mounted:
    """An export as served: its rules, its own VFS and where it sits in the pseudo fs."""

    entry: ExportEntry
    vfs: Vfs
    root: bytes  # the LocalVfs root handle
    covered_fileid: int


@dataclass(slots=True)
class _Node:
    """A pseudo directory. ``children``: name → pseudo path or export fsid."""

    path: str
    fh: bytes
    fileid: int
    children: dict[bytes, str | int] = field(default_factory=dict)
    below: list[int] = field(default_factory=list)  # fsids of the exports under it


@dataclass(slots=True)
class _Snapshot:
    table: ExportTable
    exports: dict[int, _Mounted]
    nodes: dict[str, _Node]
    by_fh: dict[bytes, _Node]
    change: int

    @property
    def root(self) -> _Node:
        return self.nodes["/"]


def _pseudo_fh(path: str) -> bytes:
    digest = hashlib.sha256(b"nfsrdma pseudo handle " + os.fsencode(path)).digest()
    return _PREFIX.pack(PSEUDO_FSID) + digest[:_PSEUDO_HASH]


def _parent(path: str) -> str:
    return os.path.dirname(path) or "/"


class _ExportFile(OpenFile):
    """An export's open file, named by its namespace handle."""

    def __init__(self, inner: OpenFile, fh: bytes) -> None:
        self._inner = inner
        self.fh = fh
        self.fileid = inner.fileid
        self.readable = inner.readable
        self.writable = inner.writable

    def read(self, offset: int, count: int) -> tuple[bytes, bool]:
        return self._inner.read(offset, count)

    def readinto(self, offset: int, buf: memoryview | bytearray) -> tuple[int, bool]:
        return self._inner.readinto(offset, buf)

    def write(self, offset: int, data: bytes | memoryview | bytearray, stable: bool = False) -> int:
        return self._inner.write(offset, data, stable)

    def commit(self) -> None:
        self._inner.commit()

    def getattr(self) -> Attributes:
        return self._inner.getattr()

    def close(self) -> None:
        self._inner.close()

    def hold_descriptor(self) -> int | None:
        return self._inner.hold_descriptor()

    def let_go_descriptor(self) -> None:
        self._inner.let_go_descriptor()

    # NFSv4.2 (sparse files, copies): the export's own file does the work.
    def seek(self, offset: int, data: bool) -> int | None:
        return self._inner.seek(offset, data)

    def allocate(self, offset: int, length: int) -> None:
        self._inner.allocate(offset, length)

    def deallocate(self, offset: int, length: int) -> None:
        self._inner.deallocate(offset, length)

    def read_segments(self, offset: int, count: int) -> tuple[list[Segment], bool]:
        return self._inner.read_segments(offset, count)

    def copy_to(self, dst: OpenFile, src_offset: int, dst_offset: int, count: int) -> int:
        return self._inner.copy_to(_inner_of(dst), src_offset, dst_offset, count)

    def clone_to(self, dst: OpenFile, src_offset: int, dst_offset: int, count: int) -> None:
        self._inner.clone_to(_inner_of(dst), src_offset, dst_offset, count)


def _inner_of(f: OpenFile) -> OpenFile:
    return f._inner if isinstance(f, _ExportFile) else f


_client = functools.lru_cache(maxsize=4096)(client_address)


def admit(entry: ExportEntry, cred: Cred, *, flavor: bool = True) -> Options | None:
    """The rule options ``cred``'s origin gets on ``entry`` (None: the server itself).

    The one place that decides admission: no rule for the address, or ``secure`` and a
    source port of 1024 or more → PermissionError; the credential's pseudo-flavour not among
    the rule's ``sec=`` → WrongSecurity (unless ``flavor`` is False: PUTFH, which must leave
    that answer to the operation after it, RFC 8881 section 2.6.3.1.1)."""
    origin = cred.origin
    if origin is None:
        return None
    address, port = _client(origin.peer)
    rule = entry.rule_for(address) if address is not None else None
    if rule is None:
        raise PermissionError(errno.EACCES, f"{entry.path} is not exported to {origin.peer}")
    options = rule.options
    # 'secure' is about TCP source ports; RPC-over-RDMA requests count as secure (as knfsd).
    if options.secure and origin.transport != "rdma" and port >= PRIVILEGED_PORT_LIMIT:
        raise PermissionError(
            errno.EACCES, f"{entry.path}: source port {port} is not privileged (secure)"
        )
    if flavor and origin.flavor not in options.flavors:
        raise WrongSecurity(f"{entry.path}: flavour {origin.flavor} not allowed")
    return options


def _sees(entry: ExportEntry, cred: Cred) -> bool:
    """Does some rule of ``entry`` name the caller's address (READDIR/LOOKUP visibility)?"""
    if cred.origin is None:
        return True
    address, _ = _client(cred.origin.peer)
    return address is not None and entry.rule_for(address) is not None


class NamespaceVfs(Vfs):
    """The exports of an :class:`ExportTable` under one pseudo-root (see module docstring)."""

    def __init__(
        self,
        table: ExportTable,
        *,
        state_dir: str | None = None,
        factory: VfsFactory | None = None,
    ) -> None:
        self.state_dir = state_dir
        self._factory: VfsFactory = factory or LocalVfs
        # The identity of AUTH_NONE callers before a rule maps them; the rules do the rest.
        self.export = Export(root="/", read_only=False, root_squash=False, state_dir=state_dir)
        self.write_verifier = os.urandom(NFS4_VERIFIER_SIZE)
        self._lock = threading.Lock()
        self._all: dict[tuple[str, int], Vfs] = {}  # every VFS opened, closed with us
        self._started_ns = time.time_ns()
        self._snap = self._build(table, 1)

    # ----------------------------------------------------------------- table

    def _open_export(self, entry: ExportEntry) -> Vfs:
        key = (entry.path, entry.fsid)
        vfs = self._all.get(key)
        if vfs is None:
            # Squashing and read-only are per client rule, applied here before the call.
            vfs = self._factory(
                Export(
                    root=entry.path, read_only=False, root_squash=False, state_dir=self.state_dir
                )
            )
            self._all[key] = vfs
        return vfs

    def _build(self, table: ExportTable, change: int) -> _Snapshot:
        nodes: dict[str, _Node] = {"/": _Node("/", _pseudo_fh("/"), pseudo_fileid("/"))}
        exports: dict[int, _Mounted] = {}
        opened: list[tuple[str, int]] = []
        try:
            for entry in table.entries:
                key = (entry.path, entry.fsid)
                fresh = key not in self._all
                vfs = self._open_export(entry)
                if fresh:
                    opened.append(key)
                exports[entry.fsid] = _Mounted(
                    entry, vfs, vfs.root_handle(), pseudo_fileid(entry.path)
                )
                child: str | int = entry.fsid
                path = entry.path
                while path != "/":
                    parent = _parent(path)
                    node = nodes.get(parent)
                    if node is None:
                        node = nodes[parent] = _Node(
                            parent, _pseudo_fh(parent), pseudo_fileid(parent)
                        )
                    node.children[os.fsencode(os.path.basename(path))] = child
                    node.below.append(entry.fsid)
                    child, path = parent, parent
        except BaseException:
            for key in opened:  # a failed reload leaves nothing behind
                self._all.pop(key).close()
            raise
        return _Snapshot(table, exports, nodes, {n.fh: n for n in nodes.values()}, change)

    def reload(self, table: ExportTable) -> None:
        """Serve ``table`` from the next call on (OSError, the old table kept, when an export
        cannot be opened)."""
        with self._lock:
            self._snap = self._build(table, self._snap.change + 1)

    @property
    def table(self) -> ExportTable:
        return self._snap.table

    # ----------------------------------------------------------------- routing

    def _wrap(self, fsid: int, inner: bytes) -> bytes:
        fh = _PREFIX.pack(fsid) + inner
        if len(fh) > NFS4_FHSIZE:
            raise OSError(errno.EOVERFLOW, f"file handle of {len(fh)} octets too large")
        return fh

    def _route(self, fh: bytes) -> tuple[_Snapshot, _Node | None, _Mounted | None, bytes]:
        if not isinstance(fh, bytes) or len(fh) <= _PREFIX.size or len(fh) > NFS4_FHSIZE:
            raise BadHandle("bad handle length")
        snap = self._snap
        (fsid,) = _PREFIX.unpack_from(fh, 0)
        if fsid == PSEUDO_FSID:
            if len(fh) != _PREFIX.size + _PSEUDO_HASH:
                raise BadHandle("bad pseudo handle")
            node = snap.by_fh.get(fh)
            if node is None:
                raise StaleHandle("no such pseudo directory (any more)")
            return snap, node, None, b""
        mounted = snap.exports.get(fsid)
        if mounted is None:
            raise StaleHandle(f"fsid {fsid} is not exported")
        return snap, None, mounted, fh[_PREFIX.size :]

    def _export(self, fh: bytes) -> tuple[_Mounted, bytes]:
        """An object in an export (EROFS for a pseudo directory: nothing there changes)."""
        _, _node, mounted, inner = self._route(fh)
        if mounted is None:
            raise _erofs("the pseudo file system is read-only")
        return mounted, inner

    def _as(self, cred: Cred, mounted: _Mounted, *, modify: bool = False) -> Cred:
        """The identity ``cred`` has on ``mounted``, after its rule's checks."""
        options = admit(mounted.entry, cred)
        if options is None:
            return cred
        if modify and options.read_only:
            raise _erofs()
        assert cred.origin is not None
        return options.identity(cred, cred.origin.flavor)

    def _read_only(self, cred: Cred, mounted: _Mounted) -> bool:
        options = admit(mounted.entry, cred)
        return options is not None and options.read_only

    def _attrs(self, mounted: _Mounted, inner: bytes, a: Attributes) -> Attributes:
        mounted_on = mounted.covered_fileid if inner == mounted.root else a.fileid
        return replace(a, fsid=(mounted.entry.fsid, 0), mounted_on_fileid=mounted_on)

    def _node_attrs(self, snap: _Snapshot, node: _Node) -> Attributes:
        t = self._started_ns
        subdirs = len(node.children)
        return Attributes(
            type=FileType.NF4DIR,
            mode=0o555,
            nlink=2 + subdirs,
            uid=0,
            gid=0,
            size=4096,
            space_used=4096,
            rdev=(0, 0),
            fsid=(PSEUDO_FSID, 0),
            fileid=node.fileid,
            mounted_on_fileid=node.fileid,
            atime_ns=t,
            mtime_ns=t,
            ctime_ns=t,
            change=t + snap.change,
        )

    def _visible(self, snap: _Snapshot, node: _Node, cred: Cred) -> bool:
        return any(_sees(snap.exports[f].entry, cred) for f in node.below)

    def _child(self, snap: _Snapshot, cred: Cred, child: str | int) -> bytes:
        """LOOKUP from a pseudo directory into ``child``."""
        if isinstance(child, int):
            mounted = snap.exports[child]
            admit(mounted.entry, cred)
            return self._wrap(child, mounted.root)
        node = snap.nodes[child]
        if not self._visible(snap, node, cred):
            raise PermissionError(errno.EACCES, f"nothing under {child} is exported to the client")
        return node.fh

    # ----------------------------------------------------------------- Vfs

    def root_handle(self) -> bytes:
        return self._snap.root.fh

    def check(self, fh: bytes) -> None:
        _, _node, mounted, inner = self._route(fh)
        if mounted is not None:
            mounted.vfs.check(inner)

    def admit(self, cred: Cred, fh: bytes, *, flavor: bool = False) -> None:
        _, _node, mounted, _ = self._route(fh)
        if mounted is not None:
            admit(mounted.entry, cred, flavor=flavor)

    def flavors(self, cred: Cred, fh: bytes, name: bytes | None = None) -> tuple[int, ...]:
        snap, node, mounted, inner = self._route(fh)
        if name is not None and mounted is not None:
            # The object must exist; the caller's flavour may be one the export refuses.
            options = admit(mounted.entry, cred, flavor=False)
            ecred = cred
            if options is not None and cred.origin is not None:
                ecred = options.identity(cred, cred.origin.flavor)
            mounted.vfs.lookup(ecred, inner, name)
        elif name is not None:
            assert node is not None
            child = node.children.get(check_name(name))
            if child is None:
                raise FileNotFoundError(errno.ENOENT, "no such export", os.fsdecode(name))
            if isinstance(child, int):
                mounted = snap.exports[child]
            else:
                node = snap.nodes[child]
                if not self._visible(snap, node, cred):
                    raise PermissionError(errno.EACCES, "nothing there is exported to the client")
        if mounted is not None:
            options = admit(mounted.entry, cred, flavor=False)
            if options is not None:
                return options.flavors
            return tuple(dict.fromkeys(f for r in mounted.entry.rules for f in r.options.flavors))
        assert node is not None
        out: dict[int, None] = {}
        for fsid in node.below:
            entry = snap.exports[fsid].entry
            for rule in entry.rules:
                out.update(dict.fromkeys(rule.options.flavors))
        return tuple(out) or (1,)

    def lookup(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> bytes:
        snap, node, mounted, inner = self._route(dir_fh)
        if mounted is not None:
            return self._wrap(
                mounted.entry.fsid, mounted.vfs.lookup(self._as(cred, mounted), inner, name)
            )
        assert node is not None
        b = check_name(name)
        child = node.children.get(b)
        if child is None:
            raise FileNotFoundError(errno.ENOENT, "no such export", os.fsdecode(b))
        return self._child(snap, cred, child)

    def lookupp(self, cred: Cred, fh: bytes) -> bytes:
        snap, node, mounted, inner = self._route(fh)
        if mounted is not None:
            if inner != mounted.root:
                ecred = self._as(cred, mounted)
                return self._wrap(mounted.entry.fsid, mounted.vfs.lookupp(ecred, inner))
            admit(mounted.entry, cred, flavor=False)  # back into the pseudo fs: any flavour
            return snap.nodes[_parent(mounted.entry.path)].fh
        assert node is not None
        if node.path == "/":
            raise FileNotFoundError(errno.ENOENT, "the pseudo-root has no parent")
        return snap.nodes[_parent(node.path)].fh

    def getattr(self, fh: bytes) -> Attributes:
        snap, node, mounted, inner = self._route(fh)
        if mounted is not None:
            return self._attrs(mounted, inner, mounted.vfs.getattr(inner))
        assert node is not None
        return self._node_attrs(snap, node)

    def file_type(self, fh: bytes) -> FileType:
        snap, node, mounted, inner = self._route(fh)
        if mounted is not None:
            return mounted.vfs.file_type(inner)
        assert node is not None
        return self._node_attrs(snap, node).type

    def change(self, fh: bytes) -> int:
        snap, node, mounted, inner = self._route(fh)
        if mounted is not None:
            return mounted.vfs.change(inner)  # (_attrs changes fsid and mounted_on only)
        assert node is not None
        return self._node_attrs(snap, node).change

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
        mounted, inner = self._export(fh)
        a = mounted.vfs.setattr(
            self._as(cred, mounted, modify=True),
            inner,
            mode=mode,
            uid=uid,
            gid=gid,
            size=size,
            atime=atime,
            mtime=mtime,
        )
        return self._attrs(mounted, inner, a)

    def access(self, cred: Cred, fh: bytes, mask: int) -> int:
        _, _node, mounted, inner = self._route(fh)
        if mounted is None:
            return mask & _PSEUDO_ACCESS
        allowed = mounted.vfs.access(self._as(cred, mounted), inner, mask)
        if self._read_only(cred, mounted):
            allowed &= ~_MODIFYING
        return allowed

    def open(
        self, cred: Cred, fh: bytes, read: bool, write: bool, truncate: bool = False
    ) -> OpenFile:
        _, _node, mounted, inner = self._route(fh)
        if mounted is None:
            raise IsADirectoryError(errno.EISDIR, "a pseudo directory")
        ecred = self._as(cred, mounted, modify=write or truncate)
        return _ExportFile(mounted.vfs.open(ecred, inner, read, write, truncate), fh)

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
    ) -> tuple[bytes, OpenFile, bool]:
        mounted, inner = self._export(dir_fh)
        fh, f, created = mounted.vfs.create_file(
            self._as(cred, mounted, modify=True),
            inner,
            name,
            mode,
            how,
            verifier,
            read=read,
            write=write,
        )
        wrapped = self._wrap(mounted.entry.fsid, fh)
        return wrapped, _ExportFile(f, wrapped), created

    def anonymous_read(self, cred: Cred, fh: bytes, offset: int, count: int) -> tuple[bytes, bool]:
        _, _node, mounted, inner = self._route(fh)
        if mounted is None:
            raise IsADirectoryError(errno.EISDIR, "a pseudo directory")
        return mounted.vfs.anonymous_read(self._as(cred, mounted), inner, offset, count)

    def anonymous_write(
        self,
        cred: Cred,
        fh: bytes,
        offset: int,
        data: bytes | memoryview | bytearray,
        stable: bool = False,
    ) -> int:
        mounted, inner = self._export(fh)
        ecred = self._as(cred, mounted, modify=True)
        return mounted.vfs.anonymous_write(ecred, inner, offset, data, stable)

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
        mounted, inner = self._export(dir_fh)
        fh = mounted.vfs.create(
            self._as(cred, mounted, modify=True), inner, name, ftype, mode, linkdata, rdev
        )
        return self._wrap(mounted.entry.fsid, fh)

    def remove(self, cred: Cred, dir_fh: bytes, name: bytes | str) -> None:
        mounted, inner = self._export(dir_fh)
        mounted.vfs.remove(self._as(cred, mounted, modify=True), inner, name)

    def _same_export(self, a: bytes, b: bytes) -> tuple[_Mounted, bytes, bytes]:
        ma, ia = self._export(a)
        mb, ib = self._export(b)
        if ma is not mb:
            raise OSError(errno.EXDEV, "across exports")
        return ma, ia, ib

    def rename(
        self,
        cred: Cred,
        src_dir_fh: bytes,
        src_name: bytes | str,
        dst_dir_fh: bytes,
        dst_name: bytes | str,
    ) -> None:
        mounted, src, dst = self._same_export(src_dir_fh, dst_dir_fh)
        ecred = self._as(cred, mounted, modify=True)
        mounted.vfs.rename(ecred, src, src_name, dst, dst_name)

    def link(self, cred: Cred, fh: bytes, dir_fh: bytes, name: bytes | str) -> None:
        mounted, obj, directory = self._same_export(fh, dir_fh)
        mounted.vfs.link(self._as(cred, mounted, modify=True), obj, directory, name)

    # NFSv4.2 extended attributes (RFC 8276): on the export's objects only.
    def getxattr(self, cred: Cred, fh: bytes, name: bytes) -> bytes:
        mounted, inner = self._export(fh)
        return mounted.vfs.getxattr(self._as(cred, mounted), inner, name)

    def setxattr(
        self, cred: Cred, fh: bytes, name: bytes, value: bytes, how: XattrHow = XattrHow.EITHER
    ) -> None:
        mounted, inner = self._export(fh)
        mounted.vfs.setxattr(self._as(cred, mounted, modify=True), inner, name, value, how)

    def listxattr(self, cred: Cred, fh: bytes) -> list[bytes]:
        mounted, inner = self._export(fh)
        return mounted.vfs.listxattr(self._as(cred, mounted), inner)

    def removexattr(self, cred: Cred, fh: bytes, name: bytes) -> None:
        mounted, inner = self._export(fh)
        mounted.vfs.removexattr(self._as(cred, mounted, modify=True), inner, name)

    def readlink(self, cred: Cred, fh: bytes) -> bytes:
        _, _node, mounted, inner = self._route(fh)
        if mounted is None:
            raise OSError(errno.EINVAL, "not a symbolic link")
        return mounted.vfs.readlink(self._as(cred, mounted), inner)

    def readdir(
        self,
        cred: Cred,
        dir_fh: bytes,
        cookie: int = 0,
        verifier: bytes = b"",
        max_entries: int = 1024,
    ) -> DirListing:
        snap, node, mounted, inner = self._route(dir_fh)
        if mounted is not None:
            listing = mounted.vfs.readdir(
                self._as(cred, mounted), inner, cookie, verifier, max_entries
            )
            fsid = mounted.entry.fsid
            entries = [
                replace(
                    e,
                    fh=None if e.fh is None else self._wrap(fsid, e.fh),
                    attrs=None
                    if e.attrs is None or e.fh is None
                    else self._attrs(mounted, e.fh, e.attrs),
                )
                for e in listing.entries
            ]
            return DirListing(entries, listing.verifier, listing.eof)
        assert node is not None
        if cookie in (1, 2) or cookie < 0:
            raise BadCookie(f"cookie {cookie} is never handed out")
        shown: list[tuple[int, bytes, str | int]] = []
        for name, child in node.children.items():
            if isinstance(child, int):
                visible = _sees(snap.exports[child].entry, cred)
            else:
                visible = self._visible(snap, snap.nodes[child], cred)
            if visible:
                shown.append((_cookie(name), name, child))
        shown.sort()
        page: list[DirEntry] = []
        rest = [s for s in shown if s[0] > cookie]
        for c, name, child in rest[:max_entries]:
            if isinstance(child, int):
                m = snap.exports[child]
                fh = self._wrap(child, m.root)
                page.append(DirEntry(c, name, fh, self._attrs(m, m.root, m.vfs.getattr(m.root))))
            else:
                sub = snap.nodes[child]
                page.append(DirEntry(c, name, sub.fh, self._node_attrs(snap, sub)))
        return DirListing(page, bytes(NFS4_VERIFIER_SIZE), len(rest) <= max_entries)

    def statfs(self, fh: bytes) -> FsStats:
        _, _node, mounted, inner = self._route(fh)
        if mounted is not None:
            return mounted.vfs.statfs(inner)
        return FsStats(0, 0, 0, 0, 0, 0, 255, 1)

    def release_identity(self) -> None:
        for vfs in list(self._all.values()):
            vfs.release_identity()

    def lease_descriptor(self, fh: bytes) -> int | None:
        _, _node, mounted, inner = self._route(fh)
        return None if mounted is None else mounted.vfs.lease_descriptor(inner)

    def close(self) -> None:
        with self._lock:
            for vfs in self._all.values():
                vfs.close()
            self._all.clear()
