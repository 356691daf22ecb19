"""Kernel file leases behind delegations (fcntl F_SETLEASE, as knfsd takes them).

A delegation promises its holder that nobody changes the file without the server recalling it
first. Other NFS clients go through the server, which recalls; a local process (or another
server) on the same file system does not, unless the kernel tells us: a lease is that. When a
local open (for writing, for a read lease; any open, for a write lease), truncate, unlink or
rename hits a leased file, the kernel blocks that process and signals the lease holder; the
holder recalls the delegation and releases the lease once it is returned (or revoked), and the
blocked process goes on. The kernel breaks the lease by itself after
``/proc/sys/fs/lease-break-time`` seconds (45 by default) whatever we do.

Notification: a real-time signal chosen with F_SETSIG, delivered to this process (F_SETOWN)
and handled by the event loop (``loop.add_signal_handler``). The handler does not get the
descriptor (Python gives no siginfo), so it asks every lease with F_GETLEASE: a lease being
broken reports the type it is being downgraded to, not the one we hold. No polling timer.
One handler per event loop serves every ``KernelLeases`` on it (several servers in a process).

Leases need the server process to own the file or to have CAP_LEASE (root has it), the
descriptor to be read-only for a read lease (and no writer anywhere), and for a write lease
no other open file description of the file anywhere, the server's own included: a write lease
is therefore taken on the very descriptor of the holder's open, borrowed (``let_go``), not on
a descriptor of its own. See ``nfs4/delegation_service.py`` for what is granted when the
kernel refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

F_SETSIG: Final = getattr(fcntl, "F_SETSIG", 10)
F_SETLEASE: Final = getattr(fcntl, "F_SETLEASE", 1024)
F_GETLEASE: Final = getattr(fcntl, "F_GETLEASE", 1025)
LEASE_SIGNAL: Final = signal.SIGRTMIN + 7

# The lease tables listening on each (event loop, signal).
_listeners: dict[tuple[asyncio.AbstractEventLoop, int], set[KernelLeases]] = {}


def _dispatch(key: tuple[asyncio.AbstractEventLoop, int]) -> None:
    for leases in list(_listeners.get(key, ())):
        leases.signalled()


@dataclass(eq=False, slots=True)
class Lease:
    fd: int
    write: bool
    key: object  # what the lease protects (the delegation)
    broken: bool = False
    # lets the descriptor go on release (when it is not ours to close), else it is closed
    let_go: Callable[[], None] | None = None

    def drop(self) -> None:
        if self.let_go is not None:
            self.let_go()
        else:
            os.close(self.fd)


class KernelLeases:
    """The leases of one server; ``on_break(lease)`` runs on the loop when the kernel breaks one."""

    def __init__(self, on_break: Callable[[Lease], None], sig: int = LEASE_SIGNAL) -> None:
        self.on_break = on_break
        self.sig = sig
        self._leases: dict[int, Lease] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.breaks = 0
        self.refused: int | None = None  # errno of the last refusal (EAGAIN: contention)

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Install the signal handler; False when it cannot be (not the main thread)."""
        key = (loop, self.sig)
        if key not in _listeners:
            try:
                loop.add_signal_handler(self.sig, _dispatch, key)
            except (RuntimeError, ValueError, NotImplementedError) as e:
                log.info("kernel leases unavailable: %s", e)
                return False
            _listeners[key] = set()
        _listeners[key].add(self)
        self._loop = loop
        return True

    @property
    def available(self) -> bool:
        return self._loop is not None

    def take(
        self, fd: int, write: bool, key: object, let_go: Callable[[], None] | None = None
    ) -> Lease | None:
        """Lease ``fd``, which this takes over: on failure or release it is closed, or, when
        ``let_go`` is given (a descriptor borrowed from an open), handed back by calling it.
        None when the kernel refuses (``refused``: EAGAIN, a conflicting open exists;
        EACCES/EPERM, not ours to lease)."""
        lease = Lease(fd, write, key, let_go=let_go)
        if self._loop is None:
            self.refused = None
            lease.drop()
            return None
        try:
            fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
            fcntl.fcntl(fd, F_SETSIG, self.sig)
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK if write else fcntl.F_RDLCK)
        except OSError as e:
            log.debug("no %s lease: %s", "write" if write else "read", e)
            self.refused = e.errno
            lease.drop()
            return None
        self._leases[fd] = lease
        return lease

    def release(self, lease: Lease) -> None:
        if self._leases.pop(lease.fd, None) is None:
            return
        with contextlib.suppress(OSError):
            fcntl.fcntl(lease.fd, F_SETLEASE, fcntl.F_UNLCK)
        lease.drop()

    def signalled(self) -> None:
        """The lease signal came: find the leases being broken."""
        held = {True: fcntl.F_WRLCK, False: fcntl.F_RDLCK}
        for lease in list(self._leases.values()):
            if lease.broken:
                continue
            try:
                now = fcntl.fcntl(lease.fd, F_GETLEASE)
            except OSError:
                now = fcntl.F_UNLCK
            if now != held[lease.write]:
                lease.broken = True
                self.breaks += 1
                self.on_break(lease)

    def close(self) -> None:
        for lease in list(self._leases.values()):
            self.release(lease)
        if self._loop is not None:
            key = (self._loop, self.sig)
            listening = _listeners.get(key)
            if listening is not None:
                listening.discard(self)
                if not listening:
                    del _listeners[key]
                    with contextlib.suppress(Exception):
                        self._loop.remove_signal_handler(self.sig)
            self._loop = None
