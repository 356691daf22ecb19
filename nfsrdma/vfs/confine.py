"""Keeping every access inside the export.

* Names are single components: no ``""``, ``"."``, ``".."``, ``"/"`` or NUL, at most 255 octets.
* Components are opened relative to a directory descriptor with ``O_PATH | O_NOFOLLOW``: the
  server never follows symlinks (clients resolve them); a symlink is an object of its own.
* Every descriptor the server uses for a client (a cached one or one just resolved from a
  handle) must still name an object inside the export; a local process may have moved it (or an
  ancestor) out. :func:`kernel_path` reads where the kernel says the object is now (the
  ``/proc/self/fd`` link is computed from the live dentry chain, one system call) and
  :func:`relative_to` cuts it to a path below the export root, or says it is outside.
* A *check window* (:func:`open_window` .. :func:`close_window`) lets one thread's run of
  operations that cannot be interleaved with anything else on that thread (one COMPOUND, while
  it runs synchronously on the event loop; the part of a long READDIR that the thread pool
  lists, one uninterrupted run on its thread) check each descriptor once: inside the window, a
  descriptor found inside the export stays so for the rest of the window (the same trust as
  between a check and the use that follows it, stretched over microseconds of one COMPOUND).
  Closing the window forgets everything it learnt; outside a window every use is checked.
* A *move watch* (:class:`MoveWatch`, fanotify) extends that trust across windows where it can
  be proven safe: on a local file system (ext4, XFS, Btrfs, tmpfs, F2FS) that the server may
  watch whole (CAP_SYS_ADMIN), every rename, unlink and rmdir anywhere on it queues an event
  before its system call returns. Opening a window polls the queue (one non-blocking ``read``
  instead of a ``readlink`` per descriptor); any event, or a lost one (queue overflow is an
  event too), starts a new *epoch*, and a descriptor found inside stays trusted only while the epoch in
  which it was checked lasts. So a COMPOUND that starts after a local process moved an object
  (or an ancestor) out, or removed a name, checks again, as before; only the ``readlink`` of
  descriptors that nothing can have moved is saved. The server's own removals
  (:meth:`MoveWatch.expect_removal`) do not end the epoch: the server drops the trust of what it
  removed itself, which is all a removal can take out of the export.
"""

from __future__ import annotations

import errno
import itertools
import os
import select
import struct
import threading
from collections.abc import Callable
from typing import Final

from nfsrdma.vfs import syscalls
from nfsrdma.vfs.base import NAME_MAX

O_PATH_NOFOLLOW: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH: Final = 4096
DELETED: Final = b" (deleted)"
"""What the kernel appends to the path of an unlinked dentry (a name may also end so)."""


# The calling thread's check window: what it found inside, as (resolver key, handle); None
# (or no attribute) when no window is open on the thread.
WINDOW = threading.local()


class Checked(set[tuple[int, bytes]]):
    """A check window's set of what it found inside, with the move watch's epoch when the
    window opened (after its poll): what the window finds inside *by name* (LOOKUP, a create)
    may be trusted in later windows while that epoch lasts, since any move or removal that
    could have taken it out since the window opened ends the epoch at a later poll."""

    __slots__ = ("epoch",)

    epoch: int  # (set by ``open_window``: no __init__ of its own, set's is cheaper)


def open_window() -> None:
    """Open the calling thread's check window (see the module docstring); with a move watch,
    take in the moves and removals that happened since the last window (a new epoch)."""
    if MOVES.active:
        MOVES.poll()
    checked = Checked()
    checked.epoch = MOVES.epoch
    WINDOW.checked = checked


def close_window() -> None:
    """Close the calling thread's check window: every later use is checked again."""
    WINDOW.checked = None


def window() -> set[tuple[int, bytes]] | None:
    """The calling thread's open check window, or None."""
    checked: set[tuple[int, bytes]] | None = getattr(WINDOW, "checked", None)
    return checked


# File systems whose every change of names goes through this kernel's VFS (so fanotify sees
# it): ext4, XFS, Btrfs, tmpfs, F2FS. Not network or FUSE file systems, nor overlayfs, whose
# lower layers may change unseen.
LOCAL_FILESYSTEMS: Final = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010})
_EVENTS_READ: Final = 16384  # octets of events read at once (a DIR_FID event: about 56)
_EVENT_MAX: Final = 4096  # more than one event with its file handle (a full read: read again)
_EVENT_HEAD: Final = struct.Struct("=IBBHQii")  # struct fanotify_event_metadata
_OWN_REMOVAL: Final = syscalls.FAN_DELETE | syscalls.FAN_ONDIR
_MOVE_EVENTS: Final = (
    syscalls.FAN_MOVED_FROM | syscalls.FAN_MOVED_TO | syscalls.FAN_DELETE | syscalls.FAN_ONDIR
)


