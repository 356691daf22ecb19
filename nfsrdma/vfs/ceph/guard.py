"""A bound on how long the server waits for CephFS.

libcephfs calls do not fail while the cluster is unreachable (an MDS restarting, an OSD down):
they wait until it is back. The NFS layer makes metadata calls from the event loop, so one such
call would stop the whole server. Every CephVfs call therefore runs in a small pool of threads
and its caller waits at most ``wait`` seconds; a call that takes longer is left to finish in
its thread, and the caller gets ``EAGAIN`` (NFS4ERR_DELAY: the client retries later). While
any call is stuck like that, new calls get ``EAGAIN`` at once, without reaching Ceph, so that
the server goes on answering everyone; when the stuck calls return, Ceph is used again.

A call that was answered with EAGAIN may still complete: the client's retry then finds it
done (an exclusive create with the same verifier succeeds; a REMOVE gets NFS4ERR_NOENT).
READ/WRITE/COMMIT on an open file are not bounded: they already run in the server's I/O
threads, and their buffers must not be given back while Ceph may still write into them.
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Concatenate, ParamSpec, Protocol, TypeVar

log = logging.getLogger("nfsrdma.vfs")

P = ParamSpec("P")
R = TypeVar("R")


class Guard:
    def __init__(self, wait: float = 2.0, workers: int = 8) -> None:
        self.wait = wait
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="nfsrdma-ceph")
        self._inside = threading.local()
        self._lock = threading.Lock()
        self.stuck = 0  # calls past their wait, still running
        self.delayed = 0  # calls answered with EAGAIN (a figure for tests and logs)

    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if getattr(self._inside, "yes", False):  # a guarded call calling another
            return fn(*args, **kwargs)
        if self.stuck:
            self.delayed += 1
            raise OSError(errno.EAGAIN, "CephFS is not answering")

        def task() -> R:
            self._inside.yes = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._inside.yes = False

        fut: Future[R] = self._pool.submit(task)
        try:
            return fut.result(self.wait)
        except FutureTimeout:
            with self._lock:
                self.stuck += 1
                first = self.stuck == 1
            fut.add_done_callback(self._unstuck)
            if first:
                log.warning("CephFS did not answer in %gs: clients get NFS4ERR_DELAY", self.wait)
            self.delayed += 1
            raise OSError(errno.EAGAIN, "CephFS did not answer in time") from None

    def _unstuck(self, _fut: object) -> None:
        with self._lock:
            self.stuck -= 1
            back = self.stuck == 0
        if back:
            log.warning("CephFS answers again")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Guarded(Protocol):
    _guard: Guard


G = TypeVar("G", bound=Guarded)


def guarded(fn: Callable[Concatenate[G, P], R]) -> Callable[Concatenate[G, P], R]:
    """Run a method of a Guarded object through its guard."""

    def call(self: G, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._guard.run(fn, self, *args, **kwargs)

    functools.update_wrapper(call, fn)
    return call
