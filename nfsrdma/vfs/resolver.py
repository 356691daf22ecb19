"""From file handle to open O_PATH descriptor, confined to the export.

*kernel mode* (the server has CAP_DAC_READ_SEARCH, i.e. runs as root): a handle carries the
kernel's file handle, resolved with open_by_handle_at(2) against the export's mount, so handles
survive server restarts. The resolved object must have the handle's fileid (the kernel checks the
generation); a directory must still lie under the export root, otherwise the handle is stale.

*cache mode* (not root, or a file system without kernel handles): the resolver remembers where it
found each object (parent handle, name) in a bounded in-memory table and re-walks that path with
``O_PATH | O_NOFOLLOW``, checking that the object found is the same one (same handle, i.e. same
fileid and kernel handle). Handles go stale when the server restarts, or when another process
renames an object. Logged at start-up.

Both modes keep a bounded LRU of O_PATH descriptors keyed by handle (``fdcache.py``): the hot path
costs a dictionary lookup plus the confinement check below (once per COMPOUND and descriptor:
see the check window in ``confine.py``). As root, the export is served from a
detached clone of its mount made with open_tree(2) without submounts, so other file systems
mounted below are never entered and a mount point shows the directory it covers, as knfsd without
``crossmnt`` does. Without that privilege an object on another mount (mount ID from
name_to_handle_at or statx; st_dev on kernels older than 5.8) gets ``EACCES`` (see
:meth:`Resolver.make_handle`).

Confinement of every use
------------------------
A local process may move an object, or one of its ancestors, out of the export while clients
hold its handle and the server holds its descriptor. So :meth:`Resolver.pin` checks the
descriptor it returns, on every call (cache hit or freshly resolved), after opening it: the
kernel's current path of the descriptor (``/proc/self/fd``, computed from the live dentry chain;
one ``readlink``) must lie under the export root. On the detached mount clone the path is
relative to the clone, and any object whose dentry left the export reads ``/``. Without the
clone the root's own current path is read too and must be a prefix. A path ending in
`` (deleted)`` (our dentry was unlinked, or a name really ends so) is confirmed by walking it
again from the root. A descriptor failing the check is dropped from the cache; the object is
then found again by name or the handle is stale:

* **Directories** have one dentry, so a directory whose path is outside is stale
  (NFS4ERR_STALE), as knfsd's subtree check does. Moved back inside, its handle works again
  (kernel mode resolves it by handle; cache mode by its remembered name).
* **Other objects** may have several names (hard links) and a descriptor opened by handle may
  have a *disconnected* dentry (no path) when the kernel had no cached name for it. Rule: a
  non-directory is served while it is reachable inside the export under a name the server knows:
  the path of the descriptor it holds, or else the last name it saw the object under (LOOKUP,
  READDIR, CREATE, OPEN, RENAME, LINK; remembered in both modes), re-opened in that name's
  verified parent directory and compared. A file left with links only outside the export is
  stale; so is, in kernel mode, a file whose dentry the kernel dropped and whose name this
  server instance never saw (after a reboot, until the client looks it up again: knfsd with
  ``subtree_check`` keeps the parent in the handle for that case; our handles do not).

The export root is the directory opened at start and defines "inside": it is never checked, so a
root renamed by a local process keeps serving its tree (its current path is read for each check
without the clone), and a root that was removed serves an empty, unwritable directory.

There is a window between the check and the use of a descriptor (the same as in knfsd): the
check proves the object was inside after it was opened, not that it stays so during one call.
The COMPOUND processor stretches that window over one COMPOUND while it runs without waiting
(``confine.open_window``): a descriptor is checked at its first use there (PUTFH), and the
operations after it in the same COMPOUND (GETATTR, ACCESS, LOOKUP, OPEN...) use it unchecked.
The window closes when the COMPOUND ends or must wait (file I/O in the thread pool), and it
belongs to the thread that opened it, so each COMPOUND checks afresh; a descriptor dropped
meanwhile (REMOVE, RENAME over it: ``forget``) is resolved and checked again, as always.

Across COMPOUNDs, the check is saved only where nothing can have moved the object: when the
export's file system is watched for moves and removals (``confine.MoveWatch``: fanotify on a
local file system, as root), a descriptor found inside is trusted in later windows until the
watch takes in any rename, unlink or rmdir on that file system (or loses events). Every window
polls the watch first, so a COMPOUND that starts after such a change checks again; nothing is
trusted outside a window (file I/O in the thread pool is checked at every use; the part of a long
READDIR listed there is one uninterrupted run on its thread, in a window of its own).
``watch_moves=False`` turns this off.

Open files removed through this server
--------------------------------------
A regular file whose last name a client removed through this server (REMOVE, or RENAME over it)
while it is open (an OPEN of any client holds it) is not "outside the export": it is deleted, and
POSIX keeps a deleted file usable by whoever has it open. The backend hands the resolver an
O_PATH descriptor of it (:meth:`Resolver.keep_orphan`); until the last open file of the object is
closed (:meth:`Resolver.drop_orphan`) its handle resolves to that descriptor without the
confinement check and without the "removed, so stale" rule, so its openers' READ, WRITE, LOCK,
GETATTR, SETATTR and CLOSE keep working; anyone holding the handle may use it meanwhile, as with
knfsd, where a handle works as long as the inode lives. After the last close the handle is stale
(NFS4ERR_STALE). A file removed by a local process, not through this server, is not kept: the
server cannot tell whether it was deleted inside the export or moved out first, so its handle is
stale as before (its opens' stateids remain, but PUTFH of the handle fails).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import stat
import threading
from collections import OrderedDict
from typing import Final, Literal

from nfsrdma.vfs import confine, syscalls
from nfsrdma.vfs.base import StaleHandle
from nfsrdma.vfs.confine import MOVES, WINDOW, open_component
from nfsrdma.vfs.fdcache import FdCache, Pin
from nfsrdma.vfs.handles import NO_KERNEL_HANDLE, HandleCodec
from nfsrdma.vfs.identity import FsIdentity

log = logging.getLogger("nfsrdma.vfs")

HandleMode = Literal["auto", "kernel", "cache"]
RESOURCE_ERRNOS: Final = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)
_NO_KHANDLE_ERRNOS: Final = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EOVERFLOW)


_TYPES_MAX: Final = 1 << 16  # file types remembered by handle


def default_fd_cache_size() -> int:
    """A quarter of the descriptor limit, between 64 and 4096."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, min(4096, soft // 4))