class MoveWatch:
    """The process's fanotify group watching the exports' file systems for names moved or
    removed, and the epoch those events advance (see the module docstring).

    ``epoch`` changes whenever events are taken in, and only then: a descriptor checked while
    the epoch was E (read before the check) may be trusted while it still is E."""

    def __init__(self) -> None:
        self.fd = -1
        self.active = False  # a file system is watched: windows poll
        self.epoch = 0
        self.lost = False  # the group failed (read error): no trust from now on
        self._epochs = itertools.count(1)  # (next() is atomic under the GIL)
        self._lock = threading.Lock()  # watch() only
        self._polling = threading.Lock()  # one poll at a time: read and new epoch together
        self._ready: Callable[[float], list[tuple[int, int]]] | None = None
        self._watched: set[int] = set()  # st_dev of the watched file systems
        # Removals this server is making, by thread ID: their events do not end the epoch
        self._expected: dict[int, int] = {}
        self._expect_lock = threading.Lock()

    def watch(self, dirfd: int) -> bool:
        """Watch the file system of the directory ``dirfd``; whether it is (False: not local,
        or fanotify refused: no privilege, an old kernel, no file handles on it)."""
        try:
            if syscalls.fs_type(dirfd) not in LOCAL_FILESYSTEMS:
                return False
            dev = os.fstat(dirfd).st_dev
            with self._lock:
                if self.lost:
                    return False
                if dev in self._watched:
                    return True
                if self.fd < 0:
                    fd = syscalls.fanotify_init(
                        syscalls.FAN_CLOEXEC
                        | syscalls.FAN_NONBLOCK
                        | syscalls.FAN_REPORT_DIR_FID
                        | syscalls.FAN_REPORT_TID
                    )
                    ready = select.epoll(1)
                    ready.register(fd, select.EPOLLIN)
                    self.fd, self._ready = fd, ready.poll
                syscalls.fanotify_mark_filesystem(self.fd, _MOVE_EVENTS, dirfd)
                self._watched.add(dev)
                self.epoch = next(self._epochs)  # (what happened before the mark was not seen)
                self.active = True
                return True
        except OSError:
            return False

    def poll(self) -> None:
        """Take in the events queued since the last poll; any but those of the server's own
        removals (:meth:`expect_removal`): a new epoch. An ``epoll_wait`` that does not wait
        (cheaper than a read that fails with EAGAIN), then one read of the queue, the next ones
        only while reads come back full. Polls that find events run one at a time, and the
        epoch changes before the lock is released: a thread that finds the queue empty because
        another one is taking its events in waits for that poll to end, so it sees the new
        epoch too."""
        ready = self._ready
        if ready is None:
            return
        if not ready(0) and not self._polling.locked():
            return
        with self._polling:
            foreign = False
            try:
                while True:
                    events = os.read(self.fd, _EVENTS_READ)
                    foreign = self._foreign(events) or foreign
                    if len(events) <= _EVENTS_READ - _EVENT_MAX:
                        break
            except BlockingIOError:
                pass
            except OSError:
                self.lost = True  # (never trusted again)
            if foreign:
                self.epoch = next(self._epochs)

    def _foreign(self, events: bytes) -> bool:
        """Whether ``events`` hold any but the expected removals (which they use up)."""
        foreign = False
        at = 0
        with self._expect_lock:
            expected = self._expected
            while at + _EVENT_HEAD.size <= len(events):
                size, _, _, _, mask, _, tid = _EVENT_HEAD.unpack_from(events, at)
                if size < _EVENT_HEAD.size:
                    return True  # (malformed: trust nothing)
                at += size
                if mask & syscalls.FAN_Q_OVERFLOW:
                    expected.clear()  # (their events may be lost: never match them later)
                    foreign = True
                elif mask & ~_OWN_REMOVAL == 0 and expected.get(tid, 0) > 0:
                    expected[tid] -= 1
                    if not expected[tid]:
                        del expected[tid]
                else:
                    foreign = True
        return foreign

    def expect_removal(self) -> int:
        """The calling thread is about to remove a name on a watched file system and then
        drop the trust of what it removed (the object, if it keeps other names:
        ``Resolver.distrust``): its event is not to end the epoch. Returns the token for
        :meth:`unexpect` (if the removal fails: no event comes)."""
        if not self.active:
            return -1
        tid = _thread_id()
        with self._expect_lock:
            self._expected[tid] = self._expected.get(tid, 0) + 1
        return tid

    def unexpect(self, token: int) -> None:
        if token < 0:
            return
        with self._expect_lock:
            left = self._expected.get(token, 0) - 1
            if left > 0:
                self._expected[token] = left
            else:
                self._expected.pop(token, None)

    def new_epoch(self) -> None:
        """Trust nothing checked so far (a removal whose object could not be told)."""
        self.epoch = next(self._epochs)

    def trusted(self, epoch: int) -> bool:
        """Whether a check made in ``epoch`` still holds (no move or removal taken in since)."""
        return epoch == self.epoch and not self.lost


