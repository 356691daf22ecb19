"""Whose permissions apply: AUTH_SYS squashing and per-thread file-system identity.

When the server runs as root, each VFS call sets the calling *thread's* fsuid, fsgid and
supplementary groups with raw system calls (glibc's ``setgroups`` would change every thread);
the kernel then checks permissions itself, ACLs included. Setting a non-zero fsuid also drops
the file-system capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_MKNOD, ...) from the
thread, so a squashed root is an ordinary user. The identity is cached per thread: repeated calls
by the same identity cost a thread-local lookup. A new thread inherits its creator's identity, so
the cache starts empty and the first call always sets it.

When the server does not run as root, switching is impossible: every client acts as the server's
own user (logged once).

Protected threads. Linux refuses ``write()`` commands on an RDMA device file (``/dev/infiniband/
rdma_cm``, and the verbs device: memory registration, and every Send on soft-RoCE) from a thread
whose credentials changed after the file was opened (``ib_safe_file_access``: the error is
EACCES). The event loop drives the RDMA transport, so its thread must never change identity:
the server marks it with :func:`protect_current_thread` before it opens a device (only when it
has an RDMA listener: a TCP-only server's loop switches in place, a few system calls on a
change of caller instead of two thread switches per call), and a VFS call
made on a protected thread that needs another identity runs, synchronously, in a worker thread
of its own (:func:`off_protected_threads`). Calls as the server's own identity run in place.
The hand-off is two locks and one long-lived thread (about half what a thread pool's future
costs, which is as much as a whole small COMPOUND); protected threads share that worker, one
call at a time. The call takes the caller's confinement check window with it (``confine.py``):
the caller waits while it runs, so it is still the same uninterrupted run of one COMPOUND, and
what the call found inside the export counts for the caller too (and the reverse).
:func:`handoffs` counts the hand-offs made (``bench/server_cpu.py`` prints them per COMPOUND).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Concatenate, Final, ParamSpec, Protocol, TypeVar, cast

from nfsrdma.vfs import confine, syscalls
from nfsrdma.vfs.base import Cred, Export

log = logging.getLogger("nfsrdma.vfs")

NGROUPS_MAX: Final = 65536
_warned_unprivileged = False


class _ThreadState(threading.local):
    """The calling thread's mark and the fs identity it acts as, shared by every FsIdentity
    (the credentials belong to the thread, not to an export). Class defaults, so that a thread
    that set neither reads them without a missing attribute's exception (``getattr`` with a
    default costs about 0.4 microseconds that way, against 0.05, on every VFS call)."""

    protected: bool = False
    current: Cred | None = None  # None: not known (never switched, or a switch failed)


_thread = _ThreadState()


def protect_current_thread() -> None:
    """The calling thread issues RDMA commands: it keeps its credentials from now on. A thread
    that never switched identity is taken to have the process's own (the server's). The mark
    is the thread's own (thread-local): a later thread that gets the same ident is not marked."""
    _thread.protected = True


def is_protected() -> bool:
    """Whether the calling thread is protected (:func:`protect_current_thread`)."""
    return _thread.protected is True


