"""An open regular file of the local backend: the READ/WRITE/COMMIT data path."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from nfsrdma.vfs import attrs
from nfsrdma.vfs.base import Attributes, OpenFile
from nfsrdma.vfs.changes import ChangeCounter


class LocalOpenFile(OpenFile):
    """Owns one descriptor. I/O is pread/pwrite (thread-safe, no shared file offset); an
    in-flight counter makes ``close`` wait for no one yet never close a descriptor under a
    running call (the last call out closes it). ``on_close(fh)`` is called once, by the first
    ``close`` (the backend counts the open files of each object, see ``LocalVfs``). A hold
    (``hold_descriptor``, for a write lease) keeps the descriptor open past ``close``."""

    def __init__(
        self,
        fd: int,
        fh: bytes,
        fileid: int,
        *,
        readable: bool,
        writable: bool,
        changes: ChangeCounter,
        on_close: Callable[[bytes], None] | None = None,
    ) -> None:
        self._fd = fd
        self.fh = fh
        self.fileid = fileid
        self.readable = readable
        self.writable = writable
        self._changes = changes
        self._lock = threading.Lock()
        self._busy = 0
        self._closing = False  # the descriptor is being (or was) closed
        self._closed = False  # ``close`` was called
        self._holds = 0  # hold_descriptor calls not let go
        self._on_close = on_close

    def _enter(self) -> int:
        with self._lock:
            if self._closing:
                raise OSError(errno.EBADF, "file is closed")
            self._busy += 1
            return self._fd

    def _exit(self) -> None:
        with self._lock:
            self._busy -= 1
            fd = self._fd if self._closing and self._busy == 0 else -1
            if fd >= 0:
                self._fd = -1
        if fd >= 0:
            os.close(fd)

    def _eof(self, fd: int, offset: int, want: int, got: int) -> bool:
        if got < want:
            return True
        return offset + got >= os.fstat(fd).st_size

    def read(self, offset: int, count: int) -> tuple[bytes, bool]:
        if not self.readable:
            raise OSError(errno.EBADF, "not open for reading")
        fd = self._enter()
        try:
            data = os.pread(fd, count, offset)
            return data, self._eof(fd, offset, count, len(data))
        finally:
            self._exit()

    def readinto(self, offset: int, buf: memoryview | bytearray) -> tuple[int, bool]:
        if not self.readable:
            raise OSError(errno.EBADF, "not open for reading")
        fd = self._enter()
        try:
            want = len(buf) if isinstance(buf, bytearray) else buf.nbytes
            n = os.preadv(fd, [buf], offset)
            return n, self._eof(fd, offset, want, n)
        finally:
            self._exit()

    def write(self, offset: int, data: bytes | memoryview | bytearray, stable: bool = False) -> int:
        if not self.writable:
            raise OSError(errno.EBADF, "not open for writing")
        fd = self._enter()
        try:
            n = os.pwritev(fd, [data], offset, os.RWF_DSYNC if stable else 0)
        finally:
            self._exit()
        self._changes.bump(self.fileid)
        return n

    def commit(self) -> None:
        fd = self._enter()
        try:
            os.fsync(fd)
        finally:
            self._exit()

    def getattr(self) -> Attributes:
        fd = self._enter()
        try:
            count = self._changes.get(self.fileid)
            return attrs.from_stat(os.fstat(fd), count)
        finally:
            self._exit()

    def hold_descriptor(self) -> int | None:
        """While held, ``close`` only tells the backend (``on_close``); the descriptor stays
        open and usable for I/O until the last ``let_go_descriptor``."""
        with self._lock:
            if self._closing or self._closed:
                return None
            self._holds += 1
            return self._fd

    def let_go_descriptor(self) -> None:
        with self._lock:
            self._holds -= 1
            last = self._holds == 0 and self._closed
        if last:
            self._close_descriptor()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held = self._holds > 0
        if not held:
            self._close_descriptor()
        if self._on_close is not None:
            self._on_close(self.fh)

    def _close_descriptor(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            fd = self._fd if self._busy == 0 else -1
            if fd >= 0:
                self._fd = -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0 and not getattr(self, "_closing", True):
            self._close_descriptor()