MOVES: Final = MoveWatch()

_TID = threading.local()  # the calling thread's kernel thread ID, asked once (a system call)


def _thread_id() -> int:
    tid: int | None = getattr(_TID, "id", None)
    if tid is None:
        tid = _TID.id = threading.get_native_id()
    return tid


def _forget_thread_id() -> None:
    _TID.id = None  # a forked child's thread has another ID


os.register_at_fork(after_in_child=_forget_thread_id)


def check_name(name: bytes | str) -> bytes:
    """Validate one component; returns it as bytes. EINVAL or ENAMETOOLONG otherwise."""
    b = os.fsencode(name) if isinstance(name, str) else name
    if not isinstance(b, bytes):
        raise OSError(errno.EINVAL, "name must be bytes")
    if b in (b"", b".", b"..") or b"/" in b or b"\0" in b:
        raise OSError(errno.EINVAL, f"invalid name {b!r}")
    if len(b) > NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, "name longer than 255 octets")
    return b


def open_component(dirfd: int, name: bytes) -> int:
    """O_PATH descriptor of ``name`` in ``dirfd`` itself (symlinks are not followed)."""
    return os.open(name, O_PATH_NOFOLLOW, dir_fd=dirfd)


def proc_path(fd: int) -> str:
    """The /proc magic link that reopens ``fd``'s object with a permission check."""
    return f"/proc/self/fd/{fd}"


def open_proc_fds() -> int:
    """A descriptor of this process's ``/proc/self/fd`` for :func:`kernel_path`."""
    return os.open("/proc/self/fd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def kernel_path(fd: int, proc_fds: int) -> bytes:
    """The kernel's current path of ``fd``'s object (``readlink`` of its /proc link;
    ``proc_fds`` from :func:`open_proc_fds` saves the walk to it).

    On a detached mount clone the path is relative to the clone's root, and an object whose
    dentry is not under that root (moved out, or a disconnected dentry of a file opened by
    handle) reads ``/``.
    """
    return os.readlink(b"%d" % fd, dir_fd=proc_fds)


def relative_to(path: bytes, top: bytes) -> bytes | None:
    """``path`` below the directory path ``top``, without the leading ``/`` (``b""`` for
    ``top`` itself); None if ``path`` is not ``top`` or below it."""
    if top == b"/":
        return path[1:] if path.startswith(b"/") else None
    if path == top:
        return b""
    if path.startswith(top) and path[len(top) : len(top) + 1] == b"/":
        return path[len(top) + 1 :]
    return None


def same_object_at(root_fd: int, rel: bytes, st: os.stat_result) -> bool:
    """Whether walking ``rel`` from ``root_fd`` by single components (never following a
    symlink) reaches the object ``st`` describes."""
    cur = os.dup(root_fd)
    try:
        for name in rel.split(b"/"):
            if name in (b"", b".", b".."):
                return False
            try:
                nxt = open_component(cur, name)
            except (FileNotFoundError, NotADirectoryError):
                return False
            os.close(cur)
            cur = nxt
        found = os.fstat(cur)
        return (found.st_dev, found.st_ino) == (st.st_dev, st.st_ino)
    finally:
        os.close(cur)


def within_root(fd: int, root: tuple[int, int]) -> bool:
    """Whether the directory ``fd`` lies under the directory identified by ``root`` (dev, ino).

    Walks ``..`` (at most :data:`MAX_DEPTH` levels) with the caller's identity.
    """
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) == root:
        return True
    try:
        cur = _parent(fd)
    except FileNotFoundError:
        return False  # outside the export's (cloned) mount: the kernel refuses ".."
    try:
        for _ in range(MAX_DEPTH):
            pst = os.fstat(cur)
            if (pst.st_dev, pst.st_ino) == root:
                return True
            if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino):
                return False  # reached a root without meeting the export
            try:
                nxt = _parent(cur)
            except FileNotFoundError:
                return False
            os.close(cur)
            cur, st = nxt, pst
        return False
    finally:
        os.close(cur)


def _parent(fd: int) -> int:
    return os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