class Resolver:
    """Handles of one export: making them, and turning them back into descriptors."""

    def __init__(
        self,
        root_path: str,
        codec: HandleCodec,
        ident: FsIdentity,
        *,
        handle_mode: HandleMode = "auto",
        clone_mount: bool = True,
        fd_cache_size: int | None = None,
        location_cache_size: int = 1 << 18,
        watch_moves: bool = True,
    ) -> None:
        self._codec = codec
        self._ident = ident
        self._loc_lock = threading.Lock()
        self._locations: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()
        # The reverse of _locations, (parent handle, name) -> handle: a hint only, confirmed by
        # an fstatat of the name against a cached descriptor (object_at_name)
        self._names: dict[tuple[bytes, bytes], bytes] = {}
        # File types (S_IFMT) of handles made with a kernel handle (which names one inode for
        # ever, so its type cannot change); bounded: forgotten all at once when full
        self._types: dict[bytes, int] = {}
        # The last stat a caller kept for the next resolution (``keep_stat``, ``kept_stat``).
        self.stat_memo: tuple[object, bytes, int, os.stat_result] | None = None
        self._orphans: dict[bytes, tuple[int, int]] = {}  # fh -> (O_PATH fd, fileid)
        self._location_capacity = location_cache_size
        self.cloned = False
        root_fd = -1
        if clone_mount and os.geteuid() == 0:
            try:
                root_fd = syscalls.open_tree_clone(root_path)
                self.cloned = True
            except OSError as e:
                log.warning("open_tree(%s): %s: objects on other mounts are refused", root_path, e)
        if root_fd < 0:
            root_fd = os.open(root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._mount_fd = os.open(
                ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd
            )
            rst = os.fstat(root_fd)
            self.dev = rst.st_dev
            self.root_key = (rst.st_dev, rst.st_ino)
            try:
                ktype, khandle, mnt = syscalls.fd_handle(root_fd)
                self._root_mnt: int | None = mnt
            except OSError as e:
                if e.errno not in _NO_KHANDLE_ERRNOS:
                    raise
                ktype, khandle = NO_KERNEL_HANDLE, b""
                self._root_mnt = syscalls.mount_id(root_fd)
            self._khandles = ktype != NO_KERNEL_HANDLE
            self.root_fh = codec.pack(rst.st_ino, ktype, khandle)
            if ktype != NO_KERNEL_HANDLE:
                self._types[self.root_fh] = stat.S_IFDIR
            self.kernel_handles = self._choose_mode(root_path, handle_mode, ktype, khandle)
        except BaseException:
            os.close(root_fd)
            if getattr(self, "_mount_fd", -1) >= 0:
                os.close(self._mount_fd)
            raise
        self._root_fd = root_fd
        self._proc_fds = confine.open_proc_fds()
        self.fds = FdCache(fd_cache_size or default_fd_cache_size())
        self.fds.add_permanent(self.root_fh, root_fd, rst.st_ino)
        # Descriptors found inside, by handle, with the move watch's epoch of their check
        # (confine.MoveWatch): trusted in later check windows while that epoch lasts.
        self._kept: dict[bytes, int] = {}
        self._kept_capacity = 2 * self.fds.capacity
        self.watched = watch_moves and confine.MOVES.watch(root_fd)
        if watch_moves and not self.watched:
            log.info(
                "%s: no move watch (fanotify needs CAP_SYS_ADMIN and a local file system): "
                "each COMPOUND checks its descriptors anew",
                root_path,
            )

    def _choose_mode(self, root_path: str, mode: HandleMode, ktype: int, khandle: bytes) -> bool:
        if mode == "cache":
            return False
        why = "the file system has no kernel file handles"
        if ktype != NO_KERNEL_HANDLE:
            try:
                flags = os.O_PATH | os.O_CLOEXEC
                os.close(syscalls.open_by_handle_at(self._mount_fd, ktype, khandle, flags))
                return True
            except OSError as e:
                why = f"open_by_handle_at: {e.strerror} (needs CAP_DAC_READ_SEARCH)"
        if mode == "kernel":
            raise PermissionError(errno.EPERM, f"kernel file handles unavailable: {why}")
        log.warning(
            "%s: file handles are kept in memory only (%s); clients get stale handles after "
            "a server restart",
            root_path,
            why,
        )
        return False

    def close(self) -> None:
        with self._loc_lock:
            orphans, self._orphans = list(self._orphans.values()), {}
        for fd, _ in orphans:
            os.close(fd)
        self.fds.close_all()
        if self._proc_fds >= 0:
            os.close(self._proc_fds)
            self._proc_fds = -1
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1

    # ----------------------------------------------------------------- handle → descriptor

    def pin(self, fh: bytes) -> Pin:
        """The object of ``fh``, pinned in the descriptor cache (resolved on a miss), checked to
        be inside the export now (StaleHandle otherwise)."""
        self.stat_memo = None  # (kept for the next resolution only: this one)
        if not isinstance(fh, bytes):  # (the compiled build's own check says the same)
            raise TypeError(f"bytes object expected; got {type(fh).__name__}")
        if self._orphans:
            orphan = self._pin_orphan(fh)
            if orphan is not None:
                return orphan
        pin = self._acquire_inside(fh)
        if pin is not None:
            return pin
        info = self._codec.unpack(fh)
        self._ident.apply_server()
        if not self.kernel_handles or info.ktype == NO_KERNEL_HANDLE:
            return self._walk(fh)
        try:
            flags = os.O_PATH | os.O_CLOEXEC
            fd = syscalls.open_by_handle_at(self._mount_fd, info.ktype, info.khandle, flags)
        except OSError as e:
            if e.errno in RESOURCE_ERRNOS:
                raise
            raise StaleHandle(f"open_by_handle_at: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if st.st_ino != info.fileid:
                raise StaleHandle("handle resolves to another object")
            inside = self._inside(fd, st)
            if not inside and stat.S_ISDIR(st.st_mode):
                raise StaleHandle("directory is no longer inside the export")
        except BaseException:
            os.close(fd)
            raise
        if not inside:
            os.close(fd)
            return self._walk(fh)  # a file's dentry outside or disconnected: its known name
        return self.fds.insert(fh, fd, st.st_ino)

    def check(self, fh: bytes) -> None:
        """``pin(fh).release()``: StaleHandle unless ``fh`` resolves inside the export (PUTFH's
        check). Without the pin when ``_acquire_inside`` would trust its cached descriptor
        without looking (in a check window, found inside while the move watch's epoch still
        lasts) and the cache has one: nothing uses the descriptor."""
        if (
            self.watched
            and type(fh) is bytes
            and not self._orphans
            and self._kept.get(fh) == MOVES.epoch
            and not MOVES.lost
            and getattr(WINDOW, "checked", None) is not None
            and self.fds.touch(fh)
        ):
            self.stat_memo = None  # (as a pin drops it)
            return
        self.pin(fh).release()

    def _pin_orphan(self, fh: bytes) -> Pin | None:
        """The descriptor of ``fh`` if it is an open file removed through this server."""
        with self._loc_lock:
            orphan = self._orphans.get(fh)
            if orphan is None:
                return None
            fd = os.dup(orphan[0])
        return self.fds.insert(fh, fd, orphan[1])

    def keep_orphan(self, fh: bytes, fd: int, fileid: int) -> None:
        """``fh`` lost its last name through this server while open: keep serving it from
        ``fd`` (duplicated; the caller keeps its own) until :meth:`drop_orphan`."""
        dup = os.dup(fd)
        with self._loc_lock:
            old = self._orphans.get(fh)
            self._orphans[fh] = (dup, fileid)
            self._drop_location(fh)
        if old is not None:
            os.close(old[0])
        self.fds.discard(fh)  # a cached descriptor would read as " (deleted)": use the orphan

    def drop_orphan(self, fh: bytes) -> None:
        """The last open file of ``fh`` was closed: if it was removed, its handle is stale now."""
        with self._loc_lock:
            orphan = self._orphans.pop(fh, None)
        if orphan is not None:
            os.close(orphan[0])
            self.forget(fh)

    def has_orphans(self) -> bool:
        """Whether any open file removed through this server is kept (``keep_orphan``)."""
        return bool(self._orphans)

    def is_orphan(self, fh: bytes) -> bool:
        with self._loc_lock:
            return fh in self._orphans

    def _acquire_inside(self, fh: bytes) -> Pin | None:
        """The cached descriptor of ``fh`` if it is still inside the export, pinned; a cached
        one that is not (moved out, or its name removed) is dropped."""
        pin = self.fds.acquire(fh)
        if pin is None or pin.fd == self._root_fd:
            return pin
        checked = getattr(WINDOW, "checked", None)  # confine.window(), inlined
        epoch = -1
        if checked is not None:
            if (self._root_fd, fh) in checked:
                return pin  # found inside earlier in this check window
            if self.watched:
                epoch = MOVES.epoch  # (read before the check: see MoveWatch)
                if self._kept.get(fh) == epoch and not MOVES.lost:
                    return pin  # found inside in an earlier window, nothing moved since
        try:
            if self._inside(pin.fd):
                if checked is not None:
                    checked.add((self._root_fd, fh))
                    if epoch >= 0:
                        kept = self._kept
                        if len(kept) >= self._kept_capacity:
                            kept.clear()
                        kept[fh] = epoch
                return pin
        except BaseException:
            pin.release()
            raise
        pin.release()
        self.fds.discard(fh)
        return None

    def found_inside(self, fh: bytes) -> None:
        """``fh``'s descriptor was just opened by one name in a directory whose descriptor is
        inside (LOOKUP): it is inside too, for the rest of the calling thread's check window."""
        checked = getattr(WINDOW, "checked", None)
        if checked is not None:
            checked.add((self._root_fd, fh))
            epoch = getattr(checked, "epoch", -1)
            if self.watched and epoch >= 0:  # kept while the window's opening epoch lasts
                kept = self._kept
                if len(kept) >= self._kept_capacity:
                    kept.clear()
                kept[fh] = epoch

    def _inside(self, fd: int, st: os.stat_result | None = None) -> bool:
        """Whether ``fd`` (not the root's) names an object inside the export now."""
        path = os.readlink(b"%d" % fd, dir_fd=self._proc_fds)  # confine.kernel_path, inlined
        if self.cloned:  # confine.relative_to(path, b"/"), inlined
            rel: bytes | None = path[1:] if path[:1] == b"/" else None
        else:
            rel = confine.relative_to(path, confine.kernel_path(self._root_fd, self._proc_fds))
        if not rel:  # outside; on the clone also escaped or disconnected; or the root's path
            return False
        if rel.endswith(confine.DELETED):  # our name was unlinked, or the name ends so
            self._ident.apply_server()
            return confine.same_object_at(self._root_fd, rel, st or os.fstat(fd))
        return True

    def _walk(self, fh: bytes) -> Pin:
        """Re-open ``fh`` by the names the server saw it under, from the nearest ancestor whose
        descriptor is inside the export (kernel mode: the parent, resolved by its handle)."""
        path: list[tuple[bytes, bytes]] = []
        cur = fh
        while True:
            with self._loc_lock:
                loc = self._locations.get(cur)
            if loc is None or len(path) > confine.MAX_DEPTH:
                raise StaleHandle("unknown or forgotten handle")
            parent_fh, name = loc
            path.append((cur, name))
            if self.kernel_handles:
                pin = self.pin(parent_fh)  # a directory: resolved by handle, never walked
                break
            cached = self._acquire_inside(parent_fh)
            if cached is not None:
                pin = cached
                break
            cur = parent_fh
        self._ident.apply_server()
        for child_fh, name in reversed(path):
            try:
                try:
                    fd = open_component(pin.fd, name)
                except OSError as e:
                    if e.errno in RESOURCE_ERRNOS:
                        raise
                    raise StaleHandle(f"{name!r}: {e.strerror}") from e
                try:
                    found, st = self.make_handle(fd)
                    if found != child_fh:
                        raise StaleHandle("name now refers to another object")
                except BaseException:
                    os.close(fd)
                    raise
            finally:
                pin.release()
            pin = self.fds.insert(child_fh, fd, st.st_ino)
        return pin

    def stat(self, pin: Pin) -> os.stat_result:
        """fstat of a pinned object; a removed object (no links left) is stale."""
        st = os.fstat(pin.fd)
        if st.st_nlink == 0 and pin.key != self.root_fh and not self.is_orphan(pin.key):
            self.forget(pin.key)
            raise StaleHandle("object was removed")
        return st

    def reopen(self, fd: int, flags: int) -> int:
        """Open ``fd``'s object again by its /proc magic link (``confine.proc_path``: a new
        open file, permission-checked for the calling identity), walked from the descriptor
        of ``/proc/self/fd`` this resolver holds: one path component instead of four."""
        return os.open(b"%d" % fd, flags, dir_fd=self._proc_fds)

    def keep_stat(self, fh: bytes, generation: int, st: os.stat_result) -> None:
        """Keep ``st``, a stat of ``fh``'s object made while the backend's count of its own
        modifications (``ChangeCounter.generation``) was ``generation`` (read before the stat),
        for the next resolution in the calling thread's check window: :meth:`kept_stat`.
        Nothing is kept outside a window."""
        checked = getattr(WINDOW, "checked", None)
        if checked is not None:
            self.stat_memo = (checked, fh, generation, st)

    @staticmethod
    def kept_stat(
        memo: tuple[object, bytes, int, os.stat_result] | None, pin: Pin, generation: int
    ) -> os.stat_result | None:
        """The stat ``memo`` (``stat_memo`` read just *before* ``pin`` was made, which drops
        it) if it may stand for an fstat of ``pin`` now, else None: it was kept by the last
        VFS call before this resolution but the read-only queries of a type or a change
        attribute and an open for I/O that truncates nothing (any other resolution in between,
        on any thread, dropped it), in this same
        check window (the same thread, in one COMPOUND that has not waited
        since: the window closes before anything waits), of this object, and the server has
        made no modification of anything since before that stat (``generation``: every one
        counts, whichever thread makes it). So nothing this server does can have changed the
        object in between, and a change by another process is concurrent with the COMPOUND:
        the attributes are the object's at a moment within it, as an fstat's."""
        if (
            memo is None
            or memo[1] != pin.key
            or memo[2] != generation
            or memo[0] is not getattr(WINDOW, "checked", None)
        ):
            return None
        return memo[3]

    # ----------------------------------------------------------------- descriptor → handle

    def make_handle(
        self, fd: int, st: os.stat_result | None = None
    ) -> tuple[bytes, os.stat_result]:
        """The handle of the object ``fd`` refers to; EACCES if it lies on another mount."""
        if st is None:
            st = os.fstat(fd)
        ktype, khandle, mnt = NO_KERNEL_HANDLE, b"", None
        if self._khandles:
            try:
                ktype, khandle, mnt = syscalls.fd_handle(fd)
            except OSError as e:
                if e.errno not in _NO_KHANDLE_ERRNOS:
                    raise
        if mnt is None:
            mnt = syscalls.mount_id(fd)
        if mnt is not None and self._root_mnt is not None:
            if mnt != self._root_mnt:
                raise OSError(errno.EACCES, "object on another mount (not crossed)")
        elif st.st_dev != self.dev:  # no mount IDs (kernel < 5.8): compare devices
            raise OSError(errno.EACCES, "object on another file system (not crossed)")
        fh = self._codec.pack(st.st_ino, ktype, khandle)
        if ktype != NO_KERNEL_HANDLE:
            types = self._types
            if len(types) >= _TYPES_MAX:
                types.clear()
            types[fh] = st.st_mode & 0o170000  # stat.S_IFMT
        return fh, st

    def known_type(self, fh: bytes) -> int | None:
        """The S_IFMT bits of ``fh``'s object if this resolver made it with a kernel handle
        (an inode's type never changes), else None."""
        return self._types.get(fh)

    # ----------------------------------------------------------------- bookkeeping

    def remember(self, fh: bytes, parent_fh: bytes, name: bytes, replace: bool = True) -> None:
        """Note that ``fh`` is called ``name`` in ``parent_fh`` (to find it again by name)."""
        if fh == self.root_fh:
            return
        with self._loc_lock:
            if not replace and fh in self._locations:
                return
            self._drop_location(fh)
            self._locations[fh] = (parent_fh, name)
            self._names[parent_fh, name] = fh
            while len(self._locations) > self._location_capacity:
                self._drop_location(next(iter(self._locations)))

    def _drop_location(self, fh: bytes) -> None:
        """Forget where ``fh`` was seen (``_loc_lock`` held)."""
        loc = self._locations.pop(fh, None)
        if loc is not None and self._names.get(loc) == fh:
            del self._names[loc]

    def unname(self, fh: bytes, parent_fh: bytes, name: bytes) -> None:
        """``name`` in ``parent_fh`` no longer refers to ``fh``."""
        with self._loc_lock:
            if self._locations.get(fh) == (parent_fh, name):
                self._drop_location(fh)

    def removing(self) -> int:
        """Before the server removes a name in this export: its move-watch event is not to end
        the epoch (``MoveWatch.expect_removal``); the token for ``removed``."""
        return MOVES.expect_removal() if self.watched else -1

    def removed(self, token: int, fh: bytes | None, ok: bool) -> None:
        """After the removal ``removing`` announced: on failure no event comes; on success the
        object it removed (``fh``: None if it could not be told) is trusted no more (it may be
        left with names outside the export only), every other one still is."""
        if token < 0:
            return
        if not ok:
            MOVES.unexpect(token)
        elif fh is None:
            MOVES.new_epoch()
        else:
            self._kept.pop(fh, None)

    def forget(self, fh: bytes) -> None:
        """The object is gone: drop its descriptor and location."""
        self.fds.discard(fh)
        self._kept.pop(fh, None)
        self._types.pop(fh, None)
        with self._loc_lock:
            self._drop_location(fh)

    def object_at_name(self, dir_pin: Pin, name: bytes) -> tuple[Pin, os.stat_result] | None:
        """The cached descriptor of the object ``name`` in the directory ``dir_pin`` (inside the
        export, the caller's identity applied) refers to now, pinned, with the name's stat; None
        (nothing pinned) unless the name was last seen as a handle whose descriptor is cached.

        One fstatat of the name (no symlink followed, the caller's search permission checked by
        the kernel) instead of an open, fstat, name_to_handle_at and close: the name's inode is
        the cached descriptor's, which keeps that inode from being reused while it is open, so
        the object found by name *is* the cached one, and inside the export (the same trust as
        LOOKUP's descriptor opened by name). Only on a cloned export mount, which has no
        submounts to cross (make_handle's mount check is not needed); errors (no such name,
        no permission) give None: the caller's usual path answers them."""
        if not self.cloned:
            return None
        with self._loc_lock:
            fh = self._names.get((dir_pin.key, name))
        if fh is None:
            return None
        pin = self.fds.acquire(fh)
        if pin is None:
            return None
        try:
            st = os.stat(name, dir_fd=dir_pin.fd, follow_symlinks=False)
        except OSError:
            pin.release()
            return None
        if st.st_ino != pin.fileid or st.st_dev != self.dev or pin.fd == self._root_fd:
            pin.release()
            return None
        return pin, st