class _Handoff:
    """The identity worker: one daemon thread running one call at a time for the protected
    threads, handed over and back through two locks (no queue, no future)."""

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._job: Callable[[], object] | None = None
        self._ok = False
        self._value: object = None
        threading.Thread(target=self._serve, name="nfsrdma-identity", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            job, self._job = self._job, None
            assert job is not None
            try:
                self._value, self._ok = job(), True
            except BaseException as exc:  # handed back to the caller, raised there
                self._value, self._ok = exc, False
            self._done.release()

    def call(self, job: Callable[[], R]) -> R:
        self._job = job
        self._go.release()
        try:
            self._done.acquire()
        except BaseException:
            # Interrupted while the job runs: this worker is left to finish it, unused.
            _retire(self)
            raise
        value, self._value = self._value, None
        if self._ok:
            return cast(R, value)
        assert isinstance(value, BaseException)
        raise value


_handoff: _Handoff | None = None
_handoff_lock = threading.Lock()  # one protected thread's call at a time
_handoffs = 0  # calls handed off so far (under _handoff_lock)


def handoffs() -> int:
    """How many VFS calls have run in the identity worker since the process started."""
    return _handoffs


def _retire(worker: _Handoff) -> None:
    global _handoff
    if _handoff is worker:
        _handoff = None


def _in_identity_worker(job: Callable[[], R]) -> R:
    global _handoff, _handoffs
    checked = confine.window()

    def windowed() -> R:  # in the caller's check window (the caller waits meanwhile)
        confine.WINDOW.checked = checked
        try:
            return job()
        finally:
            confine.WINDOW.checked = None

    with _handoff_lock:
        _handoffs += 1
        if _handoff is None:
            _handoff = _Handoff()
        return _handoff.call(job if checked is None else windowed)


class _UsesIdentity(Protocol):
    _ident: FsIdentity

    def _cred(self, cred: Cred) -> Cred: ...


V = TypeVar("V", bound=_UsesIdentity)
P = ParamSpec("P")
R = TypeVar("R")


def off_protected_threads(
    fn: Callable[Concatenate[V, Cred, P], R],
) -> Callable[Concatenate[V, Cred, P], R]:
    """For a VFS method taking the caller's ``cred`` first: on a protected thread, when that
    identity (squashed) is not the one the thread has, run the method in the identity worker
    and wait for it; everywhere else, run it in place."""

    def call(self: V, cred: Cred, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if (
            self._ident.enabled
            and _thread.protected is True  # (is_protected, inlined)
            and self._cred(cred) != self._ident.current()
        ):
            return _in_identity_worker(lambda: fn(self, cred, *args, **kwargs))
        return fn(self, cred, *args, **kwargs)

    functools.update_wrapper(call, fn)
    return call


def squash(export: Export, cred: Cred) -> Cred:
    """Apply root squashing (knfsd semantics: uid 0, gid 0 and group 0 in gids are mapped)."""
    if not export.root_squash:
        return cred
    if cred.uid != 0 and cred.gid != 0 and 0 not in cred.gids:
        return cred
    uid = export.anon_uid if cred.uid == 0 else cred.uid
    gid = export.anon_gid if cred.gid == 0 else cred.gid
    gids = tuple(export.anon_gid if g == 0 else g for g in cred.gids)
    return Cred(uid, gid, gids)


class FsIdentity:
    """Sets the calling thread's fs identity; a no-op when the process is not root."""

    def __init__(self, enabled: bool | None = None) -> None:
        nrs = syscalls.cred_syscalls()
        can = os.geteuid() == 0 and nrs is not None
        if enabled is None:
            if os.geteuid() == 0 and nrs is None:
                # Fail closed: root that cannot switch would serve every client as root.
                raise PermissionError(errno.EPERM, "no fs-identity syscalls known for this CPU")
            enabled = can
        elif enabled and not can:
            raise PermissionError(errno.EPERM, "identity switching needs root on x86_64/aarch64")
        self.enabled = enabled
        self._nr = nrs or (0, 0, 0)
        self.server = Cred(os.geteuid(), os.getegid(), tuple(os.getgroups()))
        if not enabled:
            _warn_unprivileged()

    def apply(self, cred: Cred) -> None:
        """Make the calling thread act as ``cred`` (already squashed) for file-system access."""
        current = _thread.current
        if current is cred or not self.enabled or current == cred:
            return
        if is_protected():
            if current is None and cred == self.server:
                _thread.current = cred  # never switched: it has the process's credentials
                return
            _warn_protected()
        _thread.current = None  # unknown until every call below succeeded
        setfsuid, setfsgid, setgroups = self._nr
        gids = cred.gids[:NGROUPS_MAX]
        arr = (ctypes.c_uint * max(1, len(gids)))(*gids)
        if syscalls.raw_syscall(setgroups, len(gids), arr) != 0:
            err = syscalls.last_errno()
            raise OSError(err, f"setgroups: {os.strerror(err)}")
        # setfsuid/setfsgid return the previous value and never fail visibly: verify with -1.
        syscalls.raw_syscall(setfsgid, cred.gid)
        if syscalls.raw_syscall(setfsgid, -1) != cred.gid:
            raise PermissionError(errno.EPERM, f"setfsgid({cred.gid}) did not take effect")
        syscalls.raw_syscall(setfsuid, cred.uid)
        if syscalls.raw_syscall(setfsuid, -1) != cred.uid:
            raise PermissionError(errno.EPERM, f"setfsuid({cred.uid}) did not take effect")
        _thread.current = cred

    def apply_server(self) -> None:
        """Give the calling thread back the server's own identity."""
        self.apply(self.server)

    def current(self) -> Cred:
        """The identity the calling thread acts as (the server's if unknown)."""
        cur = _thread.current
        return cur if isinstance(cur, Cred) else self.server


_warned_protected = False


def _warn_protected() -> None:
    global _warned_protected
    if not _warned_protected:
        _warned_protected = True
        log.error(
            "fs identity changed on a thread that issues RDMA commands: the kernel will refuse "
            "its RDMA-CM and verbs commands (EACCES); this is a bug"
        )


def _warn_unprivileged() -> None:
    global _warned_unprivileged
    if not _warned_unprivileged:
        _warned_unprivileged = True
        log.warning(
            "not running as root: every NFS client acts as uid %d gid %d; "
            "AUTH_SYS identities and root squashing are not applied",
            os.geteuid(),
            os.getegid(),
        )
