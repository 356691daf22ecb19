"""An open regular file of the local backend: the READ/WRITE/COMMIT data path, and NFSv4.2's
SEEK (lseek SEEK_DATA/SEEK_HOLE), ALLOCATE/DEALLOCATE (fallocate), READ_PLUS's segments, COPY
(copy_file_range) and CLONE (FICLONERANGE)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from nfsrdma.vfs import attrs, syscalls
from nfsrdma.vfs.base import Attributes, OpenFile, Segment
from nfsrdma.vfs.changes import ChangeCounter

PROBE_MAX = 16 * 1024  # reads up to this size learn the end of file by reading one octet more
# ``readinto``'s octet more lands here (its value is never read: threads may share it)
_PROBE_OCTET = bytearray(1)


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
        if count > PROBE_MAX:
            fd = self._enter()
            try:
                data = os.pread(fd, count, offset)
                return data, self._eof(fd, offset, count, len(data))
            finally:
                self._exit()
        # A small read (the usual one): ``_enter`` and ``_exit`` inlined. One octet more tells
        # whether the data reaches the end of file, without the fstat (a system call costs
        # more than copying a small read once).
        lock = self._lock
        with lock:
            if self._closing:
                raise OSError(errno.EBADF, "file is closed")
            self._busy += 1
            fd = self._fd
        try:
            data = os.pread(fd, count + 1, offset)
        finally:
            with lock:
                self._busy -= 1
                last = self._closing and self._busy == 0
                if last:
                    self._fd = -1
            if last:
                os.close(fd)
        if len(data) > count:
            return data[:count], False
        return data, True

    def readinto(self, offset: int, buf: memoryview | bytearray) -> tuple[int, bool]:
        if not self.readable:
            raise OSError(errno.EBADF, "not open for reading")
        # One octet more, read into a scratch octet after the caller's buffer (preadv's
        # second vector), tells whether the data reaches the end of file without the fstat:
        # on RPC-over-RDMA every READ lands here (the transport lends the buffer), and a
        # system call costs more than the extra vector.
        fd = self._enter()
        try:
            want = len(buf) if isinstance(buf, bytearray) else buf.nbytes
            n = os.preadv(fd, [buf, _PROBE_OCTET], offset)
        finally:
            self._exit()
        if n > want:
            return want, False
        return n, True

    def write(self, offset: int, data: bytes | memoryview | bytearray, stable: bool = False) -> int:
        if not self.writable:
            raise OSError(errno.EBADF, "not open for writing")
        fd = self._enter()
        try:
            # A stable write is answered FILE_SYNC4, which promises the file's metadata on
            # stable storage too (RFC 8881 section 18.32.3): RWF_SYNC (O_SYNC), not RWF_DSYNC.
            n = os.pwritev(fd, [data], offset, os.RWF_SYNC if stable else 0)
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

    # ------------------------------------------------------------- NFSv4.2

    def seek(self, offset: int, data: bool) -> int | None:
        fd = self._enter()
        try:
            return os.lseek(fd, offset, os.SEEK_DATA if data else os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # past the end, or no data after offset
                return None
            raise
        finally:
            self._exit()

    def allocate(self, offset: int, length: int) -> None:
        if not self.writable:
            raise OSError(errno.EBADF, "not open for writing")
        fd = self._enter()
        try:
            syscalls.allocate(fd, offset, length)
        finally:
            self._exit()
        self._changes.bump(self.fileid)

    def deallocate(self, offset: int, length: int) -> None:
        if not self.writable:
            raise OSError(errno.EBADF, "not open for writing")
        fd = self._enter()
        try:
            size = os.fstat(fd).st_size
            if offset < size:  # nothing to punch beyond the end; the size never changes
                syscalls.punch_hole(fd, offset, min(length, size - offset))
        finally:
            self._exit()
        self._changes.bump(self.fileid)

    def read_segments(self, offset: int, count: int) -> tuple[list[Segment], bool]:
        """Holes found with SEEK_HOLE/SEEK_DATA; data read with pread. A file system without
        hole reporting reports one hole at the end of file: all data, which is right."""
        if not self.readable:
            raise OSError(errno.EBADF, "not open for reading")
        fd = self._enter()
        try:
            size = os.fstat(fd).st_size
            end = min(offset + count, size)
            out: list[Segment] = []
            pos = offset
            while pos < end:
                try:
                    data_at = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                    data_at = size  # only a hole up to the end of file
                if data_at > pos:
                    hole_end = min(data_at, end)
                    out.append(Segment(pos, hole_end - pos, None))
                    pos = hole_end
                    continue
                hole_at = min(os.lseek(fd, pos, os.SEEK_HOLE), end)
                chunk = os.pread(fd, hole_at - pos, pos)
                if not chunk:  # the file shrank under us
                    break
                out.append(Segment(pos, len(chunk), chunk))
                pos += len(chunk)
            return out, pos >= os.fstat(fd).st_size
        finally:
            self._exit()

    def _pair(self, dst: OpenFile) -> LocalOpenFile:
        if not isinstance(dst, LocalOpenFile):
            raise OSError(errno.EXDEV, "not a file of this backend")
        if not self.readable:
            raise OSError(errno.EBADF, "source not open for reading")
        if not dst.writable:
            raise OSError(errno.EBADF, "destination not open for writing")
        return dst

    def copy_to(self, dst: OpenFile, src_offset: int, dst_offset: int, count: int) -> int:
        target = self._pair(dst)
        fd = self._enter()
        try:
            dfd = target._enter()
            try:
                n = os.copy_file_range(fd, dfd, count, src_offset, dst_offset)
            finally:
                target._exit()
        finally:
            self._exit()
        if n:
            self._changes.bump(target.fileid)
        return n

    def clone_to(self, dst: OpenFile, src_offset: int, dst_offset: int, count: int) -> None:
        target = self._pair(dst)
        fd = self._enter()
        try:
            dfd = target._enter()
            try:
                syscalls.clone_range(fd, src_offset, count, dfd, dst_offset)
            finally:
                target._exit()
        finally:
            self._exit()
        self._changes.bump(target.fileid)

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
        fd = -1
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._holds == 0 and not self._closing:  # (_close_descriptor, under one lock)
                self._closing = True
                if self._busy == 0:
                    fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
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
